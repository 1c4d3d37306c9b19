#include "pool_mixed.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "fit_index.h"
#include "framework.h"
#include "jsonio.h"
#include "pool_bound.h"
#include "repartition.h"
#include "sim.h"

/* Bounds are scaled down a little so that rounding never lifts one over a simulated step. */
#define MIX_ROUNDING (1 - 1e-9)
/* Nodes a group's search stopped by its node budget takes the second time, per node of the
 * budget. */
#define MIX_AGAIN_NODES 1000
/* M tried below a capacity by the whole bound (shape_cap). */
#define MIX_CAP_LOOKS 8
/* Steps of the search between two looks at the clock (some, such as a first group's
 * capacity, take milliseconds). */
#define MIX_CLOCK_EVERY 16
/* The capacity table is built again once the step to beat has fallen this much below the one
 * it was built for. */
#define MIX_TABLE_STALE 1.01
/* A table of more cells than this gives way to one per kind (pool_mixed.h; looser). */
#define MIX_TABLE_CELLS ((int64_t)1 << 24)
/* Menu entries the first look for seconds beside a first reads (doubled each look after). */
#define MIX_FITS_RUN 4096
/* Cells the table is cleared and closed by between looks at the clock. */
#define MIX_TABLE_CHUNK ((int64_t)1 << 16)
/* Probes of the bisection for the certificate of a search --time-limit stopped (its
 * precision: 2^-probes of the step); each builds the table again. */
#define MIX_BISECT_PROBES 7
/* The share of the time left that the search leaves for that bisection. */
#define MIX_BISECT_SHARE 0.1
/* The table is made again from the menu once one in MIX_TABLE_LOWERED of its caps has been
 * lowered since; the menu is sorted again (and its index made again, which takes twice as
 * long as the table) once one in MIX_MENU_RESORT has. */
#define MIX_TABLE_LOWERED 8
#define MIX_MENU_RESORT 2
/* Family summaries kept (a hash table). */
#define MIX_FAMILIES 4096
/* Planned groups kept (a hash table, grown). */
#define MIX_PLANNED_MIN 256

/* A shape: per kind its tp and stages (0: unused); code: its number, the same wherever it is
 * enumerated. */
struct mix_shape {
    int tp[POOL_KINDS_MAX], S[POOL_KINDS_MAX];
    int64_t n[POOL_KINDS_MAX]; /* GPUs a replica takes */
    uint64_t code;
};

/* A group: dp replicas of a shape. */
struct mix_group {
    struct mix_shape x;
    int dp;
    int64_t cap; /* micro-batches it could take under the table's T */
};

/* What bounds the capacity of a family of shapes (the same tp per kind): pool_bound's summary
 * of its costs at the most favourable dp and replica count, whatever the stage counts. */
struct mix_family {
    int used; /* 0: empty slot */
    int size, tp[POOL_KINDS_MAX];
    int known;
    struct pool_summary sum;
    struct pool_costs own[POOL_KINDS_MAX]; /* copies: the cache's entries move on */
    /* per M (1..B): the summary's M work + tail there (pool_summary_at), made when first
       asked for (its wholes 0: not yet, < 0: unknown) */
    struct family_at {
        double whole[POOL_KINDS_MAX], wholes;
    } *at;
    struct pool_prefixes *sums; /* pool_could_step's, made when first asked for */
};

/* A group pipeline at one M, planned once (or refuted). */
struct mix_planned {
    int used;
    uint64_t code;
    int dp, M, size;
    int state; /* 0: not planned; 1: planned (fits or not) */
    int fits;
    struct plan plan;
    struct replicas_pipe pipe;
    /* refuted: no split of it steps alone under refuted_x when it reduces with at least
       refuted_N replicas (pool_could_step) */
    double refuted_x;
    int refuted_N;
    /* planned: no pair holding its plan with floor_N replicas or more steps under floor_ms
       (replicas_step_floor; 0: none known) */
    double floor_ms;
    int floor_N;
    /* planned, its searches stopped before proving the plan its best: no pair holding the
       group steps faster than `unproved` (stopped_bound; 0: proved) */
    double unproved;
    /* the entry of M 0, one per shape and dp: from gone_M micro-batches on, no pair holding
       the group steps under T (a search proved it at gone_M: no split of it steps alone
       under T, or none with its gradients reduced over dp + 1 replicas, the fewest a pair
       reduces over; 0: none known) */
    int gone_M;
};

/* A shape's capacities under T, kept: by pool_could_step (shape_cap_tight), exact or only an
 * upper bound (what a single probe proved); and by the bounds alone (shape_cap) for the last
 * T asked (the tables', the leads' and the firsts' alike). */
struct mix_tight {
    uint64_t code;
    double T, loose_T; /* -1: none yet */
    int64_t cap, loose_cap;
    int used, size, exact;
};

/* A shape on the table's menu: its code, its capacity under the table's T, and that over the
 * GPUs a replica takes. */
struct mix_entry {
    uint64_t code;
    int64_t cap;
    double density;
    int64_t n[POOL_KINDS_MAX]; /* GPUs a replica takes, per kind */
    int64_t gpus;
};

/* A shape that could be a pair's first group (taking half the micro-batches or more), and a
 * lower bound on the step of every pair it leads. */
struct mix_lead {
    uint64_t code;
    double bound;
    double promise; /* lead_shape's */
    int searched;
};

struct mix_key {
    uint64_t code;
    int dp, M, size;
};

struct mix_state {
    const struct pool_model *pm;
    struct plan_options o;
    struct pool_costs_cache *costs;
    int size;
    int64_t B;
    int L;
    double deadline;
    double best_ms; /* the step to beat: the homogeneous best, then the best found */
    struct pool_mixed_result *r;
    /* the table: per cell (GPUs of each kind, mixed radix), the most micro-batches one group
     * fitting them could take under table_T */
    double table_T;
    int64_t *table, stride[POOL_KINDS_MAX], cells;
    int64_t *per_kind[POOL_KINDS_MAX]; /* without a table: per kind and its GPUs */
    struct mix_entry *menu; /* every shape of some capacity under table_T, densest first */
    int64_t n_menu, cap_menu;
    int64_t menu_lowered;  /* caps lowered since the table was made from the menu */
    int64_t menu_unsorted; /* caps lowered since the menu was sorted */
    /* the menu's capacities and GPUs, indexed (fit_index.h) for menu_fits; n_indexed: its
     * entries, 0 after a sort */
    fit_index_t *fit_index;
    int64_t n_indexed;
    int64_t *fitting, n_fitting, cap_fitting; /* menu_fits': menu entries */
    struct mix_family *family;
    struct mix_planned *planned;
    int64_t n_planned, cap_planned;
    struct mix_tight *tight;
    int64_t n_tight, cap_tight;
    double *floors; /* B + 1 of them: struct first's */
    struct mix_lead *leads; /* the shapes that could lead a pair, least bound first */
    int64_t n_leads, cap_leads;
    int64_t cap_guess; /* the last cap_first's answer */
    double rate[POOL_KINDS_MAX]; /* kind_rates' */
    long ticks;
    /* the least bound of the pairs decided on a plan left unproved (INFINITY: none): the
     * larger of that group's bound and, for a second, its first's floor */
    double unproved;
    int early; /* group_gone and group_reduced_refuted prune */
    int once;  /* a group's search stopped by its budget is not run again */
    int stop_lead; /* the search stops after its first lead, as --time-limit would */
    int stopped;
    int skip; /* the shapes' enumeration under way is over (each_shape) */
    /* the best pair: its groups' entries */
    int have_best;
    struct mix_key best_key[POOL_GROUPS_MAX];
};

static double mix_T(const struct mix_state *st)
{
    return st->best_ms / (1 + st->o.search_gap);
}

/* Whether the time limit has passed (looked at every few calls). */
static int mix_stopped(struct mix_state *st)
{
    if (!st->stopped && !isinf(st->deadline) && ++st->ticks % MIX_CLOCK_EVERY == 0 &&
        clock_now_s() > st->deadline)
        st->stopped = st->r->timed_out = 1;
    return st->stopped;
}

/* Whether the deadline has passed, looked at now (the table's passes are long: mix_stopped
 * counts calls). */
static int table_past(struct mix_state *st)
{
    if (!st->stopped && !isinf(st->deadline) && clock_now_s() > st->deadline)
        st->stopped = st->r->timed_out = 1;
    return st->stopped;
}

/* An array of n items of `size` bytes with room for one more (doubled when full): it, or
 * NULL when out of memory (the array left as it was). */
static void *mix_grow(void *items, int64_t n, int64_t *cap, size_t size)
{
    if (n < *cap)
        return items;
    int64_t grown_cap = *cap ? 2 * *cap : 1024;
    void *grown = realloc(items, (size_t)grown_cap * size);
    if (grown != NULL)
        *cap = grown_cap;
    return grown;
}

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* ---- capacities ---------------------------------------------------------------------- */

static uint64_t family_hash(int size, const int *tp, int K)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)size;
    for (int k = 0; k < K; k++)
        h = (h ^ (uint64_t)tp[k]) * 1099511628211ull;
    return h;
}

/* The shape's family (its tps, 0 for an unused kind), summarised once. */
static struct mix_family *family_of(struct mix_state *st, const struct mix_shape *x)
{
    int tp[POOL_KINDS_MAX] = {0}, K = st->pm->K;
    for (int k = 0; k < K; k++)
        tp[k] = x->S[k] > 0 ? x->tp[k] : 0;
    uint64_t h = family_hash(st->size, tp, K);
    struct mix_family *f = NULL;
    for (int i = 0; i < MIX_FAMILIES; i++) {
        f = &st->family[(h + (uint64_t)i) % MIX_FAMILIES];
        if (!f->used || (f->size == st->size && memcmp(f->tp, tp, sizeof tp) == 0))
            break;
    }
    if (f->used)
        return f->size == st->size && memcmp(f->tp, tp, sizeof tp) == 0 ? f : NULL;
    if (table_past(st))
        return NULL; /* a family's costs take a while: none made past the deadline */
    f->used = 1;
    f->size = st->size;
    memcpy(f->tp, tp, sizeof tp);
    struct pool_shape s = {.L = st->L, .M = 1, .schedule = st->pm->schedule};
    f->known = 1;
    for (int k = 0; k < K && f->known; k++) {
        if (tp[k] == 0)
            continue;
        if (table_past(st)) { /* unknown: no bound from it (the search stops) */
            f->known = 0;
            break;
        }
        /* the most favourable replicas: every micro-batch a replica (the most sharding of
         * the optimizer) and two pipelines reducing (the least all-reduce) */
        const struct pool_costs *c =
            pool_costs_get(st->costs, k, tp[k], st->size, (int)st->B, 2);
        if (c == NULL || !c->known || pool_costs_copy(&f->own[s.used], c, st->L)) {
            f->known = 0;
            break;
        }
        struct pool_costs *own = &f->own[s.used];
        s.costs[s.used] = own;
        s.stages[s.used++] = 1;
    }
    if (f->known) {
        pool_summarize(&s, &f->sum);
        f->known = f->sum.known;
    }
    if (f->known && (f->at = calloc((size_t)st->B + 1, sizeof *f->at)) == NULL)
        f->known = 0; /* no memory: no bound */
    return f;
}

/* pool_bound_at of s (a shape of the family f) at s->M, the family's part at s->M made once. */
static double family_bound_at(const struct mix_family *f, const struct pool_shape *s)
{
    struct family_at *at = &f->at[(int64_t)s->M];
    struct pool_summary sum = f->sum;
    if (at->wholes == 0) {
        if (pool_summary_at(s, &sum)) {
            memcpy(at->whole, sum.whole, sizeof at->whole);
            at->wholes = sum.wholes > 0 ? sum.wholes : -1;
        } else
            at->wholes = -1;
    }
    if (at->wholes < 0)
        return pool_bound_first(s, &f->sum);
    memcpy(sum.whole, at->whole, sizeof sum.whole);
    sum.wholes = at->wholes;
    return pool_bound(s, &sum);
}

/* Whether pool_bound_first of s at M is under T. */
static int first_under(struct pool_shape *s, const struct mix_family *f, int64_t M, double T)
{
    s->M = (double)M;
    return pool_bound_first(s, &f->sum) < T;
}

/* The most M at which pool_bound_first of s is under T (0: none): it rises with M, so a
 * search from the last shape's answer (the shapes come in order, their answers near each
 * other's), galloping away from it, then halving. */
static int64_t cap_first(struct mix_state *st, struct pool_shape *s, const struct mix_family *f,
                         double T)
{
    int64_t lo = 0, hi = st->B; /* under at lo (lo 0: none), not at hi + 1 */
    int64_t guess = st->cap_guess < 1 ? 1 : st->cap_guess > hi ? hi : st->cap_guess;
    if (first_under(s, f, guess, T))
        for (int64_t step = 1, at; (lo = guess) < hi; guess = at, step *= 2) {
            at = guess + step > hi ? hi : guess + step;
            if (!first_under(s, f, at, T)) {
                hi = at - 1;
                break;
            }
        }
    else
        for (int64_t step = 1, at; (hi = guess - 1) > lo; guess = at, step *= 2) {
            at = guess - step < 1 ? 1 : guess - step;
            if (first_under(s, f, at, T)) {
                lo = at;
                break;
            }
        }
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (first_under(s, f, mid, T))
            lo = mid;
        else
            hi = mid - 1;
    }
    st->cap_guess = lo;
    return lo;
}

/* The most micro-batches a replica of x could take with its step under T (0: none). */
static int64_t shape_cap_of(struct mix_state *st, const struct mix_shape *x, double T)
{
    const struct mix_family *f = family_of(st, x);
    if (f == NULL || !f->known)
        return st->B; /* nothing known: no bound */
    struct pool_shape s = {.L = st->L, .schedule = st->pm->schedule};
    for (int k = 0, u = 0; k < st->pm->K; k++)
        if (x->S[k] > 0) {
            s.costs[u] = &f->own[u];
            s.stages[u++] = x->S[k];
            s.used = u;
        }
    int64_t lo = cap_first(st, &s, f, T);
    /* every stage's end with its tail (pool_bound's (2)) only lowers it: looked for
     * downwards from lo, a few steps at most (that bound need not rise with M step by step,
     * so what is left unlooked at stays in) */
    for (int look = 0; look < MIX_CAP_LOOKS && lo > 0; look++, lo--) {
        s.M = (double)lo;
        if (family_bound_at(f, &s) < T)
            break;
    }
    return lo;
}

/* The family's costs as pool_bound.h's shape of x at M (0: unknown). */
static int family_shape(struct mix_state *st, const struct mix_shape *x, int64_t M,
                        struct pool_shape *s, struct mix_family **f)
{
    *f = family_of(st, x);
    if (*f == NULL || !(*f)->known)
        return 0;
    *s = (struct pool_shape){.L = st->L, .M = (double)M, .schedule = st->pm->schedule,
                             .recompute_only = st->o.actions == PLAN_ACTION_RECOMPUTE};
    for (int k = 0; k < st->pm->K; k++)
        if (x->S[k] > 0) {
            s->costs[s->used] = &(*f)->own[s->used];
            s->stages[s->used++] = x->S[k];
        }
    return 1;
}

/* pool_could_step of s, a shape of the family f, with the family's sums. */
static int family_could_step(struct mix_family *f, const struct pool_shape *s, double T)
{
    if (f->sums == NULL && (f->sums = pool_prefixes_make(s)) == NULL)
        return 1; /* no memory: nothing proved */
    return pool_could_step_with(s, f->sums, T);
}

static uint64_t tight_hash(uint64_t code, int size)
{
    return (code ^ ((uint64_t)size << 56)) * 0x9e3779b97f4a7c15ull;
}

/* The kept capacities, twice as many slots (-1: no memory). */
static int tight_grow(struct mix_state *st)
{
    int64_t cap = st->cap_tight ? 2 * st->cap_tight : MIX_PLANNED_MIN;
    struct mix_tight *grown = calloc((size_t)cap, sizeof *grown);
    if (grown == NULL)
        return -1;
    for (int64_t i = 0; i < st->cap_tight; i++)
        for (int64_t j = 0; st->tight[i].used; j++) {
            struct mix_tight *t = &grown[(tight_hash(st->tight[i].code, st->tight[i].size) +
                                          (uint64_t)j) % (uint64_t)cap];
            if (!t->used) {
                *t = st->tight[i];
                break;
            }
        }
    free(st->tight);
    st->tight = grown;
    st->cap_tight = cap;
    return 0;
}

/* x's entry in the kept capacities (NULL: no memory). An entry found stays where it is: the
 * table grows only for a new one. */
static struct mix_tight *tight_of(struct mix_state *st, const struct mix_shape *x)
{
    for (;;) {
        for (int64_t i = 0; st->cap_tight > 0; i++) {
            struct mix_tight *t = &st->tight[(tight_hash(x->code, st->size) + (uint64_t)i) %
                                             (uint64_t)st->cap_tight];
            if (t->used && t->code == x->code && t->size == st->size)
                return t;
            if (t->used)
                continue;
            if (2 * (st->n_tight + 1) > st->cap_tight)
                break; /* new, and no room kept for it */
            *t = (struct mix_tight){.used = 1, .code = x->code, .size = st->size, .T = -1,
                                    .loose_T = -1};
            st->n_tight++;
            return t;
        }
        if (tight_grow(st))
            return NULL;
    }
}

/* shape_cap_of, kept per shape for the last T asked; no more than a capacity shape_cap_tight
 * kept for T or a higher one (an upper bound here too), so that a table made for a lower T
 * keeps what the probes found. */
static int64_t shape_cap(struct mix_state *st, const struct mix_shape *x, double T)
{
    struct mix_tight *t = tight_of(st, x);
    int64_t cap;
    if (t != NULL && t->loose_T == T)
        cap = t->loose_cap;
    else {
        cap = shape_cap_of(st, x, T);
        if (t != NULL)
            t->loose_T = T, t->loose_cap = cap;
    }
    return t != NULL && t->T >= T && t->cap < cap ? t->cap : cap;
}

/* shape_cap refined: the most M at which some order and split of x could step under T
 * (pool_could_step, with the family's most favourable costs), kept per shape and computed
 * again once T has fallen MIX_TABLE_STALE below the T it was for. Callers that need only
 * `at_least`, and will ask again as low as `down_to` (a first at more micro-batches leaves a
 * second fewer), get, when a single probe at the lower of the two fails, an upper bound under
 * it: could_step falls with M, so that one refutation answers them all (nearly every shape a
 * second is sought among ends so); else the exact capacity. A cap kept for a higher T stays
 * an upper bound (could_step falls with T too): one under `at_least` answers such a caller
 * however stale (a best found 1% lower made every cap kept stale, and 9% of the time went to
 * probing them again), and any bounds the probes. */
static int64_t shape_cap_tight(struct mix_state *st, const struct mix_shape *x, double T,
                               int64_t at_least, int64_t down_to)
{
    struct mix_tight *t = tight_of(st, x);
    int over = t != NULL && t->T >= T; /* its cap an upper bound here */
    int fresh = over && (t->T <= T * MIX_TABLE_STALE || t->cap == 0);
    if ((fresh && t->exact) || (over && t->cap < at_least))
        return t->cap;
    int64_t lo = 0, hi = fresh ? t->cap : shape_cap(st, x, T); /* t->cap's bound in both */
    struct pool_shape s;
    struct mix_family *f;
    int exact = 1;
    if (hi > 0 && family_shape(st, x, 1, &s, &f)) {
        int64_t least = down_to < at_least ? down_to : at_least;
        if (least > 1 && least <= hi) { /* one probe first, where they will go */
            s.M = (double)least;
            if (family_could_step(f, &s, T))
                lo = least;
            else
                hi = least - 1, exact = 0, lo = hi;
        }
        if (exact && at_least > least && at_least <= hi) { /* and one where this one asks */
            s.M = (double)at_least;
            if (family_could_step(f, &s, T))
                lo = at_least;
            else
                hi = at_least - 1;
        }
        while (exact && lo < hi) { /* could_step(lo) (lo 0: none), not could_step(hi + 1) */
            int64_t mid = lo + (hi - lo + 1) / 2;
            s.M = (double)mid;
            if (family_could_step(f, &s, T))
                lo = mid;
            else
                hi = mid - 1;
        }
    } else
        lo = hi;
    if (t != NULL)
        t->T = T, t->cap = lo, t->exact = exact;
    return lo;
}

/* The most replicas of x the pool holds beside another group (which takes a micro-batch at
 * least), within `left` GPUs. */
static int64_t shape_dp_max(const struct mix_state *st, const struct mix_shape *x,
                            const int64_t *left)
{
    int64_t most = st->B - 1;
    for (int k = 0; k < st->pm->K; k++)
        if (x->n[k] > 0)
            most = min64(most, left[k] / x->n[k]);
    return most;
}

static int64_t table_at(const struct mix_state *st, const int64_t *v)
{
    if (st->table == NULL) {
        int64_t least = st->B;
        for (int k = 0; k < st->pm->K; k++)
            least = min64(least, st->per_kind[k][v[k]]);
        return least;
    }
    int64_t at = 0;
    for (int k = 0; k < st->pm->K; k++)
        at += v[k] * st->stride[k];
    return st->table[at];
}

static void table_put(struct mix_state *st, const int64_t *v, int64_t cap)
{
    if (st->table == NULL) {
        for (int k = 0; k < st->pm->K; k++)
            if (st->per_kind[k][v[k]] < cap)
                st->per_kind[k][v[k]] = cap;
        return;
    }
    int64_t at = 0;
    for (int k = 0; k < st->pm->K; k++)
        at += v[k] * st->stride[k];
    if (st->table[at] < cap)
        st->table[at] = cap;
}


/* The table's running maximum along each kind: a cell holds the most of any group fitting. */
static void table_close(struct mix_state *st)
{
    const struct pool_model *pm = st->pm;
    if (st->table == NULL) {
        for (int k = 0; k < pm->K; k++)
            for (int64_t i = 1; i <= pm->kind[k].count; i++)
                if (st->per_kind[k][i] < st->per_kind[k][i - 1])
                    st->per_kind[k][i] = st->per_kind[k][i - 1];
        return;
    }
    for (int k = 0; k < pm->K; k++) {
        int64_t step = st->stride[k], block = step * (pm->kind[k].count + 1);
        for (int64_t base = 0; base < st->cells; base += block)
            for (int64_t at = base + step; at < base + block; at++) {
                if (at % MIX_TABLE_CHUNK == 0 && table_past(st))
                    return;
                if (st->table[at] < st->table[at - step])
                    st->table[at] = st->table[at - step];
            }
    }
}

/* Every shape: kind k and after chosen (unused, or tp and stages), `used` stages so far; fn
 * on each complete one. */
typedef int (*shape_fn)(struct mix_state *st, const struct mix_shape *x, void *arg,
                        struct err *e);

static int each_shape(struct mix_state *st, struct mix_shape *x, int k, int used,
                      const int64_t *left, shape_fn fn, void *arg, struct err *e)
{
    const struct pool_model *pm = st->pm;
    if (mix_stopped(st) || st->skip)
        return ERR_OK;
    if (k == pm->K)
        return used > 0 ? fn(st, x, arg, e) : ERR_OK;
    /* the code: a digit per kind, 0 when unused */
    uint64_t radix = (uint64_t)(pm->kind[k].per_node + 1) * (uint64_t)(st->L + 1);
    uint64_t code = x->code;
    x->S[k] = 0, x->tp[k] = 1, x->n[k] = 0;
    x->code = code * radix;
    if (each_shape(st, x, k + 1, used, left, fn, arg, e))
        return e->code;
    for (int t = 1; t <= pm->kind[k].per_node; t++) {
        struct err skip;
        err_clear(&skip);
        if (cluster_check_tp(&pm->model, t, "", &skip))
            continue;
        x->tp[k] = t;
        for (int s = 1; (int64_t)s * t <= left[k] && used + s <= st->L; s++) {
            x->S[k] = s;
            x->n[k] = (int64_t)s * t;
            x->code = code * radix + (uint64_t)t * (uint64_t)(st->L + 1) + (uint64_t)s;
            if (each_shape(st, x, k + 1, used + s, left, fn, arg, e))
                return e->code;
        }
    }
    x->code = code;
    x->S[k] = 0, x->tp[k] = 1, x->n[k] = 0;
    return ERR_OK;
}

/* Every group of the menu's entry m: its capacity into the table. */
static void menu_put(struct mix_state *st, const struct mix_entry *m)
{
    int64_t most = st->B - 1, v[POOL_KINDS_MAX];
    for (int k = 0; k < st->pm->K; k++)
        if (m->n[k] > 0)
            most = min64(most, st->pm->kind[k].count / m->n[k]);
    for (int64_t dp = 1; dp <= most; dp++) {
        for (int k = 0; k < st->pm->K; k++)
            v[k] = dp * m->n[k];
        table_put(st, v, min64(dp * m->cap, st->B));
    }
}

/* Every group of shape x: its capacity into the table. */
static int table_shape(struct mix_state *st, const struct mix_shape *x, void *arg,
                       struct err *e)
{
    const double *T = arg;
    st->r->shapes++;
    int64_t cap = shape_cap(st, x, *T), gpus = 0;
    if (cap == 0)
        return ERR_OK;
    for (int k = 0; k < st->pm->K; k++)
        gpus += x->n[k];
    struct mix_entry *menu = mix_grow(st->menu, st->n_menu, &st->cap_menu, sizeof *menu);
    if (menu == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    st->menu = menu;
    struct mix_entry *m = &st->menu[st->n_menu++];
    *m = (struct mix_entry){x->code, cap, (double)cap / (double)gpus, {0}, gpus};
    memcpy(m->n, x->n, sizeof m->n);
    menu_put(st, m);
    return ERR_OK;
}

static int by_density(const void *pa, const void *pb)
{
    const struct mix_entry *a = pa, *b = pb;
    if (a->density != b->density)
        return a->density > b->density ? -1 : 1;
    return (a->code > b->code) - (a->code < b->code);
}

/* The shape of a code (each_shape's numbering: a digit per kind, the last kind's least). */
static void shape_of_code(const struct mix_state *st, uint64_t code, struct mix_shape *x)
{
    x->code = code;
    for (int k = st->pm->K - 1; k >= 0; k--) {
        uint64_t radix = (uint64_t)(st->pm->kind[k].per_node + 1) * (uint64_t)(st->L + 1);
        uint64_t digit = code % radix;
        code /= radix;
        x->tp[k] = digit == 0 ? 1 : (int)(digit / (uint64_t)(st->L + 1));
        x->S[k] = (int)(digit % (uint64_t)(st->L + 1));
        x->n[k] = (int64_t)x->tp[k] * x->S[k];
    }
}

/* The menu sorted by density, as its caps are now. `again`: it was sorted, and only the
 * entries whose caps were lowered since then are out of place: those are sorted alone and
 * merged back into the others, in order still (the same order as sorting all of them). */
static void menu_sort(struct mix_state *st, int again)
{
    struct mix_entry *moved = again ? malloc((size_t)st->n_menu * sizeof *moved) : NULL;
    int64_t kept = 0, n_moved = 0;
    for (int64_t i = 0; i < st->n_menu; i++) {
        struct mix_entry m = st->menu[i];
        double density = (double)m.cap / (double)m.gpus;
        int lowered = moved != NULL && density != m.density;
        m.density = density;
        if (lowered)
            moved[n_moved++] = m;
        else
            st->menu[kept++] = m;
    }
    if (moved == NULL)
        qsort(st->menu, (size_t)st->n_menu, sizeof *st->menu, by_density);
    else {
        qsort(moved, (size_t)n_moved, sizeof *moved, by_density);
        for (int64_t at = st->n_menu, a = kept, b = n_moved; b > 0;) /* from the back */
            st->menu[--at] = a > 0 && by_density(&st->menu[a - 1], &moved[b - 1]) > 0
                                 ? st->menu[--a]
                                 : moved[--b];
    }
    free(moved);
    st->menu_unsorted = 0;
    st->n_indexed = 0;
}

/* The menu's index made again (its order changed). */
static int menu_index(struct mix_state *st, struct err *e)
{
    int K = st->pm->K;
    int32_t *rows = malloc((size_t)(st->n_menu + 1) * (size_t)(K + 1) * sizeof *rows);
    for (int64_t i = 0; rows != NULL && i < st->n_menu; i++) {
        int32_t *row = rows + i * (K + 1);
        row[0] = (int32_t)st->menu[i].cap;
        for (int k = 0; k < K; k++)
            row[1 + k] = (int32_t)st->menu[i].n[k];
    }
    fit_index_free(st->fit_index);
    st->fit_index = rows == NULL ? NULL : fit_index_make(rows, st->n_menu, K);
    free(rows);
    if (st->fit_index == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    st->n_indexed = st->n_menu;
    return ERR_OK;
}

/* The menu's entries before which all of `left` at an entry's density could take `need`
 * (the densities fall along the menu; caps lowered since it was sorted leave theirs): found
 * by halving. The index made again first if the menu changed. */
static int menu_reach(struct mix_state *st, const int64_t *left, int64_t need, int64_t *end,
                      struct err *e)
{
    int64_t gpus = 0;
    for (int k = 0; k < st->pm->K; k++)
        gpus += left[k];
    if (st->cap_fitting < st->n_menu) {
        int64_t *fitting = realloc(st->fitting, (size_t)st->n_menu * sizeof *fitting);
        if (fitting == NULL)
            return err_set(e, ERR_FAIL, "out of memory");
        st->fitting = fitting;
        st->cap_fitting = st->n_menu;
    }
    if ((st->fit_index == NULL || st->n_indexed != st->n_menu) && menu_index(st, e))
        return e->code;
    int64_t lo = 0, hi = st->n_menu;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (st->menu[mid].density * (double)gpus < (double)need * MIX_ROUNDING)
            hi = mid;
        else
            lo = mid + 1;
    }
    *end = lo;
    return ERR_OK;
}

/* The menu's entries from `from` to `to` (st->fitting, in its order) whose replicas, `most`
 * at most, fit in `left` and could take `need` at the entry's capacity (fit_index.h). */
static void menu_fits(struct mix_state *st, const int64_t *left, int64_t need, int64_t most,
                      int64_t from, int64_t to)
{
    st->n_fitting = fit_index_find(st->fit_index, left, need, most, from, to, st->fitting);
}

/* The table cleared (0: stopped first). */
static int table_clear(struct mix_state *st)
{
    const struct pool_model *pm = st->pm;
    for (int64_t at = 0; st->table != NULL && at < st->cells; at += MIX_TABLE_CHUNK) {
        if (table_past(st))
            return 0;
        int64_t n = st->cells - at < MIX_TABLE_CHUNK ? st->cells - at : MIX_TABLE_CHUNK;
        memset(st->table + at, 0, (size_t)n * sizeof *st->table);
    }
    if (table_past(st))
        return 0;
    for (int k = 0; st->table == NULL && k < pm->K; k++)
        memset(st->per_kind[k], 0, (size_t)(pm->kind[k].count + 1) * sizeof *st->per_kind[k]);
    return 1;
}

/* The table made again from the menu's caps as lowered (any group's capacity is still at
 * most its entry's), and the menu sorted again by them when many were (its densities upper
 * bounds while unsorted). */
static void menu_tighten(struct mix_state *st)
{
    if (table_past(st))
        return;
    if (MIX_MENU_RESORT * st->menu_unsorted > st->n_menu)
        menu_sort(st, 1);
    st->menu_lowered = 0;
    if (!table_clear(st))
        return;
    for (int64_t i = 0; i < st->n_menu; i++)
        menu_put(st, &st->menu[i]);
    table_close(st);
}

/* The table for T (stopped: left incomplete, and not to be used). */
static int table_build(struct mix_state *st, double T, struct err *e)
{
    const struct pool_model *pm = st->pm;
    int64_t all[POOL_KINDS_MAX];
    struct mix_shape x = {.code = 0};
    for (int k = 0; k < pm->K; k++)
        all[k] = pm->kind[k].count;
    if (!table_clear(st))
        return ERR_OK;
    st->table_T = T;
    st->n_menu = st->n_indexed = st->menu_lowered = 0;
    if (each_shape(st, &x, 0, 0, all, table_shape, &T, e))
        return e->code;
    table_close(st);
    if (!table_past(st))
        menu_sort(st, 0);
    return ERR_OK;
}

static int table_alloc(struct mix_state *st, struct err *e)
{
    const struct pool_model *pm = st->pm;
    st->cells = 1;
    for (int k = 0; k < pm->K; k++) {
        st->stride[k] = st->cells;
        st->cells = st->cells > MIX_TABLE_CELLS ? st->cells : st->cells * (pm->kind[k].count + 1);
    }
    if (st->cells <= MIX_TABLE_CELLS)
        st->table = malloc((size_t)st->cells * sizeof *st->table);
    for (int k = 0; st->table == NULL && k < pm->K; k++)
        if ((st->per_kind[k] = malloc((size_t)(pm->kind[k].count + 1) *
                                      sizeof *st->per_kind[k])) == NULL)
            return err_set(e, ERR_FAIL, "out of memory");
    return ERR_OK;
}

/* ---- whether any pair could step under the table's T --------------------------------- */

/* A first group x of dp replicas and its capacity; what is left for the second. */
static int first_group(struct mix_state *st, const struct mix_shape *x, int64_t dp,
                       int64_t cap, int64_t *left, int64_t *need)
{
    for (int k = 0; k < st->pm->K; k++)
        left[k] = st->pm->kind[k].count - dp * x->n[k];
    *need = st->B - min64(dp * cap, st->B);
    *need = *need < 1 ? 1 : *need; /* the second group takes a micro-batch at least */
    return table_at(st, left) >= *need;
}

static int any_pair_shape(struct mix_state *st, const struct mix_shape *x, void *arg,
                          struct err *e)
{
    int *found = arg;
    int64_t all[POOL_KINDS_MAX], left[POOL_KINDS_MAX], need;
    (void)e;
    if (*found)
        return ERR_OK;
    int64_t cap = shape_cap(st, x, st->table_T);
    for (int k = 0; k < st->pm->K; k++)
        all[k] = st->pm->kind[k].count;
    for (int64_t dp = 1, most = shape_dp_max(st, x, all); cap > 0 && dp <= most && !*found; dp++)
        *found = first_group(st, x, dp, cap, left, &need);
    return ERR_OK;
}

/* Whether the table (built for T) allows any pair. */
static int any_pair(struct mix_state *st, double T, int *found, struct err *e)
{
    int64_t all[POOL_KINDS_MAX];
    struct mix_shape x = {.code = 0};
    *found = 0;
    if (table_build(st, T, e))
        return e->code;
    for (int k = 0; k < st->pm->K; k++)
        all[k] = st->pm->kind[k].count;
    if (each_shape(st, &x, 0, 0, all, any_pair_shape, found, e))
        return e->code;
    *found |= st->stopped; /* not proved */
    return ERR_OK;
}

/* The least T (within the bisection's precision, between lo, under which no pair steps,
 * and hi, where the table allows a pair) at which the table allows some pair: no pair steps
 * faster. Stopped, the most proved so far (lo at least). */
static int pairs_bound(struct mix_state *st, double lo, double hi, double *bound,
                       struct err *e)
{
    for (int i = 0; i < MIX_BISECT_PROBES && !st->stopped; i++) {
        int found;
        double mid = lo + (hi - lo) / 2;
        if (any_pair(st, mid, &found, e))
            return e->code;
        if (found)
            hi = mid;
        else
            lo = mid;
    }
    *bound = lo;
    return ERR_OK;
}

/* ---- one group at one M -------------------------------------------------------------- */

/* Group x, dp at M reducing with N replicas in all, as pool_bound.h sees it (0: unknown). */
static int group_shape(struct mix_state *st, const struct mix_shape *x, int dp, int N,
                       int64_t M, struct pool_shape *s)
{
    *s = (struct pool_shape){.L = st->L, .M = (double)M, .schedule = st->pm->schedule,
                             .recompute_only = st->o.actions == PLAN_ACTION_RECOMPUTE};
    for (int k = 0; k < st->pm->K; k++) {
        if (x->S[k] == 0)
            continue;
        const struct pool_costs *c = pool_costs_get(st->costs, k, x->tp[k], st->size, dp, N);
        if (c == NULL || !c->known)
            return 0;
        s->costs[s->used] = c;
        s->stages[s->used++] = x->S[k];
    }
    return s->used > 0;
}

/* A lower bound on the step of any pair holding the group at M (INFINITY: its GPUs cannot
 * hold the model's state): pool_bound of its pipeline, its gradients reduced over N. The
 * replicas step only adds to it (replicas.h). */
static double group_bound(struct mix_state *st, const struct mix_shape *x, int dp, int N,
                          int64_t M)
{
    struct pool_shape s;
    struct pool_summary sum;
    if (!group_shape(st, x, dp, N, M, &s))
        return 0;
    pool_summarize(&s, &sum);
    if (pool_cannot_fit(&s, &sum))
        return INFINITY;
    return pool_bound(&s, &sum);
}

static uint64_t planned_hash(uint64_t code, int dp, int M, int size)
{
    uint64_t h = code * 0x9e3779b97f4a7c15ull;
    h ^= ((uint64_t)dp << 40) ^ ((uint64_t)M << 16) ^ (uint64_t)size;
    return h * 0xbf58476d1ce4e5b9ull;
}

/* The group's entry (made empty when first asked for; planned_reserve made room). */
static struct mix_planned *planned_of(struct mix_state *st, const struct mix_shape *x, int dp,
                                      int M)
{
    uint64_t h = planned_hash(x->code, dp, M, st->size);
    for (int64_t i = 0;; i++) {
        struct mix_planned *p = &st->planned[(h + (uint64_t)i) % (uint64_t)st->cap_planned];
        if (p->used && p->code == x->code && p->dp == dp && p->M == M && p->size == st->size)
            return p;
        if (!p->used) {
            *p = (struct mix_planned){.used = 1, .code = x->code, .dp = dp, .M = M,
                                      .size = st->size, .refuted_x = -1};
            st->n_planned++;
            return p;
        }
    }
}

/* The group's entry, or NULL when there is none. */
static struct mix_planned *planned_find(const struct mix_state *st, const struct mix_shape *x,
                                        int dp, int M)
{
    uint64_t h = planned_hash(x->code, dp, M, st->size);
    for (int64_t i = 0; st->cap_planned > 0; i++) {
        struct mix_planned *p = &st->planned[(h + (uint64_t)i) % (uint64_t)st->cap_planned];
        if (!p->used)
            return NULL;
        if (p->code == x->code && p->dp == dp && p->M == M && p->size == st->size)
            return p;
    }
    return NULL;
}

/* Whether a search proved that no pair holding the group at M steps under T (gone_M): at M
 * or more micro-batches (each stage only holds more in flight and runs longer) none does
 * either. */
static int group_gone(const struct mix_state *st, const struct mix_shape *x, int dp, int M)
{
    const struct mix_planned *g = st->early ? planned_find(st, x, dp, 0) : NULL;
    return g != NULL && g->gone_M > 0 && M >= g->gone_M;
}

/* A search proved it of the group at M (group_gone); planned_reserve made room. */
static void group_gone_from(struct mix_state *st, const struct mix_shape *x, int dp, int M)
{
    struct mix_planned *from = planned_of(st, x, dp, 0);
    from->gone_M = from->gone_M == 0 || M < from->gone_M ? M : from->gone_M;
}

/* Room for `more` entries (the table at most half full): entries move, so no pointer into it
 * outlives a call. */
static int planned_reserve(struct mix_state *st, int more, struct err *e)
{
    if (2 * (st->n_planned + more) <= st->cap_planned)
        return ERR_OK;
    int64_t cap = st->cap_planned ? 2 * st->cap_planned : MIX_PLANNED_MIN;
    while (2 * (st->n_planned + more) > cap)
        cap *= 2;
    struct mix_planned *old = st->planned, *grown = calloc((size_t)cap, sizeof *grown);
    if (grown == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int64_t old_cap = st->cap_planned;
    st->planned = grown;
    st->cap_planned = cap;
    for (int64_t i = 0; i < old_cap; i++) {
        if (!old[i].used)
            continue;
        uint64_t h = planned_hash(old[i].code, old[i].dp, old[i].M, old[i].size);
        for (int64_t j = 0;; j++) {
            struct mix_planned *p = &grown[(h + (uint64_t)j) % (uint64_t)cap];
            if (!p->used) {
                *p = old[i];
                break;
            }
        }
    }
    free(old);
    return ERR_OK;
}

static struct pool_pipe group_pipe(const struct mix_state *st, const struct mix_shape *x,
                                   int dp, int M)
{
    struct pool_pipe p = {.size = st->size, .dp = dp, .M = M, .reduce_alone = 1};
    memcpy(p.tp, x->tp, sizeof p.tp);
    memcpy(p.stages, x->S, sizeof p.stages);
    return p;
}

/* The options a group's --repartition search takes: exact (pairs are scored and refuted on
 * their groups' plans, so a plan within a gap could hide a faster pair), the pool's range
 * costs, and a quarter of the time left. */
static struct plan_options group_options(const struct mix_state *st)
{
    struct plan_options o = st->o;
    o.repartition = 1;
    o.range_cache = st->pm->ranges;
    o.search_gap = 0;
    if (!isinf(st->deadline))
        o.time_limit_s = fmax((st->deadline - clock_now_s()) / 4, 1e-3);
    return o;
}

/* The least step of any split of the group at M with its gradients reduced over dp + 1
 * replicas after each stage's last backward (its cluster's reduction, unbucketed):
 * --repartition's certified bound on that cluster, searched under the cutoff T (0: nothing
 * proved). Every plan of the group has a floor (replicas_step_floor, over N > dp replicas:
 * the same reduction, over as many or more) of that or more, and so every pair holding it,
 * at M or more micro-batches. Recompute only (the search's bound). */
static double group_reduced_bound(struct mix_state *st, const struct mix_shape *x, int dp,
                                  int M, struct err *e)
{
    if (st->o.actions != PLAN_ACTION_RECOMPUTE || isinf(st->best_ms))
        return 0;
    /* as dp + 1 replicas, the fewest a pair it leads reduces over: their optimizer shards
     * (shard_optimizer) only leave it more room, so every split steps no slower */
    struct pool_pipe pipe = group_pipe(st, x, dp + 1, M);
    struct cluster c;
    if (pool_model_cluster(st->pm, &pipe, &c, e))
        return 0;
    c.dp_bucket_bytes = 0;
    struct plan_options o = group_options(st);
    o.cutoff_ms = mix_T(st);
    struct arrangement a;
    struct plan_search found;
    int rc = repartition_search(&c, &o, &a, &found, e);
    cluster_free(&c);
    if (rc == ERR_OK)
        arrangement_free(&a);
    if (rc != ERR_OK && rc != ERR_NOFIT)
        return 0;
    err_clear(e);
    return found.present ? found.lower_bound : 0;
}

/* Whether group_reduced_bound proves that no pair holding the group at M steps under T (kept:
 * group_gone_from, for which planned_reserve made room). */
static int group_reduced_refuted(struct mix_state *st, const struct mix_shape *x, int dp, int M,
                                 struct err *e)
{
    if (!st->early)
        return 0;
    int refuted = group_reduced_bound(st, x, dp, M, e) >= mix_T(st);
    st->r->refuted += refuted;
    st->r->reduced += refuted;
    if (refuted)
        group_gone_from(st, x, dp, M);
    return refuted;
}

/* The bound of a group whose search stopped (its node budget or the time limit) before its
 * plan was proved its best: a pair holding it may step faster than with that plan, but no
 * faster than the stopped search's bound, nor than group_reduced_bound. */
static double stopped_bound(struct mix_state *st, const struct mix_shape *x,
                            const struct mix_planned *g)
{
    struct err e;
    err_clear(&e);
    return fmax(g->plan.search.lower_bound, group_reduced_bound(st, x, g->dp, g->M, &e));
}

/* The group's plan for its step alone, searched within `nodes` (its cluster's reduction over
 * its own replicas made free), under the cutoff T; *dp_link the pool's link between
 * replicas. ERR_NOFIT: none under T (plan->search what was searched). */
static int group_search(struct mix_state *st, const struct mix_shape *x, int dp, int M,
                        long nodes, struct plan *plan, struct link *dp_link, struct err *e)
{
    struct pool_pipe pipe = group_pipe(st, x, dp, M);
    struct cluster c;
    if (pool_model_cluster(st->pm, &pipe, &c, e))
        return e->code;
    *dp_link = c.stages[0].dp_link;
    for (int s = 0; s < c.n_stages; s++)
        c.stages[s].dp_link = (struct link){0};
    struct plan_options o = group_options(st);
    o.search_nodes = nodes;
    if (isfinite(st->best_ms) && o.actions == PLAN_ACTION_RECOMPUTE)
        o.cutoff_ms = mix_T(st) * (1 + 1e-9);
    int rc = planner_make(&c, &o, plan, e);
    cluster_free(&c);
    return rc;
}

/* Whether a search found its fastest split and proved it (a search whose bound reached that
 * split's step stopped on its proof). */
static int search_proved(const struct plan_search *found, int fits)
{
    return found->present && (found->exhausted || (fits && found->fastest_ms > 0 &&
                                                   found->lower_bound >=
                                                       found->fastest_ms * MIX_ROUNDING));
}

/* Plans the group at its M (once) for its step alone: its cluster's reduction over its own
 * replicas made free while planning (the reduction it shares with the other group's is
 * replicas_step's), so that the best step to beat is its --repartition cutoff as it is. The
 * plan keeps the pool's link between replicas, and its iteration_ms its own cluster's step.
 * A search that stops before proving its plan the group's best runs once more with
 * MIX_AGAIN_NODES times the nodes; one that stops again leaves the group unproved
 * (stopped_bound). */
static int group_plan(struct mix_state *st, const struct mix_shape *x, struct mix_planned *g,
                      struct err *e)
{
    struct link dp_link;
    int rc = group_search(st, x, g->dp, g->M, st->o.search_nodes, &g->plan, &dp_link, e);
    st->r->planned++;
    g->state = 1;
    if (rc != ERR_OK && rc != ERR_NOFIT)
        return rc;
    err_clear(e);
    if (!st->once && g->plan.search.present && !search_proved(&g->plan.search, rc == ERR_OK) &&
        g->plan.search.lower_bound < mix_T(st)) { /* stopped: once more, with more nodes */
        struct plan again;
        double first_bound = g->plan.search.lower_bound;
        int again_rc = group_search(st, x, g->dp, g->M, st->o.search_nodes * MIX_AGAIN_NODES,
                                    &again, &dp_link, e);
        if (rc == ERR_OK)
            plan_free(&g->plan);
        if (again_rc != ERR_OK && again_rc != ERR_NOFIT)
            return again_rc;
        err_clear(e);
        g->plan = again;
        g->plan.search.lower_bound = fmax(g->plan.search.lower_bound, first_bound);
        rc = again_rc;
    }
    g->fits = rc == ERR_OK;
    const struct plan_search *found = &g->plan.search;
    int stopped = found->present && !search_proved(found, g->fits);
    double bound = !found->present ? INFINITY
                   : stopped       ? stopped_bound(st, x, g)
                                   : found->lower_bound;
    /* nothing fits, or no pair holding it steps under T (a stopped search: stopped_bound);
     * else what a stopped search left unproved bounds the answer's certificate */
    if ((!g->fits || stopped) && bound >= mix_T(st)) {
        if (g->fits)
            plan_free(&g->plan);
        g->fits = 0;
        group_gone_from(st, x, g->dp, g->M);
    } else if (stopped)
        g->unproved = bound;
    if (!g->fits)
        return ERR_OK;
    for (int s = 0; s < g->plan.n_stages; s++)
        g->plan.stages[s].dp_link = dp_link;
    struct sim_result r;
    rc = sim_plan(&g->plan, &r, e);
    if (rc == ERR_OK) {
        g->plan.iteration_ms = r.iteration_ms;
        sim_result_free(&r);
        rc = replicas_alone(&g->plan, &g->pipe, e);
    }
    if (rc) {
        plan_free(&g->plan);
        g->fits = 0;
    }
    return rc;
}

/* Whether no pair holding the group at M steps under T with N replicas or more
 * (pool_could_step, kept: at less T and more replicas it stays refuted). */
static int group_refuted(struct mix_state *st, const struct mix_shape *x, int dp, int N, int M)
{
    double T = mix_T(st);
    struct mix_planned *g = planned_of(st, x, dp, M);
    if (g->state == 0 && g->refuted_x >= T && N >= g->refuted_N)
        return 1;
    if (g->state == 0 && group_gone(st, x, dp, M)) {
        st->r->refuted++;
        st->r->gone++;
        return 1;
    }
    if (g->state == 0 && st->o.actions == PLAN_ACTION_RECOMPUTE) {
        struct pool_shape s;
        if (group_shape(st, x, dp, N, M, &s) && !pool_could_step(&s, T)) {
            st->r->refuted++;
            g->refuted_x = T, g->refuted_N = N;
            return 1;
        }
    }
    return 0;
}

/* The group at M planned (once) when not refuted: *out when it fits and steps alone under T
 * (else NULL). planned_reserve made room. */
static int group_ready(struct mix_state *st, const struct mix_shape *x, int dp, int N, int M,
                       struct mix_planned **out, struct err *e)
{
    *out = NULL;
    if (group_refuted(st, x, dp, N, M))
        return ERR_OK;
    struct mix_planned *g = planned_of(st, x, dp, M);
    if (g->state == 0 && group_plan(st, x, g, e))
        return e->code;
    if (g->fits && g->pipe.alone_ms < mix_T(st))
        *out = g;
    return ERR_OK;
}

/* Whether no pair holding the planned group g with N replicas in all steps under T: its
 * floor (replicas_step_floor: the other group's pipeline free, its bytes none) is not, kept
 * as it only rises with N. */
static int group_floor_refuted(struct mix_state *st, struct mix_planned *g, int N,
                               struct err *e)
{
    double T = mix_T(st), floor;
    if (g->floor_N > 0 && N >= g->floor_N && g->floor_ms >= T)
        return 1;
    if (replicas_step_floor(&g->plan, &g->pipe, N, &floor, e))
        return 1;
    if (floor < T)
        return 0;
    g->floor_ms = floor, g->floor_N = N;
    return 1;
}

/* Whether the second group at M2, planned already, cannot be part of a pair under T: no
 * plan of it steps alone under T, or its floor with N replicas does not. planned_reserve made
 * room. */
static int second_refuted(struct mix_state *st, const struct mix_shape *x, int dp, int N,
                          int M2, struct err *e)
{
    struct mix_planned *g = planned_of(st, x, dp, M2);
    if (g->state == 0)
        return 0;
    if (g->unproved > 0) /* its plan may not be its best: its bound only */
        return g->unproved >= mix_T(st);
    return !g->fits || g->pipe.alone_ms >= mix_T(st) || group_floor_refuted(st, g, N, e);
}

/* ---- pairs --------------------------------------------------------------------------- */

/* The pair scored: kept when it steps faster than the best. */
static int score_pair(struct mix_state *st, const struct mix_group *a, struct mix_planned *ga,
                      const struct mix_group *b, struct mix_planned *gb, int64_t B1,
                      struct err *e)
{
    struct plan plans[2] = {ga->plan, gb->plan};
    struct replicas_pipe pipes[2] = {ga->pipe, gb->pipe};
    struct replicas_result step;
    if (replicas_step_given(plans, 2, pipes, &step, e))
        return e->code;
    st->r->splits++;
    if (step.step_ms < st->best_ms) {
        st->best_ms = step.step_ms;
        st->have_best = 1;
        st->r->n_groups = 2;
        const struct mix_group *gr[2] = {a, b};
        const struct mix_planned *g[2] = {ga, gb};
        int64_t batches[2] = {B1, st->B - B1};
        for (int i = 0; i < 2; i++) {
            struct pool_mixed_group *out = &st->r->group[i];
            st->best_key[i] = (struct mix_key){g[i]->code, g[i]->dp, g[i]->M, g[i]->size};
            out->size = st->size;
            memcpy(out->tp, gr[i]->x.tp, sizeof out->tp);
            memcpy(out->stages, gr[i]->x.S, sizeof out->stages);
            out->dp = gr[i]->dp;
            out->micro_batches = g[i]->M;
            out->batches = (long)batches[i];
        }
    }
    replicas_result_free(&step);
    return ERR_OK;
}

/* The first group at its M, beside which seconds are sought: planned when a second first
 * needs it (state 1; -1: refuted, or no plan under T; 0: not yet), and its floors
 * (replicas_step_floor) per replica count, worked out when first asked for (0: not yet). */
struct first {
    struct mix_group a;
    int M, state, gone; /* gone: no plan of it under T (nor at more micro-batches) */
    int M_last;         /* the most micro-batches first_shape may try it at */
    int64_t left[POOL_KINDS_MAX];
    double *floor; /* indexed by the replicas in all, up to B */
};

static double first_floor(struct mix_state *st, const struct first *f, int N, struct err *e)
{
    if (f->floor[N] > 0)
        return f->floor[N];
    const struct mix_planned *ga = planned_of(st, &f->a.x, f->a.dp, f->M);
    if (replicas_step_floor(&ga->plan, &ga->pipe, N, &f->floor[N], e))
        return INFINITY;
    return f->floor[N];
}

/* The first planned: 1 when it fits, steps alone under T and its floor with one more replica
 * is under T; 0 (and the seconds' enumeration over) when not. Before it is planned, a search
 * with its reduction over one more replica may prove that no pair holds it (nearly every first
 * a second gets this far beside is refuted, and so without its plan, or where its plan's floor
 * would refute it, a second search at the next M). */
static int first_ready(struct mix_state *st, struct first *f, struct err *e)
{
    if (f->state == 0) {
        struct mix_planned *ga;
        int N = f->a.dp + 1;
        if (planned_reserve(st, 2, e))
            return 0;
        ga = planned_find(st, &f->a.x, f->a.dp, f->M);
        if ((ga == NULL || ga->state == 0) && !group_refuted(st, &f->a.x, f->a.dp, N, f->M) &&
            group_reduced_refuted(st, &f->a.x, f->a.dp, f->M, e)) {
            f->gone = 1, f->state = -1, st->skip = 1;
            return 0;
        }
        if (e->code || group_ready(st, &f->a.x, f->a.dp, N, f->M, &ga, e))
            return 0;
        const struct mix_planned *planned = planned_find(st, &f->a.x, f->a.dp, f->M);
        if (planned != NULL && planned->unproved > 0) /* every pair it leads, on its plan */
            st->unproved = fmin(st->unproved, planned->unproved);
        f->gone = ga == NULL;
        f->state = ga != NULL && first_floor(st, f, N, e) < mix_T(st) && !e->code ? 1 : -1;
        st->skip = f->state < 0;
    }
    return f->state > 0;
}

/* Every second group of shape x beside the first: dp replicas within what is left, taking
 * the micro-batches the first leaves (at least one a replica), each planned and the pair
 * scored when its bound is under T. */
static int second_shape(struct mix_state *st, const struct mix_shape *x, int64_t cap,
                        struct first *f, struct err *e)
{
    const struct mix_group *a = &f->a;
    if (x->code == a->x.code)
        return ERR_OK; /* one shape: the homogeneous search's */
    int64_t most = min64(shape_dp_max(st, x, f->left), st->B - a->dp);
    int64_t need = st->B - (int64_t)a->dp * f->M;
    if (cap == 0 || most * cap < need)
        return ERR_OK;
    /* fewer replicas than need / cap would each take more than cap */
    for (int64_t dp = need > cap ? (need + cap - 1) / cap : 1; dp <= most && !mix_stopped(st);
         dp++) {
        int64_t B1 = min64((int64_t)a->dp * f->M, st->B - dp), B2 = st->B - B1;
        if (B1 <= (int64_t)a->dp * (f->M - 1))
            break; /* the first could not take its M: more seconds leave it less */
        int64_t M2 = (B2 + dp - 1) / dp;
        int N = a->dp + (int)dp;
        if (M2 > cap || (M2 > 1 && shape_cap_tight(st, x, mix_T(st), M2, M2) < M2) ||
            group_bound(st, x, (int)dp, N, M2) >= mix_T(st) ||
            group_refuted(st, x, (int)dp, N, (int)M2))
            continue;
        /* a second planned already (beside another first) whose plan no pair can hold
         * saves planning this first */
        struct mix_planned *gb, *ga;
        if (planned_reserve(st, 2, e) || second_refuted(st, x, (int)dp, N, (int)M2, e)) {
            if (e->code)
                return e->code;
            continue;
        }
        if (!first_ready(st, f, e))
            return e->code;
        double floor_a = first_floor(st, f, N, e);
        if (floor_a >= mix_T(st))
            break; /* more replicas only lengthen the first's reduction */
        st->r->pairs++;
        if (e->code || planned_reserve(st, 2, e) ||
            group_ready(st, x, (int)dp, N, (int)M2, &gb, e))
            return e->code;
        const struct mix_planned *second = planned_find(st, x, (int)dp, (int)M2);
        if (second != NULL && second->unproved > 0) /* this pair, on its plan */
            st->unproved = fmin(st->unproved, fmax(second->unproved, floor_a));
        if (gb == NULL || group_floor_refuted(st, gb, N, e)) {
            if (e->code)
                return e->code;
            continue;
        }
        ga = planned_of(st, &a->x, a->dp, f->M); /* planned already */
        struct mix_group b = {.x = *x, .dp = (int)dp};
        if (score_pair(st, a, ga, &b, gb, B1, e))
            return e->code;
    }
    return ERR_OK;
}

/* The second of menu entry i beside the first f, when its replicas could take what the first
 * leaves (`need`; `need_last` at the first's most micro-batches). */
static int second_of(struct mix_state *st, struct first *f, int64_t i, int64_t need,
                     int64_t need_last, struct err *e)
{
    /* with some capacity still: only this entry's turn lowers it */
    struct mix_entry *m = &st->menu[i];
    struct mix_shape y;
    shape_of_code(st, m->code, &y);
    int64_t most = min64(shape_dp_max(st, &y, f->left), st->B - f->a.dp);
    int64_t cap = st->table_T > mix_T(st) ? shape_cap(st, &y, mix_T(st)) : m->cap;
    /* its tight capacity at the least M a replica could take here, kept as the entry's
     * cap: the step to beat only falls while the menu lasts (its density stays, an upper
     * bound still) */
    int64_t least = (need + most - 1) / most;
    int64_t least_last = need_last > most ? (need_last + most - 1) / most : 1;
    if (cap > 0 && least > 1) {
        int64_t tight = shape_cap_tight(st, &y, mix_T(st), least, least_last);
        st->menu_lowered += tight < m->cap;
        st->menu_unsorted += tight < m->cap;
        cap = m->cap = min64(cap, tight);
        fit_index_lower(st->fit_index, i, (int32_t)cap);
    }
    return most * cap < need ? ERR_OK : second_shape(st, &y, cap, f, e);
}

/* Every second beside the first f, from the menu: densest first, until even all of what is
 * left at a shape's density could not take what the first leaves. */
static int seconds(struct mix_state *st, struct first *f, struct err *e)
{
    int64_t need = st->B - (int64_t)f->a.dp * f->M;
    int64_t need_last = st->B - (int64_t)f->a.dp * f->M_last; /* at its most micro-batches */
    if (MIX_TABLE_LOWERED * st->menu_lowered > st->n_menu)
        menu_tighten(st);
    /* enough replicas to take what the first leaves at the menu's cap (at the table's T, at
       least the best's: no less than the cap there), within what is left; found a run of
       the menu at a time, longer each time: most firsts are refuted, or their seconds'
       enumeration ends, after a few of the entries that fit */
    int64_t end = 0;
    if (menu_reach(st, f->left, need, &end, e))
        return e->code;
    for (int64_t from = 0, run = MIX_FITS_RUN; from < end && !st->skip && !mix_stopped(st);
         from += run, run *= 2) {
        menu_fits(st, f->left, need, st->B - f->a.dp, from, min64(from + run, end));
        for (int64_t at = 0; at < st->n_fitting && !st->skip && !mix_stopped(st); at++)
            if (second_of(st, f, st->fitting[at], need, need_last, e))
                return e->code;
    }
    return e->code;
}

/* The least M a first of dp replicas of x may take (0: none): half the micro-batches or more,
 * and the rest within what the GPUs it leaves could take (the table's room). */
static int64_t first_least_M(const struct mix_state *st, const struct mix_shape *x, int64_t dp,
                             const int64_t *all)
{
    int64_t left[POOL_KINDS_MAX];
    for (int k = 0; k < st->pm->K; k++)
        left[k] = all[k] - dp * x->n[k];
    int64_t room = table_at(st, left); /* the most any second could take */
    if (room < 1)
        return 0;
    int64_t half = (st->B + 2 * dp - 1) / (2 * dp), rest = (st->B - room + dp - 1) / dp;
    int64_t lo = half > rest ? half : rest;
    return lo < 1 ? 1 : lo;
}

/* The least M a first of x may take at any dp up to `most` (0: none), its replicas
 * taking `cap` at most and leaving a micro-batch at least. */
static int64_t first_least(const struct mix_state *st, const struct mix_shape *x, int64_t cap,
                           int64_t most, const int64_t *all)
{
    int64_t least = 0;
    for (int64_t dp = 1; dp <= most; dp++) {
        int64_t lo = first_least_M(st, x, dp, all);
        if (lo > 0 && lo <= min64(cap, (st->B - 2) / dp + 1) && (least == 0 || lo < least))
            least = lo;
    }
    return least;
}

/* A first group of shape x (taking half the micro-batches or more): every dp, and every M
 * its bounds allow under T, from the least; planned, then its step with the reduction over
 * one more replica (replicas_step_floor, the second's pipeline free) must be under T before
 * any second is sought. */
static int first_shape(struct mix_state *st, const struct mix_shape *x, void *arg,
                       struct err *e)
{
    int64_t all[POOL_KINDS_MAX];
    (void)arg;
    if (st->table_T > mix_T(st) * MIX_TABLE_STALE && table_build(st, mix_T(st), e))
        return e->code; /* a table for the best's T, between first shapes */
    int64_t cap = shape_cap(st, x, st->table_T);
    for (int k = 0; k < st->pm->K; k++)
        all[k] = st->pm->kind[k].count;
    int64_t most = min64(shape_dp_max(st, x, all), st->B - 1);
    if (cap == 0 || 2 * min64(most * cap, st->B) < st->B)
        return ERR_OK;
    /* its tight capacity at the least M any dp asks of it (one probe refutes most leads) */
    int64_t least = first_least(st, x, cap, most, all);
    cap = least > 0 ? shape_cap_tight(st, x, mix_T(st), least, least) : 0;
    for (int64_t dp = 1; cap > 0 && dp <= most && !mix_stopped(st); dp++) {
        struct first f = {.a = {.x = *x, .dp = (int)dp}, .floor = st->floors};
        for (int k = 0; k < st->pm->K; k++)
            f.left[k] = all[k] - dp * x->n[k];
        /* at most its capacity, and one micro-batch at least left for the second */
        int64_t lo = first_least_M(st, x, dp, all), hi = min64(cap, (st->B - 2) / dp + 1);
        if (lo < 1)
            continue;
        f.M_last = (int)hi;
        for (int64_t M = lo; M <= hi && !mix_stopped(st); M++) {
            int N = (int)dp + 1;
            if (group_bound(st, x, (int)dp, N, M) >= mix_T(st) ||
                planned_reserve(st, 2, e) || group_refuted(st, x, (int)dp, N, (int)M))
                break; /* more micro-batches only add */
            f.M = (int)M;
            f.state = f.gone = 0;
            memset(f.floor, 0, ((size_t)st->B + 1) * sizeof *f.floor);
            st->skip = 0;
            int rc = seconds(st, &f, e);
            st->skip = 0;
            if (rc)
                return e->code;
            if (f.gone)
                break; /* no pair holds it: at more micro-batches neither */
        }
    }
    return ERR_OK;
}

/* ---- the first groups, least bound and most promising first, in turns --------------- */

/* A shape that could lead a pair under the table's T: its bound, pool_bound_first with its
 * family's costs at the fewest micro-batches a replica of it takes when it leads, at any dp
 * (first_least: half the batch or more, and the rest within what the GPUs it leaves could
 * take under the table's T, at or over any later T): that bound rises with M, and the
 * family's costs are at most any group's. Half the batch over the most replicas the pool
 * holds, as it was, bounded GPT-13B's 815 k leads on 512 GPUs of three kinds from 414 ms, the
 * best pair's T being 1234. */
static int lead_shape(struct mix_state *st, const struct mix_shape *x, void *arg,
                      struct err *e)
{
    int64_t all[POOL_KINDS_MAX];
    struct pool_shape s;
    struct mix_family *f;
    (void)arg;
    int64_t cap = shape_cap(st, x, st->table_T);
    for (int k = 0; k < st->pm->K; k++)
        all[k] = st->pm->kind[k].count;
    int64_t most = min64(shape_dp_max(st, x, all), st->B - 1);
    if (cap == 0 || most < 1 || 2 * min64(most * cap, st->B) < st->B)
        return ERR_OK;
    int64_t least = first_least(st, x, cap, most, all);
    if (least == 0)
        return ERR_OK; /* no dp leaves room for a second */
    double bound = 0, promise = 0;
    if (family_shape(st, x, least, &s, &f)) {
        bound = pool_bound_first(&s, &f->sum);
        /* the same at a replica's share of the batch by its GPUs' speed: a shape that does
         * well with its fair share leads the pairs that beat the best first, so T falls
         * early */
        double rate = 0, total = 0;
        for (int k = 0; k < st->pm->K; k++)
            rate += (double)x->n[k] * st->rate[k], total += (double)all[k] * st->rate[k];
        s.M = ceil((double)st->B * rate / total);
        promise = pool_bound_first(&s, &f->sum);
    }
    struct mix_lead *leads = mix_grow(st->leads, st->n_leads, &st->cap_leads, sizeof *leads);
    if (leads == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    st->leads = leads;
    st->leads[st->n_leads++] = (struct mix_lead){x->code, bound, promise, 0};
    return ERR_OK;
}

static int leads_by_bound(const void *pa, const void *pb)
{
    const struct mix_lead *a = pa, *b = pb;
    if (a->bound != b->bound)
        return a->bound < b->bound ? -1 : 1;
    return (a->code > b->code) - (a->code < b->code);
}

/* A lead's place in the order by promise. */
struct mix_rank {
    double promise;
    int64_t at;
};

static int ranks_by_promise(const void *pa, const void *pb)
{
    const struct mix_rank *a = pa, *b = pb;
    if (a->promise != b->promise)
        return a->promise < b->promise ? -1 : 1;
    return (a->at > b->at) - (a->at < b->at);
}

/* The leads' indices by promise (NULL: out of memory). */
static int64_t *promise_order(const struct mix_state *st)
{
    struct mix_rank *rank = malloc((size_t)(st->n_leads + 1) * sizeof *rank);
    int64_t *order = malloc((size_t)(st->n_leads + 1) * sizeof *order);
    if (rank != NULL && order != NULL) {
        for (int64_t i = 0; i < st->n_leads; i++)
            rank[i] = (struct mix_rank){st->leads[i].promise, i};
        qsort(rank, (size_t)st->n_leads, sizeof *rank, ranks_by_promise);
        for (int64_t i = 0; i < st->n_leads; i++)
            order[i] = rank[i].at;
    } else {
        free(order);
        order = NULL;
    }
    free(rank);
    return order;
}

/* The first lead from `at` on not searched yet (by its index, or through `order`), and by
 * promise not bounded at T either (n_leads: none). */
static int64_t lead_next(const struct mix_state *st, const int64_t *order, int64_t at)
{
    for (; at < st->n_leads; at++) {
        const struct mix_lead *l = &st->leads[order ? order[at] : at];
        if (!l->searched && (order == NULL || l->bound < mix_T(st)))
            break;
    }
    return at;
}

/* Every pair whose first group's bound is under T. The leads are taken in turns least bound
 * first, which certifies a stopped search by the least bound left, and most promising first
 * (lead_shape), which finds the pairs that beat the best early and so lowers T: *unsearched,
 * a lower bound on every pair left unsearched when stopped (INFINITY: none left; 0: the
 * leads were not all listed). */
static int search_leads(struct mix_state *st, double *unsearched, struct err *e)
{
    int64_t all[POOL_KINDS_MAX];
    struct mix_shape x = {.code = 0};
    for (int k = 0; k < st->pm->K; k++)
        all[k] = st->pm->kind[k].count;
    st->n_leads = 0;
    *unsearched = 0;
    if (each_shape(st, &x, 0, 0, all, lead_shape, NULL, e) || table_past(st))
        return e->code;
    qsort(st->leads, (size_t)st->n_leads, sizeof *st->leads, leads_by_bound);
    int64_t *order = promise_order(st), least = 0, promising = 0;
    if (order == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int turn = 0; !mix_stopped(st); turn ^= 1) {
        least = lead_next(st, NULL, least);
        if (least == st->n_leads || st->leads[least].bound >= mix_T(st))
            break; /* every lead left is bounded at T or more */
        int64_t i = least;
        if (turn && (promising = lead_next(st, order, promising)) < st->n_leads)
            i = order[promising];
        shape_of_code(st, st->leads[i].code, &x);
        if (first_shape(st, &x, NULL, e)) {
            free(order);
            return e->code;
        }
        if (st->stopped)
            break; /* this lead's pairs not all searched */
        st->leads[i].searched = 1;
        if (st->stop_lead)
            st->stopped = st->r->timed_out = 1;
    }
    free(order);
    least = lead_next(st, NULL, least);
    *unsearched = st->stopped && least < st->n_leads ? st->leads[least].bound : INFINITY;
    return ERR_OK;
}

/* The groups left unproved. */
static long unproved_count(const struct mix_state *st)
{
    long count = 0;
    for (int64_t i = 0; i < st->cap_planned; i++)
        count += st->planned[i].used && st->planned[i].unproved > 0;
    return count;
}

/* ---- the search ---------------------------------------------------------------------- */

/* Per kind, st->rate: the micro-batches a ms one of its GPUs would run holding the whole
 * model at this size (its forwards and backwards; the promise's measure of speed only). */
static void kind_rates(struct mix_state *st)
{
    for (int k = 0; k < st->pm->K; k++) {
        const struct profile *p = &st->pm->kind[k].profile[st->size];
        double ms = 0;
        for (int l = 0; l < p->n_layers; l++)
            ms += p->layers[l].fwd_ms + p->layers[l].bwd_ms;
        st->rate[k] = ms > 0 ? 1 / ms : 1;
    }
}

/* One micro-batch size: its pairs, and its bound (*bound). When the table allows no pair
 * at the best's T, that is the bound without a search. Under a time limit, the search keeps
 * a share of the time left (as many probes as fit, each as long as that first check took)
 * for pairs_bound, should it stop: from what the stopped search proved up to T. */
static int search_size(struct mix_state *st, double *bound, struct err *e)
{
    st->B = pool_model_batches(st->pm, st->size);
    st->table_T = 0; /* none built for this size */
    *bound = INFINITY;
    free(st->floors);
    if ((st->floors = calloc((size_t)st->B + 1, sizeof *st->floors)) == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    if (st->B < 2) /* two groups take a micro-batch each at least */
        return ERR_OK;
    kind_rates(st);
    double hi = isinf(st->best_ms) ? INFINITY : mix_T(st), deadline = st->deadline, kept = 0;
    *bound = 0;
    if (isfinite(hi)) {
        int found;
        double start = clock_now_s();
        if (any_pair(st, hi, &found, e))
            return e->code;
        if (!found) {
            *bound = hi; /* no pair could beat the best: certified without a search */
            return ERR_OK;
        }
        double probe = clock_now_s() - start, left = deadline - clock_now_s();
        if (probe > 0 && left > 0)
            kept = probe * fmin(MIX_BISECT_PROBES, floor(MIX_BISECT_SHARE * left / probe));
    }
    if (st->table_T != hi && table_build(st, hi, e))
        return e->code;
    double unsearched;
    st->deadline = deadline - kept;
    int rc = search_leads(st, &unsearched, e);
    st->deadline = deadline;
    if (rc)
        return e->code;
    /* the pairs searched step no faster than the best or T; the others than their leads */
    *bound = fmin(unsearched, fmin(mix_T(st), st->best_ms));
    if (st->stopped && kept > 0 && *bound < hi) { /* the time kept for the bisection */
        st->stopped = 0;
        rc = pairs_bound(st, *bound, hi, bound, e);
        st->stopped = 1;
    }
    return rc ? e->code : ERR_OK;
}

/* Hands the best's plans over (*plans owned), its micro-batches dealt, and frees the rest. */
static int take_best(struct mix_state *st, struct plan **plans, int *n, struct err *e)
{
    *plans = NULL;
    *n = 0;
    if (st->have_best && (*plans = calloc(POOL_GROUPS_MAX, sizeof **plans)) == NULL)
        err_set(e, ERR_FAIL, "out of memory");
    for (int64_t i = 0; i < st->cap_planned; i++) {
        struct mix_planned *g = &st->planned[i];
        int b = 0;
        while (*plans != NULL && b < POOL_GROUPS_MAX &&
               !(g->used && g->code == st->best_key[b].code && g->dp == st->best_key[b].dp &&
                 g->M == st->best_key[b].M && g->size == st->best_key[b].size))
            b++;
        if (g->fits)
            replicas_pipe_free(&g->pipe);
        if (*plans != NULL && b < POOL_GROUPS_MAX)
            (*plans)[b] = g->plan;
        else if (g->fits)
            plan_free(&g->plan);
    }
    if (*plans != NULL) {
        *n = POOL_GROUPS_MAX;
        for (int b = 0; b < *n && e->code == ERR_OK; b++)
            replicas_deal(&(*plans)[b], st->r->group[b].batches, e);
    }
    free(st->planned);
    st->planned = NULL;
    free(st->tight);
    st->tight = NULL;
    return e->code;
}

static void families_reset(struct mix_state *st)
{
    for (int i = 0; st->family != NULL && i < MIX_FAMILIES; i++) {
        for (int u = 0; u < POOL_KINDS_MAX; u++)
            pool_costs_free(&st->family[i].own[u]);
        pool_prefixes_free(st->family[i].sums);
        free(st->family[i].at);
        memset(&st->family[i], 0, sizeof st->family[i]);
    }
}

static void mix_free(struct mix_state *st)
{
    families_reset(st);
    free(st->floors);
    st->floors = NULL;
    free(st->family);
    st->family = NULL;
    free(st->table);
    st->table = NULL;
    free(st->menu);
    st->menu = NULL;
    fit_index_free(st->fit_index);
    st->fit_index = NULL;
    free(st->fitting);
    st->fitting = NULL;
    free(st->leads);
    st->leads = NULL;
    for (int k = 0; k < POOL_KINDS_MAX; k++) {
        free(st->per_kind[k]);
        st->per_kind[k] = NULL;
    }
}

static int mix_setup(struct mix_state *st, const struct plan_options *o, struct err *e)
{
    const struct pool_model *pm = st->pm;
    st->o = *o;
    st->o.repartition = 1;
    st->L = model_layer_count(&pm->model);
    st->r->n_kinds = pm->K;
    for (int k = 0; k < pm->K; k++)
        snprintf(st->r->device[k], sizeof st->r->device[k], "%s", pm->kind[k].device);
    memcpy(st->r->sizes, pm->sizes, sizeof st->r->sizes);
    if ((st->family = calloc(MIX_FAMILIES, sizeof *st->family)) == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    /* a pair's reductions start after each stage's last backward (replicas_step) */
    return pool_costs_cache_make(pm, o->actions, 0, &st->costs, e) ||
           table_alloc(st, e);
}

int pool_mixed_search(const struct pool_model *pm, const struct plan_options *o,
                      double beat_ms, double deadline, struct plan **plans, int *n,
                      struct replicas_result *step, struct pool_mixed_result *r,
                      struct err *e)
{
    return pool_mixed_search_early(pm, o, POOL_MIXED_EARLY, beat_ms, deadline, plans, n, step, r,
                                   e);
}

int pool_mixed_search_early(const struct pool_model *pm, const struct plan_options *o,
                            int flags, double beat_ms, double deadline, struct plan **plans,
                            int *n, struct replicas_result *step, struct pool_mixed_result *r,
                            struct err *e)
{
    memset(r, 0, sizeof *r);
    memset(step, 0, sizeof *step);
    struct mix_state st = {.pm = pm, .best_ms = beat_ms, .deadline = deadline, .r = r,
                           .early = flags & POOL_MIXED_EARLY, .once = flags & POOL_MIXED_ONCE,
                           .stop_lead = flags & POOL_MIXED_STOP_LEAD, .unproved = INFINITY};
    *plans = NULL;
    *n = 0;
    if (!framework_is_ballast(o->framework)) { /* replicas of one shape only: no pairs */
        r->framework = o->framework->title;
        r->lower_bound = INFINITY;
        return ERR_OK;
    }
    if (!isinf(deadline) && clock_now_s() > deadline) { /* nothing searched: no bound */
        r->timed_out = 1;
        r->lower_bound = pm->only_dp != 0 ? INFINITY : 0;
        return ERR_OK;
    }
    int rc = pm->only_dp != 0 ? ERR_OK : mix_setup(&st, o, e); /* "dp": identical replicas */
    double bound = INFINITY;
    for (st.size = 0; rc == ERR_OK && pm->only_dp == 0 && st.size < pm->n_sizes; st.size++) {
        double at;
        families_reset(&st); /* costs of this size */
        rc = search_size(&st, &at, e);
        bound = fmin(bound, at);
    }
    r->lower_bound = fmin(bound, st.unproved); /* INFINITY: no pair of groups can be made */
    r->unproved = unproved_count(&st);
    if (st.planned != NULL && take_best(&st, plans, n, e) == ERR_OK && rc == ERR_OK && *n > 0)
        rc = replicas_step(*plans, *n, step, e);
    free(st.planned);
    free(st.tight);
    mix_free(&st);
    pool_costs_cache_free(st.costs);
    rc = rc ? rc : e->code;
    if (rc != ERR_OK) {
        for (int g = 0; g < *n; g++)
            plan_free(&(*plans)[g]);
        free(*plans);
        *plans = NULL;
        *n = 0;
    }
    return rc;
}

int pool_mixed_group_bound(const struct pool_model *pm, const struct plan_options *o,
                           const struct pool_mixed_group *g, int replicas, double x,
                           struct pool_mixed_bound *out, struct err *e)
{
    struct pool_mixed_result r;
    struct mix_state st = {.pm = pm, .best_ms = x, .deadline = INFINITY, .r = &r,
                           .size = g->size, .unproved = INFINITY};
    struct mix_shape shape = {.code = 0};
    struct plan_options exact = *o;
    struct cluster c;
    memset(&r, 0, sizeof r);
    exact.search_gap = 0; /* T = x */
    for (int k = 0; k < pm->K; k++) {
        shape.tp[k] = g->tp[k], shape.S[k] = g->stages[k];
        shape.n[k] = (int64_t)g->tp[k] * g->stages[k];
    }
    st.B = pool_model_batches(pm, g->size);
    struct pool_pipe pipe = group_pipe(&st, &shape, g->dp, g->micro_batches);
    if (mix_setup(&st, &exact, e) == ERR_OK &&
        pool_model_cluster(pm, &pipe, &c, e) == ERR_OK) {
        struct pool_shape s;
        out->least_ms = group_bound(&st, &shape, g->dp, replicas, g->micro_batches);
        out->could_step = !group_shape(&st, &shape, g->dp, replicas, g->micro_batches, &s) ||
                          pool_could_step(&s, x);
        const struct mix_family *f = family_of(&st, &shape);
        out->cap_least_ms = 0;
        if (f != NULL && f->known) { /* shape_cap's bound at this M */
            struct pool_shape t = {.L = st.L, .M = g->micro_batches,
                                   .schedule = pm->schedule};
            for (int k = 0; k < pm->K; k++)
                if (shape.S[k] > 0) {
                    t.costs[t.used] = &f->own[t.used];
                    t.stages[t.used++] = shape.S[k];
                }
            out->cap_least_ms = pool_bound_at(&t, &f->sum);
        }
        cluster_free(&c);
    }
    mix_free(&st);
    pool_costs_cache_free(st.costs);
    return e->code;
}

/* "A100-40GB 4 x tp 2 + V100-32GB 1 x tp 8" */
static void print_shape(FILE *f, const struct pool_mixed_result *r, const int *tp, const int *S)
{
    const char *sep = "";
    for (int k = 0; k < r->n_kinds; k++)
        if (S[k] > 0) {
            fprintf(f, "%s%s %d x tp %d", sep, r->device[k], S[k], tp[k]);
            sep = " + ";
        }
}

void pool_mixed_print(FILE *f, const struct pool_mixed_result *r, double homogeneous_ms)
{
    if (r->framework != NULL) {
        fprintf(f, "pool: two groups side by side not searched: %s runs replicas of one "
                   "pipeline\n", r->framework);
        return;
    }
    if (r->n_groups == 0)
        fprintf(f, "pool: no two groups side by side step faster");
    else if (isfinite(homogeneous_ms))
        fprintf(f, "pool: two groups side by side, faster than the best homogeneous candidate "
                   "(%.3f ms)", homogeneous_ms);
    else
        fprintf(f, "pool: two groups side by side (no homogeneous candidate fits)");
    fprintf(f, "; %ld shapes bounded, %ld pairs searched, %ld pipelines planned (%ld more left "
               "as no split of theirs could beat the best: %ld as none at fewer micro-batches "
               "could, %ld as none with its own reduction could), %ld splits scored%s",
            r->shapes, r->pairs, r->planned, r->refuted, r->gone, r->reduced, r->splits,
            r->timed_out ? " (stopped at --time-limit: the best found by then)" : "");
    if (r->unproved > 0)
        fprintf(f, "; %ld pipelines whose searches ran out of nodes or time before proving "
                   "their plans (each searched twice, the second time with %d times "
                   "--search-nodes), the bound counting theirs", r->unproved, MIX_AGAIN_NODES);
    if (r->lower_bound > 0 && isfinite(r->lower_bound))
        fprintf(f, "; none steps faster than %.3f ms\n", r->lower_bound);
    else
        fprintf(f, "\n");
    for (int g = 0; g < r->n_groups; g++) {
        const struct pool_mixed_group *x = &r->group[g];
        fprintf(f, "  pipelines[%d]: dp %d x (", g, x->dp);
        print_shape(f, r, x->tp, x->stages);
        fprintf(f, "), %d micro-batches a replica (%ld in all, micro-batch %d)\n",
                x->micro_batches, x->batches, r->sizes[x->size]);
    }
}

/* The homogeneous search gets the time limit less a share kept for the second search. */
#define POOL_MIXED_TIME_SHARE 0.25

static void answer_certify(struct pool_answer *a)
{
    double best = a->mixed ? a->step.step_ms : a->plan.iteration_ms;
    double lb_h = a->homogeneous.ranked ? a->homogeneous.lower_bound : 0; /* 0 with --for */
    if (!a->have_plan) /* nothing homogeneous fits: its bound is what its search proved */
        lb_h = a->homogeneous.ranked && a->homogeneous.exhausted ? INFINITY : 0;
    a->lower_bound = fmin(fmin(lb_h, a->mix.lower_bound), best);
    a->gap = a->lower_bound > 0 ? best / a->lower_bound - 1 : -1;
    if (a->mixed)
        a->step.lower_bound_ms = a->lower_bound;
    else if (a->lower_bound > 0) { /* the plan carries the whole answer's certificate */
        a->plan.search.lower_bound = a->lower_bound;
        a->plan.optimality_gap = a->gap;
    } else /* none: the homogeneous search's own gap is not the answer's */
        a->plan.optimality_gap = -1;
}

static void answer_kinds(const struct pool_model *pm, struct pool_answer *a)
{
    a->n_kinds = pm->K;
    for (int k = 0; k < pm->K; k++) {
        snprintf(a->device[k], sizeof a->device[k], "%s", pm->kind[k].device);
        a->count[k] = (long)pm->kind[k].count;
    }
}

int pool_answer_search(const cJSON *root, const char *file, const struct plan_options *o,
                       struct pool_answer *a, struct err *e)
{
    memset(a, 0, sizeof *a);
    double start = clock_now_s();
    double deadline = o->time_limit_s > 0 ? start + o->time_limit_s : INFINITY;
    struct pool_model pm;
    if (pool_model_load(root, file, o, deadline, &pm, e))
        return e->code;
    answer_kinds(&pm, a);
    double first = isinf(deadline) ? INFINITY
                                   : deadline - POOL_MIXED_TIME_SHARE * (deadline - clock_now_s());
    /* --for: every candidate planned, since bounds of Ballast's activations may cut one the
     * framework (keeping fewer bytes) runs faster */
    long prune = framework_is_ballast(o->framework) ? POOL_KEEP : 0;
    int rc = pool_search_model(&pm, o, prune, first, &a->plan, &a->homogeneous, e);
    if (rc != ERR_OK && rc != ERR_NOFIT) {
        pool_model_free(&pm);
        return rc;
    }
    a->have_plan = rc == ERR_OK;
    struct err homogeneous = *e;
    err_clear(e);
    rc = pool_mixed_search(&pm, o, a->have_plan ? a->plan.iteration_ms : INFINITY, deadline,
                           &a->plans, &a->n, &a->step, &a->mix, e);
    pool_model_free(&pm);
    a->mixed = rc == ERR_OK && a->n > 0;
    if (rc == ERR_OK && !a->mixed && !a->have_plan) {
        *e = homogeneous;
        rc = err_set(e, ERR_NOFIT, "%s; nor does any pair of groups side by side (%ld searched%s)",
                     homogeneous.msg, a->mix.pairs,
                     a->mix.timed_out ? ", stopped at --time-limit" : "");
    }
    if (rc != ERR_OK) {
        pool_answer_free(a);
        return rc;
    }
    answer_certify(a);
    a->seconds = clock_now_s() - start;
    return ERR_OK;
}

void pool_answer_free(struct pool_answer *a)
{
    if (a->have_plan)
        plan_free(&a->plan);
    for (int g = 0; g < a->n; g++)
        plan_free(&a->plans[g]);
    free(a->plans);
    replicas_result_free(&a->step);
    memset(a, 0, sizeof *a);
}
