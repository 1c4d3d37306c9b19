// The data-parallel gradient all-reduce over NCCL (transport.h): a communicator per stage
// across its replicas, ncclAllReduce (sum) in place on the backend's stream, then a scale by
// 1/dp on the same stream; the wait polls an event with NCCL's asynchronous errors checked.
#include <stdlib.h>
#include <string.h>

#include "nccl.cuh"

extern "C" {
#include "backend.h"
#include "cuda_device.h"
#include "transport.h"
}

struct allreduce_nccl {
    ncclComm_t comm;
    cudaStream_t stream; // the backend's: after the backward, before the optimizer
    cudaEvent_t done;
    int replica, dp;
    int failed; // tear down with ncclCommAbort
};

__global__ void scale_kernel(float *x, int64_t n, float scale)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= scale;
}

static int nccl_allreduce_open(allreduce_nccl *a, const unsigned char *id, struct err *e)
{
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    CUDA_CHECK(cudaEventCreateWithFlags(&a->done, cudaEventDisableTiming), e);
    NCCL_CHECK(ncclCommInitRank(&a->comm, a->dp, u, a->replica), e);
    return ERR_OK;
}

extern "C" int allreduce_nccl_init(struct allreduce_nccl **out,
                                   const unsigned char id[TRANSPORT_NCCL_ID_BYTES], int replica,
                                   int dp, struct backend *be, struct err *e)
{
    *out = nullptr;
    if (!backend_is_cuda(be))
        return err_set(e, ERR_INPUT, "nccl: replica %d does not compute on a GPU", replica);
    allreduce_nccl *a = (allreduce_nccl *)calloc(1, sizeof *a);
    if (a == nullptr)
        return err_set(e, ERR_FAIL, "out of memory for the NCCL all-reduce");
    a->stream = (cudaStream_t)backend_cuda_stream(be);
    a->replica = replica;
    a->dp = dp;
    if (nccl_allreduce_open(a, id, e)) {
        a->failed = 1;
        allreduce_nccl_free(a);
        return e->code;
    }
    *out = a;
    return ERR_OK;
}

static int sum(allreduce_nccl *a, float *buf, int64_t n, float scale, struct err *e)
{
    NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)n, ncclFloat, ncclSum, a->comm, a->stream), e);
    int blocks = (int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    if (blocks > 0) {
        scale_kernel<<<blocks, 256, 0, a->stream>>>(buf, n, scale);
        KERNEL_CHECK("scale_kernel", e);
    }
    CUDA_CHECK(cudaEventRecord(a->done, a->stream), e);
    return nccl_wait_event(a->done, a->comm, e);
}

extern "C" int allreduce_nccl_sum(struct allreduce_nccl *a, float *buf, int64_t n, float scale,
                                  struct err *e)
{
    int rc = sum(a, buf, n, scale, e);
    if (rc)
        a->failed = 1;
    return rc;
}

// The stream drained (unless something failed), then the communicator, then the event.
extern "C" void allreduce_nccl_free(struct allreduce_nccl *a)
{
    if (a == nullptr)
        return;
    if (a->comm != nullptr) {
        if (a->failed) {
            ncclCommAbort(a->comm);
        } else {
            cudaStreamSynchronize(a->stream);
            ncclCommFinalize(a->comm);
            ncclCommDestroy(a->comm);
        }
    }
    if (a->done != nullptr)
        cudaEventDestroy(a->done);
    free(a);
}
