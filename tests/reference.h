/* An independent brute-force reference for the per-stage recomputation problem of
 * planner/solvers/knapsack.h, and random layer costs to feed it.
 *
 * The reference enumerates every subset of a stage's layers (bit l of a mask set = layer l
 * recomputed) and computes the integer memory units straight from the byte counts in 128-bit
 * arithmetic, as knapsack.h documents them, without going through knap_build:
 *   fixed = sum state + v * sum ckpt + max workspace + reserve
 *   units = sum over kept ceil(v * (act - ckpt) / unit)
 *           + max over recomputed ceil((act - ckpt) / unit)
 *   cap   = floor((limit - fixed) / unit)
 * A subset is feasible when units <= cap. */
#ifndef BALLAST_REFERENCE_H
#define BALLAST_REFERENCE_H

#include <stdint.h>

#include "plan.h"
#include "profile.h"
#include "testutil.h"

#define REF_LAYERS_MAX 16 /* brute force; the other functions take up to 64 layers */

struct ref_stage {
    int n;
    const struct layer_cost *layers;
    int in_flight;
    int64_t reserve_bytes;
    int64_t limit_bytes;
    int64_t unit_bytes;
};

__int128 ref_fixed_bytes(const struct ref_stage *s);
__int128 ref_cap(const struct ref_stage *s);
__int128 ref_units(const struct ref_stage *s, uint64_t mask);
double ref_recompute_ms(const struct ref_stage *s, uint64_t mask);
/* llround(fwd / time_unit), the balancing DP's time of one layer. */
int64_t ref_time_units(const struct layer_cost *c, double time_unit_ms);
/* Expands a mask into n flags. */
void ref_flags(uint64_t mask, int n, unsigned char *flags);
uint64_t ref_mask(const unsigned char *flags, int n);
/* A plan stage's recompute choices (plan_stage_choices; at most 64 layers) in `choice`,
 * returned; and whether two stages of the same layers take the same action on each. */
const unsigned char *ref_plan_choices(const struct plan_stage *st, unsigned char choice[64]);
int ref_same_actions(const struct plan_stage *a, const struct plan_stage *b);

/* Tolerance for "the same recompute time": sums of the same doubles in another order. */
#define REF_ATOL 1e-9
#define REF_RTOL 1e-9

struct ref_best {
    int feasible;       /* some subset fits in units */
    double recompute_ms; /* least recompute (min_recompute) */
    int64_t distance;    /* least |time units - target| (balance) */
    int64_t units;       /* least units among the subsets achieving the optimum */
};

/* Least recompute over the feasible subsets; among those within REF_ATOL + REF_RTOL * best,
 * the least units. */
void ref_min_recompute(const struct ref_stage *s, struct ref_best *out);
/* Least |sum of recomputed time units - target| over the feasible subsets; ties by least
 * units. */
void ref_balance(const struct ref_stage *s, int64_t target_units, double time_unit_ms,
                 struct ref_best *out);

/* Multiple choice: choice[l] numbers layer l's choices as cost.h does (0 keep, 1 the whole
 * layer, 2 + k its option k). Units, from the bytes: sum over layers of ceil(v * (kept -
 * ckpt) / unit) + max ceil(transient / unit), with keep = (act, 0) and whole = (ckpt,
 * act - ckpt). */
__int128 ref_choice_units(const struct ref_stage *s, const unsigned char *choice);
double ref_choice_ms(const struct ref_stage *s, const unsigned char *choice);
/* Least recompute over every combination of the layers' choices (at most REF_COMBOS_MAX),
 * ties by least units, like ref_min_recompute. */
#define REF_COMBOS_MAX (1 << 20)
void ref_min_recompute_choices(const struct ref_stage *s, struct ref_best *out);
/* Up to `most` random recompute options for a layer: kept anywhere from ckpt to act (both
 * ends included), times zero, integer (ties), below or above the layer's forward. */
void ref_random_options(struct test_rng *rng, int most, struct layer_cost *c);

/* Random layer costs in the scale of `unit` bytes: ordinary layers, layers with
 * ckpt == act, all-zero layers, layers with huge memory or time, integer-valued times (so
 * that ties happen). */
void ref_random_layers(struct test_rng *rng, int n, int64_t unit, struct layer_cost *out);
/* A limit around the interesting range for these layers: sometimes below what full
 * recomputation needs, sometimes above what keeping everything needs. */
int64_t ref_random_limit(struct test_rng *rng, const struct layer_cost *layers, int n,
                         int in_flight, int64_t reserve, int64_t unit);

#endif
