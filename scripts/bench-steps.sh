#!/usr/bin/env bash
# Measures the same perftest workloads on several revisions of softrdma in ONE run, so that each
# optimisation step of BENCHMARKS.md has its before and after from the same sitting (these
# machines are noisy; only ratios within one run count).
# Usage: scripts/bench-steps.sh [--iters-scale N] REV...    (e.g. d573c0f 107276b HEAD)
# Each revision is checked out with `git worktree` under target/steps/<rev> and built there
# (softrdma and the verbs shim), once. Then every workload runs on every revision in turn,
# ROUNDS times (default 2) interleaved, and the best of the rounds is kept per cell (the
# machine's noise only ever makes a run slower). Devices: 127.0.0.41 and 127.0.0.42.
set -euo pipefail
cd "$(dirname "$0")/.."
scale=1
if [ "${1:-}" = "--iters-scale" ]; then scale=$2; shift 2; fi
[ $# -ge 1 ] || { echo "usage: scripts/bench-steps.sh [--iters-scale N] REV..." >&2; exit 2; }
root="$PWD"
cmdline="scripts/bench-steps.sh $*"
revs=()
for r in "$@"; do
  c=$(git rev-parse --short=7 "$r^{commit}")
  revs+=("$c")
  dir="$root/target/steps/$c"
  if [ ! -x "$dir/target/release/softrdma" ] || [ ! -f "$dir/target/release/shim/libibverbs.so.1" ]; then
    echo "== building $c in $dir" >&2
    [ -d "$dir/src" ] || git worktree add --detach -f "$dir/src" "$c" >/dev/null
    (cd "$dir/src" && CARGO_TARGET_DIR="$dir/target" bash scripts/build-shim.sh >/dev/null)
  fi
done
rounds=${ROUNDS:-2}
rt="$(mktemp -d)"
chmod 700 "$rt"
export SOFTRDMA_RUNTIME_DIR="$rt" SOFTRDMA_NO_AUTOSTART=1
current=""
down() {
  [ -n "$current" ] || return 0
  timeout 15 "$current" down srdma0 >/dev/null 2>&1 || true
  timeout 15 "$current" down srdma1 >/dev/null 2>&1 || true
}
trap 'down; rm -rf "$rt"' EXIT
up() { # rev
  down
  current="$root/target/steps/$1/target/release/softrdma"
  "$current" up srdma0 --addr 127.0.0.41 >/dev/null
  "$current" up srdma1 --addr 127.0.0.42 >/dev/null
}
port=$((21000 + RANDOM % 9000))
# run REV PROG CLIENT_DEV SIZE ITERS: prints the figure (bw: MB/s average; lat: typical us)
run() {
  local rev=$1 prog=$2 cdev=$3 size=$4 n=$5 shim="$root/target/steps/$1/target/release/shim"
  port=$((port + 1))
  LD_LIBRARY_PATH="$shim" timeout 120 "$prog" -d srdma0 -p $port -s "$size" -n "$n" >"$rt/s.log" 2>&1 &
  local spid=$! out=""
  for _ in $(seq 50); do
    sleep 0.1
    out=$(LD_LIBRARY_PATH="$shim" timeout 120 "$prog" -d "$cdev" -p $port -s "$size" -n "$n" 127.0.0.41 2>&1) || true
    echo "$out" | grep -q "Couldn't connect" || break
  done
  wait $spid || true
  local row
  row=$(echo "$out" | awk '/#bytes/ {t=1; next} t && /^ *[0-9]+ +[0-9]+ +[0-9.]+/ {print; exit}')
  case $prog in
    *_lat) echo "$row" | awk '{print $5}' ;;
    *) echo "$row" | awk '{print $4}' ;;
  esac
}
work=(
  "ib_write_bw srdma1 65536 $((5000 * scale))"
  "ib_write_bw srdma0 65536 $((5000 * scale))"
  "ib_read_bw srdma1 65536 $((5000 * scale))"
  "ib_send_bw srdma1 65536 $((5000 * scale))"
  "ib_send_bw srdma1 64 $((20000 * scale))"
  "ib_send_lat srdma1 2 $((10000 * scale))"
  "ib_send_lat srdma0 2 $((10000 * scale))"
  "ib_write_lat srdma1 2 $((10000 * scale))"
)
declare -A best
for round in $(seq "$rounds"); do
  for rev in "${revs[@]}"; do
    up "$rev"
    for w in "${work[@]}"; do
      set -- $w
      v=$(run "$rev" "$1" "$2" "$3" "$4")
      [ -n "$v" ] || v=nan
      key="$rev|$w"
      prev=${best[$key]:-}
      case $1 in
        *_lat) better=$(awk -v a="$v" -v b="${prev:-inf}" 'BEGIN {print (b == "inf" || (a != "nan" && a + 0 < b + 0)) ? a : b}') ;;
        *) better=$(awk -v a="$v" -v b="${prev:-0}" 'BEGIN {print (a != "nan" && a + 0 > b + 0) ? a : b}') ;;
      esac
      best[$key]=$better
      echo "round $round $rev $w: $v" >&2
    done
  done
done
down
current=""
echo "Run: $cmdline on $(date -u '+%F %H:%M UTC'), $(nproc) CPUs, kernel $(uname -r); best of $rounds rounds."
echo "Bandwidth: perftest's BW average (MiB/s); latency: its t_typical (one-way, us). \"across\": server on srdma0 (127.0.0.41), client on srdma1 (127.0.0.42); \"within\": both on srdma0."
echo
printf '| workload |'
for rev in "${revs[@]}"; do printf ' %s |' "$rev"; done
printf ' last / first |\n|---|'
for _ in "${revs[@]}"; do printf -- '---|'; done
printf -- '---|\n'
for w in "${work[@]}"; do
  set -- $w
  where=across
  [ "$2" = srdma0 ] && where=within
  unit="MiB/s"
  case $1 in *_lat) unit="us" ;; esac
  printf '| %s -s %s, %s (%s) |' "$1" "$3" "$where" "$unit"
  for rev in "${revs[@]}"; do printf ' %s |' "${best[$rev|$w]:-nan}"; done
  first=${best[${revs[0]}|$w]:-nan}
  last=${best[${revs[-1]}|$w]:-nan}
  awk -v a="$last" -v b="$first" 'BEGIN {if (b + 0 > 0) printf " %.2f |\n", a / b; else print " - |"}'
done
