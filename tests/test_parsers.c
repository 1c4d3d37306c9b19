/* Every file parser against malformed, inconsistent and hostile files: model, profile,
 * cluster and devices through the `ballast` command line (exit status 2, a message naming the
 * file and the field, nothing written with -o), the plan through plan_load (no command reads
 * plans yet). Valid files are made by the command line itself and then altered one member at
 * a time. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan.h"
#include "testutil.h"

/* Valid files, made once. */
static char model_file[1024], cpu_profile[1024], t4_profile[1024], cluster_file[1024],
    plan_file[1024], devices_file[1024];
/* Where a failing command would write (and must not): ballast profile's and plan's -o. */
static char out_profile[1024], out_plan[1024];

static const char *const cluster_text =
    "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 4,\n"
    " \"reserve_bytes\": 1048576, \"link\": {\"gbps\": 100, \"latency_us\": 5},\n"
    " \"stages\": [\n"
    "  {\"device\": \"cpu\", \"memory_bytes\": 268435456, \"profile\": \"%s\", "
    "\"layers\": [0, 2]},\n"
    "  {\"device\": \"cpu\", \"memory_bytes\": 268435456, \"profile\": \"prof-cpu.json\", "
    "\"layers\": [3, 5]},\n"
    "  {\"device\": \"T4\", \"memory_bytes\": 268435456, \"profile\": \"prof-t4.json\", "
    "\"layers\": [6, 7]}]}\n";

static void copy_path(char *dst, const char *src)
{
    snprintf(dst, 1024, "%s", src);
}

static int init(void)
{
    char args[4096], text[4096];
    copy_path(model_file, test_write("model.json",
                                     "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", "
                                     "\"n_layer\": 6, \"n_embd\": 128, \"n_head\": 4, "
                                     "\"seq_len\": 128, \"vocab_size\": 256, \"micro_batch\": 4, "
                                     "\"dtype\": \"fp32\"}"));
    copy_path(cpu_profile, test_path("prof-cpu.json"));
    copy_path(t4_profile, test_path("prof-t4.json"));
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu -o '%s'",
             model_file, cpu_profile);
    if (test_run(args, NULL, NULL) != 0)
        return 1;
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device T4 -o '%s'",
             model_file, t4_profile);
    if (test_run(args, NULL, NULL) != 0)
        return 1;
    snprintf(text, sizeof text, cluster_text, "prof-cpu.json");
    copy_path(cluster_file, test_write("cluster.json", text));
    copy_path(plan_file, test_path("plan.json"));
    snprintf(args, sizeof args, "plan --cluster '%s' --quiet -o '%s'", cluster_file, plan_file);
    if (test_run(args, NULL, NULL) != 0)
        return 1;
    copy_path(devices_file, BALLAST_SOURCE_DIR "/configs/devices.json");
    copy_path(out_profile, test_path("out-profile.json"));
    copy_path(out_plan, test_path("out-plan.json"));
    return 0;
}

/* Splits one path step ("stages[2]", "layers") into its key and index (-1: none). */
static void step(const char *tok, char *key, int *index)
{
    const char *br = strchr(tok, '[');
    size_t klen = br ? (size_t)(br - tok) : strlen(tok);
    memcpy(key, tok, klen);
    key[klen] = '\0';
    *index = br ? atoi(br + 1) : -1;
}

/* Writes a copy of `src` in which the member at `path` (dots and [i], e.g.
 * "stages[2].layers") holds the raw text `raw` (which may be anything, valid JSON or not), or
 * is removed when raw is NULL; a missing object member is added. Returns the new file's path
 * (a static buffer, valid until the next call). */
static const char *mutate(const char *src, const char *name, const char *path, const char *raw)
{
    char *text = test_read(src);
    CU_ASSERT_FATAL(text != NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    CU_ASSERT_FATAL(root != NULL);
    char buf[256], key[256];
    snprintf(buf, sizeof buf, "%s", path);
    cJSON *parent = root;
    char *save = NULL, *tok = strtok_r(buf, ".", &save);
    while (tok != NULL) {
        int index;
        char *next = strtok_r(NULL, ".", &save);
        step(tok, key, &index);
        cJSON *holder = parent; /* the object that has `key` */
        cJSON *item = cJSON_GetObjectItemCaseSensitive(parent, key);
        if (next == NULL) {
            cJSON *value = raw ? cJSON_CreateString("@@RAW@@") : NULL;
            if (index >= 0) {
                CU_ASSERT_FATAL(cJSON_IsArray(item));
                if (raw)
                    cJSON_ReplaceItemInArray(item, index, value);
                else
                    cJSON_DeleteItemFromArray(item, index);
            } else if (raw == NULL) {
                cJSON_DeleteItemFromObjectCaseSensitive(holder, key);
            } else if (item != NULL) {
                cJSON_ReplaceItemInObjectCaseSensitive(holder, key, value);
            } else {
                cJSON_AddItemToObject(holder, key, value);
            }
        } else {
            CU_ASSERT_FATAL(item != NULL);
            parent = index >= 0 ? cJSON_GetArrayItem(item, index) : item;
            CU_ASSERT_FATAL(parent != NULL);
        }
        tok = next;
    }
    char *out = cJSON_Print(root);
    cJSON_Delete(root);
    static char file[1024];
    copy_path(file, test_path(name));
    FILE *f = fopen(file, "w");
    CU_ASSERT_FATAL(f != NULL);
    char *at = strstr(out, "\"@@RAW@@\"");
    if (at != NULL) {
        fwrite(out, 1, (size_t)(at - out), f);
        fputs(raw, f);
        fputs(at + strlen("\"@@RAW@@\""), f);
    } else {
        fputs(out, f);
    }
    fclose(f);
    free(out);
    return file;
}

static int failures;

/* Runs `ballast ARGS`, expecting exit 2, a message naming `file` (and `file2` unless NULL) and
 * containing `field` and `says` (either may be NULL), and no `out` file. */
static void expect_bad2(const char *args, const char *out, const char *file, const char *file2,
                        const char *field, const char *says)
{
    char *err = NULL;
    remove(out);
    int rc = test_run(args, NULL, &err);
    int ok = rc == 2 && err != NULL && strstr(err, file) != NULL &&
             (file2 == NULL || strstr(err, file2) != NULL) &&
             (field == NULL || strstr(err, field) != NULL) &&
             (says == NULL || strstr(err, says) != NULL);
    CU_ASSERT_EQUAL(rc, 2);
    CU_ASSERT(ok);
    CU_ASSERT(access(out, F_OK) != 0);
    if ((!ok || access(out, F_OK) == 0) && failures++ < 20)
        fprintf(stderr, "\nballast %s\n  exit %d, expected 2 naming %s / %s / %s; stderr:\n%s\n",
                args, rc, file, field ? field : "-", says ? says : "-", err ? err : "(none)");
    free(err);
}

static void expect_bad(const char *args, const char *out, const char *file, const char *field,
                       const char *says)
{
    expect_bad2(args, out, file, NULL, field, says);
}

static void expect_ok(const char *args)
{
    char *err = NULL;
    int rc = test_run(args, NULL, &err);
    CU_ASSERT_EQUAL(rc, 0);
    if (rc != 0 && failures++ < 20)
        fprintf(stderr, "\nballast %s\n  exit %d, expected 0; stderr:\n%s\n", args, rc,
                err ? err : "(none)");
    free(err);
}

struct change {
    const char *path; /* member to change */
    const char *raw;  /* its new raw text; NULL removes it */
    const char *field; /* what the message must name */
    const char *says;  /* a phrase it must contain */
};

/* Damage every Ballast file can suffer, whatever its kind: written as the whole file. */
static const char *const not_json[] = {
    "",                              /* empty */
    "this is not JSON",
    "{\"format\": ",                 /* truncated */
    "{\"a\": NaN}",
    "{\"a\": Infinity}",
    "{\"a\": -Infinity}",
    "{\"a\": 1} trailing",
    "{'format': 'single quotes'}",
    NULL,
};

static void check_not_json(const char *name, const char *args_fmt, const char *out)
{
    char args[4096];
    for (int i = 0; not_json[i] != NULL; i++) {
        const char *f = test_write(name, not_json[i]);
        snprintf(args, sizeof args, args_fmt, f, out);
        expect_bad(args, out, f, NULL, "not valid JSON");
    }
    /* a NUL byte inside an otherwise valid file */
    const char *f = test_path(name);
    FILE *fp = fopen(f, "wb");
    CU_ASSERT_FATAL(fp != NULL);
    fwrite("{\"format\": \"x\0y\"}", 1, 17, fp);
    fclose(fp);
    snprintf(args, sizeof args, args_fmt, f, out);
    expect_bad(args, out, f, NULL, "NUL");
    /* nested 5000 deep */
    char *deep = malloc(10002);
    memset(deep, '[', 5000);
    memset(deep + 5000, ']', 5000);
    deep[10000] = '\0';
    f = test_write(name, deep);
    free(deep);
    snprintf(args, sizeof args, args_fmt, f, out);
    expect_bad(args, out, f, NULL, "not valid JSON");
    /* valid JSON of the wrong shape */
    static const char *const shapes[] = {"[]", "42", "\"text\"", "null", "{}",
                                         "{\"format\": \"ballast-something/1\"}",
                                         "{\"format\": 7}", NULL};
    for (int i = 0; shapes[i] != NULL; i++) {
        f = test_write(name, shapes[i]);
        snprintf(args, sizeof args, args_fmt, f, out);
        expect_bad(args, out, f, NULL, NULL);
    }
    /* missing, and a folder */
    char missing[1024];
    copy_path(missing, test_path("does-not-exist.json"));
    snprintf(args, sizeof args, args_fmt, missing, out);
    expect_bad(args, out, missing, NULL, "cannot open");
    snprintf(args, sizeof args, args_fmt, test_tmpdir(), out);
    expect_bad(args, out, test_tmpdir(), NULL, NULL);
}

static void run_changes(const char *src, const char *name, const char *args_fmt,
                        const char *out, const struct change *changes)
{
    char args[4096];
    for (const struct change *c = changes; c->path != NULL; c++) {
        const char *f = mutate(src, name, c->path, c->raw);
        snprintf(args, sizeof args, args_fmt, f, out);
        expect_bad(args, out, f, c->field, c->says);
    }
}

/* ---- model ---- */

static const char model_args[] = "profile --model '%s' --estimate --device cpu -o '%s'";

static const struct change model_changes[] = {
    {"n_layer", "\"6\"", "n_layer", "expected an integer, found a string"},
    {"n_layer", "null", "n_layer", "found null"},
    {"n_layer", "true", "n_layer", "found a boolean"},
    {"n_layer", "[6]", "n_layer", "found an array"},
    {"n_layer", "6.5", "n_layer", "not an integer"},
    {"n_layer", "-3", "n_layer", "outside"},
    {"n_layer", "0", "n_layer", "outside"},
    {"n_layer", "1e400", "n_layer", "out of range"},
    {"n_layer", "-1e400", "n_layer", "out of range"},
    {"n_layer", "9223372036854775808", "n_layer", "out of range"}, /* 2^63 */
    {"n_embd", "9007199254740993", "n_embd", "out of range"},      /* 2^53 + 1 */
    {"n_embd", "9007199254740992", "n_embd", "out of range"},      /* 2^53 */
    {"n_embd", "4294967424", "n_embd", "outside"},
    {"n_head", NULL, "n_head", "missing"},
    {"n_head", "3", "n_head", "not a multiple"},
    {"dtype", "\"fp8\"", "dtype", "\"fp8\", expected \"fp32\", \"bf16\" or \"fp16\""},
    {"dtype", "16", "dtype", "expected a string"},
    {"kind", "\"bert\"", "kind", "bert"},
    {"format", "\"ballast-model/2\"", "format", "ballast-model/1"},
    {"format", NULL, "format", "missing"},
    {"n_layers", "6", "n_layers", "unknown field"},
    {"n_head", "4, \"n_head\": 4", "n_head", "more than once"},
    /* every size representable: a huge vocabulary times a huge width */
    {"seq_len", "16777216", NULL, "too large"},
    {NULL, NULL, NULL, NULL},
};

static void test_model(void)
{
    failures = 0;
    check_not_json("bad-model.json", model_args, out_profile);
    run_changes(model_file, "bad-model.json", model_args, out_profile,
                model_changes);
    /* a name and a description are allowed */
    char args[4096];
    const char *f = mutate(model_file, "named-model.json", "description", "\"a test model\"");
    snprintf(args, sizeof args, model_args, f, out_profile);
    expect_ok(args);
}

/* ---- devices ---- */

static const char devices_args[] =
    "profile --model '%s' --estimate --device cpu --devices '%s' -o '%s'";

static void devices_run(const char *src, const char *name, const struct change *changes)
{
    char args[4096];
    const char *out = out_profile;
    for (const struct change *c = changes; c->path != NULL; c++) {
        const char *f = mutate(src, name, c->path, c->raw);
        snprintf(args, sizeof args, devices_args, model_file, f, out);
        expect_bad(args, out, f, c->field, c->says);
    }
}

static const struct change devices_changes[] = {
    {"devices[1].peak_tflops_16bit", "-5", "devices[1].peak_tflops_16bit", "outside"},
    {"devices[1].peak_tflops_16bit", "NaN", NULL, "not valid JSON"},
    {"devices[1].peak_tflops_fp16", "0", "devices[1].peak_tflops_fp16", "outside"},
    {"devices[1].peak_tflops_fp16", "\"125\"", "devices[1].peak_tflops_fp16", "expected a number"},
    {"devices[2].memory_bytes", "1.5", "devices[2].memory_bytes", "not an integer"},
    {"devices[2].memory_bytes", "1e400", "devices[2].memory_bytes", "out of range"},
    {"devices[3].kind", "\"tpu\"", "devices[3].kind", "tpu"},
    {"devices[3].name", "\"V100-32GB\"", "devices[3].name", "already names devices[0]"},
    {"devices[0].source", NULL, "devices[0].source", "missing"},
    {"devices[0].speed", "1", "devices[0].speed", "unknown field"},
    {"devices[0]", "7", "devices[0]", "expected an object"},
    {"devices", "{}", "devices", "expected an array"},
    {"assumptions", NULL, "assumptions", "missing"},
    {"assumptions.gemm_efficiency", "2", "assumptions.gemm_efficiency", "outside"},
    {NULL, NULL, NULL, NULL},
};

static void test_devices(void)
{
    char fmt[4096];
    failures = 0;
    /* the devices file is the first %s of check_not_json's format: fix the model in it */
    snprintf(fmt, sizeof fmt, "profile --model '%s' --estimate --device cpu --devices '%%s' -o "
                              "'%%s'",
             model_file);
    check_not_json("bad-devices.json", fmt, out_profile);
    devices_run(devices_file, "bad-devices.json", devices_changes);
}

/* ---- profile (read through a cluster whose stage 0 names it) ---- */

static const char plan_args[] = "plan --cluster '%s' --quiet -o '%s'";

static const char *cluster_with_profile(const char *profile_name)
{
    char text[4096];
    snprintf(text, sizeof text, cluster_text, profile_name);
    return test_write("cluster-p.json", text);
}

static const struct change profile_changes[] = {
    {"layers[3].fwd_ms", "-1", "layers[3].fwd_ms", "outside"},
    {"layers[3].fwd_ms", "\"fast\"", "layers[3].fwd_ms", "expected a number"},
    {"layers[3].fwd_ms", "1e400", "layers[3].fwd_ms", "outside"},
    {"layers[3].fwd_ms", "1e300", "layers[3].fwd_ms", "outside"},
    {"layers[3].bwd_ms", NULL, "layers[3].bwd_ms", "missing"},
    {"layers[2].ckpt_bytes", "99999999", "layers[2].ckpt_bytes", "more than act_bytes"},
    {"layers[2].act_bytes", "1.5", "layers[2].act_bytes", "not an integer"},
    {"layers[2].act_bytes", "-1", "layers[2].act_bytes", "outside"},
    {"layers[2].state_bytes", "9007199254740993", "layers[2].state_bytes", "out of range"},
    {"layers[2].workspace_bytes", "18446744073709551616", "layers[2].workspace_bytes",
     "out of range"},
    {"layers[1].name", "\"block.7\"", "layers[1].name", "expected \"block.0\""},
    {"layers[1]", NULL, "layers", "7 entries"},
    {"layers[1]", "[]", "layers[1]", "expected an object"},
    {"layers", NULL, "layers", "missing"},
    {"layers", "{}", "layers", "expected an array"},
    {"model.n_layer", "5", "layers", "8 entries"}, /* a different layer count than its layers */
    {"model.rope", "1", "model.rope", "unknown field"},
    {"estimated", "\"yes\"", "estimated", "expected true or false"},
    {"device.kind", "\"tpu\"", "device.kind", "tpu"},
    {"device.memory_bytes", "0", "device.memory_bytes", "outside"},
    {"device", NULL, "device", "missing"},
    {"format", "\"ballast-profile/9\"", "format", NULL},
    {"layers[0].fwd_ms", "1, \"fwd_ms\": 2", "layers[0].fwd_ms", "more than once"},
    /* recompute options (block.1's: attn, mlp, attn+mlp) */
    {"layers[2].recompute_options", "{}", "layers[2].recompute_options", "expected an array"},
    {"layers[2].recompute_options", "[1, 2, 3, 4, 5]", "layers[2].recompute_options",
     "5 options, at most 4"},
    {"layers[2].recompute_options[0]", "3", "layers[2].recompute_options[0]",
     "expected an object"},
    {"layers[2].recompute_options[0].name", NULL, "layers[2].recompute_options[0].name",
     "missing"},
    {"layers[2].recompute_options[0].name", "\"\"", "layers[2].recompute_options[0].name",
     "empty"},
    {"layers[2].recompute_options[0].name", "\"attention-and-mlp\"",
     "layers[2].recompute_options[0].name", "longer than 15"},
    {"layers[2].recompute_options[0].name", "\"full\"", "layers[2].recompute_options[0].name",
     "other than"},
    {"layers[2].recompute_options[0].name", "\"keep\"", "layers[2].recompute_options[0].name",
     "other than"},
    {"layers[2].recompute_options[2].name", "\"attn\"", "layers[2].recompute_options[2].name",
     "also option 0's name"},
    {"layers[2].recompute_options[1].kept_bytes", "0",
     "layers[2].recompute_options[1].kept_bytes", "expected ckpt_bytes"},
    {"layers[2].recompute_options[1].transient_bytes", "64",
     "layers[2].recompute_options[1].kept_bytes", "kept_bytes + transient_bytes = act_bytes"},
    {"layers[2].recompute_options[1].transient_bytes", "-64",
     "layers[2].recompute_options[1].transient_bytes", "outside"},
    {"layers[2].recompute_options[1].recompute_ms", "-1",
     "layers[2].recompute_options[1].recompute_ms", "outside"},
    {"layers[2].recompute_options[1].recompute_ms", NULL,
     "layers[2].recompute_options[1].recompute_ms", "missing"},
    /* the state's split: all three, summing to state_bytes */
    {"layers[2].param_bytes", "1", "layers[2]", "summing to state_bytes"},
    {"layers[2].optimizer_bytes", NULL, "layers[2]", "expected all three"},
    {"layers[2].grad_bytes", "-4", "layers[2].grad_bytes", "outside"},
    {"layers[2].optimizer_ms", "-1", "layers[2].optimizer_ms", "outside"},
    {"layers[2].host_optimizer_ms", "\"slow\"", "layers[2].host_optimizer_ms",
     "expected a number"},
    {NULL, NULL, NULL, NULL},
};

static void test_profile(void)
{
    char args[4096];
    const char *out = out_plan;
    failures = 0;
    char cf[1024], cf2[1024];
    copy_path(cf, cluster_with_profile("bad-profile.json"));
    snprintf(args, sizeof args, plan_args, cf, out);
    /* whole-file damage: the message names the cluster's field and the profile */
    for (int i = 0; not_json[i] != NULL; i++) {
        const char *f = test_write("bad-profile.json", not_json[i]);
        expect_bad2(args, out, cf, f, "stages[0].profile", "not valid JSON");
    }
    for (const struct change *c = profile_changes; c->path != NULL; c++) {
        const char *f = mutate(cpu_profile, "bad-profile.json", c->path, c->raw);
        expect_bad2(args, out, f, cf, c->field, c->says);
    }
    /* inconsistent with the cluster: made on another device, less memory than the stage
     * claims, a different model than the other stages' profiles */
    const char *f = mutate(cpu_profile, "bad-profile.json", "device.name", "\"cpu2\"");
    expect_bad(args, out, cf, "stages[0].profile", "made on device \"cpu2\"");
    f = mutate(cpu_profile, "bad-profile.json", "device.memory_bytes", "1000");
    expect_bad(args, out, cf, "stages[0].memory_bytes", "more than the 1000 bytes");
    /* stage 1's profile describes a model with another width than stage 0's */
    f = mutate(model_file, "model-wide.json", "n_embd", "256");
    char pargs[4096];
    snprintf(pargs, sizeof pargs, "profile --model '%s' --estimate --device cpu -o '%s'", f,
             test_path("bad-profile.json"));
    CU_ASSERT_EQUAL_FATAL(test_run(pargs, NULL, NULL), 0);
    char text[4096];
    snprintf(text, sizeof text, cluster_text, "prof-cpu.json");
    char *swap = strstr(text, "\"prof-cpu.json\", \"layers\": [3, 5]");
    CU_ASSERT_FATAL(swap != NULL);
    memmove(swap + 18, swap + 15, strlen(swap + 15) + 1);
    memcpy(swap, "\"bad-profile.json\"", 18);
    copy_path(cf2, test_write("cluster-p2.json", text));
    snprintf(args, sizeof args, plan_args, cf2, out);
    expect_bad(args, out, cf2, "stages[1].profile", "different model than stage 0's profile "
                                                    "(n_embd 256 vs 128)");
    /* a profile with a different layer count (n_layer 7): also a different model */
    f = mutate(model_file, "model-deep.json", "n_layer", "7");
    snprintf(pargs, sizeof pargs, "profile --model '%s' --estimate --device cpu -o '%s'", f,
             test_path("bad-profile.json"));
    CU_ASSERT_EQUAL_FATAL(test_run(pargs, NULL, NULL), 0);
    expect_bad(args, out, cf2, "stages[1].profile", "n_layer 7 vs 6");
    /* fields a later version adds are tolerated, at every level */
    snprintf(args, sizeof args, plan_args, cf, out);
    static const char *const extras[] = {"measured_on", "layers[3].flops", "device.uuid", NULL};
    for (int i = 0; extras[i] != NULL; i++) {
        mutate(cpu_profile, "bad-profile.json", extras[i], "\"later\"");
        expect_ok(args);
    }
}

/* ---- cluster ---- */

static const struct change cluster_changes[] = {
    {"stages[2].layers", "[3, 40]", "stages[2].layers: [3, 40] runs past the 8 layers", NULL},
    {"stages[0].layers", "[-1, 2]", "stages[0].layers: [-1, 2] runs past", NULL},
    {"stages[1].layers", "[2, 5]", "stages[1].layers: [2, 5] overlaps stages[0].layers", NULL},
    {"stages[1].layers", "[4, 5]", "stages[1].layers: [4, 5] leaves layers 3..3 in no stage",
     NULL},
    {"stages[1].layers", "[5, 3]", "stages[1].layers: [5, 3]", "first > last"},
    {"stages[2].layers", "[6, 6]", "stages[2].layers: ends at 6", NULL},
    {"stages[1].layers", "[3, 4, 5]", "stages[1].layers", "expected [first, last]"},
    {"stages[1].layers", "[3.5, 5]", "stages[1].layers[0]", "not an integer"},
    {"stages[1].layers", "[3, 1e400]", "stages[1].layers[1]", "out of range"},
    {"stages[1].layers", "\"3-5\"", "stages[1].layers", "expected an array"},
    {"stages[1].layers", NULL, "stages[1].layers", "for every stage or for none"},
    {"stages[1].memory_bytes", "25769803777", "stages[1].memory_bytes",
     "more than the 25769803776 bytes"},
    {"stages[1].memory_bytes", "-1", "stages[1].memory_bytes", "outside"},
    {"stages[1].memory_bytes", "9223372036854775807", "stages[1].memory_bytes", "out of range"},
    {"stages[1].memory_bytes", "268435456.5", "stages[1].memory_bytes", "not an integer"},
    {"stages[1].device", "\"T4\"", "stages[1].profile", "made on device \"cpu\""},
    {"stages[1].device", NULL, "stages[1].device", "missing"},
    {"stages[1].profile", "\"missing.json\"", "stages[1].profile", "cannot open"},
    {"stages[1].profile", "\".\"", "stages[1].profile", NULL},
    {"stages[1].profile", "3", "stages[1].profile", "expected a string"},
    {"stages[1].memory", "5", "stages[1].memory: unknown field", NULL},
    {"stages[1].link", "{\"gbps\": 0}", "stages[1].link.gbps", "outside"},
    {"stages[2].link", "{\"gbps\": 10}", "stages[2].link", "no next stage"},
    {"stages[1]", "5", "stages[1]", "expected an object"},
    {"stages", "{}", "stages", "expected an array"},
    {"stages", "[]", "stages", "0 stages"},
    {"stages", NULL, "stages", "missing"},
    {"reserve_bytes", "268435456", "reserve_bytes", "leaves nothing of stages[0]"},
    {"reserve_bytes", "-5", "reserve_bytes", "outside"},
    {"micro_batches", "0", "micro_batches", "outside"},
    {"micro_batches", "\"4\"", "micro_batches", "expected an integer"},
    {"micro_batches", "2.5", "micro_batches", "not an integer"},
    {"schedule", "\"zero-bubble\"", "schedule", "zero-bubble"},
    {"schedul", "\"1f1b\"", "schedul: unknown field", NULL},
    {"link", "{\"gbps\": 100, \"mtu\": 9000}", "link.mtu", "unknown field"},
    {"format", "\"ballast-plan/1\"", "format", "ballast-cluster/1"},
    {"micro_batches", "4, \"micro_batches\": 8", "micro_batches", "more than once"},
    {"stages[0].device", "\"cpu\", \"device\": \"T4\"", "stages[0].device", "more than once"},
    {NULL, NULL, NULL, NULL},
};

static void test_cluster(void)
{
    char args[4096], text[65536];
    const char *out = out_plan;
    failures = 0;
    check_not_json("bad-cluster.json", plan_args, out);
    run_changes(cluster_file, "bad-cluster.json", plan_args, out, cluster_changes);
    /* more stages than the model has layers (9 stages for 8 layers, even split) */
    int used = snprintf(text, sizeof text, "{\"format\": \"ballast-cluster/1\", \"schedule\": "
                                           "\"1f1b\", \"micro_batches\": 4, \"stages\": [");
    for (int s = 0; s < 9; s++)
        used += snprintf(text + used, sizeof text - (size_t)used,
                         "%s{\"device\": \"cpu\", \"memory_bytes\": 268435456, \"profile\": "
                         "\"prof-cpu.json\"}",
                         s ? ", " : "");
    snprintf(text + used, sizeof text - (size_t)used, "]}");
    const char *f = test_write("bad-cluster.json", text);
    snprintf(args, sizeof args, plan_args, f, out);
    expect_bad(args, out, f, "stages: 9 stages, but the model has only 8 layers", NULL);
    /* the same with 8 stages plans (one layer each) */
    f = mutate(f, "ok-cluster.json", "stages[8]", NULL);
    snprintf(args, sizeof args, plan_args, f, out);
    expect_ok(args);
    /* 300000 distinct keys in one object: found unknown, in time (duplicate keys are looked
     * for in every object first) */
    size_t cap = 300000 * 16 + 64, n = 0;
    char *big = malloc(cap);
    n += (size_t)snprintf(big, cap, "{\"format\": \"ballast-cluster/1\"");
    for (int k = 0; k < 300000; k++)
        n += (size_t)snprintf(big + n, cap - n, ", \"k%d\": 0", k);
    snprintf(big + n, cap - n, "}");
    f = test_write("bad-cluster.json", big);
    free(big);
    snprintf(args, sizeof args, plan_args, f, out);
    expect_bad(args, out, f, "k0: unknown field", NULL);
}

/* ---- plan (plan_load) ---- */

static void expect_plan_bad(const char *file, const char *field, const char *says)
{
    struct plan p;
    struct err e;
    err_clear(&e);
    int rc = plan_load(file, &p, &e);
    int ok = rc == ERR_INPUT && strstr(e.msg, file) != NULL &&
             (field == NULL || strstr(e.msg, field) != NULL) &&
             (says == NULL || strstr(e.msg, says) != NULL);
    CU_ASSERT_EQUAL(rc, ERR_INPUT);
    CU_ASSERT(ok);
    if (!ok && failures++ < 20)
        fprintf(stderr, "\nplan_load: %d, expected 2 naming %s / %s; message:\n%s\n", rc,
                field ? field : "-", says ? says : "-", e.msg);
    if (rc == ERR_OK)
        plan_free(&p);
}

static const struct change plan_changes[] = {
    {"stages[1].recompute", "[99]", "stages[1].recompute[0]", "outside"},
    {"stages[1].recompute", "[3, 3]", "stages[1].recompute[1]", "listed twice"},
    {"stages[1].recompute", "[\"3\"]", "stages[1].recompute[0]", "expected an integer"},
    {"stages[0].layers", "[0, 99]", "stages[0].layers[1]", "outside"},
    {"stages[1].layers", "[4, 5]", "stages[1].layers", "expected a range starting at layer 3"},
    {"stages[1].layers", "[3, 2]", "stages[1].layers", "expected a range starting"},
    {"stages[2].layers", "[6, 6]", "stages[2].layer_costs", "2 entries for the stage's 1"},
    {"stages[2]", NULL, "stages[0].in_flight", "outside [2, 2]"}, /* 2 stages now */
    {"stages[0].memory_bytes", "1", "stages[0].memory_bytes", "the cost model gives"},
    {"stages[0].memory_bytes", "1.5", "stages[0].memory_bytes", "not an integer"},
    {"stages[0].stage_ms", "0.5", "stages[0]", "stage_ms 0.5"},
    {"stages[0].recompute_ms", "-1", "stages[0].recompute_ms", "outside"},
    {"stages[0].memory_limit_bytes", "1000", "stages[0].memory_bytes", "above memory_limit_bytes"},
    {"stages[0].memory_limit_bytes", "-1", "stages[0].memory_limit_bytes", "outside"},
    {"stages[0].capacity_bytes", "1000", "stages[0].memory_limit_bytes", "above capacity"},
    {"stages[0].in_flight", "1", "stages[0].in_flight", "outside"},
    {"stages[0].index", "1", "stages[0].index", "outside"},
    /* a plan from before device_kind: refused, not guessed from the device's name */
    {"stages[1].device_kind", NULL, "stages[1].device_kind", "re-plan"},
    {"stages[0].device_kind", "\"gpu\"", "stages[0].device_kind", "expected \"cpu\" or"},
    {"stages[0].layer_costs[1].name", "\"head\"", "stages[0].layer_costs[1].name", "block.0"},
    {"stages[0].layer_costs[1].act_bytes", "1", "stages[0].layer_costs[1].ckpt_bytes",
     "more than act_bytes"},
    {"stages[0].link", "{\"gbps\": -1}", "stages[0].link.gbps", "outside"},
    {"stages", "[]", "stages", "0 stages"},
    {"iteration_ms", NULL, "iteration_ms", "missing"},
    {"iteration_ms", "NaN", NULL, "not valid JSON"},
    {"bottleneck_stage", "3", "bottleneck_stage", "outside"},
    {"schedule", "\"zigzag\"", "schedule", "zigzag"},
    {"virtual_stages", "2", "stages", "not a multiple of virtual_stages 2"}, /* 3 stages */
    {"micro_batches", "2", "stages[0].in_flight", "outside [2, 2]"}, /* 3 with 4 */
    {"model.n_layer", "7", "stages[2].layer_costs[1].name", "expected \"block.6\""},
    {"model", NULL, "model", "missing"},
    {"verify", "{\"agree\": \"yes\", \"milp_objective\": 1, \"dp_objective\": 1}", "verify.agree",
     NULL},
    {"format", "\"ballast-profile/1\"", "format", "ballast-plan/1"},
    /* recompute options: stage 1 holds layers 3-5 (block.2 to block.4), each with attn, mlp
     * and attn+mlp; stage 2 the head, which has none */
    {"stages[1].recompute_options", "{}", "stages[1].recompute_options", "expected an array"},
    {"stages[1].recompute_options", "[7]", "stages[1].recompute_options[0]",
     "expected an object"},
    {"stages[1].recompute_options", "[{\"layer\": 4}]", "stages[1].recompute_options[0].option",
     "missing"},
    {"stages[1].recompute_options", "[{\"layer\": 6, \"option\": \"attn\"}]",
     "stages[1].recompute_options[0].layer", "outside [3, 5]"},
    {"stages[1].recompute_options", "[{\"layer\": 4, \"option\": \"gelu\"}]",
     "stages[1].recompute_options[0].option",
     "\"gelu\" is not a recompute option of layer 4 (block.3), whose layer costs list attn, "
     "mlp, attn+mlp"},
    {"stages[1].recompute_options", "[{\"layer\": 4, \"option\": \"full\"}]",
     "stages[1].recompute_options[0].option", "not a recompute option"},
    {"stages[2].recompute_options", "[{\"layer\": 7, \"option\": \"attn\"}]",
     "stages[2].recompute_options[0].option", "list none"},
    {"stages[1].recompute_options",
     "[{\"layer\": 4, \"option\": \"attn\"}, {\"layer\": 4, \"option\": \"mlp\"}]",
     "stages[1].recompute_options[1].layer", "already has a recompute choice"},
    /* a consistent choice, but not the one the stated memory is for */
    {"stages[1].recompute_options", "[{\"layer\": 4, \"option\": \"mlp\"}]",
     "stages[1].memory_bytes", "the cost model gives"},
    /* the optimizer on the host: other memory than the stated one, and a plan for it needs the
     * stage's host memory */
    {"stages[0].optimizer", "\"host\"", "stages[0].memory_bytes", "the cost model gives"},
    {"stages[0].optimizer", "\"cpu\"", "stages[0].optimizer", "expected \"device\" or"},
    {NULL, NULL, NULL, NULL},
};

static void test_plan(void)
{
    failures = 0;
    static const char *const raw[] = {"", "{", "{\"a\": Infinity}", "[1, 2]", "{}", NULL};
    for (int i = 0; raw[i] != NULL; i++)
        expect_plan_bad(test_write("bad-plan.json", raw[i]), NULL, NULL);
    expect_plan_bad(test_path("no-such-plan.json"), NULL, "cannot open");
    for (const struct change *c = plan_changes; c->path != NULL; c++)
        expect_plan_bad(mutate(plan_file, "bad-plan.json", c->path, c->raw), c->field, c->says);
    /* a host optimizer over a layer whose state is not split */
    const char *nosplit = mutate(plan_file, "nosplit-plan.json", "stages[0].optimizer", "\"host\"");
    nosplit = mutate(nosplit, "nosplit2-plan.json", "stages[0].layer_costs[1].param_bytes", NULL);
    nosplit = mutate(nosplit, "nosplit3-plan.json", "stages[0].layer_costs[1].grad_bytes", NULL);
    expect_plan_bad(mutate(nosplit, "bad-plan.json", "stages[0].layer_costs[1].optimizer_bytes",
                           NULL),
                    "stages[0].optimizer", "layer 1 (block.0) has no param_bytes");
    /* a layer both recomputed whole and with an option */
    const char *both = mutate(plan_file, "both-plan.json", "stages[1].recompute", "[4]");
    expect_plan_bad(mutate(both, "bad-plan.json", "stages[1].recompute_options",
                           "[{\"layer\": 4, \"option\": \"attn\"}]"),
                    "stages[1].recompute_options[0].layer", "already has a recompute choice");
    /* the valid plan loads, and fields a later version adds are tolerated at every level */
    static const char *const extras[] = {"", "planner_version", "stages[1].notes",
                                         "stages[0].layer_costs[0].flops", "stages[0].link.kind",
                                         NULL};
    for (int i = 0; extras[i] != NULL; i++) {
        const char *f = extras[i][0] ? mutate(plan_file, "later-plan.json", extras[i], "\"x\"")
                                     : plan_file;
        struct plan p;
        struct err e;
        err_clear(&e);
        CU_ASSERT_EQUAL(plan_load(f, &p, &e), ERR_OK);
        if (e.code != ERR_OK)
            fprintf(stderr, "\n%s\n", e.msg);
        else
            plan_free(&p);
    }
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("parsers against hostile files", init, NULL);
    CU_add_test(s, "model", test_model);
    CU_add_test(s, "devices", test_devices);
    CU_add_test(s, "profile", test_profile);
    CU_add_test(s, "cluster", test_cluster);
    CU_add_test(s, "plan", test_plan);
    return test_main();
}
