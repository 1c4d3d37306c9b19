// A tensor-parallel group's collectives timed over NCCL on this node (cuda_device.h): one
// communicator across devices 0 .. tp-1 from one process (ncclCommInitAll, as nccl-tests run
// a single-process group), each device all-gathering its bytes / tp into `bytes`, then
// reduce-scattering `bytes` back into bytes / tp, on a stream of its own; the host times each
// collective from its launch (inside one ncclGroupStart/End) to every stream's end.
#include <stdlib.h>
#include <time.h>

#include "nccl.cuh"

extern "C" {
#include "clock.h"
#include "cuda_device.h"
#include "stats.h"
}

struct tp_group {
    int tp;
    ncclComm_t *comms;
    cudaStream_t *streams;
    char **send, **recv;
};

static int group_init(tp_group *g, int64_t bytes, struct err *e)
{
    int *devs = (int *)malloc(sizeof(int) * (size_t)g->tp);
    if (devs == nullptr)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int d = 0; d < g->tp; d++)
        devs[d] = d;
    ncclResult_t rc = ncclCommInitAll(g->comms, g->tp, devs);
    free(devs);
    if (rc != ncclSuccess)
        return cudacheck_fail("ncclCommInitAll", __FILE__, __LINE__, ncclGetErrorString(rc), e);
    for (int d = 0; d < g->tp; d++) {
        CUDA_CHECK(cudaSetDevice(d), e);
        CUDA_CHECK(cudaStreamCreate(&g->streams[d]), e);
        CUDA_CHECK(cudaMalloc((void **)&g->send[d], (size_t)bytes), e);
        CUDA_CHECK(cudaMalloc((void **)&g->recv[d], (size_t)bytes), e);
        CUDA_CHECK(cudaMemset(g->send[d], 0, (size_t)bytes), e);
    }
    return ERR_OK;
}

static void group_free(tp_group *g)
{
    for (int d = 0; d < g->tp; d++) {
        cudaSetDevice(d);
        if (g->comms[d] != nullptr)
            ncclCommDestroy(g->comms[d]);
        if (g->streams[d] != nullptr)
            cudaStreamDestroy(g->streams[d]);
        cudaFree(g->send[d]);
        cudaFree(g->recv[d]);
    }
}

// One all-gather (gather 1) or reduce-scatter (0) of `bytes` in all over the group: its ms.
static int collective(tp_group *g, int gather, int64_t bytes, double *ms, struct err *e)
{
    size_t part = (size_t)(bytes / g->tp); // bf16 or fp32 elements counted as bytes: ncclInt8
    double t0 = clock_now_ms();
    NCCL_CHECK(ncclGroupStart(), e);
    for (int d = 0; d < g->tp; d++)
        NCCL_CHECK(gather ? ncclAllGather(g->send[d], g->recv[d], part, ncclInt8, g->comms[d],
                                          g->streams[d])
                          : ncclReduceScatter(g->send[d], g->recv[d], part, ncclInt8, ncclSum,
                                              g->comms[d], g->streams[d]),
                   e);
    NCCL_CHECK(ncclGroupEnd(), e);
    for (int d = 0; d < g->tp; d++) {
        CUDA_CHECK(cudaSetDevice(d), e);
        CUDA_CHECK(cudaStreamSynchronize(g->streams[d]), e);
    }
    *ms = clock_now_ms() - t0;
    return ERR_OK;
}

static int time_both(tp_group *g, int64_t bytes, int repeats, double *ag, double *rs,
                     struct err *e)
{
    double *v = (double *)malloc(sizeof(double) * 2 * (size_t)repeats);
    if (v == nullptr)
        return err_set(e, ERR_FAIL, "out of memory");
    int rc = ERR_OK;
    for (int r = -3; r < repeats && rc == ERR_OK; r++) { // three warm-ups: NCCL connects lazily
        double a = 0, b = 0;
        rc = collective(g, 1, bytes, &a, e);
        if (rc == ERR_OK)
            rc = collective(g, 0, bytes, &b, e);
        if (r >= 0)
            v[r] = a, v[repeats + r] = b;
    }
    if (rc == ERR_OK) {
        *ag = stats_upper_median(v, repeats);
        *rs = stats_upper_median(v + repeats, repeats);
    }
    free(v);
    return rc;
}

extern "C" int cuda_tp_collectives_ms(int tp, int64_t bytes, int repeats, double *all_gather_ms,
                                      double *reduce_scatter_ms, struct err *e)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < tp)
        return err_set(e, ERR_INPUT,
                       "--tp %d: timing its collectives needs %d GPUs in this node, and %d are "
                       "visible (give --node-link-gbps to take them from a link instead)",
                       tp, tp, n);
    bytes = (bytes + tp - 1) / tp * tp;
    tp_group g = {tp, (ncclComm_t *)calloc((size_t)tp, sizeof(ncclComm_t)),
                  (cudaStream_t *)calloc((size_t)tp, sizeof(cudaStream_t)),
                  (char **)calloc((size_t)tp, sizeof(char *)),
                  (char **)calloc((size_t)tp, sizeof(char *))};
    int rc = g.comms && g.streams && g.send && g.recv ? group_init(&g, bytes, e)
                                                      : err_set(e, ERR_FAIL, "out of memory");
    if (rc == ERR_OK)
        rc = time_both(&g, bytes, repeats > 0 ? repeats : 1, all_gather_ms, reduce_scatter_ms,
                       e);
    if (g.comms && g.streams && g.send && g.recv)
        group_free(&g);
    free(g.comms);
    free(g.streams);
    free(g.send);
    free(g.recv);
    cudaSetDevice(0);
    return rc;
}
