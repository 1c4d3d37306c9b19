/* The CPU backend's Llama kernels (llama_layers.h): kernels_llama_cpu.c's, fp32 only; a bf16
 * model never reaches them (the CPU backend's dtypes are fp32), and they say so if one does. */
#include "kernels_llama_cpu.h"
#include "llama_layers.h"

static int fp32_only(enum model_dtype dt, struct err *e)
{
    if (dt != MODEL_DTYPE_FP32)
        return err_set(e, ERR_FAIL, "internal: the cpu backend's llama kernels are fp32, not %s",
                       model_dtype_name(dt));
    return ERR_OK;
}

static int cpu_embedding_forward(struct backend *be, enum model_dtype dt, void *out,
                                 const int32_t *tokens, const void *wte, int B, int T, int C,
                                 struct err *e)
{
    ERR_TRY(fp32_only(dt, e));
    embedding_forward(out, tokens, wte, B, T, C);
    return ERR_OK;
}

static int cpu_embedding_backward(struct backend *be, enum model_dtype dt, float *dwte,
                                  const void *dout, const int32_t *tokens, int B, int T, int C,
                                  int V, struct err *e)
{
    ERR_TRY(fp32_only(dt, e));
    embedding_backward(dwte, dout, tokens, B, T, C);
    return ERR_OK;
}

static int cpu_rmsnorm_forward(struct backend *be, enum model_dtype dt, void *out, float *rstd,
                               const void *inp, const void *w, int N, int C, float eps,
                               struct err *e)
{
    ERR_TRY(fp32_only(dt, e));
    rmsnorm_forward(out, rstd, inp, w, N, C, eps);
    return ERR_OK;
}

static int cpu_rmsnorm_backward(struct backend *be, enum model_dtype dt, void *dinp, float *dw,
                                const void *dout, const void *inp, const void *w,
                                const float *rstd, int N, int C, struct err *e)
{
    ERR_TRY(fp32_only(dt, e));
    rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
    return ERR_OK;
}

static int cpu_rope_forward(struct backend *be, enum model_dtype dt, void *x, int B, int T,
                            int H, int stride, int hs, float theta, struct err *e)
{
    ERR_TRY(fp32_only(dt, e));
    rope_forward(x, B, T, H, stride, hs, theta);
    return ERR_OK;
}

static int cpu_rope_backward(struct backend *be, enum model_dtype dt, void *dx, int B, int T,
                             int H, int stride, int hs, float theta, struct err *e)
{
    ERR_TRY(fp32_only(dt, e));
    rope_backward(dx, B, T, H, stride, hs, theta);
    return ERR_OK;
}

static int cpu_swiglu_forward(struct backend *be, enum model_dtype dt, void *out,
                              const void *inp, int N, int F, struct err *e)
{
    ERR_TRY(fp32_only(dt, e));
    swiglu_forward(out, inp, N, F);
    return ERR_OK;
}

static int cpu_swiglu_backward(struct backend *be, enum model_dtype dt, void *dinp,
                               const void *inp, const void *dout, int N, int F, struct err *e)
{
    ERR_TRY(fp32_only(dt, e));
    swiglu_backward(dinp, inp, dout, N, F);
    return ERR_OK;
}

static int cpu_attention_forward(struct backend *be, enum model_dtype dt, void *out, void *att,
                                 const void *qkv, int B, int T, int NH, int NKV, int hs,
                                 struct err *e)
{
    ERR_TRY(fp32_only(dt, e));
    gqa_attention_forward(out, att, qkv, B, T, NH, NKV, hs);
    return ERR_OK;
}

static int cpu_attention_backward(struct backend *be, enum model_dtype dt, void *dqkv,
                                  void *datt, const void *dout, const void *qkv,
                                  const void *att, int B, int T, int NH, int NKV, int hs,
                                  struct err *e)
{
    ERR_TRY(fp32_only(dt, e));
    gqa_attention_backward(dqkv, datt, dout, qkv, att, B, T, NH, NKV, hs);
    return ERR_OK;
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
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
};
