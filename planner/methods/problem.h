/* The per-stage problem the methods solve (problem.c): the stages one knapsack chooses for
 * together, each layer's menu of action rows (the cost model's), and the group's knapsack
 * built from the menus' recompute rows. Below methods.c and the strategies over it: the
 * knapsack DPs (least recompute, balancing), the arena fit (arena_fit.c), the action search
 * (offload.c), the MILPs (milp.c over the knapsack, offload_milp.c over the menus), nofit.c,
 * verify.c. */
#ifndef BALLAST_PROBLEM_H
#define BALLAST_PROBLEM_H

#include "knapsack.h"
#include "planner.h"

/* The stages one knapsack chooses for together: stage s's GPU's chunks (schedule.h), chunk
 * by chunk; just s where a GPU holds one. The group's leader is its first chunk: the methods
 * solve for the leaders and skip the others. */
int method_group(const struct plan *p, int s, int members[SCHEDULE_CHUNKS_MAX]);
int method_leader(const struct plan *p, int s);
/* Stage s's group's knapsack as the method solves it, built from each layer's menu
 * (method_menu) of recompute choices on the device: whole layers for patent (as published),
 * every recompute option too for optimal unless o->whole_layers; its layers the group's, end
 * to end. */
int method_problem(const struct plan *p, int s, const struct plan_options *o,
                   struct knap_problem *kp, struct err *e);
/* Layer l of stage st's menu: the action rows the options allow it (cost_actions, in its
 * order): recompute choices only with recompute (whole layers only with --whole-layers),
 * host bytes only with offload and a host limit. The one list the action search
 * (offload.c) and its MILP (offload_milp.c) choose from; returns the count. */
int method_menu(const struct plan *p, const struct plan_stage *st, int l,
                const struct plan_options *o, struct cost_row out[COST_ACTIONS_MAX]);
/* The group's recompute choices end to end, as method_problem's layers (kp.n of them). */
void method_gather(const struct plan *p, int s, unsigned char *choice);

#endif
