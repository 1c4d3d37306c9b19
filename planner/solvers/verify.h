/* `ballast plan --verify`: a pass after the method that solves each stage's problem again as
 * a MILP with GLPK (milp.h) and records both objectives in plan->verify. */
#ifndef BALLAST_VERIFY_H
#define BALLAST_VERIFY_H

#include "planner.h"

/* For a knapsack method's plan (every stage fits): patent's most loaded stage and every
 * optimal stage is a least-recompute problem, checked against the recompute time the DP's
 * choice takes; patent's other stages are balancing problems, checked against the distance
 * of the DP's choice from the target. Summed over the stages, most loaded first; a stage
 * whose objectives differ is named on stderr and clears plan->verify.agree. ERR_FAIL when
 * GLPK finds no choice where the DP found one, or finds no proven optimum in time. */
int verify_plan(struct plan *p, const struct plan_options *o, struct err *e);

#endif
