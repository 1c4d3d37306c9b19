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
 *   optimizer_ms      per step: one AdamW pass over the stage's parameters on the device
 *   host_update_ms    per step, with "optimizer": "host": AdamW of every layer on the
 *                     stage's host thread (overlapping the step; host_peak_bytes includes the
 *                     mirror: master, m, v and gradient landing, 4 fp32 copies)
 *   dp, allreduce_ms  data parallelism: the replicas (top level; the stages are replica 0's)
 *                     and, per step, the stage's gradient all-reduce over them, and
 *                     "allreduce": "nccl" or "mpi", what carried it (only when dp > 1)
 *   backend, gpu      "cpu" or "cuda", and the GPU's name, ordinal and UUID
 * and, for a stage on a GPU, the device memory beside the arenas (`cuda` in the metrics), all
 * read with cudaMemGetInfo, which sees the whole device; the ranks of a node start one at a
 * time so that each reading belongs to the rank that takes it:
 *   context_bytes     device memory in use right after the rank's CUDA context came up, less
 *                     what was in use when the previous rank on the same GPU had started; for
 *                     the first rank on a GPU it includes other processes' memory, which
 *                     context_includes_other_processes says
 *   cublas_bytes      what cublasCreate and the cuBLAS workspace took (cublas_workspace_bytes
 *                     of it the workspace Ballast gives cuBLAS)
 *   nccl_bytes        what the NCCL communicators and their first transfer took (0 without
 *                     NCCL)
 *   device_used_end_bytes, device_total_bytes
 *                     the whole device after the last step: every rank on the GPU together
 * Top level: the transport ("nccl", "mpi", "mpi (host-staged)") and why it was chosen.
 * fp16 (dynamic loss scaling, lossscale.h): per step "loss_scale", the scale the step's loss
 * was multiplied by, and "skipped", whether its gradients overflowed and the step was skipped;
 * at the top level "loss_scaling": the settings ("initial", "min", "growth", "backoff",
 * "window", "hysteresis"), "skipped_steps" over the run (resumed steps included) and
 * "final_scale", the scale the next step would run with. */
#ifndef BALLAST_REPORT_H
#define BALLAST_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "err.h"
#include "model.h"
#include "lossscale.h"
#include "stage.h"

struct report_stage {
    int index, first, last, n_recompute;
    char device[64];
    char backend[8];
    char gpu[256];
    int gpu_ordinal, context_includes_others;
    char gpu_uuid[64];
    int64_t context_bytes, cublas_bytes, cublas_workspace_bytes, nccl_bytes,
        device_used_end_bytes, device_total_bytes;
    int64_t peak_bytes, planned_bytes, reserve_bytes, arena_bytes;
    double planned_stage_ms, planned_recompute_ms;
    double fwd_ms, bwd_ms, recompute_ms, send_ms, idle_ms, optimizer_ms;
    double host_update_ms; /* per step: the host optimizer's AdamW on its thread */
    double allreduce_ms;
    char allreduce[8]; /* "nccl" or "mpi" (train_dp_reduce_kind) */
    /* offload: the host slots and the staging buffers the layout gave the stage, the host
     * bytes measured at their peak, copy_ms per micro-batch each way (the two lanes' busy
     * time over 2M), stall_ms per step, late_prefetches over the run */
    int64_t host_peak_bytes, host_bytes, staging_bytes;
    double copy_ms, stall_ms;
    int late_prefetches;
};

struct report_step {
    int64_t step; /* 1-based */
    double loss, ms;
    double stall_ms;     /* every stage's offload stall in the step, summed */
    int late_prefetches; /* every stage's, summed */
    double copy_ms;      /* every stage's copy lanes' busy time, both ways, summed */
    int64_t host_peak_bytes; /* the most any stage held offloaded in the step */
    double loss_scale; /* the loss scale the step ran with (fp16; 1 otherwise) */
    int skipped;       /* fp16: the gradients overflowed and the step was skipped */
};

struct report {
    const char *plan_file;
    const char *schedule;
    int micro_batches, threads;
    int dp; /* replicas; 0 or 1: one pipeline */
    int64_t tokens_per_step;
    int n_steps;
    struct report_step *steps;
    double tokens_per_s;
    const char *data;     /* "synthetic" or the file */
    const char *transport, *transport_reason;
    double entropy_floor; /* < 0: unknown */
    int n_stages;
    struct report_stage *stages;
    /* fp16: the loss scaling's settings and its state after the last step (skipped counts
     * the whole run's, resumed steps included); NULL: none */
    const struct lossscale_config *loss_scale;
    struct lossscale scaler;
};

int report_write_metrics(const char *file, const struct report *r, struct err *e);
/* A loss scale as the lines print it: a whole number (the usual power of two) in full,
 * anything else in %g. */
void report_scale_text(double scale, char out[32]);
void report_print_summary(FILE *f, const struct report *r);

/* One Chrome-trace JSON (Perfetto opens it; common/trace.h writes it): a track per stage (and
 * per stage and copy direction for the stages that offload: "stage S to host", "... from"),
 * events[counts[0] + ...] in stage order, times relative to a common origin. */
int report_write_trace(const char *file, const struct model *m, const struct report *r,
                       const int *counts, const struct stage_event *events, struct err *e);

#endif
