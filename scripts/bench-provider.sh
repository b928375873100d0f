#!/usr/bin/env bash
# The device path against the provider path (SOFTRDMA_DATAPATH=provider), across two devices
# (127.0.0.1, 127.0.0.2), in ONE run with the physical limit beside them: udpbench's busy-poll
# UDP ping-pong (one-way) and its GSO+GRO throughput. ROUNDS (default 3) rounds interleaved; every
# figure of every round is printed (the machine is noisy: compare within a round). Not in CI;
# BENCHMARKS.md "The provider data path" records a run.
# Usage: scripts/bench-provider.sh        (needs scripts/build-shim.sh; builds udpbench)
#        ADDR0=127.0.0.3 ADDR1=127.0.0.4 scripts/bench-provider.sh   (other device addresses)
#        SHIMS="/tmp/shim-before target/release/shim" MODES=provider scripts/bench-provider.sh
#          (builds of the shim against each other, e.g. before and after a data-path change:
#          copy target/release/shim aside before it; every mode runs with every shim)
#        PROGS="ib_write_lat ib_send_lat" scripts/bench-provider.sh   (only these programs)
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_builds
ub=../shared/tools/udpbench
CARGO_TARGET_DIR="$PWD/target/udpbench" cargo build --release -q --manifest-path "$ub/Cargo.toml" || exit 2
udpbench="$PWD/target/udpbench/release/udpbench"
bench_devices "$bin" "${ADDR0:-127.0.0.1}" "${ADDR1:-127.0.0.2}"
# perf SHIM MODE PROG ARGS...: server on srdma0, client on srdma1; prints the client's first
# result row.
perf() {
  local shim=$1 mode=$2 prog=$3
  shift 3
  export LD_LIBRARY_PATH=$shim
  # provider-nohandoff: the provider path with the progress thread always on the socket.
  local dp=${mode%-nohandoff}
  local handoff=${SOFTRDMA_HANDOFF_US:-}
  [ "$mode" != "$dp" ] && handoff=0
  SOFTRDMA_DATAPATH=$dp SOFTRDMA_HANDOFF_US=$handoff perftest_pair "$prog" "$@" | perftest_row
}
# want PROG: whether PROGS (default: all four programs) names PROG.
want() { [[ " ${PROGS:-ib_send_lat ib_write_lat ib_write_bw ib_send_bw} " == *" $1 "* ]]; }
echo "columns: ib_*_lat: bytes iters t_min t_max t_typical t_avg t_stdev p99 p99.9 (us); ib_*_bw: bytes iters BW_peak BW_average (MB/s) MsgRate (Mpps)"
for round in $(seq "${ROUNDS:-3}"); do
  echo "round $round: UDP busy-poll ping-pong: $("$udpbench" lat busy 50000 2>&1 | tr '\n' ' ')"
  echo "round $round: UDP GSO+GRO 64 KiB: $("$udpbench" tput gsogro 4156 3 2>&1 | tr '\n' ' ')"
  for shim in "${shims[@]}"; do
    for mode in ${MODES:-device provider provider-nohandoff}; do
      at=$mode
      [ ${#shims[@]} -gt 1 ] && at="$shim $mode"
      want ib_send_lat && echo "round $round: $at: ib_send_lat 2 B: $(perf "$shim" $mode ib_send_lat -s 2 -n 20000)"
      want ib_write_lat && echo "round $round: $at: ib_write_lat 2 B: $(perf "$shim" $mode ib_write_lat -s 2 -n 20000)"
      want ib_write_bw && echo "round $round: $at: ib_write_bw 64 KiB: $(perf "$shim" $mode ib_write_bw -s 65536 -n 5000)"
      want ib_send_bw && echo "round $round: $at: ib_send_bw 64 B: $(perf "$shim" $mode ib_send_bw -s 64 -n 200000)"
    done
  done
done
