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

/* Bytes as a person reads them; exact below a KiB. */
static const char *human_bytes(int64_t b, char buf[32])
{
    if (b >= ((int64_t)1 << 30))
        snprintf(buf, 32, "%.2f GiB", (double)b / GIB);
    else if (b >= ((int64_t)1 << 20))
        snprintf(buf, 32, "%.2f MiB", (double)b / (1 << 20));
    else if (b >= ((int64_t)1 << 10))
        snprintf(buf, 32, "%.2f KiB", (double)b / (1 << 10));
    else
        snprintf(buf, 32, "%lld B", (long long)b);
    return buf;
}

/* Appends one stage's memory terms for the choice `recompute` against its limit. */
static void describe_stage(const struct plan *p, const struct plan_stage *st,
                           const unsigned char *recompute, const char *what, struct err *e)
{
    struct stage_cost c;
    char b[7][32];
    cost_stage(st->layers, plan_stage_layer_count(st), recompute, st->in_flight,
               p->reserve_bytes, &c);
    err_append(e,
               "  stage %d (%s, layers %d-%d) %s: state %s + %d in flight x %s kept + transient "
               "%s + workspace %s + reserve %s = %s > limit %s",
               st->index, st->device, st->first, st->last, what, human_bytes(c.state_bytes, b[0]),
               c.in_flight, human_bytes(c.kept_bytes, b[1]), human_bytes(c.transient_bytes, b[2]),
               human_bytes(c.workspace_bytes, b[3]), human_bytes(c.reserve_bytes, b[4]),
               human_bytes(c.memory_bytes, b[5]), human_bytes(st->memory_limit_bytes, b[6]));
}

/* Optimal chooses among the layers' recompute options too; the published method recomputes
 * whole layers, as published. */
static int build_problem(const struct plan *p, const struct plan_stage *st,
                         const struct plan_options *o, struct knap_problem *kp, struct err *e)
{
    int options = o->method == METHOD_OPTIMAL && !o->whole_layers;
    return (options ? knap_build_options : knap_build)(
        kp, st->layers, plan_stage_layer_count(st), st->in_flight, p->reserve_bytes,
        st->memory_limit_bytes, o->unit_bytes, e);
}

/* ERR_NOFIT naming every stage that cannot fit even recomputing every layer (full
 * recomputation needs the least memory: keeping a layer costs v (act - ckpt), more than its
 * transient), or, if all could, why this method's choice does not fit. */
static int report_nofit(const struct plan *p, const struct plan_options *o, struct err *e)
{
    int longest = 0, hopeless = 0;
    char b[32];
    for (int s = 0; s < p->n_stages; s++)
        if (plan_stage_layer_count(&p->stages[s]) > longest)
            longest = plan_stage_layer_count(&p->stages[s]);
    unsigned char *all = malloc((size_t)longest);
    if (all == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    memset(all, 1, (size_t)longest);
    err_set(e, ERR_NOFIT, "no plan fits with method %s:", p->method);
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        struct stage_cost c;
        cost_stage(st->layers, plan_stage_layer_count(st), all, st->in_flight, p->reserve_bytes,
                   &c);
        if (c.memory_bytes > st->memory_limit_bytes) {
            describe_stage(p, st, all, "cannot fit even recomputing every layer", e);
            hopeless++;
        }
    }
    if (hopeless > 0) {
        free(all);
        return err_append(e, "  (%d of %d stages; more memory, more stages, fewer micro-batches "
                             "in flight or a smaller micro-batch would help)",
                          hopeless, p->n_stages);
    }
    if (o->method == METHOD_PATENT || o->method == METHOD_OPTIMAL) {
        /* The DP is exact on memory units, each rounded up: a stage that fits only when
         * counted to the byte is refused rather than planned over its limit. */
        for (int s = 0; s < p->n_stages; s++) {
            struct knap_problem kp;
            if (build_problem(p, &p->stages[s], o, &kp, e))
                break;
            int64_t need = knap_units(&kp, all);
            if (need > kp.cap)
                err_append(e, "  stage %d fits only when its memory is counted to the byte: in "
                              "units of %lld bytes, recomputing every layer needs %lld units on "
                              "top of %s, and only %lld are left: use a smaller --unit",
                           s, (long long)o->unit_bytes, (long long)need,
                           human_bytes(kp.fixed_bytes, b), (long long)kp.cap);
            knap_free(&kp);
        }
        free(all);
        return e->code;
    }
    free(all);
    for (int s = 0; s < p->n_stages; s++)
        if (!stage_fits(p, &p->stages[s]))
            describe_stage(p, &p->stages[s], p->stages[s].recompute,
                           "does not fit this method's choice", e);
    return err_append(e, "  every stage would fit with more recomputation: try --method optimal");
}

/* Each stage its least recompute within its limit (optimal), or the most loaded stage's
 * least and every other stage's closest to it (patent). With verify, solves each stage again
 * with GLPK and records both objectives (summed over the stages). */
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
        int rc, glpk = ERR_OK;
        if (!patent || s == star) {
            rc = knap_min_recompute(&kp, st->recompute, e);
            dp_obj = knap_recompute_ms(&kp, st->recompute);
            target_ms = s == star ? dp_obj : target_ms;
            if (rc == ERR_OK && o->verify)
                glpk = milp_min_recompute(&kp, &milp_obj, e);
        } else {
            double unit = knap_balance_time_unit(&kp, o->time_unit_ms), units = 0;
            int64_t target = (int64_t)llround(target_ms / unit), distance = 0;
            rc = knap_balance(&kp, target, unit, st->recompute, &distance, e);
            dp_obj = (double)distance * unit;
            if (rc == ERR_OK && o->verify)
                glpk = milp_balance(&kp, target, unit, &units, e);
            milp_obj = units * unit;
        }
        knap_free(&kp);
        if (rc)
            return rc; /* ERR_NOFIT: nothing fits this stage */
        if (glpk == ERR_NOFIT)
            return err_set(e, ERR_FAIL,
                           "verify: stage %d: GLPK finds no choice that fits, the DP found one",
                           s);
        if (glpk)
            return glpk;
        dp_total += dp_obj;
        milp_total += milp_obj;
        if (o->verify && !(fabs(dp_obj - milp_obj) <= 1e-6 + 1e-6 * fabs(milp_obj))) {
            agree = 0;
            fprintf(stderr, "verify: stage %d: DP objective %.9g ms, GLPK %.9g ms\n", s, dp_obj,
                    milp_obj);
        }
    }
    if (o->verify)
        p->verify = (struct plan_verify){1, milp_total, dp_total, agree};
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
    /* the command line checks these; a library caller gets the same refusal */
    if (o->unit_bytes < 1 || !(o->time_unit_ms > 0) || !(o->reduce >= 0 && o->reduce <= 1) ||
        o->block_n < 0)
        return err_set(e, ERR_INPUT,
                       "plan options: unit %lld bytes, time unit %g ms, reduce %g, block %d: "
                       "expected unit >= 1, time unit > 0, 0 <= reduce <= 1, block >= 0",
                       (long long)o->unit_bytes, o->time_unit_ms, o->reduce, o->block_n);
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
        snprintf(st->device_kind, sizeof st->device_kind, "%s", prof->device.kind);
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
