#!/usr/bin/env bash
# rdma_cm's route step with a warm and a cold path record cache, from one run: cmtime's
# per-connection step times (us / conn) for N connections from a client device whose cache keeps
# paths (the default, 30 s) and from one whose cache keeps nothing (--path-cache-ttl 0: every
# rdma_resolve_route looks the path up in the routing and neighbour tables), interleaved,
# ROUNDS times (default 3); the median of the rounds per cell. The address step (a round trip to
# the device with no lookup behind it) is printed beside it as the floor of any device call.
# Usage: scripts/bench-cm-route.sh [CONNECTIONS]     (needs scripts/build-shim.sh first)
# Devices: 127.0.0.51 (server), 127.0.0.52 (warm client), 127.0.0.53 (cold client).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000}
rounds=${ROUNDS:-3}
target="${CARGO_TARGET_DIR:-target}"
bin="$(realpath "$target/release/softrdma")"
shim="$(realpath "$target/release/shim")"
command -v cmtime >/dev/null || { echo "cmtime missing: run scripts/install-deps.sh" >&2; exit 2; }
rt="$(mktemp -d)"
chmod 700 "$rt"
export SOFTRDMA_RUNTIME_DIR="$rt" SOFTRDMA_BIN="$bin" SOFTRDMA_NO_AUTOSTART=1 LD_LIBRARY_PATH="$shim"
cleanup() {
  jobs -p | xargs -r kill 2>/dev/null
  for d in rs rw rc; do timeout 15 "$bin" down "$d" >/dev/null 2>&1; done
  rm -rf "$rt"
}
trap cleanup EXIT
"$bin" up rs --addr 127.0.0.51 >/dev/null
"$bin" up rw --addr 127.0.0.52 >/dev/null
"$bin" up rc --addr 127.0.0.53 --path-cache-ttl 0 >/dev/null
port=$((20000 + RANDOM % 11000)) # below the ephemeral range (scripts/programs-lib.sh)
cmtime -p "$port" >/dev/null 2>&1 &
for _ in $(seq 100); do "$bin" cm-ids rs | grep -q "state LISTEN" && break; sleep 0.1; done
# One connection from the warm client first: its cache holds the path before the measured runs.
cmtime -s 127.0.0.51 -b 127.0.0.52 -p "$port" -c 1 >/dev/null
step() { # log step-name: us / conn
  awk -v s="$2" -F: '$1 ~ "^"s" *$" {split($2, f, " "); print f[4]}' "$1"
}
declare -A cell
for r in $(seq "$rounds"); do
  for side in warm cold; do
    b=127.0.0.52
    [ $side = cold ] && b=127.0.0.53
    log="$rt/$side.$r.log"
    cmtime -s 127.0.0.51 -b "$b" -p "$port" -c "$n" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
    cell[$side.route]+="$(step "$log" "resolve route") "
    cell[$side.addr]+="$(step "$log" "resolve addr") "
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
hits() { "$bin" stat "$1" | awk '$1 == "path_cache_hits" {h=$2} $1 == "path_cache_misses" {m=$2} END {print h" hits, "m" misses"}'; }
echo "scripts/bench-cm-route.sh $n (ROUNDS=$rounds), $(date -u +%F), $(nproc) cores"
echo
echo "| client device's path cache | resolve route, us / conn | resolve addr, us / conn | cache counters |"
echo "| --- | ---: | ---: | --- |"
echo "| warm (default, 30 s) | $(echo "${cell[warm.route]}" | median) | $(echo "${cell[warm.addr]}" | median) | $(hits rw) |"
echo "| cold (--path-cache-ttl 0) | $(echo "${cell[cold.route]}" | median) | $(echo "${cell[cold.addr]}" | median) | $(hits rc) |"
