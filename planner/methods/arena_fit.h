/* The planner's fit against a laid-out activation arena (`ballast plan --arena METHOD`): a
 * stage fits when state + arena + reserve <= limit, the arena laid out by METHOD
 * (arena_plan.h) for the stage's recompute choice. Which methods choose against it:
 *   none, full, block:N   their fixed choice, checked against the arena
 *   uniform-min           the least N whose arenas all fit
 *   patent                chooses exactly as published (the slots carving's knapsack); only
 *                         the fit check after choosing uses the arena
 *   optimal               each stage's least recompute whose laid-out arena fits
 *                         (arena_least_recompute; proven where the stage's choices are few) */
#ifndef BALLAST_ARENA_FIT_H
#define BALLAST_ARENA_FIT_H

#include "arena_plan.h"
#include "planner.h"

/* Stages with at most this many recompute combinations are searched exhaustively (every
 * cheaper combination is refuted by its lower bound or its layout); larger ones by candidates
 * of the relaxed knapsack, not proven. */
#define ARENA_FIT_COMBOS_MAX 4096

/* What the search did for one stage. */
struct arena_fit_search {
    int proven;    /* every combination with less recompute was shown not to fit */
    long combos;   /* combinations (or candidates) considered */
    long refuted;  /* of them, refused by the lower bound alone */
    long laid_out; /* of them, laid out */
};

/* *fits: stage s with its current choice fits with its arena laid out by `opt`. */
int arena_stage_fits(const struct plan *p, int s, const struct arena_options *opt, int *fits,
                     struct err *e);
/* Stage s's least recompute (among the choices method_problem gives it) whose arena, laid out
 * by o->arena, fits; ties by the slots carving's memory units. ERR_NOFIT (no message) when
 * none does: the stage is then left at the combination with the least lower bound. */
int arena_least_recompute(struct plan *p, int s, const struct plan_options *o,
                          struct arena_fit_search *found, struct err *e);
/* ERR_NOFIT naming every stage over its limit with its arena: state, arena, lower bound,
 * reserve, limit. */
int arena_nofit_report(const struct plan *p, const struct arena_options *opt, struct err *e);

#endif
