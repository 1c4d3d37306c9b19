/* The CUDA backend's layers against the CPU backend's (itself checked against float64 finite
 * differences by test_layers): the same weights, inputs and output gradients go to both, and
 * every output, kept tensor, input gradient and parameter gradient must agree, tensor by
 * tensor, elementwise within atol * rms(ref) + rtol * |ref| (rms over the tensor), and the
 * tensor's relative rms error within `rms_tol`.
 *
 * fp32: cuBLAS in pure fp32 (no TF32) and the CPU differ only in summation order and FMA
 * contraction: about 1e-7 relative per operation, over reductions of at most a few hundred
 * terms; atol 1e-4 rms, rtol 1e-4, rms_tol 1e-5. The embedding is bitwise (same additions in
 * the same order).
 *
 * bf16: both see exactly the same bf16 weights and inputs (the CPU reference gets their fp32
 * values). The GPU then rounds every stored activation to bf16 (relative error at most 2^-9 =
 * 0.2% each) where the CPU keeps fp32: a block's forward stores 8 such tensors in a chain, its
 * backward 12 more, so the relative rms error grows to about sqrt(8..20) x 0.1% = 0.3-0.5%
 * (measured: at most 0.62%, SwiGLU's product of two rounded values). That holds while the
 * pre-activations are of the inputs' scale, so the weight matrices are drawn as at a standard
 * initialisation, uniform with variance 1/fan_in: with a fixed +-0.3 a block of C = 256 had
 * attention scores of rms 7.7, which turn the 2^-9 of q and k into score errors of 0.02 and
 * probabilities 2% off, so the CPU's own bf16 path (rounding where the GPU stores) was 5% off
 * in rms in the backward, the GPU alike. Single elements reach many times the rms error (an
 * attention output where one key dominates, a product of two rounded values, a softmax's
 * largest probabilities; a Gaussian's largest of 10^4..10^5 elements is already 4-5 sigma), so
 * the elementwise band sits well above the rms limit. Tolerances: forward atol 6% rms (at 3%
 * an attention output of shape 2 was at 1.09 of its band on the CPU's own bf16 path), rtol 3%,
 * rms_tol 1%; backward atol 6% rms, rtol 6%, rms_tol 2%. On the CPU's bf16 path, which rounds
 * where the GPU stores, the largest error is 0.61 of its band in the forward and 0.59 in the
 * backward, the largest rms error 0.62 of its limit.
 * fp32-accumulated parameter gradients of bf16 products land in the same band.
 *
 * fp16: the same comparison; fp16 keeps 3 more bits than bf16 (2^-12 relative per rounding),
 * so the bf16 bands hold it with room, values near fp16's subnormals (below 6.1e-5: the
 * head's logit gradients of a small vocabulary) included.
 *
 * Also on the GPU: recompute regenerates the kept tensors bitwise, a second backward adds
 * exactly the same gradients again (no atomics), AdamW matches the CPU's (and for 16-bit the
 * weights are the master rounded to nearest even), loss scaling's unscale and non-finite check
 * is the CPU's bit for bit. Skipped (exit 77) without a GPU. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "gpu.h"
#include "half.h"
#include "kernels_cpu.h"
#include "sizes.h"
#include "testutil.h"

struct tol {
    double atol, rtol, rms;
};
static const struct tol FP32_TOL = {1e-4, 1e-4, 1e-5};
static const struct tol BF16_FWD = {0.06, 0.03, 0.01};
static const struct tol BF16_BWD = {0.06, 0.06, 0.02};

/* small models: one with sizes that are multiples of 32, one with none (and more than one
 * 256-position tile for the embedding's scatter-add, and several vocabulary slices); and a
 * Llama (grouped-query attention, llama_layers.c over cuda/llama_kernels.cu); then flash
 * attention (cuda/flash_kernels.cu against kernels_flash_cpu.c, its log-sum-exp a kept
 * tensor): a GPT over several 32-row tiles, the last partial, a grouped-query Llama with a
 * head size of 128 (its kernels ask for more than the default 48 KiB of shared memory), and
 * one with a head size of 24 (16-bit models run on the tensor cores: their 16-wide tiles
 * padded) over three 64-row tiles, the last partial */
#define N_SHAPES 6
static const struct model shapes[N_SHAPES] = {
    {.n_layer = 2, .n_embd = 64, .n_head = 4, .seq_len = 64, .vocab_size = 100, .micro_batch = 2},
    {.n_layer = 3, .n_embd = 48, .n_head = 3, .seq_len = 80, .vocab_size = 75, .micro_batch = 4},
    {.kind = MODEL_KIND_LLAMA, .n_layer = 2, .n_embd = 48, .n_head = 6, .n_kv_head = 2,
     .ffn_hidden = 80, .rope_theta = 10000, .norm_eps = 1e-5, .seq_len = 40, .vocab_size = 75,
     .micro_batch = 3},
    {.n_layer = 2, .n_embd = 48, .n_head = 3, .seq_len = 80, .vocab_size = 75, .micro_batch = 2,
     .attention = MODEL_ATTENTION_FLASH},
    {.kind = MODEL_KIND_LLAMA, .n_layer = 2, .n_embd = 256, .n_head = 2, .n_kv_head = 1,
     .ffn_hidden = 96, .rope_theta = 10000, .norm_eps = 1e-5, .seq_len = 70, .vocab_size = 64,
     .micro_batch = 2, .attention = MODEL_ATTENTION_FLASH},
    {.kind = MODEL_KIND_LLAMA, .n_layer = 2, .n_embd = 96, .n_head = 4, .n_kv_head = 2,
     .ffn_hidden = 64, .rope_theta = 10000, .norm_eps = 1e-5, .seq_len = 150, .vocab_size = 64,
     .micro_batch = 1, .attention = MODEL_ATTENTION_FLASH},
};

static struct backend cpu, gpu;
/* The 16-bit format device_from and host_from convert 2-byte tensors to and from: the model's
 * under test (pair_make, check_adamw set it). */
static enum model_dtype half_dt = MODEL_DTYPE_BF16;

/* ---- one layer on both backends ---- */

struct pair {
    struct model m, m32; /* the model (its dtype), and its fp32 twin for the CPU */
    enum model_layer_kind kind;
    int n[3];
    struct sizes_tensor t[3][SIZES_TENSORS_MAX];   /* the model's dtype */
    struct layer_view c, g;                        /* CPU (host), GPU (device) */
    float *c_out;
    void *g_out;
    int64_t BTC;
};

static int is_float_tensor(const struct sizes_tensor *t)
{
    return strcmp(t->name, "tokens") != 0 && strcmp(t->name, "targets") != 0;
}

/* A device tensor of t's size holding `host` (fp32 values, or int32 ids), converted to t's
 * element type. */
static void *device_from(const struct sizes_tensor *t, const void *host)
{
    void *d = NULL;
    struct err e;
    int64_t bytes = sizes_tensor_bytes(t);
    CU_ASSERT_EQUAL_FATAL(gpu.ops->alloc(&gpu, bytes, &d, &e), ERR_OK);
    CU_ASSERT_EQUAL_FATAL(gpu.ops->zero(&gpu, d, bytes, &e), ERR_OK);
    if (host == NULL)
        return d;
    if (t->elem_bytes == 2) {
        uint16_t *h = malloc(sizeof(uint16_t) * (size_t)t->elems);
        for (int64_t i = 0; i < t->elems; i++)
            h[i] = half_from_float(half_dt, ((const float *)host)[i]);
        CU_ASSERT_EQUAL_FATAL(gpu.ops->upload(&gpu, d, h, 2 * t->elems, &e), ERR_OK);
        free(h);
    } else {
        CU_ASSERT_EQUAL_FATAL(gpu.ops->upload(&gpu, d, host, 4 * t->elems, &e), ERR_OK);
    }
    return d;
}

/* The device tensor's values as fp32 (caller frees). */
static float *host_from(const void *d, int64_t elems, int elem_bytes)
{
    struct err e;
    float *out = malloc(sizeof(float) * (size_t)elems);
    if (elem_bytes == 2) {
        uint16_t *h = malloc(sizeof(uint16_t) * (size_t)elems);
        CU_ASSERT_EQUAL_FATAL(gpu.ops->download(&gpu, h, d, 2 * elems, &e), ERR_OK);
        for (int64_t i = 0; i < elems; i++)
            out[i] = half_to_float(half_dt, h[i]);
        free(h);
    } else {
        CU_ASSERT_EQUAL_FATAL(gpu.ops->download(&gpu, out, d, 4 * elems, &e), ERR_OK);
    }
    return out;
}

/* Random values, rounded to the 16-bit format of a 16-bit model (`half`) so that both sides
 * see the same. */
static void fill(float *x, int64_t n, double lo, double hi, double base, int half,
                 struct test_rng *rng)
{
    for (int64_t i = 0; i < n; i++) {
        float v = (float)(base + test_rng_double(rng, lo, hi));
        x[i] = half ? half_to_float(half_dt, half_from_float(half_dt, v)) : v;
    }
}

static void pair_make(struct pair *p, const struct model *shape, enum model_dtype dt,
                      enum model_layer_kind kind, struct test_rng *rng)
{
    memset(p, 0, sizeof *p);
    p->m = *shape;
    p->m.dtype = dt;
    p->m32 = *shape;
    p->m32.dtype = MODEL_DTYPE_FP32;
    p->kind = kind;
    int layer = kind == MODEL_LAYER_EMBED ? 0 : kind == MODEL_LAYER_BLOCK ? 1 : p->m.n_layer + 1;
    int bf16 = model_dtype_16bit(dt); /* any 16-bit format */
    if (bf16)
        half_dt = dt;
    struct layer_view *c = &p->c, *g = &p->g;
    c->model = &p->m32;
    g->model = &p->m;
    c->kind = g->kind = kind;
    c->layer = g->layer = layer;
    for (int cls = 0; cls < 3; cls++)
        p->n[cls] = sizes_layer_tensors(&p->m, kind, (enum sizes_class)cls, p->t[cls]);
    for (int k = 0; k < p->n[SIZES_PARAMS]; k++) {
        struct sizes_tensor w = p->t[SIZES_PARAMS][k];
        float *h = calloc((size_t)w.elems, sizeof(float));
        /* gains 1 +- 0.3; embeddings and biases +- 0.3; matrices of variance 1/fan_in (see
         * the top: pre-activations of the inputs' scale) */
        int gain = strncmp(w.name, "ln", 2) == 0 && strstr(w.name, "_w") != NULL;
        int matrix = !gain && strstr(w.name, "_w") != NULL;
        double fan_in = strcmp(w.name, "fcproj_w") == 0 ? (double)w.elems / shape->n_embd
                                                        : (double)shape->n_embd;
        double a = matrix ? sqrt(3.0 / fan_in) : 0.3;
        fill(h, w.elems, -a, a, gain ? 1.0 : 0.0, bf16, rng);
        c->params[k] = h;
        c->grads[k] = calloc((size_t)w.elems, sizeof(float));
        w.elem_bytes = sizes_weight_elem_bytes(dt);
        g->params[k] = device_from(&w, h);
        w.elem_bytes = 4;
        g->grads[k] = device_from(&w, NULL);
    }
    int n_ckpt = sizes_ckpt_tensor_count(kind);
    for (int k = 0; k < p->n[SIZES_KEPT]; k++) {
        const struct sizes_tensor *t = &p->t[SIZES_KEPT][k];
        float *h = calloc((size_t)t->elems, 4);
        if (k < n_ckpt) {
            if (is_float_tensor(t))
                fill(h, t->elems, -1, 1, 0, bf16, rng);
            else /* ids, with repeats */
                for (int64_t i = 0; i < t->elems; i++)
                    ((int32_t *)h)[i] = i % 5 == 0 ? 3 : (int32_t)test_rng_int(rng, 0, p->m.vocab_size - 1);
        }
        c->kept[k] = h;
        g->kept[k] = device_from(t, k < n_ckpt ? h : NULL);
    }
    p->BTC = (int64_t)p->m.micro_batch * p->m.seq_len * p->m.n_embd;
    for (int k = 0; k < p->n[SIZES_WORKSPACE]; k++) {
        const struct sizes_tensor *t = &p->t[SIZES_WORKSPACE][k];
        float *h = calloc((size_t)t->elems, 4);
        int dout = (kind == MODEL_LAYER_EMBED && k == EMBED_DOUT) ||
                   (kind == MODEL_LAYER_BLOCK && k == BLOCK_DOUT);
        if (dout)
            fill(h, t->elems, -1, 1, 0, bf16, rng);
        c->ws[k] = h;
        g->ws[k] = device_from(t, dout ? h : NULL);
    }
    p->c_out = calloc((size_t)p->BTC, sizeof(float));
    struct sizes_tensor out = {"out", p->BTC, sizes_act_elem_bytes(dt)};
    p->g_out = device_from(&out, NULL);
}

static void pair_free(struct pair *p)
{
    for (int k = 0; k < p->n[SIZES_PARAMS]; k++) {
        free(p->c.params[k]);
        free(p->c.grads[k]);
        gpu.ops->release(&gpu, p->g.params[k]);
        gpu.ops->release(&gpu, p->g.grads[k]);
    }
    for (int k = 0; k < p->n[SIZES_KEPT]; k++) {
        free(p->c.kept[k]);
        gpu.ops->release(&gpu, p->g.kept[k]);
    }
    for (int k = 0; k < p->n[SIZES_WORKSPACE]; k++) {
        free(p->c.ws[k]);
        gpu.ops->release(&gpu, p->g.ws[k]);
    }
    free(p->c_out);
    gpu.ops->release(&gpu, p->g_out);
}

/* ---- comparison ---- */

static int compare(const char *what, const char *name, const float *got, const float *ref,
                   int64_t n, struct tol tol)
{
    double sq = 0, err_sq = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        sq += (double)ref[i] * ref[i];
        err_sq += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
    }
    double rms = sqrt(sq / (double)n), rel_rms = sq > 0 ? sqrt(err_sq / sq) : sqrt(err_sq);
    int64_t bad = -1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]), lim = tol.atol * rms + tol.rtol * fabs(ref[i]);
        if (!(d <= lim) && bad < 0)
            bad = i;
        if (d > worst)
            worst = d;
    }
    int ok = bad < 0 && rel_rms <= tol.rms;
    if (!ok) {
        fprintf(stderr, "\n%s %s: relative rms error %.3g (limit %.3g), largest error %.3g, "
                        "rms of the reference %.3g",
                what, name, rel_rms, tol.rms, worst, rms);
        if (bad >= 0)
            fprintf(stderr, "; first element out of tolerance [%lld]: got %.9g, reference %.9g",
                    (long long)bad, got[bad], ref[bad]);
        fprintf(stderr, "\n");
    }
    return ok;
}

static int compare_device(const char *what, const char *name, const void *d, int elem_bytes,
                          const float *ref, int64_t n, struct tol tol)
{
    float *got = host_from(d, n, elem_bytes);
    int ok = compare(what, name, got, ref, n, tol);
    free(got);
    return ok;
}

/* ---- the layers ---- */

static void check_layer(int shape, enum model_dtype dt, enum model_layer_kind kind)
{
    struct test_rng rng = {100 + 10 * (uint64_t)shape + (uint64_t)kind};
    struct pair p;
    struct err e;
    pair_make(&p, &shapes[shape], dt, kind, &rng);
    int bf16 = model_dtype_16bit(dt), e_act = sizes_act_elem_bytes(dt);
    struct tol fwd = bf16 ? BF16_FWD : FP32_TOL, bwd = bf16 ? BF16_BWD : FP32_TOL;
    char what[128];
    snprintf(what, sizeof what, "%s shape %d %s", model_dtype_name(dt), shape,
             kind == MODEL_LAYER_EMBED ? "embed" : kind == MODEL_LAYER_BLOCK ? "block" : "head");
    const struct backend_layer_ops *co = &backend_layers(&cpu, &p.m)[kind],
                                   *go = &backend_layers(&gpu, &p.m)[kind];
    int has_out = kind != MODEL_LAYER_HEAD;

    /* forward */
    CU_ASSERT_EQUAL_FATAL(co->forward(&cpu, &p.c, has_out ? p.c_out : NULL, &e), ERR_OK);
    CU_ASSERT_EQUAL_FATAL(go->forward(&gpu, &p.g, has_out ? p.g_out : NULL, &e), ERR_OK);
    CU_ASSERT_EQUAL_FATAL(gpu.ops->sync(&gpu, &e), ERR_OK);
    int ok = 1;
    if (has_out) {
        if (kind == MODEL_LAYER_EMBED && !bf16) {
            float *got = host_from(p.g_out, p.BTC, 4);
            ok &= memcmp(got, p.c_out, sizeof(float) * (size_t)p.BTC) == 0;
            free(got);
        } else {
            ok &= compare_device(what, "out", p.g_out, e_act, p.c_out, p.BTC, fwd);
        }
    }
    for (int k = sizes_ckpt_tensor_count(kind); k < p.n[SIZES_KEPT]; k++) {
        const struct sizes_tensor *t = &p.t[SIZES_KEPT][k];
        ok &= compare_device(what, t->name, p.g.kept[k], t->elem_bytes, p.c.kept[k], t->elems,
                             fwd);
    }
    if (kind == MODEL_LAYER_HEAD)
        ok &= compare_device(what, "losses", p.g.ws[HEAD_LOSSES], 4, p.c.ws[HEAD_LOSSES],
                             p.t[SIZES_WORKSPACE][HEAD_LOSSES].elems, fwd);
    CU_ASSERT(ok);

    /* backward */
    float scale = 1.0f / (float)(p.m.micro_batch * p.m.seq_len);
    CU_ASSERT_EQUAL_FATAL(co->backward(&cpu, &p.c, scale, &e), ERR_OK);
    CU_ASSERT_EQUAL_FATAL(go->backward(&gpu, &p.g, scale, &e), ERR_OK);
    CU_ASSERT_EQUAL_FATAL(gpu.ops->sync(&gpu, &e), ERR_OK);
    ok = 1;
    if (kind != MODEL_LAYER_EMBED) {
        int k = kind == MODEL_LAYER_HEAD ? HEAD_DINP : BLOCK_DINP;
        ok &= compare_device(what, "dinp", p.g.ws[k], e_act, p.c.ws[k], p.BTC, bwd);
    }
    for (int k = 0; k < p.n[SIZES_PARAMS]; k++) {
        const struct sizes_tensor *t = &p.t[SIZES_PARAMS][k];
        char name[64];
        snprintf(name, sizeof name, "d%s", t->name);
        if (kind == MODEL_LAYER_EMBED && !bf16) { /* the same sums in the same order */
            float *got = host_from(p.g.grads[k], t->elems, 4);
            int same = memcmp(got, p.c.grads[k], sizeof(float) * (size_t)t->elems) == 0;
            if (!same)
                fprintf(stderr, "\n%s %s: not bitwise the CPU's\n", what, name);
            ok &= same;
            free(got);
        } else {
            ok &= compare_device(what, name, p.g.grads[k], 4, p.c.grads[k], t->elems, bwd);
        }
    }
    CU_ASSERT(ok);
    pair_free(&p);
}

static void test_fp32_layers(void)
{
    for (int s = 0; s < N_SHAPES; s++)
        for (int k = MODEL_LAYER_EMBED; k <= MODEL_LAYER_HEAD; k++)
            check_layer(s, MODEL_DTYPE_FP32, (enum model_layer_kind)k);
}

static void test_16bit_layers(void)
{
    for (int s = 0; s < N_SHAPES; s++)
        for (int k = MODEL_LAYER_EMBED; k <= MODEL_LAYER_HEAD; k++) {
            check_layer(s, MODEL_DTYPE_BF16, (enum model_layer_kind)k);
            check_layer(s, MODEL_DTYPE_FP16, (enum model_layer_kind)k);
        }
}

/* ---- properties on the GPU alone ---- */

static int device_equal(const void *a, const void *b, int64_t bytes)
{
    struct err e;
    char *x = malloc((size_t)bytes), *y = malloc((size_t)bytes);
    gpu.ops->download(&gpu, x, a, bytes, &e);
    gpu.ops->download(&gpu, y, b, bytes, &e);
    int same = memcmp(x, y, (size_t)bytes) == 0;
    free(x);
    free(y);
    return same;
}

/* recompute (whole, and every partial option) rebuilds the kept tensors it regenerates bit for
 * bit; a second backward adds exactly the same gradients (2 x bitwise) */
static void check_repeatable(int shape, enum model_dtype dt, enum model_layer_kind kind)
{
    struct test_rng rng = {7};
    struct pair p;
    struct err e;
    pair_make(&p, &shapes[shape], dt, kind, &rng);
    const struct backend_layer_ops *go = &backend_layers(&gpu, &p.m)[kind];
    int has_out = kind != MODEL_LAYER_HEAD;
    CU_ASSERT_EQUAL_FATAL(go->forward(&gpu, &p.g, has_out ? p.g_out : NULL, &e), ERR_OK);
    /* the whole layer, then each partial option the layer kind has (backend.h) */
    struct sizes_option opts[SIZES_OPTIONS_MAX + 1];
    int n_opts = sizes_recompute_options(&p.m, kind, opts + 1);
    opts[0].name = "whole";
    opts[0].regen = kind == MODEL_LAYER_EMBED ? 0 : sizes_full_regen(&p.m, kind);
    int ok = 1;
    for (int o = 0; o <= n_opts; o++) {
        p.g.regen = opts[o].regen;
        for (int k = 0; k < p.n[SIZES_KEPT]; k++) {
            const struct sizes_tensor *t = &p.t[SIZES_KEPT][k];
            if (!(opts[o].regen >> k & 1))
                continue;
            struct sizes_tensor copy_t = *t;
            void *saved = device_from(&copy_t, NULL);
            gpu.ops->copy(&gpu, saved, p.g.kept[k], sizes_tensor_bytes(t), &e);
            gpu.ops->zero(&gpu, p.g.kept[k], sizes_tensor_bytes(t), &e);
            CU_ASSERT_EQUAL_FATAL(go->recompute(&gpu, &p.g, &e), ERR_OK);
            int same = device_equal(saved, p.g.kept[k], t->elems * t->elem_bytes);
            if (!same)
                fprintf(stderr, "\n%s: recompute (%s) differs in %s\n", model_dtype_name(dt),
                        opts[o].name, t->name);
            ok &= same;
            gpu.ops->release(&gpu, saved);
        }
    }
    p.g.regen = opts[0].regen;
    CU_ASSERT(ok);
    /* backward twice from the same dout. Block and head gradients are each summed in full
     * and then added once (GEMM epilogues, column sums), so they exactly double; the
     * embedding adds position by position, so instead a second run from zero repeats it */
    int dout = kind == MODEL_LAYER_EMBED ? EMBED_DOUT : BLOCK_DOUT;
    struct sizes_tensor dt_t = p.t[SIZES_WORKSPACE][dout];
    void *dout_copy = NULL;
    if (kind != MODEL_LAYER_HEAD) {
        dout_copy = device_from(&dt_t, NULL);
        gpu.ops->copy(&gpu, dout_copy, p.g.ws[dout], sizes_tensor_bytes(&dt_t), &e);
    }
    float scale = 0.01f, *once[SIZES_TENSORS_MAX];
    CU_ASSERT_EQUAL_FATAL(go->backward(&gpu, &p.g, scale, &e), ERR_OK);
    for (int k = 0; k < p.n[SIZES_PARAMS]; k++) {
        once[k] = host_from(p.g.grads[k], p.t[SIZES_PARAMS][k].elems, 4);
        if (kind == MODEL_LAYER_EMBED)
            gpu.ops->zero(&gpu, p.g.grads[k], 4 * p.t[SIZES_PARAMS][k].elems, &e);
    }
    if (kind == MODEL_LAYER_HEAD) { /* the head's backward consumed its probabilities */
        CU_ASSERT_EQUAL_FATAL(go->recompute(&gpu, &p.g, &e), ERR_OK);
    } else {
        gpu.ops->copy(&gpu, p.g.ws[dout], dout_copy, sizes_tensor_bytes(&dt_t), &e);
    }
    CU_ASSERT_EQUAL_FATAL(go->backward(&gpu, &p.g, scale, &e), ERR_OK);
    ok = 1;
    for (int k = 0; k < p.n[SIZES_PARAMS]; k++) {
        int64_t n = p.t[SIZES_PARAMS][k].elems;
        float *twice = host_from(p.g.grads[k], n, 4), f = kind == MODEL_LAYER_EMBED ? 1 : 2;
        int same = 1;
        for (int64_t i = 0; i < n && same; i++)
            same = twice[i] == f * once[k][i];
        if (!same)
            fprintf(stderr, "\n%s: the second backward's gradient of %s is not %s\n",
                    model_dtype_name(dt), p.t[SIZES_PARAMS][k].name,
                    f == 1 ? "the first's bits" : "exactly twice the first");
        ok &= same;
        free(twice);
        free(once[k]);
    }
    CU_ASSERT(ok);
    if (dout_copy)
        gpu.ops->release(&gpu, dout_copy);
    pair_free(&p);
}

static void test_repeatable(void)
{
    for (int shape = 1; shape < N_SHAPES; shape++) /* GPTs and Llamas, both attentions */
        for (int d = MODEL_DTYPE_FP32; d <= MODEL_DTYPE_FP16; d++)
            for (int k = MODEL_LAYER_EMBED; k <= MODEL_LAYER_HEAD; k++)
                check_repeatable(shape, (enum model_dtype)d, (enum model_layer_kind)k);
}

static void check_adamw(enum model_dtype dt)
{
    enum { N = 100003 };
    struct test_rng rng = {9};
    struct err e;
    float *w = malloc(4 * N), *g = malloc(4 * N), *m = calloc(N, 4), *v = calloc(N, 4);
    fill(w, N, -1, 1, 0, 0, &rng);
    fill(g, N, -0.1, 0.1, 0, 0, &rng);
    struct sizes_tensor t32 = {"w", N, 4}, t16 = {"w", N, 2};
    if (model_dtype_16bit(dt))
        half_dt = dt;
    float *dw = device_from(&t32, w), *dg = device_from(&t32, g), *dm = device_from(&t32, m),
          *dv = device_from(&t32, v);
    void *dh = model_dtype_16bit(dt) ? device_from(&t16, w) : dw;
    struct adamw_params hp = adamw_params_gpt(1e-3f);
    for (int t = 1; t <= 3; t++) {
        adamw_update(w, g, m, v, N, hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, t);
        CU_ASSERT_EQUAL_FATAL(gpu.ops->adamw(&gpu, dh, dw, dg, dm, dv, N, dt, &hp, t, 1, &e),
                              ERR_OK);
    }
    CU_ASSERT(compare_device("adamw", "master", dw, 4, w, N, FP32_TOL));
    CU_ASSERT(compare_device("adamw", "m", dm, 4, m, N, FP32_TOL));
    CU_ASSERT(compare_device("adamw", "v", dv, 4, v, N, FP32_TOL));
    if (model_dtype_16bit(dt)) {
        float *master = host_from(dw, N, 4), *half = host_from(dh, N, 2);
        int ok = 1;
        for (int i = 0; i < N && ok; i++)
            ok = half[i] == half_to_float(dt, half_from_float(dt, master[i]));
        CU_ASSERT(ok);
        free(master);
        free(half);
        gpu.ops->release(&gpu, dh);
    }
    gpu.ops->release(&gpu, dw);
    gpu.ops->release(&gpu, dg);
    gpu.ops->release(&gpu, dm);
    gpu.ops->release(&gpu, dv);
    free(w);
    free(g);
    free(m);
    free(v);
}

static void test_adamw(void)
{
    check_adamw(MODEL_DTYPE_FP32);
    check_adamw(MODEL_DTYPE_BF16);
    check_adamw(MODEL_DTYPE_FP16);
}

/* Loss scaling's pass over the gradients: the CPU's bits (x * mul in fp32; a NaN stays a NaN),
 * the same flag;
 * mul 1 changes nothing; a clean vector sets no flag. */
static void test_unscale(void)
{
    enum { N = 70001 };
    struct test_rng rng = {11};
    struct err e;
    float *x = malloc(4 * N), *y = malloc(4 * N);
    fill(x, N, -3e4, 3e4, 0, 0, &rng);
    struct sizes_tensor t = {"g", N, 4};
    for (int pass = 0; pass < 3; pass++) {
        float mul = pass == 1 ? 1.0f : 0x1p-16f;
        if (pass == 2) {
            x[N / 2] = INFINITY;
            x[N - 1] = NAN;
        }
        float *d = device_from(&t, x);
        int found_cpu = 0, found_gpu = 0;
        memcpy(y, x, 4 * N);
        CU_ASSERT_EQUAL(cpu.ops->unscale(&cpu, y, N, mul, &found_cpu, &e), ERR_OK);
        CU_ASSERT_EQUAL(gpu.ops->unscale(&gpu, d, N, mul, &found_gpu, &e), ERR_OK);
        float *got = host_from(d, N, 4);
        int same = 1; /* NaNs alike, whatever their payloads */
        for (int i = 0; i < N && same; i++)
            same = isnan(y[i]) ? isnan(got[i]) : memcmp(&got[i], &y[i], 4) == 0;
        CU_ASSERT(same);
        CU_ASSERT_EQUAL(found_gpu, pass == 2);
        CU_ASSERT_EQUAL(found_cpu, pass == 2);
        free(got);
        gpu.ops->release(&gpu, d);
    }
    free(x);
    free(y);
}

/* the backend refuses what it cannot do, and says why */
static void test_refusals(void)
{
    struct backend be;
    struct err e;
    CU_ASSERT_EQUAL(backend_cuda_init(&be, 4096, &e), ERR_INPUT);
    CU_ASSERT(strstr(e.msg, "cuda:4096") != NULL);
    void *p = NULL;
    /* far beyond any GPU's memory: ERR_NOFIT with the numbers, not a crash */
    CU_ASSERT_EQUAL(gpu.ops->alloc(&gpu, (int64_t)1 << 50, &p, &e), ERR_NOFIT);
    CU_ASSERT(strstr(e.msg, "out of device memory") != NULL);
    CU_ASSERT_PTR_NULL(p);
    /* a regen set no option has */
    struct layer_view v = {.model = &shapes[0], .kind = MODEL_LAYER_BLOCK, .layer = 1,
                           .regen = REGEN_BIT(BLOCK_LN2)};
    CU_ASSERT_EQUAL(gpu.ops->layer[MODEL_LAYER_BLOCK].recompute(&gpu, &v, &e), ERR_FAIL);
    CU_ASSERT(strstr(e.msg, "cannot regenerate") != NULL);
}

int main(void)
{
    gpu_require("test_cuda_layers");
    struct err e;
    if (backend_cpu_init(&cpu, 2, &e) || backend_cuda_init(&gpu, 0, &e)) {
        fprintf(stderr, "test_cuda_layers: %s\n", e.msg);
        return 1;
    }
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("cuda layers", NULL, NULL);
    CU_add_test(s, "fp32 layers against the CPU's (embedding bitwise)", test_fp32_layers);
    CU_add_test(s, "bf16 and fp16 layers against the CPU's on the same 16-bit inputs",
                test_16bit_layers);
    CU_add_test(s, "recompute is bitwise, a second backward adds the same bits",
                test_repeatable);
    CU_add_test(s, "AdamW against the CPU's; 16-bit weights are the rounded master",
                test_adamw);
    CU_add_test(s, "loss scaling's unscale and check: the CPU's bits and flag", test_unscale);
    CU_add_test(s, "bad device and out-of-memory are reported, not crashed on", test_refusals);
    int rc = test_main();
    gpu.ops->free(&gpu);
    return rc;
}
