/* The CPU backend's Llama kernels (llama_layers.h): kernels_llama_cpu.c's, in fp32, and for a
 * 16-bit model (bf16, fp16) over fp32 copies as the GPT's kernels are (wide_cpu.h): widened on
 * the way in, rounded on the way out, fp32 accumulation between. */
#include <string.h>

#include "kernels_cpu.h"
#include "kernels_llama_cpu.h"
#include "llama_layers.h"
#include "sizes.h"
#include "wide_cpu.h"

static int cpu_embedding_forward(struct backend *be, enum model_dtype dt, void *out,
                                 const int32_t *tokens, const void *wte, int B, int T, int C,
                                 struct err *e)
{
    if (dt == MODEL_DTYPE_FP32) {
        embedding_forward(out, tokens, wte, B, T, C);
        return ERR_OK;
    }
    /* a gather: the rows' 16-bit values as they are (widening and rounding back is exact) */
    int64_t row = (int64_t)C * sizes_act_elem_bytes(dt);
    for (int64_t i = 0; i < (int64_t)B * T; i++)
        memcpy((char *)out + i * row, (const char *)wte + tokens[i] * row, (size_t)row);
    return ERR_OK;
}

static int cpu_embedding_backward(struct backend *be, enum model_dtype dt, float *dwte,
                                  const void *dout, const int32_t *tokens, int B, int T, int C,
                                  int V, struct err *e)
{
    struct wide x = {.dt = dt};
    float *d = wide_in(&x, dout, (int64_t)B * T * C);
    if (!x.failed)
        embedding_backward(dwte, d, tokens, B, T, C);
    return wide_done(&x, NULL, NULL, 0, e);
}

static int cpu_rmsnorm_forward(struct backend *be, enum model_dtype dt, void *out, float *rstd,
                               const void *inp, const void *w, int N, int C, float eps,
                               struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n = (int64_t)N * C;
    float *o = wide_out(&x, out, n), *i = wide_in(&x, inp, n), *wf = wide_in(&x, w, C);
    if (!x.failed)
        rmsnorm_forward(o, rstd, i, wf, N, C, eps);
    return wide_done(&x, out, o, n, e);
}

static int cpu_rmsnorm_backward(struct backend *be, enum model_dtype dt, void *dinp, float *dw,
                                const void *dout, const void *inp, const void *w,
                                const float *rstd, int N, int C, struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n = (int64_t)N * C;
    /* dinp is added to: its 16-bit values come in too */
    float *di = wide_in(&x, dinp, n), *d = wide_in(&x, dout, n), *i = wide_in(&x, inp, n),
          *wf = wide_in(&x, w, C);
    if (!x.failed)
        rmsnorm_backward(di, dw, d, i, wf, rstd, N, C);
    return wide_done(&x, dinp, di, n, e);
}

/* Rotary positions in place: the rows widened, turned, rounded back. */
static int cpu_rope(enum model_dtype dt, void *x16, int B, int T, int H, int stride, int hs,
                    float theta, int backward, struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n = (int64_t)B * T * stride;
    float *v = wide_in(&x, x16, n);
    if (!x.failed && backward)
        rope_backward(v, B, T, H, stride, hs, theta);
    else if (!x.failed)
        rope_forward(v, B, T, H, stride, hs, theta);
    return wide_done(&x, x16, v, n, e);
}

static int cpu_rope_forward(struct backend *be, enum model_dtype dt, void *x, int B, int T,
                            int H, int stride, int hs, float theta, struct err *e)
{
    return cpu_rope(dt, x, B, T, H, stride, hs, theta, 0, e);
}

static int cpu_rope_backward(struct backend *be, enum model_dtype dt, void *dx, int B, int T,
                             int H, int stride, int hs, float theta, struct err *e)
{
    return cpu_rope(dt, dx, B, T, H, stride, hs, theta, 1, e);
}

static int cpu_swiglu_forward(struct backend *be, enum model_dtype dt, void *out,
                              const void *inp, int N, int F, struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n = (int64_t)N * F;
    float *o = wide_out(&x, out, n), *i = wide_in(&x, inp, 2 * n);
    if (!x.failed)
        swiglu_forward(o, i, N, F);
    return wide_done(&x, out, o, n, e);
}

static int cpu_swiglu_backward(struct backend *be, enum model_dtype dt, void *dinp,
                               const void *inp, const void *dout, int N, int F, struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n = (int64_t)N * F;
    float *di = wide_out(&x, dinp, 2 * n), *i = wide_in(&x, inp, 2 * n),
          *d = wide_in(&x, dout, n);
    if (!x.failed)
        swiglu_backward(di, i, d, N, F);
    return wide_done(&x, dinp, di, 2 * n, e);
}

static int cpu_gqa_attention_forward(struct backend *be, enum model_dtype dt, void *out, void *att,
                                     const void *qkv, int B, int T, int NH, int NKV, int hs,
                                     struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n = (int64_t)B * T * NH * hs, n_att = (int64_t)B * NH * T * T,
            nqkv = (int64_t)B * T * (NH + 2 * NKV) * hs;
    float *o = wide_out(&x, out, n), *a = wide_out(&x, att, n_att), *q = wide_in(&x, qkv, nqkv);
    if (!x.failed)
        gqa_attention_forward(o, a, q, B, T, NH, NKV, hs, wide_rounding(dt));
    wide_store(&x, att, a, n_att); /* the probabilities: a second output */
    return wide_done(&x, out, o, n, e);
}

static int cpu_gqa_attention_backward(struct backend *be, enum model_dtype dt, void *dqkv,
                                      void *datt, const void *dout, const void *qkv,
                                      const void *att, int B, int T, int NH, int NKV, int hs,
                                      struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n = (int64_t)B * T * NH * hs, n_att = (int64_t)B * NH * T * T,
            nqkv = (int64_t)B * T * (NH + 2 * NKV) * hs;
    float *dq = wide_out(&x, dqkv, nqkv), *da = wide_out(&x, datt, n_att),
          *d = wide_in(&x, dout, n), *q = wide_in(&x, qkv, nqkv), *a = wide_in(&x, att, n_att);
    if (!x.failed)
        gqa_attention_backward(dq, da, d, q, a, B, T, NH, NKV, hs, wide_rounding(dt));
    wide_store(&x, datt, da, n_att); /* the scratch as the GPU leaves it */
    return wide_done(&x, dqkv, dq, nqkv, e);
}

const struct llama_kernels llama_kernels_cpu = {
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .attention_forward = cpu_gqa_attention_forward,
    .attention_backward = cpu_gqa_attention_backward,
};
