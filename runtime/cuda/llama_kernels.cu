// The Llama family's kernels on an NVIDIA GPU (llama_layers.h's table, shapes as in
// kernels_llama_cpu.h), in kernels.cuh's conventions: fp32 arithmetic on float or 16-bit
// tensors, no atomics, every sum in one fixed order. Written for plainness over speed: each
// output element is one thread's loop (attention included: its scores are recomputed rather
// than staged in a rounded buffer), so each is correct by construction.
#include <math.h>

#include "check.cuh"
#include "device.cuh"
#include "kernels.cuh"

extern "C" {
#include "llama_layers.h"
}

// The backend's stream, cuBLAS handle and dtype (backend.cu).
kctx cuda_kctx(struct backend *be, enum model_dtype dt);

#define THREADS 256

// ---- token embedding ----

template <typename T>
__global__ void embedding_forward_kernel(T *out, const int32_t *tokens, const T *wte, int64_t n,
                                         int C)
{
    GRID_STRIDE(i, n) {
        out[i] = wte[(int64_t)tokens[i / C] * C + i % C];
    }
}

// one thread per column, positions in order: each token's row sums in one order
template <typename T>
__global__ void embedding_backward_kernel(float *dwte, const T *dout, const int32_t *tokens,
                                          int64_t BT, int C)
{
    GRID_STRIDE(c, C) {
        for (int64_t bt = 0; bt < BT; bt++)
            dwte[(int64_t)tokens[bt] * C + c] += to_f(dout[bt * C + c]);
    }
}

template <typename T>
static int embedding_forward(struct backend *be, enum model_dtype dt, void *out,
                             const int32_t *tokens, const void *wte, int B, int T_, int C,
                             struct err *e)
{
    kctx k = cuda_kctx(be, dt);
    int64_t n = (int64_t)B * T_ * C;
    embedding_forward_kernel<T><<<blocks_for(n, THREADS), THREADS, 0, k.stream>>>(
        (T *)out, tokens, (const T *)wte, n, C);
    KERNEL_CHECK("embedding_forward_kernel", e);
    return ERR_OK;
}

template <typename T>
static int embedding_backward(struct backend *be, enum model_dtype dt, float *dwte,
                              const void *dout, const int32_t *tokens, int B, int T_, int C,
                              int V, struct err *e)
{
    kctx k = cuda_kctx(be, dt);
    embedding_backward_kernel<T><<<blocks_for(C, THREADS), THREADS, 0, k.stream>>>(
        dwte, (const T *)dout, tokens, (int64_t)B * T_, C);
    KERNEL_CHECK("embedding_backward_kernel", e);
    return ERR_OK;
}

// ---- RMSNorm: one block per row ----

template <typename T>
__global__ void rmsnorm_forward_kernel(T *out, float *rstd, const T *inp, const T *w, int C,
                                       float eps)
{
    __shared__ float shared[32];
    const T *x = inp + (int64_t)blockIdx.x * C;
    T *o = out + (int64_t)blockIdx.x * C;
    float ss = 0;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        ss += to_f(x[i]) * to_f(x[i]);
    ss = block_reduce(ss, shared, false);
    float s = 1.0f / sqrtf(ss / C + eps);
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        o[i] = from_f<T>(to_f(x[i]) * s * to_f(w[i]));
    if (threadIdx.x == 0)
        rstd[blockIdx.x] = s;
}

template <typename T>
__global__ void rmsnorm_backward_kernel(T *dinp, const T *dout, const T *inp, const T *w,
                                        const float *rstd, int C)
{
    __shared__ float shared[32];
    int64_t row = (int64_t)blockIdx.x * C;
    float s = rstd[blockIdx.x], dot = 0;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        dot += to_f(w[i]) * to_f(dout[row + i]) * to_f(inp[row + i]);
    dot = block_reduce(dot, shared, false);
    float k = s * s * s * (dot / C);
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        dinp[row + i] = from_f<T>(to_f(dinp[row + i]) + s * to_f(w[i]) * to_f(dout[row + i]) -
                                  to_f(inp[row + i]) * k);
}

template <typename T>
static int rmsnorm_forward(struct backend *be, enum model_dtype dt, void *out, float *rstd,
                           const void *inp, const void *w, int N, int C, float eps,
                           struct err *e)
{
    kctx k = cuda_kctx(be, dt);
    rmsnorm_forward_kernel<T><<<N, THREADS, 0, k.stream>>>((T *)out, rstd, (const T *)inp,
                                                           (const T *)w, C, eps);
    KERNEL_CHECK("rmsnorm_forward_kernel", e);
    return ERR_OK;
}

template <typename T>
static int rmsnorm_backward(struct backend *be, enum model_dtype dt, void *dinp, float *dw,
                            const void *dout, const void *inp, const void *w, const float *rstd,
                            int N, int C, struct err *e)
{
    kctx k = cuda_kctx(be, dt);
    rmsnorm_backward_kernel<T><<<N, THREADS, 0, k.stream>>>(
        (T *)dinp, (const T *)dout, (const T *)inp, (const T *)w, rstd, C);
    KERNEL_CHECK("rmsnorm_backward_kernel", e);
    // dw summed in full, then added once (kernels.cuh): a second backward doubles it exactly
    return k_column_grads(k, dw, nullptr, dout, inp, nullptr, rstd, N, C, e);
}

// ---- rotary positions: one thread per rotated pair; angles in double, as on the CPU ----

template <typename T>
__global__ void rope_kernel(T *x, int64_t pairs, int T_, int H, int stride, int hs,
                            float theta, float dir)
{
    int half = hs / 2;
    GRID_STRIDE(p, pairs) {
        int i = (int)(p % half), h = (int)(p / half % H);
        int64_t bt = p / half / H;
        double angle = (double)(bt % T_) * pow((double)theta, -2.0 * i / hs);
        float c = (float)cos(angle), s = dir * (float)sin(angle);
        T *a = x + bt * stride + (int64_t)h * hs + i, *b = a + half;
        float x1 = to_f(*a), x2 = to_f(*b);
        *a = from_f<T>(x1 * c - x2 * s);
        *b = from_f<T>(x2 * c + x1 * s);
    }
}

template <typename T>
static int rope_turn(struct backend *be, enum model_dtype dt, void *x, int B, int T_, int H,
                     int stride, int hs, float theta, float dir, struct err *e)
{
    kctx k = cuda_kctx(be, dt);
    int64_t pairs = (int64_t)B * T_ * H * (hs / 2);
    rope_kernel<T><<<blocks_for(pairs, THREADS), THREADS, 0, k.stream>>>(
        (T *)x, pairs, T_, H, stride, hs, theta, dir);
    KERNEL_CHECK("rope_kernel", e);
    return ERR_OK;
}

template <typename T>
static int rope_forward(struct backend *be, enum model_dtype dt, void *x, int B, int T_, int H,
                        int stride, int hs, float theta, struct err *e)
{
    return rope_turn<T>(be, dt, x, B, T_, H, stride, hs, theta, 1.0f, e);
}

template <typename T>
static int rope_backward(struct backend *be, enum model_dtype dt, void *dx, int B, int T_, int H,
                         int stride, int hs, float theta, struct err *e)
{
    return rope_turn<T>(be, dt, dx, B, T_, H, stride, hs, theta, -1.0f, e);
}

// ---- SwiGLU ----

template <typename T>
__global__ void swiglu_forward_kernel(T *out, const T *inp, int64_t n, int F)
{
    GRID_STRIDE(i, n) {
        int64_t row = i / F * 2 * F;
        float g = to_f(inp[row + i % F]), u = to_f(inp[row + F + i % F]);
        out[i] = from_f<T>(g / (1.0f + expf(-g)) * u);
    }
}

template <typename T>
__global__ void swiglu_backward_kernel(T *dinp, const T *inp, const T *dout, int64_t n, int F)
{
    GRID_STRIDE(i, n) {
        int64_t row = i / F * 2 * F;
        float g = to_f(inp[row + i % F]), u = to_f(inp[row + F + i % F]), d = to_f(dout[i]);
        float sig = 1.0f / (1.0f + expf(-g));
        dinp[row + i % F] = from_f<T>(d * u * sig * (1.0f + g * (1.0f - sig)));
        dinp[row + F + i % F] = from_f<T>(d * g * sig);
    }
}

template <typename T>
static int swiglu_forward(struct backend *be, enum model_dtype dt, void *out, const void *inp,
                          int N, int F, struct err *e)
{
    kctx k = cuda_kctx(be, dt);
    int64_t n = (int64_t)N * F;
    swiglu_forward_kernel<T><<<blocks_for(n, THREADS), THREADS, 0, k.stream>>>(
        (T *)out, (const T *)inp, n, F);
    KERNEL_CHECK("swiglu_forward_kernel", e);
    return ERR_OK;
}

template <typename T>
static int swiglu_backward(struct backend *be, enum model_dtype dt, void *dinp, const void *inp,
                           const void *dout, int N, int F, struct err *e)
{
    kctx k = cuda_kctx(be, dt);
    int64_t n = (int64_t)N * F;
    swiglu_backward_kernel<T><<<blocks_for(n, THREADS), THREADS, 0, k.stream>>>(
        (T *)dinp, (const T *)inp, (const T *)dout, n, F);
    KERNEL_CHECK("swiglu_backward_kernel", e);
    return ERR_OK;
}

// ---- grouped-query attention, materialised ----

struct gqa {
    int T, NH, NKV, hs, W, C, group;
    float scale;
    __device__ int64_t q(int b, int t, int h) const { return ((int64_t)b * T + t) * W + h * hs; }
    __device__ int64_t k(int b, int t, int h) const
    {
        return ((int64_t)b * T + t) * W + C + (h / group) * hs;
    }
    __device__ int64_t v(int b, int t, int h) const { return k(b, t, h) + (int64_t)NKV * hs; }
    __device__ int64_t o(int b, int t, int h) const { return ((int64_t)b * T + t) * C + h * hs; }
    __device__ int64_t a(int b, int h, int t) const { return (((int64_t)b * NH + h) * T + t) * T; }
};

static gqa gqa_of(int T_, int NH, int NKV, int hs)
{
    return gqa{T_, NH, NKV, hs, (NH + 2 * NKV) * hs, NH * hs, NH / NKV,
               1.0f / sqrtf((float)hs)};
}

template <typename T>
__device__ float dot(const T *x, const T *y, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++)
        s += to_f(x[i]) * to_f(y[i]);
    return s;
}

// One block per (t, h, b) row of probabilities: the maximum, the sum, then the row, each pass
// recomputing its scores; zero above the diagonal.
template <typename T>
__global__ void gqa_probs_kernel(T *att, const T *qkv, gqa g)
{
    __shared__ float shared[32];
    int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const T *q = qkv + g.q(b, t, h);
    T *row = att + g.a(b, h, t);
    float m = -INFINITY;
    for (int j = threadIdx.x; j <= t; j += blockDim.x)
        m = fmaxf(m, g.scale * dot(q, qkv + g.k(b, j, h), g.hs));
    m = block_reduce(m, shared, true);
    float sum = 0;
    for (int j = threadIdx.x; j <= t; j += blockDim.x)
        sum += expf(g.scale * dot(q, qkv + g.k(b, j, h), g.hs) - m);
    sum = block_reduce(sum, shared, false);
    for (int j = threadIdx.x; j < g.T; j += blockDim.x)
        row[j] = from_f<T>(j <= t ? expf(g.scale * dot(q, qkv + g.k(b, j, h), g.hs) - m) / sum
                                  : 0.0f);
}

template <typename T>
__global__ void gqa_out_kernel(T *out, const T *att, const T *qkv, gqa g, int64_t n)
{
    GRID_STRIDE(idx, n) {
        int i = (int)(idx % g.hs), h = (int)(idx / g.hs % g.NH);
        int t = (int)(idx / g.hs / g.NH % g.T), b = (int)(idx / g.hs / g.NH / g.T);
        const T *row = att + g.a(b, h, t);
        float acc = 0;
        for (int j = 0; j <= t; j++)
            acc += to_f(row[j]) * to_f(qkv[g.v(b, j, h) + i]);
        out[g.o(b, t, h) + i] = from_f<T>(acc);
    }
}

// d pre-softmax of one row: att * (d att - sum(att * d att)) * scale, d att = dout v^T
// recomputed in each pass
template <typename T>
__global__ void gqa_dpre_kernel(T *dpre, const T *dout, const T *qkv, const T *att, gqa g)
{
    __shared__ float shared[32];
    int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const T *go = dout + g.o(b, t, h), *arow = att + g.a(b, h, t);
    T *row = dpre + g.a(b, h, t);
    float s = 0;
    for (int j = threadIdx.x; j <= t; j += blockDim.x)
        s += to_f(arow[j]) * dot(go, qkv + g.v(b, j, h), g.hs);
    s = block_reduce(s, shared, false);
    for (int j = threadIdx.x; j < g.T; j += blockDim.x)
        row[j] = from_f<T>(j <= t ? to_f(arow[j]) * (dot(go, qkv + g.v(b, j, h), g.hs) - s) *
                                        g.scale
                                  : 0.0f);
}

template <typename T>
__global__ void gqa_dq_kernel(T *dqkv, const T *dpre, const T *qkv, gqa g, int64_t n)
{
    GRID_STRIDE(idx, n) {
        int i = (int)(idx % g.hs), h = (int)(idx / g.hs % g.NH);
        int t = (int)(idx / g.hs / g.NH % g.T), b = (int)(idx / g.hs / g.NH / g.T);
        const T *row = dpre + g.a(b, h, t);
        float acc = 0;
        for (int j = 0; j <= t; j++)
            acc += to_f(row[j]) * to_f(qkv[g.k(b, j, h) + i]);
        dqkv[g.q(b, t, h) + i] = from_f<T>(acc);
    }
}

// dk and dv of key/value head kv at position j: over its query heads in order, then the
// positions t >= j that attend to it
template <typename T>
__global__ void gqa_dkv_kernel(T *dqkv, const T *dpre, const T *att, const T *dout,
                               const T *qkv, gqa g, int64_t n)
{
    GRID_STRIDE(idx, n) {
        int i = (int)(idx % g.hs), kv = (int)(idx / g.hs % g.NKV);
        int j = (int)(idx / g.hs / g.NKV % g.T), b = (int)(idx / g.hs / g.NKV / g.T);
        float dk = 0, dv = 0;
        for (int h = kv * g.group; h < (kv + 1) * g.group; h++)
            for (int t = j; t < g.T; t++) {
                dk += to_f(dpre[g.a(b, h, t) + j]) * to_f(qkv[g.q(b, t, h) + i]);
                dv += to_f(att[g.a(b, h, t) + j]) * to_f(dout[g.o(b, t, h) + i]);
            }
        int h0 = kv * g.group;
        dqkv[g.k(b, j, h0) + i] = from_f<T>(dk);
        dqkv[g.v(b, j, h0) + i] = from_f<T>(dv);
    }
}

template <typename T>
static int gqa_attention_forward(struct backend *be, enum model_dtype dt, void *out,
                                 void *att, const void *qkv, int B, int T_, int NH, int NKV,
                                 int hs, struct err *e)
{
    kctx k = cuda_kctx(be, dt);
    gqa g = gqa_of(T_, NH, NKV, hs);
    gqa_probs_kernel<T><<<dim3(T_, NH, B), THREADS, 0, k.stream>>>((T *)att, (const T *)qkv, g);
    KERNEL_CHECK("gqa_probs_kernel", e);
    if (out == nullptr)
        return ERR_OK;
    int64_t n = (int64_t)B * T_ * NH * hs;
    gqa_out_kernel<T><<<blocks_for(n, THREADS), THREADS, 0, k.stream>>>(
        (T *)out, (const T *)att, (const T *)qkv, g, n);
    KERNEL_CHECK("gqa_out_kernel", e);
    return ERR_OK;
}

template <typename T>
static int gqa_attention_backward(struct backend *be, enum model_dtype dt, void *dqkv,
                                  void *datt, const void *dout, const void *qkv, const void *att,
                                  int B, int T_, int NH, int NKV, int hs, struct err *e)
{
    kctx k = cuda_kctx(be, dt);
    gqa g = gqa_of(T_, NH, NKV, hs);
    gqa_dpre_kernel<T><<<dim3(T_, NH, B), THREADS, 0, k.stream>>>(
        (T *)datt, (const T *)dout, (const T *)qkv, (const T *)att, g);
    KERNEL_CHECK("gqa_dpre_kernel", e);
    int64_t nq = (int64_t)B * T_ * NH * hs, nkv = (int64_t)B * T_ * NKV * hs;
    gqa_dq_kernel<T><<<blocks_for(nq, THREADS), THREADS, 0, k.stream>>>(
        (T *)dqkv, (const T *)datt, (const T *)qkv, g, nq);
    KERNEL_CHECK("gqa_dq_kernel", e);
    gqa_dkv_kernel<T><<<blocks_for(nkv, THREADS), THREADS, 0, k.stream>>>(
        (T *)dqkv, (const T *)datt, (const T *)att, (const T *)dout, (const T *)qkv, g, nkv);
    KERNEL_CHECK("gqa_dkv_kernel", e);
    return ERR_OK;
}

// ---- the table: each entry instantiated for the model's dtype ----

#define BY_DTYPE(name)                                                                       \
    template <typename... A> static int cu_##name(struct backend *be, enum model_dtype dt,   \
                                                  A... args)                                  \
    {                                                                                        \
        return BY_MODEL_DTYPE(dt, name)(be, dt, args...);                                    \
    }
BY_DTYPE(embedding_forward)
BY_DTYPE(embedding_backward)
BY_DTYPE(rmsnorm_forward)
BY_DTYPE(rmsnorm_backward)
BY_DTYPE(rope_forward)
BY_DTYPE(rope_backward)
BY_DTYPE(swiglu_forward)
BY_DTYPE(swiglu_backward)
BY_DTYPE(gqa_attention_forward)
BY_DTYPE(gqa_attention_backward)

extern "C" const struct llama_kernels llama_kernels_cuda = {
    cu_embedding_forward, cu_embedding_backward, cu_rmsnorm_forward, cu_rmsnorm_backward,
    cu_rope_forward,      cu_rope_backward,      cu_swiglu_forward,  cu_swiglu_backward,
    cu_gqa_attention_forward, cu_gqa_attention_backward,
};
