/* `ballast plan --method optimal --repartition`: chooses each stage's contiguous layer range,
 * the order of the cluster's device kinds along the pipeline (the stages of one kind stay
 * together, in their cluster order) and each stage's recompute set, to minimise the simulated
 * iteration time subject to every stage's memory limit; ties by least memory.
 *
 * With the split and order fixed, each stage's least recompute is optimal (the simulated
 * makespan never decreases when a task gets longer), so the search is over orders and splits.
 * For stage s with time T_s = sum (fwd + bwd) + R_s per micro-batch and c_s the time to move
 * its output forward and its gradient back, every 1F1B or GPipe step takes at least
 *     LB(split) = max_s ( M * T_s + sum_{r<s} (T_r + c_r) )
 * (stage s runs M forwards and backwards; the first micro-batch reaches it, and its last
 * gradient leaves it, through the stages before it). G(k, i), the least LB over the ways to
 * put layers i.. on stages k.., follows from a DP; branch and bound over splits with the
 * bound max(partial, prefix + G) then finds the best simulated split, exactly when it
 * finishes within its node budget, and otherwise reports the certified gap to the least
 * bound of what it left unexplored. */
#ifndef BALLAST_REPARTITION_H
#define BALLAST_REPARTITION_H

#include "cluster.h"
#include "err.h"
#include "plan.h"
#include "planner.h"

/* Most device kinds whose orders are searched exhaustively (6! = 720 orders). */
#define REPARTITION_KINDS_MAX 6

struct repartition_stats {
    int orders;          /* device orders considered */
    long nodes;          /* branch-and-bound nodes expanded */
    long leaves;         /* splits simulated */
    int exhausted;       /* 1 if the search finished: the plan is optimal */
    double lower_bound;  /* certified lower bound on the iteration time (ms) */
};

/* The link after the last stage of device kind `kind` (kind_of[stage] numbers the kinds) when
 * an order moves the kind: the one it had, or, for the kind that ended the pipeline, the
 * cluster's default link, else the slowest link between kinds in the cluster. Links inside a
 * kind stay as they are. */
struct link repartition_exit_link(const struct cluster *c, const int *kind_of, int kind);

/* Fills `out` like planner_make (method optimal) with the chosen order and split;
 * out->optimality_gap = (iteration - lower bound) / lower bound. */
int repartition_make(const struct cluster *c, const struct plan_options *o, struct plan *out,
                     struct repartition_stats *stats, struct err *e);

#endif
