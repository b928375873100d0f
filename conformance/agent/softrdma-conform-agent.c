/*
 * softrdma-conform-agent: the device-under-test side of `softrdma conform`.
 *
 * Runs on the host of the RoCE device under test, against that host's own libibverbs (rdma-core's,
 * with rxe, a NIC's provider, or softrdma's shim: it never links softrdma), and does what the
 * tester asks over TCP, one command a line, one answer a line:
 *
 *   open [dev=NAME] [gid_index=N]      -> ok dev=NAME gid=HEX32 gid_index=N mtu=BYTES
 *   mr len=N [access=lw,rw,rr,ra] [fill=B] -> ok id=N addr=0x.. lkey=N rkey=N
 *   cq [cqe=N]                          -> ok id=N
 *   srq [max_wr=N]                      -> ok id=N
 *   xrcd                                -> ok id=N (an XRC domain of this process)
 *   srq type=xrc xrcd=N cq=N [max_wr=N] -> ok id=N srqn=N
 *   qp type=rc|uc|ud cq=N [srq=N] [max_send_wr=N] [max_recv_wr=N] [max_inline=N] -> ok id=N qpn=N
 *   qp type=xrc_ini cq=N | type=xrc_tgt xrcd=N -> ok id=N qpn=N
 *   modify qp=N state=reset|init|rtr|rts|err [attributes] -> ok | err errno=N
 *   post_send qp=N op=send|send_imm|write|write_imm|read|cas|faa [mr= off= len=] [raddr= rkey=]
 *             [imm=] [swap=] [compare=] [add=] [flags=signaled,solicited,fence,inline] [wr_id=]
 *             [dgid= dest_qpn= qkey=]  (UD)  [srqn=N]  (XRC INI: the remote XRC SRQ)
 *   post_recv qp=N|srq=N mr=N off=N len=N [wr_id=N]
 *   poll cq=N [max=N] [wait_ms=N]       -> ok n=K wc=wr_id:status:opcode:byte_len:imm:src_qp:flags,...
 *   query qp=N                          -> ok state=N (enum ibv_qp_state)
 *   event [wait_ms=N]                   -> ok type=N (enum ibv_event_type) | ok none
 *   read mr=N off=N len=N               -> ok data=HEX
 *   write mr=N off=N data=HEX           -> ok
 *   reset                               -> ok (every object destroyed; the device stays open)
 *   quit
 *
 * Numbers are decimal or 0x hexadecimal. The protocol is docs/conform.md's.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_OBJ 64
#define LINE 65536

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static int gid_index = -1;
static union ibv_gid gid;
static char dev_name[64];
static struct ibv_mr *mrs[MAX_OBJ];
static struct ibv_cq *cqs[MAX_OBJ];
static struct ibv_srq *srqs[MAX_OBJ];
static struct ibv_qp *qps[MAX_OBJ];
static int qp_type_of[MAX_OBJ];
static struct ibv_xrcd *xrcds[MAX_OBJ];
static struct ibv_ah *ahs[256];
static int n_ahs;

static char out[LINE * 2 + 64];

struct kv {
	int n;
	char *k[64];
	char *v[64];
};

static void split(char *line, struct kv *kv)
{
	kv->n = 0;
	for (char *save = NULL, *t = strtok_r(line, " \t\r\n", &save); t && kv->n < 64;
	     t = strtok_r(NULL, " \t\r\n", &save)) {
		char *eq = strchr(t, '=');
		kv->k[kv->n] = t;
		kv->v[kv->n] = NULL;
		if (eq) {
			*eq = 0;
			kv->v[kv->n] = eq + 1;
		}
		kv->n++;
	}
}

static const char *get(const struct kv *kv, const char *key)
{
	for (int i = 1; i < kv->n; i++)
		if (!strcmp(kv->k[i], key))
			return kv->v[i] ? kv->v[i] : "";
	return NULL;
}

static int has(const struct kv *kv, const char *key)
{
	return get(kv, key) != NULL;
}

static uint64_t num(const struct kv *kv, const char *key, uint64_t dflt)
{
	const char *v = get(kv, key);
	return v && *v ? strtoull(v, NULL, 0) : dflt;
}

/* An object index from the command; -1 when absent or out of range. */
static int index_of(const struct kv *kv, const char *key)
{
	const char *v = get(kv, key);
	if (!v || !*v)
		return -1;
	long i = strtol(v, NULL, 0);
	return i >= 0 && i < MAX_OBJ ? (int)i : -1;
}

static int slot(void **arr)
{
	for (int i = 0; i < MAX_OBJ; i++)
		if (!arr[i])
			return i;
	return -1;
}

static int list_has(const char *list, const char *word)
{
	if (!list)
		return 0;
	size_t n = strlen(word);
	for (const char *p = list; *p;) {
		const char *e = strchr(p, ',');
		size_t l = e ? (size_t)(e - p) : strlen(p);
		if (l == n && !strncmp(p, word, n))
			return 1;
		p += l + (e ? 1 : 0);
	}
	return 0;
}

static int access_flags(const char *list)
{
	int a = 0;
	if (list_has(list, "lw"))
		a |= IBV_ACCESS_LOCAL_WRITE;
	if (list_has(list, "rw"))
		a |= IBV_ACCESS_REMOTE_WRITE;
	if (list_has(list, "rr"))
		a |= IBV_ACCESS_REMOTE_READ;
	if (list_has(list, "ra"))
		a |= IBV_ACCESS_REMOTE_ATOMIC;
	return a;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static int parse_gid(const char *hex, union ibv_gid *g)
{
	if (!hex || strlen(hex) != 32)
		return -1;
	for (int i = 0; i < 16; i++) {
		int h = hexval(hex[2 * i]), l = hexval(hex[2 * i + 1]);
		if (h < 0 || l < 0)
			return -1;
		g->raw[i] = (uint8_t)(h << 4 | l);
	}
	return 0;
}

static void hex_of(const uint8_t *p, size_t n, char *dst)
{
	static const char d[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		dst[2 * i] = d[p[i] >> 4];
		dst[2 * i + 1] = d[p[i] & 15];
	}
	dst[2 * n] = 0;
}

static int reply_err(int e)
{
	snprintf(out, sizeof(out), "err errno=%d %s", e, strerror(e));
	return 0;
}

static int mtu_enum(uint64_t bytes)
{
	switch (bytes) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 2048: return IBV_MTU_2048;
	case 4096: return IBV_MTU_4096;
	default: return IBV_MTU_1024;
	}
}

static void destroy_all(void)
{
	for (int i = 0; i < MAX_OBJ; i++)
		if (qps[i]) {
			ibv_destroy_qp(qps[i]);
			qps[i] = NULL;
		}
	for (int i = 0; i < n_ahs; i++)
		ibv_destroy_ah(ahs[i]);
	n_ahs = 0;
	for (int i = 0; i < MAX_OBJ; i++)
		if (srqs[i]) {
			ibv_destroy_srq(srqs[i]);
			srqs[i] = NULL;
		}
	for (int i = 0; i < MAX_OBJ; i++)
		if (xrcds[i]) {
			ibv_close_xrcd(xrcds[i]);
			xrcds[i] = NULL;
		}
	for (int i = 0; i < MAX_OBJ; i++)
		if (cqs[i]) {
			ibv_destroy_cq(cqs[i]);
			cqs[i] = NULL;
		}
	for (int i = 0; i < MAX_OBJ; i++)
		if (mrs[i]) {
			void *buf = mrs[i]->addr;
			ibv_dereg_mr(mrs[i]);
			free(buf);
			mrs[i] = NULL;
		}
}

/* The first RoCEv2 GID that is an IPv4-mapped address, else index 0. */
static int pick_gid(void)
{
	struct ibv_port_attr pa;
	if (ibv_query_port(ctx, 1, &pa))
		return 0;
	for (int i = 0; i < pa.gid_tbl_len; i++) {
		struct ibv_gid_entry e;
		if (ibv_query_gid_ex(ctx, 1, i, &e, 0))
			continue;
		static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
		if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && !memcmp(e.gid.raw, mapped, 12))
			return i;
	}
	return 0;
}

static int cmd_open(const struct kv *kv)
{
	const char *want = get(kv, "dev");
	if (ctx) {
		destroy_all();
		ibv_dealloc_pd(pd);
		ibv_close_device(ctx);
		ctx = NULL;
	}
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n == 0)
		return reply_err(ENODEV);
	for (int i = 0; i < n && !ctx; i++)
		if (!want || !*want || !strcmp(ibv_get_device_name(list[i]), want)) {
			ctx = ibv_open_device(list[i]);
			snprintf(dev_name, sizeof(dev_name), "%s", ibv_get_device_name(list[i]));
		}
	ibv_free_device_list(list);
	if (!ctx)
		return reply_err(ENODEV);
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		return reply_err(errno);
	int fl = fcntl(ctx->async_fd, F_GETFL);
	fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
	gid_index = has(kv, "gid_index") ? (int)num(kv, "gid_index", 0) : pick_gid();
	if (ibv_query_gid(ctx, 1, gid_index, &gid))
		return reply_err(errno);
	struct ibv_port_attr pa;
	if (ibv_query_port(ctx, 1, &pa))
		return reply_err(errno);
	char g[33];
	hex_of(gid.raw, 16, g);
	snprintf(out, sizeof(out), "ok dev=%s gid=%s gid_index=%d mtu=%d", dev_name, g, gid_index,
		 128 << pa.active_mtu);
	return 0;
}

static int cmd_mr(const struct kv *kv)
{
	int i = slot((void **)mrs);
	size_t len = num(kv, "len", 4096);
	if (i < 0 || len == 0 || len > (1u << 30))
		return reply_err(EINVAL);
	void *buf = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);
	if (!buf)
		return reply_err(ENOMEM);
	memset(buf, (int)num(kv, "fill", 0), len);
	const char *acc = get(kv, "access");
	mrs[i] = ibv_reg_mr(pd, buf, len, acc ? access_flags(acc) : IBV_ACCESS_LOCAL_WRITE);
	if (!mrs[i]) {
		int e = errno;
		free(buf);
		return reply_err(e);
	}
	snprintf(out, sizeof(out), "ok id=%d addr=0x%llx lkey=%u rkey=%u", i,
		 (unsigned long long)(uintptr_t)buf, mrs[i]->lkey, mrs[i]->rkey);
	return 0;
}

static int cmd_cq(const struct kv *kv)
{
	int i = slot((void **)cqs);
	if (i < 0)
		return reply_err(EINVAL);
	cqs[i] = ibv_create_cq(ctx, (int)num(kv, "cqe", 256), NULL, NULL, 0);
	if (!cqs[i])
		return reply_err(errno);
	snprintf(out, sizeof(out), "ok id=%d", i);
	return 0;
}

static int cmd_xrcd(const struct kv *kv)
{
	(void)kv;
	int i = slot((void **)xrcds);
	if (i < 0)
		return reply_err(EINVAL);
	struct ibv_xrcd_init_attr a = {.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
				       .fd = -1,
				       .oflags = O_CREAT};
	xrcds[i] = ibv_open_xrcd(ctx, &a);
	if (!xrcds[i])
		return reply_err(errno);
	snprintf(out, sizeof(out), "ok id=%d", i);
	return 0;
}

static int cmd_srq(const struct kv *kv)
{
	int i = slot((void **)srqs);
	if (i < 0)
		return reply_err(EINVAL);
	const char *t = get(kv, "type");
	if (t && !strcmp(t, "xrc")) {
		int x = index_of(kv, "xrcd"), c = index_of(kv, "cq");
		if (x < 0 || !xrcds[x] || c < 0 || !cqs[c])
			return reply_err(EINVAL);
		struct ibv_srq_init_attr_ex a = {
			.attr = {.max_wr = (uint32_t)num(kv, "max_wr", 64), .max_sge = 1},
			.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
				     IBV_SRQ_INIT_ATTR_CQ,
			.srq_type = IBV_SRQT_XRC,
			.pd = pd,
			.xrcd = xrcds[x],
			.cq = cqs[c],
		};
		srqs[i] = ibv_create_srq_ex(ctx, &a);
		if (!srqs[i])
			return reply_err(errno);
		uint32_t n = 0;
		if (ibv_get_srq_num(srqs[i], &n))
			return reply_err(errno);
		snprintf(out, sizeof(out), "ok id=%d srqn=%u", i, n);
		return 0;
	}
	struct ibv_srq_init_attr a = {.attr = {.max_wr = (uint32_t)num(kv, "max_wr", 64), .max_sge = 1}};
	srqs[i] = ibv_create_srq(pd, &a);
	if (!srqs[i])
		return reply_err(errno);
	snprintf(out, sizeof(out), "ok id=%d", i);
	return 0;
}

/* The answer to a QP made (or not) in slot i. */
static int created_qp(int i, struct ibv_qp *qp, int type)
{
	if (!qp)
		return reply_err(errno);
	qps[i] = qp;
	qp_type_of[i] = type;
	snprintf(out, sizeof(out), "ok id=%d qpn=%u", i, qp->qp_num);
	return 0;
}

/* An XRC QP: the send side (INI) on this PD and CQ, or the receive side (TGT) in an XRC domain. */
static int cmd_xrc_qp(const struct kv *kv, int i, const char *t)
{
	struct ibv_qp_init_attr_ex a;
	memset(&a, 0, sizeof(a));
	if (!strcmp(t, "xrc_ini")) {
		int c = index_of(kv, "cq");
		if (c < 0 || !cqs[c])
			return reply_err(EINVAL);
		a.qp_type = IBV_QPT_XRC_SEND;
		a.send_cq = cqs[c];
		a.recv_cq = cqs[c];
		a.cap.max_send_wr = (uint32_t)num(kv, "max_send_wr", 64);
		a.cap.max_send_sge = 1;
		a.cap.max_inline_data = (uint32_t)num(kv, "max_inline", 64);
		a.comp_mask = IBV_QP_INIT_ATTR_PD;
		a.pd = pd;
	} else {
		int x = index_of(kv, "xrcd");
		if (x < 0 || !xrcds[x])
			return reply_err(EINVAL);
		a.qp_type = IBV_QPT_XRC_RECV;
		a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
		a.xrcd = xrcds[x];
	}
	return created_qp(i, ibv_create_qp_ex(ctx, &a), a.qp_type);
}

static int cmd_qp(const struct kv *kv)
{
	int i = slot((void **)qps), c = index_of(kv, "cq"), s = index_of(kv, "srq");
	const char *t = get(kv, "type");
	if (i >= 0 && t && (!strcmp(t, "xrc_ini") || !strcmp(t, "xrc_tgt")))
		return cmd_xrc_qp(kv, i, t);
	if (i < 0 || c < 0 || !cqs[c] || (has(kv, "srq") && (s < 0 || !srqs[s])) || !t)
		return reply_err(EINVAL);
	struct ibv_qp_init_attr a = {
		.send_cq = cqs[c],
		.recv_cq = cqs[c],
		.srq = s >= 0 ? srqs[s] : NULL,
		.cap = {.max_send_wr = (uint32_t)num(kv, "max_send_wr", 64),
			.max_recv_wr = (uint32_t)num(kv, "max_recv_wr", 64),
			.max_send_sge = 1,
			.max_recv_sge = 1,
			.max_inline_data = (uint32_t)num(kv, "max_inline", 64)},
		.sq_sig_all = 0,
	};
	if (!strcmp(t, "rc"))
		a.qp_type = IBV_QPT_RC;
	else if (!strcmp(t, "uc"))
		a.qp_type = IBV_QPT_UC;
	else if (!strcmp(t, "ud"))
		a.qp_type = IBV_QPT_UD;
	else
		return reply_err(EINVAL);
	return created_qp(i, ibv_create_qp(pd, &a), a.qp_type);
}

static int cmd_modify(const struct kv *kv)
{
	int q = index_of(kv, "qp");
	const char *st = get(kv, "state");
	if (q < 0 || !qps[q] || !st)
		return reply_err(EINVAL);
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	int mask = IBV_QP_STATE, type = qp_type_of[q];
	/* XRC QPs take the RC attributes at each transition (as ibv_xsrq_pingpong sets them). */
	if (type == IBV_QPT_XRC_SEND || type == IBV_QPT_XRC_RECV)
		type = IBV_QPT_RC;
	if (!strcmp(st, "reset")) {
		a.qp_state = IBV_QPS_RESET;
	} else if (!strcmp(st, "init")) {
		a.qp_state = IBV_QPS_INIT;
		a.pkey_index = (uint16_t)num(kv, "pkey_index", 0);
		a.port_num = (uint8_t)num(kv, "port", 1);
		mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT;
		if (type == IBV_QPT_UD) {
			a.qkey = (uint32_t)num(kv, "qkey", 0x11111111);
			mask |= IBV_QP_QKEY;
		} else {
			const char *acc = get(kv, "access");
			a.qp_access_flags = acc ? access_flags(acc) : 0;
			mask |= IBV_QP_ACCESS_FLAGS;
		}
	} else if (!strcmp(st, "rtr")) {
		a.qp_state = IBV_QPS_RTR;
		if (type != IBV_QPT_UD) {
			a.path_mtu = mtu_enum(num(kv, "mtu", 1024));
			a.dest_qp_num = (uint32_t)num(kv, "dest_qpn", 0);
			a.rq_psn = (uint32_t)num(kv, "rq_psn", 0);
			union ibv_gid d;
			if (parse_gid(get(kv, "dgid"), &d))
				return reply_err(EINVAL);
			a.ah_attr.is_global = 1;
			a.ah_attr.grh.dgid = d;
			a.ah_attr.grh.sgid_index = (uint8_t)gid_index;
			a.ah_attr.grh.hop_limit = (uint8_t)num(kv, "hop_limit", 64);
			a.ah_attr.port_num = 1;
			mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
			if (type == IBV_QPT_RC) {
				a.max_dest_rd_atomic = (uint8_t)num(kv, "max_dest_rd_atomic", 1);
				a.min_rnr_timer = (uint8_t)num(kv, "min_rnr_timer", 12);
				mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
			}
		}
	} else if (!strcmp(st, "rts")) {
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = (uint32_t)num(kv, "sq_psn", 0);
		mask |= IBV_QP_SQ_PSN;
		if (type == IBV_QPT_RC) {
			a.timeout = (uint8_t)num(kv, "timeout", 14);
			a.retry_cnt = (uint8_t)num(kv, "retry_cnt", 7);
			a.rnr_retry = (uint8_t)num(kv, "rnr_retry", 7);
			a.max_rd_atomic = (uint8_t)num(kv, "max_rd_atomic", 1);
			mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
		}
	} else if (!strcmp(st, "err")) {
		a.qp_state = IBV_QPS_ERR;
	} else {
		return reply_err(EINVAL);
	}
	int rc = ibv_modify_qp(qps[q], &a, mask);
	if (rc)
		return reply_err(rc > 0 ? rc : errno);
	snprintf(out, sizeof(out), "ok");
	return 0;
}

static int sge_of(const struct kv *kv, struct ibv_sge *sge)
{
	if (!has(kv, "mr"))
		return 0;
	int m = index_of(kv, "mr");
	if (m < 0 || !mrs[m])
		return -1;
	uint64_t off = num(kv, "off", 0), len = num(kv, "len", 0);
	if (off + len > mrs[m]->length)
		return -1;
	sge->addr = (uint64_t)(uintptr_t)mrs[m]->addr + off;
	sge->length = (uint32_t)len;
	sge->lkey = has(kv, "lkey") ? (uint32_t)num(kv, "lkey", 0) : mrs[m]->lkey;
	return 1;
}

static int cmd_post_send(const struct kv *kv)
{
	int q = index_of(kv, "qp");
	const char *op = get(kv, "op"), *fl = get(kv, "flags");
	if (q < 0 || !qps[q] || !op)
		return reply_err(EINVAL);
	struct ibv_sge sge;
	int n = sge_of(kv, &sge);
	if (n < 0)
		return reply_err(EINVAL);
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = num(kv, "wr_id", 1);
	wr.sg_list = n ? &sge : NULL;
	wr.num_sge = n;
	if (list_has(fl, "signaled"))
		wr.send_flags |= IBV_SEND_SIGNALED;
	if (list_has(fl, "solicited"))
		wr.send_flags |= IBV_SEND_SOLICITED;
	if (list_has(fl, "fence"))
		wr.send_flags |= IBV_SEND_FENCE;
	if (list_has(fl, "inline"))
		wr.send_flags |= IBV_SEND_INLINE;
	uint64_t raddr = num(kv, "raddr", 0);
	uint32_t rkey = (uint32_t)num(kv, "rkey", 0);
	if (!strcmp(op, "send")) {
		wr.opcode = IBV_WR_SEND;
	} else if (!strcmp(op, "send_imm")) {
		wr.opcode = IBV_WR_SEND_WITH_IMM;
		wr.imm_data = htonl((uint32_t)num(kv, "imm", 0));
	} else if (!strcmp(op, "write")) {
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	} else if (!strcmp(op, "write_imm")) {
		wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		wr.imm_data = htonl((uint32_t)num(kv, "imm", 0));
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	} else if (!strcmp(op, "read")) {
		wr.opcode = IBV_WR_RDMA_READ;
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	} else if (!strcmp(op, "cas") || !strcmp(op, "faa")) {
		wr.opcode = !strcmp(op, "cas") ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD;
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = !strcmp(op, "cas") ? num(kv, "compare", 0) : num(kv, "add", 0);
		wr.wr.atomic.swap = num(kv, "swap", 0);
	} else {
		return reply_err(EINVAL);
	}
	if (qp_type_of[q] == IBV_QPT_XRC_SEND)
		wr.qp_type.xrc.remote_srqn = (uint32_t)num(kv, "srqn", 0);
	struct ibv_ah *ah = NULL;
	if (qp_type_of[q] == IBV_QPT_UD) {
		struct ibv_ah_attr aa;
		memset(&aa, 0, sizeof(aa));
		if (parse_gid(get(kv, "dgid"), &aa.grh.dgid))
			return reply_err(EINVAL);
		aa.is_global = 1;
		aa.grh.sgid_index = (uint8_t)gid_index;
		aa.grh.hop_limit = 64;
		aa.port_num = 1;
		if (n_ahs == (int)(sizeof(ahs) / sizeof(ahs[0])))
			return reply_err(ENOMEM);
		ah = ibv_create_ah(pd, &aa);
		if (!ah)
			return reply_err(errno);
		ahs[n_ahs++] = ah;
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = (uint32_t)num(kv, "dest_qpn", 0);
		wr.wr.ud.remote_qkey = (uint32_t)num(kv, "qkey", 0x11111111);
	}
	int rc = ibv_post_send(qps[q], &wr, &bad);
	/* The AH is kept until the next reset: the send may still be using it. */
	if (rc)
		return reply_err(rc);
	snprintf(out, sizeof(out), "ok");
	return 0;
}

static int cmd_post_recv(const struct kv *kv)
{
	int q = index_of(kv, "qp"), s = index_of(kv, "srq");
	struct ibv_sge sge;
	int n = sge_of(kv, &sge);
	if (n < 0 || (q < 0 && s < 0) || (q >= 0 && !qps[q]) || (s >= 0 && !srqs[s]))
		return reply_err(EINVAL);
	struct ibv_recv_wr wr = {.wr_id = num(kv, "wr_id", 1), .sg_list = n ? &sge : NULL, .num_sge = n},
			   *bad = NULL;
	int rc = q >= 0 ? ibv_post_recv(qps[q], &wr, &bad) : ibv_post_srq_recv(srqs[s], &wr, &bad);
	if (rc)
		return reply_err(rc);
	snprintf(out, sizeof(out), "ok");
	return 0;
}

static uint64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static int cmd_poll(const struct kv *kv)
{
	int c = index_of(kv, "cq");
	if (c < 0 || !cqs[c])
		return reply_err(EINVAL);
	int max = (int)num(kv, "max", 16);
	if (max < 1 || max > 64)
		max = 16;
	uint64_t until = now_ms() + num(kv, "wait_ms", 0);
	struct ibv_wc wc[64];
	int n;
	for (;;) {
		n = ibv_poll_cq(cqs[c], max, wc);
		if (n != 0 || now_ms() >= until)
			break;
		usleep(200);
	}
	if (n < 0)
		return reply_err(EIO);
	int o = snprintf(out, sizeof(out), "ok n=%d wc=", n);
	for (int i = 0; i < n; i++)
		o += snprintf(out + o, sizeof(out) - (size_t)o, "%s%llu:%d:%d:%u:%u:%u:%u", i ? "," : "",
			      (unsigned long long)wc[i].wr_id, wc[i].status, wc[i].opcode, wc[i].byte_len,
			      ntohl(wc[i].imm_data), wc[i].src_qp, wc[i].wc_flags);
	return 0;
}

static int cmd_query(const struct kv *kv)
{
	int q = index_of(kv, "qp");
	if (q < 0 || !qps[q])
		return reply_err(EINVAL);
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	int rc = ibv_query_qp(qps[q], &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RQ_PSN, &ia);
	if (rc)
		return reply_err(rc);
	snprintf(out, sizeof(out), "ok state=%d sq_psn=%u rq_psn=%u", a.qp_state, a.sq_psn, a.rq_psn);
	return 0;
}

static int cmd_event(const struct kv *kv)
{
	struct pollfd p = {.fd = ctx->async_fd, .events = POLLIN};
	poll(&p, 1, (int)num(kv, "wait_ms", 0));
	struct ibv_async_event e;
	if (ibv_get_async_event(ctx, &e)) {
		snprintf(out, sizeof(out), "ok none");
		return 0;
	}
	int q = -1;
	for (int i = 0; i < MAX_OBJ; i++)
		if (qps[i] && qps[i] == e.element.qp)
			q = i;
	snprintf(out, sizeof(out), "ok type=%d qp=%d", e.event_type, q);
	ibv_ack_async_event(&e);
	return 0;
}

static int cmd_read(const struct kv *kv)
{
	int m = index_of(kv, "mr");
	uint64_t off = num(kv, "off", 0), len = num(kv, "len", 0);
	if (m < 0 || !mrs[m] || off + len > mrs[m]->length || len > LINE)
		return reply_err(EINVAL);
	strcpy(out, "ok data=");
	hex_of((uint8_t *)mrs[m]->addr + off, len, out + 8);
	return 0;
}

static int cmd_write(const struct kv *kv)
{
	int m = index_of(kv, "mr");
	const char *d = get(kv, "data");
	uint64_t off = num(kv, "off", 0), len = d ? strlen(d) / 2 : 0;
	if (m < 0 || !mrs[m] || !d || strlen(d) % 2 || off + len > mrs[m]->length)
		return reply_err(EINVAL);
	uint8_t *p = (uint8_t *)mrs[m]->addr + off;
	for (uint64_t i = 0; i < len; i++) {
		int h = hexval(d[2 * i]), l = hexval(d[2 * i + 1]);
		if (h < 0 || l < 0)
			return reply_err(EINVAL);
		p[i] = (uint8_t)(h << 4 | l);
	}
	snprintf(out, sizeof(out), "ok");
	return 0;
}

/* The commands on an open device. */
static const struct {
	const char *name;
	int (*run)(const struct kv *);
} commands[] = {
	{"mr", cmd_mr},
	{"cq", cmd_cq},
	{"srq", cmd_srq},
	{"xrcd", cmd_xrcd},
	{"qp", cmd_qp},
	{"modify", cmd_modify},
	{"post_send", cmd_post_send},
	{"post_recv", cmd_post_recv},
	{"poll", cmd_poll},
	{"query", cmd_query},
	{"event", cmd_event},
	{"read", cmd_read},
	{"write", cmd_write},
};

/* One command; returns 1 to end the session. */
static int handle(char *line)
{
	struct kv kv;
	split(line, &kv);
	out[0] = 0;
	if (kv.n == 0) {
		snprintf(out, sizeof(out), "err errno=%d empty command", EINVAL);
		return 0;
	}
	const char *c = kv.k[0];
	if (!strcmp(c, "quit"))
		return 1;
	if (!strcmp(c, "open"))
		return cmd_open(&kv);
	if (!ctx)
		return reply_err(ENODEV);
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(c, commands[i].name))
			return commands[i].run(&kv);
	if (!strcmp(c, "reset")) {
		destroy_all();
		/* Drain async events a case left behind. */
		struct ibv_async_event e;
		while (!ibv_get_async_event(ctx, &e))
			ibv_ack_async_event(&e);
		snprintf(out, sizeof(out), "ok");
		return 0;
	}
	snprintf(out, sizeof(out), "err errno=%d unknown command %s", EINVAL, c);
	return 0;
}

static void serve(int fd)
{
	static char buf[LINE * 2 + 256];
	size_t have = 0;
	for (;;) {
		char *nl = memchr(buf, '\n', have);
		if (!nl) {
			if (have == sizeof(buf)) {
				dprintf(fd, "err errno=%d line too long\n", E2BIG);
				return;
			}
			ssize_t r = read(fd, buf + have, sizeof(buf) - have);
			if (r <= 0)
				return;
			have += (size_t)r;
			continue;
		}
		*nl = 0;
		size_t used = (size_t)(nl - buf) + 1;
		int end = handle(buf);
		memmove(buf, buf + used, have - used);
		have -= used;
		if (end)
			return;
		size_t l = strlen(out);
		out[l] = '\n';
		if (write(fd, out, l + 1) != (ssize_t)(l + 1))
			return;
	}
}

int main(int argc, char **argv)
{
	const char *listen_at = "127.0.0.1";
	int port = 7471, once = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--listen") && i + 1 < argc)
			listen_at = argv[++i];
		else if (!strcmp(argv[i], "--port") && i + 1 < argc)
			port = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--once"))
			once = 1;
		else {
			fprintf(stderr, "usage: %s [--listen ADDR] [--port N] [--once]\n", argv[0]);
			return 2;
		}
	}
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (inet_pton(AF_INET, listen_at, &a.sin_addr) != 1 || bind(s, (struct sockaddr *)&a, sizeof(a)) ||
	    listen(s, 1)) {
		fprintf(stderr, "softrdma-conform-agent: cannot listen on %s:%d: %s\n", listen_at, port,
			strerror(errno));
		return 1;
	}
	fprintf(stderr, "softrdma-conform-agent: listening on %s:%d\n", listen_at, port);
	do {
		int c = accept(s, NULL, NULL);
		if (c < 0)
			continue;
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		serve(c);
		close(c);
		if (ctx) {
			destroy_all();
			ibv_dealloc_pd(pd);
			ibv_close_device(ctx);
			ctx = NULL;
		}
	} while (!once);
	close(s);
	return 0;
}
