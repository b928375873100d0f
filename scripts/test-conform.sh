#!/usr/bin/env bash
# `softrdma conform` against softrdma itself (issue 55): softrdma-conform-agent on a softrdma
# device (through `softrdma exec`, as any verbs program), the tester on an address of its own,
# every built-in case, under each behaviour profile (rxe, the default; cx) and on both data paths
# (the provider path, the default: the agent's process runs its QPs; the device path: the daemon
# does). A run passes when no case fails and every case that is not passed is a "choice" case (a
# behaviour the spec leaves open) whose rule names the profile that makes the other choice.
# Then the same with the device's capture on (the cases that forge no broken packet): the run
# passes as before, and the capture holds every packet with a valid ICRC, none lost.
# Then the tester's own failure path: a case that expects the wrong PSN must fail the run with
# exit 1 and say what differed.
#
#   scripts/test-conform.sh [--repeat N]
set -uo pipefail
cd "$(dirname "$0")/.."
repeat=1
[ "${1:-}" = --repeat ] && repeat="${2:?--repeat needs a number}"
target="${CARGO_TARGET_DIR:-target}"
bin="$(realpath "$target/release/softrdma")"
examples="$(CARGO_TARGET_DIR="$target" bash scripts/build-examples.sh)" || exit 2
agent="$(realpath "$examples/softrdma-conform-agent")"
[ -x "$bin" ] && [ -x "$agent" ] || { echo "test-conform: build softrdma and the examples first" >&2; exit 2; }
work=$(mktemp -d)
chmod 700 "$work"
export SOFTRDMA_RUNTIME_DIR="$work/rt" SOFTRDMA_NO_AUTOSTART=1
mkdir -m 700 "$work/rt"
agent_pid=""
cleanup() {
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null
  for d in conf0 conf1 conf2; do timeout 15 "$bin" down $d >/dev/null 2>&1; done
  rm -rf "$work"
}
trap cleanup EXIT

"$bin" up conf0 --addr 127.0.0.61 >/dev/null || exit 2
"$bin" up conf1 --addr 127.0.0.63 --profile cx >/dev/null || exit 2
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok    $*"; }
bad() { failed=$((failed + 1)); echo "FAIL  $*"; }
port=$((17400 + RANDOM % 500))

# start_agent [ENV...]: an agent on the next port, through `softrdma exec`; waits until it listens
# (a loaded machine can take seconds to start a program on the shim).
start_agent() {
  port=$((port + 1))
  env "$@" "$bin" exec -- "$agent" --listen 127.0.0.1 --port $port --once >"$work/agent.log" 2>&1 &
  agent_pid=$!
  for _ in $(seq 600); do
    grep -q listening "$work/agent.log" && return 0
    kill -0 "$agent_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "test-conform: the agent did not start: $(cat "$work/agent.log")" >&2
  return 1
}
# stop_agent: the agent ends by itself after its one tester; one the tester never reached is ended.
stop_agent() {
  for _ in $(seq 50); do kill -0 "$agent_pid" 2>/dev/null || break; sleep 0.1; done
  kill "$agent_pid" 2>/dev/null
  wait "$agent_pid" 2>/dev/null
  agent_pid=""
}

# run DEVICE PROFILE DATAPATH LOCAL [CASE FILTERS...]: one agent, every case (or those given).
run() {
  local dev=$1 profile=$2 path=$3 local_ip=$4
  shift 4
  local filters=()
  for f in "$@"; do filters+=(--case "$f"); done
  start_agent SOFTRDMA_DATAPATH=$path || { bad "conform, profile $profile, $path path: the agent did not start"; return; }
  local json="$work/$dev-$path.json"
  timeout 300 "$bin" conform --dut 127.0.0.1:$port --dev "$dev" --local "$local_ip" --json "${filters[@]}" >"$json" 2>"$work/err"
  local rc=$?
  stop_agent
  local verdict
  verdict=$(python3 - "$json" "$profile" <<'PY' 2>&1
import json, sys
r = json.load(open(sys.argv[1]))
profile = sys.argv[2]
problems = []
if r["cases"] < 60 and profile != "rxe-capture":
    problems.append(f'only {r["cases"]} cases')
for x in r["results"]:
    if x["result"] == "fail":
        problems.append(f'{x["case"]} failed: {x["detail"]}')
    elif x["result"] == "deviation":
        # A deviation is allowed only where the case says another implementation chooses otherwise.
        other = {"rxe": "cx", "rxe-capture": "cx", "cx": "rxe"}[profile]
        names = {"cx": ["ConnectX", "cx"], "rxe": ["rxe"]}[other]
        if not any(n in x["rule"] for n in names):
            problems.append(f'{x["case"]} deviates and its rule names no {other} choice: {x["detail"]}')
print(f'{r["passed"]} passed, {r["failed"]} failed, {r["deviations"]} deviations of {r["cases"]}')
for p in problems:
    print("  " + p)
sys.exit(1 if problems else 0)
PY
)
  local vrc=$?
  local line="conform, profile $profile, $path path: $(echo "$verdict" | head -1) (exit $rc)"
  if [ $vrc = 0 ] && [ $rc = 0 ]; then ok "$line"; else
    bad "$line: $(echo "$verdict" | sed -n '2,$p' | tr '\n' ';') $(head -c 300 "$work/err")"
  fi
}

for round in $(seq "$repeat"); do
  [ "$repeat" = 1 ] || echo "-- round $round"
  run conf0 rxe provider 127.0.0.62
  run conf0 rxe device 127.0.0.62
  run conf1 cx provider 127.0.0.64
  run conf1 cx device 127.0.0.64
done

# The device's capture on: every case but the broken packets of invalid/*.
"$bin" up conf2 --addr 127.0.0.65 --pcap "$work/conf2.pcap" >/dev/null || exit 2
run conf2 rxe-capture provider 127.0.0.66 'rc_*' 'uc/*' 'ud/*' 'xrc/*'
run conf2 rxe-capture device 127.0.0.66 'rc_*' 'uc/*' 'ud/*' 'xrc/*'
lost=$("$bin" stat conf2 | awk '$1 == "capture_dropped" {print $2}')
"$bin" down conf2 >/dev/null 2>&1
check=$("$bin" pcap check "$work/conf2.pcap" 2>&1)
crc=$?
frames=$(echo "$check" | awk '$1 == "frames" {print $2; exit}')
line="the device's capture of those runs: ${frames:-no} frames, ${lost:-?} lost, $(echo "$check" | grep -m1 -E 'verdict' | tr -s ' ')"
if [ $crc = 0 ] && [ "${lost:-x}" = 0 ] && [ "${frames:-0}" -gt 100 ]; then ok "$line"; else bad "$line: $(echo "$check" | tail -5 | tr '\n' '|')"; fi

# The tester fails a case that does not hold: a copy of a built-in case expecting the wrong PSN.
mkdir -p "$work/bad/rc_req"
sed 's/psn = "sq", ack_req = true, len = 64/psn = "sq+1", ack_req = true, len = 64/' \
  conformance/cases/rc_req/send_only_first_psn.toml >"$work/bad/rc_req/wrong_psn.toml"
start_agent SOFTRDMA_DATAPATH=provider || exit 1
timeout 60 "$bin" conform --dut 127.0.0.1:$port --dev conf0 --local 127.0.0.62 --cases-dir "$work/bad" >"$work/bad.out" 2>&1
brc=$?
stop_agent
if [ $brc = 1 ] && grep -q "PSN 0x100, expected 0x101" "$work/bad.out" && grep -q "0 passed, 1 failed" "$work/bad.out"; then
  ok "a case expecting the wrong PSN fails the run (exit 1) and says what differed"
else
  bad "a case expecting the wrong PSN: exit $brc: $(tr '\n' '|' <"$work/bad.out")"
fi

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
