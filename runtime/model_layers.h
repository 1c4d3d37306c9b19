/* The runtime's layers of each model kind, found by the kind's name (common/model_kind.h):
 * the layer functions over the backend's kernels, and the tensor names its indices stand for
 * (checked against models/' size tables by layout_init). A kind's layers are its own
 * (gpt_layers.c, llama_layers.c); adding one is its row in model_layers.c. */
#ifndef BALLAST_MODEL_LAYERS_H
#define BALLAST_MODEL_LAYERS_H

#include "backend.h"

struct model_layers {
    const char *kind;                     /* model_kind_info.name */
    const struct backend_layer_ops *ops;  /* by enum model_layer_kind; NULL: the backend's
                                             own `layer` (GPT's, which every backend has) */
    /* the names of its tensor indices and how many, by layer kind and sizes class */
    const char *const (*names)[3][SIZES_TENSORS_MAX];
    const int (*counts)[3];
};

/* The layers of the model's kind; NULL for a kind the runtime cannot run (custom). */
const struct model_layers *model_layers_of(const struct model *m);

/* The tables of each kind's file. */
extern const char *const gpt_tensor_names[3][3][SIZES_TENSORS_MAX];
extern const int gpt_tensor_counts[3][3];
extern const char *const llama_tensor_names[3][3][SIZES_TENSORS_MAX];
extern const int llama_tensor_counts[3][3];

#endif
