#!/usr/bin/env bash
# Step 1 of the GitHub Actions action (action.yml): installs softrdma from source.
# Environment (what the runner gives a composite action's step):
#   SRC           the softrdma source tree (the action's own checkout, or the `source` input)
#   REVISION      optional: a commit or tag of SRC's repository to build instead of SRC as it is
#   PREFIX        where to install (bin/softrdma)
#   INSTALL_DEPS  "true": apt-get the build and tool packages first (sudo when not root)
#   GITHUB_PATH, GITHUB_ENV, GITHUB_OUTPUT   files the runner reads after the step
set -euo pipefail
: "${SRC:?}" "${PREFIX:?}" "${GITHUB_PATH:?}" "${GITHUB_ENV:?}" "${GITHUB_OUTPUT:?}"
if [ "${INSTALL_DEPS:-true}" = true ]; then
  # The build needs gcc only; the headers are for the workflow's own verbs programs.
  pkgs=(gcc libc6-dev libibverbs-dev librdmacm-dev ibverbs-utils rdmacm-utils perftest)
  need=()
  for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p"); done
  if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
fi
src="$SRC"
if [ -n "${REVISION:-}" ]; then
  # A revision of the same repository: a worktree of it, built as it is there.
  src=$(mktemp -d)/softrdma
  git -C "$SRC" fetch --quiet origin "$REVISION" 2>/dev/null || true
  git -C "$SRC" worktree add --quiet --detach "$src" "$REVISION"
fi
cargo install --quiet --locked --path "$src/cli" --root "$PREFIX" ${CARGO_TARGET_DIR:+--target-dir "$CARGO_TARGET_DIR"}
bin="$PREFIX/bin/softrdma"
echo "$PREFIX/bin" >>"$GITHUB_PATH"
shim=$("$bin" shim-path)
{
  echo "SOFTRDMA_BIN=$bin"
  echo "SOFTRDMA_SHIM=$shim"
} >>"$GITHUB_ENV"
{
  echo "version=$("$bin" --version)"
  echo "shim=$shim"
} >>"$GITHUB_OUTPUT"
echo "softrdma installed: $("$bin" --version); shim in $shim"
