/* The CPU backend: host memory, the kernels of kernels_cpu.c composed into the GPT's layers
 * (the order of operations is llm.c's). */
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kernels_cpu.h"

#define AS_F(p) ((float *)(p))
/* the weights: fp32 on this backend (ops.dtypes) */
#define W(l, k) ((const float *)(l)->params[k])
#define AS_I(p) ((int32_t *)(p))

static int cpu_alloc(struct backend *be, int64_t bytes, void **out, struct err *e)
{
    /* Arenas are carved at SIZES_ALIGN offsets; the base must be aligned the same way so that
     * every tensor starts on a cache line (and the kernels see identical alignment whatever
     * the stage split). */
    size_t n = (size_t)((bytes + SIZES_ALIGN - 1) / SIZES_ALIGN * SIZES_ALIGN);
    *out = n > 0 ? aligned_alloc(SIZES_ALIGN, n) : NULL;
    if (n > 0 && *out == NULL)
        return err_set(e, ERR_FAIL, "out of host memory allocating %lld bytes", (long long)bytes);
    return ERR_OK;
}

static void cpu_release(struct backend *be, void *p)
{
    free(p);
}

static int cpu_copy(struct backend *be, void *dst, const void *src, int64_t bytes, struct err *e)
{
    memcpy(dst, src, (size_t)bytes);
    return ERR_OK;
}

static int cpu_zero(struct backend *be, void *dst, int64_t bytes, struct err *e)
{
    memset(dst, 0, (size_t)bytes);
    return ERR_OK;
}

static int cpu_sync(struct backend *be, struct err *e)
{
    return ERR_OK; /* every call above returns when its work is done */
}

/* ---- embed: token and position embeddings ---- */

static int embed_forward(struct backend *be, const struct layer_view *l, void *out,
                         struct err *e)
{
    const struct model *m = l->model;
    encoder_forward(AS_F(out), AS_I(l->kept[EMBED_TOKENS]), W(l, EMBED_WTE),
                    W(l, EMBED_WPE), m->micro_batch, m->seq_len, m->n_embd);
    return ERR_OK;
}

static int unsupported(const struct layer_view *l, struct err *e)
{
    return err_set(e, ERR_FAIL,
                   "internal: the cpu backend cannot regenerate kept tensors 0x%x of layer %d",
                   (unsigned)l->regen, l->layer);
}

static int embed_recompute(struct backend *be, const struct layer_view *l, struct err *e)
{
    /* the tokens are all the backward needs, and they are the checkpoint */
    return l->regen == 0 ? ERR_OK : unsupported(l, e);
}

static int embed_backward(struct backend *be, const struct layer_view *l, float loss_scale,
                          struct err *e)
{
    const struct model *m = l->model;
    encoder_backward(l->grads[EMBED_WTE], l->grads[EMBED_WPE], AS_F(l->ws[EMBED_DOUT]),
                     AS_I(l->kept[EMBED_TOKENS]), m->micro_batch, m->seq_len, m->n_embd);
    return ERR_OK;
}

/* ---- block: x + attn(ln1(x)), then + mlp(ln2(.)) ---- */

/* Everything but the output projection of the MLP: what the backward needs. */
static void block_kept_forward(const struct layer_view *l)
{
    const struct model *m = l->model;
    int B = m->micro_batch, T = m->seq_len, C = m->n_embd, N = B * T;
    void *const *p = l->params;
    void *const *k = l->kept;
    layernorm_forward(AS_F(k[BLOCK_LN1]), AS_F(k[BLOCK_LN1_MEAN]), AS_F(k[BLOCK_LN1_RSTD]),
                      AS_F(k[BLOCK_INP]), AS_F(p[BLOCK_LN1_W]), AS_F(p[BLOCK_LN1_B]), N, C);
    matmul_forward(AS_F(k[BLOCK_QKV]), NULL, AS_F(k[BLOCK_LN1]), AS_F(p[BLOCK_QKV_W]), AS_F(p[BLOCK_QKV_B]), N, C,
                   3 * C);
    attention_forward(AS_F(k[BLOCK_ATTY]), AS_F(k[BLOCK_ATT]), AS_F(k[BLOCK_QKV]), B, T, C, m->n_head);
    matmul_forward(AS_F(k[BLOCK_RES2]), AS_F(k[BLOCK_INP]), AS_F(k[BLOCK_ATTY]), AS_F(p[BLOCK_PROJ_W]),
                   AS_F(p[BLOCK_PROJ_B]), N, C, C);
    layernorm_forward(AS_F(k[BLOCK_LN2]), AS_F(k[BLOCK_LN2_MEAN]), AS_F(k[BLOCK_LN2_RSTD]),
                      AS_F(k[BLOCK_RES2]), AS_F(p[BLOCK_LN2_W]), AS_F(p[BLOCK_LN2_B]), N, C);
    matmul_forward(AS_F(k[BLOCK_FCH]), NULL, AS_F(k[BLOCK_LN2]), AS_F(p[BLOCK_FC_W]), AS_F(p[BLOCK_FC_B]), N, C,
                   4 * C);
    gelu_forward(AS_F(k[BLOCK_FCH_GELU]), AS_F(k[BLOCK_FCH]), (int64_t)N * 4 * C);
}

static int block_forward(struct backend *be, const struct layer_view *l, void *out,
                         struct err *e)
{
    const struct model *m = l->model;
    int N = m->micro_batch * m->seq_len, C = m->n_embd;
    block_kept_forward(l);
    matmul_forward(AS_F(out), AS_F(l->kept[BLOCK_RES2]), AS_F(l->kept[BLOCK_FCH_GELU]),
                   W(l, BLOCK_FCPROJ_W), W(l, BLOCK_FCPROJ_B), N, 4 * C, C);
    return ERR_OK;
}

static int block_recompute(struct backend *be, const struct layer_view *l, struct err *e)
{
    const struct model *m = l->model;
    const uint32_t att = REGEN_BIT(BLOCK_ATT), gelu = REGEN_BIT(BLOCK_FCH_GELU);
    if (l->regen == sizes_full_regen(m, MODEL_LAYER_BLOCK)) {
        block_kept_forward(l);
        return ERR_OK;
    }
    if (l->regen & ~(att | gelu))
        return unsupported(l, e);
    void *const *k = l->kept;
    if (l->regen & att) /* the probabilities only: atty is kept */
        attention_forward(NULL, AS_F(k[BLOCK_ATT]), AS_F(k[BLOCK_QKV]), m->micro_batch,
                          m->seq_len, m->n_embd, m->n_head);
    if (l->regen & gelu)
        gelu_forward(AS_F(k[BLOCK_FCH_GELU]), AS_F(k[BLOCK_FCH]),
                     (int64_t)m->micro_batch * m->seq_len * 4 * m->n_embd);
    return ERR_OK;
}

static int block_backward(struct backend *be, const struct layer_view *l, float loss_scale,
                          struct err *e)
{
    const struct model *m = l->model;
    int B = m->micro_batch, T = m->seq_len, C = m->n_embd, N = B * T;
    void *const *p = l->params;
    float *const *g = l->grads;
    void *const *k = l->kept, *const *w = l->ws;
    /* dout: the output's gradient; it becomes the gradient of res2 in place */
    float *dres = AS_F(w[BLOCK_DOUT]), *d4 = AS_F(w[BLOCK_D4]), *dln = AS_F(w[BLOCK_DLN]);
    matmul_backward(d4, g[BLOCK_FCPROJ_W], g[BLOCK_FCPROJ_B], dres, AS_F(k[BLOCK_FCH_GELU]),
                    AS_F(p[BLOCK_FCPROJ_W]), N, 4 * C, C);
    gelu_backward(d4, AS_F(k[BLOCK_FCH]), d4, (int64_t)N * 4 * C);
    matmul_backward(dln, g[BLOCK_FC_W], g[BLOCK_FC_B], d4, AS_F(k[BLOCK_LN2]), AS_F(p[BLOCK_FC_W]), N, C,
                    4 * C);
    layernorm_backward(dres, g[BLOCK_LN2_W], g[BLOCK_LN2_B], dln, AS_F(k[BLOCK_RES2]),
                       AS_F(p[BLOCK_LN2_W]), AS_F(k[BLOCK_LN2_MEAN]), AS_F(k[BLOCK_LN2_RSTD]), N, C);
    matmul_backward(dln, g[BLOCK_PROJ_W], g[BLOCK_PROJ_B], dres, AS_F(k[BLOCK_ATTY]),
                    AS_F(p[BLOCK_PROJ_W]), N, C, C);
    attention_backward(AS_F(w[BLOCK_DQKV]), AS_F(w[BLOCK_DATT]), dln, AS_F(k[BLOCK_QKV]),
                       AS_F(k[BLOCK_ATT]), B, T, C, m->n_head);
    matmul_backward(dln, g[BLOCK_QKV_W], g[BLOCK_QKV_B], AS_F(w[BLOCK_DQKV]), AS_F(k[BLOCK_LN1]),
                    AS_F(p[BLOCK_QKV_W]), N, C, 3 * C);
    /* the residual carries dres straight to the input; ln1 adds its share */
    memcpy(w[BLOCK_DINP], dres, sizeof(float) * (size_t)N * C);
    layernorm_backward(AS_F(w[BLOCK_DINP]), g[BLOCK_LN1_W], g[BLOCK_LN1_B], dln, AS_F(k[BLOCK_INP]),
                       AS_F(p[BLOCK_LN1_W]), AS_F(k[BLOCK_LN1_MEAN]), AS_F(k[BLOCK_LN1_RSTD]), N, C);
    return ERR_OK;
}

/* ---- head: final layer norm, output projection, softmax cross-entropy ---- */

static void head_kept_forward(const struct layer_view *l, float *losses)
{
    const struct model *m = l->model;
    int N = m->micro_batch * m->seq_len, C = m->n_embd, V = m->vocab_size;
    void *const *k = l->kept;
    layernorm_forward(AS_F(k[HEAD_LNF]), AS_F(k[HEAD_LNF_MEAN]), AS_F(k[HEAD_LNF_RSTD]), AS_F(k[HEAD_INP]),
                      W(l, HEAD_LNF_W), W(l, HEAD_LNF_B), N, C);
    matmul_forward(AS_F(k[HEAD_PROBS]), NULL, AS_F(k[HEAD_LNF]), W(l, HEAD_LM_W), NULL, N, C, V);
    softmax_crossentropy_forward(AS_F(k[HEAD_PROBS]), losses, AS_I(k[HEAD_TARGETS]), N, V);
}

static int head_forward(struct backend *be, const struct layer_view *l, void *out,
                        struct err *e)
{
    head_kept_forward(l, AS_F(l->ws[HEAD_LOSSES]));
    return ERR_OK;
}

static int head_recompute(struct backend *be, const struct layer_view *l, struct err *e)
{
    if (l->regen != sizes_full_regen(l->model, MODEL_LAYER_HEAD))
        return unsupported(l, e);
    head_kept_forward(l, NULL);
    return ERR_OK;
}

static int head_backward(struct backend *be, const struct layer_view *l, float loss_scale,
                         struct err *e)
{
    const struct model *m = l->model;
    int N = m->micro_batch * m->seq_len, C = m->n_embd, V = m->vocab_size;
    void *const *k = l->kept, *const *w = l->ws;
    /* probs become d logits in place: the micro-batch is done with them */
    softmax_crossentropy_backward(AS_F(k[HEAD_PROBS]), AS_I(k[HEAD_TARGETS]), loss_scale, N, V);
    matmul_backward(AS_F(w[HEAD_DLNF]), l->grads[HEAD_LM_W], NULL, AS_F(k[HEAD_PROBS]),
                    AS_F(k[HEAD_LNF]), W(l, HEAD_LM_W), N, C, V);
    memset(w[HEAD_DINP], 0, sizeof(float) * (size_t)N * C);
    layernorm_backward(AS_F(w[HEAD_DINP]), l->grads[HEAD_LNF_W], l->grads[HEAD_LNF_B],
                       AS_F(w[HEAD_DLNF]), AS_F(k[HEAD_INP]), W(l, HEAD_LNF_W),
                       AS_F(k[HEAD_LNF_MEAN]), AS_F(k[HEAD_LNF_RSTD]), N, C);
    return ERR_OK;
}

static int cpu_adamw(struct backend *be, void *weights, float *master, const float *g,
                     float *m, float *v, int64_t n, enum model_dtype dtype,
                     const struct adamw_params *p, int t, int decay, struct err *e)
{
    if (dtype != MODEL_DTYPE_FP32 || weights != master)
        return err_set(e, ERR_FAIL, "internal: the cpu backend's AdamW is fp32 (its weights are "
                                    "the master weights)");
    adamw_update(master, g, m, v, n, p->lr, p->beta1, p->beta2, p->eps,
                 decay ? p->weight_decay : 0.0f, t);
    return ERR_OK;
}

static void cpu_free(struct backend *be)
{
    be->ops = NULL;
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .dtypes = BACKEND_DTYPE_BIT(MODEL_DTYPE_FP32),
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .layer = {
        [MODEL_LAYER_EMBED] = {embed_forward, embed_recompute, embed_backward},
        [MODEL_LAYER_BLOCK] = {block_forward, block_recompute, block_backward},
        [MODEL_LAYER_HEAD] = {head_forward, head_recompute, head_backward},
    },
    .adamw = cpu_adamw,
    .free = cpu_free,
};

int backend_cpu_init(struct backend *be, int threads, struct err *e)
{
    if (threads < 1)
        return err_set(e, ERR_INPUT, "cpu backend: %d threads, expected at least 1", threads);
    /* one thread pool: OpenMP's (kernels_cpu.c splits the matrix products itself) */
    omp_set_num_threads(threads);
    openblas_set_num_threads(1);
    be->ops = &cpu_ops;
    be->threads = threads;
    be->impl = NULL;
    return ERR_OK;
}
