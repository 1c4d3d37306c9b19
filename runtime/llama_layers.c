/* The Llama family's layers over the backend's kernels (llama_layers.h). The kept qkv holds q
 * and k already rotated: the attention's backward needs them so, and the rotation's backward
 * needs no input (it turns the gradients back by the same angles). */
#include "llama_layers.h"

#include "gpt_layers.h"
#include "model_layers.h"

/* The executor, the stage runner and the profiler find a layer's input, output, gradients,
 * targets and losses by GPT's indices: Llama's tables keep them in the same places. */
_Static_assert((int)LB_INP == (int)BLOCK_INP && (int)LB_OUT == (int)BLOCK_OUT &&
                   (int)LB_DOUT == (int)BLOCK_DOUT && (int)LB_DINP == (int)BLOCK_DINP,
               "llama block tensors where the executor looks for GPT's");
_Static_assert((int)LH_INP == (int)HEAD_INP && (int)LH_TARGETS == (int)HEAD_TARGETS &&
                   (int)LH_DINP == (int)HEAD_DINP && (int)LH_LOSSES == (int)HEAD_LOSSES,
               "llama head tensors where the executor looks for GPT's");

/* The names of the indices above, in enum order (model_layers.h). */
const char *const llama_tensor_names[3][3][SIZES_TENSORS_MAX] = {
    [MODEL_LAYER_EMBED] = {{"wte"}, {"tokens"}, {"out", "dout"}},
    [MODEL_LAYER_BLOCK] = {{"ln1_w", "qkv_w", "proj_w", "ln2_w", "fc_w", "fcproj_w"},
                           {"inp", "ln1", "ln1_rstd", "qkv", "att", "atty", "res2", "ln2",
                            "ln2_rstd", "fch", "fch_swiglu"},
                           {"out", "dout", "dinp", "dsw", "dfch", "dln", "dqkv", "datt"}},
    [MODEL_LAYER_HEAD] = {{"lnf_w", "lm_w"},
                          {"inp", "targets", "lnf", "lnf_rstd", "probs"},
                          {"dlnf", "dinp", "losses"}},
};
const int llama_tensor_counts[3][3] = {
    [MODEL_LAYER_EMBED] = {1, EMBED_KEPT, EMBED_WS},
    [MODEL_LAYER_BLOCK] = {LB_PARAMS, LB_KEPT, LB_WS},
    [MODEL_LAYER_HEAD] = {LH_PARAMS, LH_KEPT, LH_WS},
};

static int kernels(struct backend *be, const struct llama_kernels **k, struct err *e)
{
    *k = be->ops->llama;
    if (*k == NULL)
        return err_set(e, ERR_INPUT, "the %s backend has no kernels for llama models",
                       be->ops->name);
    return ERR_OK;
}

static int llama_cannot_regenerate(struct backend *be, const struct layer_view *l, struct err *e)
{
    return err_set(e, ERR_FAIL,
                   "internal: the %s backend cannot regenerate kept tensors 0x%x of llama layer "
                   "%d",
                   be->ops->name, (unsigned)l->regen, l->layer);
}

static int hs_of(const struct model *m)
{
    return m->n_embd / m->n_head;
}

static int qkv_width(const struct model *m)
{
    return (m->n_head + 2 * m->n_kv_head) * hs_of(m);
}

/* ---- embed: the token embedding alone (positions are the blocks' rotations) ---- */

static int embed_forward(struct backend *be, const struct layer_view *l, void *out,
                         struct err *e)
{
    const struct llama_kernels *k;
    const struct model *m = l->model;
    ERR_TRY(kernels(be, &k, e));
    return k->embedding_forward(be, m->dtype, out, l->kept[EMBED_TOKENS], l->params[EMBED_WTE],
                                m->micro_batch, m->seq_len, m->n_embd, e);
}

static int embed_recompute(struct backend *be, const struct layer_view *l, struct err *e)
{
    /* the tokens are the checkpoint */
    return l->regen == 0 ? ERR_OK : llama_cannot_regenerate(be, l, e);
}

static int embed_backward(struct backend *be, const struct layer_view *l, float loss_scale,
                          struct err *e)
{
    const struct llama_kernels *k;
    const struct model *m = l->model;
    ERR_TRY(kernels(be, &k, e));
    return k->embedding_backward(be, m->dtype, l->grads[EMBED_WTE], l->ws[EMBED_DOUT],
                                 l->kept[EMBED_TOKENS], m->micro_batch, m->seq_len, m->n_embd,
                                 m->vocab_size, e);
}

/* ---- block: x + attn(rmsnorm(x)), then + swiglu_mlp(rmsnorm(.)) ---- */

/* The probabilities (and att v into `out` unless NULL), or with flash attention att v and
 * the rows' log-sum-exp (out never NULL: flash has no "attn" option). */
static int block_attention(struct backend *be, const struct llama_kernels *k,
                           const struct layer_view *l, void *out, struct err *e)
{
    const struct model *m = l->model;
    const struct flash_kernels *f;
    if (m->attention != MODEL_ATTENTION_FLASH)
        return k->attention_forward(be, m->dtype, out, l->kept[LB_ATT], l->kept[LB_QKV],
                                    m->micro_batch, m->seq_len, m->n_head, m->n_kv_head,
                                    hs_of(m), e);
    ERR_TRY(backend_flash(be, &f, e));
    if (out == NULL)
        return llama_cannot_regenerate(be, l, e);
    return f->forward(be, m->dtype, out, l->kept[LB_ATT], l->kept[LB_QKV], m->micro_batch,
                      m->seq_len, m->n_head, m->n_kv_head, hs_of(m), e);
}

/* dqkv from d atty (`datty`), the rotated q and k as kept. */
static int block_attention_backward(struct backend *be, const struct llama_kernels *k,
                                    const struct layer_view *l, const void *datty,
                                    struct err *e)
{
    const struct model *m = l->model;
    void *const *kp = l->kept, *const *w = l->ws;
    const struct flash_kernels *f;
    if (m->attention != MODEL_ATTENTION_FLASH)
        return k->attention_backward(be, m->dtype, w[LB_DQKV], w[LB_DATT], datty, kp[LB_QKV],
                                     kp[LB_ATT], m->micro_batch, m->seq_len, m->n_head,
                                     m->n_kv_head, hs_of(m), e);
    ERR_TRY(backend_flash(be, &f, e));
    return f->backward(be, m->dtype, w[LB_DQKV], w[LB_DATT], datty, kp[LB_QKV], kp[LB_ATTY],
                       kp[LB_ATT], m->micro_batch, m->seq_len, m->n_head, m->n_kv_head,
                       hs_of(m), e);
}

static int block_swiglu(struct backend *be, const struct llama_kernels *k,
                        const struct layer_view *l, struct err *e)
{
    const struct model *m = l->model;
    return k->swiglu_forward(be, m->dtype, l->kept[LB_FCH_SWIGLU], l->kept[LB_FCH],
                             m->micro_batch * m->seq_len, m->ffn_hidden, e);
}

/* Everything but the MLP's output projection: what the backward needs. */
static int block_kept_forward(struct backend *be, const struct llama_kernels *k,
                              const struct layer_view *l, struct err *e)
{
    const struct backend_ops *o = be->ops;
    const struct model *m = l->model;
    enum model_dtype dt = m->dtype;
    int B = m->micro_batch, T = m->seq_len, C = m->n_embd, N = B * T, W = qkv_width(m);
    float eps = (float)m->norm_eps;
    void *const *p = l->params, *const *kp = l->kept;
    ERR_TRY(k->rmsnorm_forward(be, dt, kp[LB_LN1], kp[LB_LN1_RSTD], kp[LB_INP], p[LB_LN1_W], N,
                               C, eps, e));
    ERR_TRY(o->matmul_forward(be, dt, kp[LB_QKV], NULL, kp[LB_LN1], p[LB_QKV_W], NULL, N, C, W,
                              e));
    ERR_TRY(k->rope_forward(be, dt, kp[LB_QKV], B, T, m->n_head + m->n_kv_head, W, hs_of(m),
                            (float)m->rope_theta, e));
    ERR_TRY(block_attention(be, k, l, kp[LB_ATTY], e));
    ERR_TRY(o->matmul_forward(be, dt, kp[LB_RES2], kp[LB_INP], kp[LB_ATTY], p[LB_PROJ_W], NULL,
                              N, C, C, e));
    ERR_TRY(k->rmsnorm_forward(be, dt, kp[LB_LN2], kp[LB_LN2_RSTD], kp[LB_RES2], p[LB_LN2_W], N,
                               C, eps, e));
    ERR_TRY(o->matmul_forward(be, dt, kp[LB_FCH], NULL, kp[LB_LN2], p[LB_FC_W], NULL, N, C,
                              2 * m->ffn_hidden, e));
    return block_swiglu(be, k, l, e);
}

static int block_forward(struct backend *be, const struct layer_view *l, void *out,
                         struct err *e)
{
    const struct llama_kernels *k;
    const struct model *m = l->model;
    ERR_TRY(kernels(be, &k, e));
    ERR_TRY(block_kept_forward(be, k, l, e));
    return be->ops->matmul_forward(be, m->dtype, out, l->kept[LB_RES2], l->kept[LB_FCH_SWIGLU],
                                   l->params[LB_FCPROJ_W], NULL, m->micro_batch * m->seq_len,
                                   m->ffn_hidden, m->n_embd, e);
}

/* The whole block, or a partial option: the probabilities from the kept (rotated) qkv, the
 * SwiGLU from the kept fch, or both; the forward's kernels on the same inputs, so its bits. */
static int block_recompute(struct backend *be, const struct layer_view *l, struct err *e)
{
    const struct llama_kernels *k;
    const uint32_t att = REGEN_BIT(LB_ATT), sw = REGEN_BIT(LB_FCH_SWIGLU);
    ERR_TRY(kernels(be, &k, e));
    if (l->regen == sizes_full_regen(l->model, MODEL_LAYER_BLOCK))
        return block_kept_forward(be, k, l, e);
    if (l->regen & ~(att | sw))
        return llama_cannot_regenerate(be, l, e);
    if (l->regen & att)
        ERR_TRY(block_attention(be, k, l, NULL, e));
    if (l->regen & sw)
        ERR_TRY(block_swiglu(be, k, l, e));
    return ERR_OK;
}

static int block_backward(struct backend *be, const struct layer_view *l, float loss_scale,
                          struct err *e)
{
    const struct llama_kernels *k;
    const struct backend_ops *o = be->ops;
    const struct model *m = l->model;
    enum model_dtype dt = m->dtype;
    int B = m->micro_batch, T = m->seq_len, C = m->n_embd, N = B * T, W = qkv_width(m);
    int F = m->ffn_hidden;
    void *const *p = l->params, *const *kp = l->kept, *const *w = l->ws;
    float *const *g = l->grads;
    ERR_TRY(kernels(be, &k, e));
    /* dout becomes the gradient of res2 in place */
    void *dres = w[LB_DOUT], *dln = w[LB_DLN];
    ERR_TRY(layer_matmul_backward(be, l, w[LB_DSW], g[LB_FCPROJ_W], NULL, dres,
                                  kp[LB_FCH_SWIGLU], p[LB_FCPROJ_W], N, F, C, e));
    ERR_TRY(k->swiglu_backward(be, dt, w[LB_DFCH], kp[LB_FCH], w[LB_DSW], N, F, e));
    ERR_TRY(layer_matmul_backward(be, l, dln, g[LB_FC_W], NULL, w[LB_DFCH], kp[LB_LN2],
                                  p[LB_FC_W], N, C, 2 * F, e));
    ERR_TRY(k->rmsnorm_backward(be, dt, dres, g[LB_LN2_W], dln, kp[LB_RES2], p[LB_LN2_W],
                                kp[LB_LN2_RSTD], N, C, e));
    ERR_TRY(layer_matmul_backward(be, l, dln, g[LB_PROJ_W], NULL, dres, kp[LB_ATTY],
                                  p[LB_PROJ_W], N, C, C, e));
    ERR_TRY(block_attention_backward(be, k, l, dln, e));
    ERR_TRY(k->rope_backward(be, dt, w[LB_DQKV], B, T, m->n_head + m->n_kv_head, W, hs_of(m),
                             (float)m->rope_theta, e));
    ERR_TRY(layer_matmul_backward(be, l, dln, g[LB_QKV_W], NULL, w[LB_DQKV], kp[LB_LN1],
                                  p[LB_QKV_W], N, C, W, e));
    /* the residual carries dres straight to the input; the first norm adds its share */
    ERR_TRY(o->copy(be, w[LB_DINP], dres, (int64_t)N * C * sizes_act_elem_bytes(dt), e));
    return k->rmsnorm_backward(be, dt, w[LB_DINP], g[LB_LN1_W], dln, kp[LB_INP], p[LB_LN1_W],
                               kp[LB_LN1_RSTD], N, C, e);
}

/* ---- head: final RMSNorm, output projection, softmax cross-entropy ---- */

static int head_kept_forward(struct backend *be, const struct layer_view *l, float *losses,
                             struct err *e)
{
    const struct llama_kernels *k;
    const struct model *m = l->model;
    enum model_dtype dt = m->dtype;
    int N = m->micro_batch * m->seq_len, C = m->n_embd, V = m->vocab_size;
    void *const *p = l->params, *const *kp = l->kept;
    ERR_TRY(kernels(be, &k, e));
    ERR_TRY(k->rmsnorm_forward(be, dt, kp[LH_LNF], kp[LH_LNF_RSTD], kp[LH_INP], p[LH_LNF_W], N,
                               C, (float)m->norm_eps, e));
    ERR_TRY(be->ops->matmul_forward(be, dt, kp[LH_PROBS], NULL, kp[LH_LNF], p[LH_LM_W], NULL, N,
                                    C, V, e));
    return be->ops->crossentropy_forward(be, dt, kp[LH_PROBS], losses, kp[LH_TARGETS], N, V, e);
}

static int head_forward(struct backend *be, const struct layer_view *l, void *out,
                        struct err *e)
{
    return head_kept_forward(be, l, l->ws[LH_LOSSES], e);
}

static int head_recompute(struct backend *be, const struct layer_view *l, struct err *e)
{
    if (l->regen != sizes_full_regen(l->model, MODEL_LAYER_HEAD))
        return llama_cannot_regenerate(be, l, e);
    return head_kept_forward(be, l, NULL, e);
}

static int head_backward(struct backend *be, const struct layer_view *l, float loss_scale,
                         struct err *e)
{
    const struct llama_kernels *k;
    const struct backend_ops *o = be->ops;
    const struct model *m = l->model;
    enum model_dtype dt = m->dtype;
    int N = m->micro_batch * m->seq_len, C = m->n_embd, V = m->vocab_size;
    void *const *p = l->params, *const *kp = l->kept, *const *w = l->ws;
    ERR_TRY(kernels(be, &k, e));
    /* probs become d logits in place: the micro-batch is done with them */
    ERR_TRY(o->crossentropy_backward(be, dt, kp[LH_PROBS], kp[LH_TARGETS], loss_scale, N, V, e));
    ERR_TRY(o->matmul_backward(be, dt, w[LH_DLNF], l->grads[LH_LM_W], NULL, kp[LH_PROBS],
                               kp[LH_LNF], p[LH_LM_W], N, C, V, e));
    ERR_TRY(o->zero(be, w[LH_DINP], (int64_t)N * C * sizes_act_elem_bytes(dt), e));
    return k->rmsnorm_backward(be, dt, w[LH_DINP], l->grads[LH_LNF_W], w[LH_DLNF], kp[LH_INP],
                               p[LH_LNF_W], kp[LH_LNF_RSTD], N, C, e);
}

const struct backend_layer_ops llama_layer_ops[MODEL_LAYER_HEAD + 1] = {
    [MODEL_LAYER_EMBED] = {embed_forward, embed_recompute, embed_backward},
    [MODEL_LAYER_BLOCK] = {block_forward, block_recompute, block_backward},
    [MODEL_LAYER_HEAD] = {head_forward, head_recompute, head_backward},
};
