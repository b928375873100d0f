#!/usr/bin/env bash
# Runs rdma-core's pyverbs test suite (Debian's python3-pyverbs) against the verbs shim and prints
# a per-module markdown table of passed/failed/errors/skipped, then every failing or erroring test
# with the last line of its traceback, then the skips grouped by reason.
#
# Usage: scripts/pyverbs.sh [--log DIR] [--report-only] [--timeout SECONDS] [MODULE...]
#   MODULE        a test module of the suite, e.g. test_qp (default: test_device test_pd test_mr
#                 test_cq test_cq_events test_cqex test_qp test_qpex test_atomic test_addr
#                 test_shared_pd test_rdmacm, the core verbs and rdma_cm; the suite has more,
#                 e.g. test_odp)
#   --log DIR     also keep each module's raw unittest output as DIR/MODULE.log
#   --report-only exit 0 whatever the results (for producing the README table while work goes on)
#   --timeout S   per-module limit in seconds (default 300); a module that hits it counts as failed
# Exit status: 0 when no test failed or errored (or with --report-only), 1 otherwise, 2 on misuse.
set -euo pipefail

default_modules=(test_device test_pd test_mr test_cq test_cq_events test_cqex test_qp test_qpex
  test_atomic test_addr test_shared_pd test_rdmacm)

usage() { sed -n '6,13s/^# \{0,1\}//p' "$0"; }

log_dir=""
report_only=0
timeout_s=300
modules=()
while [ $# -gt 0 ]; do
  case "$1" in
    --log) [ $# -ge 2 ] || { usage >&2; exit 2; }; log_dir=$2; shift 2 ;;
    --log=*) log_dir=${1#--log=}; shift ;;
    --report-only) report_only=1; shift ;;
    --timeout) [ $# -ge 2 ] || { usage >&2; exit 2; }; timeout_s=$2; shift 2 ;;
    --timeout=*) timeout_s=${1#--timeout=}; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "pyverbs.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) m=$(basename "$1"); modules+=("${m%.py}"); shift ;; # accept test_qp, test_qp.py, tests/test_qp.py
  esac
done
[ ${#modules[@]} -gt 0 ] || modules=("${default_modules[@]}")
case "$timeout_s" in '' | *[!0-9]*) echo "pyverbs.sh: --timeout takes whole seconds" >&2; exit 2 ;; esac
# --log is relative to where we were called from, not to the repository.
case "$log_dir" in '' | /*) ;; *) log_dir="$PWD/$log_dir" ;; esac
cd "$(dirname "$0")/.."

# The suite and its bindings come from Debian (as install-deps.sh does for its packages).
if ! dpkg -s python3-pyverbs >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  echo "pyverbs.sh: installing python3-pyverbs" >&2
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends python3-pyverbs >/dev/null
fi
# Debian's interpreter explicitly: pyverbs is built for it, and another python3 may be first on PATH.
py=/usr/bin/python3

# The tests ship as documentation (Debian puts them under /usr/share/doc/rdma-core/tests, some
# gzipped); ask dpkg where rather than guessing.
src=$(dpkg -L python3-pyverbs | grep '/tests/run_tests\.py$' | head -n 1 || true)
[ -n "$src" ] || { echo "pyverbs.sh: python3-pyverbs ships no tests/run_tests.py" >&2; exit 1; }
src=$(dirname "$src")

# Build (a no-op when nothing changed) so the run always tests the current sources.
shim=$(bash scripts/build-shim.sh | tail -n 1)
shim=$(cd "$shim" && pwd)
softrdma="$shim/../softrdma"

# Everything this run creates lives in two private directories, removed on exit; every device we
# start is stopped on exit, also when interrupted.
work=$(mktemp -d)
SOFTRDMA_RUNTIME_DIR=$(mktemp -d)
chmod 0700 "$SOFTRDMA_RUNTIME_DIR"
export SOFTRDMA_RUNTIME_DIR
# A device that dies mid-run must show up as failures, not be silently replaced by the shim's
# autostart (which would also start one outside our control).
export SOFTRDMA_NO_AUTOSTART=1
daemons=() # name:pid of each device we started
runner=""  # the module run under way, if any
# shellcheck disable=SC2317 # (is_daemon and cleanup run from the EXIT trap)
is_daemon() { # PID NAME: that pid is still our device's daemon (not a reused pid)
  tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" | grep -q -- "daemon --name $2 "
}
# shellcheck disable=SC2317
cleanup() {
  local d pid
  [ -z "$runner" ] || { kill "$runner" 2>/dev/null || true; wait "$runner" 2>/dev/null || true; }
  for d in ${daemons[@]+"${daemons[@]}"}; do
    pid=${d#*:}
    # `softrdma down` talks to the device and waits forever for one that is stuck (or stopped),
    # so it gets a limit, and then the daemon's pid gets the signals.
    timeout 15 "$softrdma" down "${d%%:*}" >/dev/null 2>&1 || true
    [ -n "$pid" ] || continue # (never signal pid 0: that is our own process group)
    for _ in 1 2 3 4 5 6 7 8 9 10; do is_daemon "$pid" "${d%%:*}" || break; sleep 0.2; done
    if is_daemon "$pid" "${d%%:*}"; then
      kill -TERM "$pid" 2>/dev/null || true
      kill -CONT "$pid" 2>/dev/null || true
      sleep 1
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$work" "$SOFTRDMA_RUNTIME_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# srdma0 on 127.0.0.1; the suite needs no second device (server and client of each traffic test
# are two QPs on the same device). UDP 4791 may be held by a device of another runtime directory
# (e.g. one the shim autostarted for another program): then use another port, which only changes
# where this device sends and listens (every QP here talks to the same device).
dev=srdma0
udp_port=""
for p in 4791 14791 24791 34791; do
  if out=$("$softrdma" up "$dev" --addr 127.0.0.1 --port "$p" 2>&1); then
    udp_port=$p
    pid=$(printf '%s\n' "$out" | sed -n 's/.*(pid \([0-9][0-9]*\)).*/\1/p')
    daemons+=("$dev:$pid") # from "srdma0 up on 127.0.0.1 (pid N)"; empty if that ever changes
    break
  fi
  case "$out" in *"address already in use"*) continue ;; esac
  echo "pyverbs.sh: $out" >&2
  exit 1
done
[ -n "$udp_port" ] || { echo "pyverbs.sh: no free UDP port on 127.0.0.1 for $dev" >&2; exit 1; }

# The suite, unpacked. Only the helpers and the modules asked for (plus the test modules they
# import, e.g. test_shared_pd uses test_qpex) go into the run directory: the package's __init__.py
# imports every test_*.py beside it, so one module that cannot be imported (CUDA, a vendor library)
# would otherwise take every module down with it.
mkdir "$work/all" "$work/tests"
cp -r "$src/." "$work/all/"
find "$work/all" -name '*.gz' -exec gunzip -f {} +
find "$work/all" -maxdepth 1 -type f ! -name 'test_*.py' -exec cp {} "$work/tests/" \;
want=("${modules[@]}")
# The helpers come along whole, so the test modules they import must too (efa_base.py needs
# test_efa_srd, for instance, or the package cannot be imported at all).
while read -r dep; do
  want+=("$dep")
done < <(grep -ho 'tests\.test_[A-Za-z0-9_]*' "$work/tests/"*.py | sed 's/^tests\.//' | sort -u || true)
while [ ${#want[@]} -gt 0 ]; do
  m=${want[0]}
  want=("${want[@]:1}")
  if [ ! -f "$work/all/$m.py" ] || [ -f "$work/tests/$m.py" ]; then continue; fi
  cp "$work/all/$m.py" "$work/tests/"
  while read -r dep; do
    want+=("$dep")
  done < <(grep -o 'tests\.test_[A-Za-z0-9_]*' "$work/all/$m.py" | sed 's/^tests\.//' | sort -u || true)
done

if [ -n "$log_dir" ]; then
  mkdir -p "$log_dir"
else
  log_dir="$work/logs"
  mkdir "$log_dir"
fi

# pyverbs' rdma_cm tests find the device's IP address through sysfs: the first entry of
# /sys/class/infiniband/<dev>/device/net/ is its interface, and that interface's first address
# the address (tests/base.py, _get_ip_mac); without it every test skips ("doesn't have net
# interface"). `softrdma exec` presents the device there (a private mount namespace; a user
# namespace too for other users), so these modules run under it. Where no namespace can be made,
# softrdma exec says so and the module runs as it is: its skips say why.
sysfs_modules=" test_rdmacm "
present=("$softrdma" exec --)

# One run_tests.py per module, each under a timeout so that a hang cannot stall CI. `timeout`
# signals its whole process group, so the suite's forked helper processes go too.
results=()
for m in "${modules[@]}"; do
  log="$log_dir/$m.log"
  if [ ! -f "$work/tests/$m.py" ]; then
    echo "pyverbs.sh: no module $m in $src" >"$log"
    results+=("$m:missing:$log")
    continue
  fi
  echo "pyverbs.sh: $m" >&2
  rc=0
  # In the background so that an interrupt reaches cleanup, which then stops it (runner).
  wrap=()
  case "$sysfs_modules" in *" $m "*) wrap=("${present[@]}") ;; esac
  (cd "$work/tests" && LD_LIBRARY_PATH="$shim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    exec "${wrap[@]}" timeout -k 10 "$timeout_s" "$py" run_tests.py --dev "$dev" --port 1 --gid 0 -v "$m") \
    >"$log" 2>&1 &
  runner=$!
  wait "$runner" || rc=$?
  runner=""
  results+=("$m:$rc:$log")
done

# The report, from unittest's verbose output: its summary lines give the counts; the FAIL/ERROR
# blocks give each failure's last traceback line; the "... skipped 'why'" lines give skip reasons.
# A module without a summary (import error, crash, timeout) is counted from the tests it finished,
# plus one error (or, for a timeout, one failure) for the run itself.
rc=0
"$py" - "$timeout_s" "$udp_port" "${results[@]}" <<'EOF' || rc=$?
import re, sys
from collections import defaultdict

timeout_s, udp_port, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
header = re.compile(r'^(\w+) \(([\w.]+)\)')
status = re.compile(r"(?:^|\.\.\. )(ok|FAIL|ERROR|skipped (['\"])(.*)\2|expected failure|unexpected success)$")
exc_line = re.compile(r'^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b')

def one_line(l):
    # Readable in a list: control bytes escaped, long runs of one character (buffers in data
    # validation messages) shortened to "c×1024", site-packages paths shortened, the whole cut
    # at 200 characters.
    l = re.sub(r'/usr/lib/python3[^ ]*/dist-packages/', '', l.strip())
    l = ''.join(c if c.isprintable() else f'\\x{ord(c):02x}' for c in l)
    l = re.sub(r'(\\x[0-9a-f]{2}|.)\1{7,}', lambda m: f'{m.group(1)}×{len(m.group(0)) // len(m.group(1))}', l)
    return l if len(l) <= 200 else l[:199] + '…'

def last_exception(lines):
    lines = [l.rstrip() for l in lines if l.strip()]
    for l in reversed(lines):
        if exc_line.match(l):
            return one_line(l)
    return one_line(lines[-1]) if lines else '(no output)'

rows, problems, skips = [], [], defaultdict(list)
for run in runs:
    mod, rc, path = run.split(':', 2)
    text = open(path, errors='replace').read().split('\n')
    # Output after the summary (pyverbs' objects complaining at interpreter exit) is not a result.
    end = next((i for i, l in enumerate(text) if re.match(r'^(OK|FAILED)( \(.*\))?$', l)), None)
    body = text[:end + 1] if end is not None else text
    counts = defaultdict(int)
    current = None
    bad = [] # (test id, FAIL|ERROR) from the verbose lines
    reported = len(problems)
    for l in body:
        h = header.match(l)
        if h:
            current = h.group(2)
        s = status.search(l)
        if s and current:
            word = s.group(1).split(' ')[0]
            key = {'ok': 'passed', 'FAIL': 'failed', 'ERROR': 'errors', 'skipped': 'skipped',
                   'expected': 'passed', 'unexpected': 'failed'}[word]
            counts[key] += 1
            if key == 'skipped':
                skips[s.group(3)].append(current)
            if key in ('failed', 'errors'):
                bad.append((current, 'FAIL' if key == 'failed' else 'ERROR'))
            current = None
    # FAIL:/ERROR: blocks: header, dashes, traceback, up to the next rule.
    i = 0
    while i < len(body):
        b = re.match(r'^(FAIL|ERROR): (.*)$', body[i])
        if b and i > 0 and body[i - 1].startswith('====='):
            k = i + 1 # past the test's docstring, if unittest printed one
            while k < len(body) and not body[k].startswith('-----'):
                k += 1
            j = k + 1
            while j < len(body) and not re.match(r'^(=====|-----)', body[j]):
                j += 1
            name = b.group(2)
            inner = re.search(r'\(([\w.]+)\)', name)
            problems.append((b.group(1), inner.group(1) if inner and ' ' in name else name,
                             last_exception(body[k + 1:j])))
            i = j
        else:
            i += 1
    # A run cut short prints no FAIL/ERROR blocks: list what its verbose lines said failed.
    named = {p[1] for p in problems[reported:]}
    for tid, kind in bad:
        if tid not in named:
            problems.append((kind, tid, '(no traceback: the run did not finish)'))
    summary = next((l for l in body if re.match(r'^Ran \d+ tests? in ', l)), None)
    if rc == 'missing':
        counts = defaultdict(int, errors=1)
        problems.append(('ERROR', mod, 'no such module in python3-pyverbs'))
    elif end is not None and summary:
        ran = int(summary.split()[1])
        tail = body[end]
        get = lambda k: int((re.search(k + r'=(\d+)', tail) or [0, 0])[1])
        failed = get('failures') + get('unexpected successes')
        counts = {'failed': failed, 'errors': get('errors'), 'skipped': get('skipped')}
        counts['passed'] = max(0, ran - failed - counts['errors'] - counts['skipped'])
        if rc in ('124', '137'):
            counts['failed'] += 1
            problems.append(('TIMEOUT', mod, f'ran its tests but did not exit within {timeout_s} s'))
        elif rc not in ('0', '1'):
            counts['errors'] += 1
            problems.append(('ERROR', mod, f'run_tests.py exited with status {rc} after its summary'))
    elif rc in ('124', '137'):
        counts['failed'] += 1
        problems.append(('TIMEOUT', mod, f'no summary within {timeout_s} s; last test started: '
                         f'{current or "none"}'))
    else:
        counts['errors'] += 1
        problems.append(('ERROR', mod, f'run_tests.py exited with status {rc} without a summary: '
                         + last_exception(body)))
    rows.append((mod, counts))

cols = ('passed', 'failed', 'errors', 'skipped')
total = {c: sum(r[1].get(c, 0) for r in rows) for c in cols}
print('| module | passed | failed | errors | skipped |')
print('| --- | ---: | ---: | ---: | ---: |')
for mod, c in rows:
    print(f'| {mod} | ' + ' | '.join(str(c.get(k, 0)) for k in cols) + ' |')
print('| **total** | ' + ' | '.join(f'**{total[k]}**' for k in cols) + ' |')
if udp_port != '4791':
    print(f'\n(UDP 4791 on 127.0.0.1 was taken: srdma0 ran on UDP {udp_port}.)')
if problems:
    print('\nFailures and errors:\n')
    for kind, name, why in problems:
        print(f'- {kind} `{name}`: {why}')
if skips:
    print('\nSkips by reason:\n')
    for why, ids in sorted(skips.items(), key=lambda kv: -len(kv[1])):
        mods = sorted({i.split('.')[1] if i.startswith('tests.') else i for i in ids})
        print(f'- {len(ids)} × {why} ({", ".join(mods)})')
sys.exit(1 if total['failed'] or total['errors'] else 0)
EOF
if [ "$report_only" = 1 ]; then exit 0; fi
exit "$rc"
