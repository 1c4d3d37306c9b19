/* CUDA devices and the CUDA backend's own memory, for C callers (train, the profiler, tests).
 * Implemented in runtime/cuda/backend.cu; in a build without CUDA by cuda_none.c, where
 * cuda_device_count reports 0 devices and every other call fails with ERR_INPUT saying the
 * build has no CUDA. */
#ifndef BALLAST_CUDA_DEVICE_H
#define BALLAST_CUDA_DEVICE_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdint.h>

#include "backend.h"
#include "err.h"

#define CUDA_DEVICE_ID_MAX 64

struct cuda_device_info {
    int ordinal;
    char name[256];
    char uuid[CUDA_DEVICE_ID_MAX];       /* "GPU-xxxxxxxx-xxxx-...", as nvidia-smi prints it */
    char pci_bus_id[CUDA_DEVICE_ID_MAX]; /* "0000:3b:00.0" */
    int64_t total_bytes;
    int cc_major, cc_minor;
    int multiprocessors;
};

/* 1 when this build has the CUDA backend. */
int cuda_built(void);

/* Devices this process can use. No driver or no device is not an error: *n = 0 and `why`
 * (may be NULL) says what CUDA answered. */
int cuda_device_count(int *n, char *why, int why_cap);

/* Identity and size of device `ordinal`; does not create a context on it. */
int cuda_device_query(int ordinal, struct cuda_device_info *out, struct err *e);

/* Free and total bytes of the calling thread's current device (creates its context). */
int cuda_mem_info(int64_t *free_bytes, int64_t *total_bytes, struct err *e);

/* What the CUDA backend measured of the device's memory beside its arenas, with
 * cudaMemGetInfo (whole-device figures: another process allocating at the same moment would
 * blur them, which is why `ballast train` starts the ranks of one node one at a time). */
struct cuda_backend_memory {
    int device;
    int64_t total_bytes;
    int64_t used_at_start_bytes; /* total - free right after this process's context came up:
                                    the context, plus whatever other processes held */
    int64_t blas_bytes;          /* cublasCreate and the cuBLAS workspace, as free fell */
    int64_t blas_workspace_bytes; /* of which the workspace we gave cuBLAS */
    int64_t arena_bytes;         /* live allocations of the backend's `alloc` */
};

int backend_cuda_memory(const struct backend *be, struct cuda_backend_memory *out);
/* The backend's stream (a cudaStream_t), for the NCCL transport. */
void *backend_cuda_stream(const struct backend *be);
/* 1 if `be` is a CUDA backend. */
int backend_is_cuda(const struct backend *be);

/* A tensor-parallel group's collectives on this node, timed (cuda/collective_tp.cu): devices
 * 0 .. tp-1 in one NCCL communicator (ncclCommInitAll), each all-gathering and then
 * reduce-scattering `bytes` in all (bytes / tp its own part), `repeats` times after a warm-up;
 * the median of each, ms. The profiler's measured profile for (device, tp). */
int cuda_tp_collectives_ms(int tp, int64_t bytes, int repeats, double *all_gather_ms,
                           double *reduce_scatter_ms, struct err *e);

#ifdef __cplusplus
}
#endif

#endif
