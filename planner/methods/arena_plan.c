#include "arena_plan.h"

#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "cost.h"
#include "schedule.h"
#include "planner.h"

const struct arena_method arena_methods[] = {
    {"slots", arena_slots},
    {"greedy", arena_greedy},
    {"ga", arena_ga},
    {"exact", arena_exact},
};
const int arena_method_count = sizeof arena_methods / sizeof arena_methods[0];

void arena_options_default(struct arena_options *o)
{
    *o = (struct arena_options){.method = "greedy",
                                .seed = 1,
                                .population = 24,
                                .generations = 300,
                                .stall = 60,
                                .time_limit_s = 10};
}

const struct arena_method *arena_method_find(const char *name)
{
    for (int i = 0; i < arena_method_count; i++)
        if (strcmp(arena_methods[i].name, name) == 0)
            return &arena_methods[i];
    return NULL;
}

/* ---- the objects of a stage ---- */

/* When each micro-batch's forward and backward run: op indices of the schedule. */
static int op_times(const struct plan *p, int s, int *tf, int *tb, struct err *e)
{
    int M = p->micro_batches;
    struct schedule_shape sh = plan_shape(p);
    if (sh.chunks > 1 || schedule_splits(sh.kind))
        return err_set(e, ERR_INPUT, "--arena lays out stages of one model chunk and a whole "
                       "backward (1f1b, gpipe), not schedule %s", schedule_name(sh.kind));
    struct schedule_op *ops = malloc(sizeof *ops * 2 * (size_t)M);
    if (ops == NULL)
        return err_set(e, ERR_FAIL, "out of memory listing stage %d's schedule", s);
    int rc = schedule_ops(&sh, s, ops, e);
    for (int t = 0; t < 2 * M && rc == ERR_OK; t++)
        (ops[t].pass == SCHEDULE_B ? tb : tf)[ops[t].micro] = t;
    free(ops);
    return rc;
}

/* The tick from which layer li's kept tensors of micro-batch m are live (arena.h). */
static int kept_first(const struct plan *p, int s, int li, int m, const int *tf, const int *tb)
{
    const struct plan_stage *st = &p->stages[s];
    int n = plan_stage_layer_count(st), v = st->in_flight;
    int first = tf[m] * n + (li > 0 ? li - 1 : 0);
    if (s == p->n_stages - 1 && li == n - 1)
        first = tf[m] * n; /* the head's targets arrive with the micro-batch */
    if (li == 0 && s > 0) /* the receive buffer: posted when slot m - v is free */
        first = m < v ? 0 : (tb[m - v] + 1) * n;
    return first;
}

static int add_object(struct arena_object *o, int *n, struct arena_object x)
{
    if (x.bytes <= 0)
        return 0;
    x.offset = -1;
    o[(*n)++] = x;
    return 1;
}

/* Layer-ops a prefetch may run ahead of its backward: the plan's furthest trigger (at least
 * one), as the runtime counts the staging room its late prefetches may move into. */
static int arena_prefetch_depth(const struct plan_stage *st)
{
    int depth = 1;
    for (int li = 0; li < plan_stage_layer_count(st); li++)
        if (st->actions[li].prefetch_ahead > depth)
            depth = st->actions[li].prefetch_ahead;
    return depth;
}

/* An offloaded layer's two staging objects for micro-batch m (arena.h): the forward's, from
 * the tick that writes its tensors (the layer before, when its input goes to the host too)
 * through the copy out during the next tick; the backward's, from the furthest a prefetch may
 * be triggered to the end of the backward. */
static void add_staging(struct arena_object *o, int *k, const struct plan_stage *st, int li,
                        int m, int64_t bytes, int fwd, int back, int last_tick)
{
    int input_too = st->actions[li].place == COST_PLACE_HOST && li > 0;
    int out_last = fwd + 1 < last_tick ? fwd + 1 : last_tick;
    int in_first = back - arena_prefetch_depth(st) > 0 ? back - arena_prefetch_depth(st) : 0;
    int layer = st->first + li;
    add_object(o, k, (struct arena_object){ARENA_STAGING, m, layer, ARENA_FORWARD, bytes,
                                           fwd - input_too, out_last, -1});
    add_object(o, k, (struct arena_object){ARENA_STAGING, m, layer, ARENA_BACKWARD, bytes,
                                           in_first, back, -1});
}

int arena_stage_objects(const struct plan *p, int s, struct arena_object **out, int *count,
                        struct err *e)
{
    const struct plan_stage *st = &p->stages[s];
    int n = plan_stage_layer_count(st), M = p->micro_batches;
    int *tf = malloc(sizeof *tf * (size_t)M), *tb = malloc(sizeof *tb * (size_t)M);
    struct arena_object *o = malloc(sizeof *o * ((size_t)5 * M * n + 1));
    if (tf == NULL || tb == NULL || o == NULL || op_times(p, s, tf, tb, e)) {
        free(tf);
        free(tb);
        free(o);
        return e->code ? e->code : err_set(e, ERR_FAIL, "out of memory listing objects");
    }
    int k = 0;
    int64_t workspace = 0;
    for (int li = 0; li < n; li++) {
        struct cost_row row = plan_stage_row(st, li);
        int layer = st->first + li;
        if (st->layers[li].workspace_bytes > workspace)
            workspace = st->layers[li].workspace_bytes;
        for (int m = 0; m < M; m++) {
            int back = tb[m] * n + (n - 1 - li);
            add_object(o, &k, (struct arena_object){ARENA_KEPT, m, layer, 0, row.kept_bytes,
                                                    kept_first(p, s, li, m, tf, tb), back, -1});
            int fwd = tf[m] * n + li;
            add_object(o, &k, (struct arena_object){ARENA_TRANSIENT, m, layer, ARENA_FORWARD,
                                                    row.transient_bytes, fwd, fwd, -1});
            add_object(o, &k, (struct arena_object){ARENA_TRANSIENT, m, layer, ARENA_BACKWARD,
                                                    row.transient_bytes, back, back, -1});
            add_staging(o, &k, st, li, m, row.host_bytes, fwd, back, 2 * M * n - 1);
        }
    }
    add_object(o, &k, (struct arena_object){ARENA_WORKSPACE, -1, -1, 0, workspace, 0,
                                            2 * M * n - 1, -1});
    free(tf);
    free(tb);
    *out = o;
    *count = k;
    return ERR_OK;
}

/* ---- layouts ---- */

static int cmp_int64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int64_t arena_best_gap(const struct arena_object *o, int n, const struct arena_object *obj)
{
    /* (offset, end) pairs of the placed objects live with obj, by offset */
    int64_t(*busy)[2] = malloc(sizeof *busy * (size_t)(n + 1));
    int nb = 0;
    for (int i = 0; busy != NULL && i < n; i++)
        if (o[i].offset >= 0 && &o[i] != obj && arena_lifetimes_meet(&o[i], obj)) {
            busy[nb][0] = o[i].offset;
            busy[nb++][1] = o[i].offset + o[i].bytes;
        }
    if (busy == NULL)
        return arena_extent(o, n); /* out of memory: on top of everything is still valid */
    qsort(busy, (size_t)nb, sizeof *busy, cmp_int64);
    int64_t end = 0, best = -1, best_gap = INT64_MAX;
    for (int i = 0; i < nb; i++) {
        int64_t gap = busy[i][0] - end;
        if (gap >= obj->bytes && gap < best_gap) {
            best = end;
            best_gap = gap;
        }
        if (busy[i][1] > end)
            end = busy[i][1];
    }
    free(busy);
    return best >= 0 ? best : end;
}

/* Object indices, largest first (ties: earlier lifetime, then listing order). */
static const struct arena_object *sort_base;
static int by_size(const void *pa, const void *pb)
{
    const struct arena_object *a = &sort_base[*(const int *)pa], *b = &sort_base[*(const int *)pb];
    if (a->bytes != b->bytes)
        return a->bytes > b->bytes ? -1 : 1;
    if (a->first != b->first)
        return a->first < b->first ? -1 : 1;
    return *(const int *)pa - *(const int *)pb;
}

int arena_greedy(struct arena_problem *pb, const struct arena_options *opt,
                 struct arena_result *r, struct err *e)
{
    int *order = malloc(sizeof *order * (size_t)(pb->n + 1));
    if (order == NULL)
        return err_set(e, ERR_FAIL, "out of memory ordering %d objects", pb->n);
    for (int i = 0; i < pb->n; i++) {
        order[i] = i;
        pb->o[i].offset = -1;
    }
    sort_base = pb->o;
    qsort(order, (size_t)pb->n, sizeof *order, by_size);
    for (int i = 0; i < pb->n; i++)
        pb->o[order[i]].offset = arena_best_gap(pb->o, pb->n, &pb->o[order[i]]);
    free(order);
    return ERR_OK;
}

static int by_first(const void *pa, const void *pb)
{
    const struct arena_object *a = &sort_base[*(const int *)pa], *b = &sort_base[*(const int *)pb];
    if (a->first != b->first)
        return a->first < b->first ? -1 : 1;
    return *(const int *)pa - *(const int *)pb;
}

/* The slots carving's staging (the runtime's pool, exec.h): buffers of the largest staging
 * object above `base`, each object, in order of first tick, in the lowest-numbered buffer
 * whose objects have all ended (as few buffers as the most staging objects live at once). */
static int slots_staging(struct arena_problem *pb, int64_t base, struct err *e)
{
    int64_t size = 0;
    int k = 0;
    int *order = malloc(sizeof *order * (size_t)(pb->n + 1));
    int *ends = malloc(sizeof *ends * (size_t)(pb->n + 1)); /* per buffer: its last tick */
    if (order == NULL || ends == NULL) {
        free(order);
        free(ends);
        return err_set(e, ERR_FAIL, "out of memory laying out %d staging objects", pb->n);
    }
    for (int i = 0; i < pb->n; i++)
        if (pb->o[i].kind == ARENA_STAGING) {
            order[k++] = i;
            size = pb->o[i].bytes > size ? pb->o[i].bytes : size;
        }
    sort_base = pb->o;
    qsort(order, (size_t)k, sizeof *order, by_first);
    int n_buf = 0;
    for (int i = 0; i < k; i++) {
        struct arena_object *b = &pb->o[order[i]];
        int buf = 0;
        while (buf < n_buf && ends[buf] >= b->first)
            buf++;
        n_buf += buf == n_buf;
        ends[buf] = b->last;
        b->offset = base + buf * size;
    }
    free(order);
    free(ends);
    return ERR_OK;
}

int arena_slots(struct arena_problem *pb, const struct arena_options *opt,
                struct arena_result *r, struct err *e)
{
    /* a slot holds one micro-batch's kept objects in layer order */
    int64_t slot = 0, transient = 0, workspace = 0;
    int last_layer = -1;
    for (int i = 0; i < pb->n; i++) {
        const struct arena_object *b = &pb->o[i];
        if (b->kind == ARENA_KEPT && b->micro == 0)
            slot += b->bytes;
        if (b->kind == ARENA_TRANSIENT && b->bytes > transient)
            transient = b->bytes;
        if (b->kind == ARENA_WORKSPACE)
            workspace = b->bytes;
    }
    int64_t at = 0, top = (int64_t)pb->in_flight * slot;
    for (int i = 0; i < pb->n; i++) {
        struct arena_object *b = &pb->o[i];
        if (b->kind == ARENA_KEPT && b->micro == 0 && b->layer != last_layer) {
            b->offset = at;
            at += b->bytes;
            last_layer = b->layer;
        }
    }
    for (int i = 0; i < pb->n; i++) {
        struct arena_object *b = &pb->o[i];
        if (b->kind == ARENA_KEPT) {
            for (int j = 0; j < pb->n; j++) /* the micro-batch 0 object of the same layer */
                if (pb->o[j].kind == ARENA_KEPT && pb->o[j].micro == 0 &&
                    pb->o[j].layer == b->layer) {
                    b->offset = (int64_t)(b->micro % pb->in_flight) * slot + pb->o[j].offset;
                    break;
                }
        } else if (b->kind != ARENA_STAGING) {
            b->offset = b->kind == ARENA_TRANSIENT ? top : top + transient;
        }
    }
    return slots_staging(pb, top + transient + workspace, e);
}

double arena_clock_ms(void)
{
    return 1e3 * clock_now_s();
}

int arena_layout(struct arena_object *o, int n, int in_flight, const struct arena_options *opt,
                 struct arena *a, struct arena_result *r, struct err *e)
{
    const struct arena_method *m = arena_method_find(opt->method);
    memset(a, 0, sizeof *a);
    *r = (struct arena_result){0};
    a->objects = o;
    a->n = n;
    if (m == NULL)
        return err_set(e, ERR_INPUT, "--arena: \"%s\", expected slots, greedy, ga or exact",
                       opt->method);
    snprintf(a->method, sizeof a->method, "%s", m->name);
    struct arena_problem pb = {o, n, in_flight};
    double t0 = arena_clock_ms();
    ERR_TRY(m->fn(&pb, opt, r, e));
    a->solve_ms = arena_clock_ms() - t0;
    a->bytes = arena_extent(o, n);
    a->lower_bound_bytes = arena_lower_bound(o, n);
    a->host_bytes = arena_above_cap(o, n, opt->cap_bytes);
    a->proven = r->proven;
    a->note = r->note;
    return arena_check(a, e);
}

/* Lays stage s's arena out into a fresh *out. */
static int arena_stage_layout(const struct plan *p, int s, const struct arena_options *opt,
                              struct arena **out, struct err *e)
{
    struct arena_object *o;
    int n;
    struct arena_result r;
    struct arena *a = calloc(1, sizeof *a);
    if (a == NULL)
        return err_set(e, ERR_FAIL, "out of memory planning stage %d's arena", s);
    if (arena_stage_objects(p, s, &o, &n, e) ||
        arena_layout(o, n, p->stages[s].in_flight, opt, a, &r, e)) {
        arena_free(a);
        free(a);
        return e->code;
    }
    *out = a;
    return ERR_OK;
}

/* Whether layer li of stage s may send all it keeps to the host and does not yet (a layer
 * that sends one option's tensors may: it then sends them all). */
static int may_offload(const struct plan *p, const struct plan_stage *st, int li)
{
    struct cost_row row = cost_row(&st->layers[li], st->actions[li].choice);
    return st->actions[li].place == COST_PLACE_DEVICE && row.kept_bytes > 0 &&
           cost_whole_offload(&p->model, li, st->first + li);
}

static void to_host(struct plan_stage *st, int li)
{
    st->actions[li].place = COST_PLACE_HOST;
    st->actions[li].offload_option = -1;
    st->actions[li].prefetch_ahead = COST_PREFETCH_AHEAD;
}

/* The layers whose kept objects lie above the cap go to host memory (their fitness bytes);
 * when none of them may, the layer that may with the most kept bytes. 0: none may. */
static int offload_above_cap(const struct plan *p, struct plan_stage *st, const struct arena *a,
                             int64_t cap)
{
    int moved = 0, best = -1;
    for (int i = 0; i < a->n; i++) {
        const struct arena_object *b = &a->objects[i];
        int li = b->layer - st->first;
        if (b->kind == ARENA_KEPT && b->offset + b->bytes > cap && may_offload(p, st, li)) {
            to_host(st, li);
            moved++;
        }
    }
    for (int li = 0; !moved && li < plan_stage_layer_count(st); li++)
        if (may_offload(p, st, li) &&
            (best < 0 || cost_row(&st->layers[li], st->actions[li].choice).kept_bytes >
                             cost_row(&st->layers[best], st->actions[best].choice).kept_bytes))
            best = li;
    if (best >= 0) {
        to_host(st, best);
        moved++;
    }
    return moved;
}

/* Refuses stage s, whose arena `a` stays over the cap: the numbers and why. */
static int cap_refusal(const struct plan *p, int s, const struct arena_options *opt,
                       const struct arena *a, const char *why, struct err *e)
{
    return err_set(e, ERR_NOFIT, "stage %d (%s, layers %d-%d): the %s arena of %lld bytes "
                   "(lower bound %lld) is over --arena-cap %lld: %lld bytes must go to host "
                   "memory, but %s", s, p->stages[s].device, p->stages[s].first,
                   p->stages[s].last, a->method, (long long)a->bytes,
                   (long long)a->lower_bound_bytes, (long long)opt->cap_bytes,
                   (long long)a->host_bytes, why);
}

/* Stage s laid out under the cap: while its arena is over it, the layers above it become
 * offloads and the stage is laid out again (each round offloads one more layer at least, so
 * it ends); refused with the numbers when offload is not allowed, the stage has no host
 * memory or no layer is left to offload, or the host memory is exceeded. */
static int stage_under_cap(struct plan *p, int s, const struct arena_options *opt,
                           struct arena **a, int *changed, struct err *e)
{
    struct plan_stage *st = &p->stages[s];
    while (opt->cap_bytes > 0 && (*a)->bytes > opt->cap_bytes) {
        struct stage_cost c;
        if (!opt->offload)
            return cap_refusal(p, s, opt, *a, "--actions does not allow offload", e);
        if (st->host_limit_bytes <= 0 || !st->host_link.present)
            return cap_refusal(p, s, opt, *a, "the stage has no host_memory_bytes and "
                               "host_link to offload to", e);
        if (!offload_above_cap(p, st, *a, opt->cap_bytes))
            return cap_refusal(p, s, opt, *a, "no layer is left that may be offloaded", e);
        plan_stage_cost(p, st, &c);
        if (c.host_memory_bytes > st->host_limit_bytes)
            return cap_refusal(p, s, opt, *a, "offloading enough of it would take more host "
                               "memory than the stage's host_memory_bytes", e);
        *changed = 1;
        arena_free(*a);
        free(*a);
        *a = NULL;
        ERR_TRY(arena_stage_layout(p, s, opt, a, e));
    }
    return ERR_OK;
}

int arena_plan(struct plan *p, const struct arena_options *opt, struct err *e)
{
    int changed = 0;
    for (int s = 0; s < p->n_stages; s++) {
        struct plan_stage *st = &p->stages[s];
        struct arena *a = NULL;
        if (arena_stage_layout(p, s, opt, &a, e) || stage_under_cap(p, s, opt, &a, &changed, e)) {
            if (a != NULL)
                arena_free(a);
            free(a);
            return e->code;
        }
        if (st->arena != NULL) {
            arena_free(st->arena);
            free(st->arena);
        }
        st->arena = a;
    }
    if (changed) /* offloads the cap made: their host memory, copies and the iteration */
        ERR_TRY(planner_finish(p, e));
    for (int s = 0; s < p->n_stages; s++) {
        struct stage_cost c;
        plan_stage_cost(p, &p->stages[s], &c);
        p->stages[s].memory_bytes = cost_memory_with_arena(&c, p->stages[s].arena->bytes);
    }
    return ERR_OK;
}

void arena_explain(FILE *f, const struct plan *p, int s)
{
    const struct arena *a = p->stages[s].arena;
    const struct plan_stage *st = &p->stages[s];
    struct stage_cost c;
    plan_stage_cost(p, st, &c);
    fprintf(f, "stage %d arena (%s): %lld bytes, lower bound %lld (x%.4f), slots carving %lld "
            "(staging pool included), proven: %s%s%s%s, %.1f ms, %d objects\n",
            s, a->method, (long long)a->bytes, (long long)a->lower_bound_bytes,
            a->lower_bound_bytes ? (double)a->bytes / (double)a->lower_bound_bytes : 1.0,
            (long long)(cost_arena_bytes(&c) + c.staging_bytes),
            a->proven ? "true" : "false", a->note != NULL ? " (" : "",
            a->note != NULL ? a->note : "", a->note != NULL ? ")" : "", a->solve_ms,
            a->n);
    if (a->host_bytes > 0)
        fprintf(f, "  %lld bytes lie above the device cap: they must go to host memory\n",
                (long long)a->host_bytes);
    fprintf(f, "  %-9s %6s %6s %8s %14s %8s %8s %14s\n", "kind", "micro", "layer", "phase",
            "bytes", "first", "last", "offset");
    for (int i = 0; i < a->n; i++) {
        const struct arena_object *b = &a->objects[i];
        fprintf(f, "  %-9s %6d %6d %8s %14lld %8d %8d %14lld\n", arena_kind_name(b->kind),
                b->micro, b->layer,
                arena_kind_phased(b->kind) ? (b->phase ? "backward" : "forward") : "-",
                (long long)b->bytes, b->first, b->last, (long long)b->offset);
    }
}
