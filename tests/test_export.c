/* --micro-batches auto against planning every micro-batch size by hand (the exports are
 * test_frameworks.c's). */
#include <CUnit/CUnit.h>
#include <ctype.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "planner.h"
#include "testutil.h"

#define CONFIGS BALLAST_SOURCE_DIR "/configs/"

/* --micro-batches auto picks the fastest micro-batch size dividing the global batch: plan
 * each size by hand (its model file, its estimated profiles, its cluster) and compare. */
static void test_micro_batches_auto(void)
{
    const char *devices[] = {"T4", "RTX4090"};
    int global = 8;
    double best = INFINITY;
    int best_b = 0;
    char args[4096], *text = test_read(CONFIGS "models/gpt-1.3b.json");
    cJSON *model = cJSON_Parse(text);
    free(text);
    text = test_read(CONFIGS "clusters/t4-4090-4.json");
    cJSON *cluster = cJSON_Parse(text);
    free(text);
    CU_ASSERT_FATAL(model && cluster);
    for (int b = 1; b <= global; b++) {
        if (global % b)
            continue;
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/b%d", test_tmpdir(), b);
        snprintf(args, sizeof args, "mkdir -p '%s'", dir);
        CU_ASSERT_EQUAL_FATAL(system(args), 0);
        cJSON_SetNumberValue(cJSON_GetObjectItem(model, "micro_batch"), b);
        char path[1200];
        snprintf(path, sizeof path, "%s/model.json", dir);
        FILE *f = fopen(path, "w");
        char *s = cJSON_Print(model);
        fputs(s, f);
        fclose(f);
        free(s);
        for (int d = 0; d < 2; d++) {
            snprintf(args, sizeof args,
                     "profile --model '%s/model.json' --estimate --device %s -o '%s/%s.json'", dir,
                     devices[d], dir, devices[d]);
            CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
        }
        cJSON *c = cJSON_Duplicate(cluster, 1);
        cJSON_SetNumberValue(cJSON_GetObjectItem(c, "micro_batches"), global / b);
        const cJSON *st;
        cJSON_ArrayForEach(st, cJSON_GetObjectItem(c, "stages"))
        {
            char prof[128];
            snprintf(prof, sizeof prof, "%s.json",
                     cJSON_GetObjectItem(st, "device")->valuestring);
            cJSON_SetValuestring(cJSON_GetObjectItem(st, "profile"), prof);
        }
        snprintf(path, sizeof path, "%s/cluster.json", dir);
        f = fopen(path, "w");
        s = cJSON_Print(c);
        fputs(s, f);
        fclose(f);
        free(s);
        cJSON_Delete(c);
        snprintf(args, sizeof args, "plan --cluster '%s' --quiet -o '%s/plan.json'", path, dir);
        int rc = test_run(args, NULL, NULL);
        CU_ASSERT(rc == 0 || rc == 3);
        if (rc != 0)
            continue;
        snprintf(path, sizeof path, "%s/plan.json", dir);
        text = test_read(path);
        cJSON *p = cJSON_Parse(text);
        free(text);
        double ms = cJSON_GetObjectItem(p, "iteration_ms")->valuedouble;
        cJSON_Delete(p);
        if (ms < best) {
            best = ms;
            best_b = b;
        }
    }
    cJSON_Delete(model);
    cJSON_Delete(cluster);
    CU_ASSERT_FATAL(best_b > 0);
    const char *plan = test_path("auto-plan.json");
    char *out = NULL;
    snprintf(args, sizeof args,
             "plan --cluster '%sclusters/t4-4090-4.json' --micro-batches auto --global-batch %d "
             "-o '%s'",
             CONFIGS, global, plan);
    CU_ASSERT_EQUAL_FATAL(test_run(args, &out, NULL), 0);
    CU_ASSERT(out && strstr(out, "chosen: micro-batch"));
    free(out);
    text = test_read(plan);
    cJSON *p = cJSON_Parse(text);
    free(text);
    CU_ASSERT(test_close(cJSON_GetObjectItem(p, "iteration_ms")->valuedouble, best, 1e-9, 1e-12));
    CU_ASSERT_EQUAL(cJSON_GetObjectItem(cJSON_GetObjectItem(p, "model"), "micro_batch")->valueint,
                    best_b);
    CU_ASSERT_EQUAL(cJSON_GetObjectItem(p, "micro_batches")->valueint, global / best_b);
    cJSON_Delete(p);
    /* usage errors */
    snprintf(args, sizeof args,
             "plan --cluster '%sclusters/t4-4090-4.json' --global-batch 8", CONFIGS);
    CU_ASSERT_EQUAL(test_run(args, NULL, NULL), 2);
    snprintf(args, sizeof args,
             "plan --cluster '%sclusters/t4-4090-4.json' --export pytorch", CONFIGS);
    CU_ASSERT_EQUAL(test_run(args, NULL, NULL), 2);
}

/* --micro-batches auto on a measured profile (cpu-3's, marked measured, micro-batch 4) whose
 * blocks carry the runtime's options and one it does not know, for a global batch of 6 (so
 * every size tried differs from the profile's): the known ones are rescaled to each
 * micro-batch size (what they keep and regenerate still make up the layer's activations),
 * the unknown one is left out with a note, and the plan is one plan_load accepts (through
 * `ballast simulate`). */
static void test_micro_batches_auto_measured(void)
{
    char *text = test_read(CONFIGS "profiles/estimated/gpt-tiny/cpu.json");
    cJSON *prof = cJSON_Parse(text);
    free(text);
    CU_ASSERT_FATAL(prof != NULL);
    cJSON_ReplaceItemInObject(prof, "estimated", cJSON_CreateFalse());
    cJSON *layer = cJSON_GetArrayItem(cJSON_GetObjectItem(prof, "layers"), 1);
    cJSON *mystery = cJSON_CreateObject();
    cJSON_AddStringToObject(mystery, "name", "mystery");
    cJSON_AddNumberToObject(mystery, "kept_bytes",
                            cJSON_GetObjectItem(layer, "act_bytes")->valuedouble);
    cJSON_AddNumberToObject(mystery, "transient_bytes", 0);
    cJSON_AddNumberToObject(mystery, "recompute_ms", 0.01);
    cJSON_AddItemToArray(cJSON_GetObjectItem(layer, "recompute_options"), mystery);
    char *out = cJSON_Print(prof);
    test_write("measured-cpu.json", out);
    cJSON_free(out);
    cJSON_Delete(prof);
    text = test_read(CONFIGS "clusters/cpu-3.json");
    cJSON *cluster = cJSON_Parse(text);
    free(text);
    const cJSON *st;
    cJSON_ArrayForEach(st, cJSON_GetObjectItem(cluster, "stages"))
        cJSON_SetValuestring(cJSON_GetObjectItem(st, "profile"), "measured-cpu.json");
    out = cJSON_Print(cluster);
    char cfile[1024], plan[1024], args[4096];
    snprintf(cfile, sizeof cfile, "%s", test_write("measured-cluster.json", out));
    cJSON_free(out);
    cJSON_Delete(cluster);
    snprintf(plan, sizeof plan, "%s", test_path("measured-plan.json"));
    snprintf(args, sizeof args,
             "plan --cluster '%s' --micro-batches auto --global-batch 6 -o '%s'", cfile, plan);
    char *report = NULL;
    CU_ASSERT_EQUAL_FATAL(test_run(args, &report, NULL), 0);
    CU_ASSERT(report && strstr(report, "options of measured profiles that this runtime does not "
                                       "know were left out"));
    free(report);
    text = test_read(plan);
    cJSON *p = cJSON_Parse(text);
    free(text);
    int options = 0;
    cJSON_ArrayForEach(st, cJSON_GetObjectItem(p, "stages"))
    {
        const cJSON *c, *o;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(st, "layer_costs"))
            cJSON_ArrayForEach(o, cJSON_GetObjectItem(c, "recompute_options"))
            {
                CU_ASSERT(strcmp(cJSON_GetObjectItem(o, "name")->valuestring, "mystery") != 0);
                CU_ASSERT(cJSON_GetObjectItem(o, "kept_bytes")->valuedouble +
                              cJSON_GetObjectItem(o, "transient_bytes")->valuedouble ==
                          cJSON_GetObjectItem(c, "act_bytes")->valuedouble);
                options++;
            }
    }
    CU_ASSERT(options > 0);
    cJSON_Delete(p);
    snprintf(args, sizeof args, "simulate --plan '%s'", plan);
    CU_ASSERT_EQUAL(test_run(args, NULL, NULL), 0);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("export", NULL, NULL);
    CU_add_test(s, "--micro-batches auto is the fastest size", test_micro_batches_auto);
    CU_add_test(s, "--micro-batches auto rescales a measured profile's options",
                test_micro_batches_auto_measured);
    return test_main();
}
