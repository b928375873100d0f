#!/bin/sh
# cm-listening PORT SECONDS: waits until an rdma_cm ID in the guest listens on PORT (the kernel's
# `rdma resource show cm_id` lists it in state LISTEN); exits 1 if none does within SECONDS.
end=$(($(date +%s) + $2))
while :; do
  rdma resource show cm_id 2>/dev/null | grep -qE "state LISTEN .*src-addr [^ ]*:$1 " && exit 0
  [ "$(date +%s)" -ge "$end" ] && exit 1
  usleep 50000
done
