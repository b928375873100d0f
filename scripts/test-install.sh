#!/usr/bin/env bash
# An installed softrdma works with no clone and no build tree: `cargo install --path cli --root
# DIR` (sharing the build's target directory, so it links what is built), then from a directory
# outside the repository, with a fresh HOME (so the shim cache starts empty) and no
# SOFTRDMA_SHIM_DIR: `--version` names the commit, `shim-path` unpacks the embedded shim into
# ~/.cache/softrdma (mode 0700), `exec -- ibv_devinfo` sees the autostarted device, and
# `exec -- ibv_rc_pingpong` runs as server and client (two processes). Prints one line per check.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
target="${CARGO_TARGET_DIR:-$repo/target}"
work=$(mktemp -d)
addr=127.0.0.$((100 + RANDOM % 100))
export SOFTRDMA_RUNTIME_DIR="$work/rt"
cleanup() {
  [ -x "$work/root/bin/softrdma" ] && timeout 15 "$work/root/bin/softrdma" down srdma0 >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
passed=0 failed=0
check() { # name status detail
  if [ "$2" = 0 ]; then passed=$((passed + 1)); echo "ok    $1"; else failed=$((failed + 1)); echo "FAIL  $1: $3"; fi
}

cargo install --quiet --locked --path cli --root "$work/root" --target-dir "$target" 2>"$work/install.log"
check "cargo install --path cli --root DIR" $? "$(tail -n 5 "$work/install.log")"
bin="$work/root/bin/softrdma"
mkdir -p "$work/outside" "$work/home"
cd "$work/outside" || exit 1
run() { env -u SOFTRDMA_SHIM_DIR -u SOFTRDMA_CACHE_DIR -u XDG_CACHE_HOME HOME="$work/home" SOFTRDMA_DEFAULT_ADDR="$addr" "$@"; }

v=$(run "$bin" --version 2>&1)
commit=$(git -C "$repo" rev-parse --short HEAD)
echo "$v" | grep -q "commit $commit" ; check "--version names the commit ($v)" $? "want commit $commit"

shim=$(run "$bin" shim-path 2>&1)
mode=$(stat -c %a "$work/home/.cache/softrdma" 2>/dev/null)
[ -f "$shim/libibverbs.so.1" ] && [ -L "$shim/libibverbs.so" ] && [[ "$shim" == "$work/home/.cache/softrdma/shim-"* ]] && [ "$mode" = 700 ]
check "shim-path unpacks the embedded shim into ~/.cache/softrdma (mode $mode): $shim" $? "$shim"

run timeout 60 "$bin" exec --no-present -- ibv_devinfo >"$work/devinfo.log" 2>&1
rc=$?
grep -q "hca_id:.*srdma0" "$work/devinfo.log"
[ $? = 0 ] && [ $rc = 0 ]
check "exec -- ibv_devinfo from outside the repository (device srdma0 on $addr autostarted)" $? "rc=$rc $(tail -n 3 "$work/devinfo.log" | tr '\n' ' ')"

port=$((19000 + RANDOM % 1000))
run timeout 60 "$bin" exec --no-present -- ibv_rc_pingpong -d srdma0 -g 0 -p $port -n 200 >"$work/server.log" 2>&1 &
spid=$!
crc=1
for _ in $(seq 50); do
  sleep 0.2
  run timeout 60 "$bin" exec --no-present -- ibv_rc_pingpong -d srdma0 -g 0 -p $port -n 200 127.0.0.1 >"$work/client.log" 2>&1
  crc=$?
  grep -q "Couldn't connect" "$work/client.log" || break
done
wait $spid
src=$?
lines=$(cat "$work/server.log" "$work/client.log" | grep -c "bytes in .* seconds")
[ "$src" = 0 ] && [ "$crc" = 0 ] && [ "$lines" = 2 ]
check "exec -- ibv_rc_pingpong, server and client (two processes, 200 round trips)" $? \
  "server rc=$src client rc=$crc; $(tail -q -n 2 "$work/server.log" "$work/client.log" | tr '\n' ' ')"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
