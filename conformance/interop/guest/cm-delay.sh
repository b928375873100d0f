#!/bin/sh
# cm-delay MS: delays by MS milliseconds every CM MAD the guest receives (RoCEv2 to UDP 4791 with
# BTH destination QP 1), and nothing else: eth0's ingress redirects them to ifb0, whose netem
# qdisc holds them. cm-delay 0 removes it. (/usr/bin/tc is iproute2's; busybox's sh would run its
# own tc applet for a bare `tc`.)
tc=/usr/bin/tc
$tc qdisc del dev eth0 ingress 2>/dev/null
$tc qdisc del dev ifb0 root 2>/dev/null
[ "$1" = 0 ] && exit 0
ip link set ifb0 up || exit 1
$tc qdisc add dev ifb0 root netem delay "${1}ms" || exit 1
$tc qdisc add dev eth0 handle ffff: ingress || exit 1
# The IPv4 header is 20 bytes and UDP 8, so the BTH starts at 28 and its destination QP is the
# low 24 bits of the word at 32.
$tc filter add dev eth0 parent ffff: protocol ip prio 1 u32 match ip protocol 17 0xff \
  match ip dport 4791 0xffff match u32 0x00000001 0x00ffffff at 32 \
  action mirred egress redirect dev ifb0
