/* `ballast plan --micro-batches auto`: for a fixed global batch G (samples per step), try
 * every micro-batch size b dividing G with M = G / b micro-batches, plan each, and keep the
 * least simulated iteration time (ties: least memory). Profiles for another b: estimated
 * profiles are estimated again; measured ones keep their memory exact (the size functions
 * are linear in b) and scale their times linearly in b, which flatters small b on GPUs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices.h"
#include "estimate.h"
#include "model_ops.h"
#include "planner.h"
#include "sizes.h"

/* `to` as `from` would be for micro-batch size b. A measured profile's recompute options keep
 * exact bytes (the size functions) and linear times when the runtime knows them; one it does
 * not know cannot be rescaled and is left out (*dropped counts them). */
static int profile_for(const struct profile *from, int b, const struct device_table *t,
                       struct profile *to, int *scaled, int *dropped, struct err *e)
{
    struct model m = from->model;
    m.micro_batch = b;
    const struct device_spec *d = devices_find(t, from->device.name);
    if (from->estimated && d != NULL) {
        if (estimate_profile(t, d, &m, to, e))
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

int planner_make_auto(const struct cluster *c, const struct plan_options *o, int global_batch,
                      FILE *report, struct plan *out, struct err *e)
{
    if (model_ops_of(&c->model) == NULL)
        return err_set(e, ERR_INPUT,
                       "--micro-batches auto: the model is custom (\"%s\"): its profiles hold "
                       "one micro-batch size and Ballast has no size functions to rescale them "
                       "(profile each size and plan each)",
                       c->model.name);
    struct device_table t;
    if (devices_load(devices_default_file(), &t, e))
        return e->code;
    int found = 0, scaled = 0, dropped = 0;
    double best_ms = INFINITY;
    int64_t best_memory = 0;
    if (report)
        fprintf(report, "micro-batches for a global batch of %d samples:\n%12s %8s %14s %s\n",
                global_batch, "micro-batch", "count", "iteration ms", "");
    for (int b = 1; b <= global_batch && e->code == ERR_OK; b++) {
        if (global_batch % b)
            continue;
        struct cluster cb = *c;
        cb.micro_batches = global_batch / b;
        cb.profiles = calloc((size_t)c->n_profiles, sizeof *cb.profiles);
        if (cb.profiles == NULL) {
            err_set(e, ERR_FAIL, "out of memory");
            break;
        }
        struct model m = c->model;
        m.micro_batch = b;
        struct err inner;
        err_clear(&inner);
        int rc = model_check_sizes(&m, "--micro-batches auto", "model", &inner);
        for (int k = 0; k < c->n_profiles && rc == ERR_OK; k++)
            rc = profile_for(&c->profiles[k], b, &t, &cb.profiles[k], &scaled, &dropped, &inner);
        cb.model = m;
        struct plan p;
        if (rc == ERR_OK)
            rc = planner_make(&cb, o, &p, &inner);
        for (int k = 0; k < c->n_profiles; k++)
            profile_free(&cb.profiles[k]);
        free(cb.profiles);
        if (rc == ERR_NOFIT || rc == ERR_INPUT) {
            if (report)
                fprintf(report, "%12d %8d %14s %s\n", b, global_batch / b, "-",
                        rc == ERR_NOFIT ? "does not fit" : "too large");
            continue;
        }
        if (rc) {
            err_set(e, rc, "%s", inner.msg);
            break;
        }
        int64_t memory = 0;
        for (int s = 0; s < p.n_stages; s++)
            memory += p.stages[s].memory_bytes;
        if (report)
            fprintf(report, "%12d %8d %14.3f\n", b, global_batch / b, p.iteration_ms);
        double tol = 1e-12 * (1 + best_ms);
        if (!found || p.iteration_ms < best_ms - tol ||
            (p.iteration_ms <= best_ms + tol && memory < best_memory)) {
            if (found)
                plan_free(out);
            *out = p;
            best_ms = p.iteration_ms;
            best_memory = memory;
            found = 1;
        } else {
            plan_free(&p);
        }
    }
    devices_free(&t);
    if (e->code) {
        if (found)
            plan_free(out);
        return e->code;
    }
    if (!found)
        return err_set(e, ERR_NOFIT,
                       "no micro-batch size dividing the global batch of %d fits the cluster",
                       global_batch);
    if (report) {
        fprintf(report, "chosen: micro-batch %d x %d micro-batches\n", out->model.micro_batch,
                out->micro_batches);
        if (scaled)
            fprintf(report, "note: measured profiles were scaled to other micro-batch sizes "
                            "(memory exact, times linear in the micro-batch): profile each size "
                            "for exact times\n");
        if (dropped)
            fprintf(report, "note: recompute options of measured profiles that this runtime does "
                            "not know were left out at other micro-batch sizes\n");
    }
    return ERR_OK;
}
