/* The plan's summary per device kind, printed under its table: the GPUs each kind uses (and,
 * for a pool, those it leaves idle), its tensor- and data-parallel degrees and stages (pipeline
 * ranks: a GPU holding several chunks of the model, schedule.h, counts once), and its model
 * FLOPs utilisation; then the throughput in tokens a second.
 *
 * MFU of a kind = the model's FLOPs its GPUs run in a step (every layer's forward and backward
 * as the runtime performs them, estimate_layer_flops, times the micro-batches and replicas;
 * recomputation not counted) / (its GPUs x the peak the device reaches for the model's dtype,
 * devices_gemm_tflops, x the step). "unknown" for a device configs/devices.json lacks, or a
 * custom model (its FLOPs are not known). */
#ifndef BALLAST_PLAN_KINDS_H
#define BALLAST_PLAN_KINDS_H

#include <stdint.h>
#include <stdio.h>

#include "plan.h"

#define PLAN_KINDS_MAX 16

/* The GPUs a pool holds per device (NULL where the plan is not a pool's answer). */
struct plan_kinds_pool {
    int n;
    char device[PLAN_KINDS_MAX][PROFILE_NAME_MAX];
    int64_t count[PLAN_KINDS_MAX];
};

struct plan_kind {
    char device[PROFILE_NAME_MAX];
    long gpus, idle;            /* idle: -1 when not a pool */
    int tp[4], dp[4], pp[4];    /* the distinct degrees over the pipelines holding it */
    int n_tp, n_dp, n_pp;
    double flops;               /* model FLOPs a step */
    double mfu;                 /* -1: unknown */
};

struct plan_kinds {
    int n;
    struct plan_kind kind[PLAN_KINDS_MAX];
    double step_ms, tokens; /* tokens a step, over every replica */
};

/* The summary of `n` plans run side by side in a step of step_ms (one plan: its
 * iteration_ms). */
void plan_kinds_make(const struct plan *plans, int n, double step_ms,
                     const struct plan_kinds_pool *pool, struct plan_kinds *out);
void plan_kinds_print(FILE *f, const struct plan_kinds *k);

#endif
