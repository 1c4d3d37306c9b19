/* The per-stage problem (problem.h): a GPU's chunks as one group, and its knapsack. */
#include "problem.h"

#include <stdlib.h>
#include <string.h>

int method_group(const struct plan *p, int s, int members[SCHEDULE_CHUNKS_MAX])
{
    if (p->virtual_stages <= 1) {
        members[0] = s;
        return 1;
    }
    return plan_gpu_stages(p, p->stages[s].gpu, members);
}

int method_leader(const struct plan *p, int s)
{
    int members[SCHEDULE_CHUNKS_MAX];
    method_group(p, s, members);
    return members[0] == s;
}

/* The group's layers end to end, with each one's in-flight count and chunk (in_flight holds
 * both: the chunks from in_flight + count). */
static int group_layers(const struct plan *p, const int *members, int n,
                        struct layer_cost **layers, int **in_flight, int *count, struct err *e)
{
    int total = 0, at = 0;
    for (int k = 0; k < n; k++)
        total += plan_stage_layer_count(&p->stages[members[k]]);
    *layers = malloc((size_t)total * sizeof **layers);
    *in_flight = malloc(2 * (size_t)total * sizeof **in_flight);
    if (*layers == NULL || *in_flight == NULL) {
        free(*layers);
        free(*in_flight);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    for (int k = 0; k < n; k++) {
        const struct plan_stage *st = &p->stages[members[k]];
        for (int l = 0; l < plan_stage_layer_count(st); l++, at++) {
            (*layers)[at] = st->layers[l];
            (*in_flight)[at] = st->in_flight;
            (*in_flight)[total + at] = k;
        }
    }
    *count = total;
    return ERR_OK;
}

int method_problem(const struct plan *p, int s, const struct plan_options *o,
                   struct knap_problem *kp, struct err *e)
{
    const struct plan_stage *st = &p->stages[s];
    int options = o->method == METHOD_OPTIMAL && !o->whole_layers;
    int members[SCHEDULE_CHUNKS_MAX], n = method_group(p, s, members), count = 0;
    if (n == 1)
        return (options ? knap_build_options : knap_build)(
            kp, st->layers, plan_stage_layer_count(st), st->in_flight, p->reserve_bytes,
            st->memory_limit_bytes, o->unit_bytes, e);
    struct layer_cost *layers;
    int *in_flight;
    if (group_layers(p, members, n, &layers, &in_flight, &count, e))
        return e->code;
    int rc = knap_build_each(kp, layers, count, in_flight, in_flight + count, p->reserve_bytes,
                             st->memory_limit_bytes, o->unit_bytes, options, e);
    free(layers);
    free(in_flight);
    return rc;
}

static int action_allowed(const struct cost_row *r, const struct plan_stage *st,
                          const struct plan_options *o)
{
    if (!(o->actions & PLAN_ACTION_RECOMPUTE) && r->action.choice != COST_KEEP)
        return 0;
    if ((!(o->actions & PLAN_ACTION_OFFLOAD) || st->host_limit_bytes == 0) && r->host_bytes > 0)
        return 0;
    return !o->whole_layers || (r->action.choice <= COST_FULL && r->action.offload_option < 0);
}

int method_menu(const struct plan *p, const struct plan_stage *st, int l,
                const struct plan_options *o, struct cost_row out[COST_ACTIONS_MAX])
{
    struct cost_row all[COST_ACTIONS_MAX];
    int n_all = cost_actions(&st->layers[l], cost_whole_offload(&p->model, l, st->first + l),
                             all),
        n = 0;
    for (int i = 0; i < n_all; i++)
        if (action_allowed(&all[i], st, o))
            out[n++] = all[i];
    return n;
}

void method_gather(const struct plan *p, int s, unsigned char *choice)
{
    int members[SCHEDULE_CHUNKS_MAX], n = method_group(p, s, members);
    for (int k = 0; k < n; k++) {
        const struct plan_stage *st = &p->stages[members[k]];
        plan_stage_choices(st, choice);
        choice += plan_stage_layer_count(st);
    }
}
