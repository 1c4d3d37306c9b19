/* Replicas of two pipeline shapes side by side in the pool search (issues 17, 31). The
 * homogeneous search (pool.h) replicates one pipeline; here the pool holds two groups, each
 * dp_g replicas of its own shape: per device kind k, S_gk stages of tp_gk GPUs (a shape may
 * mix kinds, and the two may give one kind different tp), at one micro-batch size b, with
 * sum_g dp_g S_gk tp_gk <= count_k. The B = global_batch / b micro-batches are dealt exactly:
 * B_1 + B_2 = B, each group's dealt over its replicas as evenly as whole micro-batches go (a
 * replica takes at most M_g = ceil(B_g / dp_g)). Each group's pipeline is planned by
 * --method optimal --repartition at M_g (its dp replicas sharing its optimizer state), and
 * a candidate's step is replicas_step over the two plans: each pipeline up to its last
 * backwards, then every layer's gradients reduced over all the replicas, then each stage's
 * optimizer step.
 *
 * The search and its certificate. For a step under T, a replica of shape X can take at most
 * cap_X(T) micro-batches (the largest M whose lower bound on its pipeline's step is under T,
 * pool_bound.h, with the most favourable dp and replica count), so a group of dp replicas at
 * most dp cap_X(T), and two groups cover B only if their capacities do. A table over the
 * pool's GPU counts holds the most any one group fitting them can take; with it, whether any
 * pair of groups could step under T takes one pass over the groups. The search explores the
 * pairs that could at T = best / (1 + search gap) (the best the homogeneous search found, then
 * its own). A pair's first group takes half the micro-batches or more; the shapes that could
 * lead a pair are taken least bound first (pool_bound_first at the fewest micro-batches a
 * leading replica takes), until that bound reaches T. Beside each first group (every dp and
 * M its bounds allow), seconds come from a menu of shapes densest first, filtered by their
 * capacities (each lowered to its pool_could_step capacity once probed, and kept), each group's
 * bound refined at its M (pool_could_step) before planning it with the best as its
 * --repartition cutoff. A group's pipeline is planned for its step alone (the reduction it
 * shares with the other group is replicas_step's). The bounds count each stage's reduction
 * over all the pair's replicas from its last backward on, as replicas_step runs it (no
 * overlap with the backward); a planned group's floor (replicas_step_floor) is kept, and a
 * second whose floor is not under T is left without planning the first beside it. Its lower
 * bound: T when it explored every such pair; stopped at --time-limit, the least of T and the
 * bound of the first lead it did not finish, or the least T at which the table allows a pair
 * (found by bisection from there, in the time the search kept for it), whichever is more. */
#ifndef BALLAST_POOL_MIXED_H
#define BALLAST_POOL_MIXED_H

#include <stdio.h>

#include "plan.h"
#include "planner.h"
#include "pool.h"
#include "pool_model.h"
#include "replicas.h"

/* Groups side by side in an answer. */
#define POOL_GROUPS_MAX 2

struct pool_mixed_group {
    int size; /* index in the pool's sizes */
    int tp[POOL_KINDS_MAX], stages[POOL_KINDS_MAX];
    int dp, micro_batches; /* micro_batches: the most a replica takes */
    long batches;          /* the group's micro-batches, all its replicas */
};

struct pool_mixed_result {
    long shapes;   /* pipeline shapes whose capacity was bounded (tables built, summed) */
    long pairs;    /* pairs of groups whose splits were searched */
    long planned;  /* group pipelines planned by --repartition (each once) */
    long refuted;  /* group pipelines left unplanned: no split could beat the best */
    long gone;     /* of those: a search proved none steps alone under the best at fewer
                      micro-batches (the same shape and dp) */
    long reduced;  /* of those: first groups whose own reduction keeps every split over the
                      best (group_reduced_refuted), with every first at more micro-batches */
    long splits;   /* splits scored by replicas_step */
    long unproved; /* planned groups whose search stopped (--search-nodes, --time-limit) before
                      its plan was proved its best: lower_bound counts their bounds */
    int timed_out; /* --time-limit stopped the search: the best found by then */
    const char *framework; /* --for: its title, and no pair searched (none in the space) */
    double lower_bound; /* certified: no pair of groups steps faster (ms); 0: none */
    int n_groups;  /* the best's groups; 0: no pair beat the step to beat */
    struct pool_mixed_group group[POOL_GROUPS_MAX];
    int n_kinds;
    char device[POOL_KINDS_MAX][PROFILE_NAME_MAX]; /* per kind */
    int sizes[POOL_SIZES_MAX];
};

/* The pair of groups with the least step below beat_ms (INFINITY: any; ties: the first
 * found), stopping at `deadline` (the monotonic clock, clock.h; INFINITY: none): its plans, one per
 * group (*plans owned: plan_free each, then free), and its step. *n = 0 (and ERR_OK) when
 * none beats beat_ms, or when the file fixes "dp". `o` is --method optimal's. */
int pool_mixed_search(const struct pool_model *pm, const struct plan_options *o,
                      double beat_ms, double deadline, struct plan **plans, int *n,
                      struct replicas_result *step, struct pool_mixed_result *r,
                      struct err *e);
/* The same with parts of the search left out, for tests against the search with them: flags
 * without POOL_MIXED_EARLY plan groups without the two prunes that need a search of their own
 * (gone, reduced); with POOL_MIXED_ONCE a group's search stopped by its node budget is not
 * run again with more nodes (the group stays unproved); with POOL_MIXED_STOP_LEAD the search
 * stops after its first lead as --time-limit would, with time left for the bisection that
 * certifies what it left. pool_mixed_search's are POOL_MIXED_EARLY. */
enum { POOL_MIXED_EARLY = 1, POOL_MIXED_ONCE = 2, POOL_MIXED_STOP_LEAD = 4 };
int pool_mixed_search_early(const struct pool_model *pm, const struct plan_options *o,
                            int flags, double beat_ms, double deadline, struct plan **plans,
                            int *n, struct replicas_result *step, struct pool_mixed_result *r,
                            struct err *e);
void pool_mixed_print(FILE *f, const struct pool_mixed_result *r, double homogeneous_ms);

/* What the search proves of a group (its micro_batches its M) reducing with `replicas`
 * replicas in all, before planning it, for tests: least_ms, at most the step of any pair
 * holding it (INFINITY: no plan of it fits); cap_least_ms, at most that too (the bound its
 * capacity under any T is taken from); could_step, 0 when no pair holding it steps in x
 * (pool_could_step). */
struct pool_mixed_bound {
    double least_ms, cap_least_ms;
    int could_step;
};
int pool_mixed_group_bound(const struct pool_model *pm, const struct plan_options *o,
                           const struct pool_mixed_group *g, int replicas, double x,
                           struct pool_mixed_bound *out, struct err *e);

/* The pool's answer: the homogeneous plan (pool_search) or two groups side by side,
 * whichever steps faster; ties go to the homogeneous plan. o's time_limit_s holds for both
 * searches together (the second gets what the first left, and a share kept for it).
 * lower_bound: certified over both (0: none). */
struct pool_answer {
    int mixed; /* 1: plans/n/step hold the answer; 0: plan does */
    struct plan plan;
    int have_plan; /* the homogeneous search found a plan (else it had none that fits) */
    struct pool_result homogeneous;
    struct plan *plans;
    int n;
    struct replicas_result step;
    struct pool_mixed_result mix;
    double lower_bound, gap; /* gap < 0: not certified */
    double seconds;          /* the whole search's wall time */
    /* the pool's kinds and counts (for the summary table) */
    int n_kinds;
    char device[POOL_KINDS_MAX][PROFILE_NAME_MAX];
    long count[POOL_KINDS_MAX];
};
int pool_answer_search(const cJSON *root, const char *file, const struct plan_options *o,
                       struct pool_answer *a, struct err *e);
void pool_answer_free(struct pool_answer *a);

#endif
