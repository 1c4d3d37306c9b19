/* GPT (GPT-2's decoder as llm.c writes it) behind the model table: its size tables
 * (sizes.c), FLOPs (estimate.c) and initialisation rule. */
#include <math.h>
#include <string.h>

#include "estimate.h"
#include "model_kind.h"
#include "model_ops.h"

/* AdamW's weight decay applies to the matrices (embeddings and linear weights), not to
 * biases or layer-norm parameters. */
int model_gpt_param_decays(const char *name)
{
    static const char *const matrices[] = {"wte", "wpe", "qkv_w", "proj_w", "fc_w", "fcproj_w",
                                           "lm_w"};
    for (size_t i = 0; i < sizeof matrices / sizeof matrices[0]; i++)
        if (strcmp(name, matrices[i]) == 0)
            return 1;
    return 0;
}

/* std 0.02, scaled by 1/sqrt(2 n_layer) for the projections into the residual stream;
 * layer-norm weights 1, biases 0. */
void model_gpt_param_init(const struct model *m, const char *name, float *std, float *fill)
{
    size_t n = strlen(name);
    *std = 0;
    *fill = 0;
    if (strncmp(name, "ln", 2) == 0 && strcmp(name + n - 2, "_w") == 0)
        *fill = 1; /* layer-norm gain */
    else if (strcmp(name, "proj_w") == 0 || strcmp(name, "fcproj_w") == 0)
        *std = 0.02f / sqrtf(2.0f * (float)m->n_layer); /* GPT-2's residual scaling */
    else if (model_gpt_param_decays(name))
        *std = 0.02f;
}

const struct model_ops model_ops_gpt = {
    .kind = "gpt",
    .layer_count = model_layer_count,
    .layer_name = model_layer_name,
    .layer_tensors = sizes_layer_tensors_at,
    .layer_sizes = sizes_layer,
    .recompute_options = sizes_recompute_options_at,
    .layer_flops = estimate_layer_flops,
    .wgrad_share = estimate_wgrad_share,
    .param_count = sizes_model_params,
    .param_init = model_gpt_param_init,
    .param_decays = model_gpt_param_decays,
};

/* The kinds with operations, by their name in common/model_kind.c's table: one line a kind. */
static const struct model_ops *const registered[] = {&model_ops_gpt, &model_ops_llama};

const struct model_ops *model_ops_of(const struct model *m)
{
    const char *name = model_kind_of(m)->name;
    for (size_t k = 0; k < sizeof registered / sizeof registered[0]; k++)
        if (strcmp(registered[k]->kind, name) == 0)
            return registered[k];
    return NULL;
}

int64_t model_param_count(const struct model *m)
{
    const struct model_ops *ops = model_ops_of(m);
    return ops != NULL ? ops->param_count(m) : 0;
}
