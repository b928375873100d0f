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
for src in examples/c/*.c; do
  name=$(basename "$src" .c)
  "$cc" -O2 -g -Wall -Wextra -Werror -o "$out/$name" "$src" -lrdmacm -libverbs -lpthread ||
    { echo "build-examples: $src failed to build (needs libibverbs-dev and librdmacm-dev)" >&2; exit 1; }
done
echo "$out"
