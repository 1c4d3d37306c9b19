/* fp16 beside bf16 in the bench (issue 25): what the GPUs without bf16 tensor cores (V100, T4)
 * contribute to a plan, and the table that sets each bf16 case beside its fp16 twin. */
#include <math.h>
#include <string.h>

#include "bench.h"
#include "estimate.h"
#include "model_ops.h"

/* Whether the table knows `name` as a device without bf16 tensor cores. */
static int older(const struct device_table *t, const char *name)
{
    const struct device_spec *d = devices_find(t, name);
    return d != NULL && !d->bf16_tensor;
}

int bench_older_count(const struct cluster *c, const struct device_table *t)
{
    int n = 0;
    for (int s = 0; s < c->n_stages; s++)
        n += older(t, c->stages[s].device);
    return n;
}

/* The model's FLOPs (forward and backward, one micro-batch) of layers first..last; the number
 * of blocks among them into *blocks. */
static double layers_flops(const struct model *m, int first, int last, int *blocks)
{
    double sum = 0;
    *blocks = 0;
    for (int l = first; l <= last; l++) {
        double f, b;
        estimate_layer_flops(m, l, &f, &b);
        sum += f + b;
        *blocks += model_layer_kind(m, l) == MODEL_LAYER_BLOCK;
    }
    return sum;
}

void bench_older_fill(const struct plan *p, const struct sim_result *sim,
                      const struct device_table *t, struct bench_result *r)
{
    double all = 0, mine = 0, busy = 0;
    int n_older = 0;
    r->older_work = r->older_busy = NAN;
    r->blockless = 0;
    if (model_ops_of(&p->model) == NULL) /* a custom model: no FLOPs, no blocks */
        return;
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        int blocks;
        double flops = layers_flops(&p->model, st->first, st->last, &blocks);
        all += flops;
        r->blockless += blocks == 0 ? st->tp * st->dp : 0;
        if (!older(t, st->device))
            continue;
        mine += flops;
        busy += sim->busy_ms[s] / sim->iteration_ms;
        n_older++;
    }
    if (n_older > 0) {
        r->older_work = mine / all;
        r->older_busy = busy / n_older;
    }
}

int bench_fp16_twin(const struct model *m, const struct model *listed, int n_listed,
                    struct model *twin)
{
    if (m->dtype != MODEL_DTYPE_BF16 || model_ops_of(m) == NULL)
        return 0;
    *twin = *m;
    twin->dtype = MODEL_DTYPE_FP16;
    for (int j = 0; j < n_listed; j++)
        if (model_equal(&listed[j], twin))
            return 0; /* benched in fp16 already, as listed */
    return 1;
}

static void md_share(FILE *f, double bf16, double fp16)
{
    if (isnan(bf16) || isnan(fp16))
        fprintf(f, " - |");
    else
        fprintf(f, " %.0f%% -> %.0f%% |", 100 * bf16, 100 * fp16);
}

void bench_write_fp16_md(FILE *f, const struct bench_case *cases, int n)
{
    int rows = 0;
    for (int i = 1; i < n; i++)
        rows += cases[i].fp16_twin;
    if (rows == 0)
        return;
    fprintf(f, "\n## fp16 beside bf16 on GPUs without bf16 tensor cores\n\n"
               "Each bf16 model on a cluster holding GPUs without bf16 tensor cores "
               "(configs/devices.json `\"bf16_tensor\": false`: V100, T4; \"older\" below) is "
               "benched again in fp16 (`-fp16`), its GEMMs at the fp16 tensor peak "
               "(`peak_tflops_fp16`) where bf16's run at the fp32 peak. For optimal+repartition's "
               "plan: the step, the older GPUs' share of the step's work (the model's forward "
               "and backward FLOPs on their stages), their mean busy share of the simulated step, "
               "and the GPUs given no block (the embedding or head alone), bf16 -> fp16.\n\n"
               "| cluster | model | older GPUs | bf16 ms | fp16 ms | fp16 speed-up | older GPUs' "
               "work | older GPUs busy | GPUs without a block |\n"
               "|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 1; i < n; i++) {
        const struct bench_case *k = &cases[i], *b = &cases[i - 1];
        if (!k->fp16_twin)
            continue;
        const struct bench_result *x = &b->method[BENCH_REPARTITION],
                                  *y = &k->method[BENCH_REPARTITION];
        fprintf(f, "| %s | %s | %d |", b->cluster, b->model, k->n_older);
        int both = b->runnable && k->runnable && x->fits && y->fits;
        if (!both) {
            fprintf(f, " %s | %s | - | - | - | - |\n", b->runnable && x->fits ? "" : "does not fit",
                    k->runnable && y->fits ? "" : "does not fit");
            continue;
        }
        fprintf(f, " %.1f | %.1f | %.2fx |", x->iteration_ms, y->iteration_ms,
                x->iteration_ms / y->iteration_ms);
        md_share(f, x->older_work, y->older_work);
        md_share(f, x->older_busy, y->older_busy);
        fprintf(f, " %d -> %d |\n", x->blockless, y->blockless);
    }
}
