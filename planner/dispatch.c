/* Validation and dispatch: the options are checked here once; a plan is laid out from the
 * cluster, its method (methods.c) chooses, --verify checks in a pass of its own, and the plan
 * is costed and simulated. Searches (repartition.c, microbatch.c) hand back arrangements
 * that this file turns into plans. */
#include "planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arena_fit.h"
#include "choice.h"
#include "framework.h"
#include "plan_layout.h"
#include "methods.h"
#include "microbatch.h"
#include "model_ops.h"
#include "nofit.h"
#include "offload.h"
#include "repartition.h"
#include "sim.h"
#include "verify.h"

void plan_options_default(struct plan_options *o)
{
    *o = (struct plan_options){.method = METHOD_OPTIMAL,
                               .actions = PLAN_ACTION_RECOMPUTE,
                               .unit_bytes = PLAN_UNIT_DEFAULT,
                               .time_unit_ms = PLAN_TIME_UNIT_DEFAULT_MS,
                               .search_nodes = PLAN_SEARCH_NODES_DEFAULT,
                               .search_gap = PLAN_SEARCH_GAP_DEFAULT,
                               .min_gain = PLAN_MIN_GAIN_DEFAULT};
}

int plan_method_parse(const char *text, struct plan_options *o, struct err *e)
{
    const struct method *m = method_named(text);
    if (m != NULL && m->id != METHOD_BLOCK) {
        o->method = m->id;
        return ERR_OK;
    }
    if (strcmp(text, "optimal+repartition") == 0) {
        o->method = METHOD_OPTIMAL;
        o->repartition = 1;
        return ERR_OK;
    }
    if (strncmp(text, "block:", 6) == 0) {
        char *end;
        long n = strtol(text + 6, &end, 10);
        if (end != text + 6 && *end == '\0' && n >= 0 && n <= 1 << 20) {
            o->method = METHOD_BLOCK;
            o->block_n = (int)n;
            return ERR_OK;
        }
    }
    return err_set(e, ERR_INPUT,
                   "--method: \"%s\", expected none, full, block:N (N >= 0), uniform-min, patent, "
                   "optimal or optimal+repartition",
                   text);
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

int plan_options_check(const struct plan_options *o, struct err *e)
{
    char name[PLAN_METHOD_MAX];
    const struct method *m = method_find(o->method);
    if (m == NULL)
        return err_set(e, ERR_INPUT, "plan options: unknown method %d", (int)o->method);
    if (o->unit_bytes < 1 || !(o->time_unit_ms > 0) || !(o->reduce >= 0 && o->reduce <= 1) ||
        o->block_n < 0 || o->search_nodes < 1 || !(o->time_limit_s >= 0) ||
        !(o->search_gap >= 0 && o->search_gap < 1))
        return err_set(e, ERR_INPUT,
                       "plan options: unit %lld bytes, time unit %g ms, reduce %g, block %d, "
                       "search nodes %ld, time limit %g s, search gap %g: expected unit >= 1, "
                       "time unit > 0, 0 <= reduce <= 1, block >= 0, search nodes >= 1, time "
                       "limit >= 0, 0 <= search gap < 1",
                       (long long)o->unit_bytes, o->time_unit_ms, o->reduce, o->block_n,
                       o->search_nodes, o->time_limit_s, o->search_gap);
    if (!(o->min_gain >= 0 && o->min_gain < 1))
        return err_set(e, ERR_INPUT, "--min-gain: %g, expected a fraction of the step in [0, 1)",
                       o->min_gain);
    if (o->repartition && o->method != METHOD_OPTIMAL)
        return err_set(e, ERR_INPUT, "--repartition applies to --method optimal only");
    if (o->whole_layers && o->method != METHOD_OPTIMAL)
        return err_set(e, ERR_INPUT, "--whole-layers applies to --method optimal only (the "
                                     "other methods recompute whole layers anyway)");
    if (offload_options_check(o, e))
        return e->code;
    if (o->reduce > 0 && o->method != METHOD_PATENT)
        return err_set(e, ERR_INPUT, "--reduce applies to --method patent only");
    if (o->verify && o->arena != NULL)
        return err_set(e, ERR_INPUT, "--verify checks the knapsack on the slots carving; with "
                                     "--arena the choice is checked against brute force in the "
                                     "tests instead");
    if (o->verify && !m->knapsack)
        return err_set(e, ERR_INPUT,
                       "--verify checks the knapsack methods (patent, optimal); method %s "
                       "solves no optimisation",
                       plan_method_name(o, name));
    return ERR_OK;
}

/* Load M_s / limit_s with nothing recomputed; ties go to the earlier stage. */
static int most_loaded(const struct plan *p)
{
    int star = 0;
    for (int s = 1; s < p->n_stages; s++) {
        const struct plan_stage *a = &p->stages[s], *b = &p->stages[star];
        if ((__int128)a->memory_before_bytes * b->memory_limit_bytes >
            (__int128)b->memory_before_bytes * a->memory_limit_bytes)
            star = s;
    }
    return star;
}

/* Stage s as the cluster gives it, nothing recomputed yet. */
static void stage_layout(const struct cluster *c, struct plan *p, int s)
{
    struct plan_stage *st = &p->stages[s];
    const struct profile *prof = cluster_stage_profile(c, s);
    snprintf(st->device, sizeof st->device, "%s", c->stages[s].device);
    snprintf(st->device_kind, sizeof st->device_kind, "%s", prof->device.kind);
    memcpy(st->layers, prof->layers + st->first,
           (size_t)plan_stage_layer_count(st) * sizeof *st->layers);
    st->in_flight = schedule_in_flight(c->schedule, c->n_stages, s, c->micro_batches);
    st->capacity_bytes = c->stages[s].memory_bytes;
    st->memory_limit_bytes = st->capacity_bytes;
    if (s + 1 < c->n_stages)
        st->link = cluster_link(c, s);
    st->host_limit_bytes = c->stages[s].host_memory_bytes;
    st->host_link = c->stages[s].host_link;
    st->tp = c->stages[s].tp;
    st->dp = c->stages[s].dp;
    st->shard_optimizer = c->shard_optimizer && st->dp > 1; /* its layer costs divide it */
    if (c->grad_bytes != NULL) {
        st->dp_link = c->stages[s].dp_link;
        st->allreduce_bytes = cluster_grad_bytes(c, s, st->first, st->last);
        st->dp_bucket_bytes = c->dp_bucket_bytes;
    }
    struct stage_cost before;
    plan_stage_cost(p, st, &before);
    st->memory_before_bytes = before.memory_bytes;
}

/* What the stages' profiles assume (framework.h fw_profile_assumptions): "mixed" activations
 * when they differ. */
static void plan_assumptions(const struct cluster *c, struct plan *p)
{
    for (int s = 0; s < c->n_stages; s++) {
        char acts[PLAN_FRAMEWORK_MAX];
        enum model_attention att;
        fw_profile_assumptions(cluster_stage_profile(c, s), acts, &att);
        if (s == 0) {
            snprintf(p->framework.activations, sizeof p->framework.activations, "%s", acts);
            p->framework.attention = att;
        } else if (!fw_activations_alike(acts, p->framework.activations) ||
                   att != p->framework.attention) {
            snprintf(p->framework.activations, sizeof p->framework.activations, "mixed");
        }
    }
}

int plan_layout(const struct cluster *c, const struct plan_options *o, struct plan *out,
                struct err *e)
{
    int S = c->n_stages;
    int *first = malloc((size_t)S * sizeof *first), *last = malloc((size_t)S * sizeof *last);
    int rc = first && last ? ERR_OK : err_set(e, ERR_FAIL, "out of memory");
    for (int s = 0; s < S && rc == ERR_OK; s++) {
        first[s] = c->stages[s].first;
        last[s] = c->stages[s].last;
    }
    if (rc == ERR_OK)
        rc = plan_init(out, S, first, last, e);
    free(first);
    free(last);
    if (rc)
        return rc;
    char name[PLAN_METHOD_MAX];
    snprintf(out->method, sizeof out->method, "%s", plan_method_name(o, name));
    out->schedule = c->schedule;
    out->micro_batches = c->micro_batches;
    out->reserve_bytes = c->reserve_bytes;
    out->unit_bytes = o->unit_bytes;
    out->model = c->model;
    for (int s = 0; s < S; s++)
        stage_layout(c, out, s);
    out->most_loaded_stage = most_loaded(out);
    plan_assumptions(c, out);
    return ERR_OK;
}

int planner_finish(struct plan *p, struct err *e)
{
    p->bottleneck_stage = 0;
    for (int s = 0; s < p->n_stages; s++) {
        struct plan_stage *st = &p->stages[s];
        struct stage_cost cost;
        plan_stage_cost(p, st, &cost);
        st->memory_bytes = cost.memory_bytes;
        st->recompute_ms = cost.recompute_ms;
        st->stage_ms = cost.stage_ms;
        st->host_memory_bytes = cost.host_memory_bytes;
        st->staging_bytes = cost.staging_bytes;
        st->copy_ms = plan_stage_copy_ms(st);
        if (st->stage_ms > p->stages[p->bottleneck_stage].stage_ms)
            p->bottleneck_stage = s;
    }
    struct sim_result sim;
    if (sim_plan(p, &sim, e))
        return e->code;
    p->iteration_ms = sim.iteration_ms;
    sim_result_free(&sim);
    return ERR_OK;
}

static int all_fit(const struct plan *p, const struct plan_options *o, struct err *e)
{
    for (int s = 0; s < p->n_stages; s++) {
        int fits = 0;
        if (o->arena != NULL && (arena_stage_fits(p, s, o->arena, &fits, e) || !fits))
            return 0;
        if (o->arena != NULL)
            continue;
        struct stage_cost c;
        plan_stage_cost(p, &p->stages[s], &c);
        if (c.memory_bytes > p->stages[s].memory_limit_bytes)
            return 0;
    }
    return 1;
}

/* The plan of the cluster's own order and split: layout, method, fit, verify, finish. */
static int plan_fixed(const struct cluster *c, const struct plan_options *o, struct plan *out,
                      struct err *e)
{
    if (plan_layout(c, o, out, e))
        return e->code;
    int rc = method_find(o->method)->choose(out, o, e);
    /* patent chooses on the slots carving even with --arena: its refusal is explained there */
    int on_arena = o->arena != NULL && (rc == ERR_OK || o->method != METHOD_PATENT);
    if (rc == ERR_OK && !all_fit(out, o, e))
        rc = e->code ? e->code : ERR_NOFIT;
    if (rc == ERR_NOFIT) /* a knapsack that finds nothing says nothing: this says why */
        rc = on_arena ? arena_nofit_report(out, o->arena, e) : nofit_report(out, o, e);
    if (rc == ERR_OK && o->verify)
        rc = verify_plan(out, o, e);
    if (rc == ERR_OK)
        rc = planner_finish(out, e);
    if (rc)
        plan_free(out);
    return rc;
}

int arranged_cluster(const struct cluster *c, const struct arrangement *a, struct cluster *out,
                     struct err *e)
{
    *out = *c;
    out->stages = calloc((size_t)a->n_stages, sizeof *out->stages);
    if (out->stages == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int k = 0; k < a->n_stages; k++) {
        out->stages[k] = c->stages[a->stage[k]];
        out->stages[k].first = a->first[k];
        out->stages[k].last = k + 1 < a->n_stages ? a->first[k + 1] - 1 : c->n_layers - 1;
        out->stages[k].link = k + 1 < a->n_stages ? a->link[k] : (struct link){0};
    }
    out->link = (struct link){0};
    return ERR_OK;
}

/* No order and split fits (with recompute only): say why with the cluster's own split. With
 * offload that split may fit by offloading: then it is the plan (no search attached). */
static int repartition_nofit(const struct cluster *c, const struct plan_options *fixed,
                             struct plan *out, struct err *e)
{
    err_clear(e);
    if (plan_fixed(c, fixed, out, e) == ERR_OK) {
        snprintf(out->method, sizeof out->method, "optimal+repartition");
        if (fixed->actions != PLAN_ACTION_RECOMPUTE)
            return ERR_OK;
        plan_free(out);
        return err_set(e, ERR_FAIL,
                       "repartitioning found no split although the cluster's own fits");
    }
    if (e->code == ERR_NOFIT)
        err_append(e, "  and no other split of the layers or order of the device kinds fits "
                      "%s",
                   fixed->actions == PLAN_ACTION_RECOMPUTE ? "either" : "with recompute only");
    return e->code;
}

/* Whether any stage sends activations or its optimizer to host memory. */
static int plan_uses_host(const struct plan *p)
{
    int any = 0;
    for (int s = 0; s < p->n_stages; s++)
        any |= plan_stage_offloads(&p->stages[s]) || p->stages[s].optimizer == COST_PLACE_HOST;
    return any;
}

/* The fastest step behind plan p: its own, or the faster one it was chosen over. */
static double plan_fastest(const struct plan *p)
{
    return p->fastest_ms > 0 && p->fastest_ms < p->iteration_ms ? p->fastest_ms
                                                                 : p->iteration_ms;
}

/* --repartition: the search's arrangement, planned; with what was searched and the certified
 * gap. With offload the search picks the split and order with recompute only and each stage's
 * actions are then chosen with offload on them: never slower than the recompute-only plan of
 * that arrangement (methods.c), which is --repartition's plan without offload. The search's
 * bound holds for recompute only, so a plan that offloads (or hosts an optimizer) carries no
 * search or gap. The optimizer on the host is chosen the same way, per stage, after the
 * search. With --min-gain the arrangement is the search's simplest within the margin and the
 * actions' margin is measured from the fastest split found (one margin, not two); the gap is
 * still the plan's own step against the certified bound, and fastest_ms the fastest found. */
static int plan_repartitioned(const struct cluster *c, const struct plan_options *o,
                              struct plan *out, struct err *e)
{
    struct plan_options fixed = *o, searched = *o;
    struct arrangement a;
    struct plan_search found;
    struct cluster arranged;
    fixed.repartition = 0;
    searched.actions = PLAN_ACTION_RECOMPUTE;
    int rc = repartition_search(c, &searched, &a, &found, e);
    if (rc == ERR_NOFIT && found.present) { /* under the cutoff: only what was searched */
        memset(out, 0, sizeof *out);
        out->search = found;
        return rc;
    }
    if (rc == ERR_NOFIT)
        return repartition_nofit(c, &fixed, out, e);
    if (rc)
        return rc;
    rc = arranged_cluster(c, &a, &arranged, e);
    arrangement_free(&a);
    if (rc)
        return rc;
    fixed.gain_from_ms = found.fastest_ms; /* one margin, not one per split */
    rc = plan_fixed(&arranged, &fixed, out, e);
    free(arranged.stages);
    if (rc)
        return rc;
    double fastest = found.fastest_ms < plan_fastest(out) ? found.fastest_ms : plan_fastest(out);
    out->fastest_ms = out->iteration_ms > choice_cap(fastest, 0) ? fastest : 0;
    snprintf(out->method, sizeof out->method, "optimal+repartition");
    if (plan_uses_host(out))
        return ERR_OK;
    double bound = found.lower_bound;
    out->optimality_gap = bound > 0 ? (out->iteration_ms - bound) / bound : 0;
    if (out->optimality_gap < 0)
        out->optimality_gap = 0;
    out->search = found;
    return ERR_OK;
}

int planner_make(const struct cluster *c, const struct plan_options *o, struct plan *out,
                 struct err *e)
{
    if (plan_options_check(o, e))
        return e->code;
    if ((o->actions & (PLAN_ACTION_OFFLOAD | PLAN_ACTION_OPTIMIZER)) &&
        cluster_check_host_memory(c, e))
        return e->code;
    if (!framework_is_ballast(o->framework))
        return plan_for_framework(c, o, out, e);
    return o->repartition ? plan_repartitioned(c, o, out, e) : plan_fixed(c, o, out, e);
}

int64_t plan_memory(const struct plan *p)
{
    int64_t memory = 0;
    for (int s = 0; s < p->n_stages; s++)
        memory += p->stages[s].memory_bytes;
    return memory;
}

/* Plans micro-batch size b, M of them; ERR_NOFIT and ERR_INPUT (a size too large) in *rc,
 * not in e. */
static int plan_micro_batch(const struct cluster *c, const struct plan_options *o,
                            const struct device_table *t, int M, int b,
                            struct microbatch_notes *notes, struct plan *p, struct err *inner,
                            struct err *e)
{
    struct cluster cb;
    err_clear(inner);
    int rc = microbatch_cluster(c, t, o->estimate, b, M, &cb, notes, inner);
    if (rc == ERR_OK) {
        rc = planner_make(&cb, o, p, inner);
        microbatch_cluster_free(&cb, c->n_profiles);
    }
    if (rc && rc != ERR_NOFIT && rc != ERR_INPUT)
        err_set(e, rc, "%s", inner->msg);
    return rc;
}

int planner_make_auto(const struct cluster *c, const struct plan_options *o, int global_batch,
                      FILE *report, struct plan *out, struct err *e)
{
    struct device_table t;
    struct microbatch_notes notes = {0};
    struct err inner, refused; /* refused: the first size the planner refused as input */
    int found = 0, all_refused = 1;
    err_clear(&refused);
    if (plan_options_check(o, e))
        return e->code;
    if (model_ops_of(&c->model) == NULL)
        return err_set(e, ERR_INPUT,
                       "--micro-batches auto: the model is custom (\"%s\"): its profiles hold "
                       "one micro-batch size and Ballast has no size functions to rescale them "
                       "(profile each size and plan each)",
                       c->model.name);
    int dp = c->stages[0].dp, per_replica = global_batch / dp;
    if (global_batch % dp)
        return err_set(e, ERR_INPUT,
                       "--global-batch %d: the samples of a step across the %d data-parallel "
                       "replicas (stages' dp), so a multiple of %d",
                       global_batch, dp, dp);
    if (devices_load(devices_default_file(), &t, e))
        return e->code;
    microbatch_report_head(report, global_batch, dp);
    for (int b = 1; b <= per_replica && e->code == ERR_OK; b++) {
        struct plan p;
        if (per_replica % b)
            continue;
        int rc = plan_micro_batch(c, o, &t, per_replica / b, b, &notes, &p, &inner, e);
        if (e->code)
            break;
        if (rc == ERR_INPUT && refused.code == ERR_OK)
            err_set(&refused, ERR_INPUT, "micro-batch size %d: %s", b, inner.msg);
        all_refused &= rc == ERR_INPUT;
        microbatch_report_row(report, b, per_replica / b, rc, rc ? 0 : p.iteration_ms);
        if (rc)
            continue;
        if (found && !microbatch_better(p.iteration_ms, plan_memory(&p), out->iteration_ms,
                                        plan_memory(out))) {
            plan_free(&p);
            continue;
        }
        if (found)
            plan_free(out);
        *out = p;
        found = 1;
    }
    devices_free(&t);
    if (e->code && found)
        plan_free(out);
    if (e->code)
        return e->code;
    if (!found && all_refused && refused.code) /* every size refused: the input is wrong */
        return err_set(e, ERR_INPUT, "--micro-batches auto: %s", refused.msg);
    if (!found)
        return err_set(e, ERR_NOFIT,
                       "no micro-batch size dividing the global batch of %d (%d per replica) "
                       "fits the cluster%s%s",
                       global_batch, per_replica, refused.code ? "; " : "", refused.msg);
    microbatch_report_end(report, out, &notes);
    return ERR_OK;
}
