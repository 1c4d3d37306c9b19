/* Flash attention ("attention": "flash", both model kinds): the CPU kernels against the
 * materialised attention kernels (GPT's multi-head, Llama's grouped-query and multi-query),
 * forward and backward, across tile edges and thread counts; the rows' log-sum-exp against
 * float64; the size tables (activations linear in the sequence length, no "attn" option) and
 * the estimate's FLOPs; model files; and `ballast train` on three ranks with every recompute
 * option of a flash model bitwise equal to keeping everything, each stage's measured peak
 * within 2% of its plan (train_run_ok), and the loss that of materialised attention; a plan
 * asking a flash block for "attn" refused.
 *
 * Tolerances (atol + rtol |ref|): the two kernels sum the same products in different orders
 * (tiles and online rescaling against whole rows), and GPT's materialised softmax uses an
 * approximate exp (about 2 ulp): out and dqkv 2e-6 + 1e-4 |ref|, lse 1e-5 + 1e-6 |ref|. */
#include <CUnit/CUnit.h>
#include <cblas.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "estimate.h"
#include "kernels_cpu.h"
#include "kernels_flash_cpu.h"
#include "kernels_llama_cpu.h"
#include "layout.h"
#include "model_ops.h"
#include "testutil.h"
#include "traintest.h"

static struct test_rng rng = {4242};

static float *filled(int64_t n, double lo, double hi)
{
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)test_rng_double(&rng, lo, hi);
    return x;
}

/* Every element within atol + rtol |ref|; else the count and the worst one, printed. */
static int all_close(const float *got, const float *ref, int64_t n, double atol, double rtol,
                     const char *what)
{
    int64_t bad = 0, worst = 0;
    double worst_excess = 0;
    for (int64_t i = 0; i < n; i++) {
        double excess = fabs((double)got[i] - ref[i]) - (atol + rtol * fabs(ref[i]));
        bad += excess > 0;
        if (excess > worst_excess)
            worst_excess = excess, worst = i;
    }
    if (bad > 0)
        fprintf(stderr, "\n%s: %lld of %lld off, worst [%lld] %.9g against %.9g\n", what,
                (long long)bad, (long long)n, (long long)worst, got[worst], ref[worst]);
    return bad == 0;
}

/* log sum_j<=t exp(q_t k_j / sqrt(hs)) in float64 */
static double lse_ref(const float *qkv, int b, int h, int t, int T, int NH, int NKV, int hs)
{
    int W = (NH + 2 * NKV) * hs, kv = h / (NH / NKV);
    const float *q = qkv + ((int64_t)b * T + t) * W + h * hs;
    double s[1024], mx = -1e300, sum = 0;
    for (int j = 0; j <= t; j++) {
        const float *k = qkv + ((int64_t)b * T + j) * W + NH * hs + kv * hs;
        s[j] = 0;
        for (int i = 0; i < hs; i++)
            s[j] += (double)q[i] * k[i];
        s[j] /= sqrt(hs);
        mx = s[j] > mx ? s[j] : mx;
    }
    for (int j = 0; j <= t; j++)
        sum += exp(s[j] - mx);
    return mx + log(sum);
}

/* Flash against the materialised kernel of the same shape: GPT's attention_forward/backward
 * when NKV == NH (gpt != 0), Llama's grouped-query ones otherwise. */
static void check_kernels(int B, int T, int NH, int NKV, int hs, int gpt)
{
    int W = (NH + 2 * NKV) * hs, C = NH * hs;
    int64_t nqkv = (int64_t)B * T * W, n = (int64_t)B * T * C, natt = (int64_t)B * NH * T * T;
    float *qkv = filled(nqkv, -2, 2), *g = filled(n, -1, 1);
    float *out = malloc(sizeof(float) * (size_t)n), *ref = malloc(sizeof(float) * (size_t)n);
    float *lse = malloc(sizeof(float) * (size_t)B * NH * T);
    float *dsum = malloc(sizeof(float) * (size_t)B * NH * T);
    float *att = malloc(sizeof(float) * (size_t)natt), *datt = malloc(sizeof(float) * (size_t)natt);
    float *dq = filled(nqkv, -9, 9), *dref = malloc(sizeof(float) * (size_t)nqkv);
    flash_attention_forward(out, lse, qkv, B, T, NH, NKV, hs);
    if (gpt) {
        attention_forward(ref, att, qkv, B, T, C, NH, NULL);
        attention_backward(dref, datt, g, qkv, att, B, T, C, NH, NULL);
    } else {
        gqa_attention_forward(ref, att, qkv, B, T, NH, NKV, hs, NULL);
        gqa_attention_backward(dref, datt, g, qkv, att, B, T, NH, NKV, hs, NULL);
    }
    char what[96];
    snprintf(what, sizeof what, "out (T %d, %d/%d heads, %s)", T, NH, NKV, gpt ? "gpt" : "gqa");
    CU_ASSERT(all_close(out, ref, n, 2e-6, 1e-4, what));
    int lse_ok = 1;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++)
                lse_ok &= test_close(lse[((int64_t)b * NH + h) * T + t],
                                     lse_ref(qkv, b, h, t, T, NH, NKV, hs), 1e-5, 1e-6);
    CU_ASSERT(lse_ok);
    /* dqkv is overwritten (dq started as garbage) */
    flash_attention_backward(dq, dsum, g, qkv, out, lse, B, T, NH, NKV, hs);
    snprintf(what, sizeof what, "dqkv (T %d, %d/%d heads, %s)", T, NH, NKV, gpt ? "gpt" : "gqa");
    CU_ASSERT(all_close(dq, dref, nqkv, 2e-6, 1e-4, what));
    free(qkv), free(g), free(out), free(ref), free(lse), free(dsum), free(att), free(datt);
    free(dq), free(dref);
}

static void test_kernels(void)
{
    check_kernels(2, 7, 4, 4, 8, 1);    /* one partial tile, GPT's layout */
    check_kernels(2, 150, 4, 4, 16, 1); /* three tiles, the last partial */
    check_kernels(1, 128, 2, 2, 32, 1); /* two whole tiles */
    check_kernels(2, 100, 4, 4, 8, 0);  /* multi-head through the grouped-query kernel */
    check_kernels(2, 100, 4, 2, 8, 0);  /* grouped */
    check_kernels(2, 100, 4, 1, 8, 0);  /* multi-query */
}

/* One task per output: the same bits on 1 and 3 threads, and a second forward (the one a
 * recomputed block runs) repeats the first. */
static void test_threads_bitwise(void)
{
    enum { B = 2, T = 150, NH = 4, NKV = 2, HS = 8, W = (NH + 2 * NKV) * HS, C = NH * HS };
    float *qkv = filled(B * T * W, -2, 2), *g = filled(B * T * C, -1, 1);
    static float out[2][B * T * C], lse[2][B * NH * T], dsum[B * NH * T], dq[2][B * T * W];
    int saved = omp_get_max_threads();
    for (int r = 0; r < 2; r++) {
        omp_set_num_threads(r == 0 ? 1 : 3);
        flash_attention_forward(out[r], lse[r], qkv, B, T, NH, NKV, HS);
        flash_attention_backward(dq[r], dsum, g, qkv, out[r], lse[r], B, T, NH, NKV, HS);
    }
    omp_set_num_threads(saved);
    CU_ASSERT(memcmp(out[0], out[1], sizeof out[0]) == 0);
    CU_ASSERT(memcmp(lse[0], lse[1], sizeof lse[0]) == 0);
    CU_ASSERT(memcmp(dq[0], dq[1], sizeof dq[0]) == 0);
    free(qkv), free(g);
}

/* ---- sizes, options, estimate ---- */

static struct model tiny(enum model_kind kind, int T, enum model_attention a)
{
    struct model m = {.kind = kind, .n_layer = 2, .n_embd = 64, .n_head = 4, .seq_len = T,
                      .vocab_size = 256, .micro_batch = 2, .dtype = MODEL_DTYPE_FP32,
                      .attention = a};
    if (kind == MODEL_KIND_LLAMA) {
        m.n_kv_head = 2;
        m.ffn_hidden = 172;
        m.rope_theta = 10000;
        m.norm_eps = 1e-5;
    }
    return m;
}

static int64_t aligned(int64_t b)
{
    return (b + SIZES_ALIGN - 1) / SIZES_ALIGN * SIZES_ALIGN;
}

static void check_sizes(enum model_kind kind)
{
    struct model mat = tiny(kind, 256, MODEL_ATTENTION_MATERIALIZED),
                 fl = tiny(kind, 256, MODEL_ATTENTION_FLASH);
    int64_t B = 2, T = 256, NH = 4;
    struct layer_sizes a, f;
    sizes_layer(&mat, 1, &a);
    sizes_layer(&fl, 1, &f);
    /* the probabilities (B,NH,T,T) become the fp32 log-sum-exp (B,NH,T), kept and in the
     * workspace alike; nothing else changes */
    CU_ASSERT_EQUAL(a.act_bytes - f.act_bytes, aligned(B * NH * T * T * 4) - aligned(B * NH * T * 4));
    CU_ASSERT_EQUAL(a.workspace_bytes - f.workspace_bytes,
                    aligned(B * NH * T * T * 4) - aligned(B * NH * T * 4));
    CU_ASSERT_EQUAL(a.state_bytes, f.state_bytes);
    CU_ASSERT_EQUAL(a.ckpt_bytes, f.ckpt_bytes);
    /* linear in T: doubling the sequence doubles a flash block's kept bytes (these sizes are
     * whole cache lines), while the materialised one's probabilities grow fourfold */
    struct model fl2 = tiny(kind, 512, MODEL_ATTENTION_FLASH),
                 mat2 = tiny(kind, 512, MODEL_ATTENTION_MATERIALIZED);
    struct layer_sizes f2, a2;
    sizes_layer(&fl2, 1, &f2);
    sizes_layer(&mat2, 1, &a2);
    CU_ASSERT_EQUAL(f2.act_bytes, 2 * f.act_bytes);
    CU_ASSERT_EQUAL(a2.act_bytes - 2 * a.act_bytes, 2 * B * NH * T * T * 4);
    /* the menu: "mlp" alone (no probabilities to recompute); the full recompute regenerates
     * the log-sum-exp with the rest */
    struct sizes_option o[SIZES_OPTIONS_MAX];
    int n = sizes_recompute_options(&fl, MODEL_LAYER_BLOCK, o);
    CU_ASSERT_EQUAL(n, 1);
    CU_ASSERT(n >= 1 && strcmp(o[0].name, "mlp") == 0);
    CU_ASSERT_EQUAL(sizes_recompute_options(&mat, MODEL_LAYER_BLOCK, o), 3);
    uint32_t regen;
    CU_ASSERT(!sizes_find_option(&fl, MODEL_LAYER_BLOCK, "attn", &regen));
    CU_ASSERT(!sizes_find_option(&fl, MODEL_LAYER_BLOCK, "attn+mlp", &regen));
    /* the runtime's layout carves the same bytes */
    struct stage_layout sl;
    struct err e = {0};
    CU_ASSERT_EQUAL_FATAL(layout_init(&sl, &fl, 0, fl.n_layer + 1, NULL, 1, &e), ERR_OK);
    int64_t kept = 0;
    for (int l = 0; l <= fl.n_layer + 1; l++) {
        struct layer_sizes s;
        sizes_layer(&fl, l, &s);
        kept += s.act_bytes;
    }
    CU_ASSERT_EQUAL(sl.slot_bytes, kept);
    CU_ASSERT_EQUAL(sl.workspace_bytes, f.workspace_bytes);
    layout_free(&sl);
}

static void test_sizes(void)
{
    check_sizes(MODEL_KIND_GPT);
    check_sizes(MODEL_KIND_LLAMA);
}

/* The backward recomputes the scores: one more q k^T than the materialised backward,
 * 2 B NH T^2 hs FLOPs, plus the exponentials again; the forward the same GEMM FLOPs. */
static void test_flops(void)
{
    for (int kind = 0; kind < 2; kind++) {
        enum model_kind k = kind ? MODEL_KIND_LLAMA : MODEL_KIND_GPT;
        struct model mat = tiny(k, 256, MODEL_ATTENTION_MATERIALIZED),
                     fl = tiny(k, 256, MODEL_ATTENTION_FLASH);
        double fm, bm, ff, bf, BNHTT = 2.0 * 4 * 256 * 256, hs = 16;
        estimate_layer_flops(&mat, 1, &fm, &bm);
        estimate_layer_flops(&fl, 1, &ff, &bf);
        CU_ASSERT(fabs(ff - fm) < 1e-9 * fm);
        /* materialised backward: softmax 10 per element; flash: exp 5 + d s 3 + the GEMM */
        CU_ASSERT(fabs((bf - bm) - (2 * BNHTT * hs + 5 * BNHTT + 3 * BNHTT - 10 * BNHTT)) <
                  1e-9 * bm);
    }
}

/* ---- model files ---- */

static void test_model_files(void)
{
    struct model m;
    struct err e = {0};
    CU_ASSERT_EQUAL(model_load(BALLAST_SOURCE_DIR "/configs/models/gpt-tiny-flash.json", &m, &e), ERR_OK);
    CU_ASSERT_EQUAL(m.attention, MODEL_ATTENTION_FLASH);
    CU_ASSERT_EQUAL(model_load(BALLAST_SOURCE_DIR "/configs/models/llama-tiny-flash.json", &m, &e), ERR_OK);
    CU_ASSERT(m.attention == MODEL_ATTENTION_FLASH && m.n_kv_head == 2);
    /* written back and read again: the same model; the default is not written */
    cJSON *j = model_to_json(&m);
    struct model back;
    CU_ASSERT_EQUAL(model_from_json(j, "x", "", &back, &e), ERR_OK);
    CU_ASSERT(model_equal(&m, &back));
    cJSON_Delete(j);
    CU_ASSERT_EQUAL(model_load(BALLAST_SOURCE_DIR "/configs/models/gpt-tiny.json", &m, &e), ERR_OK);
    CU_ASSERT_EQUAL(m.attention, MODEL_ATTENTION_MATERIALIZED);
    j = model_to_json(&m);
    CU_ASSERT(cJSON_GetObjectItem(j, "attention") == NULL);
    back = m;
    back.attention = MODEL_ATTENTION_FLASH;
    CU_ASSERT(!model_equal(&m, &back));
    cJSON_Delete(j);
    const char *bad = test_write(
        "bad-attention.json",
        "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", \"n_layer\": 1, \"n_embd\": 8, "
        "\"n_head\": 2, \"seq_len\": 4, \"vocab_size\": 16, \"micro_batch\": 1, "
        "\"dtype\": \"fp32\", \"attention\": \"flsh\"}");
    CU_ASSERT_EQUAL(model_load(bad, &m, &e), ERR_INPUT);
    CU_ASSERT(strstr(e.msg, "bad-attention.json") != NULL && strstr(e.msg, "attention") != NULL &&
              strstr(e.msg, "flsh") != NULL);
    char *err = NULL;
    char args[1200];
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu -o '%s'", bad,
             test_path("never.json"));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "attention") != NULL);
    free(err);
}

/* ---- training on three ranks ---- */

#define RUN_LIMIT_S 120

/* Plan --method none of `model` (a file's text) on three CPU stages (embed and block 0;
 * block 1; head). */
static int make_plan(const char *tag, const char *model_text, char *plan, size_t size)
{
    char name[64], model[1024], prof[1024], cl[1024], args[4096];
    snprintf(name, sizeof name, "model-%s.json", tag);
    snprintf(model, sizeof model, "%s", test_write(name, model_text));
    snprintf(name, sizeof name, "prof-%s.json", tag);
    snprintf(prof, sizeof prof, "%s", test_path(name));
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu -o '%s'", model,
             prof);
    if (test_run(args, NULL, NULL) != 0)
        return -1;
    char text[2048];
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 4, "
             "\"stages\": [{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
             "\"%s\", \"layers\": [0, 1]}, {\"device\": \"cpu\", \"memory_bytes\": 1073741824, "
             "\"profile\": \"%s\", \"layers\": [2, 2]}, {\"device\": \"cpu\", \"memory_bytes\": "
             "1073741824, \"profile\": \"%s\", \"layers\": [3, 3]}]}",
             name, name, name);
    snprintf(name, sizeof name, "cluster-%s.json", tag);
    snprintf(cl, sizeof cl, "%s", test_write(name, text));
    snprintf(name, sizeof name, "plan-%s.json", tag);
    snprintf(plan, size, "%s", test_path(name));
    snprintf(args, sizeof args, "plan --cluster '%s' --method none --quiet -o '%s'", cl, plan);
    return test_run(args, NULL, NULL) == 0 ? 0 : -1;
}

static int train_saved(const char *plan, const char *dir, const char *name,
                       struct train_metrics *m)
{
    char args[4096], cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        return -1;
    snprintf(args, sizeof args, "--threads 1 --steps 3 --save '%s'", dir);
    return train_run_ok(3, RUN_LIMIT_S, plan, args, name, m);
}

#define GPT_SMALL                                                                            \
    "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", \"n_layer\": 2, \"n_embd\": 32, "   \
    "\"n_head\": 2, \"seq_len\": 80, \"vocab_size\": 64, \"micro_batch\": 2"
#define LLAMA_SMALL                                                                          \
    "{\"format\": \"ballast-model/1\", \"kind\": \"llama\", \"n_layer\": 2, \"n_embd\": 32, " \
    "\"n_head\": 4, \"n_kv_head\": 2, \"ffn_hidden\": 48, \"rope_theta\": 10000, "           \
    "\"norm_eps\": 1e-5, \"seq_len\": 80, \"vocab_size\": 64, \"micro_batch\": 2"

/* Keeping everything against each plan of choices (layers 0 embed, 1-2 blocks, 3 head):
 * equal checkpoints (weights, gradients, AdamW's moments) after 3 steps; the flash run's
 * losses within rtol of the materialised run's (seq_len 80: two key tiles). */
static void check_train(const char *tag, const char *model_fields, const char *dtype,
                        double rtol)
{
    char text[1024], plan[1024], plan_mat[1024], tag_mat[64];
    snprintf(text, sizeof text, "%s, \"dtype\": \"%s\", \"attention\": \"flash\"}",
             model_fields, dtype);
    CU_ASSERT_EQUAL_FATAL(make_plan(tag, text, plan, sizeof plan), 0);
    snprintf(text, sizeof text, "%s, \"dtype\": \"%s\"}", model_fields, dtype);
    snprintf(tag_mat, sizeof tag_mat, "%s-mat", tag);
    CU_ASSERT_EQUAL_FATAL(make_plan(tag_mat, text, plan_mat, sizeof plan_mat), 0);
    static const char *const choices[][4] = {
        {NULL, "mlp", "full", NULL},
        {"full", "full", "mlp", "full"},
    };
    char keep[1024], rec[1024], mat[1024], name[64];
    snprintf(keep, sizeof keep, "%s", test_path("ck-flash-keep"));
    snprintf(rec, sizeof rec, "%s", test_path("ck-flash-rec"));
    snprintf(mat, sizeof mat, "%s", test_path("ck-flash-mat"));
    struct train_metrics a, b, c;
    snprintf(name, sizeof name, "m-%s-keep.json", tag);
    if (train_saved(plan, keep, name, &a))
        return;
    CU_ASSERT(isfinite(a.loss[0]) && a.loss[2] < a.loss[0]);
    snprintf(name, sizeof name, "m-%s-mat.json", tag);
    if (train_saved(plan_mat, mat, name, &c))
        return;
    for (int k = 0; k < a.n_steps; k++)
        CU_ASSERT(test_close(a.loss[k], c.loss[k], 0, rtol));
    for (size_t i = 0; i < sizeof choices / sizeof *choices; i++) {
        char rplan[1024];
        snprintf(name, sizeof name, "plan-%s-%zu.json", tag, i);
        snprintf(rplan, sizeof rplan, "%s", test_path(name));
        train_plan_with_choices(plan, rplan, choices[i]);
        snprintf(name, sizeof name, "m-%s-%zu.json", tag, i);
        if (train_saved(rplan, rec, name, &b))
            return;
        CU_ASSERT(b.recompute_ms[0] > 0 || b.recompute_ms[1] > 0);
        CU_ASSERT(train_same_losses(&a, &b));
        for (int s = 0; s < 3; s++) {
            char fa[1200], fb[1200], fc[1200];
            snprintf(fa, sizeof fa, "%s/stage-%d-step-3.ckpt", keep, s);
            snprintf(fb, sizeof fb, "%s/stage-%d-step-3.ckpt", rec, s);
            snprintf(fc, sizeof fc, "%s/stage-%d-step-3.ckpt", mat, s);
            int same = train_files_equal(fa, fb);
            if (!same)
                fprintf(stderr, "\n%s choices %zu: stage %d state differs\n", tag, i, s);
            CU_ASSERT(same);
            CU_ASSERT(!train_files_equal(fa, fc)); /* the comparison can tell states apart */
        }
    }
}

/* A plan asking a flash block for "attn" (hand-edited: the planner never offers it) is
 * refused naming the option and the ones the layer has. */
static void check_attn_refused(const char *tag)
{
    char name[64], args[2048];
    snprintf(name, sizeof name, "plan-%s.json", tag);
    char *text = test_read(test_path(name));
    cJSON *o = cJSON_Parse(text);
    free(text);
    cJSON *st = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "stages"), 0);
    cJSON_AddItemToObject(st, "recompute_options",
                          cJSON_Parse("[{\"layer\": 1, \"option\": \"attn\"}]"));
    char *out = cJSON_Print(o);
    snprintf(name, sizeof name, "plan-%s-attn.json", tag);
    snprintf(args, sizeof args, "--plan '%s' --steps 1 --quiet", test_write(name, out));
    cJSON_free(out);
    cJSON_Delete(o);
    struct train_run r = train_exec(3, RUN_LIMIT_S, args);
    CU_ASSERT_EQUAL(r.status, 2);
    CU_ASSERT(r.err != NULL && strstr(r.err, "\"attn\" is not a recompute option") != NULL &&
              strstr(r.err, "list mlp") != NULL);
    train_run_free(&r);
}

static void test_train_gpt(void)
{
    check_train("gpt", GPT_SMALL, "fp32", 1e-5);
    check_attn_refused("gpt");
}

static void test_train_llama(void)
{
    check_train("llama", LLAMA_SMALL, "fp32", 1e-5);
}

/* bf16 (the CPU backend widens to fp32 and rounds its outputs): the flash output is rounded
 * once where materialised rounds the probabilities too, so the losses agree to bf16's
 * precision over three steps */
static void test_train_bf16(void)
{
    check_train("gpt16", GPT_SMALL, "bf16", 1e-2);
}

int main(void)
{
    openblas_set_num_threads(1); /* as the CPU backend runs the kernels */
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("flash", NULL, NULL);
    CU_add_test(s, "flash kernels against materialised attention (MHA, GQA, MQA)",
                test_kernels);
    CU_add_test(s, "1 and 3 threads, and a second forward, give identical bits",
                test_threads_bitwise);
    CU_add_test(s, "sizes: (B,NH,T) statistics, linear in T, no attn option", test_sizes);
    CU_add_test(s, "the backward's FLOPs recompute the scores", test_flops);
    CU_add_test(s, "model files: attention read, written, bad values refused",
                test_model_files);
    CU_add_test(s, "3 ranks, GPT: recompute options bitwise keeping everything, peak in plan",
                test_train_gpt);
    CU_add_test(s, "3 ranks, Llama: likewise", test_train_llama);
    CU_add_test(s, "3 ranks, bf16 GPT: likewise", test_train_bf16);
    return test_main();
}
