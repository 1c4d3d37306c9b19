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

struct cost_row cost_row(const struct layer_cost *c, int choice)
{
    struct cost_row r = {.choice = choice, .place = COST_PLACE_DEVICE};
    if (choice == COST_KEEP) {
        r.kept_bytes = c->act_bytes;
    } else if (choice == COST_FULL) {
        r.kept_bytes = c->ckpt_bytes;
        r.transient_bytes = c->act_bytes - c->ckpt_bytes;
        r.recompute_ms = c->fwd_ms;
    } else {
        const struct recompute_option *o = &c->options[choice - COST_OPTION];
        r.kept_bytes = o->kept_bytes;
        r.transient_bytes = o->transient_bytes;
        r.recompute_ms = o->recompute_ms;
    }
    return r;
}

int cost_rows(const struct layer_cost *c, struct cost_row rows[COST_ROWS_MAX])
{
    int n = cost_choice_count(c);
    for (int k = 0; k < n; k++)
        rows[k] = cost_row(c, k);
    return n;
}

void cost_choice(const struct layer_cost *c, int choice, int64_t *kept, int64_t *transient,
                 double *recompute_ms)
{
    struct cost_row r = cost_row(c, choice);
    *kept = r.kept_bytes;
    *transient = r.transient_bytes;
    *recompute_ms = r.recompute_ms;
}

const char *cost_choice_name(const struct layer_cost *c, int choice)
{
    return choice == COST_KEEP   ? "keep"
           : choice == COST_FULL ? "full"
                                 : c->options[choice - COST_OPTION].name;
}

void cost_sum_add(struct cost_sum *s, int64_t state_bytes, int64_t workspace_bytes,
                  double compute_ms, const struct cost_row *row)
{
    s->state += state_bytes;
    s->kept += row->kept_bytes;
    if (row->transient_bytes > s->transient)
        s->transient = row->transient_bytes;
    if (workspace_bytes > s->workspace)
        s->workspace = workspace_bytes;
    s->compute_ms += compute_ms;
    s->recompute_ms += row->recompute_ms;
}

int64_t cost_sum_memory(const struct cost_sum *s, int in_flight, int64_t reserve_bytes)
{
    return saturate(s->state + (__int128)in_flight * s->kept + s->transient + s->workspace +
                    reserve_bytes);
}

double cost_stage_ms(double compute_ms, double recompute_ms)
{
    return compute_ms + recompute_ms;
}

void cost_stage(const struct layer_cost *layers, int n, const unsigned char *recompute,
                int in_flight, int64_t reserve_bytes, struct stage_cost *out)
{
    struct cost_sum s = {0};
    for (int l = 0; l < n; l++) {
        const struct layer_cost *c = &layers[l];
        struct cost_row r = cost_row(c, recompute != NULL ? recompute[l] : COST_KEEP);
        cost_sum_add(&s, c->state_bytes, c->workspace_bytes, c->fwd_ms + c->bwd_ms, &r);
    }
    *out = (struct stage_cost){
        .state_bytes = saturate(s.state),
        .kept_bytes = saturate(s.kept),
        .transient_bytes = s.transient,
        .workspace_bytes = s.workspace,
        .reserve_bytes = reserve_bytes,
        .in_flight = in_flight,
        .optimizer = COST_PLACE_DEVICE,
        .memory_bytes = cost_sum_memory(&s, in_flight, reserve_bytes),
        .recompute_ms = s.recompute_ms,
        .stage_ms = cost_stage_ms(s.compute_ms, s.recompute_ms),
    };
}

int64_t cost_arena_bytes(const struct stage_cost *c)
{
    return saturate((__int128)c->in_flight * c->kept_bytes + c->transient_bytes +
                    c->workspace_bytes);
}

int64_t cost_memory_with_arena(const struct stage_cost *c, int64_t arena_bytes)
{
    return saturate((__int128)c->state_bytes + arena_bytes + c->reserve_bytes);
}

__int128 cost_fixed_bytes(const struct layer_cost *layers, int n, int in_flight,
                          int64_t reserve_bytes)
{
    __int128 fixed = reserve_bytes;
    int64_t workspace = 0;
    for (int l = 0; l < n; l++) {
        fixed += layers[l].state_bytes + (__int128)in_flight * layers[l].ckpt_bytes;
        if (layers[l].workspace_bytes > workspace)
            workspace = layers[l].workspace_bytes;
    }
    return fixed + workspace;
}

void cost_weights(const struct layer_cost *c, int choice, int in_flight, __int128 *kept_bytes,
                  int64_t *transient_bytes)
{
    struct cost_row r = cost_row(c, choice);
    *kept_bytes = (__int128)in_flight * (r.kept_bytes - c->ckpt_bytes);
    *transient_bytes = r.transient_bytes;
}

int64_t cost_saved_bytes(const struct layer_cost *c, int choice, int in_flight)
{
    return saturate((__int128)in_flight * (c->act_bytes - cost_row(c, choice).kept_bytes));
}
