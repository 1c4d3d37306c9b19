/* Ballast's optimal method with offloading (--actions ...,offload; docs/cost-model.md "Offload"):
 * per stage and layer a recompute choice, the place of what it keeps, or an option's tensors
 * sent to the host, subject to device and host memory, at the least simulated iteration time.
 *
 * Exact by dominance: the simulated makespan never decreases when a task gets longer (sim.h),
 * so of two actions of a stage, one whose every layer recomputes no longer and copies no
 * longer is never worse. Each stage's candidates are the fitting action combinations no
 * other dominates: its least recompute on the device alone (which dominates every combination
 * recomputing as long or longer), and the offloading combinations that recompute less. The
 * candidates of all stages are then simulated: every combination when there are at most
 * OFFLOAD_EXHAUSTIVE_MAX, else stage by stage until no stage improves. Exact when every stage
 * has at most OFFLOAD_ENUM_MAX combinations and the product is within the exhaustive bound.
 *
 * Where it is not exact, more actions would make more combinations and so a coarser search
 * (two-action families instead of every combination, fewer candidates kept, a descent instead
 * of every combination): a superset of actions could plan slower than a smaller set (issue 27:
 * one stage of 6 MiB, `offload` 9.442 ms against `recompute,offload` 11.050 ms). So the plans
 * of the smaller sets (methods.c) are seeds: each stage's choice in each is a candidate kept
 * past every cap, and the descent starts from the fastest, so the plan is never slower. */
#ifndef BALLAST_OFFLOAD_H
#define BALLAST_OFFLOAD_H

#include "choice.h"
#include "knapsack.h"
#include "planner.h"

#define OFFLOAD_EXHAUSTIVE_MAX 4096
/* A stage with at most this many action combinations is searched through all of them; a
 * larger one through two-action families (its first k layers one action, the rest another).
 * When the search is not exhaustive, a stage keeps at most OFFLOAD_STAGE_CANDIDATES_MAX
 * candidates besides the seeds': its baseline and those that recompute least (ties: those
 * that copy least). */
#define OFFLOAD_ENUM_MAX 1024
#define OFFLOAD_STAGE_CANDIDATES_MAX 4

/* Most seeds offload_choose takes: the plans of the smaller sets of actions (at most 31 under
 * recompute, offload, optimizer, optimizer-fraction and weights; a candidate's seeds are bits
 * of an unsigned). */
#define OFFLOAD_SEEDS_MAX 32

/* ERR_INPUT for offload with a method other than optimal. */
int offload_options_check(const struct plan_options *o, struct err *e);
/* Chooses every stage's actions of a laid-out plan. Each stage's choice in every seed (a
 * plan of a smaller set of actions, methods.c) is one of its candidates too, kept past any
 * cap, and the descent starts from the fastest seed, so the plan chosen is never slower than
 * a seed. ERR_INPUT when offload is asked and no stage has host memory, or a stage with host
 * memory has no host link. */
int offload_choose(struct plan *p, const struct plan_options *o,
                   const struct choice_snapshot *const *seeds, int n_seeds, struct err *e);

/* --min-gain where it can be exact (choice.h): each stage's every fitting combination of the
 * actions o allows, but those another no slower on every layer and no less simple beats, and
 * every combination of them simulated: the simplest within `cap`, ties by the shorter step
 * (*done 1). *done 0, p unchanged, when a stage has more than OFFLOAD_ENUM_MAX combinations
 * or the stages more than OFFLOAD_EXHAUSTIVE_MAX together, or none is within the cap. Memory
 * is the slots carving's (not --arena's). */
int offload_simplest(struct plan *p, const struct plan_options *o, double cap, int *done,
                     struct err *e);

/* The per-stage problem --verify checks: the least recompute over every action the options
 * allow, within the stage's device and host memory. By enumeration (the method's search)
 * and as a MILP with GLPK (offload_milp.c). ERR_NOFIT if nothing fits. */
int offload_stage_min_recompute(const struct plan *p, int s, const struct plan_options *o,
                                double *ms, struct err *e);
int offload_milp_min_recompute(const struct plan *p, int s, const struct plan_options *o,
                               double *ms, struct err *e);

#endif
