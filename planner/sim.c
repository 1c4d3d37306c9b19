#include "sim.h"

#include <stdlib.h>
#include <string.h>

/* A stage's program: its compute operations in order. */
struct op {
    int backward; /* 0: forward, 1: recompute + backward */
    int micro;
};

static int stage_program(enum schedule schedule, int S, int M, int s, struct op *ops)
{
    int n = 0;
    if (schedule == SCHEDULE_GPIPE) {
        for (int m = 0; m < M; m++)
            ops[n++] = (struct op){0, m};
        for (int m = 0; m < M; m++)
            ops[n++] = (struct op){1, m};
        return n;
    }
    int warm = S - s - 1 < M ? S - s - 1 : M;
    int f = 0, b = 0;
    for (; f < warm; f++)
        ops[n++] = (struct op){0, f};
    while (f < M) {
        ops[n++] = (struct op){0, f++};
        ops[n++] = (struct op){1, b++};
    }
    while (b < M)
        ops[n++] = (struct op){1, b++};
    return n;
}

void sim_result_free(struct sim_result *r)
{
    free(r->busy_ms);
    free(r->idle_ms);
    free(r->tasks);
    memset(r, 0, sizeof *r);
}

int sim_run(enum schedule schedule, int S, int M, const struct sim_stage *stages,
            struct sim_result *out, struct err *e)
{
    memset(out, 0, sizeof *out);
    size_t cells = (size_t)S * (size_t)M;
    struct op *prog = malloc(cells * 2 * sizeof *prog);
    int *next = calloc((size_t)S, sizeof *next);
    double *stage_free = calloc((size_t)S, sizeof *stage_free);
    /* arrival times of forward inputs at stage s and of gradients at stage s (< 0: not yet) */
    double *fwd_in = malloc(cells * sizeof *fwd_in);
    double *bwd_in = malloc(cells * sizeof *bwd_in);
    double *link_fwd = calloc((size_t)S, sizeof *link_fwd);
    double *link_bwd = calloc((size_t)S, sizeof *link_bwd);
    out->busy_ms = calloc((size_t)S, sizeof *out->busy_ms);
    out->idle_ms = calloc((size_t)S, sizeof *out->idle_ms);
    out->tasks = malloc(cells * 5 * sizeof *out->tasks);
    out->n_stages = S;
    if (!prog || !next || !stage_free || !fwd_in || !bwd_in || !link_fwd || !link_bwd ||
        !out->busy_ms || !out->idle_ms || !out->tasks) {
        err_set(e, ERR_FAIL, "out of memory simulating %d stages x %d micro-batches", S, M);
        goto done;
    }
    for (size_t i = 0; i < cells; i++)
        fwd_in[i] = bwd_in[i] = -1;
    for (int m = 0; m < M; m++)
        fwd_in[m] = 0; /* stage 0's inputs are at hand */
    for (int s = 0; s < S; s++)
        stage_program(schedule, S, M, s, prog + (size_t)s * 2 * M);
    int done_ops = 0, total = 2 * S * M;
    while (done_ops < total) {
        int progressed = 0;
        for (int s = 0; s < S; s++) {
            while (next[s] < 2 * M) {
                struct op op = prog[(size_t)s * 2 * M + next[s]];
                size_t at = (size_t)s * M + op.micro;
                double ready;
                if (!op.backward)
                    ready = fwd_in[at];
                else if (s == S - 1)
                    ready = 0; /* its own forward came earlier in the program */
                else
                    ready = bwd_in[at];
                if (ready < 0)
                    break;
                const struct sim_stage *st = &stages[s];
                double start = ready > stage_free[s] ? ready : stage_free[s];
                if (!op.backward) {
                    double end = start + st->fwd_ms;
                    out->tasks[out->n_tasks++] = (struct sim_task){s, op.micro, SIM_FORWARD, start, end};
                    stage_free[s] = end;
                    if (s + 1 < S) {
                        double xs = end > link_fwd[s] ? end : link_fwd[s];
                        double xe = xs + link_transfer_ms(&st->link, st->out_bytes);
                        link_fwd[s] = xe;
                        if (st->link.present)
                            out->tasks[out->n_tasks++] =
                                (struct sim_task){s, op.micro, SIM_SEND_FORWARD, xs, xe};
                        fwd_in[(size_t)(s + 1) * M + op.micro] = xe;
                    }
                } else {
                    double mid = start + st->recompute_ms;
                    double end = mid + st->bwd_ms;
                    if (st->recompute_ms > 0)
                        out->tasks[out->n_tasks++] =
                            (struct sim_task){s, op.micro, SIM_RECOMPUTE, start, mid};
                    out->tasks[out->n_tasks++] = (struct sim_task){s, op.micro, SIM_BACKWARD, mid, end};
                    stage_free[s] = end;
                    if (s > 0) {
                        const struct sim_stage *prev = &stages[s - 1];
                        double xs = end > link_bwd[s - 1] ? end : link_bwd[s - 1];
                        double xe = xs + link_transfer_ms(&prev->link, prev->out_bytes);
                        link_bwd[s - 1] = xe;
                        if (prev->link.present)
                            out->tasks[out->n_tasks++] =
                                (struct sim_task){s - 1, op.micro, SIM_SEND_BACKWARD, xs, xe};
                        bwd_in[(size_t)(s - 1) * M + op.micro] = xe;
                    }
                }
                out->busy_ms[s] += !op.backward ? st->fwd_ms : st->recompute_ms + st->bwd_ms;
                next[s]++;
                done_ops++;
                progressed = 1;
            }
        }
        if (!progressed) {
            err_set(e, ERR_FAIL, "simulation deadlocked after %d of %d operations", done_ops,
                    total);
            goto done;
        }
    }
    for (int s = 0; s < S; s++)
        if (stage_free[s] > out->iteration_ms)
            out->iteration_ms = stage_free[s];
    double idle = 0;
    for (int s = 0; s < S; s++) {
        out->idle_ms[s] = out->iteration_ms - out->busy_ms[s];
        idle += out->idle_ms[s];
    }
    out->bubble_fraction = out->iteration_ms > 0 ? idle / (S * out->iteration_ms) : 0;
done:
    free(prog);
    free(next);
    free(stage_free);
    free(fwd_in);
    free(bwd_in);
    free(link_fwd);
    free(link_bwd);
    if (e->code)
        sim_result_free(out);
    return e->code;
}

int sim_plan(const struct plan *p, struct sim_result *out, struct err *e)
{
    struct sim_stage *st = calloc((size_t)p->n_stages, sizeof *st);
    if (st == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *ps = &p->stages[s];
        int n = plan_stage_layer_count(ps);
        for (int l = 0; l < n; l++) {
            st[s].fwd_ms += ps->layers[l].fwd_ms;
            st[s].bwd_ms += ps->layers[l].bwd_ms;
            if (ps->recompute[l])
                st[s].recompute_ms += ps->layers[l].fwd_ms;
        }
        st[s].out_bytes = ps->layers[n - 1].out_bytes;
        st[s].link = ps->link;
    }
    int rc = sim_run(p->schedule, p->n_stages, p->micro_batches, st, out, e);
    free(st);
    return rc;
}
