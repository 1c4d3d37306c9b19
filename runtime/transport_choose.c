/* Which transport a run uses: a pure function of the ranks' GPUs, so that every rank, given
 * the same gathered ids, makes the same choice. */
#include <stdio.h>
#include <string.h>

#include "transport.h"

const char *transport_kind_name(enum transport_kind k)
{
    switch (k) {
    case TRANSPORT_MPI:
        return "mpi";
    case TRANSPORT_MPI_STAGED:
        return "mpi (host-staged)";
    case TRANSPORT_NCCL:
        return "nccl";
    }
    return "?";
}

int transport_choose(const char (*gpu_ids)[TRANSPORT_ID_MAX], int n, int self,
                     const char *prefer, enum transport_kind *kind, char *why, int cap)
{
    int all_gpu = 1, shared_a = -1, shared_b = -1, cpu_rank = -1;
    for (int r = 0; r < n; r++) {
        if (gpu_ids[r][0] == '\0') {
            all_gpu = 0;
            if (cpu_rank < 0)
                cpu_rank = r;
            continue;
        }
        for (int q = 0; q < r && shared_a < 0; q++)
            if (strcmp(gpu_ids[q], gpu_ids[r]) == 0) {
                shared_a = q;
                shared_b = r;
            }
    }
    int nccl_ok = all_gpu && shared_a < 0 && n > 1;
    if (!all_gpu)
        snprintf(why, (size_t)cap, "rank %d computes on the CPU", cpu_rank);
    else if (shared_a >= 0)
        snprintf(why, (size_t)cap, "ranks %d and %d share the GPU %s, and NCCL refuses two ranks "
                                   "on one GPU",
                 shared_a, shared_b, gpu_ids[shared_a]);
    else if (n == 1)
        snprintf(why, (size_t)cap, "one rank: nothing to transfer");
    else
        snprintf(why, (size_t)cap, "every rank has a GPU of its own");
    if (strcmp(prefer, "nccl") == 0 && !nccl_ok)
        return ERR_INPUT;
    if (strcmp(prefer, "auto") != 0 && strcmp(prefer, "mpi") != 0 && strcmp(prefer, "nccl") != 0) {
        snprintf(why, (size_t)cap, "--transport: \"%s\", expected auto, mpi or nccl", prefer);
        return ERR_INPUT;
    }
    if (nccl_ok && strcmp(prefer, "mpi") != 0)
        *kind = TRANSPORT_NCCL;
    else
        *kind = gpu_ids[self][0] != '\0' ? TRANSPORT_MPI_STAGED : TRANSPORT_MPI;
    if (strcmp(prefer, "mpi") == 0 && nccl_ok)
        snprintf(why, (size_t)cap, "MPI asked for (--transport mpi)");
    return ERR_OK;
}
