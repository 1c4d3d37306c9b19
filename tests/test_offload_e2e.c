/* Offload from the planner to the runtime: the shipped cpu-3-offload cluster planned with
 * `--actions recompute,offload` (stage 0 sends kept tensors to host memory instead of
 * recomputing them) trains on three ranks with every stage's measured device peak equal to
 * its plan's memory within 2% (train_run_ok) and host peak within the plan's host memory,
 * and its losses are bitwise those of the same cluster trained with nothing offloaded or
 * recomputed (`--method none` on a roomy copy: what the layers compute does not depend on
 * where their tensors wait). */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "traintest.h"

#define NP 3
#define LIMIT_S 180

static const char *plan_file(const char *cluster, const char *flags, const char *name)
{
    static char path[4][1024];
    static int next;
    char *out = path[next++ % 4];
    snprintf(out, 1024, "%s", test_path(name));
    char args[4096], *o = NULL, *err = NULL;
    snprintf(args, sizeof args, "plan --cluster '%s' %s --quiet -o '%s'", cluster, flags, out);
    int rc = test_run(args, &o, &err);
    if (rc)
        fprintf(stderr, "\nplan %s: %s\n", name, err ? err : "");
    CU_ASSERT_EQUAL(rc, 0);
    free(o);
    free(err);
    return out;
}

static void test_planned_offload_trains(void)
{
    const char *cluster = BALLAST_SOURCE_DIR "/configs/clusters/cpu-3-offload.json";
    const char *off = plan_file(cluster, "--actions recompute,offload", "offload.json");
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(plan_load(off, &p, &e) == ERR_OK);
    int offloads = 0;
    int64_t host_planned = p.stages[0].host_memory_bytes;
    for (int l = 0; l < plan_stage_layer_count(&p.stages[0]); l++)
        offloads += p.stages[0].place[l] != COST_PLACE_DEVICE || p.stages[0].offload_option[l] >= 0;
    CU_ASSERT(offloads > 0); /* the lever this test is about */
    plan_free(&p);

    struct train_metrics m, ref;
    CU_ASSERT_FATAL(train_run_ok(NP, LIMIT_S, off, "--steps 3 --host-link-gbps 100",
                                 "offload-metrics.json", &m) == 0);
    /* the host peak the runtime measured against the plan's host memory */
    cJSON *j = train_json_read(test_path("offload-metrics.json"));
    CU_ASSERT_FATAL(j != NULL);
    const cJSON *st0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "stages"), 0);
    double host_peak = cJSON_GetNumberValue(cJSON_GetObjectItem(st0, "host_peak_bytes"));
    CU_ASSERT(host_peak > 0 && host_peak <= (double)host_planned);
    cJSON_Delete(j);

    /* the reference: nothing offloaded or recomputed, on stages roomy enough */
    char text[4096];
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 4, "
             "\"stages\": ["
             "{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
             "\"%s/configs/profiles/estimated/gpt-tiny/cpu.json\", \"layers\": [0, 2]},"
             "{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
             "\"%s/configs/profiles/estimated/gpt-tiny/cpu.json\", \"layers\": [3, 5]},"
             "{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
             "\"%s/configs/profiles/estimated/gpt-tiny/cpu.json\", \"layers\": [6, 7]}]}",
             BALLAST_SOURCE_DIR, BALLAST_SOURCE_DIR, BALLAST_SOURCE_DIR);
    const char *roomy = plan_file(test_write("roomy-cluster.json", text), "--method none",
                                  "roomy.json");
    CU_ASSERT_FATAL(train_run_ok(NP, LIMIT_S, roomy, "--steps 3", "roomy-metrics.json", &ref) ==
                    0);
    CU_ASSERT(train_same_losses(&m, &ref));
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("offload end to end", NULL, NULL);
    CU_add_test(s, "a planned offload trains at its planned memory, bitwise as keeping all",
                test_planned_offload_trains);
    return test_main();
}
