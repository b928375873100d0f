#!/usr/bin/env bash
# The README's first command as a fresh machine runs it: only the Rust toolchain and a C compiler.
# As root, in a private mount namespace, rdma-core's headers (/usr/include/infiniband,
# /usr/include/rdma) and every libclang/LLVM library of the system are hidden (mounts over them),
# then `cargo run --release -p softrdma -- demo` builds into a cold target directory and runs the
# demo on a free UDP port; it must print `verdict: OK`. Prints the cold build's time (not judged
# here: BENCHMARKS.md, "Build time", has the figure and how it was measured).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "SKIPPED: scripts/test-fresh-build.sh needs root (a private mount namespace); CI runs it as root"
  exit 0
fi
work=$(mktemp -d /tmp/softrdma-fresh.XXXXXX)
trap 'rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export WORK="$work" PORT="$port"
unshare --mount --propagation private bash -euo pipefail -c '
  empty="$WORK/empty"; : >"$empty"
  mkdir -p "$WORK/emptydir"
  for d in /usr/include/infiniband /usr/include/rdma /usr/lib/llvm-*; do
    [ -d "$d" ] && mount --bind "$WORK/emptydir" "$d"
  done
  # Every libclang and LLVM shared library the dynamic loader or clang-sys could find.
  n=0
  while IFS= read -r f; do
    mount --bind "$empty" "$f"
    n=$((n + 1))
  done < <(find /usr/lib /usr/local/lib /lib -xdev \( -name "libclang*.so*" -o -name "libLLVM*.so*" \) -type f 2>/dev/null)
  # What a fresh machine lacks is really missing here.
  for h in /usr/include/infiniband/verbs.h /usr/include/rdma/rdma_cma.h; do
    [ ! -e "$h" ] || { echo "FAIL: $h still visible"; exit 1; }
  done
  while IFS= read -r f; do
    [ ! -s "$f" ] || { echo "FAIL: $f still readable"; exit 1; }
  done < <(find /usr/lib /usr/local/lib /lib -xdev \( -name "libclang*.so*" -o -name "libLLVM*.so*" \) 2>/dev/null)
  echo "hidden: rdma-core headers (/usr/include/infiniband, /usr/include/rdma) and $n libclang/LLVM libraries"
  start=$SECONDS
  CARGO_TARGET_DIR="$WORK/target" cargo build --release --locked -p softrdma 2>"$WORK/build.log" || {
    tail -n 30 "$WORK/build.log"; echo "FAIL: the cold build of -p softrdma"; exit 1; }
  echo "cold build (cargo build --release -p softrdma): $((SECONDS - start)) s"
  CARGO_TARGET_DIR="$WORK/target" timeout 300 cargo run --release --locked -p softrdma -- demo --port "$PORT" --dir "$WORK/demo" \
    >"$WORK/demo.log" 2>&1 || true
  tail -n 4 "$WORK/demo.log"
  grep -q "^verdict: OK" "$WORK/demo.log" || { echo "FAIL: the demo did not print verdict: OK"; cat "$WORK/demo.log"; exit 1; }
'
echo "fresh-machine build and demo: OK"
