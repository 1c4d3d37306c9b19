/* Discrete-event simulation of one training step of a pipeline schedule.
 *
 * 1F1B as PipeDream-Flush / Megatron run it: stage s of S does min(S-s-1, M) warm-up
 * forwards, then one forward and one backward alternately, then the remaining backwards.
 * GPipe: all forwards, then all backwards (micro-batch 0 first). A recomputed layer's forward
 * runs right before its backward. Activations (forward) and their gradients (backward) of
 * `out_bytes` cross each stage boundary over its link; a link carries one transfer at a time
 * in each direction and never blocks compute. */
#ifndef BALLAST_SIM_H
#define BALLAST_SIM_H

#include "cluster.h"
#include "err.h"
#include "plan.h"

enum sim_kind { SIM_FORWARD, SIM_RECOMPUTE, SIM_BACKWARD, SIM_SEND_FORWARD, SIM_SEND_BACKWARD };

/* One stage's costs per micro-batch. */
struct sim_stage {
    double fwd_ms;
    double bwd_ms;
    double recompute_ms;
    int64_t out_bytes; /* crosses to the next stage (and its gradient back) */
    struct link link;  /* to the next stage */
};

struct sim_task {
    int stage;
    int micro;
    enum sim_kind kind; /* SIM_SEND_*: on the link from `stage` to its neighbour */
    double start_ms;
    double end_ms;
};

struct sim_result {
    double iteration_ms;
    double bubble_fraction; /* idle share of S x iteration_ms */
    int n_stages;
    double *busy_ms; /* per stage: forward + recompute + backward */
    double *idle_ms; /* per stage: iteration_ms - busy_ms */
    int n_tasks;
    struct sim_task *tasks;
};

int sim_run(enum schedule schedule, int n_stages, int micro_batches,
            const struct sim_stage *stages, struct sim_result *out, struct err *e);
/* Simulates a plan's stages with its recompute sets. */
int sim_plan(const struct plan *p, struct sim_result *out, struct err *e);
void sim_result_free(struct sim_result *r);

#endif
