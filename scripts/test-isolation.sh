#!/usr/bin/env bash
# Isolation between users (needs root, which CI is): root runs a device; an unprivileged user (a
# spare uid through setpriv, no account needed) cannot list or read root's runtime directory,
# cannot reach the device's socket, and `softrdma` refuses root's runtime directory for that user
# with a message naming the owner; the same user's own device, in its own runtime directory, works
# beside root's; a WRITE that user forges with a guessed R_Key, from its own UDP socket, changes
# nothing, is NAKed and counted. Prints one line per check.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
[ "$(id -u)" = 0 ] || { echo "SKIPPED: test-isolation.sh needs root (CI runs it as root)"; exit 0; }
bin="${CARGO_TARGET_DIR:-$repo/target}/release/softrdma"
work=$(mktemp -d)
chmod 755 "$work"
uid=$((60000 + RANDOM % 4000))
rt="$work/root-rt" urt="$work/user-rt"
# Addresses whose RoCE port no other device of this machine holds (a random pick could land on one).
free_addr() { # FIRST COUNT: a 127.0.0.X from FIRST..FIRST+COUNT-1, random start, whose UDP 4791 is free
  local i a
  for i in $(seq 0 $(($2 - 1))); do
    a=127.0.0.$(($1 + (RANDOM + i) % $2))
    python3 -c 'import socket,sys; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).bind((sys.argv[1], 4791))' "$a" 2>/dev/null &&
      { echo "$a"; return; }
  done
  echo 127.0.0.$1
}
addr=$(free_addr 20 30) uaddr=$(free_addr 60 30)
# The binary where the other user can run it (the build tree may be under root's 0700 home).
install -m 755 "$bin" "$work/softrdma"
# The user's own directories (its runtime dir and shim cache), as its login would have them.
mkdir -m 700 "$urt" "$work/ucache"
chown "$uid:$uid" "$urt" "$work/ucache"
cleanup() {
  SOFTRDMA_RUNTIME_DIR="$rt" timeout 15 "$work/softrdma" down iso0 >/dev/null 2>&1
  SOFTRDMA_RUNTIME_DIR="$urt" timeout 15 setpriv --reuid $uid --regid $uid --clear-groups "$work/softrdma" down iso1 >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
passed=0 failed=0
check() { if [ "$2" = 0 ]; then passed=$((passed + 1)); echo "ok    $1"; else failed=$((failed + 1)); echo "FAIL  $1: $3"; fi; }
as_user() { env -i PATH=/usr/bin:/bin HOME="$work" setpriv --reuid $uid --regid $uid --clear-groups "$@"; }

SOFTRDMA_RUNTIME_DIR="$rt" "$work/softrdma" up iso0 --addr "$addr" >"$work/up.log" 2>&1
rc=$? # (before the check's arguments: a command substitution among them would set $? to its own status)
check "root's device iso0 up on $addr (runtime dir $(stat -c '%a %U' "$rt"))" $rc "$(cat "$work/up.log")"

out=$(as_user ls "$rt" 2>&1)
[ $? != 0 ] && echo "$out" | grep -qi "permission denied"
check "uid $uid cannot list root's runtime dir" $? "$out"

out=$(as_user python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])' "$rt/iso0.sock" 2>&1)
[ $? != 0 ] && echo "$out" | grep -qi "permission denied"
check "uid $uid cannot connect to root's device socket" $? "$out"

out=$(as_user env SOFTRDMA_RUNTIME_DIR="$rt" "$work/softrdma" list 2>&1)
rc=$?
[ $rc != 0 ] && echo "$out" | grep -q "owned by uid 0, not by this user (uid $uid)"
check "softrdma refuses root's runtime dir to uid $uid, naming the owner (rc $rc: $out)" $? "$out"

out=$(as_user env SOFTRDMA_RUNTIME_DIR="$rt" SOFTRDMA_NO_AUTOSTART=1 SOFTRDMA_CACHE_DIR="$work/ucache" \
  "$work/softrdma" exec --no-present -- ibv_devices 2>&1)
rc=$?
[ $rc != 0 ] && ! echo "$out" | grep -q iso0 && echo "$out" | grep -q "owned by uid 0"
check "uid $uid's verbs program through root's runtime dir is refused (rc $rc), it never reaches iso0" $? "$out"

out=$(as_user env SOFTRDMA_RUNTIME_DIR="$urt" "$work/softrdma" up iso1 --addr "$uaddr" 2>&1)
check "uid $uid's own device iso1 on $uaddr, beside root's" $? "$out"
out=$(as_user env SOFTRDMA_RUNTIME_DIR="$urt" SOFTRDMA_CACHE_DIR="$work/ucache" "$work/softrdma" exec --no-present -- ibv_devices 2>&1)
echo "$out" | grep -q iso1 && ! echo "$out" | grep -q iso0
check "uid $uid's program sees its own device only" $? "$out"
# A forged RDMA WRITE with a guessed R_Key from uid's own UDP socket (any host on a RoCE network
# can reach the port): memory unchanged, NAK remote access error, naks_sent.remote_access counted;
# the same WRITE with the right key lands (examples/examples/forged_write.rs).
faddr=127.0.0.$((100 + RANDOM % 30))
if cargo build --release --locked --quiet -p softrdma-examples --example forged_write 2>"$work/build.log"; then
  out=$(SOFTRDMA_RUNTIME_DIR="$rt" "${CARGO_TARGET_DIR:-$repo/target}/release/examples/forged_write" \
    --device iso0 --from "$faddr" --port 4791 --uid "$uid" 2>&1)
  rc=$?
  echo "$out" | sed 's/^/      /'
  check "uid $uid's forged WRITE with a guessed R_Key is refused and counted; the right key lands (rc $rc)" $rc "$out"
else
  check "building the forged-WRITE check" 1 "$(cat "$work/build.log")"
fi
SOFTRDMA_RUNTIME_DIR="$rt" "$work/softrdma" stat iso0 >"$work/stat.log" 2>&1
check "root's device unaffected (stat answers)" $? "$(cat "$work/stat.log")"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
