// NCCL helpers shared by the pipeline transport (transport_nccl.cu) and the data-parallel
// gradient all-reduce (allreduce_nccl.cu): the check macro, and a wait on a stream's event
// that asks NCCL for asynchronous errors between polls and gives up after a timeout.
#ifndef BALLAST_CUDA_NCCL_CUH
#define BALLAST_CUDA_NCCL_CUH

#include <nccl.h>

#include "check.cuh"

#define NCCL_CHECK(call, e)                                                                  \
    do {                                                                                     \
        ncclResult_t nccl_rc_ = (call);                                                      \
        if (nccl_rc_ != ncclSuccess)                                                         \
            return cudacheck_fail(#call, __FILE__, __LINE__, ncclGetErrorString(nccl_rc_),   \
                                  (e));                                                      \
    } while (0)

// Polls `ev` until it completes (ERR_OK), NCCL reports an asynchronous error on `comm` (a
// peer that died: ERR_FAIL), or timeout_s (> 0) passes: then *timed_out = 1 and ERR_FAIL with
// e unset, for the caller to name who went silent.
int nccl_wait_event(cudaEvent_t ev, ncclComm_t comm, double timeout_s, int *timed_out,
                    struct err *e);

#endif
