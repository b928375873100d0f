/*
 * signal_post: verbs calls interrupted by a signal handler that is not async-signal-safe.
 *
 * perftest's duration mode (-D) ends its measurement from a SIGALRM handler that calls stdio,
 * which allocates; if the alarm lands while libibverbs is inside malloc or free (a post or a
 * poll that allocates), the handler's malloc waits forever on the lock the interrupted call
 * holds. A NIC's provider does not allocate on that path, so programs get away with it there.
 * This program makes the rare case frequent: a thread of its own sends SIGALRM to the main
 * thread over and over, and the handler allocates and frees, while the main thread sends 64-byte
 * messages between two RC QPs of one device and polls for their completions, until it has sent
 * --messages (default 1000) and handled --signals (default 20000). It ends, or it hangs (run it
 * under timeout).
 *
 * The signals are paced by progress, not by the clock: the next one is sent only once the
 * handler has run for the last one, and the main thread has run on for 0 to --max-gap
 * microseconds (default 20, random). An interval timer at a fixed rate (the first version of this program, every 10 us)
 * starves the main thread on a slow or loaded machine, where delivering a signal costs about as
 * long as the interval: the program then never gets past its first call, deadlock or not.
 *
 *   signal_post [--device D] [--messages N] [--signals N] [--max-gap US]
 *
 * Build: cc signal_post.c -libverbs -lpthread (scripts/build-examples.sh). Output: "signal_post:
 * OK iterations N signals M" and exit 0, or "signal_post: FAILED <why>" and exit 1.
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#define MSG 64

static volatile sig_atomic_t signals;
static volatile int done;
static pthread_t main_thread;
static long max_gap_us = 20;

static void fail(const char *fmt, ...)
{
	va_list ap;

	printf("signal_post: FAILED ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	exit(1);
}

/* Not async-signal-safe on purpose: what perftest's alarm handler does through stdio. */
static void on_alarm(int sig)
{
	void *p = malloc(48 + (signals & 63));

	(void)sig;
	if (p)
		memset(p, 1, 8);
	free(p);
	signals++;
}

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* The signal source: one SIGALRM to the main thread, wait until its handler has run, let the
 * main thread run for a random 0..max_gap_us (yielding the CPU, so the device's daemon runs too
 * on a machine with few cores), again, until the main thread is done. */
static void *storm(void *arg)
{
	unsigned int seed = 12345;

	(void)arg;
	while (!done) {
		sig_atomic_t before = signals;

		pthread_kill(main_thread, SIGALRM);
		while (signals == before && !done)
			sched_yield();
		double until = now() + (max_gap_us > 0 ? (double)(rand_r(&seed) % (unsigned int)(max_gap_us + 1)) : 0) / 1e6;
		while (now() < until && !done)
			sched_yield();
	}
	return NULL;
}

static void to_rts(struct ibv_qp *qp, uint32_t dqpn, union ibv_gid *gid)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		fail("modify to INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dqpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		fail("modify to RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				  IBV_QP_MAX_QP_RD_ATOMIC))
		fail("modify to RTS");
}

/* Polls `cq` until one completion; fails on an error completion. */
static void one(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	/* A hang detector, not a speed bound: a completion between two QPs of one device that takes
	 * a minute is lost. */
	double until = now() + 60;
	int n;

	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		if (now() > until)
			fail("no %s completion within 60 s", what);
	if (n < 0)
		fail("ibv_poll_cq: %d", n);
	if (wc.status != IBV_WC_SUCCESS)
		fail("%s completion: %s", what, ibv_wc_status_str(wc.status));
}

int main(int argc, char **argv)
{
	const char *want = NULL;
	long messages = 1000, min_signals = 20000;
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	int i, n;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--device") && i + 1 < argc)
			want = argv[++i];
		else if (!strcmp(argv[i], "--messages") && i + 1 < argc)
			messages = atol(argv[++i]);
		else if (!strcmp(argv[i], "--signals") && i + 1 < argc)
			min_signals = atol(argv[++i]);
		else if (!strcmp(argv[i], "--max-gap") && i + 1 < argc)
			max_gap_us = atol(argv[++i]);
		else
			fail("usage: signal_post [--device D] [--messages N] [--signals N] [--max-gap US]");
	}
	list = ibv_get_device_list(&n);
	if (!list)
		fail("ibv_get_device_list");
	for (i = 0; i < n && !ctx; i++)
		if (!want || !strcmp(ibv_get_device_name(list[i]), want))
			ctx = ibv_open_device(list[i]);
	if (!ctx)
		fail("no device %s", want ? want : "at all");
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 0, &gid))
		fail("ibv_query_gid");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *scq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_cq *rcq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	char *buf = calloc(1, 2 * MSG);
	if (!pd || !scq || !rcq || !buf)
		fail("pd/cq");
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 2 * MSG, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		fail("ibv_reg_mr");
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = scq;
	ia.recv_cq = rcq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 4;
	ia.cap.max_recv_wr = 4;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	struct ibv_qp *a = ibv_create_qp(pd, &ia);
	struct ibv_qp *b = ibv_create_qp(pd, &ia);
	if (!a || !b)
		fail("ibv_create_qp");
	to_rts(a, b->qp_num, &gid);
	to_rts(b, a->qp_num, &gid);

	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGALRM, &sa, NULL);
	/* The storm thread itself never takes the signal. */
	sigset_t alrm, old;
	sigemptyset(&alrm);
	sigaddset(&alrm, SIGALRM);
	pthread_sigmask(SIG_BLOCK, &alrm, &old);
	main_thread = pthread_self();
	pthread_t storm_thread;
	if (pthread_create(&storm_thread, NULL, storm, NULL))
		fail("pthread_create");
	pthread_sigmask(SIG_SETMASK, &old, NULL);

	struct ibv_sge ss = { (uintptr_t)buf, MSG, mr->lkey }, rs = { (uintptr_t)buf + MSG, MSG, mr->lkey };
	long iters = 0;
	while (iters < messages || signals < min_signals) {
		struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &rs, .num_sge = 1 }, *rbad;
		struct ibv_send_wr swr = { .wr_id = 1, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
					   .send_flags = IBV_SEND_SIGNALED },
				   *sbad;

		buf[0] = (char)iters;
		if (ibv_post_recv(b, &rwr, &rbad))
			fail("ibv_post_recv");
		if (ibv_post_send(a, &swr, &sbad))
			fail("ibv_post_send");
		one(scq, "send");
		one(rcq, "receive");
		if (buf[MSG] != (char)iters)
			fail("message %ld arrived as %d", iters, buf[MSG]);
		iters++;
	}
	done = 1;
	pthread_join(storm_thread, NULL);
	if (signals == 0)
		fail("no signal was handled in %ld messages", iters);
	printf("signal_post: OK iterations %ld signals %ld\n", iters, (long)signals);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(scq);
	ibv_destroy_cq(rcq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
