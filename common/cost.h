/* The cost model of DESIGN.md, shared by the planner, the simulator, the runtime and the
 * tests. Each layer l of a stage has a recompute choice c_l (the `recompute` arrays of the
 * planner and plans hold one per layer), which keeps kept_l bytes per micro-batch,
 * regenerates transient_l bytes just before its backward and costs recompute_l ms:
 *   COST_KEEP         (act_l, 0, 0)
 *   COST_FULL         (ckpt_l, act_l - ckpt_l, fwd_l)       the whole layer
 *   COST_OPTION + k   the layer's option k (profile.h)
 * With in-flight micro-batches v:
 *   memory  M = sum state_l + v * sum kept_l + max_l transient_l + max_l workspace_l + reserve
 *   time    T = sum (fwd_l + bwd_l) + R,   recompute R = sum recompute_l   (per micro-batch)
 * With only keep and full (0/1 flags are choices) this is DESIGN.md's formula. */
#ifndef BALLAST_COST_H
#define BALLAST_COST_H

#include <stdint.h>

#include "profile.h"

enum { COST_KEEP = 0, COST_FULL = 1, COST_OPTION = 2 };

struct stage_cost {
    int64_t state_bytes;     /* sum state_l */
    int64_t kept_bytes;      /* per micro-batch: sum kept_l */
    int64_t transient_bytes; /* max transient_l */
    int64_t workspace_bytes; /* max workspace_l */
    int64_t reserve_bytes;
    int in_flight;
    int64_t memory_bytes; /* M */
    double recompute_ms;  /* R */
    double stage_ms;      /* T */
};

/* Choices a layer has: keep, full and its options. */
int cost_choice_count(const struct layer_cost *c);
/* One layer's (kept, transient, recompute ms) for `choice` < cost_choice_count(c). */
void cost_choice(const struct layer_cost *c, int choice, int64_t *kept, int64_t *transient,
                 double *recompute_ms);
/* The choice's name: "keep", "full" or the option's. */
const char *cost_choice_name(const struct layer_cost *c, int choice);

/* `recompute` has n choices (NULL: every layer kept). */
void cost_stage(const struct layer_cost *layers, int n, const unsigned char *recompute,
                int in_flight, int64_t reserve_bytes, struct stage_cost *out);

#endif
