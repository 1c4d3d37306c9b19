/* Tensor-parallel costs per degree (issue 31): the estimate for (device, tp) against the
 * one-GPU estimate (every layer's FLOPs shared out exactly, memory as the cost model divides
 * it, never faster than the ideal split, and for a small model far from it), the measured one
 * on this CPU (every share timed, the memory the estimate's), and a pool that
 * takes a profile per (kind, tp): the plan it picks is the fastest of every candidate planned
 * on its own from the same profiles (brute force), and it differs from the one the single
 * tp_efficiency factor picks where that factor is wrong. Profiles are estimated here; the
 * "measured" tp-2 profile is the estimate made 1.5 times slower, as a GPU whose tensor
 * parallelism reaches less than the datasheet would give. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "estimate.h"
#include "model.h"
#include "testjson.h"
#include "testutil.h"

static char models[1024];

/* Each GPU of a group of t does 1/t of every layer's arithmetic (Megatron-LM's split with
 * sequence parallelism leaves nothing replicated but the embedding's lookup, which has none). */
static void test_flops_shared(void)
{
    static const char *const names[] = {"gpt-350m", "llama2-7b", "gpt-tiny"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        char path[1200];
        struct model m;
        struct err e;
        err_clear(&e);
        snprintf(path, sizeof path, "%s/%s.json", models, names[k]);
        CU_ASSERT_FATAL(model_load(path, &m, &e) == ERR_OK);
        for (int l = 0; l < model_layer_count(&m); l++)
            for (int t = 2; t <= 4; t *= 2) {
                double f1, b1, ft, bt;
                if (m.n_head % t)
                    continue;
                estimate_layer_flops(&m, l, &f1, &b1);
                estimate_layer_flops_tp(&m, l, t, &ft, &bt);
                CU_ASSERT(test_close(ft * t, f1, 1e-3, 1e-12));
                CU_ASSERT(test_close(bt * t, b1, 1e-3, 1e-12));
            }
    }
}

/* `ballast profile --estimate` of MODEL on A100-40GB, with --tp TP over 2400 Gb/s when TP >
 * 1, to tmpdir/NAME; its path. */
static const char *estimate(const char *model, int tp, const char *name)
{
    static char out[8][1024];
    static int slot;
    char args[4096], *p = out[slot++ % 8];
    snprintf(p, 1024, "%s", test_path(name));
    int n = snprintf(args, sizeof args,
                     "profile --model '%s/%s.json' --estimate --device A100-40GB -o '%s'",
                     models, model, p);
    if (tp > 1)
        snprintf(args + n, sizeof args - (size_t)n, " --tp %d --node-link-gbps 2400", tp);
    CU_ASSERT_FATAL(test_run(args, NULL, NULL) == 0);
    return p;
}

static const cJSON *layer(const cJSON *prof, int l)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItem(prof, "layers"), l);
}

static double up(double bytes, int t)
{
    return ceil(bytes / t);
}

/* A block of tp 2: its memory the one-GPU block's split in two (Korthikanti et al.'s, cost.h),
 * its time no less than half the one-GPU time plus its 4 collectives; GPT-350M's GEMMs keep
 * it within 20% of that ideal, GPT-tiny's op overheads keep it far from it (the single
 * tp_efficiency factor cannot say both). */
static void test_estimate_per_degree(void)
{
    static const char *const names[] = {"gpt-350m", "gpt-tiny"};
    double efficiency[2];
    for (int k = 0; k < 2; k++) {
        char n1[64], n2[64];
        snprintf(n1, sizeof n1, "%s-tp1.json", names[k]);
        snprintf(n2, sizeof n2, "%s-tp2.json", names[k]);
        cJSON *one = test_read_json(estimate(names[k], 1, n1));
        cJSON *two = test_read_json(estimate(names[k], 2, n2));
        CU_ASSERT_EQUAL(test_num(two, "tp"), 2);
        const cJSON *a = layer(one, 1), *b = layer(two, 1);
        CU_ASSERT_EQUAL(test_num(b, "param_bytes"), up(test_num(a, "param_bytes"), 2));
        CU_ASSERT_EQUAL(test_num(b, "optimizer_bytes"), up(test_num(a, "optimizer_bytes"), 2));
        CU_ASSERT_EQUAL(test_num(b, "act_bytes"), up(test_num(a, "act_bytes"), 2));
        CU_ASSERT_EQUAL(test_num(b, "state_bytes"),
                        up(test_num(a, "param_bytes"), 2) + up(test_num(a, "grad_bytes"), 2) +
                            up(test_num(a, "optimizer_bytes"), 2));
        /* a collective: b*s*h bf16 elements, half of them over 2400 Gb/s */
        const cJSON *mo = cJSON_GetObjectItem(one, "model");
        double bytes = test_num(mo, "micro_batch") * test_num(mo, "seq_len") *
                       test_num(mo, "n_embd") *
                       (strcmp(cJSON_GetObjectItem(mo, "dtype")->valuestring, "fp32") ? 2 : 4);
        double comm = 4 * (bytes / 2 * 8 / 2400e9 * 1e3);
        double ideal = test_num(a, "fwd_ms") / 2;
        CU_ASSERT(test_num(b, "fwd_ms") - comm >= ideal * (1 - 1e-9));
        efficiency[k] = ideal / (test_num(b, "fwd_ms") - comm);
        printf("\n  %s block, tp 2: forward %.4f ms (one GPU %.4f, collectives %.4f): %.0f%% "
               "of the ideal split",
               names[k], test_num(b, "fwd_ms"), test_num(a, "fwd_ms"), comm,
               100 * efficiency[k]);
        cJSON_Delete(one);
        cJSON_Delete(two);
    }
    CU_ASSERT(efficiency[0] > 0.8 && efficiency[1] < 0.7);
}

/* The profile at `from` made `factor` times slower (times only), marked measured, to `to`. */
static void slower(const char *from, const char *to, double factor)
{
    cJSON *p = test_read_json(from);
    cJSON_ReplaceItemInObject(p, "estimated", cJSON_CreateFalse());
    for (const cJSON *l = cJSON_GetObjectItem(p, "layers")->child; l != NULL; l = l->next) {
        static const char *const keys[] = {"fwd_ms", "bwd_ms"};
        for (int k = 0; k < 2; k++)
            cJSON_SetNumberValue(cJSON_GetObjectItem(l, keys[k]),
                                 test_num(l, keys[k]) * factor);
        const cJSON *opts = cJSON_GetObjectItem(l, "recompute_options");
        for (const cJSON *o = opts ? opts->child : NULL; o != NULL; o = o->next)
            cJSON_SetNumberValue(cJSON_GetObjectItem(o, "recompute_ms"),
                                 test_num(o, "recompute_ms") * factor);
    }
    char *text = cJSON_Print(p);
    FILE *f = fopen(to, "w");
    CU_ASSERT_FATAL(f != NULL && text != NULL);
    fputs(text, f);
    fclose(f);
    cJSON_free(text);
    cJSON_Delete(p);
}

/* Two A100-40GB in a node, GPT-350M, 16 samples a step, 100 Gb/s between GPUs otherwise. */
static const char *pool_file(const char *name, const char *tp_profiles)
{
    char text[4096];
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"global_batch\": 16, "
             "\"link\": {\"gbps\": 100, \"latency_us\": 5}, "
             "\"dp_link\": {\"gbps\": 100, \"latency_us\": 5}, "
             "\"pool\": [{\"device\": \"A100-40GB\", \"count\": 2, \"per_node\": 2, "
             "\"memory_bytes\": \"39GiB\", \"profile\": \"%s\", "
             "\"node_link\": {\"gbps\": 2400, \"latency_us\": 3}%s}]}",
             test_path("gpt-350m-tp1.json"), tp_profiles);
    return test_write(name, text);
}

/* `ballast plan` of `cluster` (--repartition --search-gap 0, as the pool search plans each
 * candidate): its step, and its stages, dp and tp. */
static double plan_of(const char *cluster, int *stages, int *dp, int *tp)
{
    char args[4096], out[1024];
    snprintf(out, sizeof out, "%s.plan", cluster);
    snprintf(args, sizeof args,
             "plan --cluster '%s' --repartition --search-gap 0 --quiet -o '%s'", cluster, out);
    CU_ASSERT_FATAL(test_run(args, NULL, NULL) == 0);
    cJSON *p = test_read_json(out);
    const cJSON *st = cJSON_GetObjectItem(p, "stages");
    double ms = test_num(p, "iteration_ms");
    *stages = cJSON_GetArraySize(st);
    const cJSON *d = cJSON_GetObjectItem(st->child, "dp"), *t = cJSON_GetObjectItem(st->child, "tp");
    *dp = d ? d->valueint : 1;
    *tp = t ? t->valueint : 1;
    cJSON_Delete(p);
    return ms;
}

/* Every candidate of the pool as a cluster of its own (the per-degree profile for its tp-2
 * stage): S stages of tp t, dp d, M = 16 / (4 d) micro-batches, repartitioned. */
static double candidate(const char *name, int S, int t, int d, const char *tp2)
{
    char text[4096], stage[1024];
    int n = snprintf(text, sizeof text,
                     "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", "
                     "\"micro_batches\": %d, \"link\": {\"gbps\": 100, \"latency_us\": 5}, "
                     "\"dp_link\": {\"gbps\": 100, \"latency_us\": 5}, \"stages\": [",
                     16 / (4 * d));
    snprintf(stage, sizeof stage,
             "{\"device\": \"A100-40GB\", \"memory_bytes\": \"39GiB\", \"profile\": \"%s\", "
             "\"per_node\": 2, \"node_link\": {\"gbps\": 2400, \"latency_us\": 3}, \"tp\": %d, "
             "\"dp\": %d}",
             t == 2 ? tp2 : test_path("gpt-350m-tp1.json"), t, d);
    for (int s = 0; s < S; s++)
        n += snprintf(text + n, sizeof text - (size_t)n, "%s%s", s ? ", " : "", stage);
    snprintf(text + n, sizeof text - (size_t)n, "]}");
    int stages, dp, tp;
    return plan_of(test_write(name, text), &stages, &dp, &tp);
}

static void test_pool_per_degree(void)
{
    const char *tp2 = estimate("gpt-350m", 2, "gpt-350m-tp2.json");
    char slow[1024], entry[1200];
    snprintf(slow, sizeof slow, "%s", test_path("gpt-350m-tp2-measured.json"));
    slower(tp2, slow, 1.5);
    /* the efficiency factor (1.0: absent) picks tp 2 */
    int stages, dp, tp;
    double fallback = plan_of(pool_file("pool-factor.json", ""), &stages, &dp, &tp);
    CU_ASSERT(tp == 2 && stages == 1 && dp == 1);
    /* the per-degree profile: brute force over every candidate (2 GPUs: 2 stages, tp 2, dp 2,
     * or one GPU alone) */
    snprintf(entry, sizeof entry, ", \"tp_profiles\": [{\"tp\": 2, \"profile\": \"%s\"}]", slow);
    double got = plan_of(pool_file("pool-degree.json", entry), &stages, &dp, &tp);
    double ref[4] = {candidate("c-pp2.json", 2, 1, 1, slow), candidate("c-tp2.json", 1, 2, 1, slow),
                     candidate("c-dp2.json", 1, 1, 2, slow), candidate("c-one.json", 1, 1, 1, slow)};
    double best = fmin(fmin(ref[0], ref[1]), fmin(ref[2], ref[3]));
    CU_ASSERT(test_close(got, best, 1e-9, 1e-9));
    CU_ASSERT(tp == 1); /* tp 2 at its measured speed no longer wins */
    CU_ASSERT(ref[1] > best * 1.1);
    printf("\n  the factor: tp 2, %.3f ms; per degree: %d stages of tp %d, dp %d, %.3f ms "
           "(candidates: pp 2 %.3f, tp 2 %.3f, dp 2 %.3f, one GPU %.3f)",
           fallback, stages, tp, dp, got, ref[0], ref[1], ref[2], ref[3]);
    /* the estimate per degree is close to the factor for this model's large GEMMs: tp 2 */
    snprintf(entry, sizeof entry, ", \"tp_profiles\": [{\"tp\": 2, \"profile\": \"%s\"}]", tp2);
    plan_of(pool_file("pool-estimate.json", entry), &stages, &dp, &tp);
    CU_ASSERT(tp == 2);
}

/* A one-GPU profile listed as tp 2's, a tp above per_node, a tp twice: refused, named. */
static void test_refused(void)
{
    char entry[2400], *err = NULL, args[2048];
    static const struct {
        const char *entry, *needle;
    } cases[] = {
        {", \"tp_profiles\": [{\"tp\": 2, \"profile\": \"%s\"}]", "a profile of one GPU"},
        {", \"tp_profiles\": [{\"tp\": 4, \"profile\": \"%s\"}]", "tp_profiles[0].tp: 4"},
        {", \"tp_profiles\": [{\"tp\": 2, \"profile\": \"%s\"}, {\"tp\": 2, \"profile\": \"%s\"}]",
         "tp_profiles[1].tp: 2 is"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const char *one = test_path("gpt-350m-tp1.json");
        snprintf(entry, sizeof entry, cases[k].entry, one, one);
        snprintf(args, sizeof args, "plan --cluster '%s' --quiet",
                 pool_file("pool-bad.json", entry));
        CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
        CU_ASSERT(err != NULL && strstr(err, cases[k].needle) != NULL);
        if (err == NULL || strstr(err, cases[k].needle) == NULL)
            printf("\nexpected \"%s\" in: %s\n", cases[k].needle, err ? err : "(nothing)");
        free(err);
        err = NULL;
    }
}

/* `ballast profile --device cpu --tp 2` (the shares run on this CPU; the collectives over the
 * link given): every layer timed, the collectives in each pass, its memory the estimate's for
 * tp 2 byte for byte (the same size functions, divided alike); GPT, Llama and flash
 * attention; a tp that does not divide the heads and a CPU without --node-link-gbps refused. */
static void test_measured_per_degree(void)
{
    static const char *const names[] = {"gpt-tiny", "llama-tiny", "gpt-tiny-flash"};
    for (int k = 0; k < 3; k++) {
        char args[4096], out[1024], est[64], *err = NULL;
        snprintf(out, sizeof out, "%s", test_path("measured-tp2.json"));
        snprintf(args, sizeof args,
                 "profile --model '%s/%s.json' --device cpu --threads 1 --repeats 3 --tp 2 "
                 "--node-link-gbps 100 -o '%s'",
                 models, names[k], out);
        CU_ASSERT_FATAL(test_run(args, NULL, &err) == 0);
        free(err);
        snprintf(est, sizeof est, "%s-est-tp2.json", names[k]);
        snprintf(args, sizeof args,
                 "profile --model '%s/%s.json' --estimate --device A100-40GB --tp 2 "
                 "--node-link-gbps 100 -o '%s'",
                 models, names[k], test_path(est));
        CU_ASSERT_FATAL(test_run(args, NULL, NULL) == 0);
        cJSON *m = test_read_json(out), *e = test_read_json(test_path(est));
        CU_ASSERT_EQUAL(test_num(m, "tp"), 2);
        CU_ASSERT(cJSON_IsFalse(cJSON_GetObjectItem(m, "estimated")));
        const cJSON *mo = cJSON_GetObjectItem(m, "model");
        double bytes = test_num(mo, "micro_batch") * test_num(mo, "seq_len") *
                       test_num(mo, "n_embd") * 4;
        double one = (bytes / 2) * 8 / 100e9 * 1e3; /* a collective: half the bytes each way */
        int n = cJSON_GetArraySize(cJSON_GetObjectItem(m, "layers"));
        for (int l = 0; l < n; l++) {
            const cJSON *a = layer(m, l), *b = layer(e, l);
            double comm = (l == 0 || l == n - 1 ? 1 : 4) * one;
            static const char *const sizes[] = {"state_bytes", "act_bytes", "ckpt_bytes",
                                                "out_bytes", "workspace_bytes", "param_bytes"};
            for (int q = 0; q < 6; q++)
                CU_ASSERT_EQUAL(test_num(a, sizes[q]), test_num(b, sizes[q]));
            CU_ASSERT(test_num(a, "fwd_ms") > comm && test_num(a, "bwd_ms") > comm);
            CU_ASSERT(test_num(a, "optimizer_ms") > 0 && test_num(a, "host_optimizer_ms") > 0);
            const cJSON *opts = cJSON_GetObjectItem(a, "recompute_options");
            for (const cJSON *o = opts ? opts->child : NULL; o != NULL; o = o->next)
                CU_ASSERT(test_num(o, "recompute_ms") > 0);
        }
        cJSON_Delete(m);
        cJSON_Delete(e);
    }
    static const struct {
        const char *args, *needle;
    } bad[] = {{"--tp 3 --node-link-gbps 100", "does not divide"},
               {"--tp 2", "--node-link-gbps is for --tp"}};
    for (int k = 0; k < 2; k++) {
        char args[2048], *err = NULL;
        snprintf(args, sizeof args, "profile --model '%s/gpt-tiny.json' --device cpu %s",
                 models, bad[k].args);
        CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
        CU_ASSERT(err != NULL && strstr(err, bad[k].needle) != NULL);
        if (err == NULL || strstr(err, bad[k].needle) == NULL)
            printf("\nexpected \"%s\" in: %s\n", bad[k].needle, err ? err : "(nothing)");
        free(err);
    }
}

int main(void)
{
    snprintf(models, sizeof models, "%s/configs/models", BALLAST_SOURCE_DIR);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("tensor-parallel costs per degree", NULL, NULL);
    CU_add_test(s, "every layer's FLOPs shared out over tp", test_flops_shared);
    CU_add_test(s, "the estimate per degree", test_estimate_per_degree);
    CU_add_test(s, "a pool with a profile per (kind, tp): brute force's candidate",
                test_pool_per_degree);
    CU_add_test(s, "tp_profiles refused", test_refused);
    CU_add_test(s, "measured per degree on the CPU", test_measured_per_degree);
    return test_main();
}
