/* A cluster's stages as groups of GPUs (issue 17): tensor parallel inside a node, data
 * parallel across replicas. Read, checked, and applied to the stages' profiles, so that every
 * part after cluster_load (methods, searches, simulator, plans) sees the costs of one GPU of
 * each group (cost.h cost_group). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "cost.h"
#include "jsonio.h"
#include "model_kind.h"
#include "units.h"

#define GROUP_TP_MAX 1024
#define GROUP_DP_MAX (1 << 20)

static int read_link(const cJSON *obj, const char *file, const char *path, const char *key,
                     struct link *l, struct err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    char lp[JSONIO_PATH_MAX];
    jsonio_path_key(lp, path, key);
    return v != NULL ? link_from_json(v, file, lp, 1, l, e) : ERR_OK;
}

/* "node_host_memory_bytes": the host memory of the stage's node, shared by its per_node GPUs;
 * the stage's tp GPUs take their share as its host_memory_bytes. */
static int read_node_host_memory(const cJSON *obj, const char *file, const char *path,
                                 struct cluster_stage *st, struct err *e)
{
    int64_t node = 0;
    if (units_json_bytes_opt(obj, file, path, "node_host_memory_bytes", 1, JSONIO_INT_MAX, &node,
                             e))
        return e->code;
    if (node == 0)
        return ERR_OK;
    if (st->host_memory_bytes > 0 || st->per_node == 0)
        return err_set(e, ERR_INPUT,
                       "%s: %s.node_host_memory_bytes: %s (the node's host memory is shared "
                       "by its per_node GPUs: give it with per_node, or host_memory_bytes for "
                       "the stage alone)",
                       file, path,
                       st->per_node == 0 ? "needs per_node" : "and host_memory_bytes both given");
    st->host_memory_bytes = node / st->per_node * st->tp;
    return ERR_OK;
}

int cluster_group_read_stage(const cJSON *obj, const char *file, const char *path,
                             struct cluster_stage *st, struct err *e)
{
    int64_t tp = 1, dp = 1, per_node = 0;
    if (jsonio_int_opt(obj, file, path, "tp", 1, GROUP_TP_MAX, &tp, e) ||
        jsonio_int_opt(obj, file, path, "dp", 1, GROUP_DP_MAX, &dp, e) ||
        jsonio_int_opt(obj, file, path, "per_node", 1, GROUP_TP_MAX, &per_node, e) ||
        read_link(obj, file, path, "node_link", &st->node_link, e))
        return e->code;
    st->tp = (int)tp;
    st->dp = (int)dp;
    st->per_node = (int)per_node;
    if (per_node > 0 && tp > per_node)
        return err_set(e, ERR_INPUT,
                       "%s: %s.tp: %lld GPUs, but a node has only %lld (per_node): a "
                       "tensor-parallel group stays inside one node",
                       file, path, (long long)tp, (long long)per_node);
    return read_node_host_memory(obj, file, path, st, e);
}

int cluster_group_read(const cJSON *root, const char *file, struct cluster *c, struct err *e)
{
    const cJSON *shard = cJSON_GetObjectItemCaseSensitive(root, "shard_optimizer");
    if (shard != NULL && jsonio_bool(root, file, "", "shard_optimizer", &c->shard_optimizer, e))
        return e->code;
    c->dp_bucket_bytes = COST_DP_BUCKET_BYTES_DEFAULT;
    if (units_json_bytes_opt(root, file, "", "dp_bucket_bytes", 0, JSONIO_INT_MAX,
                             &c->dp_bucket_bytes, e))
        return e->code;
    return read_link(root, file, "", "dp_link", &c->dp_link, e);
}

int cluster_check_tp(const struct model *m, int tp, const char *where, struct err *e)
{
    if (tp == 1)
        return ERR_OK;
    if (model_is_custom(m))
        return err_set(e, ERR_INPUT,
                       "%s: %d, but a custom model's layers cannot be split: tensor "
                       "parallelism needs the model's heads",
                       where, tp);
    if (m->n_head % tp != 0)
        return err_set(e, ERR_INPUT, "%s: %d does not divide the model's n_head %d", where, tp,
                       m->n_head);
    if (model_kv_heads(m) % tp != 0)
        return err_set(e, ERR_INPUT, "%s: %d does not divide the model's n_kv_head %d", where,
                       tp, m->n_kv_head);
    return ERR_OK;
}

static int same_link(const struct link *a, const struct link *b)
{
    return a->present == b->present &&
           (!a->present || (a->gbps == b->gbps && a->latency_us == b->latency_us));
}

/* One dp for the pipeline (every stage replicated alike), and one group per device: stages of
 * one device share its profile, which becomes the group's costs. */
static int check_stage(const struct cluster *c, const char *file, int s, struct err *e)
{
    const struct cluster_stage *st = &c->stages[s];
    if (st->dp != c->stages[0].dp)
        return err_set(e, ERR_INPUT,
                       "%s: stages[%d].dp: %d, but stages[0].dp is %d: every stage of a "
                       "pipeline is replicated alike",
                       file, s, st->dp, c->stages[0].dp);
    for (int t = 0; t < s; t++) {
        const struct cluster_stage *o = &c->stages[t];
        if (strcmp(o->device, st->device) != 0)
            continue;
        if (o->tp != st->tp)
            return err_set(e, ERR_INPUT,
                           "%s: stages[%d].tp: %d, but stages[%d] on the same device \"%s\" "
                           "has tp %d (stages of one device share its costs)",
                           file, s, st->tp, t, st->device, o->tp);
        if (!same_link(&o->node_link, &st->node_link))
            return err_set(e, ERR_INPUT,
                           "%s: stages[%d].node_link: differs from stages[%d]'s on the same "
                           "device \"%s\" (stages of one device share its costs)",
                           file, s, t, st->device);
    }
    const struct profile *p = &c->profiles[st->profile];
    if (p->tp > 1 && p->tp != st->tp)
        return err_set(e, ERR_INPUT,
                       "%s: stages[%d].tp: %d, but its profile's costs are per GPU of a group of "
                       "tp %d: give tp %d, or a profile of one GPU",
                       file, s, st->tp, p->tp, p->tp);
    char where[CLUSTER_PATH_MAX + 32];
    snprintf(where, sizeof where, "%s: stages[%d].tp", file, s);
    return cluster_check_tp(&c->model, st->tp, where, e);
}

void cluster_group_layers(struct profile *p, const struct model *m, const struct cost_group *g)
{
    for (int l = 0; l < p->n_layers; l++)
        cost_group_layer(&p->layers[l], model_layer_kind(m, l), g, &p->layers[l]);
}

int cluster_profile_group(const struct cluster *c, int k, int one_gpu, struct cost_group *g)
{
    int s = 0, grouped = 0;
    while (s + 1 < c->n_stages && c->stages[s].profile != k)
        s++;
    for (int q = 0; q < c->n_stages; q++)
        grouped |= c->stages[q].tp > 1 || c->stages[q].dp > 1;
    const struct cluster_stage *st = &c->stages[s];
    const struct profile *p = &c->profiles[k];
    *g = (struct cost_group){
        .tp = p->tp > 1 && !one_gpu ? st->tp / p->tp : st->tp,
        .dp = st->dp,
        .shard_optimizer = c->shard_optimizer,
        .tp_efficiency = p->tp_efficiency > 0 ? p->tp_efficiency : 1.0,
        .node_link = st->node_link,
        .tensor_bytes = cost_tp_tensor_bytes(&c->model),
        .dtype = c->model.dtype,
    };
    return grouped;
}

/* The gradient bytes on each GPU of stage s's group, from its profile's one-GPU costs. */
static int fill_grads(struct cluster *c, int s, struct err *e)
{
    const struct cluster_stage *st = &c->stages[s];
    const struct profile *p = &c->profiles[st->profile];
    int64_t *grad = malloc((size_t)p->n_layers * sizeof *grad);
    if (grad == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    c->grad_bytes[st->profile] = grad;
    int tp = p->tp > 1 ? st->tp / p->tp : st->tp; /* a group's profile is per GPU already */
    for (int l = 0; l < p->n_layers; l++)
        grad[l] = (cost_grad_bytes(p->layers[l].state_bytes, c->model.dtype) + tp - 1) / tp;
    return ERR_OK;
}

/* Every stage's gradient bytes, and its profile as the GPUs of its group see it. */
static int apply_groups(struct cluster *c, int transform, struct err *e)
{
    c->grad_bytes = calloc((size_t)c->n_profiles, sizeof *c->grad_bytes);
    if (c->grad_bytes == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int s = 0; s < c->n_stages; s++) {
        const struct cluster_stage *st = &c->stages[s];
        struct profile *p = &c->profiles[st->profile];
        if (c->grad_bytes[st->profile] != NULL)
            continue;
        if (fill_grads(c, s, e))
            return e->code;
        struct cost_group g;
        cluster_profile_group(c, st->profile, 0, &g);
        if (transform)
            cluster_group_layers(p, &c->model, &g);
    }
    return ERR_OK;
}

int cluster_group_profile(struct profile *p, int tp, const struct link *node_link,
                          struct err *e)
{
    if (p->tp > 1)
        return err_set(e, ERR_INPUT, "--tp: the profile is a group's already (tp %d)", p->tp);
    if (cluster_check_tp(&p->model, tp, "--tp", e))
        return e->code;
    struct cost_group g = {
        .tp = tp,
        .dp = 1,
        .tp_efficiency = p->tp_efficiency > 0 ? p->tp_efficiency : 1.0,
        .node_link = *node_link,
        .tensor_bytes = cost_tp_tensor_bytes(&p->model),
        .dtype = p->model.dtype,
    };
    cluster_group_layers(p, &p->model, &g);
    p->tp = tp;
    return ERR_OK;
}

int cluster_group_apply(struct cluster *c, const char *file, struct err *e)
{
    int grouped = 0;
    for (int s = 0; s < c->n_stages; s++) {
        if (check_stage(c, file, s, e))
            return e->code;
        /* resolved here: a repartitioned cluster moves stages and their links */
        c->stages[s].dp_link = c->dp_link.present ? c->dp_link : cluster_link(c, s);
        grouped |= c->stages[s].tp > 1 || c->stages[s].dp > 1;
    }
    return grouped ? apply_groups(c, 1, e) : ERR_OK;
}

int cluster_group_grads(struct cluster *c, struct err *e)
{
    return c->grad_bytes == NULL ? apply_groups(c, 0, e) : ERR_OK;
}

void cluster_group_free(struct cluster *c)
{
    for (int k = 0; c->grad_bytes != NULL && k < c->n_profiles; k++)
        free(c->grad_bytes[k]);
    free(c->grad_bytes);
    c->grad_bytes = NULL;
}

double cluster_allreduce_ms(const struct cluster *c, int stage, int first, int last)
{
    const struct cluster_stage *st = &c->stages[stage];
    if (st->dp <= 1 || !st->dp_link.present)
        return 0; /* nothing crosses a link: no bytes to sum (a pool's group planned alone) */
    return cost_dp_allreduce_ms(&st->dp_link, st->dp, cluster_grad_bytes(c, stage, first, last));
}

int64_t cluster_grad_bytes(const struct cluster *c, int stage, int first, int last)
{
    const int64_t *grad = c->grad_bytes != NULL ? c->grad_bytes[c->stages[stage].profile] : NULL;
    int64_t sum = 0;
    for (int l = first; grad != NULL && l <= last; l++)
        sum += grad[l];
    return sum;
}

int cluster_group_no_stages(const cJSON *root, const char *file, struct err *e)
{
    const cJSON *pipes = cJSON_GetObjectItemCaseSensitive(root, "pipelines");
    if (cJSON_GetObjectItemCaseSensitive(root, "pool") != NULL)
        return err_set(e, ERR_INPUT,
                       "%s: pool: a pool of GPUs: ballast plan searches it (and takes no "
                       "\"stages\" or \"pipelines\" with it)",
                       file);
    if (pipes == NULL)
        return err_set(e, ERR_INPUT, "%s: stages: missing", file);
    if (cJSON_GetObjectItemCaseSensitive(root, "stages") != NULL)
        return err_set(e, ERR_INPUT,
                       "%s: stages and pipelines: give one pipeline's \"stages\" or a list of "
                       "\"pipelines\", not both",
                       file);
    return err_set(e, ERR_INPUT,
                   "%s: pipelines: %d pipelines: this command takes one pipeline (ballast plan "
                   "and ballast simulate take several)",
                   file, cJSON_GetArraySize(pipes));
}
