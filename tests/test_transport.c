/* The transport choice against hand-made cases (fake GPU UUIDs: every rank on its own GPU,
 * ranks sharing one, a rank on the CPU, what --transport asks for), and, under `mpirun -np 2`,
 * the host-staged MPI transport over the CPU backend: several transfers in flight both ways,
 * waited for out of order, every byte where it belongs. */
#include <CUnit/CUnit.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "mpitest.h"
#include "testutil.h"
#include "transport.h"

static int choose(const char (*ids)[TRANSPORT_ID_MAX], int n, int self, const char *prefer,
                  enum transport_kind *k, char *why)
{
    return transport_choose(ids, n, self, prefer, k, why, 256);
}

static void test_choice(void)
{
    char why[256];
    enum transport_kind k;
    static const char distinct[4][TRANSPORT_ID_MAX] = {
        "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000",
        "GPU-cccccccc-0000-0000-0000-000000000000", "GPU-dddddddd-0000-0000-0000-000000000000"};
    for (int self = 0; self < 4; self++) {
        CU_ASSERT_EQUAL(choose(distinct, 4, self, "auto", &k, why), ERR_OK);
        CU_ASSERT_EQUAL(k, TRANSPORT_NCCL);
    }
    CU_ASSERT(strstr(why, "every rank has a GPU of its own") != NULL);
    /* four ranks on one GPU (the bench's emulated cluster): host-staged MPI on each */
    static const char one[4][TRANSPORT_ID_MAX] = {"GPU-x", "GPU-x", "GPU-x", "GPU-x"};
    for (int self = 0; self < 4; self++) {
        CU_ASSERT_EQUAL(choose(one, 4, self, "auto", &k, why), ERR_OK);
        CU_ASSERT_EQUAL(k, TRANSPORT_MPI_STAGED);
    }
    CU_ASSERT(strstr(why, "ranks 0 and 1 share the GPU GPU-x") != NULL);
    /* two of three share: NCCL is all or nothing */
    static const char some[3][TRANSPORT_ID_MAX] = {"GPU-a", "GPU-b", "GPU-b"};
    CU_ASSERT_EQUAL(choose(some, 3, 0, "auto", &k, why), ERR_OK);
    CU_ASSERT_EQUAL(k, TRANSPORT_MPI_STAGED);
    CU_ASSERT(strstr(why, "ranks 1 and 2 share") != NULL);
    /* a rank on the CPU: plain MPI there, staged on the GPU rank */
    static const char mixed[2][TRANSPORT_ID_MAX] = {"GPU-a", ""};
    CU_ASSERT_EQUAL(choose(mixed, 2, 0, "auto", &k, why), ERR_OK);
    CU_ASSERT_EQUAL(k, TRANSPORT_MPI_STAGED);
    CU_ASSERT_EQUAL(choose(mixed, 2, 1, "auto", &k, why), ERR_OK);
    CU_ASSERT_EQUAL(k, TRANSPORT_MPI);
    CU_ASSERT(strstr(why, "rank 1 computes on the CPU") != NULL);
    static const char cpus[3][TRANSPORT_ID_MAX] = {"", "", ""};
    CU_ASSERT_EQUAL(choose(cpus, 3, 2, "auto", &k, why), ERR_OK);
    CU_ASSERT_EQUAL(k, TRANSPORT_MPI);
    /* one rank: nothing to transfer, no NCCL */
    CU_ASSERT_EQUAL(choose(distinct, 1, 0, "auto", &k, why), ERR_OK);
    CU_ASSERT_NOT_EQUAL(k, TRANSPORT_NCCL);
    /* what the user asks for */
    CU_ASSERT_EQUAL(choose(distinct, 4, 1, "mpi", &k, why), ERR_OK);
    CU_ASSERT_EQUAL(k, TRANSPORT_MPI_STAGED);
    CU_ASSERT(strstr(why, "--transport mpi") != NULL);
    CU_ASSERT_EQUAL(choose(distinct, 4, 1, "nccl", &k, why), ERR_OK);
    CU_ASSERT_EQUAL(k, TRANSPORT_NCCL);
    CU_ASSERT_EQUAL(choose(one, 4, 0, "nccl", &k, why), ERR_INPUT);
    CU_ASSERT(strstr(why, "NCCL refuses two ranks on one GPU") != NULL);
    CU_ASSERT_EQUAL(choose(mixed, 2, 0, "nccl", &k, why), ERR_INPUT);
    CU_ASSERT_EQUAL(choose(distinct, 4, 0, "gloo", &k, why), ERR_INPUT);
    CU_ASSERT(strstr(why, "expected auto, mpi or nccl") != NULL);
}

/* Rank r sends N messages to the other rank and receives N from it, all posted before any
 * wait, waited for in a scrambled order; message i of rank r holds bytes (r, i, j). */
static void test_staged(void)
{
    enum { N = 6, BYTES = 3000 };
    int rank, size;
    MPI_Comm comm = MPI_COMM_WORLD;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    CU_ASSERT_EQUAL_FATAL(size, 2);
    struct backend be;
    struct transport t;
    struct err e;
    CU_ASSERT_EQUAL_FATAL(backend_cpu_init(&be, 1, &e), ERR_OK);
    CU_ASSERT_EQUAL_FATAL(transport_staged_init(&t, &comm, 4 * N, &be, BYTES, &e), ERR_OK);
    CU_ASSERT_EQUAL(t.rank, rank);
    unsigned char *out = malloc(N * BYTES), *in = calloc(N, BYTES);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < BYTES; j++)
            out[i * BYTES + j] = (unsigned char)(rank * 101 + i * 7 + j);
    int sreq[N], rreq[N], peer = 1 - rank;
    for (int i = 0; i < N; i++) {
        CU_ASSERT_EQUAL(t.ops->irecv(&t, in + i * BYTES, BYTES - i, peer, i, &rreq[i], &e), ERR_OK);
        CU_ASSERT_EQUAL(t.ops->isend(&t, out + i * BYTES, BYTES - i, peer, i, &sreq[i], &e), ERR_OK);
    }
    /* the send buffers may be reused at once: the transport holds copies */
    memset(out, 0, N * BYTES);
    static const int order[N] = {3, 0, 5, 1, 4, 2};
    for (int k = 0; k < N; k++) {
        CU_ASSERT_EQUAL(t.ops->wait(&t, rreq[order[k]], &e), ERR_OK);
        CU_ASSERT_EQUAL(t.ops->wait(&t, sreq[order[N - 1 - k]], &e), ERR_OK);
    }
    int ok = 1;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < BYTES; j++) {
            unsigned char want = j < BYTES - i ? (unsigned char)(peer * 101 + i * 7 + j) : 0;
            ok &= in[i * BYTES + j] == want;
        }
    CU_ASSERT(ok);
    /* a transfer beyond the staging size, and a wait on nothing, fail cleanly */
    int req;
    CU_ASSERT_EQUAL(t.ops->isend(&t, in, BYTES + 1, peer, 99, &req, &e), ERR_FAIL);
    CU_ASSERT_EQUAL(t.ops->wait(&t, 0, &e), ERR_FAIL);
    MPI_Barrier(comm);
    t.ops->free(&t);
    be.ops->free(&be);
    free(out);
    free(in);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("transport", NULL, NULL);
    CU_add_test(s, "NCCL when every rank has a GPU of its own, else MPI", test_choice);
    CU_add_test(s, "host-staged MPI: transfers in flight both ways, out-of-order waits",
                test_staged);
    return mpi_test_main();
}
