// Device helpers shared by the CUDA kernels (kernels.cu, llama_kernels.cu, flash_kernels.cu): element access
// with fp32 arithmetic, fixed-order reductions, launch sizes and the dtype dispatch.
#ifndef BALLAST_CUDA_DEVICE_CUH
#define BALLAST_CUDA_DEVICE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

extern "C" {
#include "model.h"
}

typedef __nv_bfloat16 bf16;
typedef __half fp16;

// ---- element access: fp32 arithmetic, stores rounded to nearest even ----

static __device__ __forceinline__ float to_f(float x) { return x; }
static __device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ float to_f(fp16 x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ fp16 from_f<fp16>(float x) { return __float2half_rn(x); }

// Butterfly reductions: every lane ends with the same bits (a + b == b + a at each step).
static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Whole-block reduction (blockDim.x a multiple of 32, at most 1024): warps, then warp 0 over
// the warps in order. `shared` holds 32 floats; the result reaches every thread.
static __device__ float block_reduce(float v, float *shared, bool is_max)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads(); // `shared` may still be read by a previous reduction
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < warps ? shared[lane] : (is_max ? -INFINITY : 0.0f);
        w = is_max ? warp_max(w) : warp_sum(w);
        if (lane == 0)
            shared[0] = w;
    }
    __syncthreads();
    return shared[0];
}

static inline int blocks_for(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    return (int)(b < 65536 ? (b > 0 ? b : 1) : 65536); // grid-stride loops cover the rest
}

#define GRID_STRIDE(i, n)                                                                    \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                \
         i += (int64_t)gridDim.x * blockDim.x)

// `launch<float>`, `launch<bf16>` or `launch<fp16>` by a model dtype: the one place the CUDA
// code picks the element type.
#define BY_MODEL_DTYPE(dt, call)                                                               \
    ((dt) == MODEL_DTYPE_FP16 ? call<fp16> : (dt) == MODEL_DTYPE_BF16 ? call<bf16> : call<float>)
// The same by a kernel context's dtype.
#define DISPATCH(k, call) BY_MODEL_DTYPE((k).dt, call)

#endif
