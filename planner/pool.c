#include "pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cost.h"
#include "jsonio.h"

/* A candidate's --repartition gets the time left over this many. */
#define POOL_TIME_SHARE 4

struct pool_kind {
    const cJSON *entry;
    char device[PROFILE_NAME_MAX];
    int64_t count, per_node;
    /* per tp (NULL where it cannot split the model or its stage does not parse alone): the
     * layers' fwd + bwd on a stage of tp GPUs of the kind (pool_layers) */
    double **layer_ms;
    /* per tp, at the current dp (pool_reduce): each layer's share of its stage's tail (the
     * gradient all-reduce past its latency, and the optimizer step) and the state bytes a GPU
     * keeps for it; the first layer's whole tail alone */
    double **tail_ms, *first_tail_ms;
    int64_t **state;
    int64_t capacity; /* a GPU's memory less the cluster's reserve */
    int64_t n_tp;     /* per_node + 1 */
};

/* A candidate of the enumeration with its lower bound (candidate_bound). */
struct pool_candidate {
    long index; /* in the exhaustive order */
    double bound;
    int dp;
    short tp[POOL_KINDS_MAX], stages[POOL_KINDS_MAX];
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
    long index; /* the candidate's, in the exhaustive order */
    struct plan *best;
    int have_best;
    long best_index;
    struct pool_result *r;
    /* the pruned search collects every candidate with its bound, then plans them in order */
    int prune;
    struct pool_candidate *cands;
    long n_cands, cap_cands;
    double deadline; /* CLOCK_MONOTONIC seconds (INFINITY: no --time-limit) */
    double reduce_latency_ms; /* a stage's all-reduce at the current dp with no bytes */
    /* the least certified bound over the candidates decided so far */
    double lower_bound;
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

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The candidate's --repartition options: the best step so far as its cutoff (the search's
 * bound holds for recompute only, so not with offload or the host optimizer), and a share of
 * the time left. */
static struct plan_options candidate_options(const struct pool_state *st)
{
    struct plan_options o = *st->o;
    o.repartition = 1;
    o.cutoff_ms = st->prune && st->have_best && o.actions == PLAN_ACTION_RECOMPUTE
                      ? st->best->iteration_ms
                      : 0;
    if (!isinf(st->deadline))
        o.time_limit_s = fmax((st->deadline - now_s()) / POOL_TIME_SHARE, 1e-3);
    return o;
}

/* What the candidate's planning proved: its certified bound (at least `bound`, INFINITY when
 * nothing fits), into the pool's, and whether it searched to the end. */
static void candidate_proved(struct pool_state *st, int rc, const struct plan *p, double bound)
{
    double proved = rc == ERR_NOFIT && !p->search.present ? INFINITY : bound;
    if (p->search.present) {
        proved = fmax(proved, p->search.lower_bound);
        st->r->nodes += p->search.nodes;
        st->r->splits += p->search.splits;
        st->r->exhausted &= p->search.exhausted;
    }
    st->lower_bound = fmin(st->lower_bound, proved);
}

/* Plans the candidate in st (of lower bound `bound`; `full`: cannot_fit says it cannot fit,
 * planned only by the exhaustive search); keeps it when it fits and steps faster than the
 * best. */
static int evaluate(struct pool_state *st, double bound, int full, struct err *e)
{
    int M = candidate_M(st);
    cJSON *json = candidate_json(st, M);
    struct cluster c;
    struct plan p;
    struct plan_options o = candidate_options(st);
    if (json == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int rc = cluster_parse(json, st->file, &c, e);
    cJSON_Delete(json);
    if (rc)
        return rc;
    memset(&p, 0, sizeof p);
    rc = planner_make(&c, &o, &p, e);
    cluster_free(&c);
    st->r->candidates++;
    if (rc == ERR_NOFIT || rc == ERR_OK)
        candidate_proved(st, rc, &p, bound);
    if (rc == ERR_NOFIT) {
        st->r->cut += p.search.present && !isinf(p.search.lower_bound);
        err_clear(e);
        return ERR_OK;
    }
    if (rc)
        return rc;
    st->r->fitted++;
    st->r->full_but_fits += full;
    st->r->bound_ratio = fmax(st->r->bound_ratio, bound / p.iteration_ms);
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
 * bwd into layer_ms (when `ms`), its tail and state at dp, its capacity and the latency of
 * an all-reduce. ERR_INPUT when it does not parse. */
static int stage_alone(struct pool_state *st, int k, int t, int dp, int ms, struct err *e)
{
    struct cluster c;
    struct pool_kind *kind = &st->kind[k];
    int rc = stage_cluster(st, k, t, dp, &c, e);
    if (rc)
        return rc;
    const struct profile *p = cluster_stage_profile(&c, 0);
    const struct link *link = &c.stages[0].dp_link;
    int device_optimizer = !(st->o->actions & PLAN_ACTION_OPTIMIZER);
    /* the all-reduce's bytes part, 2 (dp - 1) transfers of bytes / dp each (cost.c) */
    double per_byte = 2.0 * (dp - 1) / dp;
    st->reduce_latency_ms = cost_dp_allreduce_ms(link, dp, 0);
    for (int l = 0; l < p->n_layers; l++) {
        const struct layer_cost *y = &p->layers[l];
        double bytes_ms = link_transfer_ms(link, cluster_grad_bytes(&c, 0, l, l)) -
                          link_transfer_ms(link, 0);
        if (ms)
            kind->layer_ms[t][l] = y->fwd_ms + y->bwd_ms;
        kind->tail_ms[t][l] = per_byte * bytes_ms + device_optimizer * y->optimizer_ms;
        kind->state[t][l] = cost_layer_state(y, COST_PLACE_DEVICE);
    }
    kind->first_tail_ms[t] =
        cluster_allreduce_ms(&c, 0, 0, 0) + device_optimizer * p->layers[0].optimizer_ms;
    kind->capacity = c.stages[0].memory_bytes - c.reserve_bytes;
    cluster_free(&c);
    return ERR_OK;
}

static int pool_kind_alloc(struct pool_kind *kind, struct err *e)
{
    kind->n_tp = kind->per_node + 1;
    size_t n = (size_t)kind->n_tp;
    kind->layer_ms = calloc(n, sizeof *kind->layer_ms);
    kind->tail_ms = calloc(n, sizeof *kind->tail_ms);
    kind->state = calloc(n, sizeof *kind->state);
    kind->first_tail_ms = calloc(n, sizeof *kind->first_tail_ms);
    if (!kind->layer_ms || !kind->tail_ms || !kind->state ||
        !kind->first_tail_ms)
        return err_set(e, ERR_FAIL, "out of memory");
    return ERR_OK;
}

/* Each kind's costs per tp that divides the model (and parses alone), at dp 1. */
static int pool_layers(struct pool_state *st, struct err *e)
{
    size_t L = (size_t)model_layer_count(&st->model);
    for (int k = 0; k < st->K && k < POOL_KINDS_MAX; k++) {
        struct pool_kind *kind = &st->kind[k];
        if (pool_kind_alloc(kind, e))
            return e->code;
        for (int t = 1; t < kind->n_tp; t++) {
            struct err skip;
            err_clear(&skip);
            if (cluster_check_tp(&st->model, t, "", &skip))
                continue;
            kind->layer_ms[t] = calloc(L, sizeof **kind->layer_ms);
            kind->tail_ms[t] = calloc(L, sizeof **kind->tail_ms);
            kind->state[t] = calloc(L, sizeof **kind->state);
            if (!kind->layer_ms[t] || !kind->tail_ms[t] || !kind->state[t])
                return err_set(e, ERR_FAIL, "out of memory");
            if (stage_alone(st, k, t, 1, 1, &skip)) {
                free(kind->layer_ms[t]);
                kind->layer_ms[t] = NULL; /* unknown: no bound */
                continue;
            }
        }
    }
    return ERR_OK;
}

static void pool_layers_free(struct pool_state *st)
{
    for (int k = 0; k < st->K && k < POOL_KINDS_MAX; k++) {
        struct pool_kind *kind = &st->kind[k];
        for (int t = 0; kind->layer_ms != NULL && t < kind->n_tp; t++) {
            free(kind->layer_ms[t]);
            free(kind->tail_ms[t]);
            free(kind->state[t]);
        }
        free(kind->layer_ms);
        free(kind->tail_ms);
        free(kind->state);
        free(kind->first_tail_ms);
    }
}

/* sum_l min_u (v_ul / V_u) / sum_u (S_u / V_u), V_u = sum_l v_ul: the dual, with weights
 * 1/V_u, of the fractional assignment of the layers to the stages (S_u of kind u, a stage of
 * kind u taking v_ul for layer l) that minimises the most a stage takes; so at most that
 * most for any split. */
static double least_most(const double *const *v, const int *S, int used, int L)
{
    double V[POOL_KINDS_MAX] = {0}, weights = 0, shares = 0;
    for (int u = 0; u < used; u++) {
        for (int l = 0; l < L; l++)
            V[u] += v[u][l];
        if (!(V[u] > 0))
            return 0;
        weights += S[u] / V[u];
    }
    for (int l = 0; l < L; l++) {
        double share = INFINITY;
        for (int u = 0; u < used; u++)
            share = fmin(share, v[u][l] / V[u]);
        shares += share;
    }
    return shares / weights;
}

/* The used kinds' per-layer arrays at their tp. 0 when one is unknown. */
static int used_kinds(const struct pool_state *st, const double **w, const double **tail,
                      const int64_t **state, int *S, int *kinds)
{
    int used = 0;
    for (int k = 0; k < st->K && k < POOL_KINDS_MAX; k++) {
        if (st->stages[k] == 0)
            continue;
        const struct pool_kind *kind = &st->kind[k];
        w[used] = kind->layer_ms[st->tp[k]];
        tail[used] = kind->tail_ms[st->tp[k]];
        state[used] = kind->state[st->tp[k]];
        S[used] = st->stages[k];
        kinds[used] = k;
        if (w[used] == NULL)
            return 0;
        used++;
    }
    return used;
}

/* A lower bound on the candidate's step, with w_kl the time of layer l on kind k (at its tp)
 * and S_k its stages. Stage b (T_b its fwd + bwd of a micro-batch, A_b its gradients'
 * all-reduce and O_b its optimizer step, both after its own last backward: sim.c) ends the
 * step no sooner than E_b + A_b + O_b, E_b the end of its last backward.
 * (1) Stage 0: E_0 = X >= P_b + M T_b for every b (P_b the T of the stages before b, which
 * micro-batch 0's forward and the last backward cross). Steady: X >= M max_b T_b >= M
 * least_most(w). Filled: T_b <= (X - P_b) / M gives sum_s T_s <= X (1 - (1 - 1/M)^S), and
 * sum_s T_s >= sum_l min_k w_kl. Stage 0 holds layer 0 at least, and A and O only grow with
 * the layers: A_0 + O_0 >= the least over its possible kinds of layer 0's alone.
 * (2) Every stage: E_b >= M T_b (its M forwards and backwards, one after another), and A_b =
 * 2 (dp - 1) (latency + ceil(bytes / dp) / bandwidth) >= the all-reduce's latency + the sum
 * over its layers of 2 (dp - 1) / dp of their bytes' transfer: so the step >= latency +
 * max_b sum over b's layers of v_kl = M w_kl + that share + the layer's optimizer step, and
 * the max is at least least_most(v).
 * Scaled down a little so that rounding never lifts it over the simulated step. */
static double candidate_bound(const struct pool_state *st)
{
    const double *w[POOL_KINDS_MAX], *tail[POOL_KINDS_MAX];
    const int64_t *state[POOL_KINDS_MAX];
    int S[POOL_KINDS_MAX], kinds[POOL_KINDS_MAX], L = model_layer_count(&st->model);
    int used = used_kinds(st, w, tail, state, S, kinds), stages = 0;
    double M = candidate_M(st), first_tail = INFINITY, least = 0;
    if (used == 0)
        return 0; /* nothing known of a kind's layers: no bound */
    double *v[POOL_KINDS_MAX];
    for (int u = 0; u < used; u++) {
        stages += S[u];
        first_tail = fmin(first_tail, st->kind[kinds[u]].first_tail_ms[st->tp[kinds[u]]]);
        if ((v[u] = malloc((size_t)L * sizeof *v[u])) == NULL) {
            while (u-- > 0)
                free(v[u]);
            return 0;
        }
        for (int l = 0; l < L; l++)
            v[u][l] = M * w[u][l] + tail[u][l];
    }
    for (int l = 0; l < L; l++) {
        double ms = INFINITY;
        for (int u = 0; u < used; u++)
            ms = fmin(ms, w[u][l]);
        least += ms;
    }
    double steady = M * least_most(w, S, used, L), filled = least / (1 - pow(1 - 1 / M, stages));
    double stage0 = fmax(steady, filled) + first_tail;
    double every = st->reduce_latency_ms + least_most((const double *const *)v, S, used, L);
    for (int u = 0; u < used; u++)
        free(v[u]);
    return fmax(stage0, every) * (1 - 1e-9);
}

/* Whether the candidate's stages cannot hold the model's state (parameters, gradients and
 * optimizer state on the device; activations, even all recomputed, only add): a stage of kind
 * u holds at most capacity_u, so sum_l state_ul / capacity_u over its layers <= 1, and summed
 * over the stages, sum_l min_u (state_ul / capacity_u) <= S. */
static int cannot_fit(const struct pool_state *st)
{
    const double *w[POOL_KINDS_MAX], *tail[POOL_KINDS_MAX];
    const int64_t *state[POOL_KINDS_MAX];
    int S[POOL_KINDS_MAX], kinds[POOL_KINDS_MAX], stages = 0;
    int used = used_kinds(st, w, tail, state, S, kinds);
    if (used == 0 || (st->o->actions & PLAN_ACTION_OPTIMIZER))
        return 0; /* unknown, or the optimizer state may go to the host */
    double need = 0;
    for (int l = 0; l < model_layer_count(&st->model); l++) {
        double least = INFINITY;
        for (int u = 0; u < used; u++)
            least = fmin(least, (double)state[u][l] / (double)st->kind[kinds[u]].capacity);
        need += least;
        if (least > 1 + 1e-9)
            return 1; /* the layer fits no stage */
    }
    for (int u = 0; u < used; u++)
        stages += S[u];
    return need > stages * (1 + 1e-9);
}

/* Each kind's tails and states at the current dp (kept from the last when a stage does not
 * parse: then its layer_ms is NULL, no bound). */
static int pool_reduce(struct pool_state *st, struct err *e)
{
    int dp = st->dp;
    for (int k = 0; k < st->K && k < POOL_KINDS_MAX; k++)
        for (int t = 1; t < st->kind[k].n_tp; t++) {
            struct err skip;
            err_clear(&skip);
            if (st->kind[k].layer_ms[t] == NULL)
                continue; /* tp t cannot split the model, or the stage did not parse */
            if (stage_alone(st, k, t, dp, 0, &skip)) {
                free(st->kind[k].layer_ms[t]);
                st->kind[k].layer_ms[t] = NULL;
            }
        }
    st->dp = dp;
    return e->code;
}

/* Whether a candidate of this bound and index could replace the best by more than the
 * search gap (evaluate's order; with no gap, a tie with an earlier index does). */
static int may_win(const struct pool_state *st, double bound, long index)
{
    if (!st->have_best)
        return 1;
    double least = bound * (1 + st->o->search_gap);
    return least < st->best->iteration_ms ||
           (least == st->best->iteration_ms && index < st->best_index);
}

static int collect(struct pool_state *st, struct err *e)
{
    if (cannot_fit(st)) {
        st->r->cannot_fit++;
        st->lower_bound = fmin(st->lower_bound, INFINITY);
        return ERR_OK;
    }
    if (st->n_cands == st->cap_cands) {
        long cap = st->cap_cands ? 2 * st->cap_cands : 1024;
        struct pool_candidate *grown = realloc(st->cands, (size_t)cap * sizeof *grown);
        if (grown == NULL)
            return err_set(e, ERR_FAIL, "out of memory");
        st->cands = grown;
        st->cap_cands = cap;
    }
    struct pool_candidate *c = &st->cands[st->n_cands++];
    *c = (struct pool_candidate){.index = st->index, .bound = candidate_bound(st), .dp = st->dp};
    for (int k = 0; k < st->K && k < POOL_KINDS_MAX; k++)
        c->tp[k] = (short)st->tp[k], c->stages[k] = (short)st->stages[k];
    return ERR_OK;
}

/* One candidate of the enumeration: collected with its bound (pruned), or planned. */
static int visit(struct pool_state *st, struct err *e)
{
    if (st->prune)
        return collect(st, e);
    int full = cannot_fit(st);
    st->r->cannot_fit += full;
    return evaluate(st, candidate_bound(st), full, e);
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
        if (pool_reduce(st, e))
            return e->code;
        if (choose_kind(st, 0, 0, e))
            return e->code;
    }
    return ERR_OK;
}

static int by_bound(const void *a, const void *b)
{
    const struct pool_candidate *x = a, *y = b;
    if (x->bound != y->bound)
        return x->bound < y->bound ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* Every candidate with its bound, planned in the order of the bounds (ties: the exhaustive
 * order) until the next bound cannot beat the best, or the time is up: a candidate left
 * keeps its bound in the certified one (the bounds after it are no less). */
static int search_pruned(struct pool_state *st, struct err *e)
{
    if (enumerate(st, e))
        return e->code;
    st->r->enumerated = st->n_cands;
    qsort(st->cands, (size_t)st->n_cands, sizeof *st->cands, by_bound);
    for (long i = 0; i < st->n_cands; i++) {
        const struct pool_candidate *c = &st->cands[i];
        int timed_out = st->have_best && now_s() > st->deadline;
        if (timed_out || !may_win(st, c->bound, c->index)) {
            st->lower_bound = fmin(st->lower_bound, c->bound);
            st->r->exhausted &= !timed_out;
            break;
        }
        st->dp = c->dp;
        st->index = c->index;
        for (int k = 0; k < st->K && k < POOL_KINDS_MAX; k++)
            st->tp[k] = c->tp[k], st->stages[k] = c->stages[k];
        if (evaluate(st, c->bound, 0, e))
            return e->code;
    }
    return ERR_OK;
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

/* The pool's certified gap on the best plan, where --repartition's goes: its lower bound is
 * the least over every candidate of what its search proved or, left unplanned, its bound. */
static void pool_certify(struct pool_state *st)
{
    struct plan *p = st->best;
    double bound = fmin(st->lower_bound, p->iteration_ms);
    st->r->lower_bound = bound;
    st->r->gap = bound > 0 ? p->iteration_ms / bound - 1 : 0;
    p->optimality_gap = st->r->gap;
    p->search.present = 1;
    p->search.nodes = st->r->nodes;
    p->search.splits = st->r->splits;
    p->search.exhausted = st->r->exhausted;
    p->search.lower_bound = bound;
}

int pool_search_pruned(const char *file, const struct plan_options *o, int prune,
                       struct plan *best, struct pool_result *r, struct err *e)
{
    memset(r, 0, sizeof *r);
    if (o->method != METHOD_OPTIMAL)
        return err_set(e, ERR_INPUT, "%s: pool: the pool search plans with --method optimal",
                       file);
    struct pool_state st = {.file = file, .o = o, .best = best, .r = r, .prune = prune,
                            .lower_bound = INFINITY};
    st.deadline = o->time_limit_s > 0 ? now_s() + o->time_limit_s : INFINITY;
    r->exhausted = 1;
    st.root = jsonio_read(file, e);
    if (st.root == NULL)
        return e->code;
    int rc = read_pool(&st, e);
    if (rc == ERR_OK)
        rc = pool_model(&st, e);
    if (rc == ERR_OK)
        rc = pool_layers(&st, e);
    if (rc == ERR_OK)
        rc = prune ? search_pruned(&st, e) : enumerate(&st, e);
    r->n_kinds = st.K;
    for (int k = 0; k < st.K; k++) {
        snprintf(r->device[k], sizeof r->device[k], "%s", st.kind[k].device);
    }
    pool_layers_free(&st);
    free(st.cands);
    cJSON_Delete((cJSON *)st.root);
    if (rc == ERR_OK && !st.have_best)
        rc = err_set(e, ERR_NOFIT,
                     "%s: pool: none of the %ld candidates (dp, tp and stages per device kind) "
                     "fits",
                     file, r->candidates);
    if (rc == ERR_OK)
        pool_certify(&st);
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
    fprintf(f, "pool search: %ld candidates, %ld planned (%ld found nothing faster than the best "
               "so far), the rest left by their bound; certified gap %.3f%% (no candidate "
               "steps faster than %.3f ms)%s\n",
            r->enumerated ? r->enumerated : r->candidates, r->candidates, r->cut, 100 * r->gap,
            r->lower_bound, r->exhausted ? "" : "; stopped at the time limit or node budget");
}
