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

int method_group(const struct plan *p, int s, int members[SCHEDULE_CHUNKS_MAX])
{
    if (p->virtual_stages <= 1) {
        members[0] = s;
        return 1;
    }
    return plan_gpu_stages(p, p->stages[s].gpu, members);
}

int method_leader(const struct plan *p, int s)
{
    int members[SCHEDULE_CHUNKS_MAX];
    method_group(p, s, members);
    return members[0] == s;
}

/* The group's layers end to end, with each one's in-flight count and chunk (in_flight holds
 * both: the chunks from in_flight + count). */
static int group_layers(const struct plan *p, const int *members, int n,
                        struct layer_cost **layers, int **in_flight, int *count, struct err *e)
{
    int total = 0, at = 0;
    for (int k = 0; k < n; k++)
        total += plan_stage_layer_count(&p->stages[members[k]]);
    *layers = malloc((size_t)total * sizeof **layers);
    *in_flight = malloc(2 * (size_t)total * sizeof **in_flight);
    if (*layers == NULL || *in_flight == NULL) {
        free(*layers);
        free(*in_flight);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    for (int k = 0; k < n; k++) {
        const struct plan_stage *st = &p->stages[members[k]];
        for (int l = 0; l < plan_stage_layer_count(st); l++, at++) {
            (*layers)[at] = st->layers[l];
            (*in_flight)[at] = st->in_flight;
            (*in_flight)[total + at] = k;
        }
    }
    *count = total;
    return ERR_OK;
}

int method_problem(const struct plan *p, int s, const struct plan_options *o,
                   struct knap_problem *kp, struct err *e)
{
    const struct plan_stage *st = &p->stages[s];
    int options = o->method == METHOD_OPTIMAL && !o->whole_layers;
    int members[SCHEDULE_CHUNKS_MAX], n = method_group(p, s, members), count = 0;
    if (n == 1)
        return (options ? knap_build_options : knap_build)(
            kp, st->layers, plan_stage_layer_count(st), st->in_flight, p->reserve_bytes,
            st->memory_limit_bytes, o->unit_bytes, e);
    struct layer_cost *layers;
    int *in_flight;
    if (group_layers(p, members, n, &layers, &in_flight, &count, e))
        return e->code;
    int rc = knap_build_each(kp, layers, count, in_flight, in_flight + count, p->reserve_bytes,
                             st->memory_limit_bytes, o->unit_bytes, options, e);
    free(layers);
    free(in_flight);
    return rc;
}

void method_gather(const struct plan *p, int s, unsigned char *choice)
{
    int members[SCHEDULE_CHUNKS_MAX], n = method_group(p, s, members);
    for (int k = 0; k < n; k++) {
        const struct plan_stage *st = &p->stages[members[k]];
        memcpy(choice, st->recompute, (size_t)plan_stage_layer_count(st));
        choice += plan_stage_layer_count(st);
    }
}

static void scatter(struct plan *p, int s, const unsigned char *choice)
{
    int members[SCHEDULE_CHUNKS_MAX], n = method_group(p, s, members);
    for (int k = 0; k < n; k++) {
        struct plan_stage *st = &p->stages[members[k]];
        memcpy(st->recompute, choice, (size_t)plan_stage_layer_count(st));
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

/* Ballast's own with the split fixed: every stage its least recompute over every choice its
 * layers allow (whole layers with --whole-layers). The simulated iteration time never
 * decreases when a stage gets slower (sim.h), so this is the least iteration time; the split
 * and the order are repartition.c's search. */
static int optimal_recompute(struct plan *p, const struct plan_options *o, struct err *e)
{
    int rc = ERR_OK;
    for (int s = 0; s < p->n_stages && rc == ERR_OK; s++)
        if (method_leader(p, s))
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

static int method_optimal(struct plan *p, const struct plan_options *o, struct err *e)
{
    if (o->actions == PLAN_ACTION_RECOMPUTE)
        return optimal_recompute(p, o, e);
    if (!(o->actions & PLAN_ACTION_RECOMPUTE))
        return offload_choose(p, o, e);
    return optimal_with_offload(p, o, e);
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
