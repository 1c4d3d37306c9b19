/* The pipeline schedule: the order in which one stage runs its forwards and backwards in one
 * step, and how many micro-batches it holds at once. The simulator (planner/sim.c) and the
 * executor (runtime/exec.c) both run what this says; the planner sizes activations by the
 * in-flight count.
 *   1F1B   stage s of S: min(S-s-1, M) warm-up forwards, then one forward and one backward
 *          alternately, then the remaining backwards; min(S-s, M) micro-batches in flight.
 *   GPipe  every forward, then every backward; M in flight.
 * Backwards always run in micro-batch order 0..M-1, so gradients accumulate in the same order
 * under both schedules and on any number of stages. */
#ifndef BALLAST_SCHEDULE_H
#define BALLAST_SCHEDULE_H

enum schedule { SCHEDULE_1F1B, SCHEDULE_GPIPE };

struct schedule_op {
    int backward; /* 0 forward, 1 backward */
    int micro;
};

/* Fills ops[0 .. 2M-1]. */
void schedule_ops(enum schedule sch, int n_stages, int stage, int micro_batches,
                  struct schedule_op *ops);
/* The most micro-batches whose forward has run and whose backward has not, at any point of
 * schedule_ops' order: the activation slots the stage needs. */
int schedule_in_flight(enum schedule sch, int n_stages, int stage, int micro_batches);

#endif
