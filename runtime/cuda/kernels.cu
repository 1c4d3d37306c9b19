// The CUDA kernels and cuBLAS calls behind kernels.cuh (see there for the conventions). The
// order of operations follows kernels_cpu.c, so fp32 results differ from the CPU's only by
// summation order and FMA contraction.
#include <math.h>

#include "check.cuh"
#include "kernels.cuh"

#include "device.cuh"

// ---- embedding ----

template <typename T>
__global__ void encoder_forward_kernel(T *out, const int32_t *tokens, const T *wte,
                                       const T *wpe, int B, int T_, int C)
{
    int64_t n = (int64_t)B * T_ * C;
    GRID_STRIDE(i, n) {
        int64_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T_);
        out[i] = from_f<T>(to_f(wte[(int64_t)tokens[bt] * C + c]) + to_f(wpe[(int64_t)t * C + c]));
    }
}

template <typename T>
__global__ void encoder_backward_wpe_kernel(float *dwpe, const T *dout, int B, int T_, int C)
{
    GRID_STRIDE(i, (int64_t)T_ * C) {
        float acc = dwpe[i];
        for (int b = 0; b < B; b++)
            acc += to_f(dout[(int64_t)b * T_ * C + i]);
        dwpe[i] = acc;
    }
}

// One block per slice of ENC_SLICE token ids: it collects the positions holding one of its
// ids, in position order (ballot and prefix counts), and adds their gradients row by row, each
// thread its own columns. No two blocks touch the same row of dwte, and each element is summed
// over positions in increasing order: deterministic, and the CPU's order.
#define ENC_SLICE 32
#define ENC_THREADS 256

template <typename T>
__global__ void encoder_backward_wte_kernel(float *dwte, const T *dout, const int32_t *tokens,
                                            int BT, int C)
{
    __shared__ int list[ENC_THREADS];
    __shared__ int counts[ENC_THREADS / 32];
    int v0 = blockIdx.x * ENC_SLICE, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int p0 = 0; p0 < BT; p0 += ENC_THREADS) {
        int p = p0 + (int)threadIdx.x;
        int tok = p < BT ? tokens[p] : -1;
        bool mine = tok >= v0 && tok < v0 + ENC_SLICE;
        unsigned ballot = __ballot_sync(0xffffffffu, mine);
        if (lane == 0)
            counts[warp] = __popc(ballot);
        __syncthreads();
        int before = 0, total = 0;
        for (int w = 0; w < ENC_THREADS / 32; w++) {
            before += w < warp ? counts[w] : 0;
            total += counts[w];
        }
        if (mine)
            list[before + __popc(ballot & ((1u << lane) - 1u))] = p;
        __syncthreads();
        for (int i = 0; i < total; i++) {
            int q = list[i];
            float *d = dwte + (int64_t)tokens[q] * C;
            const T *g = dout + (int64_t)q * C;
            for (int c = threadIdx.x; c < C; c += ENC_THREADS)
                d[c] += to_f(g[c]);
        }
        __syncthreads(); // list and counts are rewritten by the next tile
    }
}

template <typename T>
static int encoder_forward(const kctx &k, void *out, const int32_t *tokens, const void *wte,
                           const void *wpe, int B, int T_, int C, struct err *e)
{
    encoder_forward_kernel<T><<<blocks_for((int64_t)B * T_ * C, 256), 256, 0, k.stream>>>(
        (T *)out, tokens, (const T *)wte, (const T *)wpe, B, T_, C);
    KERNEL_CHECK("encoder_forward_kernel", e);
    return ERR_OK;
}

int k_encoder_forward(const kctx &k, void *out, const int32_t *tokens, const void *wte,
                      const void *wpe, int B, int T, int C, struct err *e)
{
    return DISPATCH(k, encoder_forward)(k, out, tokens, wte, wpe, B, T, C, e);
}

template <typename T>
static int encoder_backward(const kctx &k, float *dwte, float *dwpe, const void *dout,
                            const int32_t *tokens, int B, int T_, int C, int V, struct err *e)
{
    encoder_backward_wpe_kernel<T><<<blocks_for((int64_t)T_ * C, 256), 256, 0, k.stream>>>(
        dwpe, (const T *)dout, B, T_, C);
    KERNEL_CHECK("encoder_backward_wpe_kernel", e);
    int slices = (V + ENC_SLICE - 1) / ENC_SLICE;
    encoder_backward_wte_kernel<T><<<slices, ENC_THREADS, 0, k.stream>>>(
        dwte, (const T *)dout, tokens, B * T_, C);
    KERNEL_CHECK("encoder_backward_wte_kernel", e);
    return ERR_OK;
}

int k_encoder_backward(const kctx &k, float *dwte, float *dwpe, const void *dout,
                       const int32_t *tokens, int B, int T, int C, int V, struct err *e)
{
    return DISPATCH(k, encoder_backward)(k, dwte, dwpe, dout, tokens, B, T, C, V, e);
}

// ---- layer norm: a warp per row ----

#define ROW_WARPS 8 // rows (warps) per block of the row kernels

template <typename T>
__global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, const T *inp,
                                         const T *w, const T *b, int N, int C)
{
    int n = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N)
        return;
    const T *x = inp + (int64_t)n * C;
    T *o = out + (int64_t)n * C;
    float m = 0;
    for (int i = lane; i < C; i += 32)
        m += to_f(x[i]);
    m = warp_sum(m) / C;
    float var = 0;
    for (int i = lane; i < C; i += 32) {
        float d = to_f(x[i]) - m;
        var += d * d;
    }
    var = warp_sum(var) / C;
    float s = 1.0f / sqrtf(var + 1e-5f);
    for (int i = lane; i < C; i += 32)
        o[i] = from_f<T>((to_f(x[i]) - m) * s * to_f(w[i]) + to_f(b[i]));
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = s;
    }
}

template <typename T>
__global__ void layernorm_backward_kernel(T *dinp, const T *dout, const T *inp, const T *w,
                                          const float *mean, const float *rstd, int N, int C)
{
    int n = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N)
        return;
    const T *x = inp + (int64_t)n * C, *g = dout + (int64_t)n * C;
    T *d = dinp + (int64_t)n * C;
    float m = mean[n], s = rstd[n], dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int i = lane; i < C; i += 32) {
        float norm = (to_f(x[i]) - m) * s, dnorm = to_f(w[i]) * to_f(g[i]);
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean = warp_sum(dnorm_mean) / C;
    dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
    for (int i = lane; i < C; i += 32) {
        float norm = (to_f(x[i]) - m) * s, dnorm = to_f(w[i]) * to_f(g[i]);
        d[i] = from_f<T>(to_f(d[i]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
    }
}

// ---- column sums: COL_W columns per block, COL_R row lanes, rows in order per lane, then the
// lanes in order: one fixed order per column, summed in full and then added to the gradient
// once (so a second backward adds exactly the same bits: 2x the first) ----

#define COL_W 16
#define COL_R 64

// dw (C) += sum_n (x - mean) rstd dout (mean NULL: 0, RMSNorm's gain), db (C) += sum_n dout;
// either may be NULL (a bias: dw NULL; RMSNorm: db NULL)
template <typename T>
__global__ void column_grads_kernel(float *dw, float *db, const T *dout, const T *inp,
                                    const float *mean, const float *rstd, int N, int C)
{
    __shared__ float sw[COL_R][COL_W + 1], sb[COL_R][COL_W + 1];
    int tx = threadIdx.x % COL_W, ty = threadIdx.x / COL_W, c = blockIdx.x * COL_W + tx;
    float aw = 0, ab = 0;
    if (c < C)
        for (int n = ty; n < N; n += COL_R) {
            float g = to_f(dout[(int64_t)n * C + c]);
            if (dw != nullptr)
                aw += (to_f(inp[(int64_t)n * C + c]) - (mean != nullptr ? mean[n] : 0.0f)) *
                      rstd[n] * g;
            ab += g;
        }
    sw[ty][tx] = aw;
    sb[ty][tx] = ab;
    __syncthreads();
    if (ty == 0 && c < C) {
        float tw = 0, tb = 0;
        for (int r = 0; r < COL_R; r++) {
            tw += sw[r][tx];
            tb += sb[r][tx];
        }
        if (dw != nullptr)
            dw[c] += tw;
        if (db != nullptr)
            db[c] += tb;
    }
}

template <typename T>
static int column_grads(const kctx &k, float *dw, float *db, const void *dout, const void *inp,
                        const float *mean, const float *rstd, int N, int C, struct err *e)
{
    column_grads_kernel<T><<<(C + COL_W - 1) / COL_W, COL_W * COL_R, 0, k.stream>>>(
        dw, db, (const T *)dout, (const T *)inp, mean, rstd, N, C);
    KERNEL_CHECK("column_grads_kernel", e);
    return ERR_OK;
}

int k_column_grads(const kctx &k, float *dw, float *db, const void *dout, const void *inp,
                   const float *mean, const float *rstd, int N, int C, struct err *e)
{
    return DISPATCH(k, column_grads)(k, dw, db, dout, inp, mean, rstd, N, C, e);
}

template <typename T>
static int layernorm_forward(const kctx &k, void *out, float *mean, float *rstd,
                             const void *inp, const void *w, const void *b, int N, int C,
                             struct err *e)
{
    layernorm_forward_kernel<T><<<(N + ROW_WARPS - 1) / ROW_WARPS, 32 * ROW_WARPS, 0, k.stream>>>(
        (T *)out, mean, rstd, (const T *)inp, (const T *)w, (const T *)b, N, C);
    KERNEL_CHECK("layernorm_forward_kernel", e);
    return ERR_OK;
}

int k_layernorm_forward(const kctx &k, void *out, float *mean, float *rstd, const void *inp,
                        const void *w, const void *b, int N, int C, struct err *e)
{
    return DISPATCH(k, layernorm_forward)(k, out, mean, rstd, inp, w, b, N, C, e);
}

template <typename T>
static int layernorm_backward(const kctx &k, void *dinp, float *dw, float *db, const void *dout,
                              const void *inp, const void *w, const float *mean,
                              const float *rstd, int N, int C, struct err *e)
{
    layernorm_backward_kernel<T><<<(N + ROW_WARPS - 1) / ROW_WARPS, 32 * ROW_WARPS, 0, k.stream>>>(
        (T *)dinp, (const T *)dout, (const T *)inp, (const T *)w, mean, rstd, N, C);
    KERNEL_CHECK("layernorm_backward_kernel", e);
    return column_grads<T>(k, dw, db, dout, inp, mean, rstd, N, C, e);
}

int k_layernorm_backward(const kctx &k, void *dinp, float *dw, float *db, const void *dout,
                         const void *inp, const void *w, const float *mean, const float *rstd,
                         int N, int C, struct err *e)
{
    return DISPATCH(k, layernorm_backward)(k, dinp, dw, db, dout, inp, w, mean, rstd, N, C, e);
}

// ---- linear layers: cuBLAS, column-major, so a row-major X (r,c) is X^T (c,r) to it ----

static cudaDataType_t act_type(const kctx &k)
{
    return k.dt == MODEL_DTYPE_FP16 ? CUDA_R_16F : k.dt == MODEL_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// C (m,n) = alpha op(A) op(B) + beta C, column-major; A and B of the model's dtype, C of
// `ctype`; fp32 accumulation.
static int gemm(const kctx &k, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int kk,
                float alpha, const void *A, int lda, const void *B, int ldb, float beta, void *C,
                cudaDataType_t ctype, int ldc, struct err *e)
{
    CUBLAS_CHECK(cublasGemmEx(k.blas, ta, tb, m, n, kk, &alpha, A, act_type(k), lda, B,
                              act_type(k), ldb, &beta, C, ctype, ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 e);
    return ERR_OK;
}

static int gemm_batched(const kctx &k, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                        int kk, float alpha, const void *A, int lda, long long sa, const void *B,
                        int ldb, long long sb, void *C, int ldc, long long sc, int batches,
                        struct err *e)
{
    float beta = 0;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(k.blas, ta, tb, m, n, kk, &alpha, A, act_type(k),
                                            lda, sa, B, act_type(k), ldb, sb, &beta, C,
                                            act_type(k), ldc, sc, batches, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT),
                 e);
    return ERR_OK;
}

template <typename T>
__global__ void fill_add_bias_kernel(T *out, const T *add, const T *bias, int64_t N, int OC)
{
    GRID_STRIDE(i, N * OC) {
        float v = add != nullptr ? to_f(add[i]) : 0.0f;
        if (bias != nullptr)
            v += to_f(bias[i % OC]);
        out[i] = from_f<T>(v);
    }
}

template <typename T>
static int matmul_forward(const kctx &k, void *out, const void *add, const void *inp,
                          const void *w, const void *bias, int N, int C, int OC, struct err *e)
{
    float beta = 0;
    if (add != nullptr || bias != nullptr) {
        fill_add_bias_kernel<T><<<blocks_for((int64_t)N * OC, 256), 256, 0, k.stream>>>(
            (T *)out, (const T *)add, (const T *)bias, N, OC);
        KERNEL_CHECK("fill_add_bias_kernel", e);
        beta = 1;
    }
    // out^T (OC,N) = w^T^T (OC,C) inp^T (C,N)
    return gemm(k, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, 1.0f, w, C, inp, C, beta, out,
                act_type(k), OC, e);
}

int k_matmul_forward(const kctx &k, void *out, const void *add, const void *inp, const void *w,
                     const void *bias, int N, int C, int OC, struct err *e)
{
    return DISPATCH(k, matmul_forward)(k, out, add, inp, w, bias, N, C, OC, e);
}

template <typename T>
static int matmul_backward(const kctx &k, void *dinp, float *dw, float *dbias, const void *dout,
                           const void *inp, const void *w, int N, int C, int OC, struct err *e)
{
    // dinp^T (C,N) = w^T (C,OC) dout^T (OC,N)
    if (dinp != nullptr &&
        gemm(k, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, 1.0f, w, C, dout, OC, 0.0f, dinp,
             act_type(k), C, e))
        return e->code;
    // dw^T (C,OC) += inp^T (C,N) dout (N,OC), into fp32; none without dw (a split
    // backward's input-gradient pass)
    if (dw == nullptr)
        return ERR_OK;
    if (gemm(k, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dw, CUDA_R_32F,
             C, e))
        return e->code;
    return dbias != nullptr
               ? column_grads<T>(k, nullptr, dbias, dout, nullptr, nullptr, nullptr, N, OC, e)
               : ERR_OK;
}

int k_matmul_backward(const kctx &k, void *dinp, float *dw, float *dbias, const void *dout,
                      const void *inp, const void *w, int N, int C, int OC, struct err *e)
{
    return DISPATCH(k, matmul_backward)(k, dinp, dw, dbias, dout, inp, w, N, C, OC, e);
}

// ---- attention: per batch row b, strided-batched GEMMs over the heads on the strided
// columns of qkv (no permuted copies), and a warp per row of the (T,T) scores ----

template <typename T>
__global__ void softmax_causal_kernel(T *att, int rows, int T_)
{
    int r = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= rows)
        return;
    int t = r % T_;
    T *a = att + (int64_t)r * T_;
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32)
        mx = fmaxf(mx, to_f(a[j]));
    mx = warp_max(mx);
    float sum = 0;
    for (int j = lane; j <= t; j += 32)
        sum += expf(to_f(a[j]) - mx);
    float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < T_; j += 32)
        a[j] = from_f<T>(j <= t ? expf(to_f(a[j]) - mx) * inv : 0.0f);
}

// d pre-softmax = att * (d att - sum(att * d att)) * scale, in place over datt; zero above the
// diagonal (the dk product runs over whole rows)
template <typename T>
__global__ void softmax_causal_backward_kernel(T *datt, const T *att, int rows, int T_,
                                               float scale)
{
    int r = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= rows)
        return;
    int t = r % T_;
    const T *a = att + (int64_t)r * T_;
    T *d = datt + (int64_t)r * T_;
    float s = 0;
    for (int j = lane; j <= t; j += 32)
        s += to_f(a[j]) * to_f(d[j]);
    s = warp_sum(s);
    for (int j = lane; j < T_; j += 32)
        d[j] = from_f<T>(j <= t ? to_f(a[j]) * (to_f(d[j]) - s) * scale : 0.0f);
}

template <typename T>
static int attention_forward(const kctx &k, void *out, void *att, const void *qkv, int B,
                             int T_, int C, int NH, struct err *e)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    long long TT = (long long)T_ * T_;
    for (int b = 0; b < B; b++) {
        const T *q = (const T *)qkv + (int64_t)b * T_ * C3, *kk = q + C;
        T *a = (T *)att + (int64_t)b * NH * TT;
        // scores^T (T,T) = scale k (T,hs) q^T (hs,T), head h at column offset h*hs
        if (gemm_batched(k, CUBLAS_OP_T, CUBLAS_OP_N, T_, T_, hs, scale, kk, C3, hs, q, C3, hs,
                         a, T_, TT, NH, e))
            return e->code;
    }
    int rows = B * NH * T_;
    softmax_causal_kernel<T><<<(rows + ROW_WARPS - 1) / ROW_WARPS, 32 * ROW_WARPS, 0, k.stream>>>(
        (T *)att, rows, T_);
    KERNEL_CHECK("softmax_causal_kernel", e);
    for (int b = 0; out != nullptr && b < B; b++) {
        const T *v = (const T *)qkv + (int64_t)b * T_ * C3 + 2 * C;
        const T *a = (const T *)att + (int64_t)b * NH * TT;
        T *y = (T *)out + (int64_t)b * T_ * C;
        // y^T (hs,T) = v^T (hs,T) att^T (T,T)
        if (gemm_batched(k, CUBLAS_OP_N, CUBLAS_OP_N, hs, T_, T_, 1.0f, v, C3, hs, a, T_, TT, y,
                         C, hs, NH, e))
            return e->code;
    }
    return ERR_OK;
}

int k_attention_forward(const kctx &k, void *out, void *att, const void *qkv, int B, int T,
                        int C, int NH, struct err *e)
{
    return DISPATCH(k, attention_forward)(k, out, att, qkv, B, T, C, NH, e);
}

template <typename T>
static int attention_backward(const kctx &k, void *dqkv, void *datt, const void *dout,
                              const void *qkv, const void *att, int B, int T_, int C, int NH,
                              struct err *e)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    long long TT = (long long)T_ * T_;
    for (int b = 0; b < B; b++) {
        const T *v = (const T *)qkv + (int64_t)b * T_ * C3 + 2 * C;
        const T *a = (const T *)att + (int64_t)b * NH * TT;
        const T *g = (const T *)dout + (int64_t)b * T_ * C;
        T *dv = (T *)dqkv + (int64_t)b * T_ * C3 + 2 * C;
        T *da = (T *)datt + (int64_t)b * NH * TT;
        // dv^T (hs,T) = dout^T (hs,T) att (T,T)
        if (gemm_batched(k, CUBLAS_OP_N, CUBLAS_OP_T, hs, T_, T_, 1.0f, g, C, hs, a, T_, TT, dv,
                         C3, hs, NH, e))
            return e->code;
        // datt^T (T,T) = v (T,hs) dout^T (hs,T)
        if (gemm_batched(k, CUBLAS_OP_T, CUBLAS_OP_N, T_, T_, hs, 1.0f, v, C3, hs, g, C, hs, da,
                         T_, TT, NH, e))
            return e->code;
    }
    int rows = B * NH * T_;
    softmax_causal_backward_kernel<T>
        <<<(rows + ROW_WARPS - 1) / ROW_WARPS, 32 * ROW_WARPS, 0, k.stream>>>(
            (T *)datt, (const T *)att, rows, T_, scale);
    KERNEL_CHECK("softmax_causal_backward_kernel", e);
    for (int b = 0; b < B; b++) {
        const T *q = (const T *)qkv + (int64_t)b * T_ * C3, *kk = q + C;
        const T *da = (const T *)datt + (int64_t)b * NH * TT;
        T *dq = (T *)dqkv + (int64_t)b * T_ * C3, *dk = dq + C;
        // dq^T (hs,T) = k^T (hs,T) dpre^T (T,T)
        if (gemm_batched(k, CUBLAS_OP_N, CUBLAS_OP_N, hs, T_, T_, 1.0f, kk, C3, hs, da, T_, TT,
                         dq, C3, hs, NH, e))
            return e->code;
        // dk^T (hs,T) = q^T (hs,T) dpre (T,T)
        if (gemm_batched(k, CUBLAS_OP_N, CUBLAS_OP_T, hs, T_, T_, 1.0f, q, C3, hs, da, T_, TT,
                         dk, C3, hs, NH, e))
            return e->code;
    }
    return ERR_OK;
}

int k_attention_backward(const kctx &k, void *dqkv, void *datt, const void *dout,
                         const void *qkv, const void *att, int B, int T, int C, int NH,
                         struct err *e)
{
    return DISPATCH(k, attention_backward)(k, dqkv, datt, dout, qkv, att, B, T, C, NH, e);
}

// ---- GELU ----

#define GELU_SCALE 0.7978845608028654f // sqrt(2 / pi)

template <typename T> __global__ void gelu_forward_kernel(T *out, const T *inp, int64_t n)
{
    GRID_STRIDE(i, n) {
        float x = to_f(inp[i]);
        out[i] = from_f<T>(0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x))));
    }
}

template <typename T>
__global__ void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, int64_t n)
{
    GRID_STRIDE(i, n) {
        float x = to_f(inp[i]);
        float th = tanhf(GELU_SCALE * (x + 0.044715f * x * x * x));
        float sech2 = 1.0f - th * th;
        float local = 0.5f * (1.0f + th) +
                      0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = from_f<T>(local * to_f(dout[i]));
    }
}

template <typename T>
static int gelu_forward(const kctx &k, void *out, const void *inp, int64_t n, struct err *e)
{
    gelu_forward_kernel<T><<<blocks_for(n, 256), 256, 0, k.stream>>>((T *)out, (const T *)inp, n);
    KERNEL_CHECK("gelu_forward_kernel", e);
    return ERR_OK;
}

int k_gelu_forward(const kctx &k, void *out, const void *inp, int64_t n, struct err *e)
{
    return DISPATCH(k, gelu_forward)(k, out, inp, n, e);
}

template <typename T>
static int gelu_backward(const kctx &k, void *dinp, const void *inp, const void *dout, int64_t n,
                         struct err *e)
{
    gelu_backward_kernel<T><<<blocks_for(n, 256), 256, 0, k.stream>>>(
        (T *)dinp, (const T *)inp, (const T *)dout, n);
    KERNEL_CHECK("gelu_backward_kernel", e);
    return ERR_OK;
}

int k_gelu_backward(const kctx &k, void *dinp, const void *inp, const void *dout, int64_t n,
                    struct err *e)
{
    return DISPATCH(k, gelu_backward)(k, dinp, inp, dout, n, e);
}

// ---- softmax cross-entropy: a block per row of the logits ----

#define CE_THREADS 512

template <typename T>
__global__ void crossentropy_forward_kernel(T *probs, float *losses, const int32_t *targets,
                                            int V)
{
    __shared__ float shared[32];
    int n = blockIdx.x;
    T *p = probs + (int64_t)n * V;
    float target_logit = to_f(p[targets[n]]); // read before any thread overwrites the row
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        mx = fmaxf(mx, to_f(p[i]));
    mx = block_reduce(mx, shared, true);
    float sum = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        sum += expf(to_f(p[i]) - mx);
    sum = block_reduce(sum, shared, false);
    float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        p[i] = from_f<T>(expf(to_f(p[i]) - mx) * inv);
    // -log softmax from the logits: finite even when the probability underflows
    if (losses != nullptr && threadIdx.x == 0)
        losses[n] = logf(sum) - (target_logit - mx);
}

template <typename T>
__global__ void crossentropy_backward_kernel(T *probs, const int32_t *targets, float dloss,
                                             int N, int V)
{
    GRID_STRIDE(i, (int64_t)N * V) {
        int64_t n = i / V;
        float p = to_f(probs[i]);
        if (i % V == targets[n])
            p -= 1.0f;
        probs[i] = from_f<T>(p * dloss);
    }
}

template <typename T>
static int crossentropy_forward(const kctx &k, void *probs, float *losses,
                                const int32_t *targets, int N, int V, struct err *e)
{
    crossentropy_forward_kernel<T><<<N, CE_THREADS, 0, k.stream>>>((T *)probs, losses, targets, V);
    KERNEL_CHECK("crossentropy_forward_kernel", e);
    return ERR_OK;
}

int k_crossentropy_forward(const kctx &k, void *probs, float *losses, const int32_t *targets,
                           int N, int V, struct err *e)
{
    return DISPATCH(k, crossentropy_forward)(k, probs, losses, targets, N, V, e);
}

template <typename T>
static int crossentropy_backward(const kctx &k, void *probs, const int32_t *targets,
                                 float dloss, int N, int V, struct err *e)
{
    crossentropy_backward_kernel<T><<<blocks_for((int64_t)N * V, 256), 256, 0, k.stream>>>(
        (T *)probs, targets, dloss, N, V);
    KERNEL_CHECK("crossentropy_backward_kernel", e);
    return ERR_OK;
}

int k_crossentropy_backward(const kctx &k, void *probs, const int32_t *targets, float dloss,
                            int N, int V, struct err *e)
{
    return DISPATCH(k, crossentropy_backward)(k, probs, targets, dloss, N, V, e);
}

// ---- loss scaling ----

__global__ void unscale_kernel(float *x, int64_t n, float mul, int *found)
{
    GRID_STRIDE(i, n) {
        float v = x[i];
        if (!isfinite(v))
            *found = 1; // every writer writes 1: no race that matters
        if (mul != 1.0f)
            x[i] = v * mul;
    }
}

int k_unscale(const kctx &k, float *x, int64_t n, float mul, int *found, struct err *e)
{
    if (n <= 0)
        return ERR_OK;
    unscale_kernel<<<blocks_for(n, 256), 256, 0, k.stream>>>(x, n, mul, found);
    KERNEL_CHECK("unscale_kernel", e);
    return ERR_OK;
}

// ---- AdamW ----

template <typename T>
__global__ void adamw_kernel(T *weights, float *master, const float *g, float *m, float *v,
                             int64_t n, float lr, float b1, float b2, float eps, float wd,
                             float c1, float c2)
{
    GRID_STRIDE(i, n) {
        float gi = g[i];
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float w = master[i];
        w -= lr * ((mi / c1) / (sqrtf(vi / c2) + eps) + wd * w);
        master[i] = w;
        if ((void *)weights != (void *)master)
            weights[i] = from_f<T>(w);
    }
}

template <typename T>
static int adamw(const kctx &k, void *weights, float *master, const float *g, float *m, float *v,
                 int64_t n, float lr, float b1, float b2, float eps, float wd, float c1, float c2,
                 struct err *e)
{
    adamw_kernel<T><<<blocks_for(n, 256), 256, 0, k.stream>>>((T *)weights, master, g, m, v, n, lr,
                                                               b1, b2, eps, wd, c1, c2);
    KERNEL_CHECK("adamw_kernel", e);
    return ERR_OK;
}

int k_adamw(const kctx &k, void *weights, float *master, const float *g, float *m, float *v,
            int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
            float c1, float c2, struct err *e)
{
    return DISPATCH(k, adamw)(k, weights, master, g, m, v, n, lr, beta1, beta2, eps,
                              weight_decay, c1, c2, e);
}
