/* What `ballast simulate` writes: the result file and the Chrome trace of a simulated step. */
#include <stdio.h>

#include "jsonio.h"
#include "sim.h"

const char *sim_kind_name(enum sim_kind kind)
{
    switch (kind) {
    case SIM_FORWARD:
        return "forward";
    case SIM_RECOMPUTE:
        return "recompute";
    case SIM_BACKWARD:
        return "backward";
    case SIM_SEND_FORWARD:
        return "send-activations";
    case SIM_SEND_BACKWARD:
        return "send-gradients";
    case SIM_COPY_OUT:
        return "copy-to-host";
    case SIM_COPY_IN:
        return "prefetch-from-host";
    case SIM_OPTIMIZER:
        return "optimizer";
    case SIM_GRAD_COPY:
        return "gradients-to-host";
    case SIM_HOST_UPDATE:
        return "host-optimizer";
    case SIM_PARAM_COPY:
        return "parameters-from-host";
    case SIM_WEIGHT:
        return "weight-gradients";
    case SIM_ALLREDUCE:
        return "allreduce";
    }
    return "?";
}

void sim_stage_totals(const struct sim_result *r, int stage, struct sim_stage_totals *out)
{
    *out = (struct sim_stage_totals){0};
    for (int i = 0; i < r->n_tasks; i++) {
        const struct sim_task *t = &r->tasks[i];
        double d = t->end_ms - t->start_ms;
        /* a backward send over boundary k comes from stage k + 1 */
        int from = t->kind == SIM_SEND_BACKWARD ? t->stage + 1 : t->stage;
        if (from != stage)
            continue;
        switch (t->kind) {
        case SIM_FORWARD:
            out->fwd_ms += d;
            break;
        case SIM_RECOMPUTE:
            out->recompute_ms += d;
            break;
        case SIM_BACKWARD:
            out->bwd_ms += d;
            break;
        case SIM_SEND_FORWARD:
        case SIM_SEND_BACKWARD:
            out->send_ms += d;
            break;
        case SIM_COPY_OUT:
            out->copy_out_ms += d;
            break;
        case SIM_COPY_IN:
            out->copy_in_ms += d;
            break;
        case SIM_OPTIMIZER:
            out->optimizer_ms += d;
            break;
        case SIM_GRAD_COPY:
            out->grad_ms += d;
            break;
        case SIM_HOST_UPDATE:
            out->update_ms += d;
            break;
        case SIM_PARAM_COPY:
            out->param_ms += d;
            break;
        case SIM_WEIGHT:
            out->w_ms += d;
            break;
        case SIM_ALLREDUCE:
            out->allreduce_ms += d;
            out->buckets++;
            break;
        }
    }
}

cJSON *sim_result_to_json(const struct plan *p, const struct sim_result *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "ballast-simulation/1");
    cJSON_AddStringToObject(o, "method", p->method);
    cJSON_AddStringToObject(o, "schedule", schedule_name(p->schedule));
    if (p->virtual_stages > 1)
        cJSON_AddNumberToObject(o, "virtual_stages", p->virtual_stages);
    cJSON_AddNumberToObject(o, "micro_batches", p->micro_batches);
    cJSON_AddNumberToObject(o, "iteration_ms", r->iteration_ms);
    cJSON_AddNumberToObject(o, "bubble_fraction", r->bubble_fraction);
    cJSON *stages = cJSON_AddArrayToObject(o, "stages");
    for (int s = 0; s < r->n_stages; s++) {
        struct sim_stage_totals t;
        sim_stage_totals(r, s, &t);
        cJSON *so = cJSON_CreateObject();
        cJSON_AddNumberToObject(so, "index", s);
        if (p->virtual_stages > 1)
            cJSON_AddNumberToObject(so, "gpu", p->stages[s].gpu);
        cJSON_AddStringToObject(so, "device", p->stages[s].device);
        cJSON_AddNumberToObject(so, "busy_ms", r->busy_ms[s]);
        cJSON_AddNumberToObject(so, "idle_ms", r->idle_ms[s]);
        cJSON_AddNumberToObject(so, "fwd_ms", t.fwd_ms);
        cJSON_AddNumberToObject(so, "bwd_ms", t.bwd_ms);
        cJSON_AddNumberToObject(so, "recompute_ms", t.recompute_ms);
        if (schedule_splits(p->schedule))
            cJSON_AddNumberToObject(so, "w_ms", t.w_ms);
        cJSON_AddNumberToObject(so, "send_ms", t.send_ms);
        const struct plan_stage *ps = &p->stages[s];
        if (ps->dp > 1) { /* its buckets, from its last backward on (sim.h) */
            cJSON_AddNumberToObject(so, "allreduce_ms",
                                    t.buckets > 0 ? t.allreduce_ms
                                                  : cost_dp_allreduce_ms(&ps->dp_link, ps->dp,
                                                                         ps->allreduce_bytes));
            cJSON_AddNumberToObject(so, "allreduce_buckets", t.buckets);
        }
        if (plan_stage_offloads(&p->stages[s])) {
            cJSON_AddNumberToObject(so, "copy_out_ms", t.copy_out_ms);
            cJSON_AddNumberToObject(so, "copy_in_ms", t.copy_in_ms);
            cJSON_AddNumberToObject(so, "stall_ms", r->stall_ms[s]);
        }
        if (t.optimizer_ms > 0)
            cJSON_AddNumberToObject(so, "optimizer_ms", t.optimizer_ms);
        if (p->stages[s].optimizer == COST_PLACE_HOST) {
            cJSON_AddNumberToObject(so, "grad_copy_ms", t.grad_ms);
            cJSON_AddNumberToObject(so, "host_optimizer_ms", t.update_ms);
            cJSON_AddNumberToObject(so, "param_copy_ms", t.param_ms);
        }
        if (r->tail_ms[s] > 0)
            cJSON_AddNumberToObject(so, "step_tail_ms", r->tail_ms[s]);
        cJSON_AddItemToArray(stages, so);
    }
    return o;
}

/* Track ids: stage s computes on 3s+1; its link to s+1 carries activations on 3s+2 and
 * gradients on 3s+3 (two tracks because the two directions overlap in time). */
static int compute_tid(int s)
{
    return 3 * s + 1;
}

static int link_tid(int k, enum sim_kind kind)
{
    return 3 * k + (kind == SIM_SEND_FORWARD ? 2 : 3);
}

/* Stage s's host lanes follow every stage's and link's tracks, and its host optimizer's
 * threads every host lane. */
static int copy_tid(int S, int s, enum sim_kind kind)
{
    return 3 * S + 2 * s + (kind == SIM_COPY_OUT || kind == SIM_GRAD_COPY ? 1 : 2);
}

static int update_tid(int S, int s)
{
    return 5 * S + s + 1;
}

static int reduce_tid(int S, int s)
{
    return 6 * S + s + 1;
}

static int task_tid(int S, const struct sim_task *k)
{
    if (k->kind == SIM_SEND_FORWARD || k->kind == SIM_SEND_BACKWARD)
        return link_tid(k->stage, k->kind);
    if (k->kind == SIM_COPY_OUT || k->kind == SIM_COPY_IN || k->kind == SIM_GRAD_COPY ||
        k->kind == SIM_PARAM_COPY)
        return copy_tid(S, k->stage, k->kind);
    if (k->kind == SIM_HOST_UPDATE)
        return update_tid(S, k->stage);
    if (k->kind == SIM_ALLREDUCE)
        return reduce_tid(S, k->stage);
    return compute_tid(k->stage);
}

void sim_trace_add(struct trace *t, int pid, const struct plan *p, const struct sim_result *r)
{
    char name[160];
    snprintf(name, sizeof name, "simulated %s step, method %s, %d micro-batches",
             schedule_name(p->schedule), p->method, p->micro_batches);
    trace_name_process(t, pid, name);
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        if (p->virtual_stages > 1)
            snprintf(name, sizeof name, "stage %d (GPU %d) %s", s, st->gpu, st->device);
        else
            snprintf(name, sizeof name, "stage %d %s", s, st->device);
        trace_name_track(t, pid, compute_tid(s), name);
        if (s + 1 < p->n_stages && st->link.present) {
            snprintf(name, sizeof name, "link %d->%d activations (%g Gb/s)", s, s + 1,
                     st->link.gbps);
            trace_name_track(t, pid, link_tid(s, SIM_SEND_FORWARD), name);
            snprintf(name, sizeof name, "link %d->%d gradients (%g Gb/s)", s + 1, s,
                     st->link.gbps);
            trace_name_track(t, pid, link_tid(s, SIM_SEND_BACKWARD), name);
        }
        if (st->dp > 1) {
            snprintf(name, sizeof name, "stage %d gradients over %d replicas (%g Gb/s)", s,
                     st->dp, st->dp_link.gbps);
            trace_name_track(t, pid, reduce_tid(p->n_stages, s), name);
        }
        if (st->optimizer == COST_PLACE_HOST) {
            snprintf(name, sizeof name, "stage %d host optimizer", s);
            trace_name_track(t, pid, update_tid(p->n_stages, s), name);
        }
        if (plan_stage_offloads(st) || st->optimizer == COST_PLACE_HOST) {
            snprintf(name, sizeof name, "stage %d to host (%g Gb/s)", s, st->host_link.gbps);
            trace_name_track(t, pid, copy_tid(p->n_stages, s, SIM_COPY_OUT), name);
            snprintf(name, sizeof name, "stage %d from host (%g Gb/s)", s, st->host_link.gbps);
            trace_name_track(t, pid, copy_tid(p->n_stages, s, SIM_COPY_IN), name);
        }
    }
    for (int i = 0; i < r->n_tasks; i++) {
        const struct sim_task *k = &r->tasks[i];
        static const char letter[] = {'F', 'R', 'B', 'A', 'G', 'O', 'P', 'S',
                                      'D', 'U', 'W', 'W', 'Y'};
        snprintf(name, sizeof name, "%c %d", letter[k->kind], k->micro);
        int send = k->kind == SIM_SEND_FORWARD || k->kind == SIM_SEND_BACKWARD;
        int from = k->kind == SIM_SEND_BACKWARD ? k->stage + 1 : k->stage;
        int to = k->kind == SIM_SEND_FORWARD ? k->stage + 1 : k->stage;
        struct trace_arg args[3] = {{"micro_batch", k->micro}, {"stage", from}, {"to_stage", to}};
        trace_add_slice(t, pid, task_tid(p->n_stages, k), name,
                        sim_kind_name(k->kind), k->start_ms, k->end_ms - k->start_ms, args,
                        send ? 3 : 2);
    }
}
