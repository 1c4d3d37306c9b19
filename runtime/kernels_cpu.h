/* The GPT's arithmetic on the CPU, llm.c style: free functions, outputs first, then inputs,
 * parameters and sizes; shapes in comments. fp32 throughout; matrix products through OpenBLAS'
 * cblas_sgemm, everything else threaded with OpenMP.
 *
 * Conventions every caller relies on:
 *   - backward functions ADD into parameter gradients (so micro-batches accumulate);
 *   - activation gradients are OVERWRITTEN, except layernorm_backward's dinp, which is added
 *     to (the residual stream's gradient is already there);
 *   - every parallel loop splits independent outputs, and each output is reduced by one
 *     thread in a fixed order: results do not depend on the OpenMP thread count.
 * Weights are stored llm.c style: a linear layer of C inputs and OC outputs has w (OC,C). */
#ifndef BALLAST_KERNELS_CPU_H
#define BALLAST_KERNELS_CPU_H

#include <stdint.h>

/* Rounds n values in place to a 16-bit model's storage format and back (wide_cpu.h): what the
 * CUDA kernels' memory does to the values they keep between two steps of one kernel. The
 * kernels take it where they have such steps; NULL (fp32) leaves the values as they are. */
typedef void (*kernel_round_fn)(float *v, int64_t n);

/* out (B,T,C) = wte[tokens] + wpe[t]; tokens (B,T) in [0, V). */
void encoder_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                     int B, int T, int C);
void encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                      int B, int T, int C);
/* dwte (V,C) += dout at each token's row, in one order of sums per token (GPT's and Llama's
 * embedding). */
void embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int B, int T,
                        int C);

/* out (N,C) = (inp - mean) * rstd * w + b, per row; mean, rstd (N) kept for backward. */
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                       const float *b, int N, int C);
/* dinp (N,C) += ...; dw, db (C) += .... */
void layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int N, int C);

/* out (N,OC) = add + inp (N,C) @ w (OC,C)^T + bias; add (N,OC) and bias (OC) may be NULL.
 * out may not alias add. */
void matmul_forward(float *out, const float *add, const float *inp, const float *w,
                    const float *bias, int N, int C, int OC);
/* dinp (N,C) = dout @ w (skipped when dinp is NULL); dw (OC,C) += dout^T @ inp;
 * dbias (OC) += column sums of dout (skipped when NULL). */
void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                     const float *w, int N, int C, int OC);

/* Causal multi-head attention. qkv (B,T,3C) holds q, k, v side by side, head h in columns
 * h*hs .. (h+1)*hs-1 of each (hs = C/NH). att (B,NH,T,T): softmax probabilities (row t
 * defined for t2 <= t only); out (B,T,C), or NULL for the probabilities only (the same bits:
 * recomputing them). `round` (may be NULL) is applied where the CUDA kernels store: the
 * scores before the softmax and the probabilities before att v. */
void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                       kernel_round_fn round);
/* dqkv (B,T,3C) = ...; datt (B,NH,T,T) is scratch; `round` as above, on d att before the
 * softmax's backward and on its result before the dq and dk products. */
void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                        const float *att, int B, int T, int C, int NH, kernel_round_fn round);

/* GELU, tanh approximation (GPT-2's). n elements. gelu_backward may run in place
 * (dinp == dout). */
void gelu_forward(float *out, const float *inp, int64_t n);
void gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);

/* probs (N,V): logits in, softmax probabilities out (in place); losses (N) = -log
 * probs[target] when losses is not NULL. */
void softmax_crossentropy_forward(float *probs, float *losses, const int32_t *targets, int N,
                                  int V);
/* probs (N,V) becomes d logits in place: (probs - onehot(target)) * dloss. */
void softmax_crossentropy_backward(float *probs, const int32_t *targets, float dloss, int N,
                                   int V);

/* x (n) *= mul (untouched when mul is 1); returns 1 when some x was a NaN or an infinity. */
int unscale_check(float *x, int64_t n, float mul);

/* AdamW on n parameters, bias-corrected with `t` (the 1-based step); weight_decay 0 for
 * parameters that do not decay. */
void adamw_update(float *w, const float *g, float *m, float *v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t);

#endif
