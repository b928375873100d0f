#!/usr/bin/env bash
# Installs what the test suite needs on a Debian 12 machine: tshark (the independent decoder the
# wire tests cross-check against). Idempotent: does nothing for what is already there.
set -euo pipefail
need=()
command -v tshark >/dev/null 2>&1 || need+=(tshark)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  echo "install-deps: installing ${need[*]}" >&2
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
