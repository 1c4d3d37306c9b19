/* Ballast's optimal method with offloading (offload.h), stage by stage: each stage's
 * undominated candidates by a bounded search over its layers' actions (the stages together:
 * offload_global.c). */
#include "offload_stage.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "methods.h"
#include "optimizer.h"
#include "sim.h"

int plan_actions_parse(const char *text, struct plan_options *o, struct err *e)
{
    int actions = 0;
    const char *at = text;
    while (*at != '\0') {
        size_t len = strcspn(at, ",");
        if (len == 9 && strncmp(at, "recompute", 9) == 0)
            actions |= PLAN_ACTION_RECOMPUTE;
        else if (len == 7 && strncmp(at, "offload", 7) == 0)
            actions |= PLAN_ACTION_OFFLOAD;
        else if (len == 9 && strncmp(at, "optimizer", 9) == 0)
            actions |= PLAN_ACTION_OPTIMIZER;
        else if (len == 18 && strncmp(at, "optimizer-fraction", 18) == 0)
            actions |= PLAN_ACTION_OPTIMIZER | PLAN_ACTION_OPTIMIZER_FRACTION;
        else if (len == 7 && strncmp(at, "weights", 7) == 0)
            actions |= PLAN_ACTION_OPTIMIZER | PLAN_ACTION_WEIGHTS;
        else
            return err_set(e, ERR_INPUT,
                           "--actions: \"%s\": expected recompute, offload, optimizer, "
                           "optimizer-fraction, weights, comma-separated",
                           text);
        at += len + (at[len] == ',');
    }
    if (actions == 0)
        return err_set(e, ERR_INPUT, "--actions: empty, expected recompute, offload, optimizer, "
                                     "optimizer-fraction, weights, comma-separated");
    o->actions = actions;
    return ERR_OK;
}

int offload_options_check(const struct plan_options *o, struct err *e)
{
    int with_optimizer = PLAN_ACTION_OPTIMIZER_FRACTION | PLAN_ACTION_WEIGHTS;
    if (o->actions < 1 ||
        o->actions > (PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD | PLAN_ACTION_OPTIMIZER |
                      PLAN_ACTION_OPTIMIZER_FRACTION | PLAN_ACTION_WEIGHTS) ||
        ((o->actions & with_optimizer) && !(o->actions & PLAN_ACTION_OPTIMIZER)))
        return err_set(e, ERR_INPUT, "plan options: actions %d", o->actions);
    if (o->actions == PLAN_ACTION_RECOMPUTE)
        return ERR_OK;
    if (o->method != METHOD_OPTIMAL)
        return err_set(e, ERR_INPUT, "--actions offload or optimizer applies to --method optimal "
                                     "only (patent stays the published method: recompute)");
    return ERR_OK;
}


struct stage_search {
    const struct plan *p;
    const struct plan_stage *st;
    int n, v;
    int n_act[1024];
    struct cost_row (*act)[COST_ACTIONS_MAX];
    __int128 *rest; /* n + 1: the least the layers from l on add to M */
    double bound;   /* candidates recompute less than this */
    struct cost_row *cur;
    struct candidate *found;
    int n_found, cap_found;
    int baseline_first; /* found[0] is the recompute-only choice */
    /* --min-gain (offload_simplest): every fitting combination, of equal ones in time and
     * memory the simpler (choice.h), pruned only by one no slower and no less simple */
    int simplest;
};

/* a no better than b in every term the memory and the simulator see. */
static int row_dominated(const struct cost_row *a, const struct cost_row *b)
{
    return b->recompute_ms <= a->recompute_ms && b->host_bytes <= a->host_bytes &&
           b->kept_bytes <= a->kept_bytes && b->transient_bytes <= a->transient_bytes;
}

/* What an action adds to choice_key's actions (the first) and recomputed layers. */
static void row_key(const struct cost_row *r, int key[2])
{
    const struct layer_action *a = &r->action;
    key[0] += r->host_bytes > 0 || a->offload_option >= 0 || a->choice >= COST_OPTION;
    key[1] += a->choice != COST_KEEP;
}

/* Lexicographic: -1, 0, 1. */
int offload_key_cmp(const int *a, const int *b, int n)
{
    for (int i = 0; i < n; i++)
        if (a[i] != b[i])
            return a[i] < b[i] ? -1 : 1;
    return 0;
}

/* b is no simpler than a (only asked when simplicity counts). */
static int row_no_simpler(const struct cost_row *a, const struct cost_row *b)
{
    int ka[2] = {0, 0}, kb[2] = {0, 0};
    row_key(a, ka);
    row_key(b, kb);
    return offload_key_cmp(kb, ka, 2) <= 0;
}

/* a gives way to b: b dominates it, and with `simplest` is no less simple. */
static int row_gives_way(const struct cost_row *a, const struct cost_row *b, int simplest)
{
    return row_dominated(a, b) && (!simplest || row_no_simpler(a, b));
}

/* The layer's menu (problem.h) less what another of its actions dominates (ties: the
 * first). */
static int layer_actions(const struct plan *p, const struct plan_stage *st, int l,
                         const struct plan_options *o, int simplest,
                         struct cost_row out[COST_ACTIONS_MAX])
{
    struct cost_row all[COST_ACTIONS_MAX];
    int n_all = method_menu(p, st, l, o, all), n = 0;
    for (int i = 0; i < n_all; i++) {
        int keep = 1;
        for (int j = 0; j < n_all && keep; j++)
            if (j != i && row_gives_way(&all[i], &all[j], simplest) &&
                (j < i || !row_gives_way(&all[j], &all[i], simplest)))
                keep = 0;
        if (keep)
            out[n++] = all[i];
    }
    return n;
}

static int offload_stage_fits(const struct stage_search *ss, const struct cost_sum *sum)
{
    return cost_sum_memory(sum, ss->v, ss->p->reserve_bytes) <= ss->st->memory_limit_bytes &&
           cost_sum_host(sum, ss->v) <= ss->st->host_limit_bytes;
}

static int keep_found(struct stage_search *ss, double recompute_ms)
{
    if (ss->n_found == ss->cap_found) {
        int cap = ss->cap_found ? 2 * ss->cap_found : 16;
        struct candidate *f = realloc(ss->found, (size_t)cap * sizeof *f);
        if (f == NULL)
            return ERR_FAIL;
        ss->found = f;
        ss->cap_found = cap;
    }
    struct candidate *c = &ss->found[ss->n_found];
    *c = (struct candidate){.rows = malloc((size_t)ss->n * sizeof *c->rows),
                            .recompute_ms = recompute_ms};
    if (c->rows == NULL)
        return ERR_FAIL;
    memcpy(c->rows, ss->cur, (size_t)ss->n * sizeof *c->rows);
    for (int l = 0; l < ss->n; l++)
        c->host_bytes += c->rows[l].host_bytes;
    ss->n_found++;
    return ERR_OK;
}

/* Every fitting combination of layers l.. that recomputes less than the bound. */
static int search(struct stage_search *ss, int l, const struct cost_sum *sum)
{
    if (l == ss->n)
        return offload_stage_fits(ss, sum) ? keep_found(ss, sum->recompute_ms) : ERR_OK;
    const struct layer_cost *c = &ss->st->layers[l];
    for (int a = 0; a < ss->n_act[l]; a++) {
        struct cost_sum next = *sum;
        cost_sum_add(&next, c->state_bytes, c->workspace_bytes, 0, &ss->act[l][a]);
        if (next.recompute_ms >= ss->bound ||
            cost_sum_host(&next, ss->v) > ss->st->host_limit_bytes ||
            cost_sum_memory(&next, ss->v, ss->p->reserve_bytes) + ss->rest[l + 1] >
                ss->st->memory_limit_bytes)
            continue;
        ss->cur[l] = ss->act[l][a];
        if (search(ss, l + 1, &next))
            return ERR_FAIL;
    }
    return ERR_OK;
}

/* An action's kind, comparable across layers. */
static int kind(const struct cost_row *r)
{
    const struct layer_action *a = &r->action;
    return (a->choice * 2 + (int)a->place) * (PROFILE_OPTIONS_MAX + 1) + a->offload_option + 1;
}

static const struct cost_row *layer_kind(const struct stage_search *ss, int l, int k)
{
    for (int a = 0; a < ss->n_act[l]; a++)
        if (kind(&ss->act[l][a]) == k)
            return &ss->act[l][a];
    return NULL;
}

/* Layers [0, split) take kind ka, the rest kb: kept if it fits and recomputes less than the
 * bound. */
static int family_member(struct stage_search *ss, int ka, int kb, int split)
{
    struct cost_sum sum = {0};
    for (int l = 0; l < ss->n; l++) {
        const struct cost_row *r = layer_kind(ss, l, l < split ? ka : kb);
        if (r == NULL)
            return ERR_OK;
        ss->cur[l] = *r;
        cost_sum_add(&sum, ss->st->layers[l].state_bytes, ss->st->layers[l].workspace_bytes, 0,
                     r);
    }
    if (sum.recompute_ms >= ss->bound || !offload_stage_fits(ss, &sum))
        return ERR_OK;
    return keep_found(ss, sum.recompute_ms);
}

static int search_families(struct stage_search *ss)
{
    int kinds[COST_ACTIONS_MAX * 4], n_kinds = 0;
    for (int l = 0; l < ss->n; l++)
        for (int a = 0; a < ss->n_act[l]; a++) {
            int k = kind(&ss->act[l][a]), seen = 0;
            for (int i = 0; i < n_kinds; i++)
                seen |= kinds[i] == k;
            if (!seen && n_kinds < (int)(sizeof kinds / sizeof kinds[0]))
                kinds[n_kinds++] = k;
        }
    for (int a = 0; a < n_kinds; a++)
        for (int b = 0; b < n_kinds; b++)
            for (int split = a == b ? ss->n : 1; split <= ss->n; split++)
                if (family_member(ss, kinds[a], kinds[b], split))
                    return ERR_FAIL;
    return ERR_OK;
}

static double combinations(const struct stage_search *ss)
{
    double c = 1;
    for (int l = 0; l < ss->n; l++)
        c *= ss->n_act[l];
    return c;
}

/* How much of its optimizer a candidate hosts, in an order where fewer layers come first. */
static int hosted(const struct candidate *c)
{
    if (c->optimizer != COST_PLACE_HOST)
        return 0;
    return c->optimizer_from > 0 ? (1 << 30) - c->optimizer_from : 1 << 30;
}

/* Seeds first, then by recompute; ties by the bytes copied (the copies' time), then where one
 * hosts a fraction of its optimizer by the layers hosted (a list without fractions sorts as
 * before they existed). */
static int offload_by_recompute(const void *a, const void *b)
{
    const struct candidate *x = a, *y = b;
    if ((x->seeds != 0) != (y->seeds != 0))
        return x->seeds != 0 ? -1 : 1;
    if (x->recompute_ms != y->recompute_ms)
        return x->recompute_ms < y->recompute_ms ? -1 : 1;
    if (x->host_bytes != y->host_bytes)
        return x->host_bytes > y->host_bytes ? 1 : -1;
    int split = (x->optimizer == COST_PLACE_HOST && x->optimizer_from > 0) ||
                (y->optimizer == COST_PLACE_HOST && y->optimizer_from > 0);
    return split ? (hosted(x) > hosted(y)) - (hosted(x) < hosted(y)) : 0;
}

/* i is no better than j on every layer (recompute and copy bytes). */
static int cand_dominated(const struct candidate *i, const struct candidate *j, int n)
{
    for (int l = 0; l < n; l++)
        if (j->rows[l].recompute_ms > i->rows[l].recompute_ms ||
            j->rows[l].host_bytes > i->rows[l].host_bytes)
            return 0;
    return 1;
}

void offload_candidate_free(struct candidate *c)
{
    free(c->rows);
    free(c->layers);
    free(c->buckets);
}

/* A candidate's part of choice_key: its host optimizer, actions and recomputed layers. */
void offload_candidate_key(const struct candidate *c, int n, int key[3])
{
    key[0] = c->optimizer == COST_PLACE_HOST;
    key[1] = key[2] = 0;
    for (int l = 0; l < n; l++)
        row_key(&c->rows[l], key + 1);
}

/* i gives way to j: j dominates it, and where simplicity counts is as simple or simpler. */
static int cand_gives_way(const struct stage_search *ss, int i, int j)
{
    const struct candidate *a = &ss->found[i], *b = &ss->found[j];
    if (!cand_dominated(a, b, ss->n))
        return 0;
    if (!ss->simplest)
        return 1;
    int ka[3], kb[3];
    offload_candidate_key(a, ss->n, ka);
    offload_candidate_key(b, ss->n, kb);
    int c = offload_key_cmp(kb, ka, 3);
    return c <= 0;
}

/* Drops candidates another dominates (of equals, the first stays), but never the first: the
 * recompute-only choice, where the global search starts. The exact search can dominate it
 * where the knapsack's memory units rounded it away from the least recompute; dropping it
 * then left the search starting from an arbitrary candidate, slower than recompute only. */
static int prune(struct stage_search *ss)
{
    /* every comparison first, against the whole list as it was; then free and compact */
    unsigned char *out = calloc((size_t)ss->n_found + 1, 1);
    if (out == NULL)
        return ERR_FAIL;
    for (int i = ss->baseline_first ? 1 : 0; i < ss->n_found; i++)
        for (int j = 0; j < ss->n_found && !out[i]; j++)
            out[i] = j != i && cand_gives_way(ss, i, j) && (j < i || !cand_gives_way(ss, j, i));
    int kept = 0;
    for (int i = 0; i < ss->n_found; i++) {
        if (out[i])
            offload_candidate_free(&ss->found[i]);
        else
            ss->found[kept++] = ss->found[i];
    }
    ss->n_found = kept;
    free(out);
    return ERR_OK;
}

/* Past the cap, the first candidate (the baseline), the seeds' and those that recompute
 * least (ties: copy least) stay. */
void offload_cap_candidates(struct candidate *found, int *count)
{
    int keep = OFFLOAD_STAGE_CANDIDATES_MAX;
    for (int i = 1; i < *count; i++)
        keep += found[i].seeds != 0;
    if (*count <= keep)
        return;
    qsort(found + 1, (size_t)(*count - 1), sizeof *found, offload_by_recompute);
    for (int i = keep; i < *count; i++)
        offload_candidate_free(&found[i]);
    *count = keep;
}

static int offload_search_init(struct stage_search *ss, const struct plan *p, int s,
                               const struct plan_options *o, int simplest)
{
    const struct plan_stage *st = &p->stages[s];
    int n = plan_stage_layer_count(st);
    *ss = (struct stage_search){.p = p, .st = st, .n = n, .v = st->in_flight,
                                .bound = INFINITY, .simplest = simplest};
    if (n > (int)(sizeof ss->n_act / sizeof ss->n_act[0]))
        return ERR_INPUT;
    ss->act = malloc((size_t)n * sizeof *ss->act);
    ss->rest = calloc((size_t)n + 1, sizeof *ss->rest);
    ss->cur = malloc((size_t)n * sizeof *ss->cur);
    if (ss->act == NULL || ss->rest == NULL || ss->cur == NULL)
        return ERR_FAIL;
    for (int l = n - 1; l >= 0; l--) {
        const struct layer_cost *c = &st->layers[l];
        ss->n_act[l] = layer_actions(p, st, l, o, simplest, ss->act[l]);
        int64_t least = INT64_MAX;
        for (int a = 0; a < ss->n_act[l]; a++)
            if (ss->act[l][a].kept_bytes < least)
                least = ss->act[l][a].kept_bytes;
        ss->rest[l] = ss->rest[l + 1] + c->state_bytes + (__int128)ss->v * least;
    }
    return ERR_OK;
}

static void offload_search_free(struct stage_search *ss, int keep_found)
{
    free(ss->act);
    free(ss->rest);
    free(ss->cur);
    if (!keep_found) {
        for (int i = 0; i < ss->n_found; i++)
            offload_candidate_free(&ss->found[i]);
        free(ss->found);
    }
}

/* The stage's least recompute on the device alone, as the method without offload takes it,
 * as candidate 0; *r_ms gets its recompute (INFINITY: none fits). */
static int baseline(struct stage_search *ss, int s, const struct plan_options *o, double *r_ms,
                    struct err *e)
{
    int n = ss->n;
    unsigned char *choice = calloc((size_t)n, 1);
    struct knap_problem kp;
    if (choice == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int rc = ERR_OK;
    if (o->actions & PLAN_ACTION_RECOMPUTE) {
        struct plan_options ro = *o;
        ro.actions = PLAN_ACTION_RECOMPUTE;
        rc = method_problem(ss->p, s, &ro, &kp, e);
        if (rc == ERR_OK) {
            rc = knap_min_recompute(&kp, choice, e);
            knap_free(&kp);
        }
    }
    struct cost_sum sum = {0};
    for (int l = 0; l < n; l++) {
        struct layer_action a = LAYER_ACTION_KEEP;
        a.choice = choice[l];
        ss->cur[l] = cost_action_row(&ss->st->layers[l], &a);
        cost_sum_add(&sum, ss->st->layers[l].state_bytes, ss->st->layers[l].workspace_bytes, 0,
                     &ss->cur[l]);
    }
    free(choice);
    *r_ms = INFINITY;
    if (rc == ERR_NOFIT || (rc == ERR_OK && !offload_stage_fits(ss, &sum))) {
        err_clear(e);
        return ERR_OK;
    }
    if (rc)
        return rc;
    *r_ms = sum.recompute_ms;
    return keep_found(ss, sum.recompute_ms) ? err_set(e, ERR_FAIL, "out of memory") : ERR_OK;
}

/* How the simulator sees a candidate of stage st. */
int offload_candidate_sim(const struct plan_stage *st, struct candidate *c)
{
    int n = plan_stage_layer_count(st), offloads = 0;
    c->layers = calloc((size_t)n, sizeof *c->layers);
    c->buckets = calloc((size_t)n, sizeof *c->buckets);
    if (c->layers == NULL || c->buckets == NULL)
        return ERR_FAIL;
    c->sim = (struct sim_stage){.out_bytes = st->layers[n - 1].out_bytes,
                                .out_fwd_ms = st->layers[n - 1].fwd_ms, .link = st->link,
                                .allreduce_ms = cost_dp_allreduce_ms(&st->dp_link, st->dp,
                                                                     st->allreduce_bytes)};
    for (int l = 0; l < n; l++) {
        const struct cost_row *r = &c->rows[l];
        double copy = r->host_bytes > 0 ? link_transfer_ms(&st->host_link, r->host_bytes) : 0;
        c->layers[l] = (struct sim_layer){.fwd_ms = st->layers[l].fwd_ms,
                                          .bwd_ms = st->layers[l].bwd_ms,
                                          .recompute_ms = r->recompute_ms,
                                          .copy_ms = copy,
                                          .ahead = r->action.prefetch_ahead};
        c->sim.fwd_ms += st->layers[l].fwd_ms;
        c->sim.bwd_ms += st->layers[l].bwd_ms;
        c->sim.recompute_ms += r->recompute_ms;
        offloads |= r->host_bytes > 0;
    }
    c->sim.n_layers = offloads ? n : 0;
    c->sim.layers = c->layers;
    c->sim.n_buckets = sim_buckets_from_plan(st, c->buckets);
    c->sim.buckets = c->buckets;
    c->optimizer = st->optimizer;
    c->optimizer_from = st->optimizer_from;
    sim_stage_optimizer_from(st->layers, n, st->optimizer, st->optimizer_from, &st->host_link,
                             &c->sim, c->layers);
    c->stream = st->optimizer == COST_PLACE_HOST ? plan_stage_streams(st) : 0;
    for (int l = n - c->stream; l < n; l++)
        sim_layer_stream(&c->layers[l], &st->layers[l], &st->host_link);
    return ERR_OK;
}

/* The search's candidates of stage s: the baseline first, then the undominated offloading
 * ones. */
static int search_stage(struct stage_search *ss, int s, const struct plan_options *o,
                        struct err *e)
{
    double r0 = INFINITY;
    int rc = baseline(ss, s, o, &r0, e);
    if (rc)
        return rc;
    /* With its optimizer on the host the stage runs layer by layer, each layer's gradients
     * leaving as its last backward ends: which layers recompute matters, not only the sum, so
     * the least recompute dominates nothing and every combination is a candidate. */
    int by_layer = ss->st->optimizer == COST_PLACE_HOST;
    ss->bound = by_layer ? INFINITY : r0;
    ss->baseline_first = r0 < INFINITY;
    int all = combinations(ss) <= OFFLOAD_ENUM_MAX;
    if ((ss->st->host_limit_bytes > 0 && (o->actions & PLAN_ACTION_OFFLOAD)) || by_layer)
        rc = all ? search(ss, 0, &(struct cost_sum){0}) : search_families(ss);
    if (rc == ERR_OK && prune(ss))
        rc = ERR_FAIL;
    if (!all)
        offload_cap_candidates(ss->found, &ss->n_found);
    return rc;
}

/* --min-gain's candidates of stage s: every fitting combination, pruned with simplicity
 * counted; *enumerable 0 (and none) past OFFLOAD_ENUM_MAX combinations. */
static int simplest_stage(struct stage_search *ss, int *enumerable)
{
    *enumerable = combinations(ss) <= OFFLOAD_ENUM_MAX;
    if (!*enumerable)
        return ERR_OK;
    return search(ss, 0, &(struct cost_sum){0}) || prune(ss) ? ERR_FAIL : ERR_OK;
}

/* Stage s's candidates (simplest: offload_simplest's, else the search's); *enumerable as
 * simplest_stage says (1 for the search). */
static int stage_candidates(const struct plan *p, int s, const struct plan_options *o,
                            int simplest, struct candidate **out, int *count, int *enumerable,
                            struct err *e)
{
    struct stage_search ss;
    int rc = offload_search_init(&ss, p, s, o, simplest);
    *enumerable = 1;
    if (rc == ERR_INPUT)
        return err_set(e, ERR_INPUT, "stage %d: %d layers is more than offload planning takes",
                       s, ss.n);
    if (rc == ERR_OK)
        rc = simplest ? simplest_stage(&ss, enumerable) : search_stage(&ss, s, o, e);
    for (int i = 0; i < ss.n_found && rc == ERR_OK; i++)
        rc = offload_candidate_sim(&p->stages[s], &ss.found[i]);
    if (rc && e->code == ERR_OK)
        err_set(e, ERR_FAIL, "out of memory planning stage %d", s);
    *out = rc == ERR_OK ? ss.found : NULL;
    *count = rc == ERR_OK ? ss.n_found : 0;
    offload_search_free(&ss, rc == ERR_OK);
    if (rc == ERR_OK && *count == 0 && *enumerable)
        return ERR_NOFIT;
    return rc;
}

static void candidates_free(struct candidate *c, int n)
{
    for (int i = 0; i < n; i++)
        offload_candidate_free(&c[i]);
    free(c);
}

/* Stage s's candidates with its optimizer on the host from layer `from` on (0: every layer)
 * and its last `stream` layers' weights streamed, appended to (*all, *n_all) when the stage
 * may; *enumerable as stage_candidates. */
static int host_candidates(const struct plan *p, int s, int from, int stream,
                           const struct plan_options *o, int simplest, struct candidate **all,
                           int *n_all, int *enumerable, struct err *e)
{
    struct optimizer_view v;
    struct candidate *host = NULL;
    int n_host = 0, mine = 1, rc;
    if (!optimizer_stream_possible(p, s, from, stream))
        return ERR_OK;
    if (optimizer_view_init_stream(p, s, from, stream, &v, e))
        return e->code;
    rc = stage_candidates(&v.plan, s, o, simplest, &host, &n_host, &mine, e);
    optimizer_view_free(&v);
    *enumerable = *enumerable && mine;
    if (rc == ERR_NOFIT) {
        err_clear(e);
        free(host);
        return ERR_OK;
    }
    if (rc)
        return rc;
    struct candidate *grown = realloc(*all, (size_t)(*n_all + n_host + 1) * sizeof *grown);
    if (grown == NULL) {
        candidates_free(host, n_host);
        return err_set(e, ERR_FAIL, "out of memory planning stage %d", s);
    }
    if (n_host > 0)
        memcpy(grown + *n_all, host, (size_t)n_host * sizeof *host);
    free(host);
    *all = grown;
    *n_all += n_host;
    return ERR_OK;
}

/* Stage s's candidates with its optimizer on the device, then (with --actions ...,optimizer,
 * where it may) those with it on the host, and with optimizer-fraction those with the host
 * taking its last layers' (optimizer_splits): each place's own undominated ones, since the
 * places' steps are not comparable layer by layer. */
int offload_stage_candidates(const struct plan *p, int s, const struct plan_options *o,
                             int simplest, struct candidate **out, int *count, int *enumerable,
                             struct err *e)
{
    int from[1 + OPTIMIZER_SPLITS_MAX], n_from = 0;
    if (o->actions & PLAN_ACTION_OPTIMIZER)
        from[n_from++] = 0;
    if (o->actions & PLAN_ACTION_OPTIMIZER_FRACTION)
        n_from += optimizer_splits(p, s, from + n_from);
    *out = NULL;
    *count = 0;
    int rc = stage_candidates(p, s, o, simplest, out, count, enumerable, e);
    if (rc != ERR_OK && rc != ERR_NOFIT)
        return rc;
    err_clear(e);
    for (int i = 0; i < n_from && e->code == ERR_OK; i++) {
        int stream[OPTIMIZER_SPLITS_MAX], n_stream = 0;
        host_candidates(p, s, from[i], 0, o, simplest, out, count, enumerable, e);
        if (o->actions & PLAN_ACTION_WEIGHTS)
            n_stream = optimizer_streams(p, s, from[i], stream);
        for (int k = 0; k < n_stream && e->code == ERR_OK; k++)
            host_candidates(p, s, from[i], stream[k], o, simplest, out, count, enumerable, e);
    }
    if (e->code) {
        candidates_free(*out, *count);
        *out = NULL;
        *count = 0;
        return e->code;
    }
    return *count > 0 ? ERR_OK : ERR_NOFIT;
}

int offload_stage_min_recompute(const struct plan *p, int s, const struct plan_options *o,
                                double *ms, struct err *e)
{
    struct candidate *c = NULL;
    int n = 0, enumerable;
    int rc = stage_candidates(p, s, o, 0, &c, &n, &enumerable, e);
    *ms = INFINITY;
    for (int i = 0; i < n; i++) {
        if (c[i].recompute_ms < *ms)
            *ms = c[i].recompute_ms;
        offload_candidate_free(&c[i]);
    }
    free(c);
    return rc;
}
