/* `ballast plan`: per-stage recomputation plans for a cluster (docs/cost-model.md, "Methods"). */
#ifndef BALLAST_PLANNER_H
#define BALLAST_PLANNER_H

#include <stdio.h>

#include "cluster.h"
#include "devices.h"
#include "err.h"
#include "plan.h"

struct arena_options;
struct framework;
struct fw_candidate;
struct repart_cache;

enum plan_method {
    METHOD_NONE,        /* nothing recomputed */
    METHOD_FULL,        /* every layer recomputed */
    METHOD_BLOCK,       /* the first N layers of every stage (Megatron's block method) */
    METHOD_UNIFORM_MIN, /* the least single N that makes every stage fit */
    METHOD_PATENT,      /* the published load-aware method */
    METHOD_OPTIMAL,     /* least iteration time (fixed partition: each stage's least recompute,
                           choosing among the layers' recompute options too) */
};

#define PLAN_UNIT_DEFAULT ((int64_t)1 << 20)
#define PLAN_TIME_UNIT_DEFAULT_MS 1e-3
#define PLAN_SEARCH_NODES_DEFAULT 10000
#define PLAN_SEARCH_GAP_DEFAULT 0.005
/* `ballast plan --repartition`'s --time-limit when none is given: twice the 5 s the search
 * takes at most on 128 stages (bench/results/plan_speed.md), so only an unusual cluster (16384
 * micro-batches took 22.5 s) stops there, with its certified gap. */
#define PLAN_REPARTITION_TIME_LIMIT_DEFAULT_S 10.0
#define PLAN_MIN_GAIN_DEFAULT 0.005

/* --actions: the levers the planner may pull (docs/commands.md, "ballast plan"). */
/* PLAN_ACTION_OPTIMIZER_FRACTION: a stage may host the optimizer of its last layers only (a
 * fraction, cost.h); PLAN_ACTION_WEIGHTS: a stage's last layers may stream their weights from
 * host memory (cost.h "Streamed weights"); each comes with PLAN_ACTION_OPTIMIZER, the whole
 * stage's. */
enum plan_action {
    PLAN_ACTION_RECOMPUTE = 1,
    PLAN_ACTION_OFFLOAD = 2,
    PLAN_ACTION_OPTIMIZER = 4,
    PLAN_ACTION_OPTIMIZER_FRACTION = 8,
    PLAN_ACTION_WEIGHTS = 16,
};

/* Makes the estimated profile of model m on device d from the datasheets (the profiler's
 * estimate, estimate_profile in models/estimate.h). */
typedef int (*plan_estimate_fn)(const struct device_table *t, const struct device_spec *d,
                                const struct model *m, struct profile *out, struct err *e);

/* Turns an estimated profile of model m on device d into what `framework` keeps
 * (estimate_for_framework in models/estimate.h). */
typedef int (*plan_estimate_for_fn)(const struct device_table *t, const struct device_spec *d,
                                    const struct model *m, const char *framework,
                                    struct profile *p, struct err *e);

struct plan_options {
    enum plan_method method;
    int actions;         /* PLAN_ACTION_* bits; default recompute */
    int block_n;         /* METHOD_BLOCK */
    double reduce;       /* METHOD_PATENT: 0 = off, else 0 < d <= 1 */
    int verify;          /* cross-check with GLPK */
    int64_t unit_bytes;  /* knapsack memory unit */
    double time_unit_ms; /* balancing time unit */
    int repartition;     /* METHOD_OPTIMAL: also choose the split and the device order */
    int whole_layers;    /* METHOD_OPTIMAL: ignore the profiles' recompute options */
    long search_nodes;   /* repartition: branch-and-bound node budget */
    double time_limit_s; /* repartition: stop the search after this long (0: no limit) */
    double search_gap;   /* repartition: leave a node whose bound is within this fraction of the
                            best plan (the certified gap then stays under it; 0: exact) */
    double cutoff_ms;    /* repartition: an incumbent without a plan (0 or INFINITY: none; the
                            pool search's best step so far). Nothing faster: ERR_NOFIT with
                            the plan's `search` set (lower_bound finite; INFINITY: nothing
                            fits), the rest of the plan empty */
    /* --micro-batches auto and a pool's "micro_batch_sizes": how an estimated profile is made
     * again for another micro-batch size. The caller's (the CLI passes estimate_profile), so
     * that the planner calls no profiler; NULL: such a profile is refused at another size. */
    plan_estimate_fn estimate;
    /* --arena: stages fit on their arena laid out by this (arena_fit.h); NULL: the slots
     * carving */
    const struct arena_options *arena;
    /* --schedule (-1: the cluster's "schedule"), --schedule auto (or the cluster's "auto"):
     * the schedule (and interleaved's v) with the least simulated step, and
     * --virtual-stages (0: the cluster's "virtual_stages", else 2 for interleaved; with auto,
     * interleaved is tried with this v only) */
    int schedule;
    int schedule_auto;
    int virtual_stages;
    /* optimal (--min-gain): an optional action (offload, the host optimizer, a partial
     * recompute, an uneven split) is taken only where it shortens the step by at least this
     * share of it: of the plans within that margin of the fastest, the simplest (choice.h).
     * 0: the fastest (ties within floating-point noise go to the device, as every search's). */
    double min_gain;
    /* The step min_gain is measured from where a faster plan was found before this one was
     * planned (--repartition's fastest split, for the plan of the split it chose); 0: the
     * plan's own fastest. */
    double gain_from_ms;
    /* --for: the framework the plan is for (planner/methods/framework.h): only what it can run is
     * searched, on its activation model (plan_for.c); NULL: Ballast's own */
    const struct framework *framework;
    /* how an estimated profile becomes the framework's activation model (the CLI passes
     * estimate_for_framework); NULL: only profiles made --for it are taken */
    plan_estimate_for_fn estimate_for;
    /* the repartition search's per-range costs from one setting of the framework (plan_for.c
     * sets it while it searches); NULL: the knapsack */
    const struct fw_candidate *framework_range;
    /* the repartition search's per-range costs kept across searches (repartition.h; the
     * pool searches plan many clusters of the same kinds); NULL: each search its own */
    struct repart_cache *range_cache;
};

void plan_options_default(struct plan_options *o);
/* "recompute", "offload", "optimizer", "optimizer-fraction" (which takes "optimizer" with
 * it), comma-separated, into o->actions. */
int plan_actions_parse(const char *text, struct plan_options *o, struct err *e);
/* "none", "full", "block:N", "uniform-min", "patent", "optimal". */
int plan_method_parse(const char *text, struct plan_options *o, struct err *e);
const char *plan_method_name(const struct plan_options *o, char buf[PLAN_METHOD_MAX]);
/* ERR_INPUT, saying which, for options out of range or that do not apply to the method
 * (--repartition, --whole-layers, --reduce, --verify, --min-gain). planner_make checks them
 * too. */
int plan_options_check(const struct plan_options *o, struct err *e);

/* Makes the plan. ERR_NOFIT with the numbers of every stage that cannot fit; `out` is then
 * freed. With verify, out->verify holds both objectives (agree may be false: the caller
 * decides). */
int planner_make(const struct cluster *c, const struct plan_options *o, struct plan *out,
                 struct err *e);

/* Every stage's costs (memory on the slots carving), the bottleneck and the simulated
 * iteration time, from the stages' actions: what planner_make ends with, and what a plan
 * whose actions changed afterwards (arena_plan's offloads) needs again. */
int planner_finish(struct plan *p, struct err *e);

/* The schedules --schedule auto tries, in order (ties go to the earlier): 1f1b, gpipe,
 * zb-h1, v-half, interleaved with v = 2, 3, 4 (only `virtual_stages` when given). */
#define PLAN_SCHEDULES_MAX 8
int planner_schedule_candidates(int virtual_stages, struct schedule_shape out[PLAN_SCHEDULES_MAX]);

/* The table a person reads: per stage device, layers, memory before -> after against the
 * limit, recomputed layers, recompute and stage ms; bottleneck and most loaded stage. */
void planner_print(FILE *f, const struct plan *p);
/* Its offload part (report_offload.c): per offloaded tensor its bytes, copy time, free time
 * (the forward-to-backward window its copies hide in) and why it beat recomputing. */
void planner_print_offload(FILE *f, const struct plan *p);

/* The plan framework o->framework runs with settings `fs` (framework.h) on the cluster's split:
 * its profiles made the framework's activation model, the settings applied, costed and
 * simulated, fitting or not (a stage that does not fit keeps its memory_bytes above its
 * memory_limit_bytes): `ballast check`'s plan of a user's configuration. ERR_INPUT when the
 * framework cannot say the settings on that split, or run them on a stage's device. */
struct fw_settings;
int planner_make_settings(const struct cluster *c, const struct plan_options *o,
                          const struct fw_settings *fs, struct plan *out, struct err *e);

/* --micro-batches auto: `global_batch` G is a step's samples across the dp replicas (the
 * stages' dp); the micro-batch size b dividing G / dp (and M = G / (dp b)) whose plan has the
 * least simulated iteration time; each candidate is summarised on `report` (NULL: silent).
 * ERR_INPUT when dp does not divide G. */
int planner_make_auto(const struct cluster *c, const struct plan_options *o, int global_batch,
                      FILE *report, struct plan *out, struct err *e);

#endif
