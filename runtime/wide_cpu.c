#include "wide_cpu.h"

#include <stdlib.h>

#include "half.h"

float *wide_alloc(struct wide *x, int64_t n)
{
    float *p = x->n < WIDE_MAX ? calloc((size_t)(n > 0 ? n : 1), sizeof(float)) : NULL;
    if (p == NULL)
        x->failed = 1;
    else
        x->own[x->n++] = p;
    return p;
}

float *wide_in(struct wide *x, const void *p, int64_t n)
{
    if (p == NULL || x->dt == MODEL_DTYPE_FP32)
        return (float *)p;
    float *w = wide_alloc(x, n);
    if (w != NULL)
        half_widen(x->dt, w, p, n);
    return w;
}

float *wide_out(struct wide *x, void *p, int64_t n)
{
    return p == NULL || x->dt == MODEL_DTYPE_FP32 ? p : wide_alloc(x, n);
}

void wide_store(const struct wide *x, void *dst, const float *src, int64_t n)
{
    if (!x->failed && dst != NULL && x->dt != MODEL_DTYPE_FP32)
        half_narrow(x->dt, dst, src, n);
}

int wide_done(struct wide *x, void *dst, const float *src, int64_t n, struct err *e)
{
    wide_store(x, dst, src, n);
    for (int i = 0; i < x->n; i++)
        free(x->own[i]);
    return x->failed ? err_set(e, ERR_FAIL, "out of host memory for fp32 copies of %s tensors",
                               model_dtype_name(x->dt))
                     : ERR_OK;
}

static void round_fp16(float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = fp16_to_float(fp16_from_float(v[i]));
}

static void round_bf16(float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = bf16_to_float(bf16_from_float(v[i]));
}

kernel_round_fn wide_rounding(enum model_dtype dt)
{
    return dt == MODEL_DTYPE_FP16 ? round_fp16 : dt == MODEL_DTYPE_BF16 ? round_bf16 : NULL;
}
