/*
 * mpi_check.c: a small MPI program whose every result is checked, for scripts/test-cluster.sh.
 *
 *   mpicc -O1 -Wall -o mpi_check mpi_check.c
 *   mpirun -np 4 ... ./mpi_check [BYTES] [ITERS] [stamped]
 *
 * - ping-pong between rank 0 and every other rank: ITERS round trips of BYTES bytes (default
 *   65536 x 50), each message a pattern of (iteration, sender), checked by the receiver, and the
 *   mean round-trip time printed by rank 0 ("pingpong rank R: N B x I, rtt U us");
 *   with "stamped" (for bandwidth: the per-byte work of writing and checking every message
 *   would otherwise be what is timed), each sender's pattern is written once, every message
 *   carries its iteration number at its start, middle and end (checked by the receiver on
 *   every message), and the last message received is checked in full;
 * - MPI_Allreduce (sum and max over a vector of 1024 ints, known results);
 * - MPI_Alltoall (each rank sends rank*1000+destination to every rank; all checked);
 * - MPI_Barrier.
 * Prints "mpi_check: OK (P ranks on H hosts)" from rank 0 when every check held on every rank,
 * and exits 0; otherwise "mpi_check: FAIL ..." and a non-zero status (MPI_Abort).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

static void fail(const char *what)
{
	fprintf(stderr, "mpi_check: FAIL on rank %d: %s\n", rank, what);
	MPI_Abort(MPI_COMM_WORLD, 2);
}

static unsigned char pattern(int iter, int from, size_t i)
{
	return (unsigned char)(iter * 31 + from * 7 + i * 13);
}

int main(int argc, char **argv)
{
	size_t bytes = argc > 1 ? strtoul(argv[1], NULL, 0) : 65536;
	int iters = argc > 2 ? atoi(argv[2]) : 50;
	int stamped = argc > 3 && !strcmp(argv[3], "stamped");
	unsigned char *buf;
	char host[MPI_MAX_PROCESSOR_NAME], *hosts;
	int len, nhosts = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	buf = malloc(bytes ? bytes : 1);
	if (!buf)
		fail("malloc");

	/* How many distinct hosts (hostnames) the ranks run on. */
	memset(host, 0, sizeof(host));
	MPI_Get_processor_name(host, &len);
	hosts = calloc((size_t)size, MPI_MAX_PROCESSOR_NAME);
	MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts, MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
		      MPI_COMM_WORLD);
	for (int r = 0; r < size; r++) {
		int seen = 0;
		for (int q = 0; q < r; q++)
			seen |= !strcmp(hosts + (size_t)r * MPI_MAX_PROCESSOR_NAME,
					hosts + (size_t)q * MPI_MAX_PROCESSOR_NAME);
		nhosts += !seen;
	}

	for (int peer = 1; stamped && peer < size; peer++) {
		/* Messages of at least 12 bytes: three 4-byte stamps that do not overlap. */
		size_t at[3] = { 0, (bytes / 2) & ~(size_t)3, bytes - 4 };
		unsigned char *rbuf = malloc(bytes);
		int me = rank == 0 ? 0 : peer, from = rank == 0 ? peer : 0;
		double t0;
		if (!rbuf || bytes < 12)
			fail("stamped: malloc, or a message under 12 bytes");
		for (size_t i = 0; i < bytes; i++)
			buf[i] = pattern(0, me, i);
		t0 = MPI_Wtime();
		for (int it = 0; it < iters && (rank == 0 || rank == peer); it++) {
			for (int k = 0; k < 3; k++)
				memcpy(buf + at[k], &it, 4);
			if (rank == 0) {
				MPI_Send(buf, (int)bytes, MPI_BYTE, peer, it, MPI_COMM_WORLD);
				MPI_Recv(rbuf, (int)bytes, MPI_BYTE, peer, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			} else {
				MPI_Recv(rbuf, (int)bytes, MPI_BYTE, 0, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			}
			for (int k = 0; k < 3; k++)
				if (memcmp(rbuf + at[k], &it, 4))
					fail("stamped ping-pong: a message's iteration stamp");
			if (rank != 0)
				MPI_Send(buf, (int)bytes, MPI_BYTE, 0, it, MPI_COMM_WORLD);
		}
		if (rank == 0 && iters > 0)
			printf("pingpong rank %d: %zu B x %d, rtt %.1f us\n", peer, bytes, iters,
			       (MPI_Wtime() - t0) * 1e6 / iters);
		if ((rank == 0 || rank == peer) && iters > 0)
			for (size_t i = 0; i < bytes; i++)
				if ((i < at[0] + 4 || (i >= at[1] && i < at[1] + 4) || i >= at[2]) ? 0
				    : rbuf[i] != pattern(0, from, i))
					fail("stamped ping-pong: the last message's data");
		free(rbuf);
	}

	for (int peer = 1; !stamped && peer < size; peer++) {
		double t0 = MPI_Wtime();
		for (int it = 0; it < iters && (rank == 0 || rank == peer); it++) {
			if (rank == 0) {
				for (size_t i = 0; i < bytes; i++)
					buf[i] = pattern(it, 0, i);
				MPI_Send(buf, (int)bytes, MPI_BYTE, peer, it, MPI_COMM_WORLD);
				MPI_Recv(buf, (int)bytes, MPI_BYTE, peer, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (size_t i = 0; i < bytes; i++)
					if (buf[i] != pattern(it, peer, i))
						fail("ping-pong reply data");
			} else {
				MPI_Recv(buf, (int)bytes, MPI_BYTE, 0, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (size_t i = 0; i < bytes; i++)
					if (buf[i] != pattern(it, 0, i))
						fail("ping-pong request data");
				for (size_t i = 0; i < bytes; i++)
					buf[i] = pattern(it, peer, i);
				MPI_Send(buf, (int)bytes, MPI_BYTE, 0, it, MPI_COMM_WORLD);
			}
		}
		if (rank == 0 && iters > 0)
			printf("pingpong rank %d: %zu B x %d, rtt %.1f us\n", peer, bytes, iters,
			       (MPI_Wtime() - t0) * 1e6 / iters);
	}

	{
		enum { N = 1024 };
		static int in[N], sum[N], max[N];
		for (int i = 0; i < N; i++)
			in[i] = rank * N + i;
		MPI_Allreduce(in, sum, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
		MPI_Allreduce(in, max, N, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
		for (int i = 0; i < N; i++) {
			if (sum[i] != N * size * (size - 1) / 2 + size * i)
				fail("MPI_Allreduce sum");
			if (max[i] != (size - 1) * N + i)
				fail("MPI_Allreduce max");
		}
	}
	{
		int *out = malloc(sizeof(int) * (size_t)size), *got = malloc(sizeof(int) * (size_t)size);
		for (int d = 0; d < size; d++)
			out[d] = rank * 1000 + d;
		MPI_Alltoall(out, 1, MPI_INT, got, 1, MPI_INT, MPI_COMM_WORLD);
		for (int s = 0; s < size; s++)
			if (got[s] != s * 1000 + rank)
				fail("MPI_Alltoall");
		free(out);
		free(got);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		printf("mpi_check: OK (%d ranks on %d hosts)\n", size, nhosts);
	free(hosts);
	free(buf);
	MPI_Finalize();
	return 0;
}
