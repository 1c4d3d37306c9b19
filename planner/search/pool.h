/* The pool search's replicas of one pipeline (issues 17, 31): given a pool of GPUs (a cluster
 * file with "pool" and "global_batch" instead of "stages", pool_model.h), the data-parallel
 * pipeline with the least simulated step. A candidate is dp replicas of one pipeline at
 * micro-batch size b (the model's, or each of "micro_batch_sizes"), holding, per device kind
 * k, S_k stages of tp_k GPUs each (tp_k divides the model's heads and fits a node,
 * dp * S_k * tp_k <= count_k). The global batch's B = global_batch / b micro-batches are dealt
 * to the replicas as whole micro-batches, as evenly as they go (no dp needs to divide B: the
 * first B mod dp replicas take one more), so a replica takes at most M = ceil(B / dp); every
 * replica runs the plan made for M, whose step is theirs (one that takes fewer ends no
 * later). Each candidate's device order, layer split and memory actions are --method optimal
 * --repartition's, and its step is the simulated one with the gradient reduction over the
 * replicas. The answer is the least over all of them (ties: the first in the order dp, b,
 * then kind after kind tp and stages), the plan's replica_micro_batches its dealing.
 * Every candidate gets a lower bound (pool_bound.h); those whose GPUs cannot hold the model's
 * state are left out, the rest are taken in the order of their bounds until a bound cannot
 * beat the best (less --search-gap). Before planning one, a DP over its orders and splits
 * proves whether it could beat the best at all; then --repartition searches it with the best
 * step as its cutoff. --time-limit holds for every phase (the profiles at other sizes, the
 * ranking, the planning: a candidate's search gets a share of the time left); the plan carries
 * the certified gap (its lower bound: the least of what each candidate's search proved and the
 * bounds of those left), none when the ranking itself was stopped. */
#ifndef BALLAST_POOL_H
#define BALLAST_POOL_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "plan.h"
#include "planner.h"
#include "pool_model.h"

/* Candidates a pass of the pruned search keeps, the least bounds; the rest wait for the next
 * pass (so memory stays bounded however many the pool holds). */
#define POOL_KEEP (1L << 20)

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
    long unrunnable; /* --for: candidates the framework cannot run (a micro-batch count dp
                        does not divide, a tp per stage, a device it refuses), left out */
    int for_framework; /* --for: no certificate (the bounds are of Ballast's activations) */
    double bound_ratio; /* the largest lower bound over the step of a candidate planned: at
                           most 1 unless the bound is wrong */
    long nodes, splits; /* the candidates' --repartition nodes and splits simulated */
    int exhausted;      /* no time limit or node budget stopped a search */
    int ranked;         /* the ranking saw every candidate (else no certified bound) */
    double lower_bound; /* certified: no candidate steps faster (ms; 0: none) */
    double gap;         /* the best step over lower_bound, less 1 (< 0: not certified) */
    int n_kinds;
    int dp, micro_batches, micro_batch; /* the fastest's: micro_batches its most a replica */
    long batches;                       /* micro-batches a step, all replicas */
    int tp[POOL_KINDS_MAX], stages[POOL_KINDS_MAX];
    char device[POOL_KINDS_MAX][PROFILE_NAME_MAX];
};

/* The best plan of the pool file (ERR_NOFIT when no candidate fits; ERR_INPUT for a bad pool,
 * naming the field and the numbers). `o` is --method optimal's; the search sets repartition. */
int pool_search(const char *file, const struct plan_options *o, struct plan *best,
                struct pool_result *r, struct err *e);
/* The same with the pruning on, keeping `prune` candidates a pass (pool_search: POOL_KEEP), or
 * off (0: every candidate planned, for tests). */
int pool_search_pruned(const char *file, const struct plan_options *o, long prune,
                       struct plan *best, struct pool_result *r, struct err *e);
/* The same on a pool already read, stopping at `deadline` (the monotonic clock, clock.h; INFINITY:
 * none) rather than at o->time_limit_s. */
int pool_search_model(const struct pool_model *pm, const struct plan_options *o, long prune,
                      double deadline, struct plan *best, struct pool_result *r,
                      struct err *e);
void pool_print(FILE *f, const struct pool_result *r);

#endif
