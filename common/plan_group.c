/* A plan stage's tensor- and data-parallel fields (plan.h). */
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
