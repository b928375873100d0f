#!/usr/bin/env bash
# Regenerates the verbs shim's C bindings (verbs-shim/bindings/verbs.rs and rdma_cma.rs) from the
# installed rdma-core headers with bindgen (its settings: verbs-shim/bindgen/src/lib.rs).
# Needs libibverbs-dev, librdmacm-dev and libclang-dev (scripts/install-deps.sh installs them).
# Review the diff: a changed layout is a changed ABI. The shim's build reads only these files.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --locked --quiet -p softrdma-bindgen -- write
git diff --stat -- verbs-shim/bindings
