// Flash attention on an NVIDIA GPU (backend.h's struct flash_kernels; the algorithm and the
// layout of kernels_flash_cpu.h): FlashAttention-2, causal, for GPT (NKV = NH) and grouped-
// query attention alike. The (B,NH,T,T) probabilities are never stored: key/value tiles pass
// through shared memory, each query row keeps a running maximum and sum (the online softmax)
// and finally its log-sum-exp; the backward recomputes the probabilities tile by tile from
// it. 16-bit models go to the tensor-core kernels of flash_mma.cu where the GPU has them; the
// kernels here take fp32 and what those cannot. In kernels.cuh's conventions: fp32 arithmetic
// on float or 16-bit tensors, no atomics, each output element one thread's loop in a fixed
// order (so a recomputed forward repeats its bits). dq is its own pass over the key tiles
// (FlashAttention-2's deterministic variant): the scores are recomputed once for dk and dv and
// once for dq rather than added up atomically.
#include <math.h>

#include "device.cuh"
#include "flash.cuh"

extern "C" {
#include "backend.h"
}

kctx cuda_kctx(struct backend *be, enum model_dtype dt);

// Rows of queries (one thread each) and of keys per tile.
#define TILE 32
// Query rows per tile of the dk, dv pass (its threads own keys): fewer, so that a head size of
// 128 stays within the 64 KiB of shared memory a T4 allows.
#define QROWS 16
// A thread's accumulator row in shared memory: padded by one float, so that the TILE threads
// of a warp, each at element c of its own row, hit different banks.
#define ACC(hs) ((hs) + 1)

// rows c0 .. c0+rows-1 (those < T) of hs elements at `src` + at(row) into dst (rows, hs)
template <typename T, typename At>
__device__ void load_tile(float *dst, const T *src, At at, int c0, int rows, int T_, int hs)
{
    for (int i = threadIdx.x; i < rows * hs; i += blockDim.x) {
        int r = i / hs, c = i % hs;
        dst[i] = c0 + r < T_ ? to_f(src[at(c0 + r) + c]) : 0.0f;
    }
}

// Key and value rows c0.. of key/value head kv into ks, vs (TILE, hs), once every thread of
// the block is done with the previous tile; every thread of the block must call it.
template <typename T>
__device__ void load_kv_tile(float *ks, float *vs, const T *qkv, const fshape &g, int b, int kv,
                             int c0)
{
    __syncthreads();
    load_tile(ks, qkv, [&](int j) { return g.k(b, j, kv); }, c0, TILE, g.T, g.hs);
    load_tile(vs, qkv, [&](int j) { return g.v(b, j, kv); }, c0, TILE, g.T, g.hs);
    __syncthreads();
}

template <typename T>
__device__ float dot_g(const T *x, const float *y, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++)
        s += to_f(x[i]) * y[i];
    return s;
}

// One block of TILE threads per (query tile, head, batch row); thread i owns query row
// r0 + i. Shared: its accumulators (TILE, hs), then a key tile and a value tile.
template <typename T>
__global__ void flash_forward_kernel(T *out, float *lse, const T *qkv, fshape g)
{
    extern __shared__ float sm[];
    float *acc = sm, *ks = sm + TILE * ACC(g.hs), *vs = ks + TILE * g.hs;
    int r0 = blockIdx.x * TILE, h = blockIdx.y, b = blockIdx.z, kv = h / g.group;
    int t = r0 + threadIdx.x;
    bool live = t < g.T;
    float *a = acc + threadIdx.x * ACC(g.hs), mx = -INFINITY, sum = 0;
    for (int c = 0; c < g.hs; c++)
        a[c] = 0;
    const T *q = qkv + g.q(b, live ? t : 0, h);
    int last_key = r0 + TILE - 1 < g.T - 1 ? r0 + TILE - 1 : g.T - 1;
    for (int c0 = 0; c0 <= last_key; c0 += TILE) {
        load_kv_tile(ks, vs, qkv, g, b, kv, c0);
        if (!live)
            continue;
        int n = t - c0 + 1 < TILE ? t - c0 + 1 : TILE;
        float s[TILE], tile_max = -INFINITY;
        for (int j = 0; j < n; j++) {
            s[j] = g.scale * dot_g(q, ks + j * g.hs, g.hs);
            tile_max = fmaxf(tile_max, s[j]);
        }
        if (n <= 0)
            continue;
        float new_max = fmaxf(mx, tile_max), corr = expf(mx - new_max), psum = 0;
        for (int c = 0; c < g.hs; c++)
            a[c] *= corr;
        for (int j = 0; j < n; j++) {
            float p = expf(s[j] - new_max);
            psum += p;
            for (int c = 0; c < g.hs; c++)
                a[c] += p * vs[j * g.hs + c];
        }
        sum = sum * corr + psum;
        mx = new_max;
    }
    if (!live)
        return;
    T *o = out + g.o(b, t, h);
    for (int c = 0; c < g.hs; c++)
        o[c] = from_f<T>(a[c] / sum);
    lse[g.row(b, h, t)] = mx + logf(sum);
}

// D = rowsum(dout * out), one thread per (b, h, t)
template <typename T>
__global__ void flash_dsum_kernel(float *dsum, const T *dout, const T *out, fshape g, int64_t n)
{
    GRID_STRIDE(idx, n) {
        int t = (int)(idx % g.T), h = (int)(idx / g.T % g.NH), b = (int)(idx / g.T / g.NH);
        const T *x = dout + g.o(b, t, h), *y = out + g.o(b, t, h);
        float s = 0;
        for (int c = 0; c < g.hs; c++)
            s += to_f(x[c]) * to_f(y[c]);
        dsum[idx] = s;
    }
}

// dk, dv: one block of TILE threads per (key tile, key/value head, batch row); thread j owns
// key row c0 + j, and walks its query heads in order, then their query tiles from its own.
// Shared: dk, dv accumulators (TILE, hs) each, then a query tile and a dout tile (QROWS, hs).
template <typename T>
__global__ void flash_dkv_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse,
                                 const float *dsum, fshape g)
{
    extern __shared__ float sm[];
    float *dk = sm + threadIdx.x * ACC(g.hs), *dv = sm + (TILE + threadIdx.x) * ACC(g.hs);
    float *qs = sm + 2 * TILE * ACC(g.hs), *gs = qs + QROWS * g.hs;
    int c0 = blockIdx.x * TILE, kv = blockIdx.y, b = blockIdx.z, j = c0 + threadIdx.x;
    bool live = j < g.T;
    for (int c = 0; c < g.hs; c++)
        dk[c] = dv[c] = 0;
    const T *k = qkv + g.k(b, live ? j : 0, kv), *v = qkv + g.v(b, live ? j : 0, kv);
    for (int h = kv * g.group; h < (kv + 1) * g.group; h++)
        for (int r0 = c0; r0 < g.T; r0 += QROWS) {
            __syncthreads();
            load_tile(qs, qkv, [&](int t) { return g.q(b, t, h); }, r0, QROWS, g.T, g.hs);
            load_tile(gs, dout, [&](int t) { return g.o(b, t, h); }, r0, QROWS, g.T, g.hs);
            __syncthreads();
            if (!live)
                continue;
            for (int i = 0; i < QROWS && r0 + i < g.T; i++) {
                int t = r0 + i;
                if (t < j)
                    continue; // masked: query t does not see key j
                const float *qi = qs + i * g.hs, *gi = gs + i * g.hs;
                float p = expf(g.scale * dot_g(k, qi, g.hs) - lse[g.row(b, h, t)]);
                float ds = p * (dot_g(v, gi, g.hs) - dsum[g.row(b, h, t)]) * g.scale;
                for (int c = 0; c < g.hs; c++) {
                    dv[c] += p * gi[c];
                    dk[c] += ds * qi[c];
                }
            }
        }
    if (!live)
        return;
    T *dkg = dqkv + g.k(b, j, kv), *dvg = dqkv + g.v(b, j, kv);
    for (int c = 0; c < g.hs; c++) {
        dkg[c] = from_f<T>(dk[c]);
        dvg[c] = from_f<T>(dv[c]);
    }
}

// dq: one block of TILE threads per (query tile, head, batch row), thread i owning query row
// r0 + i, over the key tiles in order. Shared: dq accumulators, then a key and a value tile.
template <typename T>
__global__ void flash_dq_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse,
                                const float *dsum, fshape g)
{
    extern __shared__ float sm[];
    float *ks = sm + TILE * ACC(g.hs), *vs = ks + TILE * g.hs;
    int r0 = blockIdx.x * TILE, h = blockIdx.y, b = blockIdx.z, kv = h / g.group;
    int t = r0 + threadIdx.x;
    bool live = t < g.T;
    float *dq = sm + threadIdx.x * ACC(g.hs);
    for (int c = 0; c < g.hs; c++)
        dq[c] = 0;
    const T *q = qkv + g.q(b, live ? t : 0, h), *go = dout + g.o(b, live ? t : 0, h);
    float l = live ? lse[g.row(b, h, t)] : 0, d = live ? dsum[g.row(b, h, t)] : 0;
    int last_key = r0 + TILE - 1 < g.T - 1 ? r0 + TILE - 1 : g.T - 1;
    for (int c0 = 0; c0 <= last_key; c0 += TILE) {
        load_kv_tile(ks, vs, qkv, g, b, kv, c0);
        if (!live)
            continue;
        int n = t - c0 + 1 < TILE ? t - c0 + 1 : TILE;
        for (int j = 0; j < n; j++) {
            const float *kj = ks + j * g.hs;
            float p = expf(g.scale * dot_g(q, kj, g.hs) - l);
            float ds = p * (dot_g(go, vs + j * g.hs, g.hs) - d) * g.scale;
            for (int c = 0; c < g.hs; c++)
                dq[c] += ds * kj[c];
        }
    }
    if (!live)
        return;
    T *dqg = dqkv + g.q(b, t, h);
    for (int c = 0; c < g.hs; c++)
        dqg[c] = from_f<T>(dq[c]);
}

int flash_shared_most(int *most, struct err *e)
{
    int device;
    CUDA_CHECK(cudaGetDevice(&device), e);
    CUDA_CHECK(cudaDeviceGetAttribute(most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), e);
    return ERR_OK;
}

// Bytes of shared memory: `acc` padded accumulator rows of TILE threads and `tiles` plain
// tiles of `rows` rows.
static size_t shared_bytes(int acc, int tiles, int rows, int hs)
{
    return sizeof(float) * ((size_t)TILE * acc * ACC(hs) + (size_t)tiles * rows * hs);
}

template <typename T>
static int flash_forward(struct backend *be, enum model_dtype dt, void *out, float *lse,
                         const void *qkv, int B, int T_, int NH, int NKV, int hs, struct err *e)
{
    kctx k = cuda_kctx(be, dt);
    fshape g = flash_shape(T_, NH, NKV, hs);
    int mma;
    ERR_TRY(flash_mma_fits(dt, hs, &mma, e));
    if (mma)
        return flash_mma_forward(k, out, lse, qkv, B, g, e);
    size_t bytes = shared_bytes(1, 2, TILE, hs);
    ERR_TRY(flash_shared_for(flash_forward_kernel<T>, bytes, hs, e));
    dim3 grid((T_ + TILE - 1) / TILE, NH, B);
    flash_forward_kernel<T><<<grid, TILE, bytes, k.stream>>>((T *)out, lse, (const T *)qkv, g);
    KERNEL_CHECK("flash_forward_kernel", e);
    return ERR_OK;
}

template <typename T>
static int flash_backward(struct backend *be, enum model_dtype dt, void *dqkv, float *dsum,
                          const void *dout, const void *qkv, const void *out, const float *lse,
                          int B, int T_, int NH, int NKV, int hs, struct err *e)
{
    kctx k = cuda_kctx(be, dt);
    fshape g = flash_shape(T_, NH, NKV, hs);
    int64_t rows = (int64_t)B * NH * T_;
    int tiles = (T_ + TILE - 1) / TILE;
    flash_dsum_kernel<T><<<blocks_for(rows, 256), 256, 0, k.stream>>>(
        dsum, (const T *)dout, (const T *)out, g, rows);
    KERNEL_CHECK("flash_dsum_kernel", e);
    int mma;
    ERR_TRY(flash_mma_fits(dt, hs, &mma, e));
    if (mma)
        return flash_mma_backward(k, dqkv, dsum, dout, qkv, lse, B, g, e);
    size_t kv_bytes = shared_bytes(2, 2, QROWS, hs);
    ERR_TRY(flash_shared_for(flash_dkv_kernel<T>, kv_bytes, hs, e));
    flash_dkv_kernel<T><<<dim3(tiles, NKV, B), TILE, kv_bytes, k.stream>>>(
        (T *)dqkv, (const T *)dout, (const T *)qkv, lse, dsum, g);
    KERNEL_CHECK("flash_dkv_kernel", e);
    size_t q_bytes = shared_bytes(1, 2, TILE, hs);
    ERR_TRY(flash_shared_for(flash_dq_kernel<T>, q_bytes, hs, e));
    flash_dq_kernel<T><<<dim3(tiles, NH, B), TILE, q_bytes, k.stream>>>(
        (T *)dqkv, (const T *)dout, (const T *)qkv, lse, dsum, g);
    KERNEL_CHECK("flash_dq_kernel", e);
    return ERR_OK;
}

static int cu_flash_forward(struct backend *be, enum model_dtype dt, void *out, float *lse,
                            const void *qkv, int B, int T_, int NH, int NKV, int hs,
                            struct err *e)
{
    return BY_MODEL_DTYPE(dt, flash_forward)(be, dt, out, lse, qkv, B, T_, NH, NKV, hs, e);
}

static int cu_flash_backward(struct backend *be, enum model_dtype dt, void *dqkv, float *dsum,
                             const void *dout, const void *qkv, const void *out,
                             const float *lse, int B, int T_, int NH, int NKV, int hs,
                             struct err *e)
{
    return BY_MODEL_DTYPE(dt, flash_backward)(be, dt, dqkv, dsum, dout, qkv, out, lse, B, T_,
                                              NH, NKV, hs, e);
}

extern "C" const struct flash_kernels flash_kernels_cuda = {cu_flash_forward, cu_flash_backward};
