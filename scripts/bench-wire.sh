#!/usr/bin/env bash
# The wire benchmark of BENCHMARKS.md: criterion timings of parse + ICRC verify next to a bare
# crc32fast pass over the same bytes (one run), then instruction counts per packet from callgrind
# (repeatable on a noisy machine).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -p softrdma-engine --bench parse_icrc -- --warm-up-time 2 --measurement-time 5 2>&1 |
  grep -E '^rocev2|time:|thrpt:' | grep -v '%'
cargo build --release -q -p softrdma-engine --example parse_profile
if command -v valgrind >/dev/null; then
  n=20000
  for size in 64 4096; do
    for mode in bare view parse; do
      ir=$(MODE=$mode valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        target/release/examples/parse_profile "$size" "$n" 2>&1 | awk '/refs:/ {gsub(",", "", $4); print $4}')
      echo "callgrind payload=${size}B mode=$mode instructions/packet=$((ir / n))"
    done
  done
fi
