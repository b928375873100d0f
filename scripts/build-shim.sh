#!/usr/bin/env bash
# Builds the verbs shim: libibverbs.so.1, librdmacm.so.1, libmlx5.so.1 and libefa.so.1 (and their
# unversioned .so names) in target/<profile>/shim/ (with include/softrdma/ofed_xrc.h), from the softrdma-verbs-shim static
# library relinked with rdma-core's symbol versions (verbs-shim/maps/*.map; a Rust cdylib cannot
# carry versioned symbols).
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
cargo build $flag --locked -p softrdma-verbs-shim -p softrdma --quiet
lib="$target/$profile/libsoftrdma_verbs_shim.a"
out="$target/$profile/shim"
mkdir -p "$out"
link() { # soname map: pulls in exactly the map's symbols (and what they need) from the archive
  local undef=()
  for s in $(sed -n 's/^    \([A-Za-z0-9_]*\);$/\1/p' verbs-shim/maps/"$2"); do undef+=("-Wl,-u,$s"); done
  local extra=()
  # ibv_query_gid_type's aliases (c/symver.c) are referenced by no one: pull them in by name.
  [ "$2" = ibverbs.map ] && extra=(-Wl,-u,softrdma_query_gid_type_34 -Wl,-u,softrdma_query_gid_type_25)
  cc -shared -o "$out/$1.tmp.$$" -Wl,-soname,"$1" -Wl,--version-script=verbs-shim/maps/"$2" \
    -Wl,--gc-sections -Wl,-z,now -Wl,-z,relro "${undef[@]}" "${extra[@]}" \
    "$lib" -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
  mv "$out/$1.tmp.$$" "$out/$1"
}
link libibverbs.so.1 ibverbs.map
link librdmacm.so.1 rdmacm.map
link libmlx5.so.1 mlx5.map
link libefa.so.1 efa.map
# The unversioned names too: NCCL and some middleware dlopen "libibverbs.so" / "libmlx5.so" first,
# which would otherwise miss the shim directory and load the system's libraries.
for l in libibverbs librdmacm libmlx5 libefa; do ln -sfn "$l.so.1" "$out/$l.so"; done
# The header of the OFED XRC verbs the library also exports (verbs-shim/src/ofed_xrc.rs).
mkdir -p "$out/include/softrdma"
cp verbs-shim/include/softrdma/ofed_xrc.h "$out/include/softrdma/"
echo "$out"
