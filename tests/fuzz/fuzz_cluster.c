/* A cluster file as plan reads it: its stages, or each of its pipelines, or its pool; the
 * profiles it names are "cpu.json" (gpt-tiny's estimated CPU profile) and "llama.json"
 * (llama-tiny's), copied beside it. */
#include <math.h>

#include "cluster.h"
#include "fuzz_file.h"
#include "jsonio.h"
#include "planner.h"
#include "pool_model.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_file_copy("configs/profiles/estimated/gpt-tiny/cpu.json", "cpu.json");
    fuzz_file_copy("configs/profiles/estimated/llama-tiny/cpu.json", "llama.json");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cluster c;
    struct pool_model pm;
    struct plan_options o;
    plan_options_default(&o);
    struct err e;
    err_clear(&e);
    const char *file = fuzz_file(data, size, "cluster.json");
    cJSON *root = jsonio_read_kind(file, JSONIO_CLUSTER, &e);
    int pipelines = 0;
    if (root != NULL && cJSON_GetObjectItemCaseSensitive(root, "pool") != NULL) {
        if (pool_model_load(root, file, &o, INFINITY, &pm, &e) == ERR_OK)
            pool_model_free(&pm);
    }
    else if (root != NULL && cluster_pipeline_count(root, file, &pipelines, &e) == ERR_OK)
        for (int k = 0; k < (pipelines > 0 ? pipelines : 1); k++)
            if (cluster_parse_pipeline(root, file, k, &c, &e) == ERR_OK)
                cluster_free(&c);
    cJSON_Delete(root);
    return 0;
}
