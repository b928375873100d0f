/*
 * lnet_bulk: the bulk-transfer pattern of Lustre LNet's o2iblnd, as a plain rdma_cm + verbs
 * program (written for softrdma's examples; it uses only rdma-core's public API).
 *
 *   lnet_bulk --server [--addr A] [--port P] [--peers N]
 *   lnet_bulk --client A [--port P] [--src S] [--peers N] [--size BYTES] [--count K]
 *             [--depth D] [--verify]
 *
 * The server listens (RDMA_PS_TCP) and serves every peer that connects; with --peers N it exits
 * after N peers have come and gone, else it runs until killed. The client opens N peer
 * connections to A (from source address S, which picks the local device), and moves K transfers
 * of BYTES (default 1 MiB) over each, alternating PUT and GET.
 *
 * What it does the way o2iblnd does:
 * - per connection: rdma_resolve_addr and rdma_resolve_route with timeouts; a CQ with its own
 *   completion channel and a completion vector chosen round-robin over the device's
 *   num_comp_vectors, armed with ibv_req_notify_cq; one thread per connection sleeps on the
 *   channel (event driven, as LNet's scheduler threads);
 * - QP creation with queue-depth backoff: the send queue holds D messages' worth of work
 *   requests (each transfer is PAGES RDMA work requests plus its messages); when the device
 *   refuses the QP (too deep), D is decremented and the QP tried again;
 * - a message protocol with credits: HELLO, PUT_REQ / PUT_ACK / PUT_DONE, GET_REQ / GET_DONE,
 *   NOOP; every receive is pre-posted, each message carries the credits its sender returns, the
 *   last credit may only be spent by a message that returns credits, and a NOOP returns them when
 *   nothing else is going;
 * - bulk data: a transfer is one 4 KiB RDMA WRITE (PUT: the client writes into the server's
 *   buffer) or RDMA READ (GET: the server pulls from the client's buffer) per page, posted as one
 *   chained list with only the last one signaled;
 * - memory: a pool of buffers registered once per connection (a registration cache, the user
 *   space analogue of o2iblnd's FMR / FastReg pools). Memory windows bound per transfer would
 *   give each transfer its own rkey, but o2iblnd's pools are pre-mapped too, and a cache keeps the
 *   data path free of registration calls.
 * The client's connect carries its transfer size, depth and --verify (as o2iblnd's connection
 * request carries its parameters); --verify fills every source page with a pattern of (peer,
 * transfer, offset) and the sink checks every byte (the server for PUT and GET alike, since GET
 * pulls the client's pages).
 *
 * Output: per-connection lines, then one final line
 *   lnet_bulk: OK client peers N transfers T bytes B MB/s X transfers/s Y depth D
 *   lnet_bulk: OK server peers N puts P gets G bytes B verified V errors 0
 * and exit 0; or "lnet_bulk: FAILED <why>" and exit 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define PAGE 4096
#define RESOLVE_MS 2000
#define MAX_INFLIGHT 4

enum msg_type { HELLO = 1, PUT_REQ, PUT_ACK, PUT_DONE, GET_REQ, GET_DONE, NOOP };

static const char *msg_name(uint32_t t)
{
	static const char *n[] = { "?", "HELLO", "PUT_REQ", "PUT_ACK", "PUT_DONE", "GET_REQ", "GET_DONE", "NOOP" };
	return t <= NOOP ? n[t] : "?";
}

/* One message; every field in host order (both ends are the same program). */
struct msg {
	uint32_t type;
	uint32_t credits; /* receives the sender re-posted since its last message */
	uint64_t cookie; /* the transfer */
	uint64_t addr; /* PUT_ACK: the sink; GET_REQ: the source */
	uint32_t rkey;
	uint32_t len;
	int32_t status; /* GET_DONE: 0, or the number of bad bytes */
	uint32_t depth; /* HELLO: the sender's message queue depth (its posted receives) */
};

/* The connect's private data (o2iblnd's connection request carries its queue depth and message
 * sizes the same way): what the passive side sizes its connection by. */
struct conn_req {
	uint32_t magic;
	uint32_t depth;
	uint64_t size;
	uint32_t verify;
};
#define CONN_MAGIC 0x4c4e4554 /* "LNET" */

struct opts {
	int server;
	const char *addr, *src, *port;
	int peers;
	size_t size;
	int count, depth, verify;
};

static struct opts o = { .port = "18515", .peers = 1, .size = 1 << 20, .count = 16, .depth = 8 };

/* One connection, either side. */
struct conn {
	int idx;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	int depth; /* message queue depth after backoff */
	size_t size; /* bytes per transfer (the client's, sent in the connect's private data) */
	int verify;
	int pages; /* per transfer */
	/* messages */
	struct msg *rx, *tx;
	struct ibv_mr *rx_mr, *tx_mr;
	int tx_next;
	int credits; /* messages we may send */
	int to_return; /* receives re-posted, not yet told to the peer */
	int hello; /* the peer's HELLO arrived */
	/* bulk buffers: the registration cache */
	char *buf[MAX_INFLIGHT];
	struct ibv_mr *mr[MAX_INFLIGHT];
	int busy[MAX_INFLIGHT];
	uint64_t cookie_of[MAX_INFLIGHT];
	/* progress */
	int started, done, inflight;
	int rdma_outstanding; /* chained lists posted, last completion not yet seen */
	uint64_t puts, gets, bytes, verified, bad;
	int sends_outstanding;
	int failed;
	char why[160];
	pthread_t thread;
	int disconnected;
};

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void fail(struct conn *c, const char *fmt, ...)
{
	va_list ap;
	if (c->failed)
		return;
	c->failed = 1;
	va_start(ap, fmt);
	vsnprintf(c->why, sizeof(c->why), fmt, ap);
	va_end(ap);
}

/* The pattern byte at `off` of transfer `cookie`. */
static inline unsigned char pat(uint64_t cookie, size_t off)
{
	uint64_t x = (cookie + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(off >> 3) * 0xC2B2AE3D27D4EB4Full;
	return (unsigned char)(x >> (8 * (off & 7)));
}

static void fill(char *b, size_t n, uint64_t cookie)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (char)pat(cookie, i);
}

static uint64_t check(const char *b, size_t n, uint64_t cookie)
{
	uint64_t bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += (unsigned char)b[i] != pat(cookie, i);
	return bad;
}

static uint64_t cookie_for(int peer, int xfer)
{
	return ((uint64_t)peer << 32) | (uint32_t)xfer;
}

/* Work request IDs: the kind in the top byte. */
#define WR_RECV (1ull << 56)
#define WR_SEND (2ull << 56)
#define WR_RDMA (3ull << 56)

static int post_recv(struct conn *c, int slot)
{
	struct ibv_sge sge = { .addr = (uintptr_t)&c->rx[slot], .length = sizeof(struct msg), .lkey = c->rx_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = WR_RECV | slot, .sg_list = &sge, .num_sge = 1 }, *bad;
	return ibv_post_recv(c->id->qp, &wr, &bad);
}

/* Sends a message if a credit allows it: the last credit only for a message that returns
 * credits (o2iblnd's rule, so that credits can always flow back). Returns 0 when sent, 1 when it
 * must wait for credits, -1 on error. */
static int send_msg(struct conn *c, struct msg *m)
{
	if (c->credits == 0 || (c->credits == 1 && c->to_return == 0 && m->type != NOOP))
		return 1;
	int slot = c->tx_next++ % (2 * c->depth);
	m->credits = c->to_return;
	c->to_return = 0;
	c->tx[slot] = *m;
	struct ibv_sge sge = { .addr = (uintptr_t)&c->tx[slot], .length = sizeof(struct msg), .lkey = c->tx_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = WR_SEND | slot,
				  .sg_list = &sge,
				  .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	int rc = ibv_post_send(c->id->qp, &wr, &bad);
	if (rc) {
		fail(c, "ibv_post_send %s: %s", msg_name(m->type), strerror(rc));
		return -1;
	}
	c->credits--;
	c->sends_outstanding++;
	return 0;
}

/* Messages waiting for a credit, in order. */
struct pending {
	struct msg m[4 * MAX_INFLIGHT + 4];
	int head, n;
};

static void queue_msg(struct conn *c, struct pending *q, struct msg m)
{
	if (q->n == (int)(sizeof(q->m) / sizeof(q->m[0]))) {
		fail(c, "message queue overflow");
		return;
	}
	q->m[(q->head + q->n++) % (sizeof(q->m) / sizeof(q->m[0]))] = m;
}

static void flush_msgs(struct conn *c, struct pending *q)
{
	while (q->n && !c->failed) {
		int r = send_msg(c, &q->m[q->head]);
		if (r)
			return;
		q->head = (q->head + 1) % (sizeof(q->m) / sizeof(q->m[0]));
		q->n--;
	}
	/* Credits to give back and nothing to carry them: a NOOP. */
	if (!q->n && c->to_return >= (c->depth + 1) / 2 && c->credits > 0) {
		struct msg n = { .type = NOOP };
		send_msg(c, &n);
	}
}

/* Posts one transfer's RDMA work requests: one per page, chained, only the last signaled. */
static int post_bulk(struct conn *c, int b, enum ibv_wr_opcode op, uint64_t raddr, uint32_t rkey, size_t len)
{
	int n = (int)((len + PAGE - 1) / PAGE);
	struct ibv_sge *sge = calloc(n, sizeof(*sge));
	struct ibv_send_wr *wr = calloc(n, sizeof(*wr)), *bad;
	if (!sge || !wr) {
		free(sge);
		free(wr);
		fail(c, "out of memory");
		return -1;
	}
	for (int i = 0; i < n; i++) {
		size_t off = (size_t)i * PAGE, k = len - off < PAGE ? len - off : PAGE;
		sge[i] = (struct ibv_sge){ .addr = (uintptr_t)c->buf[b] + off, .length = (uint32_t)k, .lkey = c->mr[b]->lkey };
		wr[i] = (struct ibv_send_wr){ .wr_id = WR_RDMA | b,
					      .next = i + 1 < n ? &wr[i + 1] : NULL,
					      .sg_list = &sge[i],
					      .num_sge = 1,
					      .opcode = op,
					      .send_flags = i + 1 == n ? IBV_SEND_SIGNALED : 0 };
		wr[i].wr.rdma.remote_addr = raddr + off;
		wr[i].wr.rdma.rkey = rkey;
	}
	int rc = ibv_post_send(c->id->qp, wr, &bad);
	free(sge);
	free(wr);
	if (rc) {
		fail(c, "ibv_post_send of %d chained %s: %s", n, op == IBV_WR_RDMA_WRITE ? "WRITEs" : "READs",
		     strerror(rc));
		return -1;
	}
	c->rdma_outstanding++;
	return 0;
}

static int free_buf(struct conn *c)
{
	for (int b = 0; b < MAX_INFLIGHT; b++)
		if (c->buf[b] && !c->busy[b])
			return b;
	return -1;
}

static int buf_of(struct conn *c, uint64_t cookie)
{
	for (int b = 0; b < MAX_INFLIGHT; b++)
		if (c->busy[b] && c->cookie_of[b] == cookie)
			return b;
	return -1;
}

/* Client: starts transfers while the pool and the count allow. */
static void client_start(struct conn *c, struct pending *q)
{
	while (c->hello && c->started < o.count && !c->failed) {
		int b = free_buf(c);
		if (b < 0)
			return;
		uint64_t cookie = cookie_for(c->idx, c->started);
		c->busy[b] = 1;
		c->cookie_of[b] = cookie;
		if (c->verify)
			fill(c->buf[b], c->size, cookie);
		struct msg m = { .cookie = cookie, .len = (uint32_t)c->size };
		if (c->started % 2 == 0) {
			m.type = PUT_REQ;
		} else {
			m.type = GET_REQ;
			m.addr = (uintptr_t)c->buf[b];
			m.rkey = c->mr[b]->rkey;
		}
		c->started++;
		c->inflight++;
		queue_msg(c, q, m);
	}
}

/* One received message. */
static void on_msg(struct conn *c, struct pending *q, const struct msg *m)
{
	c->credits += m->credits;
	switch (m->type) {
	case HELLO:
		c->hello = 1;
		if ((int)m->depth < c->depth) /* the smaller queue rules both ways */
			c->credits -= c->depth - (int)m->depth;
		if (!o.server)
			client_start(c, q);
		break;
	case NOOP:
		break;
	case PUT_REQ: { /* server: a sink buffer for the client to write into */
		int b = free_buf(c);
		if (b < 0 || m->len > c->size) {
			fail(c, "PUT_REQ %#" PRIx64 ": no buffer for %u bytes", m->cookie, m->len);
			return;
		}
		c->busy[b] = 1;
		c->cookie_of[b] = m->cookie;
		struct msg a = { .type = PUT_ACK, .cookie = m->cookie, .addr = (uintptr_t)c->buf[b], .rkey = c->mr[b]->rkey, .len = m->len };
		queue_msg(c, q, a);
		break;
	}
	case PUT_ACK: { /* client: write the pages, then PUT_DONE when they completed */
		int b = buf_of(c, m->cookie);
		if (b < 0) {
			fail(c, "PUT_ACK for unknown transfer %#" PRIx64, m->cookie);
			return;
		}
		post_bulk(c, b, IBV_WR_RDMA_WRITE, m->addr, m->rkey, c->size);
		break;
	}
	case PUT_DONE: { /* server: the data is in the sink */
		int b = buf_of(c, m->cookie);
		if (b < 0) {
			fail(c, "PUT_DONE for unknown transfer %#" PRIx64, m->cookie);
			return;
		}
		if (c->verify) {
			uint64_t bad = check(c->buf[b], m->len, m->cookie);
			c->bad += bad;
			c->verified += m->len;
		}
		c->puts++;
		c->bytes += m->len;
		c->busy[b] = 0;
		break;
	}
	case GET_REQ: { /* server: pull the client's pages with RDMA READ */
		int b = free_buf(c);
		if (b < 0 || m->len > c->size) {
			fail(c, "GET_REQ %#" PRIx64 ": no buffer for %u bytes", m->cookie, m->len);
			return;
		}
		c->busy[b] = 1;
		c->cookie_of[b] = m->cookie;
		post_bulk(c, b, IBV_WR_RDMA_READ, m->addr, m->rkey, m->len);
		break;
	}
	case GET_DONE: { /* client: the server has the data */
		int b = buf_of(c, m->cookie);
		if (b < 0) {
			fail(c, "GET_DONE for unknown transfer %#" PRIx64, m->cookie);
			return;
		}
		if (m->status)
			fail(c, "GET %#" PRIx64 ": the server found %d bad bytes", m->cookie, m->status);
		c->busy[b] = 0;
		c->gets++;
		c->bytes += c->size;
		c->done++;
		c->inflight--;
		client_start(c, q);
		break;
	}
	default:
		fail(c, "unknown message type %u", m->type);
	}
}

/* One bulk list completed (its last, signaled work request). */
static void on_bulk(struct conn *c, struct pending *q, int b)
{
	c->rdma_outstanding--;
	if (!o.server) { /* PUT's writes are done: tell the server */
		struct msg m = { .type = PUT_DONE, .cookie = c->cookie_of[b], .len = (uint32_t)c->size };
		queue_msg(c, q, m);
		c->busy[b] = 0;
		c->puts++;
		c->bytes += c->size;
		c->done++;
		c->inflight--;
		client_start(c, q);
		return;
	}
	/* Server: a GET's reads are in. */
	uint64_t bad = 0;
	if (c->verify) {
		bad = check(c->buf[b], c->size, c->cookie_of[b]);
		c->bad += bad;
		c->verified += c->size;
	}
	struct msg m = { .type = GET_DONE, .cookie = c->cookie_of[b], .status = (int32_t)(bad > 0x7fffffff ? 0x7fffffff : bad) };
	queue_msg(c, q, m);
	c->gets++;
	c->bytes += c->size;
	c->busy[b] = 0;
}

/* The connection's thread: sleeps on the completion channel, polls the CQ, runs the protocol.
 * The client's ends when every transfer is done and acknowledged; the server's when the peer
 * disconnects (the QP's work requests then flush). */
static void *conn_thread(void *arg)
{
	struct conn *c = arg;
	struct pending q = { 0 };
	struct ibv_wc wc[32];

	if (!o.server) {
		struct msg h = { .type = HELLO, .depth = (uint32_t)c->depth };
		queue_msg(c, &q, h);
		flush_msgs(c, &q);
	}
	while (!c->failed) {
		if (!o.server && c->done == o.count && c->sends_outstanding == 0 && q.n == 0)
			break;
		struct ibv_cq *ev_cq;
		void *ctx;
		if (ibv_get_cq_event(c->ch, &ev_cq, &ctx)) {
			fail(c, "ibv_get_cq_event: %s", strerror(errno));
			break;
		}
		ibv_ack_cq_events(ev_cq, 1);
		if (ibv_req_notify_cq(c->cq, 0)) {
			fail(c, "ibv_req_notify_cq failed");
			break;
		}
		int n;
		while ((n = ibv_poll_cq(c->cq, 32, wc)) > 0) {
			for (int i = 0; i < n; i++) {
				uint64_t kind = wc[i].wr_id & (0xffull << 56);
				int slot = (int)(wc[i].wr_id & 0xffffffff);
				if (wc[i].status != IBV_WC_SUCCESS) {
					if (o.server && wc[i].status == IBV_WC_WR_FLUSH_ERR) {
						c->disconnected = 1;
						continue;
					}
					fail(c, "completion %s (vendor %#x) for a %s", ibv_wc_status_str(wc[i].status),
					     wc[i].vendor_err,
					     kind == WR_RECV ? "receive" : kind == WR_SEND ? "send" : "bulk list");
					break;
				}
				if (kind == WR_RECV) {
					struct msg m = c->rx[slot];
					if (post_recv(c, slot)) {
						fail(c, "ibv_post_recv failed");
						break;
					}
					c->to_return++;
					on_msg(c, &q, &m);
					if (o.server && m.type == HELLO) {
						struct msg h = { .type = HELLO, .depth = (uint32_t)c->depth };
						queue_msg(c, &q, h);
					}
				} else if (kind == WR_SEND) {
					c->sends_outstanding--;
				} else {
					on_bulk(c, &q, slot);
				}
			}
		}
		if (n < 0)
			fail(c, "ibv_poll_cq failed");
		flush_msgs(c, &q);
		if (o.server && c->disconnected)
			break;
	}
	return NULL;
}

/* Verbs resources of a connection; the QP with queue-depth backoff. */
static int setup(struct conn *c, struct rdma_cm_id *id, int depth)
{
	struct ibv_context *v = id->verbs;
	c->id = id;
	c->pages = (int)((c->size + PAGE - 1) / PAGE);
	c->pd = ibv_alloc_pd(v);
	c->ch = ibv_create_comp_channel(v);
	if (!c->pd || !c->ch) {
		fail(c, "ibv_alloc_pd / ibv_create_comp_channel: %s", strerror(errno));
		return -1;
	}
	/* o2iblnd spreads its connections' CQs over the device's completion vectors. */
	int vector = v->num_comp_vectors > 0 ? c->idx % v->num_comp_vectors : 0;
	int inflight = depth / 2 < 1 ? 1 : depth / 2 > MAX_INFLIGHT ? MAX_INFLIGHT : depth / 2;
	int cqe = depth * (c->pages + 4) + 2 * depth;
	c->cq = ibv_create_cq(v, cqe, c, c->ch, vector);
	if (!c->cq) {
		fail(c, "ibv_create_cq of %d entries: %s", cqe, strerror(errno));
		return -1;
	}
	if (ibv_req_notify_cq(c->cq, 0)) {
		fail(c, "ibv_req_notify_cq failed");
		return -1;
	}
	for (;;) {
		struct ibv_qp_init_attr a = { .send_cq = c->cq, .recv_cq = c->cq, .qp_type = IBV_QPT_RC };
		a.cap.max_send_wr = depth * (c->pages + 2);
		a.cap.max_recv_wr = depth;
		a.cap.max_send_sge = 1;
		a.cap.max_recv_sge = 1;
		if (rdma_create_qp(id, c->pd, &a) == 0)
			break;
		/* kiblnd_create_conn: a QP the device cannot make that deep is retried shallower. */
		if (depth <= 1) {
			fail(c, "rdma_create_qp at depth 1: %s", strerror(errno));
			return -1;
		}
		depth--;
	}
	c->depth = depth;
	c->credits = depth;
	c->rx = calloc(depth, sizeof(struct msg));
	c->tx = calloc(2 * depth, sizeof(struct msg));
	if (!c->rx || !c->tx)
		return -1;
	c->rx_mr = ibv_reg_mr(c->pd, c->rx, depth * sizeof(struct msg), IBV_ACCESS_LOCAL_WRITE);
	c->tx_mr = ibv_reg_mr(c->pd, c->tx, 2 * depth * sizeof(struct msg), 0);
	if (!c->rx_mr || !c->tx_mr) {
		fail(c, "ibv_reg_mr of the message buffers: %s", strerror(errno));
		return -1;
	}
	for (int b = 0; b < inflight; b++) {
		if (posix_memalign((void **)&c->buf[b], PAGE, c->size))
			return -1;
		memset(c->buf[b], 0, c->size);
		c->mr[b] = ibv_reg_mr(c->pd, c->buf[b], c->size,
				      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
		if (!c->mr[b]) {
			fail(c, "ibv_reg_mr of %zu bytes: %s", c->size, strerror(errno));
			return -1;
		}
	}
	for (int s = 0; s < depth; s++)
		if (post_recv(c, s)) {
			fail(c, "ibv_post_recv failed");
			return -1;
		}
	return 0;
}

static void teardown(struct conn *c)
{
	if (c->id && c->id->qp)
		rdma_destroy_qp(c->id);
	for (int b = 0; b < MAX_INFLIGHT; b++) {
		if (c->mr[b])
			ibv_dereg_mr(c->mr[b]);
		free(c->buf[b]);
	}
	if (c->rx_mr)
		ibv_dereg_mr(c->rx_mr);
	if (c->tx_mr)
		ibv_dereg_mr(c->tx_mr);
	free(c->rx);
	free(c->tx);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	if (c->ch)
		ibv_destroy_comp_channel(c->ch);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
}

static struct rdma_cm_event *wait_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want, const char *what)
{
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev)) {
		fprintf(stderr, "lnet_bulk: FAILED rdma_get_cm_event (%s): %s\n", what, strerror(errno));
		return NULL;
	}
	if (ev->event != want) {
		fprintf(stderr, "lnet_bulk: FAILED %s: %s (status %d), wanted %s\n", what, rdma_event_str(ev->event),
			ev->status, rdma_event_str(want));
		rdma_ack_cm_event(ev);
		return NULL;
	}
	return ev;
}

static struct addrinfo *resolve(const char *host, const char *port, int passive)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0 }, *res;
	int rc = getaddrinfo(host, port, &hints, &res);
	if (rc) {
		fprintf(stderr, "lnet_bulk: FAILED address %s: %s\n", host ? host : "*", gai_strerror(rc));
		return NULL;
	}
	return res;
}

static int run_client(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct conn *cs = calloc(o.peers, sizeof(*cs));
	struct addrinfo *dst = resolve(o.addr, o.port, 0), *src = NULL;
	if (!ch || !cs || !dst)
		return 1;
	if (o.src && !(src = resolve(o.src, "0", 0)))
		return 1;
	/* Connect every peer. */
	for (int i = 0; i < o.peers; i++) {
		struct conn *c = &cs[i];
		struct rdma_cm_id *id;
		struct rdma_cm_event *ev;
		c->idx = i;
		c->size = o.size;
		c->verify = o.verify;
		if (rdma_create_id(ch, &id, c, RDMA_PS_TCP) ||
		    rdma_resolve_addr(id, src ? src->ai_addr : NULL, dst->ai_addr, RESOLVE_MS)) {
			fprintf(stderr, "lnet_bulk: FAILED rdma_resolve_addr: %s\n", strerror(errno));
			return 1;
		}
		if (!(ev = wait_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, "resolve addr")))
			return 1;
		rdma_ack_cm_event(ev);
		if (rdma_resolve_route(id, RESOLVE_MS)) {
			fprintf(stderr, "lnet_bulk: FAILED rdma_resolve_route: %s\n", strerror(errno));
			return 1;
		}
		if (!(ev = wait_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, "resolve route")))
			return 1;
		rdma_ack_cm_event(ev);
		if (setup(c, id, o.depth)) {
			fprintf(stderr, "lnet_bulk: FAILED peer %d: %s\n", i, c->why);
			return 1;
		}
		struct conn_req r = { .magic = CONN_MAGIC, .depth = (uint32_t)c->depth, .size = o.size, .verify = (uint32_t)o.verify };
		struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7,
					     .private_data = &r, .private_data_len = sizeof(r) };
		if (rdma_connect(id, &p)) {
			fprintf(stderr, "lnet_bulk: FAILED rdma_connect: %s\n", strerror(errno));
			return 1;
		}
		if (!(ev = wait_event(ch, RDMA_CM_EVENT_ESTABLISHED, "connect")))
			return 1;
		rdma_ack_cm_event(ev);
	}
	if (o.depth != cs[0].depth)
		printf("lnet_bulk: queue depth %d refused by the device, backed off to %d\n", o.depth, cs[0].depth);
	double t0 = now_s();
	for (int i = 0; i < o.peers; i++)
		pthread_create(&cs[i].thread, NULL, conn_thread, &cs[i]);
	int failed = 0;
	uint64_t bytes = 0, xfers = 0;
	for (int i = 0; i < o.peers; i++) {
		pthread_join(cs[i].thread, NULL);
		struct conn *c = &cs[i];
		if (c->failed) {
			fprintf(stderr, "lnet_bulk: peer %d: %s\n", i, c->why);
			failed = 1;
		}
		bytes += c->bytes;
		xfers += c->puts + c->gets;
		printf("lnet_bulk: peer %d: %" PRIu64 " puts %" PRIu64 " gets %" PRIu64 " bytes depth %d\n", i, c->puts,
		       c->gets, c->bytes, c->depth);
	}
	double dt = now_s() - t0;
	for (int i = 0; i < o.peers; i++) {
		struct rdma_cm_event *ev;
		rdma_disconnect(cs[i].id);
		if ((ev = wait_event(ch, RDMA_CM_EVENT_DISCONNECTED, "disconnect")))
			rdma_ack_cm_event(ev);
		teardown(&cs[i]);
		rdma_destroy_id(cs[i].id);
	}
	rdma_destroy_event_channel(ch);
	freeaddrinfo(dst);
	if (src)
		freeaddrinfo(src);
	if (failed || xfers != (uint64_t)o.peers * o.count) {
		printf("lnet_bulk: FAILED client: %" PRIu64 " of %" PRIu64 " transfers\n", xfers, (uint64_t)o.peers * o.count);
		return 1;
	}
	printf("lnet_bulk: OK client peers %d transfers %" PRIu64 " bytes %" PRIu64 " MB/s %.1f transfers/s %.1f depth %d%s\n",
	       o.peers, xfers, bytes, bytes / dt / 1e6, xfers / dt, cs[0].depth, o.verify ? " verified" : "");
	free(cs);
	return 0;
}

static int run_server(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *listen;
	struct addrinfo *a = resolve(o.addr, o.port, 1);
	if (!ch || !a)
		return 1;
	if (rdma_create_id(ch, &listen, NULL, RDMA_PS_TCP) || rdma_bind_addr(listen, a->ai_addr) || rdma_listen(listen, 64)) {
		fprintf(stderr, "lnet_bulk: FAILED listen on %s:%s: %s\n", o.addr ? o.addr : "*", o.port, strerror(errno));
		return 1;
	}
	freeaddrinfo(a);
	printf("lnet_bulk: listening on %s port %s\n", o.addr ? o.addr : "*", o.port);
	fflush(stdout);
	int seen = 0, gone = 0, failed = 0, next = 0;
	uint64_t puts = 0, gets = 0, bytes = 0, verified = 0, bad = 0;
	while (!o.peers || gone < o.peers) {
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(ch, &ev)) {
			fprintf(stderr, "lnet_bulk: FAILED rdma_get_cm_event: %s\n", strerror(errno));
			return 1;
		}
		struct rdma_cm_id *id = ev->id;
		enum rdma_cm_event_type e = ev->event;
		if (e == RDMA_CM_EVENT_CONNECT_REQUEST) {
			struct conn *c = calloc(1, sizeof(*c));
			struct conn_req r = { 0 };
			if (ev->param.conn.private_data && ev->param.conn.private_data_len >= sizeof(r))
				memcpy(&r, ev->param.conn.private_data, sizeof(r));
			rdma_ack_cm_event(ev);
			c->idx = next++;
			id->context = c;
			if (r.magic != CONN_MAGIC || r.size == 0 || r.size > (1u << 30) || r.depth == 0 || r.depth > 4096) {
				fprintf(stderr, "lnet_bulk: peer %d: not an lnet_bulk connection request\n", c->idx);
				rdma_reject(id, NULL, 0);
				rdma_destroy_id(id);
				free(c);
				continue;
			}
			c->size = r.size;
			c->verify = (int)r.verify;
			if (setup(c, id, (int)r.depth)) {
				fprintf(stderr, "lnet_bulk: peer %d refused: %s\n", c->idx, c->why);
				rdma_reject(id, NULL, 0);
				teardown(c);
				rdma_destroy_id(id);
				free(c);
				failed = 1;
				continue;
			}
			struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7 };
			pthread_create(&c->thread, NULL, conn_thread, c);
			if (rdma_accept(id, &p)) {
				fprintf(stderr, "lnet_bulk: FAILED rdma_accept: %s\n", strerror(errno));
				return 1;
			}
			seen++;
		} else if (e == RDMA_CM_EVENT_DISCONNECTED) {
			struct conn *c = id->context;
			rdma_ack_cm_event(ev);
			rdma_disconnect(id);
			/* The QP to ERROR flushes the receives: the connection's thread sees it and ends. */
			struct ibv_qp_attr qa = { .qp_state = IBV_QPS_ERR };
			ibv_modify_qp(id->qp, &qa, IBV_QP_STATE);
			pthread_join(c->thread, NULL);
			if (c->failed) {
				fprintf(stderr, "lnet_bulk: peer %d: %s\n", c->idx, c->why);
				failed = 1;
			}
			printf("lnet_bulk: peer %d: %" PRIu64 " puts %" PRIu64 " gets %" PRIu64 " bytes, %" PRIu64 " bad\n", c->idx,
			       c->puts, c->gets, c->bytes, c->bad);
			puts += c->puts;
			gets += c->gets;
			bytes += c->bytes;
			verified += c->verified;
			bad += c->bad;
			teardown(c);
			rdma_destroy_id(id);
			free(c);
			gone++;
		} else if (e == RDMA_CM_EVENT_ESTABLISHED) {
			rdma_ack_cm_event(ev);
		} else {
			fprintf(stderr, "lnet_bulk: event %s (status %d)\n", rdma_event_str(e), ev->status);
			rdma_ack_cm_event(ev);
			if (e == RDMA_CM_EVENT_DEVICE_REMOVAL)
				return 1;
		}
	}
	rdma_destroy_id(listen);
	rdma_destroy_event_channel(ch);
	if (failed || bad) {
		printf("lnet_bulk: FAILED server peers %d puts %" PRIu64 " gets %" PRIu64 " bytes %" PRIu64 " verified %" PRIu64
		       " errors %" PRIu64 "\n",
		       seen, puts, gets, bytes, verified, bad);
		return 1;
	}
	printf("lnet_bulk: OK server peers %d puts %" PRIu64 " gets %" PRIu64 " bytes %" PRIu64 " verified %" PRIu64 " errors 0\n",
	       seen, puts, gets, bytes, verified);
	return 0;
}

static size_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	switch (*end) {
	case 'k': case 'K': v *= 1024; break;
	case 'm': case 'M': v *= 1024 * 1024; break;
	case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
	}
	return (size_t)v;
}

static void usage(void)
{
	fprintf(stderr, "usage: lnet_bulk --server [--addr A] [--port P] [--peers N]\n"
			"       lnet_bulk --client A [--port P] [--src S] [--peers N] [--size BYTES] [--count K]\n"
			"                 [--depth D] [--verify]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "server", no_argument, NULL, 'S' }, { "client", required_argument, NULL, 'c' },
		{ "addr", required_argument, NULL, 'a' }, { "port", required_argument, NULL, 'p' },
		{ "src", required_argument, NULL, 's' }, { "peers", required_argument, NULL, 'n' },
		{ "size", required_argument, NULL, 'z' }, { "count", required_argument, NULL, 'k' },
		{ "depth", required_argument, NULL, 'd' }, { "verify", no_argument, NULL, 'v' },
		{ 0 },
	};
	int ch, client = 0, peers_given = 0;
	while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (ch) {
		case 'S': o.server = 1; break;
		case 'c': client = 1; o.addr = optarg; break;
		case 'a': o.addr = optarg; break;
		case 'p': o.port = optarg; break;
		case 's': o.src = optarg; break;
		case 'n': o.peers = atoi(optarg); peers_given = 1; break;
		case 'z': o.size = parse_size(optarg); break;
		case 'k': o.count = atoi(optarg); break;
		case 'd': o.depth = atoi(optarg); break;
		case 'v': o.verify = 1; break;
		default: usage();
		}
	}
	if (o.server == client || o.size == 0 || o.size > (1u << 30) || o.count < 1 || o.depth < 1 || o.peers < 0 ||
	    (client && o.peers < 1))
		usage();
	if (o.server && !peers_given)
		o.peers = 0; /* serve until killed */

	setvbuf(stdout, NULL, _IOLBF, 0);
	return o.server ? run_server() : run_client();
}
