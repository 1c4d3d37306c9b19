/* The Llama family's own arithmetic on the CPU, in kernels_cpu.h's conventions (outputs first;
 * backward ADDS into parameter gradients; results independent of the thread count); its matrix
 * products and cross-entropy are kernels_cpu.h's. fp32 (a 16-bit model's tensors are widened
 * around them: wide_cpu.h).
 *
 * Grouped-query attention reads a fused qkv (B,T,W), W = (NH + 2 NKV) hs: query heads in
 * columns h*hs.., then NKV key heads, then NKV value heads; query head h uses key/value head
 * h / (NH/NKV). Rotary positions follow Hugging Face's Llama (rotate_half): in each head,
 * element i pairs with i + hs/2 and turns by t * theta^(-2i/hs). */
#ifndef BALLAST_KERNELS_LLAMA_CPU_H
#define BALLAST_KERNELS_LLAMA_CPU_H

#include <stdint.h>

#include "kernels_cpu.h"

/* out (B,T,C) = wte[tokens]; its backward is kernels_cpu.h's embedding_backward. */
void embedding_forward(float *out, const int32_t *tokens, const float *wte, int B, int T, int C);

/* out (N,C) = inp * rstd * w, rstd (N) = 1 / sqrt(mean(inp^2) + eps) kept for backward. */
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                     float eps);
/* dinp (N,C) += ...; dw (C) += .... */
void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                      const float *w, const float *rstd, int N, int C);

/* Rotates, in place, the first H heads of hs elements of each of the B*T rows of `stride`
 * elements of x (position t = row % T); backward turns a gradient back (the transpose). */
void rope_forward(float *x, int B, int T, int H, int stride, int hs, float theta);
void rope_backward(float *dx, int B, int T, int H, int stride, int hs, float theta);

/* out (N,F) = silu(inp[:, :F]) * inp[:, F:], inp (N,2F); backward dinp (N,2F) = .... */
void swiglu_forward(float *out, const float *inp, int N, int F);
void swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F);

/* Causal grouped-query attention over qkv (B,T,W): att (B,NH,T,T) the probabilities (zero
 * above the diagonal), out (B,T,NH*hs) or NULL for the probabilities alone (the same bits). */
void gqa_attention_forward(float *out, float *att, const float *qkv, int B, int T, int NH,
                           int NKV, int hs, kernel_round_fn round);
/* dqkv (B,T,W) = ...; datt (B,NH,T,T) is scratch. `round` (kernels_cpu.h; may be NULL) is
 * applied where the CUDA kernels store: the probabilities before att v, and the softmax's
 * backward before the dq and dk products. */
void gqa_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                            const float *att, int B, int T, int NH, int NKV, int hs,
                            kernel_round_fn round);

#endif
