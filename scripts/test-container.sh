#!/usr/bin/env bash
# The container image (Containerfile), checked without a container engine: this kind of machine
# has none and reaches no image registry, so its runtime stage is reproduced in a chroot (needs
# root): a minimal Debian 12 from the package registry (debootstrap), the image's own setup script
# (scripts/container/setup.sh: rdma-core's tools, perftest, rdmacm-utils, user `softrdma`), the
# softrdma binary as the build stage makes it (`cargo install --path cli`, here the build's own),
# then, as the unprivileged user, in a network namespace of its own with only `lo`:
# `softrdma demo` (the image's CMD) and `softrdma exec -- ibv_devinfo` (the presentation cannot
# be made in a chroot, so exec says so and runs the program anyway), and `ibv_rc_pingpong`
# between two processes. Where podman or docker with a running engine is available, the image
# itself is built and run instead (SOFTRDMA_CONTAINER_ENGINE=podman|docker forces that).
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
target="${CARGO_TARGET_DIR:-$repo/target}"
passed=0 failed=0
check() { if [ "$2" = 0 ]; then passed=$((passed + 1)); echo "ok    $1"; else failed=$((failed + 1)); echo "FAIL  $1: $3"; fi; }

engine=${SOFTRDMA_CONTAINER_ENGINE:-}
if [ -z "$engine" ]; then
  for e in podman docker; do
    command -v $e >/dev/null 2>&1 && timeout 10 $e info >/dev/null 2>&1 && { engine=$e; break; }
  done
fi
if [ -n "$engine" ]; then
  $engine build -t softrdma-test -f Containerfile . >/tmp/softrdma-image-build.log 2>&1
  check "$engine build -f Containerfile" $? "$(tail -n 5 /tmp/softrdma-image-build.log)"
  out=$($engine run --rm softrdma-test 2>&1)
  check "$engine run softrdma-test (softrdma demo, unprivileged)" $? "$(echo "$out" | tail -n 5)"
  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
  exit
fi

[ "$(id -u)" = 0 ] || { echo "SKIPPED: the chroot stand-in needs root (CI runs it as root)"; exit 0; }
command -v debootstrap >/dev/null || { echo "test-container.sh: debootstrap is missing (scripts/install-deps.sh installs it)" >&2; exit 2; }
work=$(mktemp -d)
root="$work/rootfs"
cleanup() {
  # A device a check left running (its root is the chroot) goes first.
  for p in /proc/[0-9]*; do [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && kill -9 "${p#/proc/}" 2>/dev/null; done
  for m in "$root/dev" "$root/proc"; do mountpoint -q "$m" && umount -l "$m"; done
  rm -rf "$work"
}
trap cleanup EXIT
# The mirror apt already uses (the package registry this machine reaches).
mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
mirror=${mirror:-http://deb.debian.org/debian}
t0=$SECONDS
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1
check "debootstrap bookworm (the image's base, debian:12) from $mirror in $((SECONDS - t0)) s" $? "$(tail -n 5 "$work/debootstrap.log")"
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp scripts/container/setup.sh "$root/tmp/setup.sh"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
t0=$SECONDS
chroot "$root" sh /tmp/setup.sh >"$work/setup.log" 2>&1
check "the image's setup (scripts/container/setup.sh) in $((SECONDS - t0)) s" $? "$(tail -n 5 "$work/setup.log")"
install -m 755 "$target/release/softrdma" "$root/usr/local/bin/softrdma"
# As the image runs: user softrdma, its home, a network namespace with only lo.
as_user() { unshare --net sh -c 'ip link set lo up && exec chroot --userspec=softrdma:softrdma "$0" env -i HOME=/home/softrdma PATH=/usr/local/bin:/usr/bin:/bin sh -c "cd && $1"' "$root" "$1"; }
as_user "timeout 300 softrdma demo" >"$work/demo.log" 2>&1
rc=$?
check "softrdma demo as the image runs it (unprivileged user, no extra capabilities)" $rc "$(tail -n 8 "$work/demo.log")"
as_user "timeout 60 softrdma exec -- ibv_devinfo; r=\$?; softrdma down srdma0 >/dev/null; exit \$r" >"$work/devinfo.log" 2>&1
rc=$?
grep -q "hca_id:.*srdma0" "$work/devinfo.log" && [ $rc = 0 ] && grep -q "not presented" "$work/devinfo.log"
check "softrdma exec -- ibv_devinfo (the shim unpacked into ~/.cache; no namespaces in a chroot: said, and the program runs)" $? \
  "rc=$rc $(tail -n 5 "$work/devinfo.log" | tr '\n' ' ')"
as_user "softrdma exec --no-present -- timeout 60 ibv_rc_pingpong -g 0 -n 100 & sleep 2; softrdma exec --no-present -- timeout 60 ibv_rc_pingpong -g 0 -n 100 127.0.0.1; wait; softrdma down srdma0" >"$work/pp.log" 2>&1
lines=$(grep -c "bytes in" "$work/pp.log")
[ "$lines" = 2 ]
check "ibv_rc_pingpong between two processes in the image" $? "$(tail -n 5 "$work/pp.log" | tr '\n' ' ')"
echo "$passed passed, $failed failed (a chroot stand-in for the image: no container engine here)"
[ "$failed" = 0 ]
