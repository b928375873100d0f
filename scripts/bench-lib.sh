# Sourced by the bench-*.sh scripts that run programs between two softrdma devices: a private
# runtime directory, the devices' start and stop, and perftest's server/client pair.
#
#   bench_devices BIN ADDR0 ADDR1   a private runtime dir ($rt), exported with SOFTRDMA_BIN and
#                                   SOFTRDMA_NO_AUTOSTART; starts srdma0 on ADDR0 and srdma1 on
#                                   ADDR1; on exit stops both, kills the script's jobs and removes
#                                   $rt. Exits 2 when a device does not start.
#   perftest_pair PROG ARGS...      PROG's server on srdma0 (port $port + 1), its client on
#                                   $PAIR_CLIENT_DEV (default srdma1) to $addr0, retried while
#                                   the server is not listening yet; prints the client's output.
#   perftest_row                    reads perftest's output, prints its first result row.
#   bench_builds                    sets $target (CARGO_TARGET_DIR or target), $bin (its
#                                   softrdma) and the array $shims: each build of the shim named
#                                   in $SHIMS (default $target/release/shim), as absolute paths.
# The caller's environment (LD_LIBRARY_PATH, SOFTRDMA_DATAPATH, ...) reaches both programs.

bench_builds() {
  target="${CARGO_TARGET_DIR:-target}"
  bin="$(realpath "$target/release/softrdma")"
  shims=()
  for s in ${SHIMS:-$target/release/shim}; do shims+=("$(realpath "$s")"); done
}

bench_devices() {
  bench_bin=$1
  addr0=$2
  addr1=$3
  rt="$(mktemp -d)"
  chmod 700 "$rt"
  export SOFTRDMA_RUNTIME_DIR="$rt" SOFTRDMA_BIN="$bench_bin" SOFTRDMA_NO_AUTOSTART=1
  trap bench_cleanup EXIT
  "$bench_bin" up srdma0 --addr "$addr0" >/dev/null || exit 2
  "$bench_bin" up srdma1 --addr "$addr1" >/dev/null || exit 2
  port=$((21000 + RANDOM % 9000))
}

bench_cleanup() {
  jobs -p | xargs -r kill 2>/dev/null
  "$bench_bin" down srdma0 >/dev/null 2>&1
  "$bench_bin" down srdma1 >/dev/null 2>&1
  rm -rf "$rt"
}

perftest_pair() {
  local prog=$1
  shift
  port=$((port + 1))
  timeout 120 "$prog" -d srdma0 -p $port "$@" >"$rt/s.log" 2>&1 &
  local out=""
  for _ in $(seq 50); do
    sleep 0.1
    out=$(timeout 120 "$prog" -d "${PAIR_CLIENT_DEV:-srdma1}" -p $port "$@" "$addr0" 2>&1) || true
    echo "$out" | grep -q "Couldn't connect" || break
  done
  wait
  echo "$out"
}

perftest_row() {
  awk '/#bytes/ {t=1; next} t && /^ *[0-9]+ +[0-9]+ +[0-9.]+/ {print; exit}' | tr -s ' \t' ' '
}
