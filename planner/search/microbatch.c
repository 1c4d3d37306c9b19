/* `ballast plan --micro-batches auto`: a candidate micro-batch size's cluster. Profiles for
 * another b: estimated profiles are estimated again; measured ones keep their memory exact
 * (the size functions are linear in b) and scale their times linearly in b, which flatters
 * small b on GPUs. Either way as each GPU of its stages' group holds them (tp, dp and the
 * sharded optimizer of ZeRO-1), as cluster_load made the cluster's own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "devices.h"
#include "microbatch.h"
#include "model_ops.h"
#include "sizes.h"

/* A measured layer's bytes at the model m's micro-batch size: the size functions' for one
 * GPU, as each GPU of group g holds them when `grouped`. */
static void layer_bytes(const struct model *m, int l, int grouped, const struct cost_group *g,
                        struct layer_cost *y)
{
    struct layer_sizes s;
    sizes_layer(m, l, &s);
    y->act_bytes = s.act_bytes;
    y->ckpt_bytes = s.ckpt_bytes;
    y->out_bytes = s.out_bytes;
    y->workspace_bytes = s.workspace_bytes;
    if (!grouped)
        return;
    struct layer_cost one = *y, per_gpu;
    cost_group_layer(&one, model_layer_kind(m, l), g, &per_gpu);
    y->act_bytes = per_gpu.act_bytes;
    y->ckpt_bytes = per_gpu.ckpt_bytes;
    y->out_bytes = per_gpu.out_bytes;
    y->workspace_bytes = per_gpu.workspace_bytes;
    for (int k = 0; k < y->n_options; k++) {
        y->options[k].kept_bytes = per_gpu.options[k].kept_bytes;
        y->options[k].transient_bytes = per_gpu.options[k].transient_bytes;
    }
}

/* `to` as cluster c's profile k, `from`, would be for micro-batch size b: on each GPU of its
 * stages' group (tp, dp, ZeRO-1), as cluster_load made `from`. A measured profile's
 * recompute options keep exact bytes (the size functions) and linear times when the runtime
 * knows them; one it does not know cannot be rescaled and is left out (*dropped counts
 * them). */
static int profile_for_micro_batch(const struct cluster *c, int k, int b,
                                   const struct device_table *t, plan_estimate_fn estimate,
                                   struct profile *to, int *scaled, int *dropped, struct err *e)
{
    const struct profile *from = &c->profiles[k];
    struct model m = from->model;
    struct cost_group g;
    m.micro_batch = b;
    int grouped = cluster_profile_group(c, k, 1, &g);
    g.tensor_bytes = cost_tp_tensor_bytes(&m);
    const struct device_spec *d = devices_find(t, from->device.name);
    if (from->estimated && d != NULL) {
        if (estimate == NULL)
            return err_set(e, ERR_FAIL,
                           "micro-batch %d: the profile of %s is estimated, and no estimator "
                           "was given to make it again at that size",
                           b, from->device.name);
        if (estimate(t, d, &m, to, e))
            return e->code;
        to->device.memory_bytes = from->device.memory_bytes;
        to->tp_efficiency = from->tp_efficiency;
        if (grouped) /* one GPU's estimate, as each GPU of the group sees it */
            cluster_group_layers(to, &m, &g);
        return ERR_OK;
    }
    *scaled = 1;
    *to = *from;
    to->provenance = NULL;
    to->model = m;
    to->layers = malloc((size_t)from->n_layers * sizeof *to->layers);
    if (to->layers == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    double ratio = (double)b / from->model.micro_batch;
    for (int l = 0; l < from->n_layers; l++) {
        to->layers[l] = from->layers[l];
        to->layers[l].fwd_ms *= ratio;
        to->layers[l].bwd_ms *= ratio;
        enum model_layer_kind kind = model_layer_kind(&m, l);
        to->layers[l].n_options = 0;
        for (int k = 0; k < from->layers[l].n_options; k++) {
            struct recompute_option o = from->layers[l].options[k];
            uint32_t regen;
            if (!sizes_find_option(&m, kind, o.name, &regen)) {
                (*dropped)++;
                continue;
            }
            sizes_regen_bytes(&m, kind, regen, &o.kept_bytes, &o.transient_bytes);
            o.recompute_ms *= ratio;
            to->layers[l].options[to->layers[l].n_options++] = o;
        }
        layer_bytes(&m, l, grouped, &g, &to->layers[l]);
    }
    return ERR_OK;
}

int microbatch_cluster(const struct cluster *c, const struct device_table *t,
                       plan_estimate_fn estimate, int b, int M, struct cluster *out,
                       struct microbatch_notes *notes, struct err *e)
{
    *out = *c;
    out->micro_batches = M;
    out->model.micro_batch = b;
    out->profiles = calloc((size_t)c->n_profiles, sizeof *out->profiles);
    if (out->profiles == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int rc = model_check_sizes(&out->model, "--micro-batches auto", "model", e);
    for (int k = 0; k < c->n_profiles && rc == ERR_OK; k++)
        rc = profile_for_micro_batch(c, k, b, t, estimate, &out->profiles[k], &notes->scaled,
                                     &notes->dropped, e);
    if (rc)
        microbatch_cluster_free(out, c->n_profiles);
    return rc;
}

void microbatch_cluster_free(struct cluster *cb, int n_profiles)
{
    for (int k = 0; k < n_profiles; k++)
        profile_free(&cb->profiles[k]);
    free(cb->profiles);
    cb->profiles = NULL;
}

int microbatch_better(double ms, int64_t memory, double best_ms, int64_t best_memory)
{
    double tol = 1e-12 * (1 + best_ms);
    return ms < best_ms - tol || (ms <= best_ms + tol && memory < best_memory);
}

void microbatch_report_head(FILE *report, int global_batch, int dp)
{
    if (report == NULL)
        return;
    fprintf(report, "micro-batches for a global batch of %d samples", global_batch);
    if (dp > 1)
        fprintf(report, " (%d per replica, %d replicas)", global_batch / dp, dp);
    fprintf(report, ":\n%12s %8s %14s %s\n", "micro-batch", "count", "iteration ms", "");
}

void microbatch_report_row(FILE *report, int b, int M, int rc, double iteration_ms)
{
    if (report == NULL)
        return;
    if (rc == ERR_OK)
        fprintf(report, "%12d %8d %14.3f\n", b, M, iteration_ms);
    else
        fprintf(report, "%12d %8d %14s %s\n", b, M, "-",
                rc == ERR_NOFIT ? "does not fit" : "too large");
}

void microbatch_report_end(FILE *report, const struct plan *chosen,
                           const struct microbatch_notes *notes)
{
    if (report == NULL)
        return;
    fprintf(report, "chosen: micro-batch %d x %d micro-batches\n", chosen->model.micro_batch,
            chosen->micro_batches);
    if (notes->scaled)
        fprintf(report, "note: measured profiles were scaled to other micro-batch sizes "
                        "(memory exact, times linear in the micro-batch): profile each size "
                        "for exact times\n");
    if (notes->dropped)
        fprintf(report, "note: recompute options of measured profiles that this runtime does "
                        "not know were left out at other micro-batch sizes\n");
}
