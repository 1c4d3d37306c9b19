/* The pool search's whole answer (issues 17, 31) on small pools of two estimated kinds, against
 * a brute force over every answer it covers: one group (dp replicas of a shape: per kind tp 1
 * or 2 and its stage count) or two groups of different shapes side by side, and every dealing
 * of the global batch's micro-batches to their replicas (not only the even one the search
 * takes), each group's pipeline planned exactly by --repartition from a cluster file written
 * here (a pair's group for its step alone), each answer scored by replicas_step with one
 * pipeline for each group and micro-batch count (so the claim that a replica taking fewer
 * micro-batches never changes the step is checked, not assumed). Every bound the search uses
 * on a group is checked against the steps here, and every pair's step against its groups'
 * floors (replicas_step_floor, by which the search leaves a planned group), and the
 * certificates of a search whose group searches stop at one node and of one stopped after its
 * first lead. Also: the plan and replicas files the CLI writes, simulate on them, the GPUs
 * divisibility left idle before, the time limit. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "cluster.h"
#include "jsonio.h"
#include "plan.h"
#include "planner.h"
#include "pool.h"
#include "pool_mixed.h"
#include "pool_model.h"
#include "replicas.h"
#include "testutil.h"

#define MICRO_BATCH 2
#define KINDS 2
#define TP_MAX 2
#define LAYERS 4 /* gpt n_layer 2: embed, 2 blocks, head */

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
    const char *profile[KINDS];
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

/* A shape: per kind its tp and stages (0: unused). */
struct shape {
    int tp[KINDS], S[KINDS];
};

static int shape_gpus(const struct shape *x, int k)
{
    return x->tp[k] * x->S[k];
}

/* Every shape of at most LAYERS stages. */
static int all_shapes(struct shape *out)
{
    int n = 0;
    for (int code = 0; code < (TP_MAX * LAYERS + 1) * (TP_MAX * LAYERS + 1); code++) {
        struct shape x;
        int c[KINDS] = {code % (TP_MAX * LAYERS + 1), code / (TP_MAX * LAYERS + 1)}, S = 0;
        for (int k = 0; k < KINDS; k++) {
            x.S[k] = c[k] == 0 ? 0 : 1 + (c[k] - 1) % LAYERS;
            x.tp[k] = c[k] == 0 ? 1 : 1 + (c[k] - 1) / LAYERS;
            S += x.S[k];
        }
        if (S >= 1 && S <= LAYERS)
            out[n++] = x;
    }
    return n;
}

/* A group's pipeline, planned exactly from a cluster file: its shape, dp replicas, M
 * micro-batches; alone (ALONE): planned for its step without the reduction over its replicas
 * (a pair's group), the pool's link between replicas kept in the plan; REDUCED: with that
 * reduction over its dp replicas in one piece after each stage's last backward (the cluster
 * without buckets: group_reduced_refuted's, which it asks of dp + 1). 0: none fits. */
enum { WITH_REDUCTION, ALONE, REDUCED };
struct planned {
    int used, fits;
    struct shape x;
    int dp, M, alone;
    struct plan plan;
    int simulated; /* pipe made */
    struct replicas_pipe pipe;
};

/* Planned groups by (shape index, dp, M, alone). */
#define SHAPES_MAX 128
#define DP_MAX 16
static struct planned cache[SHAPES_MAX * DP_MAX * DP_MAX * 3];
static struct shape shapes[SHAPES_MAX];

static void cache_clear(void)
{
    for (size_t i = 0; i < sizeof cache / sizeof *cache; i++)
        if (cache[i].used && cache[i].fits) {
            plan_free(&cache[i].plan);
            if (cache[i].simulated)
                replicas_pipe_free(&cache[i].pipe);
        }
    memset(cache, 0, sizeof cache);
}

static struct planned *plan_group(const struct pool_case *pc, int shape, int dp, int M,
                                  int alone)
{
    const struct shape *x = &shapes[shape];
    struct planned *g = &cache[((shape * DP_MAX + dp) * DP_MAX + M) * 3 + alone];
    if (g->used)
        return g;
    *g = (struct planned){.used = 1, .x = *x, .dp = dp, .M = M, .alone = alone};
    char stages[8192] = "", one[1024], text[10000];
    for (int k = 0; k < KINDS; k++)
        for (int s = 0; s < x->S[k]; s++) {
            snprintf(one, sizeof one,
                     "%s{\"device\":\"%s\",\"memory_bytes\":%lld,\"profile\":\"%s\","
                     "\"per_node\":2,\"node_link\":{\"gbps\":400,\"latency_us\":1},\"tp\":%d,"
                     "\"dp\":%d}",
                     stages[0] ? "," : "", pc->device[k], pc->memory[k], pc->profile[k],
                     x->tp[k], dp);
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
    CU_ASSERT_FATAL(cluster_group_grads(&c, &e) == ERR_OK);
    if (alone == REDUCED)
        c.dp_bucket_bytes = 0;
    struct link dp_link = c.stages[0].dp_link;
    for (int s = 0; alone == ALONE && s < c.n_stages; s++)
        c.stages[s].dp_link = (struct link){0};
    int rc = planner_make(&c, &o, &g->plan, &e);
    cluster_free(&c);
    CU_ASSERT(rc == ERR_OK || rc == ERR_NOFIT);
    g->fits = rc == ERR_OK;
    for (int s = 0; g->fits && s < g->plan.n_stages; s++)
        g->plan.stages[s].dp_link = dp_link;
    return g;
}

/* The step of the groups' replicas, each taking parts[g][r] micro-batches: one pipeline per
 * group and count (a copy of the group's plan at that count, its dp the replicas taking it).
 * INFINITY: a group does not fit. */
static double deal_step(struct planned **groups, int n, int parts[][16], const int *dp)
{
    struct plan p[32];
    int np = 0;
    for (int g = 0; g < n; g++) {
        if (!groups[g]->fits)
            return INFINITY;
        for (int m = 1; m <= groups[g]->M; m++) {
            int count = 0;
            for (int r = 0; r < dp[g]; r++)
                count += parts[g][r] == m;
            if (count == 0)
                continue;
            p[np] = groups[g]->plan;
            p[np].micro_batches = m;
            p[np].replica_micro_batches = NULL;
            p[np].stages = malloc((size_t)p[np].n_stages * sizeof *p[np].stages);
            memcpy(p[np].stages, groups[g]->plan.stages,
                   (size_t)p[np].n_stages * sizeof *p[np].stages);
            for (int s = 0; s < p[np].n_stages; s++)
                p[np].stages[s].dp = count;
            np++;
        }
    }
    struct replicas_result r;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(replicas_step(p, np, &r, &e), ERR_OK);
    double step = r.step_ms;
    replicas_result_free(&r);
    for (int i = 0; i < np; i++)
        free(p[i].stages);
    return step;
}

/* Every non-increasing split of B into n positive parts into out[r] (r < n), calling fn. */
typedef void (*deal_fn)(int *parts, void *arg);
static void each_partition(int B, int n, int most, int *parts, int at, deal_fn fn, void *arg)
{
    if (at == n) {
        if (B == 0)
            fn(parts, arg);
        return;
    }
    for (int m = most < B - (n - at - 1) ? most : B - (n - at - 1); m >= 1; m--) {
        if (m * (n - at) < B)
            break; /* the rest cannot take what is left */
        parts[at] = m;
        each_partition(B - m, n, m, parts, at + 1, fn, arg);
    }
}

/* The brute force's state: the pool, the best of one group and of two, and counts. */
struct brute {
    const struct pool_case *pc;
    int B;
    double one, two;
    long answers, unfit;
    /* the pair being dealt: its shapes, dp, and group 1's parts */
    int x[2]; /* shape indices */
    int dp[2], B1, first[16];
    /* per pair dealt that fits: the larger of its groups' floors and of their steps alone */
    double *floors, *alones;
    long n_floors;
    /* groups of those pairs whose best step with their own reduction (REDUCED) is over
       their step alone (and at most their floor) */
    long reduced_over_alone;
};

/* A group's floor among N replicas (replicas_step_floor: the bound the search prunes a group
 * by once planned), its pipeline alone in *alone. */
static double group_floor(struct planned *g, int N, double *alone)
{
    struct err e;
    double floor;
    err_clear(&e);
    if (!g->simulated)
        CU_ASSERT_EQUAL_FATAL(replicas_alone(&g->plan, &g->pipe, &e), ERR_OK);
    g->simulated = 1;
    CU_ASSERT_EQUAL_FATAL(replicas_step_floor(&g->plan, &g->pipe, N, &floor, &e), ERR_OK);
    *alone = g->pipe.alone_ms;
    return floor;
}

/* The pair's step against its groups' floors: each at most the step; kept for the count of
 * pairs they would prune. */
static void check_floors(struct brute *b, struct planned **g, double step)
{
    double most = 0, alone = 0;
    for (int i = 0; i < 2; i++) {
        double own, floor = group_floor(g[i], b->dp[0] + b->dp[1], &own);
        CU_ASSERT(floor <= step * (1 + 1e-12));
        /* the bound group_reduced_refuted prunes a first group by: the best split's step as
         * dp + 1 replicas reducing (the fewest a pair it leads has), at most the floor of the
         * plan made alone, with as many replicas or more */
        struct planned *r = plan_group(b->pc, b->x[i], b->dp[i] + 1, g[i]->M, REDUCED);
        CU_ASSERT_FATAL(r->fits);
        CU_ASSERT(r->plan.iteration_ms <= floor * (1 + 1e-12));
        b->reduced_over_alone += r->plan.iteration_ms > own * (1 + 1e-9);
        most = fmax(most, floor);
        alone = fmax(alone, own);
    }
    if (b->n_floors % 1024 == 0) {
        b->floors = realloc(b->floors, (size_t)(b->n_floors + 1024) * sizeof *b->floors);
        b->alones = realloc(b->alones, (size_t)(b->n_floors + 1024) * sizeof *b->alones);
        CU_ASSERT_FATAL(b->floors != NULL && b->alones != NULL);
    }
    b->floors[b->n_floors] = most;
    b->alones[b->n_floors++] = alone;
}

static void deal_one(int *parts, void *arg)
{
    struct brute *b = arg;
    int all[1][16];
    memcpy(all[0], parts, (size_t)b->dp[0] * sizeof *parts);
    struct planned *g = plan_group(b->pc, b->x[0], b->dp[0], parts[0], WITH_REDUCTION);
    double step = deal_step(&g, 1, all, b->dp);
    b->answers++;
    b->unfit += isinf(step);
    b->one = fmin(b->one, step);
}

static void deal_second(int *parts, void *arg)
{
    struct brute *b = arg;
    int all[2][16];
    memcpy(all[0], b->first, (size_t)b->dp[0] * sizeof *parts);
    memcpy(all[1], parts, (size_t)b->dp[1] * sizeof *parts);
    struct planned *g[2] = {plan_group(b->pc, b->x[0], b->dp[0], all[0][0], ALONE),
                            plan_group(b->pc, b->x[1], b->dp[1], all[1][0], ALONE)};
    double step = deal_step(g, 2, all, b->dp);
    b->answers++;
    b->unfit += isinf(step);
    b->two = fmin(b->two, step);
    if (isfinite(step))
        check_floors(b, g, step);
}

static void deal_first(int *parts, void *arg)
{
    struct brute *b = arg;
    int second[16];
    memcpy(b->first, parts, (size_t)b->dp[0] * sizeof *parts);
    each_partition(b->B - b->B1, b->dp[1], b->B, second, 0, deal_second, b);
}

/* The least step of one group and of two over every shape, dp and dealing. */
static void brute_force(const struct pool_case *pc, struct brute *b)
{
    const struct shape *x = shapes;
    int n = all_shapes(shapes), parts[16];
    *b = (struct brute){.pc = pc, .B = pc->global_batch / MICRO_BATCH, .one = INFINITY,
                        .two = INFINITY};
    for (int i = 0; i < n; i++)
        for (int dp = 1; dp <= b->B && dp < DP_MAX; dp++) {
            if (dp * shape_gpus(&x[i], 0) > pc->count[0] ||
                dp * shape_gpus(&x[i], 1) > pc->count[1])
                break;
            b->x[0] = i;
            b->dp[0] = dp;
            each_partition(b->B, dp, b->B, parts, 0, deal_one, b);
        }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            for (int d0 = 1; d0 < b->B; d0++)
                for (int d1 = 1; d0 + d1 <= b->B && d0 + d1 < DP_MAX; d1++) {
                    int fits = 1;
                    for (int k = 0; k < KINDS; k++)
                        fits &= d0 * shape_gpus(&x[i], k) + d1 * shape_gpus(&x[j], k) <=
                                pc->count[k];
                    if (!fits)
                        continue;
                    b->x[0] = i, b->x[1] = j;
                    b->dp[0] = d0, b->dp[1] = d1;
                    for (b->B1 = d0; b->B1 <= b->B - d1; b->B1++)
                        each_partition(b->B1, d0, b->B1, parts, 0, deal_first, b);
                }
}

/* The pair search of the pool in `file` (pool_mixed_search_early's flags) beating beat_ms:
 * the best pair's step (INFINITY: none) and *r. */
static double mixed_search(const char *file, const struct plan_options *o, int flags,
                           double beat_ms, struct pool_mixed_result *r)
{
    struct err e;
    err_clear(&e);
    cJSON *root = jsonio_read_kind(file, JSONIO_CLUSTER, &e);
    struct pool_model pm;
    CU_ASSERT_FATAL(root != NULL && pool_model_load(root, file, o, INFINITY, &pm, &e) == 0);
    struct plan *plans;
    int n;
    struct replicas_result step;
    CU_ASSERT_EQUAL_FATAL(pool_mixed_search_early(&pm, o, flags, beat_ms, INFINITY, &plans, &n,
                                                  &step, r, &e),
                          ERR_OK);
    double two = n > 0 ? step.step_ms : INFINITY;
    for (int g = 0; g < n; g++)
        plan_free(&plans[g]);
    free(plans);
    replicas_result_free(&step);
    pool_model_free(&pm);
    cJSON_Delete(root);
    return two;
}

/* The search's answer, exact: the homogeneous plan's step, the pairs' step (INFINITY: none
 * beats INFINITY... searched with nothing to beat), and the whole answer. */
static void search(const char *file, double *one, double *two, struct pool_answer *a,
                   struct pool_mixed_result *r)
{
    struct plan_options o;
    struct err e;
    struct plan p;
    struct pool_result hr;
    err_clear(&e);
    plan_options_default(&o);
    o.search_gap = 0;
    int rc = pool_search(file, &o, &p, &hr, &e);
    CU_ASSERT_FATAL(rc == ERR_OK || rc == ERR_NOFIT);
    *one = rc == ERR_OK ? p.iteration_ms : INFINITY;
    if (rc == ERR_OK)
        plan_free(&p);
    *two = mixed_search(file, &o, POOL_MIXED_EARLY, INFINITY, r);
    cJSON *root = jsonio_read_kind(file, JSONIO_CLUSTER, &e);
    CU_ASSERT_FATAL(root != NULL);
    CU_ASSERT_EQUAL_FATAL(pool_answer_search(root, file, &o, a, &e), ERR_OK);
    cJSON_Delete(root);
}

/* The answer with a search gap (each pipeline searched within it, its groups' exactly) and a
 * node budget (0: the default): its certified bound at most the brute force's best, so its
 * step within the gap it claims of that; without a budget, within the gap asked. */
static void check_gap(const char *file, double best, double gap, long nodes)
{
    struct plan_options o;
    struct err e;
    struct pool_answer a;
    err_clear(&e);
    plan_options_default(&o);
    o.search_gap = gap;
    o.min_gain = 0;
    if (nodes > 0)
        o.search_nodes = nodes;
    cJSON *root = jsonio_read_kind(file, JSONIO_CLUSTER, &e);
    CU_ASSERT_FATAL(root != NULL);
    CU_ASSERT_EQUAL_FATAL(pool_answer_search(root, file, &o, &a, &e), ERR_OK);
    double got = a.mixed ? a.step.step_ms : a.plan.iteration_ms;
    if (!(a.lower_bound <= best * (1 + 1e-9)))
        printf("\n  gap %g, nodes %ld: certified %.6f over the best %.6f", gap, nodes,
               a.lower_bound, best);
    CU_ASSERT(a.lower_bound <= best * (1 + 1e-9));
    CU_ASSERT(got >= best * (1 - 1e-9) && got <= best * (1 + a.gap) * (1 + 1e-9));
    CU_ASSERT(nodes > 0 || got <= best * (1 + gap) * (1 + 1e-9));
    pool_answer_free(&a);
    cJSON_Delete(root);
}

/* The pair search beating `one` exactly with parts of it cut short (flags beside
 * POOL_MIXED_EARLY, and `nodes` for each group's search; 0: the default), `how` as it is cut:
 * its certified bound at most the brute force's best pair `two`. Cut short so: each group
 * searched once within a single node (POOL_MIXED_ONCE, nodes 1: groups left unproved), or the
 * search stopped after its first lead as --time-limit would stop it, with time left for the
 * bisection that certifies what it left (POOL_MIXED_STOP_LEAD). */
static struct pool_mixed_result check_cut(const char *file, double one, double two, int flags,
                                          long nodes, const char *how)
{
    struct plan_options o;
    struct pool_mixed_result r;
    plan_options_default(&o);
    o.search_gap = 0;
    if (nodes > 0)
        o.search_nodes = nodes;
    mixed_search(file, &o, POOL_MIXED_EARLY | flags, one, &r);
    if (!(isinf(two) || r.lower_bound <= two * (1 + 1e-9)))
        printf("\n  %s: certified %.6f over the best pair %.6f", how, r.lower_bound, two);
    CU_ASSERT(isinf(two) || r.lower_bound <= two * (1 + 1e-9));
    return r;
}

/* Every bound the search uses on a group of the brute force (pool_mixed_group_bound), against
 * the steps found here: its least and the capacity's bound at most replicas_step_floor (at
 * most the step of every pair holding the group at its M), could_step true there, and the
 * floor at least the pipeline alone. Returns the groups checked; *tight: those whose least is
 * within 20% of the step (the bounds are not vacuous). */
static int check_bounds(const struct pool_case *pc, const char *file, int *tight, int *half)
{
    struct plan_options o;
    struct err e;
    struct pool_model pm;
    int checked = 0, B = pc->global_batch / MICRO_BATCH;
    err_clear(&e);
    plan_options_default(&o);
    o.search_gap = 0;
    cJSON *root = jsonio_read_kind(file, JSONIO_CLUSTER, &e);
    CU_ASSERT_FATAL(root != NULL && pool_model_load(root, file, &o, INFINITY, &pm, &e) == 0);
    cJSON_Delete(root);
    for (size_t i = 0; i < sizeof cache / sizeof *cache; i++) {
        struct planned *g = &cache[i];
        if (!g->used || !g->fits || g->alone != ALONE)
            continue;
        struct replicas_pipe alone;
        CU_ASSERT_EQUAL_FATAL(replicas_alone(&g->plan, &alone, &e), ERR_OK);
        for (int N = g->dp + 1; N <= B; N++) { /* another group of one replica at least */
            struct pool_mixed_group at = {.size = 0, .dp = g->dp, .micro_batches = g->M};
            memcpy(at.tp, g->x.tp, sizeof at.tp);
            memcpy(at.stages, g->x.S, sizeof at.stages);
            double floor;
            CU_ASSERT_EQUAL_FATAL(replicas_step_floor(&g->plan, &alone, N, &floor, &e), ERR_OK);
            struct pool_mixed_bound b;
            CU_ASSERT_EQUAL_FATAL(pool_mixed_group_bound(&pm, &o, &at, N, floor, &b, &e),
                                  ERR_OK);
            if (!(b.least_ms <= floor && b.cap_least_ms <= floor && b.could_step))
                printf("\n  dp %d M %d N %d: alone %.6f, floor %.6f; least %.6f, capacity's "
                       "%.6f, could step %d",
                       g->dp, g->M, N, alone.alone_ms, floor, b.least_ms, b.cap_least_ms,
                       b.could_step);
            CU_ASSERT(b.least_ms <= floor);
            CU_ASSERT(b.cap_least_ms <= floor);
            CU_ASSERT(b.could_step);
            CU_ASSERT(floor >= alone.alone_ms);
            /* could_step's refutation: the most x it refutes, within 1/4096 of the floor */
            double lo = fmin(b.least_ms, floor), hi = floor;
            for (int i = 0; i < 12; i++) {
                struct pool_mixed_bound at_x;
                double x = lo + (hi - lo) / 2;
                CU_ASSERT_EQUAL_FATAL(pool_mixed_group_bound(&pm, &o, &at, N, x, &at_x, &e),
                                      ERR_OK);
                *(at_x.could_step ? &hi : &lo) = x;
            }
            *tight += lo >= 0.8 * floor;
            *half += lo >= 0.5 * floor;
            checked++;
        }
        replicas_pipe_free(&alone);
    }
    pool_model_free(&pm);
    return checked;
}

static const char *profile_of(const char *device)
{
    static char *paths[4];
    static const char *names[4];
    for (int i = 0; i < 4; i++) {
        if (names[i] != NULL && strcmp(names[i], device) == 0)
            return paths[i];
        if (names[i] == NULL) {
            names[i] = device;
            return paths[i] = estimated_profile(device);
        }
    }
    return NULL;
}

/* The CLI's replicas file for a pool answered by two groups: its global batch the pool's
 * exactly (each pipeline's dealing summed), and simulate steps it as the search scored it. */
static void check_replicas_file(const char *file, const struct pool_case *c, double step_ms)
{
    char args[2048];
    const char *answer = test_path("pair.json"), *simulated = test_path("pair-sim.json");
    snprintf(args, sizeof args, "plan --cluster '%s' --search-gap 0 --quiet -o '%s'", file,
             answer);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    char *text = test_read(answer);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CU_ASSERT_FATAL(root != NULL);
    long samples = 0;
    const cJSON *pipe;
    cJSON_ArrayForEach(pipe, cJSON_GetObjectItem(root, "pipelines"))
    {
        const cJSON *dealt = cJSON_GetObjectItem(pipe, "replica_micro_batches"), *m;
        const cJSON *dp = cJSON_GetObjectItem(
            cJSON_GetArrayItem(cJSON_GetObjectItem(pipe, "stages"), 0), "dp"); /* absent: 1 */
        if (dealt == NULL) /* every replica takes micro_batches */
            samples += (long)(dp ? dp->valueint : 1) *
                       cJSON_GetObjectItem(pipe, "micro_batches")->valueint;
        cJSON_ArrayForEach(m, dealt) samples += m->valueint;
    }
    CU_ASSERT_EQUAL(samples * MICRO_BATCH, c->global_batch);
    CU_ASSERT_EQUAL(cJSON_GetObjectItem(root, "global_batch")->valueint, c->global_batch);
    cJSON_Delete(root);
    snprintf(args, sizeof args, "simulate --plan '%s' --quiet -o '%s'", answer, simulated);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    text = test_read(simulated);
    root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CU_ASSERT_FATAL(root != NULL);
    double ms = cJSON_GetObjectItem(root, "iteration_ms")->valuedouble;
    printf("\n  the CLI's replicas file: %ld samples, simulated %.6f ms", samples * MICRO_BATCH,
           ms);
    CU_ASSERT(test_close(ms, step_ms, 1e-9, 1e-9));
    CU_ASSERT_EQUAL(cJSON_GetObjectItem(root, "global_batch")->valueint, c->global_batch);
    cJSON_Delete(root);
}

static void test_against_brute_force(void)
{
    /* counts; samples; the second kind and its memory (< 0: the A100's memory, small, and
     * the second kind's 20 GB); link and dp_link Gb/s */
    static const struct {
        int count[KINDS], batch;
        const char *second;
        long long memory;
        double link, dp_link;
    } vary[] = {
        {{4, 4}, 10, "V100-32GB", 32000000000LL, 100, 10},
        {{4, 4}, 14, "V100-32GB", 25000000LL, 100, 10},
        {{3, 2}, 10, "V100-32GB", 32000000000LL, 1, 1000},
        {{2, 3}, 12, "L4", 20000000000LL, 1, 1000},
        {{3, 3}, 10, "L4", 30000000LL, 10, 400},
        {{4, 2}, 8, "L4", -18000000LL, 10, 1000},
    };
    long unfit_all = 0, floors_pruned = 0, reduced_over_alone = 0, gone = 0, reduced = 0;
    long unproved = 0, stopped = 0;
    int pairs_won = 0;
    for (size_t i = 0; i < sizeof vary / sizeof vary[0]; i++) {
        struct pool_case c = {{"A100-40GB", vary[i].second},
                              {profile_of("A100-40GB"), profile_of(vary[i].second)},
                              {vary[i].count[0], vary[i].count[1]},
                              {40000000000LL, vary[i].memory},
                              vary[i].batch,
                              vary[i].link,
                              vary[i].dp_link};
        if (vary[i].memory < 0)
            c.memory[0] = -vary[i].memory, c.memory[1] = 20000000000LL;
        char *file = strdup(pool_write(&c, "brute.json")); /* test_write's buffer rotates */
        struct brute b;
        struct pool_answer a;
        struct pool_mixed_result r;
        double one, two;
        brute_force(&c, &b);
        search(file, &one, &two, &a, &r);
        int tight = 0, half = 0, checked = check_bounds(&c, file, &tight, &half);
        double best = fmin(b.one, b.two), got = a.mixed ? a.step.step_ms : a.plan.iteration_ms;
        printf("\n  %s: %d + %d GPUs, %d micro-batches: one group %.6f ms (brute force %.6f), "
               "two %.6f (%.6f) over %ld answers (%ld not fitting); the answer %.6f, certified "
               "gap %.3g; %ld pairs searched, %ld pipelines planned; bounds within 20%% in %d "
               "of %d, within half in %d",
               vary[i].second, c.count[0], c.count[1], b.B, one, b.one, two, b.two, b.answers,
               b.unfit, got, a.gap, r.pairs, r.planned, tight, checked, half);
        CU_ASSERT(isfinite(b.one) && test_close(one, b.one, 1e-9, 1e-9));
        CU_ASSERT(isinf(b.two) ? isinf(two) : test_close(two, b.two, 1e-9, 1e-9));
        CU_ASSERT(test_close(got, best, 1e-9, 1e-9));
        CU_ASSERT(a.mixed == (b.two < b.one)); /* ties: the homogeneous plan */
        CU_ASSERT(a.gap >= 0 && a.gap <= 1e-9 && a.lower_bound <= best * (1 + 1e-12));
        check_gap(file, best, 0.01, 0);
        check_gap(file, best, 0.05, 0);
        check_gap(file, best, 0, 1); /* each pipeline's search stopped at its first split */
        unproved += check_cut(file, b.one, b.two, POOL_MIXED_ONCE, 1,
                              "searched once in a node").unproved;
        struct pool_mixed_result cut = check_cut(file, b.one, b.two, POOL_MIXED_STOP_LEAD, 0,
                                                 "stopped after a lead");
        stopped += cut.timed_out && cut.lower_bound < b.one; /* pairs left to certify */
        /* a fifth within 20%: with the reduction in buckets, each stage's backward comes off
         * its reduction in the bounds (it may overlap it), so they are looser than before */
        /* over 3/4 within 20%: a pair's reductions start after each stage's last backward
         * (replicas_step), so its bounds take no backward off them (with the backward taken
         * off, as sim.c overlaps one pipeline's reduction, a fourth to two fifths here), and
         * each stage's waits count the stages placed after it (with the least kind's work
         * there, under half in three of the six pools) */
        CU_ASSERT(checked > 0 && 4 * tight > 3 * checked && 4 * half > 3 * checked);
        /* the floors prune pairs whose pipelines alone step under the answer */
        long pruned = 0;
        for (long p = 0; p < b.n_floors; p++)
            pruned += b.alones[p] < best && b.floors[p] >= best;
        printf("; of %ld pairs fitting, %ld with both pipelines alone under the answer pruned "
               "by a floor",
               b.n_floors, pruned);
        floors_pruned += pruned;
        printf("; %ld groups whose own reduction lifts their bound over their step alone; "
               "left unplanned: %ld as gone at fewer micro-batches, %ld by their own reduction",
               b.reduced_over_alone, r.gone, r.reduced);
        reduced_over_alone += b.reduced_over_alone;
        gone += r.gone;
        reduced += r.reduced;
        free(b.floors);
        free(b.alones);
        if (a.mixed && pairs_won == 0)
            check_replicas_file(file, &c, got);
        pairs_won += a.mixed;
        unfit_all += b.unfit;
        pool_answer_free(&a);
        cache_clear();
        free(file);
    }
    CU_ASSERT(floors_pruned > 0);
    /* the bound group_reduced_refuted prunes by is not the step alone's */
    CU_ASSERT(reduced_over_alone > 0);
    CU_ASSERT(unfit_all > 0); /* the small memories */
    CU_ASSERT(pairs_won > 0); /* two groups win somewhere */
    printf("\n  searched once in a node: %ld groups left unproved in all", unproved);
    CU_ASSERT(unproved > 0);
    printf("\n  stopped after a lead: %ld pools with pairs left to certify", stopped);
    CU_ASSERT(stopped > 0);
}

/* The two prunes that leave groups before planning them (pool_mixed.h: gone, reduced), on 24
 * GPUs of three kinds and GPT-350M (a global batch of 512, the bench's pools): the search with
 * them makes the same answer (groups, step and certified bound, at --search-gap 0) as the
 * search without them, after the same homogeneous best, and plans fewer pipelines. */
static void test_early_prunes(void)
{
    static const char *kinds[] = {"A100-40GB", "V100-32GB", "H100-80GB"};
    static const long long memory[] = {40000000000LL, 32000000000LL, 80000000000LL};
    char entries[3][1024], text[4096], args[2048];
    for (int k = 0; k < 3; k++) {
        char name[64];
        snprintf(name, sizeof name, "early-%s.json", kinds[k]);
        char *profile = strdup(test_path(name));
        snprintf(args, sizeof args,
                 "profile --model %s/configs/models/gpt-350m.json --estimate --device %s "
                 "--devices %s/configs/devices.json -o %s",
                 BALLAST_SOURCE_DIR, kinds[k], BALLAST_SOURCE_DIR, profile);
        CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
        snprintf(entries[k], sizeof entries[k],
                 "{\"device\":\"%s\",\"count\":8,\"per_node\":8,\"memory_bytes\":%lld,"
                 "\"profile\":\"%s\",\"node_link\":{\"gbps\":2400,\"latency_us\":2}}",
                 kinds[k], memory[k], profile);
        free(profile);
    }
    snprintf(text, sizeof text,
             "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"global_batch\":512,"
             "\"link\":{\"gbps\":100,\"latency_us\":5},\"dp_link\":{\"gbps\":100,"
             "\"latency_us\":5},\"shard_optimizer\":true,\"pool\":[%s,%s,%s]}",
             entries[0], entries[1], entries[2]);
    char *file = strdup(test_write("early.json", text));
    struct plan_options o;
    struct err e;
    err_clear(&e);
    plan_options_default(&o);
    o.search_gap = 0;
    cJSON *root = jsonio_read_kind(file, JSONIO_CLUSTER, &e);
    struct pool_model pm;
    CU_ASSERT_FATAL(root != NULL && pool_model_load(root, file, &o, INFINITY, &pm, &e) == 0);
    struct plan best;
    struct pool_result hr;
    CU_ASSERT_EQUAL_FATAL(pool_search_model(&pm, &o, POOL_KEEP, INFINITY, &best, &hr, &e),
                          ERR_OK);
    struct pool_mixed_result r[2];
    struct replicas_result step[2];
    struct plan *plans[2];
    int n[2];
    for (int early = 0; early < 2; early++)
        CU_ASSERT_EQUAL_FATAL(pool_mixed_search_early(&pm, &o, early ? POOL_MIXED_EARLY : 0,
                                                      best.iteration_ms,
                                                      INFINITY, &plans[early], &n[early],
                                                      &step[early], &r[early], &e),
                              ERR_OK);
    printf("\n  without the prunes: %ld pipelines planned, %ld pairs; with them: %ld planned, "
           "%ld pairs, %ld left as gone at fewer micro-batches, %ld by their own reduction; "
           "bound %.6f / %.6f ms, %d / %d groups",
           r[0].planned, r[0].pairs, r[1].planned, r[1].pairs, r[1].gone, r[1].reduced,
           r[0].lower_bound, r[1].lower_bound, n[0], n[1]);
    CU_ASSERT(r[0].gone == 0 && r[0].reduced == 0);
    CU_ASSERT(r[1].gone > 0 && r[1].reduced > 0);
    CU_ASSERT(r[1].planned < r[0].planned);
    CU_ASSERT(r[1].lower_bound == r[0].lower_bound);
    CU_ASSERT_EQUAL(n[1], n[0]);
    CU_ASSERT(r[1].n_groups == r[0].n_groups &&
              memcmp(r[1].group, r[0].group, sizeof r[0].group) == 0);
    if (n[0] > 0 && n[1] == n[0])
        CU_ASSERT(step[1].step_ms == step[0].step_ms);
    for (int early = 0; early < 2; early++) {
        for (int g = 0; g < n[early]; g++)
            plan_free(&plans[early][g]);
        free(plans[early]);
        replicas_result_free(&step[early]);
    }
    plan_free(&best);
    pool_model_free(&pm);
    cJSON_Delete(root);
    free(file);
}

/* The plan of `args`' pool (plan -o), parsed; its stdout in *out (caller frees). */
static cJSON *plan_json(const char *file, const char *extra, char **out)
{
    char args[2048];
    const char *result = test_path("answer.json");
    snprintf(args, sizeof args, "plan --cluster '%s' %s -o '%s'", file, extra, result);
    CU_ASSERT_EQUAL_FATAL(test_run(args, out, NULL), 0);
    char *text = test_read(result);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CU_ASSERT_FATAL(root != NULL);
    return root;
}

/* The GPUs a plan file's stages take (tp x dp each; absent: 1). */
static int plan_gpus(const cJSON *plan)
{
    int gpus = 0;
    const cJSON *st;
    cJSON_ArrayForEach(st, cJSON_GetObjectItem(plan, "stages"))
    {
        const cJSON *tp = cJSON_GetObjectItem(st, "tp"), *dp = cJSON_GetObjectItem(st, "dp");
        gpus += (tp ? tp->valueint : 1) * (dp ? dp->valueint : 1);
    }
    return gpus;
}

/* 3 A100s and 14 samples (7 micro-batches of 2), a slow link between stages: before, a dp had
 * to divide the 7, so the best plan was one GPU alone (dp 1; a pipeline pays the slow link)
 * and two were idle. Now dp 3 takes all three, the micro-batches dealt 3, 2, 2: exactly 14
 * samples a step, and faster. simulate says so; train refuses the uneven dealing. */
static void test_no_idle_gpus(void)
{
    char text[2048];
    snprintf(text, sizeof text,
             "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"global_batch\":14,"
             "\"link\":{\"gbps\":1,\"latency_us\":2},\"dp_link\":{\"gbps\":1000,"
             "\"latency_us\":5},\"pool\":[{\"device\":\"A100-40GB\",\"count\":3,"
             "\"per_node\":1,\"memory_bytes\":40000000000,\"profile\":\"%s\"}]}",
             profile_of("A100-40GB"));
    char file[1024], divisible[1024], *out = NULL, *err = NULL, args[2048];
    snprintf(file, sizeof file, "%s", test_write("idle.json", text));
    /* before: the best of the dps dividing 7 (7 replicas do not fit 3 GPUs) */
    snprintf(strrchr(text, '}'), 16, ",\"dp\":1}");
    snprintf(divisible, sizeof divisible, "%s", test_write("idle-dp1.json", text));
    cJSON *before = plan_json(divisible, "", NULL);
    double before_ms = cJSON_GetObjectItem(before, "iteration_ms")->valuedouble;
    int before_gpus = plan_gpus(before);
    cJSON *now = plan_json(file, "", &out);
    double now_ms = cJSON_GetObjectItem(now, "iteration_ms")->valuedouble;
    const cJSON *dealt = cJSON_GetObjectItem(now, "replica_micro_batches");
    int sum = 0, n = cJSON_GetArraySize(dealt);
    for (int r = 0; r < n; r++)
        sum += cJSON_GetArrayItem(dealt, r)->valueint;
    printf("\n  before %d GPUs, %.6f ms; now %d GPUs, %.6f ms, micro-batches", before_gpus,
           before_ms, plan_gpus(now), now_ms);
    for (int r = 0; r < n; r++)
        printf(" %d", cJSON_GetArrayItem(dealt, r)->valueint);
    CU_ASSERT(before_gpus < 3);
    CU_ASSERT_EQUAL(plan_gpus(now), 3);
    CU_ASSERT_EQUAL(n, 3);
    CU_ASSERT(n == 3 && cJSON_GetArrayItem(dealt, 0)->valueint == 3 &&
              cJSON_GetArrayItem(dealt, 2)->valueint == 2);
    CU_ASSERT_EQUAL(sum * MICRO_BATCH, 14);
    CU_ASSERT_EQUAL(cJSON_GetObjectItem(now, "micro_batches")->valueint, 3);
    CU_ASSERT(now_ms < before_ms);
    CU_ASSERT(out != NULL && strstr(out, "3 micro-batches the most a replica, dp 3 replicas (7 "
                                         "in all)") != NULL);
    free(out);
    /* simulate: the same step, the samples; train: refused */
    snprintf(args, sizeof args, "simulate --plan '%s'", test_path("answer.json"));
    CU_ASSERT_EQUAL(test_run(args, &out, NULL), 0);
    char want[128];
    snprintf(want, sizeof want, "iteration %.3f ms", now_ms);
    CU_ASSERT(out != NULL && strstr(out, want) != NULL &&
              strstr(out, "replicas: 3, taking 7 micro-batches in all (14 samples)") != NULL);
    free(out);
    snprintf(args, sizeof args,
             "timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe -np 3 '%s' train "
             "--plan '%s' --steps 1 >/dev/null 2>'%s'",
             BALLAST_EXE, test_path("answer.json"), test_path("train.err"));
    int status = system(args);
    err = test_read(test_path("train.err"));
    CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 2);
    CU_ASSERT(err != NULL && strstr(err, "replica_micro_batches") != NULL);
    free(err);
    /* an export to a framework that deals evenly: refused, naming the field */
    snprintf(args, sizeof args, "export --plan '%s' --to megatron", test_path("answer.json"));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "replica_micro_batches") != NULL);
    free(err);
    /* a global batch that is not whole micro-batches: refused, never rounded */
    char *odd = strstr(text, "\"global_batch\":14");
    CU_ASSERT_FATAL(odd != NULL);
    memcpy(odd, "\"global_batch\":13", 17);
    snprintf(args, sizeof args, "plan --cluster '%s'", test_write("odd.json", text));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "global_batch: 13 samples") != NULL);
    free(err);
    cJSON_Delete(before);
    cJSON_Delete(now);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("pool_mixed", NULL, NULL);
    CU_add_test(s, "the whole answer against brute force", test_against_brute_force);
    CU_add_test(s, "groups left before planning: the same answer", test_early_prunes);
    CU_add_test(s, "no GPU idle for divisibility, the exact global batch", test_no_idle_gpus);
    return test_main();
}
