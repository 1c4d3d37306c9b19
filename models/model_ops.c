/* The model table (model_ops.h): each kind's operations, built from its own file (gpt.c,
 * llama.c: size tables, initialisation rule) and the shared ones (sizes.c, estimate.c), and
 * the kinds registered. Above every other file of models/, which never call up into it. */
#include "model_ops.h"

#include <string.h>

#include "estimate.h"
#include "gpt.h"
#include "model_kind.h"

/* GPT and Llama are both decoder-only transformers: the shared functions take each one's own
 * parts (its size tables, its FLOPs) by the model's kind, and Llama's parameter names share
 * GPT's roles, so its initialisation rule and weight decay. */
#define DECODER_OPS(name)                                                                      \
    {                                                                                          \
        .kind = (name), .layer_count = model_layer_count, .layer_name = model_layer_name,      \
        .layer_tensors = sizes_layer_tensors_at, .layer_sizes = sizes_layer,                   \
        .recompute_options = sizes_recompute_options_at, .layer_flops = estimate_layer_flops,  \
        .wgrad_share = estimate_wgrad_share, .param_count = sizes_model_params,                \
        .param_init = model_gpt_param_init, .param_decays = model_gpt_param_decays,            \
    }

const struct model_ops model_ops_gpt = DECODER_OPS("gpt");
const struct model_ops model_ops_llama = DECODER_OPS("llama");

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
