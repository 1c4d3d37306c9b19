/* The Llama family (Llama-2, Llama-3) behind the model table: pre-norm blocks of RMSNorm,
 * grouped-query attention with rotary positions, and a SwiGLU MLP; no biases, no position
 * embedding, an output head not tied to the token embedding.
 *
 * The projections are fused as the runtime computes them: qkv_w stacks q_proj (C rows),
 * k_proj and v_proj (C n_kv_head/n_head rows each), fc_w stacks gate_proj over up_proj
 * (ffn_hidden rows each); both are Hugging Face's matrices one above the other. Parameter
 * names follow GPT's where the role is the same, so the initialisation rule and weight decay
 * are GPT's (layer-norm gains 1, residual projections scaled by 1/sqrt(2 n_layer)). */
#include "llama.h"

#include <string.h>

int64_t llama_qkv_width(const struct model *m)
{
    int64_t hs = m->n_embd / m->n_head;
    return ((int64_t)m->n_head + 2 * (int64_t)m->n_kv_head) * hs;
}

/* Appends one tensor to a table. */
static void add_tensor(struct sizes_tensor *out, int *count, const char *name, int64_t elems,
                       int elem_bytes)
{
    out[(*count)++] = (struct sizes_tensor){name, elems, elem_bytes};
}

#define ADD(name_, n_, e_) add_tensor(out, &count, name_, n_, e_)

static int llama_params_tensors(const struct model *m, enum model_layer_kind kind,
                                struct sizes_tensor *out)
{
    int64_t C = m->n_embd, V = m->vocab_size, F = m->ffn_hidden, QKV = llama_qkv_width(m);
    int count = 0;
    switch (kind) {
    case MODEL_LAYER_EMBED:
        ADD("wte", V * C, 4);             /* (V,C) token embedding */
        break;
    case MODEL_LAYER_BLOCK:
        ADD("ln1_w", C, 4);               /* input RMSNorm gain */
        ADD("qkv_w", QKV * C, 4);         /* (QKV,C) q, k, v projections */
        ADD("proj_w", C * C, 4);          /* (C,C) o_proj */
        ADD("ln2_w", C, 4);               /* post-attention RMSNorm gain */
        ADD("fc_w", 2 * F * C, 4);        /* (2F,C) gate_proj over up_proj */
        ADD("fcproj_w", C * F, 4);        /* (C,F) down_proj */
        break;
    case MODEL_LAYER_HEAD:
        ADD("lnf_w", C, 4);
        ADD("lm_w", V * C, 4);            /* (V,C) untied output projection */
        break;
    }
    return count;
}

static int llama_kept_tensors(const struct model *m, enum model_layer_kind kind,
                              struct sizes_tensor *out)
{
    int64_t B = m->micro_batch, T = m->seq_len, C = m->n_embd, NH = m->n_head,
            V = m->vocab_size, F = m->ffn_hidden, QKV = llama_qkv_width(m);
    int e = sizes_act_elem_bytes(m->dtype);
    int count = 0;
    switch (kind) {
    case MODEL_LAYER_EMBED:
        ADD("tokens", B * T, 4);          /* (B,T) input ids: the checkpoint */
        break;
    case MODEL_LAYER_BLOCK:
        ADD("inp", B * T * C, e);         /* (B,T,C) input: the checkpoint */
        ADD("ln1", B * T * C, e);
        ADD("ln1_rstd", B * T, 4);
        ADD("qkv", B * T * QKV, e);       /* (B,T,QKV) q and k rotated, v */
        if (m->attention == MODEL_ATTENTION_FLASH)
            ADD("att_lse", B * NH * T, 4); /* (B,NH,T) log-sum-exp of each row */
        else
            ADD("att", B * NH * T * T, e); /* (B,NH,T,T) softmax probabilities */
        ADD("atty", B * T * C, e);        /* (B,T,C) attention output */
        ADD("res2", B * T * C, e);        /* (B,T,C) residual after attention */
        ADD("ln2", B * T * C, e);
        ADD("ln2_rstd", B * T, 4);
        ADD("fch", B * T * 2 * F, e);     /* (B,T,2F) gate and up */
        ADD("fch_swiglu", B * T * F, e);  /* (B,T,F) silu(gate) * up */
        break;
    case MODEL_LAYER_HEAD:
        ADD("inp", B * T * C, e);         /* checkpoint */
        ADD("targets", B * T, 4);         /* checkpoint */
        ADD("lnf", B * T * C, e);
        ADD("lnf_rstd", B * T, 4);
        ADD("probs", B * T * V, e);       /* (B,T,V) softmax of the logits */
        break;
    }
    return count;
}

static int llama_workspace_tensors(const struct model *m, enum model_layer_kind kind,
                                   struct sizes_tensor *out)
{
    int64_t B = m->micro_batch, T = m->seq_len, C = m->n_embd, NH = m->n_head,
            F = m->ffn_hidden, QKV = llama_qkv_width(m);
    int e = sizes_act_elem_bytes(m->dtype);
    int count = 0;
    switch (kind) {
    case MODEL_LAYER_EMBED:
        ADD("out", B * T * C, e);
        ADD("dout", B * T * C, e);
        break;
    case MODEL_LAYER_BLOCK:
        ADD("out", B * T * C, e);
        ADD("dout", B * T * C, e);
        ADD("dinp", B * T * C, e);
        ADD("dsw", B * T * F, e);         /* d fch_swiglu */
        ADD("dfch", B * T * 2 * F, e);    /* d fch */
        ADD("dln", B * T * C, e);         /* d ln2, d atty, d ln1 in turn */
        ADD("dqkv", B * T * QKV, e);
        if (m->attention == MODEL_ATTENTION_FLASH)
            ADD("att_dsum", B * NH * T, 4); /* (B,NH,T) rowsum(dout * out) */
        else
            ADD("datt", B * NH * T * T, e); /* d att, then d pre-softmax in place */
        break;
    case MODEL_LAYER_HEAD:
        ADD("dlnf", B * T * C, e);
        ADD("dinp", B * T * C, e);
        ADD("losses", B * T, 4);
        break;
    }
    return count;
}

#undef ADD

const sizes_tensors_fn llama_size_tables[3] = {
    [SIZES_PARAMS] = llama_params_tensors,
    [SIZES_KEPT] = llama_kept_tensors,
    [SIZES_WORKSPACE] = llama_workspace_tensors,
};
