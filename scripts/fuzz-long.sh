#!/usr/bin/env bash
# Long fuzzing (not in CI): runs each fuzz target for FUZZ_SECONDS (default 3600: an hour each),
# JOBS targets at a time (default 1), from the corpus scripts/fuzz-corpus.sh seeds, kept across runs
# in fuzz/corpus/<target>/ (ignored by git). An input that runs over 30 s counts as a hang. A crash
# or hang leaves its input in fuzz/artifacts/<target>/;
# fix it, then keep the input as a regression case in fuzz/regressions/<target>/ (scripts/test.sh
# replays every kept input on each run). Prints each target's final libFuzzer line and writes the
# logs to fuzz/long-<target>.log.
#   bash scripts/fuzz-long.sh                        # all five, an hour each, one after another
#   FUZZ_SECONDS=3600 JOBS=5 nice -n 19 bash scripts/fuzz-long.sh   # all at once, in the background
#   bash scripts/fuzz-long.sh parse_cm_mad           # one target
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-3600}
jobs=${JOBS:-1}
targets=${*:-parse_packet read_capture handle_packet ipc_message parse_cm_mad}
bash scripts/fuzz-corpus.sh fuzz/corpus
cd fuzz
export RUSTC_BOOTSTRAP=1   # cargo fuzz's nightly-only flags on the stable toolchain
cargo fuzz build -O
run() {
  local t=$1
  local rc=0
  cargo fuzz run -O "$t" "corpus/$t" -- -max_total_time="$seconds" -timeout=30 -print_final_stats=1 >"long-$t.log" 2>&1 || rc=$?
  echo "$t: exit $rc; $(grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units)' "long-$t.log" | tr '\n' ' ')"
  return $rc
}
fail=0
for t in $targets; do
  run "$t" &
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || fail=1; done
done
while [ -n "$(jobs -rp)" ]; do wait -n || fail=1; done
if [ -n "$(find artifacts -type f 2>/dev/null)" ]; then
  find artifacts -type f
  echo "fuzz-long: crash or hang inputs above (fuzz/artifacts)"
  fail=1
fi
exit $fail
