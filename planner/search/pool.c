#include "pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "framework.h"
#include "jsonio.h"
#include "pool_bound.h"
#include "replicas.h"

/* A candidate's --repartition gets the time left over this many. */
#define POOL_TIME_SHARE 4
/* The ranking may take this share of --time-limit; past it, the candidates ranked so far are
 * planned (and the answer carries no certified gap). */
#define POOL_RANK_SHARE 0.5
/* Candidates ranked between two looks at the clock. */
#define POOL_CLOCK_EVERY 4096

/* A candidate of the enumeration with its lower bound (candidate_bound): one dp, or (the
 * pruned search) every dp from dp to dp_hi, its bound holding for each. Its place in the
 * exhaustive order (ties go to the first): dp, size, then kind after kind unused, tp, stages. */
struct pool_candidate {
    double bound;
    int dp, dp_hi;
    short size, tp[POOL_KINDS_MAX], stages[POOL_KINDS_MAX]; /* size: index in sizes */
    short refined; /* bound: pool_refine's (else candidate_bound's) */
};

/* The search's state: the pool, the candidate being built and the best so far. */
struct pool_state {
    const struct pool_model *pm;
    const struct plan_options *o;
    struct pool_costs_cache *costs;
    int dp, dp_hi, size, tp[POOL_KINDS_MAX], stages[POOL_KINDS_MAX]; /* dp_hi: the range's */
    int block_hi; /* the enumeration's: the most dp of the range being enumerated */
    struct plan *best;
    int have_best;
    struct pool_candidate best_at; /* the best's place in the exhaustive order */
    struct pool_result *r;
    /* the pruned search collects the `keep` least bounds a pass, then plans them in order */
    int prune;
    long keep;
    struct pool_candidate *cands;
    long n_cands, cap_cands, dropped; /* kept this pass (at most keep, and the splits of
                                         ranges), and left for the next */
    int pass;
    struct pool_candidate floor; /* the last pass's greatest kept: the rest come after it */
    double deadline, rank_deadline; /* clock_now_s seconds (INFINITY: no --time-limit) */
    int rank_stopped; /* the first ranking ran past rank_deadline: what it saw is planned */
    int pass_stopped; /* a later pass's ranking ran past the deadline */
    long visits;
    /* the last candidate's summary (summary_of): its costs' serials and its M */
    long summary_serial[POOL_KINDS_MAX];
    struct pool_shape summary_shape;
    struct pool_summary summary;
    int summary_known;
    /* the least certified bound over the candidates decided so far */
    double lower_bound;
};

static int64_t candidate_B(const struct pool_state *st)
{
    return pool_model_batches(st->pm, st->size);
}

/* The most micro-batches a replica takes: B dealt over dp (of a range: its most dp's, the
 * least of them). */
static int candidate_M(const struct pool_state *st)
{
    return (int)((candidate_B(st) + st->dp_hi - 1) / st->dp_hi);
}

/* The candidate in st as a candidate of the enumeration (its bound not set). */
static struct pool_candidate candidate_of(const struct pool_state *st)
{
    struct pool_candidate c = {.dp = st->dp, .dp_hi = st->dp_hi, .size = (short)st->size};
    for (int k = 0; k < st->pm->K; k++)
        c.tp[k] = (short)st->tp[k], c.stages[k] = (short)st->stages[k];
    return c;
}

/* The exhaustive order: dp, size, then kind after kind (unused first, then tp and stages). */
static int by_order(const struct pool_candidate *a, const struct pool_candidate *b)
{
    if (a->dp != b->dp)
        return a->dp < b->dp ? -1 : 1;
    if (a->size != b->size)
        return a->size < b->size ? -1 : 1;
    for (int k = 0; k < POOL_KINDS_MAX; k++) {
        int x = a->stages[k] > 0 ? a->tp[k] : 0, y = b->stages[k] > 0 ? b->tp[k] : 0;
        if (x != y)
            return x < y ? -1 : 1;
        if (a->stages[k] != b->stages[k])
            return a->stages[k] < b->stages[k] ? -1 : 1;
    }
    return 0;
}

static struct pool_pipe candidate_pipe(const struct pool_state *st)
{
    struct pool_pipe p = {.size = st->size, .dp = st->dp, .M = candidate_M(st)};
    memcpy(p.tp, st->tp, sizeof p.tp);
    memcpy(p.stages, st->stages, sizeof p.stages);
    return p;
}

/* The candidate's --repartition options: the best step so far as its cutoff (the search's
 * bound holds for recompute only, so not with offload or the host optimizer), and a share of
 * the time left (the first candidate planned gets a little even past the limit: there is an
 * answer). */
static struct plan_options candidate_options(const struct pool_state *st)
{
    struct plan_options o = *st->o;
    o.repartition = 1;
    o.range_cache = st->pm->ranges;
    o.cutoff_ms = st->prune && st->have_best && o.actions == PLAN_ACTION_RECOMPUTE
                      ? st->best->iteration_ms
                      : 0;
    if (!isinf(st->deadline))
        o.time_limit_s = fmax((st->deadline - clock_now_s()) / POOL_TIME_SHARE, 1e-3);
    return o;
}

/* What the candidate's planning proved: its certified bound (at least `bound`, INFINITY when
 * nothing fits), into the pool's, and whether it searched to the end. */
static void candidate_proved(struct pool_state *st, int rc, const struct plan *p, double bound)
{
    double proved = rc == ERR_NOFIT && !p->search.present ? INFINITY : bound;
    if (p->search.present) {
        proved = fmax(proved, p->search.lower_bound);
        st->r->nodes += p->search.nodes;
        st->r->splits += p->search.splits;
        st->r->exhausted &= p->search.exhausted;
    }
    st->lower_bound = fmin(st->lower_bound, proved);
}

static int could_step(struct pool_state *st, double x);

/* The candidate in st kept as the best, its micro-batches dealt. */
static int keep_best(struct pool_state *st, struct plan *p, struct err *e)
{
    if (replicas_deal(p, candidate_B(st), e)) {
        plan_free(p);
        return e->code;
    }
    if (st->have_best)
        plan_free(st->best);
    *st->best = *p;
    st->have_best = 1;
    st->best_at = candidate_of(st);
    st->r->dp = st->dp;
    st->r->micro_batches = p->micro_batches;
    st->r->micro_batch = st->pm->sizes[st->size];
    st->r->batches = (long)candidate_B(st);
    memcpy(st->r->tp, st->tp, sizeof st->tp);
    memcpy(st->r->stages, st->stages, sizeof st->stages);
    return ERR_OK;
}

/* Plans the candidate in st (of lower bound `bound`; `full`: cannot_fit says it cannot fit,
 * planned only by the exhaustive search); keeps it when it fits and steps faster than the
 * best. */
static int evaluate_pipe(struct pool_state *st, double bound, int full, struct err *e)
{
    struct pool_pipe pipe = candidate_pipe(st);
    struct cluster c;
    struct plan p;
    struct plan_options o = candidate_options(st);
    int framework = !framework_is_ballast(o.framework);
    if (framework && candidate_B(st) % st->dp != 0) { /* frameworks deal micro-batches evenly */
        st->r->unrunnable++;
        return ERR_OK;
    }
    if (pool_model_cluster(st->pm, &pipe, &c, e))
        return e->code;
    memset(&p, 0, sizeof p);
    int rc = planner_make(&c, &o, &p, e);
    cluster_free(&c);
    if (framework && rc == ERR_INPUT) { /* what it cannot say or run (plan_for.c) */
        st->r->unrunnable++;
        err_clear(e);
        return ERR_OK;
    }
    st->r->candidates++;
    if (rc == ERR_NOFIT || rc == ERR_OK)
        candidate_proved(st, rc, &p, bound);
    if (rc == ERR_NOFIT) {
        st->r->cut += p.search.present && !isinf(p.search.lower_bound);
        err_clear(e);
        return ERR_OK;
    }
    if (rc)
        return rc;
    st->r->fitted++;
    st->r->refuted_but_fits += full || !could_step(st, p.iteration_ms);
    st->r->bound_ratio = fmax(st->r->bound_ratio, bound / p.iteration_ms);
    /* ties go to the earliest in the exhaustive order, as without pruning */
    struct pool_candidate at = candidate_of(st);
    if (st->have_best && (p.iteration_ms > st->best->iteration_ms ||
                          (p.iteration_ms == st->best->iteration_ms &&
                           by_order(&at, &st->best_at) > 0))) {
        plan_free(&p);
        return ERR_OK;
    }
    return keep_best(st, &p, e);
}

/* The candidate in st as the bounds see it; 0 when a kind's stage is unknown (no bound). */
static int pipe_shape_of(struct pool_state *st, struct pool_shape *s)
{
    s->used = 0;
    s->L = model_layer_count(&st->pm->model);
    s->M = candidate_M(st);
    s->schedule = st->pm->schedule;
    s->recompute_only = st->o->actions == PLAN_ACTION_RECOMPUTE;
    for (int k = 0; k < st->pm->K; k++) {
        if (st->stages[k] == 0)
            continue;
        /* a range's: the most sharding of its most dp, the least reduction of its least */
        const struct pool_costs *c =
            pool_costs_get(st->costs, k, st->tp[k], st->size, st->dp_hi, st->dp);
        if (c == NULL || !c->known)
            return 0;
        s->costs[s->used] = c;
        s->stages[s->used++] = st->stages[k];
    }
    return s->used > 0;
}

/* The candidate's shape and summary: the summary kept from the last candidate when only the
 * stage counts differ (the enumeration varies those innermost). 0: no bound. */
static int summary_of(struct pool_state *st, struct pool_shape *s, struct pool_summary *sum)
{
    if (!pipe_shape_of(st, s))
        return 0;
    int same = st->summary_known && s->used == st->summary_shape.used &&
               s->M == st->summary_shape.M;
    for (int u = 0; same && u < s->used; u++)
        same = s->costs[u] == st->summary_shape.costs[u] &&
               s->costs[u]->serial == st->summary_serial[u];
    if (!same) {
        pool_summarize(s, &st->summary);
        st->summary_shape = *s;
        for (int u = 0; u < s->used; u++)
            st->summary_serial[u] = s->costs[u]->serial;
        st->summary_known = 1;
    }
    *sum = st->summary;
    return 1;
}

static double candidate_bound(struct pool_state *st)
{
    struct pool_shape s;
    struct pool_summary sum;
    return summary_of(st, &s, &sum) ? pool_bound(&s, &sum) : 0;
}

/* Whether some order and split of the candidate in st could step in x ms (pool_bound.h). */
static int could_step(struct pool_state *st, double x)
{
    struct pool_shape s;
    return !pipe_shape_of(st, &s) || pool_could_step(&s, x);
}

static int cannot_fit(struct pool_state *st)
{
    struct pool_shape s;
    struct pool_summary sum;
    return summary_of(st, &s, &sum) && pool_cannot_fit(&s, &sum);
}

/* Whether a candidate of this bound could replace the best by more than the search gap
 * (evaluate_pipe's order; with no gap, a tie earlier in the exhaustive order does). */
static int may_win(const struct pool_state *st, const struct pool_candidate *c)
{
    if (!st->have_best)
        return 1;
    double least = c->bound * (1 + st->o->search_gap);
    return least < st->best->iteration_ms ||
           (least == st->best->iteration_ms && by_order(c, &st->best_at) < 0);
}

static int pipes_by_bound(const void *a, const void *b)
{
    const struct pool_candidate *x = a, *y = b;
    if (x->bound != y->bound)
        return x->bound < y->bound ? -1 : 1;
    return by_order(x, y);
}

/* Binary heaps of candidates by (bound, order): least first for sign 1, greatest for -1. */
static void heap_down(struct pool_candidate *h, long n, long i, int sign)
{
    for (;;) {
        long top = i, l = 2 * i + 1, r = l + 1;
        if (l < n && sign * pipes_by_bound(&h[l], &h[top]) < 0)
            top = l;
        if (r < n && sign * pipes_by_bound(&h[r], &h[top]) < 0)
            top = r;
        if (top == i)
            return;
        struct pool_candidate t = h[i];
        h[i] = h[top];
        h[top] = t;
        i = top;
    }
}

static void heap_up(struct pool_candidate *h, long i, int sign)
{
    while (i > 0 && sign * pipes_by_bound(&h[i], &h[(i - 1) / 2]) < 0) {
        struct pool_candidate t = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

/* The candidate in st, with its bound, into this pass's `keep` least (a heap, greatest
 * first); one an earlier pass took is passed over, and one that cannot beat the best is left
 * with its bound. */
static void collect(struct pool_state *st)
{
    if (cannot_fit(st)) {
        st->r->cannot_fit += st->pass == 0 ? st->dp_hi - st->dp + 1 : 0; /* nothing to bound */
        return;
    }
    struct pool_candidate c = candidate_of(st);
    c.bound = candidate_bound(st);
    st->r->enumerated += st->pass == 0 ? st->dp_hi - st->dp + 1 : 0;
    if (st->pass > 0 && pipes_by_bound(&c, &st->floor) <= 0)
        return;
    if (st->have_best && !may_win(st, &c)) {
        st->lower_bound = fmin(st->lower_bound, c.bound);
        return;
    }
    if (st->n_cands < st->keep) {
        st->cands[st->n_cands] = c;
        heap_up(st->cands, st->n_cands++, -1);
        return;
    }
    st->dropped++;
    if (pipes_by_bound(&c, &st->cands[0]) < 0) {
        st->cands[0] = c;
        heap_down(st->cands, st->n_cands, 0, -1);
    }
}

/* Whether the ranking must stop here: past its share of --time-limit (looked at every
 * POOL_CLOCK_EVERY candidates). */
static int rank_past(struct pool_state *st)
{
    if (st->rank_stopped || st->pass_stopped)
        return 1;
    if (!st->prune || isinf(st->deadline) || ++st->visits % POOL_CLOCK_EVERY != 0)
        return 0;
    if (st->pass == 0) /* the first ranking: past its share, what it saw is planned */
        return st->rank_stopped = clock_now_s() > st->rank_deadline;
    return st->pass_stopped = clock_now_s() > st->deadline; /* a later pass: the end */
}

/* One candidate of the enumeration: collected with its bound (pruned: a range of dp, to the
 * most the shape's GPUs allow), or planned. */
static int visit(struct pool_state *st, struct err *e)
{
    st->dp_hi = st->block_hi;
    for (int k = 0; k < st->pm->K; k++)
        if (st->stages[k] > 0) {
            int64_t fit = st->pm->kind[k].count / ((int64_t)st->stages[k] * st->tp[k]);
            st->dp_hi = fit < st->dp_hi ? (int)fit : st->dp_hi;
        }
    if (st->prune) {
        collect(st);
        return ERR_OK;
    }
    int full = cannot_fit(st);
    st->r->cannot_fit += full;
    st->r->enumerated += !full; /* as the pruned search counts them */
    return evaluate_pipe(st, candidate_bound(st), full, e);
}

/* Every tp and stage count of kind k and the kinds after it, `used` stages so far (at most
 * the model's layers, at least one). */
static int choose_kind(struct pool_state *st, int k, int used, struct err *e)
{
    if (rank_past(st))
        return ERR_OK;
    if (k >= st->pm->K)
        return used < 1 ? ERR_OK : visit(st, e);
    int L = model_layer_count(&st->pm->model);
    st->tp[k] = 1;
    st->stages[k] = 0; /* the kind unused */
    if (choose_kind(st, k + 1, used, e))
        return e->code;
    for (int t = 1; t <= st->pm->kind[k].per_node; t++) {
        struct err skip;
        err_clear(&skip);
        if (cluster_check_tp(&st->pm->model, t, "", &skip))
            continue;
        st->tp[k] = t;
        for (int64_t s = 1; s * t * st->dp <= st->pm->kind[k].count && used + s <= L; s++) {
            st->stages[k] = (int)s;
            if (choose_kind(st, k + 1, used + (int)s, e))
                return e->code;
        }
    }
    return ERR_OK;
}

/* Every dp a replica of at least one GPU allows and every micro-batch size, and under them
 * every choose_kind: the pruned search takes the dps in ranges, 1, 2-3, 4-7, ... (its bounds
 * split them as they are taken), the exhaustive one each alone. The most replicas first: when
 * --time-limit cuts the ranking short, what it saw holds the pool's larger answers (the order
 * of the answer's ties is by_order's, whatever the enumeration's). */
static int enumerate(struct pool_state *st, struct err *e)
{
    int64_t gpus = 0, top = 1;
    for (int k = 0; k < st->pm->K; k++)
        gpus += st->pm->kind[k].count;
    while (top * 2 <= gpus) /* the first dp of the last range */
        top *= 2;
    for (int64_t lo = st->prune ? top : gpus; lo >= 1; lo = st->prune ? lo / 2 : lo - 1)
        for (st->size = 0; st->size < st->pm->n_sizes; st->size++) {
            int64_t most = candidate_B(st) < gpus ? candidate_B(st) : gpus;
            int64_t hi = st->prune ? 2 * lo - 1 : lo;
            if (st->pm->only_dp != 0) /* the file's one dp */
                hi = lo <= st->pm->only_dp && st->pm->only_dp <= hi ? st->pm->only_dp : 0;
            st->dp = st->pm->only_dp != 0 ? (int)hi : (int)lo;
            st->block_hi = (int)(hi < most ? hi : most);
            if (st->dp >= 1 && st->dp <= st->block_hi && choose_kind(st, 0, 0, e))
                return e->code;
        }
    return ERR_OK;
}

/* Splits of the gap between two bounds when a candidate's is refined (pool_refine). */
#define POOL_REFINE_STEPS 8

static void load_candidate(struct pool_state *st, const struct pool_candidate *c)
{
    st->dp = c->dp;
    st->dp_hi = c->dp_hi;
    st->size = c->size;
    for (int k = 0; k < st->pm->K; k++)
        st->tp[k] = c->tp[k], st->stages[k] = c->stages[k];
}

/* The candidate in st (of bound c->bound) refined by pool_could_step: a bound no split of it
 * can step under, searched up to the best step less the gap (none: doubled until some split
 * could). *refuted: not even that is in reach (the bound returned is then it). */
static double pool_refine(struct pool_state *st, const struct pool_candidate *c, int *refuted)
{
    double lo = c->bound, hi = 2 * fmax(lo, 1e-9);
    if (st->have_best)
        hi = st->best->iteration_ms / (1 + st->o->search_gap);
    else
        for (int i = 0; i < 30 && !could_step(st, hi); i++)
            lo = hi, hi *= 2;
    if ((*refuted = st->have_best && !could_step(st, hi)) != 0)
        return hi;
    for (int i = 0; i < POOL_REFINE_STEPS && lo < hi; i++) {
        double mid = lo + (hi - lo) / 2;
        if (could_step(st, mid))
            hi = mid;
        else
            lo = mid;
    }
    return lo;
}

/* The candidate in st, its bound made (at least `least`), onto the heap of n (least first;
 * grown). */
static int heap_push(struct pool_state *st, double least, long *n, struct err *e)
{
    if (*n == st->cap_cands) {
        long cap = 2 * st->cap_cands;
        struct pool_candidate *grown = realloc(st->cands, (size_t)cap * sizeof *grown);
        if (grown == NULL)
            return err_set(e, ERR_FAIL, "out of memory");
        st->cands = grown;
        st->cap_cands = cap;
    }
    if (cannot_fit(st))
        return ERR_OK; /* no plan: nothing to bound */
    struct pool_candidate c = candidate_of(st);
    c.bound = fmax(candidate_bound(st), least);
    st->cands[*n] = c;
    heap_up(st->cands, (*n)++, 1);
    return ERR_OK;
}

/* The range at the top of the heap of n split in two halves, each pushed with its bound
 * (each at least the range's, refined: fewer dp each). */
static int split_range(struct pool_state *st, long *n, struct err *e)
{
    struct pool_candidate range = st->cands[0];
    st->cands[0] = st->cands[--*n];
    heap_down(st->cands, *n, 0, 1);
    int mid = range.dp + (range.dp_hi - range.dp) / 2;
    load_candidate(st, &range);
    st->dp_hi = mid;
    if (heap_push(st, range.bound, n, e))
        return e->code;
    load_candidate(st, &range);
    st->dp = mid + 1;
    return heap_push(st, range.bound, n, e);
}

/* The pass's candidates taken least bound first (ties: the exhaustive order): one whose bound
 * is the cheap one gets it refined (pool_refine) and goes back; a refined one is planned, and
 * one that cannot beat the best left with its refined bound. *stopped when the least bound
 * cannot beat the best, or at the time limit: a candidate left keeps its bound in the
 * certified one (the bounds after it, this pass's and the next's, are no less). */
static int take_best_first(struct pool_state *st, int *stopped, struct err *e)
{
    /* a heap, least first */
    qsort(st->cands, (size_t)st->n_cands, sizeof *st->cands, pipes_by_bound);
    *stopped = 0;
    for (long n = st->n_cands; n > 0;) {
        struct pool_candidate *c = &st->cands[0];
        int timed_out = st->have_best && clock_now_s() > st->deadline;
        if (timed_out || !may_win(st, c)) {
            /* what is left of this pass bounds no less; the later passes' no less than the
             * floor (split ranges may have gone past it: then they go on) */
            st->lower_bound = fmin(st->lower_bound, c->bound);
            st->r->exhausted &= !timed_out;
            *stopped = timed_out || st->dropped == 0 || !may_win(st, &st->floor);
            if (*stopped && st->dropped > 0)
                st->lower_bound = fmin(st->lower_bound, st->floor.bound);
            return ERR_OK;
        }
        /* refined only beside a best (it can refute nothing before): the first plan comes
         * at once, the least bound's */
        int range = c->dp < c->dp_hi, refine = st->have_best && clock_now_s() <= st->deadline;
        if (range && (c->refined || !refine)) { /* its two halves, each bounded */
            if (split_range(st, &n, e))
                return e->code;
            continue;
        }
        load_candidate(st, c);
        int refuted = 0;
        if (!c->refined && refine) { /* refuted, a range's whole */
            c->bound = fmax(c->bound, pool_refine(st, c, &refuted));
            c->refined = 1;
            if (!refuted) {
                heap_down(st->cands, n, 0, 1);
                continue;
            }
        }
        struct pool_candidate taken = *c;
        st->cands[0] = st->cands[--n];
        heap_down(st->cands, n, 0, 1);
        if (refuted) { /* no split could beat the best */
            st->r->refuted += taken.dp_hi - taken.dp + 1;
            st->lower_bound = fmin(st->lower_bound, taken.bound);
            continue;
        }
        if (evaluate_pipe(st, taken.bound, 0, e))
            return e->code;
    }
    return ERR_OK;
}

/* Passes over the enumeration, each taking its `keep` least bounds after the last pass's,
 * until the search stops or no candidate is left. */
static int search_pruned(struct pool_state *st, struct err *e)
{
    st->cap_cands = st->keep + 1;
    if ((st->cands = malloc((size_t)st->cap_cands * sizeof *st->cands)) == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (st->pass = 0;; st->pass++) {
        int stopped;
        st->n_cands = st->dropped = 0;
        if (enumerate(st, e))
            return e->code;
        if (st->pass_stopped) { /* what is left comes after the last floor */
            st->lower_bound = fmin(st->lower_bound, st->floor.bound);
            st->r->exhausted = 0;
            return ERR_OK;
        }
        if (st->n_cands == 0)
            return ERR_OK;
        st->floor = st->cands[0];
        if (take_best_first(st, &stopped, e) || stopped || st->dropped == 0 || st->rank_stopped)
            return e->code;
    }
}

/* The pool's certified gap on the best plan, where --repartition's goes: its lower bound is
 * the least over every candidate of what its search proved or, left unplanned, its bound;
 * none when the ranking stopped before it saw every candidate. */
static void pool_certify(struct pool_state *st)
{
    struct plan *p = st->best;
    /* --for: the bounds are of Ballast's own activations, and a framework's may keep less */
    st->r->for_framework = !framework_is_ballast(st->o->framework);
    int uncertified = st->rank_stopped || st->r->for_framework;
    double bound = uncertified ? 0 : fmin(st->lower_bound, p->iteration_ms);
    st->r->ranked = !st->rank_stopped;
    st->r->lower_bound = bound;
    st->r->gap = bound > 0 ? p->iteration_ms / bound - 1 : -1;
    p->optimality_gap = st->r->gap;
    p->search.present = 1;
    p->search.nodes = st->r->nodes;
    p->search.splits = st->r->splits;
    p->search.exhausted = st->r->exhausted && !st->rank_stopped;
    p->search.lower_bound = bound;
}

int pool_search_model(const struct pool_model *pm, const struct plan_options *o, long prune,
                      double deadline, struct plan *best, struct pool_result *r,
                      struct err *e)
{
    memset(r, 0, sizeof *r);
    if (o->method != METHOD_OPTIMAL)
        return err_set(e, ERR_INPUT, "%s: pool: the pool search plans with --method optimal",
                       pm->file);
    struct pool_state st = {.pm = pm, .o = o, .best = best, .r = r, .prune = prune > 0,
                            .keep = prune, .lower_bound = INFINITY, .deadline = deadline,
                            .rank_deadline = INFINITY};
    if (!isinf(deadline))
        st.rank_deadline = clock_now_s() + POOL_RANK_SHARE * (deadline - clock_now_s());
    r->exhausted = 1;
    r->n_kinds = pm->K;
    for (int k = 0; k < pm->K; k++)
        snprintf(r->device[k], sizeof r->device[k], "%s", pm->kind[k].device);
    int rc = pool_costs_cache_make(pm, o->actions, 1, &st.costs, e);
    if (rc == ERR_OK)
        rc = prune ? search_pruned(&st, e) : enumerate(&st, e);
    pool_costs_cache_free(st.costs);
    free(st.cands);
    if (rc == ERR_OK && !st.have_best)
        rc = err_set(e, ERR_NOFIT,
                     "%s: pool: no candidate (dp, tp and stages per device kind) fits: of %ld, "
                     "%ld were left as their GPUs cannot hold the model's state (weights, "
                     "gradients, optimizer state), and none of the %ld planned fits%s",
                     pm->file, r->enumerated + r->cannot_fit, r->cannot_fit, r->candidates,
                     st.rank_stopped ? " (stopped at --time-limit)" : "");
    if (rc == ERR_OK)
        pool_certify(&st);
    if (rc && st.have_best)
        plan_free(best);
    return rc;
}

int pool_search_pruned(const char *file, const struct plan_options *o, long prune,
                       struct plan *best, struct pool_result *r, struct err *e)
{
    struct pool_model pm;
    double deadline = o->time_limit_s > 0 ? clock_now_s() + o->time_limit_s : INFINITY;
    memset(r, 0, sizeof *r);
    cJSON *root = jsonio_read_kind(file, JSONIO_CLUSTER, e);
    if (root == NULL)
        return e->code;
    int rc = pool_model_load(root, file, o, deadline, &pm, e);
    cJSON_Delete(root);
    if (rc == ERR_OK) {
        rc = pool_search_model(&pm, o, prune, deadline, best, r, e);
        pool_model_free(&pm);
    }
    return rc;
}

int pool_search(const char *file, const struct plan_options *o, struct plan *best,
                struct pool_result *r, struct err *e)
{
    return pool_search_pruned(file, o, POOL_KEEP, best, r, e);
}

void pool_print(FILE *f, const struct pool_result *r)
{
    int pp = 0;
    for (int k = 0; k < r->n_kinds; k++)
        pp += r->stages[k];
    long less = (long)r->dp * r->micro_batches - r->batches; /* replicas taking one fewer */
    fprintf(f, "pool: %ld candidates planned, %ld fit; the fastest: dp %d x pp %d x tp (by kind), "
               "%d micro-batches a replica",
            r->candidates, r->fitted, r->dp, pp, r->micro_batches);
    if (less > 0)
        fprintf(f, " (%ld of them %d: %ld in all)", less, r->micro_batches - 1, r->batches);
    fprintf(f, ";");
    for (int k = 0; k < r->n_kinds; k++)
        fprintf(f, " %s %d stages of tp %d%s", r->device[k], r->stages[k], r->tp[k],
                k + 1 < r->n_kinds ? "," : "\n");
    fprintf(f, "pool search: micro-batch size %d; of %ld candidates %ld planned (%ld found "
               "nothing faster than the best so far), %ld left as their GPUs cannot hold the "
               "model's state, %ld as no split of theirs could beat the best, the rest by "
               "their bound; ",
            r->micro_batch, r->enumerated + r->cannot_fit, r->candidates, r->cut, r->cannot_fit,
            r->refuted);
    if (r->unrunnable > 0)
        fprintf(f, "%ld the framework cannot run (--for); ", r->unrunnable);
    if (r->gap >= 0)
        fprintf(f, "certified gap %.3f%% (no candidate steps faster than %.3f ms)%s\n",
                100 * r->gap, r->lower_bound,
                r->exhausted ? "" : "; stopped at the time limit or node budget");
    else if (r->for_framework)
        fprintf(f, "no certified gap: with --for the bounds are of Ballast's activations, "
                   "which the framework's may undercut\n");
    else
        fprintf(f, "no certified gap: --time-limit stopped the ranking of the candidates\n");
}
