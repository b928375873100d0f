/*
 * cm_sequence.c: the rdma_cm connection sequence of a test driver that runs many tests over one
 * control connection (qperf -cm1 does this), without qperf.
 *
 *   cm_sequence ADDR TESTS [--listen-first]
 *
 * Forks a server and a client, joined by a socket pair (the control connection). For each test:
 *  - both sides create an event channel and an ID they never use again (qperf's cm_init runs
 *    twice on the client; the server's listening ID is replaced by the connection's);
 *  - the server binds the wildcard address on port 0 (an ephemeral port), sends the port over
 *    the control connection, and only then listens (qperf 0.4.11's order; with --listen-first,
 *    the other way round), a few milliseconds later: the client resolves ADDR:port, creates its
 *    QP and connects at once, so its REQ finds no listener yet. The kernel's listen is one
 *    system call and wins that race in practice; a device must give the late listener the REQ
 *    rather than reject it. The server accepts on the ID of the CONNECT_REQUEST;
 *  - one SEND each way checks the connection;
 *  - the client disconnects, both wait for DISCONNECTED, destroy the QP and the connection's ID,
 *    and destroy the event channel with the other IDs still on it (the kernel's ucma destroys
 *    them with the channel's file; a listener left behind must not take the next test's
 *    connection, and the devices must stay usable).
 * Prints "cm_sequence: N tests passed" and exits 0, or names the test and step that failed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

static int test_no;

#define FAIL(...)                                                                          \
	do {                                                                               \
		fprintf(stderr, "cm_sequence: %s test %d: ", side, test_no);                 \
		fprintf(stderr, __VA_ARGS__);                                              \
		fprintf(stderr, "\n");                                                     \
		exit(1);                                                                   \
	} while (0)

static const char *side = "?";
static int listen_first;

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;

	if (rdma_get_cm_event(ch, &ev))
		FAIL("rdma_get_cm_event: %s", strerror(errno));
	if (ev->event != want)
		FAIL("got %s (status %d), expected %s", rdma_event_str(ev->event), ev->status,
		     rdma_event_str(want));
	return ev;
}

struct conn {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char buf[64];
};

static void make_qp(struct rdma_cm_id *id, struct conn *c)
{
	struct ibv_qp_init_attr qa = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};

	c->pd = ibv_alloc_pd(id->verbs);
	c->cq = c->pd ? ibv_create_cq(id->verbs, 8, NULL, NULL, 0) : NULL;
	if (!c->cq)
		FAIL("PD or CQ: %s", strerror(errno));
	qa.send_cq = qa.recv_cq = c->cq;
	if (rdma_create_qp(id, c->pd, &qa))
		FAIL("rdma_create_qp: %s", strerror(errno));
	c->mr = ibv_reg_mr(c->pd, c->buf, sizeof(c->buf), IBV_ACCESS_LOCAL_WRITE);
	if (!c->mr)
		FAIL("ibv_reg_mr: %s", strerror(errno));
}

static void post_recv(struct rdma_cm_id *id, struct conn *c)
{
	struct ibv_sge sge = { (uintptr_t)c->buf, sizeof(c->buf), c->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(id->qp, &wr, &bad))
		FAIL("ibv_post_recv: %s", strerror(errno));
}

static void exchange(struct rdma_cm_id *id, struct conn *c, int ctl)
{
	struct ibv_sge sge = { (uintptr_t)c->buf, 16, c->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;
	int got = 0, n;
	char token = 0;

	/* Both have their receive posted before either sends. */
	if (write(ctl, &token, 1) != 1 || read(ctl, &token, 1) != 1)
		FAIL("control connection lost");
	snprintf(c->buf, sizeof(c->buf), "test %d", test_no);
	if (ibv_post_send(id->qp, &wr, &bad))
		FAIL("ibv_post_send: %s", strerror(errno));
	for (int spins = 0; got < 2; spins++) {
		n = ibv_poll_cq(c->cq, 1, &wc);
		if (n < 0)
			FAIL("ibv_poll_cq");
		if (n == 1) {
			if (wc.status != IBV_WC_SUCCESS)
				FAIL("completion %s", ibv_wc_status_str(wc.status));
			got++;
		}
		if (spins > 200000000)
			FAIL("no completion");
	}
	/* The send completed and the peer's arrived: both may tear down after this. */
	if (write(ctl, &token, 1) != 1 || read(ctl, &token, 1) != 1)
		FAIL("control connection lost");
}

static void teardown(struct rdma_cm_id *id, struct conn *c)
{
	rdma_destroy_qp(id);
	if (rdma_destroy_id(id))
		FAIL("rdma_destroy_id: %s", strerror(errno));
	if (ibv_dereg_mr(c->mr) || ibv_destroy_cq(c->cq) || ibv_dealloc_pd(c->pd))
		FAIL("destroying MR, CQ or PD: %s", strerror(errno));
}

static void server(int ctl, int tests)
{
	side = "server";
	for (test_no = 1; test_no <= tests; test_no++) {
		struct rdma_event_channel *ch = rdma_create_event_channel();
		struct rdma_cm_id *listen_id, *id;
		struct sockaddr_in sin = { .sin_family = AF_INET };
		struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1,
					     .retry_count = 7, .rnr_retry_count = 7 };
		struct rdma_cm_event *ev;
		struct conn c;
		uint16_t port;

		if (!ch || rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP))
			FAIL("channel or ID: %s", strerror(errno));
		if (rdma_bind_addr(listen_id, (struct sockaddr *)&sin))
			FAIL("rdma_bind_addr: %s", strerror(errno));
		port = rdma_get_src_port(listen_id);
		if (listen_first && rdma_listen(listen_id, 0))
			FAIL("rdma_listen: %s", strerror(errno));
		if (write(ctl, &port, sizeof(port)) != sizeof(port))
			FAIL("control connection lost");
		if (!listen_first) {
			usleep(20000);
			if (rdma_listen(listen_id, 0))
				FAIL("rdma_listen: %s", strerror(errno));
		}
		ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
		id = ev->id;
		memset(&c, 0, sizeof(c));
		make_qp(id, &c);
		post_recv(id, &c);
		if (rdma_accept(id, &p))
			FAIL("rdma_accept: %s", strerror(errno));
		rdma_ack_cm_event(ev);
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
		exchange(id, &c, ctl);
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
		teardown(id, &c);
		/* listen_id stays on the channel, as qperf leaves it. */
		rdma_destroy_event_channel(ch);
	}
}

static void client(int ctl, const char *addr, int tests)
{
	side = "client";
	for (test_no = 1; test_no <= tests; test_no++) {
		struct rdma_event_channel *unused_ch = rdma_create_event_channel(), *ch;
		struct rdma_cm_id *unused, *id;
		struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1,
					     .retry_count = 7, .rnr_retry_count = 7 };
		struct sockaddr_in sin = { .sin_family = AF_INET };
		struct conn c;
		uint16_t port;

		if (!unused_ch || rdma_create_id(unused_ch, &unused, NULL, RDMA_PS_TCP))
			FAIL("channel or ID: %s", strerror(errno));
		if (read(ctl, &port, sizeof(port)) != sizeof(port))
			FAIL("control connection lost (the server failed)");
		ch = rdma_create_event_channel();
		if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
			FAIL("channel or ID: %s", strerror(errno));
		sin.sin_port = port;
		if (inet_pton(AF_INET, addr, &sin.sin_addr) != 1)
			FAIL("bad address %s", addr);
		if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, 2000))
			FAIL("rdma_resolve_addr: %s", strerror(errno));
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
		if (rdma_resolve_route(id, 2000))
			FAIL("rdma_resolve_route: %s", strerror(errno));
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
		memset(&c, 0, sizeof(c));
		make_qp(id, &c);
		post_recv(id, &c);
		if (rdma_connect(id, &p))
			FAIL("rdma_connect: %s", strerror(errno));
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
		exchange(id, &c, ctl);
		if (rdma_disconnect(id))
			FAIL("rdma_disconnect: %s", strerror(errno));
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
		teardown(id, &c);
		rdma_destroy_event_channel(ch);
		/* The unused ID stays on its channel, as qperf's first cm_init leaves it. */
		rdma_destroy_event_channel(unused_ch);
	}
}

int main(int argc, char **argv)
{
	int sv[2], st, tests;
	pid_t pid;

	if (argc < 3 || argc > 4 || (tests = atoi(argv[2])) <= 0 ||
	    (argc == 4 && strcmp(argv[3], "--listen-first"))) {
		fprintf(stderr, "usage: cm_sequence ADDR TESTS [--listen-first]\n");
		return 2;
	}
	listen_first = argc == 4;
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return perror("socketpair"), 1;
	/* Fork before either side touches a device: each process has its own verbs state. */
	pid = fork();
	if (pid < 0)
		return perror("fork"), 1;
	if (pid == 0) {
		close(sv[0]);
		server(sv[1], tests);
		return 0;
	}
	close(sv[1]);
	client(sv[0], argv[1], tests);
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "cm_sequence: the server failed\n");
		return 1;
	}
	printf("cm_sequence: %d tests passed\n", tests);
	return 0;
}
