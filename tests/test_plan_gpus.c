/* One-line planning (ballast plan --model M --gpus ...): the plan equals the plan of the same
 * pool written by hand (datasheet memory, the link presets' rates, profiles made with
 * `ballast profile --estimate`), for one kind and two (including an answer of heterogeneous
 * pipelines) and with --nodes, --node-link, --network, --reserve and --host-memory; the
 * cluster it writes plans to the same answer again. The summary's tokens/s, idle GPUs and MFU
 * against the plan file's numbers and PaLM's 6N + 12LHT FLOPs a token. With --for megatron
 * the answer is one that Megatron-LM runs and exports as planned. Unknown names list the
 * known ones; GPUs that cannot hold the model and a global batch no pipeline can take say
 * why. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define MODELS BALLAST_SOURCE_DIR "/configs/models/"

/* Datasheet memory (configs/devices.json) and link rates (configs/links.json), written here
 * by hand: what the hand-written cluster says. */
#define A100_40GB "42505273344"
#define V100_32GB "34089730048"

static cJSON *load(const char *path)
{
    char *text = test_read(path);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

/* `ballast profile --estimate` of model m on device d into tmpdir/NAME; the path. */
static const char *estimate(const char *m, const char *d, const char *name)
{
    char args[2048];
    const char *out = test_path(name);
    snprintf(args, sizeof args, "profile --model '%s%s.json' --estimate --device %s -o '%s'",
             MODELS, m, d, out);
    return test_run(args, NULL, NULL) == 0 ? out : NULL;
}

static int plan(const char *args, const char *out_plan, char **stdout_text)
{
    char all[4096];
    snprintf(all, sizeof all, "plan %s -o '%s'", args, out_plan);
    char *err = NULL;
    int rc = test_run(all, stdout_text, &err);
    if (rc != 0)
        fprintf(stderr, "\nballast %s: exit %d\n%s\n", all, rc, err ? err : "");
    free(err);
    return rc;
}

/* Both plan files (a plan or a replicas file) are the same answer: every member equal. */
static void expect_same_plan(const char *a, const char *b)
{
    cJSON *x = load(a), *y = load(b);
    CU_ASSERT_FATAL(x != NULL && y != NULL);
    int same = cJSON_Compare(x, y, 1);
    CU_ASSERT(same);
    if (!same) {
        char *sx = cJSON_PrintUnformatted(x), *sy = cJSON_PrintUnformatted(y);
        fprintf(stderr, "\n%s:\n%.600s\n%s:\n%.600s\n", a, sx, b, sy);
        free(sx);
        free(sy);
    }
    cJSON_Delete(x);
    cJSON_Delete(y);
}

/* One line against the hand-written pool, then the written cluster planned again; `extra`:
 * options for every plan. */
static void check_equal(const char *hand_json, const char *line, const char *extra,
                        const char *name)
{
    char hand[256], one[256], again[256], args[2048], written[512];
    snprintf(hand, sizeof hand, "%s-hand.json", name);
    snprintf(one, sizeof one, "%s-one.json", name);
    snprintf(again, sizeof again, "%s-again.json", name);
    const char *cluster = test_write(hand, hand_json);
    char hand_plan[1024], one_plan[1024];
    snprintf(hand_plan, sizeof hand_plan, "%s", test_path(one));
    snprintf(one_plan, sizeof one_plan, "%s", test_path(again));
    snprintf(args, sizeof args, "--cluster '%s' --quiet %s", cluster, extra);
    CU_ASSERT_FATAL(plan(args, hand_plan, NULL) == 0);
    snprintf(args, sizeof args, "%s %s", line, extra);
    CU_ASSERT_FATAL(plan(args, one_plan, NULL) == 0);
    expect_same_plan(hand_plan, one_plan);
    /* the cluster beside the plan: PLAN.cluster.json */
    snprintf(written, sizeof written, "%.*s.cluster.json", (int)strlen(one_plan) - 5, one_plan);
    snprintf(args, sizeof args, "--cluster '%s' --quiet %s", written, extra);
    CU_ASSERT_FATAL(plan(args, test_path("rerun.json"), NULL) == 0);
    expect_same_plan(hand_plan, test_path("rerun.json"));
}

static void test_one_kind(void)
{
    const char *a100 = estimate("gpt-350m", "A100-40GB", "gpt-350m-A100-40GB.json");
    CU_ASSERT_FATAL(a100 != NULL);
    char hand[4096];
    snprintf(hand, sizeof hand,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"global_batch\": 32,"
             " \"reserve_bytes\": 2147483648, \"link\": {\"gbps\": 200, \"latency_us\": 5},"
             " \"dp_link\": {\"gbps\": 200, \"latency_us\": 5}, \"shard_optimizer\": true,"
             " \"pool\": [{\"device\": \"A100-40GB\", \"count\": 8, \"per_node\": 8,"
             " \"memory_bytes\": " A100_40GB ", \"profile\": \"%s\","
             " \"node_link\": {\"gbps\": 2400, \"latency_us\": 3}}]}",
             a100);
    check_equal(hand, "--model gpt-350m --gpus 8xA100-40GB --global-batch 32", "", "one-kind");
}

/* Two kinds, nodes of 4, links named and given as rates, a smaller reserve, host memory per
 * node (each GPU's share: 1 TiB / 4) and offload allowed. */
static void test_two_kinds_options(void)
{
    const char *a100 = estimate("gpt-350m", "A100-40GB", "gpt-350m-A100-40GB.json");
    const char *v100 = estimate("gpt-350m", "V100-32GB", "gpt-350m-V100-32GB.json");
    CU_ASSERT_FATAL(a100 != NULL && v100 != NULL);
    char hand[4096];
    snprintf(hand, sizeof hand,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"global_batch\": 64,"
             " \"reserve_bytes\": 1073741824, \"link\": {\"gbps\": 100, \"latency_us\": 10},"
             " \"dp_link\": {\"gbps\": 100, \"latency_us\": 10}, \"shard_optimizer\": true,"
             " \"pool\": [{\"device\": \"A100-40GB\", \"count\": 8, \"per_node\": 4,"
             " \"memory_bytes\": " A100_40GB ", \"profile\": \"%s\","
             " \"node_link\": {\"gbps\": 256, \"latency_us\": 5},"
             " \"node_host_memory_bytes\": 1099511627776},"
             " {\"device\": \"V100-32GB\", \"count\": 4, \"per_node\": 4,"
             " \"memory_bytes\": " V100_32GB ", \"profile\": \"%s\","
             " \"node_link\": {\"gbps\": 1200, \"latency_us\": 5},"
             " \"node_host_memory_bytes\": 1099511627776}]}",
             a100, v100);
    check_equal(hand,
                "--model gpt-350m --gpus 8xA100-40GB,4xv100-32gb --nodes 2,1 "
                "--node-link pcie4,150GB/s --network eth-100g --reserve 1GiB "
                "--host-memory 1TiB --global-batch 64",
                "--actions recompute,offload", "two-kinds");
}

/* The one-line defaults written by hand: 8 A100-40GB on a node and `n_v100` V100-32GB on
 * one, 200 Gb/s InfiniBand, a 2 GiB reserve, ZeRO-1; the profiles given. */
static const char *a100_v100_pool(int global_batch, const char *a100, int n_v100,
                                  const char *v100)
{
    static char hand[4096];
    snprintf(hand, sizeof hand,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"global_batch\": %d,"
             " \"reserve_bytes\": \"2GiB\", \"link\": {\"gbps\": \"200Gbps\", \"latency_us\": 5},"
             " \"dp_link\": {\"gbps\": 200, \"latency_us\": 5}, \"shard_optimizer\": true,"
             " \"pool\": [{\"device\": \"A100-40GB\", \"count\": 8, \"per_node\": 8,"
             " \"memory_bytes\": " A100_40GB ", \"profile\": \"%s\","
             " \"node_link\": {\"gbps\": 2400, \"latency_us\": 3}},"
             " {\"device\": \"V100-32GB\", \"count\": %d, \"per_node\": %d,"
             " \"memory_bytes\": " V100_32GB ", \"profile\": \"%s\","
             " \"node_link\": {\"gbps\": 1200, \"latency_us\": 3}}]}",
             global_batch, a100, n_v100, n_v100 < 8 ? n_v100 : 8, v100);
    return hand;
}

/* The llama of the issue on its pool: the answer is heterogeneous pipelines side by side. */
static void test_mixed_answer(void)
{
    const char *a100 = estimate("llama2-7b", "A100-40GB", "llama2-7b-A100-40GB.json");
    const char *v100 = estimate("llama2-7b", "V100-32GB", "llama2-7b-V100-32GB.json");
    CU_ASSERT_FATAL(a100 != NULL && v100 != NULL);
    check_equal(a100_v100_pool(512, a100, 8, v100),
                "--model llama2-7b --gpus 8xA100-40GB,8xV100-32GB --global-batch 512", "", "llama");
    cJSON *p = load(test_path("llama-again.json"));
    CU_ASSERT(p != NULL && cJSON_GetObjectItem(p, "pipelines") != NULL);
    cJSON_Delete(p);
}

/* --for megatron on a pool: the same answer as the hand-written pool planned --for megatron,
 * one pipeline shape (Megatron-LM runs no replicas of different pipelines), every replica the
 * same micro-batches, no V100 in it (Megatron-LM's flash attention and Transformer Engine
 * need compute capability 8.0), and its export to Megatron-LM notes no difference. */
static void test_for_framework(void)
{
    const char *a100 = estimate("gpt-350m", "A100-40GB", "gpt-350m-A100-40GB.json");
    const char *v100 = estimate("gpt-350m", "V100-32GB", "gpt-350m-V100-32GB.json");
    CU_ASSERT_FATAL(a100 != NULL && v100 != NULL);
    check_equal(a100_v100_pool(60, a100, 4, v100),
                "--model gpt-350m --gpus 8xA100-40GB,4xV100-32GB --global-batch 60",
                "--for megatron", "for");
    const char *answer = test_path("for-again.json");
    cJSON *p = load(answer);
    CU_ASSERT_FATAL(p != NULL);
    CU_ASSERT(cJSON_GetObjectItem(p, "pipelines") == NULL);
    CU_ASSERT(cJSON_GetObjectItem(p, "replica_micro_batches") == NULL);
    const cJSON *st;
    cJSON_ArrayForEach(st, cJSON_GetObjectItem(p, "stages"))
        CU_ASSERT(strstr(cJSON_GetStringValue(cJSON_GetObjectItem(st, "device")), "V100") == NULL);
    cJSON_Delete(p);
    char args[2048], *err = NULL;
    snprintf(args, sizeof args, "export --plan '%s' --to megatron -o '%s'", answer,
             test_path("for.sh"));
    CU_ASSERT(test_run(args, NULL, &err) == 0);
    CU_ASSERT(err == NULL || strstr(err, "note") == NULL);
    if (err != NULL && strstr(err, "note") != NULL)
        fprintf(stderr, "\nballast %s:\n%s\n", args, err);
    free(err);
}

/* The summary against the plan file: GPUs used, idle, tokens/s, and MFU against PaLM's FLOPs
 * a token (6N + 12 L H Q T: weights' GEMMs forward and backward, and attention's). */
static void test_summary(void)
{
    char *out = NULL;
    const char *file = test_path("idle.json");
    CU_ASSERT_FATAL(plan("--model gpt-350m --gpus 5xA100-40GB --global-batch 8", file, &out) ==
                    0);
    cJSON *p = load(file);
    CU_ASSERT_FATAL(p != NULL && out != NULL);
    cJSON *stages = cJSON_GetObjectItem(p, "stages");
    int S = cJSON_GetArraySize(stages);
    const cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(stages, 0), "tp");
    const cJSON *r = cJSON_GetObjectItem(cJSON_GetArrayItem(stages, 0), "dp");
    int tp = t ? t->valueint : 1, dp = r ? r->valueint : 1; /* absent: 1 */
    int M = cJSON_GetObjectItem(p, "micro_batches")->valueint;
    double step = cJSON_GetObjectItem(p, "iteration_ms")->valuedouble;
    int used = S * tp * dp, idle = 5 - used;
    double tokens = (double)dp * M * 4 * 1024;
    char line[256];
    snprintf(line, sizeof line, "\nA100-40GB   %6d %6d %6d %4d %6d", used, idle, S, tp, dp);
    CU_ASSERT(idle > 0 && strstr(out, line) != NULL);
    char throughput[256];
    snprintf(throughput, sizeof throughput,
             "throughput: %.0f tokens a step in %.3f ms: %.0f tokens/s", tokens, step,
             tokens / (step * 1e-3));
    CU_ASSERT(strstr(out, throughput) != NULL);
    /* gpt-350m: 24 blocks of 1024, a vocabulary of 50257 and 1024 positions (tied head: the
     * head's own weights) */
    double L = 24, d = 1024, V = 50257, T = 1024;
    double N = L * 12 * d * d + V * d; /* the GEMMs' weights: blocks and the head */
    double flops = (6 * N + 12 * L * d * T) * tokens;
    double palm = flops / (used * 312e12 * step * 1e-3);
    const char *row = strstr(out, line);
    double mfu = -1;
    if (row == NULL)
        fprintf(stderr, "\nno row \"%s\" in\n%s\n", line + 1, out);
    CU_ASSERT_FATAL(row != NULL);
    const char *pct = strchr(row, '%');
    while (pct > row && pct[-1] != ' ')
        pct--;
    mfu = atof(pct) / 100;
    CU_ASSERT(test_close(mfu, palm, 0, 0.03));
    if (!test_close(mfu, palm, 0, 0.03))
        fprintf(stderr, "\nMFU %.4f, PaLM's %.4f\n%s\n", mfu, palm, out);
    cJSON_Delete(p);
    free(out);
}

static void expect_fail(const char *args, int status, const char *says)
{
    char all[2048], *err = NULL;
    snprintf(all, sizeof all, "plan %s -o '%s'", args, test_path("bad.json"));
    int rc = test_run(all, NULL, &err);
    int ok = rc == status && err != NULL && strstr(err, says) != NULL;
    CU_ASSERT(ok);
    if (!ok)
        fprintf(stderr, "\nballast %s: exit %d (expected %d)\n%s\nexpected: %s\n", all, rc,
                status, err ? err : "", says);
    free(err);
}

static void test_bad_input(void)
{
    expect_fail("--model gpt-350m --gpus 8xH100 --global-batch 8", 2,
                "--gpus: \"H100\" is not a device of");
    expect_fail("--model gpt-350m --gpus 8xH100 --global-batch 8", 2,
                "known: V100-32GB, V100-16GB, A100-40GB, A100-80GB, H100-80GB, H200");
    expect_fail("--model llama9 --gpus 8xA100-40GB --global-batch 8", 2,
                "\"llama9\" is neither a model file nor a model of");
    expect_fail("--model llama9 --gpus 8xA100-40GB --global-batch 8", 2,
                "llama2-70b, llama2-7b, llama2-7b-fp16, llama3-70b");
    /* llama2-7b's state: 6738415616 parameters x 18 bytes (bf16 weights and gradients... fp32
     * master and AdamW's two moments) = 113.0 GiB; 3 A100-40GB hold 3 x (42505273344 - 2 GiB)
     * = 112.8 GiB */
    expect_fail("--model llama2-7b --gpus 3xA100-40GB --global-batch 8", 3,
                "take 113.0 GiB (18.0 bytes a parameter), more than the 112.8 GiB of all 3 GPUs");
    expect_fail("--model gpt-350m --gpus 4xA100-40GB --global-batch 6", 2,
                "--global-batch 6: not a whole number of micro-batches of 4 samples");
    expect_fail("--model gpt-350m --gpus 12xA100-40GB --nodes 5 --global-batch 8", 2,
                "--nodes: 5 nodes for the 12 A100-40GB GPUs");
    expect_fail("--model gpt-350m --gpus 8xA100-40GB --network ib-fast --global-batch 8", 2,
                "\"ib-fast\" is neither a link preset (nvlink2");
    expect_fail("--model gpt-350m --gpus A100-40GB --global-batch 8", 2,
                "expected COUNTxDEVICE");
    expect_fail("--model gpt-350m --gpus 8xA100-40GB", 2, "--gpus needs --global-batch");
    expect_fail("--model gpt-350m --global-batch 8", 2, "give --gpus");
    expect_fail("--model gpt-350m --gpus 8xA100-40GB --global-batch 8 --method patent", 2,
                "a pool of GPUs is searched with --method optimal");
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("one-line planning", NULL, NULL);
    CU_add_test(s, "one kind equals the hand-written pool", test_one_kind);
    CU_add_test(s, "two kinds and every option", test_two_kinds_options);
    CU_add_test(s, "heterogeneous answer", test_mixed_answer);
    CU_add_test(s, "--for megatron: what Megatron-LM runs", test_for_framework);
    CU_add_test(s, "summary: GPUs, idle, tokens/s, MFU", test_summary);
    CU_add_test(s, "bad input", test_bad_input);
    return test_main();
}
