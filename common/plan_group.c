/* A plan stage's tensor- and data-parallel fields, and the plan's dealing of micro-batches to
 * its replicas (plan.h). */
#include <stdlib.h>

#include "jsonio.h"
#include "plan.h"

void plan_group_to_json(const struct plan_stage *st, cJSON *so)
{
    if (st->tp > 1)
        cJSON_AddNumberToObject(so, "tp", st->tp);
    if (st->dp > 1)
        cJSON_AddNumberToObject(so, "dp", st->dp);
    if (st->shard_optimizer)
        cJSON_AddBoolToObject(so, "shard_optimizer", 1);
    if (st->allreduce_bytes == 0)
        return;
    jsonio_add_int(so, "allreduce_bytes", st->allreduce_bytes);
    jsonio_add_int(so, "dp_bucket_bytes", st->dp_bucket_bytes);
    if (st->dp_link.present)
        cJSON_AddItemToObject(so, "dp_link", link_to_json(&st->dp_link));
}

int plan_group_from_json(const cJSON *so, const char *file, const char *path,
                         struct plan_stage *st, struct err *e)
{
    int64_t tp = 1, dp = 1;
    st->allreduce_bytes = 0;
    st->dp_bucket_bytes = 0; /* a plan from before buckets: one reduction */
    st->shard_optimizer = 0;
    if (cJSON_GetObjectItemCaseSensitive(so, "shard_optimizer") != NULL &&
        jsonio_bool(so, file, path, "shard_optimizer", &st->shard_optimizer, e))
        return e->code;
    if (jsonio_int_opt(so, file, path, "tp", 1, 1024, &tp, e) ||
        jsonio_int_opt(so, file, path, "dp", 1, 1 << 20, &dp, e) ||
        jsonio_int_opt(so, file, path, "allreduce_bytes", 0, JSONIO_INT_MAX,
                       &st->allreduce_bytes, e) ||
        jsonio_int_opt(so, file, path, "dp_bucket_bytes", 0, JSONIO_INT_MAX,
                       &st->dp_bucket_bytes, e))
        return e->code;
    st->tp = (int)tp;
    st->dp = (int)dp;
    /* the layer costs are one replica's share of a sharded optimizer state (cost.h) */
    for (int l = 0; l < plan_stage_layer_count(st); l++)
        st->layers[l].optimizer_shards = st->shard_optimizer && dp > 1 ? (int)dp : 1;
    const cJSON *link = cJSON_GetObjectItemCaseSensitive(so, "dp_link");
    char lp[JSONIO_PATH_MAX];
    jsonio_path_key(lp, path, "dp_link");
    if (link != NULL && link_from_json(link, file, lp, 0, &st->dp_link, e))
        return e->code;
    return ERR_OK;
}

int plan_group_check(const struct plan *p, const char *file, struct err *e)
{
    for (int s = 1; s < p->n_stages; s++)
        if (p->stages[s].dp != p->stages[0].dp)
            return err_set(e, ERR_INPUT,
                           "%s: stages[%d].dp: %d, but stages[0].dp is %d: every stage of a "
                           "pipeline is replicated alike",
                           file, s, p->stages[s].dp, p->stages[0].dp);
    return ERR_OK;
}

int64_t plan_batches(const struct plan *p)
{
    int dp = p->n_stages > 0 ? p->stages[0].dp : 1;
    int64_t sum = 0;
    for (int r = 0; r < dp; r++)
        sum += p->replica_micro_batches != NULL ? p->replica_micro_batches[r] : p->micro_batches;
    return sum;
}

void plan_dealing_to_json(const struct plan *p, cJSON *o)
{
    if (p->replica_micro_batches == NULL)
        return;
    cJSON *list = cJSON_AddArrayToObject(o, "replica_micro_batches");
    for (int r = 0; r < p->stages[0].dp; r++)
        cJSON_AddItemToArray(list, cJSON_CreateNumber(p->replica_micro_batches[r]));
}

int plan_dealing_from_json(const cJSON *root, const char *file, struct plan *p, struct err *e)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "replica_micro_batches");
    int dp = p->stages[0].dp, most = 0;
    if (list == NULL)
        return ERR_OK;
    if (jsonio_expect_array(list, file, "replica_micro_batches", e))
        return e->code;
    if (cJSON_GetArraySize(list) != dp)
        return err_set(e, ERR_INPUT,
                       "%s: replica_micro_batches: %d numbers, but the stages' dp is %d (one a "
                       "replica)",
                       file, cJSON_GetArraySize(list), dp);
    if ((p->replica_micro_batches = malloc((size_t)dp * sizeof *p->replica_micro_batches)) ==
        NULL)
        return err_set(e, ERR_FAIL, "%s: out of memory", file);
    for (int r = 0; r < dp; r++) {
        char path[JSONIO_PATH_MAX];
        int64_t m;
        jsonio_path_index(path, "replica_micro_batches", r);
        if (jsonio_int_value(cJSON_GetArrayItem(list, r), file, path, 1, p->micro_batches, &m,
                             e))
            return e->code;
        p->replica_micro_batches[r] = (int)m;
        most = (int)m > most ? (int)m : most;
    }
    if (most != p->micro_batches)
        return err_set(e, ERR_INPUT,
                       "%s: replica_micro_batches: the most is %d, but micro_batches is %d (the "
                       "plan's costs are its busiest replica's)",
                       file, most, p->micro_batches);
    return ERR_OK;
}
