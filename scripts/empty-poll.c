/* The cost of an empty ibv_poll_cq: what a spinning program pays between two messages, and
 * what a message that arrives meanwhile waits for (BENCHMARKS.md, "The empty poll"). Opens the
 * first device, makes a CQ and an RC QP (INIT), and times 41 batches of 20,000 polls of the idle
 * CQ; prints the smallest and the median batch mean. Built and run by
 * scripts/bench-empty-poll.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <infiniband/verbs.h>

enum { BATCH = 20000, BATCHES = 41 };

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n == 0) {
		fprintf(stderr, "empty-poll: no RDMA device\n");
		return 2;
	}
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 256, NULL, NULL, 0) : NULL;
	if (!cq) {
		fprintf(stderr, "empty-poll: cannot open the device or make a CQ\n");
		return 2;
	}
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	if (!qp || ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
		fprintf(stderr, "empty-poll: cannot make the QP\n");
		return 2;
	}
	struct ibv_wc wc[16];
	double mean[BATCHES];
	for (int j = 0; j < BATCHES; j++) {
		double t0 = now_ns();
		for (int i = 0; i < BATCH; i++)
			if (ibv_poll_cq(cq, 16, wc) != 0) {
				fprintf(stderr, "empty-poll: the idle CQ returned something\n");
				return 1;
			}
		mean[j] = (now_ns() - t0) / BATCH;
	}
	qsort(mean, BATCHES, sizeof mean[0], cmp);
	printf("empty ibv_poll_cq: min %.0f ns median %.0f ns\n", mean[0], mean[BATCHES / 2]);
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
