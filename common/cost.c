#include "cost.h"

#include <stdint.h>

/* Inputs are at most 2^53 each, but sums over many layers times the in-flight count can pass
 * 2^63 in a hostile file: sum in 128 bits and saturate rather than wrap. */
static int64_t saturate(__int128 v)
{
    return v > INT64_MAX ? INT64_MAX : (int64_t)v;
}

int cost_choice_count(const struct layer_cost *c)
{
    return COST_OPTION + c->n_options;
}

void cost_choice(const struct layer_cost *c, int choice, int64_t *kept, int64_t *transient,
                 double *recompute_ms)
{
    if (choice == COST_KEEP) {
        *kept = c->act_bytes;
        *transient = 0;
        *recompute_ms = 0;
    } else if (choice == COST_FULL) {
        *kept = c->ckpt_bytes;
        *transient = c->act_bytes - c->ckpt_bytes;
        *recompute_ms = c->fwd_ms;
    } else {
        const struct recompute_option *o = &c->options[choice - COST_OPTION];
        *kept = o->kept_bytes;
        *transient = o->transient_bytes;
        *recompute_ms = o->recompute_ms;
    }
}

const char *cost_choice_name(const struct layer_cost *c, int choice)
{
    return choice == COST_KEEP   ? "keep"
           : choice == COST_FULL ? "full"
                                 : c->options[choice - COST_OPTION].name;
}

void cost_stage(const struct layer_cost *layers, int n, const unsigned char *recompute,
                int in_flight, int64_t reserve_bytes, struct stage_cost *out)
{
    *out = (struct stage_cost){.reserve_bytes = reserve_bytes, .in_flight = in_flight};
    __int128 state = 0, kept = 0;
    double compute_ms = 0;
    for (int l = 0; l < n; l++) {
        const struct layer_cost *c = &layers[l];
        int64_t k, t;
        double r;
        cost_choice(c, recompute != NULL ? recompute[l] : COST_KEEP, &k, &t, &r);
        state += c->state_bytes;
        kept += k;
        if (t > out->transient_bytes)
            out->transient_bytes = t;
        if (c->workspace_bytes > out->workspace_bytes)
            out->workspace_bytes = c->workspace_bytes;
        compute_ms += c->fwd_ms + c->bwd_ms;
        out->recompute_ms += r;
    }
    out->state_bytes = saturate(state);
    out->kept_bytes = saturate(kept);
    out->memory_bytes = saturate(state + (__int128)in_flight * kept + out->transient_bytes +
                                 out->workspace_bytes + reserve_bytes);
    out->stage_ms = compute_ms + out->recompute_ms;
}
