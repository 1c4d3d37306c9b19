/* The export (export.h): the checks, the settings (read exactly, or planned again on the same
 * split with the numbers beside the plan's), then the framework's writer (megatron.c, nemo.c,
 * colossalai.c, flagscale.c over what they share, export_core.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "export_core.h"
#include "model_kind.h"
#include "planner.h"

#define GIB 1073741824.0

/* A deep copy of p (a plan round-trips through its file form exactly). */
static int plan_copy(const struct plan *p, struct plan *out, struct err *e)
{
    cJSON *j = plan_to_json(p);
    if (j == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int rc = plan_parse(j, "the plan", out, e);
    cJSON_Delete(j);
    return rc;
}

static double pct(double a, double b)
{
    return b > 0 ? 100.0 * (a - b) / b : 0;
}

/* The framework's plan beside the original: step and every stage's memory. */
static void export_compare(FILE *f, const struct plan *was, const struct plan *now,
                           const struct framework *fw, const char *why)
{
    fprintf(f, "ballast export: %s cannot run the plan as it is (%s): its best settings on the "
               "same split:\n", fw->title, why);
    fprintf(f, "  %5s %-12s %7s %18s %18s %12s\n", "stage", "device", "blocks", "plan GiB",
            "framework GiB", "limit GiB");
    for (int s = 0; s < now->n_stages; s++)
        fprintf(f, "  %5d %-12s %7d %18.3f %18.3f %12.3f\n", s, now->stages[s].device,
                fw_stage_blocks(now, s), was->stages[s].memory_bytes / GIB,
                now->stages[s].memory_bytes / GIB, now->stages[s].memory_limit_bytes / GIB);
    fprintf(f, "  step: plan %.3f ms, as %s runs it %.3f ms (%+.1f%%)\n", was->iteration_ms,
            fw->title, now->iteration_ms, pct(now->iteration_ms, was->iteration_ms));
}

/* The checks every export makes before anything is written. */
static int export_checks(const struct plan *p, const struct framework *f,
                         const struct export_options *o, struct err *e)
{
    if (strcmp(p->framework.activations, "mixed") == 0)
        return err_set(e, ERR_INPUT,
                       "--to %s: the plan's stages were costed with profiles of different "
                       "activation models or attention kernels (framework.activations "
                       "\"mixed\"): one launch runs one attention kernel; plan again with "
                       "profiles made alike",
                       f->name);
    if (o->devices != NULL && fw_device_check(p, f, o->devices, e))
        return e->code;
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        int k = plan_stage_streams(st);
        if (k > 0)
            return err_set(e, ERR_INPUT,
                           "--to %s: stage %d streams the weights of layers %d-%d from host "
                           "memory for each forward and backward (offload_weights), which %s "
                           "has no setting for: plan --for %s to export it",
                           f->name, s, st->last - k + 1, st->last, f->title, f->name);
    }
    if (!fw_row_fits(f, &p->model))
        return err_set(e, ERR_INPUT, "--to %s: internal: a row for model_type %s given a %s model",
                       f->name, f->hf_type, model_kind_name(p->model.kind));
    return ERR_OK;
}

/* Whether framework f runs the plan's schedule as planned (fw_schedule_allowed). */
static int schedule_allowed(const struct plan *p, const struct framework *f, struct err *e)
{
    char why[1024];
    struct schedule_shape sh = plan_shape(p);
    if (fw_schedule_allowed(f, &sh, why, sizeof why))
        return ERR_OK;
    return err_set(e, ERR_INPUT, "--to %s: %s", f->name, why);
}

/* Each pipeline rank's one recompute setting from its chunks' (a framework builds all of a
 * rank's chunks from one TransformerConfig, recomputing the first n blocks of each chunk, or
 * the same modules on all): into `ranks`, or 0 with why when a GPU's chunks differ. */
static int rank_settings(const struct plan *p, const struct framework *f,
                         const struct fw_settings *fs, struct fw_settings *ranks, char *why,
                         size_t size)
{
    int pp = p->n_stages / (p->virtual_stages > 1 ? p->virtual_stages : 1);
    for (int g = 0; g < pp; g++) {
        int chunks[SCHEDULE_CHUNKS_MAX], v = plan_gpu_stages(p, g, chunks), most = 0;
        struct fw_stage one = {0};
        for (int c = 0; c < v; c++) {
            const struct fw_stage *st = &fs->stages[chunks[c]];
            one.blocks += st->blocks;
            most = st->recompute == FW_RECOMPUTE_FULL && st->n > most ? st->n : most;
            if (st->recompute == FW_RECOMPUTE_SELECTIVE)
                one = (struct fw_stage){one.blocks, FW_RECOMPUTE_SELECTIVE, 0, st->modules};
        }
        if (most > 0)
            one = (struct fw_stage){one.blocks, FW_RECOMPUTE_FULL, most, 0};
        for (int c = 0; c < v; c++) {
            const struct fw_stage *st = &fs->stages[chunks[c]];
            int want = most < st->blocks ? most : st->blocks;
            int differs = one.recompute == FW_RECOMPUTE_SELECTIVE
                              ? st->blocks > 0 && (st->recompute != FW_RECOMPUTE_SELECTIVE ||
                                                   st->modules != one.modules)
                              : (st->recompute == FW_RECOMPUTE_FULL ? st->n : 0) != want ||
                                    st->recompute == FW_RECOMPUTE_SELECTIVE;
            if (differs)
                return snprintf(why, size, "GPU %d's chunks recompute differently (stage %d "
                                "against the GPU's other chunks), and %s builds every chunk of "
                                "a pipeline rank from one recompute setting", g, chunks[c],
                                f->title), 0;
        }
        if (ranks != NULL)
            ranks->stages[g] = one;
    }
    if (ranks != NULL)
        ranks->host_optimizer = fs->host_optimizer;
    return 1;
}

/* The settings the framework runs: the plan's own (*replanned 0), or its best on the same
 * split (*replanned 1, `run` then holds that plan). */
static int settings_for(const struct plan *p, const struct framework *f,
                        const struct export_options *o, struct fw_settings *fs,
                        struct plan *run, int *replanned, char *offload, size_t offload_size,
                        struct err *e)
{
    char why[512] = "", why_offload[512] = "", why_share[512] = "";
    int fa = fw_activations_alike(p->framework.activations, f->activations), ok = 0, host = 0;
    *replanned = 0;
    offload[0] = '\0';
    if (!fw_settings_allowed(f, p, fs, 1, why, sizeof why))
        return err_set(e, ERR_INPUT, "--to %s: %s cannot run the plan's split: %s", f->name,
                       f->title, why);
    if (fw_settings_read(p, fa, fs, why, sizeof why) &&
        fw_settings_allowed(f, p, fs, 0, why, sizeof why) &&
        rank_settings(p, f, fs, NULL, why, sizeof why))
        return ERR_OK;
    int offloads = 0;
    for (int s = 0; s < p->n_stages; s++)
        offloads |= plan_stage_offloads(&p->stages[s]);
    if (offloads && strcmp(f->exporter, "megatron") == 0) { /* its offloading, as planned */
        if (megatron_offload_flags(p, o->note, offload, offload_size, &ok, why_offload,
                                   sizeof why_offload, e))
            return e->code;
        for (int s = 0; s < p->n_stages; s++) {
            fs->stages[s] = (struct fw_stage){.blocks = fw_stage_blocks(p, s)};
            host += p->stages[s].optimizer == COST_PLACE_HOST;
        }
        fs->host_optimizer = host == p->n_stages;
        int same = fw_host_share(p, &fs->host_fraction, why_share, sizeof why_share);
        if (ok && same && (host == 0 || (host == p->n_stages && f->host_optimizer != FW_NO)) &&
            fw_settings_allowed(f, p, fs, 1, why, sizeof why))
            return ERR_OK;
        if (ok && !same)
            snprintf(why, sizeof why, "%s", why_share);
        else if (ok)
            snprintf(why, sizeof why, "%d of %d stages keep their optimizer on the host", host,
                     p->n_stages);
        else
            snprintf(why, sizeof why, "%s", why_offload);
        host = 0;
        offload[0] = '\0';
    }
    for (int s = 0; s < p->n_stages; s++)
        host |= p->stages[s].optimizer == COST_PLACE_HOST;
    if (plan_copy(p, run, e))
        return e->code;
    int rc = fw_choose(run, f, fa, host, 0, 0, fs, e); /* the framework's fastest */
    if (rc) {
        plan_free(run);
        char msg[sizeof e->msg];
        snprintf(msg, sizeof msg, "%s", e->msg);
        return err_set(e, rc, "--to %s: the plan as it is cannot run there (%s), and %s", f->name,
                       why, msg);
    }
    *replanned = 1;
    export_compare(o->note, p, run, f, why);
    return ERR_OK;
}

static int write_job(FILE *out, const struct export_job *x, struct err *e)
{
    const char *w = x->f->exporter;
    if (strcmp(w, "megatron") == 0)
        return export_megatron(out, x, e);
    if (strcmp(w, "nemo") == 0)
        return export_nemo(out, x, e);
    if (strcmp(w, "colossalai") == 0)
        return export_colossalai(out, x, e);
    return export_flagscale(out, x, e);
}

/* The frameworks give every data-parallel rank the same micro-batches: a pool plan dealing
 * its batch unevenly is refused. */
static int refuse_uneven(const struct plan *p, const struct framework *f, struct err *e)
{
    if (p->replica_micro_batches == NULL)
        return ERR_OK;
    return err_set(e, ERR_INPUT,
                   "--to %s: replica_micro_batches: the plan's %d replicas take from %d "
                   "micro-batches down to fewer (%lld in all), but %s gives every "
                   "data-parallel rank the same number (global batch = micro-batch size x "
                   "micro-batches x dp): plan the pool with \"dp\" dividing them",
                   f->name, p->stages[0].dp, p->micro_batches, (long long)plan_batches(p),
                   f->title);
}

/* A note when the plan's layer costs follow another activation model than the framework's. */
static void note_activations(FILE *note, const struct plan *q, const struct framework *f)
{
    if (fw_activations_alike(q->framework.activations, f->activations))
        return;
    fprintf(note, "ballast export: note: the plan's layer costs are %s's activation model "
                  "(\"%s\"), not %s's: plan --for %s for its own numbers\n",
            strcmp(q->framework.activations, "ballast") == 0 ? "Ballast's runtime"
                                                             : q->framework.activations,
            q->framework.activations, f->title, f->name);
}

/* p with dp replicas in all (a replicas file's pipelines taken together). */
static int export_dp(FILE *out, const struct plan *p, int dp, const struct export_options *o,
                     struct err *e)
{
    const struct framework *f = framework_find(o->to, &p->model);
    if (f == NULL || framework_is_ballast(f))
        return err_set(e, ERR_INPUT, "--to: \"%s\", expected megatron, megatron-cli, nemo, "
                       "nemo-cli, colossalai or flagscale", o->to);
    if (export_checks(p, f, o, e) || schedule_allowed(p, f, e) || refuse_uneven(p, f, e))
        return e->code;
    struct fw_settings fs, ranks = {0};
    struct plan run;
    int replanned, pp = p->n_stages / (p->virtual_stages > 1 ? p->virtual_stages : 1);
    char offload[512], why[512];
    if (fw_settings_init(&fs, p->n_stages, e))
        return e->code;
    if (settings_for(p, f, o, &fs, &run, &replanned, offload, sizeof offload, e) ||
        (pp < p->n_stages && fw_settings_init(&ranks, pp, e))) {
        fw_settings_free(&fs);
        return e->code;
    }
    if (pp < p->n_stages && !rank_settings(p, f, &fs, &ranks, why, sizeof why)) {
        fw_settings_free(&ranks); /* fw_choose keeps a GPU's chunks alike: not reached */
        fw_settings_free(&fs);
        if (replanned)
            plan_free(&run);
        return err_set(e, ERR_FAIL, "--to %s: internal: %s", f->name, why);
    }
    const struct fw_settings *per_rank = pp < p->n_stages ? &ranks : &fs;
    const struct plan *q = replanned ? &run : p;
    struct export_job x = {.p = q, .f = f, .fs = &fs, .pp = pp, .ranks = per_rank, .o = o,
                           .note = o->note,
                           .per_rank = f->per_rank_file &&
                                       !fw_settings_uniform(per_rank, why, sizeof why),
                           .tp = q->stages[0].tp, .dp = dp,
                           .shard = q->stages[0].shard_optimizer,
                           .attention = q->framework.attention};
    x.global_batch = q->micro_batches * q->model.micro_batch * dp;
    note_activations(o->note, q, f);
    x.offload = offload[0] ? offload : NULL;
    int rc = x.per_rank && o->stages == NULL
                 ? err_set(e, ERR_INPUT, "--to %s: the settings differ per stage and need the "
                           "per-rank Python file, which was given nowhere to go", f->name)
                 : ERR_OK;
    if (rc == ERR_OK)
        rc = write_job(out, &x, e);
    if (replanned)
        plan_free(&run);
    if (pp < p->n_stages)
        fw_settings_free(&ranks);
    fw_settings_free(&fs);
    return rc;
}

int planner_export(FILE *out, const struct plan *p, const struct export_options *o,
                   struct err *e)
{
    if (p->n_stages < 1)
        return err_set(e, ERR_INPUT, "--to %s: a plan of no stages", o->to);
    return export_dp(out, p, p->stages[0].dp, o, e);
}

/* Pipeline k against pipeline 0: what differs, or "" when alike. */
static void pipeline_difference(const struct plan *a, const struct plan *b, char *why,
                                size_t size)
{
    why[0] = '\0';
    if (a->n_stages != b->n_stages) {
        snprintf(why, size, "%d stages against pipeline 0's %d", b->n_stages, a->n_stages);
        return;
    }
    if (a->micro_batches != b->micro_batches || a->model.micro_batch != b->model.micro_batch) {
        snprintf(why, size, "%d micro-batches of %d against pipeline 0's %d of %d",
                 b->micro_batches, b->model.micro_batch, a->micro_batches, a->model.micro_batch);
        return;
    }
    for (int s = 0; s < a->n_stages && !why[0]; s++) {
        const struct plan_stage *x = &a->stages[s], *y = &b->stages[s];
        if (strcmp(x->device, y->device) != 0)
            snprintf(why, size, "stage %d on %s against pipeline 0's %s", s, y->device,
                     x->device);
        else if (x->first != y->first || x->last != y->last)
            snprintf(why, size, "stage %d holding layers %d..%d against pipeline 0's %d..%d", s,
                     y->first, y->last, x->first, x->last);
        else if (x->tp != y->tp)
            snprintf(why, size, "stage %d with tp %d against pipeline 0's %d", s, y->tp, x->tp);
    }
}

int planner_export_replicas(FILE *out, const struct plan *plans, int n,
                            const struct export_options *o, struct err *e)
{
    int dp = 0;
    for (int k = 0; k < n; k++) {
        char why[256];
        pipeline_difference(&plans[0], &plans[k], why, sizeof why);
        if (why[0])
            return err_set(e, ERR_INPUT,
                           "--to %s: pipelines[%d] has %s; the frameworks run one pipeline "
                           "replicated (data parallel), and FlagScale's process meshes chain "
                           "along that one pipeline too (one hetero_pipeline_layer_split, one "
                           "device type per mesh for all of its dp replicas), so pipelines of "
                           "different devices or splits cannot train side by side there",
                           o->to, k, why);
        dp += plans[k].stages[0].dp;
    }
    if (plans[0].stages[0].shard_optimizer && dp != plans[0].stages[0].dp)
        fprintf(o->note, "ballast export: note: the framework shards the optimizer over all %d "
                         "replicas, where each pipeline was planned sharding it over its own %d: "
                         "less optimizer memory per GPU than planned\n",
                dp, plans[0].stages[0].dp);
    return export_dp(out, &plans[0], dp, o, e);
}
