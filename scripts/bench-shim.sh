#!/usr/bin/env bash
# The verbs-shim measurements of BENCHMARKS.md, in one run: the physical limit (udpbench busy-poll
# UDP ping-pong), the Rust-API RC ping-pong example, and unchanged ibv_rc_pingpong through the
# shim (one device, and two devices on 127.0.0.1/127.0.0.2), at 64 B and 64 KiB.
# This is a development measurement, not `softrdma bench` (perftest against UCX and libfabric).
set -euo pipefail
cd "$(dirname "$0")/.."
ub=../shared/tools/udpbench
[ -d "$ub" ] || { echo "bench-shim.sh: $ub is missing" >&2; exit 1; }
CARGO_TARGET_DIR="$PWD/target/udpbench" cargo build --release -q --manifest-path "$ub/Cargo.toml"
udpbench=target/udpbench/release/udpbench
cargo build --release -q -p softrdma-examples --examples
bash scripts/build-shim.sh >/dev/null
bin="$PWD/target/release/softrdma"
rt="$(mktemp -d)"
chmod 700 "$rt"
export SOFTRDMA_RUNTIME_DIR="$rt" SOFTRDMA_NO_AUTOSTART=1
trap 'timeout 15 "$bin" down srdma0 >/dev/null 2>&1; timeout 15 "$bin" down srdma1 >/dev/null 2>&1; rm -rf "$rt"' EXIT
iters=${ITERS:-5000}
echo "== $(date -u +%F) $(nproc) CPUs, $(uname -r)"
echo "== physical limit: busy-poll UDP ping-pong (udpbench)"
$udpbench lat busy 20000
echo "== Rust API RC ping-pong (two in-process devices over UDP)"
for s in 64 65536; do target/release/examples/rc_pingpong --size $s --iters "$iters" --port 47990 | tail -1; done
"$bin" up srdma0 --addr 127.0.0.1 >/dev/null
"$bin" up srdma1 --addr 127.0.0.2 >/dev/null
port=18600
for s in 64 65536; do
  for c in srdma0 srdma1; do
    port=$((port + 1))
    echo "== ibv_rc_pingpong -s $s, server on srdma0, client on $c (unchanged binary, through the shim)"
    LD_LIBRARY_PATH="$PWD/target/release/shim" timeout 120 ibv_rc_pingpong -g 0 -d srdma0 -s $s -n "$iters" -p $port >/dev/null &
    sleep 0.3
    LD_LIBRARY_PATH="$PWD/target/release/shim" timeout 120 ibv_rc_pingpong -g 0 -d $c -s $s -n "$iters" -p $port 127.0.0.1 | tail -2
    wait
  done
done
