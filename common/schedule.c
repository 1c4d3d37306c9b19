#include "schedule.h"

void schedule_ops(enum schedule sch, int n_stages, int stage, int micro_batches,
                  struct schedule_op *ops)
{
    int w = schedule_warmup(sch, n_stages, stage, micro_batches);
    for (int k = 0; k < 2 * micro_batches; k++)
        ops[k] = schedule_op_at(w, micro_batches, k);
}

int schedule_in_flight(enum schedule sch, int n_stages, int stage, int micro_batches)
{
    /* the warm-up's forwards and the steady state's one more */
    int w = schedule_warmup(sch, n_stages, stage, micro_batches);
    return w < micro_batches ? w + 1 : micro_batches;
}
