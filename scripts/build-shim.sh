#!/usr/bin/env bash
# Builds softrdma and puts the verbs shim it carries (libibverbs.so.1, librdmacm.so.1, libmlx5.so.1
# and libefa.so.1, their unversioned .so names, and include/softrdma/ofed_xrc.h) in
# target/<profile>/shim/, for the scripts and tests that set LD_LIBRARY_PATH themselves. The shim
# is built and linked with rdma-core's symbol versions by cli/build.rs (verbs-shim/maps/*.map),
# which embeds it in the binary; `softrdma exec` unpacks that copy itself (`softrdma shim-path`).
# Usage: scripts/build-shim.sh [--debug]   (default: release, beside target/release/softrdma)
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
flag=--release
if [ "${1:-}" = "--debug" ]; then
  profile=debug
  flag=
fi
target="${CARGO_TARGET_DIR:-target}"
cargo build $flag --locked -p softrdma --quiet
out="$target/$profile/shim"
cache="$target/$profile/.shim-cache"
mkdir -p -m 700 "$cache"
src=$(SOFTRDMA_SHIM_DIR= SOFTRDMA_CACHE_DIR="$cache" "$target/$profile/softrdma" shim-path)
mkdir -p "$out"
# Each file replaced by a rename (a program running from the old copy keeps its mapping).
for f in libibverbs.so.1 librdmacm.so.1 libmlx5.so.1 libefa.so.1; do
  cp "$src/$f" "$out/$f.tmp.$$"
  mv "$out/$f.tmp.$$" "$out/$f"
done
for l in libibverbs librdmacm libmlx5 libefa; do ln -sfn "$l.so.1" "$out/$l.so"; done
mkdir -p "$out/include/softrdma"
cp "$src/include/softrdma/ofed_xrc.h" "$out/include/softrdma/"
echo "$out"
