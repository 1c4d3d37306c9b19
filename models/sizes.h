/* Memory of the GPT layers (and, through models/llama.c, the Llama layers), as pure functions
 * of the model: the single source of truth for the estimated profiles, the planner and the
 * runtime's allocations.
 *
 * Each layer's memory is three lifetime classes of tensors, listed in the order the runtime
 * carves them from its arenas (each tensor starts on a SIZES_ALIGN boundary):
 *   params     one copy of the layer's weights; the persistent arena holds weights, gradients
 *              and AdamW's two moments (plus fp32 master weights for bf16): `state_bytes`;
 *   kept       what one micro-batch keeps for the layer's backward: `act_bytes`; its first
 *              tensors are the layer's input (`ckpt_bytes`, all a recomputed layer keeps), and
 *              the rest is what recomputation regenerates (the transient `act - ckpt`);
 *   workspace  scratch while the layer runs: its output buffer (sent to the next stage when
 *              the layer is a stage's last), the incoming and outgoing activation gradients,
 *              and internal gradients: `workspace_bytes`.
 * Shapes: B micro_batch, T seq_len, C n_embd, NH n_head, V vocab_size; element size e is 4 for
 * fp32 and 2 for bf16; layer-norm statistics, token ids and losses are always 4 bytes.
 *
 * Recomputation is a set of kept tensors, `regen` (bit k: kept tensor k), that the layer does
 * not keep: it writes them to the transient in forward and regenerates them there just before
 * its backward. Whole-layer recomputation regenerates every kept tensor but the checkpoint;
 * the partial options below regenerate fewer, from kept tensors other than the checkpoint. */
#ifndef BALLAST_SIZES_H
#define BALLAST_SIZES_H

#include <stdint.h>

#include "model.h"
#include "tensors.h"

#define SIZES_ALIGN 64
#define SIZES_OPTIONS_MAX 4

/* Per micro-batch, in bytes (state_bytes: for the whole run). */
struct layer_sizes {
    int64_t params; /* parameter count */
    int64_t state_bytes;
    int64_t param_bytes, grad_bytes, optimizer_bytes; /* state_bytes' sections */
    int64_t act_bytes;
    int64_t ckpt_bytes;
    int64_t out_bytes;
    int64_t workspace_bytes;
};

/* Tensors of one class of a layer kind, in carving order; returns how many. */
int sizes_layer_tensors(const struct model *m, enum model_layer_kind kind, enum sizes_class cls,
                        struct sizes_tensor out[SIZES_TENSORS_MAX]);
/* The same by layer index (model_ops' layer_tensors), and the model's parameters. */
int sizes_layer_tensors_at(const struct model *m, int layer, enum sizes_class cls,
                           struct sizes_tensor out[SIZES_TENSORS_MAX]);
int64_t sizes_model_params(const struct model *m);
/* Number of leading kept tensors that form the layer's input (its checkpoint). */
int sizes_ckpt_tensor_count(enum model_layer_kind kind);
/* A tensor's bytes, rounded up to SIZES_ALIGN. */
int64_t sizes_tensor_bytes(const struct sizes_tensor *t);
/* Sum of sizes_tensor_bytes over the first n tensors. */
int64_t sizes_tensors_bytes(const struct sizes_tensor *t, int n);

int64_t sizes_layer_params(const struct model *m, enum model_layer_kind kind);
void sizes_layer(const struct model *m, int layer, struct layer_sizes *out);
/* Persistent bytes of parameters whose weights, in the model's dtype, take `weights_bytes`
 * and whose fp32 copy takes `fp32_bytes`: the weights, gradients, AdamW's m and v, and for
 * bf16 the fp32 master weights (the one place the state's sections are counted). */
int64_t sizes_state_bytes(enum model_dtype dtype, int64_t weights_bytes, int64_t fp32_bytes);
/* The same split as a profile states it: the weights, the fp32 gradients and what only the
 * optimizer needs (m and v, and for bf16 the fp32 master weights). */
void sizes_state_split(enum model_dtype dtype, int64_t weights_bytes, int64_t fp32_bytes,
                       int64_t *param_bytes, int64_t *grad_bytes, int64_t *optimizer_bytes);
/* Bytes of the persistent state per parameter tensor element: 16 (fp32), 18 (bf16). */
int sizes_state_bytes_per_param(enum model_dtype dtype);
/* An activation (B,T,C) or its gradient, per micro-batch: what crosses between stages. */
int64_t sizes_activation_bytes(const struct model *m);
/* A partial recompute option the runtime can apply. */
struct sizes_option {
    const char *name;
    uint32_t regen;
};

/* The partial recompute options of a layer kind (a block: "attn", the attention probabilities
 * from qkv as Megatron-LM's selective recomputation; "mlp", the GELU from fch; "attn+mlp");
 * returns how many. A flash-attention block keeps no probabilities (its kept "att_lse" is the
 * rows' log-sum-exp), so it has "mlp" alone: an option naming a tensor the layer does not
 * keep does not exist. */
int sizes_recompute_options(const struct model *m, enum model_layer_kind kind,
                            struct sizes_option out[SIZES_OPTIONS_MAX]);
/* The same by layer index (model_ops' recompute_options). */
int sizes_recompute_options_at(const struct model *m, int layer,
                               struct sizes_option out[SIZES_OPTIONS_MAX]);
/* The regen set of the option named `name` for this kind; 0 (and *regen untouched) if the
 * kind has no such option. */
int sizes_find_option(const struct model *m, enum model_layer_kind kind, const char *name,
                      uint32_t *regen);
/* Whole-layer recomputation: every kept tensor but the checkpoint. */
uint32_t sizes_full_regen(const struct model *m, enum model_layer_kind kind);
/* Bytes per micro-batch kept in the slot and regenerated into the transient for a regen
 * set; kept + transient = act_bytes. */
void sizes_regen_bytes(const struct model *m, enum model_layer_kind kind, uint32_t regen,
                       int64_t *kept, int64_t *transient);

/* The weight-gradient pass of a split backward (schedule.h): what a block keeps from its
 * input-gradient pass to its weight pass, the output gradient of each of its matrix products
 * in the order the backward reaches them (MLP out, MLP in, attention out, q/k/v), in the
 * activations' dtype; the runtime's W pass computes their weight gradients from these and the
 * products' kept inputs. The embedding and the head do not split (0 tensors): the head's
 * would be the logits' gradient, vocabulary-wide. */
int sizes_wgrad_tensors(const struct model *m, enum model_layer_kind kind,
                        struct sizes_tensor out[SIZES_TENSORS_MAX]);
int64_t sizes_wgrad_bytes(const struct model *m, enum model_layer_kind kind);


#endif
