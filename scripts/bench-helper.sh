#!/usr/bin/env bash
# Verbs programs with clients reached directly (process_vm_readv/writev) and through their memory
# helper (SOFTRDMA_MEMORY_HELPER=1, the fallback where the kernel refuses cross-process access),
# across two devices (127.0.0.1, 127.0.0.2): ibv_rc_pingpong 8 KiB, ib_write_bw and ib_read_bw
# 64 KiB, ib_atomic_lat. One line per run (what the program printed). Not in CI; BENCHMARKS.md
# "Memory helper" records a run.
# Usage: scripts/bench-helper.sh [SOFTRDMA_BINARY SHIM_DIR LABEL]   (default: this build)
set -uo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
bin="$(realpath "${1:-$target/release/softrdma}")"
shim="$(realpath "${2:-$target/release/shim}")"
label="${3:-this build}"
export LD_LIBRARY_PATH="$shim"
# The memory helper is how the daemon reaches a client: the device path (not the default since
# stop 41, when each program runs its own QPs).
export SOFTRDMA_DATAPATH="${SOFTRDMA_DATAPATH:-device}"
. scripts/bench-lib.sh
bench_devices "$bin" 127.0.0.1 127.0.0.2
# Server on srdma0, client on srdma1 (port $3): the client's output is kept.
pair() {
  local helper=$1 server=$2 client=$3
  SOFTRDMA_MEMORY_HELPER=$helper timeout 60 $server >"$rt/server.log" 2>&1 &
  sleep 0.7
  SOFTRDMA_MEMORY_HELPER=$helper timeout 60 $client 127.0.0.1 >"$rt/client.log" 2>&1
  wait
}
for helper in 0 1; do
  mode=$([ $helper = 1 ] && echo "through the helper" || echo "direct")
  pair $helper "ibv_rc_pingpong -d srdma0 -g 0 -s 8192 -n 3000 -p 18600" "ibv_rc_pingpong -d srdma1 -g 0 -s 8192 -n 3000 -p 18600"
  echo "$label, $mode: ibv_rc_pingpong 8 KiB: $(grep usec/iter "$rt/client.log")"
  pair $helper "ib_write_bw -d srdma0 -x 0 -s 65536 -n 3000 -p 18601" "ib_write_bw -d srdma1 -x 0 -s 65536 -n 3000 -p 18601"
  echo "$label, $mode: ib_write_bw 64 KiB (bytes iters peak average MB/s, Mmsg/s): $(grep -A1 'BW average' "$rt/client.log" | tail -1 | tr -s ' \t' ' ')"
  pair $helper "ib_read_bw -d srdma0 -x 0 -s 65536 -n 2000 -p 18602" "ib_read_bw -d srdma1 -x 0 -s 65536 -n 2000 -p 18602"
  echo "$label, $mode: ib_read_bw 64 KiB (bytes iters peak average MB/s, Mmsg/s): $(grep -A1 'BW average' "$rt/client.log" | tail -1 | tr -s ' \t' ' ')"
  pair $helper "ib_atomic_lat -d srdma0 -x 0 -n 2000 -p 18603" "ib_atomic_lat -d srdma1 -x 0 -n 2000 -p 18603"
  echo "$label, $mode: ib_atomic_lat (bytes iters min max typical avg stdev p99 p99.9 us): $(grep -A1 't_avg' "$rt/client.log" | tail -1 | tr -s ' \t' ' ')"
done
