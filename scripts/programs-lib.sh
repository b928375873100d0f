# Shared by scripts/test-verbs-programs.sh and scripts/test-provider.sh (sourced, not run): the
# result counters and the ways to run a program as server and client. Expects $logs, $addr0 and
# the devices to exist.
passed=0
failed=0
port=$((20000 + RANDOM % 20000))
result() { # name status detail
  if [ "$2" = ok ]; then
    passed=$((passed + 1))
    printf 'ok    %s\n' "$1"
  else
    failed=$((failed + 1))
    printf 'FAIL  %s: %s\n' "$1" "$3"
  fi
}

single() { # name expect-regex cmd...
  local name="$1" want="$2"
  shift 2
  local log="$logs/$(echo "$name" | tr ' /' '__').log"
  if timeout 60 "$@" >"$log" 2>&1 && grep -qE "$want" "$log"; then
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
    result "$name" fail "server rc=$src client rc=$crc, $rows result rows; server: $(tail -n 4 "$slog" | tr '\n' ' ') client: $(tail -n 4 "$clog" | tr '\n' ' ')"
  fi
}
