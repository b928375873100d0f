#!/usr/bin/env bash
# Event-driven programs (they arm a CQ and sleep on its completion channel) across two devices
# (127.0.0.1, 127.0.0.2): lnet_bulk (the o2iblnd pattern, examples/c) and perftest with -e, and
# for comparison ib_send_lat / ib_write_lat without a channel. ROUNDS (default 4) rounds
# interleaved; every figure of every round is printed (the machine is noisy: compare within a
# round). Not in CI; BENCHMARKS.md "Progress threads that keep looking while the application
# sleeps" records a run.
# Usage: scripts/bench-events.sh         (needs scripts/build-shim.sh and scripts/build-examples.sh)
#        SHIMS="/tmp/shim-before target/release/shim" scripts/bench-events.sh
#          (builds of the shim against each other: copy target/release/shim aside first; each
#          round runs every shim on the provider path, then the last shim on the device path)
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_builds
lnet="$(realpath "$target/examples/lnet_bulk" 2>/dev/null)" || { echo "no $target/examples/lnet_bulk: run scripts/build-examples.sh" >&2; exit 2; }
bench_devices "$bin" "${ADDR0:-127.0.0.1}" "${ADDR1:-127.0.0.2}"
# lnet PEERS COUNT [--verify]: the client's MB/s.
lnet() {
  port=$((port + 1))
  timeout 120 "$lnet" --server --addr "$addr0" --port $port --peers "$1" >"$rt/s.log" 2>&1 &
  local out=""
  for _ in $(seq 50); do
    sleep 0.1
    out=$(timeout 120 "$lnet" --client "$addr0" --src "$addr1" --port $port --peers "$1" --count "$2" "${@:3}" 2>&1) || true
    echo "$out" | grep -q "OK client" && break
    echo "$out" | grep -q "UNREACHABLE\|REJECTED\|refused" || break
  done
  wait
  echo "$out" | awk '/OK client/ { for (i = 1; i < NF; i++) if ($i == "MB/s") print $(i + 1) }'
}
# perf PROG ARGS...: server on srdma0, client on srdma1; prints the client's first result row.
perf() { perftest_pair "$@" | perftest_row; }
lat() { perf "$@" | awk '{print $5 " (p99 " $8 ")"}'; }
echo "columns: lnet_bulk MB/s; ib_*_lat typical (p99) us; ib_send_bw -e 64 B M msg/s; ib_read_bw -e 4 KiB MB/s"
for round in $(seq "${ROUNDS:-4}"); do
  for shim in "${shims[@]}"; do
    export LD_LIBRARY_PATH=$shim SOFTRDMA_DATAPATH=provider
    echo "round $round provider $shim"
    echo "  lnet_bulk 1 x 64: $(lnet 1 64)  8 x 16: $(lnet 8 16)  8 x 16 --verify: $(lnet 8 16 --verify)"
    echo "  ib_send_lat -e: $(lat ib_send_lat -e -n 5000)  ib_send_bw -e 64: $(perf ib_send_bw -e -s 64 -n 50000 | awk '{print $5}')  ib_read_bw -e 4096: $(perf ib_read_bw -e -s 4096 -n 20000 | awk '{print $4}')"
    echo "  ib_send_lat: $(lat ib_send_lat -n 5000)  ib_write_lat: $(lat ib_write_lat -n 5000)"
  done
  export SOFTRDMA_DATAPATH=device
  echo "round $round device ${shims[-1]}"
  echo "  lnet_bulk 1 x 64: $(lnet 1 64)  8 x 16: $(lnet 8 16)  8 x 16 --verify: $(lnet 8 16 --verify)  ib_send_lat -e: $(lat ib_send_lat -e -n 5000)"
done
