// Check macros for the CUDA code: every CUDA, cuBLAS and NCCL call is wrapped; on failure the
// macro fills the struct err with the call, file:line, host, rank and the library's own
// message, and returns the status up the stack (library code never exits).
#ifndef BALLAST_CUDA_CHECK_CUH
#define BALLAST_CUDA_CHECK_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "err.h"
}

// Fills e (ERR_FAIL) with "CALL failed at FILE:LINE on HOST rank R: WHAT" and returns ERR_FAIL.
// The rank comes from the launcher's environment (Open MPI, PMIx, MPICH), -1 without one.
int cudacheck_fail(const char *call, const char *file, int line, const char *what,
                   struct err *e);

#define CUDA_CHECK(call, e)                                                                  \
    do {                                                                                     \
        cudaError_t cuda_rc_ = (call);                                                       \
        if (cuda_rc_ != cudaSuccess)                                                         \
            return cudacheck_fail(#call, __FILE__, __LINE__, cudaGetErrorString(cuda_rc_),   \
                                  (e));                                                      \
    } while (0)

#define CUBLAS_CHECK(call, e)                                                                \
    do {                                                                                     \
        cublasStatus_t cublas_rc_ = (call);                                                  \
        if (cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                             \
            return cudacheck_fail(#call, __FILE__, __LINE__,                                 \
                                  cublasGetStatusString(cublas_rc_), (e));                   \
    } while (0)

// After a kernel launch: a bad launch configuration shows up here, not at the next sync.
#define KERNEL_CHECK(what, e)                                                                \
    do {                                                                                     \
        cudaError_t cuda_rc_ = cudaGetLastError();                                           \
        if (cuda_rc_ != cudaSuccess)                                                         \
            return cudacheck_fail(what, __FILE__, __LINE__, cudaGetErrorString(cuda_rc_),    \
                                  (e));                                                      \
    } while (0)

#endif
