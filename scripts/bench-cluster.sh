#!/usr/bin/env bash
# Middleware over softrdma against what users would pick instead, between the same two
# `softrdma cluster` hosts in one run: UCX (ucx_perftest, UCP tag matching and put) over
# softrdma's rc_verbs and ud_verbs vs UCX over tcp; the raw UDP round trip
# (../shared/tools/udpbench, the physical limit; run inside a host) when it is there; and an MPI
# ping-pong over Open MPI's pml ucx on softrdma vs its tcp btl. Needs root.
# Usage: scripts/bench-cluster.sh [--iters N]   (prints a markdown table)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench-cluster.sh: needs root (softrdma cluster)" >&2; exit 2; }
iters=2000
[ "${1:-}" = --iters ] && iters=$2
shim=$(bash scripts/build-shim.sh | tail -n 1)
bin=$(cd "$shim/.." && pwd)/softrdma
"$bin" cluster down >/dev/null 2>&1 || true
"$bin" cluster up --hosts 2 >/dev/null
trap '"$bin" cluster down >/dev/null 2>&1' EXIT
a1=$("$bin" cluster status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["hosts"][0]["addr"])')
# The client's Final line: latency (us, typical) or bandwidth (MB/s, average).
perf() { # tls test size col
  "$bin" cluster exec 1 -- env UCX_TLS="$1" timeout 120 ucx_perftest -p 13338 >/dev/null 2>&1 &
  sleep 1
  local line
  line=$("$bin" cluster exec 2 -- env UCX_TLS="$1" timeout 120 ucx_perftest "$a1" -p 13338 -t "$2" -s "$3" -n "$iters" 2>/dev/null | grep '^Final:')
  wait
  echo "$line" | awk -v c="$4" '{print $c}'
}
echo "| transport (UCX_TLS) | tag_lat 8 B (us) | tag_bw 64 KiB (MB/s) | ucp_put_bw 64 KiB (MB/s) |"
echo "| --- | ---: | ---: | ---: |"
for tls in rc_v,self ud_v,self tcp; do
  lat=$(perf "$tls" tag_lat 8 3)
  bw=$(perf "$tls" tag_bw 65536 6)
  put=$(perf "$tls" ucp_put_bw 65536 6)
  echo "| $tls | $lat | $bw | $put |"
done
# MPI ping-pong (scripts/cluster/mpi_check.c, 8 B, checked data) between the two hosts: Open MPI's
# pml ucx over softrdma's rc_verbs vs its ob1 pml with the tcp btl.
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  work=$(mktemp -d)
  mpicc -O1 -o "$work/mpi_check" scripts/cluster/mpi_check.c
  a2=$("$bin" cluster status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["hosts"][1]["addr"])')
  printf '%s slots=1\n%s slots=1\n' "$a1" "$a2" >"$work/hosts"
  mpi() {
    "$bin" cluster exec 1 -- timeout 300 mpirun --allow-run-as-root --mca plm_rsh_agent "$bin cluster rsh" \
      --hostfile "$work/hosts" -np 2 "$@" "$work/mpi_check" 8 "$iters" 2>/dev/null |
      sed -n 's/^pingpong rank 1: .*rtt \([0-9.]*\) us$/\1/p' || true
  }
  ucx_rtt=$(mpi --mca pml ucx -x UCX_TLS=rc_v,self -x OMPI_MCA_pml_ucx_devices=any)
  tcp_rtt=$(mpi --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include eth0)
  echo
  echo "| MPI ping-pong 8 B (Open MPI) | round trip (us) |"
  echo "| --- | ---: |"
  echo "| pml ucx, UCX_TLS=rc_v,self (softrdma) | ${ucx_rtt:-failed} |"
  echo "| pml ob1, btl tcp | ${tcp_rtt:-failed} |"
  rm -rf "$work"
fi
ub=../shared/tools/udpbench
if [ -d "$ub" ] && CARGO_TARGET_DIR="$PWD/target/udpbench" cargo build --release -q --manifest-path "$ub/Cargo.toml"; then
  echo
  echo "The UDP floor in a host (udpbench, busy-poll ping-pong and 4 KiB throughput, in host 1):"
  echo '```'
  "$bin" cluster exec 1 -- "$PWD/target/udpbench/release/udpbench" lat busy 20000
  "$bin" cluster exec 1 -- "$PWD/target/udpbench/release/udpbench" tput plain 4096 2
  echo '```'
fi
