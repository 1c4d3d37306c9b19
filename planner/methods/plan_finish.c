/* What every way of planning ends with (planner.h's planner_finish: the methods, the
 * frameworks' plans, arena_plan's offloads), and the tie-break of equal steps. Below the
 * files that lay out and choose a plan, so that they need not call up into dispatch.c. */
#include "plan_layout.h"
#include "sim.h"

int planner_finish(struct plan *p, struct err *e)
{
    p->bottleneck_stage = 0;
    for (int s = 0; s < p->n_stages; s++) {
        struct plan_stage *st = &p->stages[s];
        plan_stage_recost(p, st);
        if (st->stage_ms > p->stages[p->bottleneck_stage].stage_ms)
            p->bottleneck_stage = s;
    }
    struct sim_result sim;
    if (sim_plan(p, &sim, e))
        return e->code;
    p->iteration_ms = sim.iteration_ms;
    sim_result_free(&sim);
    return ERR_OK;
}

int64_t plan_memory(const struct plan *p)
{
    int64_t memory = 0;
    for (int s = 0; s < p->n_stages; s++)
        memory += p->stages[s].memory_bytes;
    return memory;
}
