/* The CPU backend: host memory and the kernels of kernels_cpu.c (fp32, and bf16 or fp16 through
 * fp32 copies: wide_cpu.h); the layers over them are gpt_layers.c's. */
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "gpt_layers.h"
#include "half.h"
#include "hostcopy_cpu.h"
#include "kernels_cpu.h"
#include "kernels_flash_cpu.h"
#include "llama_layers.h"
#include "wide_cpu.h"

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

/* ---- kernels: kernels_cpu.c's, done when they return; a 16-bit model's tensors through
 * fp32 copies (wide_cpu.h) ---- */

static int cpu_encoder_forward(struct backend *be, enum model_dtype dt, void *out,
                               const int32_t *tokens, const void *wte, const void *wpe, int B,
                               int T, int C, struct err *e)
{
    if (dt == MODEL_DTYPE_FP32) {
        encoder_forward(out, tokens, wte, wpe, B, T, C);
        return ERR_OK;
    }
    /* 16-bit: the rows the tokens pick, widened, as a table indexed 0..BT-1 */
    struct wide x = {.dt = dt};
    int64_t BT = (int64_t)B * T, n = BT * C;
    float *o = wide_out(&x, out, n), *rows = wide_alloc(&x, n),
          *pe = wide_in(&x, wpe, (int64_t)T * C);
    int32_t *at = malloc(sizeof(int32_t) * (size_t)BT);
    if (!x.failed && at != NULL) {
        for (int64_t i = 0; i < BT; i++) {
            at[i] = (int32_t)i;
            half_widen(dt, rows + i * C, (const uint16_t *)wte + (int64_t)tokens[i] * C, C);
        }
        encoder_forward(o, at, rows, pe, B, T, C);
    }
    x.failed |= at == NULL;
    free(at);
    return wide_done(&x, out, o, n, e);
}

static int cpu_encoder_backward(struct backend *be, enum model_dtype dt, float *dwte,
                                float *dwpe, const void *dout, const int32_t *tokens, int B,
                                int T, int C, int V, struct err *e)
{
    struct wide x = {.dt = dt};
    float *d = wide_in(&x, dout, (int64_t)B * T * C);
    if (!x.failed)
        encoder_backward(dwte, dwpe, d, tokens, B, T, C);
    return wide_done(&x, NULL, NULL, 0, e);
}

static int cpu_layernorm_forward(struct backend *be, enum model_dtype dt, void *out,
                                 float *mean, float *rstd, const void *inp, const void *w,
                                 const void *b, int N, int C, struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n = (int64_t)N * C;
    float *o = wide_out(&x, out, n), *i = wide_in(&x, inp, n), *wf = wide_in(&x, w, C),
          *bf = wide_in(&x, b, C);
    if (!x.failed)
        layernorm_forward(o, mean, rstd, i, wf, bf, N, C);
    return wide_done(&x, out, o, n, e);
}

static int cpu_layernorm_backward(struct backend *be, enum model_dtype dt, void *dinp,
                                  float *dw, float *db, const void *dout, const void *inp,
                                  const void *w, const float *mean, const float *rstd, int N,
                                  int C, struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n = (int64_t)N * C;
    /* dinp is added to: its 16-bit values come in too */
    float *di = wide_in(&x, dinp, n), *d = wide_in(&x, dout, n), *i = wide_in(&x, inp, n),
          *wf = wide_in(&x, w, C);
    if (!x.failed)
        layernorm_backward(di, dw, db, d, i, wf, mean, rstd, N, C);
    return wide_done(&x, dinp, di, n, e);
}

static int cpu_matmul_forward(struct backend *be, enum model_dtype dt, void *out,
                              const void *add, const void *inp, const void *w, const void *bias,
                              int N, int C, int OC, struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n = (int64_t)N * OC;
    float *o = wide_out(&x, out, n), *a = wide_in(&x, add, n),
          *i = wide_in(&x, inp, (int64_t)N * C), *wf = wide_in(&x, w, (int64_t)OC * C),
          *bf = wide_in(&x, bias, OC);
    if (!x.failed)
        matmul_forward(o, a, i, wf, bf, N, C, OC);
    return wide_done(&x, out, o, n, e);
}

static int cpu_matmul_backward(struct backend *be, enum model_dtype dt, void *dinp, float *dw,
                               float *dbias, const void *dout, const void *inp, const void *w,
                               int N, int C, int OC, struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n = (int64_t)N * C;
    float *di = wide_out(&x, dinp, n), *d = wide_in(&x, dout, (int64_t)N * OC),
          *i = wide_in(&x, inp, n), *wf = wide_in(&x, w, (int64_t)OC * C);
    if (!x.failed)
        matmul_backward(di, dw, dbias, d, i, wf, N, C, OC);
    return wide_done(&x, dinp, di, n, e);
}

static int cpu_attention_forward(struct backend *be, enum model_dtype dt, void *out, void *att,
                                 const void *qkv, int B, int T, int C, int NH, struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n_att = (int64_t)B * NH * T * T, n = (int64_t)B * T * C;
    float *o = wide_out(&x, out, n), *a = wide_out(&x, att, n_att),
          *q = wide_in(&x, qkv, 3 * n);
    if (!x.failed)
        attention_forward(o, a, q, B, T, C, NH, wide_rounding(dt));
    wide_store(&x, att, a, n_att); /* the probabilities: a second output */
    return wide_done(&x, out, o, n, e);
}

static int cpu_attention_backward(struct backend *be, enum model_dtype dt, void *dqkv,
                                  void *datt, const void *dout, const void *qkv,
                                  const void *att, int B, int T, int C, int NH, struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n_att = (int64_t)B * NH * T * T, n = (int64_t)B * T * C;
    float *dq = wide_out(&x, dqkv, 3 * n), *da = wide_out(&x, datt, n_att),
          *d = wide_in(&x, dout, n), *q = wide_in(&x, qkv, 3 * n), *a = wide_in(&x, att, n_att);
    if (!x.failed)
        attention_backward(dq, da, d, q, a, B, T, C, NH, wide_rounding(dt));
    wide_store(&x, datt, da, n_att); /* the scratch as the GPU leaves it: the arena is used */
    return wide_done(&x, dqkv, dq, 3 * n, e);
}

static int cpu_flash_forward(struct backend *be, enum model_dtype dt, void *out, float *lse,
                             const void *qkv, int B, int T, int NH, int NKV, int hs,
                             struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n = (int64_t)B * T * NH * hs, nqkv = (int64_t)B * T * (NH + 2 * NKV) * hs;
    float *o = wide_out(&x, out, n), *q = wide_in(&x, qkv, nqkv);
    if (!x.failed)
        flash_attention_forward(o, lse, q, B, T, NH, NKV, hs);
    return wide_done(&x, out, o, n, e);
}

static int cpu_flash_backward(struct backend *be, enum model_dtype dt, void *dqkv, float *dsum,
                              const void *dout, const void *qkv, const void *out,
                              const float *lse, int B, int T, int NH, int NKV, int hs,
                              struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n = (int64_t)B * T * NH * hs, nqkv = (int64_t)B * T * (NH + 2 * NKV) * hs;
    float *dq = wide_out(&x, dqkv, nqkv), *d = wide_in(&x, dout, n),
          *q = wide_in(&x, qkv, nqkv), *o = wide_in(&x, out, n);
    if (!x.failed)
        flash_attention_backward(dq, dsum, d, q, o, lse, B, T, NH, NKV, hs);
    return wide_done(&x, dqkv, dq, nqkv, e);
}

static const struct flash_kernels flash_kernels_cpu = {
    .forward = cpu_flash_forward,
    .backward = cpu_flash_backward,
};

static int cpu_gelu_forward(struct backend *be, enum model_dtype dt, void *out, const void *inp,
                            int64_t n, struct err *e)
{
    struct wide x = {.dt = dt};
    float *o = wide_out(&x, out, n), *i = wide_in(&x, inp, n);
    if (!x.failed)
        gelu_forward(o, i, n);
    return wide_done(&x, out, o, n, e);
}

static int cpu_gelu_backward(struct backend *be, enum model_dtype dt, void *dinp,
                             const void *inp, const void *dout, int64_t n, struct err *e)
{
    struct wide x = {.dt = dt};
    float *d = wide_in(&x, dout, n), *i = wide_in(&x, inp, n);
    float *di = dinp == dout ? d : wide_out(&x, dinp, n); /* in place stays in place */
    if (!x.failed)
        gelu_backward(di, i, d, n);
    return wide_done(&x, dinp, di, n, e);
}

static int cpu_crossentropy_forward(struct backend *be, enum model_dtype dt, void *probs,
                                    float *losses, const int32_t *targets, int N, int V,
                                    struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n = (int64_t)N * V;
    float *p = wide_in(&x, probs, n);
    if (!x.failed)
        softmax_crossentropy_forward(p, losses, targets, N, V);
    return wide_done(&x, probs, p, n, e);
}

static int cpu_crossentropy_backward(struct backend *be, enum model_dtype dt, void *probs,
                                     const int32_t *targets, float dloss, int N, int V,
                                     struct err *e)
{
    struct wide x = {.dt = dt};
    int64_t n = (int64_t)N * V;
    float *p = wide_in(&x, probs, n);
    if (!x.failed)
        softmax_crossentropy_backward(p, targets, dloss, N, V);
    return wide_done(&x, probs, p, n, e);
}

/* The fp32 master weights step; a 16-bit model's weights are then master rounded. */
static int cpu_adamw(struct backend *be, void *weights, float *master, const float *g,
                     float *m, float *v, int64_t n, enum model_dtype dtype,
                     const struct adamw_params *p, int t, int decay, struct err *e)
{
    if ((dtype == MODEL_DTYPE_FP32) != (weights == master))
        return err_set(e, ERR_FAIL, "internal: AdamW's weights must be the master weights "
                                    "exactly for fp32");
    adamw_update(master, g, m, v, n, p->lr, p->beta1, p->beta2, p->eps,
                 decay ? p->weight_decay : 0.0f, t);
    if (dtype != MODEL_DTYPE_FP32)
        half_narrow(dtype, weights, master, n);
    return ERR_OK;
}

static int cpu_unscale(struct backend *be, float *x, int64_t n, float mul, int *found,
                       struct err *e)
{
    if (unscale_check(x, n, mul))
        *found = 1;
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

static int cpu_copy_span(struct backend *be, int ev, double *t0_ms, double *t1_ms, int *known,
                         struct err *e)
{
    (void)e;
    *known = be->impl != NULL && hostcopy_span(be->impl, ev, t0_ms, t1_ms);
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
    .dtypes = BACKEND_DTYPE_BIT(MODEL_DTYPE_FP32) | BACKEND_DTYPE_BIT(MODEL_DTYPE_BF16) |
              BACKEND_DTYPE_BIT(MODEL_DTYPE_FP16),
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
    .unscale = cpu_unscale,
    .host_alloc = cpu_alloc, /* host memory is the CPU's memory */
    .host_release = cpu_release,
    .copy_async = cpu_copy_async,
    .event_query = cpu_event_query,
    .event_wait = cpu_event_wait,
    .copy_ms = cpu_copy_ms,
    .copy_span = cpu_copy_span,
    .free = cpu_free,
    .llama = &llama_kernels_cpu,
    .flash = &flash_kernels_cpu,
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
