/* Flash attention on the CPU (kernels_flash_cpu.h). One task per (batch, head, query tile) in
 * the forward and per (batch, key/value head) in the backward, so every output element is
 * written by one thread in one fixed order: the bits do not depend on the thread count, and a
 * recomputed forward repeats them. The tile products are OpenBLAS calls (single-threaded, as
 * the CPU backend sets it) on the heads' strided columns; a tile's scores live in a
 * FLASH_TILE x FLASH_TILE buffer on the task's stack. */
#include "kernels_flash_cpu.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

struct flash_shape {
    int T, NH, NKV, hs, W, C, group;
    float scale;
};

static struct flash_shape shape_of(int T, int NH, int NKV, int hs)
{
    return (struct flash_shape){T, NH, NKV, hs, (NH + 2 * NKV) * hs, NH * hs, NH / NKV,
                                1.0f / sqrtf((float)hs)};
}

static int min_int(int a, int b)
{
    return a < b ? a : b;
}

/* s (rows, cols; row stride FLASH_TILE) = alpha a (rows, hs) b (cols, hs)^T */
static void tile_abt(float *s, float alpha, const float *a, int lda, const float *b, int ldb,
                     int rows, int cols, int hs)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, alpha, a, lda, b, ldb,
                0.0f, s, FLASH_TILE);
}

/* One query tile (rows r0..r0+rows-1) of one head: o (rows, hs; stride C) and lse (rows). */
static void forward_tile(float *o, float *lse, const float *q, const float *k, const float *v,
                         int r0, int rows, const struct flash_shape *s)
{
    float p[FLASH_TILE * FLASH_TILE], mx[FLASH_TILE], sum[FLASH_TILE];
    for (int i = 0; i < rows; i++) {
        mx[i] = -INFINITY;
        sum[i] = 0;
        memset(o + (int64_t)i * s->C, 0, sizeof(float) * (size_t)s->hs);
    }
    /* key tiles start at multiples of FLASH_TILE up to r0: every row sees a key of each */
    for (int c0 = 0; c0 < r0 + rows; c0 += FLASH_TILE) {
        int cols = min_int(FLASH_TILE, r0 + rows - c0);
        tile_abt(p, s->scale, q, s->W, k + (int64_t)c0 * s->W, s->W, rows, cols, s->hs);
        for (int i = 0; i < rows; i++) {
            float *row = p + i * FLASH_TILE, tile_max = -INFINITY, psum = 0;
            int last = min_int(cols, r0 + i - c0 + 1); /* keys past the row are masked */
            for (int j = 0; j < last; j++)
                tile_max = row[j] > tile_max ? row[j] : tile_max;
            float new_max = tile_max > mx[i] ? tile_max : mx[i], corr = expf(mx[i] - new_max);
            for (int j = 0; j < cols; j++) {
                row[j] = j < last ? expf(row[j] - new_max) : 0.0f;
                psum += row[j];
            }
            sum[i] = sum[i] * corr + psum;
            mx[i] = new_max;
            float *orow = o + (int64_t)i * s->C;
            for (int c = 0; c < s->hs; c++)
                orow[c] *= corr;
        }
        /* o (rows, hs) += p (rows, cols) v (cols, hs) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, s->hs, cols, 1.0f, p,
                    FLASH_TILE, v + (int64_t)c0 * s->W, s->W, 1.0f, o, s->C);
    }
    for (int i = 0; i < rows; i++) {
        float *orow = o + (int64_t)i * s->C, inv = 1.0f / sum[i];
        for (int c = 0; c < s->hs; c++)
            orow[c] *= inv;
        lse[i] = mx[i] + logf(sum[i]);
    }
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
                int r0 = r * FLASH_TILE, rows = min_int(FLASH_TILE, T - r0);
                forward_tile(out + ((int64_t)b * T + r0) * s.C + h * hs,
                             lse + ((int64_t)b * NH + h) * T + r0,
                             base + (int64_t)r0 * s.W + h * hs, k, v, r0, rows, &s);
            }
}

/* The pointers of one (batch, head) for the backward: q, k, v and their gradients in rows of
 * W, dout in rows of C, the rows' lse and D. */
struct flash_head {
    const float *q, *k, *v, *g, *lse, *dsum;
    float *dq, *dk, *dv;
};

/* Query tile r0 against key tile c0 of one head: recomputes the probabilities from the
 * log-sum-exp and adds the tile's share into dv, dq and dk. */
static void backward_tile(const struct flash_head *x, int r0, int c0,
                          const struct flash_shape *s)
{
    float p[FLASH_TILE * FLASH_TILE], ds[FLASH_TILE * FLASH_TILE];
    int rows = min_int(FLASH_TILE, s->T - r0), cols = min_int(FLASH_TILE, s->T - c0), W = s->W;
    const float *q = x->q + (int64_t)r0 * W, *k = x->k + (int64_t)c0 * W,
                *v = x->v + (int64_t)c0 * W, *g = x->g + (int64_t)r0 * s->C;
    tile_abt(p, s->scale, q, W, k, W, rows, cols, s->hs);
    for (int i = 0; i < rows; i++) {
        int last = min_int(cols, r0 + i - c0 + 1);
        float *row = p + i * FLASH_TILE, l = x->lse[r0 + i];
        for (int j = 0; j < cols; j++)
            row[j] = j < last ? expf(row[j] - l) : 0.0f;
    }
    /* dv (cols, hs) += p^T dout; d p (rows, cols) = dout v^T */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, s->hs, rows, 1.0f, p,
                FLASH_TILE, g, s->C, 1.0f, x->dv + (int64_t)c0 * W, W);
    tile_abt(ds, 1.0f, g, s->C, v, W, rows, cols, s->hs);
    for (int i = 0; i < rows; i++) {
        float *row = ds + i * FLASH_TILE, d = x->dsum[r0 + i];
        const float *prow = p + i * FLASH_TILE;
        for (int j = 0; j < cols; j++)
            row[j] = prow[j] * (row[j] - d) * s->scale;
    }
    /* dq (rows, hs) += d s k; dk (cols, hs) += d s^T q */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, s->hs, cols, 1.0f, ds,
                FLASH_TILE, k, W, 1.0f, x->dq + (int64_t)r0 * W, W);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, s->hs, rows, 1.0f, ds,
                FLASH_TILE, q, W, 1.0f, x->dk + (int64_t)c0 * W, W);
}

/* Zeroes the gradients one task owns (dq of its query heads, its dk and dv) and computes D =
 * rowsum(dout * out) of its query heads. */
static void backward_start(float *dbase, float *dsum, const float *g, const float *out, int kv,
                           const struct flash_shape *s)
{
    int h0 = kv * s->group, hs = s->hs;
    for (int t = 0; t < s->T; t++) {
        float *row = dbase + (int64_t)t * s->W;
        memset(row + h0 * hs, 0, sizeof(float) * (size_t)(s->group * hs));
        memset(row + s->C + kv * hs, 0, sizeof(float) * (size_t)hs);
        memset(row + s->C + (s->NKV + kv) * hs, 0, sizeof(float) * (size_t)hs);
        for (int h = h0; h < h0 + s->group; h++) {
            const float *x = g + (int64_t)t * s->C + h * hs, *y = out + (int64_t)t * s->C + h * hs;
            float d = 0;
            for (int c = 0; c < hs; c++)
                d += x[c] * y[c];
            dsum[(int64_t)h * s->T + t] = d;
        }
    }
}

void flash_attention_backward(float *dqkv, float *dsum, const float *dout, const float *qkv,
                              const float *out, const float *lse, int B, int T, int NH, int NKV,
                              int hs)
{
    struct flash_shape s = shape_of(T, NH, NKV, hs);
    /* one task per key/value head: it owns the dk, dv of its head and the dq of its query
     * heads, and adds into them in key-tile, head, query-tile order */
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int kv = 0; kv < NKV; kv++) {
            const float *base = qkv + (int64_t)b * T * s.W, *g = dout + (int64_t)b * T * s.C;
            float *dbase = dqkv + (int64_t)b * T * s.W, *db = dsum + (int64_t)b * NH * T;
            backward_start(dbase, db, g, out + (int64_t)b * T * s.C, kv, &s);
            for (int c0 = 0; c0 < T; c0 += FLASH_TILE)
                for (int h = kv * s.group; h < (kv + 1) * s.group; h++) {
                    struct flash_head x = {
                        base + h * hs, base + s.C + kv * hs, base + s.C + (NKV + kv) * hs,
                        g + h * hs, lse + ((int64_t)b * NH + h) * T, db + (int64_t)h * T,
                        dbase + h * hs, dbase + s.C + kv * hs, dbase + s.C + (NKV + kv) * hs};
                    for (int r0 = c0; r0 < T; r0 += FLASH_TILE)
                        backward_tile(&x, r0, c0, &s);
                }
        }
}
