/* Heterogeneous pipelines in the pool search (issue 17): on small pools the search equals a
 * brute force over every grouping and micro-batch split it covers (each group's pipeline
 * planned from a cluster file written here, scored by replicas_step); a pool where they must
 * win writes a replicas file that simulate reads; a pool where they lose keeps the
 * homogeneous plan byte for byte; bad pools are refused with their numbers. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cluster.h"
#include "jsonio.h"
#include "plan.h"
#include "planner.h"
#include "pool.h"
#include "pool_mixed.h"
#include "replicas.h"
#include "testutil.h"

#define MICRO_BATCH 2
#define KINDS 2

/* A tiny GPT (4 planning layers, 8 heads) estimated on `device`; returns the path. */
static char *estimated_profile(const char *device)
{
    char args[1024], name[64];
    const char *model = test_write("model.json",
                                   "{\"format\":\"ballast-model/1\",\"kind\":\"gpt\","
                                   "\"n_layer\":2,\"n_embd\":256,\"n_head\":8,\"seq_len\":256,"
                                   "\"vocab_size\":1024,\"micro_batch\":2,\"dtype\":\"bf16\"}");
    snprintf(name, sizeof name, "profile-%s.json", device);
    char *path = strdup(test_path(name));
    snprintf(args, sizeof args, "profile --model %s --estimate --device %s -o %s", model, device,
             path);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    return path;
}

/* A pool: its kinds (device, estimated profile, count, memory) and the shared members. */
struct pool_case {
    const char *device[KINDS];
    char *profile[KINDS];
    int count[KINDS];
    long long memory[KINDS];
    int global_batch;
    double link_gbps, dp_link_gbps; /* between stages, between replicas */
};

static const char *pool_write(const struct pool_case *pc, const char *name)
{
    char kinds[KINDS][1024], text[4096];
    for (int k = 0; k < KINDS; k++)
        snprintf(kinds[k], sizeof kinds[k],
                 "{\"device\":\"%s\",\"count\":%d,\"per_node\":2,\"memory_bytes\":%lld,"
                 "\"profile\":\"%s\",\"node_link\":{\"gbps\":400,\"latency_us\":1}}",
                 pc->device[k], pc->count[k], pc->memory[k], pc->profile[k]);
    snprintf(text, sizeof text,
             "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"global_batch\":%d,"
             "\"link\":{\"gbps\":%g,\"latency_us\":2},\"dp_link\":{\"gbps\":%g,"
             "\"latency_us\":5},\"shard_optimizer\":true,\"pool\":[%s,%s]}",
             pc->global_batch, pc->link_gbps, pc->dp_link_gbps, kinds[0], kinds[1]);
    return test_write(name, text);
}

/* Kind k's pipeline of S stages of tp GPUs, dp replicas, M micro-batches, written out as a
 * cluster file and planned by --repartition (exact); 0: none fits. */
static int plan_group(const struct pool_case *pc, int k, int tp, int S, int dp, int M,
                      struct plan *p)
{
    char stages[8192] = "", one[1024], text[10000];
    for (int s = 0; s < S; s++) {
        snprintf(one, sizeof one,
                 "%s{\"device\":\"%s\",\"memory_bytes\":%lld,\"profile\":\"%s\",\"per_node\":2,"
                 "\"node_link\":{\"gbps\":400,\"latency_us\":1},\"tp\":%d,\"dp\":%d}",
                 s ? "," : "", pc->device[k], pc->memory[k], pc->profile[k], tp, dp);
        strcat(stages, one);
    }
    snprintf(text, sizeof text,
             "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"micro_batches\":%d,"
             "\"link\":{\"gbps\":%g,\"latency_us\":2},\"dp_link\":{\"gbps\":%g,"
             "\"latency_us\":5},\"shard_optimizer\":true,\"stages\":[%s]}",
             M, pc->link_gbps, pc->dp_link_gbps, stages);
    struct cluster c;
    struct plan_options o;
    struct err e;
    err_clear(&e);
    plan_options_default(&o);
    o.repartition = 1;
    o.search_gap = 0;
    if (cluster_load(test_write("group.json", text), &c, &e) != ERR_OK)
        fprintf(stderr, "\n%s\n", e.msg);
    CU_ASSERT_EQUAL_FATAL(e.code, ERR_OK);
    int rc = planner_make(&c, &o, p, &e);
    cluster_free(&c);
    CU_ASSERT(rc == ERR_OK || rc == ERR_NOFIT);
    return rc == ERR_OK;
}

/* Every group one kind can form on this pool: tp 1 or 2 (per_node 2, dividing the 8 heads),
 * 1 to 4 stages (the model's layers), dp S tp at most its count. */
struct group {
    int tp, S, dp;
};

static int kind_groups(const struct pool_case *pc, int k, struct group *out)
{
    int n = 0;
    for (int tp = 1; tp <= 2; tp++)
        for (int S = 1; S <= 4; S++)
            for (int dp = 1; dp * S * tp <= pc->count[k]; dp++)
                out[n++] = (struct group){tp, S, dp};
    return n;
}

/* The least step over both kinds' groups and every split dp_0 M_0 + dp_1 M_1 = B. */
static double brute_force(const struct pool_case *pc, long *splits, long *unfit)
{
    struct group g[KINDS][64];
    int n[KINDS], B = pc->global_batch / MICRO_BATCH;
    double best = INFINITY;
    for (int k = 0; k < KINDS; k++)
        n[k] = kind_groups(pc, k, g[k]);
    *splits = *unfit = 0;
    for (int i = 0; i < n[0]; i++)
        for (int j = 0; j < n[1]; j++)
            for (int M0 = 1; g[0][i].dp * M0 < B; M0++) {
                int rest = B - g[0][i].dp * M0;
                if (rest % g[1][j].dp != 0)
                    continue;
                struct plan p[KINDS];
                int fit0 = plan_group(pc, 0, g[0][i].tp, g[0][i].S, g[0][i].dp, M0, &p[0]);
                int fit1 = fit0 && plan_group(pc, 1, g[1][j].tp, g[1][j].S, g[1][j].dp,
                                              rest / g[1][j].dp, &p[1]);
                *unfit += !fit1;
                if (fit1) {
                    struct replicas_result r;
                    struct err e;
                    err_clear(&e);
                    CU_ASSERT_EQUAL_FATAL(replicas_step(p, KINDS, &r, &e), ERR_OK);
                    best = fmin(best, r.step_ms);
                    (*splits)++;
                    replicas_result_free(&r);
                    plan_free(&p[1]);
                }
                if (fit0)
                    plan_free(&p[0]);
            }
    return best;
}

/* Every bound the search uses on a group (pool_mixed_group_bound), against the group planned
 * here at each M: its least step at most the pipeline's step alone (which replicas_step only
 * adds to), no refutation of that step, and the cutoff's slack at least the difference the
 * all-reduce over its dp makes. Returns how many fit; *tight: how many bounds were within 20%
 * (so that the bounds are not vacuous). */
static int check_bounds(const struct pool_case *pc, const char *file, int *tight)
{
    struct group g[64];
    struct plan_options o;
    int B = pc->global_batch / MICRO_BATCH, fits = 0;
    plan_options_default(&o);
    o.search_gap = 0;
    for (int k = 0; k < KINDS; k++)
        for (int i = 0, n = kind_groups(pc, k, g); i < n; i++)
            for (int M = 1; g[i].dp * M < B; M++) {
                struct plan p;
                if (!plan_group(pc, k, g[i].tp, g[i].S, g[i].dp, M, &p))
                    continue;
                struct replicas_result r;
                struct pool_mixed_bound b;
                struct pool_mixed_group at = {k, g[i].tp, g[i].S, g[i].dp, M};
                struct err e;
                err_clear(&e);
                CU_ASSERT_EQUAL_FATAL(replicas_step(&p, 1, &r, &e), ERR_OK);
                double alone = r.pipeline_ms[0];
                if (pool_mixed_group_bound(file, &o, &at, alone, &b, &e) != ERR_OK)
                    fprintf(stderr, "\n%s\n", e.msg);
                CU_ASSERT_EQUAL_FATAL(e.code, ERR_OK);
                if (!(b.least_ms <= alone && b.could_step &&
                      p.iteration_ms - b.cutoff_slack_ms <= alone * (1 + 1e-9)))
                    printf("\n  %s dp %d x %d of tp %d, M %d: alone %.6f ms, planned %.6f ms; "
                           "bound %.6f ms, could step %d, slack %.6f ms",
                           pc->device[k], g[i].dp, g[i].S, g[i].tp, M, alone, p.iteration_ms,
                           b.least_ms, b.could_step, b.cutoff_slack_ms);
                CU_ASSERT(b.least_ms <= alone);
                CU_ASSERT(b.could_step);
                CU_ASSERT(p.iteration_ms - b.cutoff_slack_ms <= alone * (1 + 1e-9));
                *tight += b.least_ms >= 0.8 * alone;
                fits++;
                replicas_result_free(&r);
                plan_free(&p);
            }
    return fits;
}

/* The exact search's step (INFINITY: none fits) within time_limit_s (0: none). */
static double mixed_search(const char *file, double time_limit_s, struct pool_mixed_result *r)
{
    struct plan_options o;
    struct plan *plans;
    struct replicas_result step;
    struct err e;
    int n;
    err_clear(&e);
    plan_options_default(&o);
    o.search_gap = 0;
    o.time_limit_s = time_limit_s;
    cJSON *root = jsonio_read_kind(file, JSONIO_CLUSTER, &e);
    if (root == NULL || pool_mixed_search(root, file, &o, INFINITY, &plans, &n, &step, r, &e))
        fprintf(stderr, "\n%s\n", e.msg);
    cJSON_Delete(root);
    CU_ASSERT_EQUAL_FATAL(e.code, ERR_OK);
    double ms = n > 0 ? step.step_ms : INFINITY;
    CU_ASSERT_EQUAL(n, r->n_groups);
    for (int g = 0; g < n; g++)
        plan_free(&plans[g]);
    free(plans);
    replicas_result_free(&step);
    return ms;
}

/* A100-40GB and V100-32GB, 4 of each, estimated; 16 samples, fast links between stages,
 * slow between replicas: the homogeneous plan wins. */
static struct pool_case two_kinds(void)
{
    struct pool_case pc = {{"A100-40GB", "V100-32GB"}, {NULL, NULL}, {4, 4},
                           {40000000000LL, 32000000000LL}, 16, 100, 10};
    for (int k = 0; k < KINDS; k++)
        pc.profile[k] = estimated_profile(pc.device[k]);
    return pc;
}

/* The same with a slow link between stages and a fast one between replicas, 28 samples (14
 * micro-batches: dp 1, 7 or 14 for identical replicas): one-stage groups of each kind win. */
static struct pool_case mixed_wins(void)
{
    struct pool_case pc = two_kinds();
    pc.global_batch = 28;
    pc.link_gbps = 1;
    pc.dp_link_gbps = 1000;
    return pc;
}

static void free_case(struct pool_case *pc)
{
    for (int k = 0; k < KINDS; k++)
        free(pc->profile[k]);
}

static void test_against_brute_force(void)
{
    struct pool_case pc = two_kinds(), wins = mixed_wins();
    char *l4 = estimated_profile("L4");
    /* counts; samples; the second kind (V100-32GB or L4, closer to the A100's speed) and its
     * memory; link and dp_link Gb/s */
    static const struct {
        int count[KINDS], batch, l4;
        long long memory;
        double link, dp_link;
    } vary[] = {{{4, 4}, 16, 0, 32000000000LL, 100, 10}, {{4, 4}, 14, 0, 25000000LL, 100, 10},
                {{4, 4}, 28, 0, 32000000000LL, 1, 1000}, {{2, 4}, 20, 0, 32000000000LL, 1, 1000},
                {{4, 2}, 10, 0, 32000000000LL, 10, 400}, {{3, 4}, 24, 0, 40000000LL, 1, 1000},
                {{4, 4}, 24, 1, 20000000000LL, 1, 1000}, {{2, 4}, 30, 1, 20000000000LL, 10, 400},
                {{2, 4}, 40, 1, 30000000LL, 1, 1000},    {{4, 3}, 22, 1, 20000000000LL, 100, 100},
                {{4, 4}, 30, 1, -18000000LL, 10, 1000}}; /* < 0: the A100's memory, small */
    long unfit_all = 0;
    for (size_t i = 0; i < sizeof vary / sizeof vary[0]; i++) {
        struct pool_case c = pc;
        memcpy(c.count, vary[i].count, sizeof c.count);
        c.global_batch = vary[i].batch;
        if (vary[i].memory < 0)
            c.memory[0] = -vary[i].memory, c.memory[1] = 20000000000LL;
        else
            c.memory[1] = vary[i].memory;
        if (vary[i].l4)
            c.device[1] = "L4", c.profile[1] = l4;
        c.link_gbps = vary[i].link;
        c.dp_link_gbps = vary[i].dp_link;
        struct pool_mixed_result r;
        long splits, unfit;
        char *file = strdup(pool_write(&c, "brute.json")); /* test_write's buffer is reused */
        double got = mixed_search(file, 0, &r);
        int tight = 0, fits = check_bounds(&c, file, &tight);
        double want = brute_force(&c, &splits, &unfit);
        printf("\n  %d + %d GPUs, batch %d: %.6f ms (brute force %.6f ms over %ld splits, %ld "
               "not fitting); %ld groupings, %ld pipelines planned, %ld splits scored; "
               "bounds within 20%% of %d of the %d groups fitting",
               c.count[0], c.count[1], c.global_batch, got, want, splits, unfit, r.groupings,
               r.planned, r.splits, tight, fits);
        for (int g = 0; g < r.n_groups; g++)
            printf("; %s dp %d x %d of tp %d, M %d", r.device[r.group[g].kind], r.group[g].dp,
                   r.group[g].stages, r.group[g].tp, r.group[g].micro_batches);
        CU_ASSERT(isfinite(want) && test_close(got, want, 1e-9, 1e-12));
        CU_ASSERT(r.splits <= splits);
        CU_ASSERT(fits > 0 && 3 * tight > fits);
        free(file);
        unfit_all += unfit;
    }
    CU_ASSERT(unfit_all > 0); /* the small V100s */
    free(l4);
    free_case(&pc);
    free_case(&wins);
}

/* The homogeneous search's plan, as `plan -o` wrote it before (plan_write); INFINITY when
 * none fits. */
static double homogeneous(const char *file, const char *out)
{
    struct plan p;
    struct pool_result r;
    struct plan_options o;
    struct err e;
    err_clear(&e);
    plan_options_default(&o);
    int rc = pool_search(file, &o, &p, &r, &e);
    CU_ASSERT_FATAL(rc == ERR_OK || rc == ERR_NOFIT);
    if (rc != ERR_OK)
        return INFINITY;
    CU_ASSERT_EQUAL(plan_write(out, &p, &e), ERR_OK);
    double ms = p.iteration_ms;
    plan_free(&p);
    return ms;
}

/* Where heterogeneous pipelines step faster, `plan -o` writes them as a replicas file whose
 * step simulate reproduces and prints the groups; where they do not, the plan file is the
 * homogeneous search's, byte for byte. */
static void test_cli_choice(void)
{
    struct pool_case wins = mixed_wins(), loses = two_kinds();
    char args[2048], *out = NULL, *text;
    const char *file = pool_write(&wins, "wins.json");
    char replicas[512], before[512];
    snprintf(replicas, sizeof replicas, "%s", test_path("wins-out.json"));
    snprintf(before, sizeof before, "%s", test_path("wins-homogeneous.json"));
    double homogeneous_ms = homogeneous(file, before);
    snprintf(args, sizeof args, "plan --cluster %s -o %s", file, replicas);
    CU_ASSERT_EQUAL_FATAL(test_run(args, &out, NULL), 0);
    CU_ASSERT(out != NULL && strstr(out, "pool: heterogeneous pipelines, faster than the best "
                                         "homogeneous candidate") != NULL);
    CU_ASSERT(out != NULL && strstr(out, "pipelines[1]: V100-32GB, dp ") != NULL);
    free(out);
    text = test_read(replicas);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CU_ASSERT_FATAL(root != NULL && replicas_is_file(root));
    double step_ms = cJSON_GetObjectItemCaseSensitive(root, "step_ms")->valuedouble;
    long batch = (long)cJSON_GetObjectItemCaseSensitive(root, "global_batch")->valuedouble;
    printf("\n  heterogeneous %.6f ms against homogeneous %.6f ms", step_ms, homogeneous_ms);
    CU_ASSERT(step_ms < homogeneous_ms);
    CU_ASSERT_EQUAL(batch, wins.global_batch);
    cJSON_Delete(root);
    free(text);
    snprintf(args, sizeof args, "simulate --plan %s", replicas);
    CU_ASSERT_EQUAL(test_run(args, &out, NULL), 0);
    char want[64];
    snprintf(want, sizeof want, "step: %.3f ms", step_ms);
    CU_ASSERT(out != NULL && strstr(out, want) != NULL);
    free(out);
    /* homogeneous wins: the same plan file as before */
    file = pool_write(&loses, "loses.json");
    homogeneous(file, before);
    snprintf(args, sizeof args, "plan --cluster %s -o %s", file, replicas);
    CU_ASSERT_EQUAL(test_run(args, &out, NULL), 0);
    CU_ASSERT(out != NULL && strstr(out, "pool: no heterogeneous grouping steps faster") != NULL);
    free(out);
    char *a = test_read(before), *b = test_read(replicas);
    CU_ASSERT(a != NULL && b != NULL && strcmp(a, b) == 0);
    free(a);
    free(b);
    free_case(&wins);
    free_case(&loses);
}

/* --time-limit stops the search with the best found by then: never faster than the exact
 * answer, and said; "dp" fixed, none is searched. */
static void test_time_limit(void)
{
    struct pool_case pc = mixed_wins();
    const char *file = pool_write(&pc, "limit.json");
    struct pool_mixed_result exact_r, r;
    double exact = mixed_search(file, 0, &exact_r), limited = mixed_search(file, 1e-9, &r);
    CU_ASSERT(!exact_r.timed_out && r.timed_out);
    CU_ASSERT(r.planned < exact_r.planned);
    CU_ASSERT(limited >= exact);
    /* a fixed "dp" asks for identical replicas: no grouping searched */
    char *text = test_read(file), fixed[8192];
    CU_ASSERT_FATAL(text != NULL);
    snprintf(fixed, sizeof fixed, "%.*s,\"dp\":1}", (int)(strrchr(text, '}') - text), text);
    CU_ASSERT(isinf(mixed_search(test_write("limit-dp.json", fixed), 0, &r)));
    CU_ASSERT(r.groupings == 0 && r.planned == 0);
    free(text);
    free_case(&pc);
}

/* Bad pools refused with the file, the field and the numbers, before any search. */
static void test_bad_pools(void)
{
    struct pool_case pc = two_kinds();
    static const char *const bad[3][2] = {
        {"\"count\":4,\"per_node\":2", "\"count\":4,\"per_node\":8"},
        {"\"global_batch\":16", "\"global_batch\":0"},
        {"\"count\":4", "\"count\":-4"},
    };
    static const char *const want[3] = {
        "pool[0].per_node: 8 GPUs a node, but the pool has only 4 of \"A100-40GB\"",
        "global_batch", "pool[0].count"};
    for (int i = 0; i < 3; i++) {
        char *text = test_read(pool_write(&pc, "bad.json")), args[1024], *err = NULL;
        char *at = strstr(text, bad[i][0]), fixed[8192];
        CU_ASSERT_FATAL(at != NULL);
        snprintf(fixed, sizeof fixed, "%.*s%s%s", (int)(at - text), text, bad[i][1],
                 at + strlen(bad[i][0]));
        const char *file = test_write("bad.json", fixed);
        snprintf(args, sizeof args, "plan --cluster %s", file);
        CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
        CU_ASSERT(err != NULL && strstr(err, file) != NULL && strstr(err, want[i]) != NULL);
        if (err == NULL || strstr(err, want[i]) == NULL)
            fprintf(stderr, "\nwanted \"%s\" in: %s\n", want[i], err ? err : "");
        free(err);
        free(text);
    }
    free_case(&pc);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("pool_mixed", NULL, NULL);
    CU_add_test(s, "the heterogeneous search against brute force", test_against_brute_force);
    CU_add_test(s, "plan -o: replicas when they win, the same plan when not", test_cli_choice);
    CU_add_test(s, "--time-limit: the best found by then", test_time_limit);
    CU_add_test(s, "bad pools refused with their numbers", test_bad_pools);
    return test_main();
}
