// Flash attention on the tensor cores, for 16-bit models (bf16 from sm_80, fp16 from sm_70):
// FlashAttention-2's algorithm as in flash_kernels.cu, its products done by warps with WMMA
// (16x16x16 tiles, 16-bit inputs, fp32 accumulation). The scores' softmax, the log-sum-exp,
// the running maximum and sum stay in fp32; what goes into a product is 16-bit, as in every
// tensor-core flash attention: the probabilities P (forward, and the backward's dV) and the
// score gradients dS (dQ, dK) are rounded to the model's dtype first.
//
// Determinism as in kernels.cuh: no atomics; each output tile is one warp's, its products in
// one fixed order, so a recomputed forward repeats its bits. dQ is its own pass over the key
// tiles, dK and dV one over the query tiles, as in flash_kernels.cu.
//
// A block is four warps. The forward and the dQ pass take 64 query rows a block, 16 a warp,
// over key tiles of 64, their accumulators in shared memory (the forward rescales them row by
// row); the dK, dV pass takes 64 keys a block, 16 a warp, over query tiles of 32, its
// accumulators in registers, for head sizes up to 128 (flash_kernels.cu takes larger ones).
// The head size is padded with zeros to a multiple of 16 in shared memory; every tile's row is
// padded by 8 16-bit or 4 fp32 elements, so that a fragment's rows fall on different banks
// (WMMA wants the row strides a multiple of 16 bytes, fragments 32-byte aligned: every
// fragment starts at a row that is a multiple of 16).
#include <mma.h>

#include <type_traits>

#include "device.cuh"
#include "flash.cuh"

namespace wm = nvcuda::wmma;

#define WARPS 4
#define ROWS 64    // query rows of a forward or dQ block
#define KEYS 64    // keys of a forward or dQ key tile, and of a dK, dV block
#define QTILE 32   // query rows of a dK, dV query tile
#define PAD16 8    // 16-bit elements added to a tile's row
#define PAD32 4    // fp32 elements added to a tile's row

typedef wm::fragment<wm::accumulator, 16, 16, 16, float> facc;

// Row strides and the shared-memory carve: every tile a multiple of 32 bytes.
struct carve {
    int hp, l16, l32; // head size padded to 16; the row strides of 16-bit and fp32 head tiles
    size_t at;
    __host__ __device__ explicit carve(int hs)
        : hp((hs + 15) / 16 * 16), l16(hp + PAD16), l32(hp + PAD32), at(0)
    {
    }
    // `bytes` more of the block's shared memory, at `base` (NULL: only counting)
    __host__ __device__ void *take(unsigned char *base, size_t bytes)
    {
        void *p = base ? base + at : NULL;
        at += (bytes + 127) / 128 * 128;
        return p;
    }
};

// Rows r0 .. r0+rows-1 (those below T; the rest zero) of hs elements at src + at(row), into a
// 16-bit tile of `rows` rows of c.hp (zero past hs), row stride c.l16. Every thread of the
// block takes part.
template <typename T, typename At>
__device__ void load_rows(T *dst, const T *src, At at, int r0, int rows, int T_, int hs,
                          const carve &c)
{
    if (hs % 8 == 0 && ((uintptr_t)src & 15) == 0) { // 16-byte loads: 8 elements a thread
        int per_row = c.hp / 8;
        for (int i = threadIdx.x; i < rows * per_row; i += blockDim.x) {
            int r = i / per_row, col = i % per_row * 8;
            uint4 x = make_uint4(0, 0, 0, 0);
            if (r0 + r < T_ && col < hs)
                x = *(const uint4 *)(src + at(r0 + r) + col);
            *(uint4 *)(dst + r * c.l16 + col) = x;
        }
        return;
    }
    for (int i = threadIdx.x; i < rows * c.hp; i += blockDim.x) {
        int r = i / c.hp, col = i % c.hp;
        dst[r * c.l16 + col] = r0 + r < T_ && col < hs ? src[at(r0 + r) + col] : from_f<T>(0.0f);
    }
}

// out (16, 16 n) (stride ldo) = a (16, K) (row-major, stride lda) @ b^T, b (16 n, K) row-major
// (stride ldb): a warp's scores against 16 n rows of keys (or values), K a multiple of 16.
template <typename T>
__device__ void mma_abt(float *out, int ldo, const T *a, int lda, const T *b, int ldb, int n,
                        int K)
{
    wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major> fa;
    wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::col_major> fb;
    facc acc;
    for (int j = 0; j < n; j++) {
        wm::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < K; kk += 16) {
            wm::load_matrix_sync(fa, a + kk, lda);
            wm::load_matrix_sync(fb, b + (size_t)j * 16 * ldb + kk, ldb);
            wm::mma_sync(acc, fa, fb, acc);
        }
        wm::store_matrix_sync(out + j * 16, acc, ldo, wm::mem_row_major);
    }
}

// acc (16, N) (fp32, stride ldc) += a (16, K) (row-major, stride lda) @ b (K, N) (row-major,
// stride ldb): a warp's probabilities (or their gradients) times values (keys, queries, the
// output gradient), K and N multiples of 16, its first `k_used` of K nonzero.
template <typename T>
__device__ void mma_acc_ab(float *acc, int ldc, const T *a, int lda, const T *b, int ldb,
                           int N, int k_used)
{
    wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major> fa;
    wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::row_major> fb;
    facc c;
    for (int n = 0; n < N; n += 16) {
        wm::load_matrix_sync(c, acc + n, ldc, wm::mem_row_major);
        for (int kk = 0; kk < k_used; kk += 16) {
            wm::load_matrix_sync(fa, a + kk, lda);
            wm::load_matrix_sync(fb, b + (size_t)kk * ldb + n, ldb);
            wm::mma_sync(c, fa, fb, c);
        }
        wm::store_matrix_sync(acc + n, c, ldc, wm::mem_row_major);
    }
}

// Zero a warp's 16 rows of n fp32 (stride ld).
__device__ void zero_rows(float *p, int ld, int n)
{
    for (int i = threadIdx.x % 32; i < 16 * n; i += 32)
        p[i / n * ld + i % n] = 0.0f;
}

// The forward's shared memory: queries, keys, values (16-bit), the output accumulators, the
// scores (fp32) and the probabilities (16-bit).
template <typename T> struct fwd_smem {
    T *q, *k, *v, *p;
    float *o, *s;
    size_t bytes;
    __host__ __device__ fwd_smem(unsigned char *base, const carve &c0)
    {
        carve c = c0;
        q = (T *)c.take(base, sizeof(T) * ROWS * c.l16);
        k = (T *)c.take(base, sizeof(T) * KEYS * c.l16);
        v = (T *)c.take(base, sizeof(T) * KEYS * c.l16);
        o = (float *)c.take(base, sizeof(float) * ROWS * c.l32);
        s = (float *)c.take(base, sizeof(float) * ROWS * (KEYS + PAD32));
        p = (T *)c.take(base, sizeof(T) * ROWS * (KEYS + PAD16));
        bytes = c.at;
    }
};

// Blocks over (query tile, head, batch row), the query tiles last-first (the causal mask
// makes them the longest). Lanes 2r and 2r+1 of a warp own its row r's softmax statistics,
// each taking every other key of a tile.
template <typename T>
__device__ void forward_tiles(T *out, float *lse, const T *qkv, const fshape &g)
{
    extern __shared__ __align__(128) unsigned char smem[];
    carve c(g.hs);
    fwd_smem<T> sm(smem, c);
    const int ls = KEYS + PAD32, lp = KEYS + PAD16;
    int r0 = (gridDim.x - 1 - blockIdx.x) * ROWS, h = blockIdx.y, b = blockIdx.z;
    int kv = h / g.group, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int w0 = r0 + 16 * warp, ri = lane / 2, half = lane % 2, t = w0 + ri;
    float *o = sm.o + 16 * warp * c.l32, *s = sm.s + 16 * warp * ls;
    T *p = sm.p + 16 * warp * lp;
    const T *qw = sm.q + 16 * warp * c.l16;
    load_rows(sm.q, qkv, [&](int i) { return g.q(b, i, h); }, r0, ROWS, g.T, g.hs, c);
    zero_rows(o, c.l32, c.hp);
    float mx = -INFINITY, sum = 0;
    int last_key = min(r0 + ROWS, g.T) - 1;
    for (int c0 = 0; c0 <= last_key; c0 += KEYS) {
        __syncthreads(); // every warp done with the previous key tile
        load_rows(sm.k, qkv, [&](int j) { return g.k(b, j, kv); }, c0, KEYS, g.T, g.hs, c);
        load_rows(sm.v, qkv, [&](int j) { return g.v(b, j, kv); }, c0, KEYS, g.T, g.hs, c);
        __syncthreads();
        int seen = min(KEYS, min(w0 + 15, g.T - 1) - c0 + 1); // keys a row of the warp sees
        if (seen <= 0)
            continue;
        int used = (seen + 15) / 16 * 16;
        mma_abt(s, ls, qw, c.l16, sm.k, c.l16, used / 16, c.hp);
        __syncwarp();
        float tile_max = -INFINITY;
        for (int j = half; j < used; j += 2)
            if (c0 + j <= t && t < g.T)
                tile_max = fmaxf(tile_max, g.scale * s[ri * ls + j]);
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        float new_max = fmaxf(mx, tile_max);
        float base = new_max == -INFINITY ? 0.0f : new_max; // a row past T, or all masked
        float corr = expf(mx - base), psum = 0;
        for (int j = half; j < used; j += 2) {
            float e = c0 + j <= t && t < g.T ? expf(g.scale * s[ri * ls + j] - base) : 0.0f;
            T pj = from_f<T>(e);
            p[ri * lp + j] = pj;
            psum += to_f(pj); // the sum of what multiplies the values
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        sum = sum * corr + psum;
        mx = new_max;
        for (int col = half; col < c.hp; col += 2)
            o[ri * c.l32 + col] *= corr;
        __syncwarp();
        mma_acc_ab(o, c.l32, p, lp, sm.v, c.l16, c.hp, used);
        __syncwarp();
    }
    if (t >= g.T)
        return;
    T *dst = out + g.o(b, t, h);
    for (int col = half; col < g.hs; col += 2)
        dst[col] = from_f<T>(o[ri * c.l32 + col] / sum);
    if (half == 0)
        lse[g.row(b, h, t)] = mx + logf(sum);
}

// The dQ pass's shared memory: queries, output gradients, keys, values (16-bit), the dQ
// accumulators, the scores and their gradients (fp32), dS (16-bit).
template <typename T> struct dq_smem {
    T *q, *go, *k, *v, *ds;
    float *dq, *s, *dp;
    size_t bytes;
    __host__ __device__ dq_smem(unsigned char *base, const carve &c0)
    {
        carve c = c0;
        q = (T *)c.take(base, sizeof(T) * ROWS * c.l16);
        go = (T *)c.take(base, sizeof(T) * ROWS * c.l16);
        k = (T *)c.take(base, sizeof(T) * KEYS * c.l16);
        v = (T *)c.take(base, sizeof(T) * KEYS * c.l16);
        dq = (float *)c.take(base, sizeof(float) * ROWS * c.l32);
        s = (float *)c.take(base, sizeof(float) * ROWS * (KEYS + PAD32));
        dp = (float *)c.take(base, sizeof(float) * ROWS * (KEYS + PAD32));
        ds = (T *)c.take(base, sizeof(T) * ROWS * (KEYS + PAD16));
        bytes = c.at;
    }
};

// dQ = dS K over the key tiles in order, dS = P (dP - D) scale, P = exp(scale S - lse),
// dP = dO V^T; blocks and lanes as in the forward.
template <typename T>
__device__ void dq_tiles(T *dqkv, const T *dout, const T *qkv, const float *lse,
                         const float *dsum, const fshape &g)
{
    extern __shared__ __align__(128) unsigned char smem[];
    carve c(g.hs);
    dq_smem<T> sm(smem, c);
    const int ls = KEYS + PAD32, lp = KEYS + PAD16;
    int r0 = (gridDim.x - 1 - blockIdx.x) * ROWS, h = blockIdx.y, b = blockIdx.z;
    int kv = h / g.group, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int w0 = r0 + 16 * warp, ri = lane / 2, half = lane % 2, t = w0 + ri;
    float *dq = sm.dq + 16 * warp * c.l32, *s = sm.s + 16 * warp * ls;
    float *dp = sm.dp + 16 * warp * ls;
    T *ds = sm.ds + 16 * warp * lp;
    load_rows(sm.q, qkv, [&](int i) { return g.q(b, i, h); }, r0, ROWS, g.T, g.hs, c);
    load_rows(sm.go, dout, [&](int i) { return g.o(b, i, h); }, r0, ROWS, g.T, g.hs, c);
    zero_rows(dq, c.l32, c.hp);
    float l = t < g.T ? lse[g.row(b, h, t)] : 0, d = t < g.T ? dsum[g.row(b, h, t)] : 0;
    int last_key = min(r0 + ROWS, g.T) - 1;
    for (int c0 = 0; c0 <= last_key; c0 += KEYS) {
        __syncthreads();
        load_rows(sm.k, qkv, [&](int j) { return g.k(b, j, kv); }, c0, KEYS, g.T, g.hs, c);
        load_rows(sm.v, qkv, [&](int j) { return g.v(b, j, kv); }, c0, KEYS, g.T, g.hs, c);
        __syncthreads();
        int seen = min(KEYS, min(w0 + 15, g.T - 1) - c0 + 1);
        if (seen <= 0)
            continue;
        int used = (seen + 15) / 16 * 16;
        mma_abt(s, ls, sm.q + 16 * warp * c.l16, c.l16, sm.k, c.l16, used / 16, c.hp);
        mma_abt(dp, ls, sm.go + 16 * warp * c.l16, c.l16, sm.v, c.l16, used / 16, c.hp);
        __syncwarp();
        for (int j = half; j < used; j += 2) {
            float pj = c0 + j <= t && t < g.T ? expf(g.scale * s[ri * ls + j] - l) : 0.0f;
            ds[ri * lp + j] = from_f<T>(pj * (dp[ri * ls + j] - d) * g.scale);
        }
        __syncwarp();
        mma_acc_ab(dq, c.l32, ds, lp, sm.k, c.l16, c.hp, used);
        __syncwarp();
    }
    if (t >= g.T)
        return;
    T *dst = dqkv + g.q(b, t, h);
    for (int col = half; col < g.hs; col += 2)
        dst[col] = from_f<T>(dq[ri * c.l32 + col]);
}

// The dK, dV pass's shared memory: keys, values, a query tile and its output gradients
// (16-bit), its log-sum-exps and row sums D, the transposed scores and their gradients (fp32),
// P^T and dS^T (16-bit). The dK and dV accumulators are registers (fragments): in shared
// memory they would double the block's and leave one block of four warps to an SM, too few to
// keep its tensor cores busy. At the end they pass through the key and value tiles' space.
template <typename T> struct dkv_smem {
    T *k, *v, *q, *go, *pt, *dst;
    float *lse, *d, *s, *dp;
    size_t bytes;
    __host__ __device__ dkv_smem(unsigned char *base, const carve &c0)
    {
        carve c = c0;
        k = (T *)c.take(base, sizeof(T) * KEYS * c.l16);
        v = (T *)c.take(base, sizeof(T) * KEYS * c.l16);
        q = (T *)c.take(base, sizeof(T) * QTILE * c.l16);
        go = (T *)c.take(base, sizeof(T) * QTILE * c.l16);
        lse = (float *)c.take(base, sizeof(float) * QTILE);
        d = (float *)c.take(base, sizeof(float) * QTILE);
        s = (float *)c.take(base, sizeof(float) * KEYS * (QTILE + PAD32));
        dp = (float *)c.take(base, sizeof(float) * KEYS * (QTILE + PAD32));
        pt = (T *)c.take(base, sizeof(T) * KEYS * (QTILE + PAD16));
        dst = (T *)c.take(base, sizeof(T) * KEYS * (QTILE + PAD16));
        bytes = c.at;
    }
};

// The head sizes the dK, dV pass takes: its accumulators are 2 NF fragments a thread (NF =
// the padded head size / 16), 128 registers at a head size of 128.
#define MAX_NF 8

// acc[n] += a (16, K) (row-major, stride lda) @ b[:, 16n:16n+16] for n < NF, b (K, 16 NF)
// row-major (stride ldb), K = k_used a multiple of 16.
template <typename T, int NF>
__device__ void mma_acc_frags(facc (&acc)[NF], const T *a, int lda, const T *b, int ldb,
                              int k_used)
{
    wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major> fa;
    wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::row_major> fb;
    for (int kk = 0; kk < k_used; kk += 16) {
        wm::load_matrix_sync(fa, a + kk, lda);
#pragma unroll
        for (int n = 0; n < NF; n++) {
            wm::load_matrix_sync(fb, b + (size_t)kk * ldb + n * 16, ldb);
            wm::mma_sync(acc[n], fa, fb, acc[n]);
        }
    }
}

// A warp's 16 rows of fragments, through its 16 rows of fp32 scratch (stride ld), to the
// global rows at dst + at(row) for the rows below T; lanes 2r and 2r+1 write row r.
template <typename T, int NF, typename At>
__device__ void store_frags(facc (&acc)[NF], float *scratch, int ld, At at, int row0, int T_,
                            int hs)
{
#pragma unroll
    for (int n = 0; n < NF; n++)
        wm::store_matrix_sync(scratch + n * 16, acc[n], ld, wm::mem_row_major);
    __syncwarp();
    int lane = threadIdx.x % 32, ri = lane / 2;
    if (row0 + ri < T_) {
        T *dst = at(row0 + ri);
        for (int col = lane % 2; col < hs; col += 2)
            dst[col] = from_f<T>(scratch[ri * ld + col]);
    }
    __syncwarp();
}

// dV = P^T dO and dK = dS^T Q over the query heads of the key/value head in order, then their
// query tiles from the block's first key on. A warp owns 16 keys; lanes 2r and 2r+1 its key
// r, each taking every other query of a tile.
template <typename T, int NF>
__device__ void dkv_tiles(T *dqkv, const T *dout, const T *qkv, const float *lse,
                          const float *dsum, const fshape &g)
{
    extern __shared__ __align__(128) unsigned char smem[];
    carve c(g.hs);
    dkv_smem<T> sm(smem, c);
    const int ls = QTILE + PAD32, lp = QTILE + PAD16;
    int c0 = (gridDim.x - 1 - blockIdx.x) * KEYS, kv = blockIdx.y, b = blockIdx.z;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int k0 = c0 + 16 * warp, ri = lane / 2, half = lane % 2, key = k0 + ri;
    float *s = sm.s + 16 * warp * ls, *dp = sm.dp + 16 * warp * ls;
    T *pt = sm.pt + 16 * warp * lp, *dst = sm.dst + 16 * warp * lp;
    facc dk[NF], dv[NF];
#pragma unroll
    for (int n = 0; n < NF; n++) {
        wm::fill_fragment(dk[n], 0.0f);
        wm::fill_fragment(dv[n], 0.0f);
    }
    load_rows(sm.k, qkv, [&](int j) { return g.k(b, j, kv); }, c0, KEYS, g.T, g.hs, c);
    load_rows(sm.v, qkv, [&](int j) { return g.v(b, j, kv); }, c0, KEYS, g.T, g.hs, c);
    for (int h = kv * g.group; h < (kv + 1) * g.group; h++)
        for (int r0 = c0; r0 < g.T; r0 += QTILE) {
            __syncthreads(); // every warp done with the previous query tile
            load_rows(sm.q, qkv, [&](int i) { return g.q(b, i, h); }, r0, QTILE, g.T, g.hs, c);
            load_rows(sm.go, dout, [&](int i) { return g.o(b, i, h); }, r0, QTILE, g.T, g.hs,
                      c);
            for (int i = threadIdx.x; i < QTILE; i += blockDim.x) {
                bool in = r0 + i < g.T;
                sm.lse[i] = in ? lse[g.row(b, h, r0 + i)] : 0.0f;
                sm.d[i] = in ? dsum[g.row(b, h, r0 + i)] : 0.0f;
            }
            __syncthreads();
            if (k0 >= g.T || r0 + QTILE - 1 < k0)
                continue; // the warp's keys past T, or every query of the tile before them
            int used = min(QTILE, (g.T - r0 + 15) / 16 * 16); // queries below T, padded
            mma_abt(s, ls, sm.k + 16 * warp * c.l16, c.l16, sm.q, c.l16, used / 16, c.hp);
            mma_abt(dp, ls, sm.v + 16 * warp * c.l16, c.l16, sm.go, c.l16, used / 16, c.hp);
            __syncwarp();
            for (int j = half; j < used; j += 2) {
                int t = r0 + j;
                float e = t >= key && t < g.T && key < g.T
                              ? expf(g.scale * s[ri * ls + j] - sm.lse[j])
                              : 0.0f;
                pt[ri * lp + j] = from_f<T>(e);
                dst[ri * lp + j] = from_f<T>(e * (dp[ri * ls + j] - sm.d[j]) * g.scale);
            }
            __syncwarp();
            mma_acc_frags(dv, pt, lp, sm.go, c.l16, used);
            mma_acc_frags(dk, dst, lp, sm.q, c.l16, used);
        }
    __syncthreads(); // every warp done with the key and value tiles: scratch for the output
    float *scratch = (float *)sm.k + 16 * warp * c.l32;
    store_frags<T>(dk, scratch, c.l32, [&](int j) { return dqkv + g.k(b, j, kv); }, k0, g.T, g.hs);
    store_frags<T>(dv, scratch, c.l32, [&](int j) { return dqkv + g.v(b, j, kv); }, k0, g.T, g.hs);
}

// The kernels: the tensor-core code for the architectures that have it for T (bf16 from
// sm_80, fp16 from sm_70); flash_mma_fits keeps the others from launching them.
template <typename T> __host__ __device__ constexpr bool mma_arch()
{
#if __CUDA_ARCH__ >= 800
    return true;
#elif __CUDA_ARCH__ >= 700
    return std::is_same<T, fp16>::value;
#else
    return false;
#endif
}

template <typename T>
__global__ void __launch_bounds__(WARPS * 32)
    mma_forward_kernel(T *out, float *lse, const T *qkv, fshape g)
{
    if constexpr (mma_arch<T>())
        forward_tiles(out, lse, qkv, g);
}

template <typename T>
__global__ void __launch_bounds__(WARPS * 32)
    mma_dq_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *dsum,
                  fshape g)
{
    if constexpr (mma_arch<T>())
        dq_tiles(dqkv, dout, qkv, lse, dsum, g);
}

template <typename T, int NF>
__global__ void __launch_bounds__(WARPS * 32)
    mma_dkv_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *dsum,
                   fshape g)
{
    if constexpr (mma_arch<T>())
        dkv_tiles<T, NF>(dqkv, dout, qkv, lse, dsum, g);
}

// ---- host side ----

// The largest of the three kernels' shared memory for head size hs.
static size_t smem_most(int hs)
{
    carve c(hs);
    size_t f = fwd_smem<fp16>(NULL, c).bytes, q = dq_smem<fp16>(NULL, c).bytes;
    size_t kv = dkv_smem<fp16>(NULL, c).bytes;
    return f > q ? (f > kv ? f : kv) : (q > kv ? q : kv);
}

int flash_mma_fits(enum model_dtype dt, int hs, int *fits, struct err *e)
{
    int device, major, most;
    CUDA_CHECK(cudaGetDevice(&device), e);
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), e);
    ERR_TRY(flash_shared_most(&most, e));
    int arch = dt == MODEL_DTYPE_BF16 ? major >= 8 : dt == MODEL_DTYPE_FP16 ? major >= 7 : 0;
    *fits = arch && hs <= 16 * MAX_NF && smem_most(hs) <= (size_t)most;
    return ERR_OK;
}

template <typename T>
static int forward(const kctx &k, void *out, float *lse, const void *qkv, int B, fshape g,
                   struct err *e)
{
    size_t bytes = fwd_smem<T>(NULL, carve(g.hs)).bytes;
    ERR_TRY(flash_shared_for(mma_forward_kernel<T>, bytes, g.hs, e));
    dim3 grid((g.T + ROWS - 1) / ROWS, g.NH, B);
    mma_forward_kernel<T><<<grid, WARPS * 32, bytes, k.stream>>>((T *)out, lse,
                                                                 (const T *)qkv, g);
    KERNEL_CHECK("mma_forward_kernel", e);
    return ERR_OK;
}

// The dK, dV pass for NF = the padded head size / 16, that pass's accumulators.
template <typename T, int NF>
static int dkv(const kctx &k, void *dqkv, const float *dsum, const void *dout, const void *qkv,
               const float *lse, int B, fshape g, struct err *e)
{
    size_t bytes = dkv_smem<T>(NULL, carve(g.hs)).bytes;
    ERR_TRY(flash_shared_for(mma_dkv_kernel<T, NF>, bytes, g.hs, e));
    mma_dkv_kernel<T, NF><<<dim3((g.T + KEYS - 1) / KEYS, g.NKV, B), WARPS * 32, bytes,
                            k.stream>>>((T *)dqkv, (const T *)dout, (const T *)qkv, lse, dsum,
                                        g);
    KERNEL_CHECK("mma_dkv_kernel", e);
    return ERR_OK;
}

template <typename T>
static int backward(const kctx &k, void *dqkv, const float *dsum, const void *dout,
                    const void *qkv, const float *lse, int B, fshape g, struct err *e)
{
    typedef int (*dkv_fn)(const kctx &, void *, const float *, const void *, const void *,
                          const float *, int, fshape, struct err *);
    static const dkv_fn by_nf[MAX_NF] = {dkv<T, 1>, dkv<T, 2>, dkv<T, 3>, dkv<T, 4>,
                                         dkv<T, 5>, dkv<T, 6>, dkv<T, 7>, dkv<T, 8>};
    ERR_TRY(by_nf[carve(g.hs).hp / 16 - 1](k, dqkv, dsum, dout, qkv, lse, B, g, e));
    size_t q_bytes = dq_smem<T>(NULL, carve(g.hs)).bytes;
    ERR_TRY(flash_shared_for(mma_dq_kernel<T>, q_bytes, g.hs, e));
    mma_dq_kernel<T><<<dim3((g.T + ROWS - 1) / ROWS, g.NH, B), WARPS * 32, q_bytes,
                       k.stream>>>((T *)dqkv, (const T *)dout, (const T *)qkv, lse, dsum, g);
    KERNEL_CHECK("mma_dq_kernel", e);
    return ERR_OK;
}

int flash_mma_forward(const kctx &k, void *out, float *lse, const void *qkv, int B, fshape g,
                      struct err *e)
{
    if (k.dt == MODEL_DTYPE_FP16)
        return forward<fp16>(k, out, lse, qkv, B, g, e);
    if (k.dt == MODEL_DTYPE_BF16)
        return forward<bf16>(k, out, lse, qkv, B, g, e);
    return err_set(e, ERR_INPUT, "flash attention on the tensor cores takes bf16 or fp16");
}

int flash_mma_backward(const kctx &k, void *dqkv, const float *dsum, const void *dout,
                       const void *qkv, const float *lse, int B, fshape g, struct err *e)
{
    if (k.dt == MODEL_DTYPE_FP16)
        return backward<fp16>(k, dqkv, dsum, dout, qkv, lse, B, g, e);
    if (k.dt == MODEL_DTYPE_BF16)
        return backward<bf16>(k, dqkv, dsum, dout, qkv, lse, B, g, e);
    return err_set(e, ERR_INPUT, "flash attention on the tensor cores takes bf16 or fp16");
}
