/* CPU threads: `ballast profile --device cpu` takes --threads, else OMP_NUM_THREADS, else
 * OPENBLAS_NUM_THREADS, else every online core (the provenance says which and how many); and
 * `ballast plan` warns when a measured CPU profile ran more threads than a rank of the
 * cluster gets (the profile's cores / the cluster's CPU stages). */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#define CONFIGS BALLAST_SOURCE_DIR "/configs/"
#define XEON "Intel(R) Xeon(R) Processor"

static const char tiny_model[] =
    "{\"format\": \"ballast-model/1\", \"name\": \"t\", \"kind\": \"gpt\", \"n_layer\": 1, "
    "\"n_embd\": 16, \"n_head\": 2, \"seq_len\": 8, \"vocab_size\": 32, \"micro_batch\": 1, "
    "\"dtype\": \"fp32\"}";

/* Profiles the tiny model with `args` under the environment (NULL: unset) and returns the
 * provenance's threads, or -exit status when it fails; *from gets threads_from. */
static int profile_threads(const char *omp, const char *openblas, const char *args, char *from)
{
    const char *model = test_write("tiny.json", tiny_model);
    const char *out = test_path("profile.json");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "profile --model '%s' --device cpu --repeats 1 %s -o '%s'", model,
             args, out);
    omp ? setenv("OMP_NUM_THREADS", omp, 1) : unsetenv("OMP_NUM_THREADS");
    openblas ? setenv("OPENBLAS_NUM_THREADS", openblas, 1) : unsetenv("OPENBLAS_NUM_THREADS");
    unlink(out);
    int rc = test_run(cmd, NULL, NULL);
    unsetenv("OMP_NUM_THREADS");
    unsetenv("OPENBLAS_NUM_THREADS");
    if (rc != 0)
        return -rc;
    char *text = test_read(out);
    cJSON *p = cJSON_Parse(text);
    free(text);
    const cJSON *prov = cJSON_GetObjectItemCaseSensitive(p, "provenance");
    int threads = (int)cJSON_GetObjectItemCaseSensitive(prov, "threads")->valuedouble;
    snprintf(from, 64, "%s", cJSON_GetObjectItemCaseSensitive(prov, "threads_from")->valuestring);
    cJSON_Delete(p);
    return threads;
}

static void test_profile_precedence(void)
{
    char from[64] = "";
    CU_ASSERT_EQUAL(profile_threads("3", "5", "", from), 3);
    CU_ASSERT_STRING_EQUAL(from, "OMP_NUM_THREADS");
    CU_ASSERT_EQUAL(profile_threads("3,1", NULL, "", from), 3); /* OpenMP's nested list */
    CU_ASSERT_EQUAL(profile_threads(NULL, "5", "", from), 5);
    CU_ASSERT_STRING_EQUAL(from, "OPENBLAS_NUM_THREADS");
    CU_ASSERT_EQUAL(profile_threads("3", "5", "--threads 2", from), 2);
    CU_ASSERT_STRING_EQUAL(from, "--threads");
    CU_ASSERT_EQUAL(profile_threads(NULL, NULL, "", from), (int)sysconf(_SC_NPROCESSORS_ONLN));
    CU_ASSERT_STRING_EQUAL(from, "online cores");
    CU_ASSERT_EQUAL(profile_threads("many", "5", "", from), -2);
    CU_ASSERT_EQUAL(profile_threads(NULL, "0", "", from), -2);
}

/* A copy of the shipped measured GPT-tiny profile whose provenance says `threads` of `cores`,
 * and a cluster of `stages` CPU stages using it; returns the cluster's path. */
static const char *cluster_with(int threads, int cores, int stages)
{
    char *text = test_read(CONFIGS "profiles/measured/gpt-tiny/xeon-1-thread.json");
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    cJSON *p = cJSON_Parse(text);
    free(text);
    cJSON *prov = cJSON_GetObjectItemCaseSensitive(p, "provenance");
    cJSON_ReplaceItemInObject(prov, "threads", cJSON_CreateNumber(threads));
    cJSON_ReplaceItemInObject(prov, "cores_online", cJSON_CreateNumber(cores));
    char *out = cJSON_Print(p);
    test_write("measured.json", out);
    cJSON_free(out);
    cJSON_Delete(p);
    char cluster[4096];
    int n = snprintf(cluster, sizeof cluster,
                     "{\"format\": \"ballast-cluster/1\", \"name\": \"c\", \"schedule\": \"1f1b\", "
                     "\"micro_batches\": 4, \"stages\": [");
    for (int s = 0; s < stages; s++)
        n += snprintf(cluster + n, sizeof cluster - n,
                      "%s{\"device\": \"" XEON "\", \"memory_bytes\": 1073741824, "
                      "\"profile\": \"measured.json\"}",
                      s ? ", " : "");
    snprintf(cluster + n, sizeof cluster - n, "]}");
    return test_write("cluster.json", cluster);
}

/* Plans the cluster and returns how many warning lines it printed; all must name `says`. */
static int plan_warnings(const char *cluster, const char *says)
{
    char args[1024], *err = NULL;
    snprintf(args, sizeof args, "plan --cluster '%s' --quiet", cluster);
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 0);
    int lines = 0;
    for (const char *at = err; at != NULL && (at = strstr(at, "warning: stage")) != NULL; at++) {
        const char *end = strchr(at, '\n');
        char line[512];
        snprintf(line, sizeof line, "%.*s", end ? (int)(end - at) : (int)strlen(at), at);
        CU_ASSERT_PTR_NOT_NULL(strstr(line, "measured.json"));
        CU_ASSERT_PTR_NOT_NULL(strstr(line, says));
        lines++;
    }
    free(err);
    return lines;
}

static void test_plan_warns(void)
{
    /* 2 threads measured; 2 cores over 2 CPU stages give a rank 1: both stages warned */
    CU_ASSERT_EQUAL(plan_warnings(cluster_with(2, 2, 2),
                                  "measured with 2 threads, but a rank gets 1 (2 cores / 2 CPU "
                                  "stages)"),
                    2);
    /* 8 cores over 3 stages: a rank gets 2, a 4-thread profile is too many */
    CU_ASSERT_EQUAL(plan_warnings(cluster_with(4, 8, 3), "with 4 threads, but a rank gets 2"), 3);
    /* no warning when a rank gets at least what was measured */
    CU_ASSERT_EQUAL(plan_warnings(cluster_with(1, 2, 2), ""), 0);
    CU_ASSERT_EQUAL(plan_warnings(cluster_with(2, 2, 1), ""), 0);
    CU_ASSERT_EQUAL(plan_warnings(cluster_with(2, 8, 3), ""), 0);
    /* the shipped CPU clusters: estimated, and measured with one thread */
    CU_ASSERT_EQUAL(plan_warnings(CONFIGS "clusters/cpu-3.json", ""), 0);
    CU_ASSERT_EQUAL(plan_warnings(CONFIGS "clusters/cpu-3-measured.json", ""), 0);
    /* and a cluster without a CPU stage */
    CU_ASSERT_EQUAL(plan_warnings(CONFIGS "clusters/t4-4090-4.json", ""), 0);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("CPU threads", NULL, NULL);
    CU_add_test(s, "profile: --threads, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, cores",
                test_profile_precedence);
    CU_add_test(s, "plan warns of a profile measured with more threads than a rank gets",
                test_plan_warns);
    return test_main();
}
