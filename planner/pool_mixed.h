/* Heterogeneous pipelines in the pool search (issue 17). The homogeneous search (pool.h)
 * replicates one pipeline; here the pool is split into groups, one per device kind used (at
 * least two kinds): group g is dp_g replicas of one pipeline of S_g stages of tp_g GPUs of its
 * kind (tp_g divides the heads and fits a node, S_g at most the model's layers,
 * dp_g S_g tp_g <= the kind's count), and the global batch is dealt out as whole micro-batches,
 * sum_g dp_g M_g micro_batch = global_batch. Each group's pipeline is planned alone by
 * --method optimal --repartition (pool_kind_cluster's cluster: dp_g replicas, M_g
 * micro-batches) and a candidate's step is replicas_step over the groups' plans: the slowest
 * pipeline, then every layer's gradients reduced over all the replicas. The search covers
 * every such grouping and every split of the micro-batches; what it does not plan has a lower
 * bound that cannot beat the best so far (pool_mixed.c says why each bound holds). Groups
 * mixing kinds in one pipeline are not among the candidates. */
#ifndef BALLAST_POOL_MIXED_H
#define BALLAST_POOL_MIXED_H

#include <stdio.h>

#include "plan.h"
#include "planner.h"
#include "pool.h"
#include "replicas.h"

struct pool_mixed_group {
    int kind, tp, stages, dp, micro_batches;
};

struct pool_mixed_result {
    long groupings; /* groupings whose splits were searched (the others pruned by the bound) */
    long planned;   /* group pipelines planned by --repartition (each once) */
    long refuted;   /* group pipelines left unplanned: no split could beat the best
                       (pool_could_step) */
    long splits;    /* micro-batch splits scored by replicas_step */
    int timed_out;  /* --time-limit stopped the search: the best found by then */
    int n_groups;   /* the best's groups; 0: no candidate beat the step to beat */
    struct pool_mixed_group group[POOL_KINDS_MAX];
    char device[POOL_KINDS_MAX][PROFILE_NAME_MAX]; /* per kind */
};

/* The heterogeneous candidate with the least step below beat_ms (INFINITY: any; ties: the
 * first found): its plans, one per group (*plans owned: plan_free each, then free), and its
 * step. *n = 0 (and ERR_OK) when none beats beat_ms, or when the file fixes "dp". `root` is
 * the pool file parsed (read from `file`). `o` is
 * --method optimal's (its time_limit_s also bounds this whole search). */
int pool_mixed_search(const cJSON *root, const char *file, const struct plan_options *o,
                      double beat_ms,
                      struct plan **plans, int *n, struct replicas_result *step,
                      struct pool_mixed_result *r, struct err *e);
void pool_mixed_print(FILE *f, const struct pool_mixed_result *r, double homogeneous_ms);

/* What the search proves of group g (its micro_batches its M) before planning it, for tests:
 * least_ms, at most the step of its pipeline alone (replicas_result.pipeline_ms; INFINITY: no
 * plan of it fits); could_step, 0 when no plan of it steps alone in x (pool_could_step); and
 * cutoff_slack_ms, at least its plans' step as planned (with the all-reduce over its dp) less
 * that alone (INFINITY: no cutoff is passed). */
struct pool_mixed_bound {
    double least_ms, cutoff_slack_ms;
    int could_step;
};
int pool_mixed_group_bound(const char *file, const struct plan_options *o,
                           const struct pool_mixed_group *g, double x,
                           struct pool_mixed_bound *out, struct err *e);

/* The pool's answer: the homogeneous plan (pool_search) or heterogeneous pipelines, whichever
 * steps faster; ties go to the homogeneous plan. o's time_limit_s holds for both searches
 * together (the heterogeneous one gets what the homogeneous one left; mix.timed_out says
 * when it stopped there). */
struct pool_answer {
    int mixed; /* 1: plans/n/step hold the answer; 0: plan does */
    struct plan plan;
    int have_plan; /* the homogeneous search found a plan (else it had none that fits) */
    struct pool_result homogeneous;
    struct plan *plans;
    int n;
    struct replicas_result step;
    struct pool_mixed_result mix;
};
int pool_answer_search(const cJSON *root, const char *file, const struct plan_options *o,
                       struct pool_answer *a, struct err *e);
void pool_answer_free(struct pool_answer *a);

#endif
