/* Laying out a stage's activation arena (common/arena.h) by a reuse plan: the objects of a
 * plan's stage from the shared schedule, and the layouts, each one named function of the
 * `arena_methods` table:
 *   slots   today's carving: one slot per in-flight micro-batch (micro-batch m in slot
 *           m mod v, its layers in order), then the largest transient, then the workspace,
 *           then offload staging as a pool: buffers of the largest staging object, as many
 *           as are live at once
 *   greedy  greedy by size (Pisarchyk & Lee 2020, TFLite): largest first, each into the
 *           smallest gap among the objects live at the same time, else on top
 *   ga      the published genetic search (docs/cost-model.md; arena_ga.c)
 *   exact   a GLPK MILP: offsets, one order binary per pair live at once, least arena
 *           (arena_milp.c); "not proven" when its time limit stops it
 * Each is measured against the lower bound, the most bytes live at one tick. With a device
 * cap on the arena, the objects above it are the bytes that must go to host memory (the
 * fitness of ga), and arena_plan turns their layers into offloads. */
#ifndef BALLAST_ARENA_PLAN_H
#define BALLAST_ARENA_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "arena.h"
#include "plan.h"

struct arena_options {
    char method[ARENA_METHOD_MAX];
    int64_t cap_bytes;   /* the arena's device cap; <= 0: none */
    int offload;         /* --actions allows offload: layers whose kept objects lie above the
                            cap go to host memory (arena_plan) */
    uint64_t seed;       /* ga */
    int population;      /* ga */
    int generations;     /* ga: at most */
    int stall;           /* ga: stop after this many generations without a better layout */
    double time_limit_s; /* ga and exact */
};

/* What a layout method works on: the objects (it writes their offsets) and the stage's
 * in-flight count (for slots). */
struct arena_problem {
    struct arena_object *o;
    int n;
    int in_flight;
};

/* What a method says of its layout besides the offsets. */
struct arena_result {
    int proven;       /* exact: the MILP proved it optimal */
    const char *note; /* why not proven, or what the search did; static text */
    long iterations;  /* ga: generations; exact: branch-and-bound nodes (where GLPK says) */
};

typedef int (*arena_method_fn)(struct arena_problem *pb, const struct arena_options *opt,
                               struct arena_result *r, struct err *e);

struct arena_method {
    const char *name;
    arena_method_fn fn;
};

extern const struct arena_method arena_methods[];
extern const int arena_method_count;

void arena_options_default(struct arena_options *o);
/* The method named `name`, or NULL. */
const struct arena_method *arena_method_find(const char *name);

int arena_slots(struct arena_problem *pb, const struct arena_options *opt,
                struct arena_result *r, struct err *e);
int arena_greedy(struct arena_problem *pb, const struct arena_options *opt,
                 struct arena_result *r, struct err *e);
int arena_ga(struct arena_problem *pb, const struct arena_options *opt, struct arena_result *r,
             struct err *e);
int arena_exact(struct arena_problem *pb, const struct arena_options *opt,
                struct arena_result *r, struct err *e);

/* Places `o` (objects already placed: offset >= 0; those with -1 are ignored) at the lowest
 * offset of the smallest gap that holds it among placed objects live at the same time, else
 * on top of them. */
int64_t arena_best_gap(const struct arena_object *o, int n, const struct arena_object *obj);

/* Milliseconds of the monotonic clock: solve times and the searches' time limits. */
double arena_clock_ms(void);

/* Every activation object of stage s of the plan, offsets -1 (owned by the caller). */
int arena_stage_objects(const struct plan *p, int s, struct arena_object **out, int *n,
                        struct err *e);
/* Lays the objects out with the options' method into `a` (which takes the objects), checks
 * the layout, and fills bytes, lower bound, host bytes and the solve time. */
int arena_layout(struct arena_object *o, int n, int in_flight, const struct arena_options *opt,
                 struct arena *a, struct arena_result *r, struct err *e);
/* Every stage: lays its arena out and makes it the stage's memory (cost.h's arena term).
 * With a cap the arena exceeds, the layers above the cap become offloads and the stage is
 * laid out again (with opt->offload and the stage's host memory; ERR_NOFIT with the numbers
 * otherwise); the plan's costs and simulated iteration follow. */
int arena_plan(struct plan *p, const struct arena_options *opt, struct err *e);
/* Stage s's objects, lifetimes and offsets, against the lower bound. */
void arena_explain(FILE *f, const struct plan *p, int s);

#endif
