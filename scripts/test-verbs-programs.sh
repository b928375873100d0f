#!/usr/bin/env bash
# Runs unchanged rdma-core programs (Debian ibverbs-utils) and perftest on softrdma through the
# verbs shim: ibv_devices, ibv_devinfo, the ping-pong tests and the eight perftest programs as two
# processes (server and client), on one device (srdma0) and across two (srdma0 on 127.0.0.1,
# srdma1 on 127.0.0.2). Each must exit 0 and print its own result lines. One line per run, then
# "N passed, M failed".
# Usage: scripts/test-verbs-programs.sh [--quick]      (needs scripts/build-shim.sh first)
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/shim-env.sh
command -v ibv_rc_pingpong >/dev/null || { echo "ibv_rc_pingpong missing: run scripts/install-deps.sh" >&2; exit 2; }
quick=0
[ "${1:-}" = "--quick" ] && quick=1

# A private runtime directory: these devices are ours alone, and go away with it.
private_runtime
logs="$rt/logs"
mkdir -p "$logs"
cleanup() {
  stop_run srdma0 srdma1 srdma2 srdma3
}
trap cleanup EXIT
# Addresses: srdma0 on 127.0.0.1 and srdma1 on 127.0.0.2 unless told otherwise.
up_two_devices

. scripts/programs-lib.sh

# Every rdma-core, perftest and rdmacm-utils program loads on the shim with every symbol bound
# at start (they are linked BIND_NOW; LD_BIND_NOW makes sure): its libibverbs.so.1 (and
# librdmacm/libmlx5/libefa) is the shim's, and the loader reports no missing symbol or version.
for prog in ibv_devices ibv_devinfo ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong ibv_srq_pingpong \
  ibv_xsrq_pingpong ib_send_bw ib_write_bw ib_read_bw ib_atomic_bw ib_send_lat ib_write_lat ib_read_lat \
  ib_atomic_lat raw_ethernet_bw rping udaddy mckey ucmatose riostream rstream rdma_client rdma_server cmtime; do
  path=$(command -v "$prog") || { result "$prog loads" fail "not installed (scripts/install-deps.sh)"; continue; }
  out=$(LD_BIND_NOW=1 timeout 10 "$prog" --help 2>&1)
  theirs=$(ldd "$path" | grep -E "lib(ibverbs|rdmacm|mlx5|efa)\.so" | grep -vc "$shim")
  if echo "$out" | grep -qiE "symbol lookup error|version .* not found|cannot open shared object"; then
    result "$prog loads" fail "$(echo "$out" | grep -iE 'symbol|version|shared object' | head -1)"
  elif [ "$theirs" != 0 ]; then
    result "$prog loads" fail "$theirs of its verbs libraries do not come from $shim"
  else
    result "$prog loads" ok
  fi
done

# rdma_cm (librdmacm on the devices' connection manager; CM MADs on QP1 over the wire).
# A server listens once one of the devices lists its ID in state LISTEN on the port
# (`softrdma cm-ids`, what `rdma resource show cm_id` shows for a kernel device). Starting the
# client only then keeps perftest from its own retry path (it reconnects after a REJECTED and
# then mispairs its connections).
# cm_rping: an rping server bound to SERVER-ADDR and a client connecting to it; both
# must exit 0 and every ping must have been verified (-v prints each; -V checks each).
cm_rping() { # name server-addr count size [extra server/client flags]
  local name="$1" saddr="$2" count="$3" size="$4"
  shift 4
  port=$((port + 1))
  local slog="$logs/${name// /_}.server.log" clog="$logs/${name// /_}.client.log"
  timeout 60 rping -s -a "$saddr" -p "$port" -C "$count" -S "$size" -V "$@" >"$slog" 2>&1 &
  local spid=$!
  wait_listen "$port"
  timeout 60 rping -c -a "$saddr" -p "$port" -C "$count" -S "$size" -v -V "$@" >"$clog" 2>&1
  local crc=$?
  wait "$spid"
  local src=$?
  local pings
  pings=$(grep -c "^ping data: rdma-ping-" "$clog")
  if [ "$src" = 0 ] && [ "$crc" = 0 ] && [ "$pings" = "$count" ]; then
    result "$name ($pings pings verified)" ok
  else
    result "$name" fail "server rc=$src client rc=$crc pings=$pings; $(tail -q -n 2 "$slog" "$clog" | tr '\n' ' ')"
  fi
}
cm_rping "rping one device" "$addr0" 20 64
cm_rping "rping across two devices" "$addr1" 50 4096
cm_rping "rping 60000 B" "$addr1" 10 60000
cm_perf_all
# rdma_server / rdma_client: synchronous IDs, rdma_getaddrinfo, rdma_create_ep, rdma_get_request,
# rdma_accept with no conn_param, and the rdma_verbs.h helpers on id->pd and the CQs librdmacm made.
port=$((port + 1))
timeout 30 rdma_server -p "$port" >"$logs/rdma_server.log" 2>&1 &
spid=$!
wait_listen "$port"
timeout 30 rdma_client -s "$addr0" -p "$port" >"$logs/rdma_client.log" 2>&1
crc=$?
wait "$spid"
src=$?
if [ "$src" = 0 ] && [ "$crc" = 0 ] && grep -q "end 0" "$logs/rdma_server.log" && grep -q "end 0" "$logs/rdma_client.log"; then
  result "rdma_server / rdma_client" ok
else
  result "rdma_server / rdma_client" fail "server rc=$src client rc=$crc; $(tail -q -n 2 "$logs"/rdma_*.log | tr '\n' ' ')"
fi
# cm_pair NAME PS PERSISTENT SERVER_WANT CLIENT_WANT SERVER... -- CLIENT...: an rdmacm-utils
# server and, once its port (in port space PS: TCP or IB) listens, the client (twice for a persistent
# server: it must serve both). Every client exits 0 with CLIENT_WANT in its log; a server that
# ends by itself exits 0, and a persistent one (rping -P, cmtime's) is still running at the end;
# SERVER_WANT (a regex; empty for a server that prints nothing) must be in the server's log. `@P` in the commands is the port.
cm_pair() {
  local name="$1" ps="$2" persistent="$3" swant="$4" cwant="$5"
  shift 5
  port=$((port + 1))
  local -a srv=() cli=()
  while [ "$1" != "--" ]; do srv+=("${1//@P/$port}"); shift; done
  shift
  for a in "$@"; do cli+=("${a//@P/$port}"); done
  local f="${name//[^A-Za-z0-9._-]/_}"
  local slog="$logs/$f.server.log" clog="$logs/$f.client.log"
  timeout 120 "${srv[@]}" >"$slog" 2>&1 &
  local spid=$! crc=0 runs=1 why=""
  [ "$persistent" = 1 ] && runs=2
  wait_listen "$port" "$ps" || why="server never listened; "
  for r in $(seq "$runs"); do
    timeout 120 "${cli[@]}" >"$clog.$r" 2>&1 || { crc=$?; why+="client run $r rc=$crc; "; }
    grep -qE "$cwant" "$clog.$r" || why+="client run $r lacks '$cwant'; "
  done
  if [ "$persistent" = 1 ]; then
    kill -0 "$spid" 2>/dev/null || why+="persistent server exited; "
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
  else
    wait "$spid" || why+="server rc=$?; "
  fi
  [ -z "$swant" ] || grep -qE "$swant" "$slog" || why+="server lacks '$swant'; "
  if [ -z "$why" ]; then
    result "$name" ok
  else
    result "$name" fail "$why$(tail -q -n 2 "$slog" "$clog".* | tr '\n' ' ')"
  fi
}
# ucmatose (cmatose.c): data over each connection, then both sides disconnect; -c many at once,
# across two devices (-b binds the client to the second); -P ib: RDMA_PS_IB service IDs.
cm_pair "ucmatose one device" TCP 0 "return status 0" "return status 0" \
  ucmatose -p @P -- ucmatose -s "$addr0" -p @P
cm_pair "ucmatose -c 10 across two devices" TCP 0 "return status 0" "return status 0" \
  ucmatose -p @P -c 10 -- ucmatose -s "$addr0" -b "$addr1" -p @P -c 10
cm_pair "ucmatose -P ib" IB 0 "return status 0" "return status 0" \
  ucmatose -p @P -P ib -- ucmatose -s "$addr0" -p @P -P ib
# rdma_xserver / rdma_xclient: RC with an inline send, and -c x: XRC_SEND to an XRC_RECV QP in
# RDMA_PS_IB whose SRQ number travels in the REP's private data.
cm_pair "rdma_xserver / rdma_xclient RC" TCP 0 "end 0" "end 0" \
  rdma_xserver -p @P -- rdma_xclient -s "$addr0" -p @P
cm_pair "rdma_xserver / rdma_xclient -c x (XRC)" IB 0 "end 0" "end 0" \
  rdma_xserver -p @P -c x -- rdma_xclient -s "$addr0" -p @P -c x
# rping -q: the program makes its own QP and moves it with rdma_init_qp_attr, then
# rdma_establish; -P: a persistent server, one thread per connection, serving two clients.
cm_rping "rping -q (application's QP)" "$addr1" 20 64 -q
cm_pair "rping -P persistent server, two clients" TCP 1 "" "^ping data: rdma-ping-9:" \
  rping -s -P -a "$addr0" -p @P -C 10 -- rping -c -a "$addr0" -p @P -C 10 -v -V
# cmtime: 1000 connections at once across two devices (a backlog of 0 is the kernel's default,
# and REQs beyond it are dropped and retried, never rejected); its per-step table is in the log.
pc_stat() { # device counter: one of `softrdma stat`'s rows
  "$bin" stat "$1" 2>/dev/null | awk -v k="$2" '$1 == k {print $2}'
}
pc_before_hits=$(pc_stat srdma1 path_cache_hits) pc_before_misses=$(pc_stat srdma1 path_cache_misses)
pc_before_dropped=$(pc_stat srdma1 path_cache_invalidated)
cm_pair "cmtime -c 1000 across two devices" TCP 1 "" "^connect +:" \
  cmtime -p @P -- cmtime -s "$addr0" -b "$addr1" -p @P -c 1000
[ -f "$logs/cmtime_-c_1000_across_two_devices.client.log.1" ] &&
  sed -n '/^step/,$p' "$logs/cmtime_-c_1000_across_two_devices.client.log.1" | sed 's/^/    cmtime: /'
# The path record cache (rdma_resolve_route): cmtime's 1000 connections to one destination,
# twice, are one lookup on the client's device (srdma1) and hits for the rest.
if [ -n "${pc_before_hits:-}" ]; then
  pc_hits=$(($(pc_stat srdma1 path_cache_hits) - pc_before_hits))
  pc_misses=$(($(pc_stat srdma1 path_cache_misses) - pc_before_misses))
  # (one more lookup allowed per entry a change in the host's routes dropped meanwhile)
  pc_dropped=$(($(pc_stat srdma1 path_cache_invalidated) - pc_before_dropped))
  if [ "$pc_misses" -le $((1 + pc_dropped)) ] && [ "$pc_hits" -ge $((1999 - pc_dropped)) ]; then
    result "path cache: cmtime's 2000 route steps to one peer are $pc_misses lookup(s) and $pc_hits hits" ok
  else
    result "path cache: cmtime's route steps" fail "misses $pc_misses hits $pc_hits, $pc_dropped dropped by route changes (want <= 1 and >= 1999 but for those)"
  fi
fi
# Entries expire and go when a route changes: in a network namespace of our own (its routes
# change, the host's do not), two devices, an rping server, and one-ping clients: the second is a
# hit, a route added drops the entry (the device hears rtnetlink's notification) and the next is
# a lookup again, and after the entry's lifetime (--path-cache-ttl 2) another lookup.
if command -v unshare >/dev/null && command -v ip >/dev/null; then
  pc_log="$logs/path-cache-netns.log"
  uflag=-n
  [ "$(id -u)" = 0 ] || uflag=-rn
  timeout 120 unshare $uflag bash -c '
    set -u
    ip link set lo up || exit 3
    rt=$(mktemp -d); chmod 700 "$rt"; export SOFTRDMA_RUNTIME_DIR=$rt
    trap "\"$0\" down nsa >/dev/null 2>&1; \"$0\" down nsb >/dev/null 2>&1; kill %1 2>/dev/null; rm -rf \"$rt\"" EXIT
    "$0" up nsa --addr 127.0.0.1 >/dev/null && "$0" up nsb --addr 127.0.0.2 --path-cache-ttl 2 >/dev/null || exit 4
    st() { "$0" stat nsb | awk -v k="$1" "\$1 == k {print \$2}"; }
    rping -s -P -a 127.0.0.1 -p 7471 -v >"$rt/server.log" 2>&1 &
    for _ in $(seq 100); do "$0" cm-ids nsa | grep -q "state LISTEN" && break; sleep 0.1; done
    # A failed client says why: its exit code and last lines, and the server log tail.
    one() {
      o=$(timeout 30 rping -c -a 127.0.0.1 -I 127.0.0.2 -p 7471 -C 1 -v 2>&1) && return
      echo "rping failed (rc $?): $(echo "$o" | tail -n 5 | tr "\n" " ") | server: $(tail -n 5 "$rt/server.log" | tr "\n" " ")"
    }
    one; one
    echo "two: misses $(st path_cache_misses) hits $(st path_cache_hits)"
    ip route add 10.77.0.0/24 dev lo
    one
    echo "route: invalidated $(st path_cache_invalidated) misses $(st path_cache_misses)"
    sleep 2.2
    one
    echo "ttl: expired $(st path_cache_expired) misses $(st path_cache_misses)"
  ' "$bin" >"$pc_log" 2>&1
  pc_rc=$?
  if [ "$pc_rc" = 0 ] && grep -q "^two: misses 1 hits 1$" "$pc_log" && grep -q "^route: invalidated 1 misses 2$" "$pc_log" &&
    grep -q "^ttl: expired 1 misses 3$" "$pc_log" && ! grep -q "rping failed" "$pc_log"; then
    result "path cache in a network namespace: hit, dropped by a route change, expired after --path-cache-ttl" ok
  elif [ "$pc_rc" = 3 ] || grep -q "unshare: " "$pc_log"; then
    # No network namespace here (a container without the capability): said, not hidden.
    echo "skip  path cache in a network namespace: $(head -n 1 "$pc_log")"
  else
    result "path cache in a network namespace" fail "rc=$pc_rc; $(tr '\n' ' ' < "$pc_log")"
  fi
fi
# udaddy: UD "connections" through SIDR (RDMA_PS_UDP, port 7174): the SIDR_REP gives the client
# the server's QPN and Q_Key (ESTABLISHED's param.ud, with the address vector toward it); the
# server answers each datagram through ibv_create_ah_from_wc and the Q_Key it reads back with
# ibv_query_qp.
udaddy_pair() { # name server-args... -- client-args...
  local name="$1"
  shift
  local -a srv=()
  while [ "$1" != "--" ]; do srv+=("$1"); shift; done
  shift
  local f="${name//[^A-Za-z0-9._-]/_}"
  local slog="$logs/$f.server.log" clog="$logs/$f.client.log" why=""
  timeout 60 udaddy "${srv[@]}" >"$slog" 2>&1 &
  local spid=$!
  wait_listen 7174 UDP || why="server never listened; "
  timeout 60 udaddy "$@" >"$clog" 2>&1 || why+="client rc=$?; "
  wait "$spid" || why+="server rc=$?; "
  grep -q "data transfers complete" "$slog" || why+="server did not complete; "
  grep -q "return status 0" "$clog" || why+="client did not return 0; "
  if [ -z "$why" ]; then
    result "$name" ok
  else
    result "$name" fail "$why$(tail -q -n 2 "$slog" "$clog" | tr '\n' ' ')"
  fi
}
udaddy_pair "udaddy one device" -b "$addr0" -- -s "$addr0"
udaddy_pair "udaddy -c 10 across two devices" -b "$addr0" -c 10 -- -s "$addr0" -b "$addr1" -c 10
# No server: the peer's CM answers the SIDR_REQ with status 1 (unsupported) at once, which
# librdmacm reports as RDMA_CM_EVENT_UNREACHABLE, status 1.
log="$logs/udaddy-no-server.log"
timeout 20 udaddy -s "$addr1" -b "$addr0" >"$log" 2>&1
rc=$?
if [ "$rc" != 0 ] && grep -q "RDMA_CM_EVENT_UNREACHABLE, error: 1" "$log"; then
  result "udaddy with no server: UNREACHABLE status 1 (SIDR unsupported)" ok
else
  result "udaddy with no server: UNREACHABLE status 1" fail "rc=$rc; $(tail -n 2 "$log" | tr '\n' ' ')"
fi
# RDMA_PS_IPOIB on a RoCE port: an IPoIB ID takes only an InfiniBand-link-layer address
# (cma_acquire_dev_by_src_ip): resolving from the wildcard is ADDR_ERROR -EINVAL (what rxe gives,
# conformance/interop/rxe.sh), binding to the device's address is EINVAL from the call.
log="$logs/udaddy-ipoib.log"
timeout 20 udaddy -s "$addr0" -p 0x2 >"$log" 2>&1
rc=$?
if [ "$rc" != 0 ] && grep -q "RDMA_CM_EVENT_ADDR_ERROR, error: -22" "$log"; then
  result "udaddy -p 0x2 (RDMA_PS_IPOIB): ADDR_ERROR -EINVAL, as the kernel's on RoCE" ok
else
  result "udaddy -p 0x2 (RDMA_PS_IPOIB): ADDR_ERROR -EINVAL" fail "rc=$rc; $(tail -n 2 "$log" | tr '\n' ' ')"
fi
log="$logs/udaddy-ipoib-bound.log"
timeout 20 udaddy -s "$addr0" -b "$addr1" -p 0x2 >"$log" 2>&1
rc=$?
if [ "$rc" != 0 ] && grep -q "failure getting addr: Invalid argument" "$log"; then
  result "udaddy -p 0x2 -b ADDR (RDMA_PS_IPOIB): rdma_resolve_addr fails with EINVAL" ok
else
  result "udaddy -p 0x2 -b ADDR (RDMA_PS_IPOIB): EINVAL" fail "rc=$rc; $(tail -n 2 "$log" | tr '\n' ' ')"
fi
# mckey: rdma_cm multicast (RDMA_PS_UDP). Receivers join group G as full members (librdmacm
# attaches their QPs), a sender joins and sends to QPN 0xFFFFFF with the group's Q_Key; the
# device joins the IP group for its first full member (the host's /proc/net/igmp lists it) and
# leaves with its last. `softrdma stat` lists each group with its member counts.
mc_members() { # device group: its full members ("" when the device has no such group)
  "$bin" stat "$1" 2>/dev/null | awk -v g="$2" '$1 == "mcast_group" && $2 == g {print $4}'
}
mc_wait() { # device group count ("" = the group is gone)
  for _ in $(seq 100); do [ "$(mc_members "$1" "$2")" = "$3" ] && return 0; sleep 0.1; done
  return 1
}
igmp_has() { # group: whether the host is a member of it on some interface
  grep -q "$(printf '%02X%02X%02X%02X' $(echo "$1" | awk -F. '{print $4, $3, $2, $1}'))" /proc/net/igmp
}
mc_ok() { # log
  grep -q "data transfers complete" "$1" && grep -q "return status 0" "$1"
}
mck() { # name sender-addr sender-flags receiver-addr...
  local name="$1" saddr="$2" sflags="$3"
  shift 3
  local g="239.$((RANDOM % 200 + 20)).$((RANDOM % 250)).$((RANDOM % 250 + 1))" why="" k=0 pids=()
  local f="${name//[^A-Za-z0-9._-]/_}"
  for r in "$@"; do
    k=$((k + 1))
    timeout 30 mckey -m "$g" -b "$r" -C 10 >"$logs/$f.r$k.log" 2>&1 &
    pids+=($!)
  done
  for r in "$@"; do
    local d=srdma0
    [ "$r" = "$addr1" ] && d=srdma1
    mc_wait "$d" "$g" "$(printf '%s\n' "$@" | grep -cx "$r")" || why+="receivers on $d never joined; "
  done
  timeout 30 mckey -m "$g" -b "$saddr" -s -C 10 $sflags >"$logs/$f.s.log" 2>&1 || why+="sender rc=$?; "
  mc_ok "$logs/$f.s.log" || why+="sender did not complete; "
  k=0
  for p in "${pids[@]}"; do
    k=$((k + 1))
    wait "$p" || why+="receiver $k rc=$?; "
    mc_ok "$logs/$f.r$k.log" || why+="receiver $k did not get its 10 messages; "
  done
  if [ -z "$why" ]; then
    result "$name" ok
  else
    result "$name" fail "$why$(tail -q -n 2 "$logs/$f".*.log | tr '\n' ' ')"
  fi
}
mck "mckey one device: two receiver processes, one sender" "$addr0" "" "$addr0" "$addr0"
mck "mckey across two devices: receivers on both" "$addr0" "" "$addr1" "$addr0"
mck "mckey -o: a send-only sender" "$addr0" "-o" "$addr1" "$addr1"
mck "mckey -l: IBV_QP_CREATE_BLOCK_SELF_MCAST_LB on the sender, a receiver on its device" "$addr0" "-l" "$addr0"
# The seed's reference counting: two processes on one device join; one leaves; the other keeps
# receiving and the device stays in the IP group; the last leaving takes the device out of it; a
# process killed while joined counts as leaving.
g="239.$((RANDOM % 200 + 20)).77.$((RANDOM % 250 + 1))" why=""
timeout 30 mckey -m "$g" -b "$addr1" -C 10 >"$logs/mc-ref.a.log" 2>&1 &
pa=$!
timeout 30 mckey -m "$g" -b "$addr1" -C 20 >"$logs/mc-ref.b.log" 2>&1 &
pb=$!
mc_wait srdma1 "$g" 2 || why+="never 2 members; "
igmp_has "$g" || why+="the device did not join the IP group; "
timeout 30 mckey -m "$g" -b "$addr0" -s -C 10 >"$logs/mc-ref.s1.log" 2>&1 || why+="sender 1 failed; "
wait "$pa" || why+="receiver A rc=$?; "
mc_wait srdma1 "$g" 1 || why+="A's leave did not leave 1 member ($(mc_members srdma1 "$g")); "
"$bin" stat srdma1 | grep -q "mcast_group  *$g full 1 send_only 0 ip_member yes" || why+="stat does not show 1 member in the IP group; "
igmp_has "$g" || why+="the device left the IP group while B is a member; "
timeout 30 mckey -m "$g" -b "$addr0" -s -C 10 >"$logs/mc-ref.s2.log" 2>&1 || why+="sender 2 failed; "
wait "$pb" || why+="receiver B rc=$?; "
mc_ok "$logs/mc-ref.b.log" || why+="B did not get its 20 messages; "
mc_wait srdma1 "$g" "" || why+="the group outlived its last member; "
igmp_has "$g" && why+="the device is still in the IP group after the last leave; "
# (No `timeout` around it: the SIGKILL is for mckey itself.)
mckey -m "$g" -b "$addr1" -C 100 >"$logs/mc-ref.c.log" 2>&1 &
pc=$!
mc_wait srdma1 "$g" 1 || why+="C never joined; "
kill -9 "$pc" 2>/dev/null
wait "$pc" 2>/dev/null
mc_wait srdma1 "$g" "" || why+="a killed member still counts; "
igmp_has "$g" && why+="the device stayed in the IP group after its member was killed; "
if [ -z "$why" ]; then
  result "mckey reference counting: one of two leaves, the other receives; last leave and kill -9 leave the IP group" ok
else
  result "mckey reference counting" fail "$why$(tail -q -n 2 "$logs"/mc-ref.*.log | tr '\n' ' ')"
fi
# A client with no server: the peer's CM answers the REQ with REJ 8 (invalid service ID) at once,
# which librdmacm reports as RDMA_CM_EVENT_REJECTED, status 8.
log="$logs/rping-no-server.log"
start=$(date +%s%N)
timeout 20 rping -c -a "$addr1" -p 1 -C 1 >"$log" 2>&1
rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
if [ "$rc" != 0 ] && grep -q "RDMA_CM_EVENT_REJECTED, error 8" "$log" && [ "$ms" -lt 5000 ]; then
  result "rping with no server: REJECTED status 8 in ${ms} ms" ok
else
  result "rping with no server: REJECTED status 8" fail "rc=$rc ${ms} ms; $(tail -n 2 "$log" | tr '\n' ' ')"
fi

# A REQ to a silent peer: retried (15 retries after the first, each after the CM response timeout)
# and then RDMA_CM_EVENT_UNREACHABLE with -ETIMEDOUT, as the kernel's cm_timeout_handler gives it.
# With the kernel's timers that takes ~70 s; srdma2 runs them 1000x faster (--cm-timer-scale).
addr2="${SOFTRDMA_TEST_ADDR2:-127.0.0.3}" silent="${SOFTRDMA_TEST_SILENT:-127.0.0.250}"
if "$bin" up srdma2 --addr "$addr2" --cm-timer-scale 0.001 >/dev/null; then
  log="$logs/rping-silent-peer.log"
  timeout 30 rping -c -I "$addr2" -a "$silent" -p 7174 -C 1 >"$log" 2>&1
  rc=$?
  sent=$("$bin" stat srdma2 --json | grep -o '"cm_mads_sent":[0-9]*' | cut -d: -f2)
  if [ "$rc" != 0 ] && grep -q "RDMA_CM_EVENT_UNREACHABLE, error -110" "$log" && [ "$sent" = 16 ]; then
    result "rping to a silent peer: UNREACHABLE -110 after 16 REQs" ok
  else
    result "rping to a silent peer: UNREACHABLE -110 after 16 REQs" fail "rc=$rc, $sent MADs sent; $(tail -n 2 "$log" | tr '\n' ' ')"
  fi
  # The device goes away under a listening rping: RDMA_CM_EVENT_DEVICE_REMOVAL, and rping ends.
  port=$((port + 1))
  log="$logs/rping-device-removal.log"
  timeout 30 rping -s -a "$addr2" -p "$port" -C 1 >"$log" 2>&1 &
  spid=$!
  wait_listen "$port"
  timeout 15 "$bin" down srdma2 >/dev/null 2>&1
  wait "$spid"
  rc=$?
  if [ "$rc" != 124 ] && grep -q "cma detected device removal" "$log"; then
    result "rping -s when its device goes down: DEVICE_REMOVAL" ok
  else
    result "rping -s when its device goes down: DEVICE_REMOVAL" fail "rc=$rc; $(tail -n 2 "$log" | tr '\n' ' ')"
  fi
else
  result "rping to a silent peer" fail "softrdma up srdma2 --addr $addr2 failed"
fi
# A wildcard listener hears REQs on a device started after it listened, as the kernel's
# cma_add_one has every wildcard listener listen on a new ib_device: rping -s without -a listens
# on srdma0 and srdma1, srdma2 comes up, a client connects to srdma2's address.
port=$((port + 1))
slog="$logs/rping-wildcard-new-device.server.log" clog="$logs/rping-wildcard-new-device.client.log"
timeout 60 rping -s -p "$port" -C 5 -V >"$slog" 2>&1 &
spid=$!
wait_listen "$port"
crc=1 heard=0
if "$bin" up srdma2 --addr "$addr2" >/dev/null; then
  for _ in $(seq 100); do
    "$bin" cm-ids srdma2 2>/dev/null | grep -qE "state LISTEN ps TCP .*src-addr [^ ]*:$port " && { heard=1; break; }
    sleep 0.05
  done
  timeout 30 rping -c -a "$addr2" -p "$port" -C 5 -v -V >"$clog" 2>&1
  crc=$?
fi
wait "$spid"
src=$?
pings=$(grep -c "^ping data: rdma-ping-" "$clog" 2>/dev/null)
if [ "$heard" = 1 ] && [ "$src" = 0 ] && [ "$crc" = 0 ] && [ "$pings" = 5 ]; then
  result "rping -s on the wildcard, connected through a device started later ($pings pings)" ok
else
  result "rping -s on the wildcard, connected through a device started later" fail \
    "listening on srdma2=$heard server rc=$src client rc=$crc pings=$pings; $(tail -q -n 2 "$slog" "$clog" 2>/dev/null | tr '\n' ' ')"
fi
"$bin" down srdma2 >/dev/null 2>&1

# The seeds' workloads (examples/c, built by scripts/build-examples.sh; README "Example
# programs"). lnet_bulk, the o2iblnd pattern: 8 peer connections, each moving 1 MiB transfers
# (PUT as 256 chained 4 KiB RDMA WRITEs, GET as 256 READs) with credits, every byte checked;
# across two devices, with the client's queue depth too deep for the device (it backs off); then
# between two devices that lose 0.2% of the packets they send (retransmissions from their stat).
ex="$(realpath "$target/examples")"
lnet() { # name server-addr client-addr transfers-per-peer [client options]
  local name="$1" saddr="$2" caddr="$3" count="$4"
  shift 4
  port=$((port + 1))
  local slog="$logs/${name// /_}.server.log" clog="$logs/${name// /_}.client.log"
  timeout 300 "$ex/lnet_bulk" --server --addr "$saddr" --port "$port" --peers 8 >"$slog" 2>&1 &
  local spid=$!
  wait_listen "$port"
  timeout 300 "$ex/lnet_bulk" --client "$saddr" --src "$caddr" --port "$port" --peers 8 --count "$count" --verify "$@" \
    >"$clog" 2>&1
  local crc=$?
  wait "$spid"
  local src=$?
  if [ "$crc" = 0 ] && [ "$src" = 0 ] &&
    grep -q "^lnet_bulk: OK client peers 8 transfers $((8 * count)) .* verified" "$clog" &&
    grep -q "^lnet_bulk: OK server peers 8 puts $((4 * count)) gets $((4 * count)) .* errors 0" "$slog"; then
    result "$name ($(grep -o 'MB/s [0-9.]*' "$clog"), $(grep -o 'depth [0-9]*' "$clog" | tail -n 1))" ok
  else
    result "$name" fail "server rc=$src client rc=$crc; $(tail -q -n 2 "$slog" "$clog" | tr '\n' ' ')"
  fi
}
if [ -x "$ex/lnet_bulk" ]; then
  lnet "lnet_bulk 8 peers across two devices" "$addr0" "$addr1" 8
  lnet "lnet_bulk 8 peers, depth 100 backs off" "$addr0" "$addr1" 2 --depth 100
  addr3="${SOFTRDMA_TEST_ADDR3:-127.0.0.4}"
  if "$bin" up srdma2 --addr "$addr2" --faults loss=0.002,seed=11 >/dev/null &&
    "$bin" up srdma3 --addr "$addr3" --faults loss=0.002,seed=12 >/dev/null; then
    lnet "lnet_bulk 8 peers, 0.2% loss" "$addr2" "$addr3" 4
    for d in srdma2 srdma3; do
      echo "    $d: $("$bin" stat $d | grep -E '^(retransmitted_pkts|dropped_by_fault) ' | tr -s ' ' | tr '\n' ' ')"
    done
  else
    result "lnet_bulk with loss" fail "softrdma up srdma2/srdma3 with --faults failed"
  fi
  "$bin" down srdma2 >/dev/null 2>&1
  "$bin" down srdma3 >/dev/null 2>&1
else
  result "lnet_bulk" fail "$ex/lnet_bulk missing: run scripts/build-examples.sh"
fi
# xrc_job, the XRC seeds' MPI-style job: P processes per device ("node"), one XRC domain per node
# shared through a file, an XRC SRQ per process, one XRC send QP per process and remote node; the
# target QPs made by one process per node that then exits (or is killed) before the all-to-all
# rounds; at the end a send to a node whose last process left fails with RETRY_EXC_ERR. QP numbers
# out of band, or through rdma_cm (--cm).
if [ -x "$ex/xrc_job" ] && "$bin" up srdma2 --addr "$addr2" >/dev/null; then
  xjob_maker_leaves
  # The same with the send QPs connected through rdma_cm (RDMA_PS_IB XRC, target QPN in the REP).
  xjob "xrc_job --cm 3 nodes x 3 processes, maker exits" \
    "^xrc_job: OK nodes 3 procs 3 rounds 5 messages 270 checked.*setup rdma_cm; maker exited; late sender transport retry" \
    --devices srdma0,srdma1,srdma2 --procs 3 --rounds 5 --cm
  xjob "xrc_job --cm 2 nodes x 4 processes, maker killed" \
    "^xrc_job: OK nodes 2 procs 4 rounds 3 messages 96 checked.*setup rdma_cm; maker killed; late sender transport retry" \
    --devices srdma1,srdma2 --procs 4 --rounds 3 --cm --kill
  "$bin" down srdma2 >/dev/null 2>&1
  # The same job on devices with upstream Linux's lifetime (a target QP dies with the last handle
  # of the process that made it): the first round fails, which is what the seeds set out to fix.
  if "$bin" up srdma2 --addr "$addr2" --xrc-tgt-lifetime last-close >/dev/null &&
    "$bin" up srdma3 --addr "${SOFTRDMA_TEST_ADDR3:-127.0.0.4}" --xrc-tgt-lifetime last-close >/dev/null; then
    xjob "xrc_job on devices with --xrc-tgt-lifetime last-close fails" \
      "^xrc_job: FAILED .*round 0: send completion: transport retry counter exceeded" \
      --devices srdma2,srdma3 --procs 2 --rounds 1
  fi
  "$bin" down srdma2 >/dev/null 2>&1
  "$bin" down srdma3 >/dev/null 2>&1
else
  result "xrc_job" fail "$ex/xrc_job missing (scripts/build-examples.sh) or srdma2 did not start"
fi
# xrc_legacy, the seed "make receiving XRC QP independent of any one user process" through OFED's
# XRC verbs (softrdma/ofed_xrc.h): process A allocates the receive QP (ibv_alloc_xrc_rcv_qp) and
# exits; B and C receive on their XRC SRQs through it; after the last close the QP is dead. Also on
# a device whose ordinary target QPs die with their last handle (the seed's QP is the domain's).
if [ -x "$ex/xrc_legacy" ]; then
  xleg "xrc_legacy (OFED XRC verbs) across two devices" --device srdma0 --sender-device srdma1 --messages 400
  if "$bin" up srdma2 --addr "$addr2" --xrc-tgt-lifetime last-close >/dev/null; then
    xleg "xrc_legacy on one device with --xrc-tgt-lifetime last-close" --device srdma2 --sender-device srdma2 \
      --messages 100
  fi
  "$bin" down srdma2 >/dev/null 2>&1
else
  result "xrc_legacy" fail "$ex/xrc_legacy missing: run scripts/build-examples.sh"
fi
# signal_post: posts and polls interrupted by SIGALRM, sent again as soon as the handler (which
# allocates, as perftest -D's does through stdio) has run for the last one: it hung within seconds
# while the library allocated with signals deliverable (the handler waited on malloc's lock); it
# must end, on both data paths. Paced by the handler's progress, not by a timer (a 10 us interval
# timer starved the program on a loaded machine, deadlock or not); `timeout` is a hang detector.
if [ -x "$ex/signal_post" ]; then
  for dp in device provider; do
    single_timeout=180 single "signal_post: 1000 messages under 20000 SIGALRMs whose handler allocates ($dp path)" \
      "^signal_post: OK iterations [1-9][0-9]* signals [1-9]" \
      env SOFTRDMA_DATAPATH=$dp "$ex/signal_post" --device srdma0 --messages 1000 --signals 20000
  done
else
  result "signal_post" fail "$ex/signal_post missing: run scripts/build-examples.sh"
fi
# cm_sequence: qperf -cm1's connection sequence without qperf, 20 tests over one control
# connection, the server sending its ephemeral port before it listens (qperf 0.4.11's order: the
# REQ comes before the listen and must wait for it), then listening first; across two devices
# and within one. And the port-reuse loop: rping listen / connect / destroy on one port.
# (Both data paths each time: the quick runs on the device path leave them out.)
if [ $quick = 1 ]; then
  :
elif [ -x "$ex/cm_sequence" ]; then
  for dp in provider device; do
    single "cm_sequence: qperf's sequence, port sent before the listen, 20 tests ($dp path)" \
      "^cm_sequence: 20 tests passed" env SOFTRDMA_DATAPATH=$dp "$ex/cm_sequence" "$addr0" 20
    single "cm_sequence: listen first, 20 tests to the other device ($dp path)" \
      "^cm_sequence: 20 tests passed" env SOFTRDMA_DATAPATH=$dp "$ex/cm_sequence" "$addr1" 20 --listen-first
  done
else
  result "cm_sequence" fail "$ex/cm_sequence missing: run scripts/build-examples.sh"
fi
port=$((port + 1))
reuse_ok=0
[ $quick = 1 ] && reuse_ok=skip
for i in $(seq 20); do
  [ $quick = 1 ] && break
  timeout 20 rping -s -a "$addr0" -p "$port" -C 2 -S 64 >"$logs/reuse.server.log" 2>&1 &
  rspid=$!
  wait_listen "$port" || break
  timeout 20 rping -c -a "$addr0" -p "$port" -C 2 -S 64 >"$logs/reuse.client.log" 2>&1 || break
  wait "$rspid" || break
  reuse_ok=$i
done
if [ "$reuse_ok" = skip ]; then
  :
elif [ "$reuse_ok" = 20 ]; then
  result "rdma_cm port reuse: rping listen, connect, destroy on one port, 20 times" ok
else
  result "rdma_cm port reuse" fail "round $((reuse_ok + 1)) failed: $(tail -q -n 2 "$logs/reuse.server.log" "$logs/reuse.client.log" | tr '\n' ' ')"
fi
# event_intr: a signal without SA_RESTART ends a blocking ibv_get_cq_event with EINTR (qperf ends
# its tests that way), one with SA_RESTART does not. cleanup_after: every destroy returns 0 after a
# QP error, a retry-exceeded completion, a killed peer and a device that went away.
if [ $quick = 1 ]; then
  :
elif [ -x "$ex/event_intr" ] && [ -x "$ex/cleanup_after" ]; then
  for dp in provider device; do
    for m in intr restart; do
      single "event_intr $m ($dp path)" "^event_intr: $m: OK" env SOFTRDMA_DATAPATH=$dp "$ex/event_intr" srdma0 $m
    done
    for c in qp-error retry-exceeded peer-vanished; do
      single "cleanup_after $c ($dp path)" "^cleanup_after: $c: OK" env SOFTRDMA_DATAPATH=$dp "$ex/cleanup_after" srdma1 $c
    done
    if "$bin" up srdma3 --addr "${SOFTRDMA_TEST_ADDR3:-127.0.0.4}" >/dev/null; then
      coproc CLEANUP { SOFTRDMA_DATAPATH=$dp timeout 60 "$ex/cleanup_after" srdma3 device-gone 2>&1; }
      read -r -t 30 ready <&"${CLEANUP[0]}"
      timeout 15 "$bin" down srdma3 >/dev/null 2>&1
      echo go >&"${CLEANUP[1]}"
      out=$(cat <&"${CLEANUP[0]}")
      wait "$CLEANUP_PID"
      rc=$?
      if [ "${ready:-}" = ready ] && [ $rc = 0 ] && [[ "$out" == *"device-gone: OK"* ]]; then
        result "cleanup_after device-gone ($dp path)" ok
      else
        result "cleanup_after device-gone ($dp path)" fail "rc=$rc ${ready:-not ready}: $out"
      fi
    else
      result "cleanup_after device-gone ($dp path)" fail "srdma3 did not start"
    fi
  done
else
  result "event_intr, cleanup_after" fail "missing: run scripts/build-examples.sh"
fi
single "ibv_devices" "srdma0.*[0-9a-f]{16}" ibv_devices
# `softrdma exec` puts the shim on the library path itself (none set here).
single "softrdma exec -- ibv_devinfo -l" "srdma0.*srdma1|srdma1.*srdma0" env -u LD_LIBRARY_PATH bash -c \
  "\"$bin\" exec -- ibv_devinfo -l | tr '\n' ' '"
single "ibv_devinfo" "hca_id:.*srdma1" ibv_devinfo
single "ibv_devinfo -v" "GID\[ *0\]:.*::ffff:${addr0//./\\.}, RoCE v2" ibv_devinfo -v -d srdma0

n=200
sizes="64 4096 65536"
[ $quick = 1 ] && { n=50; sizes="4096 65536"; }
for where in "srdma0 srdma0" "srdma0 srdma1"; do
  set -- $where
  s=$1 c=$2
  tag="$s->$c"
  for sz in $sizes; do
    pair "ibv_rc_pingpong -s $sz $tag" "$s" "$c" ibv_rc_pingpong -s "$sz" -n "$n"
  done
  pair "ibv_rc_pingpong -e $tag" "$s" "$c" ibv_rc_pingpong -e -n "$n"
  pair "ibv_uc_pingpong $tag" "$s" "$c" ibv_uc_pingpong -n "$n"
  pair "ibv_ud_pingpong $tag" "$s" "$c" ibv_ud_pingpong -n "$n"
  pair "ibv_srq_pingpong -q 4 $tag" "$s" "$c" ibv_srq_pingpong -q 4 -n "$n"
  xsrq "ibv_xsrq_pingpong -c 4 $tag" "$s" "$c" 4
done

# perftest: each program with its defaults but few iterations, every size (-a; atomics have one
# size, perftest refuses -a for them), four QPs (-q 4; perftest allows it for bandwidth tests
# only), ib_send_bw on an SRQ, and the XRC, UC and UD transports (-c). -R (rdma_cm) waits for
# rdma_cm.
iters=20
[ $quick = 1 ] && iters=5
for where in "srdma0 srdma0" "srdma0 srdma1"; do
  set -- $where
  s=$1 c=$2
  tag="$s->$c"
  for prog in ib_send_bw ib_write_bw ib_read_bw ib_atomic_bw ib_send_lat ib_write_lat ib_read_lat ib_atomic_lat; do
    perf "$prog -n $iters $tag" "$s" "$c" "$prog" -n "$iters"
    case $prog in
      *atomic*) ;;
      # -a: 23 sizes, 2 B to 8 MiB.
      *) want_rows=23 perf "$prog -a -n 5 $tag" "$s" "$c" "$prog" -a -n 5 ;;
    esac
    case $prog in
      *_bw) perf "$prog -q 4 -n $iters $tag" "$s" "$c" "$prog" -q 4 -n "$iters" ;;
    esac
  done
  perf "ib_send_bw --use-srq -n $iters $tag" "$s" "$c" ib_send_bw --use-srq -n "$iters"
  perf "ib_send_bw --use-srq -q 4 -n $iters $tag" "$s" "$c" ib_send_bw --use-srq -q 4 -n "$iters"
  # The other transports perftest offers (-c): XRC for all eight, UC for SEND and WRITE, UD for
  # SEND (what each transport allows).
  for prog in ib_send_bw ib_write_bw ib_read_bw ib_atomic_bw ib_send_lat ib_write_lat ib_read_lat ib_atomic_lat; do
    perf "$prog -c XRC -n $iters $tag" "$s" "$c" "$prog" -c XRC -n "$iters"
  done
  for prog in ib_send_bw ib_write_bw ib_send_lat ib_write_lat; do
    perf "$prog -c UC -n $iters $tag" "$s" "$c" "$prog" -c UC -n "$iters"
  done
  for prog in ib_send_bw ib_send_lat; do
    perf "$prog -c UD -n $iters $tag" "$s" "$c" "$prog" -c UD -n "$iters"
  done
done

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
