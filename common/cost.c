#include "cost.h"

#include <stdint.h>

/* Inputs are at most 2^53 each, but sums over many layers times the in-flight count can pass
 * 2^63 in a hostile file: sum in 128 bits and saturate rather than wrap. */
static int64_t saturate(__int128 v)
{
    return v > INT64_MAX ? INT64_MAX : (int64_t)v;
}

void cost_stage(const struct layer_cost *layers, int n, const unsigned char *recompute,
                int in_flight, int64_t reserve_bytes, struct stage_cost *out)
{
    *out = (struct stage_cost){.reserve_bytes = reserve_bytes, .in_flight = in_flight};
    __int128 state = 0, kept = 0;
    double compute_ms = 0;
    for (int l = 0; l < n; l++) {
        const struct layer_cost *c = &layers[l];
        int r = recompute != NULL && recompute[l];
        state += c->state_bytes;
        kept += r ? c->ckpt_bytes : c->act_bytes;
        if (r && c->act_bytes - c->ckpt_bytes > out->transient_bytes)
            out->transient_bytes = c->act_bytes - c->ckpt_bytes;
        if (c->workspace_bytes > out->workspace_bytes)
            out->workspace_bytes = c->workspace_bytes;
        compute_ms += c->fwd_ms + c->bwd_ms;
        if (r)
            out->recompute_ms += c->fwd_ms;
    }
    out->state_bytes = saturate(state);
    out->kept_bytes = saturate(kept);
    out->memory_bytes = saturate(state + (__int128)in_flight * kept + out->transient_bytes +
                                 out->workspace_bytes + reserve_bytes);
    out->stage_ms = compute_ms + out->recompute_ms;
}
