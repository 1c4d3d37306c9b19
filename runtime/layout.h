/* Where every tensor of a stage lives: offsets into the four arenas, computed from the size
 * tables of models/sizes.h and nothing else (planning offsets, nothing allocated: the split
 * ggml's graph allocator makes between planning and applying).
 *
 *   persistent   fp32:  weights | gradients | AdamW m | AdamW v
 *                16-bit (bf16, fp16): weights (16-bit) | gradients | master weights | AdamW m |
 *                       AdamW v
 *                each section one copy of every parameter tensor of the stage, in layer order
 *                then table order, fp32 but for the 16-bit weights: sum state
 *   activations  in_flight slots; a slot holds, per layer in order, the kept tensors it does
 *                not regenerate (all of them, or only the checkpoint when the layer is
 *                recomputed whole, or all but a partial option's), and after them, for a
 *                layer whose backward is split (schedule.h), the weight pass's tensors
 *                (sizes_wgrad_tensors): v * sum kept. A stage holding several model chunks
 *                (a GPU's virtual stages) has one ring of slots per chunk, each of the
 *                chunk's own in_flight and slot size, end to end
 *   transient    the regenerated tensors of the layer running now, from offset 0: max over
 *                the layers of what they regenerate
 *   workspace    the running layer's workspace tensors: max workspace
 * Every tensor starts on a SIZES_ALIGN boundary of its arena. */
#ifndef BALLAST_LAYOUT_H
#define BALLAST_LAYOUT_H

#include <stdint.h>

#include "backend.h"
#include "cost.h"
#include "err.h"
#include "model.h"
#include "profile.h"
#include "schedule.h"
#include "sizes.h"

struct layer_layout {
    int layer; /* global index */
    enum model_layer_kind kind;
    uint32_t regen; /* kept tensors regenerated (backend.h); 0: none */
    int n_params, n_kept, n_ws;
    struct sizes_tensor params[SIZES_TENSORS_MAX];
    struct sizes_tensor kept[SIZES_TENSORS_MAX];
    struct sizes_tensor ws[SIZES_TENSORS_MAX];
    int64_t param_off[SIZES_TENSORS_MAX];  /* in an fp32 persistent section */
    int64_t weight_off[SIZES_TENSORS_MAX]; /* in the weights section (the model's dtype;
                                              equal to param_off for fp32) */
    uint32_t offload; /* kept tensors that spend forward to backward in host memory */
    int ahead;        /* offloaded: layer-ops before its backward its prefetch starts (0: 1) */
    int64_t kept_off[SIZES_TENSORS_MAX];   /* in the transient when regenerated, in a staging
                                              buffer when offloaded, else in the slot */
    int64_t ws_off[SIZES_TENSORS_MAX];    /* from the workspace's start */
    int64_t state_bytes, slot_bytes, transient_bytes, ws_bytes; /* state: on the device */
    int64_t offload_bytes, host_off; /* the offloaded tensors, and their place in a host slot */
    int chunk; /* of the stage's chunks */
    /* A split backward: the weight pass's tensors, in the slot after the kept ones (0: the
     * backward runs whole) */
    int n_wstash;
    struct sizes_tensor wstash[SIZES_TENSORS_MAX];
    int64_t wstash_off[SIZES_TENSORS_MAX];
};

/* One model chunk of a stage: layers lo .. hi-1 (indices in the stage), virtual stage vstage
 * of the pipeline (schedule.h), in_flight slots of slot_bytes from act_at in the activations. */
struct layout_chunk {
    int lo, hi, vstage, in_flight;
    int64_t slot_bytes, act_at;
};

struct stage_layout {
    int first, last, n_layers, in_flight; /* first, last and in_flight: chunk 0's */
    int n_chunks;
    struct layout_chunk chunks[SCHEDULE_CHUNKS_MAX];
    enum model_dtype dtype;
    struct layer_layout *layers; /* owned, n_layers */
    int64_t param_count;
    int64_t section_bytes; /* one fp32 copy of the stage's parameters */
    int64_t weights_bytes; /* the weights section: one copy in the model's dtype */
    /* byte offsets of the sections in the persistent arena; the weights start at 0, and for
     * fp32 the master weights are the weights (master_at 0) */
    int64_t grads_at, master_at, m_at, v_at;
    int64_t persistent_bytes; /* weights + 3 (fp32) or 4 (16-bit) fp32 sections */
    int64_t slot_bytes;       /* chunk 0's */
    int64_t activation_bytes; /* every chunk's in_flight slots */
    int64_t transient_bytes;
    int64_t workspace_bytes;
    /* Offload: the offloaded tensors pass through n_staging device buffers of
     * staging_buf_bytes (the largest layer's offloaded bytes) and live in host memory in
     * in_flight host slots of host_slot_bytes. The buffers: one per layer-op a prefetch runs
     * ahead (the spec's prefetch_depth), one for the layer being copied out, and one for a
     * forward whose input the layer before it wrote into staging: the cost model's staging,
     * (max prefetch_ahead + 2) x the largest layer's host bytes (cost.h). */
    int n_staging;
    int64_t staging_buf_bytes, staging_bytes, host_slot_bytes, host_bytes;
    int64_t arena_bytes; /* the device arenas together (staging included): what the cost
                            model calls M - reserve */
    /* The stage's state as checkpoints and stage_state_get see it, wherever the optimizer
     * runs: the persistent arena as the optimizer on the device lays it out (the offsets
     * above), state_bytes long. With the optimizer on the host (layout_spec) the
     * device keeps weights | gradients (persistent_bytes), the host mirror master | m | v |
     * gradient landing, four fp32 sections (mirror_bytes; 0: the optimizer on the device). */
    int64_t state_bytes, mirror_bytes;
    /* With a fraction of the optimizer on the host (layout_spec's optimizer_from): the mirror
     * holds bytes [host_lo, section_bytes) of each fp32 section, the device the optimizer's
     * sections of [0, host_lo) as a ZeRO-1 slice (below); section_bytes: no mirror. */
    int64_t host_lo;
    int host_from; /* the first layer (index in the stage) of the mirror; n_layers: none */
    /* ZeRO-1 (layout_spec's shards): the device keeps the optimizer's sections (16-bit: the
     * master weights, m and v; for fp32 m and v) only for bytes [shard_lo, shard_lo +
     * shard_bytes) of an fp32 section, each slice after the gradients; dev_master_at, dev_m_at
     * and dev_v_at are the device offsets of byte shard_lo of each. Unsharded: the whole
     * section, at the state's offsets. */
    int64_t shard_lo, shard_bytes, dev_master_at, dev_m_at, dev_v_at;
    /* Streamed weights (layout_spec.stream_layers; cost.h): the layers from stream_from on
     * keep their weights and gradients in host memory between their uses. The device holds
     * bytes [0, dev_weights_bytes) of the weights section and [0, dev_section_bytes) of the
     * gradients' (from dev_grads_at), and n_wbuf buffers of wbuf_bytes after the activations'
     * staging buffers, each holding a layer's weights range, then its gradients range. The host
     * holds the streamed layers' weights (host_weights_bytes, in the mirror after its four
     * sections: its gradients are the mirror's landing section). Nothing streamed: stream_from
     * n_layers, the device's bytes the sections'. */
    int stream_from, n_wbuf;
    int64_t dev_weights_bytes, dev_section_bytes, dev_grads_at, wbuf_bytes, host_weights_bytes;
};

/* The kept tensors layer `layer` regenerates for a plan's choice (cost.h) given its layer
 * costs `c` (which name its options): 0 to keep, sizes_full_regen for the whole layer, the
 * option's set from the size functions. ERR_INPUT when this runtime does not know the option
 * for the layer's kind (the message names the option and the ones it knows). */
int layout_regen(const struct model *m, int layer, int choice, const struct layer_cost *c,
                 uint32_t *regen, struct err *e);

/* Where one layer's tensors go, computed once from its action (layout_place_of): the kept
 * tensors it regenerates, those that spend forward to backward in host memory and how many
 * layer-ops ahead of its backward they come back, and whether its backward splits. */
struct layout_place {
    uint32_t regen, offload;
    int ahead;
    int split;
};

/* The place of layer li of a stage (global `layer`) taking action `a` (cost.h), its costs
 * `c` naming its options: layout_regen's set, layout_offload_mask's, the action's prefetch
 * trigger. ERR_INPUT as those. */
int layout_place_of(const struct model *m, int layer, int li, const struct layer_action *a,
                    const struct layer_cost *c, int split, struct layout_place *out,
                    struct err *e);

/* One model chunk of a stage: global layers first..last, virtual stage vstage (schedule.h),
 * in_flight slots. */
struct layout_chunk_spec {
    int first, last, vstage, in_flight;
};

/* What a stage is laid out for: its chunks; per layer of all the chunks in order its place
 * (NULL: every layer keeps everything on the device); the staging buffers' room for
 * prefetches running up to prefetch_depth layer-ops ahead (with anything offloaded); the
 * optimizer on the host for the layers from optimizer_from on (cost.h), or on the device as
 * slice `shard` of `shards` (ZeRO-1; shards <= 1: whole). */
struct layout_spec {
    const struct layout_chunk_spec *chunks;
    int n_chunks;
    const struct layout_place *place;
    int prefetch_depth;
    enum cost_place optimizer;
    int optimizer_from;
    int shard, shards;
    /* the stage's last this many layers stream their weights (0: none); their optimizer must
     * be on the host, the stage one chunk with its backward whole and its optimizer unsharded */
    int stream_layers;
};

/* Lays the stage out in one pass over its layers, each as its place says, its optimizer's
 * state where the spec puts it, and checks the result against the cost model to the byte
 * (device memory and host memory; a GPU's chunks as cost_chunks_memory counts them: one
 * transient and one workspace for all). ERR_INPUT for a place the runtime cannot run (an
 * offload beside several chunks or a split backward); ERR_FAIL on out-of-memory or a size
 * table whose tensor names no longer match backend.h's indices. */
int layout_stage(struct stage_layout *sl, const struct model *m, const struct layout_spec *spec,
                 struct err *e);
/* Layers first..last with in_flight slots, each regenerating regen[l] (NULL: none), nothing
 * offloaded, the optimizer on the device: layout_stage's simplest case. */
int layout_init(struct stage_layout *sl, const struct model *m, int first, int last,
                const uint32_t *regen, int in_flight, struct err *e);
/* The chunk of the stage whose virtual stage is vstage; -1 if none. */
int layout_chunk_of(const struct stage_layout *sl, int vstage);
void layout_free(struct stage_layout *sl);

/* Offload (exec.h). The kept tensors of global layer `layer` (the stage's first when
 * `first`) that go to host memory, for place (COST_PLACE_*: the tensors the layer keeps,
 * those it does not regenerate) or offload_option k (-1 none; with nothing regenerated: the
 * tensors option k would regenerate). The stage's first input and the head's targets stay on
 * the device: they are written when the micro-batch arrives, long before the forward.
 * ERR_INPUT for an option the layer lacks or an option beside recomputation. */
int layout_offload_mask(const struct model *m, int layer, int first, uint32_t regen, int place,
                        int option, uint32_t *mask, struct err *e);
/* Points the offloaded tensors of layer li's view at a staging buffer (NULL: none held). */
void layout_view_staging(const struct stage_layout *sl, int li, char *buf, struct layer_view *v);
/* Points streamed layer li's weights and gradients at a weights buffer (NULL: none held). */
void layout_view_weights(const struct stage_layout *sl, int li, char *buf, struct layer_view *v);
/* A streamed layer's weights range and gradients range (layout_layer_ranges' bytes): its
 * gradients start this many bytes into its weights buffer. */
int64_t layout_stream_grads_at(const struct stage_layout *sl, int li);
/* Fails (ERR_NOFIT) when the host slots need more than host_limit (< 0: no limit); with the
 * optimizer on the host, ERR_INPUT (the plan asked for it) when host_limit cannot hold the
 * mirror and the host slots together. */
int layout_check_host(const struct stage_layout *sl, int64_t host_limit, struct err *e);

/* Replica `shard` of `shards`' slice of an fp32 section: contiguous, ceil(floats / shards)
 * floats each, the last slices shorter (or empty). */
void layout_shard_range(const struct stage_layout *sl, int shard, int shards, int64_t *lo,
                        int64_t *bytes);
/* The elements of layer li's parameter tensor k inside bytes [lo, lo + bytes) of an fp32
 * section: their count (0: none), and the first in *first. */
int64_t layout_tensor_slice(const struct stage_layout *sl, int li, int k, int64_t lo,
                            int64_t bytes, int64_t *first);
/* Layer li's range of one fp32 section (its param_off[0] and bytes), and of the weights
 * section (its weight_off[0] and bytes). */
void layout_layer_ranges(const struct stage_layout *sl, int li, int64_t *sec_off,
                         int64_t *sec_bytes, int64_t *w_off, int64_t *w_bytes);

/* The tensors of layer li (index in the stage) for the micro-batch whose slot starts at
 * `slot`, given the arenas' bases: the one place a stage's offsets become pointers, shared by
 * the executor (stage.c) and the profiler so that both run the layers on the same carving. */
void layout_view(const struct stage_layout *sl, const struct model *m, int li, char *persistent,
                 char *slot, char *transient, char *workspace, struct layer_view *v);

/* The memory limit: fails (ERR_NOFIT) when the arenas need more than limit - reserve,
 * naming the layer at which the running total (state + in_flight x kept + transient +
 * workspace, over layers first..l) first crosses it, and the bytes. */
int layout_check_limit(const struct stage_layout *sl, const struct model *m, int64_t limit,
                       int64_t reserve, struct err *e);

/* The model's initialisation rule (model_ops.h), for the runtime's GPT layers: whether
 * AdamW's weight decay applies to a parameter tensor, and its initial value: normal(0, std),
 * or the constant `fill` when std is 0. */
int layout_param_decays(const char *name);
void layout_param_init(const struct model *m, const char *name, float *std, float *fill);

#endif
