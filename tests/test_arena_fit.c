/* `plan --arena`'s fit (planner/methods/arena_fit.h) against brute force: on random small stages
 * (splits of the tiny GPT, micro-batch counts, schedules, limits), every recompute combination
 * of the stage is laid out with the same method, and the search's choice must fit and have the
 * least recompute time of those that fit (ERR_NOFIT exactly when none does). Then the command
 * line: a stage that fits only with the smaller arena is planned, one that fits with none exits
 * 3 with state, arena, lower bound and limit, and patent chooses as without --arena. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena_fit.h"
#include "cluster.h"
#include "cost.h"
#include "planner.h"
#include "reference.h"
#include "testutil.h"

#define STAGE1_TIGHT 37748736 /* 36 MiB: block:1's stage 1 fits with greedy, not with slots */

/* A three-stage tiny-GPT cluster split at a and b, stage 1 given `stage1` bytes. */
static const char *write_cluster(const char *name, const char *schedule, int micro, int a,
                                 int b, long long stage1)
{
    char text[2048], prof[1024];
    snprintf(prof, sizeof prof, "%s/configs/profiles/estimated/gpt-tiny/cpu.json",
             BALLAST_SOURCE_DIR);
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"%s\", \"micro_batches\": %d, "
             "\"stages\": ["
             "{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": \"%s\", "
             "\"layers\": [0, %d]},"
             "{\"device\": \"cpu\", \"memory_bytes\": %lld, \"profile\": \"%s\", \"layers\": "
             "[%d, %d]},"
             "{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": \"%s\", "
             "\"layers\": [%d, 7]}]}",
             schedule, micro, prof, a - 1, stage1, prof, a, b - 1, prof, b);
    return test_write(name, text);
}

/* The arena of stage s's current choice, laid out by opt: state + arena + reserve. */
static int64_t stage_memory(const struct plan *p, int s, const struct arena_options *opt)
{
    struct arena_object *o;
    int n;
    struct arena a;
    struct arena_result r;
    struct err e;
    struct stage_cost c;
    err_clear(&e);
    CU_ASSERT_FATAL(arena_stage_objects(p, s, &o, &n, &e) == ERR_OK);
    CU_ASSERT_FATAL(arena_layout(o, n, p->stages[s].in_flight, opt, &a, &r, &e) == ERR_OK);
    plan_stage_cost(p, &p->stages[s], &c);
    int64_t m = cost_memory_with_arena(&c, a.bytes);
    arena_free(&a);
    return m;
}

/* Every combination of stage s: its memory with the arena and its recompute time. */
struct combo {
    int64_t memory;
    double ms;
};

static int all_combos(struct plan *p, int s, const struct arena_options *opt, int whole,
                      struct combo *out)
{
    struct plan_stage *st = &p->stages[s];
    int n = plan_stage_layer_count(st), count = 1;
    for (int l = 0; l < n; l++)
        count *= whole ? 2 : cost_choice_count(&st->layers[l]);
    for (int i = 0; i < count; i++) {
        int rest = i;
        for (int l = 0; l < n; l++) {
            int k = whole ? 2 : cost_choice_count(&st->layers[l]);
            st->actions[l].choice = (unsigned char)(rest % k);
            rest /= k;
        }
        struct stage_cost c;
        plan_stage_cost(p, st, &c);
        out[i] = (struct combo){stage_memory(p, s, opt), c.recompute_ms};
    }
    return count;
}

static struct plan_options optimal_with(const struct arena_options *arena, int whole)
{
    struct plan_options o;
    plan_options_default(&o);
    o.arena = arena;
    o.whole_layers = whole;
    o.min_gain = 0; /* each stage's least recompute, which the brute force is */
    return o;
}

/* One stage, one method: the search against every combination at random limits. */
static void check_stage(struct plan *p, int s, const char *method, int whole,
                        struct test_rng *rng, long *laid_out, long *combos)
{
    struct arena_options opt;
    arena_options_default(&opt);
    snprintf(opt.method, sizeof opt.method, "%s", method);
    opt.generations = 40;
    static struct combo c[4096];
    int count = all_combos(p, s, &opt, whole, c);
    int64_t lo = INT64_MAX, hi = 0;
    for (int i = 0; i < count; i++) {
        lo = c[i].memory < lo ? c[i].memory : lo;
        hi = c[i].memory > hi ? c[i].memory : hi;
    }
    struct plan_options o = optimal_with(&opt, whole);
    for (int t = 0; t < 6; t++) {
        int64_t limit = test_rng_int(rng, lo - (hi - lo) / 8 - 1, hi + 1);
        double best = INFINITY;
        for (int i = 0; i < count; i++)
            if (c[i].memory <= limit && c[i].ms < best)
                best = c[i].ms;
        p->stages[s].memory_limit_bytes = limit;
        struct arena_fit_search f;
        struct err e;
        err_clear(&e);
        int rc = arena_least_recompute(p, s, &o, &f, &e);
        CU_ASSERT_EQUAL(rc, isinf(best) ? ERR_NOFIT : ERR_OK);
        CU_ASSERT_EQUAL(f.proven, rc == ERR_OK);
        *laid_out += f.laid_out;
        *combos += count;
        if (rc != ERR_OK)
            continue;
        struct stage_cost sc;
        plan_stage_cost(p, &p->stages[s], &sc);
        CU_ASSERT(stage_memory(p, s, &opt) <= limit);
        CU_ASSERT(fabs(sc.recompute_ms - best) <= 1e-9 * (1 + best));
    }
}

static void test_brute_force(void)
{
    struct test_rng rng = {20261123};
    const char *methods[] = {"slots", "greedy", "ga", "exact"};
    long laid_out = 0, combos = 0;
    for (int trial = 0; trial < 12; trial++) {
        int a = (int)test_rng_int(&rng, 1, 4), b = a + (int)test_rng_int(&rng, 1, 3);
        const char *cl = write_cluster("fit-cluster.json", trial % 2 ? "gpipe" : "1f1b",
                                       (int)test_rng_int(&rng, 2, 5), a, b, 1LL << 30);
        struct cluster c;
        struct plan p;
        struct plan_options none;
        struct err e;
        err_clear(&e);
        plan_options_default(&none);
        none.method = METHOD_NONE;
        CU_ASSERT_FATAL(cluster_load(cl, &c, &e) == ERR_OK);
        CU_ASSERT_FATAL(planner_make(&c, &none, &p, &e) == ERR_OK);
        cluster_free(&c);
        for (int s = 0; s < 3; s++) {
            int layers = plan_stage_layer_count(&p.stages[s]);
            for (int m = 0; m < 4; m++)
                if (m < 3 || layers == 1)
                    check_stage(&p, s, methods[m], trial % 3 == 0, &rng, &laid_out, &combos);
        }
        plan_free(&p);
    }
    printf("\n  brute force: %ld combinations, the search laid out %ld ", combos, laid_out);
}

/* `ballast plan ARGS` on the tight cluster: status, and standard error into *err. */
static int plan_tight(const char *args, char **err)
{
    const char *cl = write_cluster("tight.json", "1f1b", 4, 3, 6, STAGE1_TIGHT);
    char line[4096], *out = NULL;
    snprintf(line, sizeof line, "plan --cluster '%s' %s --quiet -o '%s'", cl, args,
             test_path("tight-plan.json"));
    int rc = test_run(line, &out, err);
    free(out);
    return rc;
}

static void test_fits_only_with_arena(void)
{
    char *err = NULL;
    CU_ASSERT_EQUAL(plan_tight("--method block:1", &err), 3);
    free(err);
    CU_ASSERT_EQUAL(plan_tight("--method block:1 --arena slots", &err), 3);
    CU_ASSERT(err != NULL && strstr(err, "stage 1") != NULL &&
              strstr(err, "lower bound 25460736") != NULL &&
              strstr(err, "slots arena 30449664") != NULL &&
              strstr(err, "memory_limit_bytes 37748736") != NULL);
    free(err);
    CU_ASSERT_EQUAL(plan_tight("--method block:1 --arena greedy", &err), 0);
    free(err);
    CU_ASSERT_EQUAL(plan_tight("--method uniform-min --arena greedy", &err), 0);
    free(err);
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(plan_load(test_path("tight-plan.json"), &p, &e) == ERR_OK);
    CU_ASSERT(p.stages[1].memory_bytes <= STAGE1_TIGHT);
    /* block:1 */
    CU_ASSERT(p.stages[1].actions[0].choice == COST_FULL &&
              p.stages[1].actions[1].choice == COST_KEEP);
    plan_free(&p);
}

/* optimal with a stage that fits no combination: exit 3 with the stage's numbers. */
static void test_nofit(void)
{
    const char *cl = write_cluster("hopeless.json", "1f1b", 4, 3, 6, 12000000);
    char args[4096], *out = NULL, *err = NULL;
    snprintf(args, sizeof args, "plan --cluster '%s' --arena greedy --quiet", cl);
    CU_ASSERT_EQUAL(test_run(args, &out, &err), 3);
    CU_ASSERT(err != NULL && strstr(err, "stage 1 (cpu, layers 3-5): state ") != NULL &&
              strstr(err, "lower bound") != NULL &&
              strstr(err, "memory_limit_bytes 12000000") != NULL);
    free(out);
    free(err);
}

/* patent chooses as published: the same choices with and without --arena. */
static void test_patent_unchanged(void)
{
    char a[1024], b[1024], args[4096], *out = NULL, *err = NULL;
    snprintf(a, sizeof a, "%s", test_path("patent-plain.json"));
    snprintf(b, sizeof b, "%s", test_path("patent-arena.json"));
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args,
                 "plan --cluster %s/configs/clusters/cpu-3.json --method patent %s --quiet "
                 "-o '%s'",
                 BALLAST_SOURCE_DIR, k ? "--arena greedy" : "", k ? b : a);
        CU_ASSERT_EQUAL(test_run(args, &out, &err), 0);
        free(out);
        free(err);
    }
    struct plan p, q;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(plan_load(a, &p, &e) == ERR_OK && plan_load(b, &q, &e) == ERR_OK);
    for (int s = 0; s < p.n_stages; s++)
        CU_ASSERT(ref_same_actions(&p.stages[s], &q.stages[s]));
    plan_free(&p);
    plan_free(&q);
}

/* Stages too large to walk (shipped clusters): the relaxed knapsack's candidates start at the
 * knapsack's own answer, so with the greedy layout (never above the slots carving on these)
 * the choice fits and recomputes no more than the plan without --arena. */
static void test_large_stages(void)
{
    const char *clusters[] = {"v100-a100-8", "t4-4090-4", "h100-a100-l4-16", "a10-l4-v100-16"};
    int unproven = 0;
    for (int k = 0; k < 4; k++) {
        char file[1024];
        snprintf(file, sizeof file, "%s/configs/clusters/%s.json", BALLAST_SOURCE_DIR,
                 clusters[k]);
        struct cluster c;
        struct plan p;
        struct plan_options plain;
        struct arena_options opt;
        struct err e;
        err_clear(&e);
        plan_options_default(&plain);
        plain.min_gain = 0; /* each stage's least recompute */
        arena_options_default(&opt);
        struct plan_options o = optimal_with(&opt, 0);
        CU_ASSERT_FATAL(cluster_load(file, &c, &e) == ERR_OK);
        CU_ASSERT_FATAL(planner_make(&c, &plain, &p, &e) == ERR_OK);
        cluster_free(&c);
        for (int s = 0; s < p.n_stages; s++) {
            struct stage_cost before, after;
            struct arena_fit_search f;
            plan_stage_cost(&p, &p.stages[s], &before);
            CU_ASSERT_EQUAL(arena_least_recompute(&p, s, &o, &f, &e), ERR_OK);
            plan_stage_cost(&p, &p.stages[s], &after);
            CU_ASSERT(after.recompute_ms <= before.recompute_ms + 1e-9);
            CU_ASSERT(stage_memory(&p, s, &opt) <= p.stages[s].memory_limit_bytes);
            unproven += !f.proven;
        }
        plan_free(&p);
    }
    CU_ASSERT(unproven > 0); /* the candidates' path was taken */
    printf("\n  %d stages by the relaxed knapsack's candidates ", unproven);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("arena_fit", NULL, NULL);
    CU_add_test(s, "random small stages: the least recompute that fits = brute force",
                test_brute_force);
    CU_add_test(s, "large stages: fit, no more recompute than without --arena",
                test_large_stages);
    CU_add_test(s, "a stage that fits only with the smaller arena", test_fits_only_with_arena);
    CU_add_test(s, "no combination fits: exit 3 with the numbers", test_nofit);
    CU_add_test(s, "patent chooses as without --arena", test_patent_unchanged);
    return test_main();
}
