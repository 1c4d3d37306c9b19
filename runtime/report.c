#include "report.h"

#include <math.h>
#include <string.h>

#include "jsonio.h"
#include "trace.h"

/* The metrics' "loss_scaling" (report.h). */
static void add_loss_scaling(cJSON *o, const struct lossscale_config *c,
                             const struct lossscale *s)
{
    cJSON *ls = cJSON_AddObjectToObject(o, "loss_scaling");
    cJSON_AddNumberToObject(ls, "initial", c->initial);
    cJSON_AddNumberToObject(ls, "min", c->min);
    cJSON_AddNumberToObject(ls, "growth", c->growth);
    cJSON_AddNumberToObject(ls, "backoff", c->backoff);
    jsonio_add_int(ls, "window", c->window);
    jsonio_add_int(ls, "hysteresis", c->hysteresis);
    jsonio_add_int(ls, "skipped_steps", s->skipped);
    cJSON_AddNumberToObject(ls, "final_scale", s->scale);
}

void report_scale_text(double scale, char out[32])
{
    if (scale == floor(scale) && scale < 1e19)
        snprintf(out, 32, "%.0f", scale);
    else
        snprintf(out, 32, "%g", scale);
}

/* Step i of the metrics' "steps". */
static cJSON *step_json(const struct report *r, int i)
{
    cJSON *s = cJSON_CreateObject();
    jsonio_add_int(s, "step", r->steps[i].step);
    cJSON_AddNumberToObject(s, "loss", r->steps[i].loss);
    cJSON_AddNumberToObject(s, "ms", r->steps[i].ms);
    cJSON_AddNumberToObject(s, "stall_ms", r->steps[i].stall_ms);
    cJSON_AddNumberToObject(s, "late_prefetches", r->steps[i].late_prefetches);
    cJSON_AddNumberToObject(s, "copy_ms", r->steps[i].copy_ms);
    jsonio_add_int(s, "host_peak_bytes", r->steps[i].host_peak_bytes);
    if (r->loss_scale != NULL) {
        cJSON_AddNumberToObject(s, "loss_scale", r->steps[i].loss_scale);
        cJSON_AddBoolToObject(s, "skipped", r->steps[i].skipped);
    }
    return s;
}

/* A CUDA stage's device memory beside its arenas: its "cuda" object. */
static void add_cuda(cJSON *s, const struct report_stage *st)
{
    cJSON *g = cJSON_AddObjectToObject(s, "cuda");
    cJSON_AddStringToObject(g, "gpu", st->gpu);
    cJSON_AddNumberToObject(g, "ordinal", st->gpu_ordinal);
    cJSON_AddStringToObject(g, "uuid", st->gpu_uuid);
    jsonio_add_int(g, "context_bytes", st->context_bytes);
    cJSON_AddBoolToObject(g, "context_includes_other_processes", st->context_includes_others);
    jsonio_add_int(g, "cublas_bytes", st->cublas_bytes);
    jsonio_add_int(g, "cublas_workspace_bytes", st->cublas_workspace_bytes);
    jsonio_add_int(g, "nccl_bytes", st->nccl_bytes);
    jsonio_add_int(g, "device_used_end_bytes", st->device_used_end_bytes);
    jsonio_add_int(g, "device_total_bytes", st->device_total_bytes);
}

/* One stage of the metrics' "stages": measured against planned. */
static cJSON *stage_json(const struct report *r, const struct report_stage *st)
{
    cJSON *s = cJSON_CreateObject();
    cJSON_AddNumberToObject(s, "index", st->index);
    cJSON_AddStringToObject(s, "device", st->device);
    jsonio_add_int(s, "peak_bytes", st->peak_bytes);
    jsonio_add_int(s, "planned_bytes", st->planned_bytes);
    jsonio_add_int(s, "reserve_bytes", st->reserve_bytes);
    jsonio_add_int(s, "arena_bytes", st->arena_bytes);
    cJSON_AddNumberToObject(s, "fwd_ms", st->fwd_ms);
    cJSON_AddNumberToObject(s, "bwd_ms", st->bwd_ms);
    cJSON_AddNumberToObject(s, "recompute_ms", st->recompute_ms);
    cJSON_AddNumberToObject(s, "send_ms", st->send_ms);
    cJSON_AddNumberToObject(s, "idle_ms", st->idle_ms);
    cJSON_AddNumberToObject(s, "optimizer_ms", st->optimizer_ms);
    cJSON_AddNumberToObject(s, "host_update_ms", st->host_update_ms);
    if (r->dp > 1) {
        cJSON_AddNumberToObject(s, "allreduce_ms", st->allreduce_ms);
        cJSON_AddStringToObject(s, "allreduce", st->allreduce);
    }
    jsonio_add_int(s, "host_peak_bytes", st->host_peak_bytes);
    jsonio_add_int(s, "host_bytes", st->host_bytes);
    jsonio_add_int(s, "staging_bytes", st->staging_bytes);
    cJSON_AddNumberToObject(s, "copy_ms", st->copy_ms);
    cJSON_AddNumberToObject(s, "stall_ms", st->stall_ms);
    cJSON_AddNumberToObject(s, "late_prefetches", st->late_prefetches);
    cJSON_AddNumberToObject(s, "planned_stage_ms", st->planned_stage_ms);
    cJSON_AddNumberToObject(s, "planned_recompute_ms", st->planned_recompute_ms);
    cJSON_AddStringToObject(s, "backend", st->backend);
    if (strcmp(st->backend, "cuda") == 0)
        add_cuda(s, st);
    return s;
}

int report_write_metrics(const char *file, const struct report *r, struct err *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "ballast-metrics/1");
    cJSON_AddStringToObject(o, "plan", r->plan_file);
    cJSON_AddStringToObject(o, "schedule", r->schedule);
    cJSON_AddNumberToObject(o, "micro_batches", r->micro_batches);
    cJSON_AddNumberToObject(o, "threads", r->threads);
    jsonio_add_int(o, "tokens_per_step", r->tokens_per_step);
    cJSON *tp = cJSON_AddObjectToObject(o, "transport");
    cJSON_AddStringToObject(tp, "kind", r->transport);
    cJSON_AddStringToObject(tp, "reason", r->transport_reason);
    cJSON *data = cJSON_AddObjectToObject(o, "data");
    cJSON_AddStringToObject(data, "source", r->data);
    if (r->entropy_floor >= 0)
        cJSON_AddNumberToObject(data, "entropy_nats_per_token", r->entropy_floor);
    cJSON *steps = cJSON_AddArrayToObject(o, "steps");
    for (int i = 0; i < r->n_steps; i++)
        cJSON_AddItemToArray(steps, step_json(r, i));
    if (r->loss_scale != NULL)
        add_loss_scaling(o, r->loss_scale, &r->scaler);
    cJSON_AddNumberToObject(o, "tokens_per_s", r->tokens_per_s);
    if (r->dp > 1)
        cJSON_AddNumberToObject(o, "dp", r->dp);
    cJSON *stages = cJSON_AddArrayToObject(o, "stages");
    for (int i = 0; i < r->n_stages; i++)
        cJSON_AddItemToArray(stages, stage_json(r, &r->stages[i]));
    int rc = jsonio_write(file, o, e);
    cJSON_Delete(o);
    return rc;
}

void report_print_summary(FILE *f, const struct report *r)
{
    fprintf(f, "\nper stage, planned against measured (time per micro-batch, steps after the "
               "first):\n");
    fprintf(f, "stage  layers    recomputed  memory MiB: planned  measured    diff   "
               "compute ms: planned  measured   send ms  idle ms\n");
    for (int i = 0; i < r->n_stages; i++) {
        const struct report_stage *s = &r->stages[i];
        double planned = (double)s->planned_bytes / 1048576.0;
        double peak = (double)s->peak_bytes / 1048576.0;
        double diff = s->planned_bytes > 0
                          ? 100.0 * (double)(s->peak_bytes - s->planned_bytes) /
                                (double)s->planned_bytes
                          : 0.0;
        char layers[32];
        snprintf(layers, sizeof layers, "%d-%d", s->first, s->last);
        fprintf(f, "%5d  %-8s  %10d  %19.2f  %8.2f  %+6.2f%%  %19.3f  %8.3f  %8.3f  %7.3f\n",
                s->index, layers, s->n_recompute, planned, peak, diff, s->planned_stage_ms,
                s->fwd_ms + s->bwd_ms + s->recompute_ms, s->send_ms, s->idle_ms);
    }
    fprintf(f, "(planned memory: the plan's memory_bytes minus reserve_bytes; planned compute: "
               "its stage_ms, from the profile's layer times)\n");
    fprintf(f, "transport: %s (%s)\n", r->transport, r->transport_reason);
    if (r->loss_scale != NULL) {
        char scale[32];
        report_scale_text(r->scaler.scale, scale);
        fprintf(f, "loss scaling: %lld step%s skipped for overflows, the scale now %s\n",
                (long long)r->scaler.skipped, r->scaler.skipped == 1 ? "" : "s", scale);
    }
    int gpus = 0;
    for (int i = 0; i < r->n_stages; i++)
        gpus += strcmp(r->stages[i].backend, "cuda") == 0;
    if (gpus == 0)
        return;
    fprintf(f, "device memory beside the arenas, MiB (whole-device readings, see the metrics):\n");
    fprintf(f, "stage  gpu                       context  cuBLAS    NCCL  device used at end\n");
    for (int i = 0; i < r->n_stages; i++) {
        const struct report_stage *s = &r->stages[i];
        if (strcmp(s->backend, "cuda") != 0)
            continue;
        char gpu[32];
        snprintf(gpu, sizeof gpu, "%d:%s", s->gpu_ordinal, s->gpu);
        fprintf(f, "%5d  %-24s %8.1f%s %7.1f %7.1f  %8.1f of %.1f\n", s->index, gpu,
                (double)s->context_bytes / 1048576.0, s->context_includes_others ? "*" : " ",
                (double)s->cublas_bytes / 1048576.0, (double)s->nccl_bytes / 1048576.0,
                (double)s->device_used_end_bytes / 1048576.0,
                (double)s->device_total_bytes / 1048576.0);
    }
    fprintf(f, "(* the first rank on its GPU: includes what other processes held)\n");
}

static const char *const event_names[STAGE_EV_KINDS] = {
    "forward", "recompute", "backward", "send", "idle", "optimizer", "offload stall",
    "copy to host", "copy from host", "host update", "weight gradients"};

/* Stage s's compute track, and its copy lanes' after every stage's compute track, as the
 * simulator's trace has them. */
static int event_tid(int n_stages, int s, int kind)
{
    if (kind == STAGE_EV_COPY_OUT || kind == STAGE_EV_COPY_IN)
        return n_stages + 2 * s + (kind == STAGE_EV_COPY_IN);
    return s;
}

/* A track per stage and copy direction, for the stages that copied. */
static void name_copy_tracks(struct trace *t, const struct report *r, const int *counts,
                             const struct stage_event *events)
{
    const struct stage_event *ev = events;
    for (int s = 0; s < r->n_stages; s++) {
        int copies = 0;
        for (int i = 0; i < counts[s]; i++, ev++)
            copies |= ev->kind == STAGE_EV_COPY_OUT || ev->kind == STAGE_EV_COPY_IN;
        char name[64];
        for (int dir = 0; dir < 2 && copies; dir++) {
            snprintf(name, sizeof name, "stage %d %s host", s, dir ? "from" : "to");
            trace_name_track(t, 0, event_tid(r->n_stages, s, STAGE_EV_COPY_OUT + dir), name);
        }
    }
}

int report_write_trace(const char *file, const struct model *m, const struct report *r,
                       const int *counts, const struct stage_event *events, struct err *e)
{
    struct trace *t = trace_init();
    if (t == NULL)
        return err_set(e, ERR_FAIL, "%s: out of memory for the trace", file);
    char name[128];
    snprintf(name, sizeof name, "ballast train (%s)", r->schedule);
    trace_name_process(t, 0, name);
    for (int s = 0; s < r->n_stages; s++) {
        snprintf(name, sizeof name, "stage %d (%s, layers %d-%d)", s, r->stages[s].device,
                 r->stages[s].first, r->stages[s].last);
        trace_name_track(t, 0, s, name);
    }
    name_copy_tracks(t, r, counts, events);
    const struct stage_event *ev = events;
    for (int s = 0; s < r->n_stages; s++)
        for (int i = 0; i < counts[s]; i++, ev++) {
            const char *kind = event_names[ev->kind];
            if (ev->layer >= 0) {
                char lname[MODEL_LAYER_NAME_MAX];
                model_layer_name(m, ev->layer, lname);
                snprintf(name, sizeof name, "%s %s", kind, lname);
            } else {
                snprintf(name, sizeof name, "%s", kind);
            }
            struct trace_arg args[2] = {{"step", ev->step + 1}, {"micro_batch", ev->micro}};
            trace_add_slice(t, 0, event_tid(r->n_stages, s, ev->kind), name, kind, ev->t0_ms,
                            ev->t1_ms - ev->t0_ms, args, 2);
        }
    int rc = trace_write(t, file, e);
    trace_free(t);
    return rc;
}
