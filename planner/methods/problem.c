/* The per-stage problem (problem.h): a GPU's chunks as one group, each layer's menu of
 * actions, and the group's knapsack from the menus. */
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

/* The group's knapsack rows: each layer's menu of recompute choices on the device (keep and
 * full alone with whole layers), in choice order. */
static int group_rows(const struct plan *p, const int *members, int n,
                      const struct plan_options *o, int count, struct cost_row **rows, int **first,
                      struct err *e)
{
    struct plan_options ro = *o;
    ro.actions = PLAN_ACTION_RECOMPUTE;
    ro.whole_layers = !(o->method == METHOD_OPTIMAL && !o->whole_layers);
    *rows = malloc(((size_t)count * COST_ROWS_MAX + 1) * sizeof **rows);
    *first = malloc(((size_t)count + 1) * sizeof **first);
    if (*rows == NULL || *first == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int at = 0, r = 0;
    for (int k = 0; k < n; k++) {
        const struct plan_stage *st = &p->stages[members[k]];
        for (int l = 0; l < plan_stage_layer_count(st); l++, at++) {
            struct cost_row menu[COST_ACTIONS_MAX];
            int m = method_menu(p, st, l, &ro, menu);
            (*first)[at] = r;
            for (int i = 0; i < m; i++)
                if (menu[i].action.place == COST_PLACE_DEVICE && menu[i].action.offload_option < 0)
                    (*rows)[r++] = menu[i];
        }
    }
    (*first)[count] = r;
    return ERR_OK;
}

int method_problem(const struct plan *p, int s, const struct plan_options *o,
                   struct knap_problem *kp, struct err *e)
{
    const struct plan_stage *st = &p->stages[s];
    int members[SCHEDULE_CHUNKS_MAX], n = method_group(p, s, members), count = 0;
    struct layer_cost *layers;
    struct cost_row *rows = NULL;
    int *in_flight, *first = NULL;
    if (group_layers(p, members, n, &layers, &in_flight, &count, e))
        return e->code;
    int rc = group_rows(p, members, n, o, count, &rows, &first, e);
    if (rc == ERR_OK) /* a GPU's chunks each keep a workspace of their own */
        rc = knap_build_rows(kp, layers, count, rows, first, in_flight,
                             n > 1 ? in_flight + count : NULL, p->reserve_bytes,
                             st->memory_limit_bytes, o->unit_bytes, e);
    free(rows);
    free(first);
    free(layers);
    free(in_flight);
    return rc;
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
