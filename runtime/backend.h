/* The compute backend: a small table of function pointers (ggml style) behind which the
 * CPU code (backend_cpu.c) and the CUDA code (cuda/backend.cu: cuBLAS), each fp32, bf16 and fp16,
 * live. A backend is memory and kernels only; the GPT's layers are composed once over its
 * kernels (gpt_layers.c), and the Llama family's over them and its `llama` kernels
 * (llama_layers.c); backend_layers picks by model kind. The schedule executor (stage.c) reaches memory and layers only
 * through this table, never a kernel directly.
 *
 * Memory. The runtime allocates four arenas with `alloc` (persistent, activations, transient,
 * workspace; sizes from layout.h) and carves every tensor out of them. "Device" pointers are
 * only ever handed back to the backend or the transport; the host reads and writes them with
 * `upload` and `download`.
 *
 * Kernels. llm.c's free functions, outputs first, then inputs, parameters and sizes (shapes in
 * kernels_cpu.h and cuda/kernels.cuh, which implement them). Backward kernels ADD into
 * parameter gradients; activation gradients are overwritten, except layernorm_backward's dinp,
 * which is added to. `dt` is the model's dtype: the element type of every `void *` tensor.
 *
 * Layers. Each layer kind has forward, recompute and backward. A layer sees its tensors
 * through a struct layer_view: pointers in the order of the size tables (common/sizes.h),
 * indexed by the enums below, and the set of kept tensors it regenerates (`regen`: the plan's
 * choice for the layer, keep, whole or a partial option). Forward writes every kept tensor
 * wherever the view points, whatever the choice. Work may be queued (a CUDA stream): `sync`
 * waits for it, and the executor calls it before timing a span or handing a buffer to the
 * transport.
 *
 * Precision. The model's dtype decides the element type of a layer's weights (`params`),
 * activations, activation gradients and workspace: fp32, or 16 bits for a bf16 or fp16 model (element
 * sizes from common/sizes.h: sizes_weight_elem_bytes, sizes_act_elem_bytes). Parameter
 * gradients, the fp32 master weights and AdamW's moments are fp32 in both; layer-norm
 * statistics, token ids and losses are always fp32 / int32. For fp32 the master weights are
 * the weights themselves. `dtypes` says which dtypes a backend computes; the executor refuses
 * a model whose dtype its backend lacks. */
#ifndef BALLAST_BACKEND_H
#define BALLAST_BACKEND_H

#include <stdint.h>

#include "err.h"
#include "model.h"
#include "sizes.h"

/* AdamW's hyper-parameters; weight decay applies to the parameters the caller says decay. */
struct adamw_params {
    float lr, beta1, beta2, eps, weight_decay;
};

/* AdamW as GPT-2 reproductions train it (nanoGPT, llm.c): the one home of these constants. */
#define ADAMW_BETA1 0.9f
#define ADAMW_BETA2 0.95f
#define ADAMW_EPS 1e-8f
#define ADAMW_WEIGHT_DECAY 0.1f

static inline struct adamw_params adamw_params_gpt(float lr)
{
    return (struct adamw_params){lr, ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS, ADAMW_WEIGHT_DECAY};
}

#define REGEN_BIT(k) ((uint32_t)1 << (k))

/* Tensor indices, in the order of the size tables (checked against them at start-up by
 * layout_init, so a change to sizes.c cannot silently shift them). */
enum embed_param { EMBED_WTE, EMBED_WPE, EMBED_PARAMS };
enum embed_kept { EMBED_TOKENS, EMBED_KEPT };
enum embed_ws { EMBED_OUT, EMBED_DOUT, EMBED_WS };
enum block_param {
    BLOCK_LN1_W, BLOCK_LN1_B, BLOCK_QKV_W, BLOCK_QKV_B, BLOCK_PROJ_W, BLOCK_PROJ_B,
    BLOCK_LN2_W, BLOCK_LN2_B, BLOCK_FC_W, BLOCK_FC_B, BLOCK_FCPROJ_W, BLOCK_FCPROJ_B,
    BLOCK_PARAMS
};
enum block_kept {
    BLOCK_INP, BLOCK_LN1, BLOCK_LN1_MEAN, BLOCK_LN1_RSTD, BLOCK_QKV, BLOCK_ATT, BLOCK_ATTY,
    BLOCK_RES2, BLOCK_LN2, BLOCK_LN2_MEAN, BLOCK_LN2_RSTD, BLOCK_FCH, BLOCK_FCH_GELU,
    BLOCK_KEPT
};
enum block_ws { BLOCK_OUT, BLOCK_DOUT, BLOCK_DINP, BLOCK_D4, BLOCK_DLN, BLOCK_DQKV, BLOCK_DATT,
                BLOCK_WS };
enum head_param { HEAD_LNF_W, HEAD_LNF_B, HEAD_LM_W, HEAD_PARAMS };
enum head_kept { HEAD_INP, HEAD_TARGETS, HEAD_LNF, HEAD_LNF_MEAN, HEAD_LNF_RSTD, HEAD_PROBS,
                 HEAD_KEPT };
enum head_ws { HEAD_DLNF, HEAD_DINP, HEAD_LOSSES, HEAD_WS };

/* A split backward (schedule.h): what the input-gradient pass leaves the weight pass, matrix
 * product by product in the order the backward reaches them: the gradients the weight
 * gradient adds into (dbias NULL: none), the product's kept input, and its output gradient,
 * copied into the view's wstash[k]. */
struct layer_wgrad {
    int n;
    struct layer_wgrad_product {
        float *dw, *dbias;
        const void *inp, *dout;
        int N, C, OC;
    } p[SIZES_TENSORS_MAX];
};

/* One layer for one micro-batch. */
struct layer_view {
    const struct model *model;
    enum model_layer_kind kind;
    int layer; /* global index */
    void *params[SIZES_TENSORS_MAX]; /* the weights computed with: fp32, or 16-bit */
    float *grads[SIZES_TENSORS_MAX]; /* fp32 always */
    void *kept[SIZES_TENSORS_MAX]; /* in the slot, or in the transient when regenerated */
    void *ws[SIZES_TENSORS_MAX];
    /* A split backward: its weight pass's tensors (in the slot, layout.h) and where the
     * backward leaves the products for it; wgrad NULL: the backward runs whole. */
    void *wstash[SIZES_TENSORS_MAX];
    struct layer_wgrad *wgrad;
    /* The kept tensors this layer regenerates (bit k: kept[k]), which live in the transient:
     * 0 when it keeps everything; sizes_full_regen (every kept tensor but the checkpoint) when
     * it is recomputed whole; a partial option's set (sizes_recompute_options) otherwise. */
    uint32_t regen;
};

struct backend;
struct llama_kernels;
struct flash_kernels;

struct backend_layer_ops {
    /* Writes the kept tensors and the output `out` (B,T,C): the next layer's input or the
     * send buffer. The head has no `out`: it writes per-token losses to its ws[HEAD_LOSSES]. */
    int (*forward)(struct backend *be, const struct layer_view *l, void *out, struct err *e);
    /* Regenerates exactly the kept tensors of l->regen, bit for bit as forward wrote them,
     * from the other kept tensors (which hold forward's values) and the parameters; writes no
     * output and no other kept tensor. Called just before backward, only when regen is not 0.
     * Which sets a backend must support (any other: ERR_FAIL):
     *   embed   none (its only kept tensor is the checkpoint);
     *   block   the whole block, sizes_full_regen: everything from inp, as forward does, less
     *             the MLP's output projection (nothing downstream needs the output again);
     *           "attn" {att}: the causal softmax probabilities from the kept qkv (QK^T / sqrt(hs),
     *             mask, softmax), not att v: atty stays kept, as in Megatron-LM's selective
     *             recomputation;
     *           "mlp" {fch_gelu}: GELU of the kept fch;
     *           "attn+mlp" {att, fch_gelu}: both;
     *           with flash attention ("attention": "flash") kept[BLOCK_ATT] is the rows'
     *             log-sum-exp, not probabilities, and there is no "attn" nor "attn+mlp":
     *             the whole block and "mlp" only;
     *   head    the whole head, sizes_full_regen. */
    int (*recompute)(struct backend *be, const struct layer_view *l, struct err *e);
    /* Consumes ws[*_DOUT] (the output's gradient; the head has none and uses loss_scale,
     * d step-loss / d token-loss), writes ws[*_DINP] (the input's gradient; the embedding has
     * none) and ADDS into the parameter gradients; with l->wgrad, the block's matrix products'
     * weight gradients are left there for layer_weight_pass (gpt_layers.h) instead. */
    int (*backward)(struct backend *be, const struct layer_view *l, float loss_scale,
                    struct err *e);
};

/* Bit of enum model_dtype d in backend_ops.dtypes. */
#define BACKEND_DTYPE_BIT(d) (1u << (unsigned)(d))

struct backend_ops {
    const char *name;
    unsigned dtypes; /* BACKEND_DTYPE_BIT of each dtype the layers compute */
    int (*alloc)(struct backend *be, int64_t bytes, void **out, struct err *e);
    void (*release)(struct backend *be, void *p);
    int (*upload)(struct backend *be, void *dst, const void *src, int64_t bytes, struct err *e);
    int (*download)(struct backend *be, void *dst, const void *src, int64_t bytes,
                    struct err *e);
    int (*copy)(struct backend *be, void *dst, const void *src, int64_t bytes, struct err *e);
    int (*zero)(struct backend *be, void *dst, int64_t bytes, struct err *e);
    int (*sync)(struct backend *be, struct err *e);
    /* The model's layers: a backend fills them with GPT_LAYER_OPS (gpt_layers.h). */
    struct backend_layer_ops layer[MODEL_LAYER_HEAD + 1]; /* by enum model_layer_kind */
    /* out (B,T,C) = wte[tokens] + wpe[t]; backward: dwte (V,C), dwpe (T,C) += ... */
    int (*encoder_forward)(struct backend *be, enum model_dtype dt, void *out,
                           const int32_t *tokens, const void *wte, const void *wpe, int B,
                           int T, int C, struct err *e);
    int (*encoder_backward)(struct backend *be, enum model_dtype dt, float *dwte, float *dwpe,
                            const void *dout, const int32_t *tokens, int B, int T, int C,
                            int V, struct err *e);
    /* out (N,C) = (inp - mean) * rstd * w + b per row; mean, rstd (N) */
    int (*layernorm_forward)(struct backend *be, enum model_dtype dt, void *out, float *mean,
                             float *rstd, const void *inp, const void *w, const void *b, int N,
                             int C, struct err *e);
    int (*layernorm_backward)(struct backend *be, enum model_dtype dt, void *dinp, float *dw,
                              float *db, const void *dout, const void *inp, const void *w,
                              const float *mean, const float *rstd, int N, int C,
                              struct err *e);
    /* out (N,OC) = add + inp (N,C) @ w (OC,C)^T + bias: the residual add rides on the matmul;
     * add, bias may be NULL, out may not alias add. Backward: dinp, dw and dbias, each skipped
     * when NULL (dbias with dw), each computed on its own: the split backward's two passes
     * add up to the fused call bit for bit. */
    int (*matmul_forward)(struct backend *be, enum model_dtype dt, void *out, const void *add,
                          const void *inp, const void *w, const void *bias, int N, int C, int OC,
                          struct err *e);
    int (*matmul_backward)(struct backend *be, enum model_dtype dt, void *dinp, float *dw,
                           float *dbias, const void *dout, const void *inp, const void *w, int N,
                           int C, int OC, struct err *e);
    /* causal attention over qkv (B,T,3C); att (B,NH,T,T) the probabilities; out (B,T,C), or
     * NULL for the probabilities alone (the same bits). Backward: datt is scratch. */
    int (*attention_forward)(struct backend *be, enum model_dtype dt, void *out, void *att,
                             const void *qkv, int B, int T, int C, int NH, struct err *e);
    int (*attention_backward)(struct backend *be, enum model_dtype dt, void *dqkv, void *datt,
                              const void *dout, const void *qkv, const void *att, int B, int T,
                              int C, int NH, struct err *e);
    /* GELU (tanh approximation) of n elements; backward may run in place (dinp == dout) */
    int (*gelu_forward)(struct backend *be, enum model_dtype dt, void *out, const void *inp,
                        int64_t n, struct err *e);
    int (*gelu_backward)(struct backend *be, enum model_dtype dt, void *dinp, const void *inp,
                         const void *dout, int64_t n, struct err *e);
    /* probs (N,V): logits in, softmax out in place; losses (N) = -log p[target] unless NULL.
     * Backward: probs become d logits in place, (probs - onehot(target)) * dloss. */
    int (*crossentropy_forward)(struct backend *be, enum model_dtype dt, void *probs,
                                float *losses, const int32_t *targets, int N, int V,
                                struct err *e);
    int (*crossentropy_backward)(struct backend *be, enum model_dtype dt, void *probs,
                                 const int32_t *targets, float dloss, int N, int V,
                                 struct err *e);
    /* One AdamW step on n parameters; t is the 1-based step. Updates the fp32 `master` weights
     * and the moments m, v from the gradients g, then, when `weights` is another buffer (a
     * 16-bit model), writes master rounded to the nearest 16-bit value (ties to even) into it; for fp32,
     * weights == master. */
    int (*adamw)(struct backend *be, void *weights, float *master, const float *g, float *m,
                 float *v, int64_t n, enum model_dtype dtype, const struct adamw_params *p,
                 int t, int decay, struct err *e);
    /* Loss scaling's unscale and the non-finite check in one pass over n fp32 values (what
     * PyTorch's _amp_foreach_non_finite_check_and_unscale_ does): each becomes x * mul (left
     * as it is when mul is 1), and *found becomes 1 when one of them was a NaN or an infinity
     * (else it is left as it is). Done when it returns. */
    int (*unscale)(struct backend *be, float *x, int64_t n, float mul, int *found,
                   struct err *e);
    /* Host memory and copies to and from it off the compute path (the executor's offload,
     * exec.h). Host buffers: pinned on CUDA, so that copies run asynchronously. A copy goes
     * on its direction's lane (a copy thread on the CPU, a CUDA stream), first in first out;
     * it starts after the compute work queued before the call and after event `after` (-1:
     * none), and *ev names its completion. Events are numbers the backend hands out: `query`
     * says whether one is done without waiting; `wait` makes the compute work queued after it
     * wait for it (the CPU blocks; CUDA orders its streams, the host goes on). `copy_ms` adds
     * each lane's busy time since the last call (copies finished by then) into ms[dir]. */
    int (*host_alloc)(struct backend *be, int64_t bytes, void **out, struct err *e);
    void (*host_release)(struct backend *be, void *p);
    int (*copy_async)(struct backend *be, int dir, void *dst, const void *src, int64_t bytes,
                      int after, int *ev, struct err *e);
    int (*event_query)(struct backend *be, int ev, int *done, struct err *e);
    int (*event_wait)(struct backend *be, int ev, struct err *e);
    int (*copy_ms)(struct backend *be, double ms[2], struct err *e);
    /* When copy `ev` ran, on exec_now_ms's clock, waiting for it to finish (the trace's copy
     * lanes); *known 0 when the backend no longer holds its times. */
    int (*copy_span)(struct backend *be, int ev, double *t0_ms, double *t1_ms, int *known,
                     struct err *e);
    void (*free)(struct backend *be);
    /* The Llama family's own kernels (llama_layers.h); NULL when the backend has none. */
    const struct llama_kernels *llama;
    /* Flash attention, for both kinds (a model with "attention": "flash"); NULL when the
     * backend has none. */
    const struct flash_kernels *flash;
};

/* Causal flash attention (FlashAttention-2) over a fused qkv (B,T,W), W = (NH + 2 NKV) hs:
 * query heads, then key heads, then value heads (GPT: NKV = NH, W = 3C); query head h reads
 * key/value head h / (NH/NKV). The (B,NH,T,T) probabilities are never stored. */
struct flash_kernels {
    /* out (B,T,NH*hs); lse (B,NH,T) fp32: the rows' log-sum-exp of the scaled scores */
    int (*forward)(struct backend *be, enum model_dtype dt, void *out, float *lse,
                   const void *qkv, int B, int T, int NH, int NKV, int hs, struct err *e);
    /* dqkv (B,T,W) overwritten, from dout and the forward's out and lse, recomputing the
     * probabilities tile by tile; dsum (B,NH,T) fp32 is scratch (rowsum(dout * out)) */
    int (*backward)(struct backend *be, enum model_dtype dt, void *dqkv, float *dsum,
                    const void *dout, const void *qkv, const void *out, const float *lse,
                    int B, int T, int NH, int NKV, int hs, struct err *e);
};

/* The CPU backend's (backend_cpu.c over kernels_flash_cpu.c) and the CUDA backend's
 * (cuda/flash_kernels.cu). */
extern const struct flash_kernels flash_kernels_cuda;

/* The backend's flash kernels, or ERR_INPUT naming the backend when it has none. */
int backend_flash(const struct backend *be, const struct flash_kernels **k, struct err *e);

enum backend_copy_dir { BACKEND_TO_HOST, BACKEND_FROM_HOST };

struct backend {
    const struct backend_ops *ops;
    int threads;
    void *impl; /* the backend's own state */
    /* An emulated host link (CPU only, so that offload timing is testable without a GPU):
     * each copy lasts at least latency + bytes / gbps. 0 gbps: as fast as memcpy. */
    double host_link_gbps, host_link_latency_us;
};

/* The layers of the model's kind: the table's `layer` (GPT's) or llama_layers.c's, by enum
 * model_layer_kind. */
const struct backend_layer_ops *backend_layers(const struct backend *be, const struct model *m);

/* The CPU backend (fp32, bf16 and fp16, both model kinds): `threads` OpenMP threads, OpenBLAS
 * single-threaded (process-wide). */
int backend_cpu_init(struct backend *be, int threads, struct err *e);

/* The CUDA backend on device `device` (a CUDA ordinal, as in cuda:N): its own stream, cuBLAS
 * handle and workspace, fp32, bf16 and fp16. Makes `device` the calling thread's current device.
 * In a build without CUDA (BALLAST_CUDA=OFF, or no toolkit found) it fails with ERR_INPUT
 * and says so; cuda_device.h has the device queries. */
int backend_cuda_init(struct backend *be, int device, struct err *e);

#endif
