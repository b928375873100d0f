/*
 * xrc_job: an MPI-style all-to-all job over XRC, the pattern of the XRC seeds (Open MPI's openib
 * XRC support): every device stands for a node, every node runs P processes, and
 * - each node has one XRC domain, shared by its processes through a file;
 * - each process has its own XRC SRQ, and reaches every process of another node through ONE XRC
 *   initiator QP to that node (M-1 send QPs per process instead of (M-1) x P), naming the remote
 *   process by its SRQ number in each send;
 * - the target (XRC_RECV) QPs of a node are made by one process of that node, which then exits
 *   (cleanly, or killed with --kill): the target QPs belong to the XRC domain, not to the process,
 *   so the others keep receiving through them;
 * - when the last process of a node closes the domain, its target QPs are gone: a late sender
 *   gets IBV_WC_RETRY_EXC_ERR.
 *
 *   xrc_job [--devices D1,D2,...] [--procs P] [--rounds R] [--kill] [--cm]
 *
 * Default devices: every device libibverbs lists. The processes are forked; they exchange SRQ
 * numbers (and without --cm, QP numbers) out of band over TCP on 127.0.0.1 with the launcher (the
 * analogue of an MPI runtime's modex). With --cm the send QPs connect to the target QPs through
 * rdma_cm instead (RDMA_PS_IB, XRC: rdma_create_ep with IBV_QPT_XRC_SEND on one side, a listener
 * making each XRC_RECV QP in the node's shared domain on the other; the target QPN travels in the
 * REP). Each round is an all-to-all exchange in which every message is checked (sender,
 * receiver, round, payload).
 *
 * Output: one final line "xrc_job: OK nodes M procs P rounds R messages N checked, ..." and exit
 * 0, or "xrc_job: FAILED <why>" and exit 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define MAXN 8
#define MAXP 8
#define MSG 64

/* What the launcher knows and hands out: the modex. */
struct table {
	int32_t nodes, procs;
	uint8_t gid[MAXN][16];
	uint32_t srqn[MAXN][MAXP];
	uint32_t ini[MAXN][MAXP][MAXN]; /* ini[m][r][n]: process (m,r)'s send QP toward node n */
	uint32_t tgt[MAXN][MAXN][MAXP]; /* tgt[n][m][r]: on node n, the target QP of (m,r)'s send QP */
};

enum cmd { C_TABLE = 1, C_GO, C_ROUND, C_EXIT, C_LATE };

struct report {
	int32_t node, rank; /* rank -1: the node's target-QP maker */
	int32_t ok;
	uint32_t srqn;
	uint32_t ini[MAXN];
	uint32_t tgt[MAXN][MAXP];
	uint8_t gid[16];
	uint64_t checked;
	int32_t status; /* C_LATE: the completion status */
	char why[160];
};

static int nodes, procs = 2, rounds = 4, kill_maker, use_cm, cm_port;
static char devname[MAXN][64];
static char xrcd_path[MAXN][256];

static int full_write(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t k = write(fd, c, n);
		if (k <= 0) {
			if (k < 0 && errno == EINTR)
				continue;
			return -1;
		}
		c += k;
		n -= (size_t)k;
	}
	return 0;
}

static int full_read(int fd, void *p, size_t n)
{
	char *c = p;
	while (n) {
		ssize_t k = read(fd, c, n);
		if (k <= 0) {
			if (k < 0 && errno == EINTR)
				continue;
			return -1;
		}
		c += k;
		n -= (size_t)k;
	}
	return 0;
}

/* ---- a process of a node ---- */

struct proc {
	int node, rank, sock;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_xrcd *xrcd;
	int xrcd_fd;
	struct ibv_cq *cq;
	struct ibv_srq *srq;
	struct ibv_mr *mr;
	char *buf; /* receive slots, then send slots */
	int slots;
	struct ibv_qp *ini[MAXN];
	struct rdma_cm_id *ini_id[MAXN]; /* --cm */
	struct report rep;
	struct table t;
};

static void why(struct proc *p, const char *fmt, ...)
{
	va_list ap;
	if (p->rep.why[0])
		return;
	va_start(ap, fmt);
	vsnprintf(p->rep.why, sizeof(p->rep.why), fmt, ap);
	va_end(ap);
}

static struct ibv_context *open_dev(const char *name)
{
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	struct ibv_context *c = NULL;
	for (int i = 0; l && i < n; i++)
		if (!strcmp(ibv_get_device_name(l[i]), name))
			c = ibv_open_device(l[i]);
	if (l)
		ibv_free_device_list(l);
	return c;
}

/* With --cm: librdmacm's own context of the device (a QP an rdma_cm ID makes lives there, so
 * the domain, SRQ and CQs it uses must too). */
static struct ibv_context *cm_dev(const char *name)
{
	int n;
	struct ibv_context **l = rdma_get_devices(&n), *c = NULL;
	for (int i = 0; l && i < n; i++)
		if (!strcmp(ibv_get_device_name(l[i]->device), name))
			c = l[i];
	if (l)
		rdma_free_devices(l);
	return c;
}

/* A node's IPv4 address from its GID (::ffff:a.b.c.d on RoCEv2). */
static void gid_addr(const uint8_t *gid, struct sockaddr_in *a, int port)
{
	memset(a, 0, sizeof(*a));
	a->sin_family = AF_INET;
	a->sin_port = htons((uint16_t)port);
	memcpy(&a->sin_addr, gid + 12, 4);
}

/* The device, the node's XRC domain (the shared file), PD and CQ. */
static int open_node(struct proc *p)
{
	struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
					  .oflags = O_CREAT };
	union ibv_gid gid;
	if (!(p->ctx = use_cm ? cm_dev(devname[p->node]) : open_dev(devname[p->node]))) {
		why(p, "cannot open device %s", devname[p->node]);
		return -1;
	}
	p->xrcd_fd = open(xrcd_path[p->node], O_RDONLY | O_CREAT, 0600);
	xa.fd = p->xrcd_fd;
	p->pd = ibv_alloc_pd(p->ctx);
	if (p->xrcd_fd < 0 || !p->pd || !(p->xrcd = ibv_open_xrcd(p->ctx, &xa))) {
		why(p, "%s: ibv_open_xrcd on %s: %s", devname[p->node], xrcd_path[p->node], strerror(errno));
		return -1;
	}
	if (ibv_query_gid(p->ctx, 1, 0, &gid)) {
		why(p, "ibv_query_gid failed");
		return -1;
	}
	memcpy(p->rep.gid, gid.raw, 16);
	return 0;
}

static int to_init(struct proc *p, struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1 };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
		why(p, "modify to INIT failed");
		return -1;
	}
	return 0;
}

static void av(struct ibv_qp_attr *a, const uint8_t *dgid)
{
	a->ah_attr.is_global = 1;
	memcpy(a->ah_attr.grh.dgid.raw, dgid, 16);
	a->ah_attr.grh.sgid_index = 0;
	a->ah_attr.grh.hop_limit = 64;
	a->ah_attr.port_num = 1;
}

/* Target QP: RTR with the peer's send QP, then RTS (as rdma-core's xsrq_pingpong moves it). */
static int tgt_connect(struct proc *p, struct ibv_qp *qp, uint32_t dest, const uint8_t *dgid)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest,
				 .rq_psn = 0, .max_dest_rd_atomic = 1, .min_rnr_timer = 12 };
	av(&a, dgid);
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
		why(p, "target QP to RTR failed");
		return -1;
	}
	struct ibv_qp_attr b = { .qp_state = IBV_QPS_RTS, .timeout = 14, .sq_psn = 0 };
	if (ibv_modify_qp(qp, &b, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN)) {
		why(p, "target QP to RTS failed");
		return -1;
	}
	return 0;
}

/* Send QP: RTR and RTS toward a node's target QP. A short ACK timeout (2^12 x 4.096 us = 16.8 ms)
 * and 3 retries: the late sender of the last step gives up within ~70 ms. */
static int ini_connect(struct proc *p, struct ibv_qp *qp, uint32_t dest, const uint8_t *dgid)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest, .rq_psn = 0 };
	av(&a, dgid);
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN)) {
		why(p, "send QP to RTR failed: %s", strerror(errno));
		return -1;
	}
	struct ibv_qp_attr b = { .qp_state = IBV_QPS_RTS, .timeout = 12, .retry_cnt = 3, .rnr_retry = 7, .sq_psn = 0,
				 .max_rd_atomic = 1 };
	if (ibv_modify_qp(qp, &b, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					 IBV_QP_MAX_QP_RD_ATOMIC)) {
		why(p, "send QP to RTS failed: %s", strerror(errno));
		return -1;
	}
	return 0;
}

static void fill_msg(char *m, int round, int sn, int sr, int dn, int dr)
{
	snprintf(m, MSG, "xrc_job r%d from %d.%d to %d.%d", round, sn, sr, dn, dr);
	for (size_t i = strlen(m) + 1; i < MSG; i++)
		m[i] = (char)(round * 31 + sn * 7 + sr * 5 + dn * 3 + dr + (int)i);
}

static int post_slot(struct proc *p, int slot)
{
	struct ibv_sge sge = { .addr = (uintptr_t)p->buf + (size_t)slot * MSG, .length = MSG, .lkey = p->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = (uint64_t)slot, .sg_list = &sge, .num_sge = 1 }, *bad;
	return ibv_post_srq_recv(p->srq, &wr, &bad);
}

/* Worker setup: the SRQ (receives pre-posted) and one send QP per other node. */
static int worker_setup(struct proc *p)
{
	int peers = (nodes - 1) * procs;
	if (open_node(p))
		return -1;
	p->slots = 2 * peers + 2;
	p->cq = ibv_create_cq(p->ctx, 4 * p->slots + 16, NULL, NULL, 0);
	p->buf = calloc((size_t)p->slots * 2, MSG);
	if (!p->cq || !p->buf || !(p->mr = ibv_reg_mr(p->pd, p->buf, (size_t)p->slots * 2 * MSG, IBV_ACCESS_LOCAL_WRITE))) {
		why(p, "CQ / memory: %s", strerror(errno));
		return -1;
	}
	struct ibv_srq_init_attr_ex sa = { .comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD |
							IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD,
					   .srq_type = IBV_SRQT_XRC,
					   .xrcd = p->xrcd,
					   .cq = p->cq,
					   .pd = p->pd };
	sa.attr.max_wr = (uint32_t)p->slots;
	sa.attr.max_sge = 1;
	if (!(p->srq = ibv_create_srq_ex(p->ctx, &sa))) {
		why(p, "ibv_create_srq_ex (XRC): %s", strerror(errno));
		return -1;
	}
	if (ibv_get_srq_num(p->srq, &p->rep.srqn)) {
		why(p, "ibv_get_srq_num failed");
		return -1;
	}
	for (int s = 0; s < p->slots; s++)
		if (post_slot(p, s)) {
			why(p, "ibv_post_srq_recv failed");
			return -1;
		}
	for (int n = 0; n < nodes && !use_cm; n++) {
		if (n == p->node)
			continue;
		struct ibv_qp_init_attr_ex qa = { .qp_type = IBV_QPT_XRC_SEND, .send_cq = p->cq, .recv_cq = p->cq,
						  .comp_mask = IBV_QP_INIT_ATTR_PD, .pd = p->pd };
		qa.cap.max_send_wr = (uint32_t)procs + 2;
		qa.cap.max_send_sge = 1;
		if (!(p->ini[n] = ibv_create_qp_ex(p->ctx, &qa))) {
			why(p, "ibv_create_qp_ex (XRC_SEND): %s", strerror(errno));
			return -1;
		}
		if (to_init(p, p->ini[n]))
			return -1;
		p->rep.ini[n] = p->ini[n]->qp_num;
	}
	return 0;
}

static uint64_t g_checked;

/* One all-to-all round: a message to every process of every other node, through the one send
 * QP to that node, naming the receiver's SRQ; then every message addressed to this process,
 * checked. */
static int worker_round(struct proc *p, int round)
{
	int peers = (nodes - 1) * procs, sent = 0, got = 0, done_sends = 0;
	int have[MAXN][MAXP] = { 0 };
	char *sendbuf = p->buf + (size_t)p->slots * MSG;
	for (int n = 0; n < nodes; n++) {
		if (n == p->node)
			continue;
		for (int r = 0; r < procs; r++) {
			char *m = sendbuf + (size_t)(sent % p->slots) * MSG;
			fill_msg(m, round, p->node, p->rank, n, r);
			struct ibv_sge sge = { .addr = (uintptr_t)m, .length = MSG, .lkey = p->mr->lkey };
			struct ibv_send_wr wr = { .wr_id = 1ull << 40, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
						  .send_flags = IBV_SEND_SIGNALED },
					   *bad;
			wr.qp_type.xrc.remote_srqn = p->t.srqn[n][r];
			if (ibv_post_send(p->ini[n], &wr, &bad)) {
				why(p, "ibv_post_send to %d.%d failed", n, r);
				return -1;
			}
			sent++;
		}
	}
	time_t deadline = time(NULL) + 60;
	while ((got < peers || done_sends < sent) && time(NULL) < deadline) {
		struct ibv_wc wc[16];
		int k = ibv_poll_cq(p->cq, 16, wc);
		if (k < 0) {
			why(p, "ibv_poll_cq failed");
			return -1;
		}
		for (int i = 0; i < k; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				why(p, "round %d: %s completion: %s", round, wc[i].opcode == IBV_WC_RECV ? "receive" : "send",
				    ibv_wc_status_str(wc[i].status));
				return -1;
			}
			if (wc[i].wr_id == 1ull << 40) {
				done_sends++;
				continue;
			}
			int slot = (int)wc[i].wr_id, sn, sr, dn, dr, rr;
			char *m = p->buf + (size_t)slot * MSG, want[MSG];
			if (sscanf(m, "xrc_job r%d from %d.%d to %d.%d", &rr, &sn, &sr, &dn, &dr) != 5 || rr != round ||
			    dn != p->node || dr != p->rank || sn < 0 || sn >= nodes || sn == p->node || sr < 0 || sr >= procs ||
			    have[sn][sr]) {
				why(p, "round %d: unexpected message \"%.40s\"", round, m);
				return -1;
			}
			fill_msg(want, round, sn, sr, dn, dr);
			if (wc[i].byte_len != MSG || memcmp(m, want, MSG)) {
				why(p, "round %d: message from %d.%d corrupted", round, sn, sr);
				return -1;
			}
			have[sn][sr] = 1;
			got++;
			g_checked++;
			if (post_slot(p, slot)) {
				why(p, "ibv_post_srq_recv failed");
				return -1;
			}
		}
	}
	if (got < peers || done_sends < sent) {
		why(p, "round %d: %d of %d messages received, %d of %d sends completed in 60 s", round, got, peers, done_sends,
		    sent);
		return -1;
	}
	return 0;
}

/* The late sender: node 0 has gone, its target QPs with its XRC domain; a send to it must end
 * in IBV_WC_RETRY_EXC_ERR. */
static int worker_late(struct proc *p)
{
	char *m = p->buf + (size_t)p->slots * MSG;
	fill_msg(m, 999, p->node, p->rank, 0, 0);
	struct ibv_sge sge = { .addr = (uintptr_t)m, .length = MSG, .lkey = p->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	wr.qp_type.xrc.remote_srqn = p->t.srqn[0][0];
	if (ibv_post_send(p->ini[0], &wr, &bad)) {
		why(p, "late send: ibv_post_send failed");
		return -1;
	}
	time_t deadline = time(NULL) + 30;
	while (time(NULL) < deadline) {
		struct ibv_wc wc;
		int k = ibv_poll_cq(p->cq, 1, &wc);
		if (k < 0)
			return -1;
		if (k == 1 && wc.wr_id == 7) {
			p->rep.status = wc.status;
			return 0;
		}
	}
	why(p, "late send: no completion in 30 s");
	return -1;
}

/* --cm: the send QP to node `n` through rdma_cm, as librdmacm's XRC support makes it
 * (rdma_create_ep with IBV_QPT_XRC_SEND in RDMA_PS_IB; a synchronous ID). */
static int cm_connect(struct proc *p, int n)
{
	struct sockaddr_in src, dst;
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_IB, .ai_qp_type = IBV_QPT_XRC_SEND }, *res;
	struct rdma_cm_id *id;
	gid_addr(p->rep.gid, &src, 0);
	gid_addr(p->t.gid[n], &dst, cm_port + n);
	hints.ai_src_addr = (struct sockaddr *)&src;
	hints.ai_src_len = sizeof(src);
	hints.ai_dst_addr = (struct sockaddr *)&dst;
	hints.ai_dst_len = sizeof(dst);
	if (rdma_getaddrinfo(NULL, NULL, &hints, &res)) {
		why(p, "rdma_getaddrinfo for node %d: %s", n, strerror(errno));
		return -1;
	}
	struct ibv_qp_init_attr qa = { .send_cq = p->cq, .recv_cq = p->cq, .qp_type = IBV_QPT_XRC_SEND };
	qa.cap.max_send_wr = (uint32_t)procs + 2;
	qa.cap.max_send_sge = 1;
	int rc = rdma_create_ep(&id, res, p->pd, &qa);
	rdma_freeaddrinfo(res);
	if (rc) {
		why(p, "rdma_create_ep (XRC_SEND) for node %d: %s", n, strerror(errno));
		return -1;
	}
	if (id->verbs != p->ctx) {
		why(p, "rdma_cm chose another device for node %d", n);
		return -1;
	}
	/* A short ACK timeout, as ini_connect's (the late sender gives up within ~70 ms). */
	uint8_t t = 12;
	rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof(t));
	struct rdma_conn_param cp = { .retry_count = 3, .rnr_retry_count = 7 };
	if (rdma_connect(id, &cp)) {
		why(p, "rdma_connect to node %d: %s", n, strerror(errno));
		return -1;
	}
	p->ini[n] = id->qp;
	p->ini_id[n] = id;
	return 0;
}

/* Leaves the job: every object destroyed, the XRC domain closed last. The device answers each
 * call in order, so once the node's last ibv_close_xrcd has returned, its domain and target QPs
 * are gone (a process that just exits leaves the same to the device's cleanup, which finishes a
 * moment after the process is reaped). */
static void worker_leave(struct proc *p)
{
	for (int n = 0; n < nodes; n++) {
		if (p->ini_id[n])
			rdma_destroy_ep(p->ini_id[n]);
		else if (p->ini[n])
			ibv_destroy_qp(p->ini[n]);
	}
	if (p->srq)
		ibv_destroy_srq(p->srq);
	if (p->cq)
		ibv_destroy_cq(p->cq);
	if (p->mr)
		ibv_dereg_mr(p->mr);
	if (p->pd)
		ibv_dealloc_pd(p->pd);
	if (p->xrcd && ibv_close_xrcd(p->xrcd))
		fprintf(stderr, "xrc_job: process %d.%d: ibv_close_xrcd: %s\n", p->node, p->rank, strerror(errno));
	if (!use_cm && p->ctx)
		ibv_close_device(p->ctx);
}

static void worker(struct proc *p)
{
	int c;
	p->rep.node = p->node;
	p->rep.rank = p->rank;
	p->rep.ok = worker_setup(p) == 0;
	full_write(p->sock, &p->rep, sizeof(p->rep));
	while (full_read(p->sock, &c, sizeof(c)) == 0) {
		p->rep.why[0] = 0;
		switch (c) {
		case C_TABLE:
			full_read(p->sock, &p->t, sizeof(p->t));
			p->rep.ok = 1;
			for (int n = 0; n < nodes && p->rep.ok; n++)
				if (n != p->node)
					p->rep.ok = use_cm ? cm_connect(p, n) == 0 :
							     ini_connect(p, p->ini[n], p->t.tgt[n][p->node][p->rank], p->t.gid[n]) == 0;
			break;
		case C_ROUND: {
			int round;
			full_read(p->sock, &round, sizeof(round));
			p->rep.ok = worker_round(p, round) == 0;
			p->rep.checked = g_checked;
			break;
		}
		case C_LATE:
			p->rep.ok = worker_late(p) == 0;
			break;
		case C_EXIT:
			worker_leave(p);
			full_write(p->sock, &p->rep, sizeof(p->rep));
			_exit(0);
		default:
			_exit(1);
		}
		full_write(p->sock, &p->rep, sizeof(p->rep));
	}
	_exit(1);
}

/* The node's target-QP maker: a target QP for every send QP of the other nodes' processes. */
/* --cm: the node's listener (an XRC_RECV passive ID, as rdma_xserver -c x makes it: the kernel's
 * rdma_cm takes an XRC REQ only on a listener of that QP type); each connection request gets an
 * XRC_RECV QP in the node's shared domain and is accepted (the REP carries its number). Returns
 * once every send QP of the other nodes is connected. */
static int cm_serve(struct proc *p, struct rdma_cm_id *listen)
{
	for (int n = 0; n < (nodes - 1) * procs; n++) {
		struct rdma_cm_id *id;
		if (rdma_get_request(listen, &id)) {
			why(p, "rdma_get_request: %s", strerror(errno));
			return -1;
		}
		struct ibv_qp_init_attr_ex qa = { .qp_type = IBV_QPT_XRC_RECV, .comp_mask = IBV_QP_INIT_ATTR_XRCD,
						  .xrcd = p->xrcd };
		if (id->verbs != p->ctx || rdma_create_qp_ex(id, &qa)) {
			why(p, "rdma_create_qp_ex (XRC_RECV): %s", strerror(errno));
			return -1;
		}
		struct rdma_conn_param cp = { .retry_count = 3, .rnr_retry_count = 7 };
		if (rdma_accept(id, &cp)) {
			why(p, "rdma_accept: %s", strerror(errno));
			return -1;
		}
	}
	return 0;
}

static void maker(struct proc *p)
{
	int c;
	struct rdma_cm_id *listen = NULL;
	p->rep.node = p->node;
	p->rep.rank = -1;
	p->rep.ok = open_node(p) == 0;
	if (p->rep.ok && use_cm) {
		struct sockaddr_in a;
		struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_IB,
					       .ai_qp_type = IBV_QPT_XRC_RECV },
				     *res = NULL;
		gid_addr(p->rep.gid, &a, cm_port + p->node);
		hints.ai_src_addr = (struct sockaddr *)&a;
		hints.ai_src_len = sizeof(a);
		if (rdma_getaddrinfo(NULL, NULL, &hints, &res) || rdma_create_ep(&listen, res, NULL, NULL) ||
		    rdma_listen(listen, 64)) {
			why(p, "rdma_cm listener on port %d: %s", cm_port + p->node, strerror(errno));
			p->rep.ok = 0;
		}
		if (res)
			rdma_freeaddrinfo(res);
	}
	full_write(p->sock, &p->rep, sizeof(p->rep));
	if (full_read(p->sock, &c, sizeof(c)) || c != C_TABLE || full_read(p->sock, &p->t, sizeof(p->t)))
		_exit(1);
	if (use_cm) {
		p->rep.ok = cm_serve(p, listen) == 0;
		full_write(p->sock, &p->rep, sizeof(p->rep));
		full_read(p->sock, &c, sizeof(c));
		_exit(0);
	}
	p->rep.ok = 1;
	for (int m = 0; m < nodes && p->rep.ok; m++) {
		if (m == p->node)
			continue;
		for (int r = 0; r < procs && p->rep.ok; r++) {
			struct ibv_qp_init_attr_ex qa = { .qp_type = IBV_QPT_XRC_RECV, .comp_mask = IBV_QP_INIT_ATTR_XRCD,
							  .xrcd = p->xrcd };
			struct ibv_qp *qp = ibv_create_qp_ex(p->ctx, &qa);
			if (!qp) {
				why(p, "ibv_create_qp_ex (XRC_RECV): %s", strerror(errno));
				p->rep.ok = 0;
				break;
			}
			p->rep.ok = to_init(p, qp) == 0 && tgt_connect(p, qp, p->t.ini[m][r][p->node], p->t.gid[m]) == 0;
			p->rep.tgt[m][r] = qp->qp_num;
		}
	}
	full_write(p->sock, &p->rep, sizeof(p->rep));
	/* Wait to be told to go (or to be killed); going closes our handle on every target QP and
	 * on the domain, without destroying them. */
	full_read(p->sock, &c, sizeof(c));
	_exit(0);
}

/* ---- the launcher ---- */

struct child {
	pid_t pid;
	int fd, node, rank;
	int gone;
};

static struct child kids[MAXN * (MAXP + 1)];
static int nkids;

static int spawn(int lfd, int node, int rank)
{
	struct sockaddr_in a;
	socklen_t al = sizeof(a);
	getsockname(lfd, (struct sockaddr *)&a, &al);
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		struct proc p = { .node = node, .rank = rank };
		close(lfd);
		p.sock = socket(AF_INET, SOCK_STREAM, 0);
		if (connect(p.sock, (struct sockaddr *)&a, sizeof(a)))
			_exit(1);
		if (rank < 0)
			maker(&p);
		else
			worker(&p);
		_exit(0);
	}
	int fd = accept(lfd, NULL, NULL);
	if (fd < 0)
		return -1;
	kids[nkids++] = (struct child){ .pid = pid, .fd = fd, .node = node, .rank = rank };
	return 0;
}

static int ask(struct child *k, int cmd, const void *arg, size_t n, struct report *r)
{
	if (full_write(k->fd, &cmd, sizeof(cmd)) || (n && full_write(k->fd, arg, n)))
		return -1;
	return r ? full_read(k->fd, r, sizeof(*r)) : 0;
}

static int failf(const char *fmt, ...)
{
	va_list ap;
	printf("xrc_job: FAILED ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	for (int i = 0; i < nkids; i++)
		if (!kids[i].gone) {
			kill(kids[i].pid, SIGKILL);
			waitpid(kids[i].pid, NULL, 0);
		}
	for (int n = 0; n < nodes; n++)
		if (xrcd_path[n][0])
			unlink(xrcd_path[n]);
	return 1;
}

static void end(struct child *k, int how_kill)
{
	struct report r;
	if (how_kill)
		kill(k->pid, SIGKILL);
	else if (k->rank >= 0)
		ask(k, C_EXIT, NULL, 0, &r); /* a worker answers once it has left */
	else
		ask(k, C_EXIT, NULL, 0, NULL);
	waitpid(k->pid, NULL, 0);
	close(k->fd);
	k->gone = 1;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = { { "devices", required_argument, NULL, 'd' },
					    { "procs", required_argument, NULL, 'p' },
					    { "rounds", required_argument, NULL, 'r' },
					    { "kill", no_argument, NULL, 'k' },
					    { "cm", no_argument, NULL, 'c' },
					    { 0 } };
	char *devs = NULL;
	int ch;
	while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (ch) {
		case 'd': devs = optarg; break;
		case 'p': procs = atoi(optarg); break;
		case 'r': rounds = atoi(optarg); break;
		case 'k': kill_maker = 1; break;
		case 'c': use_cm = 1; break;
		default:
			fprintf(stderr, "usage: xrc_job [--devices D1,D2,...] [--procs P] [--rounds R] [--kill] [--cm]\n");
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (devs) {
		for (char *s = strtok(devs, ","); s && nodes < MAXN; s = strtok(NULL, ","))
			snprintf(devname[nodes++], sizeof(devname[0]), "%s", s);
	} else {
		int n;
		struct ibv_device **l = ibv_get_device_list(&n);
		for (int i = 0; l && i < n && nodes < MAXN; i++)
			snprintf(devname[nodes++], sizeof(devname[0]), "%s", ibv_get_device_name(l[i]));
		if (l)
			ibv_free_device_list(l);
	}
	if (nodes < 2 || procs < 1 || procs > MAXP || rounds < 1)
		return failf("needs 2 to %d devices (got %d) and 1 to %d processes per node", MAXN, nodes, MAXP);
	for (int n = 0; n < nodes; n++)
		snprintf(xrcd_path[n], sizeof(xrcd_path[0]), "/tmp/xrc_job-%d-%s.xrcd", (int)getpid(), devname[n]);

	cm_port = 20000 + (int)(getpid() % 2000) * 8;
	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) || listen(lfd, 64))
		return failf("launcher socket: %s", strerror(errno));

	/* Workers first (they open each node's domain), then each node's target-QP maker. */
	static struct table t;
	struct report r;
	t.nodes = nodes;
	t.procs = procs;
	for (int n = 0; n < nodes; n++)
		for (int p = -1; p < procs; p++)
			if (spawn(lfd, n, p < 0 ? -1 : p))
				return failf("fork: %s", strerror(errno));
	for (int i = 0; i < nkids; i++) {
		struct child *k = &kids[i];
		if (full_read(k->fd, &r, sizeof(r)) || !r.ok)
			return failf("process %d.%d setup: %s", k->node, k->rank, r.why);
		memcpy(t.gid[k->node], r.gid, 16);
		if (k->rank >= 0) {
			t.srqn[k->node][k->rank] = r.srqn;
			for (int n = 0; n < nodes; n++)
				t.ini[k->node][k->rank][n] = r.ini[n];
		}
	}
	if (use_cm) {
		/* The makers listen and make a target QP for each connection request; the workers
		 * connect through rdma_cm; then the makers go. */
		for (int i = 0; i < nkids; i++)
			if (kids[i].rank < 0 && ask(&kids[i], C_TABLE, &t, sizeof(t), NULL))
				return failf("node %d's maker is gone", kids[i].node);
		for (int i = 0; i < nkids; i++) {
			struct child *k = &kids[i];
			if (k->rank >= 0 && (ask(k, C_TABLE, &t, sizeof(t), &r) || !r.ok))
				return failf("process %d.%d connecting through rdma_cm: %s", k->node, k->rank, r.why);
		}
		for (int i = 0; i < nkids; i++) {
			struct child *k = &kids[i];
			if (k->rank < 0 && (full_read(k->fd, &r, sizeof(r)) || !r.ok))
				return failf("node %d's rdma_cm target QPs: %s", k->node, r.why);
		}
		for (int i = 0; i < nkids; i++)
			if (kids[i].rank < 0)
				end(&kids[i], kill_maker);
		printf("xrc_job: every node's target QPs made through rdma_cm by one process, which then %s\n",
		       kill_maker ? "was killed (SIGKILL)" : "exited");
	} else {
		/* The makers create and connect the target QPs, then go. */
		for (int i = 0; i < nkids; i++) {
			struct child *k = &kids[i];
			if (k->rank >= 0)
				continue;
			if (ask(k, C_TABLE, &t, sizeof(t), &r) || !r.ok)
				return failf("node %d's target QPs: %s", k->node, r.why);
			for (int m = 0; m < nodes; m++)
				for (int p = 0; p < procs; p++)
					t.tgt[k->node][m][p] = r.tgt[m][p];
		}
		for (int i = 0; i < nkids; i++)
			if (kids[i].rank < 0)
				end(&kids[i], kill_maker);
		printf("xrc_job: every node's target QPs made by one process, which then %s\n",
		       kill_maker ? "was killed (SIGKILL)" : "exited");
		/* The workers connect their send QPs to target QPs whose maker is gone. */
		for (int i = 0; i < nkids; i++) {
			struct child *k = &kids[i];
			if (k->gone)
				continue;
			if (ask(k, C_TABLE, &t, sizeof(t), &r) || !r.ok)
				return failf("process %d.%d connecting: %s", k->node, k->rank, r.why);
		}
	}
	uint64_t checked = 0;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int round = 0; round < rounds; round++) {
		for (int i = 0; i < nkids; i++)
			if (!kids[i].gone && ask(&kids[i], C_ROUND, &round, sizeof(round), NULL))
				return failf("process %d.%d is gone", kids[i].node, kids[i].rank);
		checked = 0;
		for (int i = 0; i < nkids; i++) {
			struct child *k = &kids[i];
			if (k->gone)
				continue;
			if (full_read(k->fd, &r, sizeof(r)) || !r.ok)
				return failf("process %d.%d, round %d: %s", k->node, k->rank, round, r.why);
			checked += r.checked;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double dt = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	uint64_t want = (uint64_t)rounds * nodes * procs * (nodes - 1) * procs;
	if (checked != want)
		return failf("%" PRIu64 " messages checked, %" PRIu64 " expected", checked, want);

	/* Node 0's processes go: with the last reference its XRC domain closes, and its target QPs
	 * with it. A send to it from another node must now fail with RETRY_EXC_ERR. */
	for (int i = 0; i < nkids; i++)
		if (kids[i].node == 0 && !kids[i].gone)
			end(&kids[i], 0);
	int late_status = -1;
	for (int i = 0; i < nkids; i++) {
		struct child *k = &kids[i];
		if (k->node == 1 && k->rank == 0) {
			if (ask(k, C_LATE, NULL, 0, &r) || !r.ok)
				return failf("late sender: %s", r.why);
			late_status = r.status;
		}
	}
	for (int i = 0; i < nkids; i++)
		if (!kids[i].gone)
			end(&kids[i], 0);
	for (int n = 0; n < nodes; n++)
		unlink(xrcd_path[n]);
	if (late_status != IBV_WC_RETRY_EXC_ERR)
		return failf("a send to node 0 after its last process left completed with %s, not %s",
			     ibv_wc_status_str((enum ibv_wc_status)late_status), ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR));
	long xrc_send = (long)nodes * procs * (nodes - 1), xrc_recv = xrc_send;
	long rc = (long)nodes * procs * (nodes - 1) * procs;
	printf("xrc_job: OK nodes %d procs %d rounds %d messages %" PRIu64 " checked in %.3f s; QPs: %ld XRC send + %ld "
	       "XRC target, RC would need %ld connections (%ld QPs); setup %s; maker %s; late sender %s\n",
	       nodes, procs, rounds, checked, dt, xrc_send, xrc_recv, rc / 2, rc, use_cm ? "rdma_cm" : "out of band",
	       kill_maker ? "killed" : "exited", ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR));
	return 0;
}
