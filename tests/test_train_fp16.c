/* fp16 models on CPU ranks, with dynamic loss scaling, end to end (`mpirun ... ballast
 * train`), and the non-finite stops of issue 27. References:
 *   - the same GPT in fp32 from the same weights (close: fp16 keeps 11 bits of mantissa);
 *   - the fp16 run itself on 1 stage, against 2 and 3 stages, every layer recomputed, the
 *     blocks' activations offloaded, the optimizer on the host, and ZeRO-1 over two replicas
 *     against the unsharded replicas: bitwise the same losses, scales and skipped steps, with a
 *     large initial scale (2^22) whose first steps overflow (hysteresis 2 spends one overflow
 *     before backing off), every stage's peak within 2% of its plan (train_run_ok);
 *   - an uninterrupted run for a resumed one, resumed while the scaler is still backing off
 *     (bitwise: losses, scales, checkpoints);
 *   - the definitions for the refusals and stops: non-finite or out-of-fp16 weights from
 *     --init and a NaN in a checkpoint for --resume (exit 2, the tensor named); a NaN in the
 *     gradients mid-run (BALLAST_TEST_NONFINITE) stopping an fp32 run on every rank (exit 1,
 *     the step and the stage named, the checkpoint of the step before intact and resumable)
 *     and skipping an fp16 step; a real NaN from finite fp32 weights; an overflow at the
 *     minimum scale (exit 1, the step named, no metrics); loss-scaling options out of range
 *     or for a bf16 plan (exit 2, the option and the numbers).
 * Runs pin --threads 1. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "traintest.h"

#define RUN_LIMIT_S 120
#define STEPS 8
#define LARGE "--initial-loss-scale 4194304" /* 2^22: the first 3 steps overflow */
/* |fp16 loss - fp32 loss| per step, 8 steps of the 2-block GPT from the same weights and
 * the default scale (no overflow): measured 6.1e-5 (the Llama's 4.2e-5 over 6) */
#define FP16_LOSS_TOL 1e-3

enum { P32, P2_32, P1, P2, P3, P2_FULL, P1_OFFLOAD, P2_HOST, PDP, PZERO, PBF16, PFLASH1,
       PFLASH2, PL32, PL1, PL3, N_PLANS };
static char plans[N_PLANS][1024];

/* configs/models/llama-tiny.json (4 blocks, grouped-query attention) in `dtype`. */
static void llama_text(const char *dtype, char *out, size_t size)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/configs/models/llama-tiny.json", BALLAST_SOURCE_DIR);
    char *text = test_read(path), *at = text ? strstr(text, "\"fp32\"") : NULL;
    if (at == NULL) {
        fprintf(stderr, "%s: no \"fp32\" to replace\n", path);
        snprintf(out, size, "{}");
    } else {
        snprintf(out, size, "%.*s\"%s\"%s", (int)(at - text), text, dtype, at + 6);
    }
    free(text);
}

/* A 2-stage fp16 plan of dp 2 replicas ("shard_optimizer" when `zero`). */
static void plan_dp(const char *name, int zero, char *out, size_t size)
{
    char text[2048], file[64], args[4096], prof[1024];
    snprintf(prof, sizeof prof, "%s", test_path("h1-prof.json")); /* train_plan_gpt's */
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 2%s,"
             " \"stages\": [{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
             "\"%s\", \"dp\": 2}, {\"device\": \"cpu\", \"memory_bytes\": 1073741824, "
             "\"profile\": \"%s\", \"dp\": 2}]}",
             zero ? ", \"shard_optimizer\": true" : "", prof, prof);
    snprintf(file, sizeof file, "%s-cluster.json", name);
    char cluster[1024];
    snprintf(cluster, sizeof cluster, "%s", test_write(file, text));
    snprintf(file, sizeof file, "%s-plan.json", name);
    snprintf(out, size, "%s", test_path(file));
    snprintf(args, sizeof args, "plan --cluster '%s' --method none --quiet -o '%s'", cluster, out);
    if (test_run(args, NULL, NULL) != 0)
        fprintf(stderr, "plan %s failed\n", name);
}

static int setup(void)
{
    train_plan_gpt("f32", 64, "fp32", 1, "none", plans[P32], sizeof plans[P32]);
    train_plan_gpt("f2", 64, "fp32", 2, "none", plans[P2_32], sizeof plans[P2_32]);
    train_plan_gpt("h1", 64, "fp16", 1, "none", plans[P1], sizeof plans[P1]);
    train_plan_gpt("h2", 64, "fp16", 2, "none", plans[P2], sizeof plans[P2]);
    train_plan_gpt("h3", 64, "fp16", 3, "none", plans[P3], sizeof plans[P3]);
    train_plan_gpt("h2full", 64, "fp16", 2, "full", plans[P2_FULL], sizeof plans[P2_FULL]);
    train_plan_gpt("b1", 64, "bf16", 1, "none", plans[PBF16], sizeof plans[PBF16]);
    snprintf(plans[P1_OFFLOAD], sizeof plans[P1_OFFLOAD], "%s", test_path("h1off-plan.json"));
    train_plan_offload(plans[P1], plans[P1_OFFLOAD]);
    snprintf(plans[P2_HOST], sizeof plans[P2_HOST], "%s", test_path("h2host-plan.json"));
    train_plan_host_optimizer(plans[P2], plans[P2_HOST], 3, 0);
    plan_dp("hdp", 0, plans[PDP], sizeof plans[PDP]);
    plan_dp("hzero", 1, plans[PZERO], sizeof plans[PZERO]);
    const char *flash = "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", \"n_layer\": 2, "
                        "\"n_embd\": 32, \"n_head\": 2, \"seq_len\": 16, \"vocab_size\": 64, "
                        "\"micro_batch\": 2, \"dtype\": \"fp16\", \"attention\": \"flash\"}";
    train_plan_model("hflash1", flash, 1, "none", plans[PFLASH1], sizeof plans[PFLASH1]);
    train_plan_model("hflash2", flash, 2, "none", plans[PFLASH2], sizeof plans[PFLASH2]);
    char text[2048];
    llama_text("fp32", text, sizeof text);
    train_plan_model("l32", text, 1, "none", plans[PL32], sizeof plans[PL32]);
    llama_text("fp16", text, sizeof text);
    test_write("llama-fp16.json", text);
    train_plan_model("l1", text, 1, "none", plans[PL1], sizeof plans[PL1]);
    train_plan_model("l3", text, 3, "full", plans[PL3], sizeof plans[PL3]);
    return 0;
}

/* test_fp16_trains' 1-stage run from LARGE, which every other way of running it matches */
static struct train_metrics one;
static int have_one;

static int run(int np, int plan, const char *extra, const char *name, struct train_metrics *m)
{
    char args[4096], full[4096], metrics[1024];
    snprintf(args, sizeof args, "--threads 1 --steps %d %s", STEPS, extra);
    if (plan != PDP && plan != PZERO)
        return train_run_ok(np, RUN_LIMIT_S, plans[plan], args, name, m);
    /* replicas: the metrics list replica 0's stages (train_run_ok expects np of them) */
    snprintf(metrics, sizeof metrics, "%s", test_path(name));
    snprintf(full, sizeof full, "--plan '%s' --metrics '%s' --quiet %s", plans[plan], metrics,
             args);
    struct train_run r = train_exec(np, RUN_LIMIT_S, full);
    int status = r.status;
    CU_ASSERT_EQUAL(status, 0);
    if (status != 0)
        fprintf(stderr, "\ntrain -np %d %s: status %d\n%s\n", np, full, status,
                r.err ? r.err : "");
    train_run_free(&r);
    return status == 0 ? train_metrics_read(metrics, m) : -1;
}

/* One run's losses, scales and skipped steps equal another's, bitwise. */
static void expect_same(const char *what, const struct train_metrics *a,
                        const struct train_metrics *b)
{
    int same = train_same_losses(a, b) && train_same_scaling(a, b) && a->loss_scale[0] > 0;
    if (!same)
        fprintf(stderr, "\n  %s: the losses, scales or skipped steps differ\n", what);
    CU_ASSERT(same);
}

static void test_fp16_trains(void)
{
    struct train_metrics f, h;
    /* the default scale does not overflow here: fp16 against fp32, step by step */
    if (run(1, P32, "", "f.json", &f) || run(1, P1, "", "h.json", &h))
        return;
    double worst = 0;
    for (int i = 0; i < STEPS; i++) {
        double gap = fabs(h.loss[i] - f.loss[i]);
        worst = gap > worst ? gap : worst;
        CU_ASSERT(gap <= FP16_LOSS_TOL);
    }
    fprintf(stderr, "\n  fp16 against fp32: largest loss gap %.3g over %d steps\n", worst, STEPS);
    CU_ASSERT(h.loss[0] != f.loss[0]); /* it computed in fp16 */
    /* the large scale: overflows first, then training; every way of running it alike */
    struct train_metrics other;
    if (run(1, P1, LARGE, "one.json", &one))
        return;
    have_one = 1;
    const double *scale = one.loss_scale;
    const int *skipped = one.skipped;
    int n_skipped = 0;
    for (int i = 0; i < STEPS; i++)
        n_skipped += skipped[i];
    CU_ASSERT(skipped[0] && skipped[1] && !skipped[STEPS - 1]);
    CU_ASSERT_EQUAL(scale[1], scale[0]); /* hysteresis 2: the first overflow spends it */
    CU_ASSERT_EQUAL(scale[2], scale[0] / 2);
    CU_ASSERT(one.loss[STEPS - 1] < one.loss[n_skipped]); /* it trains once it steps */
    fprintf(stderr, "  from 2^22: %d of %d steps skipped, then the scale %g\n", n_skipped,
            STEPS, scale[STEPS - 1]);
    static const struct {
        int np, plan;
        const char *name;
    } others[] = {
        {2, P2, "2 stages"},          {3, P3, "3 stages"},
        {2, P2_FULL, "recomputed"},   {1, P1_OFFLOAD, "offloaded"},
        {2, P2_HOST, "host optimizer"},
    };
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
        if (run(others[i].np, others[i].plan, LARGE, "other.json", &other) == 0)
            expect_same(others[i].name, &one, &other);
    /* ZeRO-1 over two replicas: the unsharded replicas' numbers */
    struct train_metrics dp, zero;
    if (run(4, PDP, LARGE, "dp.json", &dp) == 0 && run(4, PZERO, LARGE, "zero.json", &zero) == 0)
        expect_same("ZeRO-1", &dp, &zero);
}

/* Flash attention and the Llama family in fp16: bitwise across splits (the Llama's recomputed
 * whole), the Llama near its fp32 run, and its layers' bytes as measured on the CPU the size
 * functions' (profile --device cpu). */
static void test_fp16_flash_llama(void)
{
    struct train_metrics a, b;
    if (run(1, PFLASH1, LARGE, "flash1.json", &a) == 0 &&
        run(2, PFLASH2, LARGE, "flash2.json", &b) == 0)
        expect_same("flash, 2 stages", &a, &b);
    struct train_metrics l32, l1, l3;
    if (run(1, PL32, "--steps 6", "l32.json", &l32) || run(1, PL1, "--steps 6", "l1.json", &l1) ||
        run(3, PL3, "--steps 6", "l3.json", &l3))
        return;
    CU_ASSERT(train_same_losses(&l1, &l3));
    double worst = 0;
    for (int i = 0; i < 6; i++) {
        double gap = fabs(l1.loss[i] - l32.loss[i]);
        worst = gap > worst ? gap : worst;
    }
    CU_ASSERT(worst <= FP16_LOSS_TOL && l1.loss[0] != l32.loss[0]);
    fprintf(stderr, "\n  Llama fp16 against fp32: largest loss gap %.3g over 6 steps\n", worst);
    char args[4096], *err = NULL;
    snprintf(args, sizeof args, "profile --model '%s' --device cpu --repeats 1 --threads 1 -o '%s'",
             test_path("llama-fp16.json"), test_path("llama-fp16-prof.json"));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 0);
    CU_ASSERT(err != NULL && strstr(err, "differ") == NULL);
    if (err != NULL && strstr(err, "differ") != NULL)
        fprintf(stderr, "%s\n", err);
    free(err);
}

/* Time-shared with an fp32 job (train --share): the fp16 job's steps, scales and skipped steps
 * are its run alone's (test_fp16_trains' one stage, which its 2 stages match). */
static void test_fp16_shared(void)
{
    char args[4096], share[1024];
    snprintf(share, sizeof share, "%s", test_path("share.json"));
    snprintf(args, sizeof args, "plan --share '%s' '%s' --quiet -o '%s'",
             test_path("h2-cluster.json"), test_path("f2-cluster.json"), share);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    CU_ASSERT_FATAL(have_one);
    const struct train_metrics *alone = &one;
    snprintf(args, sizeof args, "--share '%s' --threads 1 --quiet --steps %d " LARGE
             " --metrics '%s'", share, STEPS, test_path("shared.json"));
    struct train_run r = train_exec(2, RUN_LIMIT_S, args);
    CU_ASSERT_EQUAL(r.status, 0);
    train_run_free(&r);
    cJSON *o = train_json_read(test_path("shared.json"));
    const cJSON *steps = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "jobs"), 0),
                                             "steps");
    int same = cJSON_GetArraySize(steps) == STEPS;
    for (int i = 0; same && i < STEPS; i++) {
        const cJSON *s = cJSON_GetArrayItem(steps, i);
        same = cJSON_GetObjectItem(s, "loss")->valuedouble == alone->loss[i] &&
               cJSON_GetObjectItem(s, "loss_scale")->valuedouble == alone->loss_scale[i] &&
               cJSON_IsTrue(cJSON_GetObjectItem(s, "skipped")) == alone->skipped[i];
    }
    CU_ASSERT(same);
    cJSON_Delete(o);
}

/* A run resumed at step 2, while the scale is still backing off, continues bitwise. */
static void test_fp16_resume(void)
{
    char a[1024], b[1024], extra[4096];
    struct train_metrics whole, first, rest;
    snprintf(a, sizeof a, "%s", test_path("ck-whole"));
    snprintf(b, sizeof b, "%s", test_path("ck-split"));
    snprintf(extra, sizeof extra, LARGE " --save '%s'", a);
    if (run(2, P2, extra, "whole.json", &whole))
        return;
    snprintf(extra, sizeof extra, LARGE " --save '%s' --steps 2", b);
    if (run(2, P2, extra, "first.json", &first))
        return;
    snprintf(extra, sizeof extra, LARGE " --resume '%s' --save '%s'", b, b);
    if (run(2, P2, extra, "rest.json", &rest))
        return;
    CU_ASSERT_EQUAL_FATAL(rest.n_steps, STEPS - 2);
    CU_ASSERT(whole.skipped[1] && whole.skipped[2]); /* resumed among the skipped steps */
    for (int i = 0; i < STEPS - 2; i++) {
        CU_ASSERT(rest.loss[i] == whole.loss[2 + i]);
        CU_ASSERT(rest.loss_scale[i] == whole.loss_scale[2 + i] &&
                  rest.skipped[i] == whole.skipped[2 + i]);
    }
    for (int s = 0; s < 2; s++) {
        char fa[1200], fb[1200];
        snprintf(fa, sizeof fa, "%s/stage-%d-step-%d.ckpt", a, s, STEPS);
        snprintf(fb, sizeof fb, "%s/stage-%d-step-%d.ckpt", b, s, STEPS);
        CU_ASSERT(train_files_equal(fa, fb));
    }
    /* the manifests carry the same scaler */
    char ma[1200], mb[1200];
    snprintf(ma, sizeof ma, "%s/checkpoint.json", a);
    snprintf(mb, sizeof mb, "%s/checkpoint.json", b);
    cJSON *ja = train_json_read(ma), *jb = train_json_read(mb);
    const cJSON *la = cJSON_GetObjectItem(ja, "loss_scale"), *lb = cJSON_GetObjectItem(jb, "loss_scale");
    CU_ASSERT(la != NULL && cJSON_Compare(la, lb, 1));
    CU_ASSERT(cJSON_GetObjectItem(la, "skipped_steps") != NULL &&
              cJSON_GetObjectItem(la, "skipped_steps")->valueint > 0);
    cJSON_Delete(ja);
    cJSON_Delete(jb);
}

/* ---- refusals and stops ---- */

static struct train_run expect_status(int np, int plan, const char *extra, int status,
                                      const char *needle)
{
    char args[4096];
    snprintf(args, sizeof args, "--plan '%s' --threads 1 --quiet %s", plans[plan], extra);
    struct train_run r = train_exec(np, RUN_LIMIT_S, args);
    int found = needle == NULL || (r.err != NULL && strstr(r.err, needle) != NULL);
    if (r.status != status || !found)
        fprintf(stderr, "\n%s: status %d (expected %d), stderr: %s (expected \"%s\")\n", args,
                r.status, status, r.err ? r.err : "", needle ? needle : "");
    CU_ASSERT_EQUAL(r.status, status);
    CU_ASSERT(found);
    return r;
}

static void expect_refused(int np, int plan, const char *extra, int status, const char *needle)
{
    struct train_run r = expect_status(np, plan, extra, status, needle);
    train_run_free(&r);
}

/* Writes `value` (n bytes) over element `index` of tensor `name` of a safetensors file. */
static void poke_safetensors(const char *file, const char *name, int64_t index, const void *value,
                             int n)
{
    FILE *f = fopen(file, "r+b");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    uint64_t len = 0;
    CU_ASSERT_FATAL(fread(&len, 8, 1, f) == 1);
    char *text = calloc(1, len + 1);
    CU_ASSERT_FATAL(text != NULL && fread(text, 1, len, f) == len);
    cJSON *h = cJSON_Parse(text);
    const cJSON *off = cJSON_GetObjectItem(cJSON_GetObjectItem(h, name), "data_offsets");
    CU_ASSERT_PTR_NOT_NULL_FATAL(off);
    long at = (long)(8 + len + (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble) + n * index;
    CU_ASSERT(fseek(f, at, SEEK_SET) == 0 && fwrite(value, (size_t)n, 1, f) == 1);
    fclose(f);
    cJSON_Delete(h);
    free(text);
}

/* Writes `value` over bytes [at, at + n) of a checkpoint's state and makes its checksum
 * (FNV-1a 64 of header and state, the file's last 8 bytes) match again: a file whose only
 * fault is the value. */
static void poke_checkpoint(const char *file, int64_t at, const void *value, int n)
{
    char *raw = test_read(file);
    CU_ASSERT_PTR_NOT_NULL_FATAL(raw);
    FILE *f = fopen(file, "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    uint32_t header_bytes;
    memcpy(&header_bytes, raw + 12, 4);
    memcpy(raw + header_bytes + at, value, (size_t)n);
    uint64_t h = 0xCBF29CE484222325ull;
    for (long i = 0; i < size - 8; i++)
        h = (h ^ (unsigned char)raw[i]) * 0x100000001B3ull;
    memcpy(raw + size - 8, &h, 8);
    f = fopen(file, "wb");
    CU_ASSERT(f != NULL && fwrite(raw, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    free(raw);
}

static void test_nonfinite_weights_refused(void)
{
    char w16[1024], w32[1024], extra[4096], needle[1200];
    struct train_metrics m;
    snprintf(w16, sizeof w16, "%s", test_path("w16.safetensors"));
    snprintf(w32, sizeof w32, "%s", test_path("w32.safetensors"));
    snprintf(extra, sizeof extra, "--steps 2 --save-weights '%s'", w16);
    if (run(1, P1, extra, "w16.json", &m))
        return;
    snprintf(extra, sizeof extra, "--steps 2 --save-weights '%s'", w32);
    if (run(1, P32, extra, "w32.json", &m))
        return;
    char *text = test_read(w16);
    CU_ASSERT(text != NULL && strstr(text + 8, "\"dtype\":\"F16\"") != NULL);
    free(text);
    /* a checkpoint of a run from the F16 file (which it starts), for --resume below */
    char ck[1024];
    snprintf(ck, sizeof ck, "%s", test_path("ck-nan"));
    snprintf(extra, sizeof extra, "--steps 2 --init '%s' --save '%s'", w16, ck);
    if (run(1, P1, extra, "ck-nan.json", &m))
        return;
    /* a NaN in an F16 file; a weight beyond fp16 (65504) in an F32 file for an fp16 model; an
     * infinity for fp32 */
    uint16_t nan16 = 0x7e00;
    poke_safetensors(w16, "h.1.mlp.c_fc.bias", 5, &nan16, 2);
    snprintf(extra, sizeof extra, "--steps 2 --init '%s'", w16);
    snprintf(needle, sizeof needle, "%s: h.1.mlp.c_fc.bias: element 5 is nan: weights must be "
             "finite", w16);
    expect_refused(2, P2, extra, 2, needle);
    float big = 1e5f, inf = INFINITY;
    poke_safetensors(w32, "wte.weight", 7, &big, 4);
    snprintf(extra, sizeof extra, "--steps 2 --init '%s'", w32);
    snprintf(needle, sizeof needle, "%s: wte.weight: element 7 is 100000, beyond what fp16 "
             "holds", w32);
    expect_refused(1, P1, extra, 2, needle);
    poke_safetensors(w32, "lm_head.weight", 3, &inf, 4);
    snprintf(needle, sizeof needle, "%s: lm_head.weight: element 3 is inf", w32);
    expect_refused(1, P32, extra, 2, needle);
    /* that checkpoint with a NaN master weight (checksum intact): refused, the tensor named */
    char stage0[1200];
    snprintf(stage0, sizeof stage0, "%s/stage-0-step-2.ckpt", ck);
    /* fp16: weights (wte 64 x 32 x 2 = 4096 bytes, wpe 16 x 32 x 2 = 1024, ...), gradients,
     * then the fp32 masters: the sections' sizes from the checkpoint header (section_bytes at
     * 104) and the weights' from the first section's start, 4096 + 1024 + ... */
    char *raw = test_read(stage0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(raw);
    int64_t section;
    memcpy(&section, raw + 104, 8);
    free(raw);
    int64_t weights = section / 2; /* every tensor's fp16 copy: half its fp32 one, padded to
                                      64 bytes alike (all sizes here are multiples of 128) */
    float nan32 = NAN;
    poke_checkpoint(stage0, weights + section + 4 * 9, &nan32, 4); /* wte's master, element 9 */
    snprintf(extra, sizeof extra, "--steps 3 --resume '%s'", ck);
    snprintf(needle, sizeof needle, "%s: layer embed's wte, master weights: element 9 is nan",
             stage0);
    expect_refused(1, P1, extra, 2, needle);
}

static void test_nonfinite_stops(void)
{
    char ck[1024], extra[4096], manifest[1200], args[4096];
    snprintf(ck, sizeof ck, "%s", test_path("ck-stop"));
    /* fp32: rank 1's gradients hold a NaN at step 5: every rank stops, nothing of step 5 is
     * saved (the checkpoint of step 4 stays), the run resumes from it */
    setenv("BALLAST_TEST_NONFINITE", "5:1", 1);
    snprintf(args, sizeof args,
             "--plan '%s' --threads 1 --quiet --steps 8 --save '%s' --save-every 2 "
             "--metrics '%s'", plans[P2_32], ck, test_path("stop.json"));
    struct train_run r = train_exec(2, RUN_LIMIT_S, args);
    unsetenv("BALLAST_TEST_NONFINITE");
    CU_ASSERT_EQUAL(r.status, 1);
    CU_ASSERT(r.err != NULL && strstr(r.err, "step 5: a NaN or an infinity in the loss or the "
                                             "gradients (first on stage 1)") != NULL);
    if (r.status != 1)
        fprintf(stderr, "\n%s\n", r.err ? r.err : "");
    CU_ASSERT(r.seconds < 60); /* every rank ended, none waited out a timeout */
    train_run_free(&r);
    CU_ASSERT(access(test_path("stop.json"), F_OK) != 0); /* a failed run writes no metrics */
    snprintf(manifest, sizeof manifest, "%s/checkpoint.json", ck);
    cJSON *j = train_json_read(manifest);
    CU_ASSERT(j != NULL && cJSON_GetObjectItem(j, "step")->valueint == 4);
    CU_ASSERT(cJSON_GetObjectItem(j, "loss_scale") == NULL); /* fp32: no scaler */
    cJSON_Delete(j);
    snprintf(args, sizeof args, "--plan '%s' --threads 1 --quiet --steps 6 --resume '%s'",
             plans[P2_32], ck);
    r = train_exec(2, RUN_LIMIT_S, args);
    CU_ASSERT_EQUAL(r.status, 0);
    train_run_free(&r);
    /* fp16: the same NaN is an overflow: the step is skipped, the run goes on */
    struct train_metrics m;
    setenv("BALLAST_TEST_NONFINITE", "3:1", 1);
    int rc = run(2, P2, "--hysteresis 1", "skip.json", &m);
    unsetenv("BALLAST_TEST_NONFINITE");
    if (rc)
        return;
    for (int i = 0; i < STEPS; i++)
        CU_ASSERT_EQUAL(m.skipped[i], i == 2);
    CU_ASSERT(m.loss_scale[3] == m.loss_scale[2] / 2);
    /* a real NaN: finite fp32 weights whose forward overflows (a layer norm's weight of 3e38) */
    char w[1024];
    snprintf(w, sizeof w, "%s", test_path("big.safetensors"));
    snprintf(extra, sizeof extra, "--steps 1 --save-weights '%s'", w);
    if (run(1, P32, extra, "big.json", &m))
        return;
    float big = 3e38f;
    poke_safetensors(w, "h.0.ln_1.weight", 0, &big, 4);
    snprintf(extra, sizeof extra, "--steps 3 --init '%s'", w);
    expect_refused(1, P32, extra, 1, "step 1: a NaN or an infinity in the loss or the gradients");
}

static void test_scale_at_min(void)
{
    /* 2^22 backs off once to the minimum 2^21 and overflows there: stopped at step 2 */
    struct train_run r = expect_status(
        2, P2, "--steps 6 --initial-loss-scale 4194304 --min-loss-scale 2097152 --hysteresis 1",
        1, "step 2: the gradients overflow fp16 at the minimum loss scale 2097152");
    train_run_free(&r);
}

/* The command line's parse of each kind of setting (test_fp16 checks every setting's range in
 * lossscale_check). */
static void test_options_refused(void)
{
    static const struct {
        const char *extra, *says;
    } bad[] = {
        {"--initial-loss-scale 1e39", "--initial-loss-scale: \"1e39\", expected a number in (0, "
                                      "3.4e38]"},
        {"--min-loss-scale 128 --initial-loss-scale 64",
         "--min-loss-scale: 128, expected a number in (0, 64]"},
        {"--loss-scale-backoff 1", "--loss-scale-backoff: \"1\", expected a factor in (0, 1)"},
        {"--hysteresis -1", "--hysteresis: \"-1\", expected a count >= 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_refused(1, P1, bad[i].extra, 2, bad[i].says);
    expect_refused(1, PBF16, "--hysteresis 3", 2,
                   "model.dtype: \"bf16\": the loss scaling options are for an fp16 model");
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("train_fp16", setup, NULL);
    CU_add_test(s, "an fp16 GPT trains: near fp32; with overflows, bitwise across splits, "
                   "recomputation, offload, the host optimizer and ZeRO-1",
                test_fp16_trains);
    CU_add_test(s, "flash attention and the Llama in fp16: bitwise across splits, measured "
                   "bytes as sized", test_fp16_flash_llama);
    CU_add_test(s, "an fp16 job shared with an fp32 one trains as alone", test_fp16_shared);
    CU_add_test(s, "a resumed fp16 run is bitwise the uninterrupted one", test_fp16_resume);
    CU_add_test(s, "non-finite weights from --init and --resume are refused, named",
                test_nonfinite_weights_refused);
    CU_add_test(s, "a NaN stops an fp32 run on every rank and is a skipped fp16 step",
                test_nonfinite_stops);
    CU_add_test(s, "an overflow at the minimum scale stops the run", test_scale_at_min);
    CU_add_test(s, "loss scaling options out of range or for bf16 are refused",
                test_options_refused);
    return test_main();
}
