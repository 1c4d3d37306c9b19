/* `ballast plan --micro-batches auto`: for a fixed global batch G (samples per step across the
 * dp data-parallel replicas), every micro-batch size b dividing G / dp with M = G / (dp b)
 * micro-batches is a candidate; dispatch.c plans each and keeps the least simulated
 * iteration time (ties: least memory). This file makes a candidate's cluster and prints the
 * table; it plans nothing. */
#ifndef BALLAST_MICROBATCH_H
#define BALLAST_MICROBATCH_H

#include <stdio.h>

#include "cluster.h"
#include "devices.h"
#include "plan.h"
#include "planner.h"

/* What the candidates' profiles needed, for the notes under the table. */
struct microbatch_notes {
    int scaled;  /* a measured profile was scaled to another micro-batch size */
    int dropped; /* recompute options the runtime does not know were left out */
};

/* The cluster c with micro-batch size b and M micro-batches, its profiles made for b
 * (estimated ones by `estimate`; owned: microbatch_cluster_free). ERR_INPUT when the model is
 * too large at b. */
int microbatch_cluster(const struct cluster *c, const struct device_table *t,
                       plan_estimate_fn estimate, int b, int M, struct cluster *out,
                       struct microbatch_notes *notes, struct err *e);
void microbatch_cluster_free(struct cluster *cb, int n_profiles);

/* The candidate (ms, memory) beats the best so far. */
int microbatch_better(double ms, int64_t memory, double best_ms, int64_t best_memory);

/* The table (report NULL: silent): its head, one row per candidate (rc ERR_NOFIT: does not
 * fit; another error: too large), and the choice with the notes. */
void microbatch_report_head(FILE *report, int global_batch, int dp);
void microbatch_report_row(FILE *report, int b, int M, int rc, double iteration_ms);
void microbatch_report_end(FILE *report, const struct plan *chosen,
                           const struct microbatch_notes *notes);

#endif
