/* The methods of docs/cost-model.md "Methods", one named function each, dispatched from a table.
 *
 * A method chooses every stage's recompute set of a plan whose stages, limits, in-flight
 * counts and loads dispatch.c has laid out; it changes nothing else but, for patent's
 * --reduce, the most loaded stage's limit. ERR_NOFIT (possibly with no message) when a stage
 * fits none of its choices: dispatch.c says why. */
#ifndef BALLAST_METHODS_H
#define BALLAST_METHODS_H

#include "knapsack.h"
#include "planner.h"

struct method {
    enum plan_method id;
    const char *name;
    int (*choose)(struct plan *p, const struct plan_options *o, struct err *e);
    int knapsack; /* solves per-stage knapsacks (what --verify checks) */
};

/* The table's entry for a method; NULL for a name it does not hold. */
const struct method *method_find(enum plan_method id);
const struct method *method_named(const char *name);

/* The stages one knapsack chooses for together: stage s's GPU's chunks (schedule.h), chunk
 * by chunk; just s where a GPU holds one. The group's leader is its first chunk: the methods
 * solve for the leaders and skip the others. */
int method_group(const struct plan *p, int s, int members[SCHEDULE_CHUNKS_MAX]);
int method_leader(const struct plan *p, int s);
/* Stage s's group's knapsack as the method solves it: whole layers for patent (as
 * published), every recompute option too for optimal unless o->whole_layers; its layers the
 * group's, end to end. */
int method_problem(const struct plan *p, int s, const struct plan_options *o,
                   struct knap_problem *kp, struct err *e);
/* The group's recompute choices end to end, as method_problem's layers (kp.n of them). */
void method_gather(const struct plan *p, int s, unsigned char *choice);

#endif
