/* The pool search (issue 17) on small pools of two estimated kinds, against its exhaustive
 * run (every candidate planned with no cutoff): the same plan; every candidate's lower bound
 * at most its step; no candidate left out for memory fits; the certified bound at most the
 * exhaustive best. And --repartition's cutoff, the time limit and bad pools. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "estimate.h"
#include "planner.h"
#include "pool.h"
#include "testutil.h"

static char profiles[2][1024];
static const char *const kinds[2] = {"A100-40GB", "V100-32GB"};

/* gpt-tiny's estimated profiles on both kinds. */
static int write_profiles(void)
{
    for (int k = 0; k < 2; k++) {
        char args[2048];
        snprintf(profiles[k], sizeof profiles[k], "%s", test_path(kinds[k]));
        snprintf(args, sizeof args,
                 "profile --model %s/configs/models/gpt-tiny.json --estimate --device %s "
                 "--devices %s/configs/devices.json -o %s",
                 BALLAST_SOURCE_DIR, kinds[k], BALLAST_SOURCE_DIR, profiles[k]);
        if (test_run(args, NULL, NULL) != 0)
            return -1;
    }
    return 0;
}

/* A pool of a A100s (all memory) and v V100s of 7 MB (about two of gpt-tiny's blocks' state
 * a GPU at tp 1, dp 1), two a node; `extra`: more members. Returns the file. */
static const char *pool_file(int a, int v, int global_batch, const char *extra)
{
    char text[4096];
    snprintf(text, sizeof text,
             "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"global_batch\":%d,"
             "\"link\":{\"gbps\":10,\"latency_us\":5},\"shard_optimizer\":true%s,\"pool\":["
             "{\"device\":\"%s\",\"count\":%d,\"per_node\":2,\"memory_bytes\":40000000000,"
             "\"profile\":\"%s\",\"node_link\":{\"gbps\":400,\"latency_us\":1}},"
             "{\"device\":\"%s\",\"count\":%d,\"per_node\":2,\"memory_bytes\":7000000,"
             "\"profile\":\"%s\",\"node_link\":{\"gbps\":200,\"latency_us\":1}}]}",
             global_batch, extra, kinds[0], a, profiles[0], kinds[1], v, profiles[1]);
    return test_write("pool.json", text);
}

struct pool_case {
    int a, v, global_batch;
    const char *extra;
};

static const struct pool_case cases[] = {
    {4, 4, 16, ",\"dp_link\":{\"gbps\":1,\"latency_us\":50}"},
    {2, 6, 8, ""},
    {2, 8, 32, ",\"dp_link\":{\"gbps\":5,\"latency_us\":20}"},
    {4, 2, 64, ",\"dp_link\":{\"gbps\":0.5,\"latency_us\":100}"},
    {4, 4, 16, ",\"dp_link\":{\"gbps\":1,\"latency_us\":50},\"micro_batch_sizes\":[1,2,4]"},
};

/* The exhaustive search (every candidate planned) and the pruned one of the file, exact, with
 * the default --actions (0) or these. */
static void search_both(const char *file, int actions, struct plan *all, struct pool_result *ra,
                        struct plan *pruned, struct pool_result *rp)
{
    struct plan_options o;
    struct err e;
    err_clear(&e);
    plan_options_default(&o);
    o.search_gap = 0;
    o.estimate = estimate_profile; /* a pool with "micro_batch_sizes" */
    o.actions = actions ? actions : o.actions;
    int rc = pool_search_pruned(file, &o, 0, all, ra, &e);
    if (rc == ERR_OK && (rc = pool_search_pruned(file, &o, POOL_KEEP, pruned, rp, &e)) != ERR_OK)
        plan_free(all);
    if (rc != ERR_OK)
        fprintf(stderr, "%s\n", e.msg);
    CU_ASSERT_EQUAL_FATAL(rc, ERR_OK);
}

static void test_pruned_equals_exhaustive(void)
{
    long left_for_memory = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const struct pool_case *pc = &cases[i];
        char file[1024];
        snprintf(file, sizeof file, "%s", pool_file(pc->a, pc->v, pc->global_batch, pc->extra));
        struct plan all, pruned;
        struct pool_result ra, rp;
        struct plan_options o;
        struct err e;
        err_clear(&e);
        search_both(file, 0, &all, &ra, &pruned, &rp);
        printf("\n  A100 %d, V100 %d, batch %d: %ld of %ld candidates planned (%ld cut, %ld "
               "cannot fit); %.6f ms (all: %.6f); bound/step at most %.6f; gap %.3g%%",
               pc->a, pc->v, pc->global_batch, rp.candidates, ra.candidates, rp.cut,
               rp.cannot_fit, pruned.iteration_ms, all.iteration_ms, ra.bound_ratio,
               100 * rp.gap);
        CU_ASSERT_EQUAL(pruned.iteration_ms, all.iteration_ms);
        CU_ASSERT(rp.dp == ra.dp && rp.micro_batches == ra.micro_batches);
        CU_ASSERT(memcmp(rp.tp, ra.tp, sizeof rp.tp) == 0);
        CU_ASSERT(memcmp(rp.stages, ra.stages, sizeof rp.stages) == 0);
        CU_ASSERT(rp.candidates < ra.candidates);
        CU_ASSERT_EQUAL(rp.enumerated + rp.cannot_fit, ra.candidates);
        /* every candidate planned: its bound at most its step, none left for memory fits (the
         * pruned search leaves a range of dps for memory only when its most sharded dp
         * cannot fit) */
        CU_ASSERT(ra.bound_ratio > 0.3 && ra.bound_ratio <= 1);
        CU_ASSERT_EQUAL(ra.refuted_but_fits, 0);
        CU_ASSERT(rp.cannot_fit <= ra.cannot_fit);
        left_for_memory += rp.cannot_fit;
        /* exact: the certified bound is the step */
        CU_ASSERT(rp.exhausted && rp.gap <= 1e-12 && rp.lower_bound <= all.iteration_ms);
        CU_ASSERT(pruned.search.present && pruned.optimality_gap == rp.gap);
        plan_free(&pruned);
        /* passes of 3 candidates: the same plan */
        plan_options_default(&o);
        o.search_gap = 0;
        o.estimate = estimate_profile;
        CU_ASSERT_EQUAL_FATAL(pool_search_pruned(file, &o, 3, &pruned, &rp, &e), ERR_OK);
        CU_ASSERT_EQUAL(pruned.iteration_ms, all.iteration_ms);
        CU_ASSERT(rp.dp == ra.dp && rp.micro_batch == ra.micro_batch);
        CU_ASSERT(memcmp(rp.stages, ra.stages, sizeof rp.stages) == 0);
        CU_ASSERT(memcmp(rp.tp, ra.tp, sizeof rp.tp) == 0);
        CU_ASSERT(rp.gap <= 1e-12 && rp.lower_bound <= all.iteration_ms);
        plan_free(&pruned);
        /* the default gap: within it of the best, and its certified bound below the best */
        plan_options_default(&o);
        o.estimate = estimate_profile;
        CU_ASSERT_EQUAL_FATAL(pool_search(file, &o, &pruned, &rp, &e), ERR_OK);
        CU_ASSERT(pruned.iteration_ms <= all.iteration_ms * (1 + o.search_gap) * (1 + 1e-12));
        CU_ASSERT(rp.lower_bound <= all.iteration_ms * (1 + 1e-12));
        CU_ASSERT(rp.gap <= o.search_gap * (1 + 1e-9));
        plan_free(&pruned);
        plan_free(&all);
    }
    CU_ASSERT(left_for_memory > 0);
}

/* With the optimizer and activations allowed on the host (a node's host memory and link per
 * entry; the last case streams weights too), V100s of `v_bytes`: the pruned search still
 * equals the exhaustive one, and no candidate the bounds refute fits (the bytes the bounds
 * count on the device are the least the actions leave there). */
static void test_host_actions(void)
{
    static const struct {
        int a, v, global_batch;
        long long v_bytes;
    } host_cases[] = {{4, 4, 16, 7000000}, {2, 6, 8, 7000000}, {2, 8, 16, 4500000}};
    for (size_t i = 0; i < sizeof host_cases / sizeof *host_cases; i++) {
        char text[4096], file[1024];
        snprintf(text, sizeof text,
                 "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"global_batch\":%d,"
                 "\"link\":{\"gbps\":10,\"latency_us\":5},\"shard_optimizer\":true,\"pool\":["
                 "{\"device\":\"%s\",\"count\":%d,\"per_node\":2,\"memory_bytes\":40000000000,"
                 "\"profile\":\"%s\",\"node_link\":{\"gbps\":400,\"latency_us\":1},"
                 "\"host_link\":{\"gbps\":100,\"latency_us\":2},"
                 "\"node_host_memory_bytes\":100000000000},"
                 "{\"device\":\"%s\",\"count\":%d,\"per_node\":2,\"memory_bytes\":%lld,"
                 "\"profile\":\"%s\",\"node_link\":{\"gbps\":200,\"latency_us\":1},"
                 "\"host_link\":{\"gbps\":100,\"latency_us\":2},"
                 "\"node_host_memory_bytes\":100000000000}]}",
                 host_cases[i].global_batch, kinds[0], host_cases[i].a, profiles[0], kinds[1],
                 host_cases[i].v, host_cases[i].v_bytes, profiles[1]);
        snprintf(file, sizeof file, "%s", test_write("pool-host.json", text));
        struct plan all, pruned;
        struct pool_result ra, rp;
        search_both(file,
                    PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD | PLAN_ACTION_OPTIMIZER |
                        (i == 2 ? PLAN_ACTION_WEIGHTS : 0),
                    &all, &ra, &pruned, &rp);
        printf("\n  host actions, A100 %d, V100 %d of %lld bytes: %ld of %ld planned (%ld fit), "
               "%.6f ms (all: %.6f), %ld refuted but fit", host_cases[i].a, host_cases[i].v,
               host_cases[i].v_bytes, rp.candidates, ra.candidates, ra.fitted,
               pruned.iteration_ms, all.iteration_ms, ra.refuted_but_fits);
        CU_ASSERT_EQUAL(ra.refuted_but_fits, 0);
        CU_ASSERT_EQUAL(pruned.iteration_ms, all.iteration_ms);
        plan_free(&pruned);
        plan_free(&all);
    }
}

/* The cutoff: above the step the same plan, below it ERR_NOFIT with a certified bound between
 * the cutoff (less the gap) and the step; a cluster that cannot fit says INFINITY. */
static void test_cutoff(void)
{
    char text[2048];
    snprintf(text, sizeof text,
             "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"micro_batches\":8,"
             "\"link\":{\"gbps\":10,\"latency_us\":5},\"stages\":["
             "{\"device\":\"%s\",\"memory_bytes\":40000000000,\"profile\":\"%s\"},"
             "{\"device\":\"%s\",\"memory_bytes\":%d,\"profile\":\"%s\"},"
             "{\"device\":\"%s\",\"memory_bytes\":%d,\"profile\":\"%s\"}]}",
             kinds[0], profiles[0], kinds[1], 30000000, profiles[1], kinds[1], 30000000,
             profiles[1]);
    struct cluster c;
    struct plan free_run, p;
    struct plan_options o;
    struct err e;
    err_clear(&e);
    plan_options_default(&o);
    o.repartition = 1;
    o.search_gap = 0;
    CU_ASSERT_EQUAL_FATAL(cluster_load(test_write("cut.json", text), &c, &e), ERR_OK);
    CU_ASSERT_EQUAL_FATAL(planner_make(&c, &o, &free_run, &e), ERR_OK);
    o.cutoff_ms = free_run.iteration_ms * 1.01;
    CU_ASSERT_EQUAL(planner_make(&c, &o, &p, &e), ERR_OK);
    CU_ASSERT_EQUAL(p.iteration_ms, free_run.iteration_ms);
    plan_free(&p);
    o.cutoff_ms = free_run.iteration_ms * 0.99;
    CU_ASSERT_EQUAL(planner_make(&c, &o, &p, &e), ERR_NOFIT);
    CU_ASSERT(strstr(e.msg, "nothing faster than the cutoff") != NULL);
    CU_ASSERT(p.search.present && p.n_stages == 0);
    CU_ASSERT(p.search.lower_bound >= o.cutoff_ms * (1 - 1e-9));
    CU_ASSERT(p.search.lower_bound <= free_run.iteration_ms);
    plan_free(&free_run);
    cluster_free(&c);
    err_clear(&e);
    /* 1 MB a V100: nothing fits, the cutoff or not */
    char *at;
    while ((at = strstr(text, "30000000")) != NULL)
        memcpy(at, "01000000", 8);
    CU_ASSERT_EQUAL_FATAL(cluster_load(test_write("cut1.json", text), &c, &e), ERR_OK);
    CU_ASSERT_EQUAL(planner_make(&c, &o, &p, &e), ERR_NOFIT);
    CU_ASSERT(p.search.present && isinf(p.search.lower_bound));
    cluster_free(&c);
}

/* A time limit too short for more than the first plan: stopped, and its certified bound still
 * at most the exhaustive best. */
static void test_time_limit(void)
{
    const struct pool_case *pc = &cases[0];
    const char *file = pool_file(pc->a, pc->v, pc->global_batch, pc->extra);
    struct plan all, exact, p;
    struct pool_result ra, rx, r;
    struct plan_options o;
    struct err e;
    search_both(file, 0, &all, &ra, &exact, &rx);
    plan_free(&exact);
    err_clear(&e);
    plan_options_default(&o);
    o.search_gap = 0;
    o.time_limit_s = 1e-9;
    CU_ASSERT_EQUAL_FATAL(pool_search(file, &o, &p, &r, &e), ERR_OK);
    printf("\n  stopped after %ld candidates: %.6f ms (best %.6f), certified gap %.3f%%",
           r.candidates, p.iteration_ms, all.iteration_ms, 100 * r.gap);
    CU_ASSERT(!r.exhausted && r.candidates >= 1);
    CU_ASSERT(r.lower_bound <= all.iteration_ms * (1 + 1e-12));
    CU_ASSERT(p.iteration_ms >= all.iteration_ms);
    CU_ASSERT(test_close(r.gap, p.iteration_ms / r.lower_bound - 1, 1e-12, 1e-9));
    plan_free(&p);
    plan_free(&all);
}

/* Micro-batch sizes: the search over [2, 4] is the better of the searches over each alone,
 * the model's size alone is the search without the field; bad sizes refused by name. */
static void test_micro_batch_sizes(void)
{
    static const char *const extra[4] = {
        ",\"micro_batch_sizes\":[2,4]", ",\"micro_batch_sizes\":[2]",
        ",\"micro_batch_sizes\":[4]", ""};
    struct plan p[4];
    struct pool_result r[4];
    struct plan_options o;
    struct err e;
    err_clear(&e);
    plan_options_default(&o);
    o.search_gap = 0;
    o.estimate = estimate_profile;
    for (int i = 0; i < 4; i++) {
        const char *file = pool_file(4, 4, 16, extra[i]);
        CU_ASSERT_EQUAL_FATAL(pool_search(file, &o, &p[i], &r[i], &e), ERR_OK);
        CU_ASSERT_EQUAL(p[i].model.micro_batch, r[i].micro_batch);
        CU_ASSERT_EQUAL(r[i].micro_batch * r[i].micro_batches * r[i].dp, 16);
    }
    printf("\n  sizes 2 and 4: %.6f ms at %d; 2: %.6f ms; 4: %.6f ms; the model's: %.6f ms",
           p[0].iteration_ms, r[0].micro_batch, p[1].iteration_ms, p[2].iteration_ms,
           p[3].iteration_ms);
    CU_ASSERT_EQUAL(p[0].iteration_ms, fmin(p[1].iteration_ms, p[2].iteration_ms));
    CU_ASSERT_EQUAL(r[1].micro_batch, 2);
    CU_ASSERT_EQUAL(p[2].iteration_ms, p[3].iteration_ms);
    CU_ASSERT_EQUAL(r[2].micro_batch, 4);
    for (int i = 0; i < 4; i++)
        plan_free(&p[i]);
    static const char *const bad[3][2] = {
        {"[3]", "micro_batch_sizes[0]: 3 does not divide global_batch 16"},
        {"[2,-1]", "micro_batch_sizes[1]"},
        {"[2,4,2]", "micro_batch_sizes[2]: 2 is micro_batch_sizes[0] too"},
    };
    for (int i = 0; i < 3; i++) {
        char more[128], args[2048], *err = NULL;
        snprintf(more, sizeof more, ",\"micro_batch_sizes\":%s", bad[i][0]);
        snprintf(args, sizeof args, "plan --cluster %s", pool_file(4, 4, 16, more));
        CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
        if (err == NULL || strstr(err, bad[i][1]) == NULL || strstr(err, "pool.json") == NULL) {
            fprintf(stderr, "%s: expected \"%s\" in: %s\n", bad[i][0], bad[i][1],
                    err ? err : "");
            CU_FAIL("bad micro_batch_sizes");
        }
        free(err);
    }
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("pool", NULL, NULL);
    CU_add_test(s, "the pruned search equals the exhaustive one; bounds hold",
                test_pruned_equals_exhaustive);
    CU_add_test(s, "--repartition's cutoff", test_cutoff);
    CU_add_test(s, "the optimizer and activations on the host", test_host_actions);
    CU_add_test(s, "the time limit and the certified gap", test_time_limit);
    CU_add_test(s, "micro-batch sizes", test_micro_batch_sizes);
    if (write_profiles() != 0) {
        fprintf(stderr, "could not write the profiles\n");
        return 1;
    }
    return test_main();
}
