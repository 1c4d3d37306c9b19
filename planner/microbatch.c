/* `ballast plan --micro-batches auto`: a candidate micro-batch size's cluster. Profiles for
 * another b: estimated profiles are estimated again; measured ones keep their memory exact
 * (the size functions are linear in b) and scale their times linearly in b, which flatters
 * small b on GPUs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices.h"
#include "microbatch.h"
#include "model_ops.h"
#include "sizes.h"

/* `to` as `from` would be for micro-batch size b. A measured profile's recompute options keep
 * exact bytes (the size functions) and linear times when the runtime knows them; one it does
 * not know cannot be rescaled and is left out (*dropped counts them). */
static int profile_for(const struct profile *from, int b, const struct device_table *t,
                       plan_estimate_fn estimate, struct profile *to, int *scaled, int *dropped,
                       struct err *e)
{
    struct model m = from->model;
    m.micro_batch = b;
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
        struct layer_sizes s;
        sizes_layer(&m, l, &s);
        to->layers[l] = from->layers[l];
        to->layers[l].fwd_ms *= ratio;
        to->layers[l].bwd_ms *= ratio;
        to->layers[l].act_bytes = s.act_bytes;
        to->layers[l].ckpt_bytes = s.ckpt_bytes;
        to->layers[l].out_bytes = s.out_bytes;
        to->layers[l].workspace_bytes = s.workspace_bytes;
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
        rc = profile_for(&c->profiles[k], b, t, estimate, &out->profiles[k], &notes->scaled,
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

void microbatch_report_head(FILE *report, int global_batch)
{
    if (report)
        fprintf(report, "micro-batches for a global batch of %d samples:\n%12s %8s %14s %s\n",
                global_batch, "micro-batch", "count", "iteration ms", "");
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
