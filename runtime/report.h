/* What a training run reports: the metrics file (ballast-metrics/1), the table rank 0
 * prints at the end, and the Chrome-trace file.
 *
 * Definitions (computed in train.c, written here):
 *   steps[].ms        wall time of the step on rank 0: from its start to the last stage's
 *                     loss arriving (the whole pipeline, flush included)
 *   tokens_per_s      micro_batches x micro_batch x seq_len per step, over the steps of this
 *                     run after the first (warm-up excluded; a one-step run reports that step)
 *   peak_bytes        the stage's high-water mark of bytes live (stage.h), measured
 *   planned_bytes     the plan's memory_bytes minus reserve_bytes: what the cost model says the
 *                     arenas hold at their peak (reserve_bytes is reported beside it)
 *   fwd_ms, bwd_ms, recompute_ms, send_ms, idle_ms
 *                     per micro-batch, averaged over the same steps as tokens_per_s: forward
 *                     compute, backward compute, recompute forwards, posting sends and waiting
 *                     for them to complete, waiting for data to arrive (the pipeline bubble)
 *   optimizer_ms      per step: one AdamW pass over the stage's parameters */
#ifndef BALLAST_REPORT_H
#define BALLAST_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "err.h"
#include "model.h"
#include "stage.h"

struct report_stage {
    int index, first, last, n_recompute;
    char device[64];
    int64_t peak_bytes, planned_bytes, reserve_bytes, arena_bytes;
    double planned_stage_ms, planned_recompute_ms;
    double fwd_ms, bwd_ms, recompute_ms, send_ms, idle_ms, optimizer_ms;
};

struct report_step {
    int64_t step; /* 1-based */
    double loss, ms;
};

struct report {
    const char *plan_file;
    const char *schedule;
    int micro_batches, threads;
    int64_t tokens_per_step;
    int n_steps;
    struct report_step *steps;
    double tokens_per_s;
    const char *data;     /* "synthetic" or the file */
    double entropy_floor; /* < 0: unknown */
    int n_stages;
    struct report_stage *stages;
};

int report_write_metrics(const char *file, const struct report *r, struct err *e);
void report_print_summary(FILE *f, const struct report *r);

/* One Chrome-trace JSON (Perfetto opens it; common/trace.h writes it): a track per stage,
 * events[counts[0] + ...] in stage order, times relative to a common origin. */
int report_write_trace(const char *file, const struct model *m, const struct report *r,
                       const int *counts, const struct stage_event *events, struct err *e);

#endif
