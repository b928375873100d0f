#!/usr/bin/env bash
# Builds the C example programs (examples/c/*.c) against rdma-core's installed headers and
# libraries, as a user builds them, into <target>/examples/. They run on softrdma through the shim
# (`softrdma exec -- PROGRAM`, or LD_LIBRARY_PATH=<target>/release/shim) and unchanged on any
# other RDMA device (rdma_rxe, hardware).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
out="$target/examples"
mkdir -p "$out"
cc="${CC:-cc}"
shim="$target/release/shim"
for src in examples/c/*.c conformance/agent/*.c; do
  name=$(basename "$src" .c)
  if grep -q '<softrdma/ofed_xrc.h>' "$src"; then
    # OFED's XRC verbs: only softrdma's libibverbs.so.1 exports them (as OFED's did), so the
    # program links with it and includes the header installed beside it (scripts/build-shim.sh).
    [ -f "$shim/libibverbs.so.1" ] && [ -f "$shim/include/softrdma/ofed_xrc.h" ] ||
      { echo "build-examples: $src needs the shim: run scripts/build-shim.sh first" >&2; exit 1; }
    "$cc" -O2 -g -Wall -Wextra -Werror -I"$shim/include" -o "$out/$name" "$src" "$shim/libibverbs.so.1" ||
      { echo "build-examples: $src failed to build (needs libibverbs-dev)" >&2; exit 1; }
    continue
  fi
  "$cc" -O2 -g -Wall -Wextra -Werror -o "$out/$name" "$src" -lrdmacm -libverbs -lpthread ||
    { echo "build-examples: $src failed to build (needs libibverbs-dev and librdmacm-dev)" >&2; exit 1; }
done
echo "$out"
