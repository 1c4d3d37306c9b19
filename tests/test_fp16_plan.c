/* fp16 models planned (issue 25), through the command line on profiles estimated from
 * configs/devices.json:
 *   - on V100s and A100s every method plans an fp16 GPT-13B: the knapsack methods agree with
 *     GLPK (--verify), optimal is never slower than a baseline on the same split nor
 *     --repartition or offload and the host optimizer than optimal, and the fp16 plan steps
 *     faster than the bf16 one;
 *   - where fp16 and bf16 share a tensor peak (H100, A100) every method on a fixed split gives
 *     the fp16 model the bf16 plan, tp and ZeRO-1 groups included: the same recomputation and
 *     memory to the byte, a step longer only by what fp16's unscaling pass adds to the
 *     optimizer (a simulated step never grows by more than the sum of what its tasks grew);
 *     --repartition's exact step lies between the two;
 *   - --micro-batches auto estimates fp16 profiles at the sizes it tries (the chosen size's
 *     costs equal `profile --estimate` of that size);
 *   - the pool of 8 A100-40GB + 8 V100-32GB with Llama-2-7B: in bf16 the V100s get a
 *     few blocks at most, in fp16 their share of the blocks is about their share of the tensor
 *     peak, no GPU idle, and the step is faster;
 *   - a cluster mixing fp16 and bf16 profiles, or a pool resizing profiles on a device whose
 *     table gives no fp16 peak, is refused (exit 2) naming the field. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testjson.h"
#include "testutil.h"

#define CONFIGS BALLAST_SOURCE_DIR "/configs/"

static const cJSON *member(const cJSON *o, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

/* A path that outlives test_path's rotating slots: one of 128 of its own (a test keeps under
 * 64). */
static char *keep(const char *path)
{
    static char slots[128][1024];
    static int next;
    char *out = slots[next++ % 128];
    snprintf(out, sizeof slots[0], "%s", path);
    return out;
}

/* configs/models/`model` estimated on `device` into the temporary folder (once); its path. */
static const char *estimate(const char *model, const char *device)
{
    char file[1024];
    snprintf(file, sizeof file, CONFIGS "models/%s.json", model);
    return keep(test_estimated_profile(file, device));
}

/* The profile at `path` without its state split (param, grad and optimizer bytes): the cost
 * model then takes the optimizer's and the gradients' shares of state_bytes by the dtype. */
static const char *without_split(const char *path)
{
    cJSON *p = test_read_json(path), *l;
    cJSON_ArrayForEach(l, member(p, "layers"))
    {
        static const char *const keys[] = {"param_bytes", "grad_bytes", "optimizer_bytes",
                                           "optimizer_ms", "host_optimizer_ms"};
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
            cJSON_DeleteItemFromObjectCaseSensitive(l, keys[k]);
    }
    char *text = cJSON_Print(p), name[1100];
    const char *slash = strrchr(path, '/');
    snprintf(name, sizeof name, "nosplit-%s", slash ? slash + 1 : path);
    const char *out = keep(test_write(name, text));
    free(text);
    cJSON_Delete(p);
    return out;
}

/* The shipped cluster `shipped` with every stage's profile estimated for `model`; with tp > 1
 * every stage a group of tp GPUs (NVLink between) replicated dp times with ZeRO-1, on profiles
 * without their state split. */
static const char *cluster_for(const char *shipped, const char *model, int tp, int dp)
{
    char src[1024], file[1024], name[256];
    snprintf(src, sizeof src, CONFIGS "clusters/%s.json", shipped);
    snprintf(file, sizeof file, CONFIGS "models/%s.json", model);
    cJSON *c = test_cluster_estimated(src, file);
    cJSON *st;
    cJSON_ArrayForEach(st, member(c, "stages"))
    {
        if (tp > 1) {
            const char *profile = without_split(member(st, "profile")->valuestring);
            cJSON_ReplaceItemInObjectCaseSensitive(st, "profile", cJSON_CreateString(profile));
            cJSON_AddNumberToObject(st, "tp", tp);
            cJSON_AddNumberToObject(st, "dp", dp);
            cJSON_AddNumberToObject(st, "per_node", 8);
            cJSON *link = cJSON_AddObjectToObject(st, "node_link");
            cJSON_AddNumberToObject(link, "gbps", 2400);
            cJSON_AddNumberToObject(link, "latency_us", 3);
        }
    }
    if (tp > 1)
        cJSON_AddTrueToObject(c, "shard_optimizer");
    char *text = cJSON_Print(c);
    snprintf(name, sizeof name, "%s-%s-tp%d.json", shipped, model, tp);
    const char *path = keep(test_write(name, text));
    free(text);
    cJSON_Delete(c);
    return path;
}

/* `ballast plan --cluster C --method M [extra]`: its exit status, and the plan (NULL unless it
 * fits; caller frees). */
static int plan(const char *cluster, const char *method, const char *extra, cJSON **out)
{
    char args[4096], *err = NULL;
    const char *file = test_path("plan.json");
    remove(file);
    snprintf(args, sizeof args, "plan --cluster '%s' --method %s %s --quiet -o '%s'", cluster,
             method, extra, file);
    int rc = test_run(args, NULL, &err);
    if (rc != 0 && rc != 3)
        fprintf(stderr, "\nballast %s: exit %d\n%s\n", args, rc, err ? err : "");
    free(err);
    *out = rc == 0 ? test_read_json(file) : NULL;
    return rc;
}

static const char *const methods[] = {"none", "full", "block:2", "uniform-min", "patent",
                                      "optimal"};
#define N_METHODS ((int)(sizeof methods / sizeof *methods))

static int is_knapsack(int m)
{
    return strcmp(methods[m], "patent") == 0 || strcmp(methods[m], "optimal") == 0;
}

/* Every method on the V100 + A100 cluster in fp16, and optimal+repartition in bf16 beside. */
static void test_every_method(void)
{
    const char *c16 = cluster_for("v100-a100-8", "gpt-13b-fp16", 1, 1);
    double it[N_METHODS];
    int fits = 0;
    for (int m = 0; m < N_METHODS; m++) {
        cJSON *p;
        int rc = plan(c16, methods[m], is_knapsack(m) ? "--verify" : "", &p);
        CU_ASSERT(rc == 0 || (rc == 3 && !is_knapsack(m)));
        it[m] = NAN;
        if (p == NULL)
            continue;
        fits++;
        CU_ASSERT_STRING_EQUAL(member(member(p, "model"), "dtype")->valuestring, "fp16");
        if (is_knapsack(m))
            CU_ASSERT(cJSON_IsTrue(member(member(p, "verify"), "agree")));
        it[m] = test_num(p, "iteration_ms");
        cJSON_Delete(p);
    }
    CU_ASSERT(fits >= 4);
    for (int m = 0; m < N_METHODS; m++)
        CU_ASSERT(isnan(it[m]) || it[N_METHODS - 1] <= it[m] * (1 + 1e-12));
    /* with host memory the actions' superset (offload, the host optimizer and its unscaling
     * pass) plans fp16 too, no slower than recomputation alone */
    cJSON *c = test_read_json(c16), *st, *rep, *bf16;
    cJSON_ArrayForEach(st, member(c, "stages"))
        cJSON_AddNumberToObject(st, "host_memory_bytes", 68719476736.0);
    char *text = cJSON_Print(c);
    const char *host = keep(test_write("v100-a100-8-host.json", text));
    free(text);
    cJSON_Delete(c);
    CU_ASSERT_EQUAL_FATAL(plan(host, "optimal", "--actions recompute,offload,optimizer", &rep), 0);
    CU_ASSERT(test_num(rep, "iteration_ms") <= it[N_METHODS - 1] * (1 + 1e-12));
    cJSON_Delete(rep);
    CU_ASSERT_EQUAL_FATAL(plan(c16, "optimal", "--repartition", &rep), 0);
    const char *c_bf16 = cluster_for("v100-a100-8", "gpt-13b", 1, 1);
    CU_ASSERT_EQUAL_FATAL(plan(c_bf16, "optimal", "--repartition", &bf16), 0);
    double t16 = test_num(rep, "iteration_ms"), t_bf16 = test_num(bf16, "iteration_ms");
    CU_ASSERT(t16 <= it[N_METHODS - 1] * (1 + 1e-12));
    CU_ASSERT(t16 < 0.8 * t_bf16);
    printf(" [v100-a100-8 GPT-13B optimal+repartition: bf16 %.0f ms, fp16 %.0f ms] ", t_bf16,
           t16);
    cJSON_Delete(rep);
    cJSON_Delete(bf16);
}

/* The sum over a profile's layers of fp16's optimizer_ms beyond bf16's (the unscaling pass). */
static double unscale_ms(const char *model, const char *device)
{
    char m16[128];
    snprintf(m16, sizeof m16, "%s-fp16", model);
    cJSON *a = test_read_json(estimate(model, device)), *b = test_read_json(estimate(m16, device));
    double sum = 0;
    for (int l = 0; l < cJSON_GetArraySize(member(a, "layers")); l++)
        sum += test_num(cJSON_GetArrayItem(member(b, "layers"), l), "optimizer_ms") -
               test_num(cJSON_GetArrayItem(member(a, "layers"), l), "optimizer_ms");
    cJSON_Delete(a);
    cJSON_Delete(b);
    return sum;
}

/* Both absent, or equal. */
static int same_member(const cJSON *x, const cJSON *y, const char *key)
{
    const cJSON *a = member(x, key), *b = member(y, key);
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && cJSON_Compare(a, b, 1));
}

/* Two plans of one cluster alike but for the step: per stage the layers, recomputation and
 * memory; the fp16 step within [bf16's, bf16's + slack]. */
static void check_same_plan(const cJSON *a, const cJSON *b, double slack)
{
    const cJSON *sa = member(a, "stages"), *sb = member(b, "stages");
    CU_ASSERT_EQUAL_FATAL(cJSON_GetArraySize(sa), cJSON_GetArraySize(sb));
    static const char *const same[] = {"layers", "recompute", "recompute_options", "device",
                                       "allreduce_bytes"};
    for (int s = 0; s < cJSON_GetArraySize(sa); s++) {
        const cJSON *x = cJSON_GetArrayItem(sa, s), *y = cJSON_GetArrayItem(sb, s);
        CU_ASSERT_EQUAL(test_num(x, "memory_bytes"), test_num(y, "memory_bytes"));
        for (size_t k = 0; k < sizeof same / sizeof *same; k++)
            CU_ASSERT(same_member(x, y, same[k]));
    }
    double ta = test_num(a, "iteration_ms"), tb = test_num(b, "iteration_ms");
    CU_ASSERT(tb >= ta && tb <= ta + slack + 1e-9 * ta);
}

static void check_as_bf16(int tp, int dp)
{
    const char *shipped = "llama2-7b-h100-a100-8";
    const char *c_bf16 = cluster_for(shipped, "llama2-7b", tp, dp);
    const char *c16 = cluster_for(shipped, "llama2-7b-fp16", tp, dp);
    double slack = unscale_ms("llama2-7b", "H100-80GB") + unscale_ms("llama2-7b", "A100-80GB");
    CU_ASSERT(slack > 0);
    for (int m = 0; m < N_METHODS; m++) {
        cJSON *a, *b;
        int ra = plan(c_bf16, methods[m], "", &a), rb = plan(c16, methods[m], "", &b);
        CU_ASSERT_EQUAL(ra, rb);
        if (a != NULL && b != NULL)
            check_same_plan(a, b, slack);
        cJSON_Delete(a);
        cJSON_Delete(b);
    }
    /* --repartition may split otherwise (the optimizer steps differ), but searched exactly its
     * fp16 step is at least bf16's (no task shorter) and at most bf16's split run in fp16 */
    cJSON *a, *b;
    const char *exact = "--repartition --search-gap 0";
    CU_ASSERT_EQUAL_FATAL(plan(c_bf16, "optimal", exact, &a), 0);
    CU_ASSERT_EQUAL_FATAL(plan(c16, "optimal", exact, &b), 0);
    double ta = test_num(a, "iteration_ms"), tb = test_num(b, "iteration_ms");
    CU_ASSERT(tb >= ta * (1 - 1e-12) && tb <= ta + slack + 1e-9 * ta);
    cJSON_Delete(a);
    cJSON_Delete(b);
}

static void test_as_bf16(void)
{
    check_as_bf16(1, 1);
    check_as_bf16(2, 2);
}

/* --micro-batches auto with fp16 profiles: the plan's model keeps fp16, and the chosen size's
 * layer costs are `profile --estimate`'s at that size (the fp16 GEMM peak, not fp32's). */
static void test_micro_batches_auto(void)
{
    const char *c16 = cluster_for("v100-a100-8", "gpt-13b-fp16", 1, 1);
    cJSON *p;
    CU_ASSERT_EQUAL_FATAL(plan(c16, "optimal", "--micro-batches auto --global-batch 8", &p), 0);
    const cJSON *m = member(p, "model");
    CU_ASSERT_STRING_EQUAL(member(m, "dtype")->valuestring, "fp16");
    int b = (int)test_num(m, "micro_batch");
    CU_ASSERT(b >= 1 && 8 % b == 0);
    cJSON *model = test_read_json(CONFIGS "models/gpt-13b-fp16.json");
    cJSON_ReplaceItemInObjectCaseSensitive(model, "micro_batch", cJSON_CreateNumber(b));
    char *text = cJSON_Print(model), args[4096];
    const char *mf = keep(test_write("gpt-13b-fp16-b.json", text));
    const char *out = keep(test_path("v100-b.json"));
    free(text);
    cJSON_Delete(model);
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device V100-32GB -o '%s'", mf,
             out);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    cJSON *ref = test_read_json(out);
    const cJSON *st = cJSON_GetArrayItem(member(p, "stages"), 0);
    CU_ASSERT_STRING_EQUAL(member(st, "device")->valuestring, "V100-32GB");
    const cJSON *got = cJSON_GetArrayItem(member(st, "layer_costs"), 1);
    const cJSON *want = cJSON_GetArrayItem(member(ref, "layers"), 1);
    CU_ASSERT(test_close(test_num(got, "fwd_ms"), test_num(want, "fwd_ms"), 0, 1e-12));
    CU_ASSERT(test_close(test_num(got, "act_bytes"), test_num(want, "act_bytes"), 0, 0));
    printf(" [micro-batch size %d] ", b);
    cJSON_Delete(ref);
    cJSON_Delete(p);
}

/* The pool: 8 A100-40GB + 8 V100-32GB, one node each, Llama-2-7B, 64 sequences a
 * step. `sizes`: a micro_batch_sizes member or "". */
static const char *pool_file(const char *model, const char *sizes)
{
    char text[4096], name[128];
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"global_batch\": 64,"
             " \"link\": {\"gbps\": 100, \"latency_us\": 5}, \"dp_link\": {\"gbps\": 100,"
             " \"latency_us\": 5}, \"shard_optimizer\": true%s,"
             " \"pool\": [{\"device\": \"A100-40GB\", \"count\": 8, \"per_node\": 8,"
             " \"memory_bytes\": 42505273344, \"profile\": \"%s\", \"node_link\": {\"gbps\": 2400,"
             " \"latency_us\": 2}}, {\"device\": \"V100-32GB\", \"count\": 8, \"per_node\": 8,"
             " \"memory_bytes\": 34089730048, \"profile\": \"%s\", \"node_link\": {\"gbps\": 1200,"
             " \"latency_us\": 2}}]}",
             sizes, estimate(model, "A100-40GB"), estimate(model, "V100-32GB"));
    snprintf(name, sizeof name, "pool-%s.json", model);
    return keep(test_write(name, text));
}

/* The pool's plan: the blocks on V100s, the GPUs used, the step. */
static void pool_plan(const char *model, double *v100_blocks, int *gpus, double *step_ms)
{
    cJSON *p;
    CU_ASSERT_EQUAL_FATAL(plan(pool_file(model, ""), "optimal", "", &p), 0);
    CU_ASSERT_STRING_EQUAL_FATAL(member(p, "format")->valuestring, "ballast-plan/1");
    int blocks = (int)test_num(member(p, "model"), "n_layer"), on_v100 = 0;
    *gpus = 0;
    const cJSON *st;
    cJSON_ArrayForEach(st, member(p, "stages"))
    {
        const cJSON *l = member(st, "layers");
        int first = (int)cJSON_GetArrayItem(l, 0)->valuedouble,
            last = (int)cJSON_GetArrayItem(l, 1)->valuedouble;
        /* blocks are layers 1 ... n_layer */
        int lo = first > 1 ? first : 1, hi = last < blocks ? last : blocks;
        if (strcmp(member(st, "device")->valuestring, "V100-32GB") == 0 && hi >= lo)
            on_v100 += hi - lo + 1;
        const cJSON *tp = member(st, "tp"), *dp = member(st, "dp"); /* absent: 1 */
        *gpus += (tp ? (int)tp->valuedouble : 1) * (dp ? (int)dp->valuedouble : 1);
    }
    *v100_blocks = (double)on_v100 / blocks;
    *step_ms = test_num(p, "iteration_ms");
    cJSON_Delete(p);
}

static void test_pool(void)
{
    double share_bf16, share16, step_bf16, step16;
    int gpus_bf16, gpus16;
    pool_plan("llama2-7b", &share_bf16, &gpus_bf16, &step_bf16);
    pool_plan("llama2-7b-fp16", &share16, &gpus16, &step16);
    /* 8 V100s' fp16 tensor peak is 1000 of the pool's 3496 TFLOP/s: 29% */
    CU_ASSERT(share_bf16 < 0.1);
    CU_ASSERT(share16 > 0.2 && share16 < 0.4);
    CU_ASSERT_EQUAL(gpus16, 16);
    CU_ASSERT(step16 < 0.9 * step_bf16);
    printf(" [V100s' share of the blocks: bf16 %.0f%% (%d GPUs used, step %.0f ms), fp16 %.0f%% "
           "(%d GPUs, %.0f ms)] ",
           100 * share_bf16, gpus_bf16, step_bf16, 100 * share16, gpus16, step16);
}

/* A stage whose profile is bf16 beside fp16 ones; a pool that must estimate fp16 profiles at
 * other micro-batch sizes with a table that gives the V100 no fp16 peak. */
static void test_bad_input(void)
{
    cJSON *c = test_read_json(cluster_for("v100-a100-8", "gpt-13b-fp16", 1, 1));
    cJSON *st = cJSON_GetArrayItem(member(c, "stages"), 5);
    cJSON_ReplaceItemInObjectCaseSensitive(
        st, "profile", cJSON_CreateString(estimate("gpt-13b", "A100-80GB")));
    char *text = cJSON_Print(c), args[4096], *err = NULL;
    const char *mixed = keep(test_write("mixed.json", text));
    free(text);
    cJSON_Delete(c);
    snprintf(args, sizeof args, "plan --cluster '%s'", mixed);
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "stages[5].profile") != NULL &&
              strstr(err, "dtype bf16 vs fp16") != NULL);
    free(err);

    const char *table = keep(test_devices_without("V100-32GB", "peak_tflops_fp16"));
    const char *pool = pool_file("llama2-7b-fp16", ", \"micro_batch_sizes\": [1, 2]");
    setenv("BALLAST_DEVICES", table, 1);
    err = NULL;
    snprintf(args, sizeof args, "plan --cluster '%s'", pool);
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, table) != NULL && strstr(err, "V100-32GB") != NULL &&
              strstr(err, "peak_tflops_fp16") != NULL);
    unsetenv("BALLAST_DEVICES");
    free(err);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("fp16 plans", NULL, NULL);
    CU_add_test(s, "every method on V100s and A100s, GLPK agreeing", test_every_method);
    CU_add_test(s, "the bf16 plan where the peaks agree, tp and ZeRO-1 too", test_as_bf16);
    CU_add_test(s, "--micro-batches auto estimates fp16 at each size", test_micro_batches_auto);
    CU_add_test(s, "A100-40GB + V100-32GB pool: the V100s get work", test_pool);
    CU_add_test(s, "mixed dtypes and an absent fp16 peak refused", test_bad_input);
    return test_main();
}
