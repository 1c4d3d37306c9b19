/* `mpirun -np S*dp ballast train` on a plan with dp replicas, against the independent
 * reference of one pipeline of dp*M micro-batches on S ranks (its own plan): the first step's
 * loss bitwise (same weights, the same samples, the micro-batch losses summed in the same
 * order), every loss and the weights within 1e-4 relative (the gradients' float sums are
 * grouped by replica, so later steps differ in rounding); the dp run bitwise reproducible;
 * checkpoints resumed bitwise; a wrong -np and tp > 1 refused. Runs pin --threads 1. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "traintest.h"

#define RUN_LIMIT_S 120
#define STEPS "4"

static char plan_one[2][1024], plan_dp[2][1024], plan_tp[1024];

/* `ballast plan` of a cluster of n CPU stages, micro_batches m, each stage `group` ("" or
 * ", \"dp\": 2" ...). */
static void make_plan(const char *name, int n, int m, const char *group, char *out, size_t size)
{
    char text[2048], file[64];
    int len = snprintf(text, sizeof text,
                       "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", "
                       "\"micro_batches\": %d, \"stages\": [",
                       m);
    for (int s = 0; s < n; s++)
        len += snprintf(text + len, sizeof text - (size_t)len,
                        "%s{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
                        "\"prof-dp.json\"%s}",
                        s ? ", " : "", group);
    snprintf(text + len, sizeof text - (size_t)len, "]}");
    snprintf(file, sizeof file, "cluster-%s.json", name);
    char cluster[1024], args[4096];
    snprintf(cluster, sizeof cluster, "%s", test_write(file, text));
    snprintf(file, sizeof file, "plan-%s.json", name);
    snprintf(out, size, "%s", test_path(file));
    snprintf(args, sizeof args, "plan --cluster '%s' --method none --unit 1K --quiet -o '%s'",
             cluster, out);
    if (test_run(args, NULL, NULL) != 0)
        fprintf(stderr, "plan %s failed\n", name);
}

static int setup(void)
{
    test_write("dp.json", "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", \"n_layer\": 2, "
                          "\"n_embd\": 32, \"n_head\": 2, \"seq_len\": 16, \"vocab_size\": 64, "
                          "\"micro_batch\": 2, \"dtype\": \"fp32\"}");
    char args[2048], model[1024];
    snprintf(model, sizeof model, "%s", test_path("dp.json"));
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu -o '%s'", model,
             test_path("prof-dp.json"));
    if (test_run(args, NULL, NULL) != 0)
        fprintf(stderr, "profile failed\n");
    for (int i = 0; i < 2; i++) { /* 2 and 3 stages */
        char name[32];
        snprintf(name, sizeof name, "one%d", i + 2);
        make_plan(name, i + 2, 4, "", plan_one[i], sizeof plan_one[i]);
        snprintf(name, sizeof name, "dp%d", i + 2);
        make_plan(name, i + 2, 2, ", \"dp\": 2", plan_dp[i], sizeof plan_dp[i]);
    }
    make_plan("tp", 2, 2, ", \"dp\": 2, \"tp\": 2", plan_tp, sizeof plan_tp);
    return 0;
}

/* mpirun -np NP ballast train --threads 1 --steps STEPS --quiet ARGS: its status. */
static int train(int np, const char *args, char **err)
{
    char full[4096];
    snprintf(full, sizeof full, "--threads 1 --steps " STEPS " --quiet %s", args);
    struct train_run r = train_exec(np, RUN_LIMIT_S, full);
    int status = r.status;
    if (err != NULL)
        *err = r.err;
    else
        free(r.err);
    free(r.out);
    return status;
}

/* A run that must succeed, writing tmpdir/NAME.json (metrics) and tmpdir/NAME.safetensors. */
static int train_ok(int np, const char *plan, const char *name, const char *extra,
                    struct train_metrics *m)
{
    char args[4096], file[64], metrics[1024];
    snprintf(file, sizeof file, "%s.json", name);
    snprintf(metrics, sizeof metrics, "%s", test_path(file));
    snprintf(file, sizeof file, "%s.safetensors", name);
    snprintf(args, sizeof args, "--plan '%s' --metrics '%s' --save-weights '%s' %s", plan,
             metrics, test_path(file), extra);
    char *err = NULL;
    int status = train(np, args, &err);
    CU_ASSERT_EQUAL(status, 0);
    if (status != 0)
        fprintf(stderr, "\ntrain -np %d %s: status %d\n%s\n", np, args, status, err ? err : "");
    free(err);
    return status == 0 ? train_metrics_read(metrics, m) : -1;
}

/* The weights of two safetensors files (fp32, the same tensors in the same order): the
 * largest |a - b| over the largest |a|, or 1 if the files do not match. */
static double weights_distance(const char *a_name, const char *b_name)
{
    char a_path[1024];
    snprintf(a_path, sizeof a_path, "%s", test_path(a_name));
    FILE *f[2] = {fopen(a_path, "rb"), fopen(test_path(b_name), "rb")};
    char *text[2] = {NULL, NULL};
    long n[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        if (f[i] == NULL)
            continue;
        fseek(f[i], 0, SEEK_END);
        n[i] = ftell(f[i]);
        rewind(f[i]);
        text[i] = malloc((size_t)n[i] + 1);
        if (text[i] != NULL && fread(text[i], 1, (size_t)n[i], f[i]) != (size_t)n[i])
            n[i] = 0;
        fclose(f[i]);
    }
    uint64_t header = 0;
    double worst = 1;
    if (text[0] != NULL && text[1] != NULL && n[0] == n[1] && n[0] > 8) {
        memcpy(&header, text[0], 8); /* little-endian hosts only, as the runtime */
        if (header + 8 <= (uint64_t)n[0] && memcmp(text[0], text[1], 8 + header) == 0) {
            const float *x = (const float *)(text[0] + 8 + header),
                        *y = (const float *)(text[1] + 8 + header);
            long count = (n[0] - 8 - (long)header) / 4;
            double top = 0, diff = 0;
            for (long i = 0; i < count; i++) {
                top = fmax(top, fabs(x[i]));
                diff = fmax(diff, fabs((double)x[i] - y[i]));
            }
            worst = top > 0 ? diff / top : 1;
        }
    }
    free(text[0]);
    free(text[1]);
    return worst;
}

static void expect_dp_equals_one_pipeline(int which)
{
    int S = which + 2;
    char one[32], dp[32], again[32], file_a[64], file_b[64];
    snprintf(one, sizeof one, "one%d", S);
    snprintf(dp, sizeof dp, "dp%d", S);
    snprintf(again, sizeof again, "dp%d-again", S);
    struct train_metrics a, b, c;
    if (train_ok(S, plan_one[which], one, "", &a) || train_ok(2 * S, plan_dp[which], dp, "", &b) ||
        train_ok(2 * S, plan_dp[which], again, "", &c))
        return;
    CU_ASSERT_EQUAL(b.n_steps, 4);
    CU_ASSERT_EQUAL(a.n_steps, b.n_steps);
    CU_ASSERT_EQUAL(b.n_stages, S); /* replica 0's stages */
    /* step 1: the same weights and samples, the losses summed in one order */
    CU_ASSERT(a.loss[0] == b.loss[0]);
    for (int i = 0; i < a.n_steps; i++) {
        CU_ASSERT(test_close(b.loss[i], a.loss[i], 0, 1e-4));
        if (!test_close(b.loss[i], a.loss[i], 0, 1e-4))
            fprintf(stderr, "\nstep %d: loss %.9g with dp 2, %.9g one pipeline\n", i + 1,
                    b.loss[i], a.loss[i]);
    }
    CU_ASSERT(a.loss[3] < a.loss[0]); /* it trains */
    snprintf(file_a, sizeof file_a, "%s.safetensors", one);
    snprintf(file_b, sizeof file_b, "%s.safetensors", dp);
    double d = weights_distance(file_a, file_b);
    if (d > 1e-4)
        fprintf(stderr, "\n%d stages: weights differ by %g of the largest\n", S, d);
    CU_ASSERT(d <= 1e-4);
    /* the reduction's order is fixed: the dp run again is bitwise the same */
    CU_ASSERT_EQUAL(train_same_losses(&b, &c), 1);
    snprintf(file_a, sizeof file_a, "%s.safetensors", again);
    CU_ASSERT_EQUAL(train_files_equal(test_path(file_a), test_path(file_b)), 1);
    /* the metrics name the replicas and each stage's all-reduce */
    char metrics[64];
    snprintf(metrics, sizeof metrics, "%s.json", dp);
    cJSON *o = train_json_read(test_path(metrics));
    const cJSON *st = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "stages"), S - 1);
    const cJSON *ms = cJSON_GetObjectItem(st, "allreduce_ms");
    CU_ASSERT(cJSON_IsNumber(cJSON_GetObjectItem(o, "dp")) &&
              cJSON_GetObjectItem(o, "dp")->valueint == 2);
    CU_ASSERT(cJSON_IsNumber(ms) && ms->valuedouble > 0);
    cJSON_Delete(o);
}

static void test_two_stages(void)
{
    expect_dp_equals_one_pipeline(0);
}

static void test_three_stages(void)
{
    expect_dp_equals_one_pipeline(1);
}

/* Checkpoints of step 2 (replica 0's), resumed on 2*S ranks to step 4: bitwise the run
 * without interruption. */
static void test_resume(void)
{
    char args[4096], dir[1024], extra[2048];
    snprintf(dir, sizeof dir, "%s", test_path("ckpt-dp"));
    snprintf(args, sizeof args, "rm -rf '%s'", dir);
    CU_ASSERT_EQUAL(system(args), 0);
    snprintf(args, sizeof args, "--plan '%s' --save '%s' --steps 2", plan_dp[0], dir);
    CU_ASSERT_EQUAL(train(4, args, NULL), 0); /* the later --steps wins */
    struct train_metrics full, rest;
    snprintf(extra, sizeof extra, "--resume '%s'", dir);
    if (train_ok(4, plan_dp[0], "dp2-full", "", &full) ||
        train_ok(4, plan_dp[0], "dp2-rest", extra, &rest))
        return;
    CU_ASSERT_EQUAL_FATAL(rest.n_steps, 2);
    CU_ASSERT(rest.loss[0] == full.loss[2] && rest.loss[1] == full.loss[3]);
    char a[1024];
    snprintf(a, sizeof a, "%s", test_path("dp2-full.safetensors"));
    CU_ASSERT(train_files_equal(a, test_path("dp2-rest.safetensors")));
    /* replica 0 wrote the checkpoint: one file per stage */
    snprintf(a, sizeof a, "%s/stage-1-step-2.ckpt", dir);
    FILE *f = fopen(a, "rb");
    CU_ASSERT_PTR_NOT_NULL(f);
    if (f)
        fclose(f);
}

static void expect_refused(int np, const char *plan, const char *needle)
{
    char args[2048], *err = NULL;
    snprintf(args, sizeof args, "--plan '%s'", plan);
    int status = train(np, args, &err);
    CU_ASSERT_EQUAL(status, 2);
    CU_ASSERT(err != NULL && strstr(err, needle) != NULL);
    if (err == NULL || strstr(err, needle) == NULL)
        fprintf(stderr, "\nexpected \"%s\" in: %s\n", needle, err ? err : "(nothing)");
    free(err);
}

static void test_refused(void)
{
    expect_refused(2, plan_dp[0], "the plan has 2 stages and dp 2, one MPI rank per stage of "
                                  "each replica, 4 ranks, but this run has 2 ranks (mpirun -np 4)");
    expect_refused(5, plan_dp[0], "but this run has 5 ranks (mpirun -np 4)");
    expect_refused(4, plan_tp, "stages[0]: tp 2, dp 2");
    expect_refused(4, plan_tp, "is for export");
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("train_dp", setup, NULL);
    CU_add_test(s, "dp 2 of 2 stages on 4 ranks = one pipeline of 2M micro-batches",
                test_two_stages);
    CU_add_test(s, "dp 2 of 3 stages on 6 ranks = one pipeline of 2M micro-batches",
                test_three_stages);
    CU_add_test(s, "a dp run resumed from its checkpoint = the run without interruption",
                test_resume);
    CU_add_test(s, "a wrong -np and tp > 1 refused with the numbers", test_refused);
    return test_main();
}
