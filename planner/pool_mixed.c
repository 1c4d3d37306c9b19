#include "pool_mixed.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jsonio.h"
#include "pool_bound.h"

/* One group of a kind: dp replicas of a pipeline of `stages` stages of tp GPUs. */
struct mix_option {
    int tp, stages, dp;
    double work_ms; /* W: fwd + bwd of every layer, one micro-batch, on a stage of tp GPUs */
    double rate;    /* dp S / W: at most the micro-batches a ms the group's stages finish */
    int *done;      /* per M (0 to B): 1 + its pipeline's index in mix_state.done, 0: not yet
                       planned, -1: no split of it could beat the best (owned; allocated when
                       first planned) */
    double least_ms; /* option_bound at one micro-batch (NAN: not yet), which no M is under */
    /* the most micro-batches a replica could take with option_bound under most_for (the
     * best when it was found; below, it only falls) */
    int64_t most_M;
    double most_for;
};

/* A group pipeline planned once (an option at one M), and its plan when one fits. */
struct mix_planned {
    int fits;
    struct plan plan;
    double alone_ms; /* its step alone (replicas_result.pipeline_ms), which replicas_step of
                        any grouping holding it is no less than */
    double *last;    /* when each stage's last backward ends alone (replicas_alone): the
                        groupings holding it are scored without simulating it again */
};

struct mix_state {
    const char *file;
    const cJSON *root;
    struct plan_options o;
    struct pool_info info;
    int64_t B; /* micro-batches a step, all replicas together */
    enum schedule schedule;
    struct mix_option *opt[POOL_KINDS_MAX];
    int n_opt[POOL_KINDS_MAX];
    double max_rate[POOL_KINDS_MAX];
    /* per kind: the most micro-batches a group of it could take under cap_for (kind_cap) */
    int64_t max_cap[POOL_KINDS_MAX];
    double cap_for[POOL_KINDS_MAX];
    /* the grouping searched: its groups' kinds and options, and their micro-batches */
    int n_groups, kind_of[POOL_KINDS_MAX], M[POOL_KINDS_MAX];
    struct mix_option *group[POOL_KINDS_MAX];
    struct mix_planned *done;
    int n_done, cap_done;
    double best_ms;
    int have_best, best_at[POOL_KINDS_MAX]; /* the best's plans: indices into done */
    double deadline_s;                      /* monotonic clock; 0: no limit */
    /* per kind, tp and dp (kind_costs): a stage's costs without the all-reduce, and whether
     * they were asked for (0: not yet, 1: known, -1: the stage does not parse) */
    struct pool_costs *costs[POOL_KINDS_MAX];
    signed char *costs_state[POOL_KINDS_MAX];
    struct pool_mixed_result *r;
};

/* Bounds are scaled down a little so that rounding never lifts one over a simulated step. */
#define MIX_ROUNDING (1 - 1e-9)

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* W of kind k at tp: its stage's layers' fwd + bwd (ERR_INPUT: the stage does not parse). */
static int kind_work(struct mix_state *st, int k, int tp, double *work_ms, struct err *e)
{
    struct cluster c;
    if (pool_kind_cluster(st->file, st->root, k, tp, 1, 1, 1, &c, e))
        return e->code;
    const struct profile *p = cluster_stage_profile(&c, 0);
    st->schedule = c.schedule;
    *work_ms = 0;
    for (int l = 0; l < p->n_layers; l++)
        *work_ms += p->layers[l].fwd_ms + p->layers[l].bwd_ms;
    cluster_free(&c);
    return ERR_OK;
}

/* Faster groups first (a good best early); ties in the order tp, stages, dp. */
static int by_rate(const void *pa, const void *pb)
{
    const struct mix_option *a = pa, *b = pb;
    if (a->rate != b->rate)
        return a->rate < b->rate ? 1 : -1;
    if (a->tp != b->tp)
        return a->tp - b->tp;
    return a->stages != b->stages ? a->stages - b->stages : a->dp - b->dp;
}

/* Every group kind k can form: tp dividing the heads (and its stage parsing), at most
 * per_node; stages at most the model's layers; dp S tp at most the count. */
static int kind_options(struct mix_state *st, int k, struct err *e)
{
    int L = model_layer_count(&st->info.model), n = 0, cap = 0;
    for (int tp = 1; tp <= st->info.per_node[k]; tp++) {
        struct err skip;
        double W = 0;
        err_clear(&skip);
        if (cluster_check_tp(&st->info.model, tp, "", &skip) || kind_work(st, k, tp, &W, &skip))
            continue;
        for (int S = 1; S <= L && (int64_t)S * tp <= st->info.count[k]; S++)
            for (int dp = 1; (int64_t)dp * S * tp <= st->info.count[k]; dp++) {
                if (n == cap) {
                    cap = cap ? 2 * cap : 64;
                    struct mix_option *grown = realloc(st->opt[k], (size_t)cap * sizeof *grown);
                    if (grown == NULL)
                        return err_set(e, ERR_FAIL, "out of memory");
                    st->opt[k] = grown;
                }
                st->opt[k][n++] = (struct mix_option){tp, S, dp, W, dp * S / W, NULL, NAN,
                                                        st->B / dp, INFINITY};
            }
    }
    st->n_opt[k] = n;
    if (n > 0)
        qsort(st->opt[k], (size_t)n, sizeof *st->opt[k], by_rate);
    st->max_rate[k] = n > 0 ? st->opt[k][0].rate : 0;
    return ERR_OK;
}

/* A lower bound on the step of group g's pipeline with M micro-batches: its busiest stage
 * computes M T_b >= M W / S (the stages' T sum to at least W), and the fill and drain bound of
 * pool.c's candidate_bound, W / (1 - (1 - 1/M)^S) (one kind: the least layer times are its
 * own). The reduction and the other groups only add to the step (replicas.h). */
static double group_bound(const struct mix_option *g, int64_t M)
{
    double W = g->work_ms, steady = (double)M * W / g->stages;
    double filled = W / (1 - pow(1 - 1.0 / (double)M, g->stages));
    return fmax(steady, filled) * MIX_ROUNDING;
}

/* Kind k's stage of tp and dp alone, without the all-reduce (NULL: it does not parse, or no
 * memory: no bound), computed once. */
static const struct pool_costs *kind_costs(struct mix_state *st, int k, int tp, int dp)
{
    int64_t n = st->info.count[k] + 1, at = tp * n + dp;
    if (st->costs[k] == NULL) {
        st->costs[k] = calloc((size_t)((st->info.per_node[k] + 1) * n), sizeof *st->costs[k]);
        st->costs_state[k] = calloc((size_t)((st->info.per_node[k] + 1) * n), 1);
        if (st->costs[k] == NULL || st->costs_state[k] == NULL)
            return NULL;
    }
    if (st->costs_state[k][at] == 0) {
        struct cluster c;
        struct err skip;
        err_clear(&skip);
        st->costs_state[k][at] = -1;
        if (pool_costs_alloc(&st->costs[k][at], model_layer_count(&st->info.model)))
            return NULL;
        if (pool_kind_cluster(st->file, st->root, k, tp, 1, dp, 1, &c, &skip) == ERR_OK) {
            pool_costs_fill(&c, dp, !(st->o.actions & PLAN_ACTION_OPTIMIZER), 0,
                            &st->costs[k][at]);
            st->costs_state[k][at] = 1;
            cluster_free(&c);
        }
    }
    return st->costs_state[k][at] == 1 ? &st->costs[k][at] : NULL;
}

/* Group opt of kind k with M micro-batches as pool_bound.h sees it (0: no costs). */
static int group_shape(struct mix_state *st, int k, const struct mix_option *opt, int64_t M,
                       struct pool_shape *s)
{
    const struct pool_costs *c = kind_costs(st, k, opt->tp, opt->dp);
    if (c == NULL)
        return 0;
    *s = (struct pool_shape){.used = 1, .L = model_layer_count(&st->info.model),
                             .M = (double)M, .schedule = st->schedule,
                             .recompute_only = st->o.actions == PLAN_ACTION_RECOMPUTE};
    s->costs[0] = c;
    s->stages[0] = opt->stages;
    return 1;
}

/* A lower bound on any grouping holding group opt of kind k at M micro-batches: group_bound,
 * and pool_bound of the group's pipeline without its all-reduce (INFINITY: its GPUs cannot
 * hold the model's state). Both hold for the pipeline's step alone, which replicas_step
 * simulates as is (dp 1: no reduction, the optimizer step after the last backward) and only
 * adds to; the memory is the group's own at its dp, as it is planned. Both grow with M (the
 * fill and drain term's denominator shrinks), so at M = 1 they bound every M. */
static double option_bound(struct mix_state *st, int k, const struct mix_option *opt,
                           int64_t M)
{
    struct pool_shape s;
    struct pool_summary sum;
    double weak = group_bound(opt, M);
    if (!group_shape(st, k, opt, M, &s))
        return weak;
    pool_summarize(&s, &sum);
    if (!(st->o.actions & PLAN_ACTION_OPTIMIZER) && pool_cannot_fit(&s, &sum))
        return INFINITY;
    return fmax(weak, pool_bound(&s, &sum));
}

static double option_least(struct mix_state *st, int k, struct mix_option *opt)
{
    if (isnan(opt->least_ms))
        opt->least_ms = option_bound(st, k, opt, 1);
    return opt->least_ms;
}

/* The most micro-batches a replica of opt could take in a grouping under the best: the
 * largest M with option_bound(M) under it (option_bound grows with M). */
static int64_t option_most(struct mix_state *st, int k, struct mix_option *opt)
{
    if (opt->most_for == st->best_ms)
        return opt->most_M;
    int64_t lo = 0, hi = opt->most_M; /* bound(lo) < best (lo 0: none), bound(hi + 1) >= */
    if (option_least(st, k, opt) >= st->best_ms)
        hi = 0;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (option_bound(st, k, opt, mid) < st->best_ms)
            lo = mid;
        else
            hi = mid - 1;
    }
    opt->most_for = st->best_ms;
    return opt->most_M = lo;
}

/* The most micro-batches any group of kind k could take under the best. */
static int64_t kind_cap(struct mix_state *st, int k)
{
    if (st->cap_for[k] != st->best_ms) {
        st->max_cap[k] = 0;
        for (int i = 0; i < st->n_opt[k]; i++) {
            int64_t cap = st->opt[k][i].dp * option_most(st, k, &st->opt[k][i]);
            st->max_cap[k] = cap > st->max_cap[k] ? cap : st->max_cap[k];
        }
        st->cap_for[k] = st->best_ms;
    }
    return st->max_cap[k];
}

/* Whether some order and split of group g's pipeline at its M could step under the best
 * (pool_could_step; with the optimizer on the host the device's state is not the stage's). */
static int group_could_beat(struct mix_state *st, int g)
{
    struct pool_shape s;
    if (isinf(st->best_ms) || (st->o.actions & PLAN_ACTION_OPTIMIZER) ||
        !group_shape(st, st->kind_of[g], st->group[g], st->M[g], &s))
        return 1;
    return pool_could_step(&s, st->best_ms);
}

/* An error, or the time limit past (then the best found stands). */
static int stopped(const struct mix_state *st, const struct err *e)
{
    if (!st->r->timed_out && st->deadline_s > 0 && now_s() > st->deadline_s)
        st->r->timed_out = 1;
    return e->code != ERR_OK || st->r->timed_out;
}

/* Group cluster c's --repartition options: a share of the time left, as pool.c gives a
 * candidate, and a cutoff no plan of c under which replicas_step could beat the best. The
 * pipeline alone (replicas_step's start) and as c simulates it differ by each stage's
 * all-reduce over its dp replicas, run after its last backward and before its optimizer step
 * (sim.c), no more than the whole model's on c's link; so a plan stepping in x as c simulates
 * it steps alone in at least x less that. With offload or the optimizer on the host, the
 * host's lanes make no such sum: no cutoff (as pool.c). */
static double cutoff_slack(const struct plan_options *o, const struct cluster *c)
{
    if (o->actions != PLAN_ACTION_RECOMPUTE)
        return INFINITY;
    return cluster_allreduce_ms(c, 0, 0, model_layer_count(&c->model) - 1);
}

static struct plan_options group_options(const struct mix_state *st, const struct cluster *c)
{
    struct plan_options o = st->o;
    if (st->deadline_s > 0)
        o.time_limit_s = fmax((st->deadline_s - now_s()) / 4, 1e-3);
    double slack = cutoff_slack(&o, c);
    if (isfinite(slack) && isfinite(st->best_ms))
        o.cutoff_ms = (st->best_ms + slack) * (1 + 1e-9);
    return o;
}

/* The index in done of group g's pipeline at its M, planned the first time it is asked for
 * (-1: the time limit is past). */
static int group_plan(struct mix_state *st, int g, struct err *e)
{
    struct mix_option *opt = st->group[g];
    int k = st->kind_of[g];
    if (opt->done == NULL && (opt->done = calloc((size_t)st->B + 1, sizeof *opt->done)) == NULL)
        return err_set(e, ERR_FAIL, "out of memory"), -1;
    if (opt->done[st->M[g]] != 0)
        return opt->done[st->M[g]] - 1; /* -2: refuted */
    if (stopped(st, e))
        return -1;
    if (!group_could_beat(st, g)) { /* the best only falls: refuted for good */
        st->r->refuted++;
        opt->done[st->M[g]] = -1;
        return -2;
    }
    if (st->n_done == st->cap_done) {
        int cap = st->cap_done ? 2 * st->cap_done : 64;
        struct mix_planned *grown = realloc(st->done, (size_t)cap * sizeof *grown);
        if (grown == NULL)
            return err_set(e, ERR_FAIL, "out of memory"), -1;
        st->done = grown;
        st->cap_done = cap;
    }
    struct mix_planned *d = &st->done[st->n_done];
    *d = (struct mix_planned){0};
    struct cluster c;
    if (pool_kind_cluster(st->file, st->root, k, opt->tp, opt->stages, opt->dp, st->M[g], &c, e))
        return -1;
    struct plan_options o = group_options(st, &c);
    int rc = planner_make(&c, &o, &d->plan, e);
    cluster_free(&c);
    st->r->planned++;
    if (rc != ERR_OK && rc != ERR_NOFIT)
        return -1;
    err_clear(e);
    d->fits = rc == ERR_OK;
    if (d->fits && (d->last = malloc((size_t)d->plan.n_stages * sizeof *d->last)) == NULL)
        err_set(e, ERR_FAIL, "out of memory");
    if (d->fits && (e->code || replicas_alone(&d->plan, d->last, &d->alone_ms, e)))
        return free(d->last), plan_free(&d->plan), -1;
    opt->done[st->M[g]] = st->n_done + 1;
    return st->n_done++;
}

/* Scores the grouping at its current M: keeps it when it steps faster than the best. */
static int score_split(struct mix_state *st, struct err *e)
{
    struct plan plans[POOL_KINDS_MAX];
    int at[POOL_KINDS_MAX];
    for (int g = 0; g < st->n_groups; g++) {
        if ((at[g] = group_plan(st, g, e)) == -1)
            return e->code;
        if (at[g] == -2 || !st->done[at[g]].fits || st->done[at[g]].alone_ms >= st->best_ms)
            return ERR_OK; /* no plan, or the slowest pipeline alone cannot beat the best */
    }
    double *last[POOL_KINDS_MAX], alone[POOL_KINDS_MAX];
    for (int g = 0; g < st->n_groups; g++) {
        plans[g] = st->done[at[g]].plan;
        last[g] = st->done[at[g]].last;
        alone[g] = st->done[at[g]].alone_ms;
    }
    struct replicas_result step;
    if (replicas_step_given(plans, st->n_groups, last, alone, &step, e))
        return e->code;
    st->r->splits++;
    if (step.step_ms < st->best_ms) {
        st->best_ms = step.step_ms;
        st->have_best = 1;
        st->r->n_groups = st->n_groups;
        for (int g = 0; g < st->n_groups; g++) {
            st->best_at[g] = at[g];
            st->r->group[g] = (struct pool_mixed_group){st->kind_of[g], st->group[g]->tp,
                                                        st->group[g]->stages, st->group[g]->dp,
                                                        st->M[g]};
        }
    }
    replicas_result_free(&step);
    return ERR_OK;
}

/* Every split of R micro-batches over groups g and after (each replica at least one). From
 * the balanced M_g (M proportional to the group's rate) outwards: above it group g's own
 * bound only grows, below it the later groups' share R' = R - dp_g M_g only grows, and they
 * need at least R' / (their rates summed) (max_j M_j W_j / S_j >= sum_j dp_j M_j / sum_j
 * dp_j S_j / W_j), so each direction stops where its bound reaches the best. */
static int split(struct mix_state *st, int g, int64_t R, struct err *e)
{
    const struct mix_option *opt = st->group[g];
    int k = st->kind_of[g];
    if (g == st->n_groups - 1) {
        if (R % opt->dp != 0 || option_bound(st, k, opt, R / opt->dp) >= st->best_ms)
            return ERR_OK;
        st->M[g] = (int)(R / opt->dp);
        return score_split(st, e);
    }
    int64_t rest_dp = 0, rest_cap = 0;
    double rest_rate = 0;
    for (int j = g + 1; j < st->n_groups; j++) {
        rest_dp += st->group[j]->dp, rest_rate += st->group[j]->rate;
        rest_cap += st->group[j]->dp * option_most(st, st->kind_of[j], st->group[j]);
    }
    int64_t most = (R - rest_dp) / opt->dp;
    if (most < 1)
        return ERR_OK;
    double balanced = (double)R / (rest_rate + opt->rate) * opt->stages / opt->work_ms;
    int64_t mid = llround(fmin(fmax(balanced, 1), (double)most));
    for (int64_t M = mid; M <= most && !stopped(st, e); M++) {
        if (option_bound(st, k, opt, M) >= st->best_ms)
            break;
        if ((double)(R - opt->dp * M) / rest_rate * MIX_ROUNDING >= st->best_ms ||
            R - opt->dp * M > rest_cap)
            continue;
        st->M[g] = (int)M;
        if (split(st, g + 1, R - opt->dp * M, e))
            return e->code;
    }
    for (int64_t M = mid - 1; M >= 1 && !stopped(st, e); M--) {
        if ((double)(R - opt->dp * M) / rest_rate * MIX_ROUNDING >= st->best_ms ||
            R - opt->dp * M > rest_cap) /* a later group past its option_most */
            break;
        if (option_bound(st, k, opt, M) >= st->best_ms)
            continue;
        st->M[g] = (int)M;
        if (split(st, g + 1, R - opt->dp * M, e))
            return e->code;
    }
    return e->code;
}

/* Every grouping of kinds k and after, given the groups chosen before (their rates summed,
 * their largest least_ms, their replicas). A grouping steps at least max_g least_ms (every
 * group computes one micro-batch at least: option_bound) and at least B / sum_g rate_g
 * (split's argument over all groups); the kinds still to choose add at most their max_rate
 * each, so what is below cannot beat the best once that bound reaches it; a group whose own
 * least_ms cannot is passed over. */
static int choose(struct mix_state *st, int k, double rate, double most, int64_t replicas,
                  int64_t cap, struct err *e)
{
    double reach = rate;
    int64_t room = cap;
    for (int j = k; j < st->info.n_kinds; j++)
        reach += st->max_rate[j], room += kind_cap(st, j);
    if (stopped(st, e) || replicas > st->B || room < st->B ||
        fmax((double)st->B / reach * MIX_ROUNDING, most) >= st->best_ms)
        return e->code;
    if (k == st->info.n_kinds || k == POOL_KINDS_MAX) {
        if (st->n_groups < 2)
            return ERR_OK; /* one kind alone: a homogeneous candidate */
        st->r->groupings++;
        return split(st, 0, st->B, e);
    }
    for (int i = 0; i < st->n_opt[k] && !stopped(st, e); i++) {
        struct mix_option *opt = &st->opt[k][i];
        double least = option_least(st, k, opt);
        if (least >= st->best_ms)
            continue;
        int64_t takes = opt->dp * option_most(st, k, opt);
        st->kind_of[st->n_groups] = k;
        st->group[st->n_groups++] = opt;
        int rc = choose(st, k + 1, rate + opt->rate, fmax(most, least), replicas + opt->dp,
                        cap + takes, e);
        st->n_groups--;
        if (rc)
            return rc;
    }
    return choose(st, k + 1, rate, most, replicas, cap, e); /* kind k unused */
}

/* Hands the best's plans over (*plans owned) and frees every other. */
static int take_best(struct mix_state *st, struct plan **plans, int *n, struct err *e)
{
    *plans = NULL;
    *n = 0;
    if (st->have_best && (*plans = calloc((size_t)st->r->n_groups, sizeof **plans)) == NULL)
        err_set(e, ERR_FAIL, "out of memory");
    for (int i = 0; i < st->n_done; i++) {
        free(st->done[i].last);
        int g = 0;
        while (*plans != NULL && g < st->r->n_groups && st->best_at[g] != i)
            g++;
        if (*plans != NULL && g < st->r->n_groups)
            (*plans)[g] = st->done[i].plan;
        else if (st->done[i].fits)
            plan_free(&st->done[i].plan);
    }
    if (*plans != NULL)
        *n = st->r->n_groups;
    free(st->done);
    return e->code;
}

static int mix_setup(struct mix_state *st, struct err *e)
{
    if (pool_info_read(st->file, st->root, &st->info, e))
        return e->code;
    for (int k = 0; k < st->info.n_kinds; k++)
        snprintf(st->r->device[k], sizeof st->r->device[k], "%s", st->info.device[k]);
    /* one kind has no groups to mix; a fixed "dp" asks for that many identical replicas; a
     * batch of partial micro-batches cannot be dealt out */
    if (st->info.n_kinds < 2 || st->info.only_dp != 0 ||
        st->info.global_batch % st->info.model.micro_batch != 0)
        return ERR_OK;
    st->B = st->info.global_batch / st->info.model.micro_batch;
    for (int k = 0; k < st->info.n_kinds; k++)
        if (kind_options(st, k, e))
            return e->code;
    return ERR_OK;
}

static void mix_free(struct mix_state *st)
{
    for (int k = 0; k < POOL_KINDS_MAX; k++) {
        for (int i = 0; i < st->n_opt[k]; i++)
            free(st->opt[k][i].done);
        free(st->opt[k]);
        int64_t n = st->costs[k] != NULL ? (st->info.per_node[k] + 1) * (st->info.count[k] + 1)
                                         : 0;
        for (int64_t i = 0; i < n; i++)
            pool_costs_free(&st->costs[k][i]);
        free(st->costs[k]);
        free(st->costs_state[k]);
    }
}

int pool_mixed_group_bound(const char *file, const struct plan_options *o,
                           const struct pool_mixed_group *g, double x,
                           struct pool_mixed_bound *out, struct err *e)
{
    struct pool_mixed_result r;
    struct mix_state st = {.file = file, .o = *o, .best_ms = x, .r = &r};
    struct mix_option opt = {g->tp, g->stages, g->dp, 0, 0, NULL, NAN, 0, INFINITY};
    struct cluster c;
    memset(&r, 0, sizeof r);
    cJSON *root = jsonio_read_kind(file, JSONIO_CLUSTER, e);
    if ((st.root = root) == NULL)
        return e->code;
    if (pool_info_read(file, st.root, &st.info, e) == ERR_OK &&
        kind_work(&st, g->kind, g->tp, &opt.work_ms, e) == ERR_OK &&
        pool_kind_cluster(file, st.root, g->kind, g->tp, g->stages, g->dp, g->micro_batches, &c,
                          e) == ERR_OK) {
        st.n_groups = 1;
        st.kind_of[0] = g->kind;
        st.group[0] = &opt;
        st.M[0] = g->micro_batches;
        out->least_ms = option_bound(&st, g->kind, &opt, g->micro_batches);
        out->could_step = group_could_beat(&st, 0);
        out->cutoff_slack_ms = cutoff_slack(o, &c);
        cluster_free(&c);
    }
    mix_free(&st);
    cJSON_Delete(root);
    return e->code;
}

int pool_mixed_search(const cJSON *root, const char *file, const struct plan_options *o,
                      double beat_ms,
                      struct plan **plans, int *n, struct replicas_result *step,
                      struct pool_mixed_result *r, struct err *e)
{
    memset(r, 0, sizeof *r);
    memset(step, 0, sizeof *step);
    struct mix_state st = {.file = file, .o = *o, .best_ms = beat_ms, .r = r};
    st.o.repartition = 1;
    if (o->time_limit_s > 0)
        st.deadline_s = now_s() + o->time_limit_s;
    st.root = root;
    int rc = mix_setup(&st, e);
    if (rc == ERR_OK && st.B > 0)
        rc = choose(&st, 0, 0, 0, 0, 0, e);
    if (take_best(&st, plans, n, e) == ERR_OK && rc == ERR_OK && *n > 0)
        rc = replicas_step(*plans, *n, step, e);
    mix_free(&st);
    if (e->code != ERR_OK) {
        for (int g = 0; g < *n; g++)
            plan_free(&(*plans)[g]);
        free(*plans);
        *plans = NULL;
        *n = 0;
    }
    return e->code;
}

void pool_mixed_print(FILE *f, const struct pool_mixed_result *r, double homogeneous_ms)
{
    if (r->n_groups == 0)
        fprintf(f, "pool: no heterogeneous grouping steps faster");
    else if (isfinite(homogeneous_ms))
        fprintf(f, "pool: heterogeneous pipelines, faster than the best homogeneous candidate "
                   "(%.3f ms)", homogeneous_ms);
    else
        fprintf(f, "pool: heterogeneous pipelines (no homogeneous candidate fits)");
    fprintf(f, "; %ld groupings searched, %ld pipelines planned (%ld more left as no split "
               "of theirs could beat the best), %ld splits scored%s\n",
            r->groupings, r->planned, r->refuted, r->splits,
            r->timed_out ? " (stopped at --time-limit: the best found by then)" : "");
    for (int g = 0; g < r->n_groups; g++)
        fprintf(f, "  pipelines[%d]: %s, dp %d x %d stages of tp %d, %d micro-batches a "
                   "replica\n",
                g, r->device[r->group[g].kind], r->group[g].dp, r->group[g].stages,
                r->group[g].tp, r->group[g].micro_batches);
}

int pool_answer_search(const cJSON *root, const char *file, const struct plan_options *o,
                       struct pool_answer *a, struct err *e)
{
    memset(a, 0, sizeof *a);
    double start = now_s();
    int rc = pool_search_parsed(root, file, o, POOL_KEEP, &a->plan, &a->homogeneous, e);
    if (rc != ERR_OK && rc != ERR_NOFIT)
        return rc;
    a->have_plan = rc == ERR_OK;
    struct err homogeneous = *e;
    err_clear(e);
    /* --time-limit holds for both searches: the mixed one gets what the other left */
    struct plan_options left = *o;
    if (o->time_limit_s > 0)
        left.time_limit_s = fmax(o->time_limit_s - (now_s() - start), 1e-3);
    rc = pool_mixed_search(root, file, &left, a->have_plan ? a->plan.iteration_ms : INFINITY,
                           &a->plans, &a->n, &a->step, &a->mix, e);
    a->mixed = rc == ERR_OK && a->n > 0;
    if (rc == ERR_OK && !a->mixed && !a->have_plan) {
        *e = homogeneous;
        rc = err_set(e, ERR_NOFIT, "%s; nor does any heterogeneous grouping (%ld searched%s)",
                     homogeneous.msg, a->mix.groupings,
                     a->mix.timed_out ? ", stopped at --time-limit" : "");
    }
    if (rc != ERR_OK)
        pool_answer_free(a);
    return rc;
}

void pool_answer_free(struct pool_answer *a)
{
    if (a->have_plan)
        plan_free(&a->plan);
    for (int g = 0; g < a->n; g++)
        plan_free(&a->plans[g]);
    free(a->plans);
    replicas_result_free(&a->step);
    memset(a, 0, sizeof *a);
}
