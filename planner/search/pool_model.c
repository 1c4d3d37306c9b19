#include "pool_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "devices.h"
#include "jsonio.h"
#include "microbatch.h"
#include "model_kind.h"
#include "model_ops.h"
#include "repartition.h"

int64_t pool_model_batches(const struct pool_model *pm, int size)
{
    return pm->global_batch / pm->sizes[size];
}

/* "tp_profiles": [{"tp", "profile"}, ...], each tp from 2 to per_node, once. */
static int read_tp_profiles(const cJSON *obj, const char *file, const char *path,
                            struct pool_model_kind *out, struct err *e)
{
    static const char *const keys[] = {"tp", "profile", NULL};
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(obj, "tp_profiles");
    char sub[JSONIO_PATH_MAX];
    jsonio_path_key(sub, path, "tp_profiles");
    out->n_tp_profiles = 0;
    if (list == NULL)
        return ERR_OK;
    if (jsonio_expect_array(list, file, sub, e))
        return e->code;
    if (cJSON_GetArraySize(list) > POOL_TP_PROFILES_MAX)
        return err_set(e, ERR_INPUT, "%s: %s: %d profiles, at most %d", file, sub,
                       cJSON_GetArraySize(list), POOL_TP_PROFILES_MAX);
    for (const cJSON *it = list->child; it != NULL; it = it->next) {
        char ip[JSONIO_PATH_MAX];
        int64_t tp;
        int i = out->n_tp_profiles;
        jsonio_path_index(ip, sub, i);
        if (jsonio_expect_object(it, file, ip, e) || jsonio_check_keys(it, file, ip, keys, e) ||
            jsonio_int(it, file, ip, "tp", 2, out->per_node, &tp, e) ||
            jsonio_str(it, file, ip, "profile", &out->tp_path[i], e))
            return e->code;
        for (int j = 0; j < i; j++)
            if (out->tp_of[j] == tp)
                return err_set(e, ERR_INPUT, "%s: %s.tp: %lld is %s[%d]'s too", file, ip,
                               (long long)tp, sub, j);
        out->tp_of[i] = (int)tp;
        out->n_tp_profiles++;
    }
    return ERR_OK;
}

/* Kind k's tp_profiles loaded, each a profile of its device made for its tp (its "tp" says
 * so): a one-GPU profile there would be divided by tp once more. */
static int load_tp_profiles(const struct pool_model *pm, int k, struct pool_model_kind *kind,
                            struct err *e)
{
    for (int i = 0; i < kind->n_tp_profiles; i++) {
        char full[CLUSTER_PATH_MAX];
        struct profile *p = &kind->tp_profile[i];
        struct err inner;
        err_clear(&inner);
        cluster_profile_path(pm->file, kind->tp_path[i], full);
        if (profile_load(full, p, &inner))
            return err_set(e, inner.code, "%s: pool[%d].tp_profiles[%d].profile: %s", pm->file,
                           k, i, inner.msg);
        int same = strcmp(p->device.name, kind->device) == 0;
        if (p->tp != kind->tp_of[i] || !same)
            return err_set(e, ERR_INPUT,
                           "%s: pool[%d].tp_profiles[%d]: \"%s\" is %s, but this entry is for "
                           "tp %d of \"%s\" (make it with ballast profile --tp %d)",
                           pm->file, k, i, kind->tp_path[i],
                           !same ? "another device's profile"
                           : p->tp > 1 ? "a profile of another tp"
                                       : "a profile of one GPU",
                           kind->tp_of[i], kind->device, kind->tp_of[i]);
    }
    return ERR_OK;
}

/* Kind k's profile made for tp GPUs (tp_profiles), or NULL. */
static const struct profile *kind_tp_profile(const struct pool_model_kind *kind, int tp)
{
    for (int i = 0; i < kind->n_tp_profiles; i++)
        if (kind->tp_of[i] == tp)
            return &kind->tp_profile[i];
    return NULL;
}

static int read_kind(const cJSON *obj, const char *file, int k, struct pool_model_kind *out,
                     struct err *e)
{
    static const char *const keys[] = {"device",    "count",     "per_node", "memory_bytes",
                                       "profile",   "node_link", "host_link",
                                       "node_host_memory_bytes", "tp_profiles", NULL};
    char path[JSONIO_PATH_MAX];
    jsonio_path_index(path, "pool", k);
    out->per_node = 0;
    if (jsonio_expect_object(obj, file, path, e) || jsonio_check_keys(obj, file, path, keys, e) ||
        jsonio_str_copy(obj, file, path, "device", out->device, sizeof out->device, e) ||
        jsonio_int(obj, file, path, "count", 1, 1 << 20, &out->count, e) ||
        jsonio_int_opt(obj, file, path, "per_node", 1, 1 << 20, &out->per_node, e))
        return e->code;
    if (out->per_node > out->count)
        return err_set(e, ERR_INPUT,
                       "%s: %s.per_node: %lld GPUs a node, but the pool has only %lld of \"%s\"",
                       file, path, (long long)out->per_node, (long long)out->count, out->device);
    if (out->per_node == 0)
        out->per_node = out->count;
    return read_tp_profiles(obj, file, path, out, e);
}

static int read_pool(const cJSON *root, struct pool_model *pm, struct err *e)
{
    const cJSON *pool = cJSON_GetObjectItemCaseSensitive(root, "pool");
    if (jsonio_expect_array(pool, pm->file, "pool", e) ||
        jsonio_int(root, pm->file, "", "global_batch", 1, 1 << 30, &pm->global_batch, e) ||
        jsonio_int_opt(root, pm->file, "", "dp", 1, 1 << 30, &pm->only_dp, e))
        return e->code;
    pm->K = cJSON_GetArraySize(pool);
    if (pm->K < 1 || pm->K > POOL_KINDS_MAX)
        return err_set(e, ERR_INPUT, "%s: pool: %d device kinds, expected 1 to %d", pm->file,
                       pm->K, POOL_KINDS_MAX);
    for (int k = 0; k < pm->K; k++) {
        if (read_kind(cJSON_GetArrayItem(pool, k), pm->file, k, &pm->kind[k], e))
            return e->code;
        for (int j = 0; j < k; j++)
            if (strcmp(pm->kind[j].device, pm->kind[k].device) == 0)
                return err_set(e, ERR_INPUT, "%s: pool[%d].device: \"%s\" is pool[%d]'s too",
                               pm->file, k, pm->kind[k].device, j);
    }
    return ERR_OK;
}

/* Kind k as a cluster file of one stage (tp 1, dp 1, one micro-batch): the pool file's members
 * but the pool's own, with the kind's entry as its stage. */
static cJSON *kind_json(const cJSON *root, int k)
{
    static const char *const pool_only[] = {"pool", "global_batch", "dp", "micro_batch_sizes",
                                            "micro_batches", NULL};
    cJSON *out = cJSON_Duplicate(root, 1);
    cJSON *stage = out != NULL ? cJSON_Duplicate(
                                     cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root,
                                                                                         "pool"),
                                                        k),
                                     1)
                               : NULL;
    if (stage == NULL) {
        cJSON_Delete(out);
        return NULL;
    }
    for (int i = 0; pool_only[i] != NULL; i++)
        cJSON_DeleteItemFromObjectCaseSensitive(out, pool_only[i]);
    cJSON_AddNumberToObject(out, "micro_batches", 1);
    cJSON_DeleteItemFromObjectCaseSensitive(stage, "count");
    cJSON_DeleteItemFromObjectCaseSensitive(stage, "tp_profiles");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(out, "stages"), stage);
    return out;
}

/* A message about the one stage of kind_json's cluster names the pool's entry instead. */
static int name_kind(struct err *e, int k)
{
    char *at = strstr(e->msg, "stages[0]");
    if (at == NULL)
        return e->code;
    char tail[ERR_MSG_MAX];
    snprintf(tail, sizeof tail, "%s", at + strlen("stages[0]"));
    snprintf(at, sizeof e->msg - (size_t)(at - e->msg), "pool[%d]%s", k, tail);
    return e->code;
}

/* Kind k read as its one stage's cluster file reads it, with its profile. */
static int kind_cluster(const cJSON *root, const char *file, int k, struct cluster *c,
                        struct err *e)
{
    cJSON *json = kind_json(root, k);
    if (json == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int rc = cluster_parse(json, file, c, e);
    cJSON_Delete(json);
    return rc ? name_kind(e, k) : ERR_OK;
}

/* "micro_batch_sizes" (else the model's size alone): each divides the global batch, once. */
static int pool_read_sizes(const cJSON *root, struct pool_model *pm, struct err *e)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "micro_batch_sizes");
    const char *file = pm->file;
    pm->n_sizes = 1;
    pm->sizes[0] = pm->model.micro_batch;
    if (list == NULL && pm->global_batch % pm->model.micro_batch != 0) /* dealt exactly */
        return err_set(e, ERR_INPUT,
                       "%s: global_batch: %lld samples, not whole micro-batches of the "
                       "profiles' %d (give \"micro_batch_sizes\" dividing it)",
                       file, (long long)pm->global_batch, pm->model.micro_batch);
    if (list == NULL)
        return ERR_OK;
    if (jsonio_expect_array(list, file, "micro_batch_sizes", e))
        return e->code;
    pm->n_sizes = cJSON_GetArraySize(list);
    if (pm->n_sizes < 1 || pm->n_sizes > POOL_SIZES_MAX)
        return err_set(e, ERR_INPUT, "%s: micro_batch_sizes: %d sizes, expected 1 to %d", file,
                       pm->n_sizes, POOL_SIZES_MAX);
    for (int i = 0; i < pm->n_sizes; i++) {
        char path[JSONIO_PATH_MAX];
        int64_t b;
        jsonio_path_index(path, "micro_batch_sizes", i);
        if (jsonio_int_value(cJSON_GetArrayItem(list, i), file, path, 1, pm->global_batch, &b,
                             e))
            return e->code;
        if (pm->global_batch % b != 0)
            return err_set(e, ERR_INPUT, "%s: %s: %lld does not divide global_batch %lld", file,
                           path, (long long)b, (long long)pm->global_batch);
        for (int j = 0; j < i; j++)
            if (pm->sizes[j] == b)
                return err_set(e, ERR_INPUT, "%s: %s: %lld is micro_batch_sizes[%d] too", file,
                               path, (long long)b, j);
        if (b != pm->model.micro_batch && model_ops_of(&pm->model) == NULL)
            return err_set(e, ERR_INPUT,
                           "%s: %s: %lld, but the model is custom (\"%s\"): its profiles hold "
                           "micro-batch %d only and Ballast has no size functions to rescale "
                           "them",
                           file, path, (long long)b, pm->model.name, pm->model.micro_batch);
        pm->sizes[i] = (int)b;
    }
    return ERR_OK;
}

/* Kinds describe one model: the same model, and for a custom one the same layer names. */
static int check_model(const struct pool_model *pm, int k, const struct profile *p,
                       const struct profile *first, struct err *e)
{
    if (!model_equal(&p->model, &pm->model))
        return err_set(e, ERR_INPUT,
                       "%s: pool[%d].profile: describes a different model than pool[0]'s (a "
                       "pool's kinds train one model)",
                       pm->file, k);
    for (int l = 0; model_is_custom(&p->model) && l < p->n_layers; l++)
        if (strcmp(p->layers[l].name, first->layers[l].name) != 0)
            return err_set(e, ERR_INPUT,
                           "%s: pool[%d].profile: names layer %d \"%s\", but pool[0]'s profile "
                           "names it \"%s\" (profiles of one custom model list the same layers)",
                           pm->file, k, l, p->layers[l].name, first->layers[l].name);
    return ERR_OK;
}

/* Kind k's profile at every size not the model's, made from c's (its one stage) in memory. */
static int other_sizes(struct pool_model *pm, const struct plan_options *o,
                       const struct device_table *t, int k, const struct cluster *c,
                       double deadline, struct err *e)
{
    for (int i = 0; i < pm->n_sizes; i++) {
        if (i == pm->model_size)
            continue;
        if (clock_now_s() > deadline)
            return err_set(e, ERR_NOFIT,
                           "%s: pool: --time-limit passed while making the profiles at each "
                           "micro-batch size (%d sizes, %d kinds): no candidate was planned",
                           pm->file, pm->n_sizes, pm->K);
        struct cluster cb;
        struct microbatch_notes notes = {0};
        if (microbatch_cluster(c, t, o->estimate, pm->sizes[i], 1, &cb, &notes, e))
            return name_kind(e, k);
        pm->kind[k].profile[i] = cb.profiles[0];
        free(cb.profiles);
    }
    return ERR_OK;
}

/* Kind k: its stage, its profile at every size. */
static int load_kind(const cJSON *root, struct pool_model *pm, const struct plan_options *o,
                     const struct device_table *t, int k, double deadline, struct err *e)
{
    struct pool_model_kind *kind = &pm->kind[k];
    struct cluster c;
    if (kind_cluster(root, pm->file, k, &c, e))
        return e->code;
    int rc = ERR_OK;
    if (k == 0) {
        pm->model = c.model;
        pm->schedule = c.schedule;
        pm->reserve_bytes = c.reserve_bytes;
        pm->link = c.link;
        pm->dp_link = c.dp_link;
        pm->shard_optimizer = c.shard_optimizer;
        pm->dp_bucket_bytes = c.dp_bucket_bytes;
        if (c.schedule_auto || (c.schedule != SCHEDULE_1F1B && c.schedule != SCHEDULE_GPIPE))
            rc = err_set(e, ERR_INPUT, "%s: schedule: a pool is searched with schedules 1f1b "
                         "and gpipe (--repartition's); plan another schedule on the cluster of "
                         "the plan the search writes",
                         pm->file);
        if (rc == ERR_OK)
            rc = pool_read_sizes(root, pm, e);
        pm->model_size = -1;
        for (int i = 0; i < pm->n_sizes; i++)
            pm->model_size = pm->sizes[i] == pm->model.micro_batch ? i : pm->model_size;
    } else {
        rc = check_model(pm, k, &c.profiles[0], &pm->kind[0].profile[pm->model_size < 0
                                                                          ? 0
                                                                          : pm->model_size], e);
    }
    if (rc == ERR_OK)
        rc = load_tp_profiles(pm, k, kind, e);
    if (rc == ERR_OK)
        rc = other_sizes(pm, o, t, k, &c, deadline, e);
    if (rc == ERR_OK) {
        kind->stage = c.stages[0];
        if (pm->model_size >= 0) { /* moved, not copied */
            kind->profile[pm->model_size] = c.profiles[0];
            memset(&c.profiles[0], 0, sizeof c.profiles[0]);
        }
    }
    cluster_free(&c);
    return rc;
}

int pool_model_load(const cJSON *root, const char *file, const struct plan_options *o,
                    double deadline, struct pool_model *pm, struct err *e)
{
    memset(pm, 0, sizeof *pm);
    pm->file = file;
    if (read_pool(root, pm, e) || repart_cache_make(&pm->ranges, e))
        return e->code;
    /* the device table, read once, remakes the profiles at other micro-batch sizes */
    struct device_table t;
    int loaded = 0, rc = ERR_OK;
    if (cJSON_GetObjectItemCaseSensitive(root, "micro_batch_sizes") != NULL) {
        rc = devices_load(devices_default_file(), &t, e);
        loaded = rc == ERR_OK;
    }
    for (int k = 0; k < pm->K && rc == ERR_OK; k++)
        rc = load_kind(root, pm, o, loaded ? &t : NULL, k, deadline, e);
    if (loaded)
        devices_free(&t);
    if (rc)
        pool_model_free(pm);
    return rc;
}

void pool_model_free(struct pool_model *pm)
{
    for (int k = 0; k < POOL_KINDS_MAX; k++) {
        for (int i = 0; i < POOL_SIZES_MAX; i++)
            profile_free(&pm->kind[k].profile[i]);
        for (int i = 0; i < POOL_TP_PROFILES_MAX; i++)
            profile_free(&pm->kind[k].tp_profile[i]);
    }
    repart_cache_free(pm->ranges);
    memset(pm, 0, sizeof *pm);
}

/* A copy of p's costs (its provenance left behind: no plan reads it). */
static int kind_profile_copy(const struct profile *p, struct profile *out)
{
    *out = *p;
    out->provenance = NULL;
    out->layers = malloc((size_t)p->n_layers * sizeof *out->layers);
    if (out->layers == NULL)
        return -1;
    memcpy(out->layers, p->layers, (size_t)p->n_layers * sizeof *out->layers);
    return 0;
}

/* The cluster's profiles and stages, kind after kind. */
static int fill_stages(const struct pool_model *pm, const struct pool_pipe *p, struct cluster *c,
                       struct err *e)
{
    for (int k = 0, s = 0; k < pm->K; k++) {
        if (p->stages[k] == 0)
            continue;
        const struct pool_model_kind *kind = &pm->kind[k];
        /* at the model's micro-batch size: the profile made for this tp, if given */
        const struct profile *per_degree =
            p->size == pm->model_size ? kind_tp_profile(kind, p->tp[k]) : NULL;
        if (kind_profile_copy(per_degree != NULL ? per_degree : &kind->profile[p->size],
                              &c->profiles[c->n_profiles]))
            return err_set(e, ERR_FAIL, "out of memory");
        for (int j = 0; j < p->stages[k]; j++, s++) {
            struct cluster_stage *st = &c->stages[s];
            *st = kind->stage;
            st->profile = c->n_profiles;
            st->tp = p->tp[k];
            st->dp = p->dp;
            st->host_memory_bytes = kind->stage.host_memory_bytes * p->tp[k];
        }
        c->n_profiles++;
    }
    return ERR_OK;
}

int pool_model_cluster(const struct pool_model *pm, const struct pool_pipe *p,
                       struct cluster *c, struct err *e)
{
    int S = 0, used = 0;
    memset(c, 0, sizeof *c);
    for (int k = 0; k < pm->K; k++)
        S += p->stages[k], used += p->stages[k] > 0;
    c->schedule = pm->schedule;
    c->micro_batches = p->M;
    c->reserve_bytes = pm->reserve_bytes;
    c->link = pm->link;
    c->dp_link = pm->dp_link;
    c->shard_optimizer = pm->shard_optimizer;
    c->dp_bucket_bytes = pm->dp_bucket_bytes;
    c->model = pm->kind[0].profile[p->size].model;
    c->n_layers = model_layer_count(&c->model);
    if (S < 1 || S > c->n_layers)
        return err_set(e, ERR_INPUT, "%s: pool: a pipeline of %d stages, but the model has %d "
                                     "layers",
                       pm->file, S, c->n_layers);
    c->stages = calloc((size_t)S, sizeof *c->stages);
    c->profiles = calloc((size_t)used, sizeof *c->profiles);
    if (c->stages == NULL || c->profiles == NULL) {
        cluster_free(c);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    c->n_stages = S;
    int rc = fill_stages(pm, p, c, e);
    for (int s = 0; rc == ERR_OK && s < S; s++)
        cluster_even_split(c->n_layers, S, s, &c->stages[s].first, &c->stages[s].last);
    if (rc == ERR_OK)
        rc = cluster_group_apply(c, pm->file, e);
    if (rc == ERR_OK && p->reduce_alone)
        rc = cluster_group_grads(c, e);
    if (rc)
        cluster_free(c);
    return rc;
}
