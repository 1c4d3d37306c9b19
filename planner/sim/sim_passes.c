/* The simulator of every schedule schedule.h knows, pass by pass (sim.h): each GPU runs its
 * program of schedule_ops in order, each pass as soon as the GPU is free and its input has
 * arrived. Forwards of virtual stage j wait for j-1's activation, B passes for j+1's
 * gradient (the last stage's for its own forward, earlier in its program), W passes follow
 * their B on the same GPU. A transfer between virtual stages on one GPU (the turn of a V) is
 * free; between two GPUs it goes over the link lane from the one to the other, one transfer at
 * a time in the order the sender made them (a lane has one sender), so chunks that cross the
 * same pair of GPUs share it. Sends block their sender as in sim.c: a virtual stage's forward
 * ends no sooner than its previous forward's send plus its last layer, and its B pass starts
 * no sooner than its previous B pass's send has ended (each chunk has its own workspace,
 * runtime/layout.c). A GPU's gradient buckets (sim_buckets, of each of its chunks) go over its
 * dp link one at a time in the order they are ready: a bucket rest_ms before its chunk's last
 * pass that finalizes gradients ends (its last B, or W where the backward splits: rest_ms then
 * counts the weight passes of the layers below it). As in sim.c the makespan is the longest
 * path through a fixed graph. 1F1B and GPipe run the same graph on sim.c's faster walk. */
#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct passes {
    const struct schedule_shape *sh;
    const struct sim_stage *stages;
    struct sim_result *out;
    int V, M, n_ops;
    struct schedule_op *ops; /* p x n_ops */
    int *next;               /* per GPU: its next op */
    double *free_ms;         /* per GPU */
    double *fwd_in, *bwd_in; /* V x M: arrivals (NaN: not yet) */
    double *lane_free;       /* per lane (lane_of) */
    double *fwd_sent, *bwd_sent; /* per virtual stage: when its last F's (B's) send ended */
    double *grads_end;           /* per virtual stage: when its last B or W pass ended */
    int *gpu;                    /* per virtual stage */
};

/* The lane from GPU a to GPU b (a != b): up a -> a+1, down b+1 -> b, and the interleaved
 * wrap both ways; with two GPUs the wrap is the one link. */
static int lane_of(int p, int a, int b)
{
    if (b == a + 1)
        return a;
    if (b == a - 1)
        return p - 1 + b;
    return a == p - 1 ? 2 * p - 2 : 2 * p - 1; /* p-1 -> 0, 0 -> p-1 */
}

static void record(struct passes *ps, int stage, int micro, enum sim_kind kind, double t0,
                   double t1)
{
    struct sim_result *r = ps->out;
    if (r->tasks != NULL)
        r->tasks[r->n_tasks++] = (struct sim_task){stage, micro, kind, t0, t1};
}

/* Virtual stage j's output (forward) or input gradient (backward) of micro-batch m, made at
 * `ready`, arriving at its neighbour: returns the arrival. */
static double transfer(struct passes *ps, int j, int m, int backward, double ready)
{
    int to = backward ? j - 1 : j + 1, k = backward ? j - 1 : j; /* the boundary */
    int a = ps->gpu[j], b = ps->gpu[to];
    if (a == b)
        return ready;
    double *lane = &ps->lane_free[lane_of(ps->sh->gpus, a, b)];
    double start = ready > *lane ? ready : *lane;
    double end = start + link_transfer_ms(&ps->stages[k].link, ps->stages[k].out_bytes);
    *lane = end;
    if (ps->stages[k].link.present)
        record(ps, k, m, backward ? SIM_SEND_BACKWARD : SIM_SEND_FORWARD, start, end);
    return end;
}

/* Runs GPU g's next op if its input is there; returns 1 if it ran. */
static int run_next(struct passes *ps, int g)
{
    const struct schedule_op *op = &ps->ops[(size_t)g * ps->n_ops + ps->next[g]];
    int j = schedule_vstage(ps->sh, g, op->chunk), m = op->micro;
    const struct sim_stage *c = &ps->stages[j];
    size_t at = (size_t)j * ps->M + m;
    double ready = op->pass == SCHEDULE_F   ? ps->fwd_in[at]
                   : op->pass == SCHEDULE_B ? ps->bwd_in[at]
                                            : 0;
    if (isnan(ready))
        return 0;
    double start = ready > ps->free_ms[g] ? ready : ps->free_ms[g], end;
    if (op->pass == SCHEDULE_F) {
        double last = ps->fwd_sent[j] + c->out_fwd_ms; /* its output's buffer is free */
        end = start + c->fwd_ms > last ? start + c->fwd_ms : last;
        record(ps, j, m, SIM_FORWARD, start, end);
        if (j + 1 < ps->V)
            ps->fwd_sent[j] = ps->fwd_in[at + ps->M] = transfer(ps, j, m, 0, end);
        else
            ps->bwd_in[at] = end; /* the loss */
    } else if (op->pass == SCHEDULE_B) {
        start = start > ps->bwd_sent[j] ? start : ps->bwd_sent[j];
        double mid = start + c->recompute_ms;
        end = mid + c->bwd_ms;
        if (c->recompute_ms > 0)
            record(ps, j, m, SIM_RECOMPUTE, start, mid);
        record(ps, j, m, SIM_BACKWARD, mid, end);
        if (j > 0)
            ps->bwd_sent[j] = ps->bwd_in[at - ps->M] = transfer(ps, j, m, 1, end);
        ps->grads_end[j] = end > ps->grads_end[j] ? end : ps->grads_end[j];
    } else {
        end = start + c->w_ms;
        record(ps, j, m, SIM_WEIGHT, start, end);
        ps->grads_end[j] = end > ps->grads_end[j] ? end : ps->grads_end[j];
    }
    if (ps->out->busy_ms != NULL)
        ps->out->busy_ms[j] += end - start;
    ps->free_ms[g] = end;
    ps->next[g]++;
    return 1;
}

/* GPU g's gradient buckets over its dp link, each once ready, the readiest first (sim.h);
 * returns when the last has been reduced (`end`, the GPU's last pass, when it has none). */
static double buckets_end(struct passes *ps, int g, double end)
{
    int next[SCHEDULE_CHUNKS_MAX] = {0};
    double link = 0;
    for (;;) {
        int pick = -1;
        double ready = 0;
        for (int c = 0; c < ps->sh->chunks; c++) {
            int j = schedule_vstage(ps->sh, g, c);
            const struct sim_stage *st = &ps->stages[j];
            if (next[c] >= st->n_buckets)
                continue;
            double at = ps->grads_end[j] - st->buckets[next[c]].rest_ms;
            if (pick < 0 || at < ready) {
                pick = c;
                ready = at;
            }
        }
        if (pick < 0)
            return link > end ? link : end;
        int j = schedule_vstage(ps->sh, g, pick);
        double start = ready > link ? ready : link;
        link = start + ps->stages[j].buckets[next[pick]].allreduce_ms;
        record(ps, j, next[pick]++, SIM_ALLREDUCE, start, link);
    }
}

/* After each GPU's last pass: its chunks' gradient all-reduces (in buckets, or whole one
 * after the other), then their optimizer steps, one after the other on the GPU. */
static double step_end(struct passes *ps, int g)
{
    double t = buckets_end(ps, g, ps->free_ms[g]);
    for (int c = 0; c < ps->sh->chunks; c++) {
        const struct sim_stage *st = &ps->stages[schedule_vstage(ps->sh, g, c)];
        t += st->n_buckets > 0 ? 0 : st->allreduce_ms;
    }
    for (int c = 0; c < ps->sh->chunks; c++) {
        int j = schedule_vstage(ps->sh, g, c);
        double opt = ps->stages[j].optimizer_ms;
        if (opt > 0) {
            record(ps, j, -1, SIM_OPTIMIZER, t, t + opt);
            if (ps->out->update_ms != NULL)
                ps->out->update_ms[j] += opt;
        }
        if (ps->out->tail_ms != NULL)
            ps->out->tail_ms[j] = t + opt - ps->free_ms[g];
        t += opt;
    }
    return t;
}

static int run_passes(struct passes *ps, struct err *e)
{
    int p = ps->sh->gpus;
    int64_t ran = 0, total = (int64_t)p * ps->n_ops;
    for (int progress = 1; progress && ran < total;) {
        progress = 0;
        for (int g = 0; g < p; g++)
            while (ps->next[g] < ps->n_ops && run_next(ps, g)) {
                progress = 1;
                ran++;
            }
    }
    if (ran != total)
        return err_set(e, ERR_FAIL, "simulation: %lld of %lld passes found their input there",
                       (long long)ran, (long long)total);
    ps->out->iteration_ms = 0;
    for (int g = 0; g < p; g++) {
        double t = step_end(ps, g);
        if (t > ps->out->iteration_ms)
            ps->out->iteration_ms = t;
    }
    return ERR_OK;
}

int sim_passes(const struct schedule_shape *sh, const struct sim_stage *stages,
               struct sim_result *out, struct err *e)
{
    int p = sh->gpus, V = schedule_virtual_stages(sh), M = sh->micro_batches;
    for (int j = 0; j < V; j++)
        if (stages[j].n_layers > 0)
            return err_set(e, ERR_INPUT, "simulate: stage %d offloads or steps its optimizer (or "
                           "a fraction of it) on the host, which schedule %s does not run (1f1b "
                           "and gpipe do)", j,
                           schedule_name(sh->kind));
    struct passes ps = {.sh = sh, .stages = stages, .out = out, .V = V, .M = M,
                        .n_ops = schedule_op_count(sh)};
    size_t cells = (size_t)V * M;
    ps.ops = malloc((size_t)p * ps.n_ops * sizeof *ps.ops);
    ps.next = calloc((size_t)p + (size_t)V, sizeof(int));
    ps.free_ms = calloc((size_t)p + 2 * (size_t)p + 2 * cells + 3 * (size_t)V, sizeof(double));
    int rc = ERR_OK;
    if (!ps.ops || !ps.next || !ps.free_ms) {
        rc = err_set(e, ERR_FAIL, "out of memory simulating %d GPUs x %d micro-batches", p, M);
        goto done;
    }
    ps.gpu = ps.next + p;
    ps.lane_free = ps.free_ms + p;
    ps.fwd_in = ps.lane_free + 2 * (size_t)p;
    ps.bwd_in = ps.fwd_in + cells;
    ps.fwd_sent = ps.bwd_in + cells; /* 0: nothing sent yet */
    ps.bwd_sent = ps.fwd_sent + V;
    ps.grads_end = ps.bwd_sent + V;
    for (int j = 0; j < V; j++) {
        int chunk;
        ps.gpu[j] = schedule_gpu(sh, j, &chunk);
    }
    memset(ps.fwd_in, 0xff, 2 * cells * sizeof(double)); /* NaN: nothing has arrived */
    for (int m = 0; m < M; m++)
        ps.fwd_in[m] = 0; /* the first stage's inputs are at hand */
    if ((rc = schedule_all_ops(sh, ps.ops, e)) == ERR_OK)
        rc = run_passes(&ps, e);
done:
    free(ps.ops);
    free(ps.next);
    free(ps.free_ms);
    return rc;
}
