#include "sizes.h"

#include <string.h>

#include "gpt.h"
#include "llama.h"

static int act_elem_bytes(const struct model *m)
{
    return sizes_act_elem_bytes(m->dtype);
}

int sizes_layer_tensors(const struct model *m, enum model_layer_kind kind, enum sizes_class cls,
                        struct sizes_tensor out[SIZES_TENSORS_MAX])
{
    const sizes_tensors_fn *tables =
        m->kind == MODEL_KIND_LLAMA ? llama_size_tables : gpt_size_tables;
    /* every slot defined: callers loop to the count, which the compiler cannot bound */
    memset(out, 0, SIZES_TENSORS_MAX * sizeof *out);
    return tables[cls](m, kind, out);
}

int sizes_layer_tensors_at(const struct model *m, int layer, enum sizes_class cls,
                           struct sizes_tensor out[SIZES_TENSORS_MAX])
{
    return sizes_layer_tensors(m, model_layer_kind(m, layer), cls, out);
}

int sizes_recompute_options_at(const struct model *m, int layer,
                               struct sizes_option out[SIZES_OPTIONS_MAX])
{
    return sizes_recompute_options(m, model_layer_kind(m, layer), out);
}

int64_t sizes_model_params(const struct model *m)
{
    int64_t total = 0;
    for (int l = 0; l < model_layer_count(m); l++)
        total += sizes_layer_params(m, model_layer_kind(m, l));
    return total;
}

int sizes_ckpt_tensor_count(enum model_layer_kind kind)
{
    return kind == MODEL_LAYER_HEAD ? 2 : 1;
}

/* Options by the names of the tensors they regenerate, so that a change to the tables above
 * cannot silently shift them. */
static const struct {
    enum model_kind model;
    enum model_layer_kind kind;
    const char *name;
    const char *regen[3];
} options[] = {
    /* QK^T and the causal softmax again from the kept qkv; atty stays kept (the attention
     * projection's input), as in Megatron-LM's selective recomputation of core attention */
    {MODEL_KIND_GPT, MODEL_LAYER_BLOCK, "attn", {"att"}},
    {MODEL_KIND_GPT, MODEL_LAYER_BLOCK, "mlp", {"fch_gelu"}}, /* GELU again from the kept fch */
    {MODEL_KIND_GPT, MODEL_LAYER_BLOCK, "attn+mlp", {"att", "fch_gelu"}},
    /* Llama: the same, the kept qkv already rotated; SwiGLU again from the kept gate and up */
    {MODEL_KIND_LLAMA, MODEL_LAYER_BLOCK, "attn", {"att"}},
    {MODEL_KIND_LLAMA, MODEL_LAYER_BLOCK, "mlp", {"fch_swiglu"}},
    {MODEL_KIND_LLAMA, MODEL_LAYER_BLOCK, "attn+mlp", {"att", "fch_swiglu"}},
};

/* The regen set of the kept tensors `names`; 0 when the model keeps one of them not at all
 * (flash attention keeps no probabilities: no "attn" option). */
static uint32_t mask_of(const struct model *m, enum model_layer_kind kind,
                        const char *const *names)
{
    struct sizes_tensor t[SIZES_TENSORS_MAX];
    int n = sizes_layer_tensors(m, kind, SIZES_KEPT, t);
    uint32_t mask = 0;
    for (int j = 0; j < 3 && names[j] != NULL; j++) {
        uint32_t bit = 0;
        for (int k = 0; k < n; k++)
            if (strcmp(t[k].name, names[j]) == 0)
                bit = (uint32_t)1 << k;
        if (bit == 0)
            return 0;
        mask |= bit;
    }
    return mask;
}

int sizes_recompute_options(const struct model *m, enum model_layer_kind kind,
                            struct sizes_option out[SIZES_OPTIONS_MAX])
{
    int count = 0;
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
        if (options[i].model != m->kind || options[i].kind != kind || count == SIZES_OPTIONS_MAX)
            continue;
        uint32_t regen = mask_of(m, kind, options[i].regen);
        if (regen != 0)
            out[count++] = (struct sizes_option){options[i].name, regen};
    }
    return count;
}

int sizes_find_option(const struct model *m, enum model_layer_kind kind, const char *name,
                      uint32_t *regen)
{
    struct sizes_option o[SIZES_OPTIONS_MAX];
    int n = sizes_recompute_options(m, kind, o);
    for (int i = 0; i < n; i++)
        if (strcmp(o[i].name, name) == 0) {
            *regen = o[i].regen;
            return 1;
        }
    return 0;
}

uint32_t sizes_full_regen(const struct model *m, enum model_layer_kind kind)
{
    struct sizes_tensor t[SIZES_TENSORS_MAX];
    int n = sizes_layer_tensors(m, kind, SIZES_KEPT, t), ckpt = sizes_ckpt_tensor_count(kind);
    return (((uint32_t)1 << n) - 1) & ~(((uint32_t)1 << ckpt) - 1);
}

void sizes_regen_bytes(const struct model *m, enum model_layer_kind kind, uint32_t regen,
                       int64_t *kept, int64_t *transient)
{
    struct sizes_tensor t[SIZES_TENSORS_MAX];
    int n = sizes_layer_tensors(m, kind, SIZES_KEPT, t);
    *kept = *transient = 0;
    for (int k = 0; k < n; k++)
        *(regen >> k & 1 ? transient : kept) += sizes_tensor_bytes(&t[k]);
}

int64_t sizes_tensor_bytes(const struct sizes_tensor *t)
{
    int64_t b = t->elems * t->elem_bytes;
    return (b + SIZES_ALIGN - 1) / SIZES_ALIGN * SIZES_ALIGN;
}

int64_t sizes_tensors_bytes(const struct sizes_tensor *t, int n)
{
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += sizes_tensor_bytes(&t[i]);
    return total;
}

void sizes_state_split(enum model_dtype dtype, int64_t weights_bytes, int64_t fp32_bytes,
                       int64_t *param_bytes, int64_t *grad_bytes, int64_t *optimizer_bytes)
{
    /* beside the weights, fp32 sections: gradients, Adam m and v, and for bf16 the fp32
     * master weights */
    int optimizer_sections = model_dtype_16bit(dtype) ? 3 : 2;
    *param_bytes = weights_bytes;
    *grad_bytes = fp32_bytes;
    *optimizer_bytes = optimizer_sections * fp32_bytes;
}

int64_t sizes_state_bytes(enum model_dtype dtype, int64_t weights_bytes, int64_t fp32_bytes)
{
    int64_t param, grad, optimizer;
    sizes_state_split(dtype, weights_bytes, fp32_bytes, &param, &grad, &optimizer);
    return param + grad + optimizer;
}

int sizes_state_bytes_per_param(enum model_dtype dtype)
{
    return (int)sizes_state_bytes(dtype, sizes_weight_elem_bytes(dtype), 4);
}

int64_t sizes_activation_bytes(const struct model *m)
{
    return (int64_t)m->micro_batch * m->seq_len * m->n_embd * act_elem_bytes(m);
}

int64_t sizes_layer_params(const struct model *m, enum model_layer_kind kind)
{
    struct sizes_tensor t[SIZES_TENSORS_MAX];
    int n = sizes_layer_tensors(m, kind, SIZES_PARAMS, t);
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += t[i].elems;
    return total;
}

void sizes_layer(const struct model *m, int layer, struct layer_sizes *out)
{
    struct sizes_tensor t[SIZES_TENSORS_MAX];
    enum model_layer_kind kind = model_layer_kind(m, layer);
    int n = sizes_layer_tensors(m, kind, SIZES_PARAMS, t);
    int64_t fp32_copy = sizes_tensors_bytes(t, n), weights_copy = 0;
    out->params = sizes_layer_params(m, kind);
    for (int i = 0; i < n; i++) {
        struct sizes_tensor w = t[i];
        w.elem_bytes = sizes_weight_elem_bytes(m->dtype);
        weights_copy += sizes_tensor_bytes(&w);
    }
    sizes_state_split(m->dtype, weights_copy, fp32_copy, &out->param_bytes, &out->grad_bytes,
                      &out->optimizer_bytes);
    out->state_bytes = out->param_bytes + out->grad_bytes + out->optimizer_bytes;
    n = sizes_layer_tensors(m, kind, SIZES_KEPT, t);
    out->act_bytes = sizes_tensors_bytes(t, n);
    out->ckpt_bytes = sizes_tensors_bytes(t, sizes_ckpt_tensor_count(kind));
    n = sizes_layer_tensors(m, kind, SIZES_WORKSPACE, t);
    out->workspace_bytes = sizes_tensors_bytes(t, n);
    if (kind == MODEL_LAYER_HEAD)
        out->out_bytes = 4; /* the micro-batch's mean loss */
    else
        out->out_bytes = sizes_activation_bytes(m);
}

int sizes_wgrad_tensors(const struct model *m, enum model_layer_kind kind,
                        struct sizes_tensor out[SIZES_TENSORS_MAX])
{
    int64_t BT = (int64_t)m->micro_batch * m->seq_len, C = m->n_embd;
    int llama = m->kind == MODEL_KIND_LLAMA;
    int64_t mlp = llama ? 2 * (int64_t)m->ffn_hidden : 4 * C;
    int64_t qkv = llama ? llama_qkv_width(m) : 3 * C;
    int e = sizes_act_elem_bytes(m->dtype), count = 0;
    memset(out, 0, SIZES_TENSORS_MAX * sizeof *out);
    if (kind != MODEL_LAYER_BLOCK || m->kind == MODEL_KIND_CUSTOM)
        return 0;
    const struct sizes_tensor t[] = {
        {"d_fcproj", BT * C, e}, {"d_fc", BT * mlp, e}, {"d_proj", BT * C, e},
        {"d_qkv", BT * qkv, e},
    };
    for (; count < (int)(sizeof t / sizeof t[0]); count++)
        out[count] = t[count];
    return count;
}

int64_t sizes_wgrad_bytes(const struct model *m, enum model_layer_kind kind)
{
    struct sizes_tensor t[SIZES_TENSORS_MAX];
    return sizes_tensors_bytes(t, sizes_wgrad_tensors(m, kind, t));
}
