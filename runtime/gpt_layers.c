/* The GPT's layers over the backend's kernels (gpt_layers.h). The order of operations is
 * llm.c's, and every result depends on it: the CPU's bits are checked against references and
 * the run without recomputation (test_layers, test_train), the GPU's against the CPU's
 * (test_cuda_layers). */
#include "gpt_layers.h"
#include "model_layers.h"

static int gpt_cannot_regenerate(struct backend *be, const struct layer_view *l, struct err *e)
{
    return err_set(e, ERR_FAIL,
                   "internal: the %s backend cannot regenerate kept tensors 0x%x of layer %d",
                   be->ops->name, (unsigned)l->regen, l->layer);
}

int backend_flash(const struct backend *be, const struct flash_kernels **k, struct err *e)
{
    *k = be->ops->flash;
    if (*k == NULL)
        return err_set(e, ERR_INPUT, "the %s backend has no flash attention kernels",
                       be->ops->name);
    return ERR_OK;
}

static int is_flash(const struct model *m)
{
    return m->attention == MODEL_ATTENTION_FLASH;
}

static int64_t act_bytes(const struct model *m, int64_t elems)
{
    return elems * sizes_act_elem_bytes(m->dtype);
}

int layer_matmul_backward(struct backend *be, const struct layer_view *l, void *dinp,
                          float *dw, float *dbias, const void *dout, const void *inp,
                          const void *w, int N, int C, int OC, struct err *e)
{
    const struct model *m = l->model;
    if (l->wgrad == NULL)
        return be->ops->matmul_backward(be, m->dtype, dinp, dw, dbias, dout, inp, w, N, C, OC,
                                        e);
    struct layer_wgrad *r = l->wgrad;
    int k = r->n++;
    if (k >= SIZES_TENSORS_MAX || l->wstash[k] == NULL)
        return err_set(e, ERR_FAIL, "internal: layer %d's backward splits more products than "
                       "its weight pass keeps", l->layer);
    ERR_TRY(be->ops->copy(be, l->wstash[k], dout, act_bytes(m, (int64_t)N * OC), e));
    r->p[k] = (struct layer_wgrad_product){dw, dbias, inp, l->wstash[k], N, C, OC};
    return be->ops->matmul_backward(be, m->dtype, dinp, NULL, NULL, dout, inp, w, N, C, OC, e);
}

int layer_weight_pass(struct backend *be, const struct layer_view *l,
                      const struct layer_wgrad *w, struct err *e)
{
    for (int k = 0; k < w->n; k++) {
        const struct layer_wgrad_product *q = &w->p[k];
        ERR_TRY(be->ops->matmul_backward(be, l->model->dtype, NULL, q->dw, q->dbias, q->dout,
                                         q->inp, NULL, q->N, q->C, q->OC, e));
    }
    return ERR_OK;
}

/* ---- embed: token and position embeddings ---- */

int gpt_embed_forward(struct backend *be, const struct layer_view *l, void *out, struct err *e)
{
    const struct model *m = l->model;
    return be->ops->encoder_forward(be, m->dtype, out, l->kept[EMBED_TOKENS],
                                    l->params[EMBED_WTE], l->params[EMBED_WPE], m->micro_batch,
                                    m->seq_len, m->n_embd, e);
}

int gpt_embed_recompute(struct backend *be, const struct layer_view *l, struct err *e)
{
    /* the tokens are all the backward needs, and they are the checkpoint */
    return l->regen == 0 ? ERR_OK : gpt_cannot_regenerate(be, l, e);
}

int gpt_embed_backward(struct backend *be, const struct layer_view *l, float loss_scale,
                       struct err *e)
{
    const struct model *m = l->model;
    return be->ops->encoder_backward(be, m->dtype, l->grads[EMBED_WTE], l->grads[EMBED_WPE],
                                     l->ws[EMBED_DOUT], l->kept[EMBED_TOKENS], m->micro_batch,
                                     m->seq_len, m->n_embd, m->vocab_size, e);
}

/* ---- block: x + attn(ln1(x)), then + mlp(ln2(.)) ---- */

/* atty and att from the kept qkv: the probabilities, or with flash attention the rows'
 * log-sum-exp (GPT's heads are their own key/value heads). */
static int block_attention_forward(struct backend *be, const struct layer_view *l,
                                   struct err *e)
{
    const struct model *m = l->model;
    void *const *k = l->kept;
    int B = m->micro_batch, T = m->seq_len, C = m->n_embd, NH = m->n_head;
    const struct flash_kernels *f;
    if (!is_flash(m))
        return be->ops->attention_forward(be, m->dtype, k[BLOCK_ATTY], k[BLOCK_ATT],
                                          k[BLOCK_QKV], B, T, C, NH, e);
    ERR_TRY(backend_flash(be, &f, e));
    return f->forward(be, m->dtype, k[BLOCK_ATTY], k[BLOCK_ATT], k[BLOCK_QKV], B, T, NH, NH,
                      C / NH, e);
}

/* dqkv from d atty (`datty`). */
static int gpt_block_attention_backward(struct backend *be, const struct layer_view *l,
                                        const void *datty, struct err *e)
{
    const struct model *m = l->model;
    void *const *k = l->kept, *const *w = l->ws;
    int B = m->micro_batch, T = m->seq_len, C = m->n_embd, NH = m->n_head;
    const struct flash_kernels *f;
    if (!is_flash(m))
        return be->ops->attention_backward(be, m->dtype, w[BLOCK_DQKV], w[BLOCK_DATT], datty,
                                           k[BLOCK_QKV], k[BLOCK_ATT], B, T, C, NH, e);
    ERR_TRY(backend_flash(be, &f, e));
    return f->backward(be, m->dtype, w[BLOCK_DQKV], w[BLOCK_DATT], datty, k[BLOCK_QKV],
                       k[BLOCK_ATTY], k[BLOCK_ATT], B, T, NH, NH, C / NH, e);
}

/* Everything but the output projection of the MLP: what the backward needs. */
static int gpt_block_kept_forward(struct backend *be, const struct layer_view *l, struct err *e)
{
    const struct backend_ops *o = be->ops;
    const struct model *m = l->model;
    enum model_dtype dt = m->dtype;
    int B = m->micro_batch, T = m->seq_len, C = m->n_embd, N = B * T;
    void *const *p = l->params, *const *k = l->kept;
    ERR_TRY(o->layernorm_forward(be, dt, k[BLOCK_LN1], k[BLOCK_LN1_MEAN], k[BLOCK_LN1_RSTD],
                                 k[BLOCK_INP], p[BLOCK_LN1_W], p[BLOCK_LN1_B], N, C, e));
    ERR_TRY(o->matmul_forward(be, dt, k[BLOCK_QKV], NULL, k[BLOCK_LN1], p[BLOCK_QKV_W],
                              p[BLOCK_QKV_B], N, C, 3 * C, e));
    ERR_TRY(block_attention_forward(be, l, e));
    ERR_TRY(o->matmul_forward(be, dt, k[BLOCK_RES2], k[BLOCK_INP], k[BLOCK_ATTY],
                              p[BLOCK_PROJ_W], p[BLOCK_PROJ_B], N, C, C, e));
    ERR_TRY(o->layernorm_forward(be, dt, k[BLOCK_LN2], k[BLOCK_LN2_MEAN], k[BLOCK_LN2_RSTD],
                                 k[BLOCK_RES2], p[BLOCK_LN2_W], p[BLOCK_LN2_B], N, C, e));
    ERR_TRY(o->matmul_forward(be, dt, k[BLOCK_FCH], NULL, k[BLOCK_LN2], p[BLOCK_FC_W],
                              p[BLOCK_FC_B], N, C, 4 * C, e));
    return o->gelu_forward(be, dt, k[BLOCK_FCH_GELU], k[BLOCK_FCH], (int64_t)N * 4 * C, e);
}

int gpt_block_forward(struct backend *be, const struct layer_view *l, void *out, struct err *e)
{
    const struct model *m = l->model;
    int N = m->micro_batch * m->seq_len, C = m->n_embd;
    ERR_TRY(gpt_block_kept_forward(be, l, e));
    return be->ops->matmul_forward(be, m->dtype, out, l->kept[BLOCK_RES2],
                                   l->kept[BLOCK_FCH_GELU], l->params[BLOCK_FCPROJ_W],
                                   l->params[BLOCK_FCPROJ_B], N, 4 * C, C, e);
}

/* The whole block, or a partial option (backend.h): the attention probabilities from the kept
 * qkv (not att v: atty is kept), the GELU from the kept fch, or both; the same kernels as the
 * forward on the same inputs, so the same bits. */
int gpt_block_recompute(struct backend *be, const struct layer_view *l, struct err *e)
{
    const struct model *m = l->model;
    const uint32_t att = REGEN_BIT(BLOCK_ATT), gelu = REGEN_BIT(BLOCK_FCH_GELU);
    if (l->regen == sizes_full_regen(m, MODEL_LAYER_BLOCK))
        return gpt_block_kept_forward(be, l, e);
    /* flash attention has no "attn" option: its probabilities are never kept */
    if (l->regen & ~(att | gelu) || (is_flash(m) && l->regen & att))
        return gpt_cannot_regenerate(be, l, e);
    void *const *k = l->kept;
    if (l->regen & att)
        ERR_TRY(be->ops->attention_forward(be, m->dtype, NULL, k[BLOCK_ATT], k[BLOCK_QKV],
                                           m->micro_batch, m->seq_len, m->n_embd, m->n_head,
                                           e));
    if (l->regen & gelu)
        ERR_TRY(be->ops->gelu_forward(be, m->dtype, k[BLOCK_FCH_GELU], k[BLOCK_FCH],
                                      (int64_t)m->micro_batch * m->seq_len * 4 * m->n_embd, e));
    return ERR_OK;
}

int gpt_block_backward(struct backend *be, const struct layer_view *l, float loss_scale,
                       struct err *e)
{
    const struct backend_ops *o = be->ops;
    const struct model *m = l->model;
    enum model_dtype dt = m->dtype;
    int B = m->micro_batch, T = m->seq_len, C = m->n_embd, N = B * T;
    void *const *p = l->params, *const *k = l->kept, *const *w = l->ws;
    float *const *g = l->grads;
    /* dout: the output's gradient; it becomes the gradient of res2 in place */
    void *dres = w[BLOCK_DOUT], *d4 = w[BLOCK_D4], *dln = w[BLOCK_DLN];
    ERR_TRY(layer_matmul_backward(be, l, d4, g[BLOCK_FCPROJ_W], g[BLOCK_FCPROJ_B], dres,
                                  k[BLOCK_FCH_GELU], p[BLOCK_FCPROJ_W], N, 4 * C, C, e));
    ERR_TRY(o->gelu_backward(be, dt, d4, k[BLOCK_FCH], d4, (int64_t)N * 4 * C, e));
    ERR_TRY(layer_matmul_backward(be, l, dln, g[BLOCK_FC_W], g[BLOCK_FC_B], d4, k[BLOCK_LN2],
                                  p[BLOCK_FC_W], N, C, 4 * C, e));
    ERR_TRY(o->layernorm_backward(be, dt, dres, g[BLOCK_LN2_W], g[BLOCK_LN2_B], dln,
                                  k[BLOCK_RES2], p[BLOCK_LN2_W], k[BLOCK_LN2_MEAN],
                                  k[BLOCK_LN2_RSTD], N, C, e));
    ERR_TRY(layer_matmul_backward(be, l, dln, g[BLOCK_PROJ_W], g[BLOCK_PROJ_B], dres,
                                  k[BLOCK_ATTY], p[BLOCK_PROJ_W], N, C, C, e));
    ERR_TRY(gpt_block_attention_backward(be, l, dln, e));
    ERR_TRY(layer_matmul_backward(be, l, dln, g[BLOCK_QKV_W], g[BLOCK_QKV_B], w[BLOCK_DQKV],
                                  k[BLOCK_LN1], p[BLOCK_QKV_W], N, C, 3 * C, e));
    /* the residual carries dres straight to the input; ln1 adds its share */
    ERR_TRY(o->copy(be, w[BLOCK_DINP], dres, act_bytes(m, (int64_t)N * C), e));
    return o->layernorm_backward(be, dt, w[BLOCK_DINP], g[BLOCK_LN1_W], g[BLOCK_LN1_B], dln,
                                 k[BLOCK_INP], p[BLOCK_LN1_W], k[BLOCK_LN1_MEAN],
                                 k[BLOCK_LN1_RSTD], N, C, e);
}

/* ---- head: final layer norm, output projection, softmax cross-entropy ---- */

static int gpt_head_kept_forward(struct backend *be, const struct layer_view *l, float *losses,
                                 struct err *e)
{
    const struct backend_ops *o = be->ops;
    const struct model *m = l->model;
    enum model_dtype dt = m->dtype;
    int N = m->micro_batch * m->seq_len, C = m->n_embd, V = m->vocab_size;
    void *const *p = l->params, *const *k = l->kept;
    ERR_TRY(o->layernorm_forward(be, dt, k[HEAD_LNF], k[HEAD_LNF_MEAN], k[HEAD_LNF_RSTD],
                                 k[HEAD_INP], p[HEAD_LNF_W], p[HEAD_LNF_B], N, C, e));
    ERR_TRY(o->matmul_forward(be, dt, k[HEAD_PROBS], NULL, k[HEAD_LNF], p[HEAD_LM_W], NULL, N,
                              C, V, e));
    return o->crossentropy_forward(be, dt, k[HEAD_PROBS], losses, k[HEAD_TARGETS], N, V, e);
}

int gpt_head_forward(struct backend *be, const struct layer_view *l, void *out, struct err *e)
{
    return gpt_head_kept_forward(be, l, l->ws[HEAD_LOSSES], e);
}

int gpt_head_recompute(struct backend *be, const struct layer_view *l, struct err *e)
{
    if (l->regen != sizes_full_regen(l->model, MODEL_LAYER_HEAD))
        return gpt_cannot_regenerate(be, l, e);
    return gpt_head_kept_forward(be, l, NULL, e);
}

int gpt_head_backward(struct backend *be, const struct layer_view *l, float loss_scale,
                      struct err *e)
{
    const struct backend_ops *o = be->ops;
    const struct model *m = l->model;
    enum model_dtype dt = m->dtype;
    int N = m->micro_batch * m->seq_len, C = m->n_embd, V = m->vocab_size;
    void *const *p = l->params, *const *k = l->kept, *const *w = l->ws;
    /* probs become d logits in place: the micro-batch is done with them */
    ERR_TRY(o->crossentropy_backward(be, dt, k[HEAD_PROBS], k[HEAD_TARGETS], loss_scale, N, V,
                                     e));
    ERR_TRY(o->matmul_backward(be, dt, w[HEAD_DLNF], l->grads[HEAD_LM_W], NULL, k[HEAD_PROBS],
                               k[HEAD_LNF], p[HEAD_LM_W], N, C, V, e));
    ERR_TRY(o->zero(be, w[HEAD_DINP], act_bytes(m, (int64_t)N * C), e));
    return o->layernorm_backward(be, dt, w[HEAD_DINP], l->grads[HEAD_LNF_W],
                                 l->grads[HEAD_LNF_B], w[HEAD_DLNF], k[HEAD_INP], p[HEAD_LNF_W],
                                 k[HEAD_LNF_MEAN], k[HEAD_LNF_RSTD], N, C, e);
}

/* The names backend.h's indices stand for, in enum order (model_layers.h). */
const char *const gpt_tensor_names[3][3][SIZES_TENSORS_MAX] = {
    [MODEL_LAYER_EMBED] = {{"wte", "wpe"}, {"tokens"}, {"out", "dout"}},
    [MODEL_LAYER_BLOCK] = {{"ln1_w", "ln1_b", "qkv_w", "qkv_b", "proj_w", "proj_b", "ln2_w",
                            "ln2_b", "fc_w", "fc_b", "fcproj_w", "fcproj_b"},
                           {"inp", "ln1", "ln1_mean", "ln1_rstd", "qkv", "att", "atty", "res2",
                            "ln2", "ln2_mean", "ln2_rstd", "fch", "fch_gelu"},
                           {"out", "dout", "dinp", "d4", "dln", "dqkv", "datt"}},
    [MODEL_LAYER_HEAD] = {{"lnf_w", "lnf_b", "lm_w"},
                          {"inp", "targets", "lnf", "lnf_mean", "lnf_rstd", "probs"},
                          {"dlnf", "dinp", "losses"}},
};
const int gpt_tensor_counts[3][3] = {
    [MODEL_LAYER_EMBED] = {EMBED_PARAMS, EMBED_KEPT, EMBED_WS},
    [MODEL_LAYER_BLOCK] = {BLOCK_PARAMS, BLOCK_KEPT, BLOCK_WS},
    [MODEL_LAYER_HEAD] = {HEAD_PARAMS, HEAD_KEPT, HEAD_WS},
};
