/* One pipeline stage: its arenas, its layers, and the executor (exec.h) that runs one
 * training step of it, with the data set and the transport as its port: stage 0 draws each
 * micro-batch's tokens, the others post the receipt of a micro-batch's activation as soon as
 * its slot is free (up to in_flight ahead); outputs and gradients go to the neighbours without
 * waiting. After the schedule's operations, one AdamW step over the stage's parameters. */
#ifndef BALLAST_STAGE_H
#define BALLAST_STAGE_H

#include <stdint.h>

#include "arena_run.h"
#include "backend.h"
#include "cluster.h"
#include "data.h"
#include "exec.h"
#include "hostmirror.h"
#include "layout.h"
#include "lossscale.h"
#include "plan.h"
#include "transport.h"

struct stage_runner;

struct stage_config {
    const struct model *model;
    int stage, n_stages, micro_batches; /* stage: the pipeline rank (GPU) of n_stages */
    enum schedule schedule;
    int first, last;
    /* per layer of the stage (of all its chunks, in order): where its tensors go, from its
     * action (layout_place_of); NULL: every layer keeps everything on the device */
    const struct layout_place *place;
    int in_flight;
    /* The model chunks this rank holds (schedule.h): n_chunks 0 is one, first..last as
     * virtual stage `stage` with in_flight; several, each its layers, virtual stage and
     * in-flight count. */
    int n_chunks;
    struct layout_chunk_spec chunks[SCHEDULE_CHUNKS_MAX];
    struct adamw_params adamw;
    int64_t limit_bytes, reserve_bytes; /* the arenas must fit limit - reserve */
    const struct arena *arena; /* the plan's reuse layout of the activations; NULL: slots */
    const char *arena_where;   /* where it is, for stage_init's messages ("plan.json:
                                  stages[2].arena"); NULL: "arena" */
    int check_arena;           /* arena_run.h's overlap check */
    int record_events;
    /* Time-shared jobs (train_share.c): the stage's persistent arena at `persistent`, and its
     * activations, transient and workspace carved in that order from `temporary`, both the
     * caller's memory of the given sizes (ERR_NOFIT, with the numbers, when the stage needs
     * more). NULL: the stage allocates its own. */
    char *persistent, *temporary;
    int64_t persistent_bytes, temporary_bytes;
    int prefetch_depth;       /* how far a late prefetch may move; 0: the places' furthest */
    int64_t host_limit_bytes; /* the stage's host_memory_bytes (0: none) */
    enum cost_place optimizer; /* COST_PLACE_HOST: AdamW on the host (hostmirror.h) */
    int optimizer_from;        /* ... of the layers from this one on (0: all; cost.h) */
    /* the stage's last this many layers stream their weights and gradients from host memory
     * (layout.h; 0: none): their optimizer on the host, no loss scaling, no replicas */
    int stream_layers;
    int host_threads;          /* the host optimizer's threads (0: one) */
    double host_link_gbps, host_link_latency_us; /* the link emulated on CPU; 0: none */
    /* Called after the step's last backward, before the optimizer (data parallelism: the
     * replicas' gradients reduced into this stage's; a host optimizer's updates then start,
     * layer by layer, rather than at each layer's last backward); NULL: none. */
    int (*reduce_grads)(void *ctx, struct stage_runner *r, struct err *e);
    void *reduce_ctx;
    /* Called as layer li's gradients become final (its last backward of the step; ctx
     * reduce_ctx): the replicas' reduction may start on them (train_dp.h's buckets); NULL:
     * none. */
    int (*layer_grads)(void *ctx, struct stage_runner *r, int li, struct err *e);
    /* ZeRO-1 (shards > 1, the optimizer on the device): this replica keeps the optimizer's
     * state of slice `shard` of `shards` (layout_shard_range) and updates only its weights;
     * gather_params (ctx reduce_ctx), called after the update, brings every other slice's
     * updated weights from their replicas. */
    int shard, shards;
    int (*gather_params)(void *ctx, struct stage_runner *r, struct err *e);
    /* fp16's dynamic loss scaling (lossscale.h); NULL: none (fp32, bf16). */
    const struct lossscale_config *loss_scale;
    /* After the step's last backward and the gradients' reduction: every rank's flag (a NaN
     * or an infinity in its gradients or, on a last stage, its loss) over all the run's
     * ranks, every stage of every replica; *first becomes the lowest rank whose flag is set,
     * -1 when none is. NULL: this stage alone decides (*first 0). */
    int (*agree_flag)(void *ctx, int mine, int *first, struct err *e);
    void *agree_ctx;
};

/* What became of a step (stage_runner.last). */
enum stage_verdict {
    STAGE_STEPPED,   /* the optimizer stepped */
    STAGE_SKIPPED,   /* fp16: an overflow; no update, the loss scale lowered (or not yet:
                        hysteresis) */
    STAGE_NONFINITE, /* fp32, bf16: a NaN or an infinity; no update, and the run must stop */
    STAGE_AT_MIN,    /* fp16: an overflow at the minimum loss scale; the run must stop */
};

struct stage_runner {
    struct stage_config c;
    struct schedule_shape shape; /* the pipeline: its GPUs and their chunks */
    struct stage_layout lay;
    struct backend *be;
    struct transport *tp;
    const struct data_source *data;
    char *persistent, *activations, *transient, *workspace; /* backend memory, owned unless
                                                               the config gave it */
    char *staging, *host; /* offload: backend memory, and host memory (host_alloc), owned */
    int32_t *host_tokens, *host_targets;                    /* (B,T) staging */
    int *slot_req; /* per chunk and slot (the chunks' rings end to end), -1 none */
    int depth;                                              /* exec_config.prefetch_depth */
    struct arena_run arena; /* with c.arena */
    struct hostmirror mirror; /* with the optimizer on the host */
    struct executor x; /* its times, events and peak are the stage's */
    /* ZeRO-1: the optimizer's sections of every slice (the state's layout from its first
     * optimizer section), the caller's, gathered for stage_state_get; NULL: none */
    const char *shard_state;
    struct lossscale scaler; /* with c.loss_scale: the state checkpoints carry */
    struct {
        enum stage_verdict verdict;
        float loss_scale; /* the scale the step ran with (1 without loss scaling) */
        int first;        /* agree_flag's *first: the rank that found non-finite values */
    } last; /* the last step's */
};

/* The config of plan p's rank s: its stage, or its GPU's chunks, their layers and each one's
 * place from its action (*place, allocated here: the caller's to free), the schedule, AdamW at
 * learning rate lr, its limit. ERR_INPUT when the runtime cannot apply a layer's action. */
int stage_config_of_plan(struct stage_config *c, const struct plan *p, int s, double lr,
                         struct layout_place **place, struct err *e);

/* Lays out and allocates the stage (ERR_NOFIT, naming the layer, if it does not fit),
 * weights drawn from `seed` by global layer index, optimizer state zero. */
int stage_init(struct stage_runner *r, const struct stage_config *c, struct backend *be,
               struct transport *tp, const struct data_source *data, uint64_t seed,
               struct err *e);
void stage_free(struct stage_runner *r);

/* Sets the zero of event times (call after a barrier on every rank). */
void stage_set_origin(struct stage_runner *r);

/* The bytes the stage carves from a temporary region: activations, transient, workspace (or
 * the plan's arena). */
int64_t stage_temporary_bytes(const struct stage_runner *r);

/* Whether the rank holds the model's head (the last virtual stage): its runs have the loss. */
int stage_has_head(const struct stage_runner *r);

/* Runs step `step` (0-based): the schedule, the gradients' reduction, then the verdict
 * (r->last): the gradients (times 1/scale with loss scaling) and the head's losses checked
 * for NaNs and infinities, the flag agreed over every rank (agree_flag), and the optimizer
 * steps only when no rank found one. AdamW's t is the count of steps stepped, step + 1 -
 * scaler.skipped. On the head's stage *loss is the step's mean loss (micro-batch means summed
 * in order 0..M-1, over M); elsewhere it is untouched. A verdict that stops the run
 * (STAGE_NONFINITE, STAGE_AT_MIN) is no error here: the caller ends the run. */
int stage_step(struct stage_runner *r, int64_t step, double *loss, struct err *e);

/* With the optimizer on the host: waits for the updates still running (their events then
 * recorded); nothing otherwise. */
int stage_drain(struct stage_runner *r, struct err *e);

/* The stage's state as host bytes, in chunks, for checkpoints: the persistent arena as the
 * optimizer on the device lays it out (layout.h: weights | gradients | m | v, for 16-bit with
 * the master weights before m), whichever place the optimizer has, so that a checkpoint
 * resumes with the optimizer on either. `get` downloads [off, off+n) into buf, `put`
 * uploads. With the optimizer on the host both first let every host update finish, and
 * master, m and v come from and go to the mirror (for fp32 a put of the weights sets the
 * mirror's master weights too: the device's weights are their image). With a sharded
 * optimizer (stage_config.shards) a put keeps only this replica's slice of master, m and v,
 * and a get reads the other slices from shard_state. */
int64_t stage_state_bytes(const struct stage_runner *r);
int stage_state_get(struct stage_runner *r, int64_t off, void *buf, int64_t n, struct err *e);
int stage_state_put(struct stage_runner *r, int64_t off, const void *buf, int64_t n,
                    struct err *e);
/* Bytes [off, off+n) of that state, in buf: ERR_FAIL naming the layer, the tensor, the
 * section (weights, master weights, AdamW m or v) and the element of the first NaN or
 * infinity among its values. Gradients and the padding between tensors are not values. */
int stage_state_check(const struct stage_runner *r, int64_t off, const void *buf, int64_t n,
                      struct err *e);


#endif
