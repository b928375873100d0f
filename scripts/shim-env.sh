# Sourced (not run), from the repository root, by the scripts that run programs on the built verbs
# shim (scripts/test-verbs-programs.sh, scripts/test-provider.sh, scripts/test-matrix.sh): sets
# $target, $shim and $bin, and exits 2 when the shim is not built.
target="${CARGO_TARGET_DIR:-target}"
shim="$(realpath "$target/release/shim")"
bin="$(realpath "$target/release/softrdma")"
[ -f "$shim/libibverbs.so.1" ] || { echo "no shim in $shim: run scripts/build-shim.sh" >&2; exit 2; }

# A private runtime directory, $rt (mode 0700): the devices started in it are the run's alone,
# and go away with it. The programs load the shim, find `softrdma` and start no device.
private_runtime() {
  rt="$(mktemp -d)"
  chmod 700 "$rt"
  export SOFTRDMA_RUNTIME_DIR="$rt" SOFTRDMA_BIN="$bin" SOFTRDMA_NO_AUTOSTART=1
  export LD_LIBRARY_PATH="$shim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# The EXIT trap's work: stops the run's background jobs and its devices (the arguments), and
# removes $rt.
stop_run() {
  local dev
  jobs -p | xargs -r kill 2>/dev/null
  for dev in "$@"; do
    timeout 15 "$bin" down "$dev" >/dev/null 2>&1
  done
  rm -rf "$rt"
}

# Starts srdma0 on $addr0 and srdma1 on $addr1 (127.0.0.1 and 127.0.0.2 unless
# $SOFTRDMA_TEST_ADDR0 and $SOFTRDMA_TEST_ADDR1 say otherwise); exits 2 if either fails.
up_two_devices() {
  addr0="${SOFTRDMA_TEST_ADDR0:-127.0.0.1}"
  addr1="${SOFTRDMA_TEST_ADDR1:-127.0.0.2}"
  "$bin" up srdma0 --addr "$addr0" >/dev/null || exit 2
  "$bin" up srdma1 --addr "$addr1" >/dev/null || exit 2
}
