/* The cost model (docs/cost-model.md), shared by the planner, the simulator, the runtime and the
 * tests: the one place its formula is written. Each layer l of a stage takes an action: a
 * recompute choice c_l (a plan holds one struct layer_action per layer; the solvers' choice
 * vectors one choice per layer) and a place for what the choice keeps. A choice keeps kept_l
 * bytes per micro-batch, regenerates transient_l bytes just before its backward and costs
 * recompute_l ms:
 *   COST_KEEP         (act_l, 0, 0)
 *   COST_FULL         (ckpt_l, act_l - ckpt_l, fwd_l)       the whole layer
 *   COST_OPTION + k   the layer's option k (profile.h)
 * With in-flight micro-batches v:
 *   memory  M = sum state_l + v * sum kept_l + max_l transient_l + max_l workspace_l + reserve
 *   time    T = sum (fwd_l + bwd_l) + R,   recompute R = sum recompute_l   (per micro-batch)
 * With only keep and full (0/1 flags are choices) this is docs/cost-model.md's formula.
 *
 * Offloading (a place per layer): a layer with place COST_PLACE_HOST keeps its choice's
 * kept_l in host memory instead; a kept layer (COST_KEEP) with offload option k sends only
 * option k's transient_k to the host and keeps act_l - transient_k on the device. What goes
 * to the host, host_l, crosses the host link once each way per micro-batch, and passes
 * through device staging on its way (the layer being copied out while the next computes,
 * the layer prefetched while `a` earlier layer-ops run, and a forward whose input the layer
 * before it wrote into staging):
 *   device  M = ... (kept_l of device-placed layers only) + staging,
 *           staging = (max_l a_l + 2) * max_l host_l        (0 with nothing offloaded)
 * A stage's first layer keeps its input (the receive buffer) and the head its targets on the
 * device, so neither takes COST_PLACE_HOST (cost_actions: whole_offload). 
 *   host    H = v * sum host_l
 *   copy    C = sum host_l bytes each way per micro-batch; the simulator times it.
 *
 * The optimizer (a place o per stage): on the device a layer holds all its state; on the host
 * (o = host) the device keeps the weights and the fp32 gradients the micro-batches accumulate
 * into, and host memory holds a mirror of four fp32 sections of grad_bytes each (master, m,
 * v and a landing buffer for the gradients; docs/offload.md):
 *   devstate_l = state_l (o = device),  param_l + grad_l (o = host)
 *   device  M = sum devstate_l + ...
 *   host    H = v * sum host_l + [o = host] * sum 4 * grad_l
 * Only layers whose profile splits state_bytes can move their optimizer (cost_optimizer_movable).
 * A stage may host the optimizer of only a fraction of its layers (as Megatron-LM's
 * --optimizer-offload-fraction, by layers): its last n - from, whose last backwards end first
 * so that their host step overlaps the rest of the stage's backward; o_l = host for l >= from
 * and device before, and the sums above run over each layer's own place (from 0: the whole
 * stage, as before). With ZeRO-1 a layer's optimizer state is one replica's share
 * (optimizer_shards), and so is its mirror: 4 * grad_l / shards.
 *
 * Streamed weights (a layer's weights = host, its optimizer on the host): the layer's weights
 * and gradients leave the device between their uses. The host keeps a copy of its weights
 * (param_l, beside the mirror), and each use fetches them into one of the stage's
 * COST_STREAM_BUFFERS device buffers; a backward also fetches the gradients summed so far (the
 * step's first zeroes them instead) and sends them back after it:
 *   devstate_l = 0,   staging += COST_STREAM_BUFFERS * max_l (param_l + grad_l)
 *   host      H += param_l
 *   copies per micro-batch: param_l in for the forward, param_l + grad_l in and grad_l out
 *   for the backward.
 *
 * The weight-gradient pass (schedules that split the backward, schedule.h): a layer kept whole
 * on the device defers the weight gradients of its matrix products from its backward's
 * input-gradient pass (B) to a later pass (W), keeping their output gradients from one to the
 * other, wgrad_l bytes, in its micro-batch's slot, which then lives from the forward to W:
 *   kept_l(keep) = act_l + wgrad_l,  B takes bwd_l - wgrad_ms_l and W wgrad_ms_l
 * (the planner zeroes wgrad for the schedules that do not split). Any other action runs the
 * whole backward in B: what it regenerates or brings back lives only through its backward.
 *
 * The knapsack's view of the same M splits it into the bytes no choice changes and each
 * choice's weights:
 *   M = fixed + sum_l v * (kept_l - ckpt_l) + max_l transient_l,
 *   fixed = sum state_l + v * sum ckpt_l + max_l workspace_l + reserve. */
#ifndef BALLAST_COST_H
#define BALLAST_COST_H

#include <stdint.h>

#include "profile.h"

enum { COST_KEEP = 0, COST_FULL = 1, COST_OPTION = 2 };

/* Inputs are at most 2^53 each, but sums over many layers times the in-flight count can pass
 * 2^63 in a hostile file: sum in 128 bits and saturate rather than wrap. */
static inline int64_t cost_saturate(__int128 v)
{
    return v > INT64_MAX ? INT64_MAX : (int64_t)v;
}

/* Most actions a layer has: keep, full and its options. */
#define COST_ROWS_MAX (COST_OPTION + PROFILE_OPTIONS_MAX)

/* Where an action keeps its tensors between forward and backward (and where a stage's
 * optimizer runs). */
enum cost_place { COST_PLACE_DEVICE = 0, COST_PLACE_HOST = 1 };

/* The prefetch trigger the planner gives an offloaded layer: issued this many layer-ops
 * before its backward (the runtime moves it earlier when late). */
#define COST_PREFETCH_AHEAD 1

/* What one layer does with its memory: the action a plan holds per layer. Its cost row
 * (cost_action_row), the plan file's fields (common/plan.h), the runtime's placement of its
 * tensors and the executor's hooks (runtime/stage.h) are each derived from it. */
struct layer_action {
    unsigned char choice;       /* COST_KEEP, COST_FULL or COST_OPTION + k */
    unsigned char place;        /* enum cost_place of what the choice keeps */
    signed char offload_option; /* -1, or with COST_KEEP on the device: option k to the host */
    /* enum cost_place of the layer's weights and gradients between their uses: on the host
     * they stream in for each forward and backward (cost.h "Streamed weights"); the layer's
     * optimizer must be on the host too */
    unsigned char weights;
    int prefetch_ahead; /* layer-ops; 0 when nothing goes to the host */
};

/* Keep everything on the device. */
#define LAYER_ACTION_KEEP                                                                      \
    ((struct layer_action){.choice = COST_KEEP, .place = COST_PLACE_DEVICE,                   \
                           .offload_option = -1, .weights = COST_PLACE_DEVICE})

static inline int layer_action_equal(const struct layer_action *a, const struct layer_action *b)
{
    return a->choice == b->choice && a->place == b->place &&
           a->offload_option == b->offload_option && a->weights == b->weights &&
           a->prefetch_ahead == b->prefetch_ahead;
}

/* Whether the action sends anything it keeps to the host (whole, or an option's tensors). */
static inline int layer_action_offloads(const struct layer_action *a)
{
    return a->place == COST_PLACE_HOST || a->offload_option >= 0;
}

/* One action a layer can take with its costs (an action row). */
struct cost_row {
    struct layer_action action; /* prefetch_ahead: 0 exactly when host_bytes is */
    int64_t kept_bytes;      /* on the device per micro-batch, from forward to backward */
    int64_t host_bytes;      /* in host memory per micro-batch; copied once each way */
    int64_t transient_bytes; /* regenerated just before the backward */
    double recompute_ms;
    double wgrad_ms; /* the backward's share deferred to the W pass (in kept_bytes: wgrad) */
};

struct stage_cost {
    int64_t state_bytes;     /* sum state_l */
    int64_t kept_bytes;      /* per micro-batch: sum kept_l */
    int64_t transient_bytes; /* max transient_l */
    int64_t workspace_bytes; /* max workspace_l */
    int64_t reserve_bytes;
    int64_t host_bytes;        /* per micro-batch: sum host_l (the copy each way) */
    int64_t staging_bytes;
    int64_t host_memory_bytes; /* H */
    int in_flight;
    enum cost_place optimizer; /* where the stage's optimizer state lives and steps */
    int64_t memory_bytes;      /* M */
    double recompute_ms;       /* R */
    double stage_ms;           /* T */
};

/* Running sums of M's and T's terms over a stage's layers, added in order: the memory of a
 * prefix of the stage is the memory of the layers added so far. Start from {0}. */
struct cost_sum {
    __int128 state, kept;
    __int128 host, mirror; /* mirror: the host optimizer's, once (not per micro-batch) */
    int64_t transient, workspace, host_max;
    int64_t stream_max; /* the most weights + gradients a streamed layer brings in */
    int ahead_max;
    double compute_ms, recompute_ms;
};

/* A host mirror holds this many fp32 sections of a layer's grad_bytes. */
#define COST_MIRROR_SECTIONS 4

/* Streamed weights: the device's buffers for a streamed layer's weights and gradients, one for
 * the layer-op running, one for the next one's, fetched meanwhile, and one for a backward's
 * gradients on their way out. */
#define COST_STREAM_BUFFERS 3

/* The layer's bytes on the device that no activation choice changes, with its optimizer at
 * `optimizer`: devstate_l. */
int64_t cost_layer_state(const struct layer_cost *c, enum cost_place optimizer);
/* The layer's host mirror with the optimizer on the host: 4 * grad_l, over its
 * optimizer_shards (ZeRO-1) rounding up. */
int64_t cost_layer_mirror(const struct layer_cost *c);
/* Where layer l of a stage keeps its optimizer: the stage's place, but with the optimizer on
 * the host only layers from `from` on (0: all). */
enum cost_place cost_layer_optimizer(enum cost_place optimizer, int from, int l);
/* The host mirror of layers[from..n-1]: the sum of cost_layer_mirror. */
int64_t cost_stage_mirror(const struct layer_cost *layers, int n, int from);
/* The share of the stage's optimizer_bytes that layers[from..n-1] hold, the fraction
 * Megatron-LM's --optimizer-offload-fraction states (0 when no layer splits its state). */
double cost_optimizer_fraction(const struct layer_cost *layers, int n, int from);
/* Whether every layer's profile splits its state, so the stage's optimizer may move to the
 * host; *first_missing (when not NULL) gets the first layer that does not, or -1. */
int cost_optimizer_movable(const struct layer_cost *layers, int n, int *first_missing);
/* The layers as a stage with its optimizer at `optimizer` holds them on the device: copies
 * with state_bytes = devstate_l (so every search over activation actions sees the right
 * fixed bytes); returns the mirror's bytes, sum 4 * grad_l when on the host, else 0. */
int64_t cost_layers_for_optimizer(const struct layer_cost *in, int n,
                                  enum cost_place optimizer, struct layer_cost *out);
/* The same with the optimizer on the host for layers from `from` on only. */
int64_t cost_layers_for_optimizer_from(const struct layer_cost *in, int n,
                                       enum cost_place optimizer, int from,
                                       struct layer_cost *out);

/* Choices a layer has: keep, full and its options. */
int cost_choice_count(const struct layer_cost *c);
/* The action row of `choice` < cost_choice_count(c), kept on the device. */
struct cost_row cost_row(const struct layer_cost *c, int choice);
/* Every action row of the layer, in choice order; returns cost_choice_count(c). */
int cost_rows(const struct layer_cost *c, struct cost_row rows[COST_ROWS_MAX]);
/* One layer's (kept, transient, recompute ms) for `choice`: cost_row's numbers. */
void cost_choice(const struct layer_cost *c, int choice, int64_t *kept, int64_t *transient,
                 double *recompute_ms);
/* The row of an action: its choice with what it keeps in its place, or with COST_KEEP on
 * the device its offload option (-1: none) sent to the host; prefetched prefetch_ahead
 * layer-ops ahead (0: COST_PREFETCH_AHEAD) when anything is sent. */
struct cost_row cost_action_row(const struct layer_cost *c, const struct layer_action *a);
/* Every action of the layer with the host (its choices on the device, on the host when
 * `whole_offload`, and kept with each option offloaded), prefetched COST_PREFETCH_AHEAD
 * ahead; returns the count. */
#define COST_ACTIONS_MAX (2 * COST_ROWS_MAX + PROFILE_OPTIONS_MAX)
int cost_actions(const struct layer_cost *c, int whole_offload,
                 struct cost_row rows[COST_ACTIONS_MAX]);
/* Whether a stage's layer li (global layer `layer`) may send everything it keeps to the host:
 * not the stage's first (its input is the receive buffer) nor the head (its targets stay). */
int cost_whole_offload(const struct model *m, int li, int layer);
/* The choice's name: "keep", "full" or the option's. */
const char *cost_choice_name(const struct layer_cost *c, int choice);

/* Adds one layer: its state, workspace, forward + backward ms and its action row. */
void cost_sum_add(struct cost_sum *s, int64_t state_bytes, int64_t workspace_bytes,
                  double compute_ms, const struct cost_row *row);
/* M of the layers added so far (saturating at INT64_MAX). */
int64_t cost_sum_memory(const struct cost_sum *s, int in_flight, int64_t reserve_bytes);
/* staging and H of the layers added so far (H with the mirror of those added with
 * cost_sum_add_mirror). */
int64_t cost_sum_staging(const struct cost_sum *s);
int64_t cost_sum_host(const struct cost_sum *s, int in_flight);
void cost_sum_add_mirror(struct cost_sum *s, int64_t mirror_bytes);
/* A layer whose weights stream (cost.h "Streamed weights"): its host copy and its buffers. */
void cost_sum_add_stream(struct cost_sum *s, const struct layer_cost *c);
/* T: a stage's forward and backward ms and its recompute ms. */
double cost_stage_ms(double compute_ms, double recompute_ms);

/* `recompute` has n choices (NULL: every layer kept). */
void cost_stage(const struct layer_cost *layers, int n, const unsigned char *recompute,
                int in_flight, int64_t reserve_bytes, struct stage_cost *out);
/* The same with an action per layer (NULL: every layer kept on the device) and the stage's
 * optimizer place (zero: the device), on the host for its layers from optimizer_from on (0:
 * every layer). */
struct cost_actions {
    const struct layer_action *actions;
    enum cost_place optimizer;
    int optimizer_from;
};
void cost_stage_actions(const struct layer_cost *layers, int n, const struct cost_actions *a,
                        int in_flight, int64_t reserve_bytes, struct stage_cost *out);

/* A GPU holding several model chunks (schedule.h): each chunk's costs with its own in-flight
 * count and no reserve. The GPU runs one chunk's pass at a time, so the chunks share one
 * transient; each keeps its own workspace, whose output and input gradient may still be on
 * their way to the neighbouring chunks while another chunk runs:
 *   M_gpu = sum_c (state_c + v_c * kept_c + workspace_c) + max_c transient_c + reserve
 * (no chunked schedule offloads: staging 0). */
int64_t cost_chunks_memory(const struct stage_cost *chunks, int n, int64_t reserve_bytes);

/* The activation arena: v * sum kept + max transient + max workspace, the bytes of one slot
 * per in-flight micro-batch, the largest transient and the largest workspace side by side.
 * A stage whose arena is laid out by a reuse plan (planner/arena.h) holds its objects in
 * `arena_bytes` instead:  M = sum state + arena_bytes + reserve. */
int64_t cost_arena_bytes(const struct stage_cost *c);
int64_t cost_memory_with_arena(const struct stage_cost *c, int64_t arena_bytes);

/* The knapsack's view: the bytes of M no choice of layers[0..n-1] changes. _each: a GPU's
 * chunks end to end, layer l of chunk chunk[l] (non-decreasing) with in_flight[l] in flight,
 * each chunk's own workspace (cost_chunks_memory). */
__int128 cost_fixed_bytes(const struct layer_cost *layers, int n, int in_flight,
                          int64_t reserve_bytes);
__int128 cost_fixed_bytes_each(const struct layer_cost *layers, int n, const int *in_flight,
                               const int *chunk, int64_t reserve_bytes);
/* What `choice` of layer c adds to the fixed bytes: v * (kept - ckpt) for every layer, and
 * its transient, of which the stage holds the largest. */
void cost_weights(const struct layer_cost *c, int choice, int in_flight, __int128 *kept_bytes,
                  int64_t *transient_bytes);
/* The same for an action row of layer c (its choice's row). */
void cost_row_weights(const struct layer_cost *c, const struct cost_row *r, int in_flight,
                      __int128 *kept_bytes, int64_t *transient_bytes);
/* The bytes `choice` keeps less than keeping the whole layer, over v in-flight micro-batches:
 * v * (kept(keep) - kept) (saturating). */
int64_t cost_saved_bytes(const struct layer_cost *c, int choice, int in_flight);


/* Tensor and data parallelism (issue 17): a stage as a group of GPUs, tp of one kind in a node
 * sharing each layer (Megatron-LM's tensor parallelism with sequence parallelism) and the
 * whole stage replicated dp times. Korthikanti et al. 2022 ("Reducing Activation Recomputation
 * in Large Transformer Models") give the per-GPU costs used here:
 *   memory   with sequence parallelism every activation term / tp (act, ckpt, the options'
 *            kept and transient, what a stage sends on, workspace), parameters and gradients
 *            / tp, optimizer state / (tp * dp) when sharded over the replicas (ZeRO-1), else
 *            / tp; each block and the head also holds the all-gathered input, b*s*h elements,
 *            as workspace;
 *   time     compute / (tp * efficiency), plus per block 2 all-gathers + 2 reduce-scatters of
 *            b*s*h elements forward and the same backward (the embedding: 1 reduce-scatter
 *            forward, 1 all-gather backward; the head the reverse), each a ring over the tp GPUs
 *            on the node link: (tp - 1) steps of 1/tp of the tensor. A full recompute reruns the
 *            forward with its collectives; a partial option (inside attention) recomputes
 *            without them.
 * Bytes divide rounding up. The optimizer's share of state_bytes is the runtime's layout
 * (models/sizes.h): fp32 16 bytes a parameter of which optimizer 8 and gradients 4; bf16 and
 * fp16 18, optimizer 12, gradients 4. tp = 1 with nothing sharded leaves every cost as it is. */
struct cost_group {
    int tp, dp;
    int shard_optimizer;
    double tp_efficiency;     /* in (0, 1]: compute / tp runs at this share of ideal */
    struct link node_link;    /* between the tp GPUs (absent: free) */
    int64_t tensor_bytes;     /* b*s*h elements of the activation dtype: one collective */
    enum model_dtype dtype;
};

/* A model's b*s*h activation tensor in bytes (0 for a custom model). */
int64_t cost_tp_tensor_bytes(const struct model *m);
/* One ring all-gather or reduce-scatter of `bytes` over tp GPUs on `link`. */
double cost_tp_collective_ms(const struct link *link, int tp, int64_t bytes);
/* A layer's tensor-parallel collectives of one pass (forward or backward). */
int cost_tp_collectives(enum model_layer_kind kind);
/* One layer's costs on each GPU of the group, from its costs on one GPU. */
void cost_group_layer(const struct layer_cost *in, enum model_layer_kind kind,
                      const struct cost_group *g, struct layer_cost *out);
/* The gradient bytes of a layer of `state_bytes` (one GPU's whole layer), by the runtime's
 * layout: state * 4/16 (fp32) or 4/18 (bf16, fp16). */
int64_t cost_grad_bytes(int64_t state_bytes, enum model_dtype dtype);
/* The data-parallel gradient reduction of `bytes` per GPU over dp replicas: a ring
 * all-reduce, 2 (dp - 1) steps of bytes/dp each on `link` (the same for ZeRO-1's
 * reduce-scatter of gradients and all-gather of parameters); 0 with dp = 1. */
double cost_dp_allreduce_ms(const struct link *link, int dp, int64_t bytes);
/* The gradient bucket a data-parallel reduction fills before it starts a collective (the
 * simulator's buckets, planner/sim/sim.h): PyTorch DistributedDataParallel's default
 * bucket_cap_mb of 25 (MiB), the cluster's "dp_bucket_bytes" when absent. */
#define COST_DP_BUCKET_BYTES_DEFAULT ((int64_t)25 << 20)

#endif
