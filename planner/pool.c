#include "pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonio.h"

struct pool_kind {
    const cJSON *entry;
    char device[PROFILE_NAME_MAX];
    int64_t count, per_node;
};

/* The search's state: the file, the kinds, the candidate being built and the best so far. */
struct pool_state {
    const char *file;
    const cJSON *root;
    const struct plan_options *o;
    struct pool_kind kind[POOL_KINDS_MAX];
    int K;
    struct model model;
    int64_t global_batch;
    int dp, tp[POOL_KINDS_MAX], stages[POOL_KINDS_MAX];
    struct plan *best;
    int have_best;
    struct pool_result *r;
};

int pool_file_check(const char *file, int *is_pool, struct err *e)
{
    cJSON *root = jsonio_read(file, e);
    if (root == NULL)
        return e->code;
    *is_pool = cJSON_GetObjectItemCaseSensitive(root, "pool") != NULL;
    cJSON_Delete(root);
    return ERR_OK;
}

static int read_kind(const cJSON *obj, const char *file, int k, struct pool_kind *out,
                     struct err *e)
{
    static const char *const keys[] = {"device",  "count",     "per_node", "memory_bytes",
                                       "profile", "node_link", NULL};
    char path[JSONIO_PATH_MAX];
    jsonio_path_index(path, "pool", k);
    out->entry = obj;
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
    return ERR_OK;
}

static int read_pool(struct pool_state *st, struct err *e)
{
    const cJSON *pool = cJSON_GetObjectItemCaseSensitive(st->root, "pool");
    if (jsonio_expect_array(pool, st->file, "pool", e) ||
        jsonio_int(st->root, st->file, "", "global_batch", 1, 1 << 30, &st->global_batch, e))
        return e->code;
    st->K = cJSON_GetArraySize(pool);
    if (st->K < 1 || st->K > POOL_KINDS_MAX)
        return err_set(e, ERR_INPUT, "%s: pool: %d device kinds, expected 1 to %d", st->file,
                       st->K, POOL_KINDS_MAX);
    for (int k = 0; k < st->K; k++) {
        if (read_kind(cJSON_GetArrayItem(pool, k), st->file, k, &st->kind[k], e))
            return e->code;
        for (int j = 0; j < k; j++)
            if (strcmp(st->kind[j].device, st->kind[k].device) == 0)
                return err_set(e, ERR_INPUT, "%s: pool[%d].device: \"%s\" is pool[%d]'s too",
                               st->file, k, st->kind[k].device, j);
    }
    return ERR_OK;
}

/* The candidate as a cluster file: the pool file's members but "pool" and "global_batch",
 * with its micro-batches and its stages, kind after kind. */
static cJSON *candidate_json(const struct pool_state *st, int micro_batches)
{
    cJSON *out = cJSON_Duplicate(st->root, 1);
    if (out == NULL)
        return NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(out, "pool");
    cJSON_DeleteItemFromObjectCaseSensitive(out, "global_batch");
    cJSON_DeleteItemFromObjectCaseSensitive(out, "micro_batches");
    cJSON_AddNumberToObject(out, "micro_batches", micro_batches);
    cJSON *stages = cJSON_AddArrayToObject(out, "stages");
    for (int k = 0; k < st->K; k++)
        for (int s = 0; s < st->stages[k]; s++) {
            cJSON *stage = cJSON_Duplicate(st->kind[k].entry, 1);
            cJSON_DeleteItemFromObjectCaseSensitive(stage, "count");
            cJSON_DeleteItemFromObjectCaseSensitive(stage, "per_node");
            cJSON_AddNumberToObject(stage, "per_node", (double)st->kind[k].per_node);
            cJSON_AddNumberToObject(stage, "tp", st->tp[k]);
            cJSON_AddNumberToObject(stage, "dp", st->dp);
            cJSON_AddItemToArray(stages, stage);
        }
    return out;
}

/* Plans the candidate in st; keeps it when it fits and steps faster than the best. */
static int evaluate(struct pool_state *st, struct err *e)
{
    int S = 0;
    for (int k = 0; k < st->K; k++)
        S += st->stages[k];
    if (S < 1 || S > model_layer_count(&st->model))
        return ERR_OK;
    int M = (int)(st->global_batch / ((int64_t)st->dp * st->model.micro_batch));
    cJSON *json = candidate_json(st, M);
    struct cluster c;
    struct plan p;
    struct plan_options o = *st->o;
    o.repartition = 1;
    if (json == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int rc = cluster_parse(json, st->file, &c, e);
    cJSON_Delete(json);
    if (rc)
        return rc;
    rc = planner_make(&c, &o, &p, e);
    cluster_free(&c);
    st->r->candidates++;
    if (rc == ERR_NOFIT) {
        err_clear(e);
        return ERR_OK;
    }
    if (rc)
        return rc;
    st->r->fitted++;
    if (st->have_best && p.iteration_ms >= st->best->iteration_ms) {
        plan_free(&p);
        return ERR_OK;
    }
    if (st->have_best)
        plan_free(st->best);
    *st->best = p;
    st->have_best = 1;
    st->r->dp = st->dp;
    st->r->micro_batches = M;
    memcpy(st->r->tp, st->tp, sizeof st->tp);
    memcpy(st->r->stages, st->stages, sizeof st->stages);
    return ERR_OK;
}

/* Every tp and stage count of kind k and the kinds after it. */
static int choose_kind(struct pool_state *st, int k, struct err *e)
{
    if (k >= st->K || k >= POOL_KINDS_MAX) /* K <= POOL_KINDS_MAX (read_pool); gcc's
                                             * array-bounds check wants it said */
        return evaluate(st, e);
    st->tp[k] = 1;
    st->stages[k] = 0; /* the kind unused */
    if (choose_kind(st, k + 1, e))
        return e->code;
    for (int t = 1; t <= st->kind[k].per_node; t++) {
        struct err skip;
        err_clear(&skip);
        if (cluster_check_tp(&st->model, t, "", &skip))
            continue;
        st->tp[k] = t;
        for (int64_t s = 1; s * t * st->dp <= st->kind[k].count; s++) {
            st->stages[k] = (int)s;
            if (choose_kind(st, k + 1, e))
                return e->code;
        }
    }
    return ERR_OK;
}

/* The pool's model: its first kind as one stage (its profile is read and checked). */
static int pool_model(struct pool_state *st, struct err *e)
{
    st->dp = 1;
    for (int k = 0; k < st->K; k++)
        st->tp[k] = 1, st->stages[k] = k == 0;
    cJSON *json = candidate_json(st, 1);
    struct cluster c;
    if (json == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int rc = cluster_parse(json, st->file, &c, e);
    cJSON_Delete(json);
    if (rc == ERR_OK) {
        st->model = c.model;
        cluster_free(&c);
    }
    return rc;
}

int pool_search(const char *file, const struct plan_options *o, struct plan *best,
                struct pool_result *r, struct err *e)
{
    memset(r, 0, sizeof *r);
    if (o->method != METHOD_OPTIMAL)
        return err_set(e, ERR_INPUT, "%s: pool: the pool search plans with --method optimal",
                       file);
    struct pool_state st = {.file = file, .o = o, .best = best, .r = r};
    st.root = jsonio_read(file, e);
    if (st.root == NULL)
        return e->code;
    int rc = read_pool(&st, e);
    if (rc == ERR_OK)
        rc = pool_model(&st, e);
    for (int dp = 1; rc == ERR_OK && dp * (int64_t)st.model.micro_batch <= st.global_batch; dp++) {
        if (st.global_batch % ((int64_t)dp * st.model.micro_batch) != 0)
            continue;
        st.dp = dp;
        rc = choose_kind(&st, 0, e);
    }
    r->n_kinds = st.K;
    for (int k = 0; k < st.K; k++)
        snprintf(r->device[k], sizeof r->device[k], "%s", st.kind[k].device);
    cJSON_Delete((cJSON *)st.root);
    if (rc == ERR_OK && !st.have_best)
        rc = err_set(e, ERR_NOFIT,
                     "%s: pool: none of the %ld candidates (dp, tp and stages per device kind) "
                     "fits",
                     file, r->candidates);
    if (rc && st.have_best)
        plan_free(best);
    return rc;
}

void pool_print(FILE *f, const struct pool_result *r)
{
    fprintf(f, "pool: %ld candidates planned, %ld fit; the fastest: dp %d, %d micro-batches a "
               "replica;",
            r->candidates, r->fitted, r->dp, r->micro_batches);
    for (int k = 0; k < r->n_kinds; k++)
        fprintf(f, " %s %d stages of tp %d%s", r->device[k], r->stages[k], r->tp[k],
                k + 1 < r->n_kinds ? "," : "\n");
}
