/* The order in which one stage runs its forwards and backwards in one step (the simulator's
 * schedules, planner/sim.h):
 *   1F1B   stage s of S: min(S-s-1, M) warm-up forwards, then one forward and one backward
 *          alternately, then the remaining backwards; min(S-s, M) micro-batches in flight.
 *   GPipe  every forward, then every backward; M in flight.
 * Backwards always run in micro-batch order 0..M-1, so gradients accumulate in the same order
 * under both schedules and on any number of stages. */
#ifndef BALLAST_SCHEDULE_H
#define BALLAST_SCHEDULE_H

#include "cluster.h"

struct schedule_op {
    int backward; /* 0 forward, 1 backward */
    int micro;
};

/* Fills ops[0 .. 2M-1]. */
void schedule_ops(enum schedule sch, int n_stages, int stage, int micro_batches,
                  struct schedule_op *ops);

#endif
