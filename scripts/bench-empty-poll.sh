#!/usr/bin/env bash
# The cost of an empty ibv_poll_cq on the provider path (scripts/empty-poll.c), for one or more
# builds of the shim, ROUNDS (default 3) rounds interleaved. Not in CI; BENCHMARKS.md "The empty
# poll" records a run.
# Usage: scripts/bench-empty-poll.sh                (needs scripts/build-shim.sh)
#        SHIMS="/tmp/shim-before target/release/shim" scripts/bench-empty-poll.sh
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_builds
prog="$target/empty-poll"
cc -O2 -o "$prog" scripts/empty-poll.c -libverbs || exit 2
bench_devices "$bin" "${ADDR0:-127.0.0.1}" "${ADDR1:-127.0.0.2}"
export SOFTRDMA_DATAPATH=provider
for round in $(seq "${ROUNDS:-3}"); do
  for shim in "${shims[@]}"; do
    echo "round $round: $shim: $(LD_LIBRARY_PATH=$shim "$prog" 2>&1)"
  done
done
