/* The plan file (ballast-plan/1): per stage its layers, the layers it recomputes (`recompute`:
 * whole layers; `recompute_options`: [{"layer", "option"}], layers recomputed with one of
 * their profile's partial options) and the cost model's memory and time for that choice. A
 * plan carries each stage's layer costs and links, so the simulator and the runtime need
 * nothing else. */
#ifndef BALLAST_PLAN_H
#define BALLAST_PLAN_H

#include <stdint.h>

#include "arena.h"
#include "cluster.h"
#include "cost.h"
#include "err.h"
#include "profile.h"

#define PLAN_METHOD_MAX 32

struct plan_stage {
    int index;
    int gpu; /* the pipeline rank that runs it (schedule.h): index unless a GPU holds chunks */
    char device[PROFILE_NAME_MAX];
    char device_kind[8];      /* "cpu" or "cuda", from the stage's profile; always */
    int first, last;          /* global layer indices, inclusive */
    /* owned, per layer of the stage: what it does with its memory (cost.h), written in the
     * file as "recompute", "recompute_options", "offload", "offload_options", "prefetch" */
    struct layer_action *actions;
    struct layer_cost *layers; /* owned, the stage's layer costs */
    int in_flight;
    int64_t capacity_bytes;      /* the stage's memory_bytes in the cluster */
    int64_t memory_limit_bytes;  /* what the plan must fit in (<= capacity) */
    int64_t memory_before_bytes; /* M with nothing recomputed */
    int64_t memory_bytes;        /* M for the chosen recompute set */
    double recompute_ms;         /* R per micro-batch */
    double stage_ms;             /* T per micro-batch */
    struct link link;            /* to the next stage */
    struct arena *arena;         /* owned; NULL: the slots carving of cost.h */
    /* Offloading (docs/cost-model.md "Offload"), of what the actions send to the host. */
    int64_t host_memory_bytes;   /* H */
    int64_t host_limit_bytes;    /* the cluster stage's host_memory_bytes; 0: no offload */
    int64_t staging_bytes;       /* in memory_bytes */
    double copy_ms;              /* per micro-batch, each way */
    struct link host_link;
    /* Where the stage's optimizer state lives and steps (docs/cost-model.md "The optimizer on the host"): COST_PLACE_DEVICE, or
     * COST_PLACE_HOST for a host mirror updated on the CPU: of the stage's layers from
     * optimizer_from on (relative to first; 0: all of them, a fraction of the optimizer
     * otherwise, cost.h). */
    enum cost_place optimizer;
    int optimizer_from;
    /* Tensor and data parallelism (cost.h cost_group): `layers` are the costs on each of the
     * stage's tp GPUs; the stage is replicated dp times and all-reduces allreduce_bytes of
     * gradients per GPU over dp_link after its last backward; shard_optimizer: the cluster's
     * (ZeRO-1, each replica keeps 1/dp of the optimizer state; written only with dp > 1). */
    int tp, dp;
    int shard_optimizer;
    int64_t allreduce_bytes;
    struct link dp_link;
    /* the reduction's bucket (planner/sim/sim.h): the cluster's "dp_bucket_bytes"; 0, and in a
     * plan without it: one reduction of everything after the last backward */
    int64_t dp_bucket_bytes;
};

struct plan_verify {
    int present;
    double milp_objective;
    double dp_objective;
    int agree;
};

/* What --repartition searched. */
struct plan_search {
    int present;
    int orders;         /* device-kind orders */
    long nodes;         /* branch-and-bound nodes */
    long splits;        /* splits simulated */
    int exhausted;      /* 1: searched to the end, the plan is optimal */
    double lower_bound; /* certified: no split and order is faster (ms) */
    double search_bound; /* the branch and bound's own (lower_bound may be tighter; not saved) */
    double fastest_ms;   /* the fastest split found, recompute only (not saved): the split
                            returned may be a simpler one (--min-gain) */
};

/* One schedule --schedule auto planned ("schedules_tried"). */
#define PLAN_TRIES_MAX 8
struct plan_try {
    enum schedule schedule;
    int virtual_stages;
    double iteration_ms; /* -1: no plan fits with it; -2: the cluster or options rule it out */
};

/* What a plan is for and what its layer costs assume ("framework" in the file; absent: Ballast's
 * own runtime with the model's attention kernel). */
#define PLAN_FRAMEWORK_MAX 16
struct plan_framework {
    char target[PLAN_FRAMEWORK_MAX];      /* planned for (--for): "ballast" or a framework */
    char activations[PLAN_FRAMEWORK_MAX]; /* whose activation model the layer costs are */
    enum model_attention attention;       /* the attention kernel they assume */
};

struct plan {
    char method[PLAN_METHOD_MAX];
    struct plan_framework framework;
    enum schedule schedule;
    /* model chunks a GPU holds (schedule.h): the stages are the n_stages / v GPUs' chunks,
     * virtual stages in model order, stage j on GPU `gpu` */
    int virtual_stages;
    int micro_batches;
    int bottleneck_stage;  /* largest stage_ms */
    int most_loaded_stage; /* largest memory_before / memory_limit */
    double iteration_ms;   /* simulated */
    int64_t reserve_bytes;
    int64_t unit_bytes; /* knapsack memory unit */
    struct model model;
    int n_stages;
    struct plan_stage *stages;
    struct plan_verify verify;
    double optimality_gap; /* < 0: not reported */
    struct plan_search search;
    /* Uneven data parallelism (issue 31): the micro-batches each of the stages' dp replicas
     * takes, dp of them (owned; NULL: every replica takes micro_batches). micro_batches is
     * their most: the step's costs and in-flight counts are that replica's. */
    int *replica_micro_batches;
    int n_tried; /* --schedule auto: what it planned (written, not read back) */
    struct plan_try tried[PLAN_TRIES_MAX];
    /* --min-gain (planner/methods/choice.h): the margin the plan was chosen with (0: the fastest),
     * and the fastest step found, when this plan is a simpler, slower one (0: not) */
    double min_gain, fastest_ms;
};

/* The stage's layers, first to last (an accessor every plan file uses: here, so that the
 * files of the plan's parts need not call back into plan.c). */
static inline int plan_stage_layer_count(const struct plan_stage *st)
{
    return st->last - st->first + 1;
}
/* The plan's pipeline: its schedule over n_stages / v GPUs of v chunks. */
struct schedule_shape plan_shape(const struct plan *p);
/* The stages (virtual stages) GPU `gpu` runs, chunk by chunk; returns their count. */
int plan_gpu_stages(const struct plan *p, int gpu, int stages[SCHEDULE_CHUNKS_MAX]);
/* Allocates the stages (zeroed) with their per-layer arrays for the given ranges. */
int plan_init(struct plan *p, int n_stages, const int *first, const int *last, struct err *e);
void plan_free(struct plan *p);

/* Recomputes a stage's memory, recompute and stage time from its layers and flags. With a GPU
 * holding several chunks, memory_bytes is the GPU's (cost_chunks_memory over its stages). */
void plan_stage_cost(const struct plan *p, const struct plan_stage *st, struct stage_cost *out);
/* The stage's numbers (memory, recompute, stage time, host memory, staging, copy time) written
 * from plan_stage_cost, after its actions changed. */
void plan_stage_recost(const struct plan *p, struct plan_stage *st);

/* The stage's actions as the cost model takes them, and layer l's action row. */
struct cost_actions plan_stage_actions(const struct plan_stage *st);
struct cost_row plan_stage_row(const struct plan_stage *st, int l);
/* The recompute choices of the stage's actions, as the solvers' choice vectors hold them:
 * copied out into choice[], or set from it (places and offloads unchanged). */
void plan_stage_choices(const struct plan_stage *st, unsigned char *choice);
void plan_stage_set_choices(struct plan_stage *st, const unsigned char *choice);
/* Whether any layer of the stage sends activations to the host (its optimizer aside). */
int plan_stage_offloads(const struct plan_stage *st);
/* Per micro-batch, each way: one copy per offloaded layer over the host link. */
double plan_stage_copy_ms(const struct plan_stage *st);
/* plan_offload.c: the stage's offload fields written into and read from its JSON object
 * ("offload", "offload_options", "prefetch", "host_memory_bytes", "host_limit_bytes",
 * "copy_ms", "host_link", "staging_bytes"), checked against the cost model once read. */
void plan_offload_to_json(const struct plan_stage *st, cJSON *so);
int plan_offload_from_json(const cJSON *so, const char *file, const char *path,
                           struct plan_stage *st, struct err *e);
/* The share of the stage's optimizer state on the host (0: device, 1: all on the host). */
double plan_stage_optimizer_fraction(const struct plan_stage *st);
/* A stage with its optimizer on the host needs every layer's state split (what stays on the
 * device): ERR_INPUT naming the first layer without it. */
int plan_optimizer_check(const char *file, const char *path, const struct plan_stage *st,
                         struct err *e);
/* plan_optimizer.c: the stage's "optimizer": "device" (also when absent), "host" (every
 * layer) or "split" (the layers of "optimizer_host_layers": [first, last], the stage's last
 * ones), and "optimizer_fraction" (written with the host; read, it must be the cost model's). */
void plan_optimizer_to_json(const struct plan_stage *st, cJSON *so);
int plan_optimizer_from_json(const cJSON *so, const char *file, const char *path,
                             struct plan_stage *st, struct err *e);
int plan_optimizer_fraction_check(const cJSON *so, const char *file, const char *path,
                                  const struct plan_stage *st, struct err *e);
int plan_offload_check(const struct stage_cost *c, const char *file, const char *path,
                       const struct plan_stage *st, struct err *e);
/* How many of the stage's last layers stream their weights (actions' weights on the host);
 * and the check of "offload_weights": those layers the stage's last, their optimizer on the
 * host, a 1f1b or gpipe stage alone on its GPU, no tp, dp, arena or fp16. */
int plan_stage_streams(const struct plan_stage *st);
int plan_stream_check(const struct plan *p, const struct plan_stage *st, const char *file,
                      const char *path, struct err *e);

/* plan_group.c: the stage's "tp", "dp", "allreduce_bytes", "dp_link" and "shard_optimizer"
 * (each written when above 1, or known for a grouped or replicated stage, or true; absent: 1,
 * 1, 0, none, false), and the plan's check that every stage has one dp. */
void plan_group_to_json(const struct plan_stage *st, cJSON *so);
int plan_group_from_json(const cJSON *so, const char *file, const char *path,
                         struct plan_stage *st, struct err *e);
int plan_group_check(const struct plan *p, const char *file, struct err *e);
/* "replica_micro_batches" (written only when the replicas differ): read and checked (one per
 * replica, each 1 to micro_batches, micro_batches the most of them). */
void plan_dealing_to_json(const struct plan *p, cJSON *o);
int plan_dealing_from_json(const cJSON *root, const char *file, struct plan *p, struct err *e);
/* The micro-batches a step takes, all replicas together. */
int64_t plan_batches(const struct plan *p);

cJSON *plan_to_json(const struct plan *p);
int plan_write(const char *file, const struct plan *p, struct err *e);
/* Reads and validates a plan: stages tile the model's layers, recompute indices inside their
 * stage, each layer listed once in recompute and recompute_options together, options named in
 * the layer's costs, and memory_bytes, recompute_ms and stage_ms agree with the cost model. */
int plan_load(const char *file, struct plan *p, struct err *e);
/* The same from a parsed object (a plan inside another file); `where` names it in messages
 * ("share.json: jobs[1].plan"). */
int plan_parse(const cJSON *root, const char *where, struct plan *p, struct err *e);

#endif
