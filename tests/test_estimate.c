/* Estimated profiles of bf16 models: on a device without bf16 tensor cores (V100, T4, as
 * configs/devices.json says) a block's GEMMs cost their FLOPs at the fp32 peak, on one with
 * them at the 16-bit tensor peak. fp16 models: GEMMs at the fp16 tensor peak (a V100 block
 * about 8x faster than in bf16, its roofline worked by hand here), memory byte for byte
 * bf16's, the optimizer step one unscaling pass longer; a device whose table gives no fp16
 * peak is refused. The reference is the block's operations counted here from the model's
 * shape and the device table's figures, read here with cJSON. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testjson.h"
#include "testutil.h"

#define CONFIGS BALLAST_SOURCE_DIR "/configs/"

static const cJSON *device(const cJSON *table, const char *name)
{
    const cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(table, "devices"))
        if (strcmp(cJSON_GetObjectItemCaseSensitive(d, "name")->valuestring, name) == 0)
            return d;
    CU_FAIL_FATAL("device not in configs/devices.json");
    return NULL;
}

/* The forward GEMM FLOPs of one GPT block: qkv 6BTC^2, projection 2BTC^2, MLP 16BTC^2, and
 * attention's QK^T and its product with V, 2BT^2C each. */
static double block_gemm_flops(const cJSON *model)
{
    double B = test_num(model, "micro_batch"), T = test_num(model, "seq_len"),
           C = test_num(model, "n_embd");
    return 24 * B * T * C * C + 4 * B * T * T * C;
}

/* block.0's forward and backward of `model` estimated on `device` by `ballast profile`. */
static void estimate_block(const char *model, const char *dev, double *fwd, double *bwd)
{
    char args[1024];
    const char *out = test_path("estimated.json");
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device %s -o '%s'", model, dev,
             out);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    cJSON *p = test_read_json(out);
    const cJSON *block = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(p, "layers"), 1);
    CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItemCaseSensitive(block, "name")->valuestring,
                           "block.0");
    *fwd = test_num(block, "fwd_ms");
    *bwd = test_num(block, "bwd_ms");
    cJSON_Delete(p);
}

/* ms for `flops` at `tflops` x the table's GEMM efficiency */
static double gemm_ms(const cJSON *table, double flops, double tflops)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(table, "assumptions");
    double eff = test_num(a, "gemm_efficiency");
    return flops / (tflops * 1e12 * eff) * 1e3;
}

static void check(const char *model_name, const char *dev_name, int bf16_tensor)
{
    char model_file[512];
    snprintf(model_file, sizeof model_file, CONFIGS "models/%s.json", model_name);
    cJSON *table = test_read_json(CONFIGS "devices.json");
    cJSON *model = test_read_json(model_file);
    CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItemCaseSensitive(model, "dtype")->valuestring, "bf16");
    const cJSON *d = device(table, dev_name);
    const cJSON *flag = cJSON_GetObjectItemCaseSensitive(d, "bf16_tensor");
    CU_ASSERT_EQUAL(flag == NULL || cJSON_IsTrue(flag), bf16_tensor);
    double fwd, bwd, flops = block_gemm_flops(model);
    estimate_block(model_file, dev_name, &fwd, &bwd);
    double fp32 = gemm_ms(table, flops, test_num(d, "peak_tflops_fp32"));
    double tensor = gemm_ms(table, flops, test_num(d, "peak_tflops_16bit"));
    if (!bf16_tensor) {
        /* the rest of a block this large (memory-bound operations, launches) is under 5% */
        CU_ASSERT(fwd >= fp32 && test_close(fwd, fp32, 0, 0.05));
        CU_ASSERT(bwd >= 2 * fp32 && test_close(bwd, 2 * fp32, 0, 0.05));
        CU_ASSERT(fwd > 4 * tensor); /* what costing at the fp16 tensor peak gave */
    } else {
        CU_ASSERT(fwd >= tensor && fwd <= 1.25 * tensor);
        CU_ASSERT(fwd < fp32);
    }
    if (!test_close(fwd, bf16_tensor ? tensor : fp32, 0, bf16_tensor ? 0.25 : 0.05))
        fprintf(stderr, "\n%s on %s: fwd %.3f ms, GEMMs at fp32 %.3f, at tensor %.3f\n",
                model_name, dev_name, fwd, fp32, tensor);
    cJSON_Delete(model);
    cJSON_Delete(table);
}

static void test_no_bf16_tensor_cores(void)
{
    check("gpt-13b", "V100-32GB", 0);
    check("gpt-1.3b", "T4", 0);
}

static void test_bf16_tensor_cores(void)
{
    check("gpt-13b", "A100-80GB", 1);
    check("gpt-1.3b", "RTX4090", 1);
}

/* The flag is optional (absent: tensor cores) but must be a boolean. */
static void test_flag_checked(void)
{
    char *text = test_read(CONFIGS "devices.json");
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    char *at = strstr(text, "\"bf16_tensor\": false");
    CU_ASSERT_PTR_NOT_NULL_FATAL(at);
    memcpy(at, "\"bf16_tensor\": 0    ", strlen("\"bf16_tensor\": false"));
    const char *bad = test_write("devices.json", text);
    free(text);
    char args[1024], *err = NULL;
    snprintf(args, sizeof args,
             "profile --model '" CONFIGS "models/gpt-13b.json' --estimate --device V100-32GB "
             "--devices '%s' -o '%s'",
             bad, test_path("out.json"));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "devices[0].bf16_tensor") != NULL &&
              strstr(err, "expected true or false") != NULL);
    free(err);
}

/* The AdamW step of a bf16 GPT-175B block on an A100-80GB, by hand: n = 12 C^2 + 13 C
 * parameters, each touched as 2 bytes of weights written, 4 of gradients read and 12 of m, v
 * and master read and written: 30n bytes, over the HBM bandwidth at the table's memory
 * efficiency plus one kernel's overhead per parameter tensor (12 in a block); on the host the
 * mirror's gradients read and master, m, v read and written plus the weights written (30n)
 * over the assumed host memory bandwidth. The split: 2n, 4n, 12n. */
static void test_optimizer_step(void)
{
    char args[1024];
    const char *out = test_path("estimated-opt.json");
    snprintf(args, sizeof args,
             "profile --model '%smodels/gpt-175b.json' --estimate --device A100-80GB -o '%s'",
             CONFIGS, out);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    cJSON *p = test_read_json(out), *table = test_read_json(CONFIGS "devices.json");
    const cJSON *block = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(p, "layers"), 1);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(table, "assumptions");
    const cJSON *d = device(table, "A100-80GB");
    double C = 12288, n = 12 * C * C + 13 * C;
    double dev_ms = 30 * n / (test_num(d, "memory_bandwidth_gbs") * 1e9 *
                              test_num(a, "memory_efficiency")) * 1e3 +
                    12 * test_num(d, "op_overhead_us") * 1e-3;
    double host_ms = 30 * n / (test_num(a, "host_memory_bandwidth_gbs") * 1e9) * 1e3;
    CU_ASSERT(test_close(test_num(block, "optimizer_ms"), dev_ms, 0, 1e-9));
    CU_ASSERT(test_close(test_num(block, "host_optimizer_ms"), host_ms, 0, 1e-9));
    CU_ASSERT(test_num(block, "param_bytes") == 2 * n && test_num(block, "grad_bytes") == 4 * n &&
              test_num(block, "optimizer_bytes") == 12 * n);
    printf(" [block.0: %.3f ms on the device, %.3f ms on the host] ", dev_ms, host_ms);
    cJSON_Delete(p);
    cJSON_Delete(table);
}

/* block.0 of configs/models/`model` estimated on `dev` (with --devices `table` unless NULL). */
static cJSON *estimate_layers(const char *model, const char *dev, const char *table)
{
    char args[2048];
    const char *out = test_path("estimated-layers.json");
    snprintf(args, sizeof args,
             "profile --model '" CONFIGS "models/%s.json' --estimate --device %s %s%s%s -o '%s'",
             model, dev, table ? "--devices '" : "", table ? table : "", table ? "'" : "", out);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    return test_read_json(out);
}

static const cJSON *layer(const cJSON *p, int l)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(p, "layers"), l);
}

/* One operation's roofline: max(flops at the peak x gemm_efficiency, bytes at the bandwidth x
 * memory_efficiency) plus the device's launch overhead, in ms. */
struct roof {
    double peak, vector, bw, overhead_ms;
};

static double roof_ms(const struct roof *r, double flops, double bytes)
{
    double compute = flops / r->peak, memory = bytes / r->bw;
    return (compute > memory ? compute : memory) * 1e3 + r->overhead_ms;
}

/* GPT-13B's block forward on `d` with its GEMMs at `gemm_tflops`, worked from its shape (B 1,
 * T 2048, C 5120, 40 heads of 128, 2-byte activations): the five GEMMs (qkv, q k^T, att v,
 * the projection, fc, fc projection) read their two operands and write their product; the
 * pointwise operations (two layer norms, the causal softmax over the T x T scores, GELU and
 * two residual adds) read and write whole arrays, their few FLOPs a head at the vector peak.
 * *gemm_ms gets the GEMMs' part. Every GEMM here is compute-bound (checked), so counting
 * k and v once per head or once per micro-batch changes nothing. */
static double block_forward_by_hand(const cJSON *table, const cJSON *d, double gemm_tflops,
                                    double *gemm_ms)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(table, "assumptions");
    struct roof r = {gemm_tflops * 1e12 * test_num(a, "gemm_efficiency"),
                     test_num(d, "peak_tflops_fp32") * 1e12,
                     test_num(d, "memory_bandwidth_gbs") * 1e9 * test_num(a, "memory_efficiency"),
                     test_num(d, "op_overhead_us") * 1e-3};
    const double B = 1, T = 2048, C = 5120, NH = 40, HS = C / NH, e = 2, BT = B * T;
    const double gemms[6][3] = {{BT, C, 3 * C},      {B * NH * T, HS, T}, {B * NH * T, T, HS},
                                {BT, C, C},          {BT, C, 4 * C},      {BT, 4 * C, C}};
    *gemm_ms = 0;
    for (int i = 0; i < 6; i++) {
        double M = gemms[i][0], K = gemms[i][1], N = gemms[i][2];
        int per_head = i == 1 || i == 2; /* k or v: an operand per head, not one weight */
        double flops = 2 * M * K * N,
               most_bytes = (M * K + (per_head ? B * NH : 1) * K * N + M * N) * e;
        CU_ASSERT(flops / r.peak > most_bytes / r.bw);
        *gemm_ms += roof_ms(&r, flops, (M * K + K * N + M * N) * e);
    }
    /* elements, arrays read and written, FLOPs per element */
    const double pointwise[6][3] = {{BT * C, 2, 8},      {B * NH * T * T, 2, 5}, {BT * C, 3, 1},
                                    {BT * C, 2, 8},      {4 * BT * C, 2, 10},    {BT * C, 3, 1}};
    double rest = 0;
    struct roof v = r;
    v.peak = r.vector;
    for (int i = 0; i < 6; i++)
        rest += roof_ms(&v, pointwise[i][0] * pointwise[i][2],
                        pointwise[i][0] * pointwise[i][1] * e);
    return *gemm_ms + rest;
}

/* A V100 block of GPT-13B: in bf16 its GEMMs run at the fp32 peak (no bf16 tensor cores), in
 * fp16 at the fp16 tensor peak: both forwards equal the roofline by hand, the GEMMs 125 / 15.7
 * = 8x faster in fp16, the whole block (with its memory-bound softmax and norms, the same in
 * both) over 7x; the backward likewise. The T4's GPT-1.3B block over 6x (65 / 8.1). */
static void test_fp16_v100_block(void)
{
    cJSON *table = test_read_json(CONFIGS "devices.json");
    const cJSON *d = device(table, "V100-32GB");
    CU_ASSERT_EQUAL(test_num(d, "peak_tflops_fp16"), 125);
    double fwd16, bwd16, fwd_bf16, bwd_bf16, gemm16, gemm_bf16;
    estimate_block(CONFIGS "models/gpt-13b-fp16.json", "V100-32GB", &fwd16, &bwd16);
    estimate_block(CONFIGS "models/gpt-13b.json", "V100-32GB", &fwd_bf16, &bwd_bf16);
    double hand16 = block_forward_by_hand(table, d, test_num(d, "peak_tflops_fp16"), &gemm16);
    double hand_bf16 = block_forward_by_hand(table, d, test_num(d, "peak_tflops_fp32"), &gemm_bf16);
    CU_ASSERT(test_close(fwd16, hand16, 0, 1e-9));
    CU_ASSERT(test_close(fwd_bf16, hand_bf16, 0, 1e-9));
    CU_ASSERT(test_close(gemm_bf16 / gemm16, 125 / 15.7, 0, 0.01));
    CU_ASSERT(fwd_bf16 / fwd16 > 7 && fwd_bf16 / fwd16 < 125 / 15.7);
    CU_ASSERT(bwd16 >= 2 * gemm16 && bwd_bf16 / bwd16 > 7 && bwd_bf16 / bwd16 < 125 / 15.7);
    printf(" [V100 GPT-13B block forward: bf16 %.2f ms, fp16 %.2f ms by hand %.2f, %.2fx] ",
           fwd_bf16, fwd16, hand16, fwd_bf16 / fwd16);
    estimate_block(CONFIGS "models/gpt-1.3b-fp16.json", "T4", &fwd16, &bwd16);
    estimate_block(CONFIGS "models/gpt-1.3b.json", "T4", &fwd_bf16, &bwd_bf16);
    CU_ASSERT(fwd_bf16 / fwd16 > 6 && fwd_bf16 / fwd16 < 65 / 8.1);
    cJSON_Delete(table);
}

/* Memory fields of a layer that an fp16 profile must give exactly as bf16's. */
static const char *const memory_keys[] = {"state_bytes", "act_bytes",  "ckpt_bytes",
                                          "out_bytes",   "workspace_bytes", "param_bytes",
                                          "grad_bytes",  "optimizer_bytes", NULL};

/* fp16 keeps memory as bf16 does, layer by layer and option by option; on a device whose fp16
 * and bf16 peaks are one (A100) the times are bf16's too, but for the AdamW step: fp16
 * unscales its fp32 gradients on the device first, one more read and write of them (8 bytes a
 * parameter) over the device's bandwidth, whether the step then runs there or on the host. */
static void check_as_bf16(const char *model, const char *dev)
{
    char fp16[128];
    snprintf(fp16, sizeof fp16, "%s-fp16", model);
    cJSON *a = estimate_layers(model, dev, NULL), *b = estimate_layers(fp16, dev, NULL);
    cJSON *table = test_read_json(CONFIGS "devices.json");
    const cJSON *d = device(table, dev), *as = cJSON_GetObjectItemCaseSensitive(table,
                                                                              "assumptions");
    double bw = test_num(d, "memory_bandwidth_gbs") * 1e9 * test_num(as, "memory_efficiency");
    int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(a, "layers"));
    CU_ASSERT_EQUAL(n, cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(b, "layers")));
    for (int l = 0; l < n; l++) {
        const cJSON *x = layer(a, l), *y = layer(b, l);
        for (int k = 0; memory_keys[k] != NULL; k++)
            CU_ASSERT_EQUAL(test_num(x, memory_keys[k]), test_num(y, memory_keys[k]));
        const cJSON *ox = cJSON_GetObjectItemCaseSensitive(x, "recompute_options"),
                    *oy = cJSON_GetObjectItemCaseSensitive(y, "recompute_options");
        CU_ASSERT_EQUAL(cJSON_GetArraySize(ox), cJSON_GetArraySize(oy));
        for (int k = 0; k < cJSON_GetArraySize(ox); k++) {
            CU_ASSERT_EQUAL(test_num(cJSON_GetArrayItem(ox, k), "kept_bytes"),
                            test_num(cJSON_GetArrayItem(oy, k), "kept_bytes"));
            CU_ASSERT_EQUAL(test_num(cJSON_GetArrayItem(ox, k), "transient_bytes"),
                            test_num(cJSON_GetArrayItem(oy, k), "transient_bytes"));
        }
        double unscale = 2 * test_num(x, "grad_bytes");
        CU_ASSERT(test_close(test_num(y, "optimizer_ms"),
                             test_num(x, "optimizer_ms") + unscale / bw * 1e3, 0, 1e-9));
        CU_ASSERT(test_close(test_num(y, "host_optimizer_ms"),
                             test_num(x, "host_optimizer_ms") + unscale / bw * 1e3, 0, 1e-9));
        if (cJSON_GetObjectItemCaseSensitive(d, "bf16_tensor") == NULL &&
            test_num(d, "peak_tflops_fp16") == test_num(d, "peak_tflops_16bit")) {
            CU_ASSERT_EQUAL(test_num(x, "fwd_ms"), test_num(y, "fwd_ms"));
            CU_ASSERT_EQUAL(test_num(x, "bwd_ms"), test_num(y, "bwd_ms"));
        }
    }
    const cJSON *prov = cJSON_GetObjectItemCaseSensitive(b, "provenance");
    CU_ASSERT_EQUAL(test_num(prov, "gemm_peak_tflops"), test_num(d, "peak_tflops_fp16"));
    cJSON_Delete(table);
    cJSON_Delete(a);
    cJSON_Delete(b);
}

static void test_fp16_as_bf16(void)
{
    check_as_bf16("gpt-13b", "V100-32GB");
    check_as_bf16("gpt-13b", "A100-40GB");
    check_as_bf16("llama2-7b", "A100-40GB");
    check_as_bf16("gpt-1.3b", "T4");
}

/* A table without the V100's fp16 peak: its fp16 estimate is refused (exit 2) naming the file,
 * the device and the field; bf16 and fp32 there are estimated as before. The field, when
 * given, must be a positive number. */
static void test_fp16_peak_absent(void)
{
    char table[1024], args[2048], *err = NULL;
    snprintf(table, sizeof table, "%s", test_devices_without("V100-32GB", "peak_tflops_fp16"));
    const char *out = test_path("refused.json");
    remove(out);
    snprintf(args, sizeof args,
             "profile --model '" CONFIGS "models/gpt-13b-fp16.json' --estimate --device V100-32GB "
             "--devices '%s' -o '%s'", table, out);
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, table) != NULL && strstr(err, "devices[0]") != NULL &&
              strstr(err, "V100-32GB") != NULL && strstr(err, "peak_tflops_fp16") != NULL);
    CU_ASSERT(access(out, F_OK) != 0);
    free(err);
    cJSON *p = estimate_layers("gpt-13b", "V100-32GB", table);
    cJSON_Delete(p);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("estimated profiles", NULL, NULL);
    CU_add_test(s, "bf16 without bf16 tensor cores: the fp32 rate", test_no_bf16_tensor_cores);
    CU_add_test(s, "bf16 with bf16 tensor cores: the tensor rate", test_bf16_tensor_cores);
    CU_add_test(s, "bf16_tensor must be a boolean", test_flag_checked);
    CU_add_test(s, "the AdamW step by hand", test_optimizer_step);
    CU_add_test(s, "fp16 on a V100: GEMMs at the fp16 tensor peak, the roofline by hand",
                test_fp16_v100_block);
    CU_add_test(s, "fp16 keeps memory as bf16; its AdamW step unscales first", test_fp16_as_bf16);
    CU_add_test(s, "fp16 on a device without peak_tflops_fp16 is refused", test_fp16_peak_absent);
    return test_main();
}
