/*
 * cleanup_after.c: a program cleans up after a failure, as on the kernel, where destroying
 * objects after a QP error, a transport error or even a device removal succeeds (uverbs
 * disassociates the objects and returns 0): a CI job must be able to free what it made.
 *
 *   cleanup_after DEVICE CASE
 *
 * CASE is one of
 *   qp-error        the QP is moved to the error state
 *   retry-exceeded  a SEND to a QP number nobody has ends in IBV_WC_RETRY_EXC_ERR
 *   peer-vanished   a SEND to a peer process killed after connecting ends in an error
 *   device-gone     the device goes away while the objects live (the program prints "ready"
 *                   and waits for a line on stdin; the caller stops the device meanwhile)
 * Then it destroys, checking each returns 0: the QP, the CQ, the MR, the PD, the completion
 * channel, an rdma_cm ID bound to the device's address, the device context. Prints
 * "cleanup_after: CASE: OK ..." and exits 0, or names the call that failed and exits 1.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static const char *test_case;

static void fail(const char *what, int err)
{
	fprintf(stderr, "cleanup_after: %s: %s failed: %s\n", test_case, what, strerror(err));
	exit(1);
}

struct res {
	struct ibv_context *ctx;
	struct ibv_comp_channel *ch;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct ibv_qp *qp;
	union ibv_gid gid;
	char buf[4096];
};

static struct ibv_context *open_dev(const char *name)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = NULL;

	for (int i = 0; list && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			ctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	if (!ctx)
		fail("ibv_open_device", errno ? errno : ENODEV);
	return ctx;
}

static void make(struct res *r, const char *dev)
{
	struct ibv_qp_init_attr qa = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };

	r->ctx = open_dev(dev);
	if (!(r->ch = ibv_create_comp_channel(r->ctx)))
		fail("ibv_create_comp_channel", errno);
	if (!(r->pd = ibv_alloc_pd(r->ctx)))
		fail("ibv_alloc_pd", errno);
	if (!(r->cq = ibv_create_cq(r->ctx, 8, NULL, r->ch, 0)))
		fail("ibv_create_cq", errno);
	if (!(r->mr = ibv_reg_mr(r->pd, r->buf, sizeof(r->buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)))
		fail("ibv_reg_mr", errno);
	qa.send_cq = qa.recv_cq = r->cq;
	if (!(r->qp = ibv_create_qp(r->pd, &qa)))
		fail("ibv_create_qp", errno);
	if (ibv_modify_qp(r->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		fail("modify to INIT", errno);
	if (ibv_query_gid(r->ctx, 1, 0, &r->gid))
		fail("ibv_query_gid", errno);
}

/* RTR and RTS towards (gid, qpn), with the shortest timeout and one retry. */
static void connect_to(struct res *r, union ibv_gid gid, uint32_t qpn)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = qpn, .rq_psn = 0,
		.max_dest_rd_atomic = 1, .min_rnr_timer = 1,
		.ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 64 } },
	};

	if (ibv_modify_qp(r->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		fail("modify to RTR", errno);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 8; /* 1 ms */
	a.retry_cnt = 1;
	a.rnr_retry = 1;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(r->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		fail("modify to RTS", errno);
}

/* A signaled SEND; its completion's status (waits up to 10 s). */
static enum ibv_wc_status send_and_wait(struct res *r)
{
	struct ibv_sge sge = { (uintptr_t)r->buf, 64, r->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;

	if (ibv_post_send(r->qp, &wr, &bad))
		fail("ibv_post_send", errno);
	for (int i = 0; i < 10000; i++) {
		int n = ibv_poll_cq(r->cq, 1, &wc);

		if (n < 0)
			fail("ibv_poll_cq", EIO);
		if (n == 1)
			return wc.status;
		usleep(1000);
	}
	fprintf(stderr, "cleanup_after: %s: the SEND never completed\n", test_case);
	exit(1);
}

int main(int argc, char **argv)
{
	struct res r;
	struct rdma_event_channel *cm_ch;
	struct rdma_cm_id *cm_id;
	struct sockaddr_in6 sin6 = { .sin6_family = AF_INET6 };
	const char *detail = "";
	char line[16];

	if (argc != 3) {
		fprintf(stderr, "usage: cleanup_after DEVICE qp-error|retry-exceeded|peer-vanished|device-gone\n");
		return 2;
	}
	test_case = argv[2];
	memset(&r, 0, sizeof(r));
	make(&r, argv[1]);
	/* An rdma_cm ID bound to the device's address (its GID is ::ffff:a.b.c.d or the IPv6 one). */
	if (!(cm_ch = rdma_create_event_channel()) || rdma_create_id(cm_ch, &cm_id, NULL, RDMA_PS_TCP))
		fail("rdma_create_id", errno);
	memcpy(&sin6.sin6_addr, r.gid.raw, 16);
	if (IN6_IS_ADDR_V4MAPPED(&sin6.sin6_addr)) {
		struct sockaddr_in sin = { .sin_family = AF_INET };

		memcpy(&sin.sin_addr, r.gid.raw + 12, 4);
		if (rdma_bind_addr(cm_id, (struct sockaddr *)&sin))
			fail("rdma_bind_addr", errno);
	} else if (rdma_bind_addr(cm_id, (struct sockaddr *)&sin6)) {
		fail("rdma_bind_addr", errno);
	}

	if (!strcmp(test_case, "qp-error")) {
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

		if (ibv_modify_qp(r.qp, &a, IBV_QP_STATE))
			fail("modify to ERR", errno);
		detail = "QP in the error state";
	} else if (!strcmp(test_case, "retry-exceeded")) {
		enum ibv_wc_status st;

		connect_to(&r, r.gid, 0xfffff0); /* a QP number nobody has */
		st = send_and_wait(&r);
		if (st != IBV_WC_RETRY_EXC_ERR) {
			fprintf(stderr, "cleanup_after: %s: the SEND ended %s\n", test_case, ibv_wc_status_str(st));
			return 1;
		}
		detail = "after IBV_WC_RETRY_EXC_ERR";
	} else if (!strcmp(test_case, "peer-vanished")) {
		int p[2];
		uint32_t qpn;
		pid_t pid;
		enum ibv_wc_status st;

		if (pipe(p))
			fail("pipe", errno);
		pid = fork();
		if (pid == 0) {
			/* The peer: a QP of its own, connected back, then it waits to be killed. */
			struct res peer;

			memset(&peer, 0, sizeof(peer));
			make(&peer, argv[1]);
			connect_to(&peer, r.gid, r.qp->qp_num);
			qpn = peer.qp->qp_num;
			if (write(p[1], &qpn, sizeof(qpn)) != sizeof(qpn))
				_exit(1);
			pause();
			_exit(0);
		}
		if (read(p[0], &qpn, sizeof(qpn)) != sizeof(qpn))
			fail("the peer", EIO);
		connect_to(&r, r.gid, qpn);
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		st = send_and_wait(&r);
		if (st == IBV_WC_SUCCESS) {
			fprintf(stderr, "cleanup_after: %s: a SEND to a killed peer succeeded\n", test_case);
			return 1;
		}
		detail = ibv_wc_status_str(st);
	} else if (!strcmp(test_case, "device-gone")) {
		printf("ready\n");
		fflush(stdout);
		if (!fgets(line, sizeof(line), stdin))
			fail("reading stdin", EIO);
		detail = "after the device went away";
	} else {
		fprintf(stderr, "cleanup_after: unknown case %s\n", test_case);
		return 2;
	}

	if (ibv_destroy_qp(r.qp))
		fail("ibv_destroy_qp", errno);
	if (ibv_destroy_cq(r.cq))
		fail("ibv_destroy_cq", errno);
	if (ibv_dereg_mr(r.mr))
		fail("ibv_dereg_mr", errno);
	if (ibv_dealloc_pd(r.pd))
		fail("ibv_dealloc_pd", errno);
	if (ibv_destroy_comp_channel(r.ch))
		fail("ibv_destroy_comp_channel", errno);
	if (rdma_destroy_id(cm_id))
		fail("rdma_destroy_id", errno);
	rdma_destroy_event_channel(cm_ch);
	if (ibv_close_device(r.ctx))
		fail("ibv_close_device", errno);
	printf("cleanup_after: %s: OK, every destroy returned 0 (%s)\n", test_case, detail);
	return 0;
}
