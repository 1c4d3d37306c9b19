#include "schedule.h"

/* Forwards before the first backward: the micro-batches on their way to the last stage. */
static int warmup(enum schedule sch, int n_stages, int stage, int micro_batches)
{
    int w = sch == SCHEDULE_GPIPE ? micro_batches : n_stages - stage - 1;
    return w < micro_batches ? w : micro_batches;
}

void schedule_ops(enum schedule sch, int n_stages, int stage, int micro_batches,
                  struct schedule_op *ops)
{
    int M = micro_batches, n = 0;
    int w = warmup(sch, n_stages, stage, M);
    for (int m = 0; m < w; m++)
        ops[n++] = (struct schedule_op){0, m};
    for (int k = 0; w + k < M; k++) {
        ops[n++] = (struct schedule_op){0, w + k};
        ops[n++] = (struct schedule_op){1, k};
    }
    for (int k = M - w; k < M; k++)
        ops[n++] = (struct schedule_op){1, k};
}

int schedule_in_flight(enum schedule sch, int n_stages, int stage, int micro_batches)
{
    /* the warm-up's forwards and the steady state's one more */
    int w = warmup(sch, n_stages, stage, micro_batches);
    return w < micro_batches ? w + 1 : micro_batches;
}
