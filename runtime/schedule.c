#include "schedule.h"

void schedule_ops(enum schedule sch, int n_stages, int stage, int micro_batches,
                  struct schedule_op *ops)
{
    int M = micro_batches, n = 0;
    int warmup = sch == SCHEDULE_GPIPE ? M : n_stages - stage - 1;
    if (warmup > M)
        warmup = M;
    for (int m = 0; m < warmup; m++)
        ops[n++] = (struct schedule_op){0, m};
    for (int k = 0; warmup + k < M; k++) {
        ops[n++] = (struct schedule_op){0, warmup + k};
        ops[n++] = (struct schedule_op){1, k};
    }
    for (int k = M - warmup; k < M; k++)
        ops[n++] = (struct schedule_op){1, k};
}
