/* Ballast's optimal method with offloading (--actions ...,offload; DESIGN.md "Cost model"):
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
 * has at most OFFLOAD_ENUM_MAX combinations and the product is within the exhaustive bound. */
#ifndef BALLAST_OFFLOAD_H
#define BALLAST_OFFLOAD_H

#include "knapsack.h"
#include "planner.h"

#define OFFLOAD_EXHAUSTIVE_MAX 4096
/* A stage with at most this many action combinations is searched through all of them; a
 * larger one through two-action families (its first k layers one action, the rest another).
 * When the search is not exhaustive, a stage keeps at most OFFLOAD_STAGE_CANDIDATES_MAX
 * candidates: its baseline and those that recompute least. */
#define OFFLOAD_ENUM_MAX 1024
#define OFFLOAD_STAGE_CANDIDATES_MAX 4

/* ERR_INPUT for offload with a method other than optimal. */
int offload_options_check(const struct plan_options *o, struct err *e);
/* Chooses every stage's actions of a laid-out plan. ERR_INPUT when offload is asked and no
 * stage has host memory, or a stage with host memory has no host link. */
int offload_choose(struct plan *p, const struct plan_options *o, struct err *e);

/* A recompute-only plan's choices and simulated iteration time, kept while the offload
 * search runs on the same plan: the method keeps the search's plan only where it simulates
 * faster (methods.c), so a superset of actions never gives a slower plan whatever the search
 * leaves out. */
struct offload_fallback {
    unsigned char *recompute; /* every stage's layers in turn */
    double iteration_ms;
};
int offload_fallback_save(const struct plan *p, struct offload_fallback *f, struct err *e);
/* The saved choices back, nothing offloaded. */
void offload_fallback_restore(struct plan *p, const struct offload_fallback *f);
void offload_fallback_free(struct offload_fallback *f);

/* Whether the options and the stage allow an action row: recompute choices only with
 * recompute, host bytes only with offload and host memory, whole layers only with
 * --whole-layers. */
int offload_action_allowed(const struct cost_row *r, const struct plan_stage *st,
                           const struct plan_options *o);

/* The per-stage problem --verify checks: the least recompute over every action the options
 * allow, within the stage's device and host memory. By enumeration (the method's search)
 * and as a MILP with GLPK (offload_milp.c). ERR_NOFIT if nothing fits. */
int offload_stage_min_recompute(const struct plan *p, int s, const struct plan_options *o,
                                double *ms, struct err *e);
int offload_milp_min_recompute(const struct plan *p, int s, const struct plan_options *o,
                               double *ms, struct err *e);

#endif
