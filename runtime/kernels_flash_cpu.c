/* Flash attention on the CPU (kernels_flash_cpu.h). One task per (batch, head, query tile) in
 * the forward and per (batch, key/value head) in the backward, so every output element is
 * written by one thread in one fixed order: the bits do not depend on the thread count, and a
 * recomputed forward repeats them. */
#include "kernels_flash_cpu.h"

#include <math.h>
#include <stdint.h>

struct flash_shape {
    int T, NH, NKV, hs, W, C, group;
    float scale;
};

static struct flash_shape shape_of(int T, int NH, int NKV, int hs)
{
    return (struct flash_shape){T, NH, NKV, hs, (NH + 2 * NKV) * hs, NH * hs, NH / NKV,
                                1.0f / sqrtf((float)hs)};
}

static float dot(const float *x, const float *y, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++)
        s += x[i] * y[i];
    return s;
}

static void axpy(float *y, float a, const float *x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* Query row t of one head against keys c0 .. c0+cols-1 (those <= t): folds the tile into the
 * running maximum *mx, sum *sum and unnormalised output o (hs). */
static void forward_row_tile(float *o, float *mx, float *sum, const float *q, const float *k,
                             const float *v, int t, int c0, int cols,
                             const struct flash_shape *s)
{
    float p[FLASH_TILE], tile_max = -INFINITY;
    int last = t - c0 + 1 < cols ? t - c0 + 1 : cols; /* keys past t are masked */
    for (int j = 0; j < last; j++) {
        p[j] = s->scale * dot(q, k + (int64_t)(c0 + j) * s->W, s->hs);
        tile_max = p[j] > tile_max ? p[j] : tile_max;
    }
    if (last <= 0)
        return;
    float new_max = tile_max > *mx ? tile_max : *mx, corr = expf(*mx - new_max), psum = 0;
    for (int i = 0; i < s->hs; i++)
        o[i] *= corr;
    for (int j = 0; j < last; j++) {
        p[j] = expf(p[j] - new_max);
        psum += p[j];
        axpy(o, p[j], v + (int64_t)(c0 + j) * s->W, s->hs);
    }
    *sum = *sum * corr + psum;
    *mx = new_max;
}

void flash_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH,
                             int NKV, int hs)
{
    struct flash_shape s = shape_of(T, NH, NKV, hs);
    int tiles = (T + FLASH_TILE - 1) / FLASH_TILE;
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int r = 0; r < tiles; r++) {
                const float *base = qkv + (int64_t)b * T * s.W;
                const float *k = base + s.C + (h / s.group) * hs, *v = k + NKV * hs;
                int r0 = r * FLASH_TILE, rows = T - r0 < FLASH_TILE ? T - r0 : FLASH_TILE;
                for (int i = 0; i < rows; i++) {
                    int t = r0 + i;
                    float *o = out + ((int64_t)b * T + t) * s.C + h * hs;
                    float mx = -INFINITY, sum = 0;
                    for (int c = 0; c < hs; c++)
                        o[c] = 0;
                    for (int c0 = 0; c0 <= t; c0 += FLASH_TILE)
                        forward_row_tile(o, &mx, &sum, base + (int64_t)t * s.W + h * hs, k, v, t,
                                         c0, FLASH_TILE, &s);
                    for (int c = 0; c < hs; c++)
                        o[c] /= sum;
                    lse[((int64_t)b * NH + h) * T + t] = mx + logf(sum);
                }
            }
}

/* Query head h's rows t >= c0 against key tile c0 of its key/value head: recomputes each
 * probability from the log-sum-exp and adds the tile's share into dq, dk and dv. */
static void backward_tile(float *dbase, const float *base, const float *g, const float *lse,
                          const float *dsum, int h, int c0, const struct flash_shape *s)
{
    int hs = s->hs, kv = h / s->group, cols = s->T - c0 < FLASH_TILE ? s->T - c0 : FLASH_TILE;
    const float *k = base + s->C + kv * hs, *v = k + s->NKV * hs;
    float *dk = dbase + s->C + kv * hs, *dv = dk + s->NKV * hs;
    for (int t = c0; t < s->T; t++) {
        const float *q = base + (int64_t)t * s->W + h * hs, *go = g + (int64_t)t * s->C + h * hs;
        float *dq = dbase + (int64_t)t * s->W + h * hs;
        int last = t - c0 + 1 < cols ? t - c0 + 1 : cols;
        for (int j = 0; j < last; j++) {
            int64_t key = (int64_t)(c0 + j) * s->W;
            float p = expf(s->scale * dot(q, k + key, hs) - lse[t]);
            float ds = p * (dot(go, v + key, hs) - dsum[t]) * s->scale;
            axpy(dv + key, p, go, hs);
            axpy(dq, ds, k + key, hs);
            axpy(dk + key, ds, q, hs);
        }
    }
}

void flash_attention_backward(float *dqkv, float *dsum, const float *dout, const float *qkv,
                              const float *out, const float *lse, int B, int T, int NH, int NKV,
                              int hs)
{
    struct flash_shape s = shape_of(T, NH, NKV, hs);
    /* one task per key/value head: it owns the dk, dv of its head and the dq of its query
     * heads, and adds into them in key-tile, head, row order */
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int kv = 0; kv < NKV; kv++) {
            const float *base = qkv + (int64_t)b * T * s.W, *g = dout + (int64_t)b * T * s.C;
            float *dbase = dqkv + (int64_t)b * T * s.W;
            int h0 = kv * s.group;
            for (int t = 0; t < T; t++) {
                float *row = dbase + (int64_t)t * s.W;
                for (int c = 0; c < s.group * hs; c++)
                    row[h0 * hs + c] = 0;
                for (int c = 0; c < hs; c++)
                    row[s.C + kv * hs + c] = row[s.C + (NKV + kv) * hs + c] = 0;
                for (int h = h0; h < h0 + s.group; h++) {
                    int64_t at = (int64_t)t * s.C + h * hs;
                    dsum[((int64_t)b * NH + h) * T + t] =
                        dot(g + at, out + (int64_t)b * T * s.C + at, hs);
                }
            }
            for (int c0 = 0; c0 < T; c0 += FLASH_TILE)
                for (int h = h0; h < h0 + s.group; h++) {
                    int64_t row0 = ((int64_t)b * NH + h) * T;
                    backward_tile(dbase, base, g, lse + row0, dsum + row0, h, c0, &s);
                }
        }
}
