/* Ballast's optimal method with offloading (offload.h), the stages together: every
 * combination of the stages' candidates simulated, or a descent stage by stage, from the
 * baselines or the fastest seed; and --min-gain's simplest combination within its cap. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "offload_stage.h"

struct global {
    enum schedule schedule;
    int S, M;
    struct candidate **cand; /* per stage */
    int *count;
    int *pick;
    struct sim_stage *sim;
    int n_seeds;
};

/* Faster by more than floating-point noise: a host optimizer or an offload that sums the same
 * times in another order never wins a tie. */
static int faster(double ms, double best_ms)
{
    return isinf(best_ms) ? ms < best_ms : ms < best_ms - CHOICE_NOISE * (1 + fabs(best_ms));
}

static int evaluate_offload(struct global *g, double *ms, struct err *e)
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
        if (evaluate_offload(g, &ms, e))
            return e->code;
        if (faster(ms, *best_ms)) {
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

/* The descent's start: all baselines, or the fastest seed (a smaller set's plan), so that it
 * ends no slower than any of them. */
static int descent_start(struct global *g, double *best_ms, struct err *e)
{
    int *start = malloc((size_t)g->S * sizeof *start);
    if (start == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    memset(g->pick, 0, (size_t)g->S * sizeof *g->pick);
    int rc = evaluate_offload(g, best_ms, e);
    memcpy(start, g->pick, (size_t)g->S * sizeof *start);
    for (int k = 0; k < g->n_seeds && rc == ERR_OK; k++) {
        double ms;
        for (int s = 0; s < g->S; s++)
            for (int c = 0; c < g->count[s]; c++)
                if (g->cand[s][c].seeds >> k & 1)
                    g->pick[s] = c;
        if ((rc = evaluate_offload(g, &ms, e)) == ERR_OK && faster(ms, *best_ms)) {
            *best_ms = ms;
            memcpy(start, g->pick, (size_t)g->S * sizeof *start);
        }
    }
    memcpy(g->pick, start, (size_t)g->S * sizeof *start);
    free(start);
    return rc;
}

/* Stage by stage, each its best candidate with the others fixed, until none improves. */
static int descend(struct global *g, double *best_ms, int *best, struct err *e)
{
    if (descent_start(g, best_ms, e))
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
                if (evaluate_offload(g, &ms, e))
                    return e->code;
                if (faster(ms, *best_ms)) {
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
    int n = plan_stage_layer_count(st);
    for (int l = 0; l < n; l++) {
        st->actions[l] = c->rows[l].action;
        st->actions[l].weights = l >= n - c->stream ? COST_PLACE_HOST : COST_PLACE_DEVICE;
    }
    st->optimizer = c->optimizer;
    st->optimizer_from = c->optimizer_from;
}

static int same_candidate(const struct candidate *a, const struct candidate *b, int n)
{
    for (int l = 0; l < n; l++)
        if (!layer_action_equal(&a->rows[l].action, &b->rows[l].action))
            return 0;
    return a->optimizer == b->optimizer && a->optimizer_from == b->optimizer_from &&
           a->stream == b->stream;
}

/* Stage s's choice in seed k as a candidate, marked as the seed's; one equal to a candidate
 * the search found marks that one instead. */
static int add_seed(const struct plan *p, int s, const struct choice_snapshot *seed, int k,
                    struct candidate **cand, int *count)
{
    struct plan_stage st = p->stages[s];
    int n = plan_stage_layer_count(&st), at = st.first - p->stages[0].first;
    struct candidate c = {.rows = malloc((size_t)n * sizeof *c.rows), .seeds = 1u << k};
    if (c.rows == NULL)
        return ERR_FAIL;
    st.optimizer = (enum cost_place)seed->optimizer[s];
    st.optimizer_from = seed->optimizer_from[s];
    st.actions = &seed->actions[at]; /* which of its layers stream their weights */
    for (int l = 0; l < n; l++) {
        c.rows[l] = cost_action_row(&st.layers[l], &seed->actions[at + l]);
        c.recompute_ms += c.rows[l].recompute_ms;
        c.host_bytes += c.rows[l].host_bytes;
    }
    c.optimizer = st.optimizer;
    c.optimizer_from = st.optimizer_from;
    for (int i = 0; i < *count; i++)
        if (same_candidate(&(*cand)[i], &c, n)) {
            (*cand)[i].seeds |= c.seeds;
            free(c.rows);
            return ERR_OK;
        }
    struct candidate *grown = realloc(*cand, (size_t)(*count + 1) * sizeof *grown);
    if (grown == NULL || offload_candidate_sim(&st, &c)) {
        if (grown != NULL)
            *cand = grown;
        offload_candidate_free(&c);
        return ERR_FAIL;
    }
    *cand = grown;
    grown[(*count)++] = c;
    return ERR_OK;
}

/* Stage s's candidates: the search's, and the seeds'. */
static int stage_all(struct plan *p, int s, const struct plan_options *o,
                     const struct choice_snapshot *const *seeds, struct global *g,
                     struct err *e)
{
    int enumerable;
    int rc = offload_stage_candidates(p, s, o, 0, &g->cand[s], &g->count[s], &enumerable, e);
    if (rc != ERR_OK && (rc != ERR_NOFIT || g->n_seeds == 0))
        return rc;
    err_clear(e);
    for (int k = 0; k < g->n_seeds; k++)
        if (add_seed(p, s, seeds[k], k, &g->cand[s], &g->count[s]))
            return err_set(e, ERR_FAIL, "out of memory planning stage %d", s);
    return g->count[s] > 0 ? ERR_OK : ERR_NOFIT;
}

static int choose(struct plan *p, struct global *g, const struct plan_options *o,
                  const struct choice_snapshot *const *seeds, struct err *e)
{
    double product = 1;
    for (int s = 0; s < g->S; s++) {
        int rc = stage_all(p, s, o, seeds, g, e);
        if (rc)
            return rc;
        product *= g->count[s];
    }
    if (product > OFFLOAD_EXHAUSTIVE_MAX) /* not exact anyway: keep the descent short */
        for (int s = 0; s < g->S; s++)
            offload_cap_candidates(g->cand[s], &g->count[s]);
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

static int global_init(struct global *g, const struct plan *p, int n_seeds, struct err *e)
{
    int S = p->n_stages;
    *g = (struct global){.schedule = p->schedule,
                         .S = S,
                         .M = p->micro_batches,
                         .cand = calloc((size_t)S, sizeof *g->cand),
                         .count = calloc((size_t)S, sizeof *g->count),
                         .pick = calloc((size_t)S, sizeof *g->pick),
                         .sim = calloc((size_t)S, sizeof *g->sim),
                         .n_seeds = n_seeds};
    return g->cand && g->count && g->pick && g->sim ? ERR_OK
                                                    : err_set(e, ERR_FAIL, "out of memory");
}

static void global_free(struct global *g)
{
    for (int s = 0; g->cand != NULL && s < g->S; s++) {
        for (int k = 0; k < g->count[s]; k++)
            offload_candidate_free(&g->cand[s][k]);
        free(g->cand[s]);
    }
    free(g->cand);
    free(g->count);
    free(g->pick);
    free(g->sim);
}

int offload_choose(struct plan *p, const struct plan_options *o,
                   const struct choice_snapshot *const *seeds, int n_seeds, struct err *e)
{
    struct global g;
    if (n_seeds > OFFLOAD_SEEDS_MAX)
        return err_set(e, ERR_FAIL, "offload_choose: %d seeds, at most %d", n_seeds,
                       OFFLOAD_SEEDS_MAX);
    int rc = global_init(&g, p, n_seeds, e);
    if (rc == ERR_OK)
        rc = choose(p, &g, o, seeds, e);
    global_free(&g);
    return rc;
}


/* The combination in g->pick: its key (choice.h; with a framework's preference the whole
 * plan's, p then holding it) in key[0..4]. */
/* The combination's choice key (choice.h) but its balance, which is the split's: the same for
 * every combination. */
static void pick_key(const struct plan *p, const struct global *g, int key[3])
{
    memset(key, 0, 3 * sizeof *key);
    for (int s = 0; s < g->S; s++) {
        int k[3], n = plan_stage_layer_count(&p->stages[s]);
        offload_candidate_key(&g->cand[s][g->pick[s]], n, k);
        for (int i = 0; i < 3; i++)
            key[i] += k[i];
    }
}

/* Every combination: the simplest within the cap, ties by the shorter step. */
static int simplest_all(struct plan *p, struct global *g, const struct plan_options *o,
                        double cap, int *best, struct err *e)
{
    int key[3], best_key[3], found = 0;
    double best_ms = INFINITY;
    memset(g->pick, 0, (size_t)g->S * sizeof *g->pick);
    for (;;) {
        double ms;
        pick_key(p, g, key);
        int c = found ? offload_key_cmp(key, best_key, 3) : -1;
        if (c <= 0) {
            if (evaluate_offload(g, &ms, e))
                return e->code;
            if (ms <= cap && (c < 0 || faster(ms, best_ms))) {
                found = 1;
                best_ms = ms;
                memcpy(best_key, key, sizeof key);
                memcpy(best, g->pick, (size_t)g->S * sizeof *best);
            }
        }
        int s = 0;
        while (s < g->S && ++g->pick[s] == g->count[s])
            g->pick[s++] = 0;
        if (s == g->S)
            return found ? ERR_OK : ERR_NOFIT;
    }
}

/* Each stage's candidates for offload_simplest, from the device place (the plan's stages
 * may hold the host's); *enumerable 0 where there are too many. */
static int simplest_candidates(struct plan *p, struct global *g, const struct plan_options *o,
                               int *enumerable, struct err *e)
{
    double product = 1;
    int rc = ERR_OK;
    struct {
        enum cost_place optimizer;
        int from;
    } *had = malloc((size_t)g->S * sizeof *had);
    if (had == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int s = 0; s < g->S; s++) {
        had[s].optimizer = p->stages[s].optimizer;
        had[s].from = p->stages[s].optimizer_from;
        p->stages[s].optimizer = COST_PLACE_DEVICE;
        p->stages[s].optimizer_from = 0;
    }
    *enumerable = 1;
    for (int s = 0; s < g->S && rc == ERR_OK && *enumerable; s++) {
        rc = offload_stage_candidates(p, s, o, 1, &g->cand[s], &g->count[s], enumerable, e);
        *enumerable = *enumerable && (product *= g->count[s]) <= OFFLOAD_EXHAUSTIVE_MAX;
    }
    for (int s = 0; s < g->S; s++) {
        p->stages[s].optimizer = had[s].optimizer;
        p->stages[s].optimizer_from = had[s].from;
    }
    free(had);
    return *enumerable ? rc : ERR_OK;
}

static int simplest(struct plan *p, struct global *g, const struct plan_options *o, double cap,
                    int *done, struct err *e)
{
    int enumerable = 0;
    if (simplest_candidates(p, g, o, &enumerable, e) || !enumerable)
        return e->code;
    int *best = malloc((size_t)g->S * sizeof *best);
    if (best == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int rc = simplest_all(p, g, o, cap, best, e);
    for (int s = 0; s < g->S && rc == ERR_OK; s++)
        apply(&p->stages[s], &g->cand[s][best[s]]);
    *done = rc == ERR_OK;
    free(best);
    return rc == ERR_NOFIT ? ERR_OK : rc;
}

int offload_simplest(struct plan *p, const struct plan_options *o, double cap, int *done,
                     struct err *e)
{
    struct global g;
    *done = 0;
    int rc = global_init(&g, p, 0, e);
    if (rc == ERR_OK)
        rc = simplest(p, &g, o, cap, done, e);
    global_free(&g);
    return rc;
}
