/* The Llama family's layers (token embedding; block of RMSNorm, grouped-query attention with
 * rotary positions, SwiGLU MLP; head of RMSNorm, untied projection, cross-entropy), written
 * once over a backend's kernels: the table's matmul, copy, zero and cross-entropy, and its
 * `llama` kernels below (CPU: kernels_llama_cpu.c; CUDA: cuda/llama_kernels.cu). A backend
 * without them (llama NULL) refuses a Llama model when its layers first run. */
#ifndef BALLAST_LLAMA_LAYERS_H
#define BALLAST_LLAMA_LAYERS_H

#include "backend.h"

/* Tensor indices in the order of models/llama.c's tables (checked by layout_init); the
 * embedding's are backend.h's EMBED_WTE, EMBED_TOKENS, EMBED_OUT, EMBED_DOUT. */
enum llama_block_param {
    LB_LN1_W, LB_QKV_W, LB_PROJ_W, LB_LN2_W, LB_FC_W, LB_FCPROJ_W, LB_PARAMS
};
enum llama_block_kept {
    LB_INP, LB_LN1, LB_LN1_RSTD, LB_QKV, LB_ATT, LB_ATTY, LB_RES2, LB_LN2, LB_LN2_RSTD, LB_FCH,
    LB_FCH_SWIGLU, LB_KEPT
};
enum llama_block_ws { LB_OUT, LB_DOUT, LB_DINP, LB_DSW, LB_DFCH, LB_DLN, LB_DQKV, LB_DATT, LB_WS };
enum llama_head_param { LH_LNF_W, LH_LM_W, LH_PARAMS };
enum llama_head_kept { LH_INP, LH_TARGETS, LH_LNF, LH_LNF_RSTD, LH_PROBS, LH_KEPT };
enum llama_head_ws { LH_DLNF, LH_DINP, LH_LOSSES, LH_WS };

/* The kernels only Llama uses, in backend.h's conventions (shapes: kernels_llama_cpu.h). */
struct llama_kernels {
    /* out (B,T,C) = wte[tokens]; dwte (V,C) += dout at each token's row */
    int (*embedding_forward)(struct backend *be, enum model_dtype dt, void *out,
                             const int32_t *tokens, const void *wte, int B, int T, int C,
                             struct err *e);
    int (*embedding_backward)(struct backend *be, enum model_dtype dt, float *dwte,
                              const void *dout, const int32_t *tokens, int B, int T, int C,
                              int V, struct err *e);
    /* out (N,C) = inp * rstd * w; backward: dinp ADDED to, dw added to */
    int (*rmsnorm_forward)(struct backend *be, enum model_dtype dt, void *out, float *rstd,
                           const void *inp, const void *w, int N, int C, float eps,
                           struct err *e);
    int (*rmsnorm_backward)(struct backend *be, enum model_dtype dt, void *dinp, float *dw,
                            const void *dout, const void *inp, const void *w, const float *rstd,
                            int N, int C, struct err *e);
    /* in place on the first H heads of each row of `stride` elements */
    int (*rope_forward)(struct backend *be, enum model_dtype dt, void *x, int B, int T, int H,
                        int stride, int hs, float theta, struct err *e);
    int (*rope_backward)(struct backend *be, enum model_dtype dt, void *dx, int B, int T, int H,
                         int stride, int hs, float theta, struct err *e);
    /* out (N,F) = silu(gate) * up of inp (N,2F); backward writes dinp (N,2F) */
    int (*swiglu_forward)(struct backend *be, enum model_dtype dt, void *out, const void *inp,
                          int N, int F, struct err *e);
    int (*swiglu_backward)(struct backend *be, enum model_dtype dt, void *dinp, const void *inp,
                           const void *dout, int N, int F, struct err *e);
    /* causal grouped-query attention; out may be NULL (the probabilities alone, same bits) */
    int (*attention_forward)(struct backend *be, enum model_dtype dt, void *out, void *att,
                             const void *qkv, int B, int T, int NH, int NKV, int hs,
                             struct err *e);
    int (*attention_backward)(struct backend *be, enum model_dtype dt, void *dqkv, void *datt,
                              const void *dout, const void *qkv, const void *att, int B, int T,
                              int NH, int NKV, int hs, struct err *e);
};

/* The CPU backend's (backend_llama_cpu.c) and the CUDA backend's (cuda/llama_kernels.cu). */
extern const struct llama_kernels llama_kernels_cpu;
extern const struct llama_kernels llama_kernels_cuda;

extern const struct backend_layer_ops llama_layer_ops[MODEL_LAYER_HEAD + 1];

#endif
