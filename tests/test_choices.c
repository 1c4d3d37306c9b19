/* Plans no more complex than they are worth, and a superset of actions never slower (issues
 * 24 item 7, 27 item 2): every set of actions against its subsets on random instances, each
 * set against brute force, and --min-gain's choice against brute force (every plan
 * enumerated, those within the margin kept, the simplest picked by the preference order). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "arena_plan.h"
#include "estimate.h"
#include "microbatch.h"
#include "plan_instance.h"
#include "planner.h"
#include "sim.h"
#include "testutil.h"

#define GIB ((int64_t)1 << 30)
#define ALL_ACTIONS (PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD | PLAN_ACTION_OPTIMIZER)

/* S stages of `per` layers, M micro-batches, host links from slower than the layers to far
 * faster, each stage's device memory at random between what it needs with its optimizer on
 * the host and every layer recomputed and what it needs keeping everything. */
static void instance_random(struct instance *in, struct test_rng *r, int S, int per, int M,
                            enum schedule sched)
{
    instance_init(in, S * per, S, sched, M, pow(10, test_rng_double(r, 1, 4)),
                  test_rng_int(r, 4, 200) * GIB);
    int options = (int)test_rng_int(r, 1, 2);
    for (int l = 0; l < S * per; l++) {
        instance_split_layer(&in->prof.layers[l], r);
        if (options > 1)
            instance_mlp_option(&in->prof.layers[l], r);
    }
    for (int s = 0; s < S; s++) {
        struct cluster_stage *st = &in->c.stages[s];
        int64_t least = GIB / 2, most = GIB;
        int v = schedule_in_flight(sched, S, s, M);
        for (int l = st->first; l <= st->last; l++) {
            const struct layer_cost *y = &in->prof.layers[l];
            least += y->param_bytes + y->grad_bytes + v * y->ckpt_bytes + y->act_bytes;
            most += y->state_bytes + v * y->act_bytes;
        }
        st->memory_bytes = least + (int64_t)(test_rng_double(r, 0, 1) * (double)(most - least));
    }
}

/* --repartition for check_subsets (exact: search gap 0), and the knapsack's memory unit (0:
 * the default). */
static int repartition;
static int64_t unit;

static int plan_gain(const struct instance *in, int actions, double min_gain,
                     const struct arena_options *arena, struct plan *p)
{
    struct plan_options o;
    struct err e;
    plan_options_default(&o);
    err_clear(&e);
    o.actions = actions;
    o.min_gain = min_gain;
    o.arena = arena;
    o.repartition = repartition;
    o.search_gap = 0;
    o.unit_bytes = unit > 0 ? unit : o.unit_bytes;
    int rc = planner_make(&in->c, &o, p, &e);
    if (rc != ERR_OK && rc != ERR_NOFIT)
        printf("\nplanner: %s\n", e.msg);
    return rc;
}

/* ---- a superset of actions is never slower ---- */

/* Every set of actions (recompute, offload, optimizer) planned, each against every smaller
 * set: it fits where a smaller one does, and its step is no longer. */
static int check_subsets(const struct instance *in, double min_gain,
                         const struct arena_options *arena, int sets, int *faster)
{
    double ms[8];
    int rc[8], compared = 0;
    for (int a = 1; a <= ALL_ACTIONS; a++) {
        struct plan p;
        rc[a] = (a & ~sets) ? -1 : plan_gain(in, a, min_gain, arena, &p);
        CU_ASSERT(rc[a] == -1 || rc[a] == ERR_OK || rc[a] == ERR_NOFIT);
        ms[a] = rc[a] == ERR_OK ? p.iteration_ms : INFINITY;
        if (rc[a] == ERR_OK)
            plan_free(&p);
    }
    for (int a = 1; a <= ALL_ACTIONS; a++)
        for (int b = 1; b < a; b++) {
            if ((b & a) != b || rc[a] < 0 || rc[b] != ERR_OK)
                continue;
            compared++;
            *faster += ms[a] < ms[b] * (1 - 1e-9);
            CU_ASSERT(rc[a] == ERR_OK && ms[a] <= ms[b]);
            if (!(ms[a] <= ms[b]))
                printf("\nmin-gain %g: actions %d %.9g ms, its subset %d %.9g ms\n", min_gain,
                       a, ms[a], b, ms[b]);
        }
    return compared;
}

/* Issue 27 item 2: `--actions offload` 9.442 ms and `recompute,offload` 11.050 ms on one
 * stage, where more actions made more combinations and a coarser search. Stages of up to 8
 * layers (past the exhaustive bounds of offload.h), 1 to 5 of them. */
static void test_superset_never_slower(void)
{
    struct test_rng rng = {2027};
    int compared = 0, faster = 0;
    for (int trial = 0; trial < 100; trial++) {
        struct instance in;
        int S = (int)test_rng_int(&rng, 1, 5), per = (int)test_rng_int(&rng, 1, 8);
        instance_random(&in, &rng, S, per, (int)test_rng_int(&rng, S, 3 * S),
                        trial % 2 ? SCHEDULE_GPIPE : SCHEDULE_1F1B);
        /* now and then a coarse knapsack unit: the least recompute it finds is then not the
         * least a search by bytes finds */
        unit = trial % 3 == 2 ? test_rng_int(&rng, 64, 1024) << 20 : 0;
        compared += check_subsets(&in, 0, NULL, ALL_ACTIONS, &faster);
        compared += check_subsets(&in, PLAN_MIN_GAIN_DEFAULT, NULL, ALL_ACTIONS, &faster);
        unit = 0;
        instance_free(&in);
    }
    printf(" [%d pairs, %d faster with more actions] ", compared, faster);
    CU_ASSERT(compared >= 1000);
    CU_ASSERT(faster >= 100);
}

/* With --arena (greedy), which has no host optimizer: recompute, offload and both. */
static void test_superset_with_arena(void)
{
    struct test_rng rng = {91};
    struct arena_options arena;
    arena_options_default(&arena);
    snprintf(arena.method, sizeof arena.method, "greedy");
    int compared = 0, faster = 0;
    for (int trial = 0; trial < 80; trial++) {
        struct instance in;
        int S = (int)test_rng_int(&rng, 1, 3), per = (int)test_rng_int(&rng, 1, 4);
        instance_random(&in, &rng, S, per, (int)test_rng_int(&rng, S, 2 * S), SCHEDULE_1F1B);
        arena.offload = 1;
        compared += check_subsets(&in, 0, &arena,
                                  PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD, &faster);
        instance_free(&in);
    }
    printf(" [%d pairs, %d faster] ", compared, faster);
    CU_ASSERT(compared >= 30);
}

/* With --repartition: the split is the recompute-only search's (and --min-gain's on it), the
 * same for every set of actions, and each set's plan on it never slower than a smaller's. */
static void test_superset_with_repartition(void)
{
    struct test_rng rng = {404};
    int compared = 0, faster = 0;
    repartition = 1;
    for (int trial = 0; trial < 40; trial++) {
        struct instance in;
        int S = (int)test_rng_int(&rng, 2, 4), per = (int)test_rng_int(&rng, 1, 4);
        instance_random(&in, &rng, S, per, (int)test_rng_int(&rng, S, 2 * S),
                        trial % 2 ? SCHEDULE_GPIPE : SCHEDULE_1F1B);
        compared += check_subsets(&in, 0, NULL, ALL_ACTIONS, &faster);
        compared += check_subsets(&in, PLAN_MIN_GAIN_DEFAULT, NULL, ALL_ACTIONS, &faster);
        instance_free(&in);
    }
    repartition = 0;
    printf(" [%d pairs, %d faster] ", compared, faster);
    CU_ASSERT(compared >= 300);
    CU_ASSERT(faster >= 30);
}

/* Every set of actions at --min-gain 0 is the brute force's least step. */
static void test_every_set_against_brute_force(void)
{
    struct test_rng rng = {64};
    int checked = 0;
    for (int trial = 0; trial < 24; trial++) {
        struct instance in;
        instance_random(&in, &rng, 2, 2, 4, trial % 2 ? SCHEDULE_GPIPE : SCHEDULE_1F1B);
        for (int a = 1; a <= ALL_ACTIONS; a++) {
            struct plan p;
            if (plan_gain(&in, a, 0, NULL, &p) != ERR_OK)
                continue;
            double got = p.iteration_ms, want = instance_brute_force(&p, a, 0);
            CU_ASSERT(test_close(got, want, 1e-9, 1e-12));
            if (!test_close(got, want, 1e-9, 1e-12))
                printf("\ntrial %d actions %d: %.9g ms, brute force %.9g ms\n", trial, a, got,
                       want);
            checked++;
            plan_free(&p);
        }
        instance_free(&in);
    }
    printf(" [%d plans] ", checked);
    CU_ASSERT(checked >= 60);
}

/* ---- --min-gain by brute force ---- */

/* The preference order of a plan on a fixed split, counted here from its fields: stages with
 * the optimizer on the host, layers offloading or recomputing a partial option, layers
 * recomputed. */
struct key {
    int v[3];
};

static struct key key_of(const struct plan *p)
{
    struct key k = {{0, 0, 0}};
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        k.v[0] += st->optimizer == COST_PLACE_HOST;
        for (int l = 0; l < plan_stage_layer_count(st); l++) {
            k.v[1] += layer_action_offloads(&st->actions[l]) ||
                      st->actions[l].choice >= COST_OPTION;
            k.v[2] += st->actions[l].choice != COST_KEEP;
        }
    }
    return k;
}

static int key_cmp(struct key a, struct key b)
{
    for (int i = 0; i < 3; i++)
        if (a.v[i] != b.v[i])
            return a.v[i] < b.v[i] ? -1 : 1;
    return 0;
}

/* Every plan of an instance: its step, key, and the actions it takes. */
struct every {
    int n, cap;
    double *ms;
    struct key *key;
    int *uses;
};

static void note_plan(const struct plan *p, double ms, void *ctx)
{
    struct every *ev = ctx;
    if (ev->n == ev->cap) {
        ev->cap = ev->cap ? 2 * ev->cap : 1024;
        ev->ms = realloc(ev->ms, (size_t)ev->cap * sizeof *ev->ms);
        ev->key = realloc(ev->key, (size_t)ev->cap * sizeof *ev->key);
        ev->uses = realloc(ev->uses, (size_t)ev->cap * sizeof *ev->uses);
    }
    int uses = 0;
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        uses |= st->optimizer == COST_PLACE_HOST ? PLAN_ACTION_OPTIMIZER : 0;
        for (int l = 0; l < plan_stage_layer_count(st); l++) {
            uses |= st->actions[l].choice != COST_KEEP ? PLAN_ACTION_RECOMPUTE : 0;
            uses |= layer_action_offloads(&st->actions[l]) ? PLAN_ACTION_OFFLOAD : 0;
        }
    }
    ev->ms[ev->n] = ms;
    ev->key[ev->n] = key_of(p);
    ev->uses[ev->n++] = uses;
}

/* What --min-gain g chooses with `actions`, by its definition: of the plans taking only those
 * actions, those within g of the fastest and no slower than what any smaller set chooses;
 * of them the simplest, ties by the shorter step. lo and hi: the simplest with the cap
 * 1e-9 tighter and looser (a step that close to the cap may fall either way). */
struct chosen {
    int found;
    double ms, cap;
    struct key key, lo, hi;
};

static void choose(const struct every *ev, int actions, double g, struct chosen *out)
{
    double fastest = INFINITY, cap;
    for (int i = 0; i < ev->n; i++)
        if ((ev->uses[i] & ~actions) == 0 && ev->ms[i] < fastest)
            fastest = ev->ms[i];
    struct chosen *c = &out[actions];
    memset(c, 0, sizeof *c);
    if (isinf(fastest))
        return;
    cap = fastest * (1 + g) + 1e-12 * (1 + fastest);
    for (int b = 1; b < actions; b++)
        if ((b & actions) == b && out[b].found && out[b].ms < cap)
            cap = out[b].ms;
    c->found = 1;
    c->cap = cap;
    c->ms = INFINITY;
    int lo = 0, hi = 0;
    for (int i = 0; i < ev->n; i++) {
        if ((ev->uses[i] & ~actions) != 0)
            continue;
        double ms = ev->ms[i];
        struct key k = ev->key[i];
        if (ms <= cap && (isinf(c->ms) || key_cmp(k, c->key) < 0 ||
                          (key_cmp(k, c->key) == 0 && ms < c->ms))) {
            c->key = k;
            c->ms = ms;
        }
        if (ms <= cap * (1 - 1e-9) && (!lo++ || key_cmp(k, c->lo) < 0))
            c->lo = k;
        if (ms <= cap * (1 + 1e-9) && (!hi++ || key_cmp(k, c->hi) < 0))
            c->hi = k;
    }
    if (!lo)
        c->lo = c->key;
}

static void test_min_gain_against_brute_force(void)
{
    static const double gains[] = {0.002, 0.01, 0.05, 0.2};
    static const int shapes[][2] = {{2, 2}, {1, 4}, {4, 1}, {1, 3}};
    struct test_rng rng = {31};
    int checked = 0, simpler = 0;
    for (int trial = 0; trial < 24; trial++) {
        struct instance in;
        const int *shape = shapes[trial % 4];
        instance_random(&in, &rng, shape[0], shape[1], (int)test_rng_int(&rng, 1, 6),
                        trial % 3 ? SCHEDULE_1F1B : SCHEDULE_GPIPE);
        struct plan layout;
        if (plan_gain(&in, ALL_ACTIONS, 0, NULL, &layout) != ERR_OK) {
            instance_free(&in);
            continue;
        }
        struct every ev = {0};
        instance_each_plan(&layout, ALL_ACTIONS, 0, note_plan, &ev);
        plan_free(&layout);
        for (size_t gi = 0; gi < sizeof gains / sizeof gains[0]; gi++) {
            struct chosen want[8];
            for (int a = 1; a <= ALL_ACTIONS; a++) {
                struct plan p;
                choose(&ev, a, gains[gi], want);
                int rc = plan_gain(&in, a, gains[gi], NULL, &p);
                CU_ASSERT_EQUAL(rc, want[a].found ? ERR_OK : ERR_NOFIT);
                if (rc != ERR_OK)
                    continue;
                struct key k = key_of(&p);
                int ok = p.iteration_ms <= want[a].cap * (1 + 1e-9) &&
                         key_cmp(k, want[a].hi) >= 0 && key_cmp(k, want[a].lo) <= 0;
                CU_ASSERT(ok);
                if (!ok)
                    printf("\ntrial %d gain %g actions %d: %.9g ms key %d,%d,%d; brute force "
                           "%.9g ms key %d,%d,%d (cap %.9g)\n",
                           trial, gains[gi], a, p.iteration_ms, k.v[0], k.v[1], k.v[2],
                           want[a].ms, want[a].key.v[0], want[a].key.v[1], want[a].key.v[2],
                           want[a].cap);
                double fastest = instance_brute_force(&p, a, 0);
                simpler += p.iteration_ms > fastest * (1 + 1e-9);
                checked++;
                plan_free(&p);
            }
        }
        free(ev.ms);
        free(ev.key);
        free(ev.uses);
        instance_free(&in);
    }
    printf(" [%d plans, %d simpler than the fastest] ", checked, simpler);
    CU_ASSERT(checked >= 200);
    CU_ASSERT(simpler >= 20);
}

/* Plan p's step with stage 0's optimizer at `place`. */
static double step_with(struct plan *p, enum cost_place place)
{
    struct sim_result r;
    struct err e;
    err_clear(&e);
    p->stages[0].optimizer = place;
    CU_ASSERT_FATAL(sim_plan(p, &r, &e) == ERR_OK);
    double ms = r.iteration_ms;
    sim_result_free(&r);
    return ms;
}

/* The host optimizer, chosen on two stages for a step 7e-11 ms shorter: floating-point
 * noise. One stage whose device step is made `shorter` (a share of the step; < 0: longer)
 * than the host's: the device wins within noise at --min-gain 0, the host where it is
 * faster by more than the gain. */
static void noise_case(double shorter, double min_gain, enum cost_place want)
{
    struct test_rng rng = {17};
    struct instance in;
    struct plan p, q;
    instance_random(&in, &rng, 1, 2, 3, SCHEDULE_1F1B);
    in.c.stages[0].memory_bytes = 1000 * GIB; /* nothing recomputed, either place */
    in.c.stages[0].host_memory_bytes = 1000 * GIB;
    CU_ASSERT_FATAL(plan_gain(&in, PLAN_ACTION_RECOMPUTE, 0, NULL, &p) == ERR_OK);
    double device = step_with(&p, COST_PLACE_DEVICE), host = step_with(&p, COST_PLACE_HOST);
    plan_free(&p);
    /* the device step moved so that the host's is `shorter` of it shorter */
    in.prof.layers[0].optimizer_ms += host * (1 + shorter) - device;
    CU_ASSERT_FATAL(plan_gain(&in, PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OPTIMIZER, min_gain, NULL,
                              &q) == ERR_OK);
    CU_ASSERT_EQUAL(q.stages[0].optimizer, want);
    device = step_with(&q, COST_PLACE_DEVICE);
    host = step_with(&q, COST_PLACE_HOST);
    CU_ASSERT(shorter > 0 ? device > host : device < host);
    CU_ASSERT(fabs(device / host - 1 - shorter) < 1e-13 + fabs(shorter) * 1e-3);
    plan_free(&q);
    instance_free(&in);
}

static void test_noise_ties(void)
{
    noise_case(2e-15, 0, COST_PLACE_DEVICE); /* noise: the device's */
    noise_case(2e-15, PLAN_MIN_GAIN_DEFAULT, COST_PLACE_DEVICE);
    noise_case(0.002, 0, COST_PLACE_HOST); /* a real gain, taken when above --min-gain */
    noise_case(0.002, PLAN_MIN_GAIN_DEFAULT, COST_PLACE_DEVICE);
    noise_case(0.02, PLAN_MIN_GAIN_DEFAULT, COST_PLACE_HOST);
    noise_case(-0.02, 0, COST_PLACE_DEVICE);
}

/* ---- --min-gain and the split ---- */

/* One device kind, n layers of whole-layer recompute only (no options, no host) on S stages
 * of the default split, each stage's memory between a third and all of what its share keeps. */
static void split_instance(struct instance *in, struct test_rng *r, int n, int S, int M)
{
    instance_init(in, n, S, r->s % 2 ? SCHEDULE_GPIPE : SCHEDULE_1F1B, M, 100, 0);
    int64_t most = 0;
    for (int l = 0; l < n; l++) {
        instance_split_layer(&in->prof.layers[l], r);
        in->prof.layers[l].n_options = 0;
        /* a few layers far faster: splits of the same step around the slowest stage */
        if (test_rng_int(r, 0, 1) == 0) {
            in->prof.layers[l].fwd_ms /= 20;
            in->prof.layers[l].bwd_ms /= 20;
        }
        most += in->prof.layers[l].state_bytes + M * in->prof.layers[l].act_bytes;
    }
    for (int s = 0; s < S; s++)
        in->c.stages[s].memory_bytes =
            (int64_t)(test_rng_double(r, 0.35, 1) * (double)most / S) + GIB;
}

/* The split's key as choice.h orders it with recompute alone: layers recomputed, then blocks
 * away from the default split (the instance's layers are all blocks). */
static void split_key(const struct plan *p, int key[2])
{
    key[0] = key_of(p).v[2];
    key[1] = 0;
    for (int s = 0; s < p->n_stages; s++) {
        int first, last;
        cluster_default_split(&p->model, p->stages[p->n_stages - 1].last + 1, p->n_stages, s,
                              &first, &last);
        int d = (p->stages[s].last - p->stages[s].first) - (last - first);
        key[1] += d < 0 ? -d : d;
    }
}

/* planner_make on instance `in` with stages s given layers from first[s]. */
static int plan_split(struct instance *in, const int *first, double min_gain, int repartition,
                      struct plan *p)
{
    struct plan_options o;
    struct err e;
    struct cluster c = in->c;
    struct cluster_stage st[8];
    memcpy(st, in->c.stages, (size_t)c.n_stages * sizeof *st);
    for (int s = 0; first != NULL && s < c.n_stages; s++) {
        st[s].first = first[s];
        st[s].last = s + 1 < c.n_stages ? first[s + 1] - 1 : c.n_layers - 1;
    }
    c.stages = st;
    plan_options_default(&o);
    err_clear(&e);
    o.min_gain = min_gain;
    o.repartition = repartition;
    o.search_gap = 0;
    return planner_make(&c, &o, p, &e);
}

/* --repartition with --min-gain: within the gain of the fastest split (brute force over every
 * split), no simpler (by recompute, then balance) than a split one layer away along a run of
 * stages within that gain, nor than the cluster's own split within it. The plan
 * recomputed 19 blocks on a split of 1,1,1,1,10,10,1,0 among splits of the same step. */
static void test_repartition_min_gain(void)
{
    struct test_rng rng = {5150};
    int checked = 0, simplified = 0;
    for (int trial = 0; trial < 40; trial++) {
        struct instance in;
        int S = (int)test_rng_int(&rng, 2, 4), n = S + (int)test_rng_int(&rng, 1, 5);
        split_instance(&in, &rng, n, S, (int)test_rng_int(&rng, S, 2 * S));
        double fastest = INFINITY, g = trial % 2 ? 0.02 : 0.1;
        int first[8];
        for (int s = 0; s < S; s++)
            first[s] = s;
        for (int k = S - 1; k > 0;) { /* every split: first[1..S-1] increasing in 1..n-1 */
            struct plan p;
            if (plan_split(&in, first, 0, 0, &p) == ERR_OK) {
                fastest = p.iteration_ms < fastest ? p.iteration_ms : fastest;
                plan_free(&p);
            }
            for (k = S - 1; k > 0 && first[k] == n - (S - k);)
                k--;
            if (k > 0)
                first[k]++;
            for (int q = k + 1; k > 0 && q < S; q++)
                first[q] = first[q - 1] + 1;
        }
        struct plan p, fast;
        if (isinf(fastest) || plan_split(&in, NULL, g, 1, &p) != ERR_OK) {
            instance_free(&in);
            continue;
        }
        CU_ASSERT_FATAL(plan_split(&in, NULL, 0, 1, &fast) == ERR_OK);
        double cap = fastest * (1 + g) * (1 + 1e-9);
        CU_ASSERT(test_close(fast.iteration_ms, fastest, 1e-9, 1e-9));
        CU_ASSERT(p.iteration_ms <= cap);
        CU_ASSERT(p.optimality_gap >= 0 &&
                  test_close(p.search.lower_bound * (1 + p.optimality_gap), p.iteration_ms,
                             1e-6, 1e-9));
        int key[2], fast_key[2];
        split_key(&p, key);
        split_key(&fast, fast_key);
        simplified += key[0] < fast_key[0] || (key[0] == fast_key[0] && key[1] < fast_key[1]);
        /* no split one layer away along a run of stages is simpler within the gain */
        for (int a = 0; a + 1 < S; a++)
            for (int b = a + 1; b < S; b++)
                for (int dir = -1; dir <= 1; dir += 2) {
                    int moved[8], ok = 1;
                    struct plan q;
                    for (int s = 0; s < S; s++)
                        moved[s] = p.stages[s].first + (s > a && s <= b ? dir : 0);
                    for (int s = 0; s < S; s++)
                        ok = ok && moved[s] < (s + 1 < S ? moved[s + 1] : n);
                    if (!ok || plan_split(&in, moved, 0, 0, &q) != ERR_OK)
                        continue;
                    int k[2];
                    split_key(&q, k);
                    if (q.iteration_ms <= fastest * (1 + g))
                        CU_ASSERT(k[0] > key[0] || (k[0] == key[0] && k[1] >= key[1]));
                    plan_free(&q);
                }
        /* nor than the cluster's own split (the default's) within the gain */
        struct plan own;
        int own_key[2];
        if (plan_split(&in, NULL, 0, 0, &own) == ERR_OK) {
            split_key(&own, own_key);
            if (own.iteration_ms <= fastest * (1 + g))
                CU_ASSERT(own_key[0] > key[0] || (own_key[0] == key[0] && own_key[1] >= key[1]));
            plan_free(&own);
        }
        checked++;
        plan_free(&p);
        plan_free(&fast);
        instance_free(&in);
    }
    printf(" [%d clusters, %d simpler than the fastest split] ", checked, simplified);
    CU_ASSERT(checked >= 20);
    CU_ASSERT(simplified >= 3);
}

/* --min-gain on the command line: a share or a percentage, the plan's min_gain and
 * fastest_ms written and read back, the table's line; bad values and other methods refused. */
static void test_min_gain_cli(void)
{
    char args[2048], *out = NULL, *err = NULL;
    const char *file = test_path("mg.json");
    struct plan p, q;
    struct err e;
    err_clear(&e);
    snprintf(args, sizeof args,
             "plan --cluster %s/configs/clusters/h100-a100-l4-16.json --min-gain 0.5%% -o %s",
             BALLAST_SOURCE_DIR, file);
    CU_ASSERT_EQUAL_FATAL(test_run(args, &out, NULL), 0);
    CU_ASSERT(out && strstr(out, "min-gain 0.5%: the fastest plan found steps"));
    free(out);
    CU_ASSERT_FATAL(plan_load(file, &p, &e) == ERR_OK);
    CU_ASSERT(p.min_gain == 0.005 && p.fastest_ms > 0 && p.fastest_ms < p.iteration_ms &&
              p.iteration_ms <= p.fastest_ms * 1.005);
    snprintf(args, sizeof args,
             "plan --cluster %s/configs/clusters/h100-a100-l4-16.json --min-gain 0 --quiet -o %s",
             BALLAST_SOURCE_DIR, file);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    CU_ASSERT_FATAL(plan_load(file, &q, &e) == ERR_OK);
    CU_ASSERT(q.min_gain == 0 && q.fastest_ms == 0 && q.iteration_ms == p.fastest_ms);
    plan_free(&p);
    plan_free(&q);
    static const char *const bad[][2] = {{"--min-gain 1", "--min-gain: \"1\""},
                                         {"--min-gain -0.1", "--min-gain"},
                                         {"--min-gain 5x", "--min-gain: \"5x\""},
                                         {"--method patent --min-gain 0.01", "optimal only"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "plan --cluster %s/configs/clusters/cpu-3.json %s",
                 BALLAST_SOURCE_DIR, bad[i][0]);
        CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
        CU_ASSERT(err && strstr(err, bad[i][1]));
        free(err);
        err = NULL;
    }
}

/* ---- issue 24 item 8: the default split, --micro-batches auto, --global-batch ---- */

/* cluster_default_split of n layers of model m over S stages against want's ranges. */
static void check_split(const struct model *m, int n, int S, const int want[][2])
{
    for (int s = 0; s < S; s++) {
        int first, last;
        cluster_default_split(m, n, S, s, &first, &last);
        CU_ASSERT(first == want[s][0] && last == want[s][1]);
    }
}

/* Blocks dealt evenly, the embedding with the first stage and the head with the last, the
 * remainder to the middle stages; a custom model's layers (or too few blocks) evenly. */
static void test_default_split(void)
{
    struct model gpt32 = {.kind = MODEL_KIND_GPT, .n_layer = 32};
    struct model gpt30 = {.kind = MODEL_KIND_GPT, .n_layer = 30};
    struct model gpt2 = {.kind = MODEL_KIND_GPT, .n_layer = 2};
    struct model custom = {.kind = MODEL_KIND_CUSTOM};
    check_split(&gpt32, 34, 4, (const int[][2]){{0, 8}, {9, 16}, {17, 24}, {25, 33}});
    check_split(&gpt30, 32, 4, (const int[][2]){{0, 7}, {8, 15}, {16, 23}, {24, 31}}); /* 7 8 8 7 */
    check_split(&custom, 10, 3, (const int[][2]){{0, 2}, {3, 5}, {6, 9}});
    check_split(&gpt2, 4, 3, (const int[][2]){{0, 0}, {1, 1}, {2, 3}}); /* 2 blocks, 3 stages */
    /* a shipped cluster without "layers" (Llama-2 7B's 32 blocks on 8 stages): 4 blocks each */
    struct cluster c;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(cluster_load(BALLAST_SOURCE_DIR "/configs/clusters/llama2-7b-h100-a100-8.json",
                                 &c, &e) == ERR_OK);
    for (int s = 0; s < c.n_stages; s++) {
        int blocks = c.stages[s].last - c.stages[s].first + 1 - (s == 0) - (s == c.n_stages - 1);
        CU_ASSERT_EQUAL(blocks, 4);
    }
    cluster_free(&c);
}

/* Shipped cluster `from` with every stage a group of tp GPUs replicated dp times, optimizer
 * sharded or not. */
static const char *group_cluster(const char *name, const char *from, int tp, int dp, int shard)
{
    char *text = NULL, src[1024];
    snprintf(src, sizeof src, "%s/configs/clusters/%s", BALLAST_SOURCE_DIR, from);
    FILE *f = fopen(src, "r");
    CU_ASSERT_FATAL(f != NULL);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    text = calloc((size_t)n + 1, 1);
    CU_ASSERT_FATAL(text != NULL && fread(text, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON *stages = cJSON_GetObjectItem(root, "stages"), *st;
    cJSON_ArrayForEach(st, stages) {
        cJSON *profile = cJSON_GetObjectItem(st, "profile");
        char path[1024];
        snprintf(path, sizeof path, "%s/configs/clusters/%s", BALLAST_SOURCE_DIR,
                 profile->valuestring);
        cJSON_SetValuestring(profile, path);
        cJSON_AddNumberToObject(st, "dp", dp);
        if (tp > 1)
            cJSON_AddNumberToObject(st, "tp", tp);
    }
    if (shard)
        cJSON_AddTrueToObject(root, "shard_optimizer");
    char *out = cJSON_Print(root);
    const char *file = test_write(name, out);
    free(out);
    cJSON_Delete(root);
    return file;
}

static const char *dp_cluster(const char *name, int dp, int shard)
{
    return group_cluster(name, "llama2-7b-h100-a100-8.json", 1, dp, shard);
}

/* A measured profile rescaled to its own micro-batch size is the profile cluster_load made:
 * its bytes as each GPU of a tp 2, dp 2, ZeRO-1 group holds them, to the byte. */
static void test_auto_measured_groups(void)
{
    struct device_table t;
    struct cluster c, cb;
    struct microbatch_notes notes = {0};
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(devices_load(BALLAST_SOURCE_DIR "/configs/devices.json", &t, &e) == ERR_OK);
    CU_ASSERT_FATAL(cluster_load(group_cluster("m.json", "cpu-3-measured.json", 2, 2, 1), &c,
                                 &e) == ERR_OK);
    CU_ASSERT_FATAL(microbatch_cluster(&c, &t, estimate_profile, c.model.micro_batch,
                                       c.micro_batches, &cb, &notes, &e) == ERR_OK);
    CU_ASSERT(notes.scaled);
    for (int l = 0; l < c.profiles[0].n_layers; l++) {
        const struct layer_cost *x = &cb.profiles[0].layers[l], *y = &c.profiles[0].layers[l];
        CU_ASSERT(x->state_bytes == y->state_bytes && x->act_bytes == y->act_bytes &&
                  x->ckpt_bytes == y->ckpt_bytes && x->out_bytes == y->out_bytes &&
                  x->workspace_bytes == y->workspace_bytes && x->n_options == y->n_options);
        for (int k = 0; k < x->n_options && k < y->n_options; k++)
            CU_ASSERT(x->options[k].kept_bytes == y->options[k].kept_bytes &&
                      x->options[k].transient_bytes == y->options[k].transient_bytes);
    }
    microbatch_cluster_free(&cb, c.n_profiles);
    cluster_free(&c);
    devices_free(&t);
}

/* --micro-batches auto keeps ZeRO-1 (and dp): each candidate's profiles are the estimate at
 * its micro-batch size as each GPU of the group holds it, the same as a cluster of profiles
 * estimated at that size directly; the optimizer state is sharded (the issue: stage 0 planned
 * at 47.89 GiB, the unsharded figure, instead of 38.11). */
static void test_auto_keeps_zero1(void)
{
    struct device_table t;
    struct cluster c, unsharded;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(devices_load(BALLAST_SOURCE_DIR "/configs/devices.json", &t, &e) == ERR_OK);
    CU_ASSERT_FATAL(cluster_load(dp_cluster("z.json", 2, 1), &c, &e) == ERR_OK);
    for (int b = 1; b <= 2; b++) {
        struct cluster cb;
        struct microbatch_notes notes = {0};
        CU_ASSERT_FATAL(microbatch_cluster(&c, &t, estimate_profile, b, 8, &cb, &notes, &e) ==
                        ERR_OK);
        for (int k = 0; k < c.n_profiles; k++) {
            /* the reference: estimated at b, written, loaded in the cluster with its groups */
            struct profile direct, *got = &cb.profiles[k];
            struct model m = c.model;
            m.micro_batch = b;
            CU_ASSERT_FATAL(estimate_profile(&t, devices_find(&t, got->device.name), &m,
                                             &direct, &e) == ERR_OK);
            struct cost_group g;
            CU_ASSERT(cluster_profile_group(&c, k, 1, &g));
            g.tensor_bytes = cost_tp_tensor_bytes(&m);
            int64_t opt = direct.layers[1].optimizer_bytes;
            cluster_group_layers(&direct, &m, &g);
            for (int l = 0; l < direct.n_layers; l++) {
                const struct layer_cost *x = &got->layers[l], *y = &direct.layers[l];
                CU_ASSERT(x->state_bytes == y->state_bytes && x->act_bytes == y->act_bytes &&
                          x->workspace_bytes == y->workspace_bytes &&
                          x->fwd_ms == y->fwd_ms && x->optimizer_bytes == y->optimizer_bytes);
            }
            /* sharded over the 2 replicas: half the unsharded optimizer state per GPU */
            CU_ASSERT_EQUAL(got->layers[1].optimizer_bytes, (opt + 1) / 2);
            profile_free(&direct);
        }
        microbatch_cluster_free(&cb, c.n_profiles);
    }
    /* the plan: stage 0 as a cluster of size-b profiles would have it, less than unsharded */
    struct plan_options o;
    struct plan p, q;
    plan_options_default(&o);
    o.estimate = estimate_profile;
    CU_ASSERT_FATAL(planner_make_auto(&c, &o, 32, NULL, &p, &e) == ERR_OK);
    CU_ASSERT_EQUAL(p.micro_batches * p.model.micro_batch * p.stages[0].dp, 32);
    CU_ASSERT_FATAL(cluster_load(dp_cluster("u.json", 2, 0), &unsharded, &e) == ERR_OK);
    CU_ASSERT_FATAL(planner_make_auto(&unsharded, &o, 32, NULL, &q, &e) == ERR_OK ||
                    e.code == ERR_NOFIT);
    if (e.code == ERR_OK) {
        CU_ASSERT(q.stages[0].memory_before_bytes > p.stages[0].memory_before_bytes);
        plan_free(&q);
    }
    err_clear(&e);
    /* a global batch the replicas cannot share evenly is refused, naming dp */
    CU_ASSERT_EQUAL(planner_make_auto(&c, &o, 33, NULL, &q, &e), ERR_INPUT);
    CU_ASSERT(strstr(e.msg, "--global-batch 33") != NULL && strstr(e.msg, "2") != NULL);
    plan_free(&p);
    cluster_free(&c);
    cluster_free(&unsharded);
    devices_free(&t);
}

/* --global-batch on the command line: a step's samples across the replicas. */
static void test_global_batch_cli(void)
{
    char args[2048];
    const char *file = test_path("gb.json");
    struct plan p;
    struct err e;
    err_clear(&e);
    snprintf(args, sizeof args,
             "plan --cluster %s --micro-batches auto --global-batch 64 --quiet -o %s",
             dp_cluster("g.json", 2, 1), file);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    CU_ASSERT_FATAL(plan_load(file, &p, &e) == ERR_OK);
    CU_ASSERT_EQUAL(p.micro_batches * p.model.micro_batch * p.stages[0].dp, 64);
    plan_free(&p);
    char *err = NULL;
    snprintf(args, sizeof args, "plan --cluster %s --micro-batches auto --global-batch 63",
             dp_cluster("g.json", 2, 1));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err && strstr(err, "--global-batch 63"));
    free(err);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("planning choices", NULL, NULL);
    CU_add_test(s, "a superset of actions is never slower", test_superset_never_slower);
    CU_add_test(s, "the same with --arena", test_superset_with_arena);
    CU_add_test(s, "the same with --repartition", test_superset_with_repartition);
    CU_add_test(s, "every set of actions against brute force", test_every_set_against_brute_force);
    CU_add_test(s, "--min-gain against brute force", test_min_gain_against_brute_force);
    CU_add_test(s, "floating-point noise: the device wins", test_noise_ties);
    CU_add_test(s, "--min-gain and --repartition", test_repartition_min_gain);
    CU_add_test(s, "--min-gain on the command line", test_min_gain_cli);
    CU_add_test(s, "the default split", test_default_split);
    CU_add_test(s, "--micro-batches auto keeps ZeRO-1", test_auto_keeps_zero1);
    CU_add_test(s, "... and a measured profile's groups", test_auto_measured_groups);
    CU_add_test(s, "--global-batch across replicas", test_global_batch_cli);
    return test_main();
}
