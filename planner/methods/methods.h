/* The methods of docs/cost-model.md "Methods", one named function each, dispatched from a table.
 *
 * A method chooses every stage's recompute set of a plan whose stages, limits, in-flight
 * counts and loads dispatch.c has laid out; it changes nothing else but, for patent's
 * --reduce, the most loaded stage's limit. ERR_NOFIT (possibly with no message) when a stage
 * fits none of its choices: dispatch.c says why. */
#ifndef BALLAST_METHODS_H
#define BALLAST_METHODS_H

#include "planner.h"
#include "problem.h"

struct method {
    enum plan_method id;
    const char *name;
    int (*choose)(struct plan *p, const struct plan_options *o, struct err *e);
    int knapsack; /* solves per-stage knapsacks (what --verify checks) */
};

/* The table's entry for a method; NULL for a name it does not hold. */
const struct method *method_find(enum plan_method id);
const struct method *method_named(const char *name);

#endif
