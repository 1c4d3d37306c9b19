/* MPI ping-pong between ranks 0 and 1: the link between two pipeline stages as the runtime
 * sees it (the same MPI, the same transport between the same cores). One-way time of an
 * 8-byte message and of a `--bytes` message (a stage's activations), each the median of
 * `--repeats` round trips halved; fitted exactly at those two sizes as latency + bytes /
 * bandwidth, the simulator's link model. Prints the cluster file's link object on rank 0:
 *   {"gbps": G, "latency_us": L, "bytes": N, "one_way_us": T}
 *
 * usage: mpirun -np 2 build/bench/pingpong [--bytes N] [--repeats N] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "stats.h"

#define CHECK(call)                                                                          \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        if (rc_ != MPI_SUCCESS) {                                                            \
            fprintf(stderr, "pingpong: %s failed at %s:%d (MPI error %d)\n", #call, __FILE__, \
                    __LINE__, rc_);                                                          \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                    \
        }                                                                                    \
    } while (0)

/* Median one-way time in microseconds of `bytes` bytes between ranks 0 and 1. */
static double one_way_us(int rank, char *buf, int bytes, int repeats, double *t)
{
    for (int i = -3; i < repeats; i++) { /* three round trips of warm-up */
        CHECK(MPI_Barrier(MPI_COMM_WORLD));
        double t0 = clock_now_s();
        if (rank == 0) {
            CHECK(MPI_Send(buf, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD));
            CHECK(MPI_Recv(buf, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        } else if (rank == 1) {
            CHECK(MPI_Recv(buf, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
            CHECK(MPI_Send(buf, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD));
        }
        if (i >= 0)
            t[i] = (clock_now_s() - t0) * 1e6 / 2;
    }
    return stats_upper_median(t, repeats);
}

static int parse_long(const char *text, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    long bytes = 262144, repeats = 200;
    int rank, size;
    CHECK(MPI_Init(&argc, &argv));
    CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    for (int i = 1; i < argc; i++) {
        int ok = i + 1 < argc;
        if (ok && strcmp(argv[i], "--bytes") == 0)
            ok = parse_long(argv[++i], 9, 1 << 30, &bytes) == 0;
        else if (ok && strcmp(argv[i], "--repeats") == 0)
            ok = parse_long(argv[++i], 1, 1000000, &repeats) == 0;
        else
            ok = 0;
        if (!ok) {
            if (rank == 0)
                fprintf(stderr, "usage: mpirun -np 2 pingpong [--bytes 9..2^30] "
                                "[--repeats 1..1000000]\n");
            MPI_Finalize();
            return 2;
        }
    }
    if (size != 2) {
        if (rank == 0)
            fprintf(stderr, "pingpong: run it on 2 ranks (mpirun -np 2), not %d\n", size);
        MPI_Finalize();
        return 2;
    }
    char *buf = calloc((size_t)bytes, 1);
    double *t = malloc(sizeof(double) * (size_t)repeats);
    if (buf == NULL || t == NULL) {
        fprintf(stderr, "pingpong: out of memory for %ld bytes\n", bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double small = one_way_us(rank, buf, 8, (int)repeats, t);
    double large = one_way_us(rank, buf, (int)bytes, (int)repeats, t);
    /* latency + bytes * 8 / gbps, exact at 8 bytes and at `bytes` */
    double per_byte_us = (large - small) / (double)(bytes - 8);
    double latency = small - 8 * per_byte_us;
    if (latency < 0)
        latency = 0;
    double gbps = per_byte_us > 0 ? 8e-3 / per_byte_us : 1e9;
    if (rank == 0)
        printf("{\"gbps\": %.6g, \"latency_us\": %.6g, \"bytes\": %ld, \"one_way_us\": %.6g}\n",
               gbps, latency, bytes, large);
    free(buf);
    free(t);
    CHECK(MPI_Finalize());
    return 0;
}
