#!/usr/bin/env bash
# Step 2 of the GitHub Actions action (action.yml): starts the devices and exports them.
# Environment:
#   SOFTRDMA_BIN  the installed softrdma (step 1)
#   DEVICES       "NAME=ADDRESS ..." (default "srdma0=127.0.0.1"); each device on its address
#   RUNTIME_DIR   optional: the devices' runtime directory (default: softrdma's own choice)
#   GITHUB_ENV, GITHUB_OUTPUT
set -euo pipefail
: "${SOFTRDMA_BIN:?}" "${GITHUB_ENV:?}" "${GITHUB_OUTPUT:?}"
if [ -n "${RUNTIME_DIR:-}" ]; then
  mkdir -p -m 700 "$RUNTIME_DIR"
  export SOFTRDMA_RUNTIME_DIR="$RUNTIME_DIR"
  echo "SOFTRDMA_RUNTIME_DIR=$RUNTIME_DIR" >>"$GITHUB_ENV"
fi
names=()
for d in ${DEVICES:-srdma0=127.0.0.1}; do
  name=${d%%=*} addr=${d#*=}
  [ -n "$name" ] && [ "$name" != "$d" ] && [ -n "$addr" ] ||
    { echo "softrdma action: a device is NAME=ADDRESS, not '$d'" >&2; exit 2; }
  "$SOFTRDMA_BIN" up "$name" --addr "$addr"
  names+=("$name")
done
echo "SOFTRDMA_DEVICES=${names[*]}" >>"$GITHUB_ENV"
echo "devices=${names[*]}" >>"$GITHUB_OUTPUT"
"$SOFTRDMA_BIN" list
