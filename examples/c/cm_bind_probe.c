/*
 * cm_bind_probe.c: what rdma_bind_addr does with each address given, for comparing softrdma's
 * librdmacm with the kernel's (conformance/interop/rxe.sh runs it on both sides).
 *
 *   cm_bind_probe ADDR...
 *
 * For each address, one line: "ADDR: bound, device NAME" (the ID was attached to a device:
 * id->verbs set), "ADDR: bound, no device" (id->verbs NULL), or "ADDR: error STRERROR". Exit 0.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <rdma/rdma_cma.h>

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();

	if (!ch) {
		perror("rdma_create_event_channel");
		return 1;
	}
	for (int i = 1; i < argc; i++) {
		struct sockaddr_storage ss;
		struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
		struct rdma_cm_id *id;

		memset(&ss, 0, sizeof(ss));
		if (inet_pton(AF_INET, argv[i], &in4->sin_addr) == 1) {
			in4->sin_family = AF_INET;
		} else if (inet_pton(AF_INET6, argv[i], &in6->sin6_addr) == 1) {
			in6->sin6_family = AF_INET6;
		} else {
			printf("%s: not an address\n", argv[i]);
			continue;
		}
		if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
			printf("%s: rdma_create_id: %s\n", argv[i], strerror(errno));
			continue;
		}
		if (rdma_bind_addr(id, (struct sockaddr *)&ss))
			printf("%s: error %s\n", argv[i], strerror(errno));
		else if (id->verbs)
			printf("%s: bound, device %s\n", argv[i], ibv_get_device_name(id->verbs->device));
		else
			printf("%s: bound, no device\n", argv[i]);
		rdma_destroy_id(id);
	}
	rdma_destroy_event_channel(ch);
	return 0;
}
