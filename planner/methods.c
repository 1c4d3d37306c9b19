/* The methods (DESIGN.md "Methods"): the baselines, the published method and Ballast's own. */
#include "methods.h"
#include "offload.h"

#include "arena_fit.h"
#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void set_block(struct plan_stage *st, int n)
{
    int count = plan_stage_layer_count(st);
    for (int l = 0; l < count; l++)
        st->recompute[l] = l < n;
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

static int stage_fits(const struct plan *p, const struct plan_stage *st,
                      const struct plan_options *o, struct err *e)
{
    int fits = 0;
    if (o->arena != NULL)
        return arena_stage_fits(p, st->index, o->arena, &fits, e) == ERR_OK && fits;
    struct stage_cost c;
    plan_stage_cost(p, st, &c);
    return c.memory_bytes <= st->memory_limit_bytes;
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
            all = all && stage_fits(p, &p->stages[s], o, e);
        }
        if (all)
            return ERR_OK;
        if (o->arena != NULL && e->code)
            return e->code;
    }
    return ERR_NOFIT;
}

int method_problem(const struct plan *p, int s, const struct plan_options *o,
                   struct knap_problem *kp, struct err *e)
{
    const struct plan_stage *st = &p->stages[s];
    int options = o->method == METHOD_OPTIMAL && !o->whole_layers;
    return (options ? knap_build_options : knap_build)(
        kp, st->layers, plan_stage_layer_count(st), st->in_flight, p->reserve_bytes,
        st->memory_limit_bytes, o->unit_bytes, e);
}

/* Stage s's least recompute within its limit (ties: less memory); *r_ms (if not NULL) gets
 * its recompute time. */
static int least_recompute(struct plan *p, int s, const struct plan_options *o, double *r_ms,
                           struct err *e)
{
    struct knap_problem kp;
    if (method_problem(p, s, o, &kp, e))
        return e->code;
    int rc = knap_min_recompute(&kp, p->stages[s].recompute, e);
    if (r_ms != NULL)
        *r_ms = knap_recompute_ms(&kp, p->stages[s].recompute);
    knap_free(&kp);
    return rc;
}

/* Stage s's recompute time closest to target_ms within its limit (ties: less memory), whole
 * layers, counted in the balancing time unit. */
static int closest_recompute(struct plan *p, int s, double target_ms,
                             const struct plan_options *o, struct err *e)
{
    struct knap_problem kp;
    if (method_problem(p, s, o, &kp, e))
        return e->code;
    double unit = knap_balance_time_unit(&kp, o->time_unit_ms);
    int64_t distance;
    int rc = knap_balance(&kp, (int64_t)llround(target_ms / unit), unit,
                          p->stages[s].recompute, &distance, e);
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
    if (o->reduce > 0 && reduced < (double)st->memory_limit_bytes)
        st->memory_limit_bytes = (int64_t)reduced;
    int rc = least_recompute(p, star, o, &r_star, e);
    for (int s = 0; s < p->n_stages && rc == ERR_OK; s++)
        if (s != star)
            rc = closest_recompute(p, s, r_star, o, e);
    return rc;
}

/* Ballast's own with the split fixed: every stage its least recompute over every choice its
 * layers allow (whole layers with --whole-layers). The simulated iteration time never
 * decreases when a stage gets slower (sim.h), so this is the least iteration time; the split
 * and the order are repartition.c's search. */
static int optimal_recompute(struct plan *p, const struct plan_options *o, struct err *e)
{
    int rc = ERR_OK;
    for (int s = 0; s < p->n_stages && rc == ERR_OK; s++)
        rc = o->arena != NULL ? arena_least_recompute(p, s, o, NULL, e)
                              : least_recompute(p, s, o, NULL, e);
    return rc;
}

/* Whether the offload search's plan beats the recompute-only one saved in f: simulated
 * faster, and with --arena every stage's arena fits (the search chose without it). */
static int offload_wins(const struct plan *p, const struct plan_options *o,
                        const struct offload_fallback *f, int *wins, struct err *e)
{
    struct sim_result r;
    if (sim_plan(p, &r, e))
        return e->code;
    *wins = r.iteration_ms < f->iteration_ms;
    sim_result_free(&r);
    for (int s = 0; s < p->n_stages && *wins && o->arena != NULL; s++)
        if (arena_stage_fits(p, s, o->arena, wins, e))
            return e->code;
    return ERR_OK;
}

/* Recompute and offload: the offload search's plan, or the recompute-only plan where that
 * is no slower (or the search found nothing), so that a superset of actions never gives a
 * slower plan, however the search bounded its candidates. */
static int optimal_with_offload(struct plan *p, const struct plan_options *o, struct err *e)
{
    struct plan_options ro = *o;
    struct offload_fallback f;
    int wins = 0;
    ro.actions = PLAN_ACTION_RECOMPUTE;
    int rc = optimal_recompute(p, &ro, e);
    if (rc == ERR_NOFIT) { /* the search may fit by offloading */
        err_clear(e);
        return offload_choose(p, o, e);
    }
    if (rc || offload_fallback_save(p, &f, e))
        return e->code ? e->code : rc;
    rc = offload_choose(p, o, e);
    if (rc == ERR_OK)
        rc = offload_wins(p, o, &f, &wins, e);
    if (rc == ERR_NOFIT)
        err_clear(e);
    if (rc == ERR_NOFIT || (rc == ERR_OK && !wins)) {
        offload_fallback_restore(p, &f);
        rc = ERR_OK;
    }
    offload_fallback_free(&f);
    return rc;
}

static int optimal_actions(struct plan *p, const struct plan_options *o, struct err *e)
{
    if (o->actions == PLAN_ACTION_RECOMPUTE)
        return optimal_recompute(p, o, e);
    if (!(o->actions & PLAN_ACTION_RECOMPUTE))
        return offload_choose(p, o, e);
    return optimal_with_offload(p, o, e);
}

/* Every stage's actions, kept while another search runs on the same plan. */
struct snapshot {
    unsigned char *recompute, *place;
    signed char *option;
    int *ahead, *from;
    enum cost_place *optimizer;
};

static void snapshot_free(struct snapshot *k)
{
    free(k->recompute);
    free(k->place);
    free(k->option);
    free(k->ahead);
    free(k->from);
    free(k->optimizer);
}

static int snapshot_take(const struct plan *p, struct snapshot *k, struct err *e)
{
    size_t L = 0, S = (size_t)p->n_stages;
    for (int s = 0; s < p->n_stages; s++)
        L += (size_t)plan_stage_layer_count(&p->stages[s]);
    *k = (struct snapshot){malloc(L), malloc(L), malloc(L), malloc(L * sizeof(int)),
                           malloc(S * sizeof(int)), malloc(S * sizeof(enum cost_place))};
    if (!k->recompute || !k->place || !k->option || !k->ahead || !k->from || !k->optimizer) {
        snapshot_free(k);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    for (size_t s = 0, at = 0; s < S; s++) {
        const struct plan_stage *st = &p->stages[s];
        size_t n = (size_t)plan_stage_layer_count(st);
        memcpy(k->recompute + at, st->recompute, n);
        memcpy(k->place + at, st->place, n);
        memcpy(k->option + at, st->offload_option, n);
        memcpy(k->ahead + at, st->prefetch_ahead, n * sizeof(int));
        k->optimizer[s] = st->optimizer;
        k->from[s] = st->optimizer_from;
        at += n;
    }
    return ERR_OK;
}

static void snapshot_put(struct plan *p, const struct snapshot *k)
{
    for (size_t s = 0, at = 0; s < (size_t)p->n_stages; s++) {
        struct plan_stage *st = &p->stages[s];
        size_t n = (size_t)plan_stage_layer_count(st);
        memcpy(st->recompute, k->recompute + at, n);
        memcpy(st->place, k->place + at, n);
        memcpy(st->offload_option, k->option + at, n);
        memcpy(st->prefetch_ahead, k->ahead + at, n * sizeof(int));
        st->optimizer = k->optimizer[s];
        st->optimizer_from = k->from[s];
        at += n;
    }
}

/* Every stage as laid out: nothing recomputed or offloaded, the optimizer on the device
 * (what the searches start from). */
static void clear_choices(struct plan *p)
{
    for (int s = 0; s < p->n_stages; s++) {
        struct plan_stage *st = &p->stages[s];
        size_t n = (size_t)plan_stage_layer_count(st);
        memset(st->recompute, COST_KEEP, n);
        memset(st->place, COST_PLACE_DEVICE, n);
        memset(st->offload_option, -1, n);
        memset(st->prefetch_ahead, 0, n * sizeof *st->prefetch_ahead);
        st->optimizer = COST_PLACE_DEVICE;
        st->optimizer_from = 0;
    }
}

static int simulated_ms(const struct plan *p, double *ms, struct err *e)
{
    struct sim_result r;
    if (sim_plan(p, &r, e))
        return e->code;
    *ms = r.iteration_ms;
    sim_result_free(&r);
    return ERR_OK;
}

/* --actions ...,optimizer-fraction: the plan with whole optimizers on the host or none
 * (--actions ...,optimizer's), then the search with the fractions too, kept only where it
 * simulates faster: a fraction never gives a slower plan than the whole optimizer. */
static int optimal_with_fraction(struct plan *p, const struct plan_options *o, struct err *e)
{
    struct plan_options whole = *o;
    struct snapshot k;
    double before = INFINITY, after = INFINITY;
    whole.actions &= ~PLAN_ACTION_OPTIMIZER_FRACTION;
    int rc = optimal_actions(p, &whole, e);
    if (rc == ERR_NOFIT) { /* a fraction on the host may fit where neither place did */
        err_clear(e);
        clear_choices(p);
        return optimal_actions(p, o, e);
    }
    if (rc || simulated_ms(p, &before, e) || snapshot_take(p, &k, e))
        return e->code ? e->code : rc;
    clear_choices(p);
    rc = optimal_actions(p, o, e);
    if (rc == ERR_OK)
        rc = simulated_ms(p, &after, e);
    if (rc == ERR_NOFIT) {
        err_clear(e);
        rc = ERR_OK;
    }
    if (rc == ERR_OK && !(after < before))
        snapshot_put(p, &k);
    snapshot_free(&k);
    return rc;
}

static int method_optimal(struct plan *p, const struct plan_options *o, struct err *e)
{
    if (o->actions & PLAN_ACTION_OPTIMIZER_FRACTION)
        return optimal_with_fraction(p, o, e);
    return optimal_actions(p, o, e);
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
