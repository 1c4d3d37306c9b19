#include "repartition.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "knapsack.h"
#include "sim.h"

/* A stage's least recompute for one layer range, for one kind of position. */
struct range_cost {
    double recompute_ms; /* INFINITY: does not fit even recomputing everything */
    int64_t memory_bytes;
    int known;
};

/* Positions with the same profile, capacity and in-flight count share their range costs,
 * whatever order puts them there. */
struct position_class {
    int profile;
    int64_t capacity;
    int in_flight;
    struct range_cost *ranges; /* n_layers x n_layers, [first * n + last] */
};

struct position {
    int stage;    /* index in the cluster */
    int cls;      /* position class */
    int profile;
    struct link link; /* to the next position */
};

struct search {
    const struct cluster *c;
    const struct plan_options *o;
    int S, N, M;
    double **fwd_prefix, **bwd_prefix; /* per profile, N + 1 */
    struct position_class *classes;
    int n_classes, cap_classes;
    struct position *pos; /* S, for the order being searched */
    double *G;            /* (S + 1) x (N + 1) */
    double *Q;            /* (S + 1) x (N + 1): least sum of T + transfers over suffixes */
    /* branch and bound */
    int *first;           /* S: the split being built */
    int *best_first;      /* S */
    int *best_order;      /* S: cluster stage at each position */
    double best_ms;
    int64_t best_memory;
    double open_bound; /* least bound of a node left unexplored */
    long nodes, leaves, budget;
    struct sim_stage *sim_in;
    double *children; /* S x N x 2: (bound, last layer) per depth */
    double *own;      /* S: split_bound's per-stage terms */
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
    return s->n_classes++;
}

/* The least recompute of layers first..last at a position of class `cls`: the same DP the
 * plan is finally made with, so the search and the plan agree. */
static const struct range_cost *range_cost(struct search *s, int cls, int first, int last)
{
    struct position_class *pc = &s->classes[cls];
    struct range_cost *rc = &pc->ranges[(size_t)first * s->N + last];
    if (rc->known)
        return rc;
    const struct layer_cost *layers = s->c->profiles[pc->profile].layers + first;
    int n = last - first + 1;
    struct knap_problem kp;
    unsigned char *rec = calloc((size_t)n, 1);
    rc->known = 1;
    rc->recompute_ms = INFINITY;
    int (*build)(struct knap_problem *, const struct layer_cost *, int, int, int64_t, int64_t,
                 int64_t, struct err *) = s->o->whole_layers ? knap_build : knap_build_options;
    if (rec == NULL || build(&kp, layers, n, pc->in_flight, s->c->reserve_bytes, pc->capacity,
                             s->o->unit_bytes, s->e)) {
        if (s->e->code == ERR_OK)
            err_set(s->e, ERR_FAIL, "out of memory");
        free(rec);
        return rc;
    }
    int status = knap_min_recompute(&kp, rec, s->e);
    if (status == ERR_OK) {
        struct stage_cost cost;
        cost_stage(layers, n, rec, pc->in_flight, s->c->reserve_bytes, &cost);
        rc->recompute_ms = cost.recompute_ms;
        rc->memory_bytes = cost.memory_bytes;
    } else if (status == ERR_NOFIT) {
        err_clear(s->e);
    }
    knap_free(&kp);
    free(rec);
    return rc;
}

/* T of position k holding first..last (INFINITY if it cannot fit); *fwd gets its forward
 * part (the rest, backward and recompute, is T - fwd). */
static double stage_ms(struct search *s, int k, int first, int last, double *fwd)
{
    const struct position *p = &s->pos[k];
    const struct range_cost *rc = range_cost(s, p->cls, first, last);
    if (isinf(rc->recompute_ms))
        return INFINITY;
    double f = s->fwd_prefix[p->profile][last + 1] - s->fwd_prefix[p->profile][first];
    if (fwd)
        *fwd = f;
    return cost_stage_ms(f + s->bwd_prefix[p->profile][last + 1] -
                             s->bwd_prefix[p->profile][first],
                         rc->recompute_ms);
}

/* Forward activation and backward gradient over the link after position k, whose last
 * layer is `last`. */
static double transfer_ms(const struct search *s, int k, int last)
{
    if (k + 1 >= s->S)
        return 0;
    const struct position *p = &s->pos[k];
    return 2 * link_transfer_ms(&p->link, s->c->profiles[p->profile].layers[last].out_bytes);
}

/* What position k itself adds to the bound past the prefix before it, when a micro-batch's
 * round trip through the positions after it (forward, backward, transfers) takes at least
 * `after` ms. With f its forward and A its backward with recompute per micro-batch, and W its
 * warm-up forwards (min(S-k-1, M) in 1F1B):
 *   its first backward waits for micro-batch 0's round trip: >= max((W+1) f, f + after);
 *   then M-W-1 backwards and forwards alternate until its last forward;
 *   its last backward waits for micro-batch M-1's round trip: >= max((W+1) A, after + A).
 * When it runs every forward first (GPipe, or 1F1B with W >= M - 1), its backwards start after
 * its M forwards and after micro-batch 0's round trip, and the last one waits for micro-batch
 * M-1's. For S equal stages this is exactly (M + S - 1)(f + A). */
static double own_bound(const struct search *s, int k, double t, double f, double after)
{
    double A = t - f, M = s->M;
    int W = s->S - k - 1;
    if (s->c->schedule == SCHEDULE_GPIPE || W >= s->M - 1) {
        double start = M * f > f + after ? M * f : f + after;
        double v = start + M * A;
        return v > M * f + after + A ? v : M * f + after + A;
    }
    double head = (W + 1) * f > f + after ? (W + 1) * f : f + after;
    double tail = (W + 1) * A > after + A ? (W + 1) * A : after + A;
    return head + (M - W - 1) * (f + A) + tail;
}

/* Q(k, i): least sum of T + 2 c over the ways to put layers i.. on positions k..;
 * G(k, i): least over those ways of max_{s >= k} (prefix from k to s + own_bound(s)), with
 * each stage's `after` taken as the least possible Q of what follows it. */
static void bound_table(struct search *s)
{
    int S = s->S, N = s->N;
    for (int k = 0; k <= S; k++)
        for (int i = 0; i <= N; i++)
            *G_at(s, k, i) = *Q_at(s, k, i) = INFINITY;
    *G_at(s, S, N) = *Q_at(s, S, N) = 0;
    for (int k = S - 1; k >= 0 && s->e->code == ERR_OK; k--) {
        int stages_after = S - 1 - k;
        for (int i = k; i <= N - 1 - stages_after; i++) {
            double best = INFINITY, least_sum = INFINITY;
            for (int j = i; j <= N - 1 - stages_after; j++) {
                if (k == S - 1 && j != N - 1)
                    continue;
                double f, t = stage_ms(s, k, i, j, &f);
                /* T only grows with the range: past here nothing fits */
                if (isinf(t))
                    break;
                double rest = *G_at(s, k + 1, j + 1), rest_sum = *Q_at(s, k + 1, j + 1);
                if (isinf(rest))
                    continue;
                double c = transfer_ms(s, k, j);
                if (t + c + rest_sum < least_sum)
                    least_sum = t + c + rest_sum;
                if (s->M * t >= best)
                    continue; /* own_bound >= M T: no better G here, but Q may still be */
                double v = own_bound(s, k, t, f, c + rest_sum);
                if (t + c + rest > v)
                    v = t + c + rest;
                if (v < best)
                    best = v;
            }
            *G_at(s, k, i) = best;
            *Q_at(s, k, i) = least_sum;
        }
    }
}

static int better(double ms, int64_t memory, double best_ms, int64_t best_memory)
{
    double tol = 1e-12 * (1 + fabs(best_ms));
    return ms < best_ms - tol || (ms <= best_ms + tol && memory < best_memory);
}

/* The bound of a complete split, with each stage's true round trip downstream: a cheap
 * screen before simulating it. */
static double split_bound(struct search *s)
{
    double after = 0, bound = 0, prefix = 0;
    double *own = s->own;
    for (int k = s->S - 1; k >= 0; k--) {
        int first = s->first[k], last = k + 1 < s->S ? s->first[k + 1] - 1 : s->N - 1;
        double f, t = stage_ms(s, k, first, last, &f);
        double c = transfer_ms(s, k, last);
        own[k] = own_bound(s, k, t, f, after + c);
        after += t + c;
    }
    for (int k = 0; k < s->S; k++) {
        int first = s->first[k], last = k + 1 < s->S ? s->first[k + 1] - 1 : s->N - 1;
        if (prefix + own[k] > bound)
            bound = prefix + own[k];
        prefix += stage_ms(s, k, first, last, NULL) + transfer_ms(s, k, last);
    }
    return bound;
}

static void leaf(struct search *s, const int *order)
{
    int64_t memory = 0;
    if (split_bound(s) > s->best_ms * (1 + 1e-12) + 1e-12)
        return;
    s->leaves++;
    for (int k = 0; k < s->S; k++) {
        int first = s->first[k], last = k + 1 < s->S ? s->first[k + 1] - 1 : s->N - 1;
        const struct position *p = &s->pos[k];
        const struct range_cost *rc = range_cost(s, p->cls, first, last);
        struct sim_stage *st = &s->sim_in[k];
        st->fwd_ms = s->fwd_prefix[p->profile][last + 1] - s->fwd_prefix[p->profile][first];
        st->bwd_ms = s->bwd_prefix[p->profile][last + 1] - s->bwd_prefix[p->profile][first];
        st->recompute_ms = rc->recompute_ms;
        st->out_bytes = s->c->profiles[p->profile].layers[last].out_bytes;
        st->link = k + 1 < s->S ? p->link : (struct link){0};
        memory += rc->memory_bytes;
    }
    double ms;
    if (sim_makespan(s->c->schedule, s->S, s->M, s->sim_in, &ms, s->e))
        return;
    if (better(ms, memory, s->best_ms, s->best_memory)) {
        s->best_ms = ms;
        s->best_memory = memory;
        memcpy(s->best_first, s->first, (size_t)s->S * sizeof *s->first);
        memcpy(s->best_order, order, (size_t)s->S * sizeof *order);
    }
}

/* Depth-first over the split: position k starts at layer i after a prefix of `prefix` ms,
 * the assigned positions' largest M T_s + prefix_s being `partial`. */
static void branch(struct search *s, const int *order, int k, int i, double prefix,
                   double partial)
{
    if (s->e->code)
        return;
    if (k == s->S) {
        leaf(s, order);
        return;
    }
    double limit = s->best_ms * (1 + 1e-12) + 1e-12;
    int stages_after = s->S - 1 - k;
    double *kids = s->children + (size_t)k * s->N * 2;
    int n = 0;
    for (int j = i; j <= s->N - 1 - stages_after; j++) {
        if (k == s->S - 1 && j != s->N - 1)
            continue;
        double f, t = stage_ms(s, k, i, j, &f);
        if (isinf(t) || s->M * t + prefix > limit)
            break;
        double rest = *G_at(s, k + 1, j + 1);
        if (isinf(rest))
            continue;
        double c = transfer_ms(s, k, j);
        double next = prefix + t + c;
        double own = prefix + own_bound(s, k, t, f, c + *Q_at(s, k + 1, j + 1));
        double p = partial > own ? partial : own;
        double bound = p > next + rest ? p : next + rest;
        if (bound > limit)
            continue;
        kids[2 * n] = bound;
        kids[2 * n + 1] = j;
        n++;
    }
    /* most promising first, so the incumbent improves early */
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && kids[2 * (b - 1)] > kids[2 * b]; b--) {
            double t0 = kids[2 * b], t1 = kids[2 * b + 1];
            kids[2 * b] = kids[2 * (b - 1)];
            kids[2 * b + 1] = kids[2 * (b - 1) + 1];
            kids[2 * (b - 1)] = t0;
            kids[2 * (b - 1) + 1] = t1;
        }
    for (int a = 0; a < n && s->e->code == ERR_OK; a++) {
        double bound = kids[2 * a];
        if (bound > s->best_ms * (1 + 1e-12) + 1e-12)
            break; /* the incumbent improved meanwhile */
        /* past the budget, stop, but not before a first split: a finite bound G guarantees
         * the dive reaches one */
        if (s->nodes >= s->budget && !isinf(s->best_ms)) {
            if (bound < s->open_bound)
                s->open_bound = bound;
            return;
        }
        s->nodes++;
        int j = (int)kids[2 * a + 1];
        double f, t = stage_ms(s, k, i, j, &f);
        double c = transfer_ms(s, k, j);
        double own = prefix + own_bound(s, k, t, f, c + *Q_at(s, k + 1, j + 1));
        s->first[k] = i;
        branch(s, order, k + 1, j + 1, prefix + t + c, partial > own ? partial : own);
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

/* Lays out the positions for a kind order: each kind's stages in cluster order. */
static int layout(struct search *s, const int *kinds, int K, const int *kind_of, int *order)
{
    const struct cluster *c = s->c;
    int k = 0;
    for (int g = 0; g < K; g++) {
        for (int st = 0; st < c->n_stages; st++) {
            if (kind_of[st] != kinds[g])
                continue;
            struct position *p = &s->pos[k];
            p->stage = st;
            p->profile = c->stages[st].profile;
            int v = schedule_in_flight(c->schedule, s->S, k, s->M);
            p->cls = class_of(s, p->profile, c->stages[st].memory_bytes, v);
            if (p->cls < 0)
                return err_set(s->e, ERR_FAIL, "out of memory");
            /* inside a kind, the link the stage had to its neighbour of the same kind */
            int next_same = -1;
            for (int q = st + 1; q < c->n_stages && next_same < 0; q++)
                if (kind_of[q] == kinds[g])
                    next_same = q;
            p->link = next_same >= 0 ? cluster_link(c, st) : repartition_exit_link(c, kind_of, kinds[g]);
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

static void search_free(struct search *s)
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
    free(s->fwd_prefix);
    free(s->bwd_prefix);
    free(s->pos);
    free(s->G);
    free(s->Q);
    free(s->first);
    free(s->best_first);
    free(s->best_order);
    free(s->sim_in);
    free(s->children);
    free(s->own);
}

static int search_init(struct search *s, const struct cluster *c, const struct plan_options *o,
                       struct err *e)
{
    memset(s, 0, sizeof *s);
    s->c = c;
    s->o = o;
    s->e = e;
    s->S = c->n_stages;
    s->N = c->n_layers;
    s->M = c->micro_batches;
    s->budget = o->search_nodes;
    s->best_ms = INFINITY;
    s->best_memory = INT64_MAX;
    s->open_bound = INFINITY;
    s->fwd_prefix = calloc((size_t)c->n_profiles, sizeof *s->fwd_prefix);
    s->bwd_prefix = calloc((size_t)c->n_profiles, sizeof *s->bwd_prefix);
    s->pos = calloc((size_t)s->S, sizeof *s->pos);
    s->G = malloc((size_t)(s->S + 1) * (s->N + 1) * sizeof *s->G);
    s->Q = malloc((size_t)(s->S + 1) * (s->N + 1) * sizeof *s->Q);
    s->first = calloc((size_t)s->S, sizeof *s->first);
    s->best_first = calloc((size_t)s->S, sizeof *s->best_first);
    s->best_order = calloc((size_t)s->S, sizeof *s->best_order);
    s->sim_in = calloc((size_t)s->S, sizeof *s->sim_in);
    s->children = malloc((size_t)s->S * s->N * 2 * sizeof *s->children);
    s->own = malloc((size_t)s->S * sizeof *s->own);
    if (!s->fwd_prefix || !s->bwd_prefix || !s->pos || !s->G || !s->Q || !s->first || !s->best_first ||
        !s->best_order || !s->sim_in || !s->children || !s->own)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int p = 0; p < c->n_profiles; p++) {
        s->fwd_prefix[p] = calloc((size_t)s->N + 1, sizeof **s->fwd_prefix);
        s->bwd_prefix[p] = calloc((size_t)s->N + 1, sizeof **s->bwd_prefix);
        if (!s->fwd_prefix[p] || !s->bwd_prefix[p])
            return err_set(e, ERR_FAIL, "out of memory");
        for (int l = 0; l < s->N; l++) {
            s->fwd_prefix[p][l + 1] = s->fwd_prefix[p][l] + c->profiles[p].layers[l].fwd_ms;
            s->bwd_prefix[p][l + 1] = s->bwd_prefix[p][l] + c->profiles[p].layers[l].bwd_ms;
        }
    }
    return ERR_OK;
}

/* The cluster with its stages in `order` and the split `first`; it shares c's profiles. */
static int arranged_cluster(const struct cluster *c, const struct search *s, struct cluster *out,
                            struct err *e)
{
    *out = *c;
    out->stages = calloc((size_t)s->S, sizeof *out->stages);
    if (out->stages == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int k = 0; k < s->S; k++) {
        out->stages[k] = c->stages[s->best_order[k]];
        out->stages[k].first = s->best_first[k];
        out->stages[k].last = k + 1 < s->S ? s->best_first[k + 1] - 1 : s->N - 1;
    }
    return ERR_OK;
}

int repartition_make(const struct cluster *c, const struct plan_options *o, struct plan *out,
                     struct repartition_stats *stats, struct err *e)
{
    struct search s;
    int *kind_of = malloc((size_t)c->n_stages * sizeof *kind_of);
    int *kind_first = malloc((size_t)c->n_stages * sizeof *kind_first);
    int *order = malloc((size_t)c->n_stages * sizeof *order);
    int kinds[REPARTITION_KINDS_MAX];
    double least_bound = INFINITY;
    struct link *links = NULL;
    memset(stats, 0, sizeof *stats);
    if (kind_of == NULL || kind_first == NULL || order == NULL) {
        free(kind_of);
        free(kind_first);
        free(order);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    if (search_init(&s, c, o, e))
        goto done;
    int K = device_kinds(c, kind_of, kind_first);
    if (K > REPARTITION_KINDS_MAX) {
        err_set(e, ERR_INPUT,
                "--repartition orders the cluster's device kinds exhaustively, and this cluster "
                "has %d kinds (at most %d)",
                K, REPARTITION_KINDS_MAX);
        goto done;
    }
    links = calloc((size_t)s.S, sizeof *links);
    if (links == NULL) {
        err_set(e, ERR_FAIL, "out of memory");
        goto done;
    }
    /* The cluster's own order and split start as the incumbent when its kinds are already
     * contiguous (then it is one of the candidates): the search never returns worse. */
    int contiguous = 1;
    for (int st = 1; st < c->n_stages; st++)
        contiguous = contiguous && (kind_of[st] == kind_of[st - 1] || kind_of[st] == kind_of[st - 1] + 1);
    if (contiguous) {
        for (int g = 0; g < K; g++)
            kinds[g] = g;
        if (layout(&s, kinds, K, kind_of, order))
            goto done;
        for (int k = 0; k < s.S; k++)
            s.first[k] = c->stages[k].first;
        int fits = 1;
        for (int k = 0; k < s.S && fits; k++)
            fits = !isinf(stage_ms(&s, k, c->stages[k].first, c->stages[k].last, NULL));
        if (fits) {
            leaf(&s, order);
            for (int k = 0; k < s.S; k++)
                links[k] = s.pos[k].link;
        }
        if (e->code)
            goto done;
    }
    for (int g = 0; g < K; g++)
        kinds[g] = g;
    /* Bound every order first, then search them from the most promising. */
    int n_orders = 0;
    double *order_bound = NULL;
    int *order_kinds = NULL;
    do {
        int *grown = realloc(order_kinds, (size_t)(n_orders + 1) * K * sizeof *grown);
        double *grown_b = realloc(order_bound, (size_t)(n_orders + 1) * sizeof *grown_b);
        if (grown == NULL || grown_b == NULL) {
            free(grown ? grown : order_kinds);
            free(grown_b ? grown_b : order_bound);
            err_set(e, ERR_FAIL, "out of memory");
            goto done;
        }
        order_kinds = grown;
        order_bound = grown_b;
        memcpy(order_kinds + (size_t)n_orders * K, kinds, (size_t)K * sizeof *kinds);
        if (layout(&s, kinds, K, kind_of, order))
            break;
        bound_table(&s);
        order_bound[n_orders++] = *G_at(&s, 0, 0);

    } while (e->code == ERR_OK && next_permutation(kinds, K));
    stats->orders = n_orders;
    for (int pass = 0; pass < n_orders && e->code == ERR_OK; pass++) {
        int at = -1;
        for (int q = 0; q < n_orders; q++)
            if (!isnan(order_bound[q]) && (at < 0 || order_bound[q] < order_bound[at]))
                at = q;
        double bound = order_bound[at];
        order_bound[at] = NAN; /* searched */
        if (isinf(bound))
            break;
        if (bound > s.best_ms * (1 + 1e-12) + 1e-12) {
            if (bound < least_bound)
                least_bound = bound;
            break; /* every order left is bounded above the incumbent */
        }
        if (layout(&s, order_kinds + (size_t)at * K, K, kind_of, order))
            break;
        bound_table(&s);
        if (s.nodes >= s.budget && !isinf(s.best_ms)) {
            if (bound < s.open_bound)
                s.open_bound = bound;
            continue;
        }
        branch(&s, order, 0, 0, 0, 0);

        /* keep the links of the best order for the plan */
        int same = 1;
        for (int k = 0; k < s.S && same; k++)
            same = s.best_order[k] == order[k];
        if (same)
            for (int k = 0; k < s.S; k++)
                links[k] = s.pos[k].link;
    }
    free(order_kinds);
    free(order_bound);
    if (e->code)
        goto done;
    if (isinf(s.best_ms)) {
        /* no order and split fits: say why with the cluster's own split */
        struct plan_options fixed = *o;
        fixed.repartition = 0;
        if (planner_make(c, &fixed, out, e) == ERR_OK) {
            plan_free(out);
            err_set(e, ERR_FAIL, "repartitioning found no split although the cluster's own fits");
        } else if (e->code == ERR_NOFIT) {
            err_append(e, "  and no other split of the layers or order of the device kinds fits "
                          "either");
        }
        goto done;
    }
    if (s.open_bound < least_bound)
        least_bound = s.open_bound;
    if (s.best_ms < least_bound)
        least_bound = s.best_ms;
    stats->nodes = s.nodes;
    stats->leaves = s.leaves;
    stats->exhausted = s.open_bound == INFINITY;
    stats->lower_bound = least_bound;

    struct cluster arranged;
    if (arranged_cluster(c, &s, &arranged, e))
        goto done;
    for (int k = 0; k < s.S; k++)
        arranged.stages[k].link = k + 1 < s.S ? links[k] : (struct link){0};
    arranged.link = (struct link){0};
    struct plan_options fixed = *o;
    fixed.repartition = 0;
    int rc = planner_make(&arranged, &fixed, out, e);
    free(arranged.stages);
    if (rc)
        goto done;
    snprintf(out->method, sizeof out->method, "optimal+repartition");
    out->optimality_gap = least_bound > 0 ? (out->iteration_ms - least_bound) / least_bound : 0;
    if (out->optimality_gap < 0)
        out->optimality_gap = 0;
    out->search = (struct plan_search){1, stats->orders, stats->nodes, stats->leaves,
                                       stats->exhausted, least_bound};
done:
    search_free(&s);
    free(kind_of);
    free(kind_first);
    free(order);
    free(links);
    return e->code;
}
