// The GPT's arithmetic on an NVIDIA GPU, llm.c style: free functions, outputs first, then
// inputs, parameters, sizes; shapes in comments. Each function queues its work on k.stream and
// returns a status (launch errors are caught here, execution errors at the next sync).
//
// Element types. `void *` tensors hold the model's dtype k.dt: float, __nv_bfloat16 or __half
// (activations, their gradients and the weights computed with); `float *` tensors are fp32 in
// all (parameter gradients, master weights, AdamW moments, layer-norm statistics, losses).
// Arithmetic is fp32 throughout: 16-bit values are widened on load and rounded to nearest even
// on store (fp16 overflows to infinity from 65520 up: loss scaling's overflow); cuBLAS
// multiplies 16-bit or fp32 inputs with fp32 accumulation (CUBLAS_COMPUTE_32F, no TF32).
//
// Conventions are those of kernels_cpu.h: backward functions ADD into parameter gradients;
// activation gradients are overwritten, except layernorm_backward's dinp, which is added to.
// Weights are llm.c's: a linear layer of C inputs and OC outputs has w (OC,C), row-major.
//
// Determinism: no atomics. Every reduction has one fixed order (warp butterflies, per-column
// loops over rows in order, the embedding's scatter-add over positions in order), so a run
// repeats bit for bit on the same GPU, build and cuBLAS; cuBLAS's GEMMs are deterministic on
// one stream with a fixed workspace (its documented condition). A block's and the head's
// parameter gradients are each summed in full and then added once (the GEMMs' beta = 1
// epilogue, k_column_grads), so a second backward adds exactly the first's bits; only the
// embeddings add position by position, in the CPU's order (bitwise the CPU's).
#ifndef BALLAST_CUDA_KERNELS_CUH
#define BALLAST_CUDA_KERNELS_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "err.h"
#include "model.h"
}

struct kctx {
    cudaStream_t stream;
    cublasHandle_t blas;
    enum model_dtype dt;
};

// out (B,T,C) = wte[tokens] + wpe[t]
int k_encoder_forward(const kctx &k, void *out, const int32_t *tokens, const void *wte,
                      const void *wpe, int B, int T, int C, struct err *e);
// dwte (V,C) += scatter of dout by token, dwpe (T,C) += sum over the batch
int k_encoder_backward(const kctx &k, float *dwte, float *dwpe, const void *dout,
                       const int32_t *tokens, int B, int T, int C, int V, struct err *e);

// out (N,C) = (inp - mean) * rstd * w + b per row; mean, rstd (N)
int k_layernorm_forward(const kctx &k, void *out, float *mean, float *rstd, const void *inp,
                        const void *w, const void *b, int N, int C, struct err *e);
// dinp (N,C) += ...; dw, db (C) += ...
int k_layernorm_backward(const kctx &k, void *dinp, float *dw, float *db, const void *dout,
                         const void *inp, const void *w, const float *mean, const float *rstd,
                         int N, int C, struct err *e);

// A normalisation's parameter gradients (layer norm, RMSNorm) or a bias's: dw (C) += sum over
// the rows of (inp - mean) * rstd * dout (mean NULL: 0), db (C) += sum of dout; dw or db may
// be NULL. Each column summed in full in one fixed order, then added once.
int k_column_grads(const kctx &k, float *dw, float *db, const void *dout, const void *inp,
                   const float *mean, const float *rstd, int N, int C, struct err *e);

// out (N,OC) = add + inp (N,C) @ w (OC,C)^T + bias; add, bias may be NULL; out != add
int k_matmul_forward(const kctx &k, void *out, const void *add, const void *inp, const void *w,
                     const void *bias, int N, int C, int OC, struct err *e);
// dinp (N,C) = dout @ w (skipped when NULL); dw (OC,C) += dout^T inp; dbias (OC) += sums
int k_matmul_backward(const kctx &k, void *dinp, float *dw, float *dbias, const void *dout,
                      const void *inp, const void *w, int N, int C, int OC, struct err *e);

// causal attention over qkv (B,T,3C); att (B,NH,T,T) softmax probabilities, zero above the
// diagonal; out (B,T,C), or the probabilities alone when out is NULL
int k_attention_forward(const kctx &k, void *out, void *att, const void *qkv, int B, int T,
                        int C, int NH, struct err *e);
// dqkv (B,T,3C); datt (B,NH,T,T) scratch
int k_attention_backward(const kctx &k, void *dqkv, void *datt, const void *dout,
                         const void *qkv, const void *att, int B, int T, int C, int NH,
                         struct err *e);

// GELU, tanh approximation; backward may run in place (dinp == dout)
int k_gelu_forward(const kctx &k, void *out, const void *inp, int64_t n, struct err *e);
int k_gelu_backward(const kctx &k, void *dinp, const void *inp, const void *dout, int64_t n,
                    struct err *e);

// probs (N,V): logits in, softmax out in place; losses (N) = -log p[target] unless NULL
int k_crossentropy_forward(const kctx &k, void *probs, float *losses, const int32_t *targets,
                           int N, int V, struct err *e);
// probs (N,V) becomes d logits in place: (probs - onehot(target)) * dloss
int k_crossentropy_backward(const kctx &k, void *probs, const int32_t *targets, float dloss,
                            int N, int V, struct err *e);

// x (n) *= mul (untouched when mul is 1); *found (device memory) set to 1 when some x was
// a NaN or an infinity, else left as it is
int k_unscale(const kctx &k, float *x, int64_t n, float mul, int *found, struct err *e);

// AdamW on n parameters: master, m, v updated from g; for 16-bit `weights` (16-bit) becomes
// master rounded to nearest even, for fp32 weights == master. c1, c2: the bias corrections
// 1 - beta^t.
int k_adamw(const kctx &k, void *weights, float *master, const float *g, float *m, float *v,
            int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
            float c1, float c2, struct err *e);

#endif
