#include "testjson.h"

#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

cJSON *test_read_json(const char *path)
{
    char *text = test_read(path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    cJSON *o = cJSON_Parse(text);
    free(text);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    return o;
}

double test_num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    CU_ASSERT_FATAL(cJSON_IsNumber(v));
    return v->valuedouble;
}

const char *test_estimated_profile(const char *model, const char *device)
{
    char base[256], name[512], args[4096];
    const char *slash = strrchr(model, '/');
    snprintf(base, sizeof base, "%s", slash ? slash + 1 : model);
    char *dot = strstr(base, ".json");
    if (dot != NULL)
        *dot = '\0';
    snprintf(name, sizeof name, "%s-%s.json", base, device);
    const char *path = test_path(name);
    if (access(path, F_OK) == 0)
        return path;
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device %s -o '%s'", model,
             device, path);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    return path;
}

cJSON *test_cluster_estimated(const char *cluster, const char *model)
{
    cJSON *c = test_read_json(cluster), *st;
    cJSON_ArrayForEach(st, cJSON_GetObjectItemCaseSensitive(c, "stages"))
    {
        const cJSON *dev = cJSON_GetObjectItemCaseSensitive(st, "device");
        CU_ASSERT_FATAL(cJSON_IsString(dev));
        const char *path = test_estimated_profile(model, dev->valuestring);
        cJSON_ReplaceItemInObjectCaseSensitive(st, "profile", cJSON_CreateString(path));
    }
    return c;
}

const char *test_devices_without(const char *device, const char *key)
{
    cJSON *t = test_read_json(BALLAST_SOURCE_DIR "/configs/devices.json"), *d;
    int found = 0;
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(t, "devices"))
    {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(d, "name");
        if (cJSON_IsString(name) && strcmp(name->valuestring, device) == 0 &&
            cJSON_GetObjectItemCaseSensitive(d, key) != NULL) {
            cJSON_DeleteItemFromObjectCaseSensitive(d, key);
            found = 1;
        }
    }
    CU_ASSERT_FATAL(found);
    char *text = cJSON_Print(t), name[512];
    cJSON_Delete(t);
    snprintf(name, sizeof name, "devices-%s-without-%s.json", device, key);
    const char *path = test_write(name, text);
    free(text);
    return path;
}
