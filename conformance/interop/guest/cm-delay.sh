#!/bin/sh
# cm-delay MS [out]: delays by MS milliseconds every CM MAD the guest receives (RoCEv2 to UDP
# 4791 with BTH destination QP 1), or with `out` every CM MAD it sends, and nothing else: the
# MADs are redirected to an ifb device whose netem qdisc holds them (received ones from eth0's
# ingress to ifb0; sent ones from eth0's egress, through a clsact qdisc, to ifb1, which puts them
# back on eth0 after the delay). cm-delay 0 removes both. (/usr/bin/tc is iproute2's; busybox's
# sh would run its own tc applet for a bare `tc`.)
tc=/usr/bin/tc
$tc qdisc del dev eth0 ingress 2>/dev/null
$tc qdisc del dev eth0 clsact 2>/dev/null
$tc qdisc del dev ifb0 root 2>/dev/null
$tc qdisc del dev ifb1 root 2>/dev/null
[ "$1" = 0 ] && exit 0
# The IPv4 header is 20 bytes and UDP 8, so the BTH starts at 28 and its destination QP is the
# low 24 bits of the word at 32.
if [ "$2" = out ]; then
  ip link set ifb1 up || exit 1
  $tc qdisc add dev ifb1 root netem delay "${1}ms" || exit 1
  $tc qdisc add dev eth0 clsact || exit 1
  $tc filter add dev eth0 egress protocol ip prio 1 u32 match ip protocol 17 0xff \
    match ip dport 4791 0xffff match u32 0x00000001 0x00ffffff at 32 \
    action mirred egress redirect dev ifb1
  exit $?
fi
ip link set ifb0 up || exit 1
$tc qdisc add dev ifb0 root netem delay "${1}ms" || exit 1
$tc qdisc add dev eth0 handle ffff: ingress || exit 1
$tc filter add dev eth0 parent ffff: protocol ip prio 1 u32 match ip protocol 17 0xff \
  match ip dport 4791 0xffff match u32 0x00000001 0x00ffffff at 32 \
  action mirred egress redirect dev ifb0
