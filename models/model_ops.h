/* Models as plug-ins: what the planner, the estimator, the runtime's layout and the profiler
 * need to know of a model kind, as a small table of operations (the shape of ggml's backend
 * tables). GPT (gpt.c) and the Llama family (llama.c) implement it; model_ops.c holds the
 * tables and registers the kinds. A `custom` model (a profile's bare layer list) has no
 * operations: it can be planned, simulated, benched and exported from its profiles, but not
 * estimated, measured or trained. */
#ifndef BALLAST_MODEL_OPS_H
#define BALLAST_MODEL_OPS_H

#include <stdint.h>

#include "model.h"
#include "sizes.h"

struct model_ops {
    const char *kind; /* as in the model file: "gpt", "llama" */
    /* planning layers, and their names in profiles and plans */
    int (*layer_count)(const struct model *m);
    void (*layer_name)(const struct model *m, int layer, char name[MODEL_LAYER_NAME_MAX]);
    /* tensors of one lifetime class (persistent parameters, kept, workspace) of a layer, in
     * the order the runtime carves them; returns how many */
    int (*layer_tensors)(const struct model *m, int layer, enum sizes_class cls,
                         struct sizes_tensor out[SIZES_TENSORS_MAX]);
    /* a layer's bytes per lifetime class (state, kept, checkpoint, output, workspace) */
    void (*layer_sizes)(const struct model *m, int layer, struct layer_sizes *out);
    /* the action menu beyond keep and full: the layer's partial recompute options */
    int (*recompute_options)(const struct model *m, int layer,
                             struct sizes_option out[SIZES_OPTIONS_MAX]);
    /* floating-point operations of one micro-batch's forward and backward of a layer */
    void (*layer_flops)(const struct model *m, int layer, double *fwd, double *bwd);
    /* the share of a layer's backward its weight-gradient pass takes when the backward is
     * split (sizes_wgrad_tensors); 0 for a layer that does not split */
    double (*wgrad_share)(const struct model *m, int layer);
    int64_t (*param_count)(const struct model *m);
    /* the initialisation rule of a parameter tensor, by its name in the size tables: normal
     * (0, std), or the constant `fill` when std is 0 */
    void (*param_init)(const struct model *m, const char *name, float *std, float *fill);
    /* whether AdamW's weight decay applies to the tensor */
    int (*param_decays)(const char *name);
};

extern const struct model_ops model_ops_gpt;
extern const struct model_ops model_ops_llama;

/* The operations of the model's kind; NULL for a custom model, which has none. */
const struct model_ops *model_ops_of(const struct model *m);

/* Parameters of the whole model (0 for a custom model: its profiles do not say). */
int64_t model_param_count(const struct model *m);

#endif
