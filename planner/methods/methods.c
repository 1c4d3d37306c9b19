/* The methods (docs/cost-model.md "Methods"): the baselines, the published method and
 * Ballast's own. */
#include "methods.h"
#include "offload.h"

#include "arena_fit.h"
#include "choice.h"
#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void set_block(struct plan_stage *st, int n)
{
    int count = plan_stage_layer_count(st);
    for (int l = 0; l < count; l++)
        st->actions[l].choice = l < n;
}

static int method_none(struct plan *p, const struct plan_options *o, struct err *e)
{
    (void)p, (void)o, (void)e; /* plan_init leaves every layer kept */
    return ERR_OK;
}

static int method_full(struct plan *p, const struct plan_options *o, struct err *e)
{
    (void)o, (void)e;
    for (int s = 0; s < p->n_stages; s++)
        set_block(&p->stages[s], plan_stage_layer_count(&p->stages[s]));
    return ERR_OK;
}

/* Megatron's block method: the first N layers of every stage. */
static int method_block(struct plan *p, const struct plan_options *o, struct err *e)
{
    (void)e;
    for (int s = 0; s < p->n_stages; s++)
        set_block(&p->stages[s], o->block_n);
    return ERR_OK;
}

static int method_stage_fits(const struct plan *p, const struct plan_stage *st,
                             const struct plan_options *o, struct err *e)
{
    int fits = 0;
    return choice_stage_fits(p, st->index, o, &fits, e) == ERR_OK && fits;
}

/* The least single N such that block:N makes every stage fit. */
static int method_uniform_min(struct plan *p, const struct plan_options *o, struct err *e)
{
    int most = 0;
    for (int s = 0; s < p->n_stages; s++)
        if (plan_stage_layer_count(&p->stages[s]) > most)
            most = plan_stage_layer_count(&p->stages[s]);
    for (int n = 0; n <= most; n++) {
        int all = 1;
        for (int s = 0; s < p->n_stages; s++) {
            set_block(&p->stages[s], n);
            all = all && method_stage_fits(p, &p->stages[s], o, e);
        }
        if (all)
            return ERR_OK;
        if (o->arena != NULL && e->code)
            return e->code;
    }
    return ERR_NOFIT;
}

static void scatter(struct plan *p, int s, const unsigned char *choice)
{
    int members[SCHEDULE_CHUNKS_MAX], n = method_group(p, s, members);
    for (int k = 0; k < n; k++) {
        struct plan_stage *st = &p->stages[members[k]];
        plan_stage_set_choices(st, choice);
        choice += plan_stage_layer_count(st);
    }
}

/* Stage s's group's least recompute within its limit (ties: less memory); *r_ms (if not
 * NULL) gets its recompute time. */
static int least_recompute(struct plan *p, int s, const struct plan_options *o, double *r_ms,
                           struct err *e)
{
    struct knap_problem kp;
    if (method_problem(p, s, o, &kp, e))
        return e->code;
    unsigned char *choice = malloc((size_t)kp.n + 1);
    int rc = choice == NULL ? err_set(e, ERR_FAIL, "out of memory")
                            : knap_min_recompute(&kp, choice, e);
    if (rc == ERR_OK)
        scatter(p, s, choice);
    if (r_ms != NULL && rc == ERR_OK)
        *r_ms = knap_recompute_ms(&kp, choice);
    free(choice);
    knap_free(&kp);
    return rc;
}

/* Stage s's group's recompute time closest to target_ms within its limit (ties: less
 * memory), whole layers, counted in the balancing time unit. */
static int closest_recompute(struct plan *p, int s, double target_ms,
                             const struct plan_options *o, struct err *e)
{
    struct knap_problem kp;
    if (method_problem(p, s, o, &kp, e))
        return e->code;
    double unit = knap_balance_time_unit(&kp, o->time_unit_ms);
    int64_t distance;
    unsigned char *choice = malloc((size_t)kp.n + 1);
    int rc = choice == NULL ? err_set(e, ERR_FAIL, "out of memory")
                            : knap_balance(&kp, (int64_t)llround(target_ms / unit), unit, choice,
                                           &distance, e);
    if (rc == ERR_OK)
        scatter(p, s, choice);
    free(choice);
    knap_free(&kp);
    return rc;
}

/* The published load-aware method, as published: the load M_s / limit_s with nothing
 * recomputed names the most loaded stage s* (dispatch.c; ties: the earlier); s* takes its
 * least recompute R_{s*} (0-1 knapsack, whole layers); every other stage the recompute time
 * closest to R_{s*} within its limit (ties: less memory). --reduce d first sets
 * limit_{s*} = min(capacity, d x M_{s*}(none)). */
static int method_patent(struct plan *p, const struct plan_options *o, struct err *e)
{
    int star = p->most_loaded_stage;
    struct plan_stage *st = &p->stages[star];
    double reduced = floor(o->reduce * (double)st->memory_before_bytes), r_star = 0;
    int members[SCHEDULE_CHUNKS_MAX], n = method_group(p, star, members);
    int reduce = o->reduce > 0 && reduced < (double)st->memory_limit_bytes;
    for (int k = 0; k < n && reduce; k++) /* a GPU's chunks share its limit */
        p->stages[members[k]].memory_limit_bytes = (int64_t)reduced;
    int rc = least_recompute(p, star, o, &r_star, e);
    for (int s = 0; s < p->n_stages && rc == ERR_OK; s++)
        if (s != star && method_leader(p, s) && p->stages[s].gpu != st->gpu)
            rc = closest_recompute(p, s, r_star, o, e);
    return rc;
}

/* Every stage's least recompute over the choices its layers allow (whole layers only with
 * `whole` or --whole-layers), its arena laid out with --arena, where it fits; saved with
 * each stage's fit. The simulated iteration time never decreases when a stage gets slower
 * (sim.h), so with every stage fitting this is the least iteration time with recompute only
 * and the split fixed (the split and the order are repartition.c's search). */
static int least_recompute_all(struct plan *p, const struct plan_options *o, int whole,
                               struct choice_snapshot *out, struct err *e)
{
    struct plan_options ro = *o;
    unsigned char *none = calloc((size_t)p->n_stages, 1);
    int rc = none != NULL ? ERR_OK : err_set(e, ERR_FAIL, "out of memory");
    ro.actions = PLAN_ACTION_RECOMPUTE;
    ro.whole_layers = o->whole_layers || whole;
    for (int s = 0; s < p->n_stages && rc == ERR_OK; s++) {
        int members[SCHEDULE_CHUNKS_MAX], n = method_group(p, s, members);
        if (!method_leader(p, s)) /* its GPU's first chunk chose for it */
            continue;
        rc = o->arena != NULL ? arena_least_recompute(p, s, &ro, NULL, e)
                              : least_recompute(p, s, &ro, NULL, e);
        for (int k = 0; k < n && rc == ERR_NOFIT; k++)
            none[members[k]] = 1;
        if (rc == ERR_NOFIT) {
            rc = ERR_OK;
            err_clear(e);
        }
    }
    if (rc == ERR_OK && choice_save(p, o, out, e) == ERR_OK)
        for (int s = 0; s < p->n_stages; s++) /* the search's word, not the bytes' */
            if (none[s]) {
                out->fits[s] = 0;
                out->ms = INFINITY;
            }
    free(none);
    return e->code;
}

/* The plans of every set of actions under the one asked for, each made once, smaller sets
 * first: the fastest the search finds, and the one --min-gain chooses; and the plans a set
 * may simplify to: nothing changed (base[0], without recompute), each stage's least
 * recompute (base[1]) and its least whole-layer recompute (base[2]). */
#define LATTICE_SETS (2 * PLAN_ACTION_WEIGHTS)
struct lattice {
    struct choice_snapshot fastest[LATTICE_SETS], chosen[LATTICE_SETS], base[3];
    int rc[LATTICE_SETS]; /* -1: not made */
    int n_base;
};

static int lattice_init(struct lattice *lat, struct plan *p, const struct plan_options *o,
                        struct err *e)
{
    memset(lat, 0, sizeof *lat);
    for (int a = 0; a < LATTICE_SETS; a++)
        lat->rc[a] = -1;
    /* each stage's fit judged only where a set without recompute may take it */
    int judge = o->actions != PLAN_ACTION_RECOMPUTE;
    int rc = choice_save(p, judge ? o : NULL, &lat->base[0], e);
    lat->n_base = rc == ERR_OK;
    if (rc == ERR_OK && (o->actions & PLAN_ACTION_RECOMPUTE)) {
        rc = least_recompute_all(p, o, 0, &lat->base[1], e);
        lat->n_base += rc == ERR_OK;
        if (rc == ERR_OK)
            rc = least_recompute_all(p, o, 1, &lat->base[2], e);
        lat->n_base += rc == ERR_OK;
        choice_restore(p, &lat->base[0]);
    }
    return rc;
}

static void lattice_free(struct lattice *lat)
{
    for (int a = 0; a < LATTICE_SETS; a++) {
        choice_free(&lat->fastest[a]);
        choice_free(&lat->chosen[a]);
    }
    for (int b = 0; b < lat->n_base; b++)
        choice_free(&lat->base[b]);
}

/* The search for `actions` alone: each stage's least recompute, or the action search from
 * nothing changed with the smaller sets' plans among its candidates. */
static int search_actions(struct plan *p, const struct plan_options *o, int actions,
                          struct lattice *lat, const struct choice_snapshot *const *seeds,
                          int n_seeds, struct err *e)
{
    if (actions == PLAN_ACTION_RECOMPUTE) {
        choice_restore(p, &lat->base[1]);
        return isinf(lat->base[1].ms) ? ERR_NOFIT : ERR_OK;
    }
    struct plan_options oa = *o;
    oa.actions = actions;
    choice_restore(p, &lat->base[0]);
    return offload_choose(p, &oa, seeds, n_seeds, e);
}

/* The smaller sets' plans of `actions` (of `kind`: lat->fastest or lat->chosen) that fit into
 * out; *least their fastest step. */
static int smaller_plans(struct lattice *lat, struct choice_snapshot *kind, int actions,
                         const struct choice_snapshot **out, double *least)
{
    int n = 0;
    *least = INFINITY;
    for (int b = 1; b < actions; b++)
        if ((b & actions) == b && lat->rc[b] == ERR_OK) {
            out[n++] = &kind[b];
            *least = kind[b].ms < *least ? kind[b].ms : *least;
        }
    return n;
}

/* The fastest plan of a set of actions: the search's, whose candidates include every
 * smaller set's fastest plan, so that it is never slower than any of them (with --arena,
 * where the search's plan does not fit its arena, the fastest of them). ERR_NOFIT when
 * nothing fits. */
static int fastest_plan(struct plan *p, const struct plan_options *o, int actions,
                        struct lattice *lat, struct err *e)
{
    const struct choice_snapshot *seeds[LATTICE_SETS];
    double least;
    int n = smaller_plans(lat, lat->fastest, actions, seeds, &least);
    int rc = search_actions(p, o, actions, lat, seeds, n, e);
    struct choice_snapshot *mine = &lat->fastest[actions];
    if (rc == ERR_OK && choice_save(p, o, mine, e))
        return e->code;
    if ((rc == ERR_NOFIT || !(mine->ms <= least)) && n > 0) { /* a smaller set's, then */
        choice_free(mine);
        for (int i = 0; i < n; i++)
            if (seeds[i]->ms == least)
                choice_restore(p, seeds[i]);
        err_clear(e);
        return choice_save(p, NULL, mine, e);
    }
    if (rc == ERR_OK && isinf(mine->ms))
        rc = ERR_NOFIT; /* a stage's arena does not fit: dispatch.c says which */
    return rc;
}

/* From the fastest plan of a set of actions, the simplest within --min-gain of it and no
 * slower than any smaller set's choice (choice.h): exact where every combination can be
 * tried (offload_simplest), else by taking the alternatives' choices stage by stage (the
 * smaller sets' plans and each stage's least recompute, whole layers or not, or nothing
 * changed). */
static int simplest_plan(struct plan *p, const struct plan_options *o, int actions,
                         struct lattice *lat, struct err *e)
{
    const struct choice_snapshot *alts[2 * LATTICE_SETS + 3];
    double least, ignored, fastest = lat->fastest[actions].ms;
    int n = smaller_plans(lat, lat->chosen, actions, alts, &least), done = 0;
    n += smaller_plans(lat, lat->fastest, actions, alts + n, &ignored);
    for (int b = 0; b < lat->n_base; b++) /* with recompute, each stage's least; else none */
        if ((b > 0) == ((actions & PLAN_ACTION_RECOMPUTE) != 0))
            alts[n++] = &lat->base[b];
    struct plan_options oa = *o;
    oa.actions = actions;
    double from = o->gain_from_ms > 0 && o->gain_from_ms < fastest ? o->gain_from_ms : fastest;
    double cap = choice_cap(from, o->min_gain);
    cap = cap < least ? cap : least;
    choice_restore(p, &lat->fastest[actions]);
    /* offload_simplest simulates each stage as a GPU of its own with a fused backward: 1f1b's
     * and gpipe's stages (the only ones that offload) */
    int plain = p->schedule == SCHEDULE_1F1B || p->schedule == SCHEDULE_GPIPE;
    if (o->arena == NULL && plain && offload_simplest(p, &oa, cap, &done, e))
        return e->code;
    return done ? ERR_OK : choice_simplify(p, o, alts, n, cap, e);
}

/* `actions` less `bit`: a fraction of the optimizer, and streamed weights, go with the
 * whole optimizer. */
static int smaller_set(int actions, int bit)
{
    int less = actions & ~bit;
    return less & PLAN_ACTION_OPTIMIZER
               ? less
               : less & ~(PLAN_ACTION_OPTIMIZER_FRACTION | PLAN_ACTION_WEIGHTS);
}

/* A set of actions' fastest plan and --min-gain's choice, the smaller sets' first. */
static int lattice_plan(struct plan *p, const struct plan_options *o, int actions,
                        struct lattice *lat, struct err *e)
{
    int rc;
    if (lat->rc[actions] >= 0)
        return lat->rc[actions];
    for (int bit = 1; bit < LATTICE_SETS; bit <<= 1)
        if ((actions & bit) && actions != bit &&
            (rc = lattice_plan(p, o, smaller_set(actions, bit), lat, e)) != ERR_OK &&
            rc != ERR_NOFIT)
            return rc;
    err_clear(e);
    rc = fastest_plan(p, o, actions, lat, e);
    if (rc == ERR_OK && o->min_gain > 0)
        rc = simplest_plan(p, o, actions, lat, e);
    if (rc == ERR_OK)
        rc = choice_save(p, NULL, &lat->chosen[actions], e);
    return lat->rc[actions] = rc;
}

/* Ballast's own with the split fixed: the least simulated iteration time over every action
 * --actions allows, each stage within its device and host memory, or the simplest plan
 * within --min-gain of it (lattice_plan). */
static int method_optimal(struct plan *p, const struct plan_options *o, struct err *e)
{
    struct lattice lat;
    int rc = lattice_init(&lat, p, o, e);
    if (rc == ERR_OK)
        rc = lattice_plan(p, o, o->actions, &lat, e);
    if (rc == ERR_OK) {
        const struct choice_snapshot *chosen = &lat.chosen[o->actions];
        double fastest = lat.fastest[o->actions].ms;
        choice_restore(p, chosen);
        p->min_gain = o->min_gain;
        p->fastest_ms = chosen->ms > choice_cap(fastest, 0) ? fastest : 0;
    }
    lattice_free(&lat);
    return rc;
}

static const struct method methods[] = {
    {METHOD_NONE, "none", method_none, 0},
    {METHOD_FULL, "full", method_full, 0},
    {METHOD_BLOCK, "block", method_block, 0},
    {METHOD_UNIFORM_MIN, "uniform-min", method_uniform_min, 0},
    {METHOD_PATENT, "patent", method_patent, 1},
    {METHOD_OPTIMAL, "optimal", method_optimal, 1},
};

const struct method *method_find(enum plan_method id)
{
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (methods[i].id == id)
            return &methods[i];
    return NULL;
}

const struct method *method_named(const char *name)
{
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (strcmp(methods[i].name, name) == 0)
            return &methods[i];
    return NULL;
}

const char *plan_method_name(const struct plan_options *o, char buf[PLAN_METHOD_MAX])
{
    const struct method *m = method_find(o->method);
    if (m == NULL)
        return "?";
    if (o->method != METHOD_BLOCK)
        return m->name;
    snprintf(buf, PLAN_METHOD_MAX, "block:%d", o->block_n);
    return buf;
}
