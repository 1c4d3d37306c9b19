/* The offload part of the table a person reads: every tensor sent to the host, its free time
 * (the forward-to-backward window its copies hide in, the least over the step's
 * micro-batches in the simulated step) and why offloading it won over recomputing it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner.h"
#include "sim.h"

/* Stage s's window per layer: min over micro-batches of (its backward's start - its
 * forward's end), from the simulated tasks. */
static void windows(const struct plan *p, int s, const struct sim_result *r, double *w)
{
    const struct plan_stage *st = &p->stages[s];
    int n = plan_stage_layer_count(st), j = 0, started = 0, micro = -1;
    double begin = 0, fwd_start = 0;
    for (int l = 0; l < n; l++)
        w[l] = INFINITY;
    for (int i = 0; i < r->n_tasks; i++) {
        const struct sim_task *t = &r->tasks[i];
        if (t->stage != s || t->kind == SIM_SEND_FORWARD || t->kind == SIM_SEND_BACKWARD ||
            t->kind == SIM_COPY_OUT || t->kind == SIM_COPY_IN)
            continue;
        if (t->kind == SIM_FORWARD)
            continue;
        if (t->micro != micro) { /* a new backward: layers from the last */
            micro = t->micro, j = 0, started = 0;
            for (int k = 0; k < r->n_tasks; k++)
                if (r->tasks[k].stage == s && r->tasks[k].kind == SIM_FORWARD &&
                    r->tasks[k].micro == micro)
                    fwd_start = r->tasks[k].start_ms;
        }
        int l = n - 1 - j;
        if (!started)
            begin = t->start_ms, started = 1;
        if (t->kind != SIM_BACKWARD || l < 0)
            continue;
        double fwd_end = fwd_start;
        for (int k = 0; k <= l; k++)
            fwd_end += st->layers[k].fwd_ms;
        if (begin - fwd_end < w[l])
            w[l] = begin - fwd_end;
        j++, started = 0;
    }
}

static void print_layer(FILE *f, const struct plan_stage *st, int l, double window, double stall)
{
    const struct layer_cost *c = &st->layers[l];
    const struct layer_action *a = &st->actions[l];
    struct cost_row r = plan_stage_row(st, l);
    const char *what = a->offload_option >= 0 ? c->options[a->offload_option].name
                       : a->choice == COST_FULL ? "layer input"
                                                : "kept activations";
    double copy = link_transfer_ms(&st->host_link, r.host_bytes);
    /* the recompute that frees as much device memory: full for a whole layer, the option's
     * own for its tensors */
    double instead = a->offload_option >= 0
                         ? c->options[a->offload_option].recompute_ms
                         : c->fwd_ms - r.recompute_ms;
    fprintf(f, "%5d  %5d  %-16s %9.1f %9.3f %10.3f  ahead %d: ", st->index, st->first + l, what,
            r.host_bytes / 1048576.0, copy, window, a->prefetch_ahead);
    if (a->choice == COST_FULL)
        fprintf(f, "the layer is recomputed anyway: only the host frees its input too\n");
    else if (2 * copy <= window)
        fprintf(f, "copies (2 x %.3f ms) hide in the window; recomputing costs %.3f ms per "
                   "micro-batch\n", copy, instead);
    else
        fprintf(f, "copies stick out of the window (stage stall %.3f ms per step), still less "
                   "than recomputing at %.3f ms per micro-batch\n", stall, instead);
}

void planner_print_offload(FILE *f, const struct plan *p)
{
    int any = 0;
    for (int s = 0; s < p->n_stages; s++)
        any |= plan_stage_offloads(&p->stages[s]);
    struct sim_result r;
    struct err e;
    err_clear(&e);
    if (!any || sim_plan(p, &r, &e))
        return;
    if (strcmp(p->method, "optimal+repartition") == 0 && !p->search.present)
        fprintf(f, "split and order: --repartition's search with recompute only, then each "
                   "stage's actions with offload (no gap: the search's bound holds for recompute "
                   "only)\n");
    fprintf(f, "offloaded tensors (free ms: the least forward-to-backward window of the step)\n"
               "%5s  %5s  %-16s %9s %9s %10s\n",
            "stage", "layer", "tensor", "MiB", "copy ms", "free ms");
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        int n = plan_stage_layer_count(st);
        double *w = malloc((size_t)n * sizeof *w);
        if (w == NULL || !plan_stage_offloads(st)) {
            free(w);
            continue;
        }
        windows(p, s, &r, w);
        fprintf(f, "stage %d: host %.2f GiB of %.2f, staging %.2f GiB, copy %.3f ms each way "
                   "per micro-batch, stall %.3f ms per step\n",
                s, st->host_memory_bytes / 1073741824.0, st->host_limit_bytes / 1073741824.0,
                st->staging_bytes / 1073741824.0, st->copy_ms, r.stall_ms[s]);
        for (int l = 0; l < n; l++)
            if (layer_action_offloads(&st->actions[l]))
                print_layer(f, st, l, w[l], r.stall_ms[s]);
        free(w);
    }
    sim_result_free(&r);
}
