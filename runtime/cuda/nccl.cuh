// NCCL helpers shared by the pipeline transport (transport_nccl.cu) and the data-parallel
// gradient all-reduce (allreduce_nccl.cu): the check macro, and a wait on a stream's event
// that asks NCCL for asynchronous errors between polls and sleeps between them (backoff.h).
// A peer that stopped reports no error: the heartbeat (heartbeat.h) ends the job then.
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

// Polls `ev` until it completes (ERR_OK) or NCCL reports an asynchronous error on `comm` (a
// peer that died: ERR_FAIL).
int nccl_wait_event(cudaEvent_t ev, ncclComm_t comm, struct err *e);

#endif
