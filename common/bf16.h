/* bfloat16 on the host: the upper 16 bits of an IEEE fp32. Conversion rounds to nearest, ties
 * to even (what CUDA's __float2bfloat16 does), and keeps NaNs NaN. */
#ifndef BALLAST_BF16_H
#define BALLAST_BF16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t bf16_from_float(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float bf16_to_float(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
