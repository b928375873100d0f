/* What the kernel charges for the datagrams of one RC one-way on loopback (BENCHMARKS.md, "The
 * two datagrams of a one-way"). Two processes ping-pong 20-byte datagrams (the size of a 2-byte
 * SEND_ONLY and of an ACK) between 127.0.0.41 and 127.0.0.42, both spinning on nonblocking
 * sockets; prints the one-way p50 and p10 (half the round trip) of ITERS round trips after 20,000
 * to warm up. Each variant changes one thing:
 *
 *   udp-pair plain      one datagram per one-way, send/recv (as udpbench's busy-poll ping-pong)
 *   udp-pair gso1       one datagram, sent with a UDP_SEGMENT control message
 *   udp-pair gso2       two segments in one GSO send (a SEND and an ACK, as softrdma sends them)
 *   udp-pair mmsg2      the two as two messages of one sendmmsg
 *
 * Receivers have UDP_GRO and IP_PKTINFO (as a device's socket; NO_GRO=1, NO_PKTINFO=1 leave
 * them off) and read with recvmmsg of RECV_VLEN (default 32; 1 as a spinning provider's first
 * read does) buffers, until a one-way's bytes are in. Build: cc -O2 -o udp-pair
 * scripts/udp-pair.c */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

enum { SEG = 20, WARM = 20000, VLEN_MAX = 32 };

static int gso, mmsg, nseg, vlen = VLEN_MAX;
static char out[SEG * 2];

static struct sockaddr_in addr(const char *ip, int port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

static int sock(const char *ip, int port)
{
	int s = socket(AF_INET, SOCK_DGRAM, 0), one = 1;
	struct sockaddr_in a = addr(ip, port);
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a)) {
		perror("bind");
		exit(1);
	}
	fcntl(s, F_SETFL, O_NONBLOCK);
	if (!getenv("NO_GRO"))
		setsockopt(s, IPPROTO_UDP, UDP_GRO, &one, sizeof one);
	if (!getenv("NO_PKTINFO"))
		setsockopt(s, IPPROTO_IP, IP_PKTINFO, &one, sizeof one);
	return s;
}

static void one_way(int s, struct sockaddr_in *to)
{
	if (mmsg) {
		struct mmsghdr m[2];
		struct iovec iov[2];
		memset(m, 0, sizeof m);
		for (int i = 0; i < nseg; i++) {
			iov[i].iov_base = out + i * SEG;
			iov[i].iov_len = SEG;
			m[i].msg_hdr.msg_iov = &iov[i];
			m[i].msg_hdr.msg_iovlen = 1;
			m[i].msg_hdr.msg_name = to;
			m[i].msg_hdr.msg_namelen = sizeof *to;
		}
		sendmmsg(s, m, nseg, 0);
		return;
	}
	if (!gso) {
		sendto(s, out, SEG, 0, (struct sockaddr *)to, sizeof *to);
		return;
	}
	struct iovec iov = { out, SEG * nseg };
	char c[CMSG_SPACE(sizeof(uint16_t))];
	struct msghdr m;
	memset(&m, 0, sizeof m);
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	m.msg_name = to;
	m.msg_namelen = sizeof *to;
	m.msg_control = c;
	m.msg_controllen = sizeof c;
	struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
	cm->cmsg_level = SOL_UDP;
	cm->cmsg_type = UDP_SEGMENT;
	cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
	*(uint16_t *)CMSG_DATA(cm) = SEG;
	sendmsg(s, &m, 0);
}

/* Spins until a one-way's bytes arrived. */
static void take(int s)
{
	static char bufs[VLEN_MAX][2048], cbuf[VLEN_MAX][64];
	static struct sockaddr_in names[VLEN_MAX];
	struct mmsghdr h[VLEN_MAX];
	struct iovec iov[VLEN_MAX];
	int got = 0;
	while (got < SEG * nseg) {
		for (int i = 0; i < vlen; i++) {
			iov[i].iov_base = bufs[i];
			iov[i].iov_len = sizeof bufs[i];
			memset(&h[i], 0, sizeof h[i]);
			h[i].msg_hdr.msg_iov = &iov[i];
			h[i].msg_hdr.msg_iovlen = 1;
			h[i].msg_hdr.msg_name = &names[i];
			h[i].msg_hdr.msg_namelen = sizeof names[i];
			h[i].msg_hdr.msg_control = cbuf[i];
			h[i].msg_hdr.msg_controllen = sizeof cbuf[i];
		}
		int n = recvmmsg(s, h, vlen, 0, NULL);
		for (int i = 0; i < n; i++)
			got += h[i].msg_len;
	}
}

static int cmp(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
	return a < b ? -1 : a > b;
}

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000ull + t.tv_nsec;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "plain";
	int iters = argc > 2 ? atoi(argv[2]) : 50000;
	if (getenv("RECV_VLEN"))
		vlen = atoi(getenv("RECV_VLEN"));
	if (vlen < 1 || vlen > VLEN_MAX || iters < 1) {
		fprintf(stderr, "RECV_VLEN 1..32, ITERS > 0\n");
		return 2;
	}
	if (!strcmp(mode, "plain"))
		nseg = 1;
	else if (!strcmp(mode, "gso1"))
		gso = 1, nseg = 1;
	else if (!strcmp(mode, "gso2"))
		gso = 1, nseg = 2;
	else if (!strcmp(mode, "mmsg2"))
		mmsg = 1, nseg = 2;
	else {
		fprintf(stderr, "usage: udp-pair plain|gso1|gso2|mmsg2 [ITERS]\n");
		return 2;
	}
	int pa = 40000 + getpid() % 10000 * 2, pb = pa + 1;
	int a = sock("127.0.0.41", pa), b = sock("127.0.0.42", pb);
	struct sockaddr_in ta = addr("127.0.0.41", pa), tb = addr("127.0.0.42", pb);
	pid_t c = fork();
	if (c == 0) {
		for (;;) {
			take(b);
			one_way(b, &ta);
		}
	}
	uint64_t *rtt = malloc(sizeof *rtt * iters);
	for (int i = 0; i < WARM + iters; i++) {
		uint64_t t0 = now_ns();
		one_way(a, &tb);
		take(a);
		if (i >= WARM)
			rtt[i - WARM] = now_ns() - t0;
	}
	kill(c, SIGKILL);
	waitpid(c, NULL, 0);
	qsort(rtt, iters, sizeof *rtt, cmp);
	printf("%s recv_vlen=%d: one-way p50 %.3f us, p10 %.3f us\n", mode, vlen, rtt[iters / 2] / 2000.0,
	       rtt[iters / 10] / 2000.0);
	return 0;
}
