/* The per-stage recomputation problem of knapsack.h as a MILP solved by GLPK, to cross-check
 * the DP (`ballast plan --verify`). Whole layers: r_l in {0,1} (1 = recompute l) and the
 * transient tau >= 0; constraints sum_l w_l (1 - r_l) + tau <= cap and tau >= t_l r_l.
 * With options (a problem with multiple choices), layers whose choices cost the same form a
 * group g of m_g layers: n_gc in {0..m_g} of them take choice c (sum_c n_gc = m_g) and z_gc
 * in {0,1} says whether any does (n_gc <= m_g z_gc); sum_gc w_gc n_gc + tau <= cap and
 * tau >= t_gc z_gc; the objective is sum_gc ms_gc n_gc. A group of one layer is one binary per
 * choice with a sum-to-one row. */
#ifndef BALLAST_MILP_H
#define BALLAST_MILP_H

#include "knapsack.h"

/* Branch and bound can take exponential time (balancing is a subset-sum problem, and the LP
 * bound of |sum - target| is 0 until nearly every layer is fixed): a stage GLPK has not solved
 * within this time is reported as not verified (ERR_FAIL) rather than waited for. */
#define MILP_TIME_LIMIT_MS 10000

/* Least recompute time (sum fwd_l r_l, or with options sum ms_lc x_lc). ERR_NOFIT if
 * infeasible, ERR_FAIL past MILP_TIME_LIMIT_MS. */
int milp_min_recompute(const struct knap_problem *p, double *objective_ms, struct err *e);
/* Least |sum q_l r_l - target_units| with q_l the time units of knap_time_units; whole layers
 * only, like knap_balance. */
int milp_balance(const struct knap_problem *p, int64_t target_units, double time_unit_ms,
                 double *objective_units, struct err *e);

#endif
