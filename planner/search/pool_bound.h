/* The pool search's bounds (pool.c): from the costs a stage of each device kind, tp and dp
 * gives each layer alone, a lower bound on a candidate's step, whether its GPUs can hold the
 * model's state at all, and a finer test of whether any order and split could step under a
 * given time. Every one holds for the simulated step of every plan of the candidate (the
 * proofs are at each function). */
#ifndef BALLAST_POOL_BOUND_H
#define BALLAST_POOL_BOUND_H

#include <stdint.h>

#include "cluster.h"
#include "pool_model.h"
#include "schedule.h"

/* A stage of one kind, tp and dp alone, its gradients reduced over some number of replicas. */
struct pool_costs {
    int known;    /* the stage is one the model allows (else nothing below: no bound) */
    long serial;  /* which filling of a cache slot this is (pool_costs_get) */
    double *fwd_ms, *work_ms; /* per layer: forward; forward + backward */
    double *tail_ms; /* per layer: its bytes' share of the gradient all-reduce past the
                        latency, plus its optimizer step on the device, less its backward
                        when the reduction is bucketed (it may overlap the last backward) */
    double *send_ms; /* per layer: its output (or its gradient) over the link between stages */
    int64_t *state;  /* per layer: the least parameter, gradient and optimizer bytes a GPU
                        keeps (pool_costs_fill) */
    int64_t *act, *least_kept; /* per layer: activation bytes a micro-batch keeps with nothing
                                  recomputed, and the least any recomputation keeps */
    double freed_per_ms; /* the most activation bytes a ms of recomputation frees, over the
                            layers and their options (INFINITY: some frees bytes for free) */
    double first_tail_ms; /* layer 0 alone: its all-reduce and optimizer step */
    double latency_ms;    /* an all-reduce of no bytes (0 at dp 1) */
    int64_t capacity;     /* a GPU's memory less the cluster's reserve */
};

/* A candidate as the bounds see it: the kinds it uses, their costs at its tp and dp and
 * their stage counts; L layers, M micro-batches a replica. */
struct pool_shape {
    int used;
    const struct pool_costs *costs[POOL_KINDS_MAX];
    int stages[POOL_KINDS_MAX];
    int L;
    double M;
    enum schedule schedule;
    int recompute_only; /* the plan's only memory action is recomputation (no offload, no
                           optimizer on the host): activations stay on the device */
};

/* What the bounds take from a shape but its stage counts: candidates that differ only in
 * those share it (pool_summarize). */
struct pool_summary {
    double work[POOL_KINDS_MAX], shares;   /* least_most of the works: V_u and the shares */
    double whole[POOL_KINDS_MAX], wholes;  /* the same of M work + tail */
    double least, first_tail, latency;     /* sum_l min_u work; min_u first_tail; latency */
    double phi; /* the most forward share of a layer's work, over the layers and kinds */
    double need;    /* sum_l min_u state / capacity (INFINITY: a layer fits no kind) */
    int known;      /* the sums are positive: else no bound */
};

int pool_costs_alloc(struct pool_costs *c, int L);
void pool_costs_free(struct pool_costs *c);
/* `from` into `to` (its arrays made for L layers if it has none). */
int pool_costs_copy(struct pool_costs *to, const struct pool_costs *from, int L);
/* The costs of c's stage 0 alone, its gradients reduced over `replicas` replicas of all the
 * pipelines reducing together (the stage's own dp replicas when alone; <= 1: no reduction),
 * under the plan's `actions` (planner.h): its optimizer step on the device unless the
 * optimizer may go to the host, and its state the least those actions leave on the device
 * (the optimizer's part on the host, the weights' too where they may stream).
 * overlap_backward: the reduction may overlap the stage's last backward where c buckets it,
 * as sim.c runs one pipeline's replicas; 0: it starts after the last backward, as
 * replicas_step runs pipelines side by side (replicas.h), so no backward comes off the
 * tail. */
void pool_costs_fill(const struct cluster *c, int replicas, int actions, int overlap_backward,
                     struct pool_costs *out);

/* The costs of a pool's stages, made from its model in memory when first asked for and kept
 * a while (a few dp and replica counts per kind, tp and size); pool_costs_fill's actions and
 * overlap_backward for all. */
struct pool_costs_cache;
int pool_costs_cache_make(const struct pool_model *pm, int actions, int overlap_backward,
                          struct pool_costs_cache **out, struct err *e);
void pool_costs_cache_free(struct pool_costs_cache *c);
/* Kind k's stage of tp GPUs at size index `size`, replicated dp times (its optimizer state
 * sharded over them with shard_optimizer), its gradients reduced over `replicas`; NULL when
 * tp does not suit the model, or no memory. Valid until the next call for the same kind, tp
 * and size. */
const struct pool_costs *pool_costs_get(struct pool_costs_cache *c, int k, int tp, int size,
                                        int dp, int replicas);

void pool_summarize(const struct pool_shape *s, struct pool_summary *out);
/* A lower bound on the step (cheap: ranks every candidate), from s's summary. */
double pool_bound(const struct pool_shape *s, const struct pool_summary *sum);
/* Its part that holds stage 0's end (section (1) below): of the summary, it reads only what
 * does not depend on s->M, so one summary serves every M. */
double pool_bound_first(const struct pool_shape *s, const struct pool_summary *sum);
/* pool_bound at s->M from a summary made at any M (its M work + tail made again at s->M). */
double pool_bound_at(const struct pool_shape *s, const struct pool_summary *sum);
/* What of the summary depends on s->M (whole, wholes) made again at s->M; it reads s's costs
 * only, not its stage counts, so shapes of the same costs share it. 0: unknown (no bound). */
int pool_summary_at(const struct pool_shape *s, struct pool_summary *sum);
/* Whether the stages cannot hold the model's state, activations aside. */
int pool_cannot_fit(const struct pool_shape *s, const struct pool_summary *sum);
/* Whether some order of the kinds and split of the layers could step in x ms or less
 * (0: every plan of the candidate steps slower than x). */
int pool_could_step(const struct pool_shape *s, double x);
/* The per-layer sums pool_could_step makes of a shape's costs: they do not depend on its
 * stage counts or M, so shapes of the same costs may share them (NULL: no memory). */
struct pool_prefixes;
struct pool_prefixes *pool_prefixes_make(const struct pool_shape *s);
void pool_prefixes_free(struct pool_prefixes *p);
/* pool_could_step with the sums made for s's costs. */
int pool_could_step_with(const struct pool_shape *s, const struct pool_prefixes *p, double x);

#endif
