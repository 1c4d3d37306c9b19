/* The per-stage recomputation problem on integer memory units, and its exact 0-1 knapsack DP.
 *
 * A stage's memory (cost.h) splits into a part no choice changes,
 *   fixed = sum state + v * sum ckpt + max workspace + reserve,
 * and, per layer, what keeping its activations adds, v * (act - ckpt), plus the transient of
 * recomputing it, max over recomputed layers of (act - ckpt). In units of `unit` bytes, each
 * rounded up so memory is never under-estimated:
 *   w_l = ceil(v * (act_l - ckpt_l) / unit)      keeping l
 *   t_l = ceil((act_l - ckpt_l) / unit)          l's transient if recomputed
 *   cap = floor((limit - fixed) / unit)
 * a choice fits when sum over kept w_l + max over recomputed t_l <= cap. A weight above cap can
 * never be part of a choice that fits, so knap_build stores min(w_l, cap + 1) and
 * min(t_l, cap + 1) (and cap = -1 when nothing can fit): every choice fits exactly when it
 * does with the true weights, with the same units, and no sum can overflow.
 *
 * The transient is not a knapsack item: the DP enumerates its value tau (0 or some t_l);
 * layers with t_l > tau must be kept, the rest form a plain knapsack of capacity cap - tau.
 * Every choice is found at tau = its own transient, so the best over all tau is exact. With
 * the layers sorted by t_l, the optional layers of each tau are a prefix of that order, so one
 * pass of the DP over the sorted layers serves every tau.
 *
 * Multiple choice (knap_build_options). A layer with recompute options (profile.h) has more
 * choices than keep (w_l, transient 0) and full (0, t_l): option k keeps
 *   w = ceil(v * (kept_k - ckpt_l) / unit)  and has the transient  t = ceil(transient_k / unit),
 * clamped to cap + 1 like the rest; a choice fits when the sum of its layers' w plus the
 * largest t is at most cap. Recomputing every layer whole still needs the fewest units (an
 * option keeps v (kept - ckpt) >= what it takes off the transient), so the quick refusal
 * stands. Thresholds no longer make the optional choices a prefix of one order, so the DP keeps
 * the largest transient in its state instead: layer by layer, the states (kept units, largest
 * transient, recompute time) that no other state matches or beats in all three, since every
 * completion of a beaten state is beaten by the same completion of the other. One pass is
 * exact, and the states stay few when the layers cost alike (the blocks of a model do). */
#ifndef BALLAST_KNAPSACK_H
#define BALLAST_KNAPSACK_H

#include <stdint.h>

#include "err.h"
#include "profile.h"

/* Largest DP table before the DP refuses (ask for a coarser unit), in bits: a bit per layer
 * and column to reconstruct the choice, plus a 64-bit value per column: (rows + 64) x columns.
 * 2^28 bits is 32 MiB. */
#define KNAP_CELLS_MAX ((int64_t)1 << 28)

/* Most states the multiple-choice DP keeps over all layers (5 bytes each, to reconstruct the
 * choice), and most candidates it weighs at one layer (32 bytes each), before it refuses (ask
 * for a coarser unit): 10 and 64 MiB. */
#define KNAP_STATES_MAX ((int64_t)1 << 21)

/* One choice of a layer in units: kept w, transient t, recompute time. */
struct knap_choice {
    int64_t w, t;
    double ms;
};

struct knap_problem {
    int n;
    int64_t cap;       /* -1: nothing fits */
    int64_t *w;        /* n, units kept (at most cap + 1) */
    int64_t *t;        /* n, units of transient (at most cap + 1) */
    const double *fwd; /* n, recompute cost of each layer (ms) */
    int64_t fixed_bytes; /* saturates at INT64_MAX */
    int64_t limit_bytes;
    int64_t unit_bytes;
    int multi;           /* some layer has more choices than keep and full */
    int *first_choice;   /* n + 1: layer l's choices, in cost.h's order, are choices[first_choice[l]
                            .. first_choice[l + 1] - 1] */
    struct knap_choice *choices;
};

/* Whole layers only (keep or full), whatever options the layers have. */
int knap_build(struct knap_problem *p, const struct layer_cost *layers, int n, int in_flight,
               int64_t reserve_bytes, int64_t limit_bytes, int64_t unit_bytes, struct err *e);
/* Every choice of cost.h: keep, full and the layers' options (which must hold profile.h's
 * rules: ckpt <= kept, kept + transient = act). */
int knap_build_options(struct knap_problem *p, const struct layer_cost *layers, int n,
                       int in_flight, int64_t reserve_bytes, int64_t limit_bytes,
                       int64_t unit_bytes, struct err *e);
/* A GPU holding several model chunks: its chunks' layers in one problem, layer l of chunk
 * chunk[l] with in_flight[l] micro-batches in flight, one transient for all and a workspace
 * each (cost_chunks_memory); options: knap_build_options' choices, else keep and full. */
int knap_build_each(struct knap_problem *p, const struct layer_cost *layers, int n,
                    const int *in_flight, const int *chunk, int64_t reserve_bytes,
                    int64_t limit_bytes, int64_t unit_bytes, int options, struct err *e);
/* The same from the layers' choices as cost rows (cost.h): layer l's are rows[first_row[l]
 * .. first_row[l + 1] - 1], in choice order from keep (keep and full at least), each counted
 * as v * (kept - ckpt) units kept and its transient; the per-stage problem's menu
 * (planner/methods/problem.h) builds it this way. */
struct cost_row;
int knap_build_rows(struct knap_problem *p, const struct layer_cost *layers, int n,
                    const struct cost_row *rows, const int *first_row, const int *in_flight,
                    const int *chunk, int64_t reserve_bytes, int64_t limit_bytes,
                    int64_t unit_bytes, struct err *e);
void knap_free(struct knap_problem *p);

/* Memory units of a choice: sum of w + max t over the layers' choices (recompute: n choices of
 * cost.h; 0/1 flags for keep/full); exact for a choice that fits, above cap for one that does
 * not. */
int64_t knap_units(const struct knap_problem *p, const unsigned char *recompute);
double knap_recompute_ms(const struct knap_problem *p, const unsigned char *recompute);
/* Recompute time in integer units of `time_unit_ms`, as the balancing DP counts it. */
int64_t knap_time_units(const struct knap_problem *p, int layer, double time_unit_ms);

/* Stages of at most this many layers may be solved by trying every subset (when that is
 * cheaper than the table). */
#define KNAP_SUBSETS_MAX 16

/* Least recompute time such that the stage fits, ties by least memory units: one choice per
 * layer (cost.h; only keep and full unless the problem has options). ERR_NOFIT (with no
 * message) when even recomputing everything does not fit; ERR_INPUT when the table would pass
 * KNAP_CELLS_MAX (the states KNAP_STATES_MAX). */
int knap_min_recompute(const struct knap_problem *p, unsigned char *recompute, struct err *e);
/* A floor under knap_min_recompute's time, from the problem's linear relaxation: each layer's
 * choices mixed by fractions along their lower hull of units kept against time, the transient
 * at the least any choice of a layer has. Never above the exact time (INFINITY only when
 * nothing fits); far cheaper, so a search can skip what even the floor rules out. */
double knap_recompute_floor(const struct knap_problem *p);
/* The multiple-choice DP, which knap_min_recompute uses when the problem has options. */
int knap_min_recompute_mc(const struct knap_problem *p, unsigned char *recompute,
                          struct err *e);
/* The two ways knap_min_recompute solves a stage, exposed so the tests hold them to the same
 * answers: the DP table, and every subset (n <= KNAP_SUBSETS_MAX). */
int knap_min_recompute_dp(const struct knap_problem *p, unsigned char *recompute, struct err *e);
int knap_min_recompute_subsets(const struct knap_problem *p, unsigned char *recompute);

/* The time unit the balancing DP uses for this stage: `wanted_ms`, coarsened if the DP table
 * would otherwise pass KNAP_CELLS_MAX. */
double knap_balance_time_unit(const struct knap_problem *p, double wanted_ms);
/* Recompute time closest to `target_units` (both in units of time_unit_ms), such that the
 * stage fits; ties by least memory units; whole layers only (options are not considered).
 * ERR_NOFIT when nothing fits. *distance gets |units - target_units|. */
int knap_balance(const struct knap_problem *p, int64_t target_units, double time_unit_ms,
                 unsigned char *recompute, int64_t *distance, struct err *e);

#endif
