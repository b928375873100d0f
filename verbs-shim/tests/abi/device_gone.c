/*
 * device_gone.c: what a verbs program sees when its device goes away (the daemon stops):
 * IBV_EVENT_DEVICE_FATAL on the async event queue, then every call fails cleanly, without a
 * crash or a hang.
 *
 *   cc -O1 -Wall -Werror device_gone.c -o device_gone -L$SHIM -libverbs
 *   LD_LIBRARY_PATH=$SHIM ./device_gone
 *
 * It opens srdma0 and makes a PD, an MR, a CQ on a completion channel and an RC QP, prints
 * "ready", then waits for one line on stdin (meanwhile the caller stops the device) and checks
 * the calls after it. A watchdog (alarm) turns a blocked call into a failure.
 *
 * Output: one line per check, "ok <name>" or "FAIL <name>: <detail>", and "# ..." notes.
 * Exit status: the number of failures.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"

#define DEVICE_NAME "srdma0"

static const char *volatile stage = "setup";


static void on_alarm(int sig)
{
	static const char head[] = "FAIL watchdog: blocked in ";
	static const char tail[] = "\n";

	(void)sig;
	if (write(1, head, sizeof(head) - 1) < 0 || write(1, stage, strlen(stage)) < 0 ||
	    write(1, tail, sizeof(tail) - 1) < 0) {
		/* nothing more to do */
	}
	_exit(n_failures + 1 > 255 ? 255 : n_failures + 1);
}

int main(void)
{
	struct ibv_device **list = NULL;
	struct ibv_context *ctx = NULL;
	struct ibv_comp_channel *ch = NULL;
	struct ibv_pd *pd = NULL;
	struct ibv_mr *mr = NULL;
	struct ibv_cq *cq = NULL;
	struct ibv_qp *qp = NULL;
	static char buf[4096];
	char line[64];
	int n = 0, rc;

	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGALRM, on_alarm);
	alarm(30);

	list = ibv_get_device_list(&n);
	for (int i = 0; list && i < n; i++)
		if (strcmp(ibv_get_device_name(list[i]), DEVICE_NAME) == 0)
			ctx = ibv_open_device(list[i]);
	if (!check(ctx != NULL, "ibv_open_device " DEVICE_NAME, "%d devices, errno %d (%s)", n, errno, strerror(errno)))
		return 1;
	ch = ibv_create_comp_channel(ctx);
	pd = ibv_alloc_pd(ctx);
	mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	cq = ch ? ibv_create_cq(ctx, 16, NULL, ch, 0) : NULL;
	if (cq) {
		struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					       .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
							.max_recv_sge = 1 } };

		qp = ibv_create_qp(pd, &ia);
	}
	if (!check(ch && pd && mr && cq && qp, "setup", "channel %p pd %p mr %p cq %p qp %p errno %d (%s)", (void *)ch,
		   (void *)pd, (void *)mr, (void *)cq, (void *)qp, errno, strerror(errno)))
		return 1;
	/* RTS, connected to itself, so that a post after the device is gone reaches the ring. */
	{
		union ibv_gid gid;
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
					 .qp_access_flags = IBV_ACCESS_LOCAL_WRITE };

		rc = ibv_query_gid(ctx, 1, 0, &gid);
		if (rc == 0)
			rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
		a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = qp->qp_num,
					  .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
					  .ah_attr = { .is_global = 1, .port_num = 1,
						       .grh = { .dgid = gid, .hop_limit = 64 } } };
		if (rc == 0)
			rc = ibv_modify_qp(qp, &a,
					   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
						   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
		a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
					  .max_rd_atomic = 1 };
		if (rc == 0)
			rc = ibv_modify_qp(qp, &a,
					   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
						   IBV_QP_MAX_QP_RD_ATOMIC);
		if (!check(rc == 0 && qp->state == IBV_QPS_RTS, "RC QP to RTS (loopback)", "rc %d (%s) state %d", rc,
			   strerror(rc), qp->state))
			return 1;
	}

	alarm(0);
	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin)) {
		/* EOF: go on all the same */
	}
	alarm(20);

	struct ibv_async_event ev;

	/* As the kernel's uverbs on a device removal: the async event fd and the completion
	 * channel's fd wake up, so a program sleeping in poll/epoll on them learns of it. */
	stage = "poll on the async and completion channel fds";
	{
		/* Each fd is polled until it is readable or 10 s have gone: the two wake-ups are two
		 * writes, and once one fd is readable a poll of both returns at once, so the budget is
		 * time, not a count of polls. */
		struct pollfd p[2] = { { .fd = ctx->async_fd, .events = POLLIN }, { .fd = ch->fd, .events = POLLIN } };
		short seen[2] = { 0, 0 };

		for (int waited_ms = 0; waited_ms < 10000 && !(seen[0] && seen[1]); waited_ms += 10) {
			for (int i = 0; i < 2; i++) {
				if (seen[i])
					continue;
				p[i].revents = 0;
				poll(&p[i], 1, 0);
				seen[i] = p[i].revents & POLLIN;
			}
			if (!(seen[0] && seen[1]))
				usleep(10000);
		}
		check(seen[0] && seen[1], "the async and completion channel fds wake when the device goes",
		      "async revents %#x, channel revents %#x", seen[0], seen[1]);
	}

	stage = "ibv_get_async_event (first)";
	memset(&ev, 0, sizeof(ev));
	rc = ibv_get_async_event(ctx, &ev);
	if (check(rc == 0 && ev.event_type == IBV_EVENT_DEVICE_FATAL, "ibv_get_async_event -> IBV_EVENT_DEVICE_FATAL",
		  "rc %d errno %d (%s) event_type %d (%s)", rc, errno, strerror(errno), ev.event_type,
		  ibv_event_type_str(ev.event_type)))
		ibv_ack_async_event(&ev);

	stage = "ibv_alloc_pd";
	errno = 0;
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	int e = errno;
	check(pd2 == NULL && e != 0, "ibv_alloc_pd fails with errno", "pd %p errno %d (%s)", (void *)pd2, e, strerror(e));

	stage = "ibv_modify_qp";
	{
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

		rc = ibv_modify_qp(qp, &a, IBV_QP_STATE);
		check(rc != 0, "ibv_modify_qp fails", "rc %d", rc);
		printf("# ibv_modify_qp RTS->ERR -> %d (%s)\n", rc, strerror(rc));
	}

	stage = "ibv_poll_cq";
	{
		struct ibv_wc wc[4];

		rc = ibv_poll_cq(cq, 4, wc);
		check(rc <= 0, "ibv_poll_cq returns 0 or negative", "rc %d", rc);
	}

	stage = "ibv_post_send";
	{
		struct ibv_sge s = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
		struct ibv_send_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED },
				   *bad = NULL;

		rc = ibv_post_send(qp, &w, &bad);
		check(1, "ibv_post_send returns", "-");
		printf("# ibv_post_send -> %d (%s), bad_wr %s\n", rc, strerror(rc), bad == &w ? "= wr" : "not set");
	}

	stage = "ibv_get_async_event (second)";
	memset(&ev, 0, sizeof(ev));
	errno = 0;
	rc = ibv_get_async_event(ctx, &ev);
	e = errno;
	check(rc == -1, "second ibv_get_async_event -> -1", "rc %d errno %d event_type %d (%s)", rc, e, ev.event_type,
	      ibv_event_type_str(ev.event_type));
	printf("# second ibv_get_async_event -> %d errno %d (%s)\n", rc, e, strerror(e));

	int r[6];

	stage = "ibv_destroy_qp";
	r[0] = ibv_destroy_qp(qp);
	stage = "ibv_destroy_cq";
	r[1] = ibv_destroy_cq(cq);
	stage = "ibv_destroy_comp_channel";
	r[2] = ibv_destroy_comp_channel(ch);
	stage = "ibv_dereg_mr";
	r[3] = ibv_dereg_mr(mr);
	stage = "ibv_dealloc_pd";
	r[4] = ibv_dealloc_pd(pd);
	stage = "ibv_close_device";
	r[5] = ibv_close_device(ctx);
	check(1, "teardown returns", "-");
	printf("# destroy_qp %d, destroy_cq %d, destroy_comp_channel %d, dereg_mr %d, dealloc_pd %d, close_device %d\n",
	       r[0], r[1], r[2], r[3], r[4], r[5]);
	stage = "ibv_free_device_list";
	ibv_free_device_list(list);
	alarm(0);

	printf("# %d failed\n", n_failures);
	return n_failures > 255 ? 255 : n_failures;
}
