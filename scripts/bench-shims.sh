#!/usr/bin/env bash
# Two (or more) builds of the shim against each other on the same daemons, in ONE run, rounds
# interleaved, with the UDP floor measured in each round: ib_send_lat 2 B, ib_write_lat 2 B and
# ib_send_bw 64 B across two devices. For before/after figures of a data-path change
# (BENCHMARKS.md "Without the signal mask"). Not in CI.
# Usage: cp -a target/release/shim /tmp/shim-before   # before the change
#        (change, scripts/build-shim.sh)
#        ROUNDS=3 DP=provider scripts/bench-shims.sh /tmp/shim-before target/release/shim
# DP: provider (default) or device; ADDR0/ADDR1: the devices' addresses (127.0.0.3, 127.0.0.4).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 SHIM_DIR..." >&2; exit 2; }
shims=()
for s in "$@"; do shims+=("$(realpath "$s")"); done
bin="$(realpath "${CARGO_TARGET_DIR:-target}/release/softrdma")"
ub=../shared/tools/udpbench
CARGO_TARGET_DIR="$PWD/target/udpbench" cargo build --release -q --manifest-path "$ub/Cargo.toml" || exit 2
udpbench="$PWD/target/udpbench/release/udpbench"
rt="$(mktemp -d)"
chmod 700 "$rt"
export SOFTRDMA_RUNTIME_DIR="$rt" SOFTRDMA_BIN="$bin" SOFTRDMA_NO_AUTOSTART=1
cleanup() {
  jobs -p | xargs -r kill 2>/dev/null
  "$bin" down srdma0 >/dev/null 2>&1
  "$bin" down srdma1 >/dev/null 2>&1
  rm -rf "$rt"
}
trap cleanup EXIT
addr0=${ADDR0:-127.0.0.3}
"$bin" up srdma0 --addr "$addr0" >/dev/null || exit 2
"$bin" up srdma1 --addr "${ADDR1:-127.0.0.4}" >/dev/null || exit 2
port=$((21000 + RANDOM % 9000))
# run SHIM PROG ARGS...: server on srdma0, client on srdma1; prints the client's first result row.
run() {
  local shim=$1 prog=$2
  shift 2
  port=$((port + 1))
  LD_LIBRARY_PATH=$shim SOFTRDMA_DATAPATH=${DP:-provider} timeout 120 "$prog" -d srdma0 -p $port "$@" >"$rt/s.log" 2>&1 &
  local out=""
  for _ in $(seq 50); do
    sleep 0.1
    out=$(LD_LIBRARY_PATH=$shim SOFTRDMA_DATAPATH=${DP:-provider} timeout 120 "$prog" -d srdma1 -p $port "$@" "$addr0" 2>&1) || true
    echo "$out" | grep -q "Couldn't connect" || break
  done
  wait
  echo "$out" | awk '/#bytes/ {t=1; next} t && /^ *[0-9]+ +[0-9]+ +[0-9.]+/ {print; exit}' | tr -s ' \t' ' '
}
echo "columns: ib_*_lat: bytes iters t_min t_max t_typical t_avg t_stdev p99 p99.9 (us); ib_send_bw: bytes iters BW_peak BW_average (MB/s) MsgRate (Mpps)"
for round in $(seq "${ROUNDS:-3}"); do
  echo "round $round: UDP busy-poll ping-pong: $("$udpbench" lat busy 50000 2>&1 | tr '\n' ' ')"
  for s in "${shims[@]}"; do
    echo "round $round: $s: ib_send_lat 2 B: $(run "$s" ib_send_lat -s 2 -n 20000)"
    echo "round $round: $s: ib_write_lat 2 B: $(run "$s" ib_write_lat -s 2 -n 20000)"
    echo "round $round: $s: ib_send_bw 64 B: $(run "$s" ib_send_bw -s 64 -n 200000)"
  done
done
