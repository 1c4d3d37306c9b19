/* The CPU backend's layers against an independent float64 reference written here from the
 * GPT's definition: forward outputs agree, and backward gradients agree with central
 * differences of the float64 loss (h = 1e-6: truncation and rounding errors far below the
 * tolerance). Tolerances, |got - ref| <= atol + rtol * |ref|: forward 1e-5 + 1e-4 |ref|;
 * gradients 2e-5 + 2e-3 |ref| (fp32 accumulation over at most a few hundred terms).
 * Also: recompute regenerates the kept tensors bitwise (the whole layer, and each partial
 * option, leaving the tensors it keeps alone), backward adds into parameter gradients, and
 * results do not depend on the thread count. */
#include <CUnit/CUnit.h>
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "layout.h"
#include "sizes.h"
#include "splittest.h"
#include "testutil.h"

static const struct model model = {.n_layer = 2, .n_embd = 8, .n_head = 2, .seq_len = 5,
                                   .vocab_size = 11, .micro_batch = 2,
                                   .dtype = MODEL_DTYPE_FP32};
#define B 2
#define T 5
#define C 8
#define NH 2
#define V 11
#define N (B * T)

/* ---- one layer's tensors, each its own allocation ---- */

struct layer_mem {
    struct layer_view v;
    struct sizes_tensor t[3][SIZES_TENSORS_MAX];
    int n[3];
};

static void *alloc_tensor(const struct sizes_tensor *t)
{
    void *p = aligned_alloc(SIZES_ALIGN, (size_t)sizes_tensor_bytes(t));
    memset(p, 0, (size_t)sizes_tensor_bytes(t));
    return p;
}

static void mem_make(struct layer_mem *lm, enum model_layer_kind kind, int layer,
                     struct test_rng *rng)
{
    memset(lm, 0, sizeof *lm);
    lm->v.model = &model;
    lm->v.kind = kind;
    lm->v.layer = layer;
    for (int c = 0; c < 3; c++)
        lm->n[c] = sizes_layer_tensors(&model, kind, (enum sizes_class)c, lm->t[c]);
    for (int k = 0; k < lm->n[SIZES_PARAMS]; k++) {
        const struct sizes_tensor *t = &lm->t[SIZES_PARAMS][k];
        lm->v.params[k] = alloc_tensor(t);
        lm->v.grads[k] = alloc_tensor(t);
        /* layer-norm gains near 1, everything else small and random */
        int gain = strncmp(t->name, "ln", 2) == 0 && strstr(t->name, "_w") != NULL;
        for (int64_t i = 0; i < t->elems; i++)
            ((float *)lm->v.params[k])[i] = (float)((gain ? 1.0 : 0.0) + test_rng_double(rng, -0.4, 0.4));
    }
    for (int k = 0; k < lm->n[SIZES_KEPT]; k++)
        lm->v.kept[k] = alloc_tensor(&lm->t[SIZES_KEPT][k]);
    for (int k = 0; k < lm->n[SIZES_WORKSPACE]; k++)
        lm->v.ws[k] = alloc_tensor(&lm->t[SIZES_WORKSPACE][k]);
}

static void mem_free(struct layer_mem *lm)
{
    for (int k = 0; k < lm->n[SIZES_PARAMS]; k++) {
        free(lm->v.params[k]);
        free(lm->v.grads[k]);
    }
    for (int k = 0; k < lm->n[SIZES_KEPT]; k++)
        free(lm->v.kept[k]);
    for (int k = 0; k < lm->n[SIZES_WORKSPACE]; k++)
        free(lm->v.ws[k]);
}

/* ---- float64 reference ---- */

static void ref_layernorm(double *out, const double *x, const double *w, const double *b)
{
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++)
            m += x[n * C + i];
        m /= C;
        for (int i = 0; i < C; i++)
            v += (x[n * C + i] - m) * (x[n * C + i] - m);
        v /= C;
        for (int i = 0; i < C; i++)
            out[n * C + i] = (x[n * C + i] - m) / sqrt(v + 1e-5) * w[i] + b[i];
    }
}

/* out (N,OC) = x (N,IC) W^T + b, W (OC,IC) */
static void ref_linear(double *out, const double *x, const double *W, const double *b, int IC,
                       int OC)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0;
            for (int i = 0; i < IC; i++)
                s += x[n * IC + i] * W[o * IC + i];
            out[n * OC + o] = s;
        }
}

static void ref_attention(double *out, const double *qkv)
{
    int hs = C / NH;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + (b * T + t) * 3 * C + h * hs;
                double s[T], mx = -INFINITY, z = 0;
                for (int u = 0; u <= t; u++) {
                    const double *k = qkv + (b * T + u) * 3 * C + C + h * hs;
                    s[u] = 0;
                    for (int i = 0; i < hs; i++)
                        s[u] += q[i] * k[i];
                    s[u] /= sqrt((double)hs);
                    mx = fmax(mx, s[u]);
                }
                for (int u = 0; u <= t; u++)
                    z += exp(s[u] - mx);
                for (int i = 0; i < hs; i++) {
                    double acc = 0;
                    for (int u = 0; u <= t; u++)
                        acc += exp(s[u] - mx) / z * qkv[(b * T + u) * 3 * C + 2 * C + h * hs + i];
                    out[(b * T + t) * C + h * hs + i] = acc;
                }
            }
}

static double ref_gelu(double x)
{
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* Parameters and input as float64 copies, perturbed by the finite differences. */
struct ref {
    double *p[SIZES_TENSORS_MAX];
    double *inp;
};

static void block_ref(double *out, const struct ref *r)
{
    double ln1[N * C], qkv[N * 3 * C], atty[N * C], res2[N * C], ln2[N * C], fch[N * 4 * C],
        mlp[N * C];
    double *const *p = r->p;
    ref_layernorm(ln1, r->inp, p[BLOCK_LN1_W], p[BLOCK_LN1_B]);
    ref_linear(qkv, ln1, p[BLOCK_QKV_W], p[BLOCK_QKV_B], C, 3 * C);
    ref_attention(atty, qkv);
    ref_linear(res2, atty, p[BLOCK_PROJ_W], p[BLOCK_PROJ_B], C, C);
    for (int i = 0; i < N * C; i++)
        res2[i] += r->inp[i];
    ref_layernorm(ln2, res2, p[BLOCK_LN2_W], p[BLOCK_LN2_B]);
    ref_linear(fch, ln2, p[BLOCK_FC_W], p[BLOCK_FC_B], C, 4 * C);
    for (int i = 0; i < N * 4 * C; i++)
        fch[i] = ref_gelu(fch[i]);
    ref_linear(mlp, fch, p[BLOCK_FCPROJ_W], p[BLOCK_FCPROJ_B], 4 * C, C);
    for (int i = 0; i < N * C; i++)
        out[i] = res2[i] + mlp[i];
}

/* scale * sum over tokens of -log softmax(logits)[target] */
static double head_ref(const struct ref *r, const int32_t *targets, double scale)
{
    double lnf[N * C], logits[N * V], loss = 0;
    ref_layernorm(lnf, r->inp, r->p[HEAD_LNF_W], r->p[HEAD_LNF_B]);
    ref_linear(logits, lnf, r->p[HEAD_LM_W], NULL, C, V);
    for (int n = 0; n < N; n++) {
        double mx = -INFINITY, z = 0;
        for (int i = 0; i < V; i++)
            mx = fmax(mx, logits[n * V + i]);
        for (int i = 0; i < V; i++)
            z += exp(logits[n * V + i] - mx);
        loss += log(z) - (logits[n * V + targets[n]] - mx);
    }
    return scale * loss;
}

static void ref_make(struct ref *r, const struct layer_mem *lm, const float *inp, int n_inp)
{
    for (int k = 0; k < lm->n[SIZES_PARAMS]; k++) {
        int64_t n = lm->t[SIZES_PARAMS][k].elems;
        r->p[k] = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            r->p[k][i] = ((const float *)lm->v.params[k])[i];
    }
    r->inp = malloc(sizeof(double) * (size_t)n_inp);
    for (int i = 0; i < n_inp; i++)
        r->inp[i] = inp[i];
}

static void ref_free(struct ref *r, int n_params)
{
    for (int k = 0; k < n_params; k++)
        free(r->p[k]);
    free(r->inp);
}

static int check_close(const char *what, const char *name, int64_t i, double got, double ref,
                       double atol, double rtol)
{
    if (test_close(got, ref, atol, rtol))
        return 1;
    fprintf(stderr, "\n%s %s[%lld]: got %.9g, reference %.9g\n", what, name, (long long)i, got,
            ref);
    return 0;
}

#define FWD_ATOL 1e-5
#define FWD_RTOL 1e-4
#define GRAD_ATOL 2e-5
#define GRAD_RTOL 2e-3
#define FD_H 1e-6

/* ---- block ---- */

/* sum(out * R) in float64 */
static double block_loss(const struct ref *r, const double *R)
{
    double out[N * C], s = 0;
    block_ref(out, r);
    for (int i = 0; i < N * C; i++)
        s += out[i] * R[i];
    return s;
}

static double fd(double *x, double (*f)(const struct ref *, const void *), const struct ref *r,
                 const void *arg)
{
    double keep = *x;
    *x = keep + FD_H;
    double up = f(r, arg);
    *x = keep - FD_H;
    double down = f(r, arg);
    *x = keep;
    return (up - down) / (2 * FD_H);
}

static double block_loss_v(const struct ref *r, const void *R)
{
    return block_loss(r, R);
}

static void test_block(void)
{
    struct test_rng rng = {11};
    struct layer_mem lm;
    struct backend be;
    struct err e;
    mem_make(&lm, MODEL_LAYER_BLOCK, 1, &rng);
    CU_ASSERT_EQUAL_FATAL(backend_cpu_init(&be, 1, &e), ERR_OK);
    float *inp = lm.v.kept[BLOCK_INP], out[N * C];
    double R[N * C];
    for (int i = 0; i < N * C; i++) {
        inp[i] = (float)test_rng_double(&rng, -1, 1);
        R[i] = test_rng_double(&rng, -1, 1);
    }
    struct ref r;
    ref_make(&r, &lm, inp, N * C);
    double ref_out[N * C];
    block_ref(ref_out, &r);
    CU_ASSERT_EQUAL(be.ops->layer[MODEL_LAYER_BLOCK].forward(&be, &lm.v, out, &e), ERR_OK);
    int ok = 1;
    for (int i = 0; i < N * C && ok; i++)
        ok = check_close("block forward", "out", i, out[i], ref_out[i], FWD_ATOL, FWD_RTOL);
    CU_ASSERT(ok);

    float *dout = lm.v.ws[BLOCK_DOUT];
    for (int i = 0; i < N * C; i++)
        dout[i] = (float)R[i];
    CU_ASSERT_EQUAL(be.ops->layer[MODEL_LAYER_BLOCK].backward(&be, &lm.v, 0, &e), ERR_OK);
    const float *dinp = lm.v.ws[BLOCK_DINP];
    for (int i = 0; i < N * C && ok; i++)
        ok = check_close("block backward", "dinp", i, dinp[i], fd(&r.inp[i], block_loss_v, &r, R),
                         GRAD_ATOL, GRAD_RTOL);
    for (int k = 0; k < lm.n[SIZES_PARAMS] && ok; k++)
        for (int64_t i = 0; i < lm.t[SIZES_PARAMS][k].elems && ok; i++)
            ok = check_close("block backward", lm.t[SIZES_PARAMS][k].name, i, lm.v.grads[k][i],
                             fd(&r.p[k][i], block_loss_v, &r, R), GRAD_ATOL, GRAD_RTOL);
    CU_ASSERT(ok);
    ref_free(&r, lm.n[SIZES_PARAMS]);
    mem_free(&lm);
}

/* ---- head ---- */

struct head_arg {
    const int32_t *targets;
    double scale;
};

static double head_loss_v(const struct ref *r, const void *arg)
{
    const struct head_arg *a = arg;
    return head_ref(r, a->targets, a->scale);
}

static void test_head(void)
{
    struct test_rng rng = {12};
    struct layer_mem lm;
    struct backend be;
    struct err e;
    mem_make(&lm, MODEL_LAYER_HEAD, model.n_layer + 1, &rng);
    CU_ASSERT_EQUAL_FATAL(backend_cpu_init(&be, 1, &e), ERR_OK);
    float *inp = lm.v.kept[HEAD_INP];
    int32_t *targets = lm.v.kept[HEAD_TARGETS];
    for (int i = 0; i < N * C; i++)
        inp[i] = (float)test_rng_double(&rng, -1, 1);
    for (int i = 0; i < N; i++)
        targets[i] = (int32_t)test_rng_int(&rng, 0, V - 1);
    struct ref r;
    ref_make(&r, &lm, inp, N * C);
    CU_ASSERT_EQUAL(be.ops->layer[MODEL_LAYER_HEAD].forward(&be, &lm.v, NULL, &e), ERR_OK);
    /* per-token losses against the reference, one token at a time */
    const float *losses = lm.v.ws[HEAD_LOSSES];
    double total = 0;
    for (int n = 0; n < N; n++)
        total += losses[n];
    struct head_arg a = {targets, 0.25};
    CU_ASSERT(check_close("head forward", "sum of losses", 0, total, head_ref(&r, targets, 1.0),
                          FWD_ATOL, FWD_RTOL));
    CU_ASSERT_EQUAL(be.ops->layer[MODEL_LAYER_HEAD].backward(&be, &lm.v, (float)a.scale, &e),
                    ERR_OK);
    const float *dinp = lm.v.ws[HEAD_DINP];
    int ok = 1;
    for (int i = 0; i < N * C && ok; i++)
        ok = check_close("head backward", "dinp", i, dinp[i], fd(&r.inp[i], head_loss_v, &r, &a),
                         GRAD_ATOL, GRAD_RTOL);
    for (int k = 0; k < lm.n[SIZES_PARAMS] && ok; k++)
        for (int64_t i = 0; i < lm.t[SIZES_PARAMS][k].elems && ok; i++)
            ok = check_close("head backward", lm.t[SIZES_PARAMS][k].name, i, lm.v.grads[k][i],
                             fd(&r.p[k][i], head_loss_v, &r, &a), GRAD_ATOL, GRAD_RTOL);
    CU_ASSERT(ok);
    ref_free(&r, lm.n[SIZES_PARAMS]);
    mem_free(&lm);
}

/* ---- embed: linear, so its gradients are exact sums; checked by hand ---- */

static void test_embed(void)
{
    struct test_rng rng = {13};
    struct layer_mem lm;
    struct backend be;
    struct err e;
    mem_make(&lm, MODEL_LAYER_EMBED, 0, &rng);
    CU_ASSERT_EQUAL_FATAL(backend_cpu_init(&be, 1, &e), ERR_OK);
    int32_t *tok = lm.v.kept[EMBED_TOKENS];
    for (int i = 0; i < N; i++)
        tok[i] = i % 3 == 0 ? 4 : (int32_t)test_rng_int(&rng, 0, V - 1); /* repeats */
    float out[N * C];
    CU_ASSERT_EQUAL(be.ops->layer[MODEL_LAYER_EMBED].forward(&be, &lm.v, out, &e), ERR_OK);
    const float *wte = lm.v.params[EMBED_WTE], *wpe = lm.v.params[EMBED_WPE];
    int ok = 1;
    for (int n = 0; n < N && ok; n++)
        for (int i = 0; i < C && ok; i++)
            ok = out[n * C + i] == wte[tok[n] * C + i] + wpe[(n % T) * C + i];
    CU_ASSERT(ok);
    float *dout = lm.v.ws[EMBED_DOUT];
    for (int i = 0; i < N * C; i++)
        dout[i] = (float)test_rng_double(&rng, -1, 1);
    CU_ASSERT_EQUAL(be.ops->layer[MODEL_LAYER_EMBED].backward(&be, &lm.v, 0, &e), ERR_OK);
    for (int v = 0; v < V && ok; v++)
        for (int i = 0; i < C && ok; i++) {
            double s = 0;
            for (int n = 0; n < N; n++)
                if (tok[n] == v)
                    s += dout[n * C + i];
            ok = check_close("embed backward", "wte", v * C + i, lm.v.grads[EMBED_WTE][v * C + i],
                             s, 1e-6, 1e-6);
        }
    for (int t = 0; t < T && ok; t++)
        for (int i = 0; i < C && ok; i++) {
            double s = 0;
            for (int b = 0; b < B; b++)
                s += dout[(b * T + t) * C + i];
            ok = check_close("embed backward", "wpe", t * C + i, lm.v.grads[EMBED_WPE][t * C + i],
                             s, 1e-6, 1e-6);
        }
    CU_ASSERT(ok);
    mem_free(&lm);
}

/* ---- properties of the layer interface ---- */

static void fill_block_input(struct layer_mem *lm, struct test_rng *rng)
{
    float *inp = lm->v.kept[BLOCK_INP], *dout = lm->v.ws[BLOCK_DOUT];
    for (int i = 0; i < N * C; i++) {
        inp[i] = (float)test_rng_double(rng, -1, 1);
        dout[i] = (float)test_rng_double(rng, -1, 1);
    }
}

/* Recompute of a regen set (the whole block, and each partial option of sizes.h) rebuilds
 * exactly those kept tensors, bit for bit, from the others: each is poisoned with NaNs
 * first, and the tensors it keeps are left as they were. */
static void check_regen(const char *what, struct layer_mem *lm, struct backend *be,
                        uint32_t regen)
{
    struct err e;
    void *saved[SIZES_TENSORS_MAX];
    int64_t used[SIZES_TENSORS_MAX];
    for (int k = 0; k < lm->n[SIZES_KEPT]; k++) {
        used[k] = lm->t[SIZES_KEPT][k].elems * lm->t[SIZES_KEPT][k].elem_bytes;
        saved[k] = malloc((size_t)used[k]);
        memcpy(saved[k], lm->v.kept[k], (size_t)used[k]);
        if (regen >> k & 1)
            memset(lm->v.kept[k], 0xff, (size_t)used[k]); /* NaNs */
    }
    lm->v.regen = regen;
    err_clear(&e);
    CU_ASSERT_EQUAL(be->ops->layer[lm->v.kind].recompute(be, &lm->v, &e), ERR_OK);
    int ok = 1;
    for (int k = 0; k < lm->n[SIZES_KEPT]; k++) {
        int same = memcmp(saved[k], lm->v.kept[k], (size_t)used[k]) == 0;
        if (!same)
            fprintf(stderr, "\n%s: %s differs after recompute\n", what,
                    lm->t[SIZES_KEPT][k].name);
        ok &= same;
        free(saved[k]);
    }
    CU_ASSERT(ok);
}

static void test_recompute_bitwise(void)
{
    struct test_rng rng = {14};
    struct layer_mem lm;
    struct backend be;
    struct err e;
    mem_make(&lm, MODEL_LAYER_BLOCK, 1, &rng);
    backend_cpu_init(&be, 1, &e);
    fill_block_input(&lm, &rng);
    float out[N * C];
    be.ops->layer[MODEL_LAYER_BLOCK].forward(&be, &lm.v, out, &e);
    check_regen("block", &lm, &be, sizes_full_regen(&model, MODEL_LAYER_BLOCK));
    struct sizes_option o[SIZES_OPTIONS_MAX];
    int n = sizes_recompute_options(&model, MODEL_LAYER_BLOCK, o);
    CU_ASSERT(n == 3);
    for (int i = 0; i < n; i++)
        check_regen(o[i].name, &lm, &be, o[i].regen);
    /* a set no backend is asked for is refused, not half done */
    lm.v.regen = REGEN_BIT(BLOCK_LN2);
    err_clear(&e);
    CU_ASSERT_EQUAL(be.ops->layer[MODEL_LAYER_BLOCK].recompute(&be, &lm.v, &e), ERR_FAIL);
    mem_free(&lm);
    /* the head, whole */
    mem_make(&lm, MODEL_LAYER_HEAD, model.n_layer + 1, &rng);
    for (int i = 0; i < N * C; i++)
        ((float *)lm.v.kept[HEAD_INP])[i] = (float)test_rng_double(&rng, -1, 1);
    for (int i = 0; i < N; i++)
        ((int32_t *)lm.v.kept[HEAD_TARGETS])[i] = (int32_t)test_rng_int(&rng, 0, V - 1);
    be.ops->layer[MODEL_LAYER_HEAD].forward(&be, &lm.v, NULL, &e);
    check_regen("head", &lm, &be, sizes_full_regen(&model, MODEL_LAYER_HEAD));
    mem_free(&lm);
}

/* Backward adds: twice the same backward gives exactly twice the gradient. */
static void test_backward_accumulates(void)
{
    struct test_rng rng = {15};
    struct layer_mem lm;
    struct backend be;
    struct err e;
    mem_make(&lm, MODEL_LAYER_BLOCK, 1, &rng);
    backend_cpu_init(&be, 1, &e);
    fill_block_input(&lm, &rng);
    float out[N * C], dout[N * C];
    memcpy(dout, lm.v.ws[BLOCK_DOUT], sizeof dout);
    be.ops->layer[MODEL_LAYER_BLOCK].forward(&be, &lm.v, out, &e);
    be.ops->layer[MODEL_LAYER_BLOCK].backward(&be, &lm.v, 0, &e);
    int64_t n = lm.t[SIZES_PARAMS][BLOCK_FC_W].elems;
    float *once = malloc(sizeof(float) * (size_t)n);
    memcpy(once, lm.v.grads[BLOCK_FC_W], sizeof(float) * (size_t)n);
    memcpy(lm.v.ws[BLOCK_DOUT], dout, sizeof dout); /* backward consumed it */
    be.ops->layer[MODEL_LAYER_BLOCK].backward(&be, &lm.v, 0, &e);
    int ok = 1;
    for (int64_t i = 0; i < n; i++)
        ok &= lm.v.grads[BLOCK_FC_W][i] == 2 * once[i];
    CU_ASSERT(ok);
    free(once);
    mem_free(&lm);
}

/* The backward split into its input-gradient and weight passes (zb-h1, v-half) adds up to
 * the fused backward bit for bit, over two micro-batches (both B passes, then both W), for
 * the materialised and the flash attention block. */
static void test_split_backward(void)
{
    for (int flash = 0; flash < 2; flash++) {
        struct test_rng rng = {16};
        struct layer_mem lm;
        struct backend be;
        struct err e;
        struct model fm = model;
        fm.attention = flash ? MODEL_ATTENTION_FLASH : MODEL_ATTENTION_MATERIALIZED;
        mem_make(&lm, MODEL_LAYER_BLOCK, 1, &rng);
        if (flash) { /* flash keeps the log-sum-exp where the probabilities are */
            for (int k = 0; k < lm.n[SIZES_KEPT]; k++)
                free(lm.v.kept[k]);
            struct sizes_tensor t[SIZES_TENSORS_MAX];
            sizes_layer_tensors(&fm, MODEL_LAYER_BLOCK, SIZES_KEPT, t);
            for (int k = 0; k < lm.n[SIZES_KEPT]; k++)
                lm.v.kept[k] = alloc_tensor(&t[k]);
        }
        lm.v.model = &fm;
        backend_cpu_init(&be, 1, &e);
        fill_block_input(&lm, &rng);
        float out[N * C], g0[N * C], g1[N * C];
        for (int i = 0; i < N * C; i++) {
            g0[i] = (float)test_rng_double(&rng, -1, 1);
            g1[i] = (float)test_rng_double(&rng, -1, 1);
        }
        CU_ASSERT_EQUAL(be.ops->layer[MODEL_LAYER_BLOCK].forward(&be, &lm.v, out, &e), ERR_OK);
        CU_ASSERT(split_matches_fused(&be, &lm.v, BLOCK_DOUT, BLOCK_DINP, g0, g1));
        lm.v.model = &model;
        mem_free(&lm);
        be.ops->free(&be);
    }
}

/* One thread and two give the same bits: every reduction has one fixed order. A bigger
 * block than above, so that every parallel loop really splits: 288 rows and 384 hidden
 * columns make two GEMM tiles each way, 96 positions two attention row blocks. */
static void test_threads_bitwise(void)
{
    static const struct model big = {.n_layer = 2, .n_embd = 96, .n_head = 4, .seq_len = 96,
                                      .vocab_size = 50, .micro_batch = 3,
                                      .dtype = MODEL_DTYPE_FP32};
    float *grads[2][BLOCK_PARAMS], *dinp[2];
    for (int run = 0; run < 2; run++) {
        struct test_rng rng = {16};
        struct layer_view v = {.model = &big, .kind = MODEL_LAYER_BLOCK, .layer = 1};
        struct sizes_tensor t[3][SIZES_TENSORS_MAX];
        int n[3];
        for (int c = 0; c < 3; c++)
            n[c] = sizes_layer_tensors(&big, MODEL_LAYER_BLOCK, (enum sizes_class)c, t[c]);
        for (int k = 0; k < n[0]; k++) {
            v.params[k] = alloc_tensor(&t[0][k]);
            v.grads[k] = alloc_tensor(&t[0][k]);
            for (int64_t i = 0; i < t[0][k].elems; i++)
                ((float *)v.params[k])[i] = (float)test_rng_double(&rng, -0.3, 0.3);
        }
        for (int k = 0; k < n[1]; k++)
            v.kept[k] = alloc_tensor(&t[1][k]);
        for (int k = 0; k < n[2]; k++)
            v.ws[k] = alloc_tensor(&t[2][k]);
        int64_t btc = (int64_t)big.micro_batch * big.seq_len * big.n_embd;
        for (int64_t i = 0; i < btc; i++) {
            ((float *)v.kept[BLOCK_INP])[i] = (float)test_rng_double(&rng, -1, 1);
            ((float *)v.ws[BLOCK_DOUT])[i] = (float)test_rng_double(&rng, -1, 1);
        }
        struct backend be;
        struct err e;
        backend_cpu_init(&be, run == 0 ? 1 : 2, &e);
        float *out = malloc(sizeof(float) * (size_t)btc);
        be.ops->layer[MODEL_LAYER_BLOCK].forward(&be, &v, out, &e);
        be.ops->layer[MODEL_LAYER_BLOCK].backward(&be, &v, 0, &e);
        for (int k = 0; k < n[0]; k++) {
            grads[run][k] = v.grads[k];
            free(v.params[k]);
        }
        dinp[run] = malloc(sizeof(float) * (size_t)btc);
        memcpy(dinp[run], v.ws[BLOCK_DINP], sizeof(float) * (size_t)btc);
        for (int k = 0; k < n[1]; k++)
            free(v.kept[k]);
        for (int k = 0; k < n[2]; k++)
            free(v.ws[k]);
        free(out);
    }
    int64_t btc = (int64_t)big.micro_batch * big.seq_len * big.n_embd;
    CU_ASSERT(memcmp(dinp[0], dinp[1], sizeof(float) * (size_t)btc) == 0);
    struct sizes_tensor t[SIZES_TENSORS_MAX];
    sizes_layer_tensors(&big, MODEL_LAYER_BLOCK, SIZES_PARAMS, t);
    for (int k = 0; k < BLOCK_PARAMS; k++) {
        int same = memcmp(grads[0][k], grads[1][k], sizeof(float) * (size_t)t[k].elems) == 0;
        if (!same)
            fprintf(stderr, "\n1 and 2 threads differ in d%s\n", t[k].name);
        CU_ASSERT(same);
        free(grads[0][k]);
        free(grads[1][k]);
    }
    free(dinp[0]);
    free(dinp[1]);
}

/* The persistent arena of a 16-bit stage (bf16 and fp16 alike, to the byte): 16-bit weights,
 * then fp32 gradients, master weights, m and v, each section one copy of every parameter, no
 * overlap; the fp32 layout keeps the weights as the master. Numbers by hand for the test
 * model (C = 8, V = 11, T = 5): embed wte 88 + wpe 40 elements; each tensor padded to 64
 * bytes. */
static void check_16bit_layout(enum model_dtype dtype)
{
    struct model m = model;
    struct stage_layout sl;
    struct err e;
    m.dtype = dtype;
    CU_ASSERT_EQUAL_FATAL(layout_init(&sl, &m, 0, 0, NULL, 2, &e), ERR_OK);
    /* fp32: 88 x 4 = 352 -> 384, 40 x 4 = 160 -> 192; bf16: 176 -> 192, 80 -> 128 */
    CU_ASSERT_EQUAL(sl.section_bytes, 384 + 192);
    CU_ASSERT_EQUAL(sl.weights_bytes, 192 + 128);
    CU_ASSERT_EQUAL(sl.grads_at, 320);
    CU_ASSERT_EQUAL(sl.master_at, 320 + 576);
    CU_ASSERT_EQUAL(sl.m_at, 320 + 2 * 576);
    CU_ASSERT_EQUAL(sl.v_at, 320 + 3 * 576);
    CU_ASSERT_EQUAL(sl.persistent_bytes, 320 + 4 * 576);
    CU_ASSERT_EQUAL(sl.layers[0].weight_off[EMBED_WPE], 192);
    CU_ASSERT_EQUAL(sl.layers[0].param_off[EMBED_WPE], 384);
    CU_ASSERT_EQUAL(sl.layers[0].state_bytes, sl.persistent_bytes);
    layout_free(&sl);
}

static void test_16bit_layout(void)
{
    check_16bit_layout(MODEL_DTYPE_BF16);
    check_16bit_layout(MODEL_DTYPE_FP16);
    struct model m = model;
    struct stage_layout sl;
    struct err e;
    m.dtype = MODEL_DTYPE_FP32;
    CU_ASSERT_EQUAL_FATAL(layout_init(&sl, &m, 0, 0, NULL, 2, &e), ERR_OK);
    CU_ASSERT_EQUAL(sl.weights_bytes, sl.section_bytes);
    CU_ASSERT_EQUAL(sl.master_at, 0);
    CU_ASSERT_EQUAL(sl.grads_at, 576);
    CU_ASSERT_EQUAL(sl.v_at, 3 * 576);
    CU_ASSERT_EQUAL(sl.persistent_bytes, 4 * 576);
    layout_free(&sl);
}

/* The CPU backend computes fp32, bf16 and fp16 (through fp32 copies) and says so; a 16-bit
 * AdamW steps the fp32 master and rounds it into the 16-bit weights (1 - lr: by hand). */
static void test_cpu_bf16_adamw(void)
{
    struct backend be;
    struct err e;
    backend_cpu_init(&be, 1, &e);
    CU_ASSERT(be.ops->dtypes & BACKEND_DTYPE_BIT(MODEL_DTYPE_FP32));
    CU_ASSERT(be.ops->dtypes & BACKEND_DTYPE_BIT(MODEL_DTYPE_BF16));
    float w = 1, g = 1, m = 0, v = 0;
    uint16_t half = 0;
    struct adamw_params p = {1e-3f, 0.9f, 0.95f, 1e-8f, 0};
    CU_ASSERT_EQUAL(be.ops->adamw(&be, &half, &w, &g, &m, &v, 1, MODEL_DTYPE_BF16, &p, 1, 0, &e),
                    ERR_OK);
    CU_ASSERT(fabsf(w - 0.999f) < 1e-6f);
    /* 0.999 lies between the bf16 neighbours 0.99609375 and 1 (step 2^-8), nearer 1 */
    CU_ASSERT_EQUAL(half, 0x3f80);
    /* fp16: between 0.9990234375 (0x3bfe) and 1 - 2^-11 (0x3bff), nearer the former
     * (0.999 is 2.3e-5 from it, 5.1e-4 from the other) */
    w = 1, m = 0, v = 0;
    CU_ASSERT(be.ops->dtypes & BACKEND_DTYPE_BIT(MODEL_DTYPE_FP16));
    CU_ASSERT_EQUAL(be.ops->adamw(&be, &half, &w, &g, &m, &v, 1, MODEL_DTYPE_FP16, &p, 1, 0, &e),
                    ERR_OK);
    CU_ASSERT_EQUAL(half, 0x3bfe);
    /* fp32 weights must be the master weights */
    CU_ASSERT_EQUAL(be.ops->adamw(&be, &half, &w, &g, &m, &v, 1, MODEL_DTYPE_FP32, &p, 2, 0, &e),
                    ERR_FAIL);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("layers", NULL, NULL);
    CU_add_test(s, "block forward and backward against float64 finite differences", test_block);
    CU_add_test(s, "head forward and backward against float64 finite differences", test_head);
    CU_add_test(s, "embed forward and backward by hand", test_embed);
    CU_add_test(s, "recompute (whole and each option) regenerates its tensors bitwise",
                test_recompute_bitwise);
    CU_add_test(s, "backward adds into parameter gradients", test_backward_accumulates);
    CU_add_test(s, "the split backward (B, then W) is the fused backward bitwise",
                test_split_backward);
    CU_add_test(s, "1 and 2 threads give identical bits", test_threads_bitwise);
    CU_add_test(s, "the bf16 and fp16 persistent arena by hand", test_16bit_layout);
    CU_add_test(s, "the cpu backend's 16-bit AdamW rounds the fp32 master", test_cpu_bf16_adamw);
    return test_main();
}
