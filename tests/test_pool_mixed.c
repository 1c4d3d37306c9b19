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

#include "cluster.h"
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
    double link_gbps; /* between stages (dp_link: 10 Gb/s) */
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
             "\"link\":{\"gbps\":%g,\"latency_us\":2},\"dp_link\":{\"gbps\":10,"
             "\"latency_us\":5},\"shard_optimizer\":true,\"pool\":[%s,%s]}",
             pc->global_batch, pc->link_gbps, kinds[0], kinds[1]);
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
             "\"link\":{\"gbps\":%g,\"latency_us\":2},\"dp_link\":{\"gbps\":10,"
             "\"latency_us\":5},\"shard_optimizer\":true,\"stages\":[%s]}",
             M, pc->link_gbps, stages);
    struct cluster c;
    struct plan_options o;
    struct err e;
    err_clear(&e);
    plan_options_default(&o);
    o.repartition = 1;
    o.search_gap = 0;
    CU_ASSERT_EQUAL_FATAL(cluster_load(test_write("group.json", text), &c, &e), ERR_OK);
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
static double brute_force(const struct pool_case *pc, long *splits)
{
    struct group g[KINDS][64];
    int n[KINDS], B = pc->global_batch / MICRO_BATCH;
    double best = INFINITY;
    for (int k = 0; k < KINDS; k++)
        n[k] = kind_groups(pc, k, g[k]);
    *splits = 0;
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

static double mixed_search(const char *file, struct pool_mixed_result *r)
{
    struct plan_options o;
    struct plan *plans;
    struct replicas_result step;
    struct err e;
    int n;
    err_clear(&e);
    plan_options_default(&o);
    o.search_gap = 0;
    CU_ASSERT_EQUAL_FATAL(pool_mixed_search(file, &o, INFINITY, &plans, &n, &step, r, &e),
                          ERR_OK);
    double ms = n > 0 ? step.step_ms : INFINITY;
    CU_ASSERT_EQUAL(n, r->n_groups);
    for (int g = 0; g < n; g++)
        plan_free(&plans[g]);
    free(plans);
    replicas_result_free(&step);
    return ms;
}

static void test_against_brute_force(void)
{
    struct pool_case pc = {{"A100-40GB", "V100-32GB"}, {NULL, NULL}, {4, 4}, {0, 0}, 16, 100};
    for (int k = 0; k < KINDS; k++)
        pc.profile[k] = estimated_profile(pc.device[k]);
    /* memories: roomy, then tight enough that some groups do not fit */
    static const long long memory[2][KINDS] = {{40000000000LL, 32000000000LL},
                                               {40000000000LL, 60000000LL}};
    static const int batch[2] = {16, 14};
    for (int i = 0; i < 2; i++) {
        pc.memory[0] = memory[i][0];
        pc.memory[1] = memory[i][1];
        pc.global_batch = batch[i];
        struct pool_mixed_result r;
        long splits;
        double got = mixed_search(pool_write(&pc, "brute.json"), &r);
        double want = brute_force(&pc, &splits);
        printf("\n  batch %d: %.6f ms (brute force %.6f ms over %ld splits); %ld groupings, %ld "
               "pipelines planned, %ld splits scored",
               pc.global_batch, got, want, splits, r.groupings, r.planned, r.splits);
        CU_ASSERT(isfinite(want) && test_close(got, want, 1e-9, 1e-12));
        CU_ASSERT(r.splits <= splits);
    }
    for (int k = 0; k < KINDS; k++)
        free(pc.profile[k]);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("pool_mixed", NULL, NULL);
    CU_add_test(s, "the heterogeneous search against brute force", test_against_brute_force);
    return test_main();
}
