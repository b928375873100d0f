#!/usr/bin/env bash
# The GitHub Actions action (action.yml), run here as the runner would run it (no network: the
# packages are already installed, the build's target directory is shared): action.yml is parsed
# and checked (every step's script exists, every input it uses is declared, every output comes
# from a step that sets it); then its steps run with the runner's files (GITHUB_ENV, GITHUB_PATH,
# GITHUB_OUTPUT) and the environment action.yml gives them, two devices are started, and a later
# step (PATH and env from those files, as the runner makes them) sees both devices through
# `softrdma exec -- ibv_devices` and runs ibv_rc_pingpong between them.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
work=$(mktemp -d)
passed=0 failed=0
check() { if [ "$2" = 0 ]; then passed=$((passed + 1)); echo "ok    $1"; else failed=$((failed + 1)); echo "FAIL  $1: $3"; fi; }
a0=127.0.0.$((100 + RANDOM % 50)) a1=127.0.0.$((150 + RANDOM % 50))
cleanup() {
  for d in srdma0 srdma1; do
    SOFTRDMA_RUNTIME_DIR="$work/rt" timeout 15 "$work/prefix/bin/softrdma" down $d >/dev/null 2>&1
  done
  rm -rf "$work"
}
trap cleanup EXIT

# The action's definition: the env each step gets, checked against its inputs and scripts.
python3 - action.yml "$work/steps" <<'PY' >"$work/parse.log" 2>&1
import re, sys, yaml
a = yaml.safe_load(open(sys.argv[1]))
inputs = set(a["inputs"])
steps = a["runs"]["steps"]
assert a["runs"]["using"] == "composite", "not a composite action"
ids = set()
with open(sys.argv[2], "w") as out:
    for s in steps:
        ids.add(s["id"])
        m = re.fullmatch(r'bash "\$\{\{ github\.action_path \}\}/(scripts/action/[a-z]+\.sh)"', s["run"].strip())
        assert m, "step %s does not run a script of scripts/action: %r" % (s["id"], s["run"])
        for used in re.findall(r"inputs\.([a-z-]+)", yaml.safe_dump(s)):
            assert used in inputs, "step %s uses undeclared input %s" % (s["id"], used)
        out.write("%s %s %s\n" % (s["id"], m.group(1), " ".join(s.get("env", {}))))
for name, o in a["outputs"].items():
    m = re.fullmatch(r"\$\{\{ steps\.([a-z]+)\.outputs\.([a-z]+) \}\}", o["value"])
    assert m and m.group(1) in ids, "output %s comes from no step" % name
print("ok")
PY
check "action.yml: composite, each step runs a script of scripts/action, inputs declared, outputs from steps" $? "$(cat "$work/parse.log")"
for s in $(awk '{print $2}' "$work/steps"); do
  [ -f "$s" ]; check "action.yml step script $s exists" $? "missing"
done

# The runner's files, and the steps with the environment action.yml gives them.
export GITHUB_ENV="$work/env" GITHUB_PATH="$work/path" GITHUB_OUTPUT="$work/out"
: >"$GITHUB_ENV"; : >"$GITHUB_PATH"; : >"$GITHUB_OUTPUT"
SRC="$repo" REVISION="" PREFIX="$work/prefix" INSTALL_DEPS=false CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}" \
  SOFTRDMA_CACHE_DIR="$work/cache" bash scripts/action/install.sh >"$work/install.log" 2>&1
check "step install (cargo install from the source tree, shim unpacked, env and outputs written)" $? "$(tail -n 5 "$work/install.log")"
runner_env() { # the environment a later step gets: GITHUB_ENV's variables, GITHUB_PATH first on PATH
  local -a e=(SOFTRDMA_CACHE_DIR="$work/cache" PATH="$(tr '\n' ':' <"$GITHUB_PATH")$PATH")
  while IFS= read -r l; do e+=("$l"); done <"$GITHUB_ENV"
  env "${e[@]}" "$@"
}
runner_env DEVICES="srdma0=$a0 srdma1=$a1" RUNTIME_DIR="$work/rt" bash scripts/action/start.sh >"$work/start.log" 2>&1
check "step start (srdma0 on $a0, srdma1 on $a1)" $? "$(tail -n 5 "$work/start.log")"
grep -qx "devices=srdma0 srdma1" "$GITHUB_OUTPUT" && grep -q "^shim=.*/shim-" "$GITHUB_OUTPUT" && grep -q "^version=softrdma " "$GITHUB_OUTPUT"
check "outputs: devices, shim, version" $? "$(cat "$GITHUB_OUTPUT")"
shim=$(sed -n 's/^SOFTRDMA_SHIM=//p' "$GITHUB_ENV")
[ -f "$shim/libibverbs.so.1" ] && grep -q "^SOFTRDMA_DEVICES=srdma0 srdma1$" "$GITHUB_ENV"
check "env for later steps: SOFTRDMA_SHIM ($shim), SOFTRDMA_DEVICES" $? "$(cat "$GITHUB_ENV")"

# A later step of the job.
runner_env softrdma exec --no-present -- ibv_devices >"$work/devices.log" 2>&1
grep -q srdma0 "$work/devices.log" && grep -q srdma1 "$work/devices.log"
check "a later step: softrdma (from PATH) exec -- ibv_devices lists both" $? "$(cat "$work/devices.log")"
port=$((19500 + RANDOM % 400))
runner_env timeout 60 softrdma exec --no-present -- ibv_rc_pingpong -d srdma0 -g 0 -p $port -n 100 >"$work/s.log" 2>&1 &
sp=$!
for _ in $(seq 50); do
  sleep 0.2
  runner_env timeout 60 softrdma exec --no-present -- ibv_rc_pingpong -d srdma1 -g 0 -p $port -n 100 127.0.0.1 >"$work/c.log" 2>&1
  crc=$?
  grep -q "Couldn't connect" "$work/c.log" || break
done
wait $sp
src=$?
[ "$src" = 0 ] && [ "$crc" = 0 ] && [ "$(cat "$work/s.log" "$work/c.log" | grep -c 'bytes in')" = 2 ]
check "a later step: ibv_rc_pingpong between srdma0 and srdma1" $? "server rc=$src client rc=$crc $(tail -q -n 2 "$work/s.log" "$work/c.log" | tr '\n' ' ')"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
