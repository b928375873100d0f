#!/bin/sh
# /init of the rdma_rxe test guest (conformance/interop/build-guest.sh): loads rdma_rxe, makes rxe0 on
# eth0, then serves the host's commands (guest/agent.sh) on TCP port 7000 until told to power off.
# Kernel command line: rxe_ip=ADDR/LEN.
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp
say() { echo "[guest $(cut -d' ' -f1 /proc/uptime)] $*"; }
for o in $(cat /proc/cmdline); do case $o in rxe_*=*) eval "$o" ;; esac; done
for m in $(cat /etc/modorder); do insmod "/lib/modules/$(uname -r)/$m" 2>&1 | grep -v 'File exists'; done
ip link set lo up
ip link set eth0 up
ip addr add "${rxe_ip:?}" dev eth0
rdma link add rxe0 type rxe netdev eth0 || say "RXE-FAILED"
# The RoCEv2 GID of the IPv4 address (an IPv4-mapped IPv6 GID).
gidx=""
for _ in $(seq 100); do
  for n in 0 1 2 3 4 5 6 7; do
    v=$(cat /sys/class/infiniband/rxe0/ports/1/gids/$n 2>/dev/null)
    t=$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$n 2>/dev/null)
    case "$v" in 0000:0000:0000:0000:0000:ffff:*) [ "$t" = "RoCE v2" ] && gidx=$n ;; esac
    [ -n "$gidx" ] && break
  done
  [ -n "$gidx" ] && break
  usleep 100000
done
echo "$gidx" > /tmp/gidx
nc -ll -p 7000 -e /usr/bin/agent &
say "READY gid_index=$gidx mtu=$(ibv_devinfo -d rxe0 | awk '/active_mtu/ {print $2}')"
while [ ! -e /tmp/poweroff ]; do sleep 1; done
sync
poweroff -f
