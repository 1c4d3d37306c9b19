/* The model kinds' table (model_kind.h). */
#include "model_kind.h"

#include <stdio.h>
#include <string.h>

#define FIELD_INT(n_, lo_, hi_) {#n_, 1, lo_, hi_, offsetof(struct model, n_)}
#define FIELD_NUM(n_, lo_, hi_) {#n_, 0, lo_, hi_, offsetof(struct model, n_)}

static const struct model_kind_info kinds[] = {
    /* GPT-2's decoder as llm.c writes it: LayerNorm, GELU MLP, learned positions, biases */
    [MODEL_KIND_GPT] = {.name = "gpt", .biases = 1, .hf_type = "gpt2"},
    [MODEL_KIND_CUSTOM] = {.name = "custom", .custom = 1},
    /* the Llama family (Llama-2, Llama-3) */
    [MODEL_KIND_LLAMA] = {.name = "llama",
                          .fields = {FIELD_INT(n_kv_head, 1, 1 << 20),
                                     FIELD_INT(ffn_hidden, 1, 1 << 24),
                                     FIELD_NUM(rope_theta, 1.0, 1e12),
                                     FIELD_NUM(norm_eps, 1e-12, 1.0)},
                          .n_fields = 4,
                          .rmsnorm = 1,
                          .swiglu = 1,
                          .rotary = 1,
                          .gqa = 1,
                          .hf_type = "llama"},
};

#define N_KINDS ((int)(sizeof kinds / sizeof kinds[0]))

const struct model_kind_info *model_kind_of(const struct model *m)
{
    return &kinds[m->kind];
}

const struct model_kind_info *model_kind_find(const char *name)
{
    for (int k = 0; k < N_KINDS; k++)
        if (strcmp(kinds[k].name, name) == 0)
            return &kinds[k];
    return NULL;
}

enum model_kind model_kind_id(const struct model_kind_info *kind)
{
    return (enum model_kind)(kind - kinds);
}

void model_kind_names(char *names, size_t cap)
{
    size_t n = 0;
    names[0] = '\0';
    /* the kinds with a shape first, custom last */
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < N_KINDS; k++)
            if (kinds[k].custom == pass)
                n += (size_t)snprintf(names + n, cap - n, "%s\"%s\"", n ? ", " : "",
                                      kinds[k].name);
}

const char *model_kind_name(enum model_kind kind)
{
    return kinds[kind].name;
}

int model_is_custom(const struct model *m)
{
    return model_kind_of(m)->custom;
}

int model_kv_heads(const struct model *m)
{
    return model_kind_of(m)->gqa ? m->n_kv_head : m->n_head;
}

int64_t model_ffn_hidden(const struct model *m)
{
    return model_kind_of(m)->swiglu ? m->ffn_hidden : 4 * (int64_t)m->n_embd;
}
