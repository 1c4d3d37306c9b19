/* Flash attention on the CPU (FlashAttention-2, causal), shared by GPT and the Llama family,
 * in kernels_cpu.h's conventions (outputs first; results independent of the thread count).
 * fp32.
 *
 * qkv (B,T,W), W = (NH + 2 NKV) hs: query head h in columns h*hs, then NKV key heads, then
 * NKV value heads; query head h reads key/value head h / (NH/NKV). GPT is the case NKV = NH
 * (W = 3C). The (B,NH,T,T) probabilities are never stored: the forward walks the keys in
 * tiles of FLASH_TILE with an online softmax (a running maximum and sum per row) and keeps
 * each row's log-sum-exp; the backward recomputes the probabilities tile by tile from it. */
#ifndef BALLAST_KERNELS_FLASH_CPU_H
#define BALLAST_KERNELS_FLASH_CPU_H

#define FLASH_TILE 64

/* out (B,T,NH*hs) = softmax(q k^T / sqrt(hs), causal) v; lse (B,NH,T) = the rows'
 * log-sum-exp of the scaled scores. */
void flash_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH,
                             int NKV, int hs);
/* dqkv (B,T,W) = the gradient of q, k, v (overwritten) from dout (B,T,NH*hs), the forward's
 * out and lse; dsum (B,NH,T) is scratch: rowsum(dout * out), FlashAttention-2's D. */
void flash_attention_backward(float *dqkv, float *dsum, const float *dout, const float *qkv,
                              const float *out, const float *lse, int B, int T, int NH, int NKV,
                              int hs);

#endif
