/* The model kinds the runtime runs (model_layers.h). */
#include "model_layers.h"

#include <string.h>

#include "llama_layers.h"
#include "model_kind.h"

static const struct model_layers kinds[] = {
    {"gpt", NULL, gpt_tensor_names, gpt_tensor_counts},
    {"llama", llama_layer_ops, llama_tensor_names, llama_tensor_counts},
};

const struct model_layers *model_layers_of(const struct model *m)
{
    const char *name = model_kind_of(m)->name;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        if (strcmp(kinds[k].kind, name) == 0)
            return &kinds[k];
    return NULL;
}

const struct backend_layer_ops *backend_layers(const struct backend *be, const struct model *m)
{
    const struct model_layers *ml = model_layers_of(m);
    return ml != NULL && ml->ops != NULL ? ml->ops : be->ops->layer;
}
