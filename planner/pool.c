#include "pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cost.h"
#include "devices.h"
#include "fileio.h"
#include "jsonio.h"
#include "microbatch.h"
#include "model_ops.h"
#include "pool_bound.h"

/* A candidate's --repartition gets the time left over this many. */
#define POOL_TIME_SHARE 4
/* Most "micro_batch_sizes". */
#define POOL_SIZES_MAX 16

/* Most "tp_profiles" of a kind. */
#define POOL_TP_PROFILES_MAX 16

struct pool_kind {
    const cJSON *entry;
    char device[PROFILE_NAME_MAX];
    int64_t count, per_node;
    /* "tp_profiles": a profile made for (the kind, tp) per tp given, its path as written
     * (relative to the pool file); stages of another tp take "profile" and its tp_efficiency */
    int n_tp_profiles;
    struct {
        int tp;
        const char *profile;
    } tp_profile[POOL_TP_PROFILES_MAX];
    /* per tp and dp slot (pool_costs_make): its stage alone */
    struct pool_costs *costs;
    int64_t n_tp; /* per_node + 1 */
};

/* A candidate of the enumeration with its lower bound (candidate_bound). */
struct pool_candidate {
    long index; /* in the exhaustive order */
    double bound;
    int dp;
    short size, tp[POOL_KINDS_MAX], stages[POOL_KINDS_MAX]; /* size: index in sizes */
    short refined; /* bound: pool_refine's (else candidate_bound's) */
};

/* The search's state: the file, the kinds, the candidate being built and the best so far. */
struct pool_state {
    const char *file;
    const cJSON *root;
    const struct plan_options *o;
    struct pool_kind kind[POOL_KINDS_MAX];
    int K;
    struct model model;
    enum schedule schedule;
    int64_t global_batch;
    int64_t only_dp; /* "dp"?: the one dp searched; 0: every dp */
    int dp, tp[POOL_KINDS_MAX], stages[POOL_KINDS_MAX];
    long index; /* the candidate's, in the exhaustive order */
    struct plan *best;
    int have_best;
    long best_index;
    struct pool_result *r;
    /* the pruned search collects the `keep` least bounds a pass, then plans them in order */
    int prune;
    long keep;
    struct pool_candidate *cands;
    long n_cands, dropped; /* kept this pass (at most POOL_KEEP), and left for the next */
    int pass;
    struct pool_candidate floor; /* the last pass's greatest kept: the rest come after it */
    double deadline; /* CLOCK_MONOTONIC seconds (INFINITY: no --time-limit) */
    /* the dps searched (dp_slot: each one's slot in the kinds' costs, -1: none) */
    int n_dp, *dp_slot;
    /* the micro-batch sizes searched ("micro_batch_sizes", else the model's), the candidate's
     * (-1: the file's profiles) and for a size not the model's each kind's profile at it
     * (pool_profiles, in files in memory; NULL: the file's own) */
    int n_sizes, sizes[POOL_SIZES_MAX], size;
    char *size_profile[POOL_SIZES_MAX][POOL_KINDS_MAX];
    int size_fd[POOL_SIZES_MAX][POOL_KINDS_MAX]; /* the files in memory they name */
    /* the last candidate's summary (summary_of) */
    struct pool_shape summary_shape;
    struct pool_summary summary;
    int summary_known;
    /* the least certified bound over the candidates decided so far */
    double lower_bound;
};

/* "tp_profiles": [{"tp", "profile"}, ...], each tp from 2 to per_node, once. */
static int read_tp_profiles(const cJSON *obj, const char *file, const char *path,
                            struct pool_kind *out, struct err *e)
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
            jsonio_str(it, file, ip, "profile", &out->tp_profile[i].profile, e))
            return e->code;
        for (int j = 0; j < i; j++)
            if (out->tp_profile[j].tp == tp)
                return err_set(e, ERR_INPUT, "%s: %s.tp: %lld is %s[%d]'s too", file, ip,
                               (long long)tp, sub, j);
        out->tp_profile[i].tp = (int)tp;
        out->n_tp_profiles++;
    }
    return ERR_OK;
}

/* Kind k's profile made for tp GPUs (tp_profiles), or NULL. */
static const char *kind_tp_profile(const struct pool_kind *kind, int tp)
{
    for (int i = 0; i < kind->n_tp_profiles; i++)
        if (kind->tp_profile[i].tp == tp)
            return kind->tp_profile[i].profile;
    return NULL;
}

/* Each of a kind's tp_profiles is a profile of its device made for its tp (its "tp" says so):
 * a one-GPU profile there would be divided by tp once more. */
static int check_tp_profiles(const struct pool_state *st, struct err *e)
{
    for (int k = 0; k < st->K; k++)
        for (int i = 0; i < st->kind[k].n_tp_profiles; i++) {
            char full[CLUSTER_PATH_MAX];
            struct profile p;
            struct err inner;
            err_clear(&inner);
            cluster_profile_path(st->file, st->kind[k].tp_profile[i].profile, full);
            if (profile_load(full, &p, &inner))
                return err_set(e, inner.code, "%s: pool[%d].tp_profiles[%d].profile: %s",
                               st->file, k, i, inner.msg);
            int tp = p.tp, same = strcmp(p.device.name, st->kind[k].device) == 0;
            profile_free(&p);
            if (tp != st->kind[k].tp_profile[i].tp || !same)
                return err_set(e, ERR_INPUT,
                               "%s: pool[%d].tp_profiles[%d]: \"%s\" is %s, but this entry is "
                               "for tp %d of \"%s\" (make it with ballast profile --tp %d)",
                               st->file, k, i, st->kind[k].tp_profile[i].profile,
                               !same ? "another device's profile"
                               : tp > 1 ? "a profile of another tp"
                                        : "a profile of one GPU",
                               st->kind[k].tp_profile[i].tp, st->kind[k].device,
                               st->kind[k].tp_profile[i].tp);
        }
    return ERR_OK;
}

static int read_kind(const cJSON *obj, const char *file, int k, struct pool_kind *out,
                     struct err *e)
{
    static const char *const keys[] = {"device",    "count",     "per_node", "memory_bytes",
                                       "profile",   "node_link", "host_link",
                                       "node_host_memory_bytes", "tp_profiles", NULL};
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
    return read_tp_profiles(obj, file, path, out, e);
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
    cJSON_DeleteItemFromObjectCaseSensitive(out, "micro_batch_sizes");
    cJSON_DeleteItemFromObjectCaseSensitive(out, "micro_batches");
    cJSON_AddNumberToObject(out, "micro_batches", micro_batches);
    cJSON *stages = cJSON_AddArrayToObject(out, "stages");
    for (int k = 0; k < st->K; k++)
        for (int s = 0; s < st->stages[k]; s++) {
            cJSON *stage = cJSON_Duplicate(st->kind[k].entry, 1);
            const char *profile = st->size >= 0 ? st->size_profile[st->size][k] : NULL;
            if (profile == NULL) /* at the model's micro-batch size: per degree, if given */
                profile = kind_tp_profile(&st->kind[k], st->tp[k]);
            cJSON_DeleteItemFromObjectCaseSensitive(stage, "tp_profiles");
            if (profile != NULL) {
                cJSON_DeleteItemFromObjectCaseSensitive(stage, "profile");
                cJSON_AddStringToObject(stage, "profile", profile);
            }
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
    return (int)(st->global_batch / ((int64_t)st->dp * st->sizes[st->size]));
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

static int could_step(const struct pool_state *st, double x);

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
    st->r->refuted_but_fits += full || !could_step(st, p.iteration_ms);
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
    st->r->micro_batch = st->sizes[st->size];
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

/* Kind k's stage of tp t alone, dp replicas, as the cluster file reads it, into *out;
 * ERR_INPUT when it does not parse. */
static int stage_alone(struct pool_state *st, int k, int t, int dp, struct pool_costs *out,
                       struct err *e)
{
    struct cluster c;
    int rc = stage_cluster(st, k, t, dp, &c, e);
    if (rc)
        return rc;
    pool_costs_fill(&c, dp, !(st->o->actions & PLAN_ACTION_OPTIMIZER), 1, out);
    cluster_free(&c);
    return ERR_OK;
}

/* Whether the search takes this dp at the candidate's micro-batch size: they divide the
 * global batch, and it is the file's "dp" when it gives one. */
static int dp_searched(const struct pool_state *st, int64_t dp)
{
    return st->global_batch % (dp * st->sizes[st->size]) == 0 &&
           (st->only_dp == 0 || dp == st->only_dp);
}

/* The slot of the candidate's dp and micro-batch size in each kind's costs at a tp. */
static int costs_slot(const struct pool_state *st, int t)
{
    return (t * st->n_dp + st->dp_slot[st->dp]) * st->n_sizes + st->size;
}

/* Every kind's stage alone per tp that divides the model, per dp and size searched. */
static int pool_costs_make(struct pool_state *st, struct err *e)
{
    int L = model_layer_count(&st->model), least = st->sizes[0];
    for (int i = 1; i < st->n_sizes; i++)
        least = st->sizes[i] < least ? st->sizes[i] : least;
    int dp_max = (int)(st->global_batch / least);
    if ((st->dp_slot = malloc(((size_t)dp_max + 1) * sizeof *st->dp_slot)) == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int dp = 0; dp <= dp_max; dp++) {
        int any = 0;
        for (st->size = 0; dp > 0 && st->size < st->n_sizes; st->size++)
            any |= dp_searched(st, dp);
        st->dp_slot[dp] = any ? st->n_dp++ : -1;
    }
    for (int k = 0; k < st->K && k < POOL_KINDS_MAX; k++) {
        struct pool_kind *kind = &st->kind[k];
        kind->n_tp = kind->per_node + 1;
        size_t n = (size_t)(kind->n_tp * st->n_dp * st->n_sizes);
        if ((kind->costs = calloc(n, sizeof *kind->costs)) == NULL)
            return err_set(e, ERR_FAIL, "out of memory");
        for (int t = 1; t < kind->n_tp; t++)
            for (st->dp = 1; st->dp <= dp_max; st->dp++)
                for (st->size = 0; st->size < st->n_sizes; st->size++) {
                    struct err skip;
                    err_clear(&skip);
                    if (!dp_searched(st, st->dp) || cluster_check_tp(&st->model, t, "", &skip))
                        continue;
                    struct pool_costs *c = &kind->costs[costs_slot(st, t)];
                    if (pool_costs_alloc(c, L))
                        return err_set(e, ERR_FAIL, "out of memory");
                    stage_alone(st, k, t, st->dp, c, &skip); /* not parsed: no bound */
                }
    }
    return ERR_OK;
}

static void pool_costs_free_all(struct pool_state *st)
{
    for (int k = 0; k < st->K && k < POOL_KINDS_MAX; k++) {
        int n = (int)st->kind[k].n_tp * st->n_dp * st->n_sizes;
        for (int i = 0; st->kind[k].costs != NULL && i < n; i++)
            pool_costs_free(&st->kind[k].costs[i]);
        free(st->kind[k].costs);
    }
    free(st->dp_slot);
}

/* The candidate in st as the bounds see it; 0 when a kind's stage is unknown (no bound). */
static int shape_of(const struct pool_state *st, struct pool_shape *s)
{
    s->used = 0;
    s->L = model_layer_count(&st->model);
    s->M = candidate_M(st);
    s->schedule = st->schedule;
    s->recompute_only = st->o->actions == PLAN_ACTION_RECOMPUTE;
    for (int k = 0; k < st->K && k < POOL_KINDS_MAX; k++) {
        if (st->stages[k] == 0)
            continue;
        const struct pool_kind *kind = &st->kind[k];
        const struct pool_costs *c = &kind->costs[costs_slot(st, st->tp[k])];
        if (!c->known)
            return 0;
        s->costs[s->used] = c;
        s->stages[s->used++] = st->stages[k];
    }
    return s->used > 0;
}

/* The candidate's shape and summary: the summary kept from the last candidate when only the
 * stage counts differ (the enumeration varies those innermost). 0: no bound. */
static int summary_of(struct pool_state *st, struct pool_shape *s, struct pool_summary *sum)
{
    if (!shape_of(st, s))
        return 0;
    int same = st->summary_known && s->used == st->summary_shape.used &&
               s->M == st->summary_shape.M;
    for (int u = 0; same && u < s->used; u++)
        same = s->costs[u] == st->summary_shape.costs[u];
    if (!same) {
        pool_summarize(s, &st->summary);
        st->summary_shape = *s;
        st->summary_known = 1;
    }
    *sum = st->summary;
    return 1;
}

static double candidate_bound(struct pool_state *st)
{
    struct pool_shape s;
    struct pool_summary sum;
    return summary_of(st, &s, &sum) ? pool_bound(&s, &sum) : 0;
}

/* Whether some order and split of the candidate in st could step in x ms (pool_bound.h). */
static int could_step(const struct pool_state *st, double x)
{
    struct pool_shape s;
    return !shape_of(st, &s) || pool_could_step(&s, x);
}

static int cannot_fit(struct pool_state *st)
{
    struct pool_shape s;
    struct pool_summary sum;
    return !(st->o->actions & PLAN_ACTION_OPTIMIZER) && summary_of(st, &s, &sum) &&
           pool_cannot_fit(&s, &sum);
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

static int by_bound(const void *a, const void *b)
{
    const struct pool_candidate *x = a, *y = b;
    if (x->bound != y->bound)
        return x->bound < y->bound ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* Binary heaps of candidates by (bound, index): least first for sign 1, greatest for -1. */
static void heap_down(struct pool_candidate *h, long n, long i, int sign)
{
    for (;;) {
        long top = i, l = 2 * i + 1, r = l + 1;
        if (l < n && sign * by_bound(&h[l], &h[top]) < 0)
            top = l;
        if (r < n && sign * by_bound(&h[r], &h[top]) < 0)
            top = r;
        if (top == i)
            return;
        struct pool_candidate t = h[i];
        h[i] = h[top];
        h[top] = t;
        i = top;
    }
}

static void heap_up(struct pool_candidate *h, long i, int sign)
{
    while (i > 0 && sign * by_bound(&h[i], &h[(i - 1) / 2]) < 0) {
        struct pool_candidate t = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

/* The candidate in st, with its bound, into this pass's POOL_KEEP least (a heap, greatest
 * first); one an earlier pass took is passed over, and one that cannot beat the best is left
 * with its bound. */
static int collect(struct pool_state *st, struct err *e)
{
    (void)e;
    if (cannot_fit(st)) {
        st->r->cannot_fit += st->pass == 0; /* no plan: nothing to bound */
        return ERR_OK;
    }
    struct pool_candidate c = {
        .index = st->index, .bound = candidate_bound(st), .dp = st->dp, .size = (short)st->size};
    for (int k = 0; k < st->K && k < POOL_KINDS_MAX; k++)
        c.tp[k] = (short)st->tp[k], c.stages[k] = (short)st->stages[k];
    st->r->enumerated += st->pass == 0;
    if (st->pass > 0 && by_bound(&c, &st->floor) <= 0)
        return ERR_OK;
    if (st->have_best && !may_win(st, c.bound, c.index)) {
        st->lower_bound = fmin(st->lower_bound, c.bound);
        return ERR_OK;
    }
    if (st->n_cands < st->keep) {
        st->cands[st->n_cands] = c;
        heap_up(st->cands, st->n_cands++, -1);
        return ERR_OK;
    }
    st->dropped++;
    if (by_bound(&c, &st->cands[0]) < 0) {
        st->cands[0] = c;
        heap_down(st->cands, st->n_cands, 0, -1);
    }
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

/* Every dp and micro-batch size dividing the global batch, and under them every
 * choose_kind. */
static int enumerate(struct pool_state *st, struct err *e)
{
    st->index = 0;
    for (st->dp = 1; st->dp <= st->global_batch; st->dp++)
        for (st->size = 0; st->size < st->n_sizes; st->size++)
            if (dp_searched(st, st->dp) && choose_kind(st, 0, 0, e))
                return e->code;
    return ERR_OK;
}


/* Splits of the gap between two bounds when a candidate's is refined (pool_refine). */
#define POOL_REFINE_STEPS 8


static void load_candidate(struct pool_state *st, const struct pool_candidate *c)
{
    st->dp = c->dp;
    st->size = c->size;
    st->index = c->index;
    for (int k = 0; k < st->K && k < POOL_KINDS_MAX; k++)
        st->tp[k] = c->tp[k], st->stages[k] = c->stages[k];
}

/* The candidate in st (of bound c->bound) refined by pool_could_step: a bound no split of it
 * can step under, searched up to the best step less the gap (none: doubled until some split
 * could). *refuted: not even that is in reach (the bound returned is then it). */
static double pool_refine(struct pool_state *st, const struct pool_candidate *c, int *refuted)
{
    double lo = c->bound, hi = 2 * fmax(lo, 1e-9);
    if (st->have_best)
        hi = st->best->iteration_ms / (1 + st->o->search_gap);
    else
        for (int i = 0; i < 30 && !could_step(st, hi); i++)
            lo = hi, hi *= 2;
    if ((*refuted = st->have_best && !could_step(st, hi)) != 0)
        return hi;
    for (int i = 0; i < POOL_REFINE_STEPS && lo < hi; i++) {
        double mid = lo + (hi - lo) / 2;
        if (could_step(st, mid))
            hi = mid;
        else
            lo = mid;
    }
    return lo;
}

/* The pass's candidates taken least bound first (ties: the exhaustive order): one whose bound
 * is the cheap one gets it refined (pool_refine) and goes back; a refined one is planned, and
 * one that cannot beat the best left with its refined bound. *stopped when the least bound
 * cannot beat the best, or at the time limit: a candidate left keeps its bound in the
 * certified one (the bounds after it, this pass's and the next's, are no less). */
static int take_best_first(struct pool_state *st, int *stopped, struct err *e)
{
    qsort(st->cands, (size_t)st->n_cands, sizeof *st->cands, by_bound); /* a heap, least first */
    *stopped = 0;
    for (long n = st->n_cands; n > 0;) {
        struct pool_candidate *c = &st->cands[0];
        int timed_out = st->have_best && now_s() > st->deadline;
        if (timed_out || !may_win(st, c->bound, c->index)) {
            st->lower_bound = fmin(st->lower_bound, c->bound);
            st->r->exhausted &= !timed_out;
            *stopped = 1;
            return ERR_OK;
        }
        load_candidate(st, c);
        int refuted = 0;
        if (!c->refined) {
            c->bound = fmax(c->bound, pool_refine(st, c, &refuted));
            c->refined = 1;
            if (!refuted) {
                heap_down(st->cands, n, 0, 1);
                continue;
            }
        }
        struct pool_candidate taken = *c;
        st->cands[0] = st->cands[--n];
        heap_down(st->cands, n, 0, 1);
        if (refuted) { /* no split could beat the best */
            st->r->refuted++;
            st->lower_bound = fmin(st->lower_bound, taken.bound);
            continue;
        }
        if (evaluate(st, taken.bound, 0, e))
            return e->code;
    }
    return ERR_OK;
}

/* Passes over the enumeration, each taking its POOL_KEEP least bounds after the last pass's,
 * until the search stops or no candidate is left. */
static int search_pruned(struct pool_state *st, struct err *e)
{
    if ((st->cands = malloc((size_t)st->keep * sizeof *st->cands)) == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (st->pass = 0;; st->pass++) {
        int stopped;
        st->n_cands = st->dropped = 0;
        if (enumerate(st, e))
            return e->code;
        if (st->n_cands == 0)
            return ERR_OK;
        st->floor = st->cands[0];
        if (take_best_first(st, &stopped, e) || stopped || st->dropped == 0)
            return e->code;
    }
}

/* The pool's model: its first kind as one stage (its profile is read and checked). */
static int pool_model(struct pool_state *st, struct err *e)
{
    struct cluster c;
    st->size = -1;
    int rc = stage_cluster(st, 0, 1, 1, &c, e);
    if (rc == ERR_OK) {
        st->model = c.model;
        st->schedule = c.schedule;
        if (c.schedule_auto || (c.schedule != SCHEDULE_1F1B && c.schedule != SCHEDULE_GPIPE))
            rc = err_set(e, ERR_INPUT, "schedule: a pool is searched with schedules 1f1b and "
                         "gpipe (--repartition's); plan another schedule on the cluster the "
                         "search writes");
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

/* "micro_batch_sizes" (else the model's size alone): each divides the global batch, once. */
static int read_sizes(struct pool_state *st, struct err *e)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(st->root, "micro_batch_sizes");
    st->n_sizes = 1;
    st->sizes[0] = st->model.micro_batch;
    if (list == NULL)
        return ERR_OK;
    if (jsonio_expect_array(list, st->file, "micro_batch_sizes", e))
        return e->code;
    st->n_sizes = cJSON_GetArraySize(list);
    if (st->n_sizes < 1 || st->n_sizes > POOL_SIZES_MAX)
        return err_set(e, ERR_INPUT, "%s: micro_batch_sizes: %d sizes, expected 1 to %d",
                       st->file, st->n_sizes, POOL_SIZES_MAX);
    for (int i = 0; i < st->n_sizes; i++) {
        char path[JSONIO_PATH_MAX];
        int64_t b;
        jsonio_path_index(path, "micro_batch_sizes", i);
        if (jsonio_int_value(cJSON_GetArrayItem(list, i), st->file, path, 1, st->global_batch,
                             &b, e))
            return e->code;
        if (st->global_batch % b != 0)
            return err_set(e, ERR_INPUT, "%s: %s: %lld does not divide global_batch %lld",
                           st->file, path, (long long)b, (long long)st->global_batch);
        for (int j = 0; j < i; j++)
            if (st->sizes[j] == b)
                return err_set(e, ERR_INPUT, "%s: %s: %lld is micro_batch_sizes[%d] too",
                               st->file, path, (long long)b, j);
        if (b != st->model.micro_batch && model_ops_of(&st->model) == NULL)
            return err_set(e, ERR_INPUT,
                           "%s: %s: %lld, but the model is custom (\"%s\"): its profiles hold "
                           "micro-batch %d only and Ballast has no size functions to rescale "
                           "them",
                           st->file, path, (long long)b, st->model.name, st->model.micro_batch);
        st->sizes[i] = (int)b;
    }
    return ERR_OK;
}

/* Kind k's profile at micro-batch size b, as --micro-batches auto makes it (microbatch.c),
 * written to `path`. */
/* Kind k's profile at micro-batch size b (slot i of the sizes) in a file in memory, which the
 * candidates' clusters name: a killed search leaves no file behind (planning from profiles
 * in memory, without a file, is the pool search's redesign). */
static int size_profile(struct pool_state *st, const struct device_table *t, int k, int i,
                        struct err *e)
{
    struct cluster c, cb;
    struct microbatch_notes notes = {0};
    char name[64], path[FILEIO_PATH_MAX];
    st->size = -1;
    int rc = stage_cluster(st, k, 1, 1, &c, e);
    if (rc)
        return rc;
    rc = microbatch_cluster(&c, t, st->o->estimate, st->sizes[i], 1, &cb, &notes, e);
    if (rc == ERR_OK) {
        cJSON *o = profile_to_json(&cb.profiles[0]);
        char *text = o != NULL ? cJSON_PrintUnformatted(o) : NULL;
        snprintf(name, sizeof name, "ballast-pool-%d-b%d.json", k, st->sizes[i]);
        rc = text == NULL ? err_set(e, ERR_FAIL, "out of memory")
                          : fileio_memory_file(name, text, (int64_t)strlen(text),
                                               &st->size_fd[i][k], path, e);
        if (rc == ERR_OK && (st->size_profile[i][k] = strdup(path)) == NULL)
            rc = err_set(e, ERR_FAIL, "out of memory");
        free(text);
        cJSON_Delete(o);
        microbatch_cluster_free(&cb, c.n_profiles);
    }
    cluster_free(&c);
    return rc;
}

/* Each kind's profile at each size not the model's. */
static int pool_profiles(struct pool_state *st, struct err *e)
{
    struct device_table t;
    int rc = ERR_OK, loaded = 0;
    for (int i = 0; i < st->n_sizes && rc == ERR_OK; i++)
        for (int k = 0; k < st->K && k < POOL_KINDS_MAX && rc == ERR_OK; k++) {
            if (st->sizes[i] == st->model.micro_batch)
                continue;
            if (!loaded && (rc = devices_load(devices_default_file(), &t, e)) != ERR_OK)
                return rc;
            loaded = 1;
            rc = size_profile(st, &t, k, i, e);
        }
    if (loaded)
        devices_free(&t);
    return rc;
}

static void pool_profiles_free(struct pool_state *st)
{
    for (int i = 0; i < POOL_SIZES_MAX; i++)
        for (int k = 0; k < POOL_KINDS_MAX; k++) {
            if (st->size_profile[i][k] != NULL)
                close(st->size_fd[i][k]);
            free(st->size_profile[i][k]);
        }
}

int pool_search_parsed(const cJSON *root, const char *file, const struct plan_options *o,
                       long prune, struct plan *best, struct pool_result *r, struct err *e)
{
    memset(r, 0, sizeof *r);
    if (o->method != METHOD_OPTIMAL)
        return err_set(e, ERR_INPUT, "%s: pool: the pool search plans with --method optimal",
                       file);
    struct pool_state st = {.file = file, .o = o, .best = best, .r = r, .prune = prune > 0,
                            .keep = prune, .lower_bound = INFINITY};
    st.deadline = o->time_limit_s > 0 ? now_s() + o->time_limit_s : INFINITY;
    r->exhausted = 1;
    st.root = root;
    int rc = read_pool(&st, e);
    if (rc == ERR_OK)
        rc = pool_model(&st, e);
    if (rc == ERR_OK)
        rc = check_tp_profiles(&st, e);
    if (rc == ERR_OK)
        rc = read_sizes(&st, e);
    if (rc == ERR_OK)
        rc = pool_profiles(&st, e);
    if (rc == ERR_OK)
        rc = pool_costs_make(&st, e);
    if (rc == ERR_OK)
        rc = prune ? search_pruned(&st, e) : enumerate(&st, e);
    r->n_kinds = st.K;
    for (int k = 0; k < st.K; k++) {
        snprintf(r->device[k], sizeof r->device[k], "%s", st.kind[k].device);
    }
    pool_costs_free_all(&st);
    pool_profiles_free(&st);
    free(st.cands);
    if (rc == ERR_OK && !st.have_best)
        rc = err_set(e, ERR_NOFIT,
                     "%s: pool: no candidate (dp, tp and stages per device kind) fits: of %ld, "
                     "%ld were left as their GPUs cannot hold the model's state (weights, "
                     "gradients, optimizer state), and none of the %ld planned fits",
                     file, r->enumerated + r->cannot_fit, r->cannot_fit, r->candidates);
    if (rc == ERR_OK)
        pool_certify(&st);
    if (rc && st.have_best)
        plan_free(best);
    return rc;
}

int pool_search_pruned(const char *file, const struct plan_options *o, long prune,
                       struct plan *best, struct pool_result *r, struct err *e)
{
    memset(r, 0, sizeof *r);
    cJSON *root = jsonio_read_kind(file, JSONIO_CLUSTER, e);
    if (root == NULL)
        return e->code;
    int rc = pool_search_parsed(root, file, o, prune, best, r, e);
    cJSON_Delete(root);
    return rc;
}

int pool_search(const char *file, const struct plan_options *o, struct plan *best,
                struct pool_result *r, struct err *e)
{
    return pool_search_pruned(file, o, POOL_KEEP, best, r, e);
}

void pool_print(FILE *f, const struct pool_result *r)
{
    int pp = 0;
    for (int k = 0; k < r->n_kinds; k++)
        pp += r->stages[k];
    fprintf(f, "pool: %ld candidates planned, %ld fit; the fastest: dp %d x pp %d x tp (by kind), "
               "%d micro-batches a replica;",
            r->candidates, r->fitted, r->dp, pp, r->micro_batches);
    for (int k = 0; k < r->n_kinds; k++)
        fprintf(f, " %s %d stages of tp %d%s", r->device[k], r->stages[k], r->tp[k],
                k + 1 < r->n_kinds ? "," : "\n");
    fprintf(f, "pool search: micro-batch size %d; of %ld candidates %ld planned (%ld found "
               "nothing faster than the best so far), %ld left as their GPUs cannot hold the "
               "model's state, %ld as no split of theirs could beat the best, the rest by "
               "their bound; certified gap %.3f%% (no candidate steps faster than %.3f ms)%s\n",
            r->micro_batch, r->enumerated + r->cannot_fit, r->candidates, r->cut, r->cannot_fit,
            r->refuted, 100 * r->gap, r->lower_bound,
            r->exhausted ? "" : "; stopped at the time limit or node budget");
}

int pool_info_read(const char *file, const cJSON *root, struct pool_info *info, struct err *e)
{
    struct pool_state st = {.file = file, .root = root, .size = -1};
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
    struct pool_state st = {.file = file, .root = root, .dp = dp, .size = -1};
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
