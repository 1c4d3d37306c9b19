/* The Llama family's size tables (models/llama.c), behind sizes.h's functions for a model of
 * kind "llama". */
#ifndef BALLAST_LLAMA_H
#define BALLAST_LLAMA_H

#include "model.h"
#include "tensors.h"

/* Tensors of one class of a Llama layer kind, in carving order, by enum sizes_class (through
 * sizes_layer_tensors, which clears the slots first). */
extern const sizes_tensors_fn llama_size_tables[3];
/* Width of the fused q, k, v projection: (n_head + 2 n_kv_head) * head size. */
int64_t llama_qkv_width(const struct model *m);

#endif
