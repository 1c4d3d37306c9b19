/* The CPU backend's bf16 (backend_cpu.c for the GPT's kernels, backend_llama_cpu.c for the
 * Llama's): a bf16 model's weights, activations and their gradients go through fp32 copies,
 * widened exactly on the way in, computed by the fp32 kernels (fp32 accumulation, as the CUDA
 * backend's bf16 kernels do), rounded to the nearest bf16 (ties to even) on the way out.
 * Parameter gradients, statistics and losses are fp32 in both and used in place. For fp32 the
 * wrappers hand the kernels the arena pointers themselves: no copy, the same bits.
 *
 * A kernel's wrapper declares `struct wide x = {.dt = dt}`, takes its inputs with wide_in and
 * its outputs with wide_out, runs the fp32 kernel unless x.failed, and ends with wide_done,
 * which rounds one output back and frees the copies (wide_narrow for a second output). */
#ifndef BALLAST_WIDE_CPU_H
#define BALLAST_WIDE_CPU_H

#include <stdint.h>

#include "err.h"
#include "model.h"

#define WIDE_MAX 8

struct wide {
    enum model_dtype dt;
    int n, failed;
    float *own[WIDE_MAX];
};

/* A zeroed fp32 copy of n elements, owned by x (NULL, and x->failed, when out of memory). */
float *wide_alloc(struct wide *x, int64_t n);
/* An input of n elements as fp32 (NULL stays NULL; fp32 is the tensor itself). */
float *wide_in(struct wide *x, const void *p, int64_t n);
/* Where a kernel writes an output of n elements (NULL stays NULL; fp32: the tensor itself). */
float *wide_out(struct wide *x, void *p, int64_t n);
/* An output's fp32 copy rounded into `dst` (nothing for fp32 or a failed x). */
void wide_narrow(const struct wide *x, void *dst, const float *src, int64_t n);
/* The output back into `dst` (wide_narrow), then the copies freed; ERR_FAIL if one could not
 * be made. */
int wide_done(struct wide *x, void *dst, const float *src, int64_t n, struct err *e);

#endif
