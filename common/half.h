/* 16-bit storage on the host: IEEE fp16 (binary16) beside bfloat16 (bf16.h), and the one
 * place a model's dtype picks between them. fp16 conversion rounds to nearest, ties to even,
 * as CUDA's __float2half_rn does: magnitudes from 65520 up become infinity (the overflow
 * dynamic loss scaling watches for), those below 2^-24 / 2 zero, with subnormals between;
 * NaNs stay NaN. Widening is exact. */
#ifndef BALLAST_HALF_H
#define BALLAST_HALF_H

#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "model.h"

static inline uint16_t fp16_from_float(float f)
{
    /* Fabian Giesen's float_to_half_fast3_rtne: subnormals by one float addition, which the
     * FPU rounds to nearest even; normals by rebiasing the exponent and rounding the 13 bits
     * dropped from the mantissa. */
    const uint32_t f32_inf = 255u << 23, f16_limit = (127u + 16u) << 23;
    const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = u & 0x80000000u;
    uint16_t o;
    u ^= sign;
    if (u >= f16_limit) { /* 2^16 and up, infinity, NaN */
        o = u > f32_inf ? 0x7e00u : 0x7c00u;
    } else if (u < (113u << 23)) { /* below 2^-14: a subnormal or zero */
        float x, magic;
        memcpy(&x, &u, sizeof x);
        memcpy(&magic, &denorm_magic, sizeof magic);
        x += magic;
        memcpy(&u, &x, sizeof u);
        o = (uint16_t)(u - denorm_magic);
    } else {
        uint32_t odd = (u >> 13) & 1u;
        u += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
        o = (uint16_t)(u >> 13); /* 65520 and up carry into the infinity pattern */
    }
    return (uint16_t)(o | (sign >> 16));
}

static inline float fp16_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu, u;
    float f;
    if (em >= 0x7c00u) { /* infinity, NaN (payload kept, so a NaN stays one) */
        u = 0x7f800000u | (em & 0x3ffu) << 13;
    } else if (em >= 0x0400u) {
        u = (em << 13) + ((uint32_t)(127 - 15) << 23);
    } else { /* subnormal: em x 2^-24, exact in fp32 */
        f = (float)em * 5.9604644775390625e-8f;
        memcpy(&u, &f, sizeof u);
    }
    u |= sign;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* A 16-bit model's (model_dtype_16bit) element to and from fp32. */
static inline uint16_t half_from_float(enum model_dtype dt, float f)
{
    return dt == MODEL_DTYPE_FP16 ? fp16_from_float(f) : bf16_from_float(f);
}

static inline float half_to_float(enum model_dtype dt, uint16_t h)
{
    return dt == MODEL_DTYPE_FP16 ? fp16_to_float(h) : bf16_to_float(h);
}

/* n elements each way (dst and src apart), as the functions above convert them: on an x86-64
 * CPU with F16C (every AVX2 one) fp16 goes through its conversion instructions, 8 at a time
 * (the same values; a NaN stays a NaN, its payload may differ), else one by one (half.c). */
void half_widen(enum model_dtype dt, float *dst, const uint16_t *src, int64_t n);
void half_narrow(enum model_dtype dt, uint16_t *dst, const float *src, int64_t n);

#endif
