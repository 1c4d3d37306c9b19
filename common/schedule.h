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

/* Forwards before the stage's first backward: the micro-batches on their way to the last
 * stage (1F1B), or all of them (GPipe). Never more than the stage before's (the simulator's
 * order relies on it). */
static inline int schedule_warmup(enum schedule sch, int n_stages, int stage, int micro_batches)
{
    int w = sch == SCHEDULE_GPIPE ? micro_batches : n_stages - stage - 1;
    return w < micro_batches ? w : micro_batches;
}

/* Op k (0 .. 2M-1) of a stage with `warmup` warm-up forwards: the warm-up, then M - warmup
 * pairs of a forward and a backward, then the remaining backwards. Inline, so that a
 * simulator walks the order without holding it. */
static inline struct schedule_op schedule_op_at(int warmup, int micro_batches, int k)
{
    int w = warmup, M = micro_batches;
    if (k < w)
        return (struct schedule_op){0, k};
    if (k >= 2 * M - w)
        return (struct schedule_op){1, k - M};
    int j = k - w;
    return (struct schedule_op){j & 1, j & 1 ? j >> 1 : w + (j >> 1)};
}

/* Fills ops[0 .. 2M-1] with schedule_op_at's ops. */
void schedule_ops(enum schedule sch, int n_stages, int stage, int micro_batches,
                  struct schedule_op *ops);
/* The most micro-batches whose forward has run and whose backward has not, at any point of
 * schedule_ops' order: the activation slots the stage needs. */
int schedule_in_flight(enum schedule sch, int n_stages, int stage, int micro_batches);

#endif
