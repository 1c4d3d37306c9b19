/* The GPT's layers (token and position embedding, transformer block, head), written once over
 * the kernels of the backend table (backend.h): every backend's `layer` member is
 * GPT_LAYER_OPS, so the CPU and CUDA backends run the same kernels in the same order. */
#ifndef BALLAST_GPT_LAYERS_H
#define BALLAST_GPT_LAYERS_H

#include "backend.h"

int gpt_embed_forward(struct backend *be, const struct layer_view *l, void *out, struct err *e);
int gpt_embed_recompute(struct backend *be, const struct layer_view *l, struct err *e);
int gpt_embed_backward(struct backend *be, const struct layer_view *l, float loss_scale,
                       struct err *e);
int gpt_block_forward(struct backend *be, const struct layer_view *l, void *out, struct err *e);
int gpt_block_recompute(struct backend *be, const struct layer_view *l, struct err *e);
int gpt_block_backward(struct backend *be, const struct layer_view *l, float loss_scale,
                       struct err *e);
int gpt_head_forward(struct backend *be, const struct layer_view *l, void *out, struct err *e);
int gpt_head_recompute(struct backend *be, const struct layer_view *l, struct err *e);
int gpt_head_backward(struct backend *be, const struct layer_view *l, float loss_scale,
                      struct err *e);

/* A matrix product's backward in a layer: whole (l->wgrad NULL), or split: dinp now, and its
 * output gradient copied into the next weight-pass tensor with the product recorded in
 * l->wgrad for layer_weight_pass. Both GPT's and Llama's blocks call it for their products. */
int layer_matmul_backward(struct backend *be, const struct layer_view *l, void *dinp,
                          float *dw, float *dbias, const void *dout, const void *inp,
                          const void *w, int N, int C, int OC, struct err *e);
/* The weight pass of a split backward: each product's dw (and dbias) from its recorded input
 * and output gradient, added as the fused backward adds them. */
int layer_weight_pass(struct backend *be, const struct layer_view *l,
                      const struct layer_wgrad *w, struct err *e);

/* The initializer of backend_ops.layer, by enum model_layer_kind (positional: the CUDA
 * backend's table is C++). */
#define GPT_LAYER_OPS                                                                        \
    {                                                                                        \
        {gpt_embed_forward, gpt_embed_recompute, gpt_embed_backward},                        \
        {gpt_block_forward, gpt_block_recompute, gpt_block_backward},                        \
        {gpt_head_forward, gpt_head_recompute, gpt_head_backward},                           \
    }

#endif
