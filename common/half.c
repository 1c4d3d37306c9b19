#include "half.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>

/* x86-64's F16C: IEEE conversions, rounding to nearest even (the immediate), subnormals kept. */
__attribute__((target("avx,f16c"))) static int64_t widen_f16c(float *dst, const uint16_t *src,
                                                              int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    return i;
}

__attribute__((target("avx,f16c"))) static int64_t narrow_f16c(uint16_t *dst, const float *src,
                                                               int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    return i;
}

/* CPUID and XGETBV rather than __builtin_cpu_supports("f16c"), which clang 14 (the fuzz
 * build's compiler) does not know: F16C and AVX on the CPU, and the YMM state enabled by the OS. */
static int has_f16c(void)
{
    static int known = -1;
    if (known < 0) {
        unsigned a, b, c, d, lo = 0, hi = 0;
        known = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) && (c & bit_AVX) &&
                (c & bit_OSXSAVE);
        if (known) {
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            known = (lo & 6) == 6;
        }
    }
    return known;
}
#else
static int64_t widen_f16c(float *dst, const uint16_t *src, int64_t n) { return 0; }
static int64_t narrow_f16c(uint16_t *dst, const float *src, int64_t n) { return 0; }
static int has_f16c(void) { return 0; }
#endif

void half_widen(enum model_dtype dt, float *dst, const uint16_t *src, int64_t n)
{
    if (dt != MODEL_DTYPE_FP16) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = bf16_to_float(src[i]);
        return;
    }
    for (int64_t i = has_f16c() ? widen_f16c(dst, src, n) : 0; i < n; i++)
        dst[i] = fp16_to_float(src[i]);
}

void half_narrow(enum model_dtype dt, uint16_t *dst, const float *src, int64_t n)
{
    if (dt != MODEL_DTYPE_FP16) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = bf16_from_float(src[i]);
        return;
    }
    for (int64_t i = has_f16c() ? narrow_f16c(dst, src, n) : 0; i < n; i++)
        dst[i] = fp16_from_float(src[i]);
}
