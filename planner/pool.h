/* The pool search (issue 17): given a pool of GPUs (a cluster file with "pool" and
 * "global_batch" instead of "stages"), the data-parallel pipeline with the least simulated
 * step. A candidate is dp replicas of one pipeline at micro-batch size b (the model's, or each
 * of "micro_batch_sizes"), holding, per device kind k, S_k stages of tp_k GPUs each (tp_k
 * divides the model's heads and fits a node, dp * S_k * tp_k <= count_k), with M =
 * global_batch / (dp * b) micro-batches a replica; each candidate's device order, layer split
 * and memory actions are --method optimal --repartition's, and its step is the simulated one
 * with the gradient reduction over the replicas. The answer is the least over all of them
 * (ties: the first in the order dp, b, then kind after kind tp and stages).
 * Every candidate gets a lower bound (pool_bound.h); those whose GPUs cannot hold the model's
 * state are left out, the rest are taken in the order of their bounds until a bound cannot
 * beat the best (less --search-gap). Before planning one, a DP over its orders and splits
 * proves whether it could beat the best at all; then --repartition searches it with the best
 * step as its cutoff. --time-limit holds for the whole search (checked between candidates,
 * once one plan is found; a candidate's search gets a share); the plan carries the certified
 * gap (its lower bound: the least of what each candidate's search proved and the bounds of
 * those left). */
#ifndef BALLAST_POOL_H
#define BALLAST_POOL_H

#include <cjson/cJSON.h>

#include "plan.h"
#include "planner.h"

#define POOL_KINDS_MAX 6
/* Candidates a pass of the pruned search keeps, the least bounds; the rest wait for the next
 * pass (so memory stays bounded however many the pool holds). */
#define POOL_KEEP (1L << 17)

struct pool_result {
    long enumerated; /* candidates the pruned search ranked (those left for memory aside) */
    long candidates; /* planned (the others were left by their bound) */
    long cut;        /* of which nothing beat the best so far (their --repartition cutoff) */
    long fitted;     /* of which some plan fits and was returned */
    long cannot_fit; /* left out: their GPUs cannot hold the model's state (pool.c cannot_fit;
                        the exhaustive search counts them and plans them all the same) */
    long refuted;    /* left before planning: no order and split could beat the best
                        (pool_bound.h pool_could_step) */
    long refuted_but_fits; /* planned (the exhaustive search) and fitting although cannot_fit
                              said it could not, or pool_could_step that it could not step
                              so fast: 0 unless they are wrong */
    double bound_ratio; /* the largest lower bound over the step of a candidate planned: at
                           most 1 unless the bound is wrong */
    long nodes, splits; /* the candidates' --repartition nodes and splits simulated */
    int exhausted;      /* no time limit or node budget stopped a search */
    double lower_bound; /* certified: no candidate steps faster (ms) */
    double gap;         /* the best step over lower_bound, less 1 */
    int n_kinds;
    int dp, micro_batches, micro_batch; /* the fastest's: micro_batch its size */
    int tp[POOL_KINDS_MAX], stages[POOL_KINDS_MAX];
    char device[POOL_KINDS_MAX][PROFILE_NAME_MAX];
};

/* The best plan of the pool (ERR_NOFIT when no candidate fits; ERR_INPUT for a bad pool,
 * naming the field and the numbers). `o` is --method optimal's; the search sets repartition. */
int pool_search(const char *file, const struct plan_options *o, struct plan *best,
                struct pool_result *r, struct err *e);
/* The same with the pruning on, keeping `prune` candidates a pass (pool_search: POOL_KEEP), or
 * off (0: every candidate planned, for tests). */
int pool_search_pruned(const char *file, const struct plan_options *o, long prune,
                       struct plan *best, struct pool_result *r, struct err *e);
/* pool_search_pruned on the file already parsed (`root`, read from `file`). */
int pool_search_parsed(const cJSON *root, const char *file, const struct plan_options *o,
                       long prune, struct plan *best, struct pool_result *r, struct err *e);
void pool_print(FILE *f, const struct pool_result *r);

/* A pool file's kinds as the search reads them (for planner/pool_mixed.c). */
struct pool_info {
    int n_kinds;
    char device[POOL_KINDS_MAX][PROFILE_NAME_MAX];
    int64_t count[POOL_KINDS_MAX], per_node[POOL_KINDS_MAX]; /* per_node: count when absent */
    int64_t global_batch, only_dp;                           /* only_dp: "dp", 0 when absent */
    struct model model;
};
/* Reads and checks the pool of the parsed file `root` (read from `file`). */
int pool_info_read(const char *file, const cJSON *root, struct pool_info *info, struct err *e);
/* The cluster of one pipeline of `stages` stages of tp GPUs of kind k, replicated dp times,
 * M micro-batches a replica, with the pool file's other members (as the search plans it). */
int pool_kind_cluster(const char *file, const cJSON *root, int k, int tp, int stages, int dp,
                      int M, struct cluster *c, struct err *e);

#endif
