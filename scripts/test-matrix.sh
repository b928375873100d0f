#!/usr/bin/env bash
# The program matrix: unchanged rdma-core, perftest, qperf and rdmacm-utils programs across the
# combinations users turn on together. Each setup is a data path (provider: each program runs its
# own QPs; device: the daemons run them) with the capture off or on (`softrdma up --pcap` on both
# devices), and, for a subset, faults injected on both devices; within a setup each cell is a
# program with its options, between two devices (across) or on one (within), polling or sleeping
# on completion events (-e). A cell passes when every process exits 0 and prints its figure; a
# setup with the capture on passes its capture cell when neither device lost a frame
# (capture_dropped 0) and `softrdma pcap check` finds every frame well formed, its ICRC valid.
#
# Usage: scripts/test-matrix.sh [--full] [--repeat N] [--only REGEX]
#   (no option)  the sample CI runs: every program at least once in each of the four setups
#                (both data paths, capture off and on) and a few cells under faults (~8 min)
#   --full       every cell (perftest: 4 programs x bandwidth and latency x TCP or rdma_cm
#                exchange x sizes x -q 1/4 x polling/events x across/within, qperf's RC tests
#                at 1 B to 1 MiB, rping, ucmatose, udaddy, mckey, rdma_xserver, the ping-pongs)
#   --repeat N   all of it N times; the table counts each cell's failures
#   --only RE    only the cells whose name matches the regex
#   --slow-disk BYTES_PER_S
#                the run's writes to the disk throttled (a block cgroup; needs root): the
#                capture on a disk slower than the wire (a cloud disk's baseline), which must
#                pace the programs and lose no frame; e.g. --slow-disk 100000000
# Prints a line per cell, then the table (program and options, path, capture, faults: passed of
# runs, last figure) and "matrix: P of C cells passed every time (R rounds)". Exit 1 on any
# failure. Needs scripts/build-shim.sh and the programs (scripts/install-deps.sh). Logs stay in
# $SOFTRDMA_MATRIX_LOGS when set, with the daemons' logs and the captures of a segment in which a
# cell failed.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/shim-env.sh
for p in ib_write_bw qperf rping ucmatose udaddy mckey rdma_xserver ibv_rc_pingpong; do
  command -v "$p" >/dev/null || { echo "$p missing: run scripts/install-deps.sh" >&2; exit 2; }
done
full=0 repeat=1 only="" slow_disk=""
while [ $# -gt 0 ]; do
  case "$1" in
    --full) full=1 ;;
    --repeat) repeat="$2"; shift ;;
    --only) only="$2"; shift ;;
    --slow-disk) slow_disk="$2"; shift ;;
    *) sed -n '2,28p' "$0" >&2; exit 2 ;;
  esac
  shift
done

private_runtime
logs="${SOFTRDMA_MATRIX_LOGS:-$rt/logs}"
mkdir -p "$logs"
results="$rt/results.tsv"
# The captures go to the run's directory (SOFTRDMA_MATRIX_CAPDIR puts them elsewhere), on a disk
# where the capture writes whole blocks with O_DIRECT: no new page of memory per byte. In memory
# (/dev/shm) every byte of a capture needs a page the kernel has just allocated, and on a virtual
# machine whose host takes back the pages its guest frees (this one's: a balloon with free page
# reporting) each is a fault into the host: 1 GiB into /dev/shm took 3-9 s while the matrix ran,
# 0.8 s to the disk with O_DIRECT, and single writes of the capture into /dev/shm took up to
# 232 ms, long enough to fill its rings (the full matrix lost frames in 5 of 60 capture segments
# there). A setup's cells are cut into segments (`segment_to`), each with files of its own,
# checked and removed when it ends: a segment's stay under ~8 GB a device.
capdir="$rt"
capdir="${SOFTRDMA_MATRIX_CAPDIR:-$capdir}"
# --slow-disk: this shell (and so every daemon and program it starts) into a block cgroup whose
# writes to the capture directory's disk are throttled (cgroup v2 io.max, or v1 blkio).
if [ -n "$slow_disk" ]; then
  disk=$(lsblk -no PKNAME "$(findmnt -no SOURCE -T "$capdir")" 2>/dev/null | head -1)
  [ -n "$disk" ] || disk=$(basename "$(findmnt -no SOURCE -T "$capdir")")
  majmin=$(cat "/sys/class/block/$disk/dev" 2>/dev/null) || { echo "--slow-disk: no block device under $capdir" >&2; exit 2; }
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    cg=/sys/fs/cgroup/softrdma-matrix-$$
    echo +io >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
    mkdir "$cg" && echo "$majmin wbps=$slow_disk" >"$cg/io.max" && echo $$ >"$cg/cgroup.procs"
  else
    cg=/sys/fs/cgroup/blkio/softrdma-matrix-$$
    mkdir "$cg" && echo "$majmin $slow_disk" >"$cg/blkio.throttle.write_bps_device" && echo $$ >"$cg/cgroup.procs"
  fi || { echo "--slow-disk: cannot throttle $disk ($majmin) in a cgroup (root?)" >&2; exit 2; }
  echo "writes to $disk ($majmin) throttled to $slow_disk bytes/s"
fi
: >"$results"
cleanup() {
  stop_run srdma0 srdma1
  rm -f "$capdir"/softrdma-matrix-$$-*.pcap
  if [ -n "${cg:-}" ]; then
    echo $$ >"$(dirname "$cg")/cgroup.procs" 2>/dev/null
    rmdir "$cg" 2>/dev/null
  fi
}
trap cleanup EXIT
addr0="${SOFTRDMA_TEST_ADDR0:-127.0.0.1}"
addr1="${SOFTRDMA_TEST_ADDR1:-127.0.0.2}"
# TCP ports below the kernel's ephemeral range (scripts/programs-lib.sh says why).
port=$((20000 + RANDOM % 11000))
round=1 setup="" path="" capture="" faults="" segment="" pcap0="" pcap1="" seg_ran=0 seg_failed=0

# Waits until an rdma_cm ID listens on PORT in port space PS on one of the devices.
wait_listen() { # port [ps]
  for _ in $(seq 200); do
    for d in srdma0 srdma1; do
      "$bin" cm-ids "$d" 2>/dev/null | grep -qE "state LISTEN ps ${2:-TCP} .*src-addr [^ ]*:$1 " && return 0
    done
    sleep 0.05
  done
  return 1
}

# note STATUS CELL FIGURE [DETAIL]: one result.
note() {
  seg_ran=1
  [ "$1" = FAIL ] && seg_failed=1
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$path" "$capture" "$faults" "$1" "$2|$3" >>"$results"
  printf '%-4s %-58s %-8s %-3s %-5s %s\n' "$1" "$2" "$path" "$capture" "$faults" "$3${4:+  -- $4}"
}

# Whether cell NAME of tier TIER runs: "s" cells are the sample's, "f" cells the full matrix's.
want() { # tier name
  { [ "$full" = 1 ] || [ "$1" = s ]; } && { [ -z "$only" ] || [[ "$2" =~ $only ]]; }
}

logname() { echo "$logs/r${round}_${path}_${capture}_${faults}_${1//[^A-Za-z0-9._-]/_}"; }

# The last row of a perftest table: its average bandwidth (MB/s) or typical latency (us).
perf_figure() { # log lat?
  awk -v lat="$2" '/#bytes/ {t=1; next} t && /^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+/ {r=$0} END {
    if (r == "") exit 1; split(r, f, " "); if (lat) print f[5] " us"; else print f[4] " MB/s" }' "$1"
}

# perftest, server on srdma0 and client on srdma0 (within) or srdma1 (across), exchanging through
# TCP (tcp) or rdma_cm (cm, -R).
perf_cell() { # tier conn place prog args...
  local tier="$1" conn="$2" place="$3" prog="$4"
  shift 4
  local tag=""
  [ "$conn" = cm ] && tag=" -R"
  local name="$prog $*$tag $place"
  want "$tier" "$name" || return 0
  local base slog clog lat=0 fig errs try src=1 crc=1
  base=$(logname "$name")
  slog="$base.server.log" clog="$base.client.log"
  [[ "$prog" == *_lat ]] && lat=1
  for try in 1 2; do
    perf_run "$conn" "$place" "$prog" "$@"
    if [ "$src" = 0 ] && [ "$crc" = 0 ] && fig=$(perf_figure "$clog" "$lat"); then
      if [ "$try" = 1 ]; then
        note ok "$name" "$fig"
      else
        note ok "$name" "$fig" "on its second run: the first lost its last packet to the faults (perftest -R, docs/testing.md)"
      fi
      return 0
    fi
    # With -R, perftest's last messages (the latency loop's last WRITE, its exchanges over
    # rdma_cm before the test, of the results, at the close) are followed at once by the
    # receiver's rdma_disconnect or destroy, with no handshake over TCP to hold it. When that
    # last packet or its ACK is lost, the retry reaches a QP already in the error state or gone,
    # which drops it (IBTA 10.3.1, 9.6.1), and the sender fails with retry exceeded (status 12):
    # so on a NIC over a lossy link too. The capture of such a run shows the receiver's DREQ
    # before the unanswered retries. Under injected loss such a -R cell runs once more and says
    # so; anything else fails at once.
    [ "$try" = 1 ] && [ "$faults" != none ] && [ "$conn" = cm ] \
      && grep -qE "status 12" "$slog" "$clog" || break
    mv "$slog" "$slog.first"
    mv "$clog" "$clog.first"
  done
  errs=$(grep -h -i -m 3 -E "error|fail|couldn|unable|wrong|timed? ?out|refused|status" "$slog" "$clog" | tr '\n' ' ')
  note FAIL "$name" "-" "server rc=$src client rc=$crc; ${errs:-$(tail -q -n 2 "$slog" "$clog" | tr '\n' ' ')}"
}

# One run of a perftest cell (perf_cell's variables): sets src and crc, the exit statuses.
perf_run() { # conn place prog args...
  local conn="$1" place="$2" prog="$3"
  shift 3
  local cdev=srdma0
  port=$((port + 1))
  crc=1 src=1
  [ "$place" = across ] && cdev=srdma1
  if [ "$conn" = tcp ]; then
    timeout 180 "$prog" -d srdma0 -p "$port" "$@" >"$slog" 2>&1 &
    local spid=$!
    for _ in $(seq 50); do
      sleep 0.1
      timeout 180 "$prog" -d "$cdev" -p "$port" "$@" "$addr0" >"$clog" 2>&1
      crc=$?
      grep -q "Couldn't connect" "$clog" || break
    done
  else
    local -a src_ip=()
    [ "$place" = across ] && src_ip=(--source_ip "$addr1")
    timeout 180 "$prog" -R -d srdma0 -p "$port" "$@" >"$slog" 2>&1 &
    local spid=$!
    if wait_listen "$port" TCP; then
      timeout 180 "$prog" -R -d "$cdev" -p "$port" "${src_ip[@]}" "$@" "$addr0" >"$clog" 2>&1
      crc=$?
    fi
  fi
  wait "$spid"
  src=$?
}

# A server and a client whose logs must say WANT; @P in the commands is a fresh port. The client
# starts once the server listens (rdma_cm port space PS, or "tcp": it retries while refused).
pair_cell() { # tier name ps swant cwant server... -- client...
  local tier="$1" name="$2" ps="$3" swant="$4" cwant="$5"
  shift 5
  want "$tier" "$name" || { while [ "$1" != "--" ]; do shift; done; return 0; }
  port=$((port + 1))
  local -a srv=() cli=()
  while [ "$1" != "--" ]; do srv+=("${1//@P/$port}"); shift; done
  shift
  for a in "$@"; do cli+=("${a//@P/$port}"); done
  local base slog clog why="" crc=1
  base=$(logname "$name")
  slog="$base.server.log" clog="$base.client.log"
  timeout 120 "${srv[@]}" >"$slog" 2>&1 &
  local spid=$!
  if [ "$ps" = tcp ]; then
    for _ in $(seq 50); do
      sleep 0.1
      timeout 120 "${cli[@]}" >"$clog" 2>&1
      crc=$?
      grep -qiE "couldn't connect|connection refused" "$clog" || break
    done
  else
    # PS or PS:PORT (a program with a fixed port: udaddy's 7174).
    local lport="$port"
    [[ "$ps" == *:* ]] && { lport="${ps#*:}"; ps="${ps%%:*}"; }
    wait_listen "$lport" "$ps" || why="server never listened; "
    timeout 120 "${cli[@]}" >"$clog" 2>&1
    crc=$?
  fi
  [ "$crc" = 0 ] || why+="client rc=$crc; "
  wait "$spid" || why+="server rc=$?; "
  grep -qE "$swant" "$slog" || why+="server lacks '$swant'; "
  grep -qE "$cwant" "$clog" || why+="client lacks '$cwant'; "
  if [ -z "$why" ]; then
    note ok "$name" "$(grep -ohE "$cwant" "$clog" | tail -1)"
  else
    note FAIL "$name" "-" "$why$(tail -q -n 2 "$slog" "$clog" | tr '\n' ' ')"
  fi
}

# qperf -cm1: one server for the setup, one client running a list of RC tests at one size.
qperf_cell() { # tier size tests...
  local tier="$1" size="$2"
  shift 2
  local name="qperf -cm1 -m $size ($# RC tests)"
  want "$tier" "$name" || return 0
  local log rc n
  log="$(logname "$name").log"
  timeout 400 qperf "$addr0" -lp "$qport" -cm1 -t 1 -m "$size" "$@" >"$log" 2>&1
  rc=$?
  n=$(grep -cE '^ +(bw|latency|msg_rate) += ' "$log")
  if [ "$rc" = 0 ] && [ "$n" = $# ]; then
    note ok "$name" "$n of $# figures"
  else
    note FAIL "$name" "$n of $#" "rc=$rc; $(grep -B1 -iE "fail|unexpected|error|timed out" "$log" | head -4 | tr '\n' ' ')"
  fi
}

# mckey: a receiver on each device, a sender on srdma0.
mckey_cell() { # tier
  local name="mckey: receivers on both devices, a sender" why=""
  want "$1" "$name" || return 0
  local g="239.$((RANDOM % 200 + 20)).$((RANDOM % 250)).$((RANDOM % 250 + 1))" base pids=() k=0
  base=$(logname "$name")
  for r in "$addr0" "$addr1"; do
    k=$((k + 1))
    timeout 30 mckey -m "$g" -b "$r" -C 10 >"$base.r$k.log" 2>&1 &
    pids+=($!)
  done
  for d in srdma0 srdma1; do
    for _ in $(seq 100); do
      "$bin" stat "$d" 2>/dev/null | awk -v g="$g" '$1 == "mcast_group" && $2 == g {f=1} END {exit !f}' && break
      sleep 0.1
    done
  done
  timeout 30 mckey -m "$g" -b "$addr0" -s -C 10 >"$base.s.log" 2>&1 || why+="sender rc=$?; "
  for p in "${pids[@]}"; do wait "$p" || why+="receiver rc=$?; "; done
  for f in "$base".*.log; do grep -q "return status 0" "$f" || why+="$(basename "$f") did not finish; "; done
  if [ -z "$why" ]; then note ok "$name" "10 messages each"; else note FAIL "$name" "-" "$why"; fi
}

# Every cell of one setup ("s": in the sample too; the sample picks one combination per program
# and rotates the rest with the setup, so that the four setups cover the options between them).
cells() {
  local k="$1" # the setup's index, for the sample's rotation
  local -a places=(across within) evs=("" -e) conns=(tcp cm)
  local pl="${places[$((k % 2))]}" ev="${evs[$((k / 2 % 2))]}" cn="${conns[$(((k + 1) % 2))]}"
  local prog sz q e c p t n
  for prog in ib_write_bw ib_read_bw ib_send_bw; do
    segment_to "$prog" || return
    for c in tcp cm; do for p in across within; do for e in "" -e; do for q in 1 4; do
      # ib_write_bw and ib_write_lat poll the memory the peer writes: perftest has no events
      # mode for them.
      [ "$prog" = ib_write_bw ] && [ -n "$e" ] && continue
      for sz in 4096 65536 1048576; do
        n=200
        [ "$sz" = 1048576 ] && n=50
        t=f
        [ "$c$p" = "$cn$pl" ] && { [ "$e" = "$ev" ] || [ "$prog" = ib_write_bw ]; } && [ "$q" = 1 ] && [ "$sz" = 65536 ] && t=s
        perf_cell $t "$c" "$p" "$prog" -s "$sz" -q "$q" -n "$n" $e
      done
    done; done; done; done
  done
  segment_to latency-and-atomics || return
  for c in tcp cm; do for p in across within; do for e in "" -e; do for q in 1 4; do
    t=f
    [ "$c$p$e" = "$cn$pl$ev" ] && [ "$q" = 4 ] && t=s
    perf_cell $t "$c" "$p" ib_atomic_bw -q "$q" -n 200 $e
  done; done; done; done
  for prog in ib_write_lat ib_read_lat ib_send_lat; do
    for c in tcp cm; do for p in across within; do for e in "" -e; do
      [ "$prog" = ib_write_lat ] && [ -n "$e" ] && continue
      for sz in 2 4096 65536 1048576; do
        t=f
        [ "$c$p" = "$cn$pl" ] && [ "$e" = "$ev" -o "$prog" = ib_write_lat ] && [ "$sz" = 2 ] && t=s
        perf_cell $t "$c" "$p" "$prog" -s "$sz" -n 200 $e
      done
    done; done; done
  done
  for c in tcp cm; do for p in across within; do for e in "" -e; do
    t=f
    [ "$c$p$e" = "$cn$pl$ev" ] && t=s
    perf_cell $t "$c" "$p" ib_atomic_lat -n 200 $e
  done; done; done
  # qperf: every RC test in one client run against one server (UC/UD need LIDs: not on RoCE).
  local rc_tests="rc_bw rc_bi_bw rc_lat rc_rdma_read_bw rc_rdma_read_lat rc_rdma_write_bw rc_rdma_write_lat"
  rc_tests+=" rc_rdma_write_poll_lat rc_compare_swap_mr rc_fetch_add_mr"
  # qperf's listen port: below the range the cells' ports take. With the capture on, each size
  # on devices of its own (its captures checked and removed after it: several GB at 1 MiB).
  local qs qsizes=(1 4096 65536 1048576) qtier=(f f s f) qi
  for qi in 0 1 2 3; do
    qs=${qsizes[$qi]}
    want "${qtier[$qi]}" "qperf -cm1 -m $qs " || continue
    segment_to "qperf-$qs" || return
    qport=$((19000 + RANDOM % 900))
    timeout 600 qperf -lp "$qport" >"$(logname "qperf-server-$qs").log" 2>&1 &
    local qpid=$!
    sleep 0.3
    if [ "$qs" = 1 ]; then
      qperf_cell "${qtier[$qi]}" "$qs" $rc_tests
    else
      qperf_cell "${qtier[$qi]}" "$qs" $rc_tests ver_rc_compare_swap ver_rc_fetch_add
    fi
    kill "$qpid" 2>/dev/null
    wait "$qpid" 2>/dev/null
  done
  segment_to rdma_cm-and-pingpongs || return
  # rdma_cm programs.
  for sz in 64 4096 60000; do
    t=f
    [ "$sz" = 4096 ] && t=s
    pair_cell $t "rping -v -V -S $sz across" TCP "" "ping data: rdma-ping-9" \
      rping -s -a "$addr0" -p @P -C 10 -S "$sz" -V -- rping -c -a "$addr0" -I "$addr1" -p @P -C 10 -S "$sz" -v -V
    pair_cell f "rping -v -V -S $sz within" TCP "" "ping data: rdma-ping-9" \
      rping -s -a "$addr0" -p @P -C 10 -S "$sz" -V -- rping -c -a "$addr0" -p @P -C 10 -S "$sz" -v -V
  done
  pair_cell s "ucmatose -c 8 across" TCP "return status 0" "return status 0" \
    ucmatose -p @P -c 8 -- ucmatose -s "$addr0" -b "$addr1" -p @P -c 8
  pair_cell f "ucmatose -c 8 within" TCP "return status 0" "return status 0" \
    ucmatose -p @P -c 8 -- ucmatose -s "$addr0" -p @P -c 8
  pair_cell s "udaddy -c 4 across" UDP:7174 "data transfers complete" "return status 0" \
    udaddy -b "$addr0" -c 4 -- udaddy -s "$addr0" -b "$addr1" -c 4
  pair_cell s "rdma_xserver / rdma_xclient" TCP "end 0" "end 0" \
    rdma_xserver -p @P -- rdma_xclient -s "$addr0" -p @P
  mckey_cell s
  # The ping-pongs (TCP exchange; -g 0: the GID of the device's address).
  for p in across within; do
    local cdev=srdma0
    [ "$p" = across ] && cdev=srdma1
    for prog in ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong ibv_srq_pingpong; do
      for e in "" -e; do
        t=f
        [ "$p$e" = "$pl$ev" ] && t=s
        pair_cell $t "$prog -n 200 $e $p" tcp "[0-9]+ iters in" "[0-9]+ bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec" \
          "$prog" -d srdma0 -g 0 -p @P -n 200 $e -- "$prog" -d "$cdev" -g 0 -p @P -n 200 $e "$addr0"
      done
    done
    for e in "" -e; do
      t=f
      [ "$p$e" = "$pl$ev" ] && t=s
      pair_cell $t "ibv_xsrq_pingpong -n 50 $e $p" tcp "success" "success" \
        ibv_xsrq_pingpong -d srdma0 -g 0 -p @P -c 1 -n 50 $e -- ibv_xsrq_pingpong -d "$cdev" -g 0 -p @P -n 50 $e "$addr0"
    done
  done
}

# Under faults: a subset (the sample: three cells; the full matrix: more). Not ib_send_lat -e:
# perftest's latency loop waits for "an event" on the channel its send and receive CQs share and
# then polls the CQ it meant; a loss lets the receive's event come first, the send's completion
# stays unpolled in its one-entry CQ (perftest asks cqe=1), and the next one overruns it
# (IBV_EVENT_CQ_ERR; the program then waits forever). rxe sizes that CQ the same (one entry);
# mlx5's ring holds two. Found by this matrix; the program's, not the transport's.
fault_cells() {
  perf_cell s tcp across ib_write_bw -s 65536 -n 200
  perf_cell s cm across ib_read_lat -s 4096 -n 200 -e
  pair_cell s "rping -v -V -S 4096 across" TCP "" "ping data: rdma-ping-9" \
    rping -s -a "$addr0" -p @P -C 10 -S 4096 -V -- rping -c -a "$addr0" -I "$addr1" -p @P -C 10 -S 4096 -v -V
  perf_cell f tcp within ib_read_bw -s 1048576 -n 50
  perf_cell f cm within ib_atomic_bw -q 4 -n 200
  perf_cell f tcp across ib_send_bw -s 4096 -q 4 -n 200 -e
  perf_cell f cm across ib_write_lat -s 2 -n 200
  perf_cell f tcp within ib_send_lat -s 4096 -n 200
  perf_cell f cm within ib_atomic_lat -n 200 -e
  pair_cell f "ibv_rc_pingpong -n 200 -e across" tcp "[0-9]+ iters in" "[0-9]+ bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec" \
    ibv_rc_pingpong -d srdma0 -g 0 -p @P -n 200 -e -- ibv_rc_pingpong -d srdma1 -g 0 -p @P -n 200 -e "$addr0"
}

# The setup's devices up, with its capture (files of segment SEG) and faults. Sets pcap0/pcap1.
devices_up() { # seg
  seg_ran=0 seg_failed=0
  local -a flags0=(--addr "$addr0") flags1=(--addr "$addr1")
  pcap0="$capdir/softrdma-matrix-$$-r${round}-$path-$faults-$1-srdma0.pcap"
  pcap1="$capdir/softrdma-matrix-$$-r${round}-$path-$faults-$1-srdma1.pcap"
  if [ "$capture" = on ]; then
    flags0+=(--pcap "$pcap0")
    flags1+=(--pcap "$pcap1")
  fi
  if [ "$faults" != none ]; then
    flags0+=(--faults "$fault_spec,seed=$((round * 10 + 1))")
    flags1+=(--faults "$fault_spec,seed=$((round * 10 + 2))")
  fi
  # With the capture on, the daemons log what their capture's writer met (a slow write, a late
  # wake-up, full rings): a capture cell that fails says which (capture_why).
  local caplog="${SOFTRDMA_LOG:-warn}"
  [ "$capture" = on ] && caplog+=",softrdma_device::capture=info"
  if ! SOFTRDMA_LOG="$caplog" "$bin" up srdma0 "${flags0[@]}" >/dev/null ||
    ! SOFTRDMA_LOG="$caplog" "$bin" up srdma1 "${flags1[@]}" >/dev/null; then
    note FAIL "devices up" "-" "$(tail -n 2 "$rt"/srdma*.log | tr '\n' ' ')"
    "$bin" down srdma0 >/dev/null 2>&1
    return 1
  fi
}

# What the daemons' capture writers logged in this segment, in a line: how many slow writes and
# late wake-ups (the longest of each, in ms) and how many times the rings were full.
capture_why() {
  local d
  for d in srdma0 srdma1; do
    [ -s "$rt/$d.log" ] || continue
    awk -v d="$d" '
      function ms(line) { sub(/.*(ms|late_ms)=/, "", line); sub(/[^0-9.].*/, "", line); return line + 0 }
      /a write of the file was slow/ { w++; m = ms($0); if (m > wm) wm = m }
      /the writer woke late/ { l++; m = ms($0); if (m > lm) lm = m }
      /rings were full/ { f++ }
      END { printf "%s: %d slow writes (longest %.0f ms), %d late wake-ups (longest %.0f ms), rings full %d times; ", d, w, wm, l, lm, f }
    ' "$rt/$d.log"
  done
}

# The devices down; with the capture on, its cell for segment SEG: neither device lost a frame,
# every frame of both files checks. The files go.
devices_down() { # seg
  local lost0 lost1
  lost0=$("$bin" stat srdma0 | awk '$1 == "capture_dropped" {print $2}')
  lost1=$("$bin" stat srdma1 | awk '$1 == "capture_dropped" {print $2}')
  "$bin" down srdma0 >/dev/null
  "$bin" down srdma1 >/dev/null
  # The daemons' logs (each `up` starts its own) are kept with the cells' when asked for.
  if [ -n "${SOFTRDMA_MATRIX_LOGS:-}" ]; then
    local d
    for d in srdma0 srdma1; do
      [ -s "$rt/$d.log" ] && sed "s/^/r$round $path $capture $faults ${1} $d: /" "$rt/$d.log" >>"$logs/daemons.log"
    done
  fi
  # With --only, a segment's capture is checked when one of its cells ran.
  if [ "$capture" = on ] && { want s "capture $1" || { [ -n "$only" ] && [ "$seg_ran" = 1 ]; }; }; then
    local why="" frames=0 f
    [ "${lost0:-x}" = 0 ] && [ "${lost1:-x}" = 0 ] || why="frames lost: srdma0 ${lost0:-?}, srdma1 ${lost1:-?}; "
    for f in "$pcap0" "$pcap1"; do
      local out
      out=$("$bin" pcap check "$f" 2>&1) || why+="$(basename "$f"): $(echo "$out" | grep -iE "bad|malformed|damaged" | head -2 | tr '\n' ' '); "
      frames=$((frames + $(echo "$out" | awk '$1 == "frames" {print $2}')))
    done
    if [ -z "$why" ]; then note ok "capture $1" "$frames frames, 0 lost, all checked"; else note FAIL "capture $1" "-" "$why$(capture_why)"; fi
  fi
  # A segment with a failed cell keeps its captures with the logs when they are kept (files
  # under 2 GB: a lossy setup's are a few MB).
  local f
  for f in "$pcap0" "$pcap1"; do
    if [ "$seg_failed" = 1 ] && [ -n "${SOFTRDMA_MATRIX_LOGS:-}" ] && [ -f "$f" ] \
      && [ "$(stat -c %s "$f")" -lt 2000000000 ]; then
      mv "$f" "$logs/"
    else
      rm -f "$f"
    fi
  done
}

# Between two segments of a setup: the captures so far checked and removed, the devices up
# again with new files (qperf at 1 MiB alone captures several GB a device).
next_segment() { # done next
  devices_down "$1"
  devices_up "$2"
}

# With the capture on, the cells from here on go into segment NAME's files (the previous
# segment's checked and removed first), so that no file grows past a few GB.
segment_to() { # name
  [ "$capture" = on ] && [ "$segment" != "$1" ] || return 0
  # The setup's first segment is in the files it started with.
  [ -n "$segment" ] || { segment="$1"; return 0; }
  next_segment "$segment" "$1" || return 1
  segment="$1"
}

# Runs one setup: devices up with its capture and faults, its cells, the capture's checks.
run_setup() { # index path capture faults
  local k="$1"
  path="$2" capture="$3" faults="$4"
  devices_up cells || return
  export SOFTRDMA_DATAPATH="$path"
  if [ "$faults" = none ]; then cells "$k"; else fault_cells; fi
  devices_down "${segment:-cells}"
  segment=""
}

fault_spec="loss=0.01,duplicate=0.01,reorder=0.01"
start=$SECONDS
for round in $(seq "$repeat"); do
  [ "$repeat" -gt 1 ] && echo "== round $round of $repeat"
  k=0
  for path in provider device; do
    for capture in off on; do
      run_setup "$k" "$path" "$capture" none
      k=$((k + 1))
    done
  done
  run_setup 0 provider on lossy
  run_setup 1 device on lossy
done

# The table: each cell (program and options, path, capture, faults), passed of runs, last figure.
echo
echo "== matrix ($(( (SECONDS - start) / 60 )) min, $repeat round(s)$([ $full = 1 ] && echo ', full'))"
awk -F'\t' '
  { key = $6; sub(/\|.*/, "", key); key = sprintf("%-58s %-8s %-3s %-5s", key, $2, $3, $4)
    fig = $6; sub(/^[^|]*\|/, "", fig)
    if (!(key in runs)) order[n++] = key
    runs[key]++; if ($5 == "ok") { pass[key]++; last[key] = fig } }
  END {
    good = 0
    for (i = 0; i < n; i++) { k = order[i]; p = pass[k] + 0
      if (p == runs[k]) good++
      printf "%s %s %d/%d  %s\n", (p == runs[k] ? "ok  " : "FAIL"), k, p, runs[k], last[k] }
    printf "matrix: %d of %d cells passed every time (%d run(s) each)\n", good, n, runs[order[0]]
    exit (good == n ? 0 : 1)
  }' "$results"
