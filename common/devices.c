#include "devices.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "jsonio.h"
#include "units.h"

const char *devices_default_file(void)
{
    const char *env = getenv("BALLAST_DEVICES");
    return env != NULL && env[0] != '\0' ? env : BALLAST_SOURCE_DIR "/configs/devices.json";
}

static int device_spec_from_json(const cJSON *o, const char *file, const char *path,
                                 struct device_spec *d, struct err *e)
{
    static const char *const keys[] = {"name",          "kind",
                                       "peak_tflops_16bit", "peak_tflops_fp32",
                                       "memory_bytes",  "memory_bandwidth_gbs",
                                       "host_link_gbs", "op_overhead_us",
                                       "source",        "bf16_tensor",
                                       "peak_tflops_fp16", NULL};
    if (jsonio_expect_object(o, file, path, e) || jsonio_check_keys(o, file, path, keys, e) ||
        jsonio_str_copy(o, file, path, "name", d->name, sizeof d->name, e) ||
        jsonio_str_copy(o, file, path, "kind", d->kind, sizeof d->kind, e) ||
        jsonio_num(o, file, path, "peak_tflops_16bit", 1e-6, 1e6, &d->peak_tflops_16bit, e) ||
        jsonio_num(o, file, path, "peak_tflops_fp32", 1e-6, 1e6, &d->peak_tflops_fp32, e) ||
        units_json_bytes(o, file, path, "memory_bytes", 1, JSONIO_INT_MAX, &d->memory_bytes, e) ||
        units_json_rate(o, file, path, "memory_bandwidth_gbs", 8e9, 1e-6, 1e6,
                        &d->memory_bandwidth_gbs, e) ||
        units_json_rate(o, file, path, "host_link_gbs", 8e9, 0, 1e6, &d->host_link_gbs, e) ||
        jsonio_num(o, file, path, "op_overhead_us", 0, 1e6, &d->op_overhead_us, e) ||
        jsonio_str_copy(o, file, path, "source", d->source, sizeof d->source, e))
        return e->code;
    /* optional: a device without it has bf16 tensor cores, what peak_tflops_16bit meant first */
    d->bf16_tensor = 1;
    if (cJSON_GetObjectItemCaseSensitive(o, "bf16_tensor") != NULL &&
        jsonio_bool(o, file, path, "bf16_tensor", &d->bf16_tensor, e))
        return e->code;
    /* optional: absent, the device's fp16 rate is unknown (fp16 estimates there are refused) */
    d->peak_tflops_fp16 = 0;
    if (jsonio_num_opt(o, file, path, "peak_tflops_fp16", 1e-6, 1e6, &d->peak_tflops_fp16, e))
        return e->code;
    if (strcmp(d->kind, "cpu") != 0 && strcmp(d->kind, "cuda") != 0) {
        char sub[JSONIO_PATH_MAX];
        jsonio_path_key(sub, path, "kind");
        return err_set(e, ERR_INPUT, "%s: %s: \"%s\", expected \"cpu\" or \"cuda\"", file, sub,
                       d->kind);
    }
    return ERR_OK;
}

int devices_load(const char *file, struct device_table *t, struct err *e)
{
    static const char *const keys[] = {"format", "description", "assumptions", "devices", NULL};
    static const char *const akeys[] = {"gemm_efficiency",           "memory_efficiency",
                                        "host_memory_bandwidth_gbs", "host_memory_note",
                                        "note",                      NULL};
    memset(t, 0, sizeof *t);
    snprintf(t->file, sizeof t->file, "%s", file);
    cJSON *root = jsonio_read_kind(file, JSONIO_DEVICES, e);
    if (root == NULL)
        return e->code;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "assumptions");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "devices");
    static const char *const text[] = {"description", NULL};
    static const char *const notes[] = {"host_memory_note", "note", NULL};
    if (jsonio_check_format(root, file, "devices", 1, e) ||
        jsonio_check_keys(root, file, "", keys, e) || jsonio_check_text(root, file, "", text, e))
        goto done;
    if (a == NULL || list == NULL) {
        err_set(e, ERR_INPUT, "%s: %s: missing", file, a == NULL ? "assumptions" : "devices");
        goto done;
    }
    if (jsonio_expect_object(a, file, "assumptions", e) ||
        jsonio_check_keys(a, file, "assumptions", akeys, e) ||
        jsonio_check_text(a, file, "assumptions", notes, e) ||
        jsonio_num(a, file, "assumptions", "gemm_efficiency", 1e-3, 1, &t->gemm_efficiency, e) ||
        jsonio_num(a, file, "assumptions", "memory_efficiency", 1e-3, 1, &t->memory_efficiency,
                   e) ||
        jsonio_num_opt(a, file, "assumptions", "host_memory_bandwidth_gbs", 1e-3, 1e6,
                       &t->host_memory_bandwidth_gbs, e) ||
        jsonio_expect_array(list, file, "devices", e))
        goto done;
    t->n = cJSON_GetArraySize(list);
    t->devices = calloc((size_t)(t->n > 0 ? t->n : 1), sizeof *t->devices);
    if (t->devices == NULL) {
        err_set(e, ERR_FAIL, "%s: out of memory", file);
        goto done;
    }
    int i = 0;
    for (const cJSON *d = list->child; d != NULL; d = d->next, i++) {
        char path[JSONIO_PATH_MAX];
        jsonio_path_index(path, "devices", i);
        if (device_spec_from_json(d, file, path, &t->devices[i], e))
            goto done;
        for (int k = 0; k < i; k++)
            if (strcmp(t->devices[k].name, t->devices[i].name) == 0) {
                err_set(e, ERR_INPUT, "%s: %s.name: \"%s\" already names devices[%d]", file, path,
                        t->devices[i].name, k);
                goto done;
            }
    }
done:
    cJSON_Delete(root);
    if (e->code)
        devices_free(t);
    return e->code;
}

void devices_free(struct device_table *t)
{
    free(t->devices);
    memset(t, 0, sizeof *t);
}

const struct device_spec *devices_find(const struct device_table *t, const char *name)
{
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->devices[i].name, name) == 0)
            return &t->devices[i];
    return NULL;
}

double devices_gemm_tflops(const struct device_spec *d, enum model_dtype dtype)
{
    switch (dtype) {
    case MODEL_DTYPE_BF16:
        /* without bf16 tensor cores the libraries run bf16 GEMMs on the CUDA cores in fp32
         * arithmetic: the fp16 tensor peak would be up to 8x optimistic (devices.json's note) */
        return d->bf16_tensor ? d->peak_tflops_16bit : d->peak_tflops_fp32;
    case MODEL_DTYPE_FP16:
        return d->peak_tflops_fp16;
    case MODEL_DTYPE_FP32:
        break;
    }
    return d->peak_tflops_fp32;
}

int devices_check_dtype(const struct device_table *t, const struct device_spec *d,
                        enum model_dtype dtype, struct err *e)
{
    if (devices_gemm_tflops(d, dtype) > 0)
        return ERR_OK;
    return err_set(e, ERR_INPUT,
                   "%s: devices[%d] (\"%s\"): no peak_tflops_fp16, so an fp16 model's GEMMs cannot "
                   "be costed on it: add the datasheet's dense fp16 figure with fp32 accumulation "
                   "(its peak_tflops_fp32 if it has no fp16 units), or plan the model in bf16 or "
                   "fp32",
                   t->file, (int)(d - t->devices), d->name);
}

int devices_lookup(const struct device_table *t, const char *file, const char *what,
                   const char *name, const struct device_spec **out, struct err *e)
{
    *out = devices_find(t, name);
    for (int i = 0; i < t->n && *out == NULL; i++)
        if (strcasecmp(t->devices[i].name, name) == 0)
            *out = &t->devices[i];
    if (*out != NULL)
        return ERR_OK;
    char names[1024] = "";
    size_t used = 0;
    for (int i = 0; i < t->n; i++)
        used += (size_t)snprintf(names + used, used < sizeof names ? sizeof names - used : 0,
                                 "%s%s", i ? ", " : "", t->devices[i].name);
    return err_set(e, ERR_INPUT, "%s: \"%s\" is not a device of %s (known: %s)", what, name,
                   file, names);
}

struct link devices_host_link(const struct device_spec *d)
{
    if (!(d->host_link_gbs > 0))
        return (struct link){0};
    return (struct link){.present = 1, .gbps = d->host_link_gbs * 8 * DEVICES_PINNED_SHARE};
}
