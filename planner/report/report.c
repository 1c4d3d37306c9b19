#include <stdio.h>
#include <string.h>

#include "model_kind.h"
#include "model_ops.h"
#include "planner.h"

/* Memory in GiB, or in MiB, KiB or bytes for plans whose stages have less. */
struct mem_unit {
    double bytes;
    const char *name;
};

static struct mem_unit table_unit(const struct plan *p)
{
    int64_t most = 0;
    for (int s = 0; s < p->n_stages; s++)
        if (p->stages[s].memory_limit_bytes > most)
            most = p->stages[s].memory_limit_bytes;
    if (most >= ((int64_t)1 << 30))
        return (struct mem_unit){1073741824.0, "GiB"};
    if (most >= ((int64_t)1 << 20))
        return (struct mem_unit){1048576.0, "MiB"};
    if (most >= ((int64_t)1 << 10))
        return (struct mem_unit){1024.0, "KiB"};
    return (struct mem_unit){1.0, "B"};
}

/* The recomputed layers by global index, as ranges of the same choice: "1-5,7" (whole
 * layers), "9-12:attn" (an option). */
static void format_layers(const struct plan_stage *st, char *buf, size_t cap)
{
    size_t used = 0;
    int n = plan_stage_layer_count(st);
    buf[0] = '\0';
    for (int l = 0; l < n; l++) {
        int c = st->actions[l].choice;
        if (c == COST_KEEP)
            continue;
        const char *name = cost_choice_name(&st->layers[l], c);
        int end = l;
        while (end + 1 < n && st->actions[end + 1].choice != COST_KEEP &&
               strcmp(cost_choice_name(&st->layers[end + 1], st->actions[end + 1].choice),
                      name) == 0)
            end++;
        char range[32];
        if (end == l)
            snprintf(range, sizeof range, "%d", st->first + l);
        else
            snprintf(range, sizeof range, "%d-%d", st->first + l, st->first + end);
        int w = snprintf(buf + used, cap - used, "%s%s%s%s", used ? "," : "", range,
                         c == COST_FULL ? "" : ":", c == COST_FULL ? "" : name);
        if (w < 0 || (size_t)w >= cap - used) {
            snprintf(buf + (cap > 4 ? cap - 4 : 0), 4, "...");
            break;
        }
        used += (size_t)w;
        l = end;
    }
    if (used == 0)
        snprintf(buf, cap, "-");
}

/* Whether any stage streams weights. */
static int plan_streams_any(const struct plan *p)
{
    int any = 0;
    for (int s = 0; s < p->n_stages; s++)
        any |= plan_stage_streams(&p->stages[s]) > 0;
    return any;
}

/* The stages whose last layers stream their weights from host memory (absent when none). */
static void print_streams(FILE *f, const struct plan *p)
{
    int n = 0;
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        int k = plan_stage_streams(st);
        if (k > 0)
            fprintf(f, "%sstage %d layers %d-%d", n++ ? ", " : "weights streamed from the host: ",
                    s, st->last - k + 1, st->last);
    }
    if (n > 0)
        fprintf(f, " (fetched for each forward and backward, gradients sent back after each "
                   "backward)\n");
}

/* Which stages keep their optimizer on the host, and their mirrors (absent when none). */
static void print_host_optimizer(FILE *f, const struct plan *p)
{
    int n = 0;
    double mirror = 0;
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        if (st->optimizer != COST_PLACE_HOST)
            continue;
        fprintf(f, "%s%d", n++ ? ", " : "optimizer on the host: stages ", s);
        if (st->optimizer_from > 0) /* a fraction: its last layers' */
            fprintf(f, " (layers %d-%d, %.0f%%)", st->first + st->optimizer_from, st->last,
                    100 * plan_stage_optimizer_fraction(st));
        mirror += (double)cost_stage_mirror(st->layers, plan_stage_layer_count(st),
                                            st->optimizer_from);
    }
    if (n > 0)
        fprintf(f, " (%d of %d; host mirrors %.2f GiB in all, the devices keep weights and "
                   "gradients%s)\n",
                n, p->n_stages, mirror / (1 << 30),
                plan_streams_any(p) ? " but those streamed" : "");
    print_streams(f, p);
}

/* A GPU holding several chunks: which stages it runs (memory is the GPU's, in each row). */
static void print_gpus(FILE *f, const struct plan *p)
{
    if (p->virtual_stages <= 1)
        return;
    fprintf(f, "GPUs (%d chunks each; each row's memory is its GPU's):", p->virtual_stages);
    for (int g = 0; g < p->n_stages / p->virtual_stages; g++) {
        int st[SCHEDULE_CHUNKS_MAX], n = plan_gpu_stages(p, g, st);
        fprintf(f, " %d:", g);
        for (int c = 0; c < n; c++)
            fprintf(f, "%s%d", c ? "," : "", st[c]);
    }
    fprintf(f, "\n");
}

/* The plan's first line: method, schedule, batch, model. */
static void print_title(FILE *f, const struct plan *p)
{
    double params = (double)model_param_count(&p->model);
    char replicas[96] = "";
    if (p->n_stages > 0 && p->replica_micro_batches != NULL) /* dealt unevenly */
        snprintf(replicas, sizeof replicas, " the most a replica, dp %d replicas (%lld in all)",
                 p->stages[0].dp, (long long)plan_batches(p));
    else if (p->n_stages > 0 && p->stages[0].dp > 1)
        snprintf(replicas, sizeof replicas, " a replica, dp %d replicas", p->stages[0].dp);
    if (model_is_custom(&p->model))
        fprintf(f, "plan: method %s, schedule %s, %d micro-batches%s; model custom \"%s\", %d "
                   "layers\n",
                p->method, schedule_name(p->schedule), p->micro_batches, replicas, p->model.name,
                p->model.layer_count);
    else
        fprintf(f,
                "plan: method %s, schedule %s, %d micro-batches%s; model %s %d blocks, %.3g%s "
                "parameters, %s, micro-batch %d x %d tokens\n",
                p->method, schedule_name(p->schedule), p->micro_batches, replicas,
                model_kind_name(p->model.kind), p->model.n_layer,
                params >= 1e9 ? params / 1e9 : params / 1e6, params >= 1e9 ? "B" : "M",
                model_dtype_name(p->model.dtype), p->model.micro_batch, p->model.seq_len);
}

/* The table of stages: device, layers, memory before and after against the limit, what is
 * recomputed, and the times. */
static void print_stages(FILE *f, const struct plan *p)
{
    struct mem_unit u = table_unit(p);
    char head[64];
    snprintf(head, sizeof head, "memory %s: before -> after / limit", u.name);
    /* measured profiles name devices by their model ("Intel(R) Xeon(R) Processor") */
    int w = 10;
    for (int s = 0; s < p->n_stages; s++)
        w = (int)strlen(p->stages[s].device) > w ? (int)strlen(p->stages[s].device) : w;
    fprintf(f, "%5s  %-*s %3s %-9s %4s  %-38s  %-22s %10s %10s\n", "stage", w, "device", "tp",
            "layers", "v", head, "recompute", "R ms", "T ms");
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        char range[32], mem[96], rec[80];
        snprintf(range, sizeof range, "%d-%d", st->first, st->last);
        double lim = (double)st->memory_limit_bytes;
        snprintf(mem, sizeof mem, "%7.2f (%3.0f%%) -> %6.2f (%3.0f%%) / %6.2f",
                 st->memory_before_bytes / u.bytes, 100.0 * st->memory_before_bytes / lim,
                 st->memory_bytes / u.bytes, 100.0 * st->memory_bytes / lim, lim / u.bytes);
        format_layers(st, rec, sizeof rec);
        fprintf(f, "%5d  %-*s %3d %-9s %4d  %-38s  %-22s %10.3f %10.3f\n", s, w, st->device,
                st->tp > 0 ? st->tp : 1, range, st->in_flight, mem, rec, st->recompute_ms,
                st->stage_ms);
    }
}

/* How the plan was found: --min-gain's simpler plan, the search, its gap, --verify. */
static void print_search(FILE *f, const struct plan *p)
{
    if (p->fastest_ms > 0)
        fprintf(f, "min-gain %g%%: the fastest plan found steps %.3f ms (%.3f%% faster); this "
                   "one is simpler (docs/planning-choices.md)\n",
                100 * p->min_gain, p->fastest_ms, 100 * (p->iteration_ms / p->fastest_ms - 1));
    print_host_optimizer(f, p);
    if (p->search.present)
        fprintf(f, "search: %d device orders, %ld nodes, %ld splits simulated; %s\n",
                p->search.orders, p->search.nodes, p->search.splits,
                p->search.exhausted ? "searched to the end: optimal"
                                    : "stopped at the node budget (--search-nodes) or the "
                                      "time limit (--time-limit)");
    if (p->optimality_gap >= 0)
        fprintf(f, "optimality gap: %.3f%% (certified: no split and order can be faster than "
                   "%.3f ms)\n",
                100 * p->optimality_gap, p->search.present ? p->search.lower_bound
                                                          : p->iteration_ms /
                                                                (1 + p->optimality_gap));
    if (p->verify.present)
        fprintf(f, "verify: DP objective %.6f ms, GLPK %.6f ms: %s\n", p->verify.dp_objective,
                p->verify.milp_objective, p->verify.agree ? "agree" : "DISAGREE");
}

void planner_print(FILE *f, const struct plan *p)
{
    print_title(f, p);
    print_stages(f, p);
    const struct plan_stage *b = &p->stages[p->bottleneck_stage];
    const struct plan_stage *m = &p->stages[p->most_loaded_stage];
    fprintf(f, "bottleneck stage: %d (%.3f ms per micro-batch); most loaded stage: %d (%.0f%% of "
               "its limit with nothing recomputed)\n",
            b->index, b->stage_ms, m->index,
            100.0 * m->memory_before_bytes / (double)m->memory_limit_bytes);
    fprintf(f, "iteration: %.3f ms (simulated %s, %d micro-batches)\n", p->iteration_ms,
            schedule_name(p->schedule), p->micro_batches);
    print_gpus(f, p);
    print_search(f, p);
    planner_print_offload(f, p);
}
