#!/usr/bin/env bash
# rsockets (librdmacm's rsocket/rbind/.../rpoll) with unchanged programs: two softrdma devices,
# A (rsock0 on 127.0.0.81) for the servers and B (rsock1 on 127.0.0.82) for the clients, and
# - rstream (rdmacm-utils): its default run (4 sizes, latency then bandwidth, two connections), -S
#   64 B to 1 MiB, -T a (rpoll; both sides and the server alone, see below), -T b (blocking), -T n (nonblocking),
#   -T v (verify) and pairs;
# - riostream (riomap/riowrite): a few sizes, -T v, -T a;
# - rcopy: a 100 MiB random file, sha256 of source and copy compared;
# - udpong: datagram rsockets (echo mode with an exact count, and a stream of datagrams);
# - iperf3 under librspreload (LD_PRELOAD): -t 3 and -R, its JSON's bytes checked;
# - a Python echo server and 8 clients under librspreload, each client's random bytes compared;
# - a control cell on kernel TCP (rstream -T s) that checks the harness itself;
# - then rstream's default run (on the device path 64 B and 1 MiB ping-pongs instead, the
#   default run with RSOCKET_LONG), -T v, rcopy, udpong, iperf3 and the Python server again with
#   the capture on (both data paths: provider, the default, and SOFTRDMA_DATAPATH=device), and under --faults loss=0.01 (both
#   paths), and last that no process of the run is left.
# Every program runs through `softrdma exec` under `timeout -k 5`: a client 30 s (60 s for the
# default runs and rcopy), its server 10 s more.
# A cell passes when every process exits 0 (a persistent server, rcopy's and udpong's, is
# stopped), its output reports the bytes the options ask for (rstream's and riostream's result
# rows on both sides, rcopy's byte count and hashes, udpong's transfer count, iperf3's JSON), and
# the devices sent at least bytes/MTU RoCE packets between them, some from each (so no byte went
# over a kernel socket: librspreload falls back to one silently when rsocket() fails).
#
# The run is in a network namespace of its own (unshare -n; -rn when not root), where a route
# gives the clients that cannot bind (riostream, rcopy, udpong: no -b) B's address as their
# source toward A, as the host's routing picks an rdma_cm ID's device; no client binds. Without
# the namespace, clients and servers share device A (the lines say so).
#
#   scripts/test-rsocket.sh            # ~40 cells; a few minutes on 2 cores once rsockets work
# Environment:
#   RSOCKET_LONG=1   also: rstream -T r and -T a -T v at 64 KiB, riostream's default run and
#                    -T b/-T n, udpong's default run and -T a/-T b, iperf3 -P 4 -t 10, 32 Python
#                    clients, every base cell again on the device path, and the capture and
#                    faults together (~9 min)
#   RSOCKET_TCP=1    the harness on kernel sockets: rstream and udpong with -T s, iperf3 and the
#                    Python server without the preload, no RoCE packet check; riostream and rcopy
#                    (rsockets only) are skipped
#   RSOCKET_ONLY=RE  only the cells whose name matches the regex
#   RSOCKET_BUDGET=S seconds after which the cells left are failed unrun (default 900)
#   RSOCKET_LOGS=DIR keep the programs' logs there
#   RSOCKET_NETNS=0  stay in the host's network namespace
# Prints one line per cell (PASS or FAIL, name, what it moved) and `test-rsocket: P of N passed`;
# exit 1 if a cell failed, 2 if the devices could not start. Needs target/release/softrdma
# (scripts/build-shim.sh) and scripts/install-deps.sh's rdmacm-utils, librdmacm1 and iperf3.
#
# What the programs do (rdma-core 44, Debian 12), for reading the logs:
# - rstream/riostream: port 7471 (-p); server `-b ADDR`, client `-s ADDR` (riostream's client
#   ignores -b). Without -S/-C/-I the run is 64 B, 4 KiB, 64 KiB and 1 MiB ping-pong (100k, 10k,
#   1k, 100 iterations) on one connection, then the same sizes streamed (100k ... 100 transfers)
#   on a second; its per-size errors do not change the exit status, only a missing result row
#   shows them. With -S/-C the one "custom" test streams C transfers of S bytes each way; a failed
#   transfer or verification is exit 255. Both sides print the rows (name, bytes, xfers, iters,
#   total = iters*xfers*bytes*2, time, Gb/sec, usec/xfer). One -T letter per -T: `-T av` is
#   "invalid" (usage, exit 1); write `-T a -T v`. -T n is the default (MSG_DONTWAIT);
#   -T s uses kernel TCP (rstream and udpong only). -T a (rpoll before every call) runs on both
#   sides and on the server alone: the server's rshutdown(SHUT_RDWR) after its last send is a
#   DISCONNECT, and rstream's do_poll takes any POLLHUP for an error (exit 16). rdma-core's
#   rs_poll_rs reports POLLHUP at once, so there a client that reads behind the server fails;
#   softrdma's rpoll reports the hang-up once the data before it has been read (kernel TCP's FIN
#   is POLLIN|POLLRDHUP), and the both-sides cells check that.
#   riostream's default run (LONG) waits for each
#   round trip by spinning on the riomapped byte, never calling into rsockets: on 2 cores the two
#   spinning programs starve the transport (~500 round trips/s; 100k are due: past 60 s).
# - rcopy: port 7427, the server listens on the wildcard and never exits; the client is
#   `rcopy SRC ADDR:DST [-p PORT]` (options after the operands) and prints "N bytes in S seconds";
#   the server "opening: DST, transferring...N bytes...closing...done".
# - udpong: UDP port 7174; the server (`-b ADDR`) never exits; the client's exit status is 0
#   whatever its tests did: only its row counts. Its xfers are 2*C in echo mode (-T e: each
#   datagram answered, resent after 1 ms unanswered), else the datagrams the server received.
#   The client also resends on every stale answer, so once a round trip takes over 1 ms the
#   duplicates feed themselves: its default run (LONG) on a loaded 2-core machine sent 1.8 M
#   packets in 30 s for 80k datagrams, each test slower than the one before.
# - librspreload (Debian 12's) wraps socket/bind/.../select/poll, not accept4 or epoll, and a
#   socket whose rsocket() fails becomes a kernel socket. CPython asks socket() for
#   SOCK_STREAM|SOCK_CLOEXEC (rsocket: ENOTSUP, so a kernel socket) and accepts with accept4, so
#   the Python server makes its sockets and accepts through libc (ctypes: what a C program calls)
#   and uses the socket module for the rest; each socket is checked to be the preload's (a
#   /dev/null descriptor standing for the rsocket), not a kernel socket.
# - iperf3: control and data connections on one port (5201, -p). The test ends on the control
#   connection, and the sender's total counts what it wrote that the receiver had not read by
#   then (kernel TCP: equal forward, ~650 KB of 5.5 GB short with -R; rsockets: 100-262 KB,
#   up to two 128 KiB blocks, of ~800 MB), so received <= sent within 1% (or 8 MiB) passes.
set -uo pipefail
cd "$(dirname "$0")/.."
addr_a="${RSOCKET_ADDR_A:-127.0.0.81}"
addr_b="${RSOCKET_ADDR_B:-127.0.0.82}"

# A network namespace of our own: lo up, and a route to A whose preferred source is B.
if [ -z "${RSOCKET_IN_NETNS:-}" ] && [ "${RSOCKET_NETNS:-1}" = 1 ]; then
  uflag=-n
  [ "$(id -u)" = 0 ] || uflag=-rn
  if command -v unshare >/dev/null && command -v ip >/dev/null && unshare $uflag true 2>/dev/null; then
    RSOCKET_IN_NETNS=1 exec unshare $uflag bash "$0" "$@"
  fi
  echo "test-rsocket: no network namespace (unshare $uflag failed): clients and servers share device A" >&2
fi
netns=0
if [ -n "${RSOCKET_IN_NETNS:-}" ]; then
  ip link set lo up && ip route add local "$addr_a/32" dev lo src "$addr_b" table local || {
    echo "test-rsocket: cannot set up the namespace's loopback route" >&2
    exit 2
  }
  netns=1
fi

target="${CARGO_TARGET_DIR:-target}"
bin="$(realpath "$target/release/softrdma" 2>/dev/null)"
[ -x "$bin" ] || { echo "test-rsocket: no $target/release/softrdma: run scripts/build-shim.sh" >&2; exit 2; }
preload="${RSOCKET_PRELOAD:-/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so}"
for p in rstream riostream rcopy udpong iperf3 python3 sha256sum ss; do
  command -v "$p" >/dev/null || { echo "test-rsocket: $p missing: run scripts/install-deps.sh" >&2; exit 2; }
done
[ -f "$preload" ] || { echo "test-rsocket: $preload missing (librdmacm1)" >&2; exit 2; }
py=$(command -v /usr/bin/python3 || command -v python3)

long="${RSOCKET_LONG:-0}"
tcp="${RSOCKET_TCP:-0}"
only="${RSOCKET_ONLY:-}"
budget="${RSOCKET_BUDGET:-900}"
dev_a=rsock0 dev_b=rsock1

work=$(mktemp -d)
chmod 700 "$work"
mkdir -m 700 "$work/rt"
export SOFTRDMA_RUNTIME_DIR="$work/rt" SOFTRDMA_BIN="$bin" SOFTRDMA_NO_AUTOSTART=1
logs="${RSOCKET_LOGS:-$work/logs}"
mkdir -p "$logs"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  { for p in "${pids[@]}"; do wait "$p"; done; } 2>/dev/null
  for p in "$dev_a" "$dev_b"; do timeout 15 "$bin" down "$p" >/dev/null 2>&1; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

passed=0 failed=0 skipped=0
at=${EPOCHREALTIME/[.,]/}
result() { # PASS|FAIL|SKIP name detail
  local now=${EPOCHREALTIME/[.,]/} ms
  ms=$(((now - at) / 1000))
  at=$now
  case "$1" in
    PASS) passed=$((passed + 1)) setup_passed=$((setup_passed + 1)) ;;
    FAIL) failed=$((failed + 1)) ;;
    *) skipped=$((skipped + 1)) ;;
  esac
  printf '%-4s  %s: %s (%d.%d s)\n' "$1" "$2" "$3" $((ms / 1000)) $((ms % 1000 / 100))
}
# The last two lines a log holds, on one line.
say() { tail -n 2 "$1" 2>/dev/null | tr -s '\t\n' ' |' | sed 's/|$//' | cut -c1-300; }
fname() { echo "${1//[^A-Za-z0-9._-]/_}"; }

# TCP and UDP ports below the kernel's ephemeral range (scripts/programs-lib.sh says why), one
# per cell.
port=$((20000 + RANDOM % 11000))

# rstream's size_str, cnt_str and size_to_count (librdmacm/examples/common.c).
size_str() {
  local s=$1 base=1 mag="" w f=0
  if ((s >= 1 << 30)); then base=$((1 << 30)) mag=g
  elif ((s >= 1 << 20)); then base=$((1 << 20)) mag=m
  elif ((s >= 1 << 10)); then base=1024 mag=k; fi
  w=$((s / base))
  ((w < 10)) && f=$(((s % base) * 10 / base))
  if ((f)); then echo "$w.$f$mag"; else echo "$w$mag"; fi
}
cnt_str() {
  local n=$1
  if ((n >= 1000000000)); then echo "$((n / 1000000000))b"
  elif ((n >= 1000000)); then echo "$((n / 1000000))m"
  elif ((n >= 1000)); then echo "$((n / 1000))k"
  else echo "$n"; fi
}
size_to_count() {
  if (($1 >= 1 << 20)); then echo 100; elif (($1 >= 1 << 16)); then echo 1000
  elif (($1 >= 1 << 10)); then echo 10000; else echo 100000; fi
}
human() { # bytes
  if (($1 >= 1 << 20)); then echo "$(($1 / 1048576)) MiB"; elif (($1 >= 1024)); then echo "$(($1 / 1024)) KiB"; else echo "$1 B"; fi
}

# The rows rstream and riostream print for OPTIONS: exp_rows (name bytes xfers iters total, one
# a line) and exp_bytes (the bytes they move, both directions).
exp_rows="" exp_bytes=0
add_row() { # name size xfers iters
  local b=$(($4 * $3 * $2 * 2))
  exp_bytes=$((exp_bytes + b))
  exp_rows+="$1 $(size_str "$2") $(cnt_str "$3") $(cnt_str "$4") $(size_str $b)"$'\n'
}
expect_rows() { # options...
  local size=1000 count=1000 iters=1 custom=0 s
  while [ $# -gt 0 ]; do
    case "$1" in
      -S) size=$2 custom=1; shift ;;
      -C) count=$2 custom=1; shift ;;
      -I) iters=$2 custom=1; shift ;;
      -s | -b | -p | -T | -B | -i | -k | -f) shift ;;
    esac
    shift
  done
  exp_rows="" exp_bytes=0
  if [ $custom = 1 ]; then
    add_row custom "$size" "$count" "$iters"
  else
    for s in 64 4096 65536 1048576; do add_row "$(size_str $s)_lat" $s 1 "$(size_to_count $s)"; done
    for s in 64 4096 65536 1048576; do add_row "$(size_str $s)_bw" $s "$(size_to_count $s)" 1; done
  fi
}
rows_of() { awk '$1 ~ /^(custom|[0-9.]+[kmg]?_(lat|bw))$/ {print $1, $2, $3, $4, $5}' "$1"; }

# Setups: the devices' options and the data path, for a group of cells.
setup_tag="" path=provider capture=off faults="" setup_ran=0 setup_passed=0
pcap_a="" pcap_b=""
mtu=4096
setup_begin() { # tag path capture(on|off) faults
  setup_tag=$1 path=$2 capture=$3 faults=$4 setup_ran=0 setup_passed=0
  local -a fa=(--addr "$addr_a") fb=(--addr "$addr_b")
  if [ "$capture" = on ]; then
    pcap_a="$work/$dev_a.pcap" pcap_b="$work/$dev_b.pcap"
    fa+=(--pcap "$pcap_a")
    fb+=(--pcap "$pcap_b")
  fi
  if [ -n "$faults" ]; then
    fa+=(--faults "$faults,seed=11")
    fb+=(--faults "$faults,seed=12")
  fi
  echo "== ${setup_tag:-base}: $path data path, capture $capture${faults:+, faults $faults}$([ $netns = 0 ] && echo ', clients on device A too (no namespace)')"
  if ! "$bin" up "$dev_a" "${fa[@]}" >"$logs/up.log" 2>&1 || ! "$bin" up "$dev_b" "${fb[@]}" >>"$logs/up.log" 2>&1; then
    echo "test-rsocket: the devices did not start: $(say "$logs/up.log")" >&2
    exit 2
  fi
  export SOFTRDMA_DATAPATH="$path"
  mtu=$("$bin" list | awk -v d="$dev_a" '$1 == d {print $4}')
  [ -n "$mtu" ] || mtu=4096
}
setup_end() {
  local lost_a lost_b why="" frames=0 f out n
  if [ "$capture" = on ]; then
    lost_a=$("$bin" stat "$dev_a" | awk '$1 == "capture_dropped" {print $2}')
    lost_b=$("$bin" stat "$dev_b" | awk '$1 == "capture_dropped" {print $2}')
  fi
  timeout 15 "$bin" down "$dev_a" >/dev/null 2>&1
  timeout 15 "$bin" down "$dev_b" >/dev/null 2>&1
  if [ "$capture" = on ] && [ "$setup_ran" = 0 ]; then
    rm -f "$pcap_a" "$pcap_b"
  elif [ "$capture" = on ]; then
    [ "${lost_a:-x}" = 0 ] && [ "${lost_b:-x}" = 0 ] || why+="frames lost: $dev_a ${lost_a:-?}, $dev_b ${lost_b:-?}; "
    for f in "$pcap_a" "$pcap_b"; do
      out=$("$bin" pcap check "$f" 2>&1) || why+="$(basename "$f"): $(echo "$out" | grep -iE "bad|malformed|truncated|verdict" | tr -s ' ' | tr '\n' ' '); "
      n=$(echo "$out" | awk '$1 == "frames" {print $2; exit}')
      frames=$((frames + ${n:-0}))
    done
    [ "$tcp" = 1 ] || [ "$frames" -gt 0 ] || why+="no frames captured; "
    if [ "$frames" = 0 ] && [ "$setup_passed" = 0 ]; then
      result SKIP "capture [$setup_tag]" "no cell of the setup moved data"
    elif [ -z "$why" ]; then
      result PASS "capture [$setup_tag]" "$frames frames in both devices' files, 0 lost, every frame well formed, ICRC valid"
    else
      result FAIL "capture [$setup_tag]" "$frames frames: ${why%; }"
    fi
    rm -f "$pcap_a" "$pcap_b"
  fi
}

# Whether cell NAME runs (RSOCKET_ONLY, the time budget).
want() {
  [ -z "$only" ] || [[ "$1" =~ $only ]] || return 1
  if [ "$SECONDS" -ge "$budget" ]; then
    result FAIL "$1" "not run: the run's time budget (RSOCKET_BUDGET=$budget s) is spent"
    return 1
  fi
  setup_ran=1
}
cellname() { echo "$1${setup_tag:+ [$setup_tag]}"; }

pkts() { "$bin" stat "$1" 2>/dev/null | awk -v k="$2" '$1 == k {print $2}'; }
pk_a=0 pk_b=0 pk_ra=0 pk_rb=0
pk_mark() {
  pk_a=$(pkts "$dev_a" sent_pkts) pk_b=$(pkts "$dev_b" sent_pkts)
  pk_ra=$(pkts "$dev_a" rcvd_pkts) pk_rb=$(pkts "$dev_b" rcvd_pkts)
}
# The RoCE packets the cell's BYTES took: at least BYTES/MTU from the two devices, some from each
# (the client on B, the server on A). Appends to why, sets pk_note.
# What A sent is what A counted or, if more, what B received (A is the only other device in the
# namespace), and the other way round: on the provider data path a process reports its counters
# to its device every 50 ms and when it exits, so a persistent server that is stopped (TERM) right
# after its last packet (udpong's, rcopy's) takes its last counts with it, while its client, which
# exits, has reported what it received.
pk_note=""
pk_check() { # bytes [min packets]
  local da db ra rb need
  da=$(($(pkts "$dev_a" sent_pkts) - pk_a)) db=$(($(pkts "$dev_b" sent_pkts) - pk_b))
  ra=$(($(pkts "$dev_a" rcvd_pkts) - pk_ra)) rb=$(($(pkts "$dev_b" rcvd_pkts) - pk_rb))
  [ "$rb" -gt "$da" ] && da=$rb
  [ "$ra" -gt "$db" ] && db=$ra
  need=$((($1 + mtu - 1) / mtu))
  [ $# -gt 1 ] && [ "$2" -gt "$need" ] && need=$2
  pk_note="$((da + db)) RoCE packets ($dev_a $da, $dev_b $db)"
  # (kernel sockets; or a run its timeout ended, which moved less than it was to)
  [ "$tcp" = 1 ] || [[ "$crc$src" =~ 124|137 ]] && return
  if [ $((da + db)) -lt "$need" ]; then
    why+="the devices sent $((da + db)) packets ($dev_a $da, $dev_b $db) for $(human "$1") (at least $need at MTU $mtu): the bytes did not go over rsockets; "
  elif [ $netns = 1 ] && { [ "$da" = 0 ] || [ "$db" = 0 ]; }; then
    why+="one device sent nothing ($dev_a $da, $dev_b $db): client and server were not on the two devices; "
  fi
}

# Waits until the server (PID) listens on A's PORT: an rdma_cm ID of A's in state LISTEN (TCP)
# or bound (UDP port space: datagram rsockets), or a kernel socket (-T s, the preload's fallback).
# 0 ready, 1 not after 15 s, 2 the server exited.
ready() { # port TCP|UDP pid
  local i re
  if [ "$2" = TCP ]; then re="state LISTEN ps TCP .*src-addr [^ ]*:$1 "; else re="ps UDP .*src-addr [^ ]*:$1 "; fi
  for i in $(seq 150); do
    kill -0 "$3" 2>/dev/null || return 2
    "$bin" cm-ids "$dev_a" 2>/dev/null | grep -qE "$re" && return 0
    if [ "$2" = TCP ]; then
      [ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ] && return 0
    else
      [ -n "$(ss -Hlun "sport = :$1" 2>/dev/null)" ] && return 0
    fi
    sleep 0.1
  done
  return 1
}
# Ends a background process of ours: TERM, then KILL after 3 s; sets its exit status in stopped_rc.
stop() { # pid
  local i
  kill "$1" 2>/dev/null
  for i in $(seq 30); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$1" 2>/dev/null
  { wait "$1"; stopped_rc=$?; } 2>/dev/null
}

# pair NAME TIMEOUT TCP|UDP persistent(0|1) CHECK SERVER... -- CLIENT...: the server (through
# `softrdma exec`) on A, once it listens the client on B, then CHECK (a function reading
# $slog/$clog, $src/$crc, setting why and detail). A server that ends by itself must exit 0
# within 10 s of its client; a persistent one is stopped (after $settle_re shows in its log,
# when set). `@P` in the commands is the cell's port.
settle_re="" early_hint=""
pair() {
  local name=$1 t=$2 ps=$3 persistent=$4 check=$5 a
  shift 5
  local -a srv=() cli=()
  port=$((port + 1))
  while [ "$1" != -- ]; do srv+=("${1//@P/$port}"); shift; done
  shift
  for a in "$@"; do cli+=("${a//@P/$port}"); done
  local f
  f=$(fname "$name")
  slog="$logs/$f.server.log" clog="$logs/$f.client.log"
  : >"$clog"
  why="" detail="" src="" crc=""
  pk_mark
  # (-k: iperf3 catches SIGTERM and its handler can block on the connection it ends)
  # (the server outlives its client's timeout: a persistent one is stopped by this script)
  timeout -k 5 $((t + 10)) "$bin" exec -- "${srv[@]}" >"$slog" 2>&1 &
  local spid=$! r
  pids+=("$spid")
  ready "$port" "$ps" "$spid"
  r=$?
  if [ $r = 2 ]; then
    { wait "$spid"; src=$?; } 2>/dev/null
    local hint=""
    [ -n "$early_hint" ] && grep -qiE "not supported|not implemented" "$slog" && hint="$early_hint: "
    result FAIL "$name" "${hint}server exited (rc $src) before it listened: $(say "$slog")"
    settle_re="" early_hint=""
    return
  elif [ $r = 1 ]; then
    stop "$spid"
    result FAIL "$name" "server not listening on $addr_a:$port after 15 s: $(say "$slog")"
    settle_re=""
    return
  fi
  # (the braces: the shell's own "Killed" notice for a process SIGKILL ended goes nowhere)
  { timeout -k 5 "$t" "$bin" exec -- "${cli[@]}" >"$clog" 2>&1; crc=$?; } 2>/dev/null
  [ "$crc" = 124 ] || [ "$crc" = 137 ] && why+="client timed out after $t s$([ "$crc" = 137 ] && echo ', killed: it ignored SIGTERM'); "
  if [ "$persistent" = 1 ]; then
    if [ -n "$settle_re" ]; then
      for _ in $(seq 100); do grep -qE "$settle_re" "$slog" && break; sleep 0.1; done
    fi
    src=0
    if kill -0 "$spid" 2>/dev/null; then
      stop "$spid"
    else
      { wait "$spid"; src=$?; } 2>/dev/null
      why+="the server (which serves until stopped) exited by itself, rc $src: $(say "$slog"); "
    fi
  else
    for _ in $(seq 100); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$spid" 2>/dev/null; then
      stop "$spid"
      src=$stopped_rc
      why+="server still running 10 s after its client ended (stopped); "
    else
      { wait "$spid"; src=$?; } 2>/dev/null
      [ "$src" = 124 ] || [ "$src" = 137 ] && why+="server timed out after $((t + 10)) s$([ "$src" = 137 ] && echo ', killed: it ignored SIGTERM'); "
    fi
  fi
  settle_re="" early_hint=""
  "$check"
  if [ -z "$why" ]; then
    result PASS "$name" "$detail"
  else
    result FAIL "$name" "${why%; }${detail:+ ($detail)}"
  fi
}

# rstream and riostream: exit 0 both, and both sides print exactly the rows the options ask for.
stream_args=()
check_stream() {
  local side log got
  expect_rows "${stream_args[@]}"
  # (a timeout has its own words already)
  [[ "$src" =~ ^(0|124|137)$ ]] || why+="server rc $src: $(say "$slog"); "
  [[ "$crc" =~ ^(0|124|137)$ ]] || why+="client rc $crc: $(say "$clog"); "
  for side in server client; do
    log=$slog
    [ $side = client ] && log=$clog
    got=$(rows_of "$log")
    if [ "$got"$'\n' != "$exp_rows" ]; then
      local -a g e
      mapfile -t g <<<"$got"
      mapfile -t e <<<"${exp_rows%$'\n'}"
      [ -n "$got" ] || g=()
      local i=0
      while [ $i -lt ${#e[@]} ] && [ "${g[$i]:-}" = "${e[$i]}" ]; do i=$((i + 1)); done
      why+="$side printed ${#g[@]} of ${#e[@]} result rows, the first wrong or missing: want '${e[$i]:-}', got '${g[$i]:-nothing}'; "
    fi
  done
  pk_check "$exp_bytes"
  detail="$(echo -n "$exp_rows" | grep -c .) result rows each side, $(human "$exp_bytes") moved, $pk_note"
}
stream() { # program options... [+server server-only options...]: a server `-b A` and a client
  # `-s A`, both with the options (and the server with the server-only ones)
  local prog=$1 t=30
  shift
  local -a both=() sonly=()
  while [ $# -gt 0 ] && [ "$1" != +server ]; do both+=("$1"); shift; done
  [ $# -gt 0 ] && { shift; sonly=("$@"); }
  local name
  name="$prog${both[*]:+ ${both[*]}}"
  [ ${#both[@]} = 0 ] && name+=" (default run)"
  [ ${#sonly[@]} -gt 0 ] && name+=", ${sonly[*]} on the server"
  name=$(cellname "$name")
  want "$name" || return 0
  local -a extra=()
  if [ "$tcp" = 1 ]; then
    [ "$prog" = rstream ] || { result SKIP "$name" "rsockets only (no kernel-socket mode)"; return 0; }
    extra=(-T s)
  fi
  # The default run (no -S/-C) moves ~870 MB in 300k messages, and the big sizes need time.
  [[ " ${both[*]} " == *" -C "* ]] || t=60
  stream_args=("${both[@]}")
  # (stdbuf: rows written as they come, so a run stopped by its timeout shows how far it got)
  pair "$name" "$t" TCP 0 check_stream stdbuf -oL "$prog" "${extra[@]}" "${sonly[@]}" -b "$addr_a" -p @P "${both[@]}" -- \
    stdbuf -oL "$prog" "${extra[@]}" -s "$addr_a" -p @P "${both[@]}"
}

# rcopy: the file's bytes in the client's line and the server's, the hashes equal.
rcopy_src="" rcopy_size=0
check_rcopy() {
  local dst=$rcopy_dst
  [ "$crc" = 0 ] || why+="client rc $crc: $(say "$clog"); "
  grep -q "^$rcopy_size bytes in" "$clog" || why+="client did not report $rcopy_size bytes: $(say "$clog"); "
  grep -q "\.\.\.$rcopy_size bytes\.\.\.closing\.\.\.done" "$slog" || why+="server did not report the transfer done: $(say "$slog"); "
  if [ -f "$dst" ]; then
    local h1 h2
    h1=$(sha256sum <"$rcopy_src" | cut -c1-64) h2=$(sha256sum <"$dst" | cut -c1-64)
    [ "$h1" = "$h2" ] || why+="sha256 differs: source $h1, copy $h2 ($(stat -c %s "$dst") bytes); "
    detail="$(human "$rcopy_size"), sha256 ${h1:0:16}... both, $(grep -oE '[0-9.]+ Gb/sec' "$clog" | head -1)"
  else
    why+="no copy at $dst; "
  fi
  rm -f "$dst"
  pk_check "$rcopy_size"
  detail+="${detail:+, }$pk_note"
}
rcopy_cell() {
  local name
  name=$(cellname "rcopy $(human "$rcopy_size") file")
  want "$name" || return 0
  [ "$tcp" = 1 ] && { result SKIP "$name" "rsockets only (no kernel-socket mode)"; return 0; }
  rcopy_dst="$work/rcopy.copy"
  settle_re="closing\.\.\.done|error"
  pair "$name" 60 TCP 1 check_rcopy rcopy -p @P -- rcopy "$rcopy_src" "$addr_a:$rcopy_dst" -p @P
}

# udpong: the client's row (its exit status says nothing): echo mode exactly 2*C transfers,
# otherwise some of the C datagrams delivered.
udp_count=0 udp_size=1000 udp_echo=0 udp_default=0
check_udpong() {
  [ "$crc" = 0 ] || why+="client rc $crc: $(say "$clog"); "
  local rows n x
  rows=$(awk '$1 ~ /^(custom|[0-9.]+[kmg]?_(lat|bw))$/ {print $1, $2, $3, $4}' "$clog")
  if [ "$udp_default" = 1 ]; then
    n=$(echo -n "$rows" | grep -c .)
    [ "$n" = 18 ] || why+="$n of 18 result rows: $(say "$clog"); "
    echo "$rows" | awk '$3 == "0" {bad = 1} END {exit bad}' || why+="a test delivered nothing; "
    detail="$n result rows"
    pk_check 0 1000
  else
    x=$(echo "$rows" | awk '$1 == "custom" {print $3}')
    if [ -z "$x" ]; then
      why+="no result row: $(say "$clog"); "
    elif [ "$udp_echo" = 1 ]; then
      [ "$x" = "$(cnt_str $((2 * udp_count)))" ] || why+="$x transfers, want $((2 * udp_count)); "
      detail="$x datagrams of $udp_size B echoed"
    else
      [[ "$x" =~ ^[0-9]+$ ]] && [ "$x" -gt 0 ] || why+="$x of $udp_count datagrams delivered; "
      detail="$x of $udp_count datagrams of $udp_size B delivered (UD drops are datagrams' right)"
    fi
    local least=1
    if [ "$udp_echo" = 1 ]; then least=$((2 * udp_count)); elif [[ "$x" =~ ^[0-9]+$ ]] && [ "$x" -gt 0 ]; then least=$x; fi
    pk_check 0 "$least"
  fi
  detail+=", $pk_note"
  if [ -n "$why" ] && grep -qiE "not implemented|not supported" "$slog" "$clog"; then
    why="datagram rsockets (SOCK_DGRAM) not available: ${why}"
  fi
}
udpong_cell() { # options...
  local name t
  name=$(cellname "udpong${*:+ $*}$([ $# = 0 ] && echo ' (default run)')")
  want "$name" || return 0
  udp_count=1000 udp_size=1000 udp_echo=0 udp_default=1 t=30
  local -a o=("$@") extra=()
  while [ $# -gt 0 ]; do
    case "$1" in
      -C) udp_count=$2 udp_default=0; shift ;;
      -S) udp_size=$2 udp_default=0; shift ;;
      -T) [ "$2" = e ] && udp_echo=1; shift ;;
    esac
    shift
  done
  [ "$tcp" = 1 ] && extra=(-T s)
  # (the default run: 18 tests, 180k datagrams of each kind)
  [ "$udp_default" = 1 ] && t=60
  early_hint="datagram rsockets (SOCK_DGRAM) not available"
  pair "$name" "$t" UDP 1 check_udpong stdbuf -oL udpong "${extra[@]}" -b "$addr_a" -p @P -- stdbuf -oL udpong "${extra[@]}" -s "$addr_a" -p @P "${o[@]}"
}

# iperf3 under librspreload: both exit 0, JSON without error, bytes > 0, received <= sent within
# 1% or 8 MiB (the test ends on the control connection: what the sender wrote last can still be
# unread on the data connection), the server's JSON agreeing with the client's.
iperf_reverse=0
check_iperf() {
  local v
  v=$("$py" - "$clog" "$slog" "$iperf_reverse" <<'PY' 2>&1
import json, sys
def load(f):
    try:
        return json.load(open(f))
    except Exception as e:
        return {"error": f"no JSON in {f.rsplit('/', 1)[-1]}: {e}"}
c, s, rev = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3] == "1"
errs = [f"{w}: {j['error']}" for w, j in (("client", c), ("server", s)) if j.get("error")]
if errs:
    print("; ".join(errs)); sys.exit(1)
e = c["end"]
sent, rcvd = e["sum_sent"]["bytes"], e["sum_received"]["bytes"]
srv = s["end"]["sum_sent" if rev else "sum_received"]["bytes"]
bad = []
if sent <= 0 or rcvd <= 0:
    bad.append("no bytes")
if not (0 <= sent - rcvd <= max(sent // 100, 8 << 20)):
    bad.append(f"received {rcvd} of {sent} B sent")
if srv != (sent if rev else rcvd):
    bad.append(f"the server's JSON says {srv} B, the client's {sent if rev else rcvd} B")
if bad:
    print("; ".join(bad)); sys.exit(1)
local = c["start"]["connected"][0]
print(sent, rcvd, f'{e["sum_received"].get("bits_per_second", 0) / 1e9:.2f}', local["local_host"])
PY
  )
  local vrc=$?
  # (a process timeout ended writes no JSON: its line says so already)
  [[ "$src" =~ ^(0|124|137)$ ]] || why+="server rc $src; "
  [[ "$crc" =~ ^(0|124|137)$ ]] || why+="client rc $crc; "
  if [ $vrc != 0 ]; then
    [[ "$src$crc" =~ 124|137 ]] || why+="$(echo "$v" | tail -n 1 | cut -c1-300); "
  else
    read -r sent rcvd gbps lhost _ <<<"$v"
    pk_check "$rcvd"
    detail="sent $sent B, received $rcvd B ($((sent - rcvd)) unread at the end), $gbps Gb/s, client from $lhost, $pk_note"
  fi
}
iperf_cell() { # options...
  local name
  name=$(cellname "iperf3 $* (librspreload)")
  [ "$tcp" = 1 ] && name=$(cellname "iperf3 $* (kernel TCP)")
  want "$name" || return 0
  iperf_reverse=0
  [[ " $* " == *" -R "* ]] && iperf_reverse=1
  local -a pre=(env "LD_PRELOAD=$preload")
  [ "$tcp" = 1 ] && pre=(env)
  pair "$name" 30 TCP 0 check_iperf "${pre[@]}" iperf3 -s -1 -B "$addr_a" -p @P -J -- "${pre[@]}" iperf3 -c "$addr_a" -p @P -J "$@"
}

# The Python echo server (written below) and its clients under librspreload.
py_clients=8 py_bytes=262144
check_python() {
  [ "$src" = 0 ] || why+="server rc $src: $(say "$slog"); "
  [ "$crc" = 0 ] || why+="client rc $crc: $(say "$clog"); "
  grep -q "^served $py_clients clients, $((py_clients * py_bytes)) bytes echoed" "$slog" || why+="server: $(say "$slog"); "
  grep -q "^$py_clients of $py_clients clients: $py_bytes random bytes each echoed intact" "$clog" || why+="clients: $(grep -m 2 -vE '^client [0-9]+: ok' "$clog" | tr '\n' '|' | cut -c1-300); "
  pk_check $((2 * py_clients * py_bytes))
  detail="$py_clients clients x $(human $py_bytes) echoed, $(head -n 1 "$slog" | sed 's/^listening on //'), $pk_note"
}
python_cell() {
  local name mode=rsocket
  name=$(cellname "python3 echo server, $py_clients threads' clients (librspreload)")
  [ "$tcp" = 1 ] && name=$(cellname "python3 echo server, $py_clients threads' clients (kernel TCP)") mode=kernel
  want "$name" || return 0
  local -a pre=(env "LD_PRELOAD=$preload")
  [ "$tcp" = 1 ] && pre=(env)
  pair "$name" 30 TCP 0 check_python "${pre[@]}" "$py" "$work/echo.py" server "$addr_a" @P "$py_clients" "$mode" -- \
    "${pre[@]}" "$py" "$work/echo.py" client "$addr_a" @P "$py_clients" "$py_bytes" "$mode"
}

cat >"$work/echo.py" <<'PY'
# test-rsocket.sh's echo server and clients (threads, blocking calls).
#   echo.py server ADDR PORT CLIENTS MODE          serves CLIENTS connections, then exits
#   echo.py client ADDR PORT CLIENTS BYTES MODE    CLIENTS threads, each its own random BYTES
# MODE rsocket: the sockets come from libc's socket() and accept() (under LD_PRELOAD, the
# preload's: CPython would ask socket() for SOCK_CLOEXEC, which rsocket() refuses, and accept with
# accept4, which Debian 12's librspreload does not wrap) and must be rsockets (the preload's
# /dev/null descriptor, not a kernel socket); everything else is the socket module's.
# MODE kernel: the socket module alone.
import ctypes, os, random, socket, stat, sys, threading

mode = sys.argv[-1]
libc = ctypes.CDLL(None, use_errno=True)


def wrap(fd, what):
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    if stat.S_ISSOCK(os.fstat(fd).st_mode):
        sys.exit(f"{what} gave a kernel socket, not an rsocket: librspreload fell back to the "
                 "kernel's socket() because rsocket() failed")
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=fd)


def new_socket():
    if mode == "kernel":
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    return wrap(libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0), "socket()")


def accept(ls):
    if mode == "kernel":
        return ls.accept()[0]
    return wrap(libc.accept(ls.fileno(), None, None), "accept()")


def kind(s):
    return "kernel socket" if stat.S_ISSOCK(os.fstat(s.fileno()).st_mode) else "rsocket"


def server(addr, port, n):
    ls = new_socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(n)
    print(f"listening on {addr}:{port} ({kind(ls)})", flush=True)
    echoed = [0] * n
    errors = []

    def echo(i, c):
        try:
            while True:
                d = c.recv(65536)
                if not d:
                    break
                c.sendall(d)
                echoed[i] += len(d)
        except OSError as e:
            errors.append(f"connection {i}: {e}")
        finally:
            c.close()

    threads = []
    for i in range(n):
        c = accept(ls)
        t = threading.Thread(target=echo, args=(i, c))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    ls.close()
    for e in errors:
        print(e, flush=True)
    print(f"served {n} clients, {sum(echoed)} bytes echoed", flush=True)
    return 1 if errors else 0


def client(addr, port, n, size):
    results = [None] * n

    def one(i):
        step = "socket()"
        try:
            data = os.urandom(size)
            s = new_socket()
            step = "connect()"
            s.connect((addr, port))
            step = "send/recv"
            chunks = random.Random(i)

            def send():
                off = 0
                while off < size:
                    k = chunks.randint(1, 16384)
                    s.sendall(data[off:off + k])
                    off += k

            t = threading.Thread(target=send)
            t.start()
            got = bytearray()
            while len(got) < size:
                d = s.recv(65536)
                if not d:
                    break
                got += d
            t.join()
            local = s.getsockname()[0]
            s.close()
            if bytes(got) == data:
                results[i] = (True, f"ok, {size} bytes back from {local} ({kind_of[i]})")
            else:
                bad = next((j for j in range(min(len(got), size)) if got[j] != data[j]), min(len(got), size))
                results[i] = (False, f"{len(got)} of {size} bytes back, first difference at {bad}")
        except (OSError, SystemExit) as e:
            results[i] = (False, f"{step}: {e}")

    kind_of = ["rsocket" if mode == "rsocket" else "kernel socket"] * n
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (ok, msg) in enumerate(results):
        print(f"client {i}: {msg}", flush=True)
    good = sum(1 for ok, _ in results if ok)
    print(f"{good} of {n} clients: {size} random bytes each echoed intact", flush=True)
    return 0 if good == n else 1


if sys.argv[1] == "server":
    sys.exit(server(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
sys.exit(client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
PY

# The control: kernel TCP through the same harness (rstream -T s): a failure here is the
# harness's, not rsockets'.
control_cell() {
  local name
  name=$(cellname "rstream -T s -T v -S 65536 -C 100 (kernel TCP: the harness's control)")
  want "$name" || return 0
  stream_args=(-T v -S 65536 -C 100)
  local save=$tcp
  tcp=1
  pair "$name" 30 TCP 0 check_stream rstream -T s -T v -b "$addr_a" -p @P -S 65536 -C 100 -- rstream -T s -T v -s "$addr_a" -p @P -S 65536 -C 100
  tcp=$save
}

# The errors a socket program expects: ECONNREFUSED from a connect nobody listens for (the
# peer's CM answers REJ), and ECONNRESET from a send once the peer was killed mid-stream (its
# device's cleanup sends the DREQ), both with blocking calls (-T b) and with non-blocking ones
# (the default: rstream retries EAGAIN without ever sleeping, so only its calls can see the CM's
# DISCONNECTED event).
error_cells() {
  [ "$tcp" = 1 ] && return 0
  local name log rc
  name=$(cellname "ECONNREFUSED: rconnect with no listener")
  if want "$name"; then
    port=$((port + 1))
    log="$logs/$(fname "$name").log"
    timeout -k 5 30 "$bin" exec -- rstream -T b -s "$addr_a" -p "$port" -S 64 -C 10 >"$log" 2>&1
    rc=$?
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -q "rconnect: Connection refused" "$log"; then
      result PASS "$name" "rstream exits $rc: \"$(grep -m1 'rconnect' "$log")\""
    else
      result FAIL "$name" "rc $rc: $(say "$log")"
    fi
  fi
  local mode
  for mode in "-T b" ""; do
    local label="(non-blocking)"
    [ -n "$mode" ] && label="($mode)"
    name=$(cellname "ECONNRESET: the server killed mid-stream $label")
    want "$name" || continue
    port=$((port + 1))
    log="$logs/$(fname "$name")"
    timeout -k 5 60 "$bin" exec -- rstream $mode -b "$addr_a" -p "$port" -S 65536 -C 10000000 >"$log.server.log" 2>&1 &
    local spid=$!
    ready "$port" TCP "$spid" || true
    timeout -k 5 40 "$bin" exec -- rstream $mode -s "$addr_a" -p "$port" -S 65536 -C 10000000 >"$log.client.log" 2>&1 &
    local cpid=$!
    sleep 1.5
    pkill -9 -P "$spid" 2>/dev/null
    pkill -9 -f "rstream $mode -b $addr_a -p $port " 2>/dev/null
    { wait "$spid"; } 2>/dev/null
    local t0=$SECONDS
    { wait "$cpid"; rc=$?; } 2>/dev/null
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -q "Connection reset by peer" "$log.client.log"; then
      result PASS "$name" "the client exits $rc $((SECONDS - t0)) s after: \"$(grep -m1 'reset by peer' "$log.client.log")\""
    else
      result FAIL "$name" "client rc $rc: $(say "$log.client.log")"
    fi
  done
}

rcopy_src="$work/rcopy.src"
rcopy_size=$((100 << 20))
head -c "$rcopy_size" /dev/urandom >"$rcopy_src"

echo "test-rsocket: servers on $dev_a ($addr_a), clients on $dev_b ($addr_b)$([ $netns = 1 ] && echo ' in a network namespace of its own')$([ "$tcp" = 1 ] && echo '; RSOCKET_TCP=1: kernel sockets')$([ "$long" = 1 ] && echo '; RSOCKET_LONG=1')"

base_cells() {
  stream rstream
  stream rstream -S 64 -C 10000
  stream rstream -S 4096 -C 2000
  stream rstream -S 65536 -C 200
  stream rstream -S 1048576 -C 20
  stream rstream -T a -S 4096 -C 1000
  stream rstream -S 4096 -C 1000 +server -T a
  stream rstream -T b -S 65536 -C 100
  stream rstream -T n -S 4096 -C 1000
  stream rstream -T v -S 65536 -C 200
  stream rstream -T a -T v -S 1048576 -C 10
  stream rstream -T b -T v -S 4096 -C 1000
  stream riostream -S 4096 -C 1000
  stream riostream -T v -S 65536 -C 100
  stream riostream -T v -S 1048576 -C 10
  stream riostream -T a -S 65536 -C 100
  rcopy_cell
  udpong_cell -T e -S 1024 -C 400
  udpong_cell -S 1024 -C 900
  iperf_cell -t 3
  iperf_cell -t 3 -R
  python_cell
  if [ "$long" = 1 ]; then
    stream rstream -T r -S 65536 -C 100
    stream rstream -T a -T v -S 65536 -C 200
    stream riostream
    stream riostream -T b -T v -S 65536 -C 100
    stream riostream -T n -S 4096 -C 1000
    udpong_cell
    udpong_cell -T a -T e -S 512 -C 400
    udpong_cell -T b -S 1024 -C 900
    iperf_cell -t 10 -P 4
    py_clients=32 py_bytes=65536 python_cell
    py_clients=8 py_bytes=262144
  fi
}
# With the capture on: the default run (~870 MB each way through both captures), -T v, rcopy.
# On the device path the default run is in RSOCKET_LONG only, ping-pongs of its sizes in the
# short run: there the daemons run the QPs, and two programs spinning on non-blocking calls
# (rstream's default) take the CPU the daemons need; with two busy processes beside it, 64 B
# took 2.1 ms a one-way here (77 us on the provider path, where the spinning program drives its
# own QP), so its 100k round trips ran past any timeout, and CI's run of it did.
capture_cells() {
  if [ "$path" = provider ] || [ "$long" = 1 ]; then
    stream rstream
  else
    stream rstream -S 64 -C 1 -I 5000
    stream rstream -S 1048576 -C 1 -I 50
  fi
  stream rstream -T v -S 65536 -C 200
  rcopy_cell
  udpong_cell -T e -S 1024 -C 400
  iperf_cell -t 3
  python_cell
}
# Under loss: streamed runs only. The default run's 300k ping-pong messages cannot finish: a
# lost message with nothing behind it waits out its QP's local ACK timeout (rdma_cm's packet
# lifetime 18 + 1: 4.096 us x 2^19 = 2.1 s), ~2000 times at 1% loss.
fault_cells() {
  stream rstream -T v -S 65536 -C 100
  stream rstream -S 1048576 -C 10
  stream riostream -T v -S 65536 -C 20
  rcopy_cell
  # Not udpong's echo mode: its client resends after 1 ms without an answer and again on every
  # stale answer, so once a lost datagram's retry meets a late answer the duplicates feed
  # themselves (764,172 packets in 30 s for 800 datagrams, seen here): a stream of datagrams,
  # some lost, as UD may.
  udpong_cell -S 1024 -C 900
  iperf_cell -t 3
  python_cell
}

setup_begin "" provider off ""
base_cells
control_cell
error_cells
setup_end
if [ "$long" = 1 ]; then
  setup_begin "device path" device off ""
  base_cells
  setup_end
fi
setup_begin "capture" provider on ""
capture_cells
setup_end
setup_begin "device path, capture" device on ""
capture_cells
setup_end
setup_begin "loss 1%" provider off "loss=0.01"
fault_cells
setup_end
setup_begin "device path, loss 1%" device off "loss=0.01"
fault_cells
setup_end
if [ "$long" = 1 ]; then
  setup_begin "capture, loss 1%" provider on "loss=0.01"
  fault_cells
  setup_end
  setup_begin "device path, capture, loss 1%" device on "loss=0.01"
  fault_cells
  setup_end
fi

# Nothing of the run is left: in the namespace, no process but this script (the devices are
# down, every server ended).
if [ $netns = 1 ] && { [ -z "$only" ] || [[ "no process left" =~ $only ]]; }; then
  left=()
  # (the glob is expanded before this loop starts a process of its own)
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" = $$ ] && continue
    [ /proc/$p/ns/net -ef /proc/$$/ns/net ] 2>/dev/null && left+=("$p")
  done
  gone=()
  for p in "${left[@]}"; do kill -0 "$p" 2>/dev/null && gone+=("$p $(tr '\0' ' ' </proc/$p/cmdline 2>/dev/null | cut -c1-80)"); done
  if [ ${#gone[@]} = 0 ]; then
    result PASS "no process left" "the devices are down and every program ended"
  else
    result FAIL "no process left" "$(printf '%s; ' "${gone[@]}")"
    for p in "${gone[@]}"; do kill "${p%% *}" 2>/dev/null; done
  fi
fi

echo "test-rsocket: $passed of $((passed + failed)) passed$([ "$skipped" -gt 0 ] && echo ", $skipped skipped") ($((SECONDS / 60))m$((SECONDS % 60))s)"
[ "$failed" = 0 ]
