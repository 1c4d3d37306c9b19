#include "planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "knapsack.h"
#include "milp.h"
#include "repartition.h"
#include "sim.h"

#define GIB 1073741824.0

void plan_options_default(struct plan_options *o)
{
    *o = (struct plan_options){.method = METHOD_OPTIMAL,
                               .unit_bytes = PLAN_UNIT_DEFAULT,
                               .time_unit_ms = PLAN_TIME_UNIT_DEFAULT_MS,
                               .search_nodes = PLAN_SEARCH_NODES_DEFAULT};
}

int plan_method_parse(const char *text, struct plan_options *o, struct err *e)
{
    static const struct {
        const char *name;
        enum plan_method m;
    } names[] = {{"none", METHOD_NONE},
                 {"full", METHOD_FULL},
                 {"uniform-min", METHOD_UNIFORM_MIN},
                 {"patent", METHOD_PATENT},
                 {"optimal", METHOD_OPTIMAL}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(text, names[i].name) == 0) {
            o->method = names[i].m;
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
    switch (o->method) {
    case METHOD_NONE:
        return "none";
    case METHOD_FULL:
        return "full";
    case METHOD_BLOCK:
        snprintf(buf, PLAN_METHOD_MAX, "block:%d", o->block_n);
        return buf;
    case METHOD_UNIFORM_MIN:
        return "uniform-min";
    case METHOD_PATENT:
        return "patent";
    case METHOD_OPTIMAL:
        return "optimal";
    }
    return "?";
}

static void set_block(struct plan_stage *st, int n)
{
    int count = plan_stage_layer_count(st);
    for (int l = 0; l < count; l++)
        st->recompute[l] = l < n;
}

static int stage_fits(const struct plan *p, const struct plan_stage *st)
{
    struct stage_cost c;
    plan_stage_cost(p, st, &c);
    return c.memory_bytes <= st->memory_limit_bytes;
}

static void describe_stage(const struct plan *p, const struct plan_stage *st, struct err *e,
                           const char *what)
{
    struct stage_cost c;
    plan_stage_cost(p, st, &c);
    err_append(e,
               "  stage %d (%s, layers %d-%d) %s: state %.2f GiB + %d in flight x %.3f GiB kept "
               "+ transient %.3f GiB + workspace %.3f GiB + reserve %.2f GiB = %.2f GiB > limit "
               "%.2f GiB",
               st->index, st->device, st->first, st->last, what, c.state_bytes / GIB,
               c.in_flight, c.kept_bytes / GIB, c.transient_bytes / GIB, c.workspace_bytes / GIB,
               c.reserve_bytes / GIB, c.memory_bytes / GIB, st->memory_limit_bytes / GIB);
}

/* ERR_NOFIT naming every stage that cannot fit even recomputing every layer (or, if all
 * could, the stages this method leaves over their limit). */
static int report_nofit(struct plan *p, const struct plan_options *o, struct err *e)
{
    const char *method = p->method;
    err_set(e, ERR_NOFIT, "no plan fits with method %s:", method);
    int hopeless = 0;
    for (int s = 0; s < p->n_stages; s++) {
        struct plan_stage *st = &p->stages[s];
        unsigned char *saved = malloc((size_t)plan_stage_layer_count(st));
        if (saved == NULL)
            return err_set(e, ERR_FAIL, "out of memory");
        memcpy(saved, st->recompute, (size_t)plan_stage_layer_count(st));
        set_block(st, plan_stage_layer_count(st));
        if (!stage_fits(p, st)) {
            describe_stage(p, st, e, "cannot fit even recomputing every layer");
            hopeless++;
        }
        memcpy(st->recompute, saved, (size_t)plan_stage_layer_count(st));
        free(saved);
    }
    if (hopeless > 0) {
        err_append(e, "  (%d of %d stages; more memory, more stages, fewer micro-batches in "
                      "flight or a smaller micro-batch would help)",
                   hopeless, p->n_stages);
        return ERR_NOFIT;
    }
    if (o->method == METHOD_PATENT || o->method == METHOD_OPTIMAL) {
        /* The DP is exact on memory units, each rounded up: a stage that fits only when
         * counted to the byte is refused rather than planned over its limit. */
        err_append(e, "  a stage fits only when its memory is counted to the byte; rounded up "
                      "to units of %lld bytes it does not: use a smaller --unit",
                   (long long)o->unit_bytes);
        return ERR_NOFIT;
    }
    for (int s = 0; s < p->n_stages; s++)
        if (!stage_fits(p, &p->stages[s]))
            describe_stage(p, &p->stages[s], e, "does not fit this method's choice");
    err_append(e, "  every stage would fit with more recomputation: try --method optimal");
    return ERR_NOFIT;
}

static int build_problem(const struct plan *p, const struct plan_stage *st,
                         const struct plan_options *o, struct knap_problem *kp, struct err *e)
{
    return knap_build(kp, st->layers, plan_stage_layer_count(st), st->in_flight,
                      p->reserve_bytes, st->memory_limit_bytes, o->unit_bytes, e);
}

/* Each stage its least recompute within its limit (optimal), or the most loaded stage's
 * least and every other stage's closest to it (patent). With verify, checks each stage's
 * objective against GLPK. */
static int knapsack_stages(struct plan *p, const struct plan_options *o, struct err *e)
{
    int star = p->most_loaded_stage;
    int patent = o->method == METHOD_PATENT;
    double target_ms = 0, dp_total = 0, milp_total = 0;
    int agree = 1;
    /* the most loaded stage first: the others balance to it */
    for (int pass = 0; pass < p->n_stages; pass++) {
        int s = pass == 0 ? star : (pass <= star ? pass - 1 : pass);
        struct plan_stage *st = &p->stages[s];
        struct knap_problem kp;
        double dp_obj = 0, milp_obj = 0;
        if (build_problem(p, st, o, &kp, e))
            return e->code;
        int rc;
        if (!patent || s == star) {
            rc = knap_min_recompute(&kp, st->recompute, e);
            if (rc == ERR_OK) {
                dp_obj = knap_recompute_ms(&kp, st->recompute);
                if (s == star)
                    target_ms = dp_obj;
                if (o->verify && milp_min_recompute(&kp, &milp_obj, e) == ERR_NOFIT) {
                    err_clear(e); /* the DP found a choice GLPK calls infeasible */
                    milp_obj = INFINITY;
                }
                rc = e->code;
            }
        } else {
            double unit = knap_balance_time_unit(&kp, o->time_unit_ms);
            int64_t target = (int64_t)llround(target_ms / unit), distance = 0;
            rc = knap_balance(&kp, target, unit, st->recompute, &distance, e);
            if (rc == ERR_OK) {
                dp_obj = (double)distance * unit;
                double units;
                if (o->verify && milp_balance(&kp, target, unit, &units, e) == ERR_NOFIT) {
                    err_clear(e);
                    units = INFINITY;
                }
                rc = e->code;
                if (o->verify)
                    milp_obj = units * unit;
            }
        }
        knap_free(&kp);
        if (rc == ERR_NOFIT) {
            err_clear(e);
            return ERR_NOFIT;
        }
        if (rc)
            return rc;
        dp_total += dp_obj;
        milp_total += milp_obj;
        if (o->verify && !(fabs(dp_obj - milp_obj) <= 1e-6 + 1e-6 * fabs(milp_obj))) {
            agree = 0;
            fprintf(stderr, "verify: stage %d: DP objective %.9g ms, GLPK %.9g ms\n", s, dp_obj,
                    milp_obj);
        }
    }
    if (o->verify) {
        p->verify = (struct plan_verify){1, milp_total, dp_total, agree};
    }
    return ERR_OK;
}

static int uniform_min(struct plan *p)
{
    int most = 0;
    for (int s = 0; s < p->n_stages; s++)
        if (plan_stage_layer_count(&p->stages[s]) > most)
            most = plan_stage_layer_count(&p->stages[s]);
    for (int n = 0; n <= most; n++) {
        int all = 1;
        for (int s = 0; s < p->n_stages; s++) {
            set_block(&p->stages[s], n);
            all = all && stage_fits(p, &p->stages[s]);
        }
        if (all)
            return ERR_OK;
    }
    return ERR_NOFIT;
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

int planner_make(const struct cluster *c, const struct plan_options *o, struct plan *out,
                 struct err *e)
{
    if (o->repartition) {
        struct repartition_stats stats;
        if (o->method != METHOD_OPTIMAL)
            return err_set(e, ERR_INPUT, "--repartition applies to --method optimal only");
        return repartition_make(c, o, out, &stats, e);
    }
    int S = c->n_stages;
    int *first = malloc((size_t)S * sizeof *first), *last = malloc((size_t)S * sizeof *last);
    if (first == NULL || last == NULL) {
        free(first);
        free(last);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    for (int s = 0; s < S; s++) {
        first[s] = c->stages[s].first;
        last[s] = c->stages[s].last;
    }
    int rc = plan_init(out, S, first, last, e);
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
    for (int s = 0; s < S; s++) {
        struct plan_stage *st = &out->stages[s];
        const struct profile *prof = cluster_stage_profile(c, s);
        snprintf(st->device, sizeof st->device, "%s", c->stages[s].device);
        memcpy(st->layers, prof->layers + st->first,
               (size_t)plan_stage_layer_count(st) * sizeof *st->layers);
        st->in_flight = schedule_in_flight(c->schedule, S, s, c->micro_batches);
        st->capacity_bytes = c->stages[s].memory_bytes;
        st->memory_limit_bytes = st->capacity_bytes;
        if (s + 1 < S)
            st->link = cluster_link(c, s);
        struct stage_cost before;
        plan_stage_cost(out, st, &before);
        st->memory_before_bytes = before.memory_bytes;
    }
    out->most_loaded_stage = most_loaded(out);
    if (o->method == METHOD_PATENT && o->reduce > 0) {
        struct plan_stage *st = &out->stages[out->most_loaded_stage];
        double reduced = floor(o->reduce * (double)st->memory_before_bytes);
        if (reduced < (double)st->memory_limit_bytes)
            st->memory_limit_bytes = (int64_t)reduced;
    }
    rc = ERR_OK;
    switch (o->method) {
    case METHOD_NONE:
        break;
    case METHOD_FULL:
        for (int s = 0; s < S; s++)
            set_block(&out->stages[s], plan_stage_layer_count(&out->stages[s]));
        break;
    case METHOD_BLOCK:
        for (int s = 0; s < S; s++)
            set_block(&out->stages[s], o->block_n);
        break;
    case METHOD_UNIFORM_MIN:
        rc = uniform_min(out);
        break;
    case METHOD_PATENT:
    case METHOD_OPTIMAL:
        rc = knapsack_stages(out, o, e);
        break;
    }
    if (rc != ERR_OK && rc != ERR_NOFIT)
        goto fail;
    int fits = rc == ERR_OK;
    for (int s = 0; s < S && fits; s++)
        fits = stage_fits(out, &out->stages[s]);
    if (!fits) {
        report_nofit(out, o, e);
        goto fail;
    }
    out->bottleneck_stage = 0;
    for (int s = 0; s < S; s++) {
        struct plan_stage *st = &out->stages[s];
        struct stage_cost cost;
        plan_stage_cost(out, st, &cost);
        st->memory_bytes = cost.memory_bytes;
        st->recompute_ms = cost.recompute_ms;
        st->stage_ms = cost.stage_ms;
        if (st->stage_ms > out->stages[out->bottleneck_stage].stage_ms)
            out->bottleneck_stage = s;
    }
    struct sim_result sim;
    if (sim_plan(out, &sim, e))
        goto fail;
    out->iteration_ms = sim.iteration_ms;
    sim_result_free(&sim);
    return ERR_OK;
fail:
    plan_free(out);
    return e->code;
}
