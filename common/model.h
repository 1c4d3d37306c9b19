/* The model file (ballast-model/1): a GPT decoder, or a Llama-family decoder (kind "llama":
 * RMSNorm, SwiGLU MLP of ffn_hidden, rotary positions, grouped-query attention with n_kv_head
 * key/value heads, no biases, untied output head), and its planning layers in order:
 * `embed`, `block.0` ... `block.{n_layer-1}`, `head`; or a custom model,
 * {"kind": "custom", "name": ...}, whose planning layers are its profiles' layer list, with
 * any names. A kind's fields and traits are model_kind.h's table (indexed by enum
 * model_kind); what Ballast knows of a kind beyond the file (sizes, FLOPs, actions,
 * initialisation) is models/model_ops.h's; a custom model has none of it. */
#ifndef BALLAST_MODEL_H
#define BALLAST_MODEL_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "err.h"

enum model_dtype {
    MODEL_DTYPE_FP32, /* everything fp32 */
    MODEL_DTYPE_BF16, /* bf16 compute and activations, fp32 master weights and optimizer state */
    MODEL_DTYPE_FP16, /* fp16 storage as bf16's, with dynamic loss scaling (V100, T4) */
};

enum model_kind { MODEL_KIND_GPT, MODEL_KIND_CUSTOM, MODEL_KIND_LLAMA };

/* How a block computes attention: materialized keeps the (B,NH,T,T) softmax probabilities for
 * the backward; flash (tiled, online softmax) keeps only each row's log-sum-exp and
 * recomputes the scores tile by tile in the backward. */
enum model_attention { MODEL_ATTENTION_MATERIALIZED, MODEL_ATTENTION_FLASH };

#define MODEL_NAME_MAX 64
/* Most layers a custom model may have. */
#define MODEL_CUSTOM_LAYERS_MAX 65536

struct model {
    enum model_kind kind;
    char name[MODEL_NAME_MAX]; /* custom only: the user's name for the model */
    int layer_count;           /* custom only: its planning layers; 0 while unknown (a profile
                                  gives them by its layer list) */
    /* GPT and Llama: */
    int n_layer;
    int n_embd;
    int n_head;
    int seq_len;
    int vocab_size;
    int micro_batch;
    enum model_dtype dtype;
    enum model_attention attention; /* optional "attention"; default materialized */
    /* Llama only: */
    int n_kv_head;     /* key/value heads; divides n_head */
    int ffn_hidden;    /* the SwiGLU MLP's hidden width */
    double rope_theta; /* base of the rotary frequencies */
    double norm_eps;   /* RMSNorm's epsilon */
};

enum model_layer_kind { MODEL_LAYER_EMBED, MODEL_LAYER_BLOCK, MODEL_LAYER_HEAD };

#define MODEL_LAYER_NAME_MAX 32

/* Reads the object `obj` found at `path` of `file` (the model file itself, or the "model"
 * member of a profile or plan). Checks every field and that the sizes stay representable. */
int model_from_json(const cJSON *obj, const char *file, const char *path, struct model *m,
                    struct err *e);
int model_load(const char *file, struct model *m, struct err *e);
/* A new object with the model's fields (no "format": callers embed it or add it). */
cJSON *model_to_json(const struct model *m);

int model_equal(const struct model *a, const struct model *b);
int model_layer_count(const struct model *m);
/* A custom model's layers are all MODEL_LAYER_BLOCK: plain layers, none an embedding or head. */
enum model_layer_kind model_layer_kind(const struct model *m, int layer);
/* The name a layer must have in profiles and plans; "" for a custom model (any name). */
void model_layer_name(const struct model *m, int layer, char name[MODEL_LAYER_NAME_MAX]);
/* "gpt", "llama" or "custom": the kind's name in model_kind.c's table. */
const char *model_kind_name(enum model_kind kind);
const char *model_dtype_name(enum model_dtype dtype);
/* Whether weights and activations are stored in 2 bytes (bf16, fp16) beside fp32 master
 * weights, gradients and optimizer state: the one test of "16-bit" every size and cost uses. */
int model_dtype_16bit(enum model_dtype dtype);
/* "materialized" or "flash". */
const char *model_attention_name(enum model_attention attention);
/* Fails (ERR_INPUT, naming `file` and the model's `path` in it) if some byte count of the
 * model would exceed 2^53. */
int model_check_sizes(const struct model *m, const char *file, const char *path, struct err *e);

/* model_find.c: the file of `item`, a model file (a path, or a name ending in .json) or a bare
 * name of configs/models ("llama2-7b"); ERR_INPUT listing the known names when there is none. */
int model_find(const char *item, char *path, size_t cap, struct err *e);

#endif
