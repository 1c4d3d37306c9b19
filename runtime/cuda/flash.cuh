// What the two flash attention implementations share: the shape of a fused qkv tensor and its
// element offsets, and the request for more than 48 KiB of shared memory. flash_kernels.cu
// holds the fp32 kernels on the CUDA cores (any GPU, any head size) and picks; flash_mma.cu the
// 16-bit kernels on the tensor cores.
#ifndef BALLAST_CUDA_FLASH_CUH
#define BALLAST_CUDA_FLASH_CUH

#include <math.h>
#include <stdint.h>

#include "check.cuh"
#include "kernels.cuh"

// qkv (B,T,W), W = (NH + 2 NKV) hs: the queries of head h, then the keys and the values of
// key/value head kv (shared by `group` = NH / NKV query heads); out (B,T,C), C = NH hs; the
// log-sum-exp and its gradient's row sums (B,NH,T).
struct fshape {
    int T, NH, NKV, hs, W, C, group;
    float scale;
    __device__ int64_t q(int b, int t, int h) const { return ((int64_t)b * T + t) * W + h * hs; }
    __device__ int64_t k(int b, int t, int kv) const
    {
        return ((int64_t)b * T + t) * W + C + kv * hs;
    }
    __device__ int64_t v(int b, int t, int kv) const { return k(b, t, kv) + (int64_t)NKV * hs; }
    __device__ int64_t o(int b, int t, int h) const { return ((int64_t)b * T + t) * C + h * hs; }
    __device__ int64_t row(int b, int h, int t) const { return ((int64_t)b * NH + h) * T + t; }
};

static inline fshape flash_shape(int T_, int NH, int NKV, int hs)
{
    return fshape{T_, NH, NKV, hs, (NH + 2 * NKV) * hs, NH * hs, NH / NKV,
                  1.0f / sqrtf((float)hs)};
}

// The most dynamic shared memory a block of the current device may have.
int flash_shared_most(int *most, struct err *e);

// Dynamic shared memory beyond the default 48 KiB must be asked for; past what the device
// allows, the head size is refused by name.
template <typename K>
static int flash_shared_for(K kernel, size_t bytes, int hs, struct err *e)
{
    if (bytes <= 48 * 1024)
        return ERR_OK;
    int most;
    ERR_TRY(flash_shared_most(&most, e));
    if (bytes > (size_t)most)
        return err_set(e, ERR_INPUT,
                       "flash attention with head size %d needs %zu bytes of shared memory per "
                       "block; this GPU allows %d",
                       hs, bytes, most);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)bytes), e);
    return ERR_OK;
}

// The tensor-core kernels (flash_mma.cu): whether they run this dtype and head size on the
// current device (a 16-bit dtype the device's tensor cores take, the tiles within its shared
// memory), and the forward and backward as flash_kernels.cu's, queued on k.stream.
int flash_mma_fits(enum model_dtype dt, int hs, int *fits, struct err *e);
int flash_mma_forward(const kctx &k, void *out, float *lse, const void *qkv, int B, fshape g,
                      struct err *e);
int flash_mma_backward(const kctx &k, void *dqkv, const float *dsum, const void *dout,
                       const void *qkv, const float *lse, int B, fshape g, struct err *e);

#endif
