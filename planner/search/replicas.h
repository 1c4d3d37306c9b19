/* Heterogeneous data-parallel replicas (issue 17): pipelines, each its own plan (its GPU kinds,
 * split and micro-batches, its stages replicated `dp` times, each replica taking its
 * replica_micro_batches), training one model side by side.
 *
 * Each pipeline runs its step alone (sim.h) up to each stage's last backward; then every
 * layer's gradients are reduced over all the replicas of all pipelines, N = sum of the
 * pipelines' dp. The layers are cut into segments where every pipeline's stage holding them is
 * the same; a segment's ring all-reduce (cost_dp_allreduce_ms) starts once every holding
 * stage's last backward has ended and the holders' links are free (a stage's GPUs reduce one
 * segment at a time, the last layers first), moves the largest holder's share of bytes (a
 * stage's allreduce_bytes split over its layers by their state_bytes) and runs at the slowest
 * holder's dp_link. Each stage then takes its optimizer step, as sim.c runs it after a stage's
 * own reduction; the step ends with the last stage's. One pipeline: exactly sim_plan's step.
 * Replicas of one pipeline that take fewer micro-batches finish their backwards no later than
 * its busiest, whose plan it is: they change the samples, not the step. */
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
    long global_batch; /* samples a step: every replica's micro-batches x micro_batch */
    double lower_bound_ms; /* the pool search's certified bound on every answer (0: none) */
};

/* One pipeline simulated alone (its stages at dp 1: no reduction), for scoring it in many
 * groupings without simulating it again. */
struct replicas_pipe {
    double alone_ms;
    double *last;         /* per stage: when its last backward ends (owned) */
    double *optimizer_ms; /* per stage: its optimizer step on the device once its gradients
                             are final; < 0: on the host (the pipeline is simulated again) */
};

/* ERR_INPUT when the plans are of different models. */
int replicas_step(const struct plan *plans, int n, struct replicas_result *out, struct err *e);
int replicas_alone(const struct plan *p, struct replicas_pipe *out, struct err *e);
void replicas_pipe_free(struct replicas_pipe *r);
/* replicas_step with each plan's replicas_alone given: the same step. */
int replicas_step_given(const struct plan *plans, int n, const struct replicas_pipe *alone,
                        struct replicas_result *out, struct err *e);
void replicas_result_free(struct replicas_result *r);
/* The step of p's replicas among `replicas` in all, the others' pipelines taking no time and
 * holding no bytes: no grouping holding p with that many replicas steps faster (the others'
 * stages only delay a segment's reduction, enlarge its bytes or slow its link, and more
 * replicas only lengthen it). */
int replicas_step_floor(const struct plan *p, const struct replicas_pipe *alone, int replicas,
                        double *step_ms, struct err *e);

/* Deals `batches` micro-batches to p's dp replicas as evenly as whole micro-batches go (the
 * first take one more): p->micro_batches, the most, must be ceil(batches / dp); sets
 * replica_micro_batches when they differ. ERR_INPUT when some replica would take none. */
int replicas_deal(struct plan *p, int64_t batches, struct err *e);

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
