/* The cost model of DESIGN.md, shared by the planner, the simulator, the runtime and the
 * tests. For a stage with layers l, in-flight micro-batches v and recompute flags r_l
 * (1 = recomputed, i.e. x_l = 0):
 *   memory  M = sum state_l + v * sum (r_l ? ckpt_l : act_l) + max_l r_l*(act_l - ckpt_l)
 *               + max_l workspace_l + reserve
 *   time    T = sum (fwd_l + bwd_l) + R,   recompute R = sum r_l * fwd_l   (per micro-batch) */
#ifndef BALLAST_COST_H
#define BALLAST_COST_H

#include <stdint.h>

#include "profile.h"

struct stage_cost {
    int64_t state_bytes;     /* sum state_l */
    int64_t kept_bytes;      /* per micro-batch: sum (r_l ? ckpt_l : act_l) */
    int64_t transient_bytes; /* max r_l * (act_l - ckpt_l) */
    int64_t workspace_bytes; /* max workspace_l */
    int64_t reserve_bytes;
    int in_flight;
    int64_t memory_bytes; /* M */
    double recompute_ms;  /* R */
    double stage_ms;      /* T */
};

/* `recompute` has n flags (NULL: nothing recomputed). */
void cost_stage(const struct layer_cost *layers, int n, const unsigned char *recompute,
                int in_flight, int64_t reserve_bytes, struct stage_cost *out);

#endif
