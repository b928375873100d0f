/*
 * xrc_legacy: the seed "make receiving XRC QP independent of any one user process" end to end,
 * written against OFED 1.3-1.5's XRC verbs as Open MPI's and MVAPICH's openib XRC support was
 * (softrdma/ofed_xrc.h; softrdma's libibverbs.so.1 exports them where OFED's did):
 *
 * - on the receiving node (device --device), processes B and C open the node's XRC domain
 *   through a shared file (ibv_open_xrc_domain), each creates its own XRC SRQ
 *   (ibv_create_xrc_srq) and posts its receives;
 * - process A opens the same domain, allocates the receive QP with ibv_alloc_xrc_rcv_qp (the
 *   QP is owned by the device and moved RESET->INIT->RTR in the call; A gets only its number),
 *   and exits without closing anything;
 * - the sender (device --sender-device) connects one IBV_QPT_XRC QP to that number and sends
 *   --messages messages to B's and C's SRQs alternately, naming each in xrc_remote_srq_num;
 *   B and C receive and check every one through the receive QP whose creator is gone;
 * - B and C close the domain (the last references): the receive QP goes with it, and a late
 *   send to its number fails with IBV_WC_RETRY_EXC_ERR.
 *
 *   xrc_legacy [--device D] [--sender-device S] [--messages N]
 *
 * Defaults: the first device libibverbs lists, and the second (or the first again) to send
 * from. Build: cc xrc_legacy.c -I$SHIM/include $SHIM/libibverbs.so.1 (scripts/build-examples.sh).
 * Output: "xrc_legacy: OK ..." and exit 0, or "xrc_legacy: FAILED <why>" and exit 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <softrdma/ofed_xrc.h>

#define MSG 64

static char rdev[64], sdev[64];
static int messages = 200;
static int domain_fd;

static void fail(const char *fmt, ...)
{
	va_list ap;

	printf("xrc_legacy: FAILED ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	exit(1);
}

static struct ibv_context *open_dev(const char *name)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = NULL;

	for (int i = 0; list && i < n; i++)
		if (strcmp(ibv_get_device_name(list[i]), name) == 0)
			ctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	if (!ctx)
		fail("cannot open device %s: %s", name, strerror(errno));
	return ctx;
}

/* A device's GID 0 and active MTU. */
static void port_of(struct ibv_context *ctx, union ibv_gid *gid, enum ibv_mtu *mtu)
{
	struct ibv_port_attr p;

	if (ibv_query_gid(ctx, 1, 0, gid) || ibv_query_port(ctx, 1, &p))
		fail("query port of %s: %s", ibv_get_device_name(ctx->device), strerror(errno));
	*mtu = p.active_mtu;
}

/* Pipes carry numbers between the processes (the launcher's out-of-band exchange). */
static void put(int fd, uint32_t v)
{
	if (write(fd, &v, sizeof(v)) != sizeof(v))
		_exit(2);
}

static uint32_t get(int fd)
{
	uint32_t v;

	if (read(fd, &v, sizeof(v)) != sizeof(v))
		fail("a process went away (pipe closed)");
	return v;
}

static void fill_msg(char *m, int i, uint32_t srqn)
{
	memset(m, 0, MSG);
	snprintf(m, MSG, "message %d for SRQ %u", i, srqn);
}

/*
 * Receiver B or C: its own context, the shared domain, an XRC SRQ with every receive posted;
 * reports the SRQ number, then takes `count` messages and checks them, reports how many were
 * right, waits for the word to leave, and closes everything (the domain last).
 */
static void receiver(int id, int count, int up, int down)
{
	struct ibv_context *ctx = open_dev(rdev);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, count + 1, NULL, NULL, 0);
	struct ibv_xrc_domain *d = ibv_open_xrc_domain(ctx, domain_fd, O_CREAT);
	char *buf = calloc(count, MSG);
	struct ibv_mr *mr = pd && buf ? ibv_reg_mr(pd, buf, (size_t)count * MSG, IBV_ACCESS_LOCAL_WRITE) : NULL;

	if (!pd || !cq || !d || !mr)
		fail("receiver %c: setup: %s", 'B' + id, strerror(errno));
	struct ibv_srq_init_attr sia = { .attr = { .max_wr = count, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_xrc_srq(pd, d, cq, &sia);

	if (!srq)
		fail("receiver %c: ibv_create_xrc_srq: %s", 'B' + id, strerror(errno));
	uint32_t srqn = ibv_xrc_srq(srq)->xrc_srq_num;

	for (int i = 0; i < count; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)buf + (size_t)i * MSG, .length = MSG, .lkey = mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;

		if (ibv_post_srq_recv(srq, &wr, &bad))
			fail("receiver %c: ibv_post_srq_recv", 'B' + id);
	}
	put(up, srqn);
	int good = 0;
	time_t t0 = time(NULL);

	for (int got = 0; got < count;) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(cq, 1, &wc);

		if (n < 0)
			fail("receiver %c: ibv_poll_cq", 'B' + id);
		if (n == 0) {
			if (time(NULL) - t0 > 60)
				break;
			usleep(100);
			continue;
		}
		char want[MSG];

		/* SRQ receives complete in order: the i-th completion holds the i-th message. */
		fill_msg(want, got, srqn);
		if (wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)got && wc.byte_len == MSG &&
		    memcmp(buf + (size_t)got * MSG, want, MSG) == 0)
			good++;
		got++;
	}
	put(up, good);
	get(down);
	if (ibv_destroy_srq(srq) || ibv_close_xrc_domain(d))
		fail("receiver %c: teardown: %s", 'B' + id, strerror(errno));
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	put(up, 1);
	_exit(0);
}

/* Process A: allocates the device-owned receive QP toward sender QP `sqpn` and exits. */
static void allocator(uint32_t sqpn, const union ibv_gid *sgid, int up)
{
	struct ibv_context *ctx = open_dev(rdev);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_xrc_domain *d = ibv_open_xrc_domain(ctx, domain_fd, O_CREAT);
	union ibv_gid gid;
	enum ibv_mtu mtu;
	struct ibv_qp_attr a;
	uint32_t qpn = 0;

	if (!pd || !d)
		fail("allocator: setup: %s", strerror(errno));
	port_of(ctx, &gid, &mtu);
	/* The seed's table: what RESET->INIT and INIT->RTR need. */
	memset(&a, 0, sizeof(a));
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	a.pkey_index = 0;
	a.port_num = 1;
	a.path_mtu = mtu;
	a.dest_qp_num = sqpn;
	a.rq_psn = 0x77;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *sgid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	int rc = ibv_alloc_xrc_rcv_qp(pd, d, &a,
				      IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_AV | IBV_QP_PATH_MTU |
					      IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MIN_RNR_TIMER,
				      &qpn);

	if (rc)
		fail("ibv_alloc_xrc_rcv_qp: %s", strerror(-rc));
	put(up, qpn);
	/* Exit with everything open, as a process that dies does. */
	_exit(0);
}

static int opt_device(const char *arg, char *out)
{
	if (strlen(arg) >= 64)
		return -1;
	strcpy(out, arg);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "device", required_argument, NULL, 'd' },
		{ "sender-device", required_argument, NULL, 's' },
		{ "messages", required_argument, NULL, 'n' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	setvbuf(stdout, NULL, _IOLBF, 0);
	while ((c = getopt_long(argc, argv, "d:s:n:", opts, NULL)) != -1) {
		if ((c == 'd' && opt_device(optarg, rdev)) || (c == 's' && opt_device(optarg, sdev)) ||
		    (c == 'n' && ((messages = atoi(optarg)) < 2 || messages > 4096)) || c == '?') {
			fprintf(stderr, "usage: xrc_legacy [--device D] [--sender-device S] [--messages 2..4096]\n");
			return 1;
		}
	}
	if (!rdev[0] || !sdev[0]) {
		int n = 0;
		struct ibv_device **list = ibv_get_device_list(&n);

		if (!list || n == 0)
			fail("no RDMA device");
		if (!rdev[0])
			strcpy(rdev, ibv_get_device_name(list[0]));
		if (!sdev[0])
			strcpy(sdev, ibv_get_device_name(list[n > 1 ? 1 : 0]));
		ibv_free_device_list(list);
	}
	char path[] = "/tmp/xrc_legacy-XXXXXX";

	domain_fd = mkstemp(path);
	if (domain_fd < 0)
		fail("mkstemp: %s", strerror(errno));
	unlink(path);

	/* B and C first: their references keep the domain once A has gone. */
	int up[2][2], down[2][2];
	pid_t kid[3];
	uint32_t srqn[2];
	int half[2] = { (messages + 1) / 2, messages / 2 };

	for (int r = 0; r < 2; r++) {
		if (pipe(up[r]) || pipe(down[r]))
			fail("pipe");
		kid[r] = fork();
		if (kid[r] == 0)
			receiver(r, half[r], up[r][1], down[r][0]);
		srqn[r] = get(up[r][0]);
	}

	/* The sender: one OFED IBV_QPT_XRC QP (in a domain of its own node). */
	struct ibv_context *ctx = open_dev(sdev);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_xrc_domain *sd = ibv_open_xrc_domain(ctx, -1, O_CREAT);
	static char sbuf[MSG];
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, sbuf, MSG, IBV_ACCESS_LOCAL_WRITE) : NULL;

	if (!pd || !cq || !sd || !mr)
		fail("sender setup: %s", strerror(errno));
	struct ibv_qp_init_attr_xrc ia;

	memset(&ia, 0, sizeof(ia));
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_XRC;
	ia.cap.max_send_wr = 64;
	ia.cap.max_send_sge = 1;
	ia.xrc_domain = sd;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia.base);

	if (!qp)
		fail("ibv_create_qp IBV_QPT_XRC: %s", strerror(errno));
	union ibv_gid sgid, rgid;
	enum ibv_mtu mtu;

	port_of(ctx, &sgid, &mtu);

	/* A allocates the receive QP and exits. */
	int aup[2], st;

	if (pipe(aup))
		fail("pipe");
	kid[2] = fork();
	if (kid[2] == 0)
		allocator(qp->qp_num, &sgid, aup[1]);
	uint32_t rqpn = get(aup[0]);

	if (waitpid(kid[2], &st, 0) != kid[2] || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fail("the allocating process did not exit cleanly (status 0x%x)", st);
	{
		struct ibv_context *rctx = open_dev(rdev);
		enum ibv_mtu rmtu;

		port_of(rctx, &rgid, &rmtu);
		ibv_close_device(rctx);
		if (rmtu < mtu)
			mtu = rmtu;
	}

	/* Connect the sender to the receive QP whose allocator is gone. */
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		fail("sender INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = rqpn;
	a.rq_psn = 0x77;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = rgid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN))
		fail("sender RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 12;
	a.retry_cnt = 3;
	a.rnr_retry = 7;
	a.sq_psn = 0x77;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				  IBV_QP_MAX_QP_RD_ATOMIC))
		fail("sender RTS");

	/* Every message, one at a time, alternating between B's and C's SRQs. */
	struct timespec t0, t1;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	int sent[2] = { 0, 0 };

	for (int i = 0; i < messages; i++) {
		int r = i % 2;
		struct ibv_sge sge = { .addr = (uintptr_t)sbuf, .length = MSG, .lkey = mr->lkey };
		struct ibv_send_wr wr, *bad;
		struct ibv_wc wc;
		int n;

		fill_msg(sbuf, sent[r]++, srqn[r]);
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = i;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.xrc_remote_srq_num = srqn[r];
		if (ibv_post_send(qp, &wr, &bad))
			fail("ibv_post_send %d", i);
		while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
			;
		if (n < 0 || wc.status != IBV_WC_SUCCESS)
			fail("send %d to SRQ %u: %s", i, srqn[r], n < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	int checked = 0;

	for (int r = 0; r < 2; r++) {
		int good = (int)get(up[r][0]);

		if (good != half[r])
			fail("receiver %c checked %d of %d messages", 'B' + r, good, half[r]);
		checked += good;
	}

	/* B and C leave: the domain's last references, and with them the receive QP. */
	for (int r = 0; r < 2; r++) {
		put(down[r][1], 1);
		get(up[r][0]);
		waitpid(kid[r], &st, 0);
	}
	struct ibv_context *probe = open_dev(rdev);
	struct ibv_xrc_domain *gone = ibv_open_xrc_domain(probe, domain_fd, 0);

	if (gone)
		fail("the XRC domain still exists after its last close");
	ibv_close_device(probe);
	{
		struct ibv_sge sge = { .addr = (uintptr_t)sbuf, .length = MSG, .lkey = mr->lkey };
		struct ibv_send_wr wr, *bad;
		struct ibv_wc wc;
		int n;

		memset(&wr, 0, sizeof(wr));
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.xrc_remote_srq_num = srqn[0];
		if (ibv_post_send(qp, &wr, &bad))
			fail("late ibv_post_send");
		time_t w0 = time(NULL);

		while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && time(NULL) - w0 < 30)
			usleep(1000);
		if (n != 1 || wc.status != IBV_WC_RETRY_EXC_ERR)
			fail("the late send to receive QP %u completed with %s, not transport retry counter exceeded",
			     rqpn, n == 1 ? ibv_wc_status_str(wc.status) : "nothing");
	}
	double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / messages;

	ibv_destroy_qp(qp);
	ibv_close_xrc_domain(sd);
	printf("xrc_legacy: OK receive QP %u allocated on %s by a process that exited; 2 processes received "
	       "%d messages checked (%.1f us per send) through it from %s; after the last close of the domain "
	       "the QP is gone: late send %s\n",
	       rqpn, rdev, checked, us, sdev, ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR));
	return 0;
}
