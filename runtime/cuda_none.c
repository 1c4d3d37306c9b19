/* cuda_device.h and backend_cuda_init in a build without the CUDA backend (BALLAST_CUDA=OFF,
 * or no CUDA Toolkit and NCCL found): no device, and every request for one says why. */
#include "cuda_device.h"
#include "transport.h"

#include <stdio.h>

#define NO_CUDA "this ballast was built without the CUDA backend (BALLAST_CUDA=OFF, or CMake " \
                "found no CUDA Toolkit and NCCL); rebuild with -DBALLAST_CUDA=ON"

int cuda_built(void)
{
    return 0;
}

int cuda_device_count(int *n, char *why, int why_cap)
{
    *n = 0;
    if (why != NULL && why_cap > 0)
        snprintf(why, (size_t)why_cap, "%s", NO_CUDA);
    return ERR_OK;
}

int cuda_device_query(int ordinal, struct cuda_device_info *out, struct err *e)
{
    return err_set(e, ERR_INPUT, "cuda:%d: %s", ordinal, NO_CUDA);
}

int cuda_mem_info(int64_t *free_bytes, int64_t *total_bytes, struct err *e)
{
    return err_set(e, ERR_INPUT, "%s", NO_CUDA);
}

int backend_cuda_memory(const struct backend *be, struct cuda_backend_memory *out)
{
    return ERR_INPUT;
}

void *backend_cuda_stream(const struct backend *be)
{
    return NULL;
}

int backend_is_cuda(const struct backend *be)
{
    return 0;
}

int cuda_tp_collectives_ms(int tp, int64_t bytes, int repeats, double *all_gather_ms,
                           double *reduce_scatter_ms, struct err *e)
{
    (void)tp, (void)bytes, (void)repeats, (void)all_gather_ms, (void)reduce_scatter_ms;
    return err_set(e, ERR_INPUT, "%s", NO_CUDA);
}

int backend_cuda_init(struct backend *be, int device, struct err *e)
{
    return err_set(e, ERR_INPUT, "cuda:%d: %s", device, NO_CUDA);
}

int transport_nccl_unique_id(unsigned char id[TRANSPORT_NCCL_ID_BYTES], struct err *e)
{
    return err_set(e, ERR_INPUT, "nccl: %s", NO_CUDA);
}

int transport_nccl_init(struct transport *t, int rank, int size,
                        const unsigned char (*ids)[TRANSPORT_NCCL_ID_BYTES], struct backend *be,
                        int max_requests, int64_t *device_bytes, struct err *e)
{
    return err_set(e, ERR_INPUT, "nccl: %s", NO_CUDA);
}

int allreduce_nccl_init(struct allreduce_nccl **out,
                        const unsigned char id[TRANSPORT_NCCL_ID_BYTES], int replica, int dp,
                        struct backend *be, struct err *e)
{
    *out = NULL;
    return err_set(e, ERR_INPUT, "nccl: %s", NO_CUDA);
}

int allreduce_nccl_sum(struct allreduce_nccl *a, float *buf, int64_t n, float scale,
                       struct err *e)
{
    return err_set(e, ERR_INPUT, "nccl: %s", NO_CUDA);
}

void allreduce_nccl_free(struct allreduce_nccl *a)
{
}
