/*
 * cm_bad_input.c: librdmacm calls that must fail, each with the errno librdmacm and the kernel's
 * rdma_cm give, on a device that goes on working for good calls afterwards.
 *
 *   cc -O1 -Wall -Werror cm_bad_input.c -o cm_bad_input -L$SHIM -lrdmacm -libverbs -lpthread
 *   LD_LIBRARY_PATH=$SHIM ./cm_bad_input ADDR PORT
 *
 * ADDR is a device's address; PORT a free rdma_cm port. One ID listens there; the others connect
 * to it through the same device.
 *
 * Output: one line per check, "ok <name>" or "FAIL <name>: <detail>". Exit status: the number of
 * failures. A watchdog (alarm) turns a blocked call into a failure.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <endian.h>
#include <stdint.h>
#include <rdma/rdma_cma.h>
#include <infiniband/sa.h>

#include "check.h"

static struct rdma_event_channel *ch;

/* A CM thread that calls rdma_get_cm_event once more after its channel was destroyed. */
static volatile int late_returned;
static void *late_reader(void *arg)
{
	struct rdma_cm_event *ev;

	rdma_get_cm_event(arg, &ev);
	late_returned = 1;
	return NULL;
}

/* rdma-core 44's rping destroys its event channel without joining its CM thread, which may be
 * between two calls of rdma_get_cm_event (it has just acknowledged the event that let the main
 * thread go on). On the kernel a read() of the closed ucma fd already under way stays blocked;
 * here the channel's next read must block too, not fail with EBADF (rping then exits 255). */
static void destroyed_channel_blocks_a_late_reader(void)
{
	struct rdma_event_channel *c = rdma_create_event_channel();
	pthread_t t;

	if (!c) {
		check(0, "a late reader of a destroyed channel blocks", "rdma_create_event_channel: %s",
		      strerror(errno));
		return;
	}
	rdma_destroy_event_channel(c);
	pthread_create(&t, NULL, late_reader, c);
	usleep(300 * 1000);
	check(!late_returned, "a late reader of a destroyed channel blocks", "rdma_get_cm_event returned");
	pthread_detach(t);
}

/* The next event, which must be `want`; NULL (and a failed check) otherwise. */
static struct rdma_cm_event *expect(enum rdma_cm_event_type want, const char *name)
{
	struct rdma_cm_event *ev = NULL;

	if (rdma_get_cm_event(ch, &ev)) {
		check(0, name, "rdma_get_cm_event: %s", strerror(errno));
		return NULL;
	}
	if (ev->event != want) {
		check(0, name, "got %s (status %d), wanted %s", rdma_event_str(ev->event), ev->status,
		      rdma_event_str(want));
		rdma_ack_cm_event(ev);
		return NULL;
	}
	return ev;
}

/* A new ID with its address and route resolved to `dst`. */
static struct rdma_cm_id *resolved(struct sockaddr_in *dst)
{
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;

	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		return NULL;
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)dst, 2000))
		return NULL;
	if (!(ev = expect(RDMA_CM_EVENT_ADDR_RESOLVED, "resolve addr")))
		return NULL;
	rdma_ack_cm_event(ev);
	if (rdma_resolve_route(id, 2000))
		return NULL;
	if (!(ev = expect(RDMA_CM_EVENT_ROUTE_RESOLVED, "resolve route")))
		return NULL;
	rdma_ack_cm_event(ev);
	return id;
}

static int connect_with(struct rdma_cm_id *id, const void *data, int len)
{
	struct rdma_conn_param p;

	memset(&p, 0, sizeof(p));
	p.private_data = data;
	p.private_data_len = len;
	p.qp_num = 0x1234; /* no QP: the REQ carries the number given */
	p.retry_count = 7;
	p.rnr_retry_count = 7;
	return rdma_connect(id, &p);
}

static volatile int destroyed;

static void *destroy_thread(void *arg)
{
	rdma_destroy_id(arg);
	destroyed = 1;
	return NULL;
}

/* Multicast joins that must fail (cma.c rdma_join_multicast, librdmacm), and the group limit. */
static void mcast_bad_input(const struct sockaddr_in *dev)
{
	struct rdma_cm_id *u, *t;
	struct rdma_cm_event *ev;
	struct sockaddr_in g, src = *dev;
	int rc, k, joined = 0, limit_errno = 0;

	src.sin_port = 0;
	memset(&g, 0, sizeof(g));
	g.sin_family = AF_INET;
	rdma_create_id(ch, &u, NULL, RDMA_PS_UDP);
	/* An unbound ID cannot join (the kernel: not ADDR_BOUND or ADDR_RESOLVED). */
	inet_pton(AF_INET, "239.9.8.7", &g.sin_addr);
	errno = 0;
	rc = rdma_join_multicast(u, (struct sockaddr *)&g, NULL);
	check(rc == -1 && errno == EINVAL, "join on an unbound ID is EINVAL", "rc %d errno %d", rc, errno);
	rdma_bind_addr(u, (struct sockaddr *)&src);
	/* A unicast address is no group. */
	struct sockaddr_in uni = *dev;

	errno = 0;
	rc = rdma_join_multicast(u, (struct sockaddr *)&uni, NULL);
	check(rc == -1 && errno == EINVAL, "join of a unicast address is EINVAL", "rc %d errno %d", rc, errno);
	/* A connected-mode ID cannot join. */
	rdma_create_id(ch, &t, NULL, RDMA_PS_TCP);
	rdma_bind_addr(t, (struct sockaddr *)&src);
	errno = 0;
	rc = rdma_join_multicast(t, (struct sockaddr *)&g, NULL);
	check(rc == -1 && errno == EINVAL, "join on an RC (RDMA_PS_TCP) ID is EINVAL", "rc %d errno %d", rc, errno);
	rdma_destroy_id(t);
	/* Leaving a group never joined. */
	errno = 0;
	rc = rdma_leave_multicast(u, (struct sockaddr *)&g);
	check(rc == -1 && errno == EADDRNOTAVAIL, "leave of a group never joined is EADDRNOTAVAIL", "rc %d errno %d",
	      rc, errno);
	/* A good join: the event gives QPN 0xFFFFFF, the Q_Key and the join's context. */
	rc = rdma_join_multicast(u, (struct sockaddr *)&g, (void *)0x77);
	if ((ev = expect(RDMA_CM_EVENT_MULTICAST_JOIN, "MULTICAST_JOIN"))) {
		check(ev->param.ud.qp_num == 0xffffff && ev->param.ud.qkey == 0x01234567 &&
			      ev->param.ud.private_data == (void *)0x77 && ev->param.ud.ah_attr.is_global &&
			      ev->param.ud.ah_attr.grh.dgid.raw[10] == 0xff && ev->param.ud.ah_attr.grh.dgid.raw[12] == 239,
		      "MULTICAST_JOIN: QPN 0xFFFFFF, Q_Key 0x01234567, the context, MGID ::ffff:G",
		      "qpn 0x%x qkey 0x%x ctx %p", ev->param.ud.qp_num, ev->param.ud.qkey, ev->param.ud.private_data);
		rdma_ack_cm_event(ev);
	}
	rc = rdma_leave_multicast(u, (struct sockaddr *)&g);
	check(rc == 0, "leave of the joined group", "rc %d errno %d", rc, errno);
	/* 1,000 groups: the device's limit (max_mcast_grp) is an error, not a crash. */
	for (k = 0; k < 1000; k++) {
		g.sin_addr.s_addr = htonl(0xef0a0000u + (unsigned)k); /* 239.10.x.y */
		if (rdma_join_multicast(u, (struct sockaddr *)&g, NULL)) {
			limit_errno = errno;
			break;
		}
		joined++;
		if ((ev = expect(RDMA_CM_EVENT_MULTICAST_JOIN, "MULTICAST_JOIN of many")))
			rdma_ack_cm_event(ev);
	}
	check(joined > 0 && joined < 1000 && limit_errno == ENOMEM, "1,000 joins stop at the device's group limit (ENOMEM)",
	      "joined %d errno %d", joined, limit_errno);
	rdma_destroy_id(u); /* leaves them all */
	rdma_create_id(ch, &u, NULL, RDMA_PS_UDP);
	rdma_bind_addr(u, (struct sockaddr *)&src);
	g.sin_addr.s_addr = htonl(0xef0a0000u);
	rc = rdma_join_multicast(u, (struct sockaddr *)&g, NULL);
	if (rc == 0 && (ev = expect(RDMA_CM_EVENT_MULTICAST_JOIN, "MULTICAST_JOIN after destroy")))
		rdma_ack_cm_event(ev);
	check(rc == 0, "destroying the ID left its groups: a join works again", "rc %d errno %d", rc, errno);
	rdma_destroy_id(u);
}

/*
 * RDMA_OPTION_IB_PATH: the application's own path record becomes the route (the kernel's
 * ucma_set_ib_path / rdma_set_ib_path on RoCE): EINVAL before the address is resolved, for a
 * length that is not whole records, without a primary bidirectional GMP record, and once the
 * route is set; otherwise ROUTE_RESOLVED, the record in id->route, and a REQ that carries it
 * (the passive side's RTR attributes come from it).
 */
static void path_option(const struct sockaddr_in *dev, struct rdma_cm_id *listener)
{
	struct ibv_path_data pd[2];
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	struct sockaddr_in dst = *dev;
	uint8_t gid[16] = {0};
	int rc;

	if (!check(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "path option: create id", "%s", strerror(errno)))
		return;
	memset(pd, 0, sizeof(pd));
	gid[10] = 0xff;
	gid[11] = 0xff;
	memcpy(&gid[12], &dev->sin_addr, 4);
	for (int k = 0; k < 2; k++) {
		memcpy(pd[k].path.dgid.raw, gid, 16);
		memcpy(pd[k].path.sgid.raw, gid, 16);
		pd[k].path.flowlabel_hoplimit = htobe32((0x2345u << 8) | 9);
		pd[k].path.tclass = 0x20;
		pd[k].path.reversible_numpath = 0x81;
		pd[k].path.pkey = htobe16(0xffff);
		pd[k].path.qosclass_sl = htobe16(2);
		pd[k].path.mtu = (2 << 6) | IBV_MTU_512;
		pd[k].path.rate = (2 << 6) | 0;
		pd[k].path.packetlifetime = (2 << 6) | 10;
	}
	/* The first record is an alternate, the second the primary. */
	pd[0].flags = IBV_PATH_FLAG_GMP | IBV_PATH_FLAG_ALTERNATE | IBV_PATH_FLAG_BIDIRECTIONAL;
	pd[1].flags = IBV_PATH_FLAG_GMP | IBV_PATH_FLAG_PRIMARY | IBV_PATH_FLAG_BIDIRECTIONAL;
	rc = rdma_set_option(id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, pd, sizeof(pd));
	check(rc == -1 && errno == EINVAL, "IB_PATH before the address is resolved is EINVAL", "rc %d errno %d", rc,
	      errno);
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) ||
	    !(ev = expect(RDMA_CM_EVENT_ADDR_RESOLVED, "path option: resolve addr"))) {
		rdma_destroy_id(id);
		return;
	}
	rdma_ack_cm_event(ev);
	/* librdmacm's ucma_get_device: an ID bound to a device has the device's default PD. */
	check(id->verbs && id->pd && id->pd->context == id->verbs, "a resolved ID has the device's default PD",
	      "verbs %p pd %p", (void *)id->verbs, (void *)id->pd);
	rc = rdma_set_option(id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, pd, sizeof(pd) - 1);
	check(rc == -1 && errno == EINVAL, "IB_PATH of a partial record is EINVAL", "rc %d errno %d", rc, errno);
	rc = rdma_set_option(id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, pd, sizeof(pd[0]));
	check(rc == -1 && errno == EINVAL, "IB_PATH without a primary GMP record is EINVAL", "rc %d errno %d", rc,
	      errno);
	rc = rdma_set_option(id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, pd, sizeof(pd));
	if (!check(rc == 0, "IB_PATH with a primary record", "rc %d errno %d", rc, errno)) {
		rdma_destroy_id(id);
		return;
	}
	if ((ev = expect(RDMA_CM_EVENT_ROUTE_RESOLVED, "IB_PATH reports ROUTE_RESOLVED")))
		rdma_ack_cm_event(ev);
	{
		struct ibv_sa_path_rec *r = id->route.path_rec;

		check(id->route.num_paths == 1 && r && r->hop_limit == 9 && r->traffic_class == 0x20 &&
			      r->mtu == IBV_MTU_512 && r->packet_life_time == 10 && r->sl == 2 &&
			      be32toh(r->flow_label) == 0x2345 && !memcmp(r->dgid.raw, gid, 16),
		      "id->route holds the record given", "num_paths %d hop %d tc %d mtu %d plt %d sl %d fl %#x",
		      id->route.num_paths, r ? r->hop_limit : -1, r ? r->traffic_class : -1, r ? r->mtu : -1,
		      r ? r->packet_life_time : -1, r ? r->sl : -1, r ? be32toh(r->flow_label) : 0);
	}
	rc = rdma_resolve_route(id, 2000);
	check(rc == -1 && errno == EINVAL, "rdma_resolve_route after IB_PATH is EINVAL", "rc %d errno %d", rc, errno);
	rc = rdma_set_option(id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, pd, sizeof(pd));
	check(rc == -1 && errno == EINVAL, "a second IB_PATH is EINVAL", "rc %d errno %d", rc, errno);
	{
		struct rdma_conn_param cp;

		/* A QP number of its own: the earlier connection's (0x1234) is still in timewait, and
		 * its REQ would be a stale connection. */
		memset(&cp, 0, sizeof(cp));
		cp.qp_num = 0x1235;
		cp.retry_count = 7;
		cp.rnr_retry_count = 7;
		rc = rdma_connect(id, &cp);
		check(rc == 0, "IB_PATH: connect", "rc %d errno %d", rc, errno);
	}
	if (rc == 0 && (ev = expect(RDMA_CM_EVENT_CONNECT_REQUEST, "IB_PATH: the REQ arrives"))) {
		struct rdma_cm_id *r = ev->id;
		struct ibv_qp_attr qa;
		int mask = 0;

		check(ev->listen_id == listener, "IB_PATH: the REQ reaches the listener", "another listener");
		rdma_ack_cm_event(ev);
		{
			/* The passive ID's route is the REQ's path (cma_ib_new_conn_id), its packet
			 * lifetime one below the REQ's local ACK timeout (10 + 1). */
			struct ibv_sa_path_rec *pr = r->route.path_rec;

			check(r->route.num_paths == 1 && pr && pr->hop_limit == 9 && pr->traffic_class == 0x20 &&
				      pr->mtu == IBV_MTU_512 && pr->sl == 2 && pr->packet_life_time == 10 &&
				      be32toh(pr->flow_label) == 0x2345 && !memcmp(pr->dgid.raw, gid, 16),
			      "the passive ID's route is the REQ's path",
			      "num_paths %d hop %d tc %d mtu %d sl %d plt %d fl %#x", r->route.num_paths,
			      pr ? pr->hop_limit : -1, pr ? pr->traffic_class : -1, pr ? pr->mtu : -1,
			      pr ? pr->sl : -1, pr ? pr->packet_life_time : -1, pr ? be32toh(pr->flow_label) : 0);
		}
		memset(&qa, 0, sizeof(qa));
		qa.qp_state = IBV_QPS_RTR;
		rc = rdma_init_qp_attr(r, &qa, &mask);
		check(rc == 0 && qa.path_mtu == IBV_MTU_512 && qa.ah_attr.grh.hop_limit == 9 &&
			      qa.ah_attr.grh.traffic_class == 0x20 && qa.ah_attr.grh.flow_label == 0x2345,
		      "the passive side's RTR attributes come from the REQ's path",
		      "rc %d mtu %d hop %d tc %d fl %#x", rc, qa.path_mtu, qa.ah_attr.grh.hop_limit,
		      qa.ah_attr.grh.traffic_class, qa.ah_attr.grh.flow_label);
		rdma_reject(r, NULL, 0);
		if ((ev = expect(RDMA_CM_EVENT_REJECTED, "IB_PATH: the rejected REQ")))
			rdma_ack_cm_event(ev);
		rdma_destroy_id(r);
	}
	rdma_destroy_id(id);
}

int main(int argc, char **argv)
{
	struct rdma_cm_id *l, *x, *c, *r;
	struct rdma_cm_event *ev;
	struct sockaddr_in a;
	struct rdma_conn_param p;
	unsigned char data[255];
	pthread_t t;
	int rc, i;

	if (argc != 3) {
		fprintf(stderr, "usage: cm_bad_input ADDR PORT\n");
		return 2;
	}
	alarm(60);
	for (i = 0; i < (int)sizeof(data); i++)
		data[i] = (unsigned char)(i * 7 + 1);
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons(atoi(argv[2]));
	if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) {
		fprintf(stderr, "cm_bad_input: bad address %s\n", argv[1]);
		return 2;
	}
	ch = rdma_create_event_channel();
	if (!check(ch != NULL, "event channel", "%s", strerror(errno)))
		return n_failures;
	rc = rdma_create_id(ch, &l, NULL, RDMA_PS_TCP);
	if (!check(rc == 0 && rdma_bind_addr(l, (struct sockaddr *)&a) == 0 && rdma_listen(l, 4) == 0,
		   "listen", "%s", strerror(errno)))
		return n_failures;

	/* cma_bind_port / cma_check_port: the port is taken in the port space. */
	rdma_create_id(ch, &x, NULL, RDMA_PS_TCP);
	errno = 0;
	rc = rdma_bind_addr(x, (struct sockaddr *)&a);
	check(rc == -1 && errno == EADDRINUSE, "bind to a listening port is EADDRINUSE", "rc %d errno %d", rc,
	      errno);
	/* The same port in another port space is free (service IDs differ per port space). */
	rdma_destroy_id(x);
	rdma_create_id(ch, &x, NULL, RDMA_PS_IB);
	rc = rdma_bind_addr(x, (struct sockaddr *)&a);
	check(rc == 0, "the same port in RDMA_PS_IB is free", "rc %d errno %d", rc, errno);
	rdma_destroy_id(x);

	/* rdma_bind_addr to an address no device holds: a loopback address binds without a device
	 * (id->verbs NULL, as the kernel: measured against rxe), an address of no interface is
	 * EADDRNOTAVAIL (cma_translate_addr). */
	{
		struct sockaddr_in lb = a, none = a;

		lb.sin_port = 0;
		inet_pton(AF_INET, "127.0.0.2", &lb.sin_addr);
		none.sin_port = 0;
		inet_pton(AF_INET, "192.0.2.1", &none.sin_addr);
		rdma_create_id(ch, &x, NULL, RDMA_PS_TCP);
		rc = rdma_bind_addr(x, (struct sockaddr *)&lb);
		check(rc == 0 && x->verbs == NULL, "bind to a loopback address of no device binds without one",
		      "rc %d errno %d verbs %p", rc, errno, (void *)x->verbs);
		rdma_destroy_id(x);
		rdma_create_id(ch, &x, NULL, RDMA_PS_TCP);
		errno = 0;
		rc = rdma_bind_addr(x, (struct sockaddr *)&none);
		check(rc == -1 && errno == EADDRNOTAVAIL, "bind to an address of no interface is EADDRNOTAVAIL",
		      "rc %d errno %d", rc, errno);
		rdma_destroy_id(x);
	}

	/* cma_connect_ib: private data beyond the REQ's 92 bytes less the 36-byte cma_hdr. */
	c = resolved(&a);
	if (!check(c != NULL, "resolve to the listener", "%s", strerror(errno)))
		return n_failures;
	errno = 0;
	rc = connect_with(c, data, 57);
	check(rc == -1 && errno == EINVAL, "57 bytes of REQ private data is EINVAL", "rc %d errno %d", rc, errno);
	rc = connect_with(c, data, 56);
	check(rc == 0, "56 bytes of REQ private data connect", "rc %d errno %d", rc, errno);
	if ((ev = expect(RDMA_CM_EVENT_CONNECT_REQUEST, "CONNECT_REQUEST"))) {
		r = ev->id;
		check(ev->listen_id == l && ev->param.conn.private_data_len == 56 &&
			      memcmp(ev->param.conn.private_data, data, 56) == 0,
		      "the REQ's private data arrives whole", "len %d", ev->param.conn.private_data_len);
		rdma_ack_cm_event(ev);
		/* The REJ carries 148 bytes of private data, the REP 196 (IBTA 12.6.7, 12.6.8). */
		errno = 0;
		rc = rdma_reject(r, data, 149);
		check(rc == -1 && errno == EINVAL, "149 bytes of REJ private data is EINVAL", "rc %d errno %d", rc,
		      errno);
		memset(&p, 0, sizeof(p));
		p.private_data = data;
		p.private_data_len = 197;
		p.qp_num = 0x5678;
		errno = 0;
		rc = rdma_accept(r, &p);
		check(rc == -1 && errno == EINVAL, "197 bytes of REP private data is EINVAL", "rc %d errno %d", rc,
		      errno);
		rc = rdma_reject(r, data, 148);
		check(rc == 0, "reject with 148 bytes", "rc %d errno %d", rc, errno);
		if ((ev = expect(RDMA_CM_EVENT_REJECTED, "REJECTED"))) {
			check(ev->status == 28 && ev->param.conn.private_data_len >= 148 &&
				      memcmp(ev->param.conn.private_data, data, 148) == 0,
			      "the active side gets REJ 28 with the private data", "status %d len %d", ev->status,
			      ev->param.conn.private_data_len);
			rdma_ack_cm_event(ev);
		}
		rdma_destroy_id(r);
	}
	rdma_destroy_id(c);
	/* A destroyed ID is gone: librdmacm would read freed memory; here the call fails. */
	errno = 0;
	rc = rdma_listen(c, 1);
	check(rc == -1 && errno == EINVAL, "a call on a destroyed ID is EINVAL", "rc %d errno %d", rc, errno);

	/* rdma_destroy_id waits until the ID's events are acked (librdmacm's events_completed). */
	c = resolved(&a);
	if (c && connect_with(c, data, 8) == 0 && (ev = expect(RDMA_CM_EVENT_CONNECT_REQUEST, "second REQ"))) {
		r = ev->id;
		pthread_create(&t, NULL, destroy_thread, r);
		usleep(300000);
		check(!destroyed, "destroy waits for the unacked event", "returned before the ack");
		rdma_ack_cm_event(ev);
		pthread_join(t, NULL);
		check(destroyed, "destroy returns after the ack", "still blocked");
		/* Destroying the request rejects it (ucma close; REJ consumer defined, as the kernel). */
		if ((ev = expect(RDMA_CM_EVENT_REJECTED, "REJECTED after destroy"))) {
			check(ev->id == c, "the connecting ID is rejected", "another ID");
			rdma_ack_cm_event(ev);
		}
	}
	if (c)
		rdma_destroy_id(c);

	/* The device still connects: a whole connection, then a disconnect. It carries ECE (librdmacm
	 * 1.3): the REQ the active side's vendor and options, the REP the vendor back with the
	 * passive side's options (ucma_copy_ece_param_to_kern_req / _rep). */
	c = resolved(&a);
	if (c) {
		struct ibv_ece e = { .vendor_id = 0, .options = 1 };

		errno = 0;
		rc = rdma_set_local_ece(c, &e);
		check(rc == -1 && errno == EINVAL, "rdma_set_local_ece with vendor 0 is EINVAL", "rc %d errno %d", rc,
		      errno);
		e.vendor_id = 0x2c9;
		e.comp_mask = 1;
		errno = 0;
		rc = rdma_set_local_ece(c, &e);
		check(rc == -1 && errno == EINVAL, "rdma_set_local_ece with a comp_mask is EINVAL", "rc %d errno %d",
		      rc, errno);
		e.comp_mask = 0;
		e.options = 0x80000011;
		rc = rdma_set_local_ece(c, &e);
		check(rc == 0, "rdma_set_local_ece", "rc %d errno %d", rc, errno);
	}
	if (c && connect_with(c, "hello", 5) == 0 && (ev = expect(RDMA_CM_EVENT_CONNECT_REQUEST, "third REQ"))) {
		struct ibv_ece e;

		r = ev->id;
		rdma_ack_cm_event(ev);
		memset(&e, 0, sizeof(e));
		rc = rdma_get_remote_ece(r, &e);
		check(rc == 0 && e.vendor_id == 0x2c9 && e.options == 0x80000011,
		      "the REQ's ECE reaches the passive side", "rc %d vendor %#x options %#x", rc, e.vendor_id,
		      e.options);
		e.vendor_id = 0x2c9;
		e.options = 0x5;
		rdma_set_local_ece(r, &e);
		memset(&p, 0, sizeof(p));
		p.qp_num = 0x5678;
		rc = rdma_accept(r, &p);
		if ((ev = expect(RDMA_CM_EVENT_CONNECT_RESPONSE, "CONNECT_RESPONSE"))) {
			rdma_ack_cm_event(ev);
			memset(&e, 0, sizeof(e));
			rc = rdma_get_remote_ece(c, &e);
			check(rc == 0 && e.vendor_id == 0x2c9 && e.options == 0x5,
			      "the REP's ECE reaches the active side", "rc %d vendor %#x options %#x", rc,
			      e.vendor_id, e.options);
			rc = rdma_establish(c);
			if ((ev = expect(RDMA_CM_EVENT_ESTABLISHED, "ESTABLISHED")))
				rdma_ack_cm_event(ev);
			check(rc == 0, "a good connection after all that", "rc %d errno %d", rc, errno);
			/* DREQ: the passive side hears DISCONNECTED; its own disconnect sends the DREP that
			 * ends the active side's (cma_ib_handler, IB_CM_DREQ_RECEIVED / DREP_RECEIVED). */
			rdma_disconnect(c);
			if ((ev = expect(RDMA_CM_EVENT_DISCONNECTED, "DISCONNECTED on the passive side"))) {
				check(ev->id == r, "the DREQ reaches the passive ID", "another ID");
				rdma_ack_cm_event(ev);
			}
			rdma_disconnect(r);
			if ((ev = expect(RDMA_CM_EVENT_DISCONNECTED, "DISCONNECTED on the active side"))) {
				check(ev->id == c, "the DREP reaches the active ID", "another ID");
				rdma_ack_cm_event(ev);
			}
		}
		rdma_destroy_id(r);
	}
	if (c)
		rdma_destroy_id(c);
	path_option(&a, l);
	rdma_destroy_id(l);
	mcast_bad_input(&a);
	rdma_destroy_event_channel(ch);
	destroyed_channel_blocks_a_late_reader();
	printf("# %d checks, %d failed\n", n_checks, n_failures);
	return n_failures;
}
