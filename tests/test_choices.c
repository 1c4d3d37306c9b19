/* Plans no more complex than they are worth, and a superset of actions never slower (issues
 * 24 item 7, 27 item 2): every set of actions against its subsets on random instances, each
 * set against brute force, and --min-gain's choice against brute force (every plan
 * enumerated, those within the margin kept, the simplest picked by the preference order). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena_plan.h"
#include "plan_instance.h"
#include "planner.h"
#include "sim.h"
#include "testutil.h"

#define GIB ((int64_t)1 << 30)
#define ALL_ACTIONS (PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD | PLAN_ACTION_OPTIMIZER)

/* A layer whose state splits (fp32's proportions), with one or two partial options. */
static void layer_make(struct layer_cost *c, struct test_rng *r, int options)
{
    c->fwd_ms = test_rng_double(r, 1, 4);
    c->bwd_ms = 2 * c->fwd_ms;
    c->has_split = 1;
    c->param_bytes = c->grad_bytes = test_rng_int(r, 1, 3) * GIB;
    c->optimizer_bytes = 2 * c->grad_bytes;
    c->state_bytes = c->param_bytes + c->grad_bytes + c->optimizer_bytes;
    c->optimizer_ms = test_rng_double(r, 0.2, 4);
    c->host_optimizer_ms = test_rng_double(r, 0.5, 12);
    c->act_bytes = test_rng_int(r, 2, 8) * GIB;
    c->ckpt_bytes = c->act_bytes / 8;
    c->out_bytes = c->ckpt_bytes;
    c->workspace_bytes = GIB / 4;
    instance_attn_option(c, r);
    if (options > 1) { /* an `mlp` option: a smaller share, a cheaper recompute */
        c->n_options = 2;
        snprintf(c->options[1].name, sizeof c->options[1].name, "mlp");
        c->options[1].transient_bytes = c->act_bytes / 4;
        c->options[1].kept_bytes = c->act_bytes - c->options[1].transient_bytes;
        c->options[1].recompute_ms = c->fwd_ms * test_rng_double(r, 0.05, 0.3);
    }
}

/* S stages of `per` layers, M micro-batches, host links from slower than the layers to far
 * faster, each stage's device memory at random between what it needs with its optimizer on
 * the host and every layer recomputed and what it needs keeping everything. */
static void instance_random(struct instance *in, struct test_rng *r, int S, int per, int M,
                            enum schedule sched)
{
    instance_init(in, S * per, S, sched, M, pow(10, test_rng_double(r, 1, 4)),
                  test_rng_int(r, 4, 200) * GIB);
    int options = (int)test_rng_int(r, 1, 2);
    for (int l = 0; l < S * per; l++)
        layer_make(&in->prof.layers[l], r, options);
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
        compared += check_subsets(&in, 0, NULL, ALL_ACTIONS, &faster);
        compared += check_subsets(&in, PLAN_MIN_GAIN_DEFAULT, NULL, ALL_ACTIONS, &faster);
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
            k.v[1] += st->place[l] == COST_PLACE_HOST || st->offload_option[l] >= 0 ||
                      st->recompute[l] >= COST_OPTION;
            k.v[2] += st->recompute[l] != COST_KEEP;
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
            uses |= st->recompute[l] != COST_KEEP ? PLAN_ACTION_RECOMPUTE : 0;
            uses |= st->place[l] == COST_PLACE_HOST || st->offload_option[l] >= 0
                        ? PLAN_ACTION_OFFLOAD
                        : 0;
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

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("planning choices", NULL, NULL);
    CU_add_test(s, "a superset of actions is never slower", test_superset_never_slower);
    CU_add_test(s, "the same with --arena", test_superset_with_arena);
    CU_add_test(s, "every set of actions against brute force", test_every_set_against_brute_force);
    CU_add_test(s, "--min-gain against brute force", test_min_gain_against_brute_force);
    return test_main();
}
