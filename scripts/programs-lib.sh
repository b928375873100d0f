# Shared by scripts/test-verbs-programs.sh and scripts/test-provider.sh (sourced, not run): the
# result counters and the ways to run a program as server and client. Expects $logs, $addr0 and
# the devices to exist.
passed=0
failed=0
# The programs' TCP ports start below the kernel's ephemeral range (32768-60999 by default):
# a port there can be held by any outgoing TCP connection on the machine, and the server's bind
# then fails (a CI run lost ib_send_bw -c UD that way: "Couldn't connect" after the server
# exited). A run uses a few hundred ports from the start.
port=$((20000 + RANDOM % 11000))
# Each result line ends with the seconds since the one before (where CI's time goes).
result_at=${EPOCHREALTIME/[.,]/}
result() { # name status detail
  local now=${EPOCHREALTIME/[.,]/} ms
  ms=$(((now - result_at) / 1000))
  result_at=$now
  if [ "$2" = ok ]; then
    passed=$((passed + 1))
    printf 'ok    %s (%d.%d s)\n' "$1" $((ms / 1000)) $((ms % 1000 / 100))
  else
    failed=$((failed + 1))
    printf 'FAIL  %s: %s (%d.%d s)\n' "$1" "$3" $((ms / 1000)) $((ms % 1000 / 100))
  fi
}

single() { # name expect-regex cmd...
  local name="$1" want="$2"
  shift 2
  local log="$logs/$(echo "$name" | tr ' /' '__').log"
  if timeout "${single_timeout:-60}" "$@" >"$log" 2>&1 && grep -qE "$want" "$log"; then
    result "$name" ok
  else
    result "$name" fail "$(tail -n 3 "$log" | tr '\n' ' ')"
  fi
}

# pair NAME SERVER_DEV CLIENT_DEV PROGRAM ARGS...: server and client as two processes; both must
# exit 0 and print the program's "bytes in ... seconds" and "iters in ... seconds" lines.
pair() {
  local name="$1" sdev="$2" cdev="$3" prog="$4"
  shift 4
  port=$((port + 1))
  local slog="$logs/${name// /_}.server.log" clog="$logs/${name// /_}.client.log"
  timeout 120 "$prog" -d "$sdev" -g 0 -p "$port" "$@" >"$slog" 2>&1 &
  local spid=$!
  # The client retries until the server listens (the programs exit at once when refused).
  local crc=1
  for _ in $(seq 50); do
    sleep 0.1
    timeout 120 "$prog" -d "$cdev" -g 0 -p "$port" "$@" "$addr0" >"$clog" 2>&1
    crc=$?
    grep -q "Couldn't connect" "$clog" || break
  done
  wait "$spid"
  local src=$?
  local lines
  lines=$(grep -cE "bytes in .* seconds|iters in .* seconds" "$slog" "$clog" | awk -F: '{s+=$2} END {print s}')
  if [ "$src" = 0 ] && [ "$crc" = 0 ] && [ "$lines" -ge 2 ]; then
    result "$name ($(grep -hE 'Mbit/sec' "$clog" | head -1 | sed 's/.*= //'))" ok
  else
    result "$name" fail "server rc=$src client rc=$crc; $(tail -q -n 2 "$slog" "$clog" | tr '\n' ' ')"
  fi
}

# xsrq NAME SERVER_DEV CLIENT_DEV CLIENTS: ibv_xsrq_pingpong's server serves -c CLIENTS client
# processes (all at once) through one XRC SRQ per client; every process must print "success".
xsrq() {
  local name="$1" sdev="$2" cdev="$3" n="$4"
  port=$((port + 1))
  local base="$logs/${name// /_}"
  timeout 120 ibv_xsrq_pingpong -d "$sdev" -g 0 -p "$port" -c "$n" -n 20 >"$base.server.log" 2>&1 &
  local spid=$! pids=() i
  sleep 0.3
  for i in $(seq "$n"); do
    timeout 120 ibv_xsrq_pingpong -d "$cdev" -g 0 -p "$port" -n 20 "$addr0" >"$base.client$i.log" 2>&1 &
    pids+=($!)
  done
  local bad=0
  wait "$spid" || bad=1
  for i in "${pids[@]}"; do wait "$i" || bad=1; done
  local ok
  ok=$(grep -l '^success' "$base".*.log | wc -l)
  if [ $bad = 0 ] && [ "$ok" = $((n + 1)) ]; then
    result "$name" ok
  else
    result "$name" fail "$ok of $((n + 1)) processes succeeded; $(tail -q -n 1 "$base".*.log | tr '\n' ' ')"
  fi
}

# perf NAME SERVER_DEV CLIENT_DEV PROGRAM ARGS...: a perftest program as server and client; both
# must exit 0 and the client must print its result table: the "#bytes" header and a row of
# numbers under it for each size.
perf() {
  local name="$1" sdev="$2" cdev="$3" prog="$4"
  shift 4
  port=$((port + 1))
  local slog="$logs/${name// /_}.server.log" clog="$logs/${name// /_}.client.log"
  timeout 300 "$prog" -d "$sdev" -p "$port" "$@" >"$slog" 2>&1 &
  local spid=$!
  local crc=1
  for _ in $(seq 50); do
    sleep 0.1
    timeout 300 "$prog" -d "$cdev" -p "$port" "$@" "$addr0" >"$clog" 2>&1
    crc=$?
    grep -q "Couldn't connect" "$clog" || break
  done
  wait "$spid"
  local src=$?
  local rows
  rows=$(awk '/#bytes/ {t=1; next} t && /^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+/ {n++} END {print n+0}' "$clog")
  if [ "$src" = 0 ] && [ "$crc" = 0 ] && [ "$rows" -ge "${want_rows:-1}" ]; then
    result "$name ($rows result rows)" ok
  else
    # perftest's errors go to stderr at once and its tables to stdout at exit: a log's tail is
    # its table's header, so the lines that say what went wrong are picked out first.
    local errs
    errs=$(grep -h -i -m 4 -E "error|fail|couldn|unable|wrong|timed? ?out|refused" "$slog" "$clog" | tr '\n' ' ')
    result "$name" fail "server rc=$src client rc=$crc, $rows result rows; errors: ${errs:-none printed}; server: $(tail -n 4 "$slog" | tr '\n' ' ') client: $(tail -n 4 "$clog" | tr '\n' ' ')"
  fi
}

# Waits until an rdma_cm ID listens on PORT (port space TCP, UDP or IB) on one of the devices.
wait_listen() { # port [port space: TCP or IB]
  for _ in $(seq 200); do
    for d in srdma0 srdma1 srdma2; do
      "$bin" cm-ids "$d" 2>/dev/null | grep -qE "state LISTEN ps ${2:-TCP} .*src-addr [^ ]*:$1 " && return 0
    done
    sleep 0.1
  done
  return 1
}
# perftest connecting through rdma_cm (-R): the data QPs' numbers and PSNs travel in REQ/REP.
# perftest 4.5 -R connects twice on its port: one connection carries its own exchange, and its
# server listens for the data connection only after that exchange has released the client. A
# client faster than the server then gets a correct REJ 8 (no listener), and perftest's retry
# reuses the IDs it destroyed, so the run fails (the same happens against the kernel's rdma_cm:
# INTEROP.md). Such a run, and only such a run, is tried again, at most 5 times in all (a loaded
# machine makes the slow server more likely); the
# result line says when it took more than one. The client starts once the server listens for the
# exchange, which is an RC connection in the TCP port space whatever the data QPs' type: the data
# listener of a UD run (UDP port space) appears only after that exchange, so waiting for it
# first only ran out wait_listen's 20 s, every UD run.
cm_perf() { # program [data port space [flags]] (server on srdma0, client connecting to its address; no -g: with -R it means multicast)
  local prog="$1" attempt src crc
  shift
  [ $# -gt 0 ] && shift
  local tag="$prog -R${*:+ $*}"
  local slog="$logs/${tag// /_}.server.log" clog="$logs/${tag// /_}.client.log"
  for attempt in 1 2 3 4 5; do
    port=$((port + 1))
    timeout 60 "$prog" -R "$@" -d srdma0 -p "$port" -n 200 >"$slog" 2>&1 &
    local spid=$!
    wait_listen "$port" TCP || { result "$tag" fail "the server never listened on $port: $(tail -n 2 "$slog" | tr '\n' ' ')"; kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; return; }
    timeout 60 "$prog" -R "$@" -d srdma0 -p "$port" -n 200 "$addr0" >"$clog" 2>&1
    crc=$?
    # (For UD the late listener shows as a SIDR_REP "unsupported": UNREACHABLE, status 1.)
    if [ "$crc" != 0 ] && grep -qE "RDMA_CM_EVENT_REJECTED; error: 8|RDMA_CM_EVENT_UNREACHABLE; error: 1\." "$clog"; then
      kill "$spid" 2>/dev/null
      wait "$spid" 2>/dev/null
      src=race
      continue
    fi
    wait "$spid"
    src=$?
    break
  done
  local note=""
  [ "$attempt" -gt 1 ] && note=" (attempt $attempt: perftest's data listener came late before)"
  if [ "$src" = 0 ] && [ "$crc" = 0 ] && grep -qE "^ +[0-9]+ +200 " "$clog"; then
    result "$tag$note" ok
  else
    result "$tag" fail "server rc=$src client rc=$crc after $attempt attempts; $(tail -q -n 2 "$slog" "$clog" | tr '\n' ' ')"
  fi
}

# cm_perf for each perftest program on rdma_cm: RC (SEND, WRITE, READ and atomic bandwidth, SEND
# and WRITE latency), then UD (SEND bandwidth and latency: the data QP's number and Q_Key come back
# in a SIDR_REP, RDMA_PS_UDP).
cm_perf_all() {
  for prog in ib_send_bw ib_write_bw ib_read_bw ib_atomic_bw ib_send_lat ib_write_lat; do
    cm_perf "$prog"
  done
  for prog in ib_send_bw ib_send_lat; do
    cm_perf "$prog" UDP -c UD
  done
}

# xjob NAME EXPECT-REGEX ARGS...: the MPI-style XRC job (examples/c/xrc_job.c, "$ex"), its last
# line matched against EXPECT-REGEX (a FAILED line may end with a nonzero exit).
xjob() { # name expect-regex args...
  local name="$1" want="$2"
  shift 2
  local log="$logs/${name// /_}.log"
  timeout 120 "$ex/xrc_job" "$@" >"$log" 2>&1
  local rc=$?
  if grep -qE "$want" "$log" && { [ "$rc" = 0 ] || [[ "$want" == *FAILED* ]]; }; then
    result "$name ($(grep -oE 'messages [0-9]+ checked|FAILED.*' "$log" | head -n 1))" ok
  else
    result "$name" fail "rc=$rc; $(tail -n 2 "$log" | tr '\n' ' ')"
  fi
}

# xrc_job with the target QPs' maker leaving before the rounds (srdma0, srdma1 and srdma2 up): it
# exits (3 nodes x 3 processes), it is killed (2 nodes x 4 processes).
xjob_maker_leaves() {
  xjob "xrc_job 3 nodes x 3 processes, target QPs' maker exits" \
    "^xrc_job: OK nodes 3 procs 3 rounds 5 messages 270 checked.*maker exited; late sender transport retry counter exceeded" \
    --devices srdma0,srdma1,srdma2 --procs 3 --rounds 5
  xjob "xrc_job 2 nodes x 4 processes, target QPs' maker killed" \
    "^xrc_job: OK nodes 2 procs 4 rounds 3 messages 96 checked.*maker killed; late sender transport retry counter exceeded" \
    --devices srdma0,srdma2 --procs 4 --rounds 3 --kill
}

# xleg NAME ARGS...: OFED's XRC verbs (examples/c/xrc_legacy.c): the receive QP outlives the
# process that allocated it, and goes with the domain's last close.
xleg() { # name args...
  local name="$1"
  shift
  local log="$logs/${name// /_}.log"
  timeout 120 "$ex/xrc_legacy" "$@" >"$log" 2>&1
  local rc=$?
  if [ "$rc" = 0 ] && grep -qE "^xrc_legacy: OK .*by a process that exited; 2 processes received [0-9]+ messages checked.*late send transport retry counter exceeded" "$log"; then
    result "$name ($(grep -oE 'received [0-9]+ messages checked' "$log"))" ok
  else
    result "$name" fail "rc=$rc; $(tail -n 2 "$log" | tr '\n' ' ')"
  fi
}
