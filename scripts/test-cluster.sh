#!/usr/bin/env bash
# Middleware, unchanged, on a simulated cluster (`softrdma cluster`: network-namespace hosts on
# one bridge, a softrdma device on each, MTU 1500 so path MTU 1024). Needs root.
#
#   the cluster's own behaviour: up twice, down with nothing up, exec on a host that does not
#     exist, rsh joining its words as ssh does, the presentation (/dev/infiniband, sysfs);
#   UCX (Debian's ucx-utils): ucx_info -d shows rc_verbs and ud_verbs; ucx_perftest tag_lat,
#     tag_bw and ucp_put_bw with UCX_TLS=rc_v,self and ud_v,self between two hosts, without
#     workaround variables;
#   libfabric (Debian's libfabric-bin): fi_info -p verbs; fi_pingpong -p verbs -e dgram, -e msg,
#     and -p "verbs;ofi_rxm" -e rdm;
#   pyverbs' test_rdmacm inside a host;
#   ibv_rc_pingpong, ib_write_bw and rping between hosts; two ib_send_bw streams at once between
#     them (device and provider paths);
#   a 4-host cluster: UCX tag_lat between every pair of hosts, Open MPI (pml ucx) over all four
#     (scripts/cluster/mpi_check.c, launched through `cluster rsh`), and a host's device killed
#     under a running MPI job (its rank hears DEVICE_FATAL, the job ends, the other hosts go on);
#   the set again with 0.5% loss on every host (netem, or the devices' --faults where the kernel
#     has no sch_netem): everything still completes.
#
# Usage: scripts/test-cluster.sh    (prints ok/FAIL lines; exit status = failures)
set -uo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "test-cluster.sh: needs root (network namespaces); CI runs it as root" >&2; exit 2; }
shim=$(bash scripts/build-shim.sh | tail -n 1)
bin=$(cd "$shim/.." && pwd)/softrdma
logs=$(mktemp -d)
pass=0
fail=0
result() { # name ok|fail [detail]
  if [ "$2" = ok ]; then
    pass=$((pass + 1))
    echo "ok    $1"
  else
    fail=$((fail + 1))
    echo "FAIL  $1: ${3:-}"
  fi
}
cleanup() { "$bin" cluster down >/dev/null 2>&1; rm -rf "$logs"; }
trap cleanup EXIT
on() { local h=$1; shift; "$bin" cluster exec "$h" -- "$@"; }
addr() { "$bin" cluster status --json | python3 -c 'import json,sys; print([h["addr"] for h in json.load(sys.stdin)["hosts"] if h["index"]==int(sys.argv[1])][0])' "$1"; }

# A server on host S and a client on host C (the client gets the server's address last); both
# must exit 0 and the client's output must match PATTERN.
pair() { # name S C pattern server-command... -- client-command...
  local name=$1 s=$2 c=$3 pat=$4
  shift 4
  local scmd=() ccmd=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do scmd+=("$1"); shift; done
  shift
  ccmd=("$@")
  local slog="$logs/${name//[^A-Za-z0-9_.-]/_}.server" clog="$logs/${name//[^A-Za-z0-9_.-]/_}.client"
  on "$s" timeout 120 "${scmd[@]}" >"$slog" 2>&1 &
  local spid=$!
  sleep 1
  on "$c" timeout 120 "${ccmd[@]}" "$(addr "$s")" >"$clog" 2>&1
  local crc=$?
  wait "$spid"
  local src=$?
  if [ "$crc" = 0 ] && [ "$src" = 0 ] && grep -qE "$pat" "$clog"; then
    result "$name" ok
  else
    result "$name" fail "server rc=$src client rc=$crc; $(tail -q -n 3 "$slog" "$clog" | tr '\n' ' ')"
  fi
}

# UCX between hosts S and C: the client's Final line.
ucx() { # name S C tls test [args]
  local name=$1 s=$2 c=$3 tls=$4
  shift 4
  pair "$name" "$s" "$c" "^Final:" env UCX_TLS="$tls" ucx_perftest -p 13337 -- \
    env UCX_TLS="$tls" ucx_perftest -p 13337 "$@"
}

suite() { # tag: the two-host set
  local t=$1
  ucx "UCX tag_lat rc_verbs$t" 1 2 rc_v,self -t tag_lat -n 1000
  ucx "UCX tag_bw rc_verbs$t" 1 2 rc_v,self -t tag_bw -s 65536 -n 200
  ucx "UCX ucp_put_bw rc_verbs$t" 1 2 rc_v,self -t ucp_put_bw -s 65536 -n 200
  ucx "UCX tag_lat ud_verbs$t" 1 2 ud_v,self -t tag_lat -n 1000
  ucx "UCX tag_bw ud_verbs$t" 1 2 ud_v,self -t tag_bw -s 65536 -n 100
  ucx "UCX ucp_put_bw ud_verbs$t" 1 2 ud_v,self -t ucp_put_bw -s 65536 -n 100
  # (Not under loss: fi_pingpong's dgram test has no retransmission, so a lost datagram stalls it
  # for good, on hardware as here. UCX's ud_verbs above does retransmit.)
  [ -n "$t" ] || pair "fi_pingpong -p verbs -e dgram$t" 1 2 "^1k +" fi_pingpong -p verbs -e dgram -I 100 -- \
    fi_pingpong -p verbs -e dgram -I 100
  pair "fi_pingpong -p verbs -e msg$t" 1 2 "^1m +" fi_pingpong -p verbs -e msg -I 100 -- \
    fi_pingpong -p verbs -e msg -I 100
  pair "fi_pingpong -p \"verbs;ofi_rxm\" -e rdm$t" 1 2 "^1m +" fi_pingpong -p "verbs;ofi_rxm" -e rdm -I 100 -- \
    fi_pingpong -p "verbs;ofi_rxm" -e rdm -I 100
  pair "ibv_rc_pingpong (path MTU 1024)$t" 1 2 "iters in" ibv_rc_pingpong -d srdma0 -g 0 -m 1024 -n 500 -- \
    ibv_rc_pingpong -d srdma0 -g 0 -m 1024 -n 500
  pair "ib_write_bw$t" 1 2 "^ 65536 +" ib_write_bw -d srdma0 -x 0 -n 200 -- ib_write_bw -d srdma0 -x 0 -n 200
  pair "rping$t" 1 2 "rdma-ping-19:" rping -s -a "$(addr 1)" -C 20 -V -- rping -c -C 20 -v -V -a
  [ -z "$t" ] || mpi "Open MPI over UCX rc_verbs, 2 ranks$t" 2 4096 200
}

# --- the cluster's own behaviour ---
"$bin" cluster down >/dev/null 2>&1
if "$bin" cluster down >/dev/null 2>&1; then result "cluster down with nothing up exits 0" ok; else result "cluster down with nothing up exits 0" fail; fi
if out=$("$bin" cluster up --hosts 2 2>&1); then
  result "cluster up --hosts 2" ok
else
  result "cluster up --hosts 2" fail "$out"
  echo "# $pass passed, $fail failed"
  exit 1
fi
out=$("$bin" cluster up --hosts 2 2>&1)
rc=$?
if [ "$rc" != 0 ] && echo "$out" | grep -q "already up"; then result "cluster up twice is a clear error" ok; else result "cluster up twice is a clear error" fail "rc=$rc $out"; fi
out=$("$bin" cluster exec 7 -- true 2>&1)
rc=$?
if [ "$rc" != 0 ] && echo "$out" | grep -q 'no host "7"'; then result "exec on a host that does not exist" ok; else result "exec on a host that does not exist" fail "rc=$rc $out"; fi
out=$("$bin" cluster status --json)
if echo "$out" | python3 -c 'import json,sys; h=json.load(sys.stdin)["hosts"]; assert [x["index"] for x in h]==[1,2] and all(x["device"]=="srdma0" and x["netns"] for x in h)'; then
  result "cluster status --json" ok
else
  result "cluster status --json" fail "$out"
fi
# rsh joins its words into one command line for the host's shell, as ssh does.
out=$("$bin" cluster rsh "$(addr 2)" echo 'a;' echo b '$(hostname)' 2>&1)
if [ "$out" = "a
b srdc-h2" ]; then result "cluster rsh joins words for sh -c on the host" ok; else result "cluster rsh joins words for sh -c on the host" fail "$out"; fi
# The presentation: what UCX and pyverbs look for.
out=$(on 1 sh -c 'test -c /dev/infiniband/uverbs0 && test -c /dev/infiniband/rdma_cm && cat /sys/class/infiniband/srdma0/ports/1/gid_attrs/types/0 /sys/class/infiniband/srdma0/ports/1/gid_attrs/ndevs/0 && ls /sys/class/infiniband/srdma0/device/net && cat /sys/class/infiniband_verbs/uverbs0/ibdev' 2>&1)
if [ "$out" = "RoCE v2
eth0
eth0
srdma0" ]; then result "device presented in /dev and /sys" ok; else result "device presented in /dev and /sys" fail "$out"; fi
out=$(on 1 ibv_devinfo -v 2>&1)
if echo "$out" | grep -q "active_mtu:.*1024" && echo "$out" | grep -q "GID\[  0\]:.*::ffff:$(addr 1), RoCE v2"; then
  result "path MTU 1024 at MTU 1500, RoCE v2 GID of the host's address" ok
else
  result "path MTU 1024 at MTU 1500, RoCE v2 GID of the host's address" fail "$(echo "$out" | grep -E 'mtu|GID')"
fi
out=$(on 1 ucx_info -d 2>&1)
if echo "$out" | grep -A1 "Transport: rc_verbs" | grep -q "srdma0:1" && echo "$out" | grep -A1 "Transport: ud_verbs" | grep -q "srdma0:1"; then
  result "ucx_info -d shows rc_verbs and ud_verbs on srdma0:1" ok
else
  result "ucx_info -d shows rc_verbs and ud_verbs on srdma0:1" fail "$(echo "$out" | grep -E 'Transport|Device' | tr '\n' ' ')"
fi
if on 1 fi_info -p verbs 2>&1 | grep -q "domain: srdma0"; then result "fi_info -p verbs lists srdma0" ok; else result "fi_info -p verbs lists srdma0" fail; fi

# pyverbs' rdma_cm tests inside a host: they find the device's address through the presented
# sysfs (device/net/eth0) and that interface's first address.
pv=$(dpkg -L python3-pyverbs 2>/dev/null | grep '/tests/run_tests\.py$' | head -n 1)
if [ -n "$pv" ]; then
  cp -r "$(dirname "$pv")" "$logs/pyverbs-tests"
  gunzip -f "$logs"/pyverbs-tests/*.gz 2>/dev/null
  out=$(on 1 sh -c "cd '$logs/pyverbs-tests' && timeout 300 /usr/bin/python3 run_tests.py --dev srdma0 --port 1 --gid 0 -v test_rdmacm" 2>&1)
  if echo "$out" | grep -qE "^Ran [1-9][0-9]* tests" && echo "$out" | grep -qx "OK"; then
    result "pyverbs test_rdmacm in a cluster host ($(echo "$out" | grep -E '^Ran ' | cut -d' ' -f2) passed, none skipped)" ok
  else
    result "pyverbs test_rdmacm in a cluster host" fail "$(echo "$out" | tail -n 5 | tr '\n' ' ')"
  fi
else
  result "pyverbs test_rdmacm in a cluster host" fail "python3-pyverbs ships no tests/run_tests.py"
fi

suite ""

# Two 64-byte SEND streams at once between the hosts (two processes on each side), on both data
# paths, three rounds each: a receiver that falls behind answers RNR NAKs, and the sequence NAKs
# it sends for the requests pipelined behind them must not spend the requesters' retry_cnt (they
# did: "Failed status 12", RETRY_EXC_ERR, in a quarter to a third of the runs).
streams() { # name [VAR=value...]
  local name=$1 round
  shift
  for round in 1 2 3; do
    local k pids=() rcs=()
    for k in 1 2; do
      on 2 timeout 120 env "$@" ib_send_bw -d srdma0 -p $((19000 + k)) -s 64 -n 100000 >"$logs/streams$k.s" 2>&1 &
      pids+=($!)
    done
    sleep 1
    for k in 1 2; do
      on 1 timeout 120 env "$@" ib_send_bw -d srdma0 -p $((19000 + k)) -s 64 -n 100000 "$(addr 2)" >"$logs/streams$k.c" 2>&1 &
      pids+=($!)
    done
    for k in "${pids[@]}"; do
      wait "$k"
      rcs+=($?)
    done
    if [ "${rcs[*]}" != "0 0 0 0" ] || ! grep -qE "^ 64 +100000 " "$logs/streams1.c" || ! grep -qE "^ 64 +100000 " "$logs/streams2.c"; then
      result "$name" fail "round $round: exit ${rcs[*]}; $(tail -q -n 2 "$logs"/streams*.c | tr '\n' ' ')"
      return
    fi
  done
  result "$name (3 rounds)" ok
}
streams "two ib_send_bw 64 B streams at once between the hosts, device path" SOFTRDMA_DATAPATH=device
streams "two ib_send_bw 64 B streams at once between the hosts, provider path" SOFTRDMA_DATAPATH=provider

# Open MPI (pml ucx over softrdma's rc_verbs), launched from host 1 with `cluster rsh` as its
# rsh agent: scripts/cluster/mpi_check.c (ping-pong with checked data, MPI_Allreduce,
# MPI_Alltoall) on one rank per host. OMPI_MCA_pml_ucx_devices=any: pml ucx otherwise ranks
# itself low on a device whose driver is not mlx*.
mpi_check=""
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  mpi_check="$logs/mpi_check"
  mpicc -O1 -Wall -o "$mpi_check" scripts/cluster/mpi_check.c || mpi_check=""
fi
# The hosts share this machine's cores: an Open MPI job there runs unbound unless it asks (its
# default bound each host's rank to core 0, and two hosts' ranks took turns on one core: an 8 B
# ping-pong cost milliseconds). Each rank's allowed CPUs are the machine's.
if [ -n "$mpi_check" ]; then
  printf '%s slots=1\n%s slots=1\n' "$(addr 1)" "$(addr 2)" >"$logs/hostfile-bind"
  all=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
  out=$(on 1 timeout 60 mpirun --allow-run-as-root --mca plm_rsh_agent "$bin cluster rsh" --hostfile "$logs/hostfile-bind" \
    -np 2 sh -c 'echo "$(hostname) $(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status)"' 2>&1)
  if [ "$(echo "$out" | grep -c " $all\$")" = 2 ]; then
    result "Open MPI ranks on cluster hosts are not bound to a core (the hosts share the machine's)" ok
  else
    result "Open MPI ranks on cluster hosts are not bound to a core (the hosts share the machine's)" fail "$out (all: $all)"
  fi
fi
mpi() { # name hosts [mpi_check args]
  local name=$1 n=$2
  shift 2
  if [ -z "$mpi_check" ]; then
    result "$name" fail "Open MPI (mpicc, mpirun) is not installed"
    return
  fi
  : >"$logs/hostfile"
  for i in $(seq "$n"); do echo "$(addr "$i") slots=1" >>"$logs/hostfile"; done
  local out
  out=$(on 1 timeout 180 mpirun --allow-run-as-root --mca plm_rsh_agent "$bin cluster rsh" --hostfile "$logs/hostfile" \
    -np "$n" --mca pml ucx -x UCX_TLS=rc_v,self -x OMPI_MCA_pml_ucx_devices=any "$mpi_check" "$@" 2>&1)
  local rc=$?
  if [ "$rc" = 0 ] && echo "$out" | grep -q "^mpi_check: OK ($n ranks on $n hosts)"; then
    result "$name ($(echo "$out" | grep -m1 '^pingpong' | sed 's/.*: //'))" ok
  else
    result "$name" fail "rc=$rc $(echo "$out" | grep -v setpgid | tail -n 4 | tr '\n' ' ')"
  fi
}

# --- four hosts: UCX between every pair, MPI over all four ---
"$bin" cluster down >/dev/null 2>&1
if out=$("$bin" cluster up --hosts 4 2>&1); then
  for s in 1 2 3 4; do
    for c in 1 2 3 4; do
      [ "$s" -lt "$c" ] || continue
      ucx "UCX tag_lat rc_verbs host $c -> host $s (4 hosts)" "$s" "$c" rc_v,self -t tag_lat -n 200
    done
  done
  mpi "Open MPI over UCX rc_verbs, 4 ranks on 4 hosts" 4
  # A host's device killed under a running job, as a NIC failing: the rank on that host hears
  # IBV_EVENT_DEVICE_FATAL at once (UCX prints "local catastrophic error", the async event fd woke
  # it), the job does not complete (it aborts with "transport retry counter exceeded" when rank 0
  # has a send in flight; otherwise MPI waits, as it would on hardware, until our 45 s limit),
  # and the other hosts' devices go on serving.
  if [ -n "$mpi_check" ]; then
    : >"$logs/hostfile2"
    for i in 1 2; do echo "$(addr "$i") slots=1" >>"$logs/hostfile2"; done
    h2_sends() {
      SOFTRDMA_RUNTIME_DIR=/run/softrdma-cluster/h2 "$bin" stat srdma0 --json 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["rdma_sends"])' 2>/dev/null || echo 0
    }
    base=$(h2_sends)
    on 1 timeout 45 mpirun --allow-run-as-root --mca plm_rsh_agent "$bin cluster rsh" --hostfile "$logs/hostfile2" \
      -np 2 --mca pml ucx -x UCX_TLS=rc_v,self -x OMPI_MCA_pml_ucx_devices=any "$mpi_check" 65536 1000000 \
      >"$logs/killed.log" 2>&1 &
    job=$!
    # Killed once the job runs its ping-pong (host 2's device has carried its traffic for a while).
    for _ in $(seq 300); do
      [ "$(h2_sends)" -gt $((base + 200)) ] && break
      sleep 0.1
    done
    sleep 2
    pid2=$(SOFTRDMA_RUNTIME_DIR=/run/softrdma-cluster/h2 "$bin" list --json | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["pid"])')
    kill -KILL "$pid2"
    t0=$(date +%s)
    wait "$job"
    jrc=$?
    took=$(($(date +%s) - t0))
    how=$(grep -oE "transport retry counter exceeded" "$logs/killed.log" | head -n 1)
    if [ "$jrc" != 0 ] && grep -q "local catastrophic error" "$logs/killed.log"; then
      result "MPI rank hears DEVICE_FATAL when its host's device is killed; the job ends with $jrc after ${took}s${how:+ ($how)}" ok
    else
      result "MPI rank hears DEVICE_FATAL when its host's device is killed" fail "exit $jrc after ${took}s: $(grep -v setpgid "$logs/killed.log" | tail -n 3 | tr '\n' ' ')"
    fi
    ucx "UCX between the other hosts after host 2's device died" 3 4 rc_v,self -t tag_lat -n 200
  fi
else
  result "cluster up --hosts 4" fail "$out"
fi

# --- loss on every host: netem where the kernel has it, else the devices' own fault injection
# (RoCE packets only; kernels without sch_netem, such as this project's CI machines) ---
"$bin" cluster down >/dev/null 2>&1
if modprobe -q sch_netem 2>/dev/null || [ -d /sys/module/sch_netem ]; then
  impair=(--netem "loss 0.5%")
else
  impair=(--faults "loss=0.005")
fi
if out=$("$bin" cluster up --hosts 2 "${impair[@]}" 2>&1); then
  suite " (${impair[*]})"
  lost=$(SOFTRDMA_RUNTIME_DIR=/run/softrdma-cluster/h1 "$bin" stat srdma0 --json 2>/dev/null |
    python3 -c 'import json,sys; v=json.load(sys.stdin); print(v.get("dropped_by_fault",0))' 2>/dev/null || echo "?")
  echo "#     (host 1's device dropped $lost packets by fault injection)"
else
  result "cluster up ${impair[*]}" fail "$out"
fi

"$bin" cluster down >/dev/null 2>&1
left=$(ip netns list | grep -c "^srdc-" || true)
if [ "$left" = 0 ] && ! ip link show | grep -q "srdc-"; then result "cluster down leaves no namespace or link" ok; else result "cluster down leaves no namespace or link" fail "$(ip netns list)"; fi

echo "# $pass passed, $fail failed"
exit "$fail"
