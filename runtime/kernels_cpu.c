#include "kernels_cpu.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* Threads. OpenBLAS runs single-threaded (backend_cpu_init) and all parallelism is OpenMP's:
 * two thread pools on the same cores fight (each spins while the other works). Matrix
 * products are split into tiles of the output, one OpenBLAS call per tile; the tiles depend
 * only on the shapes, never on the thread count, so neither do the results.
 *
 * Column reductions (bias and layer-norm parameter gradients, embedding scatter-adds) run over
 * blocks of COL_BLOCK columns, one task per block, rows in order inside.
 *
 * Vector code. Element-wise loops are `omp simd`; the build contracts no a*b+c into FMAs
 * (-ffp-contract=off), so a vectorised loop computes exactly what the scalar one would. Sums
 * that reduce (layer-norm statistics, softmax denominators) stay sequential. */

/* Fast paths chosen at run time, as OpenBLAS picks its kernels: with GCC on x86-64 each
 * element-wise kernel below (and its OpenMP bodies) is compiled for the portable baseline, for
 * AVX2 and for AVX-512, and the loader's resolver (ifunc) runs the best the CPU has. With
 * contraction off and no reordered sums, every version computes the same bits. Clang clones
 * the functions but not their OpenMP bodies, so it gains nothing; a build for one CPU
 * (BALLAST_CPU_ARCH) needs no clones. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !BALLAST_CPU_ARCH_SET
#define KERNEL __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define KERNEL
#endif

#define GEMM_TILE 256
#define COL_BLOCK 64

/* C (M,N) = alpha op(A) op(B) + beta C, row-major, in tiles of at most GEMM_TILE x GEMM_TILE
 * of C, one OpenBLAS call per tile. Each call packs its tile's rows of op(A) and columns of
 * op(B) again; at 256 that costs a few percent, while 64-row strips over all of N cost a
 * quarter of the time. */
static void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    int tm = (M + GEMM_TILE - 1) / GEMM_TILE, tn = (N + GEMM_TILE - 1) / GEMM_TILE;
#pragma omp parallel for collapse(2) schedule(static)
    for (int i = 0; i < tm; i++)
        for (int j = 0; j < tn; j++) {
            int m0 = i * GEMM_TILE, n0 = j * GEMM_TILE;
            int mb = M - m0 < GEMM_TILE ? M - m0 : GEMM_TILE;
            int nb = N - n0 < GEMM_TILE ? N - n0 : GEMM_TILE;
            /* rows m0.. of op(A) are rows of A, or its columns when A is transposed; columns
             * n0.. of op(B) likewise */
            const float *a = ta == CblasNoTrans ? A + (int64_t)m0 * lda : A + m0;
            const float *b = tb == CblasNoTrans ? B + n0 : B + (int64_t)n0 * ldb;
            cblas_sgemm(CblasRowMajor, ta, tb, mb, nb, K, alpha, a, lda, b, ldb, beta,
                        C + (int64_t)m0 * ldc + n0, ldc);
        }
}

/* exp(x) for x in [-87, 88] (clamped outside), within 2 ulp: Cephes' expf, written so that
 * it vectorises (no calls, no branches). */
static inline float exp_approx(float x)
{
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln 2) */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23; /* 2^n */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline float tanh_approx(float y)
{
    return 1.0f - 2.0f / (exp_approx(2.0f * y) + 1.0f);
}

KERNEL void encoder_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                     int B, int T, int C)
{
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        float *o = out + bt * C;
        const float *te = wte + (int64_t)tokens[bt] * C, *pe = wpe + (bt % T) * C;
#pragma omp simd
        for (int i = 0; i < C; i++)
            o[i] = te[i] + pe[i];
    }
}

KERNEL void embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int B,
                               int T, int C)
{
    int blocks = (C + COL_BLOCK - 1) / COL_BLOCK;
    /* Several positions may hold the same token: each column block walks every position in
     * order, so the sum per token is always taken in the same order. */
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < blocks; blk++) {
        int c0 = blk * COL_BLOCK, c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
        for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
            float *d = dwte + (int64_t)tokens[bt] * C;
            const float *g = dout + bt * C;
#pragma omp simd
            for (int i = c0; i < c1; i++)
                d[i] += g[i];
        }
    }
}

KERNEL void encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                      int B, int T, int C)
{
    embedding_backward(dwte, dout, tokens, B, T, C);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *d = dwpe + (int64_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *g = dout + ((int64_t)b * T + t) * C;
#pragma omp simd
            for (int i = 0; i < C; i++)
                d[i] += g[i];
        }
    }
}

KERNEL void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                       const float *b, int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (int64_t)n * C;
        float *o = out + (int64_t)n * C;
        float m = 0;
        for (int i = 0; i < C; i++)
            m += x[i];
        m /= C;
        float var = 0;
        for (int i = 0; i < C; i++) {
            float d = x[i] - m;
            var += d * d;
        }
        var /= C;
        float s = 1.0f / sqrtf(var + 1e-5f);
#pragma omp simd
        for (int i = 0; i < C; i++)
            o[i] = (x[i] - m) * s * w[i] + b[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

KERNEL void layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (int64_t)n * C, *g = dout + (int64_t)n * C;
        float *d = dinp + (int64_t)n * C;
        float m = mean[n], s = rstd[n];
        float dnorm_mean = 0, dnorm_norm_mean = 0;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s, dnorm = w[i] * g[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
#pragma omp simd
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s, dnorm = w[i] * g[i];
            d[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
    int blocks = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < blocks; blk++) {
        int c0 = blk * COL_BLOCK, c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
        for (int n = 0; n < N; n++) {
            const float *x = inp + (int64_t)n * C, *g = dout + (int64_t)n * C;
            float m = mean[n], s = rstd[n];
#pragma omp simd
            for (int i = c0; i < c1; i++) {
                dw[i] += (x[i] - m) * s * g[i];
                db[i] += g[i];
            }
        }
    }
}

KERNEL void matmul_forward(float *out, const float *add, const float *inp, const float *w,
                    const float *bias, int N, int C, int OC)
{
    float beta = 0;
    if (add != NULL || bias != NULL) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            float *o = out + (int64_t)n * OC;
            const float *a = add ? add + (int64_t)n * OC : NULL;
            if (a && bias) {
#pragma omp simd
                for (int i = 0; i < OC; i++)
                    o[i] = a[i] + bias[i];
            } else {
                memcpy(o, a ? a : bias, sizeof(float) * (size_t)OC);
            }
        }
        beta = 1;
    }
    /* out (N,OC) = inp (N,C) @ w^T (C,OC) + beta * out */
    gemm(CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
}

KERNEL void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                     const float *w, int N, int C, int OC)
{
    /* dinp (N,C) = dout (N,OC) @ w (OC,C) */
    if (dinp != NULL)
        gemm(CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp, C);
    /* dw (OC,C) += dout^T (OC,N) @ inp (N,C); none without dw (the input-gradient pass) */
    if (dw == NULL)
        return;
    gemm(CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
    if (dbias == NULL)
        return;
    int blocks = (OC + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < blocks; blk++) {
        int c0 = blk * COL_BLOCK, c1 = c0 + COL_BLOCK < OC ? c0 + COL_BLOCK : OC;
        for (int n = 0; n < N; n++) {
            const float *g = dout + (int64_t)n * OC;
#pragma omp simd
            for (int i = c0; i < c1; i++)
                dbias[i] += g[i];
        }
    }
}

/* Attention runs one (batch, head) per task, each product an OpenBLAS call on that head's
 * strided columns of qkv. Rows go in blocks of ATT_ROWS: a block of query rows needs keys up
 * to its last row only, which skips most of the masked upper triangle. */
#define ATT_ROWS 64

KERNEL void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                              kernel_round_fn round)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (int64_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            float *a = att + ((int64_t)b * NH + h) * T * T;
            float *o = out != NULL ? out + (int64_t)b * T * C + h * hs : NULL;
            for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
                int rows = T - r0 < ATT_ROWS ? T - r0 : ATT_ROWS, keys = r0 + rows;
                float *ab = a + (int64_t)r0 * T;
                /* scores (rows, keys) = scale q k^T */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hs, scale,
                            q + (int64_t)r0 * C3, C3, k, C3, 0.0f, ab, T);
                for (int i = 0; i < rows; i++) {
                    float *row = ab + (int64_t)i * T;
                    int t = r0 + i;
                    if (round != NULL)
                        round(row, t + 1);
                    float maxv = row[0];
                    for (int j = 1; j <= t; j++)
                        maxv = row[j] > maxv ? row[j] : maxv;
#pragma omp simd
                    for (int j = 0; j <= t; j++)
                        row[j] = exp_approx(row[j] - maxv);
                    float sum = 0;
                    for (int j = 0; j <= t; j++)
                        sum += row[j];
                    float inv = 1.0f / sum;
#pragma omp simd
                    for (int j = 0; j <= t; j++)
                        row[j] *= inv;
                    /* the masked part is zero, so products over whole rows are causal */
                    for (int j = t + 1; j < T; j++)
                        row[j] = 0;
                    if (round != NULL)
                        round(row, t + 1);
                }
                /* out (rows, hs) = att (rows, keys) v (keys, hs) */
                if (o != NULL)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, keys, 1.0f,
                                ab, T, v, C3, 0.0f, o + (int64_t)r0 * C, C);
            }
        }
}

KERNEL void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH,
                               kernel_round_fn round)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (int64_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + (int64_t)b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
            const float *a = att + ((int64_t)b * NH + h) * T * T;
            float *da = datt + ((int64_t)b * NH + h) * T * T;
            const float *g = dout + (int64_t)b * T * C + h * hs;
            /* dv (T, hs) = att^T (T,T) dout (T, hs): att is zero above the diagonal */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, g, C,
                        0.0f, dv, C3);
            for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
                int rows = T - r0 < ATT_ROWS ? T - r0 : ATT_ROWS, keys = r0 + rows;
                float *dab = da + (int64_t)r0 * T;
                /* d att (rows, keys) = dout v^T */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hs, 1.0f,
                            g + (int64_t)r0 * C, C, v, C3, 0.0f, dab, T);
                /* softmax: d pre = att * (d att - sum(att * d att)), times the score scale */
                for (int i = 0; i < rows; i++) {
                    const float *arow = a + (int64_t)(r0 + i) * T;
                    float *row = dab + (int64_t)i * T;
                    int t = r0 + i;
                    float s = 0;
                    if (round != NULL)
                        round(row, t + 1);
                    for (int j = 0; j <= t; j++)
                        s += arow[j] * row[j];
#pragma omp simd
                    for (int j = 0; j <= t; j++)
                        row[j] = arow[j] * (row[j] - s) * scale;
                    if (round != NULL)
                        round(row, t + 1);
                    /* zero to the end of the row: the dk product below runs over whole rows */
                    for (int j = t + 1; j < T; j++)
                        row[j] = 0;
                }
                /* dq (rows, hs) = d pre (rows, keys) k (keys, hs) */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, keys, 1.0f, dab,
                            T, k, C3, 0.0f, dq + (int64_t)r0 * C3, C3);
            }
            /* dk (T, hs) = d pre^T (T,T) q (T, hs) */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, da, T, q, C3,
                        0.0f, dk, C3);
        }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

KERNEL void gelu_forward(float *out, const float *inp, int64_t n)
{
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanh_approx(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

KERNEL void gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n)
{
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = tanh_approx(GELU_SCALE * (x + 0.044715f * x * x * x));
        float sech2 = 1.0f - th * th;
        float local = 0.5f * (1.0f + th) +
                      0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = local * dout[i];
    }
}

KERNEL void softmax_crossentropy_forward(float *probs, float *losses, const int32_t *targets, int N,
                                  int V)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *p = probs + (int64_t)n * V;
        float maxv = p[0];
        for (int i = 1; i < V; i++)
            maxv = p[i] > maxv ? p[i] : maxv;
        float target_logit = p[targets[n]] - maxv;
#pragma omp simd
        for (int i = 0; i < V; i++)
            p[i] = exp_approx(p[i] - maxv);
        float sum = 0;
        for (int i = 0; i < V; i++)
            sum += p[i];
        float inv = 1.0f / sum;
#pragma omp simd
        for (int i = 0; i < V; i++)
            p[i] *= inv;
        /* -log softmax from the logits: finite even when the probability underflows */
        if (losses != NULL)
            losses[n] = logf(sum) - target_logit;
    }
}

KERNEL void softmax_crossentropy_backward(float *probs, const int32_t *targets, float dloss, int N,
                                   int V)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *p = probs + (int64_t)n * V;
        p[targets[n]] -= 1.0f;
#pragma omp simd
        for (int i = 0; i < V; i++)
            p[i] *= dloss;
    }
}

KERNEL int unscale_check(float *x, int64_t n, float mul)
{
    int found = 0;
#pragma omp parallel for simd schedule(static) reduction(| : found)
    for (int64_t i = 0; i < n; i++) {
        found |= !isfinite(x[i]);
        if (mul != 1.0f)
            x[i] *= mul;
    }
    return found;
}

KERNEL void adamw_update(float *w, const float *g, float *m, float *v, int64_t n, float lr,
                  float b1, float b2, float eps, float wd, int t)
{
    float c1 = 1.0f - powf(b1, (float)t), c2 = 1.0f - powf(b2, (float)t);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float mi = b1 * m[i] + (1.0f - b1) * g[i];
        float vi = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        m[i] = mi;
        v[i] = vi;
        w[i] -= lr * ((mi / c1) / (sqrtf(vi / c2) + eps) + wd * w[i]);
    }
}
