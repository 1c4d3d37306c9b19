#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"

static int check_input(int S, int M, const struct sim_stage *stages, struct err *e)
{
    if (S < 1 || M < 1)
        return err_set(e, ERR_INPUT, "simulate: %d stages and %d micro-batches (need >= 1 each)",
                       S, M);
    if ((int64_t)S * M > SIM_CELLS_MAX)
        return err_set(e, ERR_INPUT,
                       "simulate: %d stages x %d micro-batches = %lld is more than the %lld the "
                       "simulator takes",
                       S, M, (long long)S * M, (long long)SIM_CELLS_MAX);
    for (int s = 0; s < S; s++) {
        const struct sim_stage *st = &stages[s];
        double t[5] = {st->fwd_ms, st->bwd_ms, st->recompute_ms, st->allreduce_ms, st->w_ms};
        static const char *const names[5] = {"fwd_ms", "bwd_ms", "recompute_ms", "allreduce_ms",
                                              "w_ms"};
        for (int k = 0; k < 5; k++)
            if (!(isfinite(t[k]) && t[k] >= 0))
                return err_set(e, ERR_INPUT, "simulate: stage %d: %s is %g (need finite, >= 0)",
                               s, names[k], t[k]);
        if (!(isfinite(st->optimizer_ms) && st->optimizer_ms >= 0) ||
            (st->host_optimizer &&
             (st->n_layers < 1 || st->host_from < 0 || st->host_from >= st->n_layers)))
            return err_set(e, ERR_INPUT,
                           "simulate: stage %d: optimizer step of %g ms, host step over %d "
                           "layers (need finite, >= 0, and layers with a host step)",
                           s, st->optimizer_ms, st->n_layers);
        for (int l = 0; l < st->n_layers; l++) {
            const struct sim_layer *y = &st->layers[l];
            double step[3] = {y->grad_ms, y->update_ms, y->param_ms};
            if (!(isfinite(y->copy_ms) && y->copy_ms >= 0 && (y->copy_ms == 0 || y->ahead >= 1)))
                return err_set(e, ERR_INPUT,
                               "simulate: stage %d layer %d: copy of %g ms, prefetch %d ahead "
                               "(need finite, >= 0, and ahead >= 1 with a copy)",
                               s, l, y->copy_ms, y->ahead);
            for (int k = 0; k < 3; k++)
                if (!(isfinite(step[k]) && step[k] >= 0))
                    return err_set(e, ERR_INPUT,
                                   "simulate: stage %d layer %d: host step of %g, %g, %g ms "
                                   "(need finite, >= 0)",
                                   s, l, y->grad_ms, y->update_ms, y->param_ms);
        }
        for (int k = 0; k < st->n_buckets; k++) {
            const struct sim_bucket *b = &st->buckets[k];
            if (!(isfinite(b->allreduce_ms) && b->allreduce_ms >= 0 && isfinite(b->rest_ms) &&
                  b->rest_ms >= 0))
                return err_set(e, ERR_INPUT,
                               "simulate: stage %d bucket %d: all-reduce of %g ms, ready %g ms "
                               "before the last backward ends (need finite, >= 0)",
                               s, k, b->allreduce_ms, b->rest_ms);
        }
        if (st->out_bytes < 0)
            return err_set(e, ERR_INPUT, "simulate: stage %d: out_bytes is %lld", s,
                           (long long)st->out_bytes);
        if (st->link.present &&
            !(st->link.gbps > 0 && isfinite(st->link.gbps) && st->link.latency_us >= 0 &&
              isfinite(st->link.latency_us)))
            return err_set(e, ERR_INPUT, "simulate: stage %d: link of %g Gb/s, %g us", s,
                           st->link.gbps, st->link.latency_us);
    }
    return ERR_OK;
}

/* A backward waiting for its turn in a round: the stage and its op. */
struct stage_op {
    int stage, op;
};

/* The state of the simulation: each stage's program (its warm-up), when it and each link
 * direction are next free, and when each (stage, micro-batch) input has arrived. */
struct sim_state {
    int S, M;
    const struct sim_stage *stages;
    int *warmup;       /* per stage: its program's warm-up forwards (schedule_op_at) */
    struct stage_op *back; /* S: a round's backwards */
    double *free_ms;   /* per stage: when its previous operation ends */
    double *transfer_ms; /* per boundary: one send over it (the same every time) */
    double *fwd_in;    /* S x M: activation arrival at stage s (NaN: not yet) */
    double *bwd_in;    /* S x M: gradient arrival at stage s (NaN: not yet) */
    double *link_fwd;  /* per boundary: when the forward direction is next free */
    double *link_bwd;  /* per boundary: when the backward direction is next free */
    double *fwd_sent;  /* per stage: when its last forward's send ended (its buffer free) */
    double *bwd_sent;  /* per stage: when its last backward's send ended */
    struct host_lanes *host; /* per stage */
    double *fwd_end;   /* S x M: when each forward ends (NULL: not kept) */
    double *bwd_end;   /* S x M: when each backward ends (NULL: not kept) */
    struct sim_result *out;
};

/* A stage that runs layer by layer: when each of its layer-ops started, when each
 * (micro-batch, layer) copy out ended, when each layer's latest backward ended, and when each
 * lane and its host threads are next free. */
struct host_lanes {
    double *op_start; /* 2M x n, in the stage's order of layer-ops */
    double *out_end;  /* M x n */
    double *bwd_end;  /* n */
    double *gout_end; /* n: a streamed layer's last gradients out, < 0 none yet */
    double out_free, in_free, update_free;
};

/* The times sim_makespan_periodic reads back: S x M each, owned by the caller. */
struct sim_marks {
    double *fwd_in, *bwd_in, *fwd_end, *bwd_end;
};

static void add_task(struct sim_state *st, int stage, int micro, enum sim_kind kind,
                     double start, double end)
{
    if (st->out->tasks != NULL)
        st->out->tasks[st->out->n_tasks++] = (struct sim_task){stage, micro, kind, start, end};
}

static void add_busy(struct sim_state *st, int s, double ms)
{
    if (st->out->busy_ms != NULL)
        st->out->busy_ms[s] += ms;
}

/* The simulator's innermost functions, inlined into round_k's two copies (see there). */
#define SIM_INLINE static inline __attribute__((always_inline))

/* Sends over boundary k in one direction, after `ready`, queued behind earlier sends;
 * returns the arrival time. */
SIM_INLINE double sim_send(struct sim_state *st, int record, int k, int micro, enum sim_kind kind,
                           double ready)
{
    double *link_free = kind == SIM_SEND_FORWARD ? &st->link_fwd[k] : &st->link_bwd[k];
    double start = ready > *link_free ? ready : *link_free;
    double end = start + st->transfer_ms[k];
    *link_free = end;
    if (record && st->stages[k].link.present)
        add_task(st, k, micro, kind, start, end);
    return end;
}

static void add_to(double *per_stage, int s, double ms)
{
    if (per_stage != NULL)
        per_stage[s] += ms;
}

/* A copy on one of stage s's host lanes from `ready`; returns its end. */
static double copy(struct sim_state *st, int s, int micro, enum sim_kind kind, double ready,
                   double ms)
{
    struct host_lanes *h = &st->host[s];
    int out = kind == SIM_COPY_OUT || kind == SIM_GRAD_COPY;
    double *lane_free = out ? &h->out_free : &h->in_free;
    double start = ready > *lane_free ? ready : *lane_free;
    *lane_free = start + ms;
    add_task(st, s, micro, kind, start, start + ms);
    add_to(out ? st->out->copy_out_ms : st->out->copy_in_ms, s, ms);
    return start + ms;
}

/* A streamed layer's weights (and with `grads`, its summed gradients after its last ones went
 * out) for layer-op `at` of stage s, issued at the start of the layer-op before it; returns
 * when layer-op `at`, ready at t, can start. */
static double stream_in(struct sim_state *st, int s, int m, const struct sim_layer *y,
                        int64_t at, int l, int grads, double t)
{
    struct host_lanes *h = &st->host[s];
    double issue = at > 0 ? h->op_start[at - 1] : 0;
    double arrive = copy(st, s, m, SIM_COPY_IN, issue, y->stream_w_ms);
    if (grads && h->gout_end[l] >= 0) {
        double after = arrive > h->gout_end[l] ? arrive : h->gout_end[l];
        arrive = copy(st, s, m, SIM_COPY_IN, after, y->stream_g_ms);
    }
    if (arrive > t)
        add_to(st->out->stall_ms, s, arrive - t);
    return arrive > t ? arrive : t;
}

/* Forward of micro-batch m on an offloading stage, layer by layer from `start`, its last
 * layer from `sent` on (its output's buffer free); returns its end. Op p of the stage's
 * program is its layer-ops p*n .. p*n+n-1. */
static double forward_layers(struct sim_state *st, int s, int p, int m, double start,
                             double sent)
{
    const struct sim_stage *c = &st->stages[s];
    struct host_lanes *h = &st->host[s];
    int n = c->n_layers;
    double t = start;
    for (int l = 0; l < n; l++) {
        const struct sim_layer *y = &c->layers[l];
        t = l == n - 1 && sent > t ? sent : t;
        if (y->stream)
            t = stream_in(st, s, m, y, (int64_t)p * n + l, l, 0, t);
        h->op_start[(size_t)p * n + l] = t;
        t += y->fwd_ms;
        if (y->copy_ms > 0)
            h->out_end[(size_t)m * n + l] = copy(st, s, m, SIM_COPY_OUT, t, y->copy_ms);
    }
    add_task(st, s, m, SIM_FORWARD, start, t);
    return t;
}

/* Backward of micro-batch m, layers last to first, each after its prefetch; returns its end. */
static double backward_layers(struct sim_state *st, int s, int p, int m, double start)
{
    const struct sim_stage *c = &st->stages[s];
    struct host_lanes *h = &st->host[s];
    int n = c->n_layers;
    double t = start;
    for (int j = 0; j < n; j++) {
        int l = n - 1 - j;
        const struct sim_layer *y = &c->layers[l];
        int64_t at = (int64_t)p * n + j;
        if (y->copy_ms > 0) {
            int64_t trigger = at - y->ahead;
            double issue = trigger < 0 ? 0 : h->op_start[trigger];
            double out = h->out_end[(size_t)m * n + l];
            double arrive = copy(st, s, m, SIM_COPY_IN, issue > out ? issue : out, y->copy_ms);
            if (arrive > t) {
                add_to(st->out->stall_ms, s, arrive - t);
                t = arrive;
            }
        }
        if (y->stream)
            t = stream_in(st, s, m, y, at, l, 1, t);
        h->op_start[at] = t;
        if (y->recompute_ms > 0)
            add_task(st, s, m, SIM_RECOMPUTE, t, t + y->recompute_ms);
        add_task(st, s, m, SIM_BACKWARD, t + y->recompute_ms, t + y->recompute_ms + y->bwd_ms);
        t += y->recompute_ms + y->bwd_ms;
        h->bwd_end[l] = t;
        if (y->stream)
            h->gout_end[l] = copy(st, s, m, SIM_COPY_OUT, t, y->stream_g_ms);
    }
    return t;
}

/* The host step of stage s once its gradients are final at `end` (its last backward, and with
 * data-parallel replicas their all-reduce): per layer, last to first, gradients down from the
 * end of its backward (from `end` when the replicas reduce them), AdamW on the host threads,
 * parameters up; returns when the last parameters have landed (at least `end`). */
static double host_step(struct sim_state *st, int s, double end)
{
    const struct sim_stage *c = &st->stages[s];
    struct host_lanes *h = &st->host[s];
    double done = end;
    for (int j = 0; j < c->n_layers - c->host_from; j++) {
        int l = c->n_layers - 1 - j;
        const struct sim_layer *y = &c->layers[l];
        double final = c->allreduce_ms > 0 || c->n_buckets > 0 ? end : h->bwd_end[l];
        /* a streamed layer's gradients have landed with its last backward's copy out */
        double landed = y->stream ? h->gout_end[l]
                                           : copy(st, s, l, SIM_GRAD_COPY, final, y->grad_ms);
        double start = landed > h->update_free ? landed : h->update_free;
        h->update_free = start + y->update_ms;
        add_task(st, s, l, SIM_HOST_UPDATE, start, h->update_free);
        add_to(st->out->update_ms, s, y->update_ms);
        double up = y->stream
                        ? h->update_free
                        : copy(st, s, l, SIM_PARAM_COPY, h->update_free, y->param_ms);
        done = up > done ? up : done;
    }
    return done;
}

/* When stage s's gradients are reduced over its replicas, its last backward having ended at
 * `end`: its buckets one after another on the dp link, each from when it is ready (sim.h),
 * else its whole all-reduce after `end`. */
static double reduced(struct sim_state *st, int s, double end)
{
    const struct sim_stage *c = &st->stages[s];
    if (c->n_buckets == 0)
        return end + c->allreduce_ms;
    double link = 0;
    for (int k = 0; k < c->n_buckets; k++) {
        const struct sim_bucket *b = &c->buckets[k];
        double ready = end - b->rest_ms, start = ready > link ? ready : link;
        link = start + b->allreduce_ms;
        add_task(st, s, k, SIM_ALLREDUCE, start, link);
    }
    return link > end ? link : end;
}

/* The optimizer step that ends stage s's iteration, after its gradients were final at `end`
 * (its last backward, or their reduction); returns the step's end. */
static double sim_optimizer_step(struct sim_state *st, int s, double end)
{
    const struct sim_stage *c = &st->stages[s];
    double done = end + c->optimizer_ms;
    if (c->optimizer_ms > 0) {
        add_task(st, s, -1, SIM_OPTIMIZER, end, done);
        add_to(st->out->update_ms, s, c->optimizer_ms);
    }
    if (c->host_optimizer) {
        double host = host_step(st, s, end);
        done = host > done ? host : done;
    }
    add_to(st->out->tail_ms, s, done - end);
    return done;
}

/* Stage s's op k, the forward of micro-batch m, from its input's arrival `ready`. */
SIM_INLINE void sim_run_forward(struct sim_state *st, int record, int s, int k, int m, double ready)
{
    const struct sim_stage *c = &st->stages[s];
    size_t at = (size_t)s * st->M + m;
    double start = ready > st->free_ms[s] ? ready : st->free_ms[s], end;
    double last = st->fwd_sent[s] + c->out_fwd_ms; /* its output's buffer is free */
    if (c->n_layers > 0) {
        end = forward_layers(st, s, k, m, start, st->fwd_sent[s]);
    } else {
        end = start + c->fwd_ms > last ? start + c->fwd_ms : last;
        if (record)
            add_task(st, s, m, SIM_FORWARD, start, end);
        if (st->fwd_end != NULL)
            st->fwd_end[at] = end;
    }
    st->free_ms[s] = end;
    if (record)
        add_busy(st, s, c->fwd_ms);
    if (s + 1 < st->S)
        st->fwd_sent[s] = st->fwd_in[at + st->M] =
            sim_send(st, record, s, m, SIM_SEND_FORWARD, end);
}

/* Stage s's op k, the backward of micro-batch m (and its recompute), from its gradient's
 * arrival `ready`. */
SIM_INLINE void sim_run_backward(struct sim_state *st, int record, int s, int k, int m,
                                 double ready)
{
    const struct sim_stage *c = &st->stages[s];
    size_t at = (size_t)s * st->M + m;
    double start = ready > st->free_ms[s] ? ready : st->free_ms[s], end;
    start = start > st->bwd_sent[s] ? start : st->bwd_sent[s];
    if (c->n_layers > 0) {
        end = backward_layers(st, s, k, m, start);
    } else {
        double mid = start + c->recompute_ms;
        end = mid + c->bwd_ms;
        if (record && c->recompute_ms > 0)
            add_task(st, s, m, SIM_RECOMPUTE, start, mid);
        if (record)
            add_task(st, s, m, SIM_BACKWARD, mid, end);
        if (st->bwd_end != NULL)
            st->bwd_end[at] = end;
    }
    st->free_ms[s] = end;
    if (record)
        add_busy(st, s, c->recompute_ms + c->bwd_ms);
    if (s > 0)
        st->bwd_sent[s] = st->bwd_in[at - st->M] =
            sim_send(st, record, s - 1, m, SIM_SEND_BACKWARD, end);
}

/* Runs stage s's op k (schedule_op_at's) if its input has arrived (`simulate`'s order never
 * lets it come first); returns 1 if it ran. */
SIM_INLINE int run_op(struct sim_state *st, int record, int s, int k)
{
    struct schedule_op op = schedule_op_at(st->warmup[s], st->M, k);
    size_t at = (size_t)s * st->M + op.micro;
    double ready = op.pass == SCHEDULE_B ? st->bwd_in[at] : st->fwd_in[at];
    if (isnan(ready))
        return 0;
    if (op.pass == SCHEDULE_B)
        sim_run_backward(st, record, s, k, op.micro, ready);
    else
        sim_run_forward(st, record, s, k, op.micro, ready);
    return 1;
}

static int sim_min_int(int a, int b)
{
    return a < b ? a : b;
}

static int max_int(int a, int b)
{
    return a > b ? a : b;
}

/* `simulate` runs every op of every stage in three parts, each in an order where an op's
 * inputs are there when it runs and ops next to each other seldom depend on one another (so
 * that the processor overlaps them); the times, which each op's predecessors alone fix, are
 * those of any order that respects the predecessors. The argument needs warm-ups to shrink
 * down the pipeline (schedule_warmup). Each part returns how many ops it ran.
 *
 * `record`: whether `out` takes tasks and per-stage totals; simulate calls the parts with a
 * constant 1 (sim_run) or 0 (a search), and the compiler makes a copy of each for each, the
 * search's free of all recording: the same code, never a second simulator. */

/* 1. The warm-ups: stage s's ops k < warmup, forwards, whose inputs are the previous stage's
 * same op (in its warm-up, which is no shorter) and their own stage's previous op: all in
 * part 1, run by diagonals d = s + k, each needing only the one before. */
SIM_INLINE int64_t run_warmups(struct sim_state *st, int record)
{
    int S = st->S, w0 = st->warmup[0];
    int64_t ran = 0;
    for (int d = 0; d < w0 + S - 1; d++)
        for (int s = max_int(0, d - w0 + 1); s <= sim_min_int(d, S - 1); s++)
            if (d - s < st->warmup[s])
                ran += run_op(st, record, s, d - s);
    return ran;
}

/* 2. The steady states, op k of every stage in round k: the forwards from the first stage
 * down, then the backwards from the last stage up. A forward's input is the previous stage's
 * forward of the same micro-batch, at a position of that stage's order no later (run just
 * before in this round, in an earlier one, or in part 1); a backward's is the next stage's
 * backward, likewise no later and not in its cool-down; and each op follows its stage's
 * previous one. */
SIM_INLINE int64_t run_steady(struct sim_state *st, int record)
{
    int S = st->S, M = st->M;
    int64_t ran = 0;
    for (int k = 0; k < 2 * M; k++) {
        int n_back = 0;
        for (int s = 0; s < S; s++) {
            int w = st->warmup[s];
            if (k < w || k >= 2 * M - w)
                continue;
            if (schedule_op_at(w, M, k).pass == SCHEDULE_B)
                st->back[n_back++] = (struct stage_op){s, k};
            else
                ran += run_op(st, record, s, k);
        }
        while (n_back > 0) {
            n_back--;
            ran += run_op(st, record, st->back[n_back].stage, st->back[n_back].op);
        }
    }
    return ran;
}

/* 3. The cool-downs: stage s's ops k >= 2M - warmup, backwards of micro-batch k - M, whose
 * inputs are the next stage's same op (in its cool-down, or part 2) and their own stage's
 * previous op (likewise), and which no op of parts 1 and 2 waits for: by diagonals
 * e = S - 1 - s + k. */
SIM_INLINE int64_t run_cooldowns(struct sim_state *st, int record)
{
    int S = st->S, M = st->M, w0 = st->warmup[0];
    int64_t ran = 0;
    for (int e = 2 * M - w0; e < 2 * M + S - 1; e++)
        for (int s = max_int(0, 2 * M - w0 - e + S - 1); s <= sim_min_int(S - 1, 2 * M - e + S - 2);
             s++) {
            int k = e - (S - 1 - s);
            if (k >= 2 * M - st->warmup[s])
                ran += run_op(st, record, s, k);
        }
    return ran;
}

SIM_INLINE int64_t run_all(struct sim_state *st, int record)
{
    return run_warmups(st, record) + run_steady(st, record) + run_cooldowns(st, record);
}

static int host_lanes_alloc(struct sim_state *st)
{
    for (int s = 0; s < st->S; s++) {
        int n = st->stages[s].n_layers;
        if (n == 0)
            continue;
        st->host[s].op_start = malloc((size_t)2 * st->M * n * sizeof(double));
        st->host[s].out_end = calloc((size_t)st->M * n, sizeof(double));
        st->host[s].bwd_end = calloc((size_t)n, sizeof(double));
        st->host[s].gout_end = malloc((size_t)n * sizeof(double));
        if (!st->host[s].op_start || !st->host[s].out_end || !st->host[s].bwd_end ||
            !st->host[s].gout_end)
            return ERR_FAIL;
        for (int l = 0; l < n; l++)
            st->host[s].gout_end[l] = -1;
    }
    return ERR_OK;
}

/* Tasks a step records: 6 per cell (F, R, B, W and two sends) and each stage's optimizer
 * step, and per layer of a stage run layer by layer its copies (streamed weights: 4 more a
 * micro-batch), its backward's recompute and backward slices and its host step. */
static size_t task_capacity(int S, int M, const struct sim_stage *stages)
{
    size_t n = (size_t)S * (size_t)M * 6 + (size_t)S;
    for (int s = 0; s < S; s++)
        n += ((size_t)M * 8 + 3) * (size_t)stages[s].n_layers + (size_t)stages[s].n_buckets;
    return n;
}

void sim_result_free(struct sim_result *r)
{
    free(r->busy_ms);
    free(r->idle_ms);
    free(r->copy_out_ms);
    free(r->copy_in_ms);
    free(r->stall_ms);
    free(r->update_ms);
    free(r->tail_ms);
    free(r->tasks);
    memset(r, 0, sizeof *r);
}

/* The per-call arrays of a simulation, carved from one allocation: per stage its host lanes
 * (zeroed: nothing on them yet), warm-up, free time, link times and send time, a round's
 * backwards, and the S x M arrivals unless `marks` has them. Returns the allocation (NULL:
 * out of memory). */
static void *state_alloc(struct sim_state *st, struct sim_marks *marks)
{
    size_t S = (size_t)st->S, cells = S * (size_t)st->M;
    size_t doubles = 6 * S + (marks ? 0 : 2 * cells);
    struct host_lanes *h = malloc(S * sizeof *h + doubles * sizeof(double) +
                                  S * (sizeof(struct stage_op) + sizeof(int)));
    if (h == NULL)
        return NULL;
    memset(h, 0, S * sizeof *h);
    st->host = h;
    double *d = (double *)(h + S);
    st->free_ms = d;
    st->link_fwd = d + S;
    st->link_bwd = d + 2 * S;
    st->transfer_ms = d + 3 * S;
    st->fwd_sent = d + 4 * S;
    st->bwd_sent = d + 5 * S;
    st->fwd_in = marks ? marks->fwd_in : d + 6 * S;
    st->bwd_in = marks ? marks->bwd_in : d + 6 * S + cells;
    st->back = (struct stage_op *)(d + doubles);
    st->warmup = (int *)(st->back + S);
    return h;
}

/* Nothing has run and nothing has arrived but stage 0's inputs. */
static void state_init(struct sim_state *st, enum schedule schedule)
{
    int S = st->S, M = st->M;
    for (int s = 0; s < S; s++) {
        const struct sim_stage *c = &st->stages[s];
        st->free_ms[s] = st->link_fwd[s] = st->link_bwd[s] = 0;
        st->fwd_sent[s] = st->bwd_sent[s] = 0;
        st->transfer_ms[s] = link_transfer_ms(&c->link, c->out_bytes);
        st->warmup[s] = schedule_warmup(schedule, S, s, M);
    }
    /* all bits set: a NaN, and memset is the fastest fill */
    memset(st->fwd_in, 0xff, (size_t)S * M * sizeof *st->fwd_in);
    memset(st->bwd_in, 0xff, (size_t)S * M * sizeof *st->bwd_in);
    for (int m = 0; m < M; m++) {
        st->fwd_in[m] = 0; /* stage 0's inputs are at hand */
        st->bwd_in[(size_t)(S - 1) * M + m] = 0; /* the last stage's own forward came first */
    }
}

/* The simulation proper: out->iteration_ms, and the tasks and busy times when out has
 * arrays for them (NULL: the makespan alone, for searches over many candidates); every
 * arrival and end time in `marks` when given. */
static int walk(enum schedule schedule, int S, int M, const struct sim_stage *stages,
                struct sim_result *out, struct sim_marks *marks, struct err *e)
{
    struct sim_state st = {
        .S = S,
        .M = M,
        .stages = stages,
        .fwd_end = marks ? marks->fwd_end : NULL,
        .bwd_end = marks ? marks->bwd_end : NULL,
        .out = out,
    };
    void *arrays = state_alloc(&st, marks);
    int rc = ERR_OK;
    if (!arrays || host_lanes_alloc(&st)) {
        rc = err_set(e, ERR_FAIL, "out of memory simulating %d stages x %d micro-batches", S, M);
        goto done;
    }
    state_init(&st, schedule);
    int64_t ran = out->tasks != NULL ? run_all(&st, 1) : run_all(&st, 0);
    if (ran != 2 * (int64_t)S * M) {
        rc = err_set(e, ERR_FAIL, "simulation: %lld of %lld operations found their input there",
                     (long long)ran, 2 * (long long)S * M);
        goto done;
    }
    /* After each stage's last backward: the gradients' all-reduce over the data-parallel
     * replicas, then the optimizer step, on the stage's own clock and host lanes, which no
     * other stage's op reads. */
    out->iteration_ms = 0;
    for (int s = 0; s < S; s++) {
        st.free_ms[s] = sim_optimizer_step(&st, s, reduced(&st, s, st.free_ms[s]));
        if (st.free_ms[s] > out->iteration_ms)
            out->iteration_ms = st.free_ms[s];
    }
done:
    for (int s = 0; arrays != NULL && s < S; s++) {
        free(st.host[s].op_start);
        free(st.host[s].out_end);
        free(st.host[s].bwd_end);
        free(st.host[s].gout_end);
    }
    free(arrays);
    return rc;
}

/* 1F1B and GPipe on the walk above, every other schedule pass by pass (marks: the walk's). */
static int simulate(const struct schedule_shape *sh, const struct sim_stage *stages,
                    struct sim_result *out, struct sim_marks *marks, struct err *e)
{
    if ((sh->kind == SCHEDULE_1F1B || sh->kind == SCHEDULE_GPIPE) && sh->chunks == 1)
        return walk(sh->kind, sh->gpus, sh->micro_batches, stages, out, marks, e);
    return sim_passes(sh, stages, out, e);
}

/* Each stage's idle time is its GPU's (what none of the GPU's stages keeps busy), and the
 * bubble the GPUs' idle share of the step. */
static void idle_times(const struct schedule_shape *sh, struct sim_result *out)
{
    double idle = 0;
    for (int g = 0; g < sh->gpus; g++) {
        double busy = 0;
        for (int c = 0; c < sh->chunks; c++)
            busy += out->busy_ms[schedule_vstage(sh, g, c)];
        for (int c = 0; c < sh->chunks; c++)
            out->idle_ms[schedule_vstage(sh, g, c)] = out->iteration_ms - busy;
        idle += out->iteration_ms - busy;
    }
    out->bubble_fraction = out->iteration_ms > 0 ? idle / (sh->gpus * out->iteration_ms) : 0;
}

static int check_shape(const struct schedule_shape *sh, const struct sim_stage *stages,
                       struct err *e)
{
    int S = schedule_virtual_stages(sh);
    if (schedule_check(sh, e) || check_input(S, sh->micro_batches, stages, e))
        return e->code;
    for (int s = 0; s < S && !schedule_splits(sh->kind); s++)
        if (stages[s].w_ms > 0)
            return err_set(e, ERR_INPUT, "simulate: stage %d has a weight pass of %g ms, but "
                           "schedule %s does not split the backward", s, stages[s].w_ms,
                           schedule_name(sh->kind));
    return ERR_OK;
}

int sim_run(enum schedule schedule, int S, int M, const struct sim_stage *stages,
            struct sim_result *out, struct err *e)
{
    struct schedule_shape sh = schedule_shape_of(schedule, S, 1, M);
    return sim_run_shape(&sh, stages, out, e);
}

int sim_run_shape(const struct schedule_shape *sh, const struct sim_stage *stages,
                  struct sim_result *out, struct err *e)
{
    int S = schedule_virtual_stages(sh), M = sh->micro_batches;
    memset(out, 0, sizeof *out);
    if (check_shape(sh, stages, e))
        return e->code;
    out->n_stages = S;
    out->busy_ms = calloc((size_t)S, sizeof *out->busy_ms);
    out->idle_ms = calloc((size_t)S, sizeof *out->idle_ms);
    out->copy_out_ms = calloc((size_t)S, sizeof *out->copy_out_ms);
    out->copy_in_ms = calloc((size_t)S, sizeof *out->copy_in_ms);
    out->stall_ms = calloc((size_t)S, sizeof *out->stall_ms);
    out->update_ms = calloc((size_t)S, sizeof *out->update_ms);
    out->tail_ms = calloc((size_t)S, sizeof *out->tail_ms);
    out->tasks = malloc(task_capacity(S, M, stages) * sizeof *out->tasks);
    if (!out->busy_ms || !out->idle_ms || !out->copy_out_ms || !out->copy_in_ms ||
        !out->stall_ms || !out->update_ms || !out->tail_ms || !out->tasks) {
        sim_result_free(out);
        return err_set(e, ERR_FAIL, "out of memory simulating %d stages x %d micro-batches", S,
                       M);
    }
    int rc = simulate(sh, stages, out, NULL, e);
    if (rc) {
        sim_result_free(out);
        return rc;
    }
    idle_times(sh, out);
    return ERR_OK;
}

/* sim_makespan on input already checked */
static int makespan(const struct schedule_shape *sh, const struct sim_stage *stages,
                    double *iteration_ms, struct err *e)
{
    struct sim_result r = {0};
    if (simulate(sh, stages, &r, NULL, e))
        return e->code;
    *iteration_ms = r.iteration_ms;
    return ERR_OK;
}

int sim_makespan(enum schedule schedule, int S, int M, const struct sim_stage *stages,
                 double *iteration_ms, struct err *e)
{
    struct schedule_shape sh = schedule_shape_of(schedule, S, 1, M);
    return sim_makespan_shape(&sh, stages, iteration_ms, e);
}

int sim_makespan_shape(const struct schedule_shape *sh, const struct sim_stage *stages,
                       double *iteration_ms, struct err *e)
{
    if (check_shape(sh, stages, e))
        return e->code;
    return makespan(sh, stages, iteration_ms, e);
}

/* Most micro-batches in a period of the steady state that sim_makespan_periodic looks for
 * (1F1B's often repeats every second micro-batch), and a multiple of every period up to it. */
#define SIM_PERIOD_MAX 6
#define SIM_PERIODS_LCM 60

/* Whether every time of micro-batches j+1 .. j+S+1 (each stage's forward and backward end, each
 * activation and gradient arrival) is that of micro-batch p before plus one shift `shift`
 * (within rounding); stage 0's inputs and the last stage's gradients are all at hand at 0 and
 * never bind past it, so they are left out. */
static int periodic(const struct sim_marks *mk, int S, int M, int j, int p, double *shift)
{
    double lam = mk->fwd_end[j + 1] - mk->fwd_end[j + 1 - p];
    for (int n = j + 1; n <= j + S + 1; n++)
        for (int s = 0; s < S; s++) {
            size_t a = (size_t)s * M + n;
            double now[4] = {mk->fwd_end[a], mk->bwd_end[a], mk->fwd_in[a], mk->bwd_in[a]};
            double then[4] = {mk->fwd_end[a - p], mk->bwd_end[a - p], mk->fwd_in[a - p],
                              mk->bwd_in[a - p]};
            int kept[4] = {1, 1, s > 0, s + 1 < S};
            for (int q = 0; q < 4; q++)
                if (kept[q] && fabs(now[q] - then[q] - lam) > 1e-11 * (1 + fabs(now[q])))
                    return 0;
        }
    *shift = lam;
    return 1;
}

/* Simulates M' micro-batches (M - M' a multiple of every period looked for) and, when
 * micro-batches j+1 .. j+S+1, j = M' - 2S - 2, repeat with a period p: those are all in every
 * stage's steady state (past the warm-up's forwards, before the cool-down's backwards), each
 * time there is a max of times at most S + 1 micro-batches before or after plus fixed task
 * times, so the same shift holds for every later steady-state time by induction, and M
 * micro-batches' cool-down is M''s shifted by (M - M') / p periods. */
static int extrapolate(enum schedule schedule, int S, int Mp, int M,
                       const struct sim_stage *stages, double *ms, int *found, struct err *e)
{
    size_t cells = (size_t)S * Mp;
    struct sim_marks mk = {malloc(cells * sizeof(double)), malloc(cells * sizeof(double)),
                           malloc(cells * sizeof(double)), malloc(cells * sizeof(double))};
    struct sim_result r = {0};
    double shift;
    *found = 0;
    if (!mk.fwd_in || !mk.bwd_in || !mk.fwd_end || !mk.bwd_end) {
        err_set(e, ERR_FAIL, "out of memory simulating %d stages x %d micro-batches", S, Mp);
    } else if (walk(schedule, S, Mp, stages, &r, &mk, e) == ERR_OK) {
        for (int p = 1; p <= SIM_PERIOD_MAX && !*found; p++)
            if (periodic(&mk, S, Mp, Mp - 2 * S - 2, p, &shift)) {
                *ms = r.iteration_ms + (double)((M - Mp) / p) * shift;
                *found = 1;
            }
    }
    free(mk.fwd_in);
    free(mk.bwd_in);
    free(mk.fwd_end);
    free(mk.bwd_end);
    return e->code;
}

int sim_makespan_periodic(enum schedule schedule, int S, int M, const struct sim_stage *stages,
                          double *iteration_ms, int *simulated, struct err *e)
{
    struct schedule_shape shape = schedule_shape_of(schedule, S, 1, M);
    if (check_shape(&shape, stages, e))
        return e->code;
    /* A stage run layer by layer keeps no marks of its ends (and its host lanes' times are
     * not among those compared): such a pipeline is simulated whole. */
    int layered = 0;
    for (int s = 0; s < S; s++)
        layered |= stages[s].n_layers > 0;
    /* j - p >= S: the compared micro-batches are past every warm-up */
    for (int base = 3 * S + 2 + SIM_PERIOD_MAX; schedule == SCHEDULE_1F1B && !layered;
         base *= 2) {
        int Mp = base + ((M - base) % SIM_PERIODS_LCM + SIM_PERIODS_LCM) % SIM_PERIODS_LCM, found;
        if (Mp >= M / 2)
            break;
        if (extrapolate(schedule, S, Mp, M, stages, iteration_ms, &found, e))
            return e->code;
        if (found) {
            *simulated = Mp;
            return ERR_OK;
        }
    }
    *simulated = M;
    struct schedule_shape sh = schedule_shape_of(schedule, S, 1, M);
    return makespan(&sh, stages, iteration_ms, e);
}

void sim_stage_from_plan(const struct plan_stage *ps, struct sim_stage *out)
{
    int n = plan_stage_layer_count(ps);
    *out = (struct sim_stage){
        .out_bytes = ps->layers[n - 1].out_bytes,
        .out_fwd_ms = ps->layers[n - 1].fwd_ms,
        .link = ps->link,
        .allreduce_ms = cost_dp_allreduce_ms(&ps->dp_link, ps->dp, ps->allreduce_bytes),
    };
    for (int l = 0; l < n; l++) {
        const struct layer_cost *c = &ps->layers[l];
        struct cost_row r = plan_stage_row(ps, l);
        out->fwd_ms += c->fwd_ms;
        out->bwd_ms += c->bwd_ms - r.wgrad_ms;
        out->w_ms += r.wgrad_ms;
        out->recompute_ms += r.recompute_ms;
    }
    if (ps->optimizer == COST_PLACE_DEVICE)
        sim_stage_optimizer(ps->layers, n, COST_PLACE_DEVICE, &ps->host_link, out, NULL);
}

void sim_stage_optimizer(const struct layer_cost *layers, int n, enum cost_place optimizer,
                         const struct link *host_link, struct sim_stage *st,
                         struct sim_layer *sl)
{
    sim_stage_optimizer_from(layers, n, optimizer, 0, host_link, st, sl);
}

/* A ZeRO-1 replica's share of a layer's bytes (cost.h optimizer_shards). */
static int64_t share(int64_t bytes, int shards)
{
    return shards > 1 ? (bytes + shards - 1) / shards : bytes;
}

void sim_stage_optimizer_from(const struct layer_cost *layers, int n, enum cost_place optimizer,
                              int from, const struct link *host_link, struct sim_stage *st,
                              struct sim_layer *sl)
{
    int host = optimizer == COST_PLACE_HOST;
    st->optimizer_ms = 0;
    st->host_optimizer = host;
    st->host_from = host ? from : 0;
    for (int l = 0; l < (host ? from : n); l++)
        st->optimizer_ms += layers[l].optimizer_ms;
    if (!host)
        return;
    for (int l = from; l < n; l++) {
        int shards = layers[l].optimizer_shards;
        sl[l].grad_ms = link_transfer_ms(host_link, share(layers[l].grad_bytes, shards));
        sl[l].update_ms = layers[l].host_optimizer_ms;
        sl[l].param_ms = link_transfer_ms(host_link, share(layers[l].param_bytes, shards));
    }
    st->n_layers = n;
    st->layers = sl;
}

void sim_layer_stream(struct sim_layer *y, const struct layer_cost *c,
                      const struct link *host_link)
{
    y->stream = 1;
    y->stream_w_ms = link_transfer_ms(host_link, c->param_bytes);
    y->stream_g_ms = link_transfer_ms(host_link, c->grad_bytes);
}

int sim_layers_from_plan(const struct plan_stage *ps, struct sim_layer *layers)
{
    if (!plan_stage_offloads(ps) && ps->optimizer != COST_PLACE_HOST)
        return 0;
    int n = plan_stage_layer_count(ps);
    for (int l = 0; l < n; l++) {
        const struct layer_cost *c = &ps->layers[l];
        struct cost_row r = plan_stage_row(ps, l);
        layers[l] = (struct sim_layer){
            .fwd_ms = c->fwd_ms,
            .bwd_ms = c->bwd_ms,
            .recompute_ms = r.recompute_ms,
            .copy_ms = r.host_bytes > 0 ? link_transfer_ms(&ps->host_link, r.host_bytes) : 0,
            .ahead = r.action.prefetch_ahead,
        };
        if (ps->actions[l].weights == COST_PLACE_HOST)
            sim_layer_stream(&layers[l], c, &ps->host_link);
    }
    return n;
}

int sim_buckets(const int64_t *grad_bytes, const double *bwd_ms, int n, int64_t cap_bytes,
                const struct link *link, int dp, struct sim_bucket *out)
{
    int count = 0;
    int64_t all = 0;
    for (int l = 0; l < n; l++)
        all += grad_bytes[l];
    if (dp <= 1 || all == 0)
        return 0;
    double below = 0; /* the plain backward of layers 0 .. l - 1 */
    for (int l = 0; l < n; l++)
        below += bwd_ms[l];
    struct sim_bucket *b = NULL;
    for (int l = n - 1; l >= 0; l--) {
        below -= bwd_ms[l];
        if (b == NULL || (cap_bytes > 0 && b->bytes >= cap_bytes)) {
            b = &out[count++];
            *b = (struct sim_bucket){.last = l};
        }
        b->bytes += grad_bytes[l];
        b->first = l;
        b->rest_ms = below > 0 ? below : 0; /* its lowest layer's gradients close it */
    }
    for (int k = 0; k < count; k++)
        out[k].allreduce_ms = cost_dp_allreduce_ms(link, dp, out[k].bytes);
    return count;
}

int sim_buckets_from_plan(const struct plan_stage *ps, struct sim_bucket *out)
{
    int n = plan_stage_layer_count(ps);
    int64_t *grad = malloc((size_t)n * sizeof *grad);
    double *bwd = malloc((size_t)n * sizeof *bwd), weight = 0, before = 0, w_ms = 0;
    int count = 0;
    if (grad != NULL && bwd != NULL) {
        for (int l = 0; l < n; l++) {
            weight += (double)(ps->layers[l].has_split ? ps->layers[l].grad_bytes
                                                       : ps->layers[l].state_bytes);
            w_ms += plan_stage_row(ps, l).wgrad_ms;
        }
        /* allreduce_bytes in proportion, rounded so that the parts add up to it */
        for (int l = 0; l < n; l++) {
            const struct layer_cost *y = &ps->layers[l];
            double upto = before + (double)(y->has_split ? y->grad_bytes : y->state_bytes);
            grad[l] = weight > 0 ? (int64_t)((double)ps->allreduce_bytes * (upto / weight)) -
                                       (int64_t)((double)ps->allreduce_bytes * (before / weight))
                                 : 0;
            before = upto;
            /* a split backward's gradients are final in its last W pass (sim_passes.c) */
            bwd[l] = w_ms > 0 ? plan_stage_row(ps, l).wgrad_ms : y->bwd_ms;
        }
        count = sim_buckets(grad, bwd, n, ps->dp_bucket_bytes, &ps->dp_link, ps->dp, out);
    }
    free(grad);
    free(bwd);
    return count;
}

/* The plan's stages as the simulator takes them: st (n_stages), their layers in pool and
 * their gradient buckets in buckets (one each per layer of the plan), the caller's to free;
 * each stage's gradient reduction allreduce_ms[s] when given, one after its last backward
 * (else its own over its dp, in its buckets). */
static int plan_stages(const struct plan *p, const double *allreduce_ms, struct sim_stage **st,
                       struct sim_layer **pool, struct sim_bucket **buckets, struct err *e)
{
    if (p->n_stages <= 0)
        return err_set(e, ERR_INPUT, "the plan has no stages to simulate");
    int layers = 0;
    for (int s = 0; s < p->n_stages; s++)
        layers += plan_stage_layer_count(&p->stages[s]);
    *st = calloc((size_t)p->n_stages, sizeof **st);
    *pool = calloc((size_t)layers, sizeof **pool);
    *buckets = calloc((size_t)layers, sizeof **buckets);
    if (*st == NULL || *pool == NULL || *buckets == NULL) {
        free(*st);
        free(*pool);
        free(*buckets);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    struct sim_layer *next = *pool;
    struct sim_bucket *bucket = *buckets;
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *ps = &p->stages[s];
        struct sim_stage *one = &(*st)[s];
        sim_stage_from_plan(ps, one);
        if (allreduce_ms != NULL) /* one reduction, over every pipeline's replicas */
            one->allreduce_ms = allreduce_ms[s];
        else
            one->n_buckets = sim_buckets_from_plan(ps, bucket);
        one->buckets = bucket;
        bucket += plan_stage_layer_count(ps);
        one->n_layers = sim_layers_from_plan(ps, next);
        one->layers = next;
        if (ps->optimizer == COST_PLACE_HOST)
            sim_stage_optimizer_from(ps->layers, one->n_layers, COST_PLACE_HOST,
                                     ps->optimizer_from, &ps->host_link, one, next);
        next += plan_stage_layer_count(ps);
    }
    return ERR_OK;
}

int sim_plan_ms(const struct plan *p, double *iteration_ms, struct err *e)
{
    struct sim_stage *st;
    struct sim_layer *pool;
    struct sim_bucket *buckets;
    if (plan_stages(p, NULL, &st, &pool, &buckets, e))
        return e->code;
    struct schedule_shape sh = plan_shape(p);
    int rc = sim_makespan_shape(&sh, st, iteration_ms, e);
    free(st);
    free(pool);
    free(buckets);
    return rc;
}

int sim_plan_reduced(const struct plan *p, const double *allreduce_ms, struct sim_result *out,
                     struct err *e)
{
    struct sim_stage *st;
    struct sim_layer *pool;
    struct sim_bucket *buckets;
    if (plan_stages(p, allreduce_ms, &st, &pool, &buckets, e))
        return e->code;
    struct schedule_shape sh = plan_shape(p);
    int rc = sim_run_shape(&sh, st, out, e);
    free(st);
    free(pool);
    free(buckets);
    return rc;
}

int sim_plan(const struct plan *p, struct sim_result *out, struct err *e)
{
    return sim_plan_reduced(p, NULL, out, e);
}
