/* GPT's own parts (models/gpt.c) behind the model table (model_ops.c) and sizes.h's functions
 * for a model of kind "gpt". */
#ifndef BALLAST_GPT_H
#define BALLAST_GPT_H

#include "model.h"
#include "tensors.h"

/* Tensors of one class of a GPT layer kind, in carving order, by enum sizes_class (through
 * sizes_layer_tensors, which clears the slots first). */
extern const sizes_tensors_fn gpt_size_tables[3];

/* GPT's initialisation rule and weight decay, by parameter name (Llama's names share GPT's
 * where the roles are the same, and so its rule). */
void model_gpt_param_init(const struct model *m, const char *name, float *std, float *fill);
int model_gpt_param_decays(const char *name);

#endif
