/* bf16 models on CPU ranks, GPT and Llama: the fp32 kernels over widened copies, results
 * rounded to bf16 (fp32 accumulation, as on the GPU). References: the same model in fp32 from
 * the same weights (close, not equal), and the bf16 run itself on another stage split and
 * with every layer recomputed (bitwise). Runs pin --threads 1. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "traintest.h"

#define RUN_LIMIT_S 120
#define STEPS 8
/* |bf16 loss - fp32 loss| per step, 8 steps of the 2-block GPT from the same weights: the
 * measured gap is about 1.3e-4 (bf16 keeps 8 bits of mantissa: 0.4% per value) */
#define BF16_LOSS_TOL 5e-3

/* The same for the Llama below: the measured gap over 8 steps is about 2e-4 */
#define LLAMA_BF16_LOSS_TOL 5e-3

static char plan32[1024], plan16[1024], plan16_2[1024], plan16_full[1024];
/* the Llama: fp32 and bf16 on one stage, bf16 on two, on three with every layer recomputed,
 * and with flash attention on one and two stages */
static char lplan32[1024], lplan16[1024], lplan16_2[1024], lplan16_full[1024];
static char fplan32[1024], fplan16[1024], fplan16_2[1024];

/* A 2-block Llama with grouped-query attention (4 query heads over 2 key/value heads). */
static void llama_text(char *out, size_t size, const char *dtype, const char *attention)
{
    snprintf(out, size,
             "{\"format\": \"ballast-model/1\", \"kind\": \"llama\", \"n_layer\": 2, "
             "\"n_embd\": 32, \"n_head\": 4, \"n_kv_head\": 2, \"ffn_hidden\": 48, "
             "\"rope_theta\": 10000, \"norm_eps\": 1e-5, \"seq_len\": 16, \"vocab_size\": "
             "64, \"micro_batch\": 2, \"dtype\": \"%s\", \"attention\": \"%s\"}",
             dtype, attention);
}

static void llama_plan(const char *name, const char *dtype, const char *attention, int n,
                       const char *method, char *plan)
{
    char text[1024];
    llama_text(text, sizeof text, dtype, attention);
    train_plan_model(name, text, n, method, plan, 1024);
}

static int setup(void)
{
    train_plan_gpt("fp32", 64, "fp32", 1, "none", plan32, sizeof plan32);
    train_plan_gpt("bf16", 64, "bf16", 1, "none", plan16, sizeof plan16);
    train_plan_gpt("bf16x2", 64, "bf16", 2, "none", plan16_2, sizeof plan16_2);
    train_plan_gpt("bf16full", 64, "bf16", 2, "full", plan16_full, sizeof plan16_full);
    llama_plan("l32", "fp32", "materialized", 1, "none", lplan32);
    llama_plan("l16", "bf16", "materialized", 1, "none", lplan16);
    llama_plan("l16x2", "bf16", "materialized", 2, "none", lplan16_2);
    llama_plan("l16full", "bf16", "materialized", 3, "full", lplan16_full);
    llama_plan("f32", "fp32", "flash", 1, "none", fplan32);
    llama_plan("f16", "bf16", "flash", 1, "none", fplan16);
    llama_plan("f16x2", "bf16", "flash", 2, "full", fplan16_2);
    return 0;
}

static int run(int np, const char *plan, const char *extra, const char *name,
               struct train_metrics *m)
{
    char args[4096];
    snprintf(args, sizeof args, "--threads 1 --steps %d %s", STEPS, extra);
    return train_run_ok(np, RUN_LIMIT_S, plan, args, name, m);
}

/* bf16 runs h (one stage), h2 and h3 (other splits, recomputation) against the fp32 run f:
 * within tol, bitwise among themselves, and computed in bf16. */
static void expect_bf16(const struct train_metrics *f, const struct train_metrics *h,
                        const struct train_metrics *h2, const struct train_metrics *h3,
                        double tol, const char *what)
{
    double worst = 0;
    for (int i = 0; i < STEPS; i++) {
        double gap = fabs(h->loss[i] - f->loss[i]);
        worst = gap > worst ? gap : worst;
        CU_ASSERT(isfinite(h->loss[i]));
        CU_ASSERT(gap <= tol);
        CU_ASSERT(h2->loss[i] == h->loss[i]);
        CU_ASSERT(h3 == NULL || h3->loss[i] == h->loss[i]);
    }
    fprintf(stderr, "\n  %s bf16 against fp32: largest loss gap %.3g over %d steps\n", what,
            worst, STEPS);
    CU_ASSERT(h->loss[0] != f->loss[0]); /* it computed in bf16 */
    CU_ASSERT(h->loss[STEPS - 1] < h->loss[0]);
}

/* fp32 and bf16 runs of plans[0..3] (fp32; bf16 on one stage, its weights saved to `w`; two
 * other bf16 splits) on np[0..3] ranks into m[0..3], their metrics named after `tag`; 0, or -1
 * when one failed. */
static int run_four(const char *const plans[4], const int np[4], const char *tag, const char *w,
                    struct train_metrics m[4])
{
    char extra[2048], name[64];
    for (int k = 0; k < 4; k++) {
        snprintf(extra, sizeof extra, k == 1 ? "--save-weights '%s'" : "", w);
        snprintf(name, sizeof name, "%s-%d.json", tag, k);
        if (run(np[k], plans[k], extra, name, &m[k]))
            return -1;
    }
    return 0;
}

/* The weights file holds BF16 tensors only, `tensor` among them. */
static void expect_bf16_file(const char *w, const char *tensor)
{
    char *text = test_read(w), quoted[128];
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    snprintf(quoted, sizeof quoted, "\"%s\"", tensor);
    CU_ASSERT(strstr(text + 8, quoted) != NULL);
    CU_ASSERT(strstr(text + 8, "\"dtype\":\"BF16\"") != NULL);
    CU_ASSERT(strstr(text + 8, "\"dtype\":\"F32\"") == NULL);
    free(text);
}

static void test_bf16_trains(void)
{
    struct train_metrics m[4];
    const char *plans[4] = {plan32, plan16, plan16_2, plan16_full};
    const int np[4] = {1, 1, 2, 2};
    char w[1024], extra[2048];
    snprintf(w, sizeof w, "%s", test_path("bf16.safetensors"));
    if (run_four(plans, np, "gpt", w, m))
        return;
    expect_bf16(&m[0], &m[1], &m[2], &m[3], BF16_LOSS_TOL, "gpt");
    /* its weights come out as BF16 and start the 2-stage run as they start the 1-stage one */
    expect_bf16_file(w, "wte.weight");
    struct train_metrics a, b;
    snprintf(extra, sizeof extra, "--init '%s'", w);
    if (run(1, plan16, extra, "a.json", &a) || run(2, plan16_full, extra, "b.json", &b))
        return;
    for (int i = 0; i < STEPS; i++)
        CU_ASSERT(a.loss[i] == b.loss[i]);
    CU_ASSERT(a.loss[0] < m[1].loss[0]); /* trained weights: a lower first loss */
}

/* Issue 27: a bf16 Llama was refused once its ranks had started; its kernels on CPU ranks
 * take bf16 as the GPT's do. */
static void test_llama_bf16_trains(void)
{
    struct train_metrics m[4];
    const char *plans[4] = {lplan32, lplan16, lplan16_2, lplan16_full};
    const int np[4] = {1, 1, 2, 3};
    char w[1024];
    snprintf(w, sizeof w, "%s", test_path("llama-bf16.safetensors"));
    if (run_four(plans, np, "llama", w, m))
        return;
    expect_bf16(&m[0], &m[1], &m[2], &m[3], LLAMA_BF16_LOSS_TOL, "llama");
    expect_bf16_file(w, "model.layers.1.self_attn.k_proj.weight");
}

static void test_llama_flash_bf16_trains(void)
{
    struct train_metrics f, h, h2;
    if (run(1, fplan32, "", "ff.json", &f) || run(1, fplan16, "", "fh.json", &h) ||
        run(2, fplan16_2, "", "fh2.json", &h2))
        return;
    expect_bf16(&f, &h, &h2, NULL, LLAMA_BF16_LOSS_TOL, "flash llama");
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("train_bf16", setup, NULL);
    CU_add_test(s, "a bf16 GPT trains on CPU ranks: near fp32, bitwise across splits and "
                   "recomputation",
                test_bf16_trains);
    CU_add_test(s, "a bf16 Llama trains on CPU ranks: near fp32, bitwise across splits and "
                   "recomputation",
                test_llama_bf16_trains);
    CU_add_test(s, "a bf16 Llama with flash attention on CPU ranks likewise",
                test_llama_flash_bf16_trains);
    return test_main();
}
