/* The CPU backend's 16-bit path. A 16-bit model's tensors (bf16 or fp16: common/half.h picks
 * the format by the dtype, nowhere else) go through fp32 copies: widened exactly on the way
 * in, computed by the fp32 kernels (fp32 accumulation, as the CUDA backend's 16-bit kernels
 * do), rounded to the nearest 16-bit value (ties to even) on the way out. For fp32 the copies
 * are the arena pointers themselves: no copy, the same bits.
 *
 * Usage, per kernel call: `struct wide x = {.dt = dt};`, wide_in for each input, wide_out for
 * each output, the fp32 kernel on the returned pointers, then wide_done (the output rounded
 * into its tensor, the copies freed; a second output through wide_store first). */
#ifndef BALLAST_WIDE_CPU_H
#define BALLAST_WIDE_CPU_H

#include <stdint.h>

#include "err.h"
#include "kernels_cpu.h"
#include "model.h"

#define WIDE_MAX 8

struct wide {
    enum model_dtype dt;
    int n, failed;
    float *own[WIDE_MAX];
};

/* A zeroed fp32 buffer of n elements, freed by wide_done (NULL and x->failed when it cannot
 * be had). Zeroed: an output copy a kernel only partly writes (the attention's upper
 * triangle) must not carry garbage into the 16-bit tensor. */
float *wide_alloc(struct wide *x, int64_t n);
/* An input of n elements as fp32 (NULL stays NULL). */
float *wide_in(struct wide *x, const void *p, int64_t n);
/* Where a kernel writes an output of n elements (NULL stays NULL). */
float *wide_out(struct wide *x, void *p, int64_t n);
/* A further output `src` rounded into `dst` (nothing for fp32, whose src is dst). */
void wide_store(const struct wide *x, void *dst, const float *src, int64_t n);
/* The output `src` rounded into `dst` (may be NULL: none), then the copies freed; ERR_FAIL
 * if one could not be made. */
int wide_done(struct wide *x, void *dst, const float *src, int64_t n, struct err *e);
/* The kernels' rounding of values the CUDA kernels keep in memory between two steps of one
 * kernel (kernel_round_fn): to the dtype's 16-bit format and back; NULL for fp32. */
kernel_round_fn wide_rounding(enum model_dtype dt);

#endif
