/* The per-stage recomputation problem of knapsack.h as a MILP solved by GLPK, to cross-check
 * the DP (`ballast plan --verify`). Least recompute: a binary x_lc per choice c of layer l
 * (keep and full, and the layer's options when the problem has them), sum_c x_lc = 1 and
 * tau >= sum_c t_lc x_lc per layer, sum_lc w_lc x_lc + tau <= cap; the objective is
 * sum_lc ms_lc x_lc. Balancing (whole layers): r_l in {0,1} (1 = recompute l) and tau >= 0,
 * sum_l w_l (1 - r_l) + tau <= cap and tau >= t_l r_l. Alike layers (a model's blocks) are
 * kept in one order of their choices, so that GLPK does not search their permutations. */
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

/* GLPK's branch and cut on a loaded problem (a glp_prob *): *objective on a proven optimum;
 * ERR_NOFIT when infeasible, ERR_FAIL past MILP_TIME_LIMIT_MS. */
struct glp_prob;
int milp_intopt(struct glp_prob *lp, double *objective, struct err *e);

/* A constraint matrix gathered as GLPK's 1-based triplets (ia, ja, ar; element 0 unused), the
 * one way every MILP here fills its rows: milp_matrix_put grows the arrays as needed, and a
 * failed growth is reported once, by milp_matrix_load. Start from {0}. */
struct milp_matrix {
    int *ia, *ja;
    double *ar;
    int n, cap, failed;
};
/* a_(row, col) = value (rows and columns 1-based, as GLPK numbers them). */
void milp_matrix_put(struct milp_matrix *m, int row, int col, double value);
/* Loads the matrix into lp (glp_load_matrix); ERR_FAIL if a put ran out of memory. */
int milp_matrix_load(const struct milp_matrix *m, struct glp_prob *lp, struct err *e);
void milp_matrix_free(struct milp_matrix *m);

#endif
