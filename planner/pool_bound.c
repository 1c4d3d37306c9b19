#include "pool_bound.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"

int pool_costs_alloc(struct pool_costs *c, int L)
{
    memset(c, 0, sizeof *c);
    c->fwd_ms = calloc((size_t)3 * L, sizeof *c->fwd_ms);
    c->state = calloc((size_t)3 * L, sizeof *c->state);
    if (c->fwd_ms == NULL || c->state == NULL) {
        pool_costs_free(c);
        return -1;
    }
    c->work_ms = c->fwd_ms + L;
    c->act = c->state + L;
    c->least_kept = c->state + 2 * L;
    c->tail_ms = c->fwd_ms + 2 * L;
    return 0;
}

void pool_costs_free(struct pool_costs *c)
{
    free(c->fwd_ms);
    free(c->state);
    memset(c, 0, sizeof *c);
}

void pool_costs_fill(const struct cluster *c, int dp, int device_optimizer, int reduce,
                     struct pool_costs *out)
{
    const struct profile *p = cluster_stage_profile(c, 0);
    const struct link *link = &c->stages[0].dp_link;
    /* the all-reduce's bytes part, 2 (dp - 1) transfers of bytes / dp each (cost.c); reduced in
     * buckets (sim.h), all of it may overlap the stage's last backward, whose layers' share is
     * taken off (the bounds add M forwards and backwards to it: never below 0) */
    double per_byte = reduce ? 2.0 * (dp - 1) / dp : 0;
    int overlap = reduce && dp > 1 && c->dp_bucket_bytes > 0;
    for (int l = 0; l < p->n_layers; l++) {
        const struct layer_cost *y = &p->layers[l];
        double bytes_ms = link_transfer_ms(link, cluster_grad_bytes(c, 0, l, l)) -
                          link_transfer_ms(link, 0);
        out->fwd_ms[l] = y->fwd_ms;
        out->work_ms[l] = y->fwd_ms + y->bwd_ms;
        out->tail_ms[l] = per_byte * bytes_ms + device_optimizer * y->optimizer_ms -
                          overlap * y->bwd_ms;
        out->state[l] = cost_layer_state(y, COST_PLACE_DEVICE);
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
    out->first_tail_ms = (reduce ? cluster_allreduce_ms(c, 0, 0, 0) : 0) +
                         device_optimizer * p->layers[0].optimizer_ms;
    out->latency_ms = reduce ? cost_dp_allreduce_ms(link, dp, 0) : 0;
    out->capacity = c->stages[0].memory_bytes - c->reserve_bytes;
    out->known = 1;
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
    out->least = out->need = 0;
    out->first_tail = INFINITY;
    out->latency = s->costs[0]->latency_ms;
    for (int u = 0; u < s->used; u++)
        out->first_tail = fmin(out->first_tail, s->costs[u]->first_tail_ms);
    for (int l = 0; l < s->L; l++) {
        double ms = INFINITY, state = INFINITY;
        for (int u = 0; u < s->used; u++) {
            ms = fmin(ms, s->costs[u]->work_ms[l]);
            state = fmin(state, (double)s->costs[u]->state[l] / (double)s->costs[u]->capacity);
        }
        out->least += ms;
        out->need += state > 1 + 1e-9 ? INFINITY : state; /* a layer that fits no stage */
    }
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
double pool_bound(const struct pool_shape *s, const struct pool_summary *sum)
{
    int S = 0;
    if (!sum->known)
        return 0;
    for (int u = 0; u < s->used; u++)
        S += s->stages[u];
    double steady = s->M * least_most(s, sum->work, sum->shares);
    double filled = sum->least / (1 - pow(1 - 1 / s->M, S));
    double stage0 = fmax(steady, filled) + sum->first_tail;
    double every = sum->latency + least_most(s, sum->whole, sum->wholes);
    return fmax(stage0, every) * (1 - 1e-9);
}

/* A stage of kind u holds at most capacity_u (its memory >= the reserve and its layers' state;
 * activations, even all recomputed, only add), so sum_l state_u(l) / capacity_u over its
 * layers <= 1, and summed over the stages, sum_l min_u (state_u(l) / capacity_u) <= S. */
int pool_cannot_fit(const struct pool_shape *s, const struct pool_summary *sum)
{
    int S = 0;
    for (int u = 0; u < s->used; u++)
        S += s->stages[u];
    return sum->need > S * (1 + 1e-9);
}

/* Per layer prefix sums: of each used kind's work, tail and state (p[u]), and of the least
 * forward and the least work over the kinds (fwd, work). */
struct prefixes {
    double *work[POOL_KINDS_MAX], *tail[POOL_KINDS_MAX], *state[POOL_KINDS_MAX];
    double *act[POOL_KINDS_MAX], *kept[POOL_KINDS_MAX];
    double *fwd, *least_work;
    double *block; /* the one allocation */
};

static int prefixes_make(const struct pool_shape *s, struct prefixes *p)
{
    size_t n = (size_t)s->L + 1;
    p->block = malloc((5 * (size_t)s->used + 2) * n * sizeof *p->block);
    if (p->block == NULL)
        return -1;
    for (int u = 0; u < s->used; u++) {
        p->work[u] = p->block + 5 * u * n;
        p->tail[u] = p->work[u] + n;
        p->state[u] = p->tail[u] + n;
        p->act[u] = p->state[u] + n;
        p->kept[u] = p->act[u] + n;
        p->work[u][0] = p->tail[u][0] = p->state[u][0] = p->act[u][0] = p->kept[u][0] = 0;
    }
    p->fwd = p->block + 5 * s->used * n;
    p->least_work = p->fwd + n;
    p->fwd[0] = p->least_work[0] = 0;
    for (int l = 0; l < s->L; l++) {
        double f = INFINITY, w = INFINITY;
        for (int u = 0; u < s->used; u++) {
            const struct pool_costs *c = s->costs[u];
            p->work[u][l + 1] = p->work[u][l] + c->work_ms[l];
            p->tail[u][l + 1] = p->tail[u][l] + c->tail_ms[l];
            p->state[u][l + 1] = p->state[u][l] + (double)c->state[l];
            p->act[u][l + 1] = p->act[u][l] + (double)c->act[l];
            p->kept[u][l + 1] = p->kept[u][l] + (double)c->least_kept[l];
            f = fmin(f, c->fwd_ms[l]);
            w = fmin(w, c->work_ms[l]);
        }
        p->fwd[l + 1] = p->fwd[l] + f;
        p->least_work[l + 1] = p->least_work[l] + w;
    }
    return 0;
}

/* The positions' kinds in this order of the kinds, each kind's stages together. */
static int positions(const struct pool_shape *s, const int *order, int *kind_at)
{
    int S = 0;
    for (int g = 0; g < s->used; g++)
        for (int j = 0; j < s->stages[order[g]]; j++)
            kind_at[S++] = order[g];
    return S;
}

/* The least recomputation a micro-batch of a stage of kind u must run on layers i..j (prefix
 * indices i, n = j + 1) with `in_flight` micro-batches' activations: its memory is at least
 * state + in_flight x kept, so recomputation must free at least act - (capacity - state) /
 * in_flight bytes of a micro-batch's activations, each ms of it at most freed_per_ms.
 * INFINITY when even the least kept cannot fit. 0 when activations may leave the device. */
static double least_recompute_ms(const struct pool_shape *s, const struct prefixes *p, int u,
                                 int i, int n, int in_flight)
{
    const struct pool_costs *c = s->costs[u];
    if (!s->recompute_only)
        return 0;
    double room = (double)c->capacity - (p->state[u][n] - p->state[u][i]);
    if (in_flight * (p->kept[u][n] - p->kept[u][i]) > room * (1 + 1e-12))
        return INFINITY;
    double excess = p->act[u][n] - p->act[u][i] - room / in_flight;
    return excess > 0 ? excess / c->freed_per_ms : 0;
}

/* Whether positions of these kinds can split the layers with every stage b (layers i..j,
 * kind u, T_b its fwd + bwd + the least recomputation its memory forces) under x as section
 * (2) of pool_bound and (1) by split: its state within capacity_u; F_b + M T_b + A_b + O_b <=
 * x (E_b >= F_b + M T_b, F_b >= the least forwards of the layers before i: micro-batch 0's
 * forward reaches b no sooner); and P_b + M T_b <= x - A_0 - O_0 (P_b >= the least works of
 * the layers before i). A DP over the positions: at[i] the least A_0 + O_0 of a split of the
 * layers before i over the positions so far (less is never worse for the positions after, so
 * the least suffices); each constraint only grows with j. */
static int split_could_step(const struct pool_shape *s, const struct prefixes *p,
                            const int *kind_at, int S, double x, double *at, double *next)
{
    int L = s->L;
    double latency = s->costs[0]->latency_ms;
    if (L < 1)
        return 0;
    for (int i = 0; i <= L; i++)
        at[i] = i == 0 ? 0 : INFINITY;
    for (int b = 0; b < S; b++) {
        int u = kind_at[b], last = L - (S - b); /* leave a layer to each position after */
        int in_flight = schedule_in_flight(s->schedule, S, b, (int)s->M);
        double cap = (double)s->costs[u]->capacity * (1 + 1e-12);
        for (int i = 0; i <= L; i++)
            next[i] = INFINITY;
        for (int i = b; i <= last; i++) {
            if (isinf(at[i]))
                continue;
            for (int j = i; j <= last; j++) {
                double T = p->work[u][j + 1] - p->work[u][i] +
                           least_recompute_ms(s, p, u, i, j + 1, in_flight);
                double tail = latency + p->tail[u][j + 1] - p->tail[u][i];
                double t0 = b == 0 ? tail : at[i];
                if (p->state[u][j + 1] - p->state[u][i] > cap ||
                    !(p->fwd[i] + s->M * T + tail <= x) ||
                    !(p->least_work[i] + s->M * T <= x - t0))
                    break;
                next[j + 1] = fmin(next[j + 1], t0);
            }
        }
        memcpy(at, next, (size_t)(L + 1) * sizeof *at);
    }
    return !isinf(at[L]);
}

/* The orders of the kinds, order[0..depth) fixed and the kinds in `left` (a bit each) to
 * come: whether some split of one could step in x. */
static int some_order(const struct pool_shape *s, const struct prefixes *p, int *order,
                      int depth, unsigned left, int *kind_at, double x, double *at)
{
    if (left == 0)
        return split_could_step(s, p, kind_at, positions(s, order, kind_at), x, at,
                                at + s->L + 1);
    for (int u = 0; u < s->used; u++)
        if (left >> u & 1) {
            order[depth] = u;
            if (some_order(s, p, order, depth + 1, left & ~(1u << u), kind_at, x, at))
                return 1;
        }
    return 0;
}

int pool_could_step(const struct pool_shape *s, double x)
{
    struct prefixes p;
    int order[POOL_KINDS_MAX], S = 0;
    for (int u = 0; u < s->used; u++)
        S += s->stages[u];
    int *kind_at = malloc((size_t)S * sizeof *kind_at);
    double *at = malloc(2 * ((size_t)s->L + 1) * sizeof *at);
    if (kind_at == NULL || at == NULL || prefixes_make(s, &p)) {
        free(kind_at);
        free(at);
        return 1; /* nothing proved */
    }
    /* rounding never leaves out a split that steps in x */
    int could = some_order(s, &p, order, 0, (1u << s->used) - 1, kind_at, x * (1 + 1e-9), at);
    free(p.block);
    free(kind_at);
    free(at);
    return could;
}
