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

/* Layer b's option "half" keeps 50 of its 80 bytes and regenerates 30 in 0.75 ms. */
static void test_options_by_hand(void)
{
    struct layer_cost l[3] = {three[0], three[1], three[2]};
    l[1].n_options = 1;
    l[1].options[0] = (struct recompute_option){"half", 50, 30, 0.75};
    struct stage_cost c;
    CU_ASSERT_EQUAL(cost_choice_count(&l[1]), 3);
    CU_ASSERT_STRING_EQUAL(cost_choice_name(&l[1], COST_OPTION), "half");
    CU_ASSERT_STRING_EQUAL(cost_choice_name(&l[1], COST_FULL), "full");
    /* keep, half, keep: 600 + 3 x (50+50+40) + transient 30 + 30 + 9 */
    cost_stage(l, 3, (const unsigned char[]){COST_KEEP, COST_OPTION, COST_KEEP}, 3, 9, &c);
    CU_ASSERT_EQUAL(c.kept_bytes, 140);
    CU_ASSERT_EQUAL(c.transient_bytes, 30);
    CU_ASSERT_EQUAL(c.memory_bytes, 1089);
    CU_ASSERT_DOUBLE_EQUAL(c.recompute_ms, 0.75, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(c.stage_ms, 13.25, 1e-12);
    /* full a, half b, keep c: 600 + 3 x (10+50+40) + max(40, 30) + 30 + 9 */
    cost_stage(l, 3, (const unsigned char[]){COST_FULL, COST_OPTION, COST_KEEP}, 3, 9, &c);
    CU_ASSERT_EQUAL(c.memory_bytes, 979);
    CU_ASSERT_DOUBLE_EQUAL(c.recompute_ms, 1.75, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(c.stage_ms, 14.25, 1e-12);
    /* keep and full are today's formula whatever options the layers have */
    cost_stage(l, 3, (const unsigned char[]){1, 1, 0}, 3, 9, &c);
    CU_ASSERT_EQUAL(c.memory_bytes, 909);
    CU_ASSERT_DOUBLE_EQUAL(c.recompute_ms, 4, 1e-12);
}

/* The block's options from the size functions: which tensors each regenerates, and its
 * bytes, by formula (B=2 T=8 C=16 NH=2, fp32: every tensor a multiple of 64 bytes). */
static void test_option_sizes(void)
{
    struct model m = {.n_layer = 2, .n_embd = 16, .n_head = 2, .seq_len = 8, .vocab_size = 50,
                      .micro_batch = 2, .dtype = MODEL_DTYPE_FP32};
    int64_t B = 2, T = 8, C = 16, NH = 2, kept, transient;
    struct sizes_option o[SIZES_OPTIONS_MAX];
    struct layer_sizes s;
    sizes_layer(&m, 1, &s);
    CU_ASSERT_EQUAL_FATAL(sizes_recompute_options(&m, MODEL_LAYER_BLOCK, o), 3);
    CU_ASSERT_STRING_EQUAL(o[0].name, "attn");
    CU_ASSERT_STRING_EQUAL(o[1].name, "mlp");
    CU_ASSERT_STRING_EQUAL(o[2].name, "attn+mlp");
    /* kept tensors: inp 0, ln1 1, ln1_mean 2, ln1_rstd 3, qkv 4, att 5, atty 6, ..., fch 11,
     * fch_gelu 12 */
    CU_ASSERT_EQUAL(o[0].regen, 1u << 5);
    CU_ASSERT_EQUAL(o[1].regen, 1u << 12);
    CU_ASSERT_EQUAL(o[2].regen, (1u << 5) | (1u << 12));
    sizes_regen_bytes(&m, MODEL_LAYER_BLOCK, o[0].regen, &kept, &transient);
    CU_ASSERT_EQUAL(transient, 4 * B * NH * T * T);
    CU_ASSERT_EQUAL(kept + transient, s.act_bytes);
    sizes_regen_bytes(&m, MODEL_LAYER_BLOCK, o[1].regen, &kept, &transient);
    CU_ASSERT_EQUAL(transient, 4 * B * T * 4 * C);
    sizes_regen_bytes(&m, MODEL_LAYER_BLOCK, sizes_full_regen(&m, MODEL_LAYER_BLOCK), &kept,
                      &transient);
    CU_ASSERT_EQUAL(kept, s.ckpt_bytes);
    CU_ASSERT_EQUAL(transient, s.act_bytes - s.ckpt_bytes);
    /* the embedding and the head have no partial options */
    CU_ASSERT_EQUAL(sizes_recompute_options(&m, MODEL_LAYER_EMBED, o), 0);
    CU_ASSERT_EQUAL(sizes_recompute_options(&m, MODEL_LAYER_HEAD, o), 0);
    uint32_t regen = 0;
    CU_ASSERT(sizes_find_option(&m, MODEL_LAYER_BLOCK, "mlp", &regen) && regen == 1u << 12);
    CU_ASSERT(!sizes_find_option(&m, MODEL_LAYER_HEAD, "mlp", &regen));
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

/* A random stage of up to 6 layers, each with up to PROFILE_OPTIONS_MAX options. */
static int random_stage(struct test_rng *rng, struct layer_cost *l, unsigned char *choice)
{
    int n = (int)test_rng_int(rng, 1, 6);
    for (int i = 0; i < n; i++) {
        int64_t act = test_rng_int(rng, 0, 1000), ckpt = test_rng_int(rng, 0, act);
        l[i] = (struct layer_cost)LAYER("x", test_rng_double(rng, 0, 3), test_rng_double(rng, 0, 5),
                                        test_rng_int(rng, 0, 500), act, ckpt, 4,
                                        test_rng_int(rng, 0, 300));
        l[i].n_options = (int)test_rng_int(rng, 0, PROFILE_OPTIONS_MAX);
        for (int k = 0; k < l[i].n_options; k++) {
            int64_t kept = test_rng_int(rng, ckpt, act);
            l[i].options[k] = (struct recompute_option){"o", kept, act - kept,
                                                        test_rng_double(rng, 0, 2)};
        }
        choice[i] = (unsigned char)test_rng_int(rng, 0, cost_choice_count(&l[i]) - 1);
    }
    return n;
}

/* The action rows, the running sums and the knapsack's view (fixed bytes plus each choice's
 * weights) all give cost_stage's M, against M summed here term by term from the profile. */
static void test_views_agree(void)
{
    struct test_rng rng = {2024};
    for (int trial = 0; trial < 2000; trial++) {
        struct layer_cost l[6];
        unsigned char choice[6];
        int n = random_stage(&rng, l, choice), v = (int)test_rng_int(&rng, 1, 8);
        int64_t reserve = test_rng_int(&rng, 0, 100), state = 0, kept = 0, trans = 0, ws = 0;
        __int128 weights = 0;
        int64_t largest = 0;
        struct cost_sum sum = {0};
        for (int i = 0; i < n; i++) {
            const struct layer_cost *c = &l[i];
            int64_t k = choice[i] == COST_KEEP   ? c->act_bytes
                        : choice[i] == COST_FULL ? c->ckpt_bytes
                                                 : c->options[choice[i] - COST_OPTION].kept_bytes;
            int64_t t = c->act_bytes - k;
            state += c->state_bytes;
            kept += k;
            trans = t > trans ? t : trans;
            ws = c->workspace_bytes > ws ? c->workspace_bytes : ws;
            struct cost_row rows[COST_ROWS_MAX];
            CU_ASSERT_EQUAL(cost_rows(c, rows), cost_choice_count(c));
            CU_ASSERT_EQUAL(rows[choice[i]].kept_bytes, k);
            CU_ASSERT_EQUAL(rows[choice[i]].transient_bytes, t);
            CU_ASSERT_EQUAL(rows[choice[i]].action.place, COST_PLACE_DEVICE);
            CU_ASSERT_EQUAL(cost_saved_bytes(c, choice[i], v), v * (c->act_bytes - k));
            __int128 w;
            int64_t wt;
            cost_weights(c, choice[i], v, &w, &wt);
            weights += w;
            largest = wt > largest ? wt : largest;
            /* the running sum of a prefix is the prefix's stage */
            struct stage_cost prefix;
            cost_sum_add(&sum, c->state_bytes, c->workspace_bytes, c->fwd_ms + c->bwd_ms,
                         &rows[choice[i]]);
            cost_stage(l, i + 1, choice, v, reserve, &prefix);
            CU_ASSERT_EQUAL(cost_sum_memory(&sum, v, reserve), prefix.memory_bytes);
        }
        int64_t M = state + v * kept + trans + ws + reserve;
        struct stage_cost c;
        cost_stage(l, n, choice, v, reserve, &c);
        CU_ASSERT_EQUAL(c.memory_bytes, M);
        CU_ASSERT_EQUAL(cost_fixed_bytes(l, n, v, reserve) + weights + largest, M);
    }
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

/* GPT-2 124M's shapes in bf16 (B=8, T=1024, C=768, NH=12, V=50257), every number by hand:
 * BTC = 6291456, B*NH*T*T = 100663296, BT = 8192; every tensor here is a multiple of 64
 * bytes, so no padding. */
static void test_bf16_sizes(void)
{
    struct model m = {.n_layer = 12, .n_embd = 768, .n_head = 12, .seq_len = 1024,
                      .vocab_size = 50257, .micro_batch = 8, .dtype = MODEL_DTYPE_BF16};
    struct layer_sizes s;
    CU_ASSERT_EQUAL(sizes_weight_elem_bytes(MODEL_DTYPE_BF16), 2);
    CU_ASSERT_EQUAL(sizes_act_elem_bytes(MODEL_DTYPE_BF16), 2);
    CU_ASSERT_EQUAL(sizes_state_bytes_per_param(MODEL_DTYPE_BF16), 18);
    /* embed: wte 50257 x 768 + wpe 1024 x 768 = 39383808 parameters, 18 bytes each */
    sizes_layer(&m, 0, &s);
    CU_ASSERT_EQUAL(s.params, 39383808);
    CU_ASSERT_EQUAL(s.state_bytes, 708908544);
    CU_ASSERT_EQUAL(s.act_bytes, 32768);   /* the token ids, int32 */
    CU_ASSERT_EQUAL(s.ckpt_bytes, 32768);
    CU_ASSERT_EQUAL(s.out_bytes, 12582912); /* 2 x BTC */
    CU_ASSERT_EQUAL(s.workspace_bytes, 25165824); /* out and dout */
    /* block: 12 C^2 + 13 C = 7087872 parameters */
    sizes_layer(&m, 1, &s);
    CU_ASSERT_EQUAL(s.params, 7087872);
    CU_ASSERT_EQUAL(s.state_bytes, 127581696);
    /* kept: 16 BTC-sized bf16 tensors and the bf16 attention, 4 fp32 statistics:
     * 2 x (16 x 6291456 + 100663296) + 4 x 4 x 8192 */
    CU_ASSERT_EQUAL(s.act_bytes, 402784256);
    CU_ASSERT_EQUAL(s.ckpt_bytes, 12582912);
    CU_ASSERT_EQUAL(s.out_bytes, 12582912);
    /* out, dout, dinp, d4 (4), dln, dqkv (3): 11 BTC, and datt: 2 x (69206016 + 100663296) */
    CU_ASSERT_EQUAL(s.workspace_bytes, 339738624);
    /* head: lnf_w, lnf_b and lm_w (50257 x 768) */
    sizes_layer(&m, 13, &s);
    CU_ASSERT_EQUAL(s.params, 38598912);
    CU_ASSERT_EQUAL(s.state_bytes, 694780416);
    /* inp, lnf: 2 x 12582912; targets, mean, rstd: 3 x 32768; probs B x T x V bf16:
     * 823410688 */
    CU_ASSERT_EQUAL(s.act_bytes, 848674816);
    CU_ASSERT_EQUAL(s.ckpt_bytes, 12582912 + 32768);
    CU_ASSERT_EQUAL(s.out_bytes, 4);
    /* dlnf, dinp bf16, losses fp32 */
    CU_ASSERT_EQUAL(s.workspace_bytes, 2 * 12582912 + 32768);
    /* the same model in fp32 doubles every activation but the ids and statistics */
    m.dtype = MODEL_DTYPE_FP32;
    sizes_layer(&m, 1, &s);
    CU_ASSERT_EQUAL(s.act_bytes, 4 * (16 * 6291456 + 100663296) + 4 * 4 * 8192);
    CU_ASSERT_EQUAL(s.state_bytes, 16 * 7087872);
}

/* The optimizer's place by hand: three layers whose state splits as (param, grad, optimizer)
 * = (10, 20, 70), (20, 40, 140), (30, 60, 210). */
static void test_optimizer_place(void)
{
    struct layer_cost l[3] = {
        LAYER("a", 1.0, 2.0, 100, 50, 10, 4, 7),
        LAYER("b", 3.0, 5.0, 200, 80, 20, 4, 30),
        LAYER("c", 0.5, 1.0, 300, 40, 40, 4, 12),
    };
    for (int k = 0; k < 3; k++)
        l[k].has_split = 1, l[k].param_bytes = 10 * (k + 1), l[k].grad_bytes = 20 * (k + 1),
        l[k].optimizer_bytes = 70 * (k + 1);
    struct cost_actions dev = {0}, host = {.optimizer = COST_PLACE_HOST};
    struct stage_cost c;
    /* on the device: as test_stage_memory_and_time's, nothing on the host */
    cost_stage_actions(l, 3, &dev, 3, 9, &c);
    CU_ASSERT_EQUAL(c.memory_bytes, 1149);
    CU_ASSERT_EQUAL(c.host_memory_bytes, 0);
    /* on the host: (10+20) + (20+40) + (30+60) = 180 state instead of 600; the mirror
     * 4 x (20 + 40 + 60) = 480; the time per micro-batch is the same */
    cost_stage_actions(l, 3, &host, 3, 9, &c);
    CU_ASSERT_EQUAL(c.memory_bytes, 1149 - 600 + 180);
    CU_ASSERT_EQUAL(c.host_memory_bytes, 480);
    CU_ASSERT_EQUAL(c.optimizer, COST_PLACE_HOST);
    CU_ASSERT_DOUBLE_EQUAL(c.stage_ms, 12.5, 1e-12);
    /* the view the planner's searches take: state = devstate, the mirror returned */
    struct layer_cost view[3];
    CU_ASSERT_EQUAL(cost_layers_for_optimizer(l, 3, COST_PLACE_HOST, view), 480);
    CU_ASSERT_EQUAL(view[1].state_bytes, 60);
    CU_ASSERT_EQUAL(cost_layers_for_optimizer(l, 3, COST_PLACE_DEVICE, view), 0);
    CU_ASSERT_EQUAL(view[1].state_bytes, 200);
    /* a layer without the split cannot move its optimizer */
    int missing;
    CU_ASSERT_TRUE(cost_optimizer_movable(l, 3, &missing));
    CU_ASSERT_EQUAL(missing, -1);
    l[2].has_split = 0;
    CU_ASSERT_FALSE(cost_optimizer_movable(l, 3, &missing));
    CU_ASSERT_EQUAL(missing, 2);
}

/* The size functions' split: fp32 (4n, 4n, 8n), bf16 (2n, 4n, 12n), summing to state. */
static void test_state_split(void)
{
    struct model m = {.n_layer = 2, .n_embd = 64, .n_head = 4, .seq_len = 32,
                      .vocab_size = 256, .micro_batch = 2, .dtype = MODEL_DTYPE_FP32};
    struct layer_sizes s;
    sizes_layer(&m, 1, &s); /* 12 C^2 + 13 C = 49984 parameters, every tensor 64-byte sized */
    CU_ASSERT_EQUAL(s.param_bytes, 4 * 49984);
    CU_ASSERT_EQUAL(s.grad_bytes, 4 * 49984);
    CU_ASSERT_EQUAL(s.optimizer_bytes, 8 * 49984);
    CU_ASSERT_EQUAL(s.state_bytes, s.param_bytes + s.grad_bytes + s.optimizer_bytes);
    m.dtype = MODEL_DTYPE_BF16;
    sizes_layer(&m, 1, &s);
    CU_ASSERT_EQUAL(s.param_bytes, 2 * 49984);
    CU_ASSERT_EQUAL(s.grad_bytes, 4 * 49984);
    CU_ASSERT_EQUAL(s.optimizer_bytes, 12 * 49984);
    CU_ASSERT_EQUAL(s.state_bytes, 18 * 49984);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("cost", NULL, NULL);
    CU_add_test(s, "stage memory and time by hand", test_stage_memory_and_time);
    CU_add_test(s, "recompute options by hand", test_options_by_hand);
    CU_add_test(s, "the block's options from the size functions", test_option_sizes);
    CU_add_test(s, "in-flight micro-batches", test_in_flight);
    CU_add_test(s, "memory saturates instead of wrapping", test_saturates);
    CU_add_test(s, "rows, running sums and the knapsack's view give M", test_views_agree);
    CU_add_test(s, "GPT block sizes by formula", test_block_sizes);
    CU_add_test(s, "bf16 sizes of GPT-2 124M by hand", test_bf16_sizes);
    CU_add_test(s, "the optimizer on the device and on the host by hand", test_optimizer_place);
    CU_add_test(s, "the state split of the size functions", test_state_split);
    return test_main();
}
