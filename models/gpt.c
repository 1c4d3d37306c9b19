/* GPT (GPT-2's decoder as llm.c writes it): its size tables and initialisation rule, behind
 * the model table (model_ops.c). */
#include "gpt.h"

#include <math.h>
#include <string.h>

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

#define ADD(n_, e_)                                                                              \
    do {                                                                                         \
        out[count].name = (name_);                                                               \
        out[count].elems = (n_);                                                                 \
        out[count].elem_bytes = (e_);                                                            \
        count++;                                                                                 \
    } while (0)

static int params_tensors(const struct model *m, enum model_layer_kind kind,
                          struct sizes_tensor out[SIZES_TENSORS_MAX])
{
    int64_t C = m->n_embd, V = m->vocab_size, T = m->seq_len;
    int count = 0;
    const char *name_;
    switch (kind) {
    case MODEL_LAYER_EMBED:
        name_ = "wte";      ADD(V * C, 4);      /* (V,C) token embedding */
        name_ = "wpe";      ADD(T * C, 4);      /* (T,C) position embedding */
        break;
    case MODEL_LAYER_BLOCK:
        name_ = "ln1_w";    ADD(C, 4);
        name_ = "ln1_b";    ADD(C, 4);
        name_ = "qkv_w";    ADD(3 * C * C, 4);  /* (3C,C) */
        name_ = "qkv_b";    ADD(3 * C, 4);
        name_ = "proj_w";   ADD(C * C, 4);      /* (C,C) */
        name_ = "proj_b";   ADD(C, 4);
        name_ = "ln2_w";    ADD(C, 4);
        name_ = "ln2_b";    ADD(C, 4);
        name_ = "fc_w";     ADD(4 * C * C, 4);  /* (4C,C) */
        name_ = "fc_b";     ADD(4 * C, 4);
        name_ = "fcproj_w"; ADD(C * 4 * C, 4);  /* (C,4C) */
        name_ = "fcproj_b"; ADD(C, 4);
        break;
    case MODEL_LAYER_HEAD:
        name_ = "lnf_w";    ADD(C, 4);
        name_ = "lnf_b";    ADD(C, 4);
        name_ = "lm_w";     ADD(V * C, 4);      /* (V,C) output projection, not tied to wte */
        break;
    }
    return count;
}

static int kept_tensors(const struct model *m, enum model_layer_kind kind,
                        struct sizes_tensor out[SIZES_TENSORS_MAX])
{
    int64_t B = m->micro_batch, T = m->seq_len, C = m->n_embd, NH = m->n_head,
            V = m->vocab_size;
    int e = sizes_act_elem_bytes(m->dtype);
    int count = 0;
    const char *name_;
    switch (kind) {
    case MODEL_LAYER_EMBED:
        name_ = "tokens";   ADD(B * T, 4);          /* (B,T) input ids: the checkpoint */
        break;
    case MODEL_LAYER_BLOCK:
        name_ = "inp";      ADD(B * T * C, e);      /* (B,T,C) input: the checkpoint */
        name_ = "ln1";      ADD(B * T * C, e);      /* (B,T,C) */
        name_ = "ln1_mean"; ADD(B * T, 4);
        name_ = "ln1_rstd"; ADD(B * T, 4);
        name_ = "qkv";      ADD(B * T * 3 * C, e);  /* (B,T,3C) */
        if (m->attention == MODEL_ATTENTION_FLASH) {
            name_ = "att_lse"; ADD(B * NH * T, 4);  /* (B,NH,T) log-sum-exp of each row */
        } else {
            name_ = "att";  ADD(B * NH * T * T, e); /* (B,NH,T,T) softmax probabilities */
        }
        name_ = "atty";     ADD(B * T * C, e);      /* (B,T,C) attention output */
        name_ = "res2";     ADD(B * T * C, e);      /* (B,T,C) residual after attention */
        name_ = "ln2";      ADD(B * T * C, e);
        name_ = "ln2_mean"; ADD(B * T, 4);
        name_ = "ln2_rstd"; ADD(B * T, 4);
        name_ = "fch";      ADD(B * T * 4 * C, e);  /* (B,T,4C) before GELU */
        name_ = "fch_gelu"; ADD(B * T * 4 * C, e);  /* (B,T,4C) after GELU */
        break;
    case MODEL_LAYER_HEAD:
        name_ = "inp";      ADD(B * T * C, e);      /* (B,T,C) input: checkpoint */
        name_ = "targets";  ADD(B * T, 4);          /* (B,T) target ids: checkpoint */
        name_ = "lnf";      ADD(B * T * C, e);
        name_ = "lnf_mean"; ADD(B * T, 4);
        name_ = "lnf_rstd"; ADD(B * T, 4);
        name_ = "probs";    ADD(B * T * V, e);      /* (B,T,V) softmax of the logits */
        break;
    }
    return count;
}

static int workspace_tensors(const struct model *m, enum model_layer_kind kind,
                             struct sizes_tensor out[SIZES_TENSORS_MAX])
{
    int64_t B = m->micro_batch, T = m->seq_len, C = m->n_embd, NH = m->n_head;
    int e = sizes_act_elem_bytes(m->dtype);
    int count = 0;
    const char *name_;
    switch (kind) {
    case MODEL_LAYER_EMBED:
        name_ = "out";      ADD(B * T * C, e);      /* output, the send buffer */
        name_ = "dout";     ADD(B * T * C, e);      /* gradient of the output */
        break;
    case MODEL_LAYER_BLOCK:
        name_ = "out";      ADD(B * T * C, e);
        name_ = "dout";     ADD(B * T * C, e);
        name_ = "dinp";     ADD(B * T * C, e);      /* gradient of the input, sent back */
        name_ = "d4";       ADD(B * T * 4 * C, e);  /* d fch_gelu, then d fch in place */
        name_ = "dln";      ADD(B * T * C, e);      /* d ln2, d atty, d ln1 in turn */
        name_ = "dqkv";     ADD(B * T * 3 * C, e);
        if (m->attention == MODEL_ATTENTION_FLASH) {
            name_ = "att_dsum"; ADD(B * NH * T, 4); /* (B,NH,T) rowsum(dout * out) */
        } else {
            name_ = "datt"; ADD(B * NH * T * T, e); /* d att, then d pre-softmax in place */
        }
        break;
    case MODEL_LAYER_HEAD:
        name_ = "dlnf";     ADD(B * T * C, e);
        name_ = "dinp";     ADD(B * T * C, e);
        name_ = "losses";   ADD(B * T, 4);          /* per-token losses */
        break;
    }
    return count;
}

#undef ADD

const sizes_tensors_fn gpt_size_tables[3] = {
    [SIZES_PARAMS] = params_tensors,
    [SIZES_KEPT] = kept_tensors,
    [SIZES_WORKSPACE] = workspace_tensors,
};
