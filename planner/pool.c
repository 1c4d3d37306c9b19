#include "pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonio.h"

struct pool_kind {
    const cJSON *entry;
    char device[PROFILE_NAME_MAX];
    int64_t count, per_node;
    /* per tp (NULL where it cannot split the model or its stage does not parse alone): the
     * layers' fwd + bwd on a stage of tp GPUs of the kind, and their sum (pool_layers) */
    double **layer_ms, *work_ms;
    /* per tp: the all-reduce over the current dp of the first layer's gradients alone */
    double *first_reduce_ms;
    int64_t n_tp; /* per_node + 1 */
};

/* The best candidates by lower bound (first pass), planned before the rest. */
#define POOL_FIRST 16

struct pool_candidate {
    long index; /* in the exhaustive order */
    double bound;
    int dp, tp[POOL_KINDS_MAX], stages[POOL_KINDS_MAX];
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
    int64_t only_dp; /* "dp"?: the one dp searched; 0: every dp */
    int dp, tp[POOL_KINDS_MAX], stages[POOL_KINDS_MAX];
    struct plan *best;
    int have_best;
    long best_index;
    struct pool_result *r;
    /* the pruning: the pass (0: rank the bounds, 1: plan what they leave), the candidate's
     * index and the first ones */
    int prune, pass;
    long index;
    struct pool_candidate first[POOL_FIRST];
    int n_first;
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
        jsonio_int(st->root, st->file, "", "global_batch", 1, 1 << 30, &st->global_batch, e) ||
        jsonio_int_opt(st->root, st->file, "", "dp", 1, 1 << 30, &st->only_dp, e))
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
    cJSON_DeleteItemFromObjectCaseSensitive(out, "dp");
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

static int candidate_M(const struct pool_state *st)
{
    return (int)(st->global_batch / ((int64_t)st->dp * st->model.micro_batch));
}

/* Plans the candidate in st; keeps it when it fits and steps faster than the best. */
static int evaluate(struct pool_state *st, struct err *e)
{
    int M = candidate_M(st);
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
    /* ties go to the earliest in the exhaustive order, as without pruning */
    if (st->have_best && (p.iteration_ms > st->best->iteration_ms ||
                          (p.iteration_ms == st->best->iteration_ms &&
                           st->index > st->best_index))) {
        plan_free(&p);
        return ERR_OK;
    }
    if (st->have_best)
        plan_free(st->best);
    *st->best = p;
    st->have_best = 1;
    st->best_index = st->index;
    st->r->dp = st->dp;
    st->r->micro_batches = M;
    memcpy(st->r->tp, st->tp, sizeof st->tp);
    memcpy(st->r->stages, st->stages, sizeof st->stages);
    return ERR_OK;
}

/* The cluster of one stage of kind k, tp t and dp replicas, one micro-batch. */
static int stage_cluster(struct pool_state *st, int k, int t, int dp, struct cluster *c,
                         struct err *e)
{
    st->dp = dp;
    for (int j = 0; j < st->K && j < POOL_KINDS_MAX; j++)
        st->tp[j] = j == k ? t : 1, st->stages[j] = j == k;
    cJSON *json = candidate_json(st, 1);
    if (json == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int rc = cluster_parse(json, st->file, c, e);
    cJSON_Delete(json);
    return rc;
}

/* Kind k's stage of tp t alone, dp replicas, as the cluster file reads it: its layers' fwd +
 * bwd in `ms` (L of them, unless NULL) and the all-reduce of its first layer's gradients.
 * ERR_INPUT when it does not parse. */
static int stage_alone(struct pool_state *st, int k, int t, int dp, double *ms,
                       double *first_reduce_ms, struct err *e)
{
    struct cluster c;
    int rc = stage_cluster(st, k, t, dp, &c, e);
    if (rc)
        return rc;
    const struct profile *p = cluster_stage_profile(&c, 0);
    for (int l = 0; ms != NULL && l < p->n_layers; l++)
        ms[l] = p->layers[l].fwd_ms + p->layers[l].bwd_ms;
    *first_reduce_ms = cluster_allreduce_ms(&c, 0, 0, 0);
    cluster_free(&c);
    return ERR_OK;
}

/* Each kind's layer_ms and work_ms per tp. */
static int pool_layers(struct pool_state *st, struct err *e)
{
    int L = model_layer_count(&st->model);
    for (int k = 0; k < st->K && k < POOL_KINDS_MAX; k++) {
        struct pool_kind *kind = &st->kind[k];
        kind->n_tp = kind->per_node + 1;
        kind->layer_ms = calloc((size_t)kind->n_tp, sizeof *kind->layer_ms);
        kind->work_ms = calloc((size_t)kind->n_tp, sizeof *kind->work_ms);
        kind->first_reduce_ms = calloc((size_t)kind->n_tp, sizeof *kind->first_reduce_ms);
        if (kind->layer_ms == NULL || kind->work_ms == NULL || kind->first_reduce_ms == NULL)
            return err_set(e, ERR_FAIL, "out of memory");
        for (int t = 1; t < kind->n_tp; t++) {
            struct err skip;
            double unused, *ms;
            err_clear(&skip);
            if (cluster_check_tp(&st->model, t, "", &skip))
                continue;
            if ((ms = calloc((size_t)L, sizeof *ms)) == NULL)
                return err_set(e, ERR_FAIL, "out of memory");
            if (stage_alone(st, k, t, 1, ms, &unused, &skip)) {
                free(ms);
                continue;
            }
            kind->layer_ms[t] = ms;
            for (int l = 0; l < L; l++)
                kind->work_ms[t] += ms[l];
        }
    }
    return ERR_OK;
}

static void pool_layers_free(struct pool_state *st)
{
    for (int k = 0; k < st->K && k < POOL_KINDS_MAX; k++) {
        for (int t = 0; st->kind[k].layer_ms != NULL && t < st->kind[k].n_tp; t++)
            free(st->kind[k].layer_ms[t]);
        free(st->kind[k].layer_ms);
        free(st->kind[k].work_ms);
        free(st->kind[k].first_reduce_ms);
    }
}

/* A lower bound on the candidate's step, with w_kl the time of layer l on kind k (at its tp),
 * W_k their sum and S_k its stages. X, the end of stage 0's last backward: stage b's last
 * backward ends at least P_b + M T_b after the step starts (T_b its fwd + bwd of a micro-batch,
 * P_b the T of the stages before it, which micro-batch 0's forward and the last backward
 * cross); stage 0's gradients are reduced after X. Steady: X >= M max_b T_b, and max_b T_b is
 * at least the fractional assignment's (an LP), whose dual with weights 1/W_k gives
 * sum_l min_k (w_kl / W_k) / sum_k (S_k / W_k). Filled: T_b <= (X - P_b) / M gives
 * sum_s T_s <= X (1 - (1 - 1/M)^S), and sum_s T_s >= sum_l min_k w_kl. Plus the least
 * reduction of the first layer alone. Scaled down a little so that rounding never lifts it
 * over the simulated step. */
static double candidate_bound(const struct pool_state *st)
{
    const double *w[POOL_KINDS_MAX];
    double W[POOL_KINDS_MAX], weights = 0, reduce = INFINITY, M = candidate_M(st);
    int used = 0, S = 0;
    for (int k = 0; k < st->K && k < POOL_KINDS_MAX; k++) {
        if (st->stages[k] == 0)
            continue;
        const struct pool_kind *kind = &st->kind[k];
        w[used] = kind->layer_ms[st->tp[k]];
        W[used] = kind->work_ms[st->tp[k]];
        if (w[used] == NULL || !(W[used] > 0))
            return 0; /* nothing known of its layers: no bound */
        weights += st->stages[k] / W[used];
        reduce = fmin(reduce, kind->first_reduce_ms[st->tp[k]]);
        S += st->stages[k];
        used++;
    }
    double shares = 0, least = 0;
    for (int l = 0; l < model_layer_count(&st->model); l++) {
        double share = INFINITY, ms = INFINITY;
        for (int u = 0; u < used; u++) {
            share = fmin(share, w[u][l] / W[u]);
            ms = fmin(ms, w[u][l]);
        }
        shares += share;
        least += ms;
    }
    double steady = M * shares / weights, filled = least / (1 - pow(1 - 1 / M, S));
    return (fmax(steady, filled) + reduce) * (1 - 1e-9);
}

/* Each kind's first_reduce_ms at the current dp (a stage that does not parse alone: 0). */
static int pool_reduce(struct pool_state *st, struct err *e)
{
    int dp = st->dp;
    for (int k = 0; k < st->K && k < POOL_KINDS_MAX; k++)
        for (int t = 1; t < st->kind[k].n_tp; t++) {
            struct err skip;
            err_clear(&skip);
            st->kind[k].first_reduce_ms[t] = 0;
            if (st->kind[k].layer_ms[t] == NULL)
                continue; /* tp t cannot split the model, or the stage did not parse */
            if (stage_alone(st, k, t, dp, NULL, &st->kind[k].first_reduce_ms[t], &skip))
                st->kind[k].first_reduce_ms[t] = 0;
        }
    st->dp = dp;
    return e->code;
}

/* Whether a candidate of this bound and index could replace the best (evaluate's order). */
static int may_win(const struct pool_state *st, double bound, long index)
{
    if (!st->have_best)
        return 1;
    return bound < st->best->iteration_ms ||
           (bound == st->best->iteration_ms && index < st->best_index);
}

/* Keeps the candidate among the POOL_FIRST least bounds (ties: earliest). */
static void rank_first(struct pool_state *st, double bound)
{
    int i = st->n_first < POOL_FIRST ? st->n_first++ : POOL_FIRST;
    while (i > 0 && st->first[i - 1].bound > bound) {
        if (i < POOL_FIRST)
            st->first[i] = st->first[i - 1];
        i--;
    }
    if (i < POOL_FIRST) {
        struct pool_candidate *c = &st->first[i];
        *c = (struct pool_candidate){.index = st->index, .bound = bound, .dp = st->dp};
        memcpy(c->tp, st->tp, sizeof c->tp);
        memcpy(c->stages, st->stages, sizeof c->stages);
    }
}

static int is_first(const struct pool_state *st, long index)
{
    for (int i = 0; i < st->n_first; i++)
        if (st->first[i].index == index)
            return 1;
    return 0;
}

/* One candidate of the enumeration: planned, ranked or skipped as the pass says. */
static int visit(struct pool_state *st, struct err *e)
{
    if (!st->prune)
        return evaluate(st, e);
    double bound = candidate_bound(st);
    if (st->pass == 0) {
        rank_first(st, bound);
        return ERR_OK;
    }
    if (is_first(st, st->index) || !may_win(st, bound, st->index))
        return ERR_OK;
    return evaluate(st, e);
}

/* Every tp and stage count of kind k and the kinds after it, `used` stages so far (at most
 * the model's layers, at least one). */
static int choose_kind(struct pool_state *st, int k, int used, struct err *e)
{
    if (k >= st->K || k >= POOL_KINDS_MAX) { /* K <= POOL_KINDS_MAX (read_pool); gcc's
                                              * array-bounds check wants it said */
        if (used < 1)
            return ERR_OK;
        int rc = visit(st, e);
        st->index++;
        return rc;
    }
    int L = model_layer_count(&st->model);
    st->tp[k] = 1;
    st->stages[k] = 0; /* the kind unused */
    if (choose_kind(st, k + 1, used, e))
        return e->code;
    for (int t = 1; t <= st->kind[k].per_node; t++) {
        struct err skip;
        err_clear(&skip);
        if (cluster_check_tp(&st->model, t, "", &skip))
            continue;
        st->tp[k] = t;
        for (int64_t s = 1; s * t * st->dp <= st->kind[k].count && used + s <= L; s++) {
            st->stages[k] = (int)s;
            if (choose_kind(st, k + 1, used + (int)s, e))
                return e->code;
        }
    }
    return ERR_OK;
}

/* Every dp dividing the global batch, and under it every choose_kind. */
static int enumerate(struct pool_state *st, struct err *e)
{
    st->index = 0;
    for (int dp = 1; dp * (int64_t)st->model.micro_batch <= st->global_batch; dp++) {
        if (st->global_batch % ((int64_t)dp * st->model.micro_batch) != 0 ||
            (st->only_dp != 0 && dp != st->only_dp))
            continue;
        st->dp = dp;
        if (st->prune && pool_reduce(st, e))
            return e->code;
        if (choose_kind(st, 0, 0, e))
            return e->code;
    }
    return ERR_OK;
}

/* Plans the first candidates in the order of their bounds (a good best early), then every
 * other one whose bound could beat the best. */
static int search_pruned(struct pool_state *st, struct err *e)
{
    st->pass = 0;
    if (enumerate(st, e))
        return e->code;
    for (int i = 0; i < st->n_first; i++) {
        const struct pool_candidate *c = &st->first[i];
        if (!may_win(st, c->bound, c->index))
            continue;
        st->dp = c->dp;
        st->index = c->index;
        memcpy(st->tp, c->tp, sizeof st->tp);
        memcpy(st->stages, c->stages, sizeof st->stages);
        if (evaluate(st, e))
            return e->code;
    }
    st->pass = 1;
    return enumerate(st, e);
}

/* The pool's model: its first kind as one stage (its profile is read and checked). */
static int pool_model(struct pool_state *st, struct err *e)
{
    struct cluster c;
    int rc = stage_cluster(st, 0, 1, 1, &c, e);
    if (rc == ERR_OK) {
        st->model = c.model;
        cluster_free(&c);
    }
    return rc;
}

int pool_search_pruned(const char *file, const struct plan_options *o, int prune,
                       struct plan *best, struct pool_result *r, struct err *e)
{
    memset(r, 0, sizeof *r);
    if (o->method != METHOD_OPTIMAL)
        return err_set(e, ERR_INPUT, "%s: pool: the pool search plans with --method optimal",
                       file);
    struct pool_state st = {.file = file, .o = o, .best = best, .r = r, .prune = prune};
    st.root = jsonio_read(file, e);
    if (st.root == NULL)
        return e->code;
    int rc = read_pool(&st, e);
    if (rc == ERR_OK)
        rc = pool_model(&st, e);
    if (rc == ERR_OK && prune)
        rc = pool_layers(&st, e);
    if (rc == ERR_OK)
        rc = prune ? search_pruned(&st, e) : enumerate(&st, e);
    r->n_kinds = st.K;
    for (int k = 0; k < st.K; k++) {
        snprintf(r->device[k], sizeof r->device[k], "%s", st.kind[k].device);
    }
    pool_layers_free(&st);
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

int pool_search(const char *file, const struct plan_options *o, struct plan *best,
                struct pool_result *r, struct err *e)
{
    return pool_search_pruned(file, o, 1, best, r, e);
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

int pool_info_read(const char *file, const cJSON *root, struct pool_info *info, struct err *e)
{
    struct pool_state st = {.file = file, .root = root};
    if (read_pool(&st, e) || pool_model(&st, e))
        return e->code;
    memset(info, 0, sizeof *info);
    info->n_kinds = st.K;
    for (int k = 0; k < st.K && k < POOL_KINDS_MAX; k++) {
        snprintf(info->device[k], sizeof info->device[k], "%s", st.kind[k].device);
        info->count[k] = st.kind[k].count;
        info->per_node[k] = st.kind[k].per_node;
    }
    info->global_batch = st.global_batch;
    info->only_dp = st.only_dp;
    info->model = st.model;
    return ERR_OK;
}

int pool_kind_cluster(const char *file, const cJSON *root, int k, int tp, int stages, int dp,
                      int M, struct cluster *c, struct err *e)
{
    struct pool_state st = {.file = file, .root = root, .dp = dp};
    if (read_pool(&st, e))
        return e->code;
    for (int j = 0; j < st.K && j < POOL_KINDS_MAX; j++)
        st.tp[j] = j == k ? tp : 1, st.stages[j] = j == k ? stages : 0;
    cJSON *json = candidate_json(&st, M);
    if (json == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int rc = cluster_parse(json, file, c, e);
    cJSON_Delete(json);
    return rc;
}
