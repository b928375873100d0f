/*
 * softrdma: OFED 1.3-1.5's XRC verbs, for programs written against them (Open MPI's and
 * MVAPICH's old openib XRC support). softrdma's libibverbs.so.1 exports them under IBVERBS_1.1,
 * where OFED's libibverbs had them; include this header after (or instead of)
 * <infiniband/verbs.h> and link with that libibverbs.so.1 (scripts/build-examples.sh shows how).
 *
 * They map onto the upstream objects: an XRC domain here is the same file-shared domain
 * ibv_open_xrcd gives, an XRC SRQ is an upstream XRC SRQ, an XRC receive QP is an XRC_RECV
 * target QP, and an IBV_QPT_XRC QP is an XRC_SEND QP.
 *
 * OFED's structures differ from upstream's in three places; this header gives their layouts:
 *  - struct ibv_qp_init_attr had `xrc_domain` after `sq_sig_all`: use struct
 *    ibv_qp_init_attr_xrc (its fields by their usual names) and pass &attr.base;
 *  - struct ibv_srq had `xrc_srq_num`, `xrc_domain` and `xrc_cq` after `handle`: an SRQ from
 *    ibv_create_xrc_srq is laid out as struct ibv_srq_legacy (ibv_xrc_srq() casts);
 *  - struct ibv_send_wr had `xrc_remote_srq_num` where upstream has qp_type.xrc.remote_srqn:
 *    the macro below lets `wr.xrc_remote_srq_num = n` compile unchanged.
 */
#ifndef SOFTRDMA_OFED_XRC_H
#define SOFTRDMA_OFED_XRC_H

#include <stdint.h>
#include <pthread.h>
#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The sending XRC QP type of ibv_create_qp (upstream's IBV_QPT_XRC_SEND). */
#define IBV_QPT_XRC ((enum ibv_qp_type)5)

/* Set in event_type for an async event of an XRC receive QP this process registered with;
 * the element is then the QP number (ibv_xrc_event_qp_num). */
#define IBV_XRC_QP_EVENT_FLAG 0x80000000

#define xrc_remote_srq_num qp_type.xrc.remote_srqn

/* An XRC domain: the device context and the domain's number on it. */
struct ibv_xrc_domain {
	struct ibv_context *context;
	uint32_t handle;
};

/* OFED's struct ibv_qp_init_attr. */
struct ibv_qp_init_attr_xrc {
	union {
		struct ibv_qp_init_attr base;
		struct {
			void *qp_context;
			struct ibv_cq *send_cq;
			struct ibv_cq *recv_cq;
			struct ibv_srq *srq;
			struct ibv_qp_cap cap;
			enum ibv_qp_type qp_type;
			int sq_sig_all;
		};
	};
	struct ibv_xrc_domain *xrc_domain;
};

/* OFED's struct ibv_srq, as an SRQ from ibv_create_xrc_srq is laid out. */
struct ibv_srq_legacy {
	struct ibv_context *context;
	void *srq_context;
	struct ibv_pd *pd;
	uint32_t handle;
	uint32_t events_completed;
	uint32_t xrc_srq_num;
	struct ibv_xrc_domain *xrc_domain;
	struct ibv_cq *xrc_cq;
	pthread_mutex_t mutex;
	pthread_cond_t cond;
};

static inline struct ibv_srq_legacy *ibv_xrc_srq(struct ibv_srq *srq)
{
	return (struct ibv_srq_legacy *)srq;
}

static inline uint32_t ibv_xrc_event_qp_num(const struct ibv_async_event *event)
{
	return (uint32_t)event->element.port_num;
}

/*
 * Opens the XRC domain associated with the file `fd` on this device (shared by every process
 * that opens the same file), creating it with O_CREAT; O_CREAT|O_EXCL fails when it exists.
 * fd -1 with O_CREAT gives a domain of this process alone. NULL with errno on failure.
 */
struct ibv_xrc_domain *ibv_open_xrc_domain(struct ibv_context *context, int fd, int oflag);

/*
 * Closes this process's reference (its receive QP registrations in the domain go first); the
 * last reference destroys the domain and its receive QPs. Done implicitly at process exit.
 * 0, or an errno (EBUSY while this process's XRC SRQs use the domain).
 */
int ibv_close_xrc_domain(struct ibv_xrc_domain *d);

/*
 * Creates an SRQ in `pd` that receives XRC messages of `xrc_domain`, completing on `xrc_cq`.
 * Its number (what senders name) is ibv_xrc_srq(srq)->xrc_srq_num. NULL with errno on failure.
 */
struct ibv_srq *ibv_create_xrc_srq(struct ibv_pd *pd, struct ibv_xrc_domain *xrc_domain, struct ibv_cq *xrc_cq,
				   struct ibv_srq_init_attr *srq_init_attr);

/*
 * The seed's receive QP owned by the device: created in `xrc_domain` and moved RESET->INIT
 * (IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT) and INIT->RTR (IBV_QP_AV |
 * IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MIN_RNR_TIMER, and
 * IBV_QP_MAX_DEST_RD_ATOMIC for RDMA or atomics) in the call; all those bits must be in
 * `attr_mask`. There is no user object, no query and no destroy: the program gets the QP number,
 * and the QP persists until the domain's reference count reaches zero. Its async events go to
 * the device's log. 0, or a negative error value.
 */
int ibv_alloc_xrc_rcv_qp(struct ibv_pd *pd, struct ibv_xrc_domain *xrc_domain, struct ibv_qp_attr *attr,
			 enum ibv_qp_attr_mask attr_mask, uint32_t *xrc_rcv_qpn);

/*
 * Creates a receive QP in init_attr->xrc_domain (init_attr points at a struct
 * ibv_qp_init_attr_xrc; its other fields are ignored) and registers this process with it. The QP
 * persists until the last registered process unregisters (or exits). 0, or a negative error value.
 */
int ibv_create_xrc_rcv_qp(struct ibv_qp_init_attr *init_attr, uint32_t *xrc_rcv_qpn);

/* ibv_modify_qp on receive QP `xrc_qp_num` of the domain. 0, or a positive error value. */
int ibv_modify_xrc_rcv_qp(struct ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num, struct ibv_qp_attr *attr,
			  int attr_mask);

/* ibv_query_qp on receive QP `xrc_qp_num`; init_attr (may be NULL) points at a struct
 * ibv_qp_init_attr_xrc. 0, or a positive error value. */
int ibv_query_xrc_rcv_qp(struct ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num, struct ibv_qp_attr *attr,
			 int attr_mask, struct ibv_qp_init_attr *init_attr);

/* Registers this process with receive QP `xrc_qp_num` of the domain. 0, or EINVAL (no such
 * receive QP in the domain). */
int ibv_reg_xrc_rcv_qp(struct ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num);

/* Unregisters this process; with the last registration the QP is destroyed. 0, or EINVAL (this
 * process is not registered with such a QP). */
int ibv_unreg_xrc_rcv_qp(struct ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num);

#ifdef __cplusplus
}
#endif

#endif
