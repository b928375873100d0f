#!/usr/bin/env bash
# The provider data path (SOFTRDMA_DATAPATH=provider): unchanged rdma-core programs and perftest
# run their own QPs in their processes, on sockets of the daemons' steered ports, one device
# (srdma0) and across two (srdma0 on 127.0.0.1, srdma1 on 127.0.0.2), and the daemons' engines
# see none of their packets (`softrdma stat`: daemon_udp_rcvd stays 0 on both), while the devices'
# counters count them (rcvd_pkts: the programs report theirs). One line per run, then
# "N passed, M failed".
# Usage: scripts/test-provider.sh [--quick]      (needs scripts/build-shim.sh first)
# XRC last: the domains, XRC SRQs and target QPs are the daemons' (the programs' XRC sides,
# device/src/verbs/xrc.rs), so the daemons receive those packets. rdma_cm's own contexts (rping,
# rdma_server) stay on the device path.
cd "$(dirname "$0")/.."
. scripts/shim-env.sh
quick=0
[ "${1:-}" = "--quick" ] && quick=1
private_runtime
export SOFTRDMA_DATAPATH=provider
logs="$rt/logs"
mkdir -p "$logs"
cleanup() {
  stop_run srdma0 srdma1
}
trap cleanup EXIT
up_two_devices
. scripts/programs-lib.sh

n=200
iters=100
[ $quick = 1 ] && { n=50; iters=20; }
for where in "srdma0 srdma0" "srdma0 srdma1"; do
  set -- $where
  s=$1 c=$2
  tag="$s->$c"
  pair "ibv_rc_pingpong $tag" "$s" "$c" ibv_rc_pingpong -n "$n"
  pair "ibv_rc_pingpong -s 65536 $tag" "$s" "$c" ibv_rc_pingpong -s 65536 -n "$n"
  pair "ibv_rc_pingpong -e $tag" "$s" "$c" ibv_rc_pingpong -e -n "$n"
  pair "ibv_uc_pingpong $tag" "$s" "$c" ibv_uc_pingpong -n "$n"
  pair "ibv_ud_pingpong $tag" "$s" "$c" ibv_ud_pingpong -n "$n"
  pair "ibv_srq_pingpong -q 4 $tag" "$s" "$c" ibv_srq_pingpong -q 4 -n "$n"
  for prog in ib_send_bw ib_write_bw ib_read_bw ib_atomic_bw ib_send_lat ib_write_lat ib_read_lat ib_atomic_lat; do
    perf "$prog -n $iters $tag" "$s" "$c" "$prog" -n "$iters"
  done
  want_rows=23 perf "ib_write_bw -a -n 5 $tag" "$s" "$c" ib_write_bw -a -n 5
  perf "ib_send_bw -q 4 -n $iters $tag" "$s" "$c" ib_send_bw -q 4 -n "$iters"
  perf "ib_send_bw -c UD -n $iters $tag" "$s" "$c" ib_send_bw -c UD -n "$iters"
done

# rdma_cm on the programs' own provider contexts (perftest -R opens its device itself and has
# librdmacm connect those QPs: their numbers and PSNs travel in REQ/REP through the daemon's CM,
# the data through the programs' own sockets). One device: -R connects to srdma0's address.
cm_perf_all

# None of it passed through a daemon's socket: the kernel steered every datagram to the process
# that owns its destination QP. The devices' counters still count the programs' packets: each
# program reported its own (`Request::Publish`) as it closed.
for dev in srdma0 srdma1; do
  js=$("$bin" stat "$dev" --json 2>/dev/null)
  own=$(sed -n 's/.*"daemon_udp_rcvd": *\([0-9]*\).*/\1/p' <<<"$js" | head -1)
  all=$(sed -n 's/.*"rcvd_pkts": *\([0-9]*\).*/\1/p' <<<"$js" | head -1)
  if [ "$own" = 0 ] && [ "${all:-0}" -gt 0 ]; then
    result "$dev's daemon received no packet (all steered to the programs), the device counted $all" ok
  else
    result "$dev's daemon received no packet, the device counted the programs'" fail "daemon_udp_rcvd=$own rcvd_pkts=$all"
  fi
done

# XRC on the provider path: the programs' send QPs are their own, the domains, XRC SRQs and
# target QPs are the daemons' (each program's XRC side), its CQs and memory the program's. The
# seeds' workloads: target QPs that outlive the process that made them (exit, SIGKILL), through
# rdma_cm too, and OFED's XRC verbs.
ex="$(realpath "$target/examples")"
addr2="${SOFTRDMA_TEST_ADDR2:-127.0.0.3}"
xsrq "ibv_xsrq_pingpong -c 3 srdma0->srdma0" srdma0 srdma0 3
xsrq "ibv_xsrq_pingpong -c 2 srdma0->srdma1" srdma0 srdma1 2
if [ -x "$ex/xrc_job" ] && [ -x "$ex/xrc_legacy" ] && "$bin" up srdma2 --addr "$addr2" >/dev/null; then
  xjob_maker_leaves
  xjob "xrc_job --cm 2 nodes x 3 processes, maker exits" \
    "^xrc_job: OK nodes 2 procs 3 rounds 3 messages 54 checked.*setup rdma_cm; maker exited; late sender transport retry" \
    --devices srdma1,srdma2 --procs 3 --rounds 3 --cm
  xleg "xrc_legacy (OFED XRC verbs) across two devices" --device srdma0 --sender-device srdma1 --messages 200
  timeout 15 "$bin" down srdma2 >/dev/null 2>&1
else
  result "xrc_job, xrc_legacy" fail "$ex/xrc_job or xrc_legacy missing (scripts/build-examples.sh) or srdma2 did not start"
fi

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
