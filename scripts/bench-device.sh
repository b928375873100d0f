#!/usr/bin/env bash
# The device measurements of BENCHMARKS.md, in one run on this machine: the physical limits from
# ../shared/tools/udpbench (plain UDP and GSO+GRO throughput of 4 KiB datagrams, busy-poll UDP
# ping-pong, process_vm_readv), then softrdma's demo workloads without loss (two devices over
# UDP on loopback, with and without GSO, on the device path) and the Rust-API RC ping-pong.
# This is a development measurement of the device, not `softrdma bench` (perftest against UCX and
# libfabric), which does not exist yet.
set -euo pipefail
cd "$(dirname "$0")/.."
ub=../shared/tools/udpbench
[ -d "$ub" ] || { echo "bench-device.sh: $ub is missing" >&2; exit 1; }
CARGO_TARGET_DIR="$PWD/target/udpbench" cargo build --release -q --manifest-path "$ub/Cargo.toml"
udpbench=target/udpbench/release/udpbench
cargo build --release -q -p softrdma -p softrdma-examples --examples --bins
echo "== $(date -u +%F) $(nproc) CPUs, $(uname -r)"
echo "== physical limits (udpbench)"
$udpbench tput plain 4096 2
$udpbench tput gsogro 4096 2
$udpbench lat busy 20000
$udpbench xproc 64 4096
echo "== softrdma demo, no loss, 2000 operations per workload"
target/release/softrdma demo --datapath device --loss 0 --ops 2000 | sed -n '/^workload/,/^total/p'
echo "== the same with --no-gso"
target/release/softrdma demo --datapath device --loss 0 --ops 2000 --no-gso | sed -n '/^workload/,/^total/p'
echo "== RC ping-pong on the Rust API (two in-process devices over UDP)"
target/release/examples/rc_pingpong --size 2 --iters 5000 --port 47990
target/release/examples/rc_pingpong --size 4096 --iters 5000 --port 47990
