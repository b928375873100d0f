# Sourced by conformance/interop/rxe.sh (rping against the kernel's rdma_cm).
#
# rping_lost_teardown_race SERVER-LOG: true when an rping server's log ends the way rping's own
# race ends it (rdma-core 44's rping, Debian 12's rdmacm-utils; upstream rping later fixed it by
# waking and joining its CM thread before destroying the channel). The CM thread goes back to
# rdma_get_cm_event after the DISCONNECTED event; if the main thread, done with the last ping,
# destroyed the event channel first, that call fails with EBADF (librdmacm writes to the closed
# ucma fd) and the thread calls exit(-1): status 255, on the kernel's rdma_cm. softrdma's librdmacm
# keeps a destroyed channel open for a second and while a thread reads it, so that late call
# blocks as an earlier one would (verbs-shim/src/cma/mod.rs `bury`): the race no longer ends an
# rping on softrdma; this stays for rping against rxe in the interop guest. The caller still checks
# that every ping was verified and that the client exited 0.
rping_lost_teardown_race() {
  [ "$(tail -n 3 "$1")" = "$(printf 'server DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\nrdma_get_cm_event: Bad file descriptor')" ]
}
