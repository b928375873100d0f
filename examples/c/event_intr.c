/*
 * event_intr.c: what a signal does to a thread blocked in ibv_get_cq_event, against the kernel's
 * behaviour (the call is a read(2) of the completion channel's fd).
 *
 *   event_intr DEVICE intr      a SIGALRM handler installed without SA_RESTART ends the wait:
 *                               ibv_get_cq_event returns -1 with errno EINTR (qperf ends each
 *                               test from such a handler and waits for that)
 *   event_intr DEVICE restart   with SA_RESTART the wait goes on after the handler ran
 *
 * Prints "event_intr: MODE: OK ..." and exits 0, or says what happened instead and exits 1.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

static volatile sig_atomic_t fired;

static void on_alarm(int sig)
{
	(void)sig;
	fired = 1;
}

/* restart mode: the wait must still be going on a second after the handler ran. */
static void *watch(void *arg)
{
	(void)arg;
	while (!fired)
		usleep(10000);
	sleep(1);
	printf("event_intr: restart: OK, ibv_get_cq_event still waits after the SA_RESTART handler ran\n");
	fflush(stdout);
	_exit(0);
	return NULL;
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq, *ev_cq;
	struct sigaction sa;
	void *ev_ctx;
	pthread_t t;
	int restart, n, r, e;

	if (argc != 3 || (strcmp(argv[2], "intr") && strcmp(argv[2], "restart"))) {
		fprintf(stderr, "usage: event_intr DEVICE intr|restart\n");
		return 2;
	}
	restart = !strcmp(argv[2], "restart");
	list = ibv_get_device_list(&n);
	for (int i = 0; list && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			ctx = ibv_open_device(list[i]);
	if (!ctx) {
		fprintf(stderr, "event_intr: cannot open %s\n", argv[1]);
		return 1;
	}
	ch = ibv_create_comp_channel(ctx);
	cq = ch ? ibv_create_cq(ctx, 4, NULL, ch, 0) : NULL;
	if (!cq || ibv_req_notify_cq(cq, 0)) {
		fprintf(stderr, "event_intr: channel, CQ or arming failed: %s\n", strerror(errno));
		return 1;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sa.sa_flags = restart ? SA_RESTART : 0;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, NULL);
	if (restart && pthread_create(&t, NULL, watch, NULL)) {
		fprintf(stderr, "event_intr: pthread_create failed\n");
		return 1;
	}
	alarm(1);
	/* Nothing completes on this CQ: only the signal can end the wait. */
	r = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
	e = errno;
	if (restart) {
		fprintf(stderr, "event_intr: restart: ibv_get_cq_event returned %d (%s) after an SA_RESTART signal\n", r,
			strerror(e));
		return 1;
	}
	if (r != -1 || e != EINTR || !fired) {
		fprintf(stderr, "event_intr: intr: ibv_get_cq_event returned %d, errno %s, handler %s\n", r, strerror(e),
			fired ? "ran" : "did not run");
		return 1;
	}
	/* The objects are as before: destroying them succeeds. */
	if (ibv_destroy_cq(cq) || ibv_destroy_comp_channel(ch) || ibv_close_device(ctx)) {
		fprintf(stderr, "event_intr: intr: cleanup failed: %s\n", strerror(errno));
		return 1;
	}
	ibv_free_device_list(list);
	printf("event_intr: intr: OK, ibv_get_cq_event returned -1 with EINTR\n");
	return 0;
}
