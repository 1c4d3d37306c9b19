/* The cost model and the size functions against numbers computed by hand. */
#include <CUnit/CUnit.h>
#include <string.h>

#include "cluster.h"
#include "cost.h"
#include "sizes.h"
#include "testutil.h"

/* A layer's costs by position (name, fwd, bwd, state, act, ckpt, out, workspace), without
 * recompute options. */
#define LAYER(n_, f_, b_, s_, a_, c_, o_, w_)                                                  \
    {.name = n_, .fwd_ms = f_, .bwd_ms = b_, .state_bytes = s_, .act_bytes = a_,               \
     .ckpt_bytes = c_, .out_bytes = o_, .workspace_bytes = w_}

static const struct layer_cost three[3] = {
    LAYER("a", 1.0, 2.0, 100, 50, 10, 4, 7),
    LAYER("b", 3.0, 5.0, 200, 80, 20, 4, 30),
    LAYER("c", 0.5, 1.0, 300, 40, 40, 4, 12),
};

static void check(const unsigned char *r, int64_t memory, double recompute, double stage)
{
    struct stage_cost c;
    cost_stage(three, 3, r, 3, 9, &c);
    CU_ASSERT_EQUAL(c.memory_bytes, memory);
    CU_ASSERT_DOUBLE_EQUAL(c.recompute_ms, recompute, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(c.stage_ms, stage, 1e-12);
}

static void test_stage_memory_and_time(void)
{
    /* nothing: 600 state + 3 x (50+80+40) + 0 transient + 30 workspace + 9 reserve */
    check(NULL, 1149, 0, 12.5);
    /* b recomputed: 600 + 3 x (50+20+40) + transient 60 + 30 + 9 */
    check((const unsigned char[]){0, 1, 0}, 1029, 3, 15.5);
    /* a and b: 600 + 3 x (10+20+40) + max(40, 60) + 30 + 9 */
    check((const unsigned char[]){1, 1, 0}, 909, 4, 16.5);
    /* a: 600 + 3 x (10+80+40) + 40 + 30 + 9 */
    check((const unsigned char[]){1, 0, 0}, 1069, 1, 13.5);
    /* c recomputed costs time and saves nothing: ckpt == act, transient 0 */
    check((const unsigned char[]){0, 0, 1}, 1149, 0.5, 13.0);
}

static void test_in_flight(void)
{
    /* 1F1B: min(S - s, M); GPipe: M */
    CU_ASSERT_EQUAL(schedule_in_flight(SCHEDULE_1F1B, 4, 0, 8), 4);
    CU_ASSERT_EQUAL(schedule_in_flight(SCHEDULE_1F1B, 4, 3, 8), 1);
    CU_ASSERT_EQUAL(schedule_in_flight(SCHEDULE_1F1B, 4, 0, 2), 2);
    CU_ASSERT_EQUAL(schedule_in_flight(SCHEDULE_1F1B, 4, 2, 2), 2);
    CU_ASSERT_EQUAL(schedule_in_flight(SCHEDULE_GPIPE, 4, 3, 8), 8);
}

static void test_saturates(void)
{
    struct layer_cost huge = LAYER("h", 1, 1, (int64_t)1 << 53, (int64_t)1 << 53, 0, 0, 0);
    struct stage_cost c;
    cost_stage(&huge, 1, NULL, 1 << 20, 0, &c);
    CU_ASSERT_EQUAL(c.memory_bytes, INT64_MAX);
}

static void test_block_sizes(void)
{
    /* B=2 T=8 C=16 NH=2 V=50, fp32: every tensor is a multiple of 64 bytes */
    struct model m = {.n_layer = 2, .n_embd = 16, .n_head = 2, .seq_len = 8, .vocab_size = 50,
                      .micro_batch = 2, .dtype = MODEL_DTYPE_FP32};
    int64_t B = 2, T = 8, C = 16, NH = 2;
    struct layer_sizes s;
    sizes_layer(&m, 1, &s);
    CU_ASSERT_EQUAL(s.params, 12 * C * C + 13 * C);
    CU_ASSERT_EQUAL(s.state_bytes, 16 * (12 * C * C + 13 * C));
    /* kept: 16 (B,T,C) tensors, 4 (B,T) statistics, the (B,NH,T,T) attention */
    CU_ASSERT_EQUAL(s.act_bytes, 4 * (16 * B * T * C + 4 * B * T + B * NH * T * T));
    CU_ASSERT_EQUAL(s.ckpt_bytes, 4 * B * T * C);
    CU_ASSERT_EQUAL(s.out_bytes, 4 * B * T * C);
    CU_ASSERT_EQUAL(s.workspace_bytes, 4 * (11 * B * T * C + B * NH * T * T));
    /* head: input and targets are its checkpoint */
    sizes_layer(&m, 3, &s);
    CU_ASSERT_EQUAL(s.ckpt_bytes, 4 * B * T * C + 64 /* 16 ids padded to 64 bytes */);
    CU_ASSERT_EQUAL(s.params, 2 * C + 50 * C);
    /* bf16: 2-byte activations, 18 bytes of state per parameter */
    m.dtype = MODEL_DTYPE_BF16;
    sizes_layer(&m, 1, &s);
    CU_ASSERT_EQUAL(s.ckpt_bytes, 2 * B * T * C);
    /* bf16 weight copy: the 16-element vectors (ln1_w, ln1_b, proj_b, ln2_w, ln2_b, fcproj_b)
     * take 32 bytes padded to 64, qkv_b 96 -> 128, fc_b 128: 224 bytes of padding */
    CU_ASSERT_EQUAL(s.state_bytes, 2 * (12 * C * C + 13 * C) + 224 + 16 * (12 * C * C + 13 * C));
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("cost", NULL, NULL);
    CU_add_test(s, "stage memory and time by hand", test_stage_memory_and_time);
    CU_add_test(s, "in-flight micro-batches", test_in_flight);
    CU_add_test(s, "memory saturates instead of wrapping", test_saturates);
    CU_add_test(s, "GPT block sizes by formula", test_block_sizes);
    return test_main();
}
