/* The activation arena's layouts (planner/methods/arena_plan.h) against independent references: an
 * overlap check written here (every pair of objects live at a common tick, byte by byte
 * ranges), the lower bound counted tick by tick, and brute force over every placement order
 * for `exact` (the lowest-offset placement in the order of an optimal layout's offsets
 * rebuilds a layout no taller, so the best order is optimal). On random instances and on
 * every stage of shipped clusters. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena_plan.h"
#include "cluster.h"
#include "cost.h"
#include "planner.h"
#include "schedule.h"
#include "testutil.h"

/* ---- independent references ---- */

static int overlap_free(const struct arena_object *o, int n, int64_t bytes)
{
    for (int i = 0; i < n; i++) {
        if (o[i].offset < 0 || o[i].offset + o[i].bytes > bytes)
            return 0;
        for (int j = 0; j < n; j++) {
            int live = o[i].first <= o[j].last && o[j].first <= o[i].last;
            int share = o[i].offset < o[j].offset + o[j].bytes &&
                        o[j].offset < o[i].offset + o[i].bytes;
            if (i != j && live && share)
                return 0;
        }
    }
    return 1;
}

static int64_t live_peak(const struct arena_object *o, int n)
{
    int last = 0;
    for (int i = 0; i < n; i++)
        last = o[i].last > last ? o[i].last : last;
    int64_t most = 0;
    for (int t = 0; t <= last; t++) {
        int64_t sum = 0;
        for (int i = 0; i < n; i++)
            sum += o[i].first <= t && t <= o[i].last ? o[i].bytes : 0;
        most = sum > most ? sum : most;
    }
    return most;
}

/* The lowest offset at which object k fits among objects placed[0..np-1]. */
static int64_t lowest_fit(const struct arena_object *o, const int *placed, int np, int k,
                          const int64_t *off)
{
    int64_t at = 0;
    for (int moved = 1; moved;) {
        moved = 0;
        for (int q = 0; q < np; q++) {
            int j = placed[q];
            if (o[j].first <= o[k].last && o[k].first <= o[j].last && at < off[j] + o[j].bytes &&
                off[j] < at + o[k].bytes) {
                at = off[j] + o[j].bytes;
                moved = 1;
            }
        }
    }
    return at;
}

static int64_t best_order(const struct arena_object *o, int n, int *perm, int depth,
                          int64_t *off, int64_t top)
{
    if (depth == n)
        return top;
    int64_t best = INT64_MAX;
    for (int i = depth; i < n; i++) {
        int t = perm[depth];
        perm[depth] = perm[i];
        perm[i] = t;
        int k = perm[depth];
        off[k] = lowest_fit(o, perm, depth, k, off);
        int64_t end = off[k] + o[k].bytes;
        int64_t got = best_order(o, n, perm, depth + 1, off, end > top ? end : top);
        best = got < best ? got : best;
        perm[i] = perm[depth];
        perm[depth] = t;
    }
    return best;
}

static int64_t brute_force(const struct arena_object *o, int n)
{
    int perm[16];
    int64_t off[16];
    for (int i = 0; i < n; i++)
        perm[i] = i;
    return best_order(o, n, perm, 0, off, 0);
}

/* ---- instances ---- */

static void random_objects(struct test_rng *r, struct arena_object *o, int n, int ticks)
{
    for (int i = 0; i < n; i++) {
        int a = (int)test_rng_int(r, 0, ticks - 1), b = (int)test_rng_int(r, 0, ticks - 1);
        o[i] = (struct arena_object){ARENA_KEPT, i, i, 0, 64 * test_rng_int(r, 1, 40),
                                     a < b ? a : b, a < b ? b : a, -1};
    }
}

static struct arena_options options(const char *method)
{
    struct arena_options o;
    arena_options_default(&o);
    snprintf(o.method, sizeof o.method, "%s", method);
    o.time_limit_s = 20;
    return o;
}

/* Lays out a copy of o[] with `method`; the arena (owning its copy). */
static int lay_out(const struct arena_object *o, int n, int in_flight, const char *method,
                   int64_t cap, struct arena *a, struct arena_result *r)
{
    struct arena_object *copy = malloc(sizeof *copy * (size_t)(n + 1));
    memcpy(copy, o, sizeof *copy * (size_t)n);
    struct arena_options opt = options(method);
    opt.cap_bytes = cap;
    struct err e;
    err_clear(&e);
    int rc = arena_layout(copy, n, in_flight, &opt, a, r, &e);
    if (rc)
        fprintf(stderr, "\n%s: %s\n", method, e.msg);
    return rc;
}

static const char *const methods[] = {"greedy", "ga", "exact"};

static void check_layout(const struct arena *a, const struct arena_object *o, int n)
{
    CU_ASSERT(overlap_free(a->objects, a->n, a->bytes));
    CU_ASSERT_EQUAL(a->lower_bound_bytes, live_peak(o, n));
    CU_ASSERT(a->bytes >= a->lower_bound_bytes);
    for (int i = 0; i < n; i++) /* lifetimes and sizes as given */
        CU_ASSERT(a->objects[i].bytes == o[i].bytes && a->objects[i].first == o[i].first &&
                  a->objects[i].last == o[i].last);
}

static void test_random_layouts(void)
{
    struct test_rng r = {14};
    int greedy_above = 0; /* instances where exact has something to prove */
    for (int trial = 0; trial < 60; trial++) {
        int n = (int)test_rng_int(&r, 1, 7);
        struct arena_object o[8];
        random_objects(&r, o, n, (int)test_rng_int(&r, 2, 12));
        int64_t best = brute_force(o, n);
        int64_t greedy = -1;
        for (int k = 0; k < 3; k++) {
            struct arena a;
            struct arena_result res;
            if (lay_out(o, n, 1, methods[k], 0, &a, &res)) {
                CU_FAIL("layout failed");
                continue;
            }
            check_layout(&a, o, n);
            CU_ASSERT(a.bytes >= best);
            if (k == 0) {
                greedy = a.bytes;
                greedy_above += greedy > best;
            }
            if (k == 1)
                CU_ASSERT(a.bytes <= greedy);
            if (k == 2) {
                CU_ASSERT(a.proven);
                CU_ASSERT_EQUAL(a.bytes, best);
                if (a.bytes != best)
                    fprintf(stderr, "\ntrial %d: exact %lld, brute force %lld\n", trial,
                            (long long)a.bytes, (long long)best);
            }
            arena_free(&a);
        }
    }
    CU_ASSERT(greedy_above > 0);
}

/* Larger random instances: the GA against greedy, exact under a time limit. */
static void test_ga_never_worse(void)
{
    struct test_rng r = {41};
    int improved = 0;
    for (int trial = 0; trial < 20; trial++) {
        int n = (int)test_rng_int(&r, 10, 60);
        struct arena_object *o = malloc(sizeof *o * (size_t)n);
        random_objects(&r, o, n, (int)test_rng_int(&r, 5, 40));
        struct arena g, ga;
        struct arena_result res;
        if (lay_out(o, n, 1, "greedy", 0, &g, &res) == 0 &&
            lay_out(o, n, 1, "ga", 0, &ga, &res) == 0) {
            check_layout(&ga, o, n);
            CU_ASSERT(ga.bytes <= g.bytes);
            improved += ga.bytes < g.bytes;
            arena_free(&g);
            arena_free(&ga);
        } else {
            CU_FAIL("layout failed");
        }
        free(o);
    }
    fprintf(stderr, "\nga better than greedy on %d of 20 random instances\n", improved);
}

/* A device cap below the lower bound: at the busiest tick at most `cap` of the live bytes
 * lie below it, so at least lower bound - cap must go to host memory. */
static void test_cap(void)
{
    struct test_rng r = {7};
    for (int trial = 0; trial < 20; trial++) {
        int n = (int)test_rng_int(&r, 3, 30);
        struct arena_object *o = malloc(sizeof *o * (size_t)n);
        random_objects(&r, o, n, 10);
        int64_t lb = live_peak(o, n), cap = lb / 2;
        for (int k = 0; k < 2; k++) {
            struct arena a;
            struct arena_result res;
            if (lay_out(o, n, 1, methods[k], cap, &a, &res)) {
                CU_FAIL("layout failed");
                continue;
            }
            int64_t above = 0;
            for (int i = 0; i < n; i++)
                above += a.objects[i].offset + a.objects[i].bytes > cap ? a.objects[i].bytes : 0;
            CU_ASSERT_EQUAL(a.host_bytes, above);
            CU_ASSERT(a.host_bytes >= lb - cap);
            arena_free(&a);
        }
        free(o);
    }
}

static void test_ga_deterministic(void)
{
    struct test_rng r = {99};
    struct arena_object o[40];
    random_objects(&r, o, 40, 20);
    struct arena a, b;
    struct arena_result res;
    if (lay_out(o, 40, 1, "ga", 0, &a, &res) || lay_out(o, 40, 1, "ga", 0, &b, &res)) {
        CU_FAIL("layout failed");
        return;
    }
    for (int i = 0; i < 40; i++)
        CU_ASSERT_EQUAL(a.objects[i].offset, b.objects[i].offset);
    arena_free(&a);
    arena_free(&b);
}

/* Every stage of shipped clusters, plans of three recompute methods: each layout valid,
 * slots exactly today's carving (the cost model's v x kept + transient + workspace), none
 * below the lower bound, ga never above greedy. */
static void stage_layouts(const struct plan *p)
{
    for (int s = 0; s < p->n_stages; s++) {
        struct arena_object *o;
        int n;
        struct err e;
        err_clear(&e);
        if (arena_stage_objects(p, s, &o, &n, &e)) {
            CU_FAIL(e.msg);
            continue;
        }
        struct stage_cost c;
        plan_stage_cost(p, &p->stages[s], &c);
        int64_t greedy = 0;
        const char *all[] = {"slots", "greedy", "ga"};
        for (int k = 0; k < 3; k++) {
            struct arena a;
            struct arena_result res;
            if (lay_out(o, n, p->stages[s].in_flight, all[k], 0, &a, &res)) {
                CU_FAIL("layout failed");
                continue;
            }
            CU_ASSERT(overlap_free(a.objects, a.n, a.bytes));
            CU_ASSERT(a.bytes >= a.lower_bound_bytes);
            if (k == 0)
                CU_ASSERT_EQUAL(a.bytes, cost_arena_bytes(&c));
            if (k == 1)
                greedy = a.bytes;
            if (k == 2)
                CU_ASSERT(a.bytes <= greedy);
            arena_free(&a);
        }
        free(o);
    }
}

static void test_shipped_stages(void)
{
    const char *clusters[] = {"v100-a100-8", "t4-4090-4", "cpu-3", "a10-l4-v100-16"};
    const char *recompute[] = {"none", "full", "optimal"};
    for (int c = 0; c < 4; c++)
        for (int m = 0; m < 3; m++) {
            char file[1024];
            snprintf(file, sizeof file, "%s/configs/clusters/%s.json", BALLAST_SOURCE_DIR,
                     clusters[c]);
            struct cluster cl;
            struct plan p;
            struct plan_options o;
            struct err e;
            err_clear(&e);
            plan_options_default(&o);
            if (cluster_load(file, &cl, &e) || plan_method_parse(recompute[m], &o, &e)) {
                CU_FAIL(e.msg);
                continue;
            }
            int rc = planner_make(&cl, &o, &p, &e);
            cluster_free(&cl);
            if (rc == ERR_NOFIT)
                continue;
            CU_ASSERT_EQUAL_FATAL(rc, ERR_OK);
            stage_layouts(&p);
            plan_free(&p);
        }
}

/* ---- offload: staging objects ---- */

/* cpu-3-offload planned with --actions recompute,offload (stage 0 offloads options), then,
 * with cap > 0, laid out by greedy under that cap (layers go to host memory whole). */
static int offload_plan(int64_t cap, int offload, struct plan *p, struct err *e)
{
    struct cluster cl;
    struct plan_options o;
    plan_options_default(&o);
    o.actions = PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD;
    ERR_TRY(cluster_load(BALLAST_SOURCE_DIR "/configs/clusters/cpu-3-offload.json", &cl, e));
    int rc = plan_method_parse("optimal", &o, e) || planner_make(&cl, &o, p, e);
    cluster_free(&cl);
    if (rc || cap <= 0)
        return rc ? e->code : ERR_OK;
    struct arena_options opt = options("greedy");
    opt.cap_bytes = cap;
    opt.offload = offload;
    if (arena_plan(p, &opt, e)) {
        plan_free(p);
        return e->code;
    }
    return ERR_OK;
}

/* The staging objects of stage s checked against the schedule, counted here: per offloaded
 * layer and micro-batch, a forward one of its host bytes over its forward (from the tick
 * before when the layer's input goes too) and the tick after, and a backward one ending with
 * its backward, starting no later than its prefetch trigger. */
static void check_staging(const struct plan *p, int s, const struct arena_object *o, int n)
{
    const struct plan_stage *st = &p->stages[s];
    int L = plan_stage_layer_count(st), M = p->micro_batches, found = 0, want = 0;
    struct schedule_op ops[64];
    CU_ASSERT_FATAL(2 * M <= 64);
    struct schedule_shape sh = plan_shape(p);
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(schedule_ops(&sh, s, ops, &e) == ERR_OK);
    for (int t = 0; t < 2 * M; t++)
        for (int li = 0; li < L; li++) {
            struct cost_row row = cost_action_row(&st->layers[li], &st->actions[li]);
            if (row.host_bytes == 0)
                continue;
            int phase = ops[t].pass == SCHEDULE_B, tick = t * L + (phase ? L - 1 - li : li);
            want++;
            for (int i = 0; i < n; i++) {
                const struct arena_object *b = &o[i];
                if (b->kind != ARENA_STAGING || b->micro != ops[t].micro ||
                    b->layer != st->first + li || b->phase != phase)
                    continue;
                found++;
                CU_ASSERT_EQUAL(b->bytes, row.host_bytes);
                if (phase) {
                    CU_ASSERT(b->last == tick &&
                              b->first <= tick - st->actions[li].prefetch_ahead);
                } else {
                    int input = st->actions[li].place == COST_PLACE_HOST;
                    CU_ASSERT(b->first == tick - input && b->last == tick + 1);
                }
            }
        }
    CU_ASSERT_EQUAL(found, want);
    int staging = 0;
    for (int i = 0; i < n; i++)
        staging += o[i].kind == ARENA_STAGING;
    CU_ASSERT_EQUAL(staging, want);
}

/* Every stage of the offload plans: staging objects as the schedule says, every layout
 * overlap-free (the check here), never below the lower bound, ga and exact never above
 * greedy, slots within the cost model's carving with its staging pool. */
static void test_offload_stages(void)
{
    int64_t caps[] = {0, 31000000};
    for (int k = 0; k < 2; k++) {
        struct plan p;
        struct err e;
        err_clear(&e);
        CU_ASSERT_EQUAL_FATAL(offload_plan(caps[k], 1, &p, &e), ERR_OK);
        int staged = 0;
        for (int s = 0; s < p.n_stages; s++) {
            struct arena_object *o;
            int n;
            CU_ASSERT_EQUAL_FATAL(arena_stage_objects(&p, s, &o, &n, &e), ERR_OK);
            check_staging(&p, s, o, n);
            struct stage_cost c;
            plan_stage_cost(&p, &p.stages[s], &c);
            staged += c.staging_bytes > 0;
            int64_t greedy = 0;
            const char *all[] = {"slots", "greedy", "ga", "exact"};
            for (int m = 0; m < 4; m++) {
                struct arena a;
                struct arena_result res;
                if (lay_out(o, n, p.stages[s].in_flight, all[m], 0, &a, &res)) {
                    CU_FAIL("layout failed");
                    continue;
                }
                check_layout(&a, o, n);
                if (m == 0)
                    CU_ASSERT(a.bytes <= cost_arena_bytes(&c) + c.staging_bytes);
                if (m == 1)
                    greedy = a.bytes;
                if (m > 1)
                    CU_ASSERT(a.bytes <= greedy);
                arena_free(&a);
            }
            free(o);
        }
        CU_ASSERT(staged > 0);
        plan_free(&p);
    }
}

/* Tiny instances cut from an offloading stage, staging objects among them: exact proves the
 * brute force's optimum. */
static void test_exact_staging_brute(void)
{
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(offload_plan(31000000, 1, &p, &e), ERR_OK);
    struct arena_object *all;
    int n_all;
    CU_ASSERT_EQUAL_FATAL(arena_stage_objects(&p, 1, &all, &n_all, &e), ERR_OK);
    plan_free(&p);
    struct test_rng r = {12};
    for (int trial = 0; trial < 20; trial++) {
        struct arena_object o[7];
        int n = 0, staging = 0;
        while (n < 7) {
            const struct arena_object *b = &all[test_rng_int(&r, 0, n_all - 1)];
            int twice = 0;
            for (int i = 0; i < n; i++)
                twice |= memcmp(&o[i], b, sizeof *b) == 0;
            if (twice || (n >= 5 && staging < 2 && b->kind != ARENA_STAGING))
                continue;
            staging += b->kind == ARENA_STAGING;
            o[n++] = *b;
        }
        struct arena a;
        struct arena_result res;
        if (lay_out(o, n, 1, "exact", 0, &a, &res)) {
            CU_FAIL("layout failed");
            continue;
        }
        check_layout(&a, o, n);
        CU_ASSERT(a.proven);
        CU_ASSERT_EQUAL(a.bytes, brute_force(o, n));
        arena_free(&a);
    }
    free(all);
}

/* A cap below a stage's arena: the layers above it go to host memory whole until the arena
 * fits; the plan stays consistent (it round-trips through its file). Without offload, or with
 * a cap no offload reaches: ERR_NOFIT with the numbers. */
static void test_cap_offloads(void)
{
    struct plan p, q;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(offload_plan(0, 1, &p, &e), ERR_OK);
    int before = 0;
    for (int l = 0; l < plan_stage_layer_count(&p.stages[1]); l++)
        before += p.stages[1].actions[l].place == COST_PLACE_HOST;
    plan_free(&p);
    CU_ASSERT_EQUAL_FATAL(offload_plan(31000000, 1, &p, &e), ERR_OK);
    int after = 0;
    for (int l = 0; l < plan_stage_layer_count(&p.stages[1]); l++)
        after += p.stages[1].actions[l].place == COST_PLACE_HOST;
    CU_ASSERT(after > before);
    for (int s = 0; s < p.n_stages; s++) {
        CU_ASSERT(p.stages[s].arena->bytes <= 31000000);
        CU_ASSERT(p.stages[s].host_memory_bytes <= p.stages[s].host_limit_bytes);
    }
    const char *file = test_path("arena-cap.json");
    CU_ASSERT_EQUAL(plan_write(file, &p, &e), ERR_OK);
    CU_ASSERT_EQUAL(plan_load(file, &q, &e), ERR_OK);
    if (e.code)
        fprintf(stderr, "\n%s\n", e.msg);
    else
        plan_free(&q);
    plan_free(&p);
    CU_ASSERT_EQUAL(offload_plan(31000000, 0, &p, &e), ERR_NOFIT);
    CU_ASSERT(strstr(e.msg, "--arena-cap 31000000") != NULL &&
              strstr(e.msg, "does not allow offload") != NULL);
    err_clear(&e);
    CU_ASSERT_EQUAL(offload_plan(1000000, 1, &p, &e), ERR_NOFIT);
    CU_ASSERT(strstr(e.msg, "lower bound") != NULL);
}

/* ---- the plan file ---- */

/* `ballast plan` of cpu-3 with --arena METHOD into `path`: its exit status. */
static int plan_cpu3(const char *method, const char *path)
{
    char args[4096], *out = NULL, *err = NULL;
    snprintf(args, sizeof args,
             "plan --cluster %s/configs/clusters/cpu-3.json --arena %s --quiet -o '%s'",
             BALLAST_SOURCE_DIR, method, path);
    int rc = test_run(args, &out, &err);
    free(out);
    free(err);
    return rc;
}

/* The plan `root` (freed here) written as NAME: simulate refuses it (exit 2), saying `why`. */
static void simulate_refuses(cJSON *root, const char *name, const char *why)
{
    char args[2048], *out = NULL, *err = NULL;
    char *bad = cJSON_Print(root);
    cJSON_Delete(root);
    const char *bad_file = test_write(name, bad);
    free(bad);
    snprintf(args, sizeof args, "simulate --plan '%s'", bad_file);
    CU_ASSERT_EQUAL(test_run(args, &out, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, why) != NULL);
    free(out);
    free(err);
}

/* "proven" is read back: true for exact on cpu-3 (each stage proven), false for the ga plan
 * test_plan_file wrote, and a ga plan that claims it is refused. */
static void test_proven(void)
{
    char ga_plan[1024], exact[1024];
    snprintf(ga_plan, sizeof ga_plan, "%s", test_path("arena-plan.json"));
    snprintf(exact, sizeof exact, "%s", test_path("arena-exact.json"));
    CU_ASSERT_EQUAL_FATAL(plan_cpu3("exact", exact), 0);
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(plan_load(exact, &p, &e), ERR_OK);
    for (int s = 0; s < p.n_stages; s++)
        CU_ASSERT(p.stages[s].arena->proven);
    plan_free(&p);
    CU_ASSERT_EQUAL_FATAL(plan_load(ga_plan, &p, &e), ERR_OK);
    for (int s = 0; s < p.n_stages; s++)
        CU_ASSERT(!p.stages[s].arena->proven);
    plan_free(&p);
    char *text = test_read(ga_plan);
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON *arena = cJSON_GetObjectItem(
        cJSON_GetArrayItem(cJSON_GetObjectItem(root, "stages"), 0), "arena");
    cJSON_ReplaceItemInObject(arena, "proven", cJSON_CreateTrue());
    simulate_refuses(root, "arena-claims-proven.json", "proven");
}

static void test_plan_file(void)
{
    const char *plan = test_path("arena-plan.json");
    CU_ASSERT_EQUAL_FATAL(plan_cpu3("ga", plan), 0);
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(plan_load(plan, &p, &e), ERR_OK);
    for (int s = 0; s < p.n_stages; s++) {
        const struct plan_stage *st = &p.stages[s];
        struct stage_cost c;
        plan_stage_cost(&p, st, &c);
        CU_ASSERT_FATAL(st->arena != NULL);
        CU_ASSERT_EQUAL(st->memory_bytes, c.state_bytes + st->arena->bytes + p.reserve_bytes);
        CU_ASSERT(overlap_free(st->arena->objects, st->arena->n, st->arena->bytes));
    }
    plan_free(&p);
    /* two objects live at once moved onto the same bytes: refused, naming them */
    char *text = test_read(plan);
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON *objs = cJSON_GetObjectItem(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "stages"), 0), "arena"),
        "objects");
    cJSON *a = cJSON_GetArrayItem(objs, 0), *b = NULL;
    for (cJSON *it = objs->child; it != NULL && b == NULL; it = it->next)
        if (it != a && cJSON_GetObjectItem(it, "first")->valuedouble <=
                           cJSON_GetObjectItem(a, "last")->valuedouble &&
            cJSON_GetObjectItem(a, "first")->valuedouble <=
                cJSON_GetObjectItem(it, "last")->valuedouble)
            b = it;
    CU_ASSERT_FATAL(b != NULL);
    cJSON_ReplaceItemInObject(b, "offset",
                              cJSON_CreateNumber(cJSON_GetObjectItem(a, "offset")->valuedouble));
    simulate_refuses(root, "arena-bad.json", "share bytes");
    test_proven();
}

static void test_cli(void)
{
    char args[4096], *out = NULL, *err = NULL;
    snprintf(args, sizeof args,
             "plan --cluster %s/configs/clusters/cpu-3.json --arena exact --explain-arena 1",
             BALLAST_SOURCE_DIR);
    CU_ASSERT_EQUAL(test_run(args, &out, &err), 0);
    CU_ASSERT(out != NULL && strstr(out, "stage 1 arena (exact)") != NULL &&
              strstr(out, "proven: true") != NULL && strstr(out, "workspace") != NULL);
    free(out);
    free(err);
    snprintf(args, sizeof args, "plan --cluster %s/configs/clusters/cpu-3.json --arena best",
             BALLAST_SOURCE_DIR);
    CU_ASSERT_EQUAL(test_run(args, &out, &err), 2);
    free(out);
    free(err);
    snprintf(args, sizeof args,
             "plan --cluster %s/configs/clusters/cpu-3.json --arena greedy --explain-arena 9",
             BALLAST_SOURCE_DIR);
    CU_ASSERT_EQUAL(test_run(args, &out, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "stage 9") != NULL);
    free(out);
    free(err);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("arena", NULL, NULL);
    CU_add_test(s, "random layouts: overlap-free, lower bound, exact = brute force",
                test_random_layouts);
    CU_add_test(s, "ga never worse than greedy", test_ga_never_worse);
    CU_add_test(s, "a device cap: the bytes above it", test_cap);
    CU_add_test(s, "ga is deterministic", test_ga_deterministic);
    CU_add_test(s, "every stage of shipped clusters", test_shipped_stages);
    CU_add_test(s, "offload: staging objects from the schedule, every layout",
                test_offload_stages);
    CU_add_test(s, "offload: exact = brute force with staging objects", test_exact_staging_brute);
    CU_add_test(s, "offload: a cap turns the objects above it into offloads", test_cap_offloads);
    CU_add_test(s, "the plan file carries the arena", test_plan_file);
    CU_add_test(s, "plan --arena and --explain-arena", test_cli);
    return test_main();
}
