#include "pool_bound.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"

int pool_costs_alloc(struct pool_costs *c, int L)
{
    memset(c, 0, sizeof *c);
    c->fwd_ms = calloc((size_t)4 * L, sizeof *c->fwd_ms);
    c->state = calloc((size_t)3 * L, sizeof *c->state);
    if (c->fwd_ms == NULL || c->state == NULL) {
        pool_costs_free(c);
        return -1;
    }
    c->work_ms = c->fwd_ms + L;
    c->act = c->state + L;
    c->least_kept = c->state + 2 * L;
    c->tail_ms = c->fwd_ms + 2 * L;
    c->send_ms = c->fwd_ms + 3 * L;
    return 0;
}

int pool_costs_copy(struct pool_costs *to, const struct pool_costs *from, int L)
{
    if (to->fwd_ms == NULL && pool_costs_alloc(to, L))
        return -1;
    double *times = to->fwd_ms;
    int64_t *bytes = to->state;
    memcpy(times, from->fwd_ms, 4 * (size_t)L * sizeof *times);
    memcpy(bytes, from->state, 3 * (size_t)L * sizeof *bytes);
    *to = *from;
    to->fwd_ms = times, to->work_ms = times + L, to->tail_ms = times + 2 * L;
    to->send_ms = times + 3 * L;
    to->state = bytes, to->act = bytes + L, to->least_kept = bytes + 2 * L;
    return 0;
}

void pool_costs_free(struct pool_costs *c)
{
    free(c->fwd_ms);
    free(c->state);
    memset(c, 0, sizeof *c);
}

void pool_costs_fill(const struct cluster *c, int replicas, int actions, int overlap_backward,
                     struct pool_costs *out)
{
    int device_optimizer = !(actions & PLAN_ACTION_OPTIMIZER);
    const struct profile *p = cluster_stage_profile(c, 0);
    const struct link *link = &c->stages[0].dp_link;
    struct link next = cluster_link(c, 0); /* to a next stage, were there one */
    int N = replicas > 1 ? replicas : 1;
    /* the all-reduce's bytes part, 2 (N - 1) transfers of bytes / N each (cost.c); reduced in
     * buckets (sim.h) and overlap_backward, all of it may overlap the stage's last backward,
     * whose layers' share is taken off (the bounds add M forwards and backwards to it: never
     * below 0) */
    double per_byte = 2.0 * (N - 1) / N;
    int overlap = overlap_backward && N > 1 && c->dp_bucket_bytes > 0;
    out->freed_per_ms = 0;
    for (int l = 0; l < p->n_layers; l++) {
        const struct layer_cost *y = &p->layers[l];
        double bytes_ms = link_transfer_ms(link, cluster_grad_bytes(c, 0, l, l)) -
                          link_transfer_ms(link, 0);
        out->fwd_ms[l] = y->fwd_ms;
        out->work_ms[l] = y->fwd_ms + y->bwd_ms;
        out->tail_ms[l] = per_byte * bytes_ms + device_optimizer * y->optimizer_ms -
                          overlap * y->bwd_ms;
        out->send_ms[l] = link_transfer_ms(&next, y->out_bytes);
        out->state[l] = actions & PLAN_ACTION_WEIGHTS
                            ? 0
                            : cost_layer_state(y, device_optimizer ? COST_PLACE_DEVICE
                                                                   : COST_PLACE_HOST);
        out->act[l] = y->act_bytes;
        out->least_kept[l] = y->act_bytes;
        for (int k = 0; k < cost_choice_count(y); k++) { /* keep, full, each option */
            struct cost_row row = cost_row(y, k);
            double freed = (double)(y->act_bytes - row.kept_bytes);
            out->least_kept[l] = row.kept_bytes < out->least_kept[l] ? row.kept_bytes
                                                                     : out->least_kept[l];
            if (freed > 0)
                out->freed_per_ms = fmax(out->freed_per_ms, row.recompute_ms > 0
                                                                ? freed / row.recompute_ms
                                                                : INFINITY);
        }
    }
    out->first_tail_ms = cost_dp_allreduce_ms(link, N, cluster_grad_bytes(c, 0, 0, 0)) +
                         device_optimizer * p->layers[0].optimizer_ms;
    out->latency_ms = cost_dp_allreduce_ms(link, N, 0);
    out->capacity = c->stages[0].memory_bytes - c->reserve_bytes;
    out->known = 1;
}

#define POOL_COSTS_WAYS 32

struct pool_costs_slot {
    int dp, replicas; /* 0: empty */
    struct pool_costs costs;
};

/* Kind k's stages of one tp at one size. */
struct pool_costs_bucket {
    signed char allowed; /* 0: not asked yet, 1: tp suits the model, -1: not */
    int next;            /* the slot to fill next */
    struct pool_costs_slot slot[POOL_COSTS_WAYS];
};

struct pool_costs_cache {
    const struct pool_model *pm;
    int actions, overlap_backward, L;
    long serial;
    struct pool_costs_bucket *bucket[POOL_KINDS_MAX]; /* (per_node + 1) x sizes each */
};

int pool_costs_cache_make(const struct pool_model *pm, int actions, int overlap_backward,
                          struct pool_costs_cache **out, struct err *e)
{
    struct pool_costs_cache *c = calloc(1, sizeof *c);
    *out = c;
    if (c == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    c->pm = pm;
    c->actions = actions;
    c->overlap_backward = overlap_backward;
    c->L = model_layer_count(&pm->model);
    for (int k = 0; k < pm->K; k++)
        if ((c->bucket[k] = calloc((size_t)(pm->kind[k].per_node + 1) * (size_t)pm->n_sizes,
                                   sizeof *c->bucket[k])) == NULL)
            return err_set(e, ERR_FAIL, "out of memory");
    return ERR_OK;
}

void pool_costs_cache_free(struct pool_costs_cache *c)
{
    if (c == NULL)
        return;
    for (int k = 0; k < c->pm->K; k++)
        for (int64_t i = 0; c->bucket[k] != NULL &&
                            i < (c->pm->kind[k].per_node + 1) * (int64_t)c->pm->n_sizes;
             i++)
            for (int w = 0; w < POOL_COSTS_WAYS; w++)
                pool_costs_free(&c->bucket[k][i].slot[w].costs);
    for (int k = 0; k < POOL_KINDS_MAX; k++)
        free(c->bucket[k]);
    free(c);
}

/* The slot's costs made: kind k's stage of tp alone, as pool_model_cluster builds it. */
static int fill_slot(struct pool_costs_cache *c, int k, int tp, int size,
                     struct pool_costs_slot *slot)
{
    struct pool_pipe pipe = {.size = size, .dp = slot->dp, .M = 1, .reduce_alone = 1};
    struct cluster cl;
    struct err e;
    err_clear(&e);
    pipe.tp[k] = tp;
    pipe.stages[k] = 1;
    if (slot->costs.fwd_ms == NULL && pool_costs_alloc(&slot->costs, c->L))
        return -1;
    if (pool_model_cluster(c->pm, &pipe, &cl, &e))
        return -1;
    pool_costs_fill(&cl, slot->replicas, c->actions, c->overlap_backward, &slot->costs);
    slot->costs.serial = ++c->serial;
    cluster_free(&cl);
    return 0;
}

const struct pool_costs *pool_costs_get(struct pool_costs_cache *c, int k, int tp, int size,
                                        int dp, int replicas)
{
    if (tp < 1 || tp > c->pm->kind[k].per_node)
        return NULL;
    struct pool_costs_bucket *b = &c->bucket[k][(int64_t)tp * c->pm->n_sizes + size];
    if (b->allowed == 0) {
        struct err skip;
        err_clear(&skip);
        b->allowed = cluster_check_tp(&c->pm->model, tp, "", &skip) ? -1 : 1;
    }
    if (b->allowed < 0)
        return NULL;
    for (int w = 0; w < POOL_COSTS_WAYS; w++)
        if (b->slot[w].dp == dp && b->slot[w].replicas == replicas)
            return &b->slot[w].costs;
    struct pool_costs_slot *slot = &b->slot[b->next];
    b->next = (b->next + 1) % POOL_COSTS_WAYS;
    slot->dp = dp;
    slot->replicas = replicas;
    if (fill_slot(c, k, tp, size, slot)) {
        slot->dp = 0;
        return NULL;
    }
    return &slot->costs;
}

/* least_most(v) = sum_l min_u (v_u(l) / V_u) / sum_u (S_u / V_u), V_u = sum_l v_u(l): the
 * dual, with weights 1/V_u, of the fractional assignment of the layers to the stages (S_u of
 * kind u, a stage of kind u taking v_u(l) for layer l) that minimises the most a stage takes;
 * so at most that most for any split. Here its V_u and numerator, for v = M work + tail when
 * `tails`, else work. */
static int least_most_parts(const struct pool_shape *s, int tails, double *V, double *shares)
{
    double M = tails ? s->M : 1;
    *shares = 0;
    for (int u = 0; u < s->used; u++) {
        V[u] = 0;
        for (int l = 0; l < s->L; l++)
            V[u] += M * s->costs[u]->work_ms[l] + (tails ? s->costs[u]->tail_ms[l] : 0);
        if (!(V[u] > 0))
            return 0;
    }
    for (int l = 0; l < s->L; l++) {
        double share = INFINITY;
        for (int u = 0; u < s->used; u++)
            share = fmin(share, (M * s->costs[u]->work_ms[l] +
                                 (tails ? s->costs[u]->tail_ms[l] : 0)) / V[u]);
        *shares += share;
    }
    return 1;
}

static double least_most(const struct pool_shape *s, const double *V, double shares)
{
    double weights = 0;
    for (int u = 0; u < s->used; u++)
        weights += s->stages[u] / V[u];
    return shares / weights;
}

void pool_summarize(const struct pool_shape *s, struct pool_summary *out)
{
    out->known = least_most_parts(s, 0, out->work, &out->shares) &&
                 least_most_parts(s, 1, out->whole, &out->wholes);
    out->least = out->need = out->phi = 0;
    out->first_tail = INFINITY;
    out->latency = s->costs[0]->latency_ms;
    for (int u = 0; u < s->used; u++)
        out->first_tail = fmin(out->first_tail, s->costs[u]->first_tail_ms);
    for (int l = 0; l < s->L; l++) {
        double ms = INFINITY, state = INFINITY;
        for (int u = 0; u < s->used; u++) {
            const struct pool_costs *c = s->costs[u];
            ms = fmin(ms, c->work_ms[l]);
            state = fmin(state, (double)c->state[l] / (double)c->capacity);
            out->phi = fmax(out->phi, c->work_ms[l] > 0 ? c->fwd_ms[l] / c->work_ms[l] : 1);
        }
        out->least += ms;
        out->need += state > 1 + 1e-9 ? INFINITY : state; /* a layer that fits no stage */
    }
}

/* Section (1) under a schedule whose forwards run in micro-batch order, each backward after
 * its own forward: stage b's first backward waits for micro-batch 0's forward to reach it and
 * its round trip through the stages after it, and before it b has run w_b forwards (1F1B:
 * min(S - b, M); GPipe: M); then its M backwards and the other forwards, and its last
 * backward's gradient reaches stage 0 through the backwards before it. So E_0 >= W + (M - 1)
 * T_b - (w_b - 1) f_b for every b (W the stages' T summed), f_b <= phi T_b: with c_b = M - 1 -
 * (w_b - 1) phi > 0 for every b, E_0 >= W + W / sum_b (1 / c_b) (the T_b that make every
 * right side equal, summing to W, is the least any split reaches); 0 when some c_b <= 0. */
static double pipeline_filled(const struct pool_shape *s, const struct pool_summary *sum, int S)
{
    if (s->schedule != SCHEDULE_1F1B && s->schedule != SCHEDULE_GPIPE)
        return 0;
    double inverse = 0;
    for (int b = 0; b < S; b++) {
        double w = s->schedule == SCHEDULE_GPIPE || S - b > s->M ? s->M : S - b;
        double c = s->M - 1 - (w - 1) * sum->phi;
        if (!(c > 0))
            return 0;
        inverse += 1 / c;
    }
    return sum->least * (1 + 1 / inverse);
}

/* With w_u(l) the time of layer l on kind u and S_u its stages: stage b (T_b its fwd + bwd of
 * a micro-batch, A_b its gradients' all-reduce and O_b its optimizer step, both after its own
 * last backward: sim.c) ends the step no sooner than E_b + A_b + O_b, E_b the end of its last
 * backward.
 * (1) Stage 0: E_0 = X >= P_b + M T_b for every b (P_b the T of the stages before b, which
 * micro-batch 0's forward and the last backward cross). Steady: X >= M max_b T_b >= M
 * least_most(w). Filled: T_b <= (X - P_b) / M gives sum_s T_s <= X (1 - (1 - 1/M)^S), and
 * sum_s T_s >= sum_l min_u w_u(l). Stage 0 holds layer 0 at least, and A and O only grow with
 * the layers: A_0 + O_0 >= the least over its possible kinds of layer 0's alone.
 * (2) Every stage: E_b >= M T_b (its M forwards and backwards, one after another), and A_b =
 * 2 (dp - 1) (latency + ceil(bytes / dp) / bandwidth) >= the all-reduce's latency + the sum
 * over its layers of 2 (dp - 1) / dp of their bytes' transfer: so the step >= latency +
 * max_b of the sum over b's layers of M w + that share + the layer's optimizer step, which is
 * at least least_most of those.
 * Scaled down a little so that rounding never lifts it over the simulated step. */
double pool_bound_first(const struct pool_shape *s, const struct pool_summary *sum)
{
    int S = 0;
    if (!sum->known)
        return 0;
    for (int u = 0; u < s->used; u++)
        S += s->stages[u];
    double steady = s->M * least_most(s, sum->work, sum->shares);
    double filled = fmax(sum->least / (1 - pow(1 - 1 / s->M, S)), pipeline_filled(s, sum, S));
    return (fmax(steady, filled) + sum->first_tail) * (1 - 1e-9);
}

double pool_bound(const struct pool_shape *s, const struct pool_summary *sum)
{
    if (!sum->known)
        return 0;
    double every = sum->latency + least_most(s, sum->whole, sum->wholes);
    return fmax(pool_bound_first(s, sum), every * (1 - 1e-9));
}

/* A stage of kind u holds at most capacity_u (its memory >= the reserve and its layers' state;
 * activations, even all recomputed, only add), so sum_l state_u(l) / capacity_u over its
 * layers <= 1, and summed over the stages, sum_l min_u (state_u(l) / capacity_u) <= S. */
int pool_summary_at(const struct pool_shape *s, struct pool_summary *sum)
{
    return sum->known && least_most_parts(s, 1, sum->whole, &sum->wholes);
}

double pool_bound_at(const struct pool_shape *s, const struct pool_summary *sum)
{
    struct pool_summary at = *sum;
    if (!pool_summary_at(s, &at))
        return pool_bound_first(s, sum);
    return pool_bound(s, &at);
}

int pool_cannot_fit(const struct pool_shape *s, const struct pool_summary *sum)
{
    int S = 0;
    for (int u = 0; u < s->used; u++)
        S += s->stages[u];
    return sum->need > S * (1 + 1e-9);
}

/* Per layer prefix sums: of each used kind's work, backward, tail and state (p[u]), and of
 * the least forward over the kinds (fwd). */
struct pool_prefixes {
    double *work[POOL_KINDS_MAX], *bwd[POOL_KINDS_MAX], *tail[POOL_KINDS_MAX];
    double *state[POOL_KINDS_MAX], *act[POOL_KINDS_MAX], *kept[POOL_KINDS_MAX];
    double *fwd; /* the least forward over the kinds */
    /* the least send over the kinds of any layer before i (INFINITY: none) */
    double *send_before;
    double *block; /* the one allocation */
};

#define PREFIX_ARRAYS 6

static double least_send(const struct pool_shape *s, int l)
{
    double least = INFINITY;
    for (int u = 0; u < s->used; u++)
        least = fmin(least, s->costs[u]->send_ms[l]);
    return least;
}

static int prefixes_make(const struct pool_shape *s, struct pool_prefixes *p)
{
    size_t n = (size_t)s->L + 1;
    p->block = malloc((PREFIX_ARRAYS * (size_t)s->used + 2) * n * sizeof *p->block);
    if (p->block == NULL)
        return -1;
    for (int u = 0; u < s->used; u++) {
        double **a[PREFIX_ARRAYS] = {&p->work[u], &p->bwd[u], &p->tail[u],
                                     &p->state[u], &p->act[u], &p->kept[u]};
        for (int i = 0; i < PREFIX_ARRAYS; i++) {
            *a[i] = p->block + (PREFIX_ARRAYS * (size_t)u + (size_t)i) * n;
            (*a[i])[0] = 0;
        }
    }
    p->fwd = p->block + PREFIX_ARRAYS * (size_t)s->used * n;
    p->send_before = p->fwd + n;
    p->fwd[0] = 0;
    p->send_before[0] = INFINITY;
    for (int l = 0; l < s->L; l++) {
        double f = INFINITY;
        for (int u = 0; u < s->used; u++) {
            const struct pool_costs *c = s->costs[u];
            p->work[u][l + 1] = p->work[u][l] + c->work_ms[l];
            p->bwd[u][l + 1] = p->bwd[u][l] + (c->work_ms[l] - c->fwd_ms[l]);
            p->tail[u][l + 1] = p->tail[u][l] + c->tail_ms[l];
            p->state[u][l + 1] = p->state[u][l] + (double)c->state[l];
            p->act[u][l + 1] = p->act[u][l] + (double)c->act[l];
            p->kept[u][l + 1] = p->kept[u][l] + (double)c->least_kept[l];
            f = fmin(f, c->fwd_ms[l]);
        }
        p->fwd[l + 1] = p->fwd[l] + f;
        p->send_before[l + 1] = fmin(p->send_before[l], least_send(s, l));
    }
    return 0;
}

/* The least recomputation a micro-batch of a stage of kind u must run on layers i..j (prefix
 * indices i, n = j + 1) with `in_flight` micro-batches' activations (per_flight its
 * inverse): its memory is at least state + in_flight x kept, so recomputation must free at
 * least act - (capacity - state) / in_flight bytes of a micro-batch's activations, each ms
 * of it at most freed_per_ms (per_freed its inverse). INFINITY when even the least kept
 * cannot fit. 0 when activations may leave the device. */
static double least_recompute_ms(const struct pool_shape *s, const struct pool_prefixes *p,
                                 int u, int i, int n, int in_flight, double per_flight,
                                 double per_freed)
{
    if (!s->recompute_only)
        return 0;
    double room = (double)s->costs[u]->capacity - (p->state[u][n] - p->state[u][i]);
    if (in_flight * (p->kept[u][n] - p->kept[u][i]) > room * (1 + 1e-12))
        return INFINITY;
    double excess = p->act[u][n] - p->act[u][i] - room * per_flight;
    return excess > 0 ? excess * per_freed : 0;
}

/* What could_row reads and where it writes (pool_could_step_with carves the arrays). */
struct could_walk {
    const struct pool_shape *s;
    const struct pool_prefixes *p;
    const int *in_flights;            /* per position */
    const double *per_flight;         /* per position: 1 / its in-flight count */
    double per_freed[POOL_KINDS_MAX]; /* per kind: 1 / its freed_per_ms */
    int *front;                       /* per set of kinds: front_reach's */
    int *reach; /* per position: the furthest its start could be (reach_after) */
    int S;
    double x;
    double *trip, *back; /* scratch, L + 1 each */
    double *nxt, *sum;   /* per depth of the walk (kinds placed), L + 1 each */
};

/* Whether positions of these kinds can split the layers with every stage b (layers i..k-1,
 * kind u, T_b = f_b + g_b: its fwd, and g_b its bwd + the least recomputation its memory
 * forces, which runs right before each backward) ending its step under x. Its last backward
 * ends at E_b >= V_b = max(F_b + M T_b + H_b + D_b, V_{b+1} + g_b): it starts no sooner than
 * micro-batch 0's forward reaches it (F_b >= the least forwards of the layers before i and b
 * sends of the least any of them puts out), then runs M forwards and backwards; under 1F1B it
 * runs w = min(S - b, M) forwards before its first backward, which waits for micro-batch 0's
 * round trip through the stages after it: H_b = max(0, Q - (w - 1) f_b) idle, Q at least the
 * T of the positions after b and both sends over each link from b on; with w < M it runs its
 * last forward after M - w backwards, and its w backwards after that wait for the last
 * micro-batch's round trip: D_b = max(0, Q - (w - 1) g_b) more (with w = M, E_b >= F_b +
 * M f_b + Q + g_b instead); and its last backward takes the last micro-batch's gradient from
 * stage b+1, sent over the link (as many bytes as b's last layer puts out: sim.c). Then its
 * all-reduce A_b and optimizer step O_b (sim.c; in a grouping replicas.c, whose reduction of
 * b's layers is no shorter), so V_b + A_b + O_b <= x, A_b + O_b >= the tail of pool_bound's
 * section (2). (For stage 0, V_0 is section (1)'s max_b P_b + M T_b, with b's backwards
 * exact.) A DP from the last position back: nxt[k] the least V_{b+1} of a split of the layers
 * from k over the positions after b, and sum[k] the least Q over those splits, each stage
 * passing this test (less is never worse for the positions before; the two may come from
 * different splits: floors of each); F_b + M T_b, A_b + O_b and the state grow with b's last
 * layer.
 *
 * One row of that DP: position b of kind u before the positions after it, whose least V and
 * Q from each end k are nxt[k] and sum[k] (finite from *from_lo to *from_hi): both made b's,
 * and its ends; 0 when no split of the layers from any start fits the positions from b. In
 * place: b's entry from start i reads only the entries after i, so the starts go up. */
static int could_row(const struct could_walk *w, int b, int u, double *nxt, double *sum,
                     int *from_lo, int *from_hi)
{
    const struct pool_shape *s = w->s;
    const struct pool_prefixes *p = w->p;
    int L = s->L, S = w->S, one_f_one_b = s->schedule == SCHEDULE_1F1B;
    double latency = s->costs[0]->latency_ms, M = s->M, x = w->x;
    /* per end k: what the stage's position asks of its successors: micro-batch 0's round
     * trip past k, and the last backward's gradient back over the link */
    double *trip = w->trip, *back = w->back;
    int first = b, last = L - (S - b); /* a layer for every position */
    int in_flight = w->in_flights[b], waits = one_f_one_b && b < S - 1;
    double per_flight = w->per_flight[b], per_freed = w->per_freed[u];
    const double *work = p->work[u], *bwd = p->bwd[u], *tails = p->tail[u];
    const double *state = p->state[u], *send = s->costs[u]->send_ms;
    double cap = (double)s->costs[u]->capacity * (1 + 1e-12);
    double ahead = S - b < M ? S - b : (int)M; /* forwards before its first backward */
    if (b == 0)
        last = 0; /* stage 0 starts at layer 0: no other start is asked for */
    if (last > w->reach[b])
        last = w->reach[b];
    if (last > *from_hi - 1)
        last = *from_hi - 1;
    for (int k = *from_lo; k <= *from_hi; k++) {
        if (waits)
            trip[k] = sum[k] + 2 * send[k - 1];
        back[k] = b < S - 1 ? nxt[k] + send[k - 1] : 0;
    }
    int lo = *from_lo, hi = *from_hi;
    *from_lo = L + 1, *from_hi = -1;
    for (int i = first; i <= last; i++) {
        double arrive = p->fwd[i] + (b > 0 ? b * p->send_before[i] : 0), best = INFINITY;
        double least_sum = INFINITY;
        for (int k = i + 1 > lo ? i + 1 : lo; k <= hi; k++) {
            if (isinf(nxt[k]))
                continue;
            double R = least_recompute_ms(s, p, u, i, k, in_flight, per_flight, per_freed);
            double T = work[k] - work[i] + R, g = bwd[k] - bwd[i] + R, f = T - g;
            double own = arrive + M * T, tail = latency + tails[k] - tails[i];
            if (state[k] - state[i] > cap || !(own + tail <= x))
                break; /* and every later end */
            if (waits) { /* the round trips past the positions after b */
                double head = trip[k] - (ahead - 1) * f, drain = trip[k] - (ahead - 1) * g;
                own += head > 0 ? head : 0;
                if (ahead < M)
                    own += drain > 0 ? drain : 0;
                else if (arrive + M * f + trip[k] + g > own)
                    own = arrive + M * f + trip[k] + g;
            }
            double chain = back[k] + g;
            double V = b < S - 1 && chain > own ? chain : own;
            if (!(V + tail <= x))
                continue;
            best = V < best ? V : best;
            double through = T + (b < S - 1 ? 2 * send[k - 1] : 0) + sum[k];
            least_sum = through < least_sum ? through : least_sum;
        }
        nxt[i] = best;
        sum[i] = least_sum;
        if (!isinf(best)) {
            *from_lo = *from_lo < i ? *from_lo : i;
            *from_hi = i;
        }
    }
    for (int k = lo; k <= hi; k++)
        if (k < first || k > last)
            nxt[k] = sum[k] = INFINITY; /* the positions after b's, not b's */
    return *from_lo <= *from_hi;
}

/* Whether the layers i..k-1 could be the stage of kind u at position b stepping in x:
 * micro-batch 0's arrival, its M forwards and backwards with the least recomputation and its
 * tail within x, and its state within capacity (could_row's test, less the wait for the
 * positions after it). It holds for the layers of any stage that passes that test, and for
 * any fewer of them ending at k: a later start arrives later by at most the least forwards
 * of the layers it leaves out, which its M forwards and backwards lose, and its
 * recomputation, tail and state only fall. */
static int range_could(const struct could_walk *w, int u, int b, int i, int k)
{
    const struct pool_shape *s = w->s;
    const struct pool_prefixes *p = w->p;
    const struct pool_costs *c = s->costs[u];
    double R = least_recompute_ms(s, p, u, i, k, w->in_flights[b], w->per_flight[b],
                                  w->per_freed[u]);
    double arrive = p->fwd[i] + (b > 0 ? b * p->send_before[i] : 0);
    double tail = c->latency_ms + p->tail[u][k] - p->tail[u][i];
    return p->state[u][k] - p->state[u][i] <= (double)c->capacity * (1 + 1e-12) &&
           arrive + s->M * (p->work[u][k] - p->work[u][i] + R) + tail <= w->x;
}

/* From `from`, the furthest layer the n stages of kind u at positions b.. could hold up to
 * (range_could's, each from where the one before could end at the furthest: no split of
 * theirs ends later), and into reach (when not NULL) where each could start at the furthest. */
static int reach_after(const struct could_walk *w, int u, int b, int n, int from, int *reach)
{
    for (int a = b; a < b + n; a++) {
        if (reach != NULL)
            reach[a] = from;
        int k = from;
        while (k < w->s->L && range_could(w, u, a, from, k + 1))
            k++;
        from = k;
    }
    return from;
}

/* Per set of kinds (a bit each), the furthest layer their stages could hold up to at the
 * front, in any order (reach_after's, the most over the kind placed last), into w->front.
 * Whether all of them could hold every layer. */
static int front_reach(const struct could_walk *w)
{
    const struct pool_shape *s = w->s;
    int *front = w->front;
    unsigned all = (1u << s->used) - 1;
    front[0] = 0;
    for (unsigned set = 1; set <= all; set++) {
        int before = 0;
        for (int u = 0; u < s->used; u++)
            before += (set >> u & 1) ? s->stages[u] : 0;
        front[set] = 0;
        for (int u = 0; u < s->used; u++)
            if (set >> u & 1) {
                unsigned rest = set & ~(1u << u);
                int to = reach_after(w, u, before - s->stages[u], s->stages[u], front[rest],
                                     NULL);
                front[set] = to > front[set] ? to : front[set];
            }
    }
    return front[all] >= s->L;
}

/* The kinds in `left` (a bit each), each kind's stages together in some order, on the
 * positions before `end`, the positions from `end` on placed already (their DP's nxt at
 * depth d, finite from from_lo to from_hi): whether some order and split could step in x.
 * Orders that end alike share the DP of their end (and most are refuted there). */
static int could_suffix(const struct could_walk *w, unsigned left, int end, int d,
                        int from_lo, int from_hi)
{
    int L = w->s->L;
    const double *placed = w->nxt + (size_t)d * (L + 1);
    const double *placed_sum = w->sum + (size_t)d * (L + 1);
    if (left == 0)
        return !isinf(placed[0]);
    double *nxt = w->nxt + (size_t)(d + 1) * (L + 1);
    double *sum = w->sum + (size_t)(d + 1) * (L + 1);
    for (int u = 0; u < w->s->used; u++) {
        if (!(left >> u & 1))
            continue;
        int lo = from_lo, hi = from_hi, alive = 1, start = end - w->s->stages[u];
        unsigned before = left & ~(1u << u);
        if (reach_after(w, u, start, w->s->stages[u], w->front[before], w->reach) < lo)
            continue; /* the positions before the placed ones cannot reach their layers */
        memcpy(nxt, placed, (size_t)(L + 1) * sizeof *nxt);
        memcpy(sum, placed_sum, (size_t)(L + 1) * sizeof *sum);
        for (int b = end - 1; alive && b >= start; b--)
            alive = could_row(w, b, u, nxt, sum, &lo, &hi);
        if (alive && could_suffix(w, left & ~(1u << u), start, d + 1, lo, hi))
            return 1;
    }
    return 0;
}

struct pool_prefixes *pool_prefixes_make(const struct pool_shape *s)
{
    struct pool_prefixes *p = malloc(sizeof *p);
    if (p != NULL && prefixes_make(s, p)) {
        free(p);
        return NULL;
    }
    return p;
}

void pool_prefixes_free(struct pool_prefixes *p)
{
    if (p != NULL)
        free(p->block);
    free(p);
}

int pool_could_step_with(const struct pool_shape *s, const struct pool_prefixes *p, double x)
{
    int S = 0, L = s->L;
    for (int u = 0; u < s->used; u++)
        S += s->stages[u];
    if (L < S || S < 1)
        return 0;
    int *in_flights = malloc((2 * (size_t)S + (1u << s->used)) * sizeof *in_flights);
    double *at = malloc(((size_t)(4 + 2 * s->used) * ((size_t)L + 1) + (size_t)S) * sizeof *at);
    if (in_flights == NULL || at == NULL) {
        free(in_flights);
        free(at);
        return 1; /* nothing proved */
    }
    /* per position, whatever the order (read only when activations must stay:
       least_recompute_ms) */
    for (int b = 0; b < S; b++)
        in_flights[b] = s->recompute_only ? schedule_in_flight(s->schedule, S, b, (int)s->M) : 1;
    /* rounding never leaves out a split that steps in x */
    size_t n = (size_t)L + 1, depths = (size_t)s->used + 1;
    double *per_flight = at + (2 + 2 * depths) * n;
    for (int b = 0; b < S; b++)
        per_flight[b] = 1.0 / in_flights[b];
    struct could_walk w = {s, p, in_flights, per_flight, {0}, in_flights + 2 * S,
                           in_flights + S, S, x * (1 + 1e-9), at, at + n, at + 2 * n,
                           at + (2 + depths) * n};
    for (int u = 0; u < s->used; u++)
        w.per_freed[u] = 1 / s->costs[u]->freed_per_ms;
    if (!front_reach(&w)) {
        free(in_flights);
        free(at);
        return 0;
    }
    for (int k = 0; k <= L; k++)
        w.nxt[k] = w.sum[k] = k == L ? 0 : INFINITY; /* no position after the last */
    int could = could_suffix(&w, (1u << s->used) - 1, S, 0, L, L);
    free(in_flights);
    free(at);
    return could;
}

int pool_could_step(const struct pool_shape *s, double x)
{
    struct pool_prefixes *p = pool_prefixes_make(s);
    int could = p == NULL || pool_could_step_with(s, p, x); /* NULL: nothing proved */
    pool_prefixes_free(p);
    return could;
}
