#include "kernels_llama_cpu.h"

#include <cblas.h>
#include <math.h>

/* Column reductions over blocks of COL_BLOCK columns, rows in order inside, as kernels_cpu.c's:
 * the sums do not depend on the thread count. */
#define COL_BLOCK 64

void embedding_forward(float *out, const int32_t *tokens, const float *wte, int B, int T, int C)
{
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        float *o = out + bt * C;
        const float *te = wte + (int64_t)tokens[bt] * C;
        for (int i = 0; i < C; i++)
            o[i] = te[i];
    }
}

void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                     float eps)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (int64_t)n * C;
        float *o = out + (int64_t)n * C;
        float ss = 0;
        for (int i = 0; i < C; i++)
            ss += x[i] * x[i];
        float s = 1.0f / sqrtf(ss / C + eps);
        for (int i = 0; i < C; i++)
            o[i] = x[i] * s * w[i];
        rstd[n] = s;
    }
}

void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                      const float *w, const float *rstd, int N, int C)
{
    /* y = x s w with s = (mean(x^2) + eps)^-1/2: dx = s w g - x s^3 mean(w g x) */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (int64_t)n * C, *g = dout + (int64_t)n * C;
        float *d = dinp + (int64_t)n * C;
        float s = rstd[n], dot = 0;
        for (int i = 0; i < C; i++)
            dot += w[i] * g[i] * x[i];
        float k = s * s * s * (dot / C);
        for (int i = 0; i < C; i++)
            d[i] += s * w[i] * g[i] - x[i] * k;
    }
    int blocks = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < blocks; blk++) {
        int c0 = blk * COL_BLOCK, c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
        for (int n = 0; n < N; n++) {
            const float *x = inp + (int64_t)n * C, *g = dout + (int64_t)n * C;
            float s = rstd[n];
            for (int i = c0; i < c1; i++)
                dw[i] += x[i] * s * g[i];
        }
    }
}

/* dir +1 turns forward, -1 back (the transpose of the rotation); each angle in double,
 * rounded once */
static void rope_turn(float *x, int B, int T, int H, int stride, int hs, float theta, float dir)
{
    int half = hs / 2;
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        int t = (int)(bt % T);
        for (int i = 0; i < half; i++) {
            double angle = t * pow((double)theta, -2.0 * i / hs);
            float c = (float)cos(angle), s = dir * (float)sin(angle);
            for (int h = 0; h < H; h++) {
                float *a = x + bt * stride + (int64_t)h * hs + i, *b = a + half;
                float x1 = *a, x2 = *b;
                *a = x1 * c - x2 * s;
                *b = x2 * c + x1 * s;
            }
        }
    }
}

void rope_forward(float *x, int B, int T, int H, int stride, int hs, float theta)
{
    rope_turn(x, B, T, H, stride, hs, theta, 1.0f);
}

void rope_backward(float *dx, int B, int T, int H, int stride, int hs, float theta)
{
    rope_turn(dx, B, T, H, stride, hs, theta, -1.0f);
}

void swiglu_forward(float *out, const float *inp, int N, int F)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (int64_t)n * 2 * F, *u = g + F;
        float *o = out + (int64_t)n * F;
        for (int i = 0; i < F; i++)
            o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

void swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (int64_t)n * 2 * F, *u = g + F, *d = dout + (int64_t)n * F;
        float *dg = dinp + (int64_t)n * 2 * F, *du = dg + F;
        for (int i = 0; i < F; i++) {
            float sig = 1.0f / (1.0f + expf(-g[i])), silu = g[i] * sig;
            dg[i] = d[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
            du[i] = d[i] * silu;
        }
    }
}

/* One query head's causal softmax rows of `a` (T,T), from its scores in place. */
static void causal_softmax(float *a, int T)
{
    for (int t = 0; t < T; t++) {
        float *row = a + (int64_t)t * T, maxv = row[0], sum = 0;
        for (int j = 1; j <= t; j++)
            maxv = row[j] > maxv ? row[j] : maxv;
        for (int j = 0; j <= t; j++) {
            row[j] = expf(row[j] - maxv);
            sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int j = 0; j <= t; j++)
            row[j] *= inv;
        for (int j = t + 1; j < T; j++)
            row[j] = 0; /* products over whole rows are then causal */
    }
}

void gqa_attention_forward(float *out, float *att, const float *qkv, int B, int T, int NH,
                           int NKV, int hs, kernel_round_fn round)
{
    int W = (NH + 2 * NKV) * hs, C = NH * hs, group = NH / NKV;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *base = qkv + (int64_t)b * T * W, *q = base + h * hs;
            const float *k = base + C + (h / group) * hs, *v = k + NKV * hs;
            float *a = att + ((int64_t)b * NH + h) * T * T;
            /* scores (T,T) = scale q k^T; the masked part is overwritten by the softmax */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, W, k, W,
                        0.0f, a, T);
            causal_softmax(a, T);
            if (round != NULL)
                round(a, (int64_t)T * T);
            if (out != NULL)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v,
                            W, 0.0f, out + (int64_t)b * T * C + h * hs, C);
        }
}

void gqa_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                            const float *att, int B, int T, int NH, int NKV, int hs,
                            kernel_round_fn round)
{
    int W = (NH + 2 * NKV) * hs, C = NH * hs, group = NH / NKV;
    float scale = 1.0f / sqrtf((float)hs);
    /* one task per key/value head: its query heads add into dk and dv in head order */
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int kv = 0; kv < NKV; kv++) {
            const float *base = qkv + (int64_t)b * T * W;
            const float *k = base + C + kv * hs, *v = k + NKV * hs;
            float *dbase = dqkv + (int64_t)b * T * W;
            float *dk = dbase + C + kv * hs, *dv = dk + NKV * hs;
            for (int h = kv * group; h < (kv + 1) * group; h++) {
                const float *q = base + h * hs, *a = att + ((int64_t)b * NH + h) * T * T;
                const float *g = dout + (int64_t)b * T * C + h * hs;
                float *dq = dbase + h * hs, *da = datt + ((int64_t)b * NH + h) * T * T;
                float beta = h == kv * group ? 0.0f : 1.0f;
                /* dv (T,hs) += att^T dout */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, g, C,
                            beta, dv, W);
                /* d att (T,T) = dout v^T, then through the softmax and the score scale */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, g, C, v, W,
                            0.0f, da, T);
                for (int t = 0; t < T; t++) {
                    const float *arow = a + (int64_t)t * T;
                    float *row = da + (int64_t)t * T, s = 0;
                    for (int j = 0; j <= t; j++)
                        s += arow[j] * row[j];
                    for (int j = 0; j <= t; j++)
                        row[j] = arow[j] * (row[j] - s) * scale;
                    for (int j = t + 1; j < T; j++)
                        row[j] = 0;
                }
                if (round != NULL)
                    round(da, (int64_t)T * T);
                /* dq (T,hs) = d pre k; dk (T,hs) += d pre^T q */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, da, T, k,
                            W, 0.0f, dq, W);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, da, T, q, W,
                            beta, dk, W);
            }
        }
}
