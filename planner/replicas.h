/* Heterogeneous data-parallel replicas (issue 17): pipelines, each its own plan (its GPU kinds,
 * split and micro-batches, its stages replicated `dp` times), training one model side by side.
 *
 * Each pipeline runs its step alone (sim.h); then every layer's gradients are reduced over all
 * the replicas of all pipelines, N = sum of the pipelines' dp. The layers are cut into
 * segments where every pipeline's stage holding them is the same; a segment's ring all-reduce
 * (cost_dp_allreduce_ms) starts once every holding stage's last backward has ended and the
 * holders' links are free (a stage's GPUs reduce one segment at a time, the last layers
 * first), moves the largest holder's share of bytes (a stage's allreduce_bytes split over its
 * layers by their state_bytes) and runs at the slowest holder's dp_link. The step ends with the
 * last reduction or the slowest pipeline, whichever is later. One pipeline: exactly sim_plan's
 * step. */
#ifndef BALLAST_REPLICAS_H
#define BALLAST_REPLICAS_H

#include <stdio.h>

#include "err.h"
#include "plan.h"

struct replicas_result {
    double step_ms;
    int n_pipelines;
    double *pipeline_ms; /* owned: each pipeline's step alone, without the reduction */
    int n_segments;
    int replicas;      /* N: the pipelines' dp summed */
    long global_batch; /* samples a step: sum of dp x micro_batches x micro_batch */
};

/* ERR_INPUT when the plans are of different models. */
int replicas_step(const struct plan *plans, int n, struct replicas_result *out, struct err *e);
/* Plan p's step alone (its stages at dp 1: no reduction) and when each of its stages' last
 * backward ends (last: p->n_stages, the caller's). */
int replicas_alone(const struct plan *p, double *last, double *alone_ms, struct err *e);
/* replicas_step with each plan's replicas_alone given, for a search that scores one pipeline
 * in many groupings: the same step, without simulating the pipelines again. */
int replicas_step_given(const struct plan *plans, int n, double *const *last,
                        const double *alone_ms, struct replicas_result *out, struct err *e);
void replicas_result_free(struct replicas_result *r);

/* The replicas file (ballast-replicas/1): {"step_ms", "replicas", "global_batch",
 * "pipelines": [a plan (ballast-plan/1's members) each]}. */
cJSON *replicas_to_json(const struct plan *plans, int n, const struct replicas_result *r);
/* Reads the pipelines' plans of a replicas file (*plans owned: plan_free each, then free). */
int replicas_parse(const cJSON *root, const char *file, struct plan **plans, int *n,
                   struct err *e);
/* Whether a parsed file is a replicas file (by its "format"). */
int replicas_is_file(const cJSON *root);
/* The step's summary line(s). */
void replicas_print(FILE *f, const struct plan *plans, int n, const struct replicas_result *r);

#endif
