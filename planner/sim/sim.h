/* Discrete-event simulation of one training step of a pipeline schedule.
 *
 * 1F1B as PipeDream-Flush / Megatron run it: stage s of S does min(S-s-1, M) warm-up
 * forwards, then one forward and one backward alternately, then the remaining backwards.
 * GPipe: all forwards, then all backwards (micro-batch 0 first). A recomputed layer's forward
 * runs right before its backward. Activations (forward) and their gradients (backward) of
 * `out_bytes` cross each stage boundary over its link; a link carries one transfer at a time
 * in each direction, in the order the sender produced them. A send is asynchronous, but its
 * buffer is one the sender's next op of the same direction takes again (the runtime's
 * workspace, runtime/exec.c), and the runtime waits for the send there: a forward's last layer
 * writes the output the previous forward's send reads (so that forward ends no sooner than
 * that send plus its last layer, out_fwd_ms), and a backward's first layer takes the
 * workspace the previous backward's input gradient is sent from (so it starts no sooner than
 * that send has ended).
 *
 * Data parallelism: a stage's replicas reduce its gradients over their dp_link in buckets
 * (sim_buckets; as PyTorch DDP and Megatron-LM do with overlap), one collective at a time in
 * backward order: a bucket starts once its layers' gradients are final, rest_ms (the plain
 * backward of the stage's layers below it) before the stage's last backward ends, and the
 * link is free; its layers' recompute is counted before the last backward's layers, so a
 * bucket is never ready earlier than it runs. The optimizer step follows the last bucket.
 *
 * Every operation starts as soon as its stage has finished the previous operation of its
 * program and its input has arrived, so the makespan is the longest path through a fixed
 * graph: it never decreases when any task gets longer. That is why each stage's least
 * recompute gives the least iteration time with a fixed partition.
 *
 * Offloading: a stage with `layers` runs each forward and backward layer by layer (its
 * layer-ops). A layer that sends bytes to the host copies them out on the stage's
 * device->host lane when its forward ends, and back on the host->device lane from its
 * prefetch trigger: the start of the layer-op `ahead` layer-ops before its backward in the
 * stage's order (a trigger before the step's first op fires at the step's start), once the
 * copy out has ended. Each lane carries one copy at a time, in the order the forwards made
 * them and the backwards need them. A backward layer waits for its prefetch (a stall); copies
 * never hold up forwards. Copies are tasks of the same graph, so the makespan still never
 * decreases when any task, copy included, gets longer.
 *
 * The optimizer step ends every stage's iteration (docs/offload.md). On the device it
 * takes `optimizer_ms` (the layers' sum) after the stage's last backward. On the host the
 * stage runs layer by layer and, as each hosted layer's last backward ends (last to first),
 * its gradients go down on the device->host lane (grad_ms), the host's AdamW runs on the
 * stage's host threads, one layer at a time in that order, as soon as they have landed
 * (update_ms), and its parameters go up on the host->device lane (param_ms), behind any
 * prefetch; the step, and the stage's iteration, ends when the last parameters have landed
 * (they must be there before the next iteration's first forward of that layer). With a
 * fraction of the optimizer on the host (host_from > 0) the device steps the other layers
 * after the last backward meanwhile, and the step ends when both have. All of these are tasks
 * of the same graph too.
 *
 * Streamed weights: a streamed layer's weights come in on the host->device lane from the
 * start of the layer-op before each of its forwards and backwards (the step's first from its
 * start), a backward's summed gradients with them (not for the layer's first backward of the
 * step, and not before its last backward's have gone out), and the layer-op waits for them (a
 * stall); its gradients go out on the device->host lane after each backward. Its host step
 * starts from its last gradients' landing and ends with its AdamW: its weights stay on the
 * host. */
#ifndef BALLAST_SIM_H
#define BALLAST_SIM_H

#include "cluster.h"
#include "err.h"
#include "plan.h"
#include "trace.h"

/* More stages x micro-batches than this is refused rather than allocated (the task list
 * takes 5 entries per cell). */
#define SIM_CELLS_MAX ((int64_t)1 << 22)

enum sim_kind {
    SIM_FORWARD,
    SIM_RECOMPUTE,
    SIM_BACKWARD,
    SIM_SEND_FORWARD,
    SIM_SEND_BACKWARD,
    SIM_COPY_OUT, /* device -> host, of the stage's `stage` */
    SIM_COPY_IN,  /* host -> device (a prefetch) */
    SIM_OPTIMIZER,   /* the device's optimizer step (micro: -1) */
    SIM_GRAD_COPY,   /* a layer's gradients device -> host (micro: the stage's layer index) */
    SIM_HOST_UPDATE, /* a layer's AdamW on the host (micro: the layer index) */
    SIM_PARAM_COPY,  /* a layer's parameters host -> device (micro: the layer index) */
    SIM_WEIGHT,      /* the weight-gradient pass of a split backward (schedule.h) */
    SIM_ALLREDUCE,   /* a bucket of gradients reduced over the replicas (micro: the bucket) */
};

/* One bucket of a stage's gradients (sim_buckets). */
struct sim_bucket {
    double allreduce_ms; /* cost_dp_allreduce_ms of its bytes */
    double rest_ms;      /* ready this long before the stage's last backward ends */
    int64_t bytes;
    int first, last;     /* its layers, indices in the stage (last >= first) */
};

/* One layer of a stage that offloads, per micro-batch. */
struct sim_layer {
    double fwd_ms, bwd_ms, recompute_ms;
    double copy_ms; /* each way; 0: the layer sends nothing to the host */
    int ahead;      /* the prefetch trigger, in layer-ops (>= 1 when copy_ms > 0) */
    /* with the stage's optimizer on the host: its gradients down, its AdamW on the host, its
     * parameters up */
    double grad_ms, update_ms, param_ms;
    /* streamed weights (cost.h): the weights' copy in, before each forward and backward, and
     * the gradients' each way around each backward (0: not streamed) */
    int stream;
    double stream_w_ms, stream_g_ms;
};

/* One stage's costs per micro-batch. */
struct sim_stage {
    double fwd_ms;
    double bwd_ms; /* the whole backward, or with a split one its input-gradient pass */
    double w_ms;   /* a split backward's weight-gradient pass (0 otherwise) */
    double recompute_ms;
    /* Data parallelism: the pipeline is one of dp identical replicas; once the stage's own
     * last backward has ended it all-reduces its gradients with its replicas for this long
     * (cost_dp_allreduce_ms), overlapping the other stages' drain. The step ends when every
     * stage's reduction has: iteration = max over stages of (last backward end + this). */
    double allreduce_ms;
    /* The same in buckets (n_buckets > 0: in place of allreduce_ms; the file's top comment) */
    int n_buckets;
    const struct sim_bucket *buckets;
    int64_t out_bytes; /* crosses to the next stage (and its gradient back) */
    double out_fwd_ms; /* its last layer's forward (0: not known; a forward then ends no sooner
                          than the previous forward's send) */
    struct link link;  /* to the next stage */
    int n_layers;      /* > 0: the stage offloads or hosts its optimizer: layer by layer */
    const struct sim_layer *layers; /* n_layers of them; their sums are fwd, bwd, recompute */
    double optimizer_ms; /* the device's optimizer step after the last backward */
    int host_optimizer;  /* 1: layers host_from.. step on the host (n_layers > 0), beside the
                            device's step of the others (optimizer_ms) */
    int host_from;
};

struct sim_task {
    /* compute: the stage that runs it; SIM_SEND_*: the boundary k, i.e. the link between
     * stages k and k+1 (forward sends go k -> k+1, backward sends k+1 -> k) */
    int stage;
    int micro;
    enum sim_kind kind;
    double start_ms;
    double end_ms;
};

struct sim_result {
    double iteration_ms;
    double bubble_fraction; /* idle share of S x iteration_ms */
    int n_stages;
    double *busy_ms; /* per stage: forward + recompute + backward (+ weight pass) */
    double *idle_ms; /* per stage: iteration_ms - busy_ms of its GPU's stages */
    double *copy_out_ms, *copy_in_ms; /* per stage: its host lanes' busy time */
    double *stall_ms;                 /* per stage: backwards waiting for a prefetch */
    double *update_ms; /* per stage: its optimizer's AdamW time (device, or host threads) */
    double *tail_ms;   /* per stage: from its last backward's end to its step's end */
    int n_tasks;
    struct sim_task *tasks; /* in the order they were simulated, not sorted by time */
};

/* Simulates one step. ERR_INPUT for S or M < 1, S x M above SIM_CELLS_MAX, or a time or
 * size that is negative or not finite; `out` holds nothing then. One chunk a GPU (n_stages
 * GPUs); sim_run_shape takes any pipeline of schedule.h, its stages its virtual stages in
 * model order (each stage's link is to the next virtual stage). Schedules other than 1F1B
 * and GPipe run pass by pass (sim_passes.c) and take no stage run layer by layer. */
int sim_run(enum schedule schedule, int n_stages, int micro_batches,
            const struct sim_stage *stages, struct sim_result *out, struct err *e);
int sim_run_shape(const struct schedule_shape *sh, const struct sim_stage *stages,
                  struct sim_result *out, struct err *e);
int sim_makespan_shape(const struct schedule_shape *sh, const struct sim_stage *stages,
                       double *iteration_ms, struct err *e);
/* The iteration time alone, the same as sim_run's but recording no tasks: for searches that
 * simulate many candidates. */
int sim_makespan(enum schedule schedule, int n_stages, int micro_batches,
                 const struct sim_stage *stages, double *iteration_ms, struct err *e);
/* The same iteration time at a cost independent of M where 1F1B's steady state repeats
 * exactly: it simulates M' micro-batches (about 3S + 8, doubled while under M / 2), finds
 * every stage's and link's times repeating with a period of at most 6 micro-batches, and
 * extrapolates to M (equal to sim_makespan's within rounding, ~1e-12 relative); otherwise
 * (GPipe, a stage run layer by layer, or no period found) it simulates all M.
 * *simulated gets the micro-batches simulated. */
int sim_makespan_periodic(enum schedule schedule, int n_stages, int micro_batches,
                          const struct sim_stage *stages, double *iteration_ms, int *simulated,
                          struct err *e);
/* One stage's per-micro-batch costs from a plan: its layers' fwd and bwd times (the weight
 * passes its actions defer apart), the forward time of its recomputed layers, its last
 * layer's out_bytes and its link; and its device optimizer step. */
void sim_stage_from_plan(const struct plan_stage *ps, struct sim_stage *out);
/* Layer y of a stage, cost c, streams its weights over host_link (its fetches' and gradients'
 * copies). */
void sim_layer_stream(struct sim_layer *y, const struct layer_cost *c,
                      const struct link *host_link);
/* Its layers when it offloads or hosts its optimizer (`layers` has room for the stage's
 * layer count); returns the count, 0 otherwise. */
int sim_layers_from_plan(const struct plan_stage *ps, struct sim_layer *layers);
/* The optimizer step of n layers at `optimizer`: on the device the sum of their optimizer_ms
 * into st->optimizer_ms; on the host each layer's grad_ms, update_ms and param_ms into
 * sl[l] (whose compute and copies the caller has filled) and st->host_optimizer, st->layers
 * and st->n_layers set. The one place the simulator's view of the step is made. */
void sim_stage_optimizer(const struct layer_cost *layers, int n, enum cost_place optimizer,
                         const struct link *host_link, struct sim_stage *st,
                         struct sim_layer *sl);
/* The same with the optimizer on the host for layers from `from` on only (cost.h), the others
 * stepping on the device: their optimizer_ms into st->optimizer_ms. With ZeRO-1 a layer's
 * host step moves its share (optimizer_shards) of the gradients and parameters. */
void sim_stage_optimizer_from(const struct layer_cost *layers, int n, enum cost_place optimizer,
                              int from, const struct link *host_link, struct sim_stage *st,
                              struct sim_layer *sl);
/* The buckets of a stage of n layers whose gradients of grad_bytes[l] bytes a replica reduce
 * over dp replicas on `link`, and whose layers' backwards take bwd_ms[l]: layers from the last
 * down (the order their gradients become final), a bucket closing once it holds at least
 * cap_bytes (0: one bucket of everything, reduced after the last backward). Into out (room
 * for n); returns the count (0 with dp 1 or no bytes). */
int sim_buckets(const int64_t *grad_bytes, const double *bwd_ms, int n, int64_t cap_bytes,
                const struct link *link, int dp, struct sim_bucket *out);
/* A plan stage's buckets (its allreduce_bytes over its layers in proportion to their
 * gradients, grad_bytes where the profile splits the state, else state_bytes); into out (room
 * for the stage's layers); returns the count. */
int sim_buckets_from_plan(const struct plan_stage *ps, struct sim_bucket *out);
/* Simulates a plan's stages with its recompute sets. */
int sim_plan(const struct plan *p, struct sim_result *out, struct err *e);
/* The same with each stage's gradient reduction taking allreduce_ms[s] after its last backward
 * instead of its own over its dp (replicas.c: pipelines reducing together). */
int sim_plan_reduced(const struct plan *p, const double *allreduce_ms, struct sim_result *out,
                     struct err *e);
/* Its iteration time alone (sim_makespan's), for searches that compare many plans. */
int sim_plan_ms(const struct plan *p, double *iteration_ms, struct err *e);
void sim_result_free(struct sim_result *r);
/* The pass-by-pass walk (sim_passes.c), which sim_run_shape uses: any schedule of
 * schedule.h, for these stages (virtual stages in model order; no stage run layer by layer).
 * out->iteration_ms, and the tasks, busy, update and tail times where out has arrays for them.
 * ERR_INPUT for a stage that offloads or hosts its optimizer. */
int sim_passes(const struct schedule_shape *sh, const struct sim_stage *stages,
               struct sim_result *out, struct err *e);

const char *sim_kind_name(enum sim_kind kind);

/* Per-stage totals over the step (ms): forward, recompute and backward compute, and the link
 * time of the stage's own sends (activations to s+1, gradients to s-1), and its copies to and
 * from the host. */
struct sim_stage_totals {
    double fwd_ms, recompute_ms, bwd_ms, w_ms, send_ms, copy_out_ms, copy_in_ms;
    double optimizer_ms;            /* the device's step */
    double grad_ms, update_ms, param_ms; /* the host's step: copies and AdamW */
    double allreduce_ms; /* its gradients' buckets over the replicas (the dp link's busy time) */
    int buckets;
};
void sim_stage_totals(const struct sim_result *r, int stage, struct sim_stage_totals *out);

/* The result file (ballast-simulation/1, see README): iteration_ms, bubble_fraction and per
 * stage index, device, busy_ms, idle_ms, fwd_ms, bwd_ms, recompute_ms, send_ms; and for a
 * stage that offloads copy_out_ms, copy_in_ms (its host lanes' busy time) and stall_ms. */
cJSON *sim_result_to_json(const struct plan *p, const struct sim_result *r);
/* A Chrome trace of the step: one track per stage ("stage 3 A100-80GB") with its forward,
 * recompute and backward slices named by micro-batch ("F 7", "R 7", "B 7"), and two tracks
 * per link (activations, gradients), two per stage that offloads (to host "O 7", from host
 * "P 7"), all in process `pid`. */
void sim_trace_add(struct trace *t, int pid, const struct plan *p, const struct sim_result *r);

#endif
