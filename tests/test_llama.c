/* The Llama family: each CPU kernel (RMSNorm, SwiGLU, rotary positions, grouped-query
 * attention, token embedding) against plain float64 references, forward, and backward
 * against float64 central differences of the reference's forward; the size tables against
 * the published parameter counts and formulas by hand, and the layout the runtime carves;
 * bad model files refused naming file and field; and `ballast train` on three ranks with
 * every recompute option bitwise equal to keeping everything. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "estimate.h"
#include "kernels_cpu.h"
#include "kernels_llama_cpu.h"
#include "layout.h"
#include "llama_layers.h"
#include "model_ops.h"
#include "splittest.h"
#include "testutil.h"
#include "traintest.h"

static struct test_rng rng = {12345};

static void fill(float *x, double *xd, int64_t n, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++) {
        x[i] = (float)test_rng_double(&rng, lo, hi);
        if (xd != NULL)
            xd[i] = x[i];
    }
}

/* d loss / d x by central differences of a float64 loss */
typedef double (*loss_fn)(const double *x, const void *ctx);

static void fd_grad(loss_fn f, const void *ctx, double *x, int64_t n, double *g)
{
    for (int64_t i = 0; i < n; i++) {
        double keep = x[i], h = 1e-6 * (fabs(keep) > 1 ? fabs(keep) : 1);
        x[i] = keep + h;
        double lp = f(x, ctx);
        x[i] = keep - h;
        double lm = f(x, ctx);
        x[i] = keep;
        g[i] = (lp - lm) / (2 * h);
    }
}

static int all_close(const float *got, const double *ref, int64_t n, double atol, double rtol,
                     const char *what)
{
    for (int64_t i = 0; i < n; i++)
        if (!test_close(got[i], ref[i], atol, rtol)) {
            fprintf(stderr, "\n%s[%lld]: %.9g against %.9g\n", what, (long long)i, got[i],
                    ref[i]);
            return 0;
        }
    return 1;
}

/* ---- RMSNorm ---- */

struct rms_ctx {
    int N, C;
    double eps;
    const double *x, *w, *G; /* the other input stays fixed while one varies */
    int wrt_w;
};

static void rms_ref(const double *x, const double *w, double *y, int N, int C, double eps)
{
    for (int n = 0; n < N; n++) {
        double ss = 0;
        for (int i = 0; i < C; i++)
            ss += x[n * C + i] * x[n * C + i];
        double r = 1 / sqrt(ss / C + eps);
        for (int i = 0; i < C; i++)
            y[n * C + i] = x[n * C + i] * r * w[i];
    }
}

static double rms_loss(const double *v, const void *p)
{
    const struct rms_ctx *c = p;
    double *y = malloc(sizeof *y * (size_t)(c->N * c->C)), l = 0;
    rms_ref(c->wrt_w ? c->x : v, c->wrt_w ? v : c->w, y, c->N, c->C, c->eps);
    for (int i = 0; i < c->N * c->C; i++)
        l += y[i] * c->G[i];
    free(y);
    return l;
}

static void test_rmsnorm(void)
{
    enum { N = 5, C = 24 };
    float x[N * C], w[C], G[N * C], out[N * C], rstd[N], dx[N * C], dw[C];
    double xd[N * C], wd[C], Gd[N * C], ref[N * C], gx[N * C], gw[C];
    fill(x, xd, N * C, -2, 2);
    fill(w, wd, C, 0.5, 1.5);
    fill(G, Gd, N * C, -1, 1);
    rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f);
    rms_ref(xd, wd, ref, N, C, 1e-5);
    CU_ASSERT(all_close(out, ref, N * C, 1e-6, 1e-5, "rmsnorm out"));
    /* backward adds: start from known values and subtract them */
    fill(dx, NULL, N * C, -1, 1);
    fill(dw, NULL, C, -1, 1);
    float dx0[N * C], dw0[C];
    memcpy(dx0, dx, sizeof dx);
    memcpy(dw0, dw, sizeof dw);
    rmsnorm_backward(dx, dw, G, x, w, rstd, N, C);
    struct rms_ctx c = {N, C, 1e-5, xd, wd, Gd, 0};
    fd_grad(rms_loss, &c, xd, N * C, gx);
    c.wrt_w = 1;
    fd_grad(rms_loss, &c, wd, C, gw);
    for (int i = 0; i < N * C; i++)
        dx[i] -= dx0[i];
    for (int i = 0; i < C; i++)
        dw[i] -= dw0[i];
    CU_ASSERT(all_close(dx, gx, N * C, 1e-4, 1e-3, "rmsnorm dinp"));
    CU_ASSERT(all_close(dw, gw, C, 1e-4, 1e-3, "rmsnorm dw"));
}

/* ---- SwiGLU ---- */

struct sw_ctx {
    int N, F;
    const double *G;
};

static void swiglu_ref(const double *x, double *y, int N, int F)
{
    for (int n = 0; n < N; n++)
        for (int i = 0; i < F; i++) {
            double g = x[n * 2 * F + i], u = x[n * 2 * F + F + i];
            y[n * F + i] = g / (1 + exp(-g)) * u;
        }
}

static double swiglu_loss(const double *x, const void *p)
{
    const struct sw_ctx *c = p;
    double y[64 * 64], l = 0;
    swiglu_ref(x, y, c->N, c->F);
    for (int i = 0; i < c->N * c->F; i++)
        l += y[i] * c->G[i];
    return l;
}

static void test_swiglu(void)
{
    enum { N = 4, F = 10 };
    float x[N * 2 * F], G[N * F], out[N * F], dx[N * 2 * F];
    double xd[N * 2 * F], Gd[N * F], ref[N * F], gx[N * 2 * F];
    fill(x, xd, N * 2 * F, -4, 4);
    fill(G, Gd, N * F, -1, 1);
    swiglu_forward(out, x, N, F);
    swiglu_ref(xd, ref, N, F);
    CU_ASSERT(all_close(out, ref, N * F, 1e-6, 1e-5, "swiglu out"));
    swiglu_backward(dx, x, G, N, F);
    struct sw_ctx c = {N, F, Gd};
    fd_grad(swiglu_loss, &c, xd, N * 2 * F, gx);
    CU_ASSERT(all_close(dx, gx, N * 2 * F, 1e-4, 1e-3, "swiglu dinp"));
}

/* ---- rotary positions ---- */

struct rope_ctx {
    int B, T, H, stride, hs;
    double theta;
    const double *G;
};

static void rope_ref(const double *x, double *y, const struct rope_ctx *c)
{
    int half = c->hs / 2;
    memcpy(y, x, sizeof *y * (size_t)(c->B * c->T * c->stride));
    for (int bt = 0; bt < c->B * c->T; bt++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < half; i++) {
                double a = (bt % c->T) * pow(c->theta, -2.0 * i / c->hs);
                const double *p = x + bt * c->stride + h * c->hs;
                double *q = y + bt * c->stride + h * c->hs;
                q[i] = p[i] * cos(a) - p[i + half] * sin(a);
                q[i + half] = p[i + half] * cos(a) + p[i] * sin(a);
            }
}

static double rope_loss(const double *x, const void *p)
{
    const struct rope_ctx *c = p;
    double y[2 * 6 * 40], l = 0;
    rope_ref(x, y, c);
    for (int i = 0; i < c->B * c->T * c->stride; i++)
        l += y[i] * c->G[i];
    return l;
}

static void test_rope(void)
{
    enum { B = 2, T = 6, H = 3, HS = 8, STRIDE = 40, N = B * T * STRIDE };
    float x[N], G[N];
    double xd[N], Gd[N], ref[N], gx[N];
    fill(x, xd, N, -2, 2);
    fill(G, Gd, N, -1, 1);
    struct rope_ctx c = {B, T, H, STRIDE, HS, 10000.0, Gd};
    rope_forward(x, B, T, H, STRIDE, HS, 10000.0f);
    rope_ref(xd, ref, &c);
    /* heads past H (the values) are left as they were, bit for bit */
    CU_ASSERT(all_close(x, ref, N, 1e-6, 1e-5, "rope out"));
    int untouched = 1;
    for (int bt = 0; bt < B * T; bt++)
        for (int i = H * HS; i < STRIDE; i++)
            untouched &= x[bt * STRIDE + i] == (float)xd[bt * STRIDE + i];
    CU_ASSERT(untouched);
    rope_backward(G, B, T, H, STRIDE, HS, 10000.0f);
    fd_grad(rope_loss, &c, xd, N, gx);
    CU_ASSERT(all_close(G, gx, N, 1e-5, 1e-4, "rope dx"));
}

/* ---- grouped-query attention ---- */

struct att_ctx {
    int B, T, NH, NKV, hs;
    const double *G;
};

static void att_ref(const double *qkv, double *out, double *att, const struct att_ctx *c)
{
    int W = (c->NH + 2 * c->NKV) * c->hs, C = c->NH * c->hs, group = c->NH / c->NKV;
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->NH; h++)
            for (int t = 0; t < c->T; t++) {
                const double *q = qkv + (b * c->T + t) * W + h * c->hs;
                double *a = att + ((b * c->NH + h) * c->T + t) * c->T, maxv = -1e300, sum = 0;
                for (int j = 0; j < c->T; j++) {
                    const double *k = qkv + (b * c->T + j) * W + C + (h / group) * c->hs;
                    double s = 0;
                    for (int i = 0; i < c->hs; i++)
                        s += q[i] * k[i];
                    a[j] = j <= t ? s / sqrt(c->hs) : 0;
                    if (j <= t && a[j] > maxv)
                        maxv = a[j];
                }
                for (int j = 0; j <= t; j++)
                    sum += a[j] = exp(a[j] - maxv);
                for (int j = 0; j <= t; j++)
                    a[j] /= sum;
                double *o = out + (b * c->T + t) * C + h * c->hs;
                for (int i = 0; i < c->hs; i++) {
                    o[i] = 0;
                    for (int j = 0; j <= t; j++)
                        o[i] += a[j] * qkv[(b * c->T + j) * W + C + c->NKV * c->hs +
                                           (h / group) * c->hs + i];
                }
            }
}

#define ATT_MAX 4096

static double att_loss(const double *qkv, const void *p)
{
    const struct att_ctx *c = p;
    static double out[ATT_MAX], att[ATT_MAX];
    att_ref(qkv, out, att, c);
    double l = 0;
    for (int i = 0; i < c->B * c->T * c->NH * c->hs; i++)
        l += out[i] * c->G[i];
    return l;
}

static void check_attention(int NKV)
{
    enum { B = 2, T = 7, NH = 4, HS = 4, C = NH * HS };
    int W = (NH + 2 * NKV) * HS, n = B * T * W;
    float qkv[ATT_MAX], out[B * T * C], att[B * NH * T * T], att2[B * NH * T * T],
        G[B * T * C], dqkv[ATT_MAX], datt[B * NH * T * T];
    double qd[ATT_MAX], Gd[B * T * C], oref[B * T * C], aref[B * NH * T * T], gq[ATT_MAX];
    fill(qkv, qd, n, -1.5, 1.5);
    fill(G, Gd, B * T * C, -1, 1);
    struct att_ctx c = {B, T, NH, NKV, HS, Gd};
    gqa_attention_forward(out, att, qkv, B, T, NH, NKV, HS, NULL);
    att_ref(qd, oref, aref, &c);
    CU_ASSERT(all_close(att, aref, B * NH * T * T, 1e-6, 1e-5, "gqa att"));
    CU_ASSERT(all_close(out, oref, B * T * C, 1e-6, 1e-5, "gqa out"));
    /* the probabilities alone (recomputation) are the same bits */
    gqa_attention_forward(NULL, att2, qkv, B, T, NH, NKV, HS, NULL);
    CU_ASSERT(memcmp(att, att2, sizeof att) == 0);
    fill(dqkv, NULL, n, -9, 9); /* overwritten, not added to */
    gqa_attention_backward(dqkv, datt, G, qkv, att, B, T, NH, NKV, HS, NULL);
    fd_grad(att_loss, &c, qd, n, gq);
    char what[64];
    snprintf(what, sizeof what, "gqa dqkv (%d kv heads)", NKV);
    CU_ASSERT(all_close(dqkv, gq, n, 1e-4, 1e-3, what));
}

static void test_attention(void)
{
    check_attention(4); /* multi-head: GPT's attention */
    check_attention(2); /* grouped */
    check_attention(1); /* multi-query */
}

static void test_embedding(void)
{
    enum { B = 2, T = 3, C = 5, V = 4 };
    int32_t tok[B * T] = {1, 3, 1, 0, 1, 2};
    float wte[V * C], out[B * T * C], dout[B * T * C], dwte[V * C];
    fill(wte, NULL, V * C, -1, 1);
    fill(dout, NULL, B * T * C, -1, 1);
    embedding_forward(out, tok, wte, B, T, C);
    for (int i = 0; i < B * T * C; i++)
        CU_ASSERT_EQUAL(out[i], wte[tok[i / C] * C + i % C]);
    for (int i = 0; i < V * C; i++)
        dwte[i] = 1;
    embedding_backward(dwte, dout, tok, B, T, C);
    for (int v = 0; v < V; v++)
        for (int i = 0; i < C; i++) {
            double want = 1;
            for (int bt = 0; bt < B * T; bt++)
                want += tok[bt] == v ? dout[bt * C + i] : 0;
            CU_ASSERT(test_close(dwte[v * C + i], want, 1e-6, 1e-6));
        }
}

/* ---- the composed layers (llama_layers.c over the CPU backend) against float64 ---- */

enum { LB = 2, LT = 5, LC = 16, LNH = 4, LNKV = 2, LHS = 4, LF = 12, LV = 11,
       LW = (LNH + 2 * LNKV) * LHS, LN = LB * LT };

static const struct model small_llama = {
    .kind = MODEL_KIND_LLAMA, .n_layer = 1, .n_embd = LC, .n_head = LNH, .n_kv_head = LNKV,
    .ffn_hidden = LF, .seq_len = LT, .vocab_size = LV, .micro_batch = LB,
    .dtype = MODEL_DTYPE_FP32, .rope_theta = 10000, .norm_eps = 1e-5};

/* one layer's tensors, each its own allocation, parameters random (gains near 1) */
struct layer_mem {
    struct layer_view v;
    struct sizes_tensor t[3][SIZES_TENSORS_MAX];
    int n[3];
    double *pd[SIZES_TENSORS_MAX]; /* float64 copies of the parameters */
};

static void mem_make(struct layer_mem *lm, enum model_layer_kind kind, int layer)
{
    memset(lm, 0, sizeof *lm);
    lm->v.model = &small_llama;
    lm->v.kind = kind;
    lm->v.layer = layer;
    for (int c = 0; c < 3; c++) {
        lm->n[c] = sizes_layer_tensors(&small_llama, kind, (enum sizes_class)c, lm->t[c]);
        for (int k = 0; k < lm->n[c]; k++) {
            size_t bytes = (size_t)sizes_tensor_bytes(&lm->t[c][k]);
            void **at = c == SIZES_PARAMS ? &lm->v.params[k]
                        : c == SIZES_KEPT ? &lm->v.kept[k] : &lm->v.ws[k];
            *at = calloc(1, bytes);
            if (c != SIZES_PARAMS)
                continue;
            lm->v.grads[k] = calloc(1, bytes);
            int64_t n = lm->t[c][k].elems;
            lm->pd[k] = malloc(sizeof(double) * (size_t)n);
            int gain = strstr(lm->t[c][k].name, "ln") == lm->t[c][k].name;
            fill(lm->v.params[k], lm->pd[k], n, gain ? 0.6 : -0.4, gain ? 1.4 : 0.4);
        }
    }
}

static void mem_free(struct layer_mem *lm)
{
    for (int k = 0; k < lm->n[SIZES_PARAMS]; k++) {
        free(lm->v.params[k]);
        free(lm->v.grads[k]);
        free(lm->pd[k]);
    }
    for (int k = 0; k < lm->n[SIZES_KEPT]; k++)
        free(lm->v.kept[k]);
    for (int k = 0; k < lm->n[SIZES_WORKSPACE]; k++)
        free(lm->v.ws[k]);
}

/* out (N,OC) = x (N,IC) W^T, W (OC,IC) */
static void ref_linear(double *out, const double *x, const double *W, int n, int IC, int OC)
{
    for (int r = 0; r < n; r++)
        for (int o = 0; o < OC; o++) {
            double acc = 0;
            for (int i = 0; i < IC; i++)
                acc += x[r * IC + i] * W[o * IC + i];
            out[r * OC + o] = acc;
        }
}

struct block_ctx {
    double *x, *G;
    double *const *p; /* ln1_w, qkv_w, proj_w, ln2_w, fc_w, fcproj_w */
};

static double block_loss(const double *unused, const void *ctx)
{
    const struct block_ctx *c = ctx;
    static double ln[LN * LC], qkv[LN * LW], rot[LN * LW], atty[LN * LC], att[LB * LNH * LT * LT],
        res2[LN * LC], fch[LN * 2 * LF], sw[LN * LF], out[LN * LC];
    struct rope_ctx rc = {LB, LT, LNH + LNKV, LW, LHS, 10000.0, NULL};
    struct att_ctx ac = {LB, LT, LNH, LNKV, LHS, NULL};
    rms_ref(c->x, c->p[0], ln, LN, LC, 1e-5);
    ref_linear(qkv, ln, c->p[1], LN, LC, LW);
    rope_ref(qkv, rot, &rc);
    att_ref(rot, atty, att, &ac);
    ref_linear(res2, atty, c->p[2], LN, LC, LC);
    for (int i = 0; i < LN * LC; i++)
        res2[i] += c->x[i];
    rms_ref(res2, c->p[3], ln, LN, LC, 1e-5);
    ref_linear(fch, ln, c->p[4], LN, LC, 2 * LF);
    swiglu_ref(fch, sw, LN, LF);
    ref_linear(out, sw, c->p[5], LN, LF, LC);
    double l = 0;
    for (int i = 0; i < LN * LC; i++)
        l += (out[i] + res2[i]) * c->G[i];
    return l;
}

static void test_block_layer(void)
{
    struct backend be;
    struct err e = {0};
    CU_ASSERT_EQUAL_FATAL(backend_cpu_init(&be, 1, &e), ERR_OK);
    struct layer_mem lm;
    mem_make(&lm, MODEL_LAYER_BLOCK, 1);
    const struct backend_layer_ops *ops = &backend_layers(&be, &small_llama)[MODEL_LAYER_BLOCK];
    static float out[LN * LC], G[LN * LC];
    static double xd[LN * LC], Gd[LN * LC], gref[LW * LC];
    fill(lm.v.kept[LB_INP], xd, LN * LC, -1, 1);
    fill(G, Gd, LN * LC, -1, 1);
    CU_ASSERT_EQUAL_FATAL(ops->forward(&be, &lm.v, out, &e), ERR_OK);
    struct block_ctx c = {xd, Gd, lm.pd};
    double l = 0;
    for (int i = 0; i < LN * LC; i++)
        l += out[i] * Gd[i];
    CU_ASSERT(test_close(l, block_loss(NULL, &c), 1e-4, 1e-4));
    memcpy(lm.v.ws[LB_DOUT], G, sizeof G);
    CU_ASSERT_EQUAL_FATAL(ops->backward(&be, &lm.v, 1.0f, &e), ERR_OK);
    fd_grad(block_loss, &c, xd, LN * LC, gref);
    CU_ASSERT(all_close(lm.v.ws[LB_DINP], gref, LN * LC, 2e-4, 2e-3, "block dinp"));
    for (int k = 0; k < lm.n[SIZES_PARAMS]; k++) {
        fd_grad(block_loss, &c, lm.pd[k], lm.t[SIZES_PARAMS][k].elems, gref);
        CU_ASSERT(all_close(lm.v.grads[k], gref, lm.t[SIZES_PARAMS][k].elems, 2e-4, 2e-3,
                            lm.t[SIZES_PARAMS][k].name));
    }
    mem_free(&lm);
    be.ops->free(&be);
}

/* The backward split into its input-gradient and weight passes adds up to the fused backward
 * bit for bit, over two micro-batches (both B passes, then both W). */
static void test_split_backward(void)
{
    struct backend be;
    struct err e = {0};
    CU_ASSERT_EQUAL_FATAL(backend_cpu_init(&be, 1, &e), ERR_OK);
    struct layer_mem lm;
    mem_make(&lm, MODEL_LAYER_BLOCK, 1);
    static float out[LN * LC], g0[LN * LC], g1[LN * LC];
    static double xd[LN * LC], unused[LN * LC];
    fill(lm.v.kept[LB_INP], xd, LN * LC, -1, 1);
    fill(g0, unused, LN * LC, -1, 1);
    fill(g1, unused, LN * LC, -1, 1);
    const struct backend_layer_ops *ops = &backend_layers(&be, &small_llama)[MODEL_LAYER_BLOCK];
    CU_ASSERT_EQUAL_FATAL(ops->forward(&be, &lm.v, out, &e), ERR_OK);
    CU_ASSERT(split_matches_fused(&be, &lm.v, LB_DOUT, LB_DINP, g0, g1));
    mem_free(&lm);
    be.ops->free(&be);
}

struct head_ctx {
    double *x, *wn, *wl, scale;
    const int32_t *targets;
};

static double head_loss(const double *unused, const void *ctx)
{
    const struct head_ctx *c = ctx;
    static double ln[LN * LC], logits[LN * LV];
    rms_ref(c->x, c->wn, ln, LN, LC, 1e-5);
    ref_linear(logits, ln, c->wl, LN, LC, LV);
    double l = 0;
    for (int n = 0; n < LN; n++) {
        double m = -INFINITY, z = 0;
        for (int v = 0; v < LV; v++)
            m = fmax(m, logits[n * LV + v]);
        for (int v = 0; v < LV; v++)
            z += exp(logits[n * LV + v] - m);
        l += c->scale * (log(z) + m - logits[n * LV + c->targets[n]]);
    }
    return l;
}

static void test_head_layer(void)
{
    struct backend be;
    struct err e = {0};
    CU_ASSERT_EQUAL_FATAL(backend_cpu_init(&be, 1, &e), ERR_OK);
    struct layer_mem lm;
    mem_make(&lm, MODEL_LAYER_HEAD, 2);
    const struct backend_layer_ops *ops = &backend_layers(&be, &small_llama)[MODEL_LAYER_HEAD];
    static double xd[LN * LC], gref[LV * LC];
    int32_t *targets = lm.v.kept[LH_TARGETS];
    for (int n = 0; n < LN; n++)
        targets[n] = (int32_t)test_rng_int(&rng, 0, LV - 1);
    fill(lm.v.kept[LH_INP], xd, LN * LC, -1, 1);
    CU_ASSERT_EQUAL_FATAL(ops->forward(&be, &lm.v, NULL, &e), ERR_OK);
    float scale = 1.0f / LN;
    struct head_ctx c = {xd, lm.pd[LH_LNF_W], lm.pd[LH_LM_W], scale, targets};
    double l = 0;
    for (int n = 0; n < LN; n++)
        l += scale * ((float *)lm.v.ws[LH_LOSSES])[n];
    CU_ASSERT(test_close(l, head_loss(NULL, &c), 1e-5, 1e-5));
    CU_ASSERT_EQUAL_FATAL(ops->backward(&be, &lm.v, scale, &e), ERR_OK);
    fd_grad(head_loss, &c, xd, LN * LC, gref);
    CU_ASSERT(all_close(lm.v.ws[LH_DINP], gref, LN * LC, 1e-5, 1e-3, "head dinp"));
    fd_grad(head_loss, &c, lm.pd[LH_LNF_W], LC, gref);
    CU_ASSERT(all_close(lm.v.grads[LH_LNF_W], gref, LC, 1e-5, 1e-3, "lnf_w"));
    fd_grad(head_loss, &c, lm.pd[LH_LM_W], LV * LC, gref);
    CU_ASSERT(all_close(lm.v.grads[LH_LM_W], gref, LV * LC, 1e-5, 1e-3, "lm_w"));
    mem_free(&lm);
    be.ops->free(&be);
}

/* ---- sizes ---- */

static struct model llama(int n_layer, int C, int NH, int NKV, int F, int T, int V, int B)
{
    return (struct model){.kind = MODEL_KIND_LLAMA, .n_layer = n_layer, .n_embd = C,
                          .n_head = NH, .n_kv_head = NKV, .ffn_hidden = F, .seq_len = T,
                          .vocab_size = V, .micro_batch = B, .dtype = MODEL_DTYPE_FP32,
                          .rope_theta = 10000, .norm_eps = 1e-5};
}

/* Hugging Face's parameter counts of the published checkpoints (untied lm_head). */
static void test_param_counts(void)
{
    struct model l2_7 = llama(32, 4096, 32, 32, 11008, 4096, 32000, 1);
    struct model l2_13 = llama(40, 5120, 40, 40, 13824, 4096, 32000, 1);
    struct model l2_70 = llama(80, 8192, 64, 8, 28672, 4096, 32000, 1);
    struct model l3_8 = llama(32, 4096, 32, 8, 14336, 8192, 128256, 1);
    struct model l3_70 = llama(80, 8192, 64, 8, 28672, 8192, 128256, 1);
    CU_ASSERT_EQUAL(model_param_count(&l2_7), 6738415616LL);
    CU_ASSERT_EQUAL(model_param_count(&l2_13), 13015864320LL);
    CU_ASSERT_EQUAL(model_param_count(&l2_70), 68976648192LL);
    CU_ASSERT_EQUAL(model_param_count(&l3_8), 8030261248LL);
    CU_ASSERT_EQUAL(model_param_count(&l3_70), 70553706496LL);
    CU_ASSERT_PTR_EQUAL(model_ops_of(&l3_8), &model_ops_llama);
}

/* A block's bytes by formula (every tensor a multiple of 64 bytes here), the layout's
 * slots and transients for each option, and the estimate's memory equal to both. */
static void test_sizes(void)
{
    struct model m = llama(3, 64, 4, 2, 172, 64, 256, 2);
    int64_t B = 2, T = 64, C = 64, NH = 4, F = 172, W = (4 + 2 * 2) * 16, BT = B * T;
    struct layer_sizes s;
    sizes_layer(&m, 1, &s);
    CU_ASSERT_EQUAL(s.params, C + W * C + C * C + C + 2 * F * C + C * F);
    CU_ASSERT_EQUAL(s.state_bytes, 16 * s.params);
    CU_ASSERT_EQUAL(s.act_bytes, 4 * (5 * BT * C + 2 * BT + BT * W + B * NH * T * T + 3 * BT * F));
    CU_ASSERT_EQUAL(s.ckpt_bytes, 4 * BT * C);
    CU_ASSERT_EQUAL(s.workspace_bytes,
                    4 * (4 * BT * C + 3 * BT * F + BT * W + B * NH * T * T));
    sizes_layer(&m, 0, &s);
    CU_ASSERT_EQUAL(s.params, 256 * C);
    sizes_layer(&m, 4, &s);
    CU_ASSERT_EQUAL(s.params, C + 256 * C);
    CU_ASSERT_EQUAL(s.act_bytes, 4 * (2 * BT * C + 2 * BT + BT * 256));
    /* the options: what each regenerates */
    struct sizes_option o[SIZES_OPTIONS_MAX];
    CU_ASSERT_EQUAL_FATAL(sizes_recompute_options(&m, MODEL_LAYER_BLOCK, o), 3);
    int64_t kept, transient;
    sizes_regen_bytes(&m, MODEL_LAYER_BLOCK, o[0].regen, &kept, &transient);
    CU_ASSERT(strcmp(o[0].name, "attn") == 0 && transient == 4 * B * NH * T * T);
    sizes_regen_bytes(&m, MODEL_LAYER_BLOCK, o[1].regen, &kept, &transient);
    CU_ASSERT(strcmp(o[1].name, "mlp") == 0 && transient == 4 * BT * F);
    /* the layout of the whole model under each choice: its slot and transient per layer are
     * the size functions' (layout_init also checks its total against the cost model) */
    uint32_t full = sizes_full_regen(&m, MODEL_LAYER_BLOCK);
    uint32_t regens[] = {0, o[0].regen, o[1].regen, o[2].regen, full};
    for (size_t r = 0; r < sizeof regens / sizeof *regens; r++) {
        uint32_t regen[5] = {0, regens[r], regens[r], regens[r], 0};
        struct stage_layout sl;
        struct err e = {0};
        CU_ASSERT_EQUAL_FATAL(layout_init(&sl, &m, 0, 4, regen, 2, &e), ERR_OK);
        sizes_layer(&m, 1, &s);
        sizes_regen_bytes(&m, MODEL_LAYER_BLOCK, regens[r], &kept, &transient);
        CU_ASSERT_EQUAL(sl.layers[1].slot_bytes, kept);
        CU_ASSERT_EQUAL(sl.layers[1].transient_bytes, transient);
        CU_ASSERT_EQUAL(sl.layers[1].ws_bytes, s.workspace_bytes);
        CU_ASSERT_EQUAL(sl.layers[1].state_bytes, s.state_bytes);
        CU_ASSERT_EQUAL(sl.param_count, model_param_count(&m));
        layout_free(&sl);
    }
    /* the estimated profile carries the same memory and the three options */
    struct device_table dt;
    const struct device_spec *d = NULL;
    struct err e = {0};
    CU_ASSERT_EQUAL_FATAL(devices_load(devices_default_file(), &dt, &e), ERR_OK);
    d = devices_find(&dt, "A100-80GB");
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    struct profile p;
    CU_ASSERT_EQUAL_FATAL(estimate_profile(&dt, d, &m, &p, &e), ERR_OK);
    for (int l = 0; l < p.n_layers; l++) {
        sizes_layer(&m, l, &s);
        CU_ASSERT_EQUAL(p.layers[l].act_bytes, s.act_bytes);
        CU_ASSERT_EQUAL(p.layers[l].state_bytes, s.state_bytes);
        CU_ASSERT_EQUAL(p.layers[l].workspace_bytes, s.workspace_bytes);
        CU_ASSERT(p.layers[l].fwd_ms > 0 && p.layers[l].bwd_ms > p.layers[l].fwd_ms);
        CU_ASSERT_EQUAL(p.layers[l].n_options, l >= 1 && l <= 3 ? 3 : 0);
    }
    /* the frameworks' Llama blocks (sizes by hand: test_estimate_for) */
    CU_ASSERT_EQUAL(estimate_for_framework(&dt, d, &m, "megatron", &p, &e), ERR_OK);
    profile_free(&p);
    devices_free(&dt);
}

/* A profile measured by running llama_layers.c (ballast profile --device cpu) carries the size
 * functions' memory, and times for every layer and option. */
static void test_measured_profile(void)
{
    char args[2048], out[1024];
    snprintf(out, sizeof out, "%s", test_path("llama-measured.json"));
    snprintf(args, sizeof args,
             "profile --model '%s/configs/models/llama-tiny.json' --device cpu --threads 1 "
             "-o '%s'",
             BALLAST_SOURCE_DIR, out);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    struct profile p;
    struct err e = {0};
    CU_ASSERT_EQUAL_FATAL(profile_load(out, &p, &e), ERR_OK);
    CU_ASSERT_EQUAL_FATAL(p.n_layers, p.model.n_layer + 2);
    CU_ASSERT(p.model.kind == MODEL_KIND_LLAMA && p.model.n_kv_head == 2);
    for (int l = 0; l < p.n_layers; l++) {
        struct layer_sizes s;
        sizes_layer(&p.model, l, &s);
        CU_ASSERT_EQUAL(p.layers[l].act_bytes, s.act_bytes);
        CU_ASSERT_EQUAL(p.layers[l].state_bytes, s.state_bytes);
        CU_ASSERT(p.layers[l].fwd_ms > 0 && p.layers[l].bwd_ms > 0);
        for (int k = 0; k < p.layers[l].n_options; k++)
            CU_ASSERT(p.layers[l].options[k].recompute_ms > 0);
    }
    CU_ASSERT_EQUAL(p.layers[1].n_options, 3);
    profile_free(&p);
}

/* ---- model files ---- */

static void test_bad_files(void)
{
    static const char *const base =
        "\"format\": \"ballast-model/1\", \"n_layer\": 2, \"n_embd\": 32, \"seq_len\": 8, "
        "\"vocab_size\": 64, \"micro_batch\": 1, \"dtype\": \"fp32\"";
    static const struct {
        const char *fields, *expect;
    } cases[] = {
        {"\"kind\": \"llama\", \"n_head\": 4, \"ffn_hidden\": 48, \"rope_theta\": 10000, "
         "\"norm_eps\": 1e-5", "n_kv_head: missing"},
        {"\"kind\": \"llama\", \"n_head\": 4, \"n_kv_head\": 2, \"rope_theta\": 10000, "
         "\"norm_eps\": 1e-5", "ffn_hidden: missing"},
        {"\"kind\": \"llama\", \"n_head\": 4, \"n_kv_head\": 2, \"ffn_hidden\": 48, "
         "\"norm_eps\": 1e-5", "rope_theta: missing"},
        {"\"kind\": \"llama\", \"n_head\": 4, \"n_kv_head\": 2, \"ffn_hidden\": 48, "
         "\"rope_theta\": 10000", "norm_eps: missing"},
        {"\"kind\": \"llama\", \"n_head\": 4, \"n_kv_head\": 3, \"ffn_hidden\": 48, "
         "\"rope_theta\": 10000, \"norm_eps\": 1e-5", "n_kv_head: n_head 4 is not a multiple"},
        {"\"kind\": \"llama\", \"n_head\": 32, \"n_kv_head\": 2, \"ffn_hidden\": 48, "
         "\"rope_theta\": 10000, \"norm_eps\": 1e-5", "n_head: head size n_embd/n_head = 1"},
        {"\"kind\": \"llama\", \"n_head\": 4, \"n_kv_head\": 2, \"ffn_hidden\": 48, "
         "\"rope_theta\": 0, \"norm_eps\": 1e-5", "rope_theta"},
        {"\"kind\": \"llama\", \"n_head\": 4, \"n_kv_head\": 2, \"ffn_hidden\": 48, "
         "\"rope_theta\": 10000, \"norm_eps\": 1e-5, \"bias\": true", "bias"},
        /* GPT has no such fields */
        {"\"kind\": \"gpt\", \"n_head\": 4, \"n_kv_head\": 2", "n_kv_head"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[1024];
        snprintf(text, sizeof text, "{%s, %s}", base, cases[i].fields);
        const char *file = test_write("bad-model.json", text);
        struct model m;
        struct err e = {0};
        int rc = model_load(file, &m, &e);
        int ok = rc == ERR_INPUT && strstr(e.msg, "bad-model.json") != NULL &&
                 strstr(e.msg, cases[i].expect) != NULL;
        if (!ok)
            fprintf(stderr, "\ncase %zu: expected \"%s\" in: %s\n", i, cases[i].expect, e.msg);
        CU_ASSERT(ok);
    }
    /* the shipped tiny Llama loads and round-trips through JSON */
    struct model m, back;
    struct err e = {0};
    char path[1024];
    snprintf(path, sizeof path, "%s/configs/models/llama-tiny.json", BALLAST_SOURCE_DIR);
    CU_ASSERT_EQUAL_FATAL(model_load(path, &m, &e), ERR_OK);
    cJSON *j = model_to_json(&m);
    CU_ASSERT_EQUAL(model_from_json(j, "json", "", &back, &e), ERR_OK);
    CU_ASSERT(model_equal(&m, &back) && back.n_kv_head == 2 && back.norm_eps == 1e-5);
    cJSON_Delete(j);
}

/* ---- training ---- */

#define RUN_LIMIT_S 120

static char plan_none[1024];

static int make_plan(void)
{
    const char *model = test_write(
        "llama-small.json",
        "{\"format\": \"ballast-model/1\", \"kind\": \"llama\", \"n_layer\": 2, \"n_embd\": 32, "
        "\"n_head\": 4, \"n_kv_head\": 2, \"ffn_hidden\": 48, \"rope_theta\": 10000, "
        "\"norm_eps\": 1e-5, \"seq_len\": 16, \"vocab_size\": 64, \"micro_batch\": 2, "
        "\"dtype\": \"fp32\"}");
    char args[4096], prof[1024], model_path[1024];
    snprintf(model_path, sizeof model_path, "%s", model);
    snprintf(prof, sizeof prof, "%s", test_path("prof-llama.json"));
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu -o '%s'",
             model_path, prof);
    if (test_run(args, NULL, NULL) != 0)
        return -1;
    const char *cluster = test_write(
        "cluster-llama.json",
        "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 4, "
        "\"stages\": [{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
        "\"prof-llama.json\", \"layers\": [0, 1]}, {\"device\": \"cpu\", \"memory_bytes\": "
        "1073741824, \"profile\": \"prof-llama.json\", \"layers\": [2, 2]}, {\"device\": "
        "\"cpu\", \"memory_bytes\": 1073741824, \"profile\": \"prof-llama.json\", \"layers\": "
        "[3, 3]}]}");
    char cl[1024];
    snprintf(cl, sizeof cl, "%s", cluster);
    snprintf(plan_none, sizeof plan_none, "%s", test_path("plan-llama.json"));
    snprintf(args, sizeof args, "plan --cluster '%s' --method none --quiet -o '%s'", cl,
             plan_none);
    return test_run(args, NULL, NULL) == 0 ? 0 : -1;
}

static int train_saved(const char *plan, const char *dir, const char *extra, const char *name,
                       struct train_metrics *m)
{
    char args[4096];
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        return -1;
    snprintf(args, sizeof args, "--threads 1 --steps 3 --save '%s' %s", dir, extra);
    return train_run_ok(3, RUN_LIMIT_S, plan, args, name, m);
}

/* Keeping everything against each plan of choices (layers 0 embed, 1-2 blocks, 3 head):
 * checkpoints hold weights, the last gradients and AdamW's moments, so equal files mean all
 * of them are bitwise equal. */
static void test_train_recompute(void)
{
    CU_ASSERT_EQUAL_FATAL(make_plan(), 0);
    static const char *const choices[][4] = {
        {NULL, "attn", "mlp", NULL},
        {NULL, "attn+mlp", "full", "full"},
        {"full", "full", "attn", NULL},
    };
    char keep[1024], rec[1024], other[1024];
    snprintf(keep, sizeof keep, "%s", test_path("ck-keep"));
    snprintf(rec, sizeof rec, "%s", test_path("ck-rec"));
    snprintf(other, sizeof other, "%s", test_path("ck-seed2"));
    struct train_metrics a, b, c;
    if (train_saved(plan_none, keep, "", "mk.json", &a))
        return;
    CU_ASSERT(isfinite(a.loss[0]) && a.loss[2] < a.loss[0]); /* it trains */
    if (train_saved(plan_none, other, "--seed 2", "ms.json", &c))
        return;
    for (size_t i = 0; i < sizeof choices / sizeof *choices; i++) {
        char plan[1024], name[64];
        snprintf(name, sizeof name, "plan-llama-%zu.json", i);
        snprintf(plan, sizeof plan, "%s", test_path(name));
        train_plan_with_choices(plan_none, plan, choices[i]);
        snprintf(name, sizeof name, "mr%zu.json", i);
        if (train_saved(plan, rec, "", name, &b))
            return;
        CU_ASSERT_EQUAL(b.n_steps, a.n_steps);
        /* the plan really made the runtime recompute: stage 0 or 1 reran something */
        CU_ASSERT(b.recompute_ms[0] > 0 || b.recompute_ms[1] > 0);
        for (int k = 0; k < a.n_steps; k++)
            CU_ASSERT_EQUAL(a.loss[k], b.loss[k]);
        for (int s = 0; s < 3; s++) {
            char fa[1200], fb[1200], fc[1200];
            snprintf(fa, sizeof fa, "%s/stage-%d-step-3.ckpt", keep, s);
            snprintf(fb, sizeof fb, "%s/stage-%d-step-3.ckpt", rec, s);
            snprintf(fc, sizeof fc, "%s/stage-%d-step-3.ckpt", other, s);
            int same = train_files_equal(fa, fb);
            if (!same)
                fprintf(stderr, "\nchoices %zu: stage %d state differs\n", i, s);
            CU_ASSERT(same);
            CU_ASSERT(!train_files_equal(fa, fc)); /* the comparison can tell states apart */
        }
    }
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("llama", NULL, NULL);
    CU_add_test(s, "RMSNorm forward and backward against float64", test_rmsnorm);
    CU_add_test(s, "the split backward (B, then W) is the fused backward bitwise",
                test_split_backward);
    CU_add_test(s, "SwiGLU forward and backward against float64", test_swiglu);
    CU_add_test(s, "rotary positions forward and backward against float64", test_rope);
    CU_add_test(s, "grouped-query attention (MHA, GQA, MQA) against float64", test_attention);
    CU_add_test(s, "token embedding forward and backward by hand", test_embedding);
    CU_add_test(s, "the block (llama_layers.c) against float64", test_block_layer);
    CU_add_test(s, "the head (llama_layers.c) against float64", test_head_layer);
    CU_add_test(s, "parameter counts of Llama-2 and Llama-3 as published", test_param_counts);
    CU_add_test(s, "block sizes by formula, the layout and the estimate agree", test_sizes);
    CU_add_test(s, "a measured CPU profile of llama-tiny", test_measured_profile);
    CU_add_test(s, "bad model files are refused naming file and field", test_bad_files);
    CU_add_test(s, "3 ranks: every recompute option bitwise equal to keeping everything",
                test_train_recompute);
    return test_main();
}
