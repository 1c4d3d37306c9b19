/* The pool search (issue 17): given a pool of GPUs (a cluster file with "pool" and
 * "global_batch" instead of "stages"), the data-parallel pipeline with the least simulated
 * step. A candidate is dp replicas of one pipeline holding, per device kind k, S_k stages of
 * tp_k GPUs each (tp_k divides the model's heads and fits a node, dp * S_k * tp_k <= count_k),
 * with M = global_batch / (dp * micro_batch) micro-batches a replica; each candidate's device
 * order, layer split and memory actions are --method optimal --repartition's, and its step is
 * the simulated one with the gradient reduction over the replicas. The answer is the least
 * over all of them (ties: the first in the order dp, then kind after kind tp and stages):
 * the candidates with the POOL_FIRST least lower bounds are planned first, and a candidate
 * whose bound (M times the reference work over the summed speeds of its stages, pool.c
 * candidate_bound) cannot beat the best so far is not planned. */
#ifndef BALLAST_POOL_H
#define BALLAST_POOL_H

#include <cjson/cJSON.h>

#include "plan.h"
#include "planner.h"

#define POOL_KINDS_MAX 6

struct pool_result {
    long candidates; /* planned (the others were pruned by their bound) */
    long fitted;     /* of which some plan fits */
    int n_kinds;
    int dp, micro_batches;
    int tp[POOL_KINDS_MAX], stages[POOL_KINDS_MAX];
    char device[POOL_KINDS_MAX][PROFILE_NAME_MAX];
};

/* Whether a cluster file gives a "pool" (*is_pool), read from `file`. */
int pool_file_check(const char *file, int *is_pool, struct err *e);
/* The best plan of the pool (ERR_NOFIT when no candidate fits; ERR_INPUT for a bad pool,
 * naming the field and the numbers). `o` is --method optimal's; the search sets repartition. */
int pool_search(const char *file, const struct plan_options *o, struct plan *best,
                struct pool_result *r, struct err *e);
/* The same with the pruning on or off (off: every candidate planned, for tests). */
int pool_search_pruned(const char *file, const struct plan_options *o, int prune,
                       struct plan *best, struct pool_result *r, struct err *e);
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
