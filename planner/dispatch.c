/* Validation and dispatch: the options are checked here once; a plan is laid out from the
 * cluster (plan_layout.c), its method (methods.c) chooses, --verify checks in a pass of its
 * own, and the plan is costed and simulated (plan_finish.c). Searches (repartition.c,
 * microbatch.c) hand back arrangements that this file turns into plans. */
#include "planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arena_fit.h"
#include "choice.h"
#include "clock.h"
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
                               .min_gain = PLAN_MIN_GAIN_DEFAULT,
                               .schedule = -1};
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
                              struct plan *out, struct cluster *arranged_out, struct err *e)
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
    if (rc == ERR_OK && arranged_out != NULL)
        *arranged_out = arranged; /* the caller frees its stages */
    else
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

int planner_schedule_candidates(int virtual_stages, struct schedule_shape out[PLAN_SCHEDULES_MAX])
{
    static const enum schedule kinds[] = {SCHEDULE_1F1B, SCHEDULE_GPIPE, SCHEDULE_ZB_H1,
                                          SCHEDULE_V_HALF};
    int n = 0;
    for (int k = 0; k < 4; k++)
        out[n++] = schedule_shape_of(kinds[k], 0, schedule_fixed_chunks(kinds[k], 1), 0);
    for (int v = 2; v <= 4; v++)
        if (virtual_stages == 0 || virtual_stages == v)
            out[n++] = schedule_shape_of(SCHEDULE_INTERLEAVED, 0, v, 0);
    return n;
}

/* The schedule --schedule and --virtual-stages, or the cluster, ask for. */
static struct schedule_shape asked_shape(const struct cluster *c, const struct plan_options *o,
                                         struct err *e)
{
    enum schedule kind = o->schedule >= 0 ? (enum schedule)o->schedule : c->schedule;
    int v = o->virtual_stages > 0 ? o->virtual_stages : c->virtual_stages;
    if (o->virtual_stages > 0 && kind != SCHEDULE_INTERLEAVED)
        err_set(e, ERR_INPUT, "--virtual-stages %d: schedule %s holds %d model chunk%s a GPU "
                "(virtual stages are interleaved's)", o->virtual_stages, schedule_name(kind),
                schedule_fixed_chunks(kind, 1), schedule_fixed_chunks(kind, 1) > 1 ? "s" : "");
    return schedule_shape_of(kind, c->n_stages, schedule_fixed_chunks(kind, v > 0 ? v : 2),
                             c->micro_batches);
}

/* Whether this cluster and these options can plan schedule sh: ERR_INPUT saying why not. */
static int shape_allowed(const struct cluster *c, const struct plan_options *o,
                         const struct schedule_shape *sh, struct err *e)
{
    const char *name = schedule_name(sh->kind);
    int plain = sh->kind == SCHEDULE_1F1B || sh->kind == SCHEDULE_GPIPE;
    if (schedule_check(sh, e))
        return e->code;
    if (!plain && (o->actions & (PLAN_ACTION_OFFLOAD | PLAN_ACTION_OPTIMIZER)))
        return err_set(e, ERR_INPUT, "--actions: offload and a host optimizer are planned and "
                       "run with schedules 1f1b and gpipe (a fraction of the optimizer too), "
                       "not %s", name);
    if (!plain && o->arena != NULL)
        return err_set(e, ERR_INPUT, "--arena lays out stages of schedules 1f1b and gpipe, not %s",
                       name);
    if (sh->chunks > 1 && schedule_virtual_stages(sh) > c->n_layers)
        return err_set(e, ERR_INPUT, "schedule %s: %d GPUs x %d chunks is more than the model's "
                       "%d layers", name, sh->gpus, sh->chunks, c->n_layers);
    return ERR_OK;
}

/* c under schedule sh (shares everything with c). */
static struct cluster with_shape(const struct cluster *c, const struct schedule_shape *sh)
{
    struct cluster out = *c;
    out.schedule = sh->kind;
    out.schedule_auto = 0;
    out.virtual_stages = sh->chunks;
    return out;
}

/* Each GPU's layer count on `base`'s split, a GPU left fewer layers than sh's chunks taking
 * them from the GPU with the most, one at a time (the callers' shape_allowed made sure there
 * are p x v). */
static void chunk_counts(const struct cluster *base, const struct schedule_shape *sh, int *n)
{
    int S = base->n_stages;
    for (int g = 0; g < S; g++)
        n[g] = base->stages[g].last - base->stages[g].first + 1;
    for (int g = 0; g < S; g++)
        while (n[g] < sh->chunks) {
            int most = 0;
            for (int h = 1; h < S; h++)
                most = n[h] > n[most] ? h : most;
            n[most]--;
            n[g]++;
        }
}

/* Schedule sh on `base`'s GPUs in their order, GPU g holding n[g] layers in order, planned as
 * fixed. */
static int plan_counts(const struct cluster *base, const struct plan_options *o,
                       const struct schedule_shape *sh, const int *n, struct plan *out,
                       struct err *e)
{
    struct plan_options fixed = *o;
    struct cluster ca = with_shape(base, sh);
    int S = ca.n_stages;
    struct cluster_stage *st = malloc((size_t)S * sizeof *st);
    if (st == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    memcpy(st, ca.stages, (size_t)S * sizeof *st);
    for (int g = 0, next = 0; g < S; next = st[g++].last + 1) {
        st[g].first = next;
        st[g].last = next + n[g] - 1;
    }
    ca.stages = st;
    fixed.repartition = 0;
    int rc = plan_fixed(&ca, &fixed, out, e);
    free(st);
    if (rc == ERR_OK)
        snprintf(out->method, sizeof out->method, "optimal+repartition");
    return rc;
}

/* Whether step a is shorter than step b by more than floating-point noise. */
static int shorter(double a, double b)
{
    return a < b && !(b <= choice_cap(a, 0));
}

/* From *best (GPU g holding n[g] layers of `base`), moves one layer between neighbouring
 * GPUs while that shortens the step (first improvement; a GPU keeps a layer a chunk), until
 * no move does or --time-limit has passed. The chunked schedules' split search: their
 * simulated step has no bounds here, so this finds a local optimum, not a certified one. */
static int polish_counts(const struct cluster *base, const struct plan_options *o,
                         const struct schedule_shape *sh, int *n, struct plan *best,
                         struct err *e)
{
    double deadline = o->time_limit_s > 0 ? clock_now_s() + o->time_limit_s : INFINITY;
    for (int improved = 1; improved && clock_now_s() < deadline;) {
        improved = 0;
        for (int m = 0; m < 2 * (base->n_stages - 1) && clock_now_s() < deadline; m++) {
            int g = m / 2, from = m % 2 ? g + 1 : g, to = m % 2 ? g : g + 1;
            if (n[from] <= sh->chunks)
                continue;
            n[from]--;
            n[to]++;
            struct plan p;
            struct err inner;
            err_clear(&inner);
            int rc = plan_counts(base, o, sh, n, &p, &inner);
            if (rc != ERR_OK && rc != ERR_NOFIT && rc != ERR_INPUT)
                return err_set(e, rc, "%s", inner.msg);
            if (rc == ERR_OK && shorter(p.iteration_ms, best->iteration_ms)) {
                plan_free(best);
                *best = p;
                improved = 1;
                continue;
            }
            if (rc == ERR_OK)
                plan_free(&p);
            n[from]++;
            n[to]--;
        }
    }
    return ERR_OK;
}

/* Schedule sh (zb-h1, v-half, interleaved) under --repartition: from the better of `arranged`
 * (1f1b's order and split, NULL: none found) and the cluster's own split (ties: the
 * arrangement's; where 1f1b's split gives a slow GPU one layer, its own split may be the
 * better), layers moved between neighbouring GPUs while the step gets shorter
 * (polish_counts). With --min-gain the polished split is kept only where it gains at least
 * that over the split it started from, or is no less balanced. */
static int plan_on_either(const struct cluster *c, const struct cluster *arranged,
                          const struct plan_options *o, const struct schedule_shape *sh,
                          struct plan *out, struct err *e)
{
    const struct cluster *bases[2] = {arranged, c}, *base = NULL;
    int S = c->n_stages, *n = malloc((size_t)S * sizeof *n);
    int *won = malloc((size_t)S * sizeof *won);
    struct plan start;
    int rc = n && won ? ERR_NOFIT : err_set(e, ERR_FAIL, "out of memory");
    for (int k = 0; k < 2 && (rc == ERR_OK || rc == ERR_NOFIT || rc == ERR_INPUT); k++) {
        struct plan p;
        struct err inner;
        err_clear(&inner);
        if (bases[k] == NULL)
            continue;
        chunk_counts(bases[k], sh, n);
        int rk = plan_counts(bases[k], o, sh, n, &p, &inner);
        if (rk != ERR_OK && rk != ERR_NOFIT && rk != ERR_INPUT) {
            rc = err_set(e, rk, "%s", inner.msg);
        } else if (rk == ERR_OK && (base == NULL || shorter(p.iteration_ms, start.iteration_ms))) {
            if (base != NULL)
                plan_free(&start);
            start = p;
            base = bases[k];
            memcpy(won, n, (size_t)S * sizeof *n);
            rc = ERR_OK;
        } else if (rk == ERR_OK) {
            plan_free(&p);
        } else if (base == NULL) {
            rc = rk;
            *e = inner;
        }
    }
    if (rc == ERR_OK) { /* polished from a plan of its own: start stays for --min-gain */
        rc = plan_counts(base, o, sh, won, out, e);
        if (rc == ERR_OK && (rc = polish_counts(base, o, sh, won, out, e)) != ERR_OK)
            plan_free(out);
    }
    if (rc == ERR_OK && o->min_gain > 0 &&
        start.iteration_ms <= choice_cap(out->iteration_ms, o->min_gain)) {
        struct choice_key ks, kp;
        choice_key_of(&start, o, &ks);
        choice_key_of(out, o, &kp);
        if (choice_key_cmp(&ks, &kp) <= 0) {
            double fastest = out->iteration_ms;
            plan_free(out);
            *out = start;
            base = NULL; /* start now belongs to out */
            out->min_gain = o->min_gain;
            out->fastest_ms = shorter(fastest, out->iteration_ms) ? fastest : 0;
        }
    }
    if (base != NULL)
        plan_free(&start);
    free(n);
    free(won);
    return rc;
}

/* One schedule on the cluster's split, or with --repartition on the order and split the
 * search finds: its own for 1f1b and gpipe, whose bounds it knows, 1f1b's (or the cluster's
 * own split, the faster: plan_on_either) for the others. */
static int plan_shape_of(const struct cluster *c, const struct plan_options *o,
                         const struct schedule_shape *sh, struct plan *out, struct err *e)
{
    if (shape_allowed(c, o, sh, e))
        return e->code;
    struct cluster cs = with_shape(c, sh);
    if (!o->repartition)
        return plan_fixed(&cs, o, out, e);
    if (sh->kind == SCHEDULE_1F1B || sh->kind == SCHEDULE_GPIPE)
        return plan_repartitioned(&cs, o, out, NULL, e);
    struct schedule_shape one = schedule_shape_of(SCHEDULE_1F1B, sh->gpus, 1, sh->micro_batches);
    struct cluster c1 = with_shape(c, &one), arranged = {0};
    struct plan p1;
    int rc = plan_repartitioned(&c1, o, &p1, &arranged, e);
    if (rc == ERR_OK)
        plan_free(&p1);
    if (rc == ERR_OK || rc == ERR_NOFIT) {
        err_clear(e);
        rc = plan_on_either(c, arranged.stages != NULL ? &arranged : NULL, o, sh, out, e);
    }
    free(arranged.stages);
    return rc;
}

/* One candidate schedule's plan: with --repartition, 1F1B's searched split (kept in
 * *arranged for the other schedules) or another schedule's plan on either split; else the
 * schedule on the cluster's split. */
static int plan_candidate(const struct cluster *c, const struct plan_options *o,
                          const struct schedule_shape *sh, struct plan *out,
                          struct cluster *arranged, struct err *e)
{
    int plain = sh->kind == SCHEDULE_1F1B || sh->kind == SCHEDULE_GPIPE;
    if (o->repartition && !plain)
        return shape_allowed(c, o, sh, e)
                   ? e->code
                   : plan_on_either(c, arranged->stages != NULL ? arranged : NULL, o, sh, out,
                                    e);
    if (o->repartition && sh->kind == SCHEDULE_1F1B) {
        struct cluster cs = with_shape(c, sh);
        return shape_allowed(c, o, sh, e) ? e->code
                                          : plan_repartitioned(&cs, o, out, arranged, e);
    }
    return plan_shape_of(c, o, sh, out, e);
}

/* The plan kept of those that fit (ok): the first within min_gain of the fastest (*fastest:
 * the least of the plans' own fastest steps; with no margin, the least step), else the least
 * step; -1 when none fits. */
static int kept_schedule(const struct plan *plans, const int *ok, int n, double gain,
                         double *fastest)
{
    int kept = -1, least = -1;
    for (int k = 0; k < n; k++)
        if (ok[k] && (least < 0 || plans[k].iteration_ms < plans[least].iteration_ms))
            least = k;
    if (gain == 0 && least >= 0)
        *fastest = plans[least].iteration_ms;
    for (int k = 0; k < n && kept < 0; k++)
        if (ok[k] && plans[k].iteration_ms <= choice_cap(*fastest, gain))
            kept = k;
    return kept >= 0 ? kept : least;
}

static int auto_nofit(const struct plan_try *tried, int n, struct err *e)
{
    err_set(e, ERR_NOFIT, "--schedule auto: no schedule fits the cluster:");
    for (int k = 0; k < n; k++)
        err_append(e, "\n  %s, %d chunk%s a GPU: %s", schedule_name(tried[k].schedule),
                   tried[k].virtual_stages, tried[k].virtual_stages > 1 ? "s" : "",
                   tried[k].iteration_ms == -1 ? "no plan fits"
                                               : "not with this cluster and these options");
    return ERR_NOFIT;
}

/* --schedule auto (--method optimal's): every candidate schedule planned. With --min-gain G
 * the plan kept is the earliest candidate (1f1b, gpipe, zb-h1, v-half, interleaved by v:
 * simplest first) whose step is within G of the fastest step found for any of them, so a
 * more complex schedule is taken only where it gains at least G; with G = 0 the least step
 * (ties within noise: the earlier candidate). The fastest step is each plan's own fastest
 * (one margin, not one per schedule). With --repartition, 1f1b's search gives the order and
 * split the others are planned on, or the cluster's split, the faster (plan_on_either);
 * gpipe searches its own. */
static int plan_auto_schedule(const struct cluster *c, const struct plan_options *o,
                              struct plan *out, struct err *e)
{
    struct schedule_shape cand[PLAN_SCHEDULES_MAX];
    int v = o->virtual_stages > 0 ? o->virtual_stages : c->virtual_stages;
    int n = planner_schedule_candidates(v, cand), rc = ERR_OK;
    struct plan_try tried[PLAN_SCHEDULES_MAX];
    struct plan plans[PLAN_SCHEDULES_MAX];
    int ok[PLAN_SCHEDULES_MAX] = {0};
    struct cluster arranged = {0};
    double fastest = INFINITY; /* the least of the plans' own fastest steps */
    for (int k = 0; k < n; k++) {
        struct err inner;
        err_clear(&inner);
        cand[k].gpus = c->n_stages;
        cand[k].micro_batches = c->micro_batches;
        rc = plan_candidate(c, o, &cand[k], &plans[k], &arranged, &inner);
        if (rc != ERR_OK && rc != ERR_NOFIT && rc != ERR_INPUT) {
            err_set(e, rc, "%s", inner.msg);
            break;
        }
        tried[k] = (struct plan_try){cand[k].kind, cand[k].chunks,
                                     rc == ERR_OK ? plans[k].iteration_ms
                                     : rc == ERR_NOFIT ? -1
                                                       : -2};
        ok[k] = rc == ERR_OK;
        if (ok[k] && plan_fastest(&plans[k]) < fastest)
            fastest = plan_fastest(&plans[k]);
        rc = ERR_OK;
    }
    free(arranged.stages);
    double gain = o->min_gain;
    int kept = kept_schedule(plans, ok, n, gain, &fastest);
    for (int k = 0; k < n; k++)
        if (ok[k] && k != kept)
            plan_free(&plans[k]);
    if (rc != ERR_OK) {
        if (kept >= 0)
            plan_free(&plans[kept]);
        return rc;
    }
    if (kept < 0)
        return auto_nofit(tried, n, e);
    *out = plans[kept];
    if (gain > 0) {
        out->min_gain = gain;
        out->fastest_ms = out->iteration_ms > choice_cap(fastest, 0) ? fastest : 0;
    }
    out->n_tried = n;
    memcpy(out->tried, tried, (size_t)n * sizeof *tried);
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
    int automatic = o->schedule_auto || (c->schedule_auto && o->schedule < 0);
    char method[PLAN_METHOD_MAX];
    if (automatic && o->method != METHOD_OPTIMAL)
        return err_set(e, ERR_INPUT, "--schedule auto: the schedule is chosen by --method "
                       "optimal; --method %s plans the schedule it is given: name one (%s)",
                       plan_method_name(o, method), schedule_names());
    if (automatic && !framework_is_ballast(o->framework))
        return err_set(e, ERR_INPUT, "--schedule auto: --for %s plans the schedule it is given "
                       "(docs/schedules.md says which each framework runs): name one",
                       o->framework->name);
    if (automatic)
        return plan_auto_schedule(c, o, out, e);
    struct schedule_shape sh = asked_shape(c, o, e);
    if (e->code)
        return e->code;
    if (!framework_is_ballast(o->framework)) {
        char why[1024];
        struct cluster cs = with_shape(c, &sh);
        if (schedule_check(&sh, e))
            return e->code;
        if (!fw_schedule_allowed(o->framework, &sh, why, sizeof why))
            return err_set(e, ERR_INPUT, "--for %s: %s", o->framework->name, why);
        if (sh.chunks > 1 && o->repartition)
            return err_set(e, ERR_INPUT, "--for %s --repartition: the framework's split search "
                           "costs one chunk a GPU; plan the interleaved schedule on the "
                           "cluster's split (its \"layers\"), or --for ballast --repartition "
                           "and export", o->framework->name);
        return plan_for_framework(&cs, o, out, e);
    }
    return plan_shape_of(c, o, &sh, out, e);
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
