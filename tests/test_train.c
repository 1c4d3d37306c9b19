/* `mpirun -np S ballast train` end to end, on plans made by `ballast plan` from cluster files
 * written here. References are other runs: the same model on 1, 2 and 4 ranks, without
 * recomputation, under the other schedule, without interruption; the cost model's memory;
 * the synthetic source's entropy. Every run's metrics must also show each stage's measured
 * peak within 2% of its plan (|peak - planned| <= 0.02 planned). Runs pin --threads 1 and
 * each has a time limit, so a hang fails instead of blocking. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "cost.h"
#include "cuda_device.h"
#include "jsonio.h"
#include "layout.h"
#include "plan.h"
#include "sim.h"
#include "testutil.h"
#include "traintest.h"

#define RUN_LIMIT_S 120
/* mpirun -np NP ballast train --threads 1 ARGS */
static struct train_run train(int np, const char *args)
{
    char with_threads[8192];
    snprintf(with_threads, sizeof with_threads, "--threads 1 %s", args);
    return train_exec(np, RUN_LIMIT_S, with_threads);
}

/* A run that must succeed, one thread per rank: its metrics, with the memory checked. */
static int train_ok(int np, const char *plan, const char *extra, const char *metrics_name,
                    struct train_metrics *m)
{
    char with_threads[4096];
    snprintf(with_threads, sizeof with_threads, "--threads 1 %s", extra);
    return train_run_ok(np, RUN_LIMIT_S, plan, with_threads, metrics_name, m);
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

/* ---- configurations ---- */

#define N_PLANS_MAX 16

static char plan_path[N_PLANS_MAX][1024];
enum {
    P1, P2, P2_FULL, P2_SPLIT, P4, P4_GPIPE, TIGHT, TIGHT_NONE, ENTROPY, BYTES, BF16, OPTIONS,
    OPTIONS_MIXED, N_PLANS
};

static void write_model(const char *name, int n_layer, int n_embd, int n_head, int seq_len,
                        int vocab, int micro_batch, const char *dtype)
{
    char text[512];
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", \"n_layer\": %d, "
             "\"n_embd\": %d, \"n_head\": %d, \"seq_len\": %d, \"vocab_size\": %d, "
             "\"micro_batch\": %d, \"dtype\": \"%s\"}",
             n_layer, n_embd, n_head, seq_len, vocab, micro_batch, dtype);
    char file[256];
    snprintf(file, sizeof file, "%s.json", name);
    test_write(file, text);
    char args[2048], prof[256];
    snprintf(prof, sizeof prof, "prof-%s.json", name);
    char model_path[1024], prof_path[1024];
    snprintf(model_path, sizeof model_path, "%s", test_path(file));
    snprintf(prof_path, sizeof prof_path, "%s", test_path(prof));
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu -o '%s'",
             model_path, prof_path);
    if (test_run(args, NULL, NULL) != 0)
        fprintf(stderr, "profile of %s failed\n", name);
}

/* A cluster of `n` stages on profile prof-<model>.json; `layers` "[a,b],[c,d]" or NULL for an
 * even split; limits per stage (0: 1 GiB); then `ballast plan`. */
static void make_plan(int which, const char *model, int n, const char *schedule,
                      const int (*layers)[2], const long *limits, const char *method)
{
    char text[4096], name[64];
    int len = snprintf(text, sizeof text,
                       "{\"format\": \"ballast-cluster/1\", \"schedule\": \"%s\", "
                       "\"micro_batches\": 4, \"stages\": [",
                       schedule);
    for (int s = 0; s < n; s++) {
        len += snprintf(text + len, sizeof text - (size_t)len,
                        "%s{\"device\": \"cpu\", \"memory_bytes\": %ld, \"profile\": "
                        "\"prof-%s.json\"",
                        s ? ", " : "", limits && limits[s] ? limits[s] : 1L << 30, model);
        if (layers)
            len += snprintf(text + len, sizeof text - (size_t)len, ", \"layers\": [%d, %d]",
                            layers[s][0], layers[s][1]);
        len += snprintf(text + len, sizeof text - (size_t)len, "}");
    }
    snprintf(text + len, sizeof text - (size_t)len, "]}");
    snprintf(name, sizeof name, "cluster-%d.json", which);
    char cluster[1024];
    snprintf(cluster, sizeof cluster, "%s", test_write(name, text));
    snprintf(name, sizeof name, "plan-%d.json", which);
    snprintf(plan_path[which], sizeof plan_path[which], "%s", test_path(name));
    char args[4096];
    snprintf(args, sizeof args, "plan --cluster '%s' --method %s --unit 1K --quiet -o '%s'",
             cluster, method, plan_path[which]);
    char *err = NULL;
    if (test_run(args, NULL, &err) != 0)
        fprintf(stderr, "plan %d failed: %s\n", which, err ? err : "");
    free(err);
}

/* Plan `which`: plan `from` with the given recompute choices (traintest.h). */
static void plan_with_choices(int from, int which, const char *const *choice)
{
    char name[64];
    snprintf(name, sizeof name, "plan-%d.json", which);
    snprintf(plan_path[which], sizeof plan_path[which], "%s", test_path(name));
    train_plan_with_choices(plan_path[from], plan_path[which], choice);
}

static int setup(void)
{
    /* small: 4 planning layers (embed, 2 blocks, head), so 4 stages hold one each */
    write_model("small", 2, 32, 2, 16, 64, 2, "fp32");
    write_model("entropy", 1, 32, 2, 32, 16, 4, "fp32");
    write_model("bytes", 1, 32, 2, 16, 256, 2, "fp32");
    write_model("half", 1, 32, 2, 16, 64, 2, "bf16");
    make_plan(P1, "small", 1, "1f1b", NULL, NULL, "none");
    make_plan(P2, "small", 2, "1f1b", NULL, NULL, "none");
    make_plan(P2_FULL, "small", 2, "1f1b", NULL, NULL, "full");
    make_plan(P2_SPLIT, "small", 2, "1f1b", (const int[][2]){{0, 0}, {1, 3}}, NULL, "none");
    make_plan(P4, "small", 4, "1f1b", NULL, NULL, "none");
    make_plan(P4_GPIPE, "small", 4, "gpipe", NULL, NULL, "block:1");
    /* stage 0 holds embed and both blocks with 2 micro-batches in flight and too little
     * memory to keep everything: the optimal plan recomputes one block */
    make_plan(TIGHT, "small", 2, "1f1b", (const int[][2]){{0, 2}, {3, 3}},
              (const long[]){760000, 0}, "optimal");
    make_plan(TIGHT_NONE, "small", 2, "1f1b", (const int[][2]){{0, 2}, {3, 3}}, NULL, "none");
    make_plan(ENTROPY, "entropy", 2, "1f1b", NULL, NULL, "none");
    make_plan(BYTES, "bytes", 1, "1f1b", NULL, NULL, "none");
    make_plan(BF16, "half", 1, "1f1b", NULL, NULL, "none");
    /* partial recomputation on stage 0 (embed, block.0, block.1): block.0's attention
     * probabilities and block.1's GELU; or block.0 whole and block.1 both */
    plan_with_choices(TIGHT_NONE, OPTIONS, (const char *const[]){NULL, "attn", "mlp", NULL});
    plan_with_choices(TIGHT_NONE, OPTIONS_MIXED,
                      (const char *const[]){NULL, "full", "attn+mlp", NULL});
    return 0;
}

/* ---- the tests ---- */

static void expect_refused(int np, const char *args, int status, const char *needle);

static void test_ranks_identical(void)
{
    struct train_metrics m1, m2, m2s, m4, t2;
    if (train_ok(1, plan_path[P1], "--steps 4", "m1.json", &m1) ||
        train_ok(2, plan_path[P2], "--steps 4", "m2.json", &m2) ||
        train_ok(2, plan_path[P2_SPLIT], "--steps 4", "m2s.json", &m2s) ||
        train_ok(4, plan_path[P4], "--steps 4", "m4.json", &m4) ||
        train_ok(1, plan_path[P1], "--steps 4 --threads 2", "m1t2.json", &t2))
        return;
    CU_ASSERT(train_same_losses(&m1, &m2));
    CU_ASSERT(train_same_losses(&m1, &m2s)); /* another split of the same layers */
    CU_ASSERT(train_same_losses(&m1, &m4));
    CU_ASSERT(train_same_losses(&m1, &t2)); /* two threads: the same bits */
    /* and they are losses of training, not constants */
    CU_ASSERT(isfinite(m1.loss[0]) && m1.loss[3] < m1.loss[0]);
}

/* Appends op (kind, micro) of a stage's order: forwards and backwards of its first layer, and
 * the first recompute of each backward (a recomputed stage reruns before it). */
static void add_op(int *ops, int *n, int kind, int micro)
{
    if (kind == SIM_RECOMPUTE && *n > 0 && ops[2 * *n - 2] == SIM_RECOMPUTE &&
        ops[2 * *n - 1] == micro)
        return;
    ops[2 * *n] = kind;
    ops[2 * *n + 1] = micro;
    (*n)++;
}

/* Whether stage s reruns a forward before its backward: some layer it recomputes regenerates
 * a tensor. The cost model also charges a "recomputed" embedding, which keeps only its tokens
 * and so has nothing to rerun; the simulator's recompute task of such a stage has no
 * counterpart in the run. */
static int stage_reruns(const struct plan *p, int s)
{
    const struct plan_stage *st = &p->stages[s];
    int any = 0;
    for (int l = 0; l < plan_stage_layer_count(st); l++) {
        uint32_t regen = 0;
        struct err e;
        CU_ASSERT(layout_regen(&p->model, st->first + l, st->actions[l].choice, &st->layers[l],
                               &regen, &e) == ERR_OK);
        any |= regen != 0;
    }
    return any;
}

/* Each stage's forwards, recomputes and backwards of the first step, in the order the trace
 * of a real run recorded them, against the simulator's order for the plan. */
static void check_trace_order(const char *plan_file, const char *trace)
{
    struct plan p;
    struct sim_result r;
    struct err e;
    CU_ASSERT_FATAL(plan_load(plan_file, &p, &e) == ERR_OK);
    CU_ASSERT_FATAL(sim_plan(&p, &r, &e) == ERR_OK);
    cJSON *o = jsonio_read(trace, &e);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    int M = p.micro_batches, want[6 * 64], got[6 * 64];
    CU_ASSERT_FATAL(M <= 64);
    for (int s = 0; s < p.n_stages; s++) {
        int nw = 0, ng = 0;
        for (int i = 0; i < r.n_tasks; i++)
            if (r.tasks[i].stage == s && r.tasks[i].kind <= SIM_BACKWARD &&
                (r.tasks[i].kind != SIM_RECOMPUTE || stage_reruns(&p, s)))
                add_op(want, &nw, r.tasks[i].kind, r.tasks[i].micro);
        char first[MODEL_LAYER_NAME_MAX], name[64];
        model_layer_name(&p.model, p.stages[s].first, first);
        const cJSON *ev;
        cJSON_ArrayForEach(ev, cJSON_GetObjectItem(o, "traceEvents"))
        {
            const cJSON *tid = cJSON_GetObjectItem(ev, "tid"), *a = cJSON_GetObjectItem(ev, "args");
            const cJSON *step = cJSON_GetObjectItem(a, "step"),
                        *micro = cJSON_GetObjectItem(a, "micro_batch");
            const char *n = cJSON_GetStringValue(cJSON_GetObjectItem(ev, "name"));
            if (tid == NULL || tid->valueint != s || step == NULL || micro == NULL || n == NULL ||
                step->valueint != 1)
                continue;
            for (int kind = SIM_FORWARD; kind <= SIM_BACKWARD; kind++) {
                static const char *const kinds[] = {"forward", "recompute", "backward"};
                snprintf(name, sizeof name, "%s %s", kinds[kind], first);
                if (kind == SIM_RECOMPUTE ? strncmp(n, "recompute ", 10) == 0
                                          : strcmp(n, name) == 0)
                    add_op(got, &ng, kind, micro->valueint);
            }
        }
        CU_ASSERT_EQUAL(ng, nw);
        CU_ASSERT(ng == nw && memcmp(got, want, sizeof(int) * 2 * (size_t)nw) == 0);
        if (ng != nw || memcmp(got, want, sizeof(int) * 2 * (size_t)nw) != 0)
            fprintf(stderr, "\n%s stage %d: %d ops run, %d simulated\n", plan_file, s, ng, nw);
    }
    cJSON_Delete(o);
    sim_result_free(&r);
    plan_free(&p);
}

static void test_schedules_identical(void)
{
    struct train_metrics f, g;
    char tf[1024], tg[1024], extra[2048];
    snprintf(tf, sizeof tf, "%s", test_path("trace-1f1b.json"));
    snprintf(tg, sizeof tg, "%s", test_path("trace-gpipe.json"));
    snprintf(extra, sizeof extra, "--steps 4 --trace '%s'", tf);
    if (train_ok(4, plan_path[P4], extra, "m4.json", &f))
        return;
    snprintf(extra, sizeof extra, "--steps 4 --trace '%s'", tg);
    if (train_ok(4, plan_path[P4_GPIPE], extra, "m4g.json", &g))
        return;
    CU_ASSERT(train_same_losses(&f, &g));
    /* and each rank ran the schedule the simulator times */
    check_trace_order(plan_path[P4], tf);
    check_trace_order(plan_path[P4_GPIPE], tg);
}

/* Checkpoints hold weights, the last step's gradients and AdamW's moments: byte-equal files
 * mean all of them are bitwise equal. */
static void check_recompute(int plan_none, int plan_rec, int np, const char *tag)
{
    char none_dir[1024], rec_dir[1024], other_dir[1024], extra[2048];
    snprintf(none_dir, sizeof none_dir, "%s", test_path("ck-none"));
    snprintf(rec_dir, sizeof rec_dir, "%s", test_path("ck-rec"));
    snprintf(other_dir, sizeof other_dir, "%s", test_path("ck-seed2"));
    sh("rm -rf '%s' '%s' '%s'", none_dir, rec_dir, other_dir);
    struct train_metrics a, b, c;
    snprintf(extra, sizeof extra, "--steps 3 --save '%s'", none_dir);
    if (train_ok(np, plan_path[plan_none], extra, "mn.json", &a))
        return;
    snprintf(extra, sizeof extra, "--steps 3 --save '%s'", rec_dir);
    if (train_ok(np, plan_path[plan_rec], extra, "mr.json", &b))
        return;
    snprintf(extra, sizeof extra, "--steps 3 --seed 2 --save '%s'", other_dir);
    if (train_ok(np, plan_path[plan_rec], extra, "ms.json", &c))
        return;
    CU_ASSERT(train_same_losses(&a, &b));
    for (int s = 0; s < np; s++) {
        char fa[1200], fb[1200], fc[1200];
        snprintf(fa, sizeof fa, "%s/stage-%d-step-3.ckpt", none_dir, s);
        snprintf(fb, sizeof fb, "%s/stage-%d-step-3.ckpt", rec_dir, s);
        snprintf(fc, sizeof fc, "%s/stage-%d-step-3.ckpt", other_dir, s);
        int same = train_files_equal(fa, fb);
        if (!same)
            fprintf(stderr, "\n%s: stage %d state differs with recomputation\n", tag, s);
        CU_ASSERT(same);
        CU_ASSERT(!train_files_equal(fa, fc)); /* the comparison can tell states apart */
    }
}

static void test_recompute_full(void)
{
    check_recompute(P2, P2_FULL, 2, "every layer recomputed");
}

static void test_recompute_partial(void)
{
    /* the tight plan must really recompute something on stage 0 (a whole block or with an
     * option), and nothing on stage 1 */
    struct train_metrics m;
    char *text = test_read(plan_path[TIGHT]);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT(strstr(text, "\"recompute\":\t[2]") != NULL ||
              strstr(text, "\"recompute\":\t[1]") != NULL ||
              strstr(text, "\"recompute_options\"") != NULL);
    free(text);
    check_recompute(TIGHT_NONE, TIGHT, 2, "one block recomputed");
    if (train_ok(2, plan_path[TIGHT], "--steps 2", "mt.json", &m) == 0) {
        CU_ASSERT(m.recompute_ms[0] > 0);
        CU_ASSERT(m.recompute_ms[1] == 0);
    }
}

/* Recompute options: the same bits as the run that keeps everything, measured peak within 2%
 * of the plan (train_ok), and recompute time where the plan recomputes. */
static void test_recompute_options(void)
{
    struct train_metrics m;
    char *text = test_read(plan_path[OPTIONS]);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    CU_ASSERT(strstr(text, "\"option\":\t\"attn\"") != NULL &&
              strstr(text, "\"option\":\t\"mlp\"") != NULL);
    free(text);
    check_recompute(TIGHT_NONE, OPTIONS, 2, "attn and mlp options");
    if (train_ok(2, plan_path[OPTIONS], "--steps 2", "mo.json", &m) == 0) {
        CU_ASSERT(m.recompute_ms[0] > 0);
        CU_ASSERT(m.recompute_ms[1] == 0);
    }
    check_recompute(TIGHT_NONE, OPTIONS_MIXED, 2, "a whole block and attn+mlp");
}

/* A plan naming an option this runtime cannot apply is refused before training, naming the
 * plan, the stage, the layer and the option (exit 2). */
static void test_unknown_option(void)
{
    char *text = test_read(plan_path[OPTIONS]);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    cJSON *o = cJSON_Parse(text);
    free(text);
    /* rename block.1's option "mlp" to "swiglu", in its costs and in the choice */
    cJSON *st = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "stages"), 0), *opt;
    cJSON *costs = cJSON_GetArrayItem(cJSON_GetObjectItem(st, "layer_costs"), 2);
    cJSON_ArrayForEach(opt, cJSON_GetObjectItem(costs, "recompute_options"))
        if (strcmp(cJSON_GetObjectItem(opt, "name")->valuestring, "mlp") == 0)
            cJSON_ReplaceItemInObject(opt, "name", cJSON_CreateString("swiglu"));
    cJSON_ArrayForEach(opt, cJSON_GetObjectItem(st, "recompute_options"))
        if (strcmp(cJSON_GetObjectItem(opt, "option")->valuestring, "mlp") == 0)
            cJSON_ReplaceItemInObject(opt, "option", cJSON_CreateString("swiglu"));
    char *out = cJSON_Print(o);
    char plan[1024], args[2048];
    snprintf(plan, sizeof plan, "%s", test_write("plan-swiglu.json", out));
    cJSON_free(out);
    cJSON_Delete(o);
    snprintf(args, sizeof args, "--plan '%s' --steps 1", plan);
    expect_refused(2, args, 2,
                   "stages[0].recompute_options: layer 2 (block.1): recompute option \"swiglu\" "
                   "is not one this runtime can apply (it knows attn, mlp, attn+mlp)");
}

static void test_entropy_floor(void)
{
    /* Markov source over 16 tokens, 4 successors each: floor ln 4. The first step's loss is
     * near ln 16 (uniform predictions); after 200 steps the mean of the last 20 is within 0.1
     * nats of the floor, and no step's loss can sit far below it (Gibbs). */
    struct train_metrics m;
    if (train_ok(2, plan_path[ENTROPY], "--steps 200 --lr 1e-2", "me.json", &m))
        return;
    double floor = log(4.0), tail = 0, lowest = INFINITY;
    for (int i = 180; i < 200; i++) {
        tail += m.loss[i] / 20;
        lowest = fmin(lowest, m.loss[i]);
    }
    fprintf(stderr, "\n  first %.4f (ln 16 = %.4f), last 20 mean %.4f, floor ln 4 = %.4f ",
            m.loss[0], log(16.0), tail, floor);
    CU_ASSERT(test_close(m.loss[0], log(16.0), 0.15, 0));
    CU_ASSERT(tail <= floor + 0.1);
    CU_ASSERT(lowest >= floor - 0.02);
}

static long long plan_number(int which, int stage, const char *key, int layer)
{
    char *text = test_read(plan_path[which]);
    cJSON *o = cJSON_Parse(text);
    free(text);
    cJSON *st = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "stages"), stage);
    if (layer >= 0)
        st = cJSON_GetArrayItem(cJSON_GetObjectItem(st, "layer_costs"), layer);
    long long v = (long long)cJSON_GetObjectItem(st, key)->valuedouble;
    cJSON_Delete(o);
    return v;
}

static void check_limit(long long limit, const char *layer_name)
{
    char plan[1024], metrics[1024], args[4096], expect[128];
    snprintf(plan, sizeof plan, "%s",
             train_plan_understated(plan_path[P2], 1, limit, "plan-limit.json"));
    snprintf(metrics, sizeof metrics, "%s", test_path("m-limit.json"));
    remove(metrics);
    snprintf(args, sizeof args, "--plan '%s' --steps 3 --metrics '%s'", plan, metrics);
    struct train_run r = train(2, args);
    fprintf(stderr, "\n  limit %lld: status %d in %.2f s: %s", limit, r.status, r.seconds,
            r.err ? r.err : "");
    CU_ASSERT_EQUAL(r.status, 3);
    CU_ASSERT(r.seconds < 30);
    CU_ASSERT_PTR_NOT_NULL_FATAL(r.err);
    snprintf(expect, sizeof expect, "memory_limit_bytes %lld", limit);
    CU_ASSERT(strstr(r.err, "stage 1") != NULL);
    CU_ASSERT(strstr(r.err, layer_name) != NULL);
    CU_ASSERT(strstr(r.err, expect) != NULL);
    CU_ASSERT(strstr(r.err, "bytes") != NULL);
    FILE *f = fopen(metrics, "r");
    CU_ASSERT_PTR_NULL(f); /* no metrics passed off as results */
    if (f)
        fclose(f);
    train_run_free(&r);
}

static void test_limit_exceeded(void)
{
    /* stage 1 holds block.1 and head: below block.1's state alone the limit is crossed at
     * block.1; one byte under the plan's own memory it is crossed only at head */
    check_limit(plan_number(P2, 1, "state_bytes", 0) - 1, "(block.1)");
    check_limit(plan_number(P2, 1, "memory_bytes", -1) - 1, "(head)");
}

/* A plan whose layer costs are another implementation's: the run says so with the numbers,
 * allocates its own sizes, and the metrics show the plan's bytes against what it used. */
static void test_foreign_costs(void)
{
    char *text = test_read(plan_path[P2]);
    cJSON *o = cJSON_Parse(text);
    free(text);
    cJSON *st = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "stages"), 1);
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(st, "layer_costs"), 0);
    double act = cJSON_GetObjectItem(c, "act_bytes")->valuedouble;
    double mem = cJSON_GetObjectItem(st, "memory_bytes")->valuedouble;
    /* stage 1 of 2 keeps one micro-batch in flight: 4096 more kept bytes, 4096 more memory */
    cJSON_ReplaceItemInObject(c, "act_bytes", cJSON_CreateNumber(act + 4096));
    cJSON_DeleteItemFromObject(c, "recompute_options"); /* none in that implementation */
    cJSON_ReplaceItemInObject(st, "memory_bytes", cJSON_CreateNumber(mem + 4096));
    char *out = cJSON_Print(o);
    char plan[1024], expect[256];
    snprintf(plan, sizeof plan, "%s", test_write("plan-foreign.json", out));
    cJSON_free(out);
    cJSON_Delete(o);
    char mfile[1024], args[4096];
    snprintf(mfile, sizeof mfile, "%s", test_path("m-foreign.json"));
    snprintf(args, sizeof args, "--plan '%s' --steps 2 --quiet --metrics '%s'", plan, mfile);
    struct train_run r = train(2, args);
    CU_ASSERT_EQUAL(r.status, 0);
    snprintf(expect, sizeof expect, "block.1: act_bytes %.0f in the plan, %.0f here", act + 4096,
             act);
    CU_ASSERT(r.err != NULL && strstr(r.err, "not this runtime's") != NULL &&
              strstr(r.err, expect) != NULL);
    struct train_metrics m;
    CU_ASSERT_EQUAL_FATAL(train_metrics_read(mfile, &m), 0);
    CU_ASSERT_EQUAL(m.planned[1] - m.peak[1], 4096);
    CU_ASSERT_EQUAL(m.planned[0], m.peak[0]);
    train_run_free(&r);
}

static void test_resume_bitwise(void)
{
    char a[1024], b[1024], extra[2048];
    snprintf(a, sizeof a, "%s", test_path("ck-a"));
    snprintf(b, sizeof b, "%s", test_path("ck-b"));
    sh("rm -rf '%s' '%s'", a, b);
    struct train_metrics whole, first, rest;
    snprintf(extra, sizeof extra, "--steps 6 --save '%s' --save-every 3", a);
    if (train_ok(2, plan_path[P2], extra, "mw.json", &whole))
        return;
    snprintf(extra, sizeof extra, "--steps 3 --save '%s'", b);
    if (train_ok(2, plan_path[P2], extra, "mf.json", &first))
        return;
    snprintf(extra, sizeof extra, "--steps 6 --resume '%s' --save '%s'", b, b);
    if (train_ok(2, plan_path[P2], extra, "mr.json", &rest))
        return;
    CU_ASSERT_EQUAL_FATAL(rest.n_steps, 3);
    for (int i = 0; i < 3; i++) {
        CU_ASSERT(first.loss[i] == whole.loss[i]);
        CU_ASSERT(rest.loss[i] == whole.loss[3 + i]);
    }
    for (int s = 0; s < 2; s++) {
        char fa[1200], fb[1200], old[1200];
        snprintf(fa, sizeof fa, "%s/stage-%d-step-6.ckpt", a, s);
        snprintf(fb, sizeof fb, "%s/stage-%d-step-6.ckpt", b, s);
        snprintf(old, sizeof old, "%s/stage-%d-step-3.ckpt", b, s);
        CU_ASSERT(train_files_equal(fa, fb));
        FILE *f = fopen(old, "r"); /* superseded files are gone */
        CU_ASSERT_PTR_NULL(f);
        if (f)
            fclose(f);
    }
}

static void expect_refused(int np, const char *args, int status, const char *needle)
{
    struct train_run r = train(np, args);
    int found = r.err != NULL && strstr(r.err, needle) != NULL;
    if (r.status != status || !found)
        fprintf(stderr, "\n%s: status %d (expected %d), stderr: %s (expected \"%s\")\n", args,
                r.status, status, r.err ? r.err : "", needle);
    CU_ASSERT_EQUAL(r.status, status);
    CU_ASSERT(found);
    train_run_free(&r);
}

static void test_checkpoint_refused(void)
{
    char a[1024], d[1024], args[4096];
    snprintf(a, sizeof a, "%s", test_path("ck-a")); /* step 6, from test_resume_bitwise */
    snprintf(d, sizeof d, "%s", test_path("ck-bad"));
    /* damaged: one byte of stage 1's weights changed */
    sh("rm -rf '%s' && cp -r '%s' '%s'", d, a, d);
    sh("printf 'B' | dd of='%s/stage-1-step-6.ckpt' bs=1 seek=300 conv=notrunc status=none", d);
    snprintf(args, sizeof args, "--plan '%s' --steps 8 --resume '%s'", plan_path[P2], d);
    expect_refused(2, args, 2, "damaged");
    /* truncated */
    sh("rm -rf '%s' && cp -r '%s' '%s'", d, a, d);
    sh("truncate -s -100 '%s/stage-0-step-6.ckpt'", d);
    expect_refused(2, args, 2, "truncated");
    /* another stage split, another stage count, another seed, nothing left to do */
    snprintf(args, sizeof args, "--plan '%s' --steps 8 --resume '%s'", plan_path[P2_SPLIT], a);
    expect_refused(2, args, 2, "another stage split");
    snprintf(args, sizeof args, "--plan '%s' --steps 8 --resume '%s'", plan_path[P4], a);
    expect_refused(4, args, 2, "n_stages");
    snprintf(args, sizeof args, "--plan '%s' --steps 8 --seed 7 --resume '%s'", plan_path[P2],
             a);
    expect_refused(2, args, 2, "--seed 1; this run has --seed 7");
    snprintf(args, sizeof args, "--plan '%s' --steps 6 --resume '%s'", plan_path[P2], a);
    expect_refused(2, args, 2, "nothing to train");
}

static void test_bad_input(void)
{
    char args[4096];
    /* bf16 on the CPU backend trains now (test_train_bf16 compares it with fp32) */
    struct train_metrics half;
    if (train_ok(1, plan_path[BF16], "--steps 2", "bf16-cpu.json", &half) == 0)
        CU_ASSERT(isfinite(half.loss[1]));
    snprintf(args, sizeof args, "--plan '%s'", plan_path[P2]);
    expect_refused(1, args, 2, "the plan has 2 stages");
    snprintf(args, sizeof args, "--plan '%s' --data '%s'", plan_path[BYTES],
             test_path("no-such-file"));
    expect_refused(1, args, 2, "cannot open");
    snprintf(args, sizeof args, "--plan '%s' --data '%s/README.md' --data-format bytes",
             plan_path[P1], BALLAST_SOURCE_DIR);
    expect_refused(1, args, 2, "vocab_size >= 256");
    snprintf(args, sizeof args, "--plan '%s' --steps 0", plan_path[P1]);
    expect_refused(1, args, 2, "--steps");
    /* a GPU asked for where there is none (or none in the build): refused with the reason */
    int gpus = 0;
    char why[256];
    cuda_device_count(&gpus, why, sizeof why);
    snprintf(args, sizeof args, "--plan '%s' --steps 1 --device cuda", plan_path[P1]);
    if (gpus == 0)
        expect_refused(1, args, 2, cuda_built() ? "no CUDA device is usable here"
                                                : "built without the CUDA backend");
    snprintf(args, sizeof args, "--plan '%s' --steps 1 --transport nccl", plan_path[P2]);
    expect_refused(2, args, 2, "--transport nccl: rank 0 computes on the CPU");
    snprintf(args, sizeof args, "--plan '%s' --steps 1 --device gpu", plan_path[P1]);
    expect_refused(1, args, 2, "expected auto, cpu or cuda");
    /* a plan from before device_kind: refused with the stage and what to do, not guessed */
    struct err e;
    cJSON *old = jsonio_read(plan_path[P2], &e);
    CU_ASSERT_PTR_NOT_NULL_FATAL(old);
    cJSON_DeleteItemFromObject(cJSON_GetArrayItem(cJSON_GetObjectItem(old, "stages"), 1),
                               "device_kind");
    char old_plan[1024];
    snprintf(old_plan, sizeof old_plan, "%s", test_path("old-plan.json"));
    CU_ASSERT_EQUAL_FATAL(jsonio_write(old_plan, old, &e), ERR_OK);
    cJSON_Delete(old);
    snprintf(args, sizeof args, "--plan '%s' --steps 1", old_plan);
    expect_refused(2, args, 2, "stages[1].device_kind: missing");
    expect_refused(2, args, 2, "re-plan with `ballast plan`");
}

static void test_data_file(void)
{
    char extra[2048];
    struct train_metrics m;
    snprintf(extra, sizeof extra, "--steps 3 --data '%s/README.md' --data-format bytes",
             BALLAST_SOURCE_DIR);
    if (train_ok(1, plan_path[BYTES], extra, "md.json", &m))
        return;
    /* a fresh model predicts about uniformly over 256 bytes */
    CU_ASSERT(test_close(m.loss[0], log(256.0), 0.2, 0));
    CU_ASSERT(isfinite(m.loss[2]));
}

static void test_trace(void)
{
    char extra[2048], trace[1024];
    snprintf(trace, sizeof trace, "%s", test_path("trace.json"));
    snprintf(extra, sizeof extra, "--steps 2 --trace '%s'", trace);
    struct train_metrics m;
    if (train_ok(2, plan_path[P2_FULL], extra, "mtr.json", &m))
        return;
    struct err e;
    cJSON *o = jsonio_read(trace, &e);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    /* per stage (track): which kinds of event it shows, and that slices follow each other
     * (the trace format's rule; the events of one rank are sequential) */
    int seen[2][6] = {{0}};
    double end[2] = {-1, -1};
    static const char *const cats[6] = {"forward", "backward", "recompute", "send", "idle",
                                        "optimizer"};
    const cJSON *ev;
    cJSON_ArrayForEach(ev, cJSON_GetObjectItem(o, "traceEvents"))
    {
        const cJSON *cat = cJSON_GetObjectItem(ev, "cat"), *tid = cJSON_GetObjectItem(ev, "tid");
        if (cat == NULL || tid == NULL || tid->valueint < 0 || tid->valueint > 1)
            continue;
        double ts = cJSON_GetObjectItem(ev, "ts")->valuedouble,
               dur = cJSON_GetObjectItem(ev, "dur")->valuedouble;
        CU_ASSERT(dur >= 0);
        CU_ASSERT(ts >= end[tid->valueint] - 1e-3); /* written in time order per track */
        end[tid->valueint] = ts + dur;
        for (int k = 0; k < 6; k++)
            seen[tid->valueint][k] |= strcmp(cat->valuestring, cats[k]) == 0;
    }
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 6; k++) {
            if (!seen[s][k])
                fprintf(stderr, "\nstage %d has no %s event\n", s, cats[k]);
            CU_ASSERT(seen[s][k]);
        }
    cJSON_Delete(o);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("train", setup, NULL);
    CU_add_test(s, "1, 2 and 4 ranks (and 2 threads) give identical losses",
                test_ranks_identical);
    CU_add_test(s, "1F1B and GPipe give identical losses, each rank in the simulator's order",
                test_schedules_identical);
    CU_add_test(s, "recomputing every layer leaves weights, gradients and moments bitwise",
                test_recompute_full);
    CU_add_test(s, "recomputing one block (optimal plan under a limit) likewise",
                test_recompute_partial);
    CU_add_test(s, "recompute options (attn, mlp, attn+mlp) likewise", test_recompute_options);
    CU_add_test(s, "an option the runtime cannot apply is refused", test_unknown_option);
    CU_add_test(s, "the loss approaches the synthetic source's entropy", test_entropy_floor);
    CU_add_test(s, "a stage over its memory limit fails cleanly on every rank",
                test_limit_exceeded);
    CU_add_test(s, "a plan with another implementation's layer costs is flagged",
                test_foreign_costs);
    CU_add_test(s, "a resumed run is bitwise the uninterrupted one", test_resume_bitwise);
    CU_add_test(s, "damaged, truncated and mismatched checkpoints are refused",
                test_checkpoint_refused);
    CU_add_test(s, "bad input is refused with the reason", test_bad_input);
    CU_add_test(s, "training on a file's bytes", test_data_file);
    CU_add_test(s, "the Chrome trace has every stage's events", test_trace);
    return test_main();
}
