#include "nofit.h"

#include <stdlib.h>
#include <string.h>

#include "methods.h"

#define GIB 1073741824.0

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

/* The stage's costs with every layer's choice `all[l]`, or with its actions (all NULL). */
static void stage_cost_with(const struct plan_stage *st, const unsigned char *all,
                            int64_t reserve_bytes, struct stage_cost *c)
{
    struct cost_actions a = plan_stage_actions(st);
    if (all != NULL)
        cost_stage(st->layers, plan_stage_layer_count(st), all, st->in_flight, reserve_bytes, c);
    else
        cost_stage_actions(st->layers, plan_stage_layer_count(st), &a, st->in_flight,
                           reserve_bytes, c);
}

/* Appends one stage's memory terms for the choices `all` (NULL: its actions) against its
 * limit. */
static void describe_stage(const struct plan *p, const struct plan_stage *st,
                           const unsigned char *all, const char *what, struct err *e)
{
    struct stage_cost c;
    char b[7][32];
    stage_cost_with(st, all, p->reserve_bytes, &c);
    err_append(e,
               "  stage %d (%s, layers %d-%d) %s: state %s + %d in flight x %s kept + transient "
               "%s + workspace %s + reserve %s = %s > limit %s",
               st->index, st->device, st->first, st->last, what, human_bytes(c.state_bytes, b[0]),
               c.in_flight, human_bytes(c.kept_bytes, b[1]), human_bytes(c.transient_bytes, b[2]),
               human_bytes(c.workspace_bytes, b[3]), human_bytes(c.reserve_bytes, b[4]),
               human_bytes(c.memory_bytes, b[5]), human_bytes(st->memory_limit_bytes, b[6]));
}

/* A GPU holding several chunks (stage s its first): its memory with every layer recomputed
 * (`all`) or with the plan's choice (NULL), against its limit. Returns 1 when it does not fit. */
static int describe_gpu(const struct plan *p, int s, const unsigned char *all, const char *what,
                        struct err *e)
{
    int members[SCHEDULE_CHUNKS_MAX], n = method_group(p, s, members);
    struct stage_cost chunk[SCHEDULE_CHUNKS_MAX];
    char b[2][32], ranges[SCHEDULE_CHUNKS_MAX * 16] = "";
    for (int k = 0; k < n; k++) {
        const struct plan_stage *st = &p->stages[members[k]];
        stage_cost_with(st, all, 0, &chunk[k]);
        snprintf(ranges + strlen(ranges), sizeof ranges - strlen(ranges), "%s%d-%d",
                 k ? ", " : "", st->first, st->last);
    }
    int64_t need = cost_chunks_memory(chunk, n, p->reserve_bytes);
    const struct plan_stage *st = &p->stages[s];
    if (need <= st->memory_limit_bytes)
        return 0;
    err_append(e, "  GPU %d (%s, chunks of layers %s) %s: %s with the chunks' in-flight "
                  "micro-batches > limit %s", st->gpu, st->device, ranges, what,
               human_bytes(need, b[0]), human_bytes(st->memory_limit_bytes, b[1]));
    return 1;
}

/* The stages that cannot fit even recomputing every layer (full recomputation needs the least
 * memory: keeping a layer costs v (act - ckpt), more than its transient); `all` is n ones. */
static int hopeless_stages(const struct plan *p, const unsigned char *all, struct err *e)
{
    int hopeless = 0;
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        struct stage_cost c;
        if (p->virtual_stages > 1) {
            hopeless += method_leader(p, s) &&
                        describe_gpu(p, s, all, "cannot fit even recomputing every layer", e);
            continue;
        }
        cost_stage(st->layers, plan_stage_layer_count(st), all, st->in_flight, p->reserve_bytes,
                   &c);
        if (c.memory_bytes > st->memory_limit_bytes) {
            describe_stage(p, st, all, "cannot fit even recomputing every layer", e);
            hopeless++;
        }
    }
    return hopeless;
}

/* The DP is exact on memory units, each rounded up: a stage that fits only when counted to
 * the byte is refused rather than planned over its limit. */
static void rounded_out_stages(const struct plan *p, const struct plan_options *o,
                               const unsigned char *all, struct err *e)
{
    char b[32];
    for (int s = 0; s < p->n_stages; s++) {
        struct knap_problem kp;
        if (!method_leader(p, s))
            continue;
        if (method_problem(p, s, o, &kp, e))
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
}

int nofit_report(const struct plan *p, const struct plan_options *o, struct err *e)
{
    int longest = model_layer_count(&p->model); /* a stage's, or a GPU's chunks' */
    unsigned char *all = malloc((size_t)longest + 1);
    if (all == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    memset(all, 1, (size_t)longest + 1);
    err_set(e, ERR_NOFIT, "no plan fits with method %s:", p->method);
    int hopeless = hopeless_stages(p, all, e);
    if (hopeless > 0)
        err_append(e, "  (%d of %d stages; more memory, more stages, fewer micro-batches "
                      "in flight or a smaller micro-batch would help)",
                   hopeless, p->n_stages);
    else if (method_find(o->method)->knapsack)
        rounded_out_stages(p, o, all, e);
    else {
        for (int s = 0; s < p->n_stages; s++) {
            const struct plan_stage *st = &p->stages[s];
            struct stage_cost c;
            plan_stage_cost(p, st, &c);
            if (p->virtual_stages > 1 && method_leader(p, s))
                describe_gpu(p, s, NULL, "does not fit this method's choice", e);
            else if (p->virtual_stages <= 1 && c.memory_bytes > st->memory_limit_bytes)
                describe_stage(p, st, NULL, "does not fit this method's choice", e);
        }
        err_append(e, "  every stage would fit with more recomputation: try --method optimal");
    }
    free(all);
    return e->code;
}
