/* fp16 on the host and the loss scaler, against independent references:
 *   - common/half.h's fp16 conversion against GCC's _Float16 (libgcc's soft-float or the
 *     CPU's F16C: IEEE binary16, round to nearest even): every one of the 65536 halves widened,
 *     and narrowed from every float between and around two neighbouring halves (midpoints,
 *     one ulp either side), every overflow boundary and a sweep of 2^26 float patterns; and the
 *     bulk conversions (half_widen, half_narrow: F16C where the CPU has it) against them;
 *   - the CPU attention's rounding where the CUDA kernels store (kernels_cpu.h's `round`):
 *     every probability an fp16 value, and the output att v of those values (float64);
 *   - lossscale.c's updates against sequences worked by hand from Megatron-LM's
 *     DynamicGradScaler.update, PyTorch's _amp_update_scale_ and DeepSpeed's stop at the
 *     minimum (the rules quoted in lossscale.h), and its range checks. */
#include <CUnit/CUnit.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "kernels_cpu.h"
#include "lossscale.h"
#include "testutil.h"
#include "wide_cpu.h"

static uint16_t ref_narrow(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

static float ref_widen(uint16_t u)
{
    _Float16 h;
    memcpy(&h, &u, 2);
    return (float)h;
}

static float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Whether half.h narrows f as the reference does (NaN to some NaN). */
static int narrows_alike(float f, long *bad)
{
    uint16_t got = fp16_from_float(f), want = ref_narrow(f);
    int ok = isnan(f) ? isnan(fp16_to_float(got)) : got == want;
    if (!ok && (*bad)++ < 5)
        fprintf(stderr, "\n  %a (0x%08x): 0x%04x, expected 0x%04x", (double)f, float_bits(f),
                got, want);
    return ok;
}

static void test_widen_all(void)
{
    long bad = 0;
    for (uint32_t u = 0; u < 65536; u++) {
        float got = fp16_to_float((uint16_t)u), want = ref_widen((uint16_t)u);
        int ok = isnan(want) ? isnan(got) : float_bits(got) == float_bits(want);
        if (!ok && bad++ < 5)
            fprintf(stderr, "\n  0x%04x: %a, expected %a", u, (double)got, (double)want);
        /* and back: every half survives the round trip */
        if (ok && !isnan(want) && fp16_from_float(got) != u && bad++ < 5)
            fprintf(stderr, "\n  0x%04x does not round-trip", u);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_narrow_between_halves(void)
{
    long bad = 0;
    for (uint32_t u = 0; u < 0x7c00; u++) { /* each finite half and the next one up */
        float a = fp16_to_float((uint16_t)u), b = fp16_to_float((uint16_t)(u + 1));
        float mid = (float)(((double)a + (double)b) / 2); /* exact: 11 bits of mantissa */
        float probes[] = {a, b, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY),
                          nextafterf(a, INFINITY), nextafterf(b, 0)};
        for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
            narrows_alike(probes[i], &bad);
            narrows_alike(-probes[i], &bad);
        }
    }
    /* the overflow: 65504 is the largest half, 65520 (its midpoint to 2^16) rounds up to
     * infinity, anything just below stays 65504 */
    CU_ASSERT_EQUAL(fp16_from_float(65504.0f), 0x7bff);
    CU_ASSERT_EQUAL(fp16_from_float(nextafterf(65520.0f, 0)), 0x7bff);
    CU_ASSERT_EQUAL(fp16_from_float(65520.0f), 0x7c00);
    CU_ASSERT_EQUAL(fp16_from_float(-1e10f), 0xfc00);
    CU_ASSERT_EQUAL(fp16_from_float(INFINITY), 0x7c00);
    CU_ASSERT(isnan(fp16_to_float(fp16_from_float(NAN))));
    /* the smallest subnormal 2^-24, and half of it rounding to even (zero) */
    CU_ASSERT_EQUAL(fp16_from_float(0x1p-24f), 0x0001);
    CU_ASSERT_EQUAL(fp16_from_float(0x1p-25f), 0x0000);
    CU_ASSERT_EQUAL(fp16_from_float(0x1.8p-24f), 0x0002);
    for (uint64_t u = 0; u < ((uint64_t)1 << 32); u += 61) /* a sweep across every exponent */
        narrows_alike(bits_float((uint32_t)u), &bad);
    CU_ASSERT_EQUAL(bad, 0);
}

/* The bulk conversions (F16C's instructions where the CPU has them, in blocks of 8 and a tail)
 * give the scalar conversions' values: every half widened, and floats in and around every
 * half's range narrowed (NaNs only stay NaNs). */
static void test_bulk(void)
{
    enum { N = 1 << 16 };
    static uint16_t h[N + 3], back[N + 3];
    static float f[N + 3], g[4 * N + 3];
    long bad = 0;
    for (uint32_t u = 0; u < N; u++)
        h[u] = (uint16_t)u;
    half_widen(MODEL_DTYPE_FP16, f, h, N);     /* a whole number of blocks */
    half_widen(MODEL_DTYPE_FP16, f + N, h, 3); /* and a tail alone */
    for (uint32_t u = 0; u < N + 3; u++) {
        float want = fp16_to_float(h[u % N]);
        bad += isnan(want) ? !isnan(f[u]) : float_bits(f[u]) != float_bits(want);
    }
    /* narrowing: the halves' values, their midpoints, and beyond */
    struct test_rng rng = {3};
    for (int i = 0; i < 4 * N + 3; i++)
        g[i] = i < N       ? f[i]
               : i < 2 * N ? f[i - N] * 1.00048828125f /* near the midpoint above */
                           : bits_float((uint32_t)test_rng_next(&rng));
    uint16_t *out = malloc(sizeof *out * (4 * N + 3));
    half_narrow(MODEL_DTYPE_FP16, out, g, 4 * N + 3);
    for (int i = 0; i < 4 * N + 3; i++) {
        uint16_t want = fp16_from_float(g[i]);
        bad += isnan(g[i]) ? !isnan(fp16_to_float(out[i])) : out[i] != want;
    }
    free(out);
    half_narrow(MODEL_DTYPE_FP16, back, f, N);
    for (uint32_t u = 0; u < N; u++) /* every non-NaN half round-trips */
        bad += !isnan(f[u]) && back[u] != u;
    CU_ASSERT_EQUAL(bad, 0);
}

/* bf16 and fp16 by the dtype (half.h's one choice), and the kernels' rounding hook: scores
 * of a 1-head attention row by hand. */
static void test_half_dispatch(void)
{
    CU_ASSERT_EQUAL(half_from_float(MODEL_DTYPE_FP16, 1.0f), 0x3c00);
    CU_ASSERT_EQUAL(half_from_float(MODEL_DTYPE_BF16, 1.0f), 0x3f80);
    CU_ASSERT_EQUAL(half_to_float(MODEL_DTYPE_FP16, 0x3555), 0x1.554p-2f);
    CU_ASSERT_EQUAL(half_to_float(MODEL_DTYPE_BF16, 0x3eab), 0x1.56p-2f);
    /* 1/3 in each: 11 and 8 significant bits */
    float x[2] = {1.0f / 3, 1.0f / 3};
    uint16_t h[2];
    half_narrow(MODEL_DTYPE_FP16, h, x, 2);
    CU_ASSERT(h[0] == 0x3555 && h[1] == 0x3555);
    half_narrow(MODEL_DTYPE_BF16, h, x, 2);
    CU_ASSERT(h[0] == 0x3eab && h[1] == 0x3eab);
}

/* One batch row, one head: with fp16's rounding the probabilities the kernel keeps and uses
 * are fp16 values (without it most are not), and the output is their product with v. */
static void test_attention_rounding(void)
{
    enum { T = 9, C = 4 };
    float qkv[T * 3 * C], out[T * C], att[T * T], plain[T * T];
    struct test_rng rng = {7};
    for (int i = 0; i < T * 3 * C; i++)
        qkv[i] = (float)test_rng_double(&rng, -2, 2);
    attention_forward(out, att, qkv, 1, T, C, 1, wide_rounding(MODEL_DTYPE_FP16));
    attention_forward(NULL, plain, qkv, 1, T, C, 1, NULL);
    int halves = 1, differ = 0, close = 1;
    for (int t = 0; t < T; t++) {
        for (int j = 0; j <= t; j++) {
            float p = att[t * T + j];
            halves &= fp16_to_float(fp16_from_float(p)) == p;
            differ += p != plain[t * T + j];
        }
        for (int c = 0; c < C; c++) {
            double y = 0;
            for (int j = 0; j <= t; j++)
                y += (double)att[t * T + j] * qkv[j * 3 * C + 2 * C + c];
            close &= test_close(out[t * C + c], y, 1e-6, 1e-5);
        }
    }
    CU_ASSERT(halves);
    CU_ASSERT(differ > T); /* the rounding did something */
    CU_ASSERT(close);
    CU_ASSERT_PTR_NULL(wide_rounding(MODEL_DTYPE_FP32));
}

/* ---- the loss scaler ---- */

struct case_step {
    int overflow;
    float scale_after;
    int verdict;
};

/* Runs `n` steps from `c` and compares each verdict and scale with the hand-worked ones. */
static void run_case(const char *name, const struct lossscale_config *c,
                     const struct case_step *steps, int n)
{
    struct lossscale s;
    lossscale_init(&s, c);
    CU_ASSERT_EQUAL(s.scale, (float)c->initial);
    int skipped = 0;
    for (int i = 0; i < n; i++) {
        int v = lossscale_update(&s, c, steps[i].overflow);
        skipped += steps[i].overflow;
        int ok = v == steps[i].verdict && s.scale == steps[i].scale_after;
        if (!ok)
            fprintf(stderr, "\n  %s, step %d: verdict %d scale %g, expected %d and %g", name,
                    i + 1, v, (double)s.scale, steps[i].verdict, (double)steps[i].scale_after);
        CU_ASSERT(ok);
    }
    CU_ASSERT_EQUAL(s.skipped, skipped);
}

enum { STEP = LOSSSCALE_STEP, SKIP = LOSSSCALE_SKIP, STOP = LOSSSCALE_AT_MIN };

static void test_gradscaler(void)
{
    /* hysteresis 1 is GradScaler: every overflow halves; window 3 clean steps doubles; an
     * overflow restarts the count */
    struct lossscale_config c = {1024, 1e-30, 2, 0.5, 3, 1};
    const struct case_step steps[] = {
        {1, 512, SKIP}, {1, 256, SKIP}, {0, 256, STEP}, {0, 256, STEP}, {0, 512, STEP},
        {0, 512, STEP}, {1, 256, SKIP}, {0, 256, STEP}, {0, 256, STEP}, {0, 512, STEP},
    };
    run_case("GradScaler", &c, steps, (int)(sizeof steps / sizeof steps[0]));
    /* growth past FLT_MAX keeps the scale (_amp_update_scale_'s isfinite) */
    struct lossscale_config big = {0x1p127, 1, 2, 0.5, 1, 1};
    const struct case_step top[] = {{0, 0x1p127f, STEP}, {1, 0x1p126f, SKIP}, {0, 0x1p127f, STEP}};
    run_case("growth at FLT_MAX", &big, top, 3);
}

static void test_megatron_hysteresis(void)
{
    /* hysteresis 2: the first overflow only spends it, the second backs off; the tracker is
     * restored by a growth, not by a clean step; min clamps the backoff */
    struct lossscale_config c = {16, 3, 2, 0.5, 2, 2};
    const struct case_step steps[] = {
        {1, 16, SKIP},  /* tracker 2 -> 1 */
        {0, 16, STEP},  /* growth tracker 1 */
        {1, 8, SKIP},   /* tracker 1 -> 0: back off */
        {1, 4, SKIP},   /* tracker -1: back off again */
        {1, 3, SKIP},   /* 2 < min 3: clamped to the minimum */
        {0, 3, STEP},
        {0, 6, STEP},   /* 2 clean steps: grow, tracker back to 2 */
        {1, 6, SKIP},   /* tracker 1 */
        {1, 3, SKIP},   /* tracker 0: to the minimum */
        {1, 3, STOP},   /* at the minimum with no hysteresis left: stop (DeepSpeed) */
    };
    run_case("Megatron", &c, steps, (int)(sizeof steps / sizeof steps[0]));
}

static void test_check(void)
{
    static const struct {
        struct lossscale_config c;
        const char *says;
    } bad[] = {
        {{0, 1, 2, 0.5, 1000, 2}, "--initial-loss-scale: 0"},
        {{1e39, 1, 2, 0.5, 1000, 2}, "--initial-loss-scale: 1e+39"},
        {{NAN, 1, 2, 0.5, 1000, 2}, "--initial-loss-scale: nan"},
        {{1024, 2048, 2, 0.5, 1000, 2}, "--min-loss-scale: 2048, expected a number in (0, 1024]"},
        {{1024, 0, 2, 0.5, 1000, 2}, "--min-loss-scale: 0"},
        {{1024, 1, 1, 0.5, 1000, 2}, "--loss-scale-growth: 1"},
        {{1024, 1, 2, 1, 1000, 2}, "--loss-scale-backoff: 1"},
        {{1024, 1, 2, 0, 1000, 2}, "--loss-scale-backoff: 0"},
        {{1024, 1, 2, 0.5, 0, 2}, "--loss-scale-window: 0"},
        {{1024, 1, 2, 0.5, 1000, 0}, "--hysteresis: 0"},
    };
    struct err e;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err_clear(&e);
        CU_ASSERT_EQUAL(lossscale_check(&bad[i].c, &e), ERR_INPUT);
        int ok = strstr(e.msg, bad[i].says) != NULL;
        if (!ok)
            fprintf(stderr, "\n  \"%s\" does not say \"%s\"", e.msg, bad[i].says);
        CU_ASSERT(ok);
    }
    struct lossscale_config d = LOSSSCALE_DEFAULTS;
    CU_ASSERT_EQUAL(lossscale_check(&d, &e), ERR_OK);
    /* 1/scale in double, rounded: exact for powers of two */
    struct lossscale s = {.scale = 65536};
    CU_ASSERT_EQUAL(lossscale_inverse(&s), 0x1p-16f);
    s.scale = 3;
    CU_ASSERT_EQUAL(lossscale_inverse(&s), (float)(1.0 / 3.0));
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("fp16", NULL, NULL);
    CU_add_test(s, "every half widens as _Float16 does, and round-trips", test_widen_all);
    CU_add_test(s, "floats narrow as _Float16 does: between halves, at overflow, a sweep",
                test_narrow_between_halves);
    CU_add_test(s, "the bulk conversions (F16C) are the scalar ones", test_bulk);
    CU_add_test(s, "the dtype picks bf16 or fp16", test_half_dispatch);
    CU_add_test(s, "the CPU attention rounds where CUDA stores", test_attention_rounding);
    CU_add_test(s, "hysteresis 1: PyTorch GradScaler's sequence", test_gradscaler);
    CU_add_test(s, "Megatron's hysteresis, the minimum, DeepSpeed's stop", test_megatron_hysteresis);
    CU_add_test(s, "settings out of range name the option and the numbers", test_check);
    return test_main();
}
