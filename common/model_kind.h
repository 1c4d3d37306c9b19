/* A model kind as data: its name in the model file, the fields it adds to GPT's, and the
 * traits of its blocks that checks and exporters read (a norm, an MLP, positions, biases,
 * key/value heads) instead of testing which kind a model is. The table lives here, below
 * models/, because the model file's reader (model.c) needs it; a kind's operations (sizes,
 * FLOPs, initialisation, checkpoint tensor names) are models/model_ops.h's, registered there
 * under the same name. Adding a kind: its enum value (model.h), its row here, its files in
 * models/ and their line in models/model_ops.c's registry. */
#ifndef BALLAST_MODEL_KIND_H
#define BALLAST_MODEL_KIND_H

#include <stddef.h>

#include "model.h"

/* A field the kind adds to GPT's, required in its files: an integer (an int member of struct
 * model) or a number (a double member), in [lo, hi]. */
struct model_field {
    const char *name;
    int integer;
    double lo, hi;
    size_t offset; /* offsetof(struct model, ...) */
};

#define MODEL_FIELDS_MAX 8

struct model_kind_info {
    const char *name;      /* in the model file: "gpt" */
    int custom;            /* a bare layer list: no shape, its layers and costs its profiles' */
    struct model_field fields[MODEL_FIELDS_MAX]; /* in the order the file writes them */
    int n_fields;
    /* traits of its blocks */
    int rmsnorm;           /* RMSNorm of epsilon norm_eps, not LayerNorm */
    int swiglu;            /* a SwiGLU MLP of ffn_hidden, not GELU of 4 n_embd */
    int rotary;            /* rotary positions of base rope_theta, no position embedding */
    int biases;            /* its linear layers and norms have biases */
    int gqa;               /* n_kv_head key/value heads (grouped-query attention) */
    const char *hf_type;   /* HuggingFace's model_type for it: "gpt2", "llama" */
};

/* The kind of a model (struct model's kind indexes the table). */
const struct model_kind_info *model_kind_of(const struct model *m);
/* The kind named `name`; NULL for a name Ballast does not know. */
const struct model_kind_info *model_kind_find(const char *name);
/* Its index in the table: struct model's kind. */
enum model_kind model_kind_id(const struct model_kind_info *kind);
/* The known names, quoted and comma-separated, for messages: "\"gpt\", \"llama\", \"custom\"". */
void model_kind_names(char *names, size_t cap);

/* Whether the model is custom (model_kind.custom). */
int model_is_custom(const struct model *m);
/* Key/value heads: n_kv_head for a kind with grouped-query attention, n_head otherwise. */
int model_kv_heads(const struct model *m);
/* The MLP's hidden width: ffn_hidden for a SwiGLU kind, 4 n_embd otherwise. */
int64_t model_ffn_hidden(const struct model *m);

#endif
