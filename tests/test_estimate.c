/* Estimated profiles of bf16 models: on a device without bf16 tensor cores (V100, T4, as
 * configs/devices.json says) a block's GEMMs cost their FLOPs at the fp32 peak, on one with
 * them at the 16-bit tensor peak. The reference is the block's GEMM FLOPs counted here from
 * the model's shape and the device table's figures, read here with cJSON. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define CONFIGS BALLAST_SOURCE_DIR "/configs/"

static cJSON *read_json(const char *path)
{
    char *text = test_read(path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    cJSON *o = cJSON_Parse(text);
    free(text);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    return o;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    CU_ASSERT_FATAL(cJSON_IsNumber(v));
    return v->valuedouble;
}

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
    double B = num(model, "micro_batch"), T = num(model, "seq_len"), C = num(model, "n_embd");
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
    cJSON *p = read_json(out);
    const cJSON *block = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(p, "layers"), 1);
    CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItemCaseSensitive(block, "name")->valuestring,
                           "block.0");
    *fwd = num(block, "fwd_ms");
    *bwd = num(block, "bwd_ms");
    cJSON_Delete(p);
}

/* ms for `flops` at `tflops` x the table's GEMM efficiency */
static double gemm_ms(const cJSON *table, double flops, double tflops)
{
    double eff = num(cJSON_GetObjectItemCaseSensitive(table, "assumptions"), "gemm_efficiency");
    return flops / (tflops * 1e12 * eff) * 1e3;
}

static void check(const char *model_name, const char *dev_name, int bf16_tensor)
{
    char model_file[512];
    snprintf(model_file, sizeof model_file, CONFIGS "models/%s.json", model_name);
    cJSON *table = read_json(CONFIGS "devices.json");
    cJSON *model = read_json(model_file);
    CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItemCaseSensitive(model, "dtype")->valuestring, "bf16");
    const cJSON *d = device(table, dev_name);
    const cJSON *flag = cJSON_GetObjectItemCaseSensitive(d, "bf16_tensor");
    CU_ASSERT_EQUAL(flag == NULL || cJSON_IsTrue(flag), bf16_tensor);
    double fwd, bwd, flops = block_gemm_flops(model);
    estimate_block(model_file, dev_name, &fwd, &bwd);
    double fp32 = gemm_ms(table, flops, num(d, "peak_tflops_fp32"));
    double tensor = gemm_ms(table, flops, num(d, "peak_tflops_16bit"));
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
    cJSON *p = read_json(out), *table = read_json(CONFIGS "devices.json");
    const cJSON *block = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(p, "layers"), 1);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(table, "assumptions");
    const cJSON *d = device(table, "A100-80GB");
    double C = 12288, n = 12 * C * C + 13 * C;
    double dev_ms = 30 * n / (num(d, "memory_bandwidth_gbs") * 1e9 *
                              num(a, "memory_efficiency")) * 1e3 +
                    12 * num(d, "op_overhead_us") * 1e-3;
    double host_ms = 30 * n / (num(a, "host_memory_bandwidth_gbs") * 1e9) * 1e3;
    CU_ASSERT(test_close(num(block, "optimizer_ms"), dev_ms, 0, 1e-9));
    CU_ASSERT(test_close(num(block, "host_optimizer_ms"), host_ms, 0, 1e-9));
    CU_ASSERT(num(block, "param_bytes") == 2 * n && num(block, "grad_bytes") == 4 * n &&
              num(block, "optimizer_bytes") == 12 * n);
    printf(" [block.0: %.3f ms on the device, %.3f ms on the host] ", dev_ms, host_ms);
    cJSON_Delete(p);
    cJSON_Delete(table);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("estimated profiles", NULL, NULL);
    CU_add_test(s, "bf16 without bf16 tensor cores: the fp32 rate", test_no_bf16_tensor_cores);
    CU_add_test(s, "bf16 with bf16 tensor cores: the tensor rate", test_bf16_tensor_cores);
    CU_add_test(s, "bf16_tensor must be a boolean", test_flag_checked);
    CU_add_test(s, "the AdamW step by hand", test_optimizer_step);
    return test_main();
}
