#!/usr/bin/env bash
# What the capture costs: ib_write_bw -s 65536 across two devices (srdma0, srdma1), alternately
# with the capture off and on (`--pcap` on both devices), ROUNDS times each in the same run; prints
# each run's average bandwidth and the frames the captures lost, then the medians and their ratio.
# Usage: scripts/bench-capture.sh [ROUNDS (default 5)] [DIR for the captures (default /dev/shm)]
# Needs scripts/build-shim.sh and perftest. Not a test: it judges nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
capdir="${2:-/dev/shm}"
target="${CARGO_TARGET_DIR:-target}"
shim="$(realpath "$target/release/shim")"
bin="$(realpath "$target/release/softrdma")"
rt="$(mktemp -d)"
chmod 700 "$rt"
export SOFTRDMA_RUNTIME_DIR="$rt" SOFTRDMA_NO_AUTOSTART=1 LD_LIBRARY_PATH="$shim"
addr0="${SOFTRDMA_TEST_ADDR0:-127.0.0.91}" addr1="${SOFTRDMA_TEST_ADDR1:-127.0.0.92}"
trap '"$bin" down srdma0 >/dev/null 2>&1; "$bin" down srdma1 >/dev/null 2>&1; rm -rf "$rt" "$capdir"/softrdma-bench-capture-*.pcap' EXIT
port=$((20000 + RANDOM % 10000))
one() { # off|on: prints the client's average MB/s, then the frames lost
  local f0=() f1=()
  if [ "$1" = on ]; then
    f0=(--pcap "$capdir/softrdma-bench-capture-0.pcap")
    f1=(--pcap "$capdir/softrdma-bench-capture-1.pcap")
  fi
  "$bin" up srdma0 --addr "$addr0" "${f0[@]}" >/dev/null && "$bin" up srdma1 --addr "$addr1" "${f1[@]}" >/dev/null || exit 2
  port=$((port + 1))
  timeout 120 ib_write_bw -d srdma0 -x 0 -p "$port" -s 65536 -n 5000 >"$rt/s.log" 2>&1 &
  local spid=$!
  sleep 0.5
  timeout 120 ib_write_bw -d srdma1 -x 0 -p "$port" -s 65536 -n 5000 "$addr0" >"$rt/c.log" 2>&1
  wait "$spid"
  local lost=0 d
  for d in srdma0 srdma1; do
    lost=$((lost + $("$bin" stat $d | awk '$1 == "capture_dropped" {print $2}')))
  done
  "$bin" down srdma0 >/dev/null
  "$bin" down srdma1 >/dev/null
  rm -f "$capdir"/softrdma-bench-capture-*.pcap
  echo "$(awk '/#bytes/ {getline; print $4}' "$rt/c.log") $lost"
}
offs=() ons=()
for r in $(seq "$rounds"); do
  read -r off _ < <(one off)
  read -r on lost < <(one on)
  echo "round $r: capture off ${off:-?} MB/s, on ${on:-?} MB/s (frames lost: ${lost:-?})"
  offs+=("${off:-0}")
  ons+=("${on:-0}")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
m_off=$(median "${offs[@]}")
m_on=$(median "${ons[@]}")
echo "median: off $m_off MB/s, on $m_on MB/s, ratio $(awk -v a="$m_on" -v b="$m_off" 'BEGIN {printf "%.2f", (b > 0) ? a / b : 0}')"
