/*
 * ofed_xrc.c: OFED 1.3-1.5's XRC verbs on the shim, compiled against softrdma/ofed_xrc.h as an
 * old OFED program is against OFED's verbs.h, and linked with the shim's libibverbs.so.1:
 *
 *   cc -O1 -Wall -Werror -I$SHIM/include ofed_xrc.c -o ofed_xrc $SHIM/libibverbs.so.1
 *   LD_LIBRARY_PATH=$SHIM ./ofed_xrc
 *
 * The semantics checked: domains shared through a file; XRC SRQs with OFED's srq layout; the
 * IBV_QPT_XRC sending QP with OFED's init_attr tail and xrc_remote_srq_num; the registered
 * receive QP (ibv_create/modify/query/reg/unreg_xrc_rcv_qp) that lives while any registered
 * process does; the masks modify and ibv_alloc_xrc_rcv_qp require (EINVAL without them); the
 * device-owned receive QP of ibv_alloc_xrc_rcv_qp that outlives its allocating process and dies
 * with the domain; an SRQ of another domain refused (NAK: invalid request); async events of a
 * registered receive QP with IBV_XRC_QP_EVENT_FLAG. A second process is a fork.
 *
 * Output: one line per check, "ok <name>" or "FAIL <name>: <detail>", then "# N checks, M
 * failed". Exit status: the number of failures. A watchdog (alarm) fails a blocked call.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <softrdma/ofed_xrc.h>

#include "check.h"

#define DEVICE_NAME "srdma0"

static void on_alarm(int sig)
{
	static const char msg[] = "FAIL watchdog: a call blocked\n";

	(void)sig;
	if (write(1, msg, sizeof(msg) - 1) < 0) {
		/* nothing more to do */
	}
	_exit(n_failures + 1 > 255 ? 255 : n_failures + 1);
}

static struct ibv_context *open_ctx(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = NULL;

	for (int i = 0; list && i < n; i++)
		if (strcmp(ibv_get_device_name(list[i]), DEVICE_NAME) == 0)
			ctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	return ctx;
}

struct env {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
	enum ibv_mtu mtu;
};

/* The path attributes toward this device itself (both sides are on it). */
static void fill_path(const struct env *e, struct ibv_qp_attr *a, uint32_t dest_qpn)
{
	a->path_mtu = e->mtu;
	a->dest_qp_num = dest_qpn;
	a->rq_psn = 0x100;
	a->min_rnr_timer = 12;
	a->ah_attr.is_global = 1;
	a->ah_attr.grh.dgid = e->gid;
	a->ah_attr.grh.hop_limit = 1;
	a->ah_attr.port_num = 1;
}

static const int INIT_MASK = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
static const int RTR_MASK = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;

/* An OFED IBV_QPT_XRC sending QP in domain d (in RESET). */
static struct ibv_qp *xrc_qp(const struct env *e, struct ibv_xrc_domain *d)
{
	struct ibv_qp_init_attr_xrc ia;

	memset(&ia, 0, sizeof(ia));
	ia.send_cq = e->cq;
	ia.recv_cq = e->cq;
	ia.qp_type = IBV_QPT_XRC;
	ia.cap.max_send_wr = 16;
	ia.cap.max_send_sge = 1;
	ia.xrc_domain = d;
	return ibv_create_qp(e->pd, &ia.base);
}

/* Connects sending QP qp to receive QP rqpn (RESET->INIT->RTR->RTS); 0 or the errno. */
static int xrc_connect(const struct env *e, struct ibv_qp *qp, uint32_t rqpn, int retry_cnt)
{
	struct ibv_qp_attr a;
	int rc;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	if ((rc = ibv_modify_qp(qp, &a, INIT_MASK)))
		return rc;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	fill_path(e, &a, rqpn);
	if ((rc = ibv_modify_qp(qp, &a, RTR_MASK)))
		return rc;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 10; /* 4 ms */
	a.retry_cnt = retry_cnt;
	a.rnr_retry = 7;
	a.sq_psn = 0x100;
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

/* A sending QP connected to receive QP rqpn. */
static struct ibv_qp *xrc_sender(const struct env *e, struct ibv_xrc_domain *d, uint32_t rqpn, int retry_cnt)
{
	struct ibv_qp *qp = xrc_qp(e, d);

	if (qp && xrc_connect(e, qp, rqpn, retry_cnt)) {
		ibv_destroy_qp(qp);
		return NULL;
	}
	return qp;
}

/* Waits up to 5 s for one completion on the CQ. */
static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (int i = 0; i < 5000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n)
			return n;
		usleep(1000);
	}
	return 0;
}

/* Posts a receive on srq (if any) and sends `msg` through qp to SRQ number `srqn`; returns the
 * sender's completion status (-1: none) and, in *got, whether the receive completed with msg. */
static int xsend(const struct env *e, struct ibv_qp *qp, struct ibv_srq *srq, uint32_t srqn, const char *msg,
		 int *got)
{
	size_t len = strlen(msg) + 1;
	struct ibv_sge rs = { .addr = (uintptr_t)e->buf + 2048, .length = 1024, .lkey = e->mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &rs, .num_sge = 1 }, *rbad;
	struct ibv_sge ss = { .addr = (uintptr_t)e->buf, .length = (uint32_t)len, .lkey = e->mr->lkey };
	struct ibv_send_wr swr, *sbad;
	struct ibv_wc wc;
	int status = -1;

	*got = 0;
	memset(e->buf + 2048, 0, 1024);
	memcpy(e->buf, msg, len);
	if (srq && ibv_post_srq_recv(srq, &rwr, &rbad))
		return -2;
	memset(&swr, 0, sizeof(swr));
	swr.wr_id = 1;
	swr.sg_list = &ss;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	swr.xrc_remote_srq_num = srqn; /* OFED's field name */
	if (ibv_post_send(qp, &swr, &sbad))
		return -3;
	for (int k = 0; k < (srq ? 2 : 1); k++) {
		if (!poll_one(e->cq, &wc))
			break;
		if (wc.wr_id == 1)
			status = wc.status;
		else if (wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS && wc.byte_len == len &&
			 memcmp(e->buf + 2048, msg, len) == 0)
			*got = 1;
		if (wc.wr_id == 1 && wc.status != IBV_WC_SUCCESS)
			break;
	}
	return status;
}

/* One line from a pipe as an integer (the child's report). */
static long read_num(int fd)
{
	char line[32];
	size_t n = 0;

	while (n < sizeof(line) - 1 && read(fd, line + n, 1) == 1 && line[n] != '\n')
		n++;
	line[n] = 0;
	return n ? strtol(line, NULL, 0) : -9999;
}

static void write_num(int fd, long v)
{
	char line[32];
	int n = snprintf(line, sizeof(line), "%ld\n", v);

	if (write(fd, line, n) != n)
		_exit(100);
}

/* The second process for the registration checks: registers with rqpn, reports, waits for
 * the go, unregisters, reports. */
static void child_registrant(int fd, uint32_t rqpn, int to_parent, int from_parent)
{
	struct ibv_context *ctx = open_ctx();
	struct ibv_xrc_domain *d = ctx ? ibv_open_xrc_domain(ctx, fd, 0) : NULL;

	write_num(to_parent, d ? 0 : -errno - 1000);
	if (!d)
		_exit(1);
	write_num(to_parent, ibv_reg_xrc_rcv_qp(d, rqpn));
	write_num(to_parent, ibv_reg_xrc_rcv_qp(d, rqpn ^ 0x5a5a));
	read_num(from_parent);
	write_num(to_parent, ibv_unreg_xrc_rcv_qp(d, rqpn));
	read_num(from_parent);
	_exit(ibv_close_xrc_domain(d));
}

/* The allocating process of the seed: opens the domain, allocates the receive QP toward
 * sender `sqpn`, reports the mask check and the number, and exits without closing anything. */
static void child_allocator(int fd, uint32_t sqpn, int to_parent)
{
	struct env e;
	struct ibv_qp_attr a;
	uint32_t qpn = 0;

	memset(&e, 0, sizeof(e));
	e.ctx = open_ctx();
	e.pd = e.ctx ? ibv_alloc_pd(e.ctx) : NULL;
	struct ibv_xrc_domain *d = e.pd ? ibv_open_xrc_domain(e.ctx, fd, 0) : NULL;
	struct ibv_port_attr port;

	if (!d || ibv_query_gid(e.ctx, 1, 0, &e.gid) || ibv_query_port(e.ctx, 1, &port)) {
		write_num(to_parent, -1000);
		_exit(1);
	}
	e.mtu = port.active_mtu;
	memset(&a, 0, sizeof(a));
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	a.port_num = 1;
	fill_path(&e, &a, sqpn);
	a.max_dest_rd_atomic = 1;
	int need = IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_AV | IBV_QP_PATH_MTU |
		   IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MIN_RNR_TIMER;

	write_num(to_parent, ibv_alloc_xrc_rcv_qp(e.pd, d, &a, need & ~IBV_QP_RQ_PSN, &qpn));
	write_num(to_parent, ibv_alloc_xrc_rcv_qp(e.pd, d, &a, need | IBV_QP_MAX_DEST_RD_ATOMIC, &qpn));
	write_num(to_parent, qpn);
	_exit(0);
}

int main(void)
{
	struct env e;
	struct ibv_port_attr port;
	char path[] = "/tmp/softrdma-ofed-xrc-XXXXXX", path2[] = "/tmp/softrdma-ofed-xrc2-XXXXXX";
	int rc, got;

	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGALRM, on_alarm);
	alarm(90);
	memset(&e, 0, sizeof(e));
	e.ctx = open_ctx();
	if (!check(e.ctx != NULL, "ibv_open_device " DEVICE_NAME, "errno %d (%s)", errno, strerror(errno)))
		return 1;
	e.pd = ibv_alloc_pd(e.ctx);
	e.cq = ibv_create_cq(e.ctx, 64, NULL, NULL, 0);
	e.buf = calloc(1, 4096);
	e.mr = e.pd ? ibv_reg_mr(e.pd, e.buf, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
	int fd = mkstemp(path), fd2 = mkstemp(path2);

	if (!check(e.pd && e.cq && e.mr && fd >= 0 && fd2 >= 0 && !ibv_query_gid(e.ctx, 1, 0, &e.gid) &&
			   !ibv_query_port(e.ctx, 1, &port),
		   "setup", "errno %d (%s)", errno, strerror(errno)))
		return 1;
	e.mtu = port.active_mtu;
	unlink(path);
	unlink(path2);

	/* Domains. */
	struct ibv_xrc_domain *d = ibv_open_xrc_domain(e.ctx, fd, O_CREAT);
	struct ibv_xrc_domain *d2 = ibv_open_xrc_domain(e.ctx, fd2, O_CREAT);

	if (!check(d && d2 && d->context == e.ctx && d->handle != d2->handle, "ibv_open_xrc_domain O_CREAT x2",
		   "d %p d2 %p errno %d (%s)", (void *)d, (void *)d2, errno, strerror(errno)))
		return 1;
	struct ibv_xrc_domain *bad = ibv_open_xrc_domain(e.ctx, -1, 0);

	check(bad == NULL && errno == EAGAIN, "ibv_open_xrc_domain fd -1 without O_CREAT -> EAGAIN", "%p errno %d",
	      (void *)bad, errno);
	bad = ibv_open_xrc_domain(e.ctx, fd, O_CREAT | O_EXCL);
	check(bad == NULL && errno == EINVAL, "ibv_open_xrc_domain O_CREAT|O_EXCL on an existing domain -> EINVAL",
	      "%p errno %d", (void *)bad, errno);

	/* SRQs with OFED's layout. */
	struct ibv_srq_init_attr sia = { .attr = { .max_wr = 32, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_xrc_srq(e.pd, d, e.cq, &sia);
	struct ibv_srq *srq2 = ibv_create_xrc_srq(e.pd, d2, e.cq, &sia);
	uint32_t num = 0;

	if (!check(srq && srq2, "ibv_create_xrc_srq x2", "errno %d (%s)", errno, strerror(errno)))
		return 1;
	ibv_get_srq_num(srq, &num);
	struct ibv_srq_legacy *ls = ibv_xrc_srq(srq);

	check(ls->xrc_srq_num == num && num != 0 && ls->xrc_domain == d && ls->xrc_cq == e.cq && ls->context == e.ctx &&
		      ls->pd == e.pd && srq->context == e.ctx,
	      "OFED's srq->xrc_srq_num, xrc_domain, xrc_cq", "num %u (ibv_get_srq_num %u) domain %p cq %p",
	      ls->xrc_srq_num, num, (void *)ls->xrc_domain, (void *)ls->xrc_cq);
	uint32_t srqn = ls->xrc_srq_num, srqn2 = ibv_xrc_srq(srq2)->xrc_srq_num;

	bad = (struct ibv_xrc_domain *)ibv_create_xrc_srq(e.pd, NULL, e.cq, &sia);
	check(bad == NULL && errno == EINVAL, "ibv_create_xrc_srq without a domain -> EINVAL", "errno %d", errno);

	/* The registered receive QP. */
	struct ibv_qp_init_attr_xrc ia;
	uint32_t rqpn = 0;

	memset(&ia, 0, sizeof(ia));
	rc = ibv_create_xrc_rcv_qp(&ia.base, &rqpn);
	check(rc == -EINVAL, "ibv_create_xrc_rcv_qp without a domain -> -EINVAL", "rc %d", rc);
	ia.xrc_domain = d;
	rc = ibv_create_xrc_rcv_qp(&ia.base, &rqpn);
	if (!check(rc == 0 && rqpn != 0, "ibv_create_xrc_rcv_qp", "rc %d qpn %u", rc, rqpn))
		return 1;

	struct ibv_qp *sqp = xrc_sender(&e, d, rqpn, 7);

	if (!check(sqp && sqp->qp_type == IBV_QPT_XRC, "ibv_create_qp IBV_QPT_XRC (5) with OFED's init_attr",
		   "qp %p errno %d (%s)", (void *)sqp, errno, strerror(errno)))
		return 1;
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	rc = ibv_modify_xrc_rcv_qp(d, rqpn, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS);
	check(rc == EINVAL, "ibv_modify_xrc_rcv_qp RESET->INIT without IBV_QP_PORT -> EINVAL", "rc %d", rc);
	a.port_num = 1;
	rc = ibv_modify_xrc_rcv_qp(d, rqpn, &a, INIT_MASK);
	check(rc == 0, "ibv_modify_xrc_rcv_qp RESET->INIT", "rc %d", rc);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	fill_path(&e, &a, sqp->qp_num);
	rc = ibv_modify_xrc_rcv_qp(d, rqpn, &a, RTR_MASK & ~IBV_QP_MAX_DEST_RD_ATOMIC);
	check(rc == EINVAL, "ibv_modify_xrc_rcv_qp INIT->RTR without IBV_QP_MAX_DEST_RD_ATOMIC -> EINVAL", "rc %d",
	      rc);
	rc = ibv_modify_xrc_rcv_qp(d, rqpn, &a, RTR_MASK);
	check(rc == 0, "ibv_modify_xrc_rcv_qp INIT->RTR", "rc %d", rc);
	rc = ibv_modify_xrc_rcv_qp(d2, rqpn, &a, RTR_MASK);
	check(rc == EINVAL, "ibv_modify_xrc_rcv_qp through another domain -> EINVAL", "rc %d", rc);

	struct ibv_qp_init_attr_xrc qi;

	memset(&qi, 0, sizeof(qi));
	memset(&a, 0, sizeof(a));
	rc = ibv_query_xrc_rcv_qp(d, rqpn, &a, IBV_QP_STATE, &qi.base);
	check(rc == 0 && a.qp_state == IBV_QPS_RTR && qi.qp_type == IBV_QPT_XRC && qi.xrc_domain == d,
	      "ibv_query_xrc_rcv_qp: RTR, type 5, its domain", "rc %d state %d type %d domain %p", rc, a.qp_state,
	      qi.qp_type, (void *)qi.xrc_domain);
	memset(&qi, 0, sizeof(qi));
	rc = ibv_query_qp(sqp, &a, IBV_QP_STATE, &qi.base);
	check(rc == 0 && a.qp_state == IBV_QPS_RTS && qi.qp_type == IBV_QPT_XRC && qi.xrc_domain == d,
	      "ibv_query_qp of the XRC QP fills OFED's init_attr tail", "rc %d state %d type %d domain %p", rc,
	      a.qp_state, qi.qp_type, (void *)qi.xrc_domain);

	rc = xsend(&e, sqp, srq, srqn, "to the registered receive QP", &got);
	check(rc == IBV_WC_SUCCESS && got, "SEND with xrc_remote_srq_num through the receive QP", "status %d got %d", rc,
	      got);

	/* Its first packet made it communication-established: an event for the registered process. */
	{
		struct ibv_async_event ev;
		int fl = fcntl(e.ctx->async_fd, F_GETFL);
		int found = 0;

		fcntl(e.ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
		for (int i = 0; i < 200 && !found; i++) {
			if (ibv_get_async_event(e.ctx, &ev) == 0) {
				found = ev.event_type == (enum ibv_event_type)(IBV_XRC_QP_EVENT_FLAG | IBV_EVENT_COMM_EST) &&
					ibv_xrc_event_qp_num(&ev) == rqpn;
				ibv_ack_async_event(&ev);
			} else {
				usleep(5000);
			}
		}
		fcntl(e.ctx->async_fd, F_SETFL, fl);
		check(found, "COMM_EST of the receive QP arrives with IBV_XRC_QP_EVENT_FLAG and its number", "none");
	}

	/* Registrations from a second process. */
	int up[2], down[2];

	if (pipe(up) || pipe(down))
		return 1;
	pid_t pid = fork();

	if (pid == 0) {
		close(up[0]);
		close(down[1]);
		child_registrant(fd, rqpn, up[1], down[0]);
	}
	close(up[1]);
	close(down[0]);
	check(read_num(up[0]) == 0, "a second process opens the domain through the file", "failed");
	rc = (int)read_num(up[0]);
	check(rc == 0, "ibv_reg_xrc_rcv_qp from the second process", "rc %d", rc);
	rc = (int)read_num(up[0]);
	check(rc == EINVAL, "ibv_reg_xrc_rcv_qp of a number that is no receive QP -> EINVAL", "rc %d", rc);
	rc = ibv_unreg_xrc_rcv_qp(d, rqpn);
	check(rc == 0, "ibv_unreg_xrc_rcv_qp by its creator", "rc %d", rc);
	rc = ibv_unreg_xrc_rcv_qp(d, rqpn);
	check(rc == EINVAL, "ibv_unreg_xrc_rcv_qp again -> EINVAL (not registered)", "rc %d", rc);
	rc = ibv_query_xrc_rcv_qp(d, rqpn, &a, IBV_QP_STATE, NULL);
	check(rc == 0 && a.qp_state == IBV_QPS_RTR, "the receive QP lives while the second process is registered",
	      "rc %d state %d", rc, a.qp_state);
	rc = xsend(&e, sqp, srq, srqn, "still there", &got);
	check(rc == IBV_WC_SUCCESS && got, "traffic through it continues", "status %d got %d", rc, got);
	write_num(down[1], 1);
	rc = (int)read_num(up[0]);
	check(rc == 0, "ibv_unreg_xrc_rcv_qp by the last registered process", "rc %d", rc);
	rc = ibv_query_xrc_rcv_qp(d, rqpn, &a, IBV_QP_STATE, NULL);
	check(rc == EINVAL, "after the last unregistration the receive QP is gone (query -> EINVAL)", "rc %d", rc);
	rc = ibv_reg_xrc_rcv_qp(d, rqpn);
	check(rc == EINVAL, "and cannot be registered again -> EINVAL", "rc %d", rc);
	write_num(down[1], 1);
	int st = 0;

	waitpid(pid, &st, 0);
	check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the second process closed its domain", "status 0x%x", st);
	ibv_destroy_qp(sqp);

	/* The seed's device-owned receive QP, allocated by a process that then exits. */
	struct ibv_qp *sqp2 = xrc_qp(&e, d);
	uint32_t aqpn = 0;

	if (!check(sqp2 != NULL, "a second XRC sending QP", "errno %d", errno))
		return 1;
	if (pipe(up))
		return 1;
	pid = fork();
	if (pid == 0) {
		close(up[0]);
		child_allocator(fd, sqp2->qp_num, up[1]);
	}
	close(up[1]);
	rc = (int)read_num(up[0]);
	check(rc == -EINVAL, "ibv_alloc_xrc_rcv_qp without IBV_QP_RQ_PSN (the seed's table) -> -EINVAL", "rc %d", rc);
	rc = (int)read_num(up[0]);
	aqpn = (uint32_t)read_num(up[0]);
	check(rc == 0 && aqpn != 0, "ibv_alloc_xrc_rcv_qp in another process", "rc %d qpn %u", rc, aqpn);
	waitpid(pid, &st, 0);
	check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the allocating process exited", "status 0x%x", st);
	rc = ibv_query_xrc_rcv_qp(d, aqpn, &a, IBV_QP_STATE, NULL);
	check(rc == 0 && a.qp_state == IBV_QPS_RTR, "the allocated receive QP is in RTR after its allocator exited",
	      "rc %d state %d", rc, a.qp_state);
	/* Connect the sender to it now that its number is known. */
	rc = xrc_connect(&e, sqp2, aqpn, 2);
	if (!check(rc == 0, "the sending QP connects to the allocated receive QP", "rc %d", rc))
		return 1;
	rc = xsend(&e, sqp2, srq, srqn, "through the device-owned receive QP", &got);
	check(rc == IBV_WC_SUCCESS && got, "SEND through the allocated receive QP", "status %d got %d", rc, got);
	rc = xsend(&e, sqp2, NULL, srqn2, "to another domain's SRQ", &got);
	check(rc == IBV_WC_REM_INV_REQ_ERR, "an SRQ of another domain is refused (NAK invalid request)",
	      "status %d (%s)", rc, rc >= 0 ? ibv_wc_status_str(rc) : "no completion");
	ibv_destroy_qp(sqp2);

	/* The domain's last reference: the allocated QP goes with it. */
	rc = ibv_close_xrc_domain(d);
	check(rc == EBUSY, "ibv_close_xrc_domain while its XRC SRQ exists -> EBUSY", "rc %d", rc);
	ibv_destroy_srq(srq);
	rc = ibv_close_xrc_domain(d);
	check(rc == 0, "ibv_close_xrc_domain (the last reference)", "rc %d", rc);
	bad = ibv_open_xrc_domain(e.ctx, fd, 0);
	check(bad == NULL && errno == EAGAIN, "the domain is gone (open without O_CREAT -> EAGAIN)", "%p errno %d",
	      (void *)bad, errno);
	d = ibv_open_xrc_domain(e.ctx, fd, O_CREAT);
	struct ibv_qp *late = d ? xrc_sender(&e, d, aqpn, 1) : NULL;

	if (check(late != NULL, "a late sender", "errno %d", errno)) {
		rc = xsend(&e, late, NULL, srqn, "too late", &got);
		check(rc == IBV_WC_RETRY_EXC_ERR, "a send to the dead receive QP number -> RETRY_EXC_ERR",
		      "status %d (%s)", rc, rc >= 0 ? ibv_wc_status_str(rc) : "no completion");
		ibv_destroy_qp(late);
	}
	ibv_destroy_srq(srq2);
	check(ibv_close_xrc_domain(d2) == 0 && (!d || ibv_close_xrc_domain(d) == 0), "close the domains", "errno %d",
	      errno);
	printf("# %d checks, %d failed\n", n_checks, n_failures);
	return n_failures > 255 ? 255 : n_failures;
}
