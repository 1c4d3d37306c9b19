#include "kernels_cpu.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* Column reductions (bias and layer-norm parameter gradients, embedding scatter-adds) run
 * over blocks of this many columns, one block per task, rows in order inside. */
#define COL_BLOCK 32

void encoder_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                     int B, int T, int C)
{
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        float *o = out + bt * C;
        const float *te = wte + (int64_t)tokens[bt] * C, *pe = wpe + (bt % T) * C;
        for (int i = 0; i < C; i++)
            o[i] = te[i] + pe[i];
    }
}

void encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                      int B, int T, int C)
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
            for (int i = c0; i < c1; i++)
                d[i] += g[i];
        }
    }
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *d = dwpe + (int64_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *g = dout + ((int64_t)b * T + t) * C;
            for (int i = 0; i < C; i++)
                d[i] += g[i];
        }
    }
}

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
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
        for (int i = 0; i < C; i++)
            o[i] = (x[i] - m) * s * w[i] + b[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

void layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
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
            for (int i = c0; i < c1; i++) {
                dw[i] += (x[i] - m) * s * g[i];
                db[i] += g[i];
            }
        }
    }
}

void matmul_forward(float *out, const float *add, const float *inp, const float *w,
                    const float *bias, int N, int C, int OC)
{
    float beta = 0;
    if (add != NULL || bias != NULL) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            float *o = out + (int64_t)n * OC;
            const float *a = add ? add + (int64_t)n * OC : NULL;
            for (int i = 0; i < OC; i++)
                o[i] = (a ? a[i] : 0.0f) + (bias ? bias[i] : 0.0f);
        }
        beta = 1;
    }
    /* out (N,OC) = inp (N,C) @ w^T (C,OC) + beta * out */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, beta,
                out, OC);
}

void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                     const float *w, int N, int C, int OC)
{
    /* dinp (N,C) = dout (N,OC) @ w (OC,C) */
    if (dinp != NULL)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C,
                    0.0f, dinp, C);
    /* dw (OC,C) += dout^T (OC,N) @ inp (N,C) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                dw, C);
    if (dbias == NULL)
        return;
    int blocks = (OC + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < blocks; blk++) {
        int c0 = blk * COL_BLOCK, c1 = c0 + COL_BLOCK < OC ? c0 + COL_BLOCK : OC;
        for (int n = 0; n < N; n++) {
            const float *g = dout + (int64_t)n * OC;
            for (int i = c0; i < c1; i++)
                dbias[i] += g[i];
        }
    }
}

void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    int hs = C / NH;
    int64_t C3 = 3 * (int64_t)C;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *base = qkv + (int64_t)b * T * C3;
                const float *q = base + t * C3 + h * hs;
                float *a = att + (((int64_t)b * NH + h) * T + t) * T;
                float maxv = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = base + t2 * C3 + C + h * hs;
                    float dot = 0;
                    for (int i = 0; i < hs; i++)
                        dot += q[i] * k[i];
                    dot *= scale;
                    a[t2] = dot;
                    if (dot > maxv)
                        maxv = dot;
                }
                float sum = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    float ev = expf(a[t2] - maxv);
                    a[t2] = ev;
                    sum += ev;
                }
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 <= t; t2++)
                    a[t2] *= inv;
                float *o = out + ((int64_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++)
                    o[i] = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = base + t2 * C3 + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++)
                        o[i] += a[t2] * v[i];
                }
            }
}

void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                        const float *att, int B, int T, int C, int NH)
{
    int hs = C / NH;
    int64_t C3 = 3 * (int64_t)C;
    float scale = 1.0f / sqrtf((float)hs);
    /* One task per (batch, head): it owns that head's columns of dqkv, so the sums over
     * positions into dk and dv are taken in one fixed order. */
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *base = qkv + (int64_t)b * T * C3;
            float *dbase = dqkv + (int64_t)b * T * C3;
            for (int t = 0; t < T; t++)
                for (int j = 0; j < 3; j++)
                    memset(dbase + t * C3 + j * C + h * hs, 0, sizeof(float) * (size_t)hs);
            for (int t = 0; t < T; t++) {
                const float *a = att + (((int64_t)b * NH + h) * T + t) * T;
                float *da = datt + (((int64_t)b * NH + h) * T + t) * T;
                const float *g = dout + ((int64_t)b * T + t) * C + h * hs;
                const float *q = base + t * C3 + h * hs;
                float *dq = dbase + t * C3 + h * hs;
                /* d att and d v */
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = base + t2 * C3 + 2 * C + h * hs;
                    float *dv = dbase + t2 * C3 + 2 * C + h * hs;
                    float dot = 0;
                    for (int i = 0; i < hs; i++) {
                        dot += g[i] * v[i];
                        dv[i] += a[t2] * g[i];
                    }
                    da[t2] = dot;
                }
                /* softmax: d pre[t2] = att[t2] * (d att[t2] - sum_t3 att[t3] d att[t3]) */
                float s = 0;
                for (int t2 = 0; t2 <= t; t2++)
                    s += a[t2] * da[t2];
                for (int t2 = 0; t2 <= t; t2++)
                    da[t2] = a[t2] * (da[t2] - s) * scale;
                /* d q and d k */
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = base + t2 * C3 + C + h * hs;
                    float *dk = dbase + t2 * C3 + C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += da[t2] * k[i];
                        dk[i] += da[t2] * q[i];
                    }
                }
            }
        }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

void gelu_forward(float *out, const float *inp, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

void gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = tanhf(GELU_SCALE * (x + 0.044715f * x * x * x));
        float sech2 = 1.0f - th * th;
        float local = 0.5f * (1.0f + th) +
                      0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = local * dout[i];
    }
}

void softmax_crossentropy_forward(float *probs, float *losses, const int32_t *targets, int N,
                                  int V)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *p = probs + (int64_t)n * V;
        float maxv = -INFINITY;
        for (int i = 0; i < V; i++)
            if (p[i] > maxv)
                maxv = p[i];
        float target_logit = p[targets[n]] - maxv;
        float sum = 0;
        for (int i = 0; i < V; i++) {
            p[i] = expf(p[i] - maxv);
            sum += p[i];
        }
        float inv = 1.0f / sum;
        for (int i = 0; i < V; i++)
            p[i] *= inv;
        /* -log softmax from the logits: finite even when the probability underflows */
        if (losses != NULL)
            losses[n] = logf(sum) - target_logit;
    }
}

void softmax_crossentropy_backward(float *probs, const int32_t *targets, float dloss, int N,
                                   int V)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *p = probs + (int64_t)n * V;
        p[targets[n]] -= 1.0f;
        for (int i = 0; i < V; i++)
            p[i] *= dloss;
    }
}

void adamw_update(float *w, const float *g, float *m, float *v, int64_t n,
                  const struct adamw_params *p, int t, int decay)
{
    float c1 = 1.0f - powf(p->beta1, (float)t), c2 = 1.0f - powf(p->beta2, (float)t);
    float wd = decay ? p->weight_decay : 0.0f;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float mi = p->beta1 * m[i] + (1.0f - p->beta1) * g[i];
        float vi = p->beta2 * v[i] + (1.0f - p->beta2) * g[i] * g[i];
        m[i] = mi;
        v[i] = vi;
        w[i] -= p->lr * ((mi / c1) / (sqrtf(vi / c2) + p->eps) + wd * w[i]);
    }
}
