/* The CPU backend: host memory and the kernels of kernels_cpu.c (fp32); the layers over them
 * are gpt_layers.c's. */
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "gpt_layers.h"
#include "hostcopy_cpu.h"
#include "kernels_cpu.h"

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

/* ---- kernels: kernels_cpu.c's, fp32 (ops.dtypes), done when they return ---- */

static int cpu_encoder_forward(struct backend *be, enum model_dtype dt, void *out,
                               const int32_t *tokens, const void *wte, const void *wpe, int B,
                               int T, int C, struct err *e)
{
    encoder_forward(out, tokens, wte, wpe, B, T, C);
    return ERR_OK;
}

static int cpu_encoder_backward(struct backend *be, enum model_dtype dt, float *dwte,
                                float *dwpe, const void *dout, const int32_t *tokens, int B,
                                int T, int C, int V, struct err *e)
{
    encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
    return ERR_OK;
}

static int cpu_layernorm_forward(struct backend *be, enum model_dtype dt, void *out,
                                 float *mean, float *rstd, const void *inp, const void *w,
                                 const void *b, int N, int C, struct err *e)
{
    layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    return ERR_OK;
}

static int cpu_layernorm_backward(struct backend *be, enum model_dtype dt, void *dinp,
                                  float *dw, float *db, const void *dout, const void *inp,
                                  const void *w, const float *mean, const float *rstd, int N,
                                  int C, struct err *e)
{
    layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    return ERR_OK;
}

static int cpu_matmul_forward(struct backend *be, enum model_dtype dt, void *out,
                              const void *add, const void *inp, const void *w, const void *bias,
                              int N, int C, int OC, struct err *e)
{
    matmul_forward(out, add, inp, w, bias, N, C, OC);
    return ERR_OK;
}

static int cpu_matmul_backward(struct backend *be, enum model_dtype dt, void *dinp, float *dw,
                               float *dbias, const void *dout, const void *inp, const void *w,
                               int N, int C, int OC, struct err *e)
{
    matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
    return ERR_OK;
}

static int cpu_attention_forward(struct backend *be, enum model_dtype dt, void *out, void *att,
                                 const void *qkv, int B, int T, int C, int NH, struct err *e)
{
    attention_forward(out, att, qkv, B, T, C, NH);
    return ERR_OK;
}

static int cpu_attention_backward(struct backend *be, enum model_dtype dt, void *dqkv,
                                  void *datt, const void *dout, const void *qkv,
                                  const void *att, int B, int T, int C, int NH, struct err *e)
{
    attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
    return ERR_OK;
}

static int cpu_gelu_forward(struct backend *be, enum model_dtype dt, void *out, const void *inp,
                            int64_t n, struct err *e)
{
    gelu_forward(out, inp, n);
    return ERR_OK;
}

static int cpu_gelu_backward(struct backend *be, enum model_dtype dt, void *dinp,
                             const void *inp, const void *dout, int64_t n, struct err *e)
{
    gelu_backward(dinp, inp, dout, n);
    return ERR_OK;
}

static int cpu_crossentropy_forward(struct backend *be, enum model_dtype dt, void *probs,
                                    float *losses, const int32_t *targets, int N, int V,
                                    struct err *e)
{
    softmax_crossentropy_forward(probs, losses, targets, N, V);
    return ERR_OK;
}

static int cpu_crossentropy_backward(struct backend *be, enum model_dtype dt, void *probs,
                                     const int32_t *targets, float dloss, int N, int V,
                                     struct err *e)
{
    softmax_crossentropy_backward(probs, targets, dloss, N, V);
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

/* ---- host memory and the copy lanes (hostcopy_cpu.c), started on the first copy ---- */

static int cpu_copy_async(struct backend *be, int dir, void *dst, const void *src,
                          int64_t bytes, int after, int *ev, struct err *e)
{
    if (be->impl == NULL)
        ERR_TRY(hostcopy_start((struct hostcopy **)&be->impl, e));
    return hostcopy_submit(be->impl, dir, dst, src, bytes, after, be->host_link_gbps,
                           be->host_link_latency_us, ev, e);
}

static int cpu_event_query(struct backend *be, int ev, int *done, struct err *e)
{
    *done = be->impl == NULL || hostcopy_done(be->impl, ev);
    return ERR_OK;
}

static int cpu_event_wait(struct backend *be, int ev, struct err *e)
{
    if (be->impl != NULL)
        hostcopy_wait(be->impl, ev);
    return ERR_OK;
}

static int cpu_copy_ms(struct backend *be, double ms[2], struct err *e)
{
    if (be->impl != NULL)
        hostcopy_busy(be->impl, ms);
    return ERR_OK;
}

static void cpu_free(struct backend *be)
{
    hostcopy_stop(be->impl);
    be->impl = NULL;
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
    .layer = GPT_LAYER_OPS,
    .encoder_forward = cpu_encoder_forward,
    .encoder_backward = cpu_encoder_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .crossentropy_forward = cpu_crossentropy_forward,
    .crossentropy_backward = cpu_crossentropy_backward,
    .adamw = cpu_adamw,
    .host_alloc = cpu_alloc, /* host memory is the CPU's memory */
    .host_release = cpu_release,
    .copy_async = cpu_copy_async,
    .event_query = cpu_event_query,
    .event_wait = cpu_event_wait,
    .copy_ms = cpu_copy_ms,
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
