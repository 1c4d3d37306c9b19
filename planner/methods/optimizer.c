/* The host-optimizer view of a stage (optimizer.h). */
#include "optimizer.h"

#include <stdlib.h>
#include <string.h>

int optimizer_host_possible(const struct plan *p, int s, const char **why)
{
    return optimizer_host_possible_from(p, s, 0, why);
}

int optimizer_host_possible_from(const struct plan *p, int s, int from, const char **why)
{
    const struct plan_stage *st = &p->stages[s];
    int n = plan_stage_layer_count(st);
    const char *no = NULL;
    if (st->host_limit_bytes == 0 || !st->host_link.present)
        no = "no host memory or no host link";
    else if (!cost_optimizer_movable(st->layers + from, n - from, NULL))
        no = "a layer's profile does not split its state_bytes";
    else if (cost_stage_mirror(st->layers, n, from) > st->host_limit_bytes)
        no = "the mirror is larger than its host memory";
    if (why != NULL)
        *why = no;
    return no == NULL;
}

int optimizer_splits(const struct plan *p, int s, int from[OPTIMIZER_SPLITS_MAX])
{
    int n = plan_stage_layer_count(&p->stages[s]), count = 0;
    if (n - 1 <= OPTIMIZER_SPLITS_ALL) {
        for (int k = 1; k < n; k++)
            from[count++] = k;
        return count;
    }
    /* the last k layers hosted for k on a geometric grid, the last layer alone and all but
     * the first among them */
    for (double k = 1; k < n && count < OPTIMIZER_SPLITS_MAX - 1; k *= 1.5) {
        int f = n - (int)k;
        if (count == 0 || from[count - 1] != f)
            from[count++] = f;
    }
    if (from[count - 1] != 1)
        from[count++] = 1;
    return count;
}

int optimizer_view_init(const struct plan *p, int s, struct optimizer_view *v, struct err *e)
{
    return optimizer_view_init_from(p, s, 0, v, e);
}

int optimizer_view_init_from(const struct plan *p, int s, int from, struct optimizer_view *v,
                             struct err *e)
{
    return optimizer_view_init_stream(p, s, from, 0, v, e);
}

/* What streaming the last `stream` of stage st's layers takes from its host memory (their
 * weights' copy) and from its device memory (the weights buffers). */
static void stream_bytes(const struct plan_stage *st, int stream, int64_t *host,
                         int64_t *device)
{
    int n = plan_stage_layer_count(st);
    struct cost_sum sum = {0};
    for (int l = n - stream; l < n; l++)
        cost_sum_add_stream(&sum, &st->layers[l]);
    *host = cost_saturate(sum.mirror);
    *device = cost_sum_staging(&sum);
}

int optimizer_stream_possible(const struct plan *p, int s, int from, int stream)
{
    const struct plan_stage *st = &p->stages[s];
    int64_t host, device;
    /* the runtime streams without loss scaling, replicas, tensor parallelism or chunks */
    if (!optimizer_host_possible_from(p, s, from, NULL) || p->model.dtype == MODEL_DTYPE_FP16 ||
        st->dp > 1 || st->tp > 1 || p->virtual_stages > 1)
        return 0;
    stream_bytes(st, stream, &host, &device);
    return cost_stage_mirror(st->layers, plan_stage_layer_count(st), from) + host <=
               st->host_limit_bytes &&
           device < st->memory_limit_bytes;
}

int optimizer_streams(const struct plan *p, int s, int from, int stream[OPTIMIZER_SPLITS_MAX])
{
    int hosted = plan_stage_layer_count(&p->stages[s]) - from, count = 0;
    if (hosted <= OPTIMIZER_SPLITS_ALL) {
        for (int k = 1; k <= hosted; k++)
            stream[count++] = k;
        return count;
    }
    for (double k = 1; k < hosted && count < OPTIMIZER_SPLITS_MAX - 1; k *= 1.5)
        if (count == 0 || stream[count - 1] != (int)k)
            stream[count++] = (int)k;
    stream[count++] = hosted;
    return count;
}

int optimizer_view_init_stream(const struct plan *p, int s, int from, int stream,
                               struct optimizer_view *v, struct err *e)
{
    const struct plan_stage *st = &p->stages[s];
    int n = plan_stage_layer_count(st);
    v->plan = *p;
    v->stage = s;
    v->stages = malloc((size_t)p->n_stages * sizeof *v->stages);
    struct layer_cost *layers = malloc((size_t)n * sizeof *layers);
    struct layer_action *actions = malloc((size_t)n * sizeof *actions);
    if (v->stages == NULL || layers == NULL || actions == NULL) {
        free(v->stages);
        free(layers);
        free(actions);
        v->stages = NULL; /* optimizer_view_free has nothing to free */
        return err_set(e, ERR_FAIL, "out of memory");
    }
    memcpy(v->stages, p->stages, (size_t)p->n_stages * sizeof *v->stages);
    struct plan_stage *vs = &v->stages[s];
    vs->host_limit_bytes -=
        cost_layers_for_optimizer_from(st->layers, n, COST_PLACE_HOST, from, layers);
    int64_t host, device;
    stream_bytes(st, stream, &host, &device);
    vs->host_limit_bytes -= host;
    vs->memory_limit_bytes -= device;
    for (int l = 0; l < n; l++) {
        actions[l] = st->actions[l];
        actions[l].weights = l >= n - stream ? COST_PLACE_HOST : COST_PLACE_DEVICE;
        if (l >= n - stream)
            layers[l].state_bytes = 0;
    }
    vs->layers = layers;
    vs->actions = actions;
    vs->optimizer = COST_PLACE_HOST;
    vs->optimizer_from = from;
    v->plan.stages = v->stages;
    return ERR_OK;
}

void optimizer_view_free(struct optimizer_view *v)
{
    if (v->stages != NULL) {
        free(v->stages[v->stage].layers);
        free(v->stages[v->stage].actions);
    }
    free(v->stages);
    v->stages = NULL;
}
