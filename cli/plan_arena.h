/* `ballast plan`'s --arena options (planner/methods/arena_plan.h), kept apart from the rest of the
 * command. */
#ifndef BALLAST_PLAN_ARENA_H
#define BALLAST_PLAN_ARENA_H

#include "arena_plan.h"

struct plan_arena_args {
    int on;       /* --arena given */
    long explain; /* --explain-arena's stage; -1: none */
    struct arena_options o;
};

void plan_arena_args_default(struct plan_arena_args *a);
/* --arena, --explain-arena, --arena-cap, --arena-seed, --arena-generations, --arena-stall,
 * --arena-time-limit at argv[*i]: 1 taken (*rc: ERR_OK, or the usage error's status, printed),
 * 0 not one of them. */
int plan_arena_option(int argc, char **argv, int *i, struct plan_arena_args *a, int *rc);
/* Every stage's arena laid out (its memory the arena's), and each stage against its limit
 * (ERR_NOFIT naming it); `p` is freed on error. */
int plan_arena_apply(const struct plan_arena_args *a, struct plan *p, struct err *e);

#endif
