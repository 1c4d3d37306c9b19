/* `mpirun -np S*dp ballast train` on a plan with dp replicas, against the independent
 * reference of one pipeline of dp*M micro-batches on S ranks (its own plan): the first step's
 * loss bitwise (same weights, the same samples, the micro-batch losses summed in the same
 * order), every loss and the weights within 1e-4 relative (the gradients' float sums are
 * grouped by replica, so later steps differ in rounding), and so each stage's checkpoint
 * (weights, averaged gradients, AdamW m and v); the dp run bitwise reproducible; checkpoints
 * resumed bitwise; a wrong -np and tp > 1 refused. ZeRO-1 (shard_optimizer) and the
 * optimizer on the host against the unsharded device-optimizer dp run: bitwise. Gradients
 * reduced in buckets of 4 KiB (several a stage, started as the backward goes) against one
 * reduction after the last backward: bitwise. Runs pin --threads 1. */
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
#define CKPT_HEADER_BYTES 120 /* runtime/ckpt.c's struct ckpt_header */

static char plan_one[2][1024], plan_dp[2][1024], plan_tp[1024], plan_m[1024], plan_zero[1024],
    plan_dp3[1024], plan_zero3[1024], plan_bucket[2][1024], plan_bucket_sched[2][2][1024];

/* `ballast plan` of a cluster of n CPU stages, micro_batches m, each stage `group` ("" or
 * ", \"dp\": 2" ...), the cluster `top` ("" or ", \"shard_optimizer\": true"). */
static void make_plan_sched(const char *name, const char *sched, int n, int m,
                            const char *group, const char *top, char *out, size_t size)
{
    char text[2048], file[64];
    int len = snprintf(text, sizeof text,
                       "{\"format\": \"ballast-cluster/1\", \"schedule\": \"%s\", "
                       "\"micro_batches\": %d%s, \"stages\": [",
                       sched, m, top);
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

static void make_plan_top(const char *name, int n, int m, const char *group, const char *top,
                          char *out, size_t size)
{
    make_plan_sched(name, "1f1b", n, m, group, top, out, size);
}

static void make_plan(const char *name, int n, int m, const char *group, char *out, size_t size)
{
    make_plan_top(name, n, m, group, "", out, size);
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
    make_plan("m", 2, 2, "", plan_m, sizeof plan_m);
    make_plan("tp", 2, 2, ", \"dp\": 2, \"tp\": 2", plan_tp, sizeof plan_tp);
    make_plan_top("zero", 2, 2, ", \"dp\": 2", ", \"shard_optimizer\": true", plan_zero,
                  sizeof plan_zero);
    make_plan("dp3x1", 1, 2, ", \"dp\": 3", plan_dp3, sizeof plan_dp3);
    make_plan_top("zero3x1", 1, 2, ", \"dp\": 3", ", \"shard_optimizer\": true", plan_zero3,
                  sizeof plan_zero3);
    make_plan_top("bucket0", 2, 2, ", \"dp\": 2", ", \"dp_bucket_bytes\": 0", plan_bucket[0],
                  sizeof plan_bucket[0]);
    make_plan_top("bucket4k", 2, 2, ", \"dp\": 2", ", \"dp_bucket_bytes\": \"4KiB\"",
                  plan_bucket[1], sizeof plan_bucket[1]);
    static const char *const sched[2] = {"zb-h1", "interleaved"};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++) {
            char name[32];
            snprintf(name, sizeof name, "%s-%s", sched[i], k ? "4k" : "0");
            make_plan_sched(name, sched[i], 2, 2, ", \"dp\": 2",
                            k ? ", \"dp_bucket_bytes\": \"4KiB\"" : ", \"dp_bucket_bytes\": 0",
                            plan_bucket_sched[i][k], sizeof plan_bucket_sched[i][k]);
        }
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

static char *read_all(const char *path, long *n)
{
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    *n = 0;
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    text = size > 0 ? malloc((size_t)size) : NULL;
    if (text != NULL && fread(text, 1, (size_t)size, f) == (size_t)size)
        *n = size;
    fclose(f);
    return text;
}

/* The largest |a - b| over the largest |a| of n floats. */
static double distance(const float *a, const float *b, long n)
{
    double top = 0, diff = 0;
    for (long i = 0; i < n; i++) {
        top = fmax(top, fabs(a[i]));
        diff = fmax(diff, fabs((double)a[i] - b[i]));
    }
    return top > 0 ? diff / top : (diff > 0 ? 1 : 0);
}

/* Two files of fp32 data after `header` bytes that must match (skip: floats left out at the
 * end), compared in `sections` equal parts: the worst part's distance, or 1 if the files do
 * not match. header < 0: a safetensors file's (its 8-byte length and JSON). */
static double files_distance(const char *a_path, const char *b_path, long header, int sections,
                             long skip)
{
    long n[2];
    char *a = read_all(a_path, &n[0]), *b = read_all(b_path, &n[1]);
    double worst = 1;
    if (header < 0 && n[0] > 8) {
        uint64_t h;
        memcpy(&h, a, 8); /* little-endian hosts only, as the runtime */
        header = h < (uint64_t)n[0] ? 8 + (long)h : n[0];
    }
    long floats = (n[0] - header) / 4 - skip;
    if (a != NULL && b != NULL && n[0] == n[1] && floats > 0 && floats % sections == 0 &&
        memcmp(a, b, (size_t)header) == 0) {
        worst = 0;
        long part = floats / sections;
        for (int k = 0; k < sections; k++)
            worst = fmax(worst, distance((const float *)(a + header) + k * part,
                                         (const float *)(b + header) + k * part, part));
    }
    free(a);
    free(b);
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
    char save[2][1100];
    snprintf(save[0], sizeof save[0], "--save '%s'", test_path(one));
    snprintf(save[1], sizeof save[1], "--save '%s'", test_path(dp));
    if (train_ok(S, plan_one[which], one, save[0], &a) ||
        train_ok(2 * S, plan_dp[which], dp, save[1], &b) ||
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
    char path_a[1024];
    snprintf(file_a, sizeof file_a, "%s.safetensors", one);
    snprintf(file_b, sizeof file_b, "%s.safetensors", dp);
    snprintf(path_a, sizeof path_a, "%s", test_path(file_a));
    double d = files_distance(path_a, test_path(file_b), -1, 1, 0);
    if (d > 1e-4)
        fprintf(stderr, "\n%d stages: weights differ by %g of the largest\n", S, d);
    CU_ASSERT(d <= 1e-4);
    /* each stage's checkpoint: the same header (the identity of one pipeline of 2M), and its
     * weights, averaged gradients, AdamW m and v each within 1e-4 of its largest */
    for (int s = 0; s < S; s++) {
        char b[1200];
        snprintf(path_a, sizeof path_a, "%s/stage-%d-step-4.ckpt", test_path(one), s);
        snprintf(b, sizeof b, "%s/stage-%d-step-4.ckpt", test_path(dp), s);
        d = files_distance(path_a, b, CKPT_HEADER_BYTES, 4, 2);
        if (d > 1e-4)
            fprintf(stderr, "\n%d stages: stage %d's checkpoint differs by %g\n", S, s, d);
        CU_ASSERT(d <= 1e-4);
    }
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
    /* CPU ranks: NCCL is for replicas on GPUs of their own */
    const cJSON *kind = cJSON_GetObjectItem(st, "allreduce");
    CU_ASSERT(cJSON_IsString(kind) && strcmp(kind->valuestring, "mpi") == 0);
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
    /* its identity is one pipeline of 2M micro-batches: that pipeline resumes it (then
     * differing in rounding only); one of M refuses it */
    struct train_metrics one;
    if (train_ok(2, plan_one[0], "one2-rest", extra, &one) == 0) {
        CU_ASSERT_EQUAL(one.n_steps, 2);
        CU_ASSERT(test_close(one.loss[0], full.loss[2], 0, 1e-4));
        CU_ASSERT(test_close(one.loss[1], full.loss[3], 0, 1e-4));
    }
    char *err = NULL;
    snprintf(args, sizeof args, "--plan '%s' %s", plan_m, extra);
    CU_ASSERT_EQUAL(train(2, args, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "written with 4 micro-batches per step; the plan has 2"));
    free(err);
    /* replica 0 wrote the checkpoint: one file per stage */
    snprintf(a, sizeof a, "%s/stage-1-step-2.ckpt", dir);
    FILE *f = fopen(a, "rb");
    CU_ASSERT_PTR_NOT_NULL(f);
    if (f)
        fclose(f);
}

/* Stage s's number `key` in plan `file`, and its layers' optimizer bytes (fp32: half the
 * state) in *optimizer; -1 if missing. */
static long long plan_stage_number(const char *file, int s, const char *key, long long *optimizer)
{
    cJSON *o = train_json_read(file);
    const cJSON *st = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "stages"), s);
    const cJSON *v = cJSON_GetObjectItem(st, key), *l;
    long long n = cJSON_IsNumber(v) ? (long long)v->valuedouble : cJSON_IsTrue(v) ? 1 : -1;
    *optimizer = 0;
    cJSON_ArrayForEach(l, cJSON_GetObjectItem(st, "layer_costs"))
        *optimizer += (long long)cJSON_GetObjectItem(l, "state_bytes")->valuedouble / 2;
    cJSON_Delete(o);
    return n;
}

/* --save DIR --steps N (the later --steps wins) on 4 ranks of `plan`, DIR cleared first. */
static void save_steps(const char *plan, const char *name, const char *steps)
{
    char args[4096], dir[1024];
    snprintf(dir, sizeof dir, "%s", test_path(name));
    snprintf(args, sizeof args, "rm -rf '%s'", dir);
    CU_ASSERT_EQUAL(system(args), 0);
    snprintf(args, sizeof args, "--plan '%s' --save '%s' --steps %s", plan, dir, steps);
    CU_ASSERT_EQUAL(train(4, args, NULL), 0);
}

static int same_stage_files(const char *dir_a, const char *dir_b, int S, int step)
{
    int same = 1;
    for (int s = 0; s < S; s++) {
        char a[1200], b[1200];
        snprintf(a, sizeof a, "%s/stage-%d-step-%d.ckpt", dir_a, s, step);
        snprintf(b, sizeof b, "%s/stage-%d-step-%d.ckpt", dir_b, s, step);
        same &= train_files_equal(a, b);
    }
    return same;
}

/* ZeRO-1 (the cluster's shard_optimizer, carried by the plan): dp 2 with each replica keeping
 * half of AdamW's state is bitwise the unsharded dp 2 run (losses, weights, checkpoints),
 * resumes its checkpoints and it ours bitwise, and each rank's measured peak is the planned
 * one and falls by half the optimizer state. */
static void test_zero1(void)
{
    long long opt[2], opt_sharded;
    for (int s = 0; s < 2; s++) {
        CU_ASSERT_EQUAL(plan_stage_number(plan_zero, s, "shard_optimizer", &opt_sharded), 1);
        CU_ASSERT_EQUAL(plan_stage_number(plan_dp[0], s, "shard_optimizer", &opt[s]), -1);
    }
    /* a value other than true or false is refused, naming the field */
    cJSON *bad = train_json_read(plan_zero);
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(bad, "stages"), 1),
                              "shard_optimizer", cJSON_CreateNumber(3));
    char *text = cJSON_PrintUnformatted(bad), args[2048], *err = NULL;
    snprintf(args, sizeof args, "simulate --plan '%s'", test_write("plan-zero-bad.json", text));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "plan-zero-bad.json: stages[1].shard_optimizer: "
                                         "expected true or false") != NULL);
    free(err);
    free(text);
    cJSON_Delete(bad);
    save_steps(plan_dp[0], "zero-ref", STEPS);
    save_steps(plan_zero, "zero-run", STEPS);
    char ref[1024], run[1024], extra[2048];
    snprintf(ref, sizeof ref, "%s", test_path("zero-ref"));
    snprintf(run, sizeof run, "%s", test_path("zero-run"));
    CU_ASSERT(same_stage_files(ref, run, 2, 4));
    struct train_metrics full, zero, resumed[2];
    if (train_ok(4, plan_dp[0], "zero-full", "", &full) ||
        train_ok(4, plan_zero, "zero-zero", "", &zero))
        return;
    CU_ASSERT_EQUAL(train_same_losses(&full, &zero), 1);
    CU_ASSERT(train_files_equal(test_path("zero-full.safetensors"),
                                test_path("zero-zero.safetensors")));
    for (int s = 0; s < 2; s++) {
        long long planned = plan_stage_number(plan_zero, s, "memory_bytes", &opt_sharded);
        long long drop = full.peak[s] - zero.peak[s];
        CU_ASSERT(zero.planned[s] == planned);
        CU_ASSERT(test_close((double)zero.peak[s], (double)zero.planned[s], 0, 0.02));
        CU_ASSERT(test_close((double)full.peak[s], (double)full.planned[s], 0, 0.02));
        /* the planner rounds each layer's half up, the runtime the stage's slice */
        CU_ASSERT(drop > 0 && llabs(drop - opt[s] / 2) <= 64);
        if (llabs(drop - opt[s] / 2) > 64)
            fprintf(stderr, "\nstage %d: peak %lld unsharded, %lld sharded; optimizer %lld\n",
                    s, full.peak[s], zero.peak[s], opt[s]);
    }
    /* checkpoints of step 2 across: the sharded run resumes the unsharded one's, and back */
    save_steps(plan_dp[0], "zero-ref2", "2");
    save_steps(plan_zero, "zero-run2", "2");
    snprintf(extra, sizeof extra, "--resume '%s'", test_path("zero-ref2"));
    if (train_ok(4, plan_zero, "zero-from-ref", extra, &resumed[0]))
        return;
    snprintf(extra, sizeof extra, "--resume '%s'", test_path("zero-run2"));
    if (train_ok(4, plan_dp[0], "ref-from-zero", extra, &resumed[1]))
        return;
    for (int k = 0; k < 2; k++) {
        CU_ASSERT_EQUAL_FATAL(resumed[k].n_steps, 2);
        CU_ASSERT(resumed[k].loss[0] == full.loss[2] && resumed[k].loss[1] == full.loss[3]);
    }
    CU_ASSERT(train_files_equal(test_path("zero-from-ref.safetensors"),
                                test_path("zero-full.safetensors")));
    CU_ASSERT(train_files_equal(test_path("ref-from-zero.safetensors"),
                                test_path("zero-full.safetensors")));
}

/* The optimizer on the host with dp 2: each layer's host update starts once the replicas'
 * gradients are reduced, and the run is bitwise the device optimizer's dp run (losses,
 * weights, checkpoints); each rank's device peak is the plan's. The same with a fraction of
 * the optimizer on the host (each stage's last layer's). */
static void test_host_optimizer(void)
{
    char host[1024], dir[2][1024], extra[2][1100];
    snprintf(host, sizeof host, "%s", test_path("plan-dp2-host.json"));
    train_plan_host_optimizer(plan_dp[0], host, 3, 0);
    for (int k = 0; k < 2; k++) {
        snprintf(dir[k], sizeof dir[k], "%s", test_path(k ? "hostopt-dev" : "hostopt-host"));
        snprintf(extra[k], sizeof extra[k], "--save '%s'", dir[k]);
    }
    struct train_metrics on_host, dev;
    if (train_ok(4, host, "hostopt-host", extra[0], &on_host) ||
        train_ok(4, plan_dp[0], "hostopt-dev", extra[1], &dev))
        return;
    CU_ASSERT_EQUAL(train_same_losses(&on_host, &dev), 1);
    CU_ASSERT(train_files_equal(test_path("hostopt-host.safetensors"),
                                test_path("hostopt-dev.safetensors")));
    CU_ASSERT(same_stage_files(dir[0], dir[1], 2, 4));
    for (int s = 0; s < 2; s++) {
        CU_ASSERT(test_close((double)on_host.peak[s], (double)on_host.planned[s], 0, 0.02));
        CU_ASSERT(on_host.peak[s] < dev.peak[s]); /* m and v live on the host */
    }
    /* a fraction: each stage's second layer's optimizer on the host, after the reduction */
    char split[1024], split_dir[1024], extra_split[1100];
    struct train_metrics part;
    snprintf(split, sizeof split, "%s", test_path("plan-dp2-split.json"));
    snprintf(split_dir, sizeof split_dir, "%s", test_path("hostopt-split"));
    snprintf(extra_split, sizeof extra_split, "--save '%s'", split_dir);
    train_plan_host_optimizer_from(plan_dp[0], split, 3, 1, 0);
    if (train_ok(4, split, "hostopt-split", extra_split, &part))
        return;
    CU_ASSERT_EQUAL(train_same_losses(&part, &dev), 1);
    CU_ASSERT(same_stage_files(split_dir, dir[1], 2, 4));
}

/* dp 3 of one stage: its 30080 floats do not divide by 3, so the last slice is shorter, and
 * the slices cut tensors; still bitwise the unsharded run. */
static void test_zero1_uneven(void)
{
    struct train_metrics full, zero;
    if (train_ok(3, plan_dp3, "zero3-full", "", &full) ||
        train_ok(3, plan_zero3, "zero3-zero", "", &zero))
        return;
    CU_ASSERT_EQUAL(train_same_losses(&full, &zero), 1);
    CU_ASSERT(train_files_equal(test_path("zero3-full.safetensors"),
                                test_path("zero3-zero.safetensors")));
    CU_ASSERT(test_close((double)zero.peak[0], (double)zero.planned[0], 0, 0.02));
    CU_ASSERT(zero.peak[0] < full.peak[0]);
}

/* Buckets of 4 KiB (every layer of this model holds more: each its own, two a stage) against
 * one reduction of everything after the last backward, under 1F1B, ZB-H1 (the buckets start
 * in the last weight passes) and interleaved 1F1B (each chunk's in its last backward): the
 * same sums in the same order, bitwise; the simulated steps count them. */
static void buckets_equal(const char *const plan[2], const char *tag)
{
    char dir[2][1024], extra[2][1100], name[2][64], file[2][80];
    struct train_metrics m[2];
    for (int k = 0; k < 2; k++) {
        snprintf(name[k], sizeof name[k], "%sbucket%s", tag, k ? "4k" : "0");
        snprintf(file[k], sizeof file[k], "%s.safetensors", name[k]);
        snprintf(dir[k], sizeof dir[k], "%s", test_path(name[k]));
        snprintf(extra[k], sizeof extra[k], "--save '%s'", dir[k]);
        if (train_ok(4, plan[k], name[k], extra[k], &m[k]))
            return;
    }
    CU_ASSERT_EQUAL(train_same_losses(&m[0], &m[1]), 1);
    CU_ASSERT(train_files_equal(test_path(file[0]), test_path(file[1])));
    CU_ASSERT(same_stage_files(dir[0], dir[1], 2, 4));
    /* the simulated step of each: a bucket a layer (4 of them) with 4 KiB, else one a stage */
    for (int k = 0; k < 2; k++) {
        char args[2048], out[1024], sim[80];
        int buckets = 0, n = 0;
        snprintf(sim, sizeof sim, "sim-%s%s.json", tag, k ? "4k" : "0");
        snprintf(out, sizeof out, "%s", test_path(sim));
        snprintf(args, sizeof args, "simulate --plan '%s' -o '%s'", plan[k], out);
        CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
        cJSON *o = train_json_read(out);
        const cJSON *st;
        cJSON_ArrayForEach(st, cJSON_GetObjectItem(o, "stages")) {
            buckets += cJSON_GetObjectItem(st, "allreduce_buckets")->valueint;
            n++;
        }
        CU_ASSERT(k ? buckets == 4 : buckets == n);
        cJSON_Delete(o);
    }
}

static void test_buckets(void)
{
    const char *const one[2] = {plan_bucket[0], plan_bucket[1]};
    buckets_equal(one, "");
    for (int i = 0; i < 2; i++) {
        const char *const plan[2] = {plan_bucket_sched[i][0], plan_bucket_sched[i][1]};
        buckets_equal(plan, i ? "il-" : "zb-");
    }
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
    char host[1024];
    snprintf(host, sizeof host, "%s", test_path("plan-zero-host.json"));
    train_plan_host_optimizer(plan_zero, host, 3, 0);
    expect_refused(4, host, "stages[0]: the optimizer on the host and shard_optimizer with dp "
                            "2: ballast train shards the optimizer on the device only");
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("train_dp", setup, NULL);
    CU_add_test(s, "dp 2 of 2 stages on 4 ranks = one pipeline of 2M micro-batches",
                test_two_stages);
    CU_add_test(s, "dp 2 of 3 stages on 6 ranks = one pipeline of 2M micro-batches",
                test_three_stages);
    CU_add_test(s, "a dp run resumed from its checkpoint = the run without interruption; "
                   "one pipeline of 2M resumes it, one of M refuses it",
                test_resume);
    CU_add_test(s, "ZeRO-1: the optimizer sharded over 2 replicas = unsharded, bitwise; its "
                   "checkpoints resumed both ways; the peak falls by half the optimizer",
                test_zero1);
    CU_add_test(s, "ZeRO-1 over 3 replicas, uneven slices: bitwise unsharded", test_zero1_uneven);
    CU_add_test(s, "the optimizer on the host with dp 2 = on the device, bitwise",
                test_host_optimizer);
    CU_add_test(s, "gradients in buckets = one reduction, bitwise", test_buckets);
    CU_add_test(s, "a wrong -np, tp > 1 and a sharded host optimizer refused with the numbers",
                test_refused);
    return test_main();
}
