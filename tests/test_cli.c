/* The command line: help and usage errors, exit 3 with the numbers that make a stage not fit
 * (computed by hand), --verify in the plan file, and every shipped cluster planned with every
 * method and read back. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan.h"
#include "testutil.h"

static int run(const char *args, char **out, char **err)
{
    int rc = test_run(args, out, err);
    return rc;
}

static void expect(const char *args, int status, const char *in_stdout, const char *in_stderr)
{
    char *out = NULL, *err = NULL;
    int rc = run(args, &out, &err);
    int ok = rc == status && (in_stdout == NULL || (out && strstr(out, in_stdout))) &&
             (in_stderr == NULL || (err && strstr(err, in_stderr)));
    CU_ASSERT(ok);
    if (!ok)
        fprintf(stderr, "\nballast %s: exit %d (expected %d)\nstdout: %s\nstderr: %s\n", args, rc,
                status, out ? out : "", err ? err : "");
    free(out);
    free(err);
}

static void test_help_and_usage(void)
{
    expect("--help", 0, "usage: ballast COMMAND", NULL);
    expect("help", 0, "commands:", NULL);
    expect("", 2, NULL, "usage:");
    expect("frobnicate", 2, NULL, "unknown command \"frobnicate\"");
    static const char *const commands[] = {"profile", "plan", NULL};
    char args[256];
    for (int i = 0; commands[i] != NULL; i++) {
        snprintf(args, sizeof args, "%s --help", commands[i]);
        expect(args, 0, "usage: ballast", NULL);
        snprintf(args, sizeof args, "%s -h", commands[i]);
        expect(args, 0, "usage: ballast", NULL);
        snprintf(args, sizeof args, "%s --frobnicate", commands[i]);
        expect(args, 2, NULL, "unknown option \"--frobnicate\"");
    }
    const char *cluster = BALLAST_SOURCE_DIR "/configs/clusters/cpu-3.json";
    const char *model = BALLAST_SOURCE_DIR "/configs/models/gpt-tiny.json";
    static const struct {
        const char *args;
        const char *says;
    } bad[] = {
        {"plan", "--cluster (or --model and --gpus) is required"},
        {"plan --cluster", "--cluster needs a value"},
        {"plan --cluster %s --method fastest", "--method: \"fastest\""},
        {"plan --cluster %s --method block:", "block:N"},
        {"plan --cluster %s --method block:-1", "block:N"},
        {"plan --cluster %s --method block:2x", "block:N"},
        {"plan --cluster %s --method patent --reduce 0", "--reduce"},
        {"plan --cluster %s --method patent --reduce 1.5", "--reduce"},
        {"plan --cluster %s --method patent --reduce half", "--reduce"},
        {"plan --cluster %s --method optimal --reduce 0.5", "--method patent only"},
        {"plan --cluster %s --method none --verify", "method none solves no optimisation"},
        {"plan --cluster %s --method patent --whole-layers", "--method optimal only"},
        {"plan --cluster %s --method block:3 --verify", "method block:3 solves no"},
        {"plan --cluster %s --unit 0", "--unit"},
        {"plan --cluster %s --unit 1.5", "--unit"},
        {"plan --cluster %s --unit 1X", "--unit"},
        {"plan --cluster %s --unit", "--unit needs a value"},
        {"plan --cluster %s --time-unit -1", "--time-unit"},
        {"plan --cluster %s --time-unit nan", "--time-unit"},
        {"plan --cluster %s --repartition --search-gap 1", "--search-gap: \"1\""},
        {"plan --cluster %s --repartition --search-gap -0.1", "--search-gap"},
        {"profile --model %s", "--model and --device are required"},
        {"profile --model %s --device tpu", "expected \"cpu\" or \"cuda:N\""},
        {"profile --model %s --estimate --device TPUv9", "\"TPUv9\" is not a device of"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, bad[i].args,
                 strncmp(bad[i].args, "plan", 4) == 0 ? cluster : model);
        expect(args, 2, NULL, bad[i].says);
    }
}

/* A profile and clusters with byte counts small enough to print exactly. Layers (state, act,
 * ckpt, workspace): embed (100, 50, 10, 7), block.0 (200, 80, 20, 30), head (300, 40, 40, 12);
 * stage 0 = embed + block.0 with 2 micro-batches in flight (1F1B, 2 stages, 4 micro-batches),
 * stage 1 = head, reserve 9. Stage 0 recomputing both layers: 300 + 2 x 30 + transient 60 +
 * workspace 30 + reserve 9 = 459 bytes; recomputing nothing: 300 + 2 x 130 + 30 + 9 = 599. */
static const char *hand_cluster(const char *name, int64_t stage0_bytes)
{
    static const char profile[] =
        "{\"format\": \"ballast-profile/1\", \"estimated\": false,\n"
        " \"device\": {\"name\": \"dev\", \"kind\": \"cpu\", \"memory_bytes\": 1073741824},\n"
        " \"model\": {\"kind\": \"gpt\", \"n_layer\": 1, \"n_embd\": 8, \"n_head\": 2, "
        "\"seq_len\": 4, \"vocab_size\": 16, \"micro_batch\": 1, \"dtype\": \"fp32\"},\n"
        " \"layers\": [\n"
        "  {\"name\": \"embed\", \"fwd_ms\": 1, \"bwd_ms\": 2, \"state_bytes\": 100, "
        "\"act_bytes\": 50, \"ckpt_bytes\": 10, \"out_bytes\": 4, \"workspace_bytes\": 7},\n"
        "  {\"name\": \"block.0\", \"fwd_ms\": 3, \"bwd_ms\": 5, \"state_bytes\": 200, "
        "\"act_bytes\": 80, \"ckpt_bytes\": 20, \"out_bytes\": 4, \"workspace_bytes\": 30},\n"
        "  {\"name\": \"head\", \"fwd_ms\": 0.5, \"bwd_ms\": 1, \"state_bytes\": 300, "
        "\"act_bytes\": 40, \"ckpt_bytes\": 40, \"out_bytes\": 4, \"workspace_bytes\": 12}]}\n";
    test_write("hand-profile.json", profile);
    char text[1024];
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 4, "
             "\"reserve_bytes\": 9, \"stages\": [\n"
             " {\"device\": \"dev\", \"memory_bytes\": %lld, \"profile\": \"hand-profile.json\", "
             "\"layers\": [0, 1]},\n"
             " {\"device\": \"dev\", \"memory_bytes\": 1000, \"profile\": \"hand-profile.json\", "
             "\"layers\": [2, 2]}]}\n",
             (long long)stage0_bytes);
    return test_write(name, text);
}

static void test_no_plan_fits(void)
{
    static const char *const methods[] = {"none", "full", "block:1", "uniform-min", "patent",
                                          "optimal", NULL};
    char args[2048], cluster[1024], out[1024];
    snprintf(cluster, sizeof cluster, "%s", hand_cluster("hand-400.json", 400));
    snprintf(out, sizeof out, "%s", test_path("hand-plan.json"));
    for (int i = 0; methods[i] != NULL; i++) {
        snprintf(args, sizeof args, "plan --cluster '%s' --method %s -o '%s'", cluster,
                 methods[i], out);
        remove(out);
        char *err = NULL;
        int rc = run(args, NULL, &err);
        CU_ASSERT_EQUAL(rc, 3);
        CU_ASSERT_PTR_NOT_NULL(err);
        if (err == NULL)
            continue;
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "stage 0 (dev, layers 0-1) cannot fit even "
                                           "recomputing every layer: state 300 B + 2 in flight "
                                           "x 30 B kept + transient 60 B + workspace 30 B + "
                                           "reserve 9 B = 459 B > limit 400 B"));
        CU_ASSERT_PTR_NULL(strstr(err, "stage 1"));
        CU_ASSERT(access(out, F_OK) != 0);
        free(err);
    }
    /* 500 bytes: full recomputation fits, nothing recomputed (599) does not */
    snprintf(cluster, sizeof cluster, "%s", hand_cluster("hand-500.json", 500));
    snprintf(args, sizeof args, "plan --cluster '%s' --method none --unit 1", cluster);
    expect(args, 3, NULL, "stage 0 (dev, layers 0-1) does not fit this method's choice: state 300 "
                          "B + 2 in flight x 130 B kept + transient 0 B + workspace 30 B + reserve "
                          "9 B = 599 B > limit 500 B");
    expect(args, 3, NULL, "try --method optimal");
    snprintf(args, sizeof args, "plan --cluster '%s' --method optimal --unit 1", cluster);
    expect(args, 0, "bottleneck stage: 0", NULL);
    /* with 1 MiB units nothing fits: 101 bytes are left and the transient rounds up to a unit */
    snprintf(args, sizeof args, "plan --cluster '%s' --method optimal", cluster);
    expect(args, 3, NULL, "stage 0 fits only when its memory is counted to the byte");
    expect(args, 3, NULL, "use a smaller --unit");
}

static const cJSON *member(const cJSON *o, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

static void test_verify_in_plan(void)
{
    char args[2048], out[1024];
    snprintf(out, sizeof out, "%s", test_path("verify.json"));
    snprintf(args, sizeof args,
             "plan --cluster '%s/configs/clusters/cpu-3.json' --verify -o '%s'",
             BALLAST_SOURCE_DIR, out);
    expect(args, 0, "verify: DP objective", NULL);
    char *text = test_read(out);
    cJSON *plan = cJSON_Parse(text);
    free(text);
    CU_ASSERT_FATAL(plan != NULL);
    const cJSON *v = member(plan, "verify");
    CU_ASSERT_FATAL(cJSON_IsObject(v));
    CU_ASSERT(cJSON_IsNumber(member(v, "milp_objective")));
    CU_ASSERT(cJSON_IsNumber(member(v, "dp_objective")));
    CU_ASSERT(cJSON_IsTrue(member(v, "agree")));
    CU_ASSERT(test_close(member(v, "dp_objective")->valuedouble,
                         member(v, "milp_objective")->valuedouble, 1e-6, 1e-6));
    /* the shipped CPU cluster is built so that stage 0 must recompute (whole layers or in
     * part) */
    const cJSON *s0 = cJSON_GetArrayItem(member(plan, "stages"), 0);
    CU_ASSERT(cJSON_GetArraySize(member(s0, "recompute")) +
                  cJSON_GetArraySize(member(s0, "recompute_options")) > 0);
    CU_ASSERT(member(s0, "memory_bytes")->valuedouble <=
              member(s0, "memory_limit_bytes")->valuedouble);
    cJSON_Delete(plan);
    /* without --verify there is no verify member */
    snprintf(args, sizeof args, "plan --cluster '%s/configs/clusters/cpu-3.json' --quiet -o '%s'",
             BALLAST_SOURCE_DIR, out);
    expect(args, 0, NULL, NULL);
    text = test_read(out);
    CU_ASSERT_PTR_NULL(strstr(text, "\"verify\""));
    free(text);
}

/* A recompute option by hand: the hand profile's block.0 may also keep 50 of its 80 bytes
 * and regenerate 30 in 0.5 ms ("half"). Stage 0 (v 2) against 570 bytes: keeping everything
 * takes 599; block.0 half 300 + 2 x (50 + 50) + 30 + 30 + 9 = 569 (0.5 ms); the embedding
 * whole 300 + 2 x (10 + 80) + 40 + 39 = 559 (1 ms); block.0 whole 539 (3 ms). So optimal
 * takes "half", and with --whole-layers the embedding. */
static void test_option_by_hand(void)
{
    char *text = test_read(hand_cluster("hand-570.json", 570)), cluster[1024], out[1024];
    char args[4096];
    free(text);
    text = test_read(test_path("hand-profile.json"));
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    char *at = strstr(text, "\"workspace_bytes\": 30}");
    CU_ASSERT_PTR_NOT_NULL_FATAL(at);
    char edited[8192];
    snprintf(edited, sizeof edited, "%.*s\"workspace_bytes\": 30, \"recompute_options\": "
                                    "[{\"name\": \"half\", \"kept_bytes\": 50, "
                                    "\"transient_bytes\": 30, \"recompute_ms\": 0.5}]}%s",
             (int)(at - text), text, at + strlen("\"workspace_bytes\": 30}"));
    free(text);
    test_write("hand-profile.json", edited);
    snprintf(cluster, sizeof cluster, "%s", test_path("hand-570.json"));
    snprintf(out, sizeof out, "%s", test_path("hand-option.json"));
    const char *const runs[3] = {"", "--whole-layers", "--method patent"};
    for (int k = 0; k < 3; k++) {
        snprintf(args, sizeof args, "plan --cluster '%s' --unit 1 --verify %s -o '%s'", cluster,
                 runs[k], out);
        expect(args, 0, k == 0 ? "1:half" : "verify: DP objective", NULL);
        text = test_read(out);
        cJSON *plan = cJSON_Parse(text);
        free(text);
        CU_ASSERT_FATAL(plan != NULL);
        const cJSON *s0 = cJSON_GetArrayItem(member(plan, "stages"), 0);
        const cJSON *opts = member(s0, "recompute_options");
        if (k == 0) {
            CU_ASSERT(cJSON_GetArraySize(member(s0, "recompute")) == 0);
            CU_ASSERT_FATAL(cJSON_GetArraySize(opts) == 1);
            CU_ASSERT(member(cJSON_GetArrayItem(opts, 0), "layer")->valueint == 1);
            CU_ASSERT_STRING_EQUAL(member(cJSON_GetArrayItem(opts, 0), "option")->valuestring,
                                   "half");
            CU_ASSERT(member(s0, "memory_bytes")->valuedouble == 569);
            CU_ASSERT(member(s0, "recompute_ms")->valuedouble == 0.5);
        } else {
            CU_ASSERT_PTR_NULL(opts);
            CU_ASSERT(cJSON_GetArraySize(member(s0, "recompute")) == 1 &&
                      cJSON_GetArrayItem(member(s0, "recompute"), 0)->valueint == 0);
            CU_ASSERT(member(s0, "memory_bytes")->valuedouble == 559);
            CU_ASSERT(member(s0, "recompute_ms")->valuedouble == 1);
        }
        CU_ASSERT(cJSON_IsTrue(member(member(plan, "verify"), "agree")));
        cJSON_Delete(plan);
        struct plan p;
        struct err e;
        err_clear(&e);
        CU_ASSERT_EQUAL(plan_load(out, &p, &e), ERR_OK);
        if (e.code == ERR_OK)
            plan_free(&p);
    }
}

/* Every plan says where each stage computes, whichever path made it: each method, the
 * repartition (which reorders the device kinds), the micro-batch search, whole layers. Two
 * devices of the hand profile, "dev" on the CPU and "gpu" a CUDA device, slowest first. */
static void test_device_kind_always(void)
{
    static const char *const paths[] = {
        "--method none", "--method full", "--method block:1", "--method uniform-min",
        "--method patent", "--method optimal", "--method optimal --repartition",
        "--method optimal --micro-batches auto --global-batch 8",
        "--method optimal --whole-layers", NULL};
    hand_cluster("unused.json", 1000);
    char *cpu = test_read(test_path("hand-profile.json")), *at = NULL;
    CU_ASSERT_FATAL(cpu != NULL && (at = strstr(cpu, "\"name\": \"dev\", \"kind\": \"cpu\"")));
    char gpu[4096];
    snprintf(gpu, sizeof gpu, "%.*s\"name\": \"gpu\", \"kind\": \"cuda\"%s", (int)(at - cpu), cpu,
             at + strlen("\"name\": \"dev\", \"kind\": \"cpu\""));
    free(cpu);
    test_write("hand-gpu.json", gpu);
    char cluster[1024];
    snprintf(cluster, sizeof cluster, "%s", test_write(
        "two-kinds.json",
        "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 4, "
        "\"stages\": [\n"
        " {\"device\": \"dev\", \"memory_bytes\": 100000, \"profile\": \"hand-profile.json\"},\n"
        " {\"device\": \"gpu\", \"memory_bytes\": 100000, \"profile\": \"hand-gpu.json\"}]}\n"));
    char args[4096], out[1024];
    snprintf(out, sizeof out, "%s", test_path("two-kinds-plan.json"));
    for (int i = 0; paths[i] != NULL; i++) {
        snprintf(args, sizeof args, "plan --cluster '%s' %s --unit 1 --quiet -o '%s'", cluster,
                 paths[i], out);
        remove(out);
        expect(args, 0, NULL, NULL);
        struct plan p;
        struct err e;
        err_clear(&e);
        CU_ASSERT_EQUAL_FATAL(plan_load(out, &p, &e), ERR_OK);
        CU_ASSERT_EQUAL(p.n_stages, 2);
        for (int s = 0; s < p.n_stages; s++) {
            const char *want = strcmp(p.stages[s].device, "gpu") == 0 ? "cuda" : "cpu";
            CU_ASSERT_STRING_EQUAL(p.stages[s].device_kind, want);
        }
        plan_free(&p);
    }
}

/* Every shipped cluster with every method: exit 0 with a plan that plan_load reads back
 * (stages fit their limits, numbers are the cost model's) and a table, or exit 3. The
 * knapsack methods plan every shipped cluster and agree with GLPK. */
static void test_shipped_clusters(void)
{
    static const char *const methods[] = {"none", "full", "block:2", "uniform-min", "patent",
                                          "optimal", NULL};
    DIR *d = opendir(BALLAST_SOURCE_DIR "/configs/clusters");
    CU_ASSERT_FATAL(d != NULL);
    struct dirent *ent;
    int clusters = 0;
    char args[4096], out[1024];
    snprintf(out, sizeof out, "%s", test_path("shipped.json"));
    while ((ent = readdir(d)) != NULL) {
        if (strstr(ent->d_name, ".json") == NULL)
            continue;
        clusters++;
        for (int i = 0; methods[i] != NULL; i++) {
            int knapsack = strcmp(methods[i], "patent") == 0 || strcmp(methods[i], "optimal") == 0;
            snprintf(args, sizeof args,
                     "plan --cluster '%s/configs/clusters/%s' --method %s %s -o '%s'",
                     BALLAST_SOURCE_DIR, ent->d_name, methods[i], knapsack ? "--verify" : "",
                     out);
            remove(out);
            char *stdout_text = NULL, *err = NULL;
            int rc = run(args, &stdout_text, &err);
            CU_ASSERT(rc == 0 || (rc == 3 && !knapsack));
            if (rc != 0 && (rc != 3 || knapsack))
                fprintf(stderr, "\nballast %s: exit %d\n%s\n", args, rc, err ? err : "");
            if (rc == 0) {
                CU_ASSERT_PTR_NOT_NULL(strstr(stdout_text, "most loaded stage"));
                struct plan p;
                struct err e;
                err_clear(&e);
                CU_ASSERT_EQUAL(plan_load(out, &p, &e), ERR_OK);
                if (e.code == ERR_OK) {
                    CU_ASSERT(!knapsack || (p.verify.present && p.verify.agree));
                    plan_free(&p);
                } else {
                    fprintf(stderr, "\n%s\n", e.msg);
                }
            } else {
                CU_ASSERT(access(out, F_OK) != 0);
            }
            free(stdout_text);
            free(err);
        }
    }
    closedir(d);
    CU_ASSERT(clusters >= 5);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("command line", NULL, NULL);
    CU_add_test(s, "help and usage errors", test_help_and_usage);
    CU_add_test(s, "exit 3 with the numbers", test_no_plan_fits);
    CU_add_test(s, "--verify in the plan", test_verify_in_plan);
    CU_add_test(s, "a recompute option by hand", test_option_by_hand);
    CU_add_test(s, "every shipped cluster, every method", test_shipped_clusters);
    CU_add_test(s, "device_kind in every plan, whichever path made it", test_device_kind_always);
    return test_main();
}
