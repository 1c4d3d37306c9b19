/* A layer's tensors as a model kind lists them (gpt.c, llama.c), below sizes.h's functions
 * over every kind: the lifetime classes, one tensor's name and size, a kind's table of them,
 * and the element sizes by dtype. */
#ifndef BALLAST_TENSORS_H
#define BALLAST_TENSORS_H

#include <stdint.h>

#include "model.h"

#define SIZES_TENSORS_MAX 16

enum sizes_class { SIZES_PARAMS, SIZES_KEPT, SIZES_WORKSPACE };

struct sizes_tensor {
    const char *name;
    int64_t elems;
    int elem_bytes;
};

/* One class's tensors of a layer kind of one model kind, in carving order; returns how many. */
typedef int (*sizes_tensors_fn)(const struct model *m, enum model_layer_kind kind,
                                struct sizes_tensor *out);

/* Element bytes of the weights the layers compute with (the params tables list fp32 copies):
 * 4 for fp32, 2 for bf16 (whose fp32 master copy is a separate section). */
static inline int sizes_weight_elem_bytes(enum model_dtype dtype)
{
    return model_dtype_16bit(dtype) ? 2 : 4;
}
/* Element bytes of activations and activation gradients: 4 for fp32, 2 for bf16. */
static inline int sizes_act_elem_bytes(enum model_dtype dtype)
{
    return model_dtype_16bit(dtype) ? 2 : 4;
}

#endif
