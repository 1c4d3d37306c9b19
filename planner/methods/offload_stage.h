/* The offload search's per-stage part (offload.c) as its stages-together part
 * (offload_global.c) uses it: a stage's candidates and how the simulator sees each. Internal
 * to the two files. */
#ifndef BALLAST_OFFLOAD_STAGE_H
#define BALLAST_OFFLOAD_STAGE_H

#include "offload.h"
#include "sim.h"

/* One candidate of a stage: its action per layer and how the simulator sees it. */
struct candidate {
    struct cost_row *rows; /* n */
    struct sim_stage sim;
    struct sim_layer *layers; /* n, used when it offloads or hosts its optimizer */
    struct sim_bucket *buckets; /* n at most: its gradients' reduction */
    double recompute_ms;
    int64_t host_bytes; /* sent to the host per micro-batch */
    enum cost_place optimizer;
    int optimizer_from; /* on the host from this layer on (a fraction; 0: all) */
    int stream;         /* its last layers whose weights stream (cost.h; 0: none) */
    unsigned seeds; /* bit k: the stage's choice in seed k (a smaller set's plan) */
};

/* Stage s's candidates with its optimizer on the device, then (with --actions ...,optimizer,
 * where it may) those with it on the host, and with optimizer-fraction on the host from each
 * of optimizer_splits' layers on: each place's own undominated ones, since the places' steps
 * are not comparable layer by layer. `simplest`: offload_simplest's (every
 * fitting combination, simplicity counted in the pruning; *enumerable 0 and none past
 * OFFLOAD_ENUM_MAX), else the search's (*enumerable 1). ERR_NOFIT when none fits. */
int offload_stage_candidates(const struct plan *p, int s, const struct plan_options *o,
                             int simplest, struct candidate **out, int *count, int *enumerable,
                             struct err *e);
/* How the simulator sees candidate c of stage st (its layers' compute, recompute and copies,
 * the stage's optimizer place). */
int offload_candidate_sim(const struct plan_stage *st, struct candidate *c);
void offload_candidate_free(struct candidate *c);
/* Past OFFLOAD_STAGE_CANDIDATES_MAX, the first candidate (the baseline), the seeds' and those
 * that recompute least (ties: copy least) stay. */
void offload_cap_candidates(struct candidate *found, int *count);
/* A candidate's part of choice_key: its host optimizer, actions and recomputed layers. */
void offload_candidate_key(const struct candidate *c, int n, int key[3]);
/* Lexicographic: -1, 0, 1. */
int offload_key_cmp(const int *a, const int *b, int n);

#endif
