/* `ballast plan --method optimal --repartition`: chooses each stage's contiguous layer range,
 * the order of the cluster's device kinds along the pipeline (the stages of one kind stay
 * together, in their cluster order) and each stage's recompute set, to minimise the simulated
 * iteration time subject to every stage's memory limit; ties by least memory.
 *
 * With the split and order fixed, each stage's least recompute is optimal (the simulated
 * makespan never decreases when a task gets longer), so the search is over orders and splits.
 * For stage s with time T_s = sum (fwd + bwd) + R_s per micro-batch and c_s the time to move
 * its output forward and its gradient back, every 1F1B or GPipe step takes at least
 *     LB(split) = max_s ( own_s + sum_{r<s} (T_r + c_r) )
 * where own_s (repartition.c, own_bound) is stage s's M forwards and backwards, the wait for
 * its first backward (micro-batch 0's round trip, and the forwards each later stage runs
 * before its first backward) and for its last (the drain of the stages after it). G(k, i),
 * the least LB over the ways to put layers i.. on stages k.., follows from a DP (with the
 * least round trip Q and drain D of what follows); a range's knapsack is solved only when
 * its T could matter. Branch and bound over splits with the bound max(partial, prefix + G)
 * then finds the best simulated split, exactly when it finishes within its node budget and
 * time limit, and otherwise reports the certified gap to the least bound of what it left
 * unexplored. */
#ifndef BALLAST_REPARTITION_H
#define BALLAST_REPARTITION_H

#include "cluster.h"
#include "err.h"
#include "plan.h"
#include "planner.h"

/* Most device kinds whose orders are searched exhaustively (6! = 720 orders). */
#define REPARTITION_KINDS_MAX 6

/* What the search found: the cluster's stages in pipeline order and the split. */
struct arrangement {
    int n_stages;
    int *stage;        /* the cluster stage at each position */
    int *first;        /* each position's first layer (the last is the next one's first - 1) */
    struct link *link; /* each position's link to the next */
};
void arrangement_free(struct arrangement *a);

/* The link after the last stage of device kind `kind` (kind_of[stage] numbers the kinds) when
 * an order moves the kind: the one it had, or, for the kind that ended the pipeline, the
 * cluster's default link, else the slowest link between kinds in the cluster. Links inside a
 * kind stay as they are. */
struct link repartition_exit_link(const struct cluster *c, const int *kind_of, int kind);

/* Range costs (each a knapsack) kept across searches: keyed by a position's whole profile,
 * memory capacity, in-flight count, the cluster's reserve and the options that shape the
 * knapsack, so a search finds what an earlier one on the same kind of position solved. A
 * search with it makes the same plan and bounds as without (it still asks each range in
 * the same order; only the knapsack is not solved again). Never for a framework's costs.
 * Single-threaded. */
struct repart_cache;
int repart_cache_make(struct repart_cache **out, struct err *e);
void repart_cache_free(struct repart_cache *c);
/* Ranges solved, and found solved (hits), since it was made. */
void repart_cache_counts(const struct repart_cache *c, long *solved, long *hits);

/* The fastest arrangement (method optimal) within o->search_nodes and o->time_limit_s, and in
 * *found what was searched with the certified lower bound on the iteration time. ERR_NOFIT
 * when no order and split fits (dispatch.c says why with the cluster's own split). */
int repartition_search(const struct cluster *c, const struct plan_options *o,
                       struct arrangement *a, struct plan_search *found, struct err *e);

#endif
