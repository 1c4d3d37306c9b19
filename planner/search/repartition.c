#include "repartition.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "choice.h"
#include "clock.h"
#include "cost.h"
#include "framework.h"
#include "knapsack.h"
#include "sim.h"
#include "stats.h"

/* A stage's least recompute for one layer range, for one kind of position. */
struct range_cost {
    double recompute_ms; /* INFINITY: does not fit even recomputing everything */
    int64_t memory_bytes;
    int options, recomputed; /* layers on a partial option; layers recomputed (choice.h) */
    int known;
    double floor_ms; /* knap_recompute_floor's, once has_floor */
    int has_floor;
};

/* Positions with the same profile, capacity and in-flight count share their range costs,
 * whatever order puts them there. */
struct position_class {
    int profile;
    int64_t capacity;
    int in_flight;
    struct range_cost *ranges; /* n_layers x n_layers, [first * n + last] */
    struct range_cost *kept;   /* the cache's for this class (repartition.h), or NULL */
};

struct position {
    int stage;    /* index in the cluster */
    int cls;      /* position class */
    int profile;
    struct link link; /* to the next position */
};

/* A position of the branch's path as it was placed: its T and forward, the floors of what
 * follows it that bounded it (own_bound's after, drain, fill, cool, cool_own), the prefix
 * before it (ms, fwd_ms: struct prefix's), its tail and its transfer. */
struct placed {
    double t, f, after, drain, fill, cool, cool_own, ms, fwd_ms, tail, c;
};

/* The most positions a run the branch bounds spans past its first (runs_bound). */
#define RUNS_MAX 4

struct search {
    const struct cluster *c;
    const struct plan_options *o;
    int S, N, M;
    double **fwd_prefix, **bwd_prefix; /* per profile, N + 1 */
    double **opt_prefix; /* per profile, N + 1: the device optimizer step's layer sums */
    struct position_class *classes;
    int n_classes, cap_classes;
    uint64_t *profile_hash; /* per profile, for the range cache (0: not yet) */
    struct position *pos; /* S, for the order being searched */
    double *transfer;     /* S x N: transfer_ms(k, last) for the positions laid out */
    double *G;            /* (S + 1) x (N + 1) */
    double *Q;            /* (S + 1) x (N + 1): least sum of T + transfers over suffixes */
    double *D;            /* (S + 1) x (N + 1): least drain over suffixes (drain_step) */
    int *target;          /* n_targets positions r that fill_floor measures round trips to */
    int n_targets;
    double *Z;            /* n_targets x (S + 1) x (N + 1): least round trip to target r */
    double *R;            /* n_targets x (S + 1) x (N + 1): least largest backward up to r */
    double *P;            /* (S + 1) x (N + 1): least largest backward before k (prefix_table) */
    /* branch and bound */
    int *first;           /* S: the split being built */
    int *best_first;      /* S */
    int *best_order;      /* S: cluster stage at each position */
    struct link *best_link; /* S: its links */
    double best_ms;
    int64_t best_memory;
    double open_bound; /* least bound of a node left unexplored */
    double pruned_bound; /* least bound of a node left within o->search_gap of the best */
    long nodes, leaves, budget;
    long clock_nodes; /* out_of_budget looks at the clock from this node on (0: at once) */
    double deadline; /* CLOCK_MONOTONIC seconds past which the search stops (INFINITY: none) */
    int may_stop;    /* bound_table may stop at the deadline with only any_order_bound */
    double enough;   /* bound_table may stop once G(0, 0) is known to be this or more
                      * (INFINITY: never): the order is then left out whatever the rest */
    int dived;       /* branch has reached a split */
    int diving;      /* branch stops at dive_over (dive_orders) */
    long dive_leaves, dive_nodes; /* a dive ends past these leaves or nodes */
    int pair;        /* bound_table and tight_bound add window_bound (tighten only: the search's
                      * own bounds, and so the plans it finds, stay as they were) */
    struct sim_stage *sim_in;
    struct sim_bucket *buckets; /* N: the split's stages' gradient buckets (split_ms) */
    double *bwd_scratch;        /* N */
    double *children; /* S x N x 2: (bound, last layer) per depth */
    double *own;      /* S: split_bound's per-stage terms */
    double *fill_z;   /* S: split_bound's cumulative round trips */
    double *a_max;    /* S: split_bound's largest backward (with recompute) up to each position */
    double *a;        /* S: split_bound's backward (with recompute) of each position */
    double *own_end;  /* S: split_bound's own terms to the position's own last backward */
    int *reach;       /* S: the furthest layer each position could start at (starts_reach) */
    struct placed *path; /* S: the positions the branch has placed (runs_bound) */
    /* a framework's least blocks a stage (framework.h min_blocks): position 0 ends at layer
     * first_end_min or later, the last starts at last_start_max or earlier. The bounds relax
     * it (a range's costs ignore it, so they stay monotone in the range); no split breaking
     * it is kept or branched to. */
    int first_end_min, last_start_max;
    int even_middle; /* and the positions between the first and the last hold alike (NeMo) */
    struct err *e;
};

static double *G_at(struct search *s, int k, int i)
{
    return &s->G[(size_t)k * (s->N + 1) + i];
}

static double *Q_at(struct search *s, int k, int i)
{
    return &s->Q[(size_t)k * (s->N + 1) + i];
}

static double *P_at(struct search *s, int k, int i)
{
    return &s->P[(size_t)k * (s->N + 1) + i];
}

static double *D_at(struct search *s, int k, int i)
{
    return &s->D[(size_t)k * (s->N + 1) + i];
}

/* Z_r(k, i): the least sum of T over positions k..r and of the transfers between them, with
 * position k starting at layer i (INFINITY where positions k..r cannot hold layers from i
 * and leave one to each position after r). */
static double *Z_at(struct search *s, int t, int k, int i)
{
    return &s->Z[((size_t)t * (s->S + 1) + k) * (s->N + 1) + i];
}

/* R_r(k, i): the least, over the ways positions k.. hold layers from i, of the largest
 * backward (with recompute) among positions k..r (-INFINITY past r, INFINITY where none fits). */
static double *R_at(struct search *s, int t, int k, int i)
{
    return &s->R[((size_t)t * (s->S + 1) + k) * (s->N + 1) + i];
}

/* ---- range costs kept across searches (repartition.h) ---------------------------------- */

/* The most bytes of range costs a cache keeps; classes past it are solved per search. */
#define REPART_CACHE_BYTES ((size_t)256 << 20)

struct cache_class {
    uint64_t hash; /* 0: an empty slot */
    int n_layers;
    struct layer_cost *layers; /* the profile's, copied */
    int64_t capacity, reserve_bytes, unit_bytes;
    int in_flight, whole_layers;
    struct range_cost *ranges; /* n_layers x n_layers, as a class's */
};

struct repart_cache {
    struct cache_class *slot;
    int64_t n, cap;
    size_t bytes;
    long solved, hits;
};

int repart_cache_make(struct repart_cache **out, struct err *e)
{
    if ((*out = calloc(1, sizeof **out)) == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    return ERR_OK;
}

void repart_cache_free(struct repart_cache *c)
{
    for (int64_t i = 0; c != NULL && i < c->cap; i++) {
        free(c->slot[i].layers);
        free(c->slot[i].ranges);
    }
    if (c != NULL)
        free(c->slot);
    free(c);
}

void repart_cache_counts(const struct repart_cache *c, long *solved, long *hits)
{
    *solved = c != NULL ? c->solved : 0;
    *hits = c != NULL ? c->hits : 0;
}

static uint64_t fnv_bytes(uint64_t h, const void *data, size_t n)
{
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* The class's key hashed (never 0): its profile's layers, capacity, in-flight count and what
 * else shapes its knapsacks. */
static uint64_t class_hash(struct search *s, int profile, int64_t capacity, int in_flight)
{
    if (s->profile_hash[profile] == 0)
        s->profile_hash[profile] =
            fnv_bytes(1469598103934665603ull, s->c->profiles[profile].layers,
                      (size_t)s->N * sizeof *s->c->profiles[profile].layers);
    int64_t key[5] = {capacity, in_flight, s->c->reserve_bytes, s->o->unit_bytes,
                      s->o->whole_layers};
    uint64_t h = fnv_bytes(s->profile_hash[profile], key, sizeof key);
    return h ? h : 1;
}

static int same_class(const struct search *s, const struct cache_class *k, uint64_t h,
                      int profile, int64_t capacity, int in_flight)
{
    return k->hash == h && k->n_layers == s->N && k->capacity == capacity &&
           k->in_flight == in_flight && k->reserve_bytes == s->c->reserve_bytes &&
           k->unit_bytes == s->o->unit_bytes && k->whole_layers == s->o->whole_layers &&
           memcmp(k->layers, s->c->profiles[profile].layers, (size_t)s->N * sizeof *k->layers) ==
               0;
}

/* The cache's slots doubled (at most half full). */
static int cache_grow(struct repart_cache *c)
{
    int64_t cap = c->cap ? 2 * c->cap : 256;
    struct cache_class *grown = calloc((size_t)cap, sizeof *grown);
    if (grown == NULL)
        return -1;
    for (int64_t i = 0; i < c->cap; i++)
        for (int64_t j = 0; c->slot[i].hash != 0; j++) {
            struct cache_class *to = &grown[(c->slot[i].hash + (uint64_t)j) % (uint64_t)cap];
            if (to->hash == 0) {
                *to = c->slot[i];
                break;
            }
        }
    free(c->slot);
    c->slot = grown;
    c->cap = cap;
    return 0;
}

/* The cache's range costs of the class, made empty when first asked for; NULL without a
 * cache, for a framework's costs, or past its bytes. */
static struct range_cost *cache_ranges(struct search *s, int profile, int64_t capacity,
                                       int in_flight)
{
    struct repart_cache *c = s->o->range_cache;
    if (c == NULL || s->o->framework_range != NULL)
        return NULL;
    uint64_t h = class_hash(s, profile, capacity, in_flight);
    for (int64_t j = 0; c->cap > 0; j++) {
        struct cache_class *k = &c->slot[(h + (uint64_t)j) % (uint64_t)c->cap];
        if (k->hash == 0)
            break;
        if (same_class(s, k, h, profile, capacity, in_flight))
            return k->ranges;
    }
    size_t N = (size_t)s->N, bytes = N * N * sizeof(struct range_cost) +
                                     N * sizeof(struct layer_cost);
    if (c->bytes + bytes > REPART_CACHE_BYTES || (2 * (c->n + 1) > c->cap && cache_grow(c)))
        return NULL;
    struct cache_class k = {.hash = h, .n_layers = s->N, .capacity = capacity,
                            .in_flight = in_flight, .reserve_bytes = s->c->reserve_bytes,
                            .unit_bytes = s->o->unit_bytes, .whole_layers = s->o->whole_layers};
    k.layers = malloc(N * sizeof *k.layers);
    k.ranges = calloc(N * N, sizeof *k.ranges);
    if (k.layers == NULL || k.ranges == NULL) {
        free(k.layers);
        free(k.ranges);
        return NULL;
    }
    memcpy(k.layers, s->c->profiles[profile].layers, N * sizeof *k.layers);
    for (int64_t j = 0;; j++) {
        struct cache_class *to = &c->slot[(h + (uint64_t)j) % (uint64_t)c->cap];
        if (to->hash == 0) {
            *to = k;
            break;
        }
    }
    c->n++;
    c->bytes += bytes;
    return k.ranges;
}

static int class_of(struct search *s, int profile, int64_t capacity, int in_flight)
{
    for (int k = 0; k < s->n_classes; k++)
        if (s->classes[k].profile == profile && s->classes[k].capacity == capacity &&
            s->classes[k].in_flight == in_flight)
            return k;
    if (s->n_classes == s->cap_classes) {
        int cap = s->cap_classes ? 2 * s->cap_classes : 16;
        struct position_class *grown = realloc(s->classes, (size_t)cap * sizeof *grown);
        if (grown == NULL)
            return -1;
        s->classes = grown;
        s->cap_classes = cap;
    }
    struct position_class *pc = &s->classes[s->n_classes];
    pc->profile = profile;
    pc->capacity = capacity;
    pc->in_flight = in_flight;
    pc->ranges = calloc((size_t)s->N * s->N, sizeof *pc->ranges);
    if (pc->ranges == NULL)
        return -1;
    pc->kept = cache_ranges(s, profile, capacity, in_flight);
    return s->n_classes++;
}

/* The knapsack of layers first..last at a position of class pc. */
static int build_range(struct search *s, const struct position_class *pc, int first, int last,
                       struct knap_problem *kp)
{
    int (*build)(struct knap_problem *, const struct layer_cost *, int, int, int64_t, int64_t,
                 int64_t, struct err *) = s->o->whole_layers ? knap_build : knap_build_options;
    return build(kp, s->c->profiles[pc->profile].layers + first, last - first + 1,
                 pc->in_flight, s->c->reserve_bytes, pc->capacity, s->o->unit_bytes, s->e);
}

/* range_cost's knapsack (or the framework's menu) for layers first..last into *rc. */
static void solve_range(struct search *s, const struct position_class *pc, int first, int last,
                        struct range_cost *rc)
{
    const struct layer_cost *layers = s->c->profiles[pc->profile].layers + first;
    int n = last - first + 1;
    struct knap_problem kp;
    rc->known = 1;
    if (s->o->framework_range != NULL) { /* a framework's menu (framework.h) */
        rc->recompute_ms =
            fw_range_recompute(s->o->framework_range, &s->c->model, first, layers, n,
                               pc->in_flight, s->c->reserve_bytes, pc->capacity,
                               &rc->memory_bytes);
        return;
    }
    unsigned char *rec = calloc((size_t)n, 1);
    rc->recompute_ms = INFINITY;
    if (rec == NULL || build_range(s, pc, first, last, &kp)) {
        if (s->e->code == ERR_OK)
            err_set(s->e, ERR_FAIL, "out of memory");
        free(rec);
        return;
    }
    int status = knap_min_recompute(&kp, rec, s->e);
    if (status == ERR_OK) {
        struct stage_cost cost;
        cost_stage(layers, n, rec, pc->in_flight, s->c->reserve_bytes, &cost);
        rc->recompute_ms = cost.recompute_ms;
        rc->memory_bytes = cost.memory_bytes;
        for (int l = 0; l < n; l++) {
            rc->options += rec[l] >= COST_OPTION;
            rc->recomputed += rec[l] != COST_KEEP;
        }
    } else if (status == ERR_NOFIT) {
        err_clear(s->e);
    }
    knap_free(&kp);
    free(rec);
}

/* The least recompute of layers first..last at a position of class `cls`: the same DP the
 * plan is finally made with, so the search and the plan agree. Kept in the cache when there
 * is one (a range known to the search only once it asked, as without). */
static const struct range_cost *range_cost(struct search *s, int cls, int first, int last)
{
    struct position_class *pc = &s->classes[cls];
    struct range_cost *rc = &pc->ranges[(size_t)first * s->N + last];
    if (rc->known)
        return rc;
    struct range_cost *kept = pc->kept != NULL ? &pc->kept[(size_t)first * s->N + last] : NULL;
    if (kept != NULL && kept->known) {
        s->o->range_cache->hits++;
        *rc = *kept;
        return rc;
    }
    solve_range(s, pc, first, last, rc);
    if (kept != NULL && s->e->code == ERR_OK) {
        s->o->range_cache->solved++;
        *kept = *rc;
    }
    return rc;
}

/* Ranges of at most this many layers range_floor solves exactly: their knapsacks are small,
 * and on a stage of a few layers the relaxation's fraction of a layer is much of its time. */
#define RANGE_EXACT_LAYERS 4

/* A floor under the range's recompute at a position of class `cls` (exact once the range is
 * known, or when it is short): its relaxation's (knap_recompute_floor), kept in the cache like
 * the knapsacks' answers; 0 under a framework's menu. A range the relaxation cannot fit
 * becomes known: nothing fits it. */
static double range_floor(struct search *s, int cls, int first, int last)
{
    struct position_class *pc = &s->classes[cls];
    struct range_cost *rc = &pc->ranges[(size_t)first * s->N + last];
    struct range_cost *kept = pc->kept != NULL ? &pc->kept[(size_t)first * s->N + last] : NULL;
    struct knap_problem kp;
    if (last - first + 1 <= RANGE_EXACT_LAYERS)
        return range_cost(s, cls, first, last)->recompute_ms;
    int asked = !rc->known && !rc->has_floor;
    if (asked && kept != NULL && kept->has_floor) {
        s->o->range_cache->hits++;
        rc->floor_ms = kept->floor_ms;
        rc->has_floor = 1;
    } else if (asked && s->o->framework_range == NULL &&
               build_range(s, pc, first, last, &kp) == ERR_OK) {
        rc->floor_ms = knap_recompute_floor(&kp);
        rc->has_floor = 1;
        knap_free(&kp);
        if (kept != NULL) {
            s->o->range_cache->solved++;
            kept->floor_ms = rc->floor_ms;
            kept->has_floor = 1;
        }
    }
    if (!rc->known && rc->has_floor && isinf(rc->floor_ms)) { /* no choice fits */
        rc->known = 1;
        rc->recompute_ms = INFINITY;
    }
    return rc->known ? rc->recompute_ms : rc->has_floor ? rc->floor_ms : 0;
}

/* T of position k holding first..last (INFINITY if it cannot fit); *fwd gets its forward
 * part (the rest, backward and recompute, is T - fwd). */
static double stage_ms(struct search *s, int k, int first, int last, double *fwd)
{
    const struct position *p = &s->pos[k];
    const struct range_cost *rc = range_cost(s, p->cls, first, last);
    double f = s->fwd_prefix[p->profile][last + 1] - s->fwd_prefix[p->profile][first];
    if (fwd)
        *fwd = f;
    return cost_stage_ms(f + s->bwd_prefix[p->profile][last + 1] -
                             s->bwd_prefix[p->profile][first],
                         rc->recompute_ms);
}

/* Forward activation and backward gradient over the link after position k, whose last
 * layer is `last` (place made them). */
static double transfer_ms(const struct search *s, int k, int last)
{
    return s->transfer[(size_t)k * s->N + last];
}

/* The optimizer step position k takes on the device holding first..last: the simulator's
 * (the host optimizer is chosen after the search). */
static double optimizer_ms(const struct search *s, int k, int first, int last)
{
    const double *opt = s->opt_prefix[s->pos[k].profile];
    return opt[last + 1] - opt[first];
}

/* The least position k runs after its last backward: its gradients' all-reduce over its data
 * parallel replicas, then its optimizer step. In buckets (sim.h) the reduction may overlap
 * the last backward, all but the bucket of its first layer, which starts after it: at least
 * that layer's alone, and the whole less the layers' backwards. */
static double tail_ms(const struct search *s, int k, int first, int last)
{
    int p = s->pos[k].profile, stage = s->pos[k].stage;
    double whole = cluster_allreduce_ms(s->c, stage, first, last);
    if (s->c->dp_bucket_bytes > 0) {
        double overlap = whole - (s->bwd_prefix[p][last + 1] - s->bwd_prefix[p][first]);
        whole = fmax(cluster_allreduce_ms(s->c, stage, first, first), overlap);
    }
    return whole + optimizer_ms(s, k, first, last);
}

/* Position k's gradient buckets over layers first..last, into `out` (sim_buckets). */
static int stage_buckets(const struct search *s, int k, int first, int last,
                         struct sim_bucket *out)
{
    const struct position *p = &s->pos[k];
    const struct cluster_stage *st = &s->c->stages[p->stage];
    const struct layer_cost *layers = s->c->profiles[p->profile].layers + first;
    int n = last - first + 1;
    if (s->c->grad_bytes == NULL || st->dp <= 1)
        return 0;
    for (int l = 0; l < n; l++)
        s->bwd_scratch[l] = layers[l].bwd_ms;
    return sim_buckets(s->c->grad_bytes[p->profile] + first, s->bwd_scratch, n,
                       s->c->dp_bucket_bytes, &st->dp_link, st->dp, out);
}

/* Backwards position k runs after its last forward: W + 1 in 1F1B with W = S-k-1 warm-up
 * forwards, all M when it runs every forward first (GPipe, or 1F1B with W >= M - 1). */
static int drain_backwards(const struct search *s, int k)
{
    int W = s->S - k - 1;
    return s->c->schedule == SCHEDULE_GPIPE || W >= s->M - 1 ? s->M : W + 1;
}

/* What position k itself adds to the bound past the prefix before it. With f its forward and
 * A its backward with recompute per micro-batch, W its warm-up forwards (min(S-k-1, M) in
 * 1F1B), `after` the least round trip of a micro-batch through the positions after it
 * (forward, backward, transfers) and `drain` the least time from its last forward's output
 * leaving to the last gradient coming back (the D of drain_step), and `fill` the most, over
 * the positions r after it, of n_r f plus micro-batch 0's round trip to r, n_r being the
 * forwards r runs before its first backward (drain_backwards; -infinity when not known),
 * and `cool` the most, over the positions r after it, of the last micro-batch's round trip to
 * r (from k's last forward, r's first backward after it being of micro-batch M - n_r) plus
 * n_r - 1 more backwards at some position q <= r (micro-batches M - n_r + 1 .. M - 1 that q
 * runs one after the other; any q on the way back, so A of k or more):
 *   its first backward waits for micro-batch 0's round trip: >= max((W+1) f, f + after, fill);
 *   then M-W-1 backwards and forwards alternate until its last forward;
 *   its last backward waits for its own W+1 backwards and for the drain: >= max((W+1) A,
 *   A + drain, cool).
 * And in 1F1B, with n = W + 1 micro-batches in flight, it runs the forward of m + n only after
 * the backward of m (schedule_op_at's order), and the backward of m + n only after that
 * micro-batch's round trip: its backwards of m and m + n end at least f + A + after apart.
 * Its last backward, of M - 1, ends at least q such steps after that of j = (M - 1) mod n,
 * q = (M - 1) div n, which ends at least one step after its forward of j starts, j forwards
 * after its first: >= j f + (q + 1)(f + A + after). Where the transfers take about as long
 * as the stages, that is well over the (M - W - 1)(f + A) of its own operations.
 * When it runs every forward first (GPipe, or 1F1B with W >= M - 1), its backwards start after
 * its M forwards and after micro-batch 0's round trip, and the last one waits for the drain
 * after its M forwards. For S equal stages this is exactly (M + S - 1)(f + A).
 * It runs from k's first forward to the end of its last backward, with `cool`'s q >= k
 * (with q < k it reaches past that, to a backward before k's): a step a stage takes after
 * its last backward (its optimizer step, tail_k) adds as stage_bound says. */
static double own_bound(const struct search *s, int k, double t, double f, double after,
                        double drain, double fill, double cool)
{
    double A = t - f, M = s->M;
    int W = s->S - k - 1;
    drain = drain > after ? drain : after;
    fill = fill > f + after ? fill : f + after;
    if (drain_backwards(s, k) == s->M) {
        double start = M * f > fill ? M * f : fill;
        double v = start + M * A, last = M * f + (drain + A > cool ? drain + A : cool);
        return v > last ? v : last;
    }
    double head = (W + 1) * f > fill ? (W + 1) * f : fill;
    double tail = (W + 1) * A > drain + A ? (W + 1) * A : drain + A;
    tail = tail > cool ? tail : cool;
    int n = W + 1, q = (s->M - 1) / n, j = (s->M - 1) % n;
    double own = head + (M - W - 1) * (f + A) + tail, chain = j * f + (q + 1) * (f + A + after);
    return own > chain ? own : chain;
}

/* A floor under own_bound's span for position k (from its first forward to the end of its
 * last backward) from its steady state with positions k + 1 .. k + d, `span` being their T and
 * k's, plus the transfers both ways between them (-INFINITY: none); the other arguments as
 * own_bound's. In 1F1B with W = S-k-1 < M-1 warm-up forwards (n = W + 1 in flight), k's
 * backward of m is followed by its forward of m + n, which k + d (n - d in flight) runs
 * before its backward of m + d + 1, whose gradient comes back through k + d - 1 .. k + 1 to
 * k's backward of m + d + 1: k's backwards of 0, d + 1, 2 (d + 1), ... m' (the last such m
 * whose forward m + n exists) end at least `span` apart. The first starts after own_bound's
 * head; after m' k runs its forwards up to M - 1 and its backwards before M - W - 1, then
 * own_bound's tail from its last forward. own_bound counts k's own operations alone in the
 * steady state, and its chain the whole round trip (d = W), so where the stages and links
 * just after k are slower on average than k alone and than the rest, it is counted here. */
static double window_bound(const struct search *s, int k, double t, double f, double after,
                           double drain, double fill, double cool, double span, int d)
{
    int W = s->S - k - 1, M = s->M;
    if (isinf(span) || d < 1 || k + d >= s->S || drain_backwards(s, k) == M)
        return -INFINITY;
    double A = t - f;
    drain = drain > after ? drain : after;
    fill = fill > f + after ? fill : f + after;
    double head = (W + 1) * f > fill ? (W + 1) * f : fill;
    double tail = (W + 1) * A > drain + A ? (W + 1) * A : drain + A;
    tail = tail > cool ? tail : cool;
    int m = (M - W - 2) / (d + 1) * (d + 1); /* m' */
    return head + A + m / (d + 1) * span + (M - 1 - W - m) * f + (M - W - 2 - m) * A + tail;
}

/* The least T of a position k + 1 starting at layer j + 1 (-INFINITY past the last position):
 * the forward and backward of that layer alone (recompute only adds), plus k's transfers. */
static double next_floor(const struct search *s, int k, int j)
{
    if (k + 1 >= s->S || j + 1 >= s->N)
        return -INFINITY;
    int p = s->pos[k + 1].profile;
    return cost_stage_ms(s->fwd_prefix[p][j + 2] - s->fwd_prefix[p][j + 1] +
                             s->bwd_prefix[p][j + 2] - s->bwd_prefix[p][j + 1],
                         0) +
           transfer_ms(s, k, j);
}

/* The iteration's bound from position k's own terms `own` and `own_end` (own_bound; the
 * latter without backwards before k in its `cool`, split_bound's own_end), after `prefix` (T and
 * transfers of the positions before it) of which `fwd_prefix` are forwards and forward
 * transfers: stage 0's last backward waits for k's and the backwards before it, then its
 * optimizer step `tail0`; k's own step `tail` starts after its last backward (own_bound). */
static double stage_bound(double prefix, double fwd_prefix, double own, double own_end,
                          double tail0, double tail)
{
    double through = prefix + own + tail0, at = fwd_prefix + own_end + tail;
    return through > at ? through : at;
}

/* The drain from position k's input on, D(k) = max(f + n A, T + c + D(k+1)) with n its
 * drain_backwards: the last micro-batch's forward reaches some position r through the ones
 * before it, r runs its n_r last backwards, and the last gradient comes back. Every path of
 * the simulated graph, so a lower bound (D(S) = -infinity: nothing after the last). */
static double drain_step(const struct search *s, int k, double t, double f, double c,
                         double rest)
{
    double own = f + drain_backwards(s, k) * (t - f), through = t + c + rest;
    return own > through ? own : through;
}

/* T of layers i..j at position k as far as known without its knapsack: forward, backward and
 * `r_floor`, a floor under its recompute (a contained range's, or its relaxation's:
 * range_floor; the exact T when the range is known). */
static double floor_ms(struct search *s, int k, int i, int j, double r_floor, double *fwd)
{
    const struct position *p = &s->pos[k];
    if (s->classes[p->cls].ranges[(size_t)i * s->N + j].known)
        return stage_ms(s, k, i, j, fwd);
    *fwd = s->fwd_prefix[p->profile][j + 1] - s->fwd_prefix[p->profile][i];
    return cost_stage_ms(*fwd + s->bwd_prefix[p->profile][j + 1] - s->bwd_prefix[p->profile][i],
                         r_floor);
}

/* The most targets fill_floor measures round trips to. */
#define FILL_TARGETS_MAX 16

/* The positions fill_floor measures round trips to: the last of each run of one profile (past
 * it the stages are of another kind, often much faster or slower, so a round trip to there
 * is the one that binds) and every S/4th, the last position left out (own_bound's `after`
 * is the round trip to it). */
static void choose_targets(struct search *s)
{
    int step = s->S / 4 > 1 ? s->S / 4 : 1;
    s->n_targets = 0;
    for (int r = 0; r + 1 < s->S && s->n_targets < FILL_TARGETS_MAX; r++)
        if (s->pos[r].profile != s->pos[r + 1].profile || (r + 1) % step == 0)
            s->target[s->n_targets++] = r;
}

/* Z_r(k, .) and R_r(k, .) for every target r >= k from those at k + 1, with each T as far as
 * known without a knapsack (floor_ms): floors, never more than the true round trip and
 * largest backward. */
static void round_trip_table(struct search *s, int k)
{
    int last_j = s->N - 1 - (s->S - 1 - k);
    for (int t = 0; t < s->n_targets; t++) {
        int r = s->target[t];
        for (int i = 0; i <= s->N; i++)
            *Z_at(s, t, k, i) = *R_at(s, t, k, i) = k <= r ? INFINITY : -INFINITY;
        for (int i = k; k <= r && i <= last_j; i++) {
            double least = INFINITY, least_a = INFINITY, r_floor = 0;
            for (int j = i; j <= last_j; j++) {
                double rest = k < r ? *Z_at(s, t, k + 1, j + 1) : 0, f;
                double tm = floor_ms(s, k, i, j, r_floor, &f);
                if (s->classes[s->pos[k].cls].ranges[(size_t)i * s->N + j].known)
                    r_floor = range_cost(s, s->pos[k].cls, i, j)->recompute_ms;
                if (isinf(tm))
                    break; /* T only grows with the range */
                double v = tm + (k < r ? transfer_ms(s, k, j) + rest : 0);
                double a = k < r ? *R_at(s, t, k + 1, j + 1) : -INFINITY;
                a = a > tm - f ? a : tm - f;
                least = v < least ? v : least;
                least_a = a < least_a ? a : least_a;
            }
            *Z_at(s, t, k, i) = least;
            *R_at(s, t, k, i) = least_a;
        }
    }
}

/* A floor under own_bound's `fill` for position k holding layers up to j with forward f,
 * whatever follows: each target r after k runs n_r forwards before its first backward, each
 * after k's forward of the same micro-batch, and micro-batch 0's round trip from k to r takes
 * at least k's transfer and Z_r(k + 1, j + 1) (split_bound's z[r] - z[k]). */
static double fill_floor(struct search *s, int k, int j, double f)
{
    double fill = -INFINITY, c = transfer_ms(s, k, j);
    for (int t = 0; t < s->n_targets; t++) {
        int r = s->target[t];
        double v = r > k ? drain_backwards(s, r) * f + c + *Z_at(s, t, k + 1, j + 1) : -INFINITY;
        fill = v > fill ? v : fill;
    }
    return fill;
}

/* A floor under own_bound's `cool` for position k holding layers up to j with backward A
 * (with recompute): for each target r after k, A, then n_r - 1 backwards at a position q in
 * k..r (so at least the larger of A and R_r(k + 1, j + 1)), and the round trip from k to r
 * (split_bound's z[r] - z[k], at least k's transfer and Z_r(k + 1, j + 1)); `a_before` a
 * floor of the largest backward before k (q may be there too: split_bound's cool takes the
 * largest over 0..r, cool_own over k..r). */
static double cool_floor_after(struct search *s, int k, int j, double A, double a_before)
{
    double cool = -INFINITY, c = transfer_ms(s, k, j);
    for (int t = 0; t < s->n_targets; t++) {
        int r = s->target[t];
        if (r <= k)
            continue;
        double q = *R_at(s, t, k + 1, j + 1);
        q = q > A ? q : A;
        q = q > a_before ? q : a_before;
        double v = A + (drain_backwards(s, r) - 1) * q + c + *Z_at(s, t, k + 1, j + 1);
        cool = v > cool ? v : cool;
    }
    return cool;
}

/* cool_floor_after for own_end (split_bound's cool_own: no backward before k counted). */
static double cool_floor(struct search *s, int k, int j, double A)
{
    return cool_floor_after(s, k, j, A, -INFINITY);
}

/* Whether layers i..j at position k might lower G, Q or D below `best`, `sum` and `drain`
 * (bound_table's): T is at least its forward and backward plus `r_floor`, the recompute of a
 * range it contains (dropping a layer frees memory and never adds recompute). The bounds only
 * grow with T, so when even that floor improves none of them, the range's own floor
 * (range_floor) is not needed. */
static int could_improve(struct search *s, int k, int i, int j, double r_floor, double c,
                         double rest, double rest_sum, double rest_drain, double best,
                         double sum, double drain)
{
    double f, t = floor_ms(s, k, i, j, r_floor, &f);
    if (isinf(t) || t + c + rest_sum < sum || drain_step(s, k, t, f, c, rest_drain) < drain)
        return 1;
    if (s->M * t >= best)
        return 0;
    double v = own_bound(s, k, t, f, c + rest_sum, c + rest_drain, fill_floor(s, k, j, f),
                         cool_floor(s, k, j, t - f));
    double tail0 = k == 0 ? tail_ms(s, 0, i, j) : 0;
    return (t + c + rest > v ? t + c + rest : v) + tail0 < best;
}

/* P(k, i): the least, over the ways positions 0..k-1 hold layers 0..i-1, of their largest
 * backward (with recompute, as far as known without a knapsack: floor_ms); -INFINITY at k 0.
 * Position k's `cool` may wait on backwards there (cool_floor_after's a_before). */
static void prefix_table(struct search *s)
{
    int S = s->S, N = s->N;
    for (int k = 0; k <= S; k++)
        for (int i = 0; i <= N; i++)
            *P_at(s, k, i) = k == 0 && i == 0 ? -INFINITY : INFINITY;
    for (int k = 0; k < S; k++)
        for (int i = k; i < N; i++) {
            double before = *P_at(s, k, i), r_floor = 0;
            if (isinf(before) && before > 0)
                continue;
            for (int j = i; j < N; j++) {
                double f, t = floor_ms(s, k, i, j, r_floor, &f);
                if (s->classes[s->pos[k].cls].ranges[(size_t)i * N + j].known)
                    r_floor = range_cost(s, s->pos[k].cls, i, j)->recompute_ms;
                if (isinf(t))
                    break;
                double a = t - f > before ? t - f : before, *at = P_at(s, k + 1, j + 1);
                *at = a < *at ? a : *at;
            }
        }
}

static int past_deadline(const struct search *s);
static double any_order_bound(const struct search *s);

/* The furthest layer each position of the order laid out could start at in a split bounded
 * under `under`, into s->reach. Every bound of a position is M T or more (own_bound), and T
 * its layers' forward and backward or more, so the positions before k hold at most what each
 * one's M forwards and backwards alone fit under it, each from where the one before could end
 * at the furthest (fewer layers from a later start fit too). */
static void starts_reach(struct search *s, double under)
{
    s->reach[0] = 0;
    for (int k = 0; k + 1 < s->S; k++) {
        const double *fwd = s->fwd_prefix[s->pos[k].profile];
        const double *bwd = s->bwd_prefix[s->pos[k].profile];
        int from = s->reach[k], to = from;
        while (to < s->N && s->M * (fwd[to + 1] - fwd[from] + bwd[to + 1] - bwd[from]) < under)
            to++;
        s->reach[k + 1] = to;
    }
}

/* Q(k, i): least sum of T + 2 c over the ways to put layers i.. on positions k..;
 * D(k, i): least drain_step over those ways;
 * G(k, i): least over those ways of max_{s >= k} (prefix from k to s + own_bound(s)), with
 * each stage's `after` and `drain` taken as the least possible Q and D of what follows it,
 * and each T as far as known without a knapsack (floor_ms with range_floor's relaxation, so
 * that the tables solve only short ranges' knapsacks; the splits simulated solve theirs).
 * 0 when s->may_stop stopped it at the time limit (G(0, 0) then any_order_bound). Each G(k, i)
 * is at least the least G(k + 1, .) (a stage's bound holds what follows it), so G(0, 0) is at
 * least the least of any row: once that reaches s->enough, G(0, 0) is set to it and the rest
 * is left unbuilt. Under a finite `under` (a little over s->enough), each row's starts past
 * starts_reach's are left out too, and with them the ways through them: the splits left are
 * bounded over the ways left (as tight as before or tighter), the others at `under` or more
 * (bound_table takes G(0, 0) no higher than that). */
static int table_rows(struct search *s, double under)
{
    int S = s->S, N = s->N, cut = !isinf(under);
    if (cut)
        starts_reach(s, under);
    for (int k = 0; k <= S; k++)
        for (int i = 0; i <= N; i++)
            *G_at(s, k, i) = *Q_at(s, k, i) = *D_at(s, k, i) = INFINITY;
    *G_at(s, S, N) = *Q_at(s, S, N) = 0;
    *D_at(s, S, N) = -INFINITY;
    for (int k = S - 1; k >= 0 && s->e->code == ERR_OK; k--) {
        int stages_after = S - 1 - k;
        double row_least = INFINITY;
        if (s->may_stop && past_deadline(s)) {
            *G_at(s, 0, 0) = any_order_bound(s);
            return 0;
        }
        int i_last = N - 1 - stages_after;
        if (cut && i_last > s->reach[k])
            i_last = s->reach[k]; /* later starts are bounded at `under` or more */
        for (int i = k; i <= i_last; i++) {
            double best = INFINITY, least_sum = INFINITY, least_drain = INFINITY, r_floor = 0;
            for (int j = i; j <= N - 1 - stages_after; j++) {
                if (k == S - 1 && j != N - 1)
                    continue;
                double rest = *G_at(s, k + 1, j + 1), rest_sum = *Q_at(s, k + 1, j + 1);
                double rest_drain = *D_at(s, k + 1, j + 1), c = transfer_ms(s, k, j), f;
                if (isinf(rest) || !could_improve(s, k, i, j, r_floor, c, rest, rest_sum,
                                                  rest_drain, best, least_sum, least_drain))
                    continue; /* whatever its recompute */
                double relaxed = range_floor(s, s->pos[k].cls, i, j);
                r_floor = relaxed > r_floor ? relaxed : r_floor;
                double t = floor_ms(s, k, i, j, r_floor, &f);
                /* T only grows with the range: past here nothing fits */
                if (isinf(t))
                    break;
                double d = drain_step(s, k, t, f, c, rest_drain);
                if (t + c + rest_sum < least_sum)
                    least_sum = t + c + rest_sum;
                if (d < least_drain)
                    least_drain = d;
                if (s->M * t >= best)
                    continue; /* own_bound >= M T: no better G here, but Q and D may be */
                double fill = fill_floor(s, k, j, f);
                double cool = cool_floor_after(s, k, j, t - f, *P_at(s, k, i));
                double v = own_bound(s, k, t, f, c + rest_sum, c + rest_drain, fill, cool);
                double w = s->pair ? window_bound(s, k, t, f, c + rest_sum, c + rest_drain,
                                                  fill, cool, t + next_floor(s, k, j), 1)
                                   : v;
                v = w > v ? w : v;
                if (t + c + rest > v)
                    v = t + c + rest;
                if (k == 0) /* the iteration ends with stage 0's optimizer step */
                    v += tail_ms(s, 0, i, j);
                if (v < best)
                    best = v;
            }
            *G_at(s, k, i) = best;
            *Q_at(s, k, i) = least_sum;
            *D_at(s, k, i) = least_drain;
            row_least = best < row_least ? best : row_least;
        }
        if (k > 0 && row_least >= s->enough) {
            *G_at(s, 0, 0) = row_least;
            break;
        }
        round_trip_table(s, k);
    }
    return 1;
}

/* Where bound_table cuts the tables: a little over s->enough, so that no rounding cuts a
 * split bounded under it (INFINITY: uncut). */
static double table_cut(const struct search *s)
{
    return s->enough * (1 + 1e-9);
}

/* The tables of the order laid out (table_rows), cut where a bound may stop them; made again
 * uncut when the cut ones leave no split (INFINITY says that none fits). */
static int bound_table(struct search *s)
{
    double under = table_cut(s);
    choose_targets(s);
    prefix_table(s);
    int tabled = table_rows(s, under);
    if (!tabled || isinf(under))
        return tabled;
    if (isinf(*G_at(s, 0, 0)))
        return table_rows(s, INFINITY);
    if (*G_at(s, 0, 0) > under * (1 - 1e-12)) /* less its rounding */
        *G_at(s, 0, 0) = under * (1 - 1e-12);
    return 1;
}

/* Buckets of tight_bound's suffix sums. */
#define TIGHT_BUCKETS 256

/* Records a suffix of bound `v` and sum `sum` (of T and transfers) from (k, i) in tight_bound's
 * tables g and e (that state's TIGHT_BUCKETS entries): in the bucket of sum - least (`least`:
 * Q(k, i)), or, from `cap` on, as cap in bucket 0 with the least sum (nothing there matters). */
static void tight_put(double *g, double *e, double v, double sum, double least, double cap,
                      double width)
{
    int b = 0;
    if (v >= cap) {
        v = cap;
        sum = least;
    } else if (sum - least > 0) {
        double x = (sum - least) / width;
        b = x < TIGHT_BUCKETS - 1 ? (int)x : TIGHT_BUCKETS - 1;
    }
    g[b] = v < g[b] ? v : g[b];
    e[b] = sum < e[b] ? sum : e[b];
}

/* The children of (k, i) that give position k layers i..j (T ms, f forward, c its transfer):
 * one per bucket of (k + 1, j + 1) in the row after (gb, eb), with bound_table's own_bound and
 * `after` that bucket's sum; recorded with tight_put in g and e when `put`. Returns their
 * least bound. */
static double tight_children(struct search *s, const double *gb, const double *eb, double *g,
                             double *e, int k, int i, int j, double t, double f, double c,
                             double cap, double width, int put)
{
    size_t at = (size_t)(j + 1) * TIGHT_BUCKETS;
    double least = INFINITY, drain = c + *D_at(s, k + 1, j + 1), fill = fill_floor(s, k, j, f);
    double cool = cool_floor_after(s, k, j, t - f, *P_at(s, k, i)), next = next_floor(s, k, j);
    double tail0 = k == 0 ? tail_ms(s, 0, i, j) : 0;
    for (int b = 0; b < TIGHT_BUCKETS; b++) {
        double rest = gb[at + b];
        if (isinf(rest))
            continue;
        double sum = t + c + eb[at + b];
        double v = own_bound(s, k, t, f, sum - t, drain, fill, cool);
        double w = s->pair ? window_bound(s, k, t, f, sum - t, drain, fill, cool, t + next, 1)
                           : v;
        v = w > v ? w : v;
        v = (t + c + rest > v ? t + c + rest : v) + tail0;
        least = v < least ? v : least;
        if (put)
            tight_put(g, e, v, sum, *Q_at(s, k, i), cap, width);
    }
    return least;
}

/* Row k of tight_bound's tables (g, e) from row k + 1 (gb, eb). */
static void tight_row(struct search *s, const double *gb, const double *eb, double *g,
                      double *e, int k, double cap, double width)
{
    int N = s->N, last_j = N - 1 - (s->S - 1 - k);
    for (size_t q = 0; q < (size_t)(N + 1) * TIGHT_BUCKETS; q++)
        g[q] = e[q] = INFINITY;
    for (int i = k; i <= (k == 0 ? 0 : last_j); i++) {
        double *gi = g + (size_t)i * TIGHT_BUCKETS, *ei = e + (size_t)i * TIGHT_BUCKETS;
        double r_floor = 0;
        int capped = 0;
        for (int j = k == s->S - 1 ? N - 1 : i; j <= last_j && !isinf(*Q_at(s, k, i)); j++) {
            double f, t = floor_ms(s, k, i, j, r_floor, &f), c = transfer_ms(s, k, j);
            if (isinf(t) || s->M * t >= cap) { /* and every longer range */
                capped |= !isinf(t);
                break;
            }
            if (isinf(*Q_at(s, k + 1, j + 1)))
                continue;
            if (tight_children(s, gb, eb, gi, ei, k, i, j, t, f, c, cap, width, 0) >= cap) {
                capped = 1;
                continue;
            }
            t = stage_ms(s, k, i, j, &f);
            if (isinf(t))
                break;
            r_floor = range_cost(s, s->pos[k].cls, i, j)->recompute_ms;
            tight_children(s, gb, eb, gi, ei, k, i, j, t, f, c, cap, width, 1);
        }
        if (capped)
            tight_put(gi, ei, cap, 0, *Q_at(s, k, i), cap, width);
    }
}

/* A bound on every split of the order laid out (after its bound_table), at most `cap`, or NAN
 * when out of time or memory. bound_table takes each position's own term with `after` at Q,
 * the least sum of T and transfers after it, whatever split G(k + 1) took; here each state
 * also carries its suffix's sum, in buckets of `width` above Q (the last one holding all
 * above), so that both come from one split. g(k, i, b): the least bound of a suffix from
 * (k, i) whose sum is in bucket b; e(k, i, b): the least sum there (the two may come from
 * different splits of the bucket: floors of each); one row of each is kept. A range's
 * knapsack is solved only when its T at its floor could give less than cap. */
static double tight_bound(struct search *s, double cap, double width)
{
    size_t n = (size_t)(s->N + 1) * TIGHT_BUCKETS;
    double *g = malloc(2 * n * sizeof *g), *e = malloc(2 * n * sizeof *e), least = NAN;
    if (g == NULL || e == NULL) {
        free(g);
        free(e);
        return NAN;
    }
    double *gb = g + n, *eb = e + n; /* row k + 1 */
    for (size_t q = 0; q < n; q++)
        gb[q] = eb[q] = INFINITY;
    gb[(size_t)s->N * TIGHT_BUCKETS] = eb[(size_t)s->N * TIGHT_BUCKETS] = 0;
    for (int k = s->S - 1; k >= 0 && s->e->code == ERR_OK && !past_deadline(s); k--) {
        double *gk = gb == g ? g + n : g, *ek = eb == e ? e + n : e;
        tight_row(s, gb, eb, gk, ek, k, cap, width);
        gb = gk;
        eb = ek;
        if (k == 0) {
            least = INFINITY;
            for (int b = 0; b < TIGHT_BUCKETS; b++)
                least = gb[b] < least ? gb[b] : least;
        }
    }
    free(g);
    free(e);
    return least;
}

static int repart_better(double ms, int64_t memory, double best_ms, int64_t best_memory)
{
    double tol = 1e-12 * (1 + fabs(best_ms));
    return ms < best_ms - tol || (ms <= best_ms + tol && memory < best_memory);
}

/* Past this bound a node cannot beat the incumbent by more than o->search_gap (0: cannot beat
 * it at all). */
static double prune_limit(const struct search *s)
{
    return s->best_ms / (1 + s->o->search_gap) * (1 + 1e-12) + 1e-12;
}

/* Whether a node of this bound is left out; its bound then stays in the certified one (it
 * may be below the best plan by up to the gap), but for a dive's (the search visits its
 * order again). */
static int pruned(struct search *s, double bound)
{
    if (bound <= prune_limit(s))
        return 0;
    if (bound < s->pruned_bound && !s->diving)
        s->pruned_bound = bound;
    return 1;
}

/* The bound of a complete split, with each stage's true round trip downstream and its steady
 * state with every run of stages after it (window_bound): a cheap screen before simulating
 * it. `coarse`: without the round trips to each later position (own_bound's fill and cool)
 * and the runs, a weaker bound in time linear in S. */
static double split_bound(struct search *s, int coarse)
{
    double after = 0, drain = -INFINITY, bound = 0, prefix = 0, t_next = 0;
    double *own = s->own, *z = s->fill_z, *a_max = s->a_max;
    for (int k = 0; k < s->S; k++) { /* the largest A of positions 0..k */
        int first = s->first[k], last = k + 1 < s->S ? s->first[k + 1] - 1 : s->N - 1;
        double f, t = stage_ms(s, k, first, last, &f);
        a_max[k] = k > 0 && a_max[k - 1] > t - f ? a_max[k - 1] : t - f;
        s->a[k] = t - f;
    }
    for (int k = s->S - 1; k >= 0; k--) {
        int first = s->first[k], last = k + 1 < s->S ? s->first[k + 1] - 1 : s->N - 1;
        double f, t = stage_ms(s, k, first, last, &f);
        double c = transfer_ms(s, k, last), fill = -INFINITY, cool = -INFINITY;
        double cool_own = -INFINITY, a_own = t - f;
        /* z[r] - z[k]: micro-batch 0's round trip from k to r and back (T of k+1..r and
         * the transfers between), while k ran the forwards r needs before its first backward */
        z[k] = k + 1 < s->S ? z[k + 1] - t_next - c : 0;
        for (int r = k + 1; r < s->S && !coarse; r++) {
            double v = drain_backwards(s, r) * f + z[r] - z[k];
            double w = t - f + (drain_backwards(s, r) - 1) * a_max[r] + z[r] - z[k];
            a_own = s->a[r] > a_own ? s->a[r] : a_own;
            double w_own = t - f + (drain_backwards(s, r) - 1) * a_own + z[r] - z[k];
            fill = v > fill ? v : fill;
            cool = w > cool ? w : cool;
            cool_own = w_own > cool_own ? w_own : cool_own;
        }
        own[k] = own_bound(s, k, t, f, after + c, drain + c, fill, cool);
        /* to k's own last backward, the backwards at q < k left out of cool */
        s->own_end[k] = own_bound(s, k, t, f, after + c, drain + c, fill, cool_own);
        /* (none where k runs every forward first: window_bound is -infinity there) */
        for (int r = k + 1; r < s->S && !coarse && drain_backwards(s, k) < s->M; r++) {
            double span = t + z[r] - z[k];
            double v = window_bound(s, k, t, f, after + c, drain + c, fill, cool, span, r - k);
            double w = window_bound(s, k, t, f, after + c, drain + c, fill, cool_own, span, r - k);
            own[k] = v > own[k] ? v : own[k];
            s->own_end[k] = w > s->own_end[k] ? w : s->own_end[k];
        }
        after += t + c;
        drain = drain_step(s, k, t, f, c, drain);
        t_next = t;
    }
    double tail0 = tail_ms(s, 0, 0, s->S > 1 ? s->first[1] - 1 : s->N - 1), fwd_prefix = 0;
    for (int k = 0; k < s->S; k++) {
        int first = s->first[k], last = k + 1 < s->S ? s->first[k + 1] - 1 : s->N - 1;
        double f, c = transfer_ms(s, k, last);
        double through = prefix + own[k] + tail0;
        double at = fwd_prefix + s->own_end[k] + tail_ms(s, k, first, last);
        bound = through > bound ? through : bound;
        bound = at > bound ? at : bound;
        prefix += stage_ms(s, k, first, last, &f) + c;
        fwd_prefix += f + c / 2;
    }
    return bound;
}

/* The simulated step of the split in s->first (*memory: its stages' memory); INFINITY when
 * the simulation fails. */
static double split_ms(struct search *s, int64_t *memory)
{
    struct sim_bucket *bucket = s->buckets;
    *memory = 0;
    for (int k = 0; k < s->S; k++) {
        int first = s->first[k], last = k + 1 < s->S ? s->first[k + 1] - 1 : s->N - 1;
        const struct position *p = &s->pos[k];
        const struct range_cost *rc = range_cost(s, p->cls, first, last);
        struct sim_stage *st = &s->sim_in[k];
        st->n_buckets = stage_buckets(s, k, first, last, bucket);
        st->buckets = bucket;
        bucket += st->n_buckets;
        st->fwd_ms = s->fwd_prefix[p->profile][last + 1] - s->fwd_prefix[p->profile][first];
        st->bwd_ms = s->bwd_prefix[p->profile][last + 1] - s->bwd_prefix[p->profile][first];
        st->recompute_ms = rc->recompute_ms;
        st->out_bytes = s->c->profiles[p->profile].layers[last].out_bytes;
        st->out_fwd_ms = s->c->profiles[p->profile].layers[last].fwd_ms;
        st->link = k + 1 < s->S ? p->link : (struct link){0};
        st->allreduce_ms = cluster_allreduce_ms(s->c, p->stage, first, last);
        st->optimizer_ms = optimizer_ms(s, k, first, last);
        *memory += rc->memory_bytes;
    }
    double ms;
    int simulated;
    if (sim_makespan_periodic(s->c->schedule, s->S, s->M, s->sim_in, &ms, &simulated, s->e))
        return INFINITY;
    return ms;
}

/* The split in s->first, simulated at `ms` with `memory`, becomes the incumbent if better. */
/* Whether position k may hold layers i..j under a framework's split (its least blocks at the
 * ends; an even middle: as many layers as position 1, whose range ends where position 2, or
 * at depth 2 this one, starts), with s->first set up to k. */
static int range_allowed(const struct search *s, int k, int i, int j)
{
    if ((k == 0 && j < s->first_end_min) || (k == s->S - 1 && i > s->last_start_max))
        return 0;
    if (!s->even_middle || k < 2 || k > s->S - 2)
        return 1;
    return j - i + 1 == (k == 2 ? i : s->first[2]) - s->first[1];
}

/* The whole split in s->first under range_allowed. */
static int repart_split_allowed(const struct search *s)
{
    for (int k = 0; k < s->S; k++)
        if (!range_allowed(s, k, s->first[k], k + 1 < s->S ? s->first[k + 1] - 1 : s->N - 1))
            return 0;
    return 1;
}

static void keep_if_better(struct search *s, const int *order, double ms, int64_t memory)
{
    if (!repart_better(ms, memory, s->best_ms, s->best_memory) || !repart_split_allowed(s))
        return;
    s->best_ms = ms;
    s->best_memory = memory;
    memcpy(s->best_first, s->first, (size_t)s->S * sizeof *s->first);
    memcpy(s->best_order, order, (size_t)s->S * sizeof *order);
    for (int k = 0; k < s->S; k++)
        s->best_link[k] = s->pos[k].link;
}

static void leaf(struct search *s, const int *order)
{
    int64_t memory;
    if (pruned(s, split_bound(s, 0)))
        return;
    s->leaves++;
    double ms = split_ms(s, &memory);
    if (!isinf(ms))
        keep_if_better(s, order, ms, memory);
}

/* The time limit has passed. */
static int past_deadline(const struct search *s)
{
    return !isinf(s->deadline) && clock_now_s() > s->deadline;
}

/* Forward and backward of layer l on profile p. */
static double layer_ms(const struct search *s, int p, int l)
{
    return s->fwd_prefix[p][l + 1] - s->fwd_prefix[p][l] + s->bwd_prefix[p][l + 1] -
           s->bwd_prefix[p][l];
}

/* A floor under the busiest position's T whatever the order and split (recompute only adds):
 * the n_p positions of profile p hold n_p different layers, one of them at least the n_p-th
 * fastest on p; and with weights y_p = (1 / W_p) / sum_q (n_q / W_q), W_p the model's forward
 * and backward on p, sum_p n_p y_p = 1, so T >= the sum over positions of y T, to which each
 * layer adds at least min_p y_p t_lp (LP duality for spreading the layers). */
static double busiest_floor(const struct search *s)
{
    const struct cluster *c = s->c;
    double norm = 0, spread = 0, least_held = 0;
    double *t = malloc((size_t)s->N * sizeof *t);
    int *n = calloc((size_t)c->n_profiles, sizeof *n);
    if (t == NULL || n == NULL) {
        free(t);
        free(n);
        return 0;
    }
    for (int st = 0; st < c->n_stages; st++)
        n[c->stages[st].profile]++;
    for (int p = 0; p < c->n_profiles; p++)
        norm += n[p] / (s->fwd_prefix[p][s->N] + s->bwd_prefix[p][s->N]);
    for (int l = 0; l < s->N; l++) {
        double least = INFINITY;
        for (int p = 0; p < c->n_profiles; p++) {
            double y = 1 / ((s->fwd_prefix[p][s->N] + s->bwd_prefix[p][s->N]) * norm);
            if (n[p] > 0 && y * layer_ms(s, p, l) < least)
                least = y * layer_ms(s, p, l);
        }
        spread += least;
    }
    for (int p = 0; p < c->n_profiles; p++) {
        if (n[p] == 0)
            continue;
        for (int l = 0; l < s->N; l++)
            t[l] = layer_ms(s, p, l);
        stats_sort(t, s->N);
        least_held = t[n[p] - 1] > least_held ? t[n[p] - 1] : least_held;
    }
    free(t);
    free(n);
    return spread > least_held ? spread : least_held;
}

/* A bound on every order and split, for the orders whose bound table the time limit left
 * unbuilt: the busiest position runs M forwards and backwards one after the other. */
static double any_order_bound(const struct search *s)
{
    return s->M * busiest_floor(s);
}

/* Nodes between two looks at the clock (a node takes about a microsecond; reading the clock
 * at every one was 2% of a search). */
#define CLOCK_NODES 64

/* The node budget is spent, or the time limit has passed and the search has dived to a split
 * of its own (not only the cluster's). */
static int out_of_budget(struct search *s)
{
    if (s->nodes >= s->budget)
        return 1;
    if (!s->dived || s->nodes < s->clock_nodes)
        return 0;
    s->clock_nodes = s->nodes + CLOCK_NODES;
    if (!past_deadline(s))
        return 0;
    s->budget = s->nodes; /* stays stopped without asking the clock again */
    return 1;
}

/* The prefix a branch has built: positions before k, `ms` their T and transfers, `fwd_ms`
 * their forwards and forward transfers, `tail0` stage 0's optimizer step (once placed),
 * `partial` the largest stage_bound of those positions, `a_max` their largest backward (with
 * recompute) and `a_first` that of those that run every forward first (0: none). */
struct prefix {
    double ms, fwd_ms, tail0, partial, a_max, a_first;
};

/* The earlier runs' part of a child's bound: each position k' of the branch's path within
 * RUNS_MAX before k, with its steady state over k' + 1 .. k (window_bound; span: their T,
 * k's t among them, and the transfers both ways between), its other terms the floors it was
 * placed with (after, drain, fill, cool: window_bound only grows with them). The runs ending
 * after k wait for the positions after it, and split_bound takes them at the leaf. */
static double runs_bound(const struct search *s, int k, double t, double tail0)
{
    double v = -INFINITY, between = t;
    for (int q = k - 1; q >= 0 && k - q <= RUNS_MAX; q--) {
        const struct placed *a = &s->path[q];
        between += a->c;
        double span = a->t + between;
        double w = window_bound(s, q, a->t, a->f, a->after, a->drain, a->fill, a->cool, span,
                                k - q);
        double w_end = window_bound(s, q, a->t, a->f, a->after, a->drain, a->fill, a->cool_own,
                                    span, k - q);
        v = fmax(v, stage_bound(a->ms, a->fwd_ms, w, w_end, tail0, a->tail));
        between += a->t;
    }
    return v;
}

/* The prefix with position k holding layers i..j (T ms, f forward) added; what bounded it
 * into *out (when not NULL: the branch's path). */
static struct prefix extend(struct search *s, const struct prefix *p, int k, int i, int j,
                            double t, double f, struct placed *out)
{
    double c = transfer_ms(s, k, j), tail = tail_ms(s, k, i, j);
    double tail0 = k == 0 ? tail : p->tail0;
    double after = c + *Q_at(s, k + 1, j + 1), drain = c + *D_at(s, k + 1, j + 1);
    double fill = fill_floor(s, k, j, f);
    double cool = cool_floor_after(s, k, j, t - f, p->a_max), cool_own = cool_floor(s, k, j, t - f);
    double own = own_bound(s, k, t, f, after, drain, fill, cool);
    double own_end = own_bound(s, k, t, f, after, drain, fill, cool_own);
    double v = stage_bound(p->ms, p->fwd_ms, own, own_end, tail0, tail);
    double runs = runs_bound(s, k, t, tail0);
    v = runs > v ? runs : v;
    /* a position q that runs every forward first ends its M backwards no sooner than
     * micro-batch 0's round trip from its own forward (own_bound: f + after + M A), so the
     * iteration takes every position's T and transfer, (M - 1) A_q more, and stage 0's
     * optimizer step: with q placed before, those after k at their least sum (Q), a bound
     * the positions placed since q have raised from the floor q was placed with */
    double a_first = drain_backwards(s, k) == s->M && t - f > p->a_first ? t - f : p->a_first;
    double chain = p->ms + t + c + *Q_at(s, k + 1, j + 1) + (s->M - 1) * a_first + tail0;
    v = chain > v ? chain : v;
    if (out != NULL)
        *out = (struct placed){t, f, after, drain, fill, cool, cool_own, p->ms, p->fwd_ms, tail, c};
    return (struct prefix){p->ms + t + c, p->fwd_ms + f + c / 2, tail0,
                           p->partial > v ? p->partial : v,
                           p->a_max > t - f ? p->a_max : t - f, a_first};
}

/* The bound of the child that gives position k the layers i..j (T ms, f forward) after the
 * prefix p; `rest` is G after it. */
static double child_bound(struct search *s, const struct prefix *p, int k, int i, int j,
                          double t, double f, double rest)
{
    struct prefix next = extend(s, p, k, i, j, t, f, NULL);
    double through = next.ms + rest + next.tail0;
    return next.partial > through ? next.partial : through;
}

/* Most promising first, so the incumbent improves early: (bound, last layer) pairs by bound,
 * stable (insertion sort: a node has few children). */
static void sort_children(double *kids, int n)
{
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && kids[2 * (b - 1)] > kids[2 * b]; b--) {
            double t0 = kids[2 * b], t1 = kids[2 * b + 1];
            kids[2 * b] = kids[2 * (b - 1)];
            kids[2 * b + 1] = kids[2 * (b - 1) + 1];
            kids[2 * (b - 1)] = t0;
            kids[2 * (b - 1) + 1] = t1;
        }
}

/* A dive (dive_orders) has simulated a split, or spent its nodes. */
static int dive_over(const struct search *s)
{
    return s->diving && (s->leaves > s->dive_leaves || s->nodes >= s->dive_nodes);
}

/* Depth-first over the split: position k starts at layer i after the prefix p. */
static void branch(struct search *s, const int *order, int k, int i, const struct prefix *p)
{
    if (s->e->code)
        return;
    if (k == s->S) {
        s->dived = 1;
        leaf(s, order);
        return;
    }
    int stages_after = s->S - 1 - k;
    double *kids = s->children + (size_t)k * s->N * 2;
    int n = 0;
    double r_floor = 0;
    for (int j = i; j <= s->N - 1 - stages_after; j++) {
        if (k == s->S - 1 && j != s->N - 1)
            continue;
        double rest = *G_at(s, k + 1, j + 1);
        if (!range_allowed(s, k, i, j))
            continue;
        /* the child's bound with T at its floor first: when even that is over the limit, the
         * range's knapsack is not needed */
        double f, t = floor_ms(s, k, i, j, r_floor, &f);
        if (pruned(s, s->M * t + p->ms)) /* and every later child: T grows with the range */
            break;
        if (isinf(rest) || pruned(s, child_bound(s, p, k, i, j, t, f, rest)))
            continue;
        t = stage_ms(s, k, i, j, &f);
        if (isinf(t) || pruned(s, s->M * t + p->ms))
            break;
        r_floor = range_cost(s, s->pos[k].cls, i, j)->recompute_ms;
        double bound = child_bound(s, p, k, i, j, t, f, rest);
        if (pruned(s, bound))
            continue;
        kids[2 * n] = bound;
        kids[2 * n + 1] = j;
        n++;
    }
    sort_children(kids, n);
    for (int a = 0; a < n && s->e->code == ERR_OK; a++) {
        double bound = kids[2 * a];
        if (pruned(s, bound))
            break; /* the incumbent improved meanwhile (the kids after are bounded higher) */
        if (dive_over(s))
            return;
        /* past the budget, stop, but not before a first split: a finite bound G guarantees
         * the dive reaches one */
        if (out_of_budget(s) && !isinf(s->best_ms)) {
            if (bound < s->open_bound && !s->diving)
                s->open_bound = bound;
            return;
        }
        s->nodes++;
        int j = (int)kids[2 * a + 1];
        double f, t = stage_ms(s, k, i, j, &f);
        struct prefix next = extend(s, p, k, i, j, t, f, &s->path[k]);
        s->first[k] = i;
        branch(s, order, k + 1, j + 1, &next);
    }
}

/* Device kinds in order of first appearance; kind_of[stage]. */
static int device_kinds(const struct cluster *c, int *kind_of, int *first_stage)
{
    int K = 0;
    for (int s = 0; s < c->n_stages; s++) {
        int k = 0;
        while (k < K && strcmp(c->stages[first_stage[k]].device, c->stages[s].device) != 0)
            k++;
        if (k == K)
            first_stage[K++] = s;
        kind_of[s] = k;
    }
    return K;
}

struct link repartition_exit_link(const struct cluster *c, const int *kind_of, int kind)
{
    int last = -1;
    for (int s = 0; s < c->n_stages; s++)
        if (kind_of[s] == kind)
            last = s;
    if (last + 1 < c->n_stages)
        return cluster_link(c, last);
    if (c->link.present)
        return c->link;
    struct link slowest = {0};
    for (int s = 0; s + 1 < c->n_stages; s++) {
        if (kind_of[s] == kind_of[s + 1])
            continue;
        struct link l = cluster_link(c, s);
        if (l.present && (!slowest.present || l.gbps < slowest.gbps ||
                          (l.gbps == slowest.gbps && l.latency_us > slowest.latency_us)))
            slowest = l;
    }
    return slowest;
}

/* Cluster stage `st` at position k, with its link to the next. */
static int place(struct search *s, int k, int st, struct link link)
{
    struct position *p = &s->pos[k];
    p->stage = st;
    p->profile = s->c->stages[st].profile;
    int v = schedule_in_flight(s->c->schedule, s->S, k, s->M);
    p->cls = class_of(s, p->profile, s->c->stages[st].memory_bytes, v);
    if (p->cls < 0)
        return err_set(s->e, ERR_FAIL, "out of memory");
    p->link = link;
    /* transfer_ms's, per last layer: the bound tables ask them over and over */
    const struct layer_cost *layers = s->c->profiles[p->profile].layers;
    for (int l = 0; l < s->N; l++)
        s->transfer[(size_t)k * s->N + l] =
            k + 1 < s->S ? 2 * link_transfer_ms(&link, layers[l].out_bytes) : 0;
    return ERR_OK;
}

/* Lays out the positions for a kind order: each kind's stages in cluster order. */
static int repart_layout(struct search *s, const int *kinds, int K, const int *kind_of, int *order)
{
    const struct cluster *c = s->c;
    int k = 0;
    for (int g = 0; g < K; g++) {
        for (int st = 0; st < c->n_stages; st++) {
            if (kind_of[st] != kinds[g])
                continue;
            /* inside a kind, the link the stage had to its neighbour of the same kind */
            int next_same = -1;
            for (int q = st + 1; q < c->n_stages && next_same < 0; q++)
                if (kind_of[q] == kinds[g])
                    next_same = q;
            if (place(s, k, st, next_same >= 0 ? cluster_link(c, st)
                                               : repartition_exit_link(c, kind_of, kinds[g])))
                return s->e->code;
            order[k++] = st;
        }
    }
    return ERR_OK;
}

static int next_permutation(int *a, int n)
{
    int i = n - 2;
    while (i >= 0 && a[i] >= a[i + 1])
        i--;
    if (i < 0)
        return 0;
    int j = n - 1;
    while (a[j] <= a[i])
        j--;
    int t = a[i];
    a[i] = a[j];
    a[j] = t;
    for (int l = i + 1, r = n - 1; l < r; l++, r--) {
        t = a[l];
        a[l] = a[r];
        a[r] = t;
    }
    return 1;
}

static void repart_search_free(struct search *s)
{
    for (int k = 0; k < s->n_classes; k++)
        free(s->classes[k].ranges);
    free(s->classes);
    if (s->fwd_prefix)
        for (int p = 0; p < s->c->n_profiles; p++)
            free(s->fwd_prefix[p]);
    if (s->bwd_prefix)
        for (int p = 0; p < s->c->n_profiles; p++)
            free(s->bwd_prefix[p]);
    if (s->opt_prefix)
        for (int p = 0; p < s->c->n_profiles; p++)
            free(s->opt_prefix[p]);
    free(s->fwd_prefix);
    free(s->bwd_prefix);
    free(s->opt_prefix);
    free(s->profile_hash);
    free(s->pos);
    free(s->transfer);
    free(s->G);
    free(s->Q);
    free(s->D);
    free(s->target);
    free(s->Z);
    free(s->R);
    free(s->P);
    free(s->first);
    free(s->best_first);
    free(s->best_order);
    free(s->best_link);
    free(s->sim_in);
    free(s->buckets);
    free(s->bwd_scratch);
    free(s->children);
    free(s->own);
    free(s->fill_z);
    free(s->a_max);
    free(s->a);
    free(s->own_end);
    free(s->reach);
    free(s->path);
}

/* For a framework's plan: the least end of the first stage and the most start of the last,
 * its blocks counted from either end (min_blocks each); whether the middle splits evenly. */
static void framework_ends(struct search *s, const struct cluster *c,
                           const struct plan_options *o)
{
    s->first_end_min = 0;
    s->last_start_max = s->N - 1;
    s->even_middle = o->framework_range != NULL && o->framework_range->f->split == FW_SPLIT_ENDS;
    if (o->framework_range == NULL)
        return;
    int want = o->framework_range->f->min_blocks;
    for (int l = 0, b = 0; l < s->N && b < want; l++)
        if (fw_is_block(&c->model, l) && ++b == want)
            s->first_end_min = l;
    for (int l = s->N - 1, b = 0; l >= 0 && b < want; l--)
        if (fw_is_block(&c->model, l) && ++b == want)
            s->last_start_max = l;
}

/* The search's tables: per (stage, layer) position, per fill target, per stage and layer. */
static int alloc_tables(struct search *s, const struct cluster *c, struct err *e)
{
    size_t cells = (size_t)(s->S + 1) * (s->N + 1), S = (size_t)s->S, N = (size_t)s->N;
    s->fwd_prefix = calloc((size_t)c->n_profiles, sizeof *s->fwd_prefix);
    s->bwd_prefix = calloc((size_t)c->n_profiles, sizeof *s->bwd_prefix);
    s->opt_prefix = calloc((size_t)c->n_profiles, sizeof *s->opt_prefix);
    s->profile_hash = calloc((size_t)c->n_profiles, sizeof *s->profile_hash);
    s->pos = calloc(S, sizeof *s->pos);
    s->transfer = malloc(S * N * sizeof *s->transfer);
    s->G = malloc(cells * sizeof *s->G);
    s->Q = malloc(cells * sizeof *s->Q);
    s->D = malloc(cells * sizeof *s->D);
    s->target = malloc(FILL_TARGETS_MAX * sizeof *s->target);
    s->Z = malloc(FILL_TARGETS_MAX * cells * sizeof *s->Z);
    s->R = malloc(FILL_TARGETS_MAX * cells * sizeof *s->R);
    s->P = malloc(cells * sizeof *s->P);
    s->first = calloc(S, sizeof *s->first);
    s->best_first = calloc(S, sizeof *s->best_first);
    s->best_order = calloc(S, sizeof *s->best_order);
    s->best_link = calloc(S, sizeof *s->best_link);
    s->sim_in = calloc(S, sizeof *s->sim_in);
    s->buckets = calloc(N, sizeof *s->buckets);
    s->bwd_scratch = calloc(N, sizeof *s->bwd_scratch);
    s->children = malloc(S * N * 2 * sizeof *s->children);
    s->own = malloc(S * sizeof *s->own);
    s->fill_z = malloc(S * sizeof *s->fill_z);
    s->a_max = malloc(S * sizeof *s->a_max);
    s->a = malloc(S * sizeof *s->a);
    s->own_end = malloc(S * sizeof *s->own_end);
    s->reach = malloc(S * sizeof *s->reach);
    s->path = malloc(S * sizeof *s->path);
    if (!s->fwd_prefix || !s->bwd_prefix || !s->opt_prefix || !s->profile_hash || !s->pos ||
        !s->transfer || !s->G || !s->Q || !s->D || !s->target || !s->Z || !s->R || !s->P ||
        !s->first || !s->best_first || !s->best_order || !s->best_link || !s->sim_in ||
        !s->buckets || !s->bwd_scratch || !s->children || !s->own || !s->fill_z || !s->a_max ||
        !s->a || !s->own_end || !s->reach || !s->path)
        return err_set(e, ERR_FAIL, "out of memory");
    return ERR_OK;
}

/* Each profile's forward, backward and optimizer times summed over its first l layers. */
static int time_prefixes(struct search *s, const struct cluster *c, struct err *e)
{
    for (int p = 0; p < c->n_profiles; p++) {
        s->fwd_prefix[p] = calloc((size_t)s->N + 1, sizeof **s->fwd_prefix);
        s->bwd_prefix[p] = calloc((size_t)s->N + 1, sizeof **s->bwd_prefix);
        s->opt_prefix[p] = calloc((size_t)s->N + 1, sizeof **s->opt_prefix);
        if (!s->fwd_prefix[p] || !s->bwd_prefix[p] || !s->opt_prefix[p])
            return err_set(e, ERR_FAIL, "out of memory");
        for (int l = 0; l < s->N; l++) {
            s->fwd_prefix[p][l + 1] = s->fwd_prefix[p][l] + c->profiles[p].layers[l].fwd_ms;
            s->bwd_prefix[p][l + 1] = s->bwd_prefix[p][l] + c->profiles[p].layers[l].bwd_ms;
            s->opt_prefix[p][l + 1] = s->opt_prefix[p][l] + c->profiles[p].layers[l].optimizer_ms;
        }
    }
    return ERR_OK;
}

static int repart_search_init(struct search *s, const struct cluster *c,
                              const struct plan_options *o, struct err *e)
{
    memset(s, 0, sizeof *s);
    s->c = c;
    s->o = o;
    s->e = e;
    s->S = c->n_stages;
    s->N = c->n_layers;
    s->M = c->micro_batches;
    s->budget = o->search_nodes;
    s->deadline = o->time_limit_s > 0 ? clock_now_s() + o->time_limit_s : INFINITY;
    s->best_ms = o->cutoff_ms > 0 ? o->cutoff_ms : INFINITY; /* prunes as an incumbent would */
    s->best_memory = INT64_MAX; /* until a leaf is kept: then whether one was kept */
    s->open_bound = INFINITY;
    s->enough = INFINITY;
    s->pruned_bound = INFINITY;
    framework_ends(s, c, o);
    if (alloc_tables(s, c, e) || time_prefixes(s, c, e))
        return e->code;
    return ERR_OK;
}

/* Lays out the incumbent's positions again (its order and links). */
static int layout_best(struct search *s)
{
    for (int k = 0; k < s->S; k++)
        if (place(s, k, s->best_order[k], s->best_link[k]))
            return s->e->code;
    return ERR_OK;
}

/* The incumbent's split with one layer moved along positions a..b: with dir +1 position a
 * takes the first layer of a + 1, which takes the first of a + 2, ... and b gives one up;
 * dir -1 the other way. 0 when that leaves a position empty or breaks a framework's split
 * (repart_split_allowed). */
static int shift_split(struct search *s, int a, int b, int dir)
{
    memcpy(s->first, s->best_first, (size_t)s->S * sizeof *s->first);
    for (int q = a + 1; q <= b; q++)
        s->first[q] += dir;
    for (int q = a; q <= b; q++)
        if (s->first[q] >= (q + 1 < s->S ? s->first[q + 1] : s->N))
            return 0;
    return repart_split_allowed(s);
}

/* Whether s->first simulates strictly faster than the incumbent (then it becomes it). */
static int try_split(struct search *s, const int *order)
{
    int64_t memory;
    double tol = 1e-12 * (1 + s->best_ms);
    if (!(split_bound(s, 1) < s->best_ms - tol) || !(split_bound(s, 0) < s->best_ms - tol))
        return 0;
    double ms = split_ms(s, &memory);
    if (!(ms < s->best_ms - tol))
        return 0;
    keep_if_better(s, order, ms, memory);
    return 1;
}

/* Local improvement of the incumbent when the search left a gap: every shift_split that
 * simulates faster, until none does (or the time limit). Only strictly faster splits are
 * taken, so an incumbent the search proved optimal is never touched. */
static void polish(struct search *s, int *order)
{
    if (layout_best(s))
        return;
    memcpy(order, s->best_order, (size_t)s->S * sizeof *order);
    for (int improved = 1; improved && s->e->code == ERR_OK;) {
        improved = 0;
        for (int a = 0; a + 1 < s->S && s->e->code == ERR_OK && !past_deadline(s); a++)
            for (int b = a + 1; b < s->S; b++)
                for (int dir = -1; dir <= 1; dir += 2)
                    improved |= shift_split(s, a, b, dir) && try_split(s, order);
    }
}

/* Positions a..b of the split in s->first: their layers on a partial option and layers
 * recomputed added into key[0] and key[1] (sign -1: taken off); 0 when one cannot fit. */
static int runs_key(struct search *s, int a, int b, int sign, int key[2])
{
    for (int k = a; k <= b; k++) {
        int last = k + 1 < s->S ? s->first[k + 1] - 1 : s->N - 1;
        const struct range_cost *rc = range_cost(s, s->pos[k].cls, s->first[k], last);
        if (isinf(rc->recompute_ms))
            return 0;
        key[0] += sign * rc->options;
        key[1] += sign * rc->recomputed;
    }
    return 1;
}

/* Lexicographic, of two split keys: -1, 0, 1. */
static int split_key_cmp(const int a[3], const int b[3])
{
    for (int i = 0; i < 3; i++)
        if (a[i] != b[i])
            return a[i] < b[i] ? -1 : 1;
    return 0;
}

/* The split in s->first, moved from the incumbent along positions a..b, is simpler: its key
 * (partial options, recomputed layers, blocks away from the default split) below `key`,
 * which it then becomes. */
static int simpler_split(struct search *s, int a, int b, int key[3])
{
    int k[3] = {key[0], key[1], 0}, *first = s->first;
    s->first = s->best_first;
    int fits = runs_key(s, a, b, -1, k);
    s->first = first;
    if (!fits || !runs_key(s, a, b, 1, k))
        return 0;
    k[2] = choice_imbalance(&s->c->model, s->N, s->S, s->first);
    if (split_key_cmp(k, key) >= 0)
        return 0;
    memcpy(key, k, sizeof k);
    return 1;
}

/* --min-gain (choice.h): from the incumbent, every move of one layer along a run of
 * positions (shift_split) that makes the split simpler and simulates within `cap` (the
 * fastest found, plus the gain), until none does or the time limit; key gets the split's. */
static void simplify_split(struct search *s, int *order, double cap, int key[3])
{
    memset(key, 0, 3 * sizeof *key);
    if (layout_best(s))
        return;
    memcpy(order, s->best_order, (size_t)s->S * sizeof *order);
    memcpy(s->first, s->best_first, (size_t)s->S * sizeof *s->first);
    runs_key(s, 0, s->S - 1, 1, key);
    key[2] = choice_imbalance(&s->c->model, s->N, s->S, s->first);
    for (int changed = 1; changed && s->e->code == ERR_OK;) {
        changed = 0;
        for (int a = 0; a + 1 < s->S && s->e->code == ERR_OK && !past_deadline(s); a++)
            for (int b = a + 1; b < s->S; b++)
                for (int dir = -1; dir <= 1; dir += 2) {
                    int64_t memory;
                    int k[3] = {key[0], key[1], key[2]};
                    if (!shift_split(s, a, b, dir) || !simpler_split(s, a, b, k) ||
                        split_bound(s, 1) > cap || split_bound(s, 0) > cap)
                        continue;
                    double ms = split_ms(s, &memory);
                    if (!(ms <= cap))
                        continue;
                    memcpy(key, k, sizeof k);
                    memcpy(s->best_first, s->first, (size_t)s->S * sizeof *s->first);
                    s->best_memory = memory;
                    changed = 1;
                }
    }
}

void arrangement_free(struct arrangement *a)
{
    free(a->stage);
    free(a->first);
    free(a->link);
    memset(a, 0, sizeof *a);
}

/* The kinds of the cluster's own order, when each kind's stages are contiguous (then its own
 * arrangement is one of the candidates); -1 otherwise. */
static int own_order_kinds(const struct cluster *c, const int *kind_of, int K, int *kinds)
{
    for (int st = 1; st < c->n_stages; st++)
        if (kind_of[st] != kind_of[st - 1] && kind_of[st] != kind_of[st - 1] + 1)
            return -1;
    for (int g = 0; g < K; g++)
        kinds[g] = g;
    return 0;
}

/* The cluster's own order and split laid out in s->pos, order and s->first: 1 when it is a
 * candidate (each kind's stages together) and fits. */
static int own_split(struct search *s, const int *kind_of, int K, int *order)
{
    int kinds[REPARTITION_KINDS_MAX];
    const struct cluster *c = s->c;
    if (own_order_kinds(c, kind_of, K, kinds) < 0 || repart_layout(s, kinds, K, kind_of, order))
        return 0;
    for (int k = 0; k < s->S; k++)
        s->first[k] = c->stages[k].first;
    for (int k = 0; k < s->S; k++)
        if (isinf(stage_ms(s, k, c->stages[k].first, c->stages[k].last, NULL)))
            return 0;
    return 1;
}

/* The cluster's own order and split start as the incumbent when it is a candidate and fits:
 * the search never returns worse. */
static int seed_incumbent(struct search *s, const int *kind_of, int K, int *order)
{
    if (own_split(s, kind_of, K, order))
        leaf(s, order);
    return s->e->code;
}

/* --min-gain on the split: the simplest split simplify_split reaches from the fastest found,
 * or from the cluster's own split where that is within `cap` and simpler still, so that an
 * uneven split is taken only where it gains (or is simpler by the preferences before
 * balance). The split is chosen with recompute alone, the same for every --actions. */
static void simplify(struct search *s, const int *kind_of, int K, int *order, double cap)
{
    int key[3], own[3] = {0, 0, 0};
    int64_t memory;
    simplify_split(s, order, cap, key);
    if (s->e->code || !own_split(s, kind_of, K, order) || !(split_ms(s, &memory) <= cap))
        return;
    runs_key(s, 0, s->S - 1, 1, own);
    own[2] = choice_imbalance(&s->c->model, s->N, s->S, s->first);
    if (split_key_cmp(own, key) >= 0)
        return;
    memcpy(s->best_first, s->first, (size_t)s->S * sizeof *s->first);
    memcpy(s->best_order, order, (size_t)s->S * sizeof *order);
    for (int k = 0; k < s->S; k++)
        s->best_link[k] = s->pos[k].link;
    s->best_memory = memory;
    simplify_split(s, order, cap, key);
}

/* Every order of the K kinds with its bound G(0, 0). */
struct orders {
    int n, K;
    int *kinds;    /* n x K */
    double *bound; /* n; NAN once searched */
    double *table; /* n: bound_table's G(0, 0) (any_order_bound where the time limit left none) */
    unsigned char *tabled; /* n: whether bound_table was built */
    struct kept_tables *kept; /* n: the tables of an order left to search (tables_keep) */
};

/* The tables branch reads (G, Q, D, and Z and R of n_targets targets), as bound_table left
 * them for an order under `under` (INFINITY: uncut); cells NULL when none are kept. */
struct kept_tables {
    double *cells;
    int target[FILL_TARGETS_MAX], n_targets;
    double under;
};

static size_t table_cells(const struct search *s)
{
    return (size_t)(s->S + 1) * (s->N + 1);
}

/* The order laid out, bounded under the incumbent less the gap: its tables kept, so that its
 * search need not build them again. Cut at `under` (bound_table), they stay right while the
 * incumbent only falls, and the splits they leave out are bounded at `under` or more. */
static void tables_keep(const struct search *s, struct kept_tables *k, double under)
{
    size_t n = table_cells(s), z = (size_t)s->n_targets * n;
    k->cells = malloc((3 * n + 2 * z) * sizeof *k->cells);
    if (k->cells == NULL)
        return; /* built again when searched */
    memcpy(k->cells, s->G, n * sizeof *s->G);
    memcpy(k->cells + n, s->Q, n * sizeof *s->Q);
    memcpy(k->cells + 2 * n, s->D, n * sizeof *s->D);
    memcpy(k->cells + 3 * n, s->Z, z * sizeof *s->Z);
    memcpy(k->cells + 3 * n + z, s->R, z * sizeof *s->R);
    memcpy(k->target, s->target, (size_t)s->n_targets * sizeof *s->target);
    k->n_targets = s->n_targets;
    k->under = under;
}

/* The kept tables back in place for the order laid out. `searched`: the order is searched
 * now, what they leave out counts in the certified bound at `under`, and they are not kept;
 * else (a dive) they are kept for its search. */
static void tables_restore(struct search *s, struct kept_tables *k, int searched)
{
    size_t n = table_cells(s), z = (size_t)k->n_targets * n;
    memcpy(s->G, k->cells, n * sizeof *s->G);
    memcpy(s->Q, k->cells + n, n * sizeof *s->Q);
    memcpy(s->D, k->cells + 2 * n, n * sizeof *s->D);
    memcpy(s->Z, k->cells + 3 * n, z * sizeof *s->Z);
    memcpy(s->R, k->cells + 3 * n + z, z * sizeof *s->R);
    memcpy(s->target, k->target, (size_t)k->n_targets * sizeof *s->target);
    s->n_targets = k->n_targets;
    if (!searched)
        return;
    if (k->under < s->pruned_bound)
        s->pruned_bound = k->under;
    free(k->cells);
    k->cells = NULL;
}

static int orders_bound(struct search *s, const int *kind_of, int K, int *order,
                        struct orders *out)
{
    int kinds[REPARTITION_KINDS_MAX], n = 1, tabled = 0;
    for (int g = 0; g < K; g++) {
        kinds[g] = g;
        n *= g + 1;
    }
    *out = (struct orders){0,
                           K,
                           malloc((size_t)n * K * sizeof *out->kinds),
                           malloc((size_t)n * sizeof *out->bound),
                           malloc((size_t)n * sizeof *out->table),
                           calloc((size_t)n, 1),
                           calloc((size_t)n, sizeof *out->kept)};
    if (out->kinds == NULL || out->bound == NULL || out->table == NULL || out->tabled == NULL ||
        out->kept == NULL)
        return err_set(s->e, ERR_FAIL, "out of memory");
    do {
        memcpy(out->kinds + (size_t)out->n * K, kinds, (size_t)K * sizeof *kinds);
        /* past the time limit, with a plan to return and an order to dive in, the tables
         * are left unbuilt */
        s->may_stop = !isinf(s->best_ms) && tabled > 0;
        if (s->may_stop && past_deadline(s)) {
            out->bound[out->n++] = any_order_bound(s);
            continue;
        }
        if (repart_layout(s, kinds, K, kind_of, order))
            break;
        s->enough = s->best_ms; /* an order bounded there is left out */
        out->tabled[out->n] = (unsigned char)bound_table(s);
        if (out->tabled[out->n] && !(*G_at(s, 0, 0) > prune_limit(s)))
            tables_keep(s, &out->kept[out->n], table_cut(s));
        s->enough = INFINITY;
        tabled += out->tabled[out->n];
        out->bound[out->n++] = *G_at(s, 0, 0);
    } while (s->e->code == ERR_OK && next_permutation(kinds, K));
    memcpy(out->table, out->bound, (size_t)out->n * sizeof *out->table);
    s->may_stop = 0; /* the search builds a table only to branch on it */
    return s->e->code;
}

/* The unsearched order of least bound (of those with a table built, when `tabled`); -1 when
 * none is left. */
static int orders_next(const struct orders *o, int tabled)
{
    int at = -1;
    for (int q = 0; q < o->n; q++)
        if (!isnan(o->bound[q]) && (!tabled || o->tabled[q]) &&
            (at < 0 || o->bound[q] < o->bound[at]))
            at = q;
    return at;
}

/* The most nodes a dive takes, per position. */
#define DIVE_NODES 16

/* One dive into each order whose tables were kept (bounded under the incumbent), least bound
 * first, before any is searched to the end: each to its first split simulated, or DIVE_NODES
 * nodes a position. The order of least bound need not hold the fastest split, and a search
 * that spent its nodes there would leave the better incumbent of another order unfound (a
 * pool's pipeline of one A100 and 13 V100 at 4 micro-batches: V100s first bound at 2465 ms and
 * none was found under 2573 ms in 10^6 nodes, while A100 first steps 2484, found in a dive,
 * which proves the whole in 10^3 nodes). The order of least bound is dived into first, as the
 * search would start (an incumbent from another order, a little slower, could cut its first
 * dive short within --search-gap and leave its search a band of nodes to wade through). The
 * search visits each order again, so a dive's pruned and unexplored nodes count nothing. */
static void dive_orders(struct search *s, const int *kind_of, struct orders *ord, int *order)
{
    unsigned char *dove = ord->n > 1 ? calloc((size_t)ord->n, 1) : NULL;
    for (int tries = 0; dove != NULL && tries < ord->n && s->e->code == ERR_OK; tries++) {
        int at = -1;
        for (int q = 0; q < ord->n; q++)
            if (!dove[q] && ord->kept[q].cells != NULL &&
                (at < 0 || ord->bound[q] < ord->bound[at]))
                at = q;
        if (at < 0 || !(ord->bound[at] <= prune_limit(s)) || out_of_budget(s) ||
            past_deadline(s))
            break;
        dove[at] = 1;
        if (repart_layout(s, ord->kinds + (size_t)at * ord->K, ord->K, kind_of, order))
            break;
        tables_restore(s, &ord->kept[at], 0);
        s->diving = 1;
        s->dive_leaves = s->leaves;
        s->dive_nodes = s->nodes + (long)DIVE_NODES * s->S;
        branch(s, order, 0, 0, &(struct prefix){.a_max = -INFINITY});
        s->diving = 0;
    }
    free(dove);
}

/* Branch and bound over the orders, the most promising first, after a dive into each;
 * past the time limit before a dive of its own, the most promising of those whose table was
 * built (the others' bound is only any_order_bound's). */
static void search_orders(struct search *s, const int *kind_of, struct orders *ord, int *order)
{
    dive_orders(s, kind_of, ord, order);
    while (s->e->code == ERR_OK) {
        int at = !s->dived && past_deadline(s) ? orders_next(ord, 1) : -1, least = at < 0;
        if (least && (at = orders_next(ord, 0)) < 0)
            break;
        double bound = ord->bound[at];
        ord->bound[at] = NAN; /* searched */
        if (isinf(bound) || pruned(s, bound)) {
            if (least)
                break; /* every order left is bounded above the incumbent, less the gap */
            continue;
        }
        if (out_of_budget(s) && !isinf(s->best_ms)) {
            if (bound < s->open_bound)
                s->open_bound = bound;
            continue;
        }
        if (repart_layout(s, ord->kinds + (size_t)at * ord->K, ord->K, kind_of, order))
            break;
        if (ord->kept[at].cells != NULL)
            tables_restore(s, &ord->kept[at], 1);
        else
            bound_table(s);
        branch(s, order, 0, 0, &(struct prefix){.a_max = -INFINITY});
    }
}

/* The certified bound `least` (the search's: the least bound it left) raised to the least
 * over the orders of tight_bound, for each order whose table bound is under the incumbent,
 * when every order is above it; `least` when not, or out of time. */
static double tighten(struct search *s, const int *kind_of, const struct orders *ord, int *order,
                      double least)
{
    double all = INFINITY;
    for (int q = 0; q < ord->n && all > least && s->e->code == ERR_OK; q++) {
        double g = ord->table[q];
        if (g < s->best_ms) {
            if (past_deadline(s) ||
                repart_layout(s, ord->kinds + (size_t)q * ord->K, ord->K, kind_of, order))
                return least;
            s->pair = 1;
            bound_table(s);
            double t = tight_bound(s, s->best_ms, 2 * (s->best_ms - g) / TIGHT_BUCKETS);
            s->pair = 0;
            if (isnan(t))
                return least;
            g = t > g ? t : g;
            g = *G_at(s, 0, 0) > g ? *G_at(s, 0, 0) : g;
        }
        all = g < all ? g : all;
    }
    return all > least && s->e->code == ERR_OK ? all : least;
}

static int arrangement_fill(const struct search *s, struct arrangement *a, struct err *e)
{
    size_t n = (size_t)s->S;
    *a = (struct arrangement){s->S, malloc(n * sizeof *a->stage), malloc(n * sizeof *a->first),
                              malloc(n * sizeof *a->link)};
    if (a->stage == NULL || a->first == NULL || a->link == NULL) {
        arrangement_free(a);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    memcpy(a->stage, s->best_order, n * sizeof *a->stage);
    memcpy(a->first, s->best_first, n * sizeof *a->first);
    memcpy(a->link, s->best_link, n * sizeof *a->link);
    return ERR_OK;
}

/* The device kinds, at most REPARTITION_KINDS_MAX. */
static int kinds_of(const struct cluster *c, int *kind_of, int *K, struct err *e)
{
    int *first_stage = malloc((size_t)c->n_stages * sizeof *first_stage);
    if (first_stage == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    *K = device_kinds(c, kind_of, first_stage);
    free(first_stage);
    if (*K > REPARTITION_KINDS_MAX)
        return err_set(e, ERR_INPUT,
                       "--repartition orders the cluster's device kinds exhaustively, and this "
                       "cluster has %d kinds (at most %d)",
                       *K, REPARTITION_KINDS_MAX);
    return ERR_OK;
}

int repartition_search(const struct cluster *c, const struct plan_options *o,
                       struct arrangement *a, struct plan_search *found, struct err *e)
{
    struct search s;
    struct orders ord = {0};
    int K = 0, *kind_of = malloc((size_t)c->n_stages * sizeof *kind_of);
    int *order = malloc((size_t)c->n_stages * sizeof *order);
    double least_bound = INFINITY;
    memset(found, 0, sizeof *found);
    memset(a, 0, sizeof *a);
    if (kind_of == NULL || order == NULL)
        err_set(e, ERR_FAIL, "out of memory");
    else if (repart_search_init(&s, c, o, e) == ERR_OK && kinds_of(c, kind_of, &K, e) == ERR_OK &&
             seed_incumbent(&s, kind_of, K, order) == ERR_OK &&
             orders_bound(&s, kind_of, K, order, &ord) == ERR_OK)
        search_orders(&s, kind_of, &ord, order);
    if (e->code == ERR_OK && s.best_memory == INT64_MAX && !isinf(s.best_ms)) {
        /* the cutoff and no plan under it: what was left unexplored bounds this cluster, and
         * the splits simulated stepped no faster than the cutoff */
        least_bound = s.open_bound < s.pruned_bound ? s.open_bound : s.pruned_bound;
        least_bound = s.leaves > 0 && s.best_ms < least_bound ? s.best_ms : least_bound;
        *found = (struct plan_search){1, ord.n, s.nodes, s.leaves, s.open_bound == INFINITY,
                                      least_bound, least_bound, 0};
        if (isinf(least_bound))
            err_set(e, ERR_NOFIT, "no order of the device kinds and split of the layers fits");
        else
            err_set(e, ERR_NOFIT, "nothing faster than the cutoff %g ms", s.best_ms);
    } else if (e->code == ERR_OK && !isinf(s.best_ms)) {
        least_bound = s.open_bound < least_bound ? s.open_bound : least_bound;
        least_bound = s.pruned_bound < least_bound ? s.pruned_bound : least_bound;
        /* stopped short of the gap asked for: a better plan, a better bound */
        int short_of_gap = s.open_bound < INFINITY && least_bound * (1 + o->search_gap) < s.best_ms;
        if (short_of_gap)
            polish(&s, order);
        double searched = s.best_ms < least_bound ? s.best_ms : least_bound;
        if (short_of_gap)
            least_bound = tighten(&s, kind_of, &ord, order, least_bound);
        least_bound = s.best_ms < least_bound ? s.best_ms : least_bound;
        *found = (struct plan_search){1, ord.n, s.nodes, s.leaves, s.open_bound == INFINITY,
                                      least_bound, searched, s.best_ms};
        if (o->min_gain > 0)
            simplify(&s, kind_of, K, order, choice_cap(s.best_ms, o->min_gain));
        arrangement_fill(&s, a, e);
    } else if (e->code == ERR_OK) {
        err_set(e, ERR_NOFIT, "no order of the device kinds and split of the layers fits");
    }
    if (kind_of != NULL && order != NULL)
        repart_search_free(&s);
    free(ord.kinds);
    free(ord.bound);
    free(ord.table);
    free(ord.tabled);
    for (int q = 0; q < ord.n && ord.kept != NULL; q++)
        free(ord.kept[q].cells);
    free(ord.kept);
    free(kind_of);
    free(order);
    return e->code;
}
