/* The host-optimizer view of a stage (optimizer.h). */
#include "optimizer.h"

#include <stdlib.h>
#include <string.h>

static int64_t mirror_bytes(const struct plan_stage *st)
{
    int64_t mirror = 0;
    for (int l = 0; l < plan_stage_layer_count(st); l++)
        mirror += cost_layer_mirror(&st->layers[l]);
    return mirror;
}

int optimizer_host_possible(const struct plan *p, int s, const char **why)
{
    const struct plan_stage *st = &p->stages[s];
    const char *no = NULL;
    if (st->host_limit_bytes == 0 || !st->host_link.present)
        no = "no host memory or no host link";
    else if (!cost_optimizer_movable(st->layers, plan_stage_layer_count(st), NULL))
        no = "a layer's profile does not split its state_bytes";
    else if (mirror_bytes(st) > st->host_limit_bytes)
        no = "the mirror is larger than its host memory";
    if (why != NULL)
        *why = no;
    return no == NULL;
}

int optimizer_view_init(const struct plan *p, int s, struct optimizer_view *v, struct err *e)
{
    const struct plan_stage *st = &p->stages[s];
    int n = plan_stage_layer_count(st);
    v->plan = *p;
    v->stage = s;
    v->stages = malloc((size_t)p->n_stages * sizeof *v->stages);
    struct layer_cost *layers = malloc((size_t)n * sizeof *layers);
    if (v->stages == NULL || layers == NULL) {
        free(v->stages);
        free(layers);
        v->stages = NULL; /* optimizer_view_free has nothing to free */
        return err_set(e, ERR_FAIL, "out of memory");
    }
    memcpy(v->stages, p->stages, (size_t)p->n_stages * sizeof *v->stages);
    struct plan_stage *vs = &v->stages[s];
    vs->host_limit_bytes -= cost_layers_for_optimizer(st->layers, n, COST_PLACE_HOST, layers);
    vs->layers = layers;
    vs->optimizer = COST_PLACE_HOST;
    v->plan.stages = v->stages;
    return ERR_OK;
}

void optimizer_view_free(struct optimizer_view *v)
{
    if (v->stages != NULL)
        free(v->stages[v->stage].layers);
    free(v->stages);
    v->stages = NULL;
}
