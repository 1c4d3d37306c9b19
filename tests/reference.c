#include "reference.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static __int128 ceil_div(__int128 a, __int128 b)
{
    return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

static __int128 floor_div(__int128 a, __int128 b)
{
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

__int128 ref_fixed_bytes(const struct ref_stage *s)
{
    __int128 fixed = s->reserve_bytes, workspace = 0;
    for (int l = 0; l < s->n; l++) {
        fixed += s->layers[l].state_bytes + (__int128)s->in_flight * s->layers[l].ckpt_bytes;
        if (s->layers[l].workspace_bytes > workspace)
            workspace = s->layers[l].workspace_bytes;
    }
    return fixed + workspace;
}

__int128 ref_cap(const struct ref_stage *s)
{
    return floor_div((__int128)s->limit_bytes - ref_fixed_bytes(s), s->unit_bytes);
}

__int128 ref_units(const struct ref_stage *s, uint64_t mask)
{
    __int128 kept = 0, transient = 0;
    for (int l = 0; l < s->n; l++) {
        __int128 d = s->layers[l].act_bytes - s->layers[l].ckpt_bytes;
        if (mask >> l & 1) {
            __int128 t = ceil_div(d, s->unit_bytes);
            if (t > transient)
                transient = t;
        } else {
            kept += ceil_div(d * s->in_flight, s->unit_bytes);
        }
    }
    return kept + transient;
}

double ref_recompute_ms(const struct ref_stage *s, uint64_t mask)
{
    double r = 0;
    for (int l = 0; l < s->n; l++)
        if (mask >> l & 1)
            r += s->layers[l].fwd_ms;
    return r;
}

int64_t ref_time_units(const struct layer_cost *c, double time_unit_ms)
{
    return (int64_t)llround(c->fwd_ms / time_unit_ms);
}

void ref_flags(uint64_t mask, int n, unsigned char *flags)
{
    for (int l = 0; l < n; l++)
        flags[l] = mask >> l & 1;
}

uint64_t ref_mask(const unsigned char *flags, int n)
{
    uint64_t mask = 0;
    for (int l = 0; l < n; l++)
        if (flags[l])
            mask |= (uint64_t)1 << l;
    return mask;
}

const unsigned char *ref_plan_choices(const struct plan_stage *st, unsigned char choice[64])
{
    plan_stage_choices(st, choice);
    return choice;
}

int ref_same_actions(const struct plan_stage *a, const struct plan_stage *b)
{
    if (plan_stage_layer_count(a) != plan_stage_layer_count(b))
        return 0;
    for (int l = 0; l < plan_stage_layer_count(a); l++)
        if (!layer_action_equal(&a->actions[l], &b->actions[l]))
            return 0;
    return 1;
}

void ref_min_recompute(const struct ref_stage *s, struct ref_best *out)
{
    __int128 cap = ref_cap(s);
    uint64_t all = (uint64_t)1 << s->n;
    *out = (struct ref_best){0};
    for (uint64_t m = 0; m < all; m++) {
        if (ref_units(s, m) > cap)
            continue;
        double r = ref_recompute_ms(s, m);
        if (!out->feasible || r < out->recompute_ms)
            out->recompute_ms = r;
        out->feasible = 1;
    }
    if (!out->feasible)
        return;
    double tie = out->recompute_ms + REF_ATOL + REF_RTOL * fabs(out->recompute_ms);
    out->units = INT64_MAX;
    for (uint64_t m = 0; m < all; m++) {
        __int128 u = ref_units(s, m);
        if (u <= cap && ref_recompute_ms(s, m) <= tie && u < out->units)
            out->units = (int64_t)u;
    }
}

void ref_balance(const struct ref_stage *s, int64_t target_units, double time_unit_ms,
                 struct ref_best *out)
{
    __int128 cap = ref_cap(s);
    uint64_t all = (uint64_t)1 << s->n;
    *out = (struct ref_best){0};
    for (uint64_t m = 0; m < all; m++) {
        __int128 u = ref_units(s, m);
        if (u > cap)
            continue;
        int64_t q = 0;
        for (int l = 0; l < s->n; l++)
            if (m >> l & 1)
                q += ref_time_units(&s->layers[l], time_unit_ms);
        int64_t d = q > target_units ? q - target_units : target_units - q;
        if (!out->feasible || d < out->distance || (d == out->distance && u < out->units)) {
            out->distance = d;
            out->units = (int64_t)u;
        }
        out->feasible = 1;
    }
}

void ref_random_layers(struct test_rng *rng, int n, int64_t unit, struct layer_cost *out)
{
    for (int l = 0; l < n; l++) {
        struct layer_cost *c = &out[l];
        *c = (struct layer_cost){0};
        snprintf(c->name, sizeof c->name, "layer%d", l);
        int kind = (int)test_rng_int(rng, 0, 99);
        if (kind < 10)
            continue; /* costs nothing at all */
        c->state_bytes = test_rng_int(rng, 0, 1000) * unit + test_rng_int(rng, 0, unit - 1);
        c->ckpt_bytes = test_rng_int(rng, 0, 100) * unit + test_rng_int(rng, 0, unit - 1);
        c->workspace_bytes = test_rng_int(rng, 0, 50) * unit;
        c->out_bytes = test_rng_int(rng, 0, 10) * unit;
        int64_t d;
        if (kind < 20)
            d = 0; /* ckpt == act: recomputing saves nothing */
        else if (kind < 30)
            d = test_rng_int(rng, 1, unit); /* under one unit: rounding decides */
        else if (kind < 38)
            d = test_rng_int(rng, 500, 2000) * unit + test_rng_int(rng, 0, unit - 1); /* huge */
        else
            d = test_rng_int(rng, 0, 100) * unit + test_rng_int(rng, 0, unit - 1);
        c->act_bytes = c->ckpt_bytes + d;
        if (kind >= 38 && kind < 41)
            c->state_bytes = (int64_t)1 << 45; /* a huge fixed part */
        /* times: integer-valued (ties), zero, huge or arbitrary */
        int tk = (int)test_rng_int(rng, 0, 9);
        if (tk < 3)
            c->fwd_ms = (double)test_rng_int(rng, 0, 4);
        else if (tk < 4)
            c->fwd_ms = 0;
        else if (tk < 5)
            c->fwd_ms = test_rng_double(rng, 1e3, 1e5);
        else
            c->fwd_ms = test_rng_double(rng, 0, 5);
        c->bwd_ms = 2 * c->fwd_ms + test_rng_double(rng, 0, 1);
    }
}

int64_t ref_random_limit(struct test_rng *rng, const struct layer_cost *layers, int n,
                         int in_flight, int64_t reserve, int64_t unit)
{
    struct ref_stage s = {n, layers, in_flight, reserve, 0, unit};
    __int128 fixed = ref_fixed_bytes(&s);
    uint64_t all = n >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1;
    __int128 none = ref_units(&s, 0), full = ref_units(&s, all);
    __int128 x;
    int k = (int)test_rng_int(rng, 0, 9);
    if (k == 0)
        x = full - 1 - test_rng_int(rng, 0, 20); /* too little even for full recomputation */
    else if (k == 1)
        x = none + test_rng_int(rng, 0, 20); /* room for everything */
    else
        x = full + (__int128)((double)(none - full) * test_rng_double(rng, 0, 1));
    __int128 limit = fixed + x * unit + test_rng_int(rng, 0, unit - 1);
    if (limit < 1)
        limit = 1;
    if (limit > ((int64_t)1 << 53))
        limit = (int64_t)1 << 53;
    return (int64_t)limit;
}

/* kept - ckpt and the transient of one layer's choice, straight from the layer's fields */
static void choice_bytes(const struct layer_cost *c, int choice, __int128 *excess,
                         __int128 *transient)
{
    if (choice == 0) {
        *excess = c->act_bytes - c->ckpt_bytes;
        *transient = 0;
    } else if (choice == 1) {
        *excess = 0;
        *transient = c->act_bytes - c->ckpt_bytes;
    } else {
        *excess = c->options[choice - 2].kept_bytes - c->ckpt_bytes;
        *transient = c->options[choice - 2].transient_bytes;
    }
}

__int128 ref_choice_units(const struct ref_stage *s, const unsigned char *choice)
{
    __int128 kept = 0, transient = 0;
    for (int l = 0; l < s->n; l++) {
        __int128 x, t;
        choice_bytes(&s->layers[l], choice[l], &x, &t);
        kept += ceil_div(x * s->in_flight, s->unit_bytes);
        t = ceil_div(t, s->unit_bytes);
        transient = t > transient ? t : transient;
    }
    return kept + transient;
}

double ref_choice_ms(const struct ref_stage *s, const unsigned char *choice)
{
    double r = 0;
    for (int l = 0; l < s->n; l++) {
        const struct layer_cost *c = &s->layers[l];
        if (choice[l] == 1)
            r += c->fwd_ms;
        else if (choice[l] >= 2)
            r += c->options[choice[l] - 2].recompute_ms;
    }
    return r;
}

/* Steps `choice` to the next combination (mixed radix); 0 after the last. */
static int next_combination(const struct ref_stage *s, unsigned char *choice)
{
    for (int l = 0; l < s->n; l++) {
        if (choice[l] + 1 < 2 + s->layers[l].n_options) {
            choice[l]++;
            return 1;
        }
        choice[l] = 0;
    }
    return 0;
}

void ref_min_recompute_choices(const struct ref_stage *s, struct ref_best *out)
{
    __int128 cap = ref_cap(s);
    unsigned char choice[64] = {0};
    *out = (struct ref_best){0};
    do {
        if (ref_choice_units(s, choice) > cap)
            continue;
        double r = ref_choice_ms(s, choice);
        if (!out->feasible || r < out->recompute_ms)
            out->recompute_ms = r;
        out->feasible = 1;
    } while (next_combination(s, choice));
    if (!out->feasible)
        return;
    double tie = out->recompute_ms + REF_ATOL + REF_RTOL * fabs(out->recompute_ms);
    out->units = INT64_MAX;
    memset(choice, 0, sizeof choice);
    do {
        __int128 u = ref_choice_units(s, choice);
        if (u <= cap && ref_choice_ms(s, choice) <= tie && u < out->units)
            out->units = (int64_t)u;
    } while (next_combination(s, choice));
}

void ref_random_options(struct test_rng *rng, int most, struct layer_cost *c)
{
    int64_t d = c->act_bytes - c->ckpt_bytes;
    c->n_options = (int)test_rng_int(rng, 0, most);
    for (int k = 0; k < c->n_options; k++) {
        struct recompute_option *o = &c->options[k];
        snprintf(o->name, sizeof o->name, "opt%d", k);
        int kind = (int)test_rng_int(rng, 0, 9);
        int64_t kept = kind == 0 ? 0 : kind == 1 ? d : test_rng_int(rng, 0, d);
        o->kept_bytes = c->ckpt_bytes + kept;
        o->transient_bytes = c->act_bytes - o->kept_bytes;
        int tk = (int)test_rng_int(rng, 0, 9);
        if (tk < 3)
            o->recompute_ms = (double)test_rng_int(rng, 0, 4);
        else if (tk < 4)
            o->recompute_ms = 0;
        else
            o->recompute_ms = test_rng_double(rng, 0, 1.2 * c->fwd_ms + 1);
    }
}
