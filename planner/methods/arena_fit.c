/* Choosing recomputation against a laid-out arena (arena_fit.h).
 *
 * Why the exhaustive walk is exact. For a recompute combination c let L(c) be its lower bound
 * (the most bytes of its objects live at one tick) and A(c) the bytes of its arena as the
 * method lays it out (deterministic: seeded ga, exact with its time limit). The objects live at
 * the busiest tick occupy disjoint bytes of any layout, so A(c) >= L(c); the slots carving
 * S(c) is what the knapsack counts, and the layouts are meant to land in [L(c), S(c)], so the
 * knapsack's own answer is where the walk usually stops. The walk visits every combination in
 * increasing recompute time (ties: the knapsack's memory units, then the combination's index):
 * a combination with state + L(c) + reserve > limit is refuted without a layout (no layout of
 * it can fit); any other is laid out and accepted when state + A(c) + reserve <= limit. When
 * the walk accepts c*, every combination before it was refuted by its lower bound or laid out
 * over the limit by the very method the plan uses, so no combination with less recompute fits:
 * c* is the least recompute that fits, which is what optimal means with --arena. The walk is
 * bounded by ARENA_FIT_COMBOS_MAX combinations per stage (the stages of the shipped CPU
 * clusters have at most a few hundred).
 *
 * Larger stages: the knapsack gives the least recompute for a memory budget on the slots
 * carving, and a combination's slots carving exceeds its arena by roughly S - L. So the
 * candidates are the knapsack's answers with the limit relaxed by that slack (measured on
 * keeping everything) in eighths, from the most relaxed down, then recomputing every layer;
 * the first whose laid-out arena fits is taken. Not proven: a combination the knapsack never
 * returns may fit with less recompute. */
#include "arena_fit.h"

#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "methods.h"

/* Bytes the arena may take on stage s: the limit less state and reserve. */
static int64_t arena_room(const struct plan *p, int s)
{
    struct stage_cost c;
    plan_stage_cost(p, &p->stages[s], &c);
    return p->stages[s].memory_limit_bytes - cost_memory_with_arena(&c, 0);
}

static int stage_lower_bound(const struct plan *p, int s, int64_t *lower, struct err *e)
{
    struct arena_object *o;
    int n;
    ERR_TRY(arena_stage_objects(p, s, &o, &n, e));
    *lower = arena_lower_bound(o, n);
    free(o);
    return ERR_OK;
}

/* Stage s's current choice laid out by opt: its bytes (the arena is not kept). */
static int stage_arena_bytes(const struct plan *p, int s, const struct arena_options *opt,
                             int64_t *bytes, int64_t *lower, struct err *e)
{
    struct arena_object *o;
    int n;
    struct arena a;
    struct arena_result r;
    ERR_TRY(arena_stage_objects(p, s, &o, &n, e));
    int rc = arena_layout(o, n, p->stages[s].in_flight, opt, &a, &r, e);
    *bytes = a.bytes;
    *lower = a.lower_bound_bytes;
    arena_free(&a);
    return rc;
}

/* ga and exact start from the greedy layout and keep it unless they find a better one; with
 * no cap their fitness is the arena's bytes, so they never return more than greedy does. When
 * the greedy layout fits, theirs does too, and the costly search is skipped: the fit decision
 * is the same as laying them out. */
static int greedy_bounds(const struct arena_options *opt)
{
    return opt->cap_bytes <= 0 && (strcmp(opt->method, "ga") == 0 ||
                                   strcmp(opt->method, "exact") == 0);
}

/* *fits: stage s's current choice laid out by opt fits in `room`. */
static int fits_in(const struct plan *p, int s, const struct arena_options *opt, int64_t room,
                   int *fits, struct err *e)
{
    int64_t bytes, lower;
    if (greedy_bounds(opt)) {
        struct arena_options greedy = *opt;
        snprintf(greedy.method, sizeof greedy.method, "greedy");
        ERR_TRY(stage_arena_bytes(p, s, &greedy, &bytes, &lower, e));
        if ((*fits = bytes <= room))
            return ERR_OK;
    }
    ERR_TRY(stage_arena_bytes(p, s, opt, &bytes, &lower, e));
    *fits = bytes <= room;
    return ERR_OK;
}

int arena_stage_fits(const struct plan *p, int s, const struct arena_options *opt, int *fits,
                     struct err *e)
{
    return fits_in(p, s, opt, arena_room(p, s), fits, e);
}

/* The walk's order: recompute time, then memory units, then index. */
struct combo {
    double ms;
    int64_t units;
    long index;
};

static int fit_by_recompute(const void *pa, const void *pb)
{
    const struct combo *a = pa, *b = pb;
    if (a->ms != b->ms)
        return a->ms < b->ms ? -1 : 1;
    if (a->units != b->units)
        return a->units < b->units ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

/* Combination `index` in mixed radix, layer 0 the fastest digit. */
static void fit_decode(const struct knap_problem *kp, long index, unsigned char *recompute)
{
    for (int l = 0; l < kp->n; l++) {
        long k = kp->first_choice[l + 1] - kp->first_choice[l];
        recompute[l] = (unsigned char)(index % k);
        index /= k;
    }
}

static long combo_count(const struct knap_problem *kp)
{
    long total = 1;
    for (int l = 0; l < kp->n && total <= ARENA_FIT_COMBOS_MAX; l++)
        total *= kp->first_choice[l + 1] - kp->first_choice[l];
    return total;
}

/* Tries stage s's current choice: 1 when its arena fits; refuted by the lower bound or laid
 * out, counted in f. *lower gets the lower bound. */
static int try_choice(const struct plan *p, int s, const struct arena_options *opt,
                      struct arena_fit_search *f, int64_t *lower, int *fits, struct err *e)
{
    int64_t room = arena_room(p, s);
    f->combos++;
    ERR_TRY(stage_lower_bound(p, s, lower, e));
    *fits = 0;
    if (*lower > room) {
        f->refuted++;
        return ERR_OK;
    }
    f->laid_out++;
    return fits_in(p, s, opt, room, fits, e);
}

/* Every combination in increasing recompute time; the first that fits. */
static int walk_all(struct plan *p, int s, const struct knap_problem *kp,
                    const struct arena_options *opt, struct arena_fit_search *f, struct err *e)
{
    long total = combo_count(kp);
    struct plan_stage *st = &p->stages[s];
    unsigned char *rec = malloc((size_t)plan_stage_layer_count(st));
    struct combo *c = malloc(sizeof *c * (size_t)total);
    if (c == NULL || rec == NULL) {
        free(c);
        free(rec);
        return err_set(e, ERR_FAIL, "out of memory ordering stage %d's %ld choices", s, total);
    }
    for (long i = 0; i < total; i++) {
        fit_decode(kp, i, rec);
        c[i] = (struct combo){knap_recompute_ms(kp, rec), knap_units(kp, rec), i};
    }
    qsort(c, (size_t)total, sizeof *c, fit_by_recompute);
    int rc = ERR_NOFIT, fits = 0;
    long least = 0;
    int64_t least_lower = INT64_MAX, lower;
    for (long i = 0; i < total && rc == ERR_NOFIT; i++) {
        fit_decode(kp, c[i].index, rec);
        plan_stage_set_choices(st, rec);
        if (try_choice(p, s, opt, f, &lower, &fits, e)) {
            rc = e->code;
            break;
        }
        rc = fits ? ERR_OK : ERR_NOFIT;
        if (lower < least_lower) {
            least_lower = lower;
            least = c[i].index;
        }
    }
    if (rc == ERR_NOFIT) {
        fit_decode(kp, least, rec);
        plan_stage_set_choices(st, rec);
    }
    f->proven = rc == ERR_OK;
    free(c);
    free(rec);
    return rc;
}

static void set_every_choice(struct plan_stage *st, int choice)
{
    for (int l = 0; l < plan_stage_layer_count(st); l++)
        st->actions[l].choice = (unsigned char)choice;
}

/* The knapsack's least recompute with stage s's limit raised by `relax` bytes. */
static int relaxed_choice(struct plan *p, int s, const struct plan_options *o, int64_t relax,
                          struct err *e)
{
    struct plan_stage *st = &p->stages[s];
    int64_t limit = st->memory_limit_bytes;
    struct knap_problem kp;
    st->memory_limit_bytes = limit + relax;
    int rc = method_problem(p, s, o, &kp, e);
    st->memory_limit_bytes = limit;
    if (rc)
        return rc;
    unsigned char *choice = malloc((size_t)plan_stage_layer_count(st));
    rc = choice == NULL ? err_set(e, ERR_FAIL, "out of memory")
                        : knap_min_recompute(&kp, choice, e);
    if (rc == ERR_OK)
        plan_stage_set_choices(st, choice);
    free(choice);
    knap_free(&kp);
    return rc;
}

/* Candidate k of stage s (see the top): the knapsack relaxed by k eighths of the slack, or
 * for k = -1 every layer recomputed; *fits. */
static int candidate(struct plan *p, int s, const struct plan_options *o, int64_t slack, int k,
                     struct arena_fit_search *f, int *fits, struct err *e)
{
    int64_t lower;
    *fits = 0;
    if (k < 0) {
        set_every_choice(&p->stages[s], COST_FULL);
    } else {
        int rc = relaxed_choice(p, s, o, slack / 8 * k, e);
        if (rc == ERR_NOFIT)
            return ERR_OK;
        ERR_TRY(rc);
    }
    return try_choice(p, s, o->arena, f, &lower, fits, e);
}

/* Too many combinations to walk: the most relaxed candidate that fits, found by bisection
 * over k = -1..8 (the candidates' memory falls as k does, so their fit is taken to be
 * monotone; about four layouts instead of ten, which matters for ga and exact). */
static int walk_candidates(struct plan *p, int s, const struct plan_options *o,
                           struct arena_fit_search *f, struct err *e)
{
    struct plan_stage *st = &p->stages[s];
    int64_t lower;
    struct stage_cost c;
    set_every_choice(st, COST_KEEP);
    plan_stage_cost(p, st, &c);
    ERR_TRY(stage_lower_bound(p, s, &lower, e));
    int64_t slack = cost_arena_bytes(&c) - lower;
    int good = -2, bad = 9, fits = 0; /* largest k known to fit, smallest known not to */
    ERR_TRY(candidate(p, s, o, slack, 8, f, &fits, e));
    if (fits)
        return ERR_OK;
    bad = 8;
    while (bad - good > 1) {
        int k = good + (bad - good) / 2;
        ERR_TRY(candidate(p, s, o, slack, k, f, &fits, e));
        *(fits ? &good : &bad) = k;
    }
    if (good < -1)
        return ERR_NOFIT;
    return candidate(p, s, o, slack, good, f, &fits, e);
}

int arena_least_recompute(struct plan *p, int s, const struct plan_options *o,
                          struct arena_fit_search *found, struct err *e)
{
    struct knap_problem kp;
    struct arena_fit_search f = {0};
    ERR_TRY(method_problem(p, s, o, &kp, e));
    int rc = combo_count(&kp) <= ARENA_FIT_COMBOS_MAX ? walk_all(p, s, &kp, o->arena, &f, e)
                                                      : walk_candidates(p, s, o, &f, e);
    knap_free(&kp);
    if (found != NULL)
        *found = f;
    return rc;
}

int arena_nofit_report(const struct plan *p, const struct arena_options *opt, struct err *e)
{
    struct err line;
    err_clear(&line);
    err_set(e, ERR_NOFIT, "no plan fits with its %s arena:", opt->method);
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        int64_t bytes, lower;
        struct stage_cost c;
        if (stage_arena_bytes(p, s, opt, &bytes, &lower, &line))
            return err_set(e, line.code, "%s", line.msg);
        plan_stage_cost(p, st, &c);
        int64_t total = cost_memory_with_arena(&c, bytes);
        if (total > st->memory_limit_bytes)
            err_append(e,
                       "  stage %d (%s, layers %d-%d): state %lld + %s arena %lld (lower bound "
                       "%lld) + reserve %lld = %lld bytes > memory_limit_bytes %lld",
                       s, st->device, st->first, st->last, (long long)c.state_bytes,
                       opt->method, (long long)bytes, (long long)lower,
                       (long long)c.reserve_bytes, (long long)total,
                       (long long)st->memory_limit_bytes);
    }
    return ERR_NOFIT;
}
