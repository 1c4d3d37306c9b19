/* Ballast's optimal method with offloading (offload.h): each stage's undominated candidates
 * by a bounded search over its layers' actions, then the simulator over the stages. */
#include "offload.h"

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
        else
            return err_set(e, ERR_INPUT,
                           "--actions: \"%s\": expected recompute, offload, optimizer, "
                           "optimizer-fraction, comma-separated",
                           text);
        at += len + (at[len] == ',');
    }
    if (actions == 0)
        return err_set(e, ERR_INPUT, "--actions: empty, expected recompute, offload, optimizer, "
                                     "optimizer-fraction, comma-separated");
    o->actions = actions;
    return ERR_OK;
}

int offload_options_check(const struct plan_options *o, struct err *e)
{
    if (o->actions < 1 ||
        o->actions > (PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD | PLAN_ACTION_OPTIMIZER |
                      PLAN_ACTION_OPTIMIZER_FRACTION) ||
        ((o->actions & PLAN_ACTION_OPTIMIZER_FRACTION) && !(o->actions & PLAN_ACTION_OPTIMIZER)))
        return err_set(e, ERR_INPUT, "plan options: actions %d", o->actions);
    if (o->actions == PLAN_ACTION_RECOMPUTE)
        return ERR_OK;
    if (o->method != METHOD_OPTIMAL)
        return err_set(e, ERR_INPUT, "--actions offload or optimizer applies to --method optimal "
                                     "only (patent stays the published method: recompute)");
    return ERR_OK;
}

/* Every stage that may offload has a host link; some stage may. */
static int check_hosts(const struct plan *p, struct err *e)
{
    int any = 0;
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        if (st->host_limit_bytes > 0 && !st->host_link.present)
            return err_set(e, ERR_INPUT,
                           "stages[%d] (%s): host_memory_bytes %lld but no host_link (none in the "
                           "cluster, its profile, or devices.json's host_link_gbs for it)",
                           s, st->device, (long long)st->host_limit_bytes);
        any |= st->host_limit_bytes > 0;
    }
    if (!any)
        return err_set(e, ERR_INPUT,
                       "--actions offload or optimizer: no stage of the cluster has "
                       "host_memory_bytes (the host memory it may offload to)");
    return ERR_OK;
}

/* One candidate of a stage: its action per layer and how the simulator sees it. */
struct candidate {
    struct cost_row *rows; /* n */
    struct sim_stage sim;
    struct sim_layer *layers; /* n, used when it offloads or hosts its optimizer */
    struct sim_bucket *buckets; /* n at most: its gradients' reduction */
    double recompute_ms;
    enum cost_place optimizer;
    int optimizer_from;
};

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
};

int offload_action_allowed(const struct cost_row *r, const struct plan_stage *st,
                           const struct plan_options *o)
{
    if (!(o->actions & PLAN_ACTION_RECOMPUTE) && r->choice != COST_KEEP)
        return 0;
    if ((!(o->actions & PLAN_ACTION_OFFLOAD) || st->host_limit_bytes == 0) && r->host_bytes > 0)
        return 0;
    return !o->whole_layers || (r->choice <= COST_FULL && r->offload_option < 0);
}

/* a no better than b in every term the memory and the simulator see. */
static int row_dominated(const struct cost_row *a, const struct cost_row *b)
{
    return b->recompute_ms <= a->recompute_ms && b->host_bytes <= a->host_bytes &&
           b->kept_bytes <= a->kept_bytes && b->transient_bytes <= a->transient_bytes;
}

/* The layer's allowed actions that no other allowed action dominates (ties: the first). */
static int layer_actions(const struct plan *p, const struct plan_stage *st, int l,
                         const struct plan_options *o, struct cost_row out[COST_ACTIONS_MAX])
{
    struct cost_row all[COST_ACTIONS_MAX];
    int n_all = cost_actions(&st->layers[l], cost_whole_offload(&p->model, l, st->first + l), all),
        n = 0;
    for (int i = 0; i < n_all; i++) {
        int keep = offload_action_allowed(&all[i], st, o);
        for (int j = 0; j < n_all && keep; j++)
            if (j != i && offload_action_allowed(&all[j], st, o) && row_dominated(&all[i], &all[j]) &&
                (j < i || !row_dominated(&all[j], &all[i])))
                keep = 0;
        if (keep)
            out[n++] = all[i];
    }
    return n;
}

static int stage_fits(const struct stage_search *ss, const struct cost_sum *sum)
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
    ss->n_found++;
    return ERR_OK;
}

/* Every fitting combination of layers l.. that recomputes less than the bound. */
static int search(struct stage_search *ss, int l, const struct cost_sum *sum)
{
    if (l == ss->n)
        return stage_fits(ss, sum) ? keep_found(ss, sum->recompute_ms) : ERR_OK;
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
    return (r->choice * 2 + (int)r->place) * (PROFILE_OPTIONS_MAX + 1) + r->offload_option + 1;
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
    if (sum.recompute_ms >= ss->bound || !stage_fits(ss, &sum))
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

/* Less recompute first; of equals, where one hosts a fraction of its optimizer, the one
 * hosting less (a list without fractions sorts as before they existed). */
static int by_recompute(const void *a, const void *b)
{
    const struct candidate *x = a, *y = b;
    int r = (x->recompute_ms > y->recompute_ms) - (x->recompute_ms < y->recompute_ms);
    int split = (x->optimizer == COST_PLACE_HOST && x->optimizer_from > 0) ||
                (y->optimizer == COST_PLACE_HOST && y->optimizer_from > 0);
    return r != 0 || !split ? r : (hosted(x) > hosted(y)) - (hosted(x) < hosted(y));
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

static void candidate_free(struct candidate *c)
{
    free(c->rows);
    free(c->layers);
    free(c->buckets);
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
            out[i] = j != i && cand_dominated(&ss->found[i], &ss->found[j], ss->n) &&
                     (j < i || !cand_dominated(&ss->found[j], &ss->found[i], ss->n));
    int kept = 0;
    for (int i = 0; i < ss->n_found; i++) {
        if (out[i])
            candidate_free(&ss->found[i]);
        else
            ss->found[kept++] = ss->found[i];
    }
    ss->n_found = kept;
    free(out);
    return ERR_OK;
}

/* Past the cap, the first candidate (the baseline) and those that recompute least stay. */
static void cap_candidates(struct candidate *found, int *count)
{
    if (*count <= OFFLOAD_STAGE_CANDIDATES_MAX)
        return;
    qsort(found + 1, (size_t)(*count - 1), sizeof *found, by_recompute);
    for (int i = OFFLOAD_STAGE_CANDIDATES_MAX; i < *count; i++)
        candidate_free(&found[i]);
    *count = OFFLOAD_STAGE_CANDIDATES_MAX;
}

static int search_init(struct stage_search *ss, const struct plan *p, int s,
                       const struct plan_options *o, double bound)
{
    const struct plan_stage *st = &p->stages[s];
    int n = plan_stage_layer_count(st);
    *ss = (struct stage_search){.p = p, .st = st, .n = n, .v = st->in_flight, .bound = bound};
    if (n > (int)(sizeof ss->n_act / sizeof ss->n_act[0]))
        return ERR_INPUT;
    ss->act = malloc((size_t)n * sizeof *ss->act);
    ss->rest = calloc((size_t)n + 1, sizeof *ss->rest);
    ss->cur = malloc((size_t)n * sizeof *ss->cur);
    if (ss->act == NULL || ss->rest == NULL || ss->cur == NULL)
        return ERR_FAIL;
    for (int l = n - 1; l >= 0; l--) {
        const struct layer_cost *c = &st->layers[l];
        ss->n_act[l] = layer_actions(p, st, l, o, ss->act[l]);
        int64_t least = INT64_MAX;
        for (int a = 0; a < ss->n_act[l]; a++)
            if (ss->act[l][a].kept_bytes < least)
                least = ss->act[l][a].kept_bytes;
        ss->rest[l] = ss->rest[l + 1] + c->state_bytes + (__int128)ss->v * least;
    }
    return ERR_OK;
}

static void search_free(struct stage_search *ss, int keep_found)
{
    free(ss->act);
    free(ss->rest);
    free(ss->cur);
    if (!keep_found) {
        for (int i = 0; i < ss->n_found; i++)
            candidate_free(&ss->found[i]);
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
        ss->cur[l] = cost_action_row(&ss->st->layers[l], choice[l], COST_PLACE_DEVICE, -1, 0);
        cost_sum_add(&sum, ss->st->layers[l].state_bytes, ss->st->layers[l].workspace_bytes, 0,
                     &ss->cur[l]);
    }
    free(choice);
    *r_ms = INFINITY;
    if (rc == ERR_NOFIT || (rc == ERR_OK && !stage_fits(ss, &sum))) {
        err_clear(e);
        return ERR_OK;
    }
    if (rc)
        return rc;
    *r_ms = sum.recompute_ms;
    return keep_found(ss, sum.recompute_ms) ? err_set(e, ERR_FAIL, "out of memory") : ERR_OK;
}

/* How the simulator sees a candidate of stage st. */
static int candidate_sim(const struct plan_stage *st, struct candidate *c)
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
                                          .ahead = r->prefetch_ahead};
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
    return ERR_OK;
}

/* Stage s's candidates: the baseline first, then the undominated offloading ones. */
static int stage_candidates(const struct plan *p, int s, const struct plan_options *o,
                            struct candidate **out, int *count, struct err *e)
{
    struct stage_search ss;
    double r0 = INFINITY;
    int rc = search_init(&ss, p, s, o, 0);
    if (rc == ERR_INPUT)
        return err_set(e, ERR_INPUT, "stage %d: %d layers is more than offload planning takes",
                       s, ss.n);
    if (rc == ERR_OK && baseline(&ss, s, o, &r0, e) == ERR_OK) {
        /* A stage that steps its optimizer on the host runs layer by layer, and where a layer
         * recomputes moves when its host step can start: less recompute in all does not
         * dominate then, only less in every layer (prune). */
        ss.bound = p->stages[s].optimizer == COST_PLACE_HOST ? INFINITY : r0;
        ss.baseline_first = r0 < INFINITY;
        int all = combinations(&ss) <= OFFLOAD_ENUM_MAX;
        if ((p->stages[s].host_limit_bytes > 0 && (o->actions & PLAN_ACTION_OFFLOAD)) ||
            p->stages[s].optimizer == COST_PLACE_HOST)
            rc = all ? search(&ss, 0, &(struct cost_sum){0}) : search_families(&ss);
        if (rc == ERR_OK && prune(&ss))
            rc = err_set(e, ERR_FAIL, "out of memory");
        if (!all)
            cap_candidates(ss.found, &ss.n_found);
        for (int i = 0; i < ss.n_found && rc == ERR_OK; i++)
            rc = candidate_sim(&p->stages[s], &ss.found[i]);
    } else if (rc == ERR_OK) {
        rc = e->code;
    }
    if (rc && e->code == ERR_OK)
        err_set(e, ERR_FAIL, "out of memory planning stage %d", s);
    *out = rc == ERR_OK ? ss.found : NULL;
    *count = rc == ERR_OK ? ss.n_found : 0;
    search_free(&ss, rc == ERR_OK);
    if (rc == ERR_OK && *count == 0)
        return ERR_NOFIT;
    return rc;
}

static void candidates_free(struct candidate *c, int n)
{
    for (int i = 0; i < n; i++)
        candidate_free(&c[i]);
    free(c);
}

/* Stage s's candidates with its optimizer on the host from layer `from` on, appended to
 * (*all, *n_all) when the stage may host it. */
static int host_candidates(const struct plan *p, int s, int from, const struct plan_options *o,
                           struct candidate **all, int *n_all, struct err *e)
{
    struct optimizer_view v;
    struct candidate *host = NULL;
    int n_host = 0, rc;
    if (!optimizer_host_possible_from(p, s, from, NULL))
        return ERR_OK;
    if (optimizer_view_init_from(p, s, from, &v, e))
        return e->code;
    rc = stage_candidates(&v.plan, s, o, &host, &n_host, e);
    optimizer_view_free(&v);
    if (rc == ERR_NOFIT) {
        err_clear(e);
        free(host);
        return ERR_OK;
    }
    if (rc)
        return rc;
    struct candidate *grown = realloc(*all, (size_t)(*n_all + n_host) * sizeof *grown);
    if (grown == NULL) {
        candidates_free(host, n_host);
        return err_set(e, ERR_FAIL, "out of memory planning stage %d", s);
    }
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
static int stage_candidates_places(const struct plan *p, int s, const struct plan_options *o,
                                   struct candidate **out, int *count, struct err *e)
{
    int from[1 + OPTIMIZER_SPLITS_MAX], n_from = 0;
    if (o->actions & PLAN_ACTION_OPTIMIZER)
        from[n_from++] = 0;
    if (o->actions & PLAN_ACTION_OPTIMIZER_FRACTION)
        n_from += optimizer_splits(p, s, from + n_from);
    *out = NULL;
    *count = 0;
    int rc = stage_candidates(p, s, o, out, count, e);
    if (rc != ERR_OK && rc != ERR_NOFIT)
        return rc;
    err_clear(e);
    for (int i = 0; i < n_from && e->code == ERR_OK; i++)
        host_candidates(p, s, from[i], o, out, count, e);
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
    int n = 0;
    int rc = stage_candidates(p, s, o, &c, &n, e);
    *ms = INFINITY;
    for (int i = 0; i < n; i++) {
        if (c[i].recompute_ms < *ms)
            *ms = c[i].recompute_ms;
        candidate_free(&c[i]);
    }
    free(c);
    return rc;
}

struct global {
    enum schedule schedule;
    int S, M;
    struct candidate **cand; /* per stage */
    int *count;
    int *pick;
    struct sim_stage *sim;
};

static int evaluate(struct global *g, double *ms, struct err *e)
{
    for (int s = 0; s < g->S; s++)
        g->sim[s] = g->cand[s][g->pick[s]].sim;
    return sim_makespan(g->schedule, g->S, g->M, g->sim, ms, e);
}

/* Every combination of the stages' candidates, in odometer order from all baselines: the
 * first least time wins (so the baselines win ties). */
static int exhaustive(struct global *g, double *best_ms, int *best, struct err *e)
{
    memset(g->pick, 0, (size_t)g->S * sizeof *g->pick);
    *best_ms = INFINITY;
    for (;;) {
        double ms;
        if (evaluate(g, &ms, e))
            return e->code;
        if (ms < *best_ms) {
            *best_ms = ms;
            memcpy(best, g->pick, (size_t)g->S * sizeof *best);
        }
        int s = 0;
        while (s < g->S && ++g->pick[s] == g->count[s])
            g->pick[s++] = 0;
        if (s == g->S)
            return ERR_OK;
    }
}

/* Stage by stage, each its best candidate with the others fixed, until none improves. */
static int descend(struct global *g, double *best_ms, int *best, struct err *e)
{
    memset(g->pick, 0, (size_t)g->S * sizeof *g->pick);
    if (evaluate(g, best_ms, e))
        return e->code;
    for (int improved = 1; improved;) {
        improved = 0;
        for (int s = 0; s < g->S; s++) {
            int keep = g->pick[s];
            for (int k = 0; k < g->count[s]; k++) {
                double ms;
                if (k == keep)
                    continue;
                g->pick[s] = k;
                if (evaluate(g, &ms, e))
                    return e->code;
                if (ms < *best_ms) {
                    *best_ms = ms;
                    keep = k;
                    improved = 1;
                }
            }
            g->pick[s] = keep;
        }
    }
    memcpy(best, g->pick, (size_t)g->S * sizeof *best);
    return ERR_OK;
}

static void apply(struct plan_stage *st, const struct candidate *c)
{
    for (int l = 0; l < plan_stage_layer_count(st); l++) {
        st->recompute[l] = (unsigned char)c->rows[l].choice;
        st->place[l] = (unsigned char)c->rows[l].place;
        st->offload_option[l] = (signed char)c->rows[l].offload_option;
        st->prefetch_ahead[l] = c->rows[l].prefetch_ahead;
    }
    st->optimizer = c->optimizer;
    st->optimizer_from = c->optimizer_from;
}

static int choose(struct plan *p, struct global *g, const struct plan_options *o, struct err *e)
{
    double product = 1;
    for (int s = 0; s < g->S; s++) {
        int rc = stage_candidates_places(p, s, o, &g->cand[s], &g->count[s], e);
        if (rc)
            return rc;
        product *= g->count[s];
    }
    if (product > OFFLOAD_EXHAUSTIVE_MAX) /* not exact anyway: keep the descent short */
        for (int s = 0; s < g->S; s++)
            cap_candidates(g->cand[s], &g->count[s]);
    int *best = malloc((size_t)g->S * sizeof *best);
    double ms;
    if (best == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int rc = product <= OFFLOAD_EXHAUSTIVE_MAX ? exhaustive(g, &ms, best, e)
                                                : descend(g, &ms, best, e);
    for (int s = 0; s < g->S && rc == ERR_OK; s++)
        apply(&p->stages[s], &g->cand[s][best[s]]);
    free(best);
    return rc;
}

int offload_choose(struct plan *p, const struct plan_options *o, struct err *e)
{
    if ((o->actions & (PLAN_ACTION_OFFLOAD | PLAN_ACTION_OPTIMIZER)) && check_hosts(p, e))
        return e->code;
    int S = p->n_stages;
    struct global g = {.schedule = p->schedule,
                       .S = S,
                       .M = p->micro_batches,
                       .cand = calloc((size_t)S, sizeof *g.cand),
                       .count = calloc((size_t)S, sizeof *g.count),
                       .pick = calloc((size_t)S, sizeof *g.pick),
                       .sim = calloc((size_t)S, sizeof *g.sim)};
    int rc = g.cand && g.count && g.pick && g.sim ? choose(p, &g, o, e)
                                                  : err_set(e, ERR_FAIL, "out of memory");
    for (int s = 0; g.cand != NULL && s < S; s++) {
        for (int k = 0; k < g.count[s]; k++)
            candidate_free(&g.cand[s][k]);
        free(g.cand[s]);
    }
    free(g.cand);
    free(g.count);
    free(g.pick);
    free(g.sim);
    return rc;
}

int offload_fallback_save(const struct plan *p, struct offload_fallback *f, struct err *e)
{
    int total = 0;
    for (int s = 0; s < p->n_stages; s++)
        total += plan_stage_layer_count(&p->stages[s]);
    f->recompute = malloc((size_t)total + 1);
    if (f->recompute == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int s = 0, at = 0; s < p->n_stages; s++) {
        int n = plan_stage_layer_count(&p->stages[s]);
        memcpy(f->recompute + at, p->stages[s].recompute, (size_t)n);
        at += n;
    }
    struct sim_result r;
    if (sim_plan(p, &r, e)) {
        offload_fallback_free(f);
        return e->code;
    }
    f->iteration_ms = r.iteration_ms;
    sim_result_free(&r);
    return ERR_OK;
}

void offload_fallback_restore(struct plan *p, const struct offload_fallback *f)
{
    for (int s = 0, at = 0; s < p->n_stages; s++) {
        struct plan_stage *st = &p->stages[s];
        int n = plan_stage_layer_count(st);
        memcpy(st->recompute, f->recompute + at, (size_t)n);
        memset(st->place, COST_PLACE_DEVICE, (size_t)n);
        memset(st->offload_option, -1, (size_t)n);
        memset(st->prefetch_ahead, 0, (size_t)n * sizeof *st->prefetch_ahead);
        st->optimizer = COST_PLACE_DEVICE;
        st->optimizer_from = 0;
        at += n;
    }
}

void offload_fallback_free(struct offload_fallback *f)
{
    free(f->recompute);
    f->recompute = NULL;
}
