/*
 * abi_check.c: the verbs ABI as a C program compiled against rdma-core's installed headers
 * sees it, run on the softrdma shim (libibverbs.so.1).
 *
 *   cc -O1 -Wall -Werror abi_check.c -o abi_check -L$SHIM -libverbs
 *   LD_LIBRARY_PATH=$SHIM ./abi_check
 *
 * It exercises the exported functions and, above all, the static inline ones of verbs.h: those
 * that reach the library through struct verbs_context (ibv_query_port as a macro,
 * ibv_query_device_ex, ibv_create_cq_ex, ibv_open_xrcd, ibv_create_srq_ex, ibv_get_srq_num,
 * ibv_create_qp_ex, ibv_open_qp, ibv_close_xrcd), through ctx->ops (ibv_post_send,
 * ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) and through the function pointers of
 * ibv_cq_ex (ibv_start_poll...) and ibv_qp_ex (ibv_wr_*). It also compares the sizes and
 * offsets of the structures the shim fills with rdma-core 44's, so header or ABI drift shows.
 *
 * Output: one line per check, "ok <name>" or "FAIL <name>: <detail>". Exit status: the number
 * of failures (at most 255).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include "check.h"

#define DEVICE_NAME "srdma0"
#define POLL_TIMEOUT_MS 10000



static void on_alarm(int sig)
{
	static const char msg[] = "FAIL watchdog: the program did not finish within 90 s (a call blocked)\n";

	(void)sig;
	if (write(1, msg, sizeof(msg) - 1) < 0) {
		/* nothing more to do */
	}
	_exit(n_failures + 1 > 255 ? 255 : n_failures + 1);
}

static long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------------------------------------ */
/* Layouts. Expected values: rdma-core 44 (Debian 12, libibverbs-dev 44.0-2, x86_64), the sizes
 * and offsets a program compiled against those headers was built with. A difference means the
 * installed headers are not the ones the shim's ABI was checked against. */

struct lay {
	const char *type;
	const char *field; /* NULL: sizeof */
	size_t got;
	size_t want;
};

#define SZ(T, w) { #T, NULL, sizeof(struct T), (w) }
#define OFF(T, f, w) { #T, #f, offsetof(struct T, f), (w) }

static const struct lay layouts[] = {
	/* rdma-core 44 */
	SZ(ibv_device, 664),
	OFF(ibv_device, node_type, 16),
	OFF(ibv_device, transport_type, 20),
	OFF(ibv_device, name, 24),
	OFF(ibv_device, dev_name, 88),
	OFF(ibv_device, dev_path, 152),
	OFF(ibv_device, ibdev_path, 408),

	SZ(ibv_context_ops, 256),
	OFF(ibv_context_ops, alloc_mw, 56),
	OFF(ibv_context_ops, bind_mw, 64),
	OFF(ibv_context_ops, dealloc_mw, 72),
	OFF(ibv_context_ops, poll_cq, 88),
	OFF(ibv_context_ops, req_notify_cq, 96),
	OFF(ibv_context_ops, post_srq_recv, 160),
	OFF(ibv_context_ops, post_send, 200),
	OFF(ibv_context_ops, post_recv, 208),

	SZ(ibv_context, 328),
	OFF(ibv_context, device, 0),
	OFF(ibv_context, ops, 8),
	OFF(ibv_context, cmd_fd, 264),
	OFF(ibv_context, async_fd, 268),
	OFF(ibv_context, num_comp_vectors, 272),
	OFF(ibv_context, abi_compat, 320),

	SZ(verbs_context, 648),
	OFF(verbs_context, query_port, 0),
	OFF(verbs_context, create_cq_ex, 200),
	OFF(verbs_context, query_device_ex, 216),
	OFF(verbs_context, open_qp, 256),
	OFF(verbs_context, create_qp_ex, 264),
	OFF(verbs_context, get_srq_num, 272),
	OFF(verbs_context, create_srq_ex, 280),
	OFF(verbs_context, open_xrcd, 288),
	OFF(verbs_context, close_xrcd, 296),
	OFF(verbs_context, sz, 312),
	OFF(verbs_context, context, 320),

	SZ(ibv_comp_channel, 16),
	OFF(ibv_comp_channel, fd, 8),
	OFF(ibv_comp_channel, refcnt, 12),

	SZ(ibv_pd, 16),
	OFF(ibv_pd, handle, 8),

	SZ(ibv_mr, 48),
	OFF(ibv_mr, pd, 8),
	OFF(ibv_mr, addr, 16),
	OFF(ibv_mr, length, 24),
	OFF(ibv_mr, handle, 32),
	OFF(ibv_mr, lkey, 36),
	OFF(ibv_mr, rkey, 40),

	SZ(ibv_cq, 128),
	OFF(ibv_cq, channel, 8),
	OFF(ibv_cq, cq_context, 16),
	OFF(ibv_cq, handle, 24),
	OFF(ibv_cq, cqe, 28),
	OFF(ibv_cq, comp_events_completed, 120),
	OFF(ibv_cq, async_events_completed, 124),

	SZ(ibv_cq_ex, 288),
	OFF(ibv_cq_ex, comp_mask, 128),
	OFF(ibv_cq_ex, status, 132),
	OFF(ibv_cq_ex, wr_id, 136),
	OFF(ibv_cq_ex, start_poll, 144),
	OFF(ibv_cq_ex, next_poll, 152),
	OFF(ibv_cq_ex, end_poll, 160),
	OFF(ibv_cq_ex, read_opcode, 168),
	OFF(ibv_cq_ex, read_byte_len, 184),
	OFF(ibv_cq_ex, read_imm_data, 192),
	OFF(ibv_cq_ex, read_qp_num, 200),
	OFF(ibv_cq_ex, read_wc_flags, 216),
	OFF(ibv_cq_ex, read_completion_wallclock_ns, 280),

	SZ(ibv_srq, 128),
	OFF(ibv_srq, pd, 16),
	OFF(ibv_srq, handle, 24),
	OFF(ibv_srq, events_completed, 120),

	SZ(ibv_xrcd, 8),

	SZ(ibv_qp, 160),
	OFF(ibv_qp, send_cq, 24),
	OFF(ibv_qp, recv_cq, 32),
	OFF(ibv_qp, srq, 40),
	OFF(ibv_qp, handle, 48),
	OFF(ibv_qp, qp_num, 52),
	OFF(ibv_qp, state, 56),
	OFF(ibv_qp, qp_type, 60),
	OFF(ibv_qp, events_completed, 152),

	SZ(ibv_qp_ex, 352),
	OFF(ibv_qp_ex, qp_base, 0),
	OFF(ibv_qp_ex, comp_mask, 160),
	OFF(ibv_qp_ex, wr_id, 168),
	OFF(ibv_qp_ex, wr_flags, 176),
	OFF(ibv_qp_ex, wr_rdma_write, 224),
	OFF(ibv_qp_ex, wr_send, 240),
	OFF(ibv_qp_ex, wr_set_sge, 304),
	OFF(ibv_qp_ex, wr_start, 320),
	OFF(ibv_qp_ex, wr_complete, 328),
	OFF(ibv_qp_ex, wr_abort, 336),
	OFF(ibv_qp_ex, wr_atomic_write, 344),

	SZ(ibv_ah, 24),
	SZ(ibv_mw, 32),
	OFF(ibv_mw, rkey, 16),
	OFF(ibv_mw, type, 24),

	SZ(ibv_sge, 16),
	SZ(ibv_send_wr, 128),
	OFF(ibv_send_wr, num_sge, 24),
	OFF(ibv_send_wr, opcode, 28),
	OFF(ibv_send_wr, send_flags, 32),
	OFF(ibv_send_wr, wr, 40),
	OFF(ibv_send_wr, qp_type, 72),
	OFF(ibv_send_wr, bind_mw, 80),
	SZ(ibv_recv_wr, 32),

	SZ(ibv_wc, 48),
	OFF(ibv_wc, wr_id, 0),
	OFF(ibv_wc, status, 8),
	OFF(ibv_wc, opcode, 12),
	OFF(ibv_wc, vendor_err, 16),
	OFF(ibv_wc, byte_len, 20),
	OFF(ibv_wc, imm_data, 24),
	OFF(ibv_wc, qp_num, 28),
	OFF(ibv_wc, src_qp, 32),
	OFF(ibv_wc, wc_flags, 36),
	OFF(ibv_wc, pkey_index, 40),
	OFF(ibv_wc, slid, 42),
	OFF(ibv_wc, sl, 44),
	OFF(ibv_wc, dlid_path_bits, 45),

	SZ(ibv_device_attr, 232),
	SZ(ibv_device_attr_ex, 400),
	SZ(ibv_port_attr, 52),
	SZ(ibv_qp_attr, 144),
	SZ(ibv_qp_init_attr, 64),
	SZ(ibv_qp_init_attr_ex, 136),
	SZ(ibv_srq_init_attr, 24),
	SZ(ibv_srq_init_attr_ex, 64),
	SZ(ibv_cq_init_attr_ex, 56),
	SZ(ibv_xrcd_init_attr, 12),
	SZ(ibv_qp_open_attr, 32),
	SZ(ibv_ah_attr, 32),
	SZ(ibv_global_route, 24),
	SZ(ibv_async_event, 16),
	SZ(ibv_gid_entry, 32),
	SZ(ibv_poll_cq_attr, 4),
};

/* One check per structure: its size and the offsets listed for it. */
static void check_layouts(void)
{
	size_t n = sizeof(layouts) / sizeof(layouts[0]);
	size_t i = 0;

	while (i < n) {
		const char *type = layouts[i].type;
		char name[96], detail[1024] = "";
		size_t len = 0, count = 0;
		int bad = 0;

		for (; i < n && strcmp(layouts[i].type, type) == 0; i++, count++) {
			const struct lay *l = &layouts[i];

			if (l->got == l->want)
				continue;
			bad++;
			if (len < sizeof(detail))
				len += snprintf(detail + len, sizeof(detail) - len, "%s%s%s%s = %zu, rdma-core 44 has %zu",
						bad > 1 ? "; " : "", l->field ? "offsetof(" : "sizeof(",
						l->field ? l->field : type, ")", l->got, l->want);
		}
		snprintf(name, sizeof(name), "layout struct %s (%zu values)", type, count);
		check(!bad, name, "%s", detail);
	}
}

/* ------------------------------------------------------------------------------------------ */

static int poll_classic(struct ibv_cq *cq, struct ibv_wc *wc)
{
	long deadline = now_ms() + POLL_TIMEOUT_MS;

	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n != 0)
			return n;
		if (now_ms() > deadline)
			return 0;
		usleep(100);
	}
}

struct exwc {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len;
	uint32_t qp_num;
};

/* Reads `want` completions with ibv_start_poll / ibv_next_poll / ibv_end_poll. Returns how many
 * were read, or -errno when start_poll/next_poll failed with something other than ENOENT. */
static int poll_ex(struct ibv_cq_ex *cq, struct exwc *out, int want)
{
	long deadline = now_ms() + POLL_TIMEOUT_MS;
	int got = 0;

	while (got < want && now_ms() <= deadline) {
		struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
		int rc = ibv_start_poll(cq, &attr);

		if (rc == ENOENT) {
			usleep(100);
			continue;
		}
		if (rc)
			return -rc;
		for (;;) {
			out[got].wr_id = cq->wr_id;
			out[got].status = cq->status;
			out[got].opcode = ibv_wc_read_opcode(cq);
			out[got].byte_len = ibv_wc_read_byte_len(cq);
			out[got].qp_num = ibv_wc_read_qp_num(cq);
			got++;
			if (got == want)
				break;
			rc = ibv_next_poll(cq);
			if (rc == ENOENT)
				break;
			if (rc) {
				ibv_end_poll(cq);
				return -rc;
			}
		}
		ibv_end_poll(cq);
	}
	return got;
}

/* RESET -> INIT -> RTR -> RTS towards remote_qpn at the GID `gid`. Returns 0 or the failing
 * step's errno, with *step naming it. */
static int connect_rc(struct ibv_qp *qp, uint32_t remote_qpn, const union ibv_gid *gid, enum ibv_mtu mtu,
		      const char **step)
{
	struct ibv_qp_attr a;
	int rc;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	*step = "INIT";
	rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc)
		return rc;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = remote_qpn;
	a.rq_psn = 0x1234;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.sgid_index = 0;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	*step = "RTR";
	rc = ibv_modify_qp(qp, &a,
			   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (rc)
		return rc;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0x1234;
	a.max_rd_atomic = 1;
	*step = "RTS";
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

static void fill_pattern(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed + i * 7 + (i >> 8));
}

static const char *gid_str(const union ibv_gid *g, char *buf, size_t len)
{
	if (!inet_ntop(AF_INET6, g->raw, buf, (socklen_t)len))
		snprintf(buf, len, "?");
	return buf;
}

/* The device's state shared by the sections. */
struct env {
	struct ibv_device **list;
	struct ibv_device *dev;
	struct ibv_context *ctx;
	struct ibv_port_attr port;
	union ibv_gid gid;
	struct ibv_device_attr dattr;
	char tmpdir[256];
};

/* ------------------------------------------------------------------------------------------ */

static int section_device(struct env *e)
{
	int num = -1;
	char gs[64];

	e->list = ibv_get_device_list(&num);
	if (!check(e->list != NULL && num >= 1, "ibv_get_device_list", "list %p num %d errno %d (%s)", (void *)e->list,
		   num, errno, strerror(errno)))
		return -1;
	for (int i = 0; i < num; i++)
		if (strcmp(ibv_get_device_name(e->list[i]), DEVICE_NAME) == 0)
			e->dev = e->list[i];
	check(e->list[num] == NULL, "ibv_get_device_list NULL-terminated", "list[%d] = %p", num, (void *)e->list[num]);
	if (!check(e->dev != NULL, "ibv_get_device_list finds " DEVICE_NAME, "%d devices, first %s", num,
		   num > 0 ? ibv_get_device_name(e->list[0]) : "-"))
		return -1;
	check(e->dev->node_type == IBV_NODE_CA && e->dev->transport_type == IBV_TRANSPORT_IB &&
		      strcmp(e->dev->name, DEVICE_NAME) == 0,
	      "ibv_device fields", "node_type %d transport_type %d name %.64s", e->dev->node_type,
	      e->dev->transport_type, e->dev->name);
	check(ibv_get_device_guid(e->dev) != 0, "ibv_get_device_guid", "guid 0");

	e->ctx = ibv_open_device(e->dev);
	if (!check(e->ctx != NULL, "ibv_open_device", "NULL, errno %d (%s)", errno, strerror(errno)))
		return -1;
	check(e->ctx->device == e->dev && e->ctx->num_comp_vectors >= 1 && e->ctx->async_fd >= 0,
	      "ibv_context fields", "device %p (want %p) num_comp_vectors %d async_fd %d", (void *)e->ctx->device,
	      (void *)e->dev, e->ctx->num_comp_vectors, e->ctx->async_fd);

	struct verbs_context *vctx = verbs_get_ctx(e->ctx);

	if (!check(vctx != NULL, "verbs_get_ctx (abi_compat == __VERBS_ABI_IS_EXTENDED)", "abi_compat = %p",
		   e->ctx->abi_compat))
		return -1;
	check(&vctx->context == e->ctx, "verbs_context.context is the ibv_context", "%p vs %p",
	      (void *)&vctx->context, (void *)e->ctx);
	check(vctx->sz >= sizeof(struct verbs_context) - offsetof(struct verbs_context, query_port),
	      "verbs_context.sz covers every op", "sz %zu < %zu", vctx->sz,
	      sizeof(struct verbs_context) - offsetof(struct verbs_context, query_port));
	printf("# verbs_context.sz = %zu, sizeof(struct verbs_context) = %zu\n", vctx->sz, sizeof(struct verbs_context));

	/* The ops the inline functions call: verbs_get_ctx_op must find each (sz and non-NULL). */
	char missing[512] = "";
	size_t ml = 0;
#define OP(op)                                                                                        \
	do {                                                                                          \
		if (!verbs_get_ctx_op(e->ctx, op) && ml < sizeof(missing))                            \
			ml += snprintf(missing + ml, sizeof(missing) - ml, " vctx->%s", #op);        \
	} while (0)
	OP(query_port);
	OP(query_device_ex);
	OP(create_cq_ex);
	OP(open_xrcd);
	OP(close_xrcd);
	OP(create_srq_ex);
	OP(get_srq_num);
	OP(create_qp_ex);
	OP(open_qp);
#undef OP
#define CTXOP(op)                                                                                     \
	do {                                                                                          \
		if (!e->ctx->ops.op && ml < sizeof(missing))                                          \
			ml += snprintf(missing + ml, sizeof(missing) - ml, " ops.%s", #op);          \
	} while (0)
	CTXOP(poll_cq);
	CTXOP(req_notify_cq);
	CTXOP(post_send);
	CTXOP(post_recv);
	CTXOP(post_srq_recv);
	CTXOP(alloc_mw);
	CTXOP(dealloc_mw);
	CTXOP(bind_mw);
#undef CTXOP
	check(ml == 0, "context ops used by the inline verbs are set", "missing:%s", missing);

	/* Port: the macro goes to vctx->query_port with sizeof(struct ibv_port_attr). */
	memset(&e->port, 0xa5, sizeof(e->port));
	int rc = ibv_query_port(e->ctx, 1, &e->port);
	check(rc == 0, "ibv_query_port (macro, vctx->query_port)", "rc %d", rc);
	check(e->port.state == IBV_PORT_ACTIVE, "port state ACTIVE", "state %d", e->port.state);
	check(e->port.link_layer == IBV_LINK_LAYER_ETHERNET, "port link_layer ETHERNET", "link_layer %u",
	      e->port.link_layer);
	check(e->port.active_mtu >= IBV_MTU_256 && e->port.active_mtu <= IBV_MTU_4096 &&
		      e->port.active_mtu <= e->port.max_mtu,
	      "port active_mtu sane", "active_mtu %d max_mtu %d", e->port.active_mtu, e->port.max_mtu);
	check(e->port.gid_tbl_len >= 1 && e->port.pkey_tbl_len >= 1 && e->port.max_msg_sz > 0,
	      "port table lengths", "gid_tbl_len %d pkey_tbl_len %u max_msg_sz %u", e->port.gid_tbl_len,
	      e->port.pkey_tbl_len, e->port.max_msg_sz);
	check(e->port.flags == 0 && e->port.port_cap_flags2 == 0, "port_attr tail filled (flags, port_cap_flags2)",
	      "flags 0x%x port_cap_flags2 0x%x (0xa5 fill left?)", e->port.flags, e->port.port_cap_flags2);
	memset(&e->port, 0, sizeof(e->port));
	ibv_query_port(e->ctx, 1, &e->port);

	{
		/* The exported (non-macro) ibv_query_port, the old ABI's entry (programs built before
		 * the macro, bindings, and the inline's fallback). struct _compat_ibv_port_attr is
		 * opaque in verbs.h; rdma-core 44 defines it in libibverbs/verbs.c as ibv_port_attr
		 * without port_cap_flags2: 48 bytes, and fills exactly that much. */
		const size_t compat_len = 48; /* rdma-core 44: sizeof(struct _compat_ibv_port_attr) */
		struct ibv_port_attr compat;
		uint8_t tail[sizeof(compat)];

		check(offsetof(struct ibv_port_attr, port_cap_flags2) == compat_len,
		      "layout _compat_ibv_port_attr is ibv_port_attr up to port_cap_flags2",
		      "offsetof(port_cap_flags2) = %zu, rdma-core 44 compat size %zu",
		      offsetof(struct ibv_port_attr, port_cap_flags2), compat_len);
		memset(&compat, 0xa5, sizeof(compat));
		rc = (ibv_query_port)(e->ctx, 1, (struct _compat_ibv_port_attr *)&compat);
		check(rc == 0 && compat.state == e->port.state && compat.active_mtu == e->port.active_mtu &&
			      compat.max_mtu == e->port.max_mtu && compat.link_layer == e->port.link_layer &&
			      compat.gid_tbl_len == e->port.gid_tbl_len,
		      "ibv_query_port exported (compat struct) fills the port attributes",
		      "rc %d state %d active_mtu %d max_mtu %d link_layer %u gid_tbl_len %d (0xa5 fill: not written)", rc,
		      compat.state, compat.active_mtu, compat.max_mtu, compat.link_layer, compat.gid_tbl_len);
		memset(tail, 0xa5, sizeof(tail));
		check(memcmp((uint8_t *)&compat + compat_len, tail, sizeof(compat) - compat_len) == 0,
		      "ibv_query_port exported writes no more than the 48-byte compat struct",
		      "bytes %zu..%zu were overwritten", compat_len, sizeof(compat));
		struct ibv_port_attr bad;
		rc = ibv_query_port(e->ctx, 2, &bad);
		check(rc != 0, "ibv_query_port port 2 fails", "rc %d", rc);
	}

	/* GIDs. */
	static const uint8_t want_gid[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1 };

	memset(&e->gid, 0, sizeof(e->gid));
	rc = ibv_query_gid(e->ctx, 1, 0, &e->gid);
	check(rc == 0 && memcmp(e->gid.raw, want_gid, 16) == 0, "ibv_query_gid index 0 is ::ffff:127.0.0.1",
	      "rc %d gid %s", rc, gid_str(&e->gid, gs, sizeof(gs)));

	struct ibv_gid_entry ge;

	memset(&ge, 0xa5, sizeof(ge));
	rc = ibv_query_gid_ex(e->ctx, 1, 0, &ge, 0);
	check(rc == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2 && ge.gid_index == 0 && ge.port_num == 1 &&
		      memcmp(ge.gid.raw, e->gid.raw, 16) == 0,
	      "ibv_query_gid_ex RoCE v2", "rc %d gid_type %u gid_index %u port_num %u gid %s", rc, ge.gid_type,
	      ge.gid_index, ge.port_num, gid_str(&ge.gid, gs, sizeof(gs)));

	struct ibv_gid_entry table[8];

	memset(table, 0, sizeof(table));
	ssize_t n = ibv_query_gid_table(e->ctx, table, 8, 0);
	check(n >= 1 && table[0].gid_type == IBV_GID_TYPE_ROCE_V2 && memcmp(table[0].gid.raw, e->gid.raw, 16) == 0,
	      "ibv_query_gid_table RoCE v2", "n %zd gid_type %u gid %s", n, table[0].gid_type,
	      gid_str(&table[0].gid, gs, sizeof(gs)));

	/* Device attributes: exported ibv_query_device and the inline ibv_query_device_ex. */
	struct ibv_device_attr_ex dx;

	memset(&e->dattr, 0, sizeof(e->dattr));
	memset(&dx, 0xa5, sizeof(dx));
	rc = ibv_query_device(e->ctx, &e->dattr);
	check(rc == 0 && e->dattr.max_qp > 0 && e->dattr.max_cqe > 0 && e->dattr.phys_port_cnt == 1,
	      "ibv_query_device", "rc %d max_qp %d max_cqe %d phys_port_cnt %u", rc, e->dattr.max_qp,
	      e->dattr.max_cqe, e->dattr.phys_port_cnt);
	check(e->dattr.vendor_id != 0x02c9, "vendor_id is not Mellanox's", "vendor_id 0x%x", e->dattr.vendor_id);
	rc = ibv_query_device_ex(e->ctx, NULL, &dx);
	check(rc == 0 && dx.orig_attr.max_qp == e->dattr.max_qp && dx.orig_attr.max_qp_wr == e->dattr.max_qp_wr &&
		      dx.orig_attr.max_sge == e->dattr.max_sge && dx.orig_attr.max_cqe == e->dattr.max_cqe &&
		      dx.orig_attr.max_srq == e->dattr.max_srq && dx.orig_attr.node_guid == e->dattr.node_guid &&
		      dx.orig_attr.vendor_id == e->dattr.vendor_id &&
		      dx.orig_attr.device_cap_flags == e->dattr.device_cap_flags,
	      "ibv_query_device_ex (vctx) agrees with ibv_query_device",
	      "rc %d max_qp %d/%d max_qp_wr %d/%d max_sge %d/%d max_cqe %d/%d", rc, dx.orig_attr.max_qp,
	      e->dattr.max_qp, dx.orig_attr.max_qp_wr, e->dattr.max_qp_wr, dx.orig_attr.max_sge, e->dattr.max_sge,
	      dx.orig_attr.max_cqe, e->dattr.max_cqe);
	check(dx.phys_port_cnt_ex == 1, "ibv_query_device_ex phys_port_cnt_ex", "%u", dx.phys_port_cnt_ex);
	check(e->dattr.device_cap_flags & IBV_DEVICE_XRC, "device_cap_flags has IBV_DEVICE_XRC", "0x%x",
	      e->dattr.device_cap_flags);
	{
		struct ibv_query_device_ex_input in = { .comp_mask = 1 };

		rc = ibv_query_device_ex(e->ctx, &in, &dx);
		check(rc == EINVAL, "ibv_query_device_ex input comp_mask EINVAL", "rc %d", rc);
	}

	/* P_Key. */
	uint16_t pkey = 0;

	rc = ibv_query_pkey(e->ctx, 1, 0, &pkey);
	check(rc == 0 && pkey == htons(0xffff), "ibv_query_pkey index 0 is 0xffff", "rc %d pkey 0x%04x (network order)",
	      rc, pkey);
	rc = ibv_get_pkey_index(e->ctx, 1, htons(0xffff));
	check(rc == 0, "ibv_get_pkey_index(0xffff)", "rc %d", rc);
	return 0;
}

/* ------------------------------------------------------------------------------------------ */

static void section_mr(struct env *e)
{
	struct ibv_pd *pd = ibv_alloc_pd(e->ctx);
	void *buf = NULL, *buf2 = NULL;
	int rc;

	if (!check(pd != NULL && pd->context == e->ctx, "ibv_alloc_pd", "pd %p errno %d", (void *)pd, errno))
		return;
	if (posix_memalign(&buf, 4096, 8192) || posix_memalign(&buf2, 4096, 8192)) {
		check(0, "posix_memalign", "out of memory");
		return;
	}

	/* Constant access without optional bits: the macro calls the exported ibv_reg_mr. */
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
							    IBV_ACCESS_REMOTE_READ);
	check(mr != NULL && mr->addr == buf && mr->length == 8192 && mr->pd == pd && mr->context == e->ctx,
	      "ibv_reg_mr (macro -> ibv_reg_mr)", "mr %p errno %d (%s) addr %p length %zu", (void *)mr, errno,
	      strerror(errno), mr ? mr->addr : NULL, mr ? mr->length : 0);

	/* IBV_ACCESS_RELAXED_ORDERING is in IBV_ACCESS_OPTIONAL_RANGE: the macro calls
	 * ibv_reg_mr_iova2(pd, addr, len, (uintptr_t)addr, access). */
	struct ibv_mr *mr2 = ibv_reg_mr(pd, buf2, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
	check(mr2 != NULL && mr2->addr == buf2 && mr2->length == 8192, "ibv_reg_mr RELAXED_ORDERING (-> ibv_reg_mr_iova2)",
	      "mr %p errno %d (%s)", (void *)mr2, errno, strerror(errno));

	/* A non-constant access value also goes to ibv_reg_mr_iova2. */
	volatile int acc = IBV_ACCESS_LOCAL_WRITE;
	struct ibv_mr *mr3 = ibv_reg_mr(pd, (char *)buf + 4096, 4096, acc);
	check(mr3 != NULL && mr3->addr == (char *)buf + 4096, "ibv_reg_mr non-constant access (-> ibv_reg_mr_iova2)",
	      "mr %p errno %d (%s)", (void *)mr3, errno, strerror(errno));

	/* Remote write without local write: IBTA 10.6.3.1 / ib_check_mr_access -> EINVAL. */
	errno = 0;
	struct ibv_mr *bad = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_REMOTE_WRITE);
	check(bad == NULL && errno == EINVAL, "ibv_reg_mr REMOTE_WRITE without LOCAL_WRITE -> EINVAL", "mr %p errno %d",
	      (void *)bad, errno);
	if (bad)
		ibv_dereg_mr(bad);

	rc = ibv_dealloc_pd(pd);
	check(rc == EBUSY, "ibv_dealloc_pd with an MR -> EBUSY", "rc %d (%s)", rc, strerror(rc));

	int r1 = mr ? ibv_dereg_mr(mr) : 0, r2 = mr2 ? ibv_dereg_mr(mr2) : 0, r3 = mr3 ? ibv_dereg_mr(mr3) : 0;

	check(r1 == 0 && r2 == 0 && r3 == 0, "ibv_dereg_mr", "rc %d %d %d", r1, r2, r3);
	if (rc != 0) {
		rc = ibv_dealloc_pd(pd);
		check(rc == 0, "ibv_dealloc_pd after the MRs are gone", "rc %d (%s)", rc, strerror(rc));
	}
	free(buf);
	free(buf2);
}

/* ------------------------------------------------------------------------------------------ */

static void section_xrc(struct env *e, struct ibv_pd *pd, struct ibv_cq *cq)
{
	char path[300], path2[300];
	int rc;

	snprintf(path, sizeof(path), "%s/xrcd", e->tmpdir);
	snprintf(path2, sizeof(path2), "%s/xrcd-fresh", e->tmpdir);
	int fd = open(path, O_CREAT | O_RDWR, 0600);
	int fd2 = open(path2, O_CREAT | O_RDWR, 0600);

	if (!check(fd >= 0 && fd2 >= 0, "xrcd files", "open %s: %s", path, strerror(errno)))
		return;

	struct ibv_xrcd_init_attr xa = {
		.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
		.fd = fd,
		.oflags = O_CREAT,
	};
	struct ibv_xrcd *xrcd = ibv_open_xrcd(e->ctx, &xa);

	if (!check(xrcd != NULL && xrcd->context == e->ctx, "ibv_open_xrcd O_CREAT (vctx->open_xrcd)",
		   "xrcd %p errno %d (%s)", (void *)xrcd, errno, strerror(errno)))
		goto out;

	/* Kernel semantics (ib_uverbs_open_xrcd): no domain for the inode and no O_CREAT -> EAGAIN. */
	struct ibv_xrcd_init_attr xa2 = {
		.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
		.fd = fd2,
		.oflags = 0,
	};
	errno = 0;
	struct ibv_xrcd *x2 = ibv_open_xrcd(e->ctx, &xa2);
	check(x2 == NULL && errno == EAGAIN, "ibv_open_xrcd without O_CREAT on a fresh file -> EAGAIN",
	      "xrcd %p errno %d (%s)", (void *)x2, errno, strerror(errno));
	if (x2)
		ibv_close_xrcd(x2);

	/* An existing domain with O_CREAT | O_EXCL -> EINVAL (kernel). */
	struct ibv_xrcd_init_attr xa3 = xa;
	xa3.oflags = O_CREAT | O_EXCL;
	errno = 0;
	struct ibv_xrcd *x3 = ibv_open_xrcd(e->ctx, &xa3);
	check(x3 == NULL && errno == EINVAL, "ibv_open_xrcd O_CREAT|O_EXCL on an existing domain -> EINVAL",
	      "xrcd %p errno %d (%s)", (void *)x3, errno, strerror(errno));
	if (x3)
		ibv_close_xrcd(x3);

	struct ibv_srq_init_attr_ex sa;

	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = 16;
	sa.attr.max_sge = 1;
	sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
	sa.srq_type = IBV_SRQT_XRC;
	sa.pd = pd;
	sa.xrcd = xrcd;
	sa.cq = cq;
	struct ibv_srq *srq = ibv_create_srq_ex(e->ctx, &sa);
	uint32_t srqn = 0;

	if (check(srq != NULL && srq->context == e->ctx, "ibv_create_srq_ex XRC (vctx->create_srq_ex)",
		  "srq %p errno %d (%s)", (void *)srq, errno, strerror(errno))) {
		rc = ibv_get_srq_num(srq, &srqn);
		check(rc == 0 && srqn != 0, "ibv_get_srq_num (vctx->get_srq_num)", "rc %d srqn %u", rc, srqn);
	}

	struct ibv_qp_init_attr_ex qa;

	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_XRC_RECV;
	qa.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	qa.xrcd = xrcd;
	struct ibv_qp *tgt = ibv_create_qp_ex(e->ctx, &qa);

	if (check(tgt != NULL && tgt->qp_num != 0 && tgt->qp_type == IBV_QPT_XRC_RECV && tgt->context == e->ctx,
		  "ibv_create_qp_ex XRC_RECV (vctx->create_qp_ex)", "qp %p errno %d (%s) qp_num %u", (void *)tgt,
		  errno, strerror(errno), tgt ? tgt->qp_num : 0)) {
		struct ibv_qp_open_attr oa = {
			.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE |
				     IBV_QP_OPEN_ATTR_CONTEXT,
			.qp_num = tgt->qp_num,
			.xrcd = xrcd,
			.qp_context = (void *)0x5eed,
			.qp_type = IBV_QPT_XRC_RECV,
		};
		struct ibv_qp *h2 = ibv_open_qp(e->ctx, &oa);

		check(h2 != NULL && h2 != tgt && h2->qp_num == tgt->qp_num && h2->qp_type == IBV_QPT_XRC_RECV &&
			      h2->qp_context == (void *)0x5eed,
		      "ibv_open_qp (vctx->open_qp) gives a second handle", "qp %p errno %d (%s) qp_num %u", (void *)h2,
		      errno, strerror(errno), h2 ? h2->qp_num : 0);
		int r2 = h2 ? ibv_destroy_qp(h2) : 0;
		int r1 = ibv_destroy_qp(tgt);

		check(r1 == 0 && r2 == 0, "ibv_destroy_qp both XRC target handles", "rc %d %d", r1, r2);
	}

	if (srq) {
		/* The kernel refuses to close a domain an XRC SRQ still uses. */
		rc = ibv_close_xrcd(xrcd);
		if (rc == 0) {
			check(0, "ibv_close_xrcd while an XRC SRQ uses it -> EBUSY", "rc 0: the domain closed");
			xrcd = NULL;
		} else {
			check(rc == EBUSY, "ibv_close_xrcd while an XRC SRQ uses it -> EBUSY", "rc %d (%s)", rc,
			      strerror(rc));
		}
		rc = ibv_destroy_srq(srq);
		check(rc == 0, "ibv_destroy_srq XRC", "rc %d (%s)", rc, strerror(rc));
	}
	if (xrcd) {
		rc = ibv_close_xrcd(xrcd);
		check(rc == 0, "ibv_close_xrcd (vctx->close_xrcd)", "rc %d (%s)", rc, strerror(rc));
	}
out:
	close(fd);
	close(fd2);
	unlink(path);
	unlink(path2);
}

/* ------------------------------------------------------------------------------------------ */

struct rc_side {
	struct ibv_qp *qp;
	struct ibv_cq *cq; /* send and receive */
};

static struct ibv_qp *make_rc(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq)
{
	struct ibv_qp_init_attr ia;

	memset(&ia, 0, sizeof(ia));
	ia.send_cq = scq;
	ia.recv_cq = rcq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 16;
	ia.cap.max_recv_wr = 16;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.qp_context = pd;
	return ibv_create_qp(pd, &ia);
}

static void section_classic(struct env *e, struct ibv_pd *pd)
{
	enum { LEN = 1000 };
	struct ibv_comp_channel *ch = ibv_create_comp_channel(e->ctx);
	struct ibv_cq *cqa = ibv_create_cq(e->ctx, 32, NULL, NULL, 0);
	struct ibv_cq *cqb = NULL;
	uint8_t *sbuf = calloc(1, 4096), *rbuf = calloc(1, 4096);
	struct ibv_mr *smr = NULL, *rmr = NULL;
	struct ibv_qp *a = NULL, *b = NULL;
	const char *step = "";
	int rc;

	check(ch != NULL && ch->fd >= 0 && ch->context == e->ctx, "ibv_create_comp_channel", "ch %p errno %d",
	      (void *)ch, errno);
	if (ch) {
		cqb = ibv_create_cq(e->ctx, 32, (void *)0xc0ffee, ch, 0);
		check(cqb != NULL && cqb->channel == ch && cqb->cq_context == (void *)0xc0ffee && cqb->cqe >= 32,
		      "ibv_create_cq with a channel", "cq %p errno %d", (void *)cqb, errno);
	}
	if (!check(cqa != NULL && cqa->context == e->ctx && cqa->cqe >= 32, "ibv_create_cq", "cq %p errno %d (%s)",
		   (void *)cqa, errno, strerror(errno)) ||
	    !cqb)
		goto out;
	smr = ibv_reg_mr(pd, sbuf, 4096, IBV_ACCESS_LOCAL_WRITE);
	rmr = ibv_reg_mr(pd, rbuf, 4096, IBV_ACCESS_LOCAL_WRITE);
	if (!check(smr && rmr, "ibv_reg_mr loopback buffers", "errno %d", errno))
		goto out;

	a = make_rc(pd, cqa, cqa);
	b = make_rc(pd, cqa, cqb);
	if (!check(a && b && a->qp_num != b->qp_num && a->state == IBV_QPS_RESET && a->qp_type == IBV_QPT_RC &&
			   a->send_cq == cqa && b->recv_cq == cqb && a->qp_context == pd,
		   "ibv_create_qp RC x2", "a %p b %p errno %d (%s)", (void *)a, (void *)b, errno, strerror(errno)))
		goto out;
	check(ibv_qp_to_qp_ex(a) == NULL, "ibv_qp_to_qp_ex of a QP made without send_ops_flags is NULL", "%p",
	      (void *)ibv_qp_to_qp_ex(a));

	/* Error paths before the QPs are connected. */
	{
		struct ibv_sge sge = { .addr = (uintptr_t)rbuf, .length = 64, .lkey = rmr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad = NULL;

		rc = ibv_post_recv(a, &rwr, &bad);
		check(rc == EINVAL && bad == &rwr, "ibv_post_recv in RESET -> EINVAL, bad_wr set", "rc %d bad %p (wr %p)",
		      rc, (void *)bad, (void *)&rwr);

		struct ibv_qp_attr at;

		memset(&at, 0, sizeof(at));
		at.qp_state = IBV_QPS_INIT;
		at.port_num = 1;
		at.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
		rc = ibv_modify_qp(a, &at, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
		check(rc == EINVAL && a->state == IBV_QPS_RESET,
		      "ibv_modify_qp RESET->INIT without IBV_QP_PKEY_INDEX -> EINVAL", "rc %d state %d", rc, a->state);

		struct ibv_qp_init_attr qi;
		memset(&at, 0, sizeof(at));
		rc = ibv_query_qp(a, &at, IBV_QP_STATE, &qi);
		check(rc == 0 && at.qp_state == IBV_QPS_RESET, "ibv_query_qp after the refused modify: RESET",
		      "rc %d state %d", rc, at.qp_state);
	}

	rc = connect_rc(a, b->qp_num, &e->gid, e->port.active_mtu, &step);
	if (!check(rc == 0 && a->state == IBV_QPS_RTS, "ibv_modify_qp RC a INIT/RTR/RTS", "step %s rc %d (%s) state %d",
		   step, rc, strerror(rc), a->state))
		goto out;
	rc = connect_rc(b, a->qp_num, &e->gid, e->port.active_mtu, &step);
	if (!check(rc == 0 && b->state == IBV_QPS_RTS, "ibv_modify_qp RC b INIT/RTR/RTS", "step %s rc %d (%s) state %d",
		   step, rc, strerror(rc), b->state))
		goto out;
	{
		struct ibv_qp_attr at;
		struct ibv_qp_init_attr qi;

		memset(&at, 0, sizeof(at));
		memset(&qi, 0, sizeof(qi));
		rc = ibv_query_qp(a, &at, IBV_QP_STATE | IBV_QP_DEST_QPN | IBV_QP_CAP, &qi);
		check(rc == 0 && at.qp_state == IBV_QPS_RTS && at.dest_qp_num == b->qp_num && at.sq_psn == 0x1234 &&
			      qi.qp_type == IBV_QPT_RC && qi.send_cq == cqa && qi.cap.max_send_sge >= 1,
		      "ibv_query_qp RTS", "rc %d state %d dest_qp_num %u sq_psn %u", rc, at.qp_state, at.dest_qp_num,
		      at.sq_psn);

		/* More SGEs than max_send_sge -> EINVAL, nothing posted. */
		uint32_t max = qi.cap.max_send_sge;
		struct ibv_sge *sg = calloc(max + 1, sizeof(*sg));
		for (uint32_t i = 0; i <= max; i++)
			sg[i] = (struct ibv_sge){ .addr = (uintptr_t)sbuf + i, .length = 1, .lkey = smr->lkey };
		struct ibv_send_wr w = { .wr_id = 2, .sg_list = sg, .num_sge = (int)max + 1, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED };
		struct ibv_send_wr *bad = NULL;

		rc = ibv_post_send(a, &w, &bad);
		check(rc == EINVAL && bad == &w, "ibv_post_send num_sge > max_send_sge -> EINVAL",
		      "rc %d bad %p (wr %p) max_send_sge %u", rc, (void *)bad, (void *)&w, max);
		free(sg);
	}

	/* The completion channel is armed before the data arrives. */
	rc = ibv_req_notify_cq(cqb, 0);
	check(rc == 0, "ibv_req_notify_cq (ops.req_notify_cq)", "rc %d (%s)", rc, strerror(rc));

	fill_pattern(sbuf, LEN, 3);
	memset(rbuf, 0, 4096);
	{
		struct ibv_sge rs = { .addr = (uintptr_t)rbuf, .length = 4096, .lkey = rmr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 0xb0b, .sg_list = &rs, .num_sge = 1 }, *rbad = NULL;

		rc = ibv_post_recv(b, &rwr, &rbad);
		check(rc == 0, "ibv_post_recv (ops.post_recv)", "rc %d (%s)", rc, strerror(rc));

		struct ibv_sge ss = { .addr = (uintptr_t)sbuf, .length = LEN, .lkey = smr->lkey };
		struct ibv_send_wr swr = { .wr_id = 0xa0a, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
					   .send_flags = IBV_SEND_SIGNALED },
				   *sbad = NULL;

		rc = ibv_post_send(a, &swr, &sbad);
		check(rc == 0, "ibv_post_send SEND (ops.post_send)", "rc %d (%s)", rc, strerror(rc));
	}

	{
		struct ibv_wc wc;

		memset(&wc, 0xa5, sizeof(wc));
		int n = poll_classic(cqa, &wc);
		check(n == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND && wc.wr_id == 0xa0a &&
			      wc.qp_num == a->qp_num,
		      "ibv_poll_cq send completion", "n %d status %d (%s) opcode %d wr_id 0x%llx qp_num %u (want %u)", n,
		      wc.status, ibv_wc_status_str(wc.status), wc.opcode, (unsigned long long)wc.wr_id, wc.qp_num,
		      a->qp_num);
	}

	{
		struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
		int pr = poll(&pfd, 1, POLL_TIMEOUT_MS);

		check(pr == 1 && (pfd.revents & POLLIN), "completion channel fd readable", "poll %d revents 0x%x", pr,
		      pfd.revents);
		if (pr == 1) {
			struct ibv_cq *ev_cq = NULL;
			void *ev_ctx = NULL;

			rc = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
			check(rc == 0 && ev_cq == cqb && ev_ctx == (void *)0xc0ffee, "ibv_get_cq_event",
			      "rc %d cq %p (want %p) cq_context %p", rc, (void *)ev_cq, (void *)cqb, ev_ctx);
			if (rc == 0 && ev_cq) {
				unsigned before = ev_cq->comp_events_completed;

				ibv_ack_cq_events(ev_cq, 1);
				check(ev_cq->comp_events_completed == before + 1, "ibv_ack_cq_events",
				      "comp_events_completed %u -> %u", before, ev_cq->comp_events_completed);
			}
		}
	}

	{
		struct ibv_wc wc;

		memset(&wc, 0xa5, sizeof(wc));
		int n = poll_classic(cqb, &wc);
		check(n == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == 0xb0b &&
			      wc.byte_len == LEN && wc.qp_num == b->qp_num && !(wc.wc_flags & IBV_WC_WITH_IMM),
		      "ibv_poll_cq receive completion",
		      "n %d status %d (%s) opcode %d wr_id 0x%llx byte_len %u qp_num %u (want %u) wc_flags 0x%x", n,
		      wc.status, ibv_wc_status_str(wc.status), wc.opcode, (unsigned long long)wc.wr_id, wc.byte_len,
		      wc.qp_num, b->qp_num, wc.wc_flags);
		size_t diff = 0;
		while (diff < LEN && rbuf[diff] == sbuf[diff])
			diff++;
		check(diff == LEN && rbuf[LEN] == 0, "RC SEND data byte-exact", "first difference at byte %zu of %d", diff,
		      LEN);
		n = ibv_poll_cq(cqb, 1, &wc);
		check(n == 0, "CQ empty afterwards", "poll returned %d", n);
	}

	rc = ibv_destroy_comp_channel(ch);
	check(rc == EBUSY, "ibv_destroy_comp_channel with a CQ on it -> EBUSY", "rc %d (%s)", rc, strerror(rc));
	if (rc == 0)
		ch = NULL;

	rc = ibv_dealloc_pd(pd);
	check(rc == EBUSY, "ibv_dealloc_pd with QPs and MRs -> EBUSY", "rc %d (%s)", rc, strerror(rc));

out:
	{
		int r[8] = { 0 };

		if (a)
			r[0] = ibv_destroy_qp(a);
		if (b)
			r[1] = ibv_destroy_qp(b);
		if (smr)
			r[2] = ibv_dereg_mr(smr);
		if (rmr)
			r[3] = ibv_dereg_mr(rmr);
		if (cqa)
			r[4] = ibv_destroy_cq(cqa);
		if (cqb)
			r[5] = ibv_destroy_cq(cqb);
		if (ch)
			r[6] = ibv_destroy_comp_channel(ch);
		check(!r[0] && !r[1] && !r[2] && !r[3] && !r[4] && !r[5] && !r[6], "classic loopback teardown",
		      "destroy_qp %d %d dereg_mr %d %d destroy_cq %d %d destroy_comp_channel %d", r[0], r[1], r[2], r[3],
		      r[4], r[5], r[6]);
	}
	free(sbuf);
	free(rbuf);
}

/* ------------------------------------------------------------------------------------------ */

static struct ibv_cq_ex *make_cq_ex(struct env *e)
{
	struct ibv_cq_init_attr_ex ca;

	memset(&ca, 0, sizeof(ca));
	ca.cqe = 64;
	ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM;
	ca.comp_vector = 0;
	ca.comp_mask = 0;
	return ibv_create_cq_ex(e->ctx, &ca);
}

static struct ibv_qp *make_rc_ex(struct env *e, struct ibv_pd *pd, struct ibv_cq_ex *cq)
{
	struct ibv_qp_init_attr_ex ia;

	memset(&ia, 0, sizeof(ia));
	ia.qp_type = IBV_QPT_RC;
	ia.send_cq = ibv_cq_ex_to_cq(cq);
	ia.recv_cq = ibv_cq_ex_to_cq(cq);
	ia.cap.max_send_wr = 16;
	ia.cap.max_recv_wr = 16;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	ia.pd = pd;
	ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	return ibv_create_qp_ex(e->ctx, &ia);
}

static void section_extended(struct env *e, struct ibv_pd *pd, struct ibv_cq_ex *cqc)
{
	enum { SLEN = 700, WLEN = 3000, WOFF = 4096 };
	struct ibv_cq_ex *cqd = make_cq_ex(e);
	uint8_t *sbuf = calloc(1, 8192), *dbuf = calloc(1, 8192);
	struct ibv_mr *smr = NULL, *dmr = NULL;
	struct ibv_qp *c = NULL, *d = NULL;
	const char *step = "";
	int rc;

	if (!check(cqd != NULL, "ibv_create_cq_ex second CQ", "errno %d (%s)", errno, strerror(errno)))
		goto out;
	smr = ibv_reg_mr(pd, sbuf, 8192, IBV_ACCESS_LOCAL_WRITE);
	dmr = ibv_reg_mr(pd, dbuf, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!check(smr && dmr, "ibv_reg_mr extended-loopback buffers", "errno %d", errno))
		goto out;

	c = make_rc_ex(e, pd, cqc);
	d = make_rc_ex(e, pd, cqd);
	if (!check(c && d && c->qp_type == IBV_QPT_RC && c->send_cq == ibv_cq_ex_to_cq(cqc) && c->pd == pd,
		   "ibv_create_qp_ex RC with SEND_OPS_FLAGS (vctx->create_qp_ex)", "c %p d %p errno %d (%s)", (void *)c,
		   (void *)d, errno, strerror(errno)))
		goto out;

	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(c);

	if (!check(qx != NULL && &qx->qp_base == c && qx->wr_start && qx->wr_complete && qx->wr_send &&
			   qx->wr_rdma_write && qx->wr_set_sge,
		   "ibv_qp_to_qp_ex", "qp_ex %p (qp %p)", (void *)qx, (void *)c))
		goto out;

	rc = connect_rc(c, d->qp_num, &e->gid, e->port.active_mtu, &step);
	if (!check(rc == 0, "ibv_modify_qp extended c INIT/RTR/RTS", "step %s rc %d (%s)", step, rc, strerror(rc)))
		goto out;
	rc = connect_rc(d, c->qp_num, &e->gid, e->port.active_mtu, &step);
	if (!check(rc == 0, "ibv_modify_qp extended d INIT/RTR/RTS", "step %s rc %d (%s)", step, rc, strerror(rc)))
		goto out;

	fill_pattern(sbuf, SLEN, 11);
	fill_pattern(sbuf + WOFF, WLEN, 99);
	memset(dbuf, 0, 8192);
	{
		struct ibv_sge rs = { .addr = (uintptr_t)dbuf, .length = 2048, .lkey = dmr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 0xd00d, .sg_list = &rs, .num_sge = 1 }, *rbad = NULL;

		rc = ibv_post_recv(d, &rwr, &rbad);
		check(rc == 0, "ibv_post_recv on the extended QP", "rc %d (%s)", rc, strerror(rc));
	}

	/* A SEND and an RDMA WRITE in one ibv_wr_start ... ibv_wr_complete batch. */
	ibv_wr_start(qx);
	qx->wr_id = 0x5151;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, smr->lkey, (uintptr_t)sbuf, SLEN);
	qx->wr_id = 0x5252;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, dmr->rkey, (uintptr_t)dbuf + WOFF);
	ibv_wr_set_sge(qx, smr->lkey, (uintptr_t)sbuf + WOFF, WLEN);
	rc = ibv_wr_complete(qx);
	check(rc == 0, "ibv_wr_start/ibv_wr_send/ibv_wr_rdma_write/ibv_wr_set_sge/ibv_wr_complete", "rc %d (%s)", rc,
	      strerror(rc));

	{
		struct exwc w[2];

		memset(w, 0xa5, sizeof(w));
		int n = poll_ex(cqc, w, 2);
		check(n == 2 && w[0].status == IBV_WC_SUCCESS && w[0].wr_id == 0x5151 && w[0].opcode == IBV_WC_SEND &&
			      w[0].qp_num == c->qp_num && w[1].status == IBV_WC_SUCCESS && w[1].wr_id == 0x5252 &&
			      w[1].opcode == IBV_WC_RDMA_WRITE && w[1].qp_num == c->qp_num,
		      "ibv_start_poll/ibv_next_poll send completions",
		      "n %d; [0] wr_id 0x%llx status %d opcode %d qp_num %u; [1] wr_id 0x%llx status %d opcode %d qp_num %u (qp %u)",
		      n, (unsigned long long)w[0].wr_id, w[0].status, w[0].opcode, w[0].qp_num,
		      (unsigned long long)w[1].wr_id, w[1].status, w[1].opcode, w[1].qp_num, c->qp_num);
	}
	{
		struct exwc w[1];

		memset(w, 0xa5, sizeof(w));
		int n = poll_ex(cqd, w, 1);
		check(n == 1 && w[0].status == IBV_WC_SUCCESS && w[0].wr_id == 0xd00d && w[0].opcode == IBV_WC_RECV &&
			      w[0].byte_len == SLEN && w[0].qp_num == d->qp_num,
		      "ibv_start_poll receive completion (ibv_wc_read_opcode/byte_len/qp_num)",
		      "n %d wr_id 0x%llx status %d opcode %d byte_len %u qp_num %u (qp %u)", n,
		      (unsigned long long)w[0].wr_id, w[0].status, w[0].opcode, w[0].byte_len, w[0].qp_num, d->qp_num);
	}
	check(memcmp(dbuf, sbuf, SLEN) == 0 && dbuf[SLEN] == 0, "ibv_wr_send data byte-exact", "mismatch");
	check(memcmp(dbuf + WOFF, sbuf + WOFF, WLEN) == 0 && dbuf[WOFF + WLEN] == 0 && dbuf[WOFF - 1] == 0,
	      "ibv_wr_rdma_write data byte-exact", "mismatch");
	{
		struct ibv_poll_cq_attr pa = { .comp_mask = 0 };

		rc = ibv_start_poll(cqc, &pa);
		check(rc == ENOENT, "extended CQ empty afterwards", "start_poll %d", rc);
		if (rc == 0)
			ibv_end_poll(cqc);
	}
	/* ibv_wr_abort drops what was built. */
	ibv_wr_start(qx);
	qx->wr_id = 0x5353;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, smr->lkey, (uintptr_t)sbuf, 8);
	ibv_wr_abort(qx);
	usleep(50000);
	{
		struct ibv_poll_cq_attr pa = { .comp_mask = 0 };

		rc = ibv_start_poll(cqc, &pa);
		check(rc == ENOENT, "ibv_wr_abort posts nothing", "start_poll %d wr_id 0x%llx", rc,
		      (unsigned long long)cqc->wr_id);
		if (rc == 0)
			ibv_end_poll(cqc);
	}

out:
	{
		int r[5] = { 0 };

		if (c)
			r[0] = ibv_destroy_qp(c);
		if (d)
			r[1] = ibv_destroy_qp(d);
		if (smr)
			r[2] = ibv_dereg_mr(smr);
		if (dmr)
			r[3] = ibv_dereg_mr(dmr);
		if (cqd)
			r[4] = ibv_destroy_cq(ibv_cq_ex_to_cq(cqd));
		check(!r[0] && !r[1] && !r[2] && !r[3] && !r[4], "extended loopback teardown",
		      "destroy_qp %d %d dereg_mr %d %d destroy_cq %d", r[0], r[1], r[2], r[3], r[4]);
	}
	free(sbuf);
	free(dbuf);
}

/* ------------------------------------------------------------------------------------------ */

int main(void)
{
	struct env e;
	int rc;

	memset(&e, 0, sizeof(e));
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGALRM, on_alarm);
	alarm(90);

	check_layouts();

	const char *t = getenv("TMPDIR");
	snprintf(e.tmpdir, sizeof(e.tmpdir), "%s/abi_check.XXXXXX", t && *t ? t : "/tmp");
	if (!mkdtemp(e.tmpdir)) {
		check(0, "mkdtemp", "%s: %s", e.tmpdir, strerror(errno));
		return n_failures;
	}

	if (section_device(&e) == 0) {
		section_mr(&e);

		struct ibv_pd *pd = ibv_alloc_pd(e.ctx);
		struct ibv_cq_ex *cqx = NULL;

		if (check(pd != NULL, "ibv_alloc_pd (shared)", "errno %d", errno)) {
			cqx = make_cq_ex(&e);
			if (check(cqx != NULL, "ibv_create_cq_ex BYTE_LEN|IMM|QP_NUM (vctx->create_cq_ex)",
				  "errno %d (%s)", errno, strerror(errno))) {
				struct ibv_cq *cq = ibv_cq_ex_to_cq(cqx);

				check((void *)cq == (void *)cqx && cq->context == e.ctx && cq->cqe >= 64 &&
					      cq->channel == NULL,
				      "ibv_cq_ex_to_cq", "cq %p context %p cqe %d", (void *)cq, (void *)cq->context,
				      cq->cqe);
				check(cqx->start_poll && cqx->next_poll && cqx->end_poll && cqx->read_opcode &&
					      cqx->read_byte_len && cqx->read_imm_data && cqx->read_qp_num,
				      "ibv_cq_ex function pointers set", "a requested accessor is NULL");
				struct ibv_poll_cq_attr pa = { .comp_mask = 0 };
				rc = ibv_start_poll(cqx, &pa);
				check(rc == ENOENT, "ibv_start_poll on an empty CQ -> ENOENT", "rc %d", rc);
				if (rc == 0)
					ibv_end_poll(cqx);
				struct ibv_wc wc;
				rc = ibv_poll_cq(cq, 1, &wc);
				check(rc == 0, "ibv_poll_cq on an empty extended CQ", "rc %d", rc);
			}
			{
				struct ibv_cq_init_attr_ex ca;

				memset(&ca, 0, sizeof(ca));
				ca.cqe = 8;
				ca.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
				errno = 0;
				struct ibv_cq_ex *ts = ibv_create_cq_ex(e.ctx, &ca);
				check(ts == NULL && errno == EOPNOTSUPP,
				      "ibv_create_cq_ex with COMPLETION_TIMESTAMP -> EOPNOTSUPP", "cq %p errno %d",
				      (void *)ts, errno);
				if (ts)
					ibv_destroy_cq(ibv_cq_ex_to_cq(ts));
			}

			if (cqx) {
				section_xrc(&e, pd, ibv_cq_ex_to_cq(cqx));
				section_classic(&e, pd);
				section_extended(&e, pd, cqx);
				rc = ibv_destroy_cq(ibv_cq_ex_to_cq(cqx));
				check(rc == 0, "ibv_destroy_cq extended", "rc %d (%s)", rc, strerror(rc));
			}
			rc = ibv_dealloc_pd(pd);
			check(rc == 0, "ibv_dealloc_pd", "rc %d (%s)", rc, strerror(rc));
		}
		rc = ibv_close_device(e.ctx);
		check(rc == 0, "ibv_close_device", "rc %d", rc);
	}
	if (e.list)
		ibv_free_device_list(e.list);
	rmdir(e.tmpdir);

	printf("# %d checks, %d failed\n", n_checks, n_failures);
	return n_failures > 255 ? 255 : n_failures;
}
