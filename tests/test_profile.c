/* Measured profiles (`ballast profile --device cpu`): every layer, positive times, memory equal
 * to the size functions (the reference, models/sizes.c: the scans do not use its numbers, they
 * count what the layers wrote), the recompute options measured and timed too, the provenance;
 * the scans catch a layer that writes past its arena, leaves a kept tensor unwritten or
 * recomputes nothing (the CPU backend's layers with one fault put in); option errors; and the
 * planner refusing a measured profile put into the wrong cluster. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "measure.h"
#include "profile.h"
#include "sizes.h"
#include "testutil.h"

/* Tensors of 40 bytes (B*T floats) and 20-byte rows: the 64-byte carving is exercised. */
static const char tiny_text[] =
    "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", \"n_layer\": 2, \"n_embd\": 8, "
    "\"n_head\": 2, \"seq_len\": 5, \"vocab_size\": 11, \"micro_batch\": 2, \"dtype\": "
    "\"fp32\"}";
static const struct model tiny = {.n_layer = 2, .n_embd = 8, .n_head = 2, .seq_len = 5,
                                  .vocab_size = 11, .micro_batch = 2,
                                  .dtype = MODEL_DTYPE_FP32};

static int run(const char *args, int status, const char *in_stderr)
{
    char *err = NULL;
    int rc = test_run(args, NULL, &err);
    int ok = rc == status && (in_stderr == NULL || (err && strstr(err, in_stderr)));
    CU_ASSERT(ok);
    if (!ok)
        fprintf(stderr, "\nballast %s: exit %d (expected %d)\nstderr: %s\n", args, rc, status,
                err ? err : "");
    free(err);
    return ok;
}

static const char *str_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static double num_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* Profiles `model_file` with 3 repeats on one thread and checks the file. */
static void check_measured(const char *model_file, const char *out)
{
    char args[4096];
    snprintf(args, sizeof args,
             "profile --model '%s' --device cpu --repeats 3 --threads 1 -o '%s'", model_file, out);
    char *err = NULL;
    int rc = test_run(args, NULL, &err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    /* no byte count differs from the size functions, so nothing is reported */
    CU_ASSERT(err != NULL && strstr(err, "differ") == NULL && strstr(err, "measured") == NULL);
    free(err);
    struct profile p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(profile_load(out, &p, &e), ERR_OK); /* every layer, in order, named */
    CU_ASSERT_EQUAL(p.estimated, 0);
    CU_ASSERT_STRING_EQUAL(p.device.kind, "cpu");
    CU_ASSERT(p.device.memory_bytes > 0);
    CU_ASSERT(p.device.name[0] != '\0');
    CU_ASSERT_EQUAL(p.n_layers, p.model.n_layer + 2);
    for (int l = 0; l < p.n_layers; l++) {
        const struct layer_cost *c = &p.layers[l];
        struct layer_sizes s;
        sizes_layer(&p.model, l, &s);
        CU_ASSERT(c->fwd_ms > 0 && c->bwd_ms > 0);
        CU_ASSERT_EQUAL(c->state_bytes, s.state_bytes);
        /* the state's split as the AdamW step touches it, and that step timed on the
         * backend and on host threads */
        CU_ASSERT(c->has_split && c->param_bytes == s.param_bytes &&
                  c->grad_bytes == s.grad_bytes && c->optimizer_bytes == s.optimizer_bytes);
        CU_ASSERT(c->optimizer_ms > 0 && c->host_optimizer_ms > 0);
        CU_ASSERT_EQUAL(c->act_bytes, s.act_bytes);
        CU_ASSERT_EQUAL(c->ckpt_bytes, s.ckpt_bytes);
        CU_ASSERT_EQUAL(c->out_bytes, s.out_bytes);
        CU_ASSERT_EQUAL(c->workspace_bytes, s.workspace_bytes);
        /* the recompute options: every one the runtime has, its bytes, a positive time */
        struct sizes_option opt[SIZES_OPTIONS_MAX];
        enum model_layer_kind kind = model_layer_kind(&p.model, l);
        CU_ASSERT_EQUAL(c->n_options, sizes_recompute_options(&p.model, kind, opt));
        for (int j = 0; j < c->n_options; j++) {
            int64_t kept, transient;
            sizes_regen_bytes(&p.model, kind, opt[j].regen, &kept, &transient);
            CU_ASSERT_STRING_EQUAL(c->options[j].name, opt[j].name);
            CU_ASSERT_EQUAL(c->options[j].kept_bytes, kept);
            CU_ASSERT_EQUAL(c->options[j].transient_bytes, transient);
            CU_ASSERT(c->options[j].recompute_ms > 0);
        }
    }
    /* provenance: the device, host, date, threads, library versions, how it was measured */
    const cJSON *pv = p.provenance;
    CU_ASSERT_FATAL(pv != NULL);
    CU_ASSERT(str_of(pv, "device") != NULL && strcmp(str_of(pv, "device"), p.device.name) == 0);
    CU_ASSERT(str_of(pv, "host") != NULL && str_of(pv, "host")[0] != '\0');
    const char *date = str_of(pv, "date");
    CU_ASSERT(date != NULL && strlen(date) == 20 && date[4] == '-' && date[10] == 'T' &&
              date[19] == 'Z');
    CU_ASSERT_EQUAL(num_of(pv, "threads"), 1);
    const cJSON *lib = cJSON_GetObjectItemCaseSensitive(pv, "libraries");
    CU_ASSERT(str_of(lib, "openblas") != NULL &&
              strncmp(str_of(lib, "openblas"), "OpenBLAS", 8) == 0);
    CU_ASSERT(str_of(lib, "mpi") != NULL && str_of(lib, "mpi")[0] != '\0');
    CU_ASSERT(str_of(lib, "cjson") != NULL && strcmp(str_of(lib, "cjson"), cJSON_Version()) == 0);
    const cJSON *meas = cJSON_GetObjectItemCaseSensitive(pv, "measurement");
    CU_ASSERT_EQUAL(num_of(meas, "repeats"), 3);
    CU_ASSERT(num_of(meas, "warmup") >= 1);
    CU_ASSERT(str_of(meas, "statistic") != NULL &&
              strcmp(str_of(meas, "statistic"), "median") == 0);
    CU_ASSERT(str_of(meas, "timer") != NULL);
    CU_ASSERT_EQUAL(num_of(meas, "size_function_mismatches"), 0);
    profile_free(&p);
}

static void test_measured_tiny(void)
{
    char model[1024], out[1024];
    snprintf(model, sizeof model, "%s", test_write("tiny.json", tiny_text));
    snprintf(out, sizeof out, "%s", test_path("tiny-prof.json"));
    check_measured(model, out);
}

static void test_measured_gpt_tiny(void)
{
    char out[1024];
    snprintf(out, sizeof out, "%s", test_path("gpt-tiny-prof.json"));
    check_measured(BALLAST_SOURCE_DIR "/configs/models/gpt-tiny.json", out);
}

/* ---- the scans catch faults: the CPU backend with one layer function replaced ---- */

static const struct backend_ops *cpu_ops;
static float stray[64];

/* Writes one float past the block's workspace, into the next line. */
static int forward_past_end(struct backend *be, const struct layer_view *l, void *out,
                            struct err *e)
{
    struct sizes_tensor t[SIZES_TENSORS_MAX];
    sizes_layer_tensors(l->model, MODEL_LAYER_BLOCK, SIZES_WORKSPACE, t);
    int rc = cpu_ops->layer[MODEL_LAYER_BLOCK].forward(be, l, out, e);
    *(float *)((char *)l->ws[BLOCK_DATT] + sizes_tensor_bytes(&t[BLOCK_DATT])) = 1.0f;
    return rc;
}

/* Keeps ln1's mean somewhere else: its place in the slot stays unwritten. */
static int forward_drops_mean(struct backend *be, const struct layer_view *l, void *out,
                              struct err *e)
{
    struct layer_view v = *l;
    v.kept[BLOCK_LN1_MEAN] = stray;
    return cpu_ops->layer[MODEL_LAYER_BLOCK].forward(be, &v, out, e);
}

static int recompute_nothing(struct backend *be, const struct layer_view *l, struct err *e)
{
    return ERR_OK;
}

enum fault { FAULT_PAST_END, FAULT_DROPS_MEAN, FAULT_NO_RECOMPUTE };

/* Measures the tiny model with the fault; returns the mismatches and the report text. */
static int measure_with(enum fault f, struct profile *p, char **report)
{
    static struct backend_ops ops;
    struct backend be;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(backend_cpu_init(&be, 1, &e), ERR_OK);
    cpu_ops = be.ops;
    ops = *be.ops;
    if (f == FAULT_PAST_END)
        ops.layer[MODEL_LAYER_BLOCK].forward = forward_past_end;
    else if (f == FAULT_DROPS_MEAN)
        ops.layer[MODEL_LAYER_BLOCK].forward = forward_drops_mean;
    else
        ops.layer[MODEL_LAYER_BLOCK].recompute = recompute_nothing;
    be.ops = &ops;
    size_t len = 0;
    FILE *rep = open_memstream(report, &len);
    struct measure_options o = {1, 0, (int64_t)1 << 30, NULL, rep, NULL};
    int mismatches = 0;
    memset(p, 0, sizeof *p);
    CU_ASSERT_EQUAL(measure_profile(&be, &tiny, &o, p, &mismatches, &e), ERR_OK);
    fclose(rep);
    be.ops->free(&be);
    return mismatches;
}

static void test_scans_catch_faults(void)
{
    struct profile p;
    char *report = NULL;
    struct layer_sizes s;
    sizes_layer(&tiny, 1, &s);
    /* every block writes one float past its workspace: one line more */
    int n = measure_with(FAULT_PAST_END, &p, &report);
    /* the blocks share one shape: the first block's scan, reported once, serves them all */
    CU_ASSERT_EQUAL(n, 2); /* the stray float counts as output too */
    CU_ASSERT_EQUAL(p.layers[tiny.n_layer].workspace_bytes, s.workspace_bytes + SIZES_ALIGN);
    CU_ASSERT_STRING_EQUAL(p.layers[tiny.n_layer].name, "block.1");
    CU_ASSERT_EQUAL(p.layers[1].workspace_bytes, s.workspace_bytes + SIZES_ALIGN);
    CU_ASSERT_EQUAL(p.layers[1].out_bytes, s.out_bytes + 4);
    CU_ASSERT_EQUAL(p.layers[1].act_bytes, s.act_bytes);
    CU_ASSERT_PTR_NOT_NULL(strstr(report, "block.0: workspace_bytes: measured"));
    profile_free(&p);
    free(report);
    /* ln1's mean (B*T = 10 floats, one line) never reaches the slot; the recompute, which does
     * write it, then disagrees with the forward */
    n = measure_with(FAULT_DROPS_MEAN, &p, &report);
    /* per block: act_bytes, the whole recompute, and each option's kept_bytes */
    CU_ASSERT_EQUAL(n, 5);
    CU_ASSERT_EQUAL(p.layers[2].act_bytes, s.act_bytes - SIZES_ALIGN);
    CU_ASSERT_EQUAL(p.layers[2].ckpt_bytes, s.ckpt_bytes);
    CU_ASSERT_PTR_NOT_NULL(strstr(report, "block.0: act_bytes: measured"));
    CU_ASSERT_PTR_NOT_NULL(strstr(report, "block.0: recomputed whole: the recompute regenerates"));
    CU_ASSERT_PTR_NOT_NULL(strstr(report, "block.0: option attn: kept_bytes: measured"));
    CU_ASSERT_PTR_NULL(strstr(report, "block.1:"));
    profile_free(&p);
    free(report);
    /* a recompute that regenerates nothing */
    n = measure_with(FAULT_NO_RECOMPUTE, &p, &report);
    /* per block: the whole recompute, and each of 3 options' transient_bytes and bits */
    CU_ASSERT_EQUAL(n, 7);
    CU_ASSERT_EQUAL(p.layers[1].act_bytes, s.act_bytes);
    CU_ASSERT_PTR_NOT_NULL(
        strstr(report, "block.0: recomputed whole: the recompute regenerates 0 bytes"));
    CU_ASSERT_PTR_NOT_NULL(strstr(report, "block.0: option mlp: transient_bytes: measured 0"));
    profile_free(&p);
    free(report);
}

/* ---- options ---- */

/* test_path's buffers rotate (test_run takes two per run): keep copies. */
static const char *keep(char buf[1024], const char *path)
{
    snprintf(buf, 1024, "%s", path);
    return buf;
}

static void test_options(void)
{
    char model_buf[1024], out_buf[1024], bf16_buf[1024];
    const char *model = keep(model_buf, test_write("tiny.json", tiny_text));
    const char *out = keep(out_buf, test_path("never.json"));
    static const struct {
        const char *args, *says;
    } bad[] = {
        {"--device cpu --repeats 0", "--repeats: \"0\""},
        {"--device cpu --repeats -2", "--repeats: \"-2\""},
        {"--device cpu --repeats 2.5", "--repeats: \"2.5\""},
        {"--device cpu --repeats many", "--repeats: \"many\""},
        {"--device cpu --repeats 1000001", "from 1 to 1000000"},
        {"--device cpu --threads 0", "--threads: \"0\""},
        {"--device cpu --threads -1", "--threads: \"-1\""},
        {"--device cpu --threads 4097", "from 1 to 4096"},
        {"--device cpu --threads two", "--threads: \"two\""},
        {"--device cpu --name ''", "--name"},
        {"--device cpu --repeats=", "--repeats: \"\""},
        {"--device gpu", "expected \"cpu\" or \"cuda:N\""},
        {"--device cuda:", "\"cuda:\""},
        {"--device cuda:-1", "\"cuda:-1\""},
        {"--device cuda:1x", "\"cuda:1x\""},
        {"--device cuda:0 --threads 2", "--threads is for --device cpu"},
        {"--estimate --device cpu --repeats 3", "for measuring"},
        {"--device cpu --devices x.json", "device table of --estimate"},
        {"--repeats 3", "--model and --device are required"},
#if !BALLAST_WITH_CUDA
        {"--device cuda:0", "built without the CUDA backend"},
#endif
    };
    char args[4096];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        remove(out);
        snprintf(args, sizeof args, "profile --model '%s' %s -o '%s'", model, bad[i].args, out);
        run(args, 2, bad[i].says);
        CU_ASSERT(access(out, F_OK) != 0);
    }
    /* 16-bit models: the CPU computes them (fp32 copies, 16-bit arenas), and the bytes their
     * layers touch are the size functions' */
    static const char *const half[] = {"bf16", "fp16"};
    for (int d = 0; d < 2; d++) {
        char text[sizeof tiny_text], *err = NULL, file[32];
        snprintf(text, sizeof text, "%s", tiny_text);
        memcpy(strstr(text, "fp32"), half[d], 4);
        snprintf(file, sizeof file, "tiny-%s.json", half[d]);
        snprintf(args, sizeof args, "profile --model '%s' --device cpu --repeats 1 -o '%s'",
                 keep(bf16_buf, test_write(file, text)), out);
        CU_ASSERT_EQUAL(test_run(args, NULL, &err), 0);
        CU_ASSERT(err != NULL && strstr(err, "differ") == NULL);
        if (err != NULL && strstr(err, "differ") != NULL)
            fprintf(stderr, "\n%s: %s\n", half[d], err);
        free(err);
        CU_ASSERT(access(out, F_OK) == 0);
        remove(out);
    }
    /* --name names the device */
    snprintf(args, sizeof args,
             "profile --model '%s' --device cpu --repeats 1 --threads 1 --name 'lab box' -o '%s'",
             model, out);
    run(args, 0, NULL);
    struct profile p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(profile_load(out, &p, &e), ERR_OK);
    CU_ASSERT_STRING_EQUAL(p.device.name, "lab box");
    profile_free(&p);
}

/* ---- measured profiles in clusters ---- */

static const char *cluster(const char *name, const char *dev0, const char *prof0,
                           const char *dev1, const char *prof1)
{
    char text[4096];
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 2,\n"
             " \"stages\": [{\"device\": \"%s\", \"memory_bytes\": 1073741824, \"profile\": "
             "\"%s\"},\n"
             "            {\"device\": \"%s\", \"memory_bytes\": 1073741824, \"profile\": "
             "\"%s\"}]}\n",
             dev0, prof0, dev1, prof1);
    return test_write(name, text);
}

/* The host link measured through the CPU backend's copy lanes with an emulated link (the
 * reference): its bandwidth and latency come back; without one, memcpy's, positive. */
static void test_host_link(void)
{
    struct backend be;
    struct err e;
    double gbps = 0, lat = -1;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(backend_cpu_init(&be, 1, &e), ERR_OK);
    CU_ASSERT_EQUAL(measure_host_link(&be, 1 << 20, 3, &gbps, &lat, &e), ERR_OK);
    CU_ASSERT(gbps > 0 && gbps < 1e6 && lat >= 0);
    be.host_link_gbps = 2;
    be.host_link_latency_us = 500;
    int64_t bytes = 16 << 20;
    CU_ASSERT_EQUAL(measure_host_link(&be, bytes, 5, &gbps, &lat, &e), ERR_OK);
    /* a copy lasts at least the link's time; a loaded host's scheduling adds to it */
    double want_ms = 0.5 + (double)bytes * 8 / 2e6, got_ms = lat * 1e-3 + (double)bytes * 8 /
                                                                            (gbps * 1e6);
    printf(" (emulated 2 Gbit/s, 500 us: measured %.3f Gbit/s, %.0f us; %lld bytes in %.2f ms, "
           "link %.2f ms)", gbps, lat, (long long)bytes, got_ms, want_ms);
    CU_ASSERT(lat >= 500);
    CU_ASSERT(got_ms >= want_ms * 0.999 && got_ms < want_ms + 15);
    CU_ASSERT(gbps > 1.6 && gbps < 2.4);
    be.ops->free(&be);
}

static void test_clusters(void)
{
    char args[4096], deep_text[sizeof tiny_text], model_buf[1024], deep_buf[1024], prof[1024];
    char plan_buf[1024];
    const char *model = keep(model_buf, test_write("tiny.json", tiny_text));
    snprintf(deep_text, sizeof deep_text, "%s", tiny_text);
    memcpy(strstr(deep_text, "\"n_layer\": 2"), "\"n_layer\": 3", 12);
    const char *deep = keep(deep_buf, test_write("tiny-deep.json", deep_text));
    static const struct {
        const char *model_name, *name, *file, *extra;
    } profiles[] = {
        {"tiny", "box", "m-box.json", "--repeats 1"},
        {"tiny", "box", "m-box-again.json", "--repeats 2"},
        {"deep", "box3", "m-deep.json", "--repeats 1"},
    };
    for (size_t i = 0; i < sizeof profiles / sizeof profiles[0]; i++) {
        snprintf(args, sizeof args,
                 "profile --model '%s' --device cpu --threads 1 --name %s %s -o '%s'",
                 strcmp(profiles[i].model_name, "tiny") == 0 ? model : deep, profiles[i].name,
                 profiles[i].extra, keep(prof, test_path(profiles[i].file)));
        CU_ASSERT_FATAL(run(args, 0, NULL));
    }
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu -o '%s'", model,
             keep(prof, test_path("e-cpu.json")));
    CU_ASSERT_FATAL(run(args, 0, NULL));
    const char *plan = keep(plan_buf, test_path("plan.json"));
    static const struct {
        const char *dev0, *prof0, *dev1, *prof1;
        int status;
        const char *says;
    } cases[] = {
        /* a measured and an estimated device side by side */
        {"box", "m-box.json", "cpu", "e-cpu.json", 0, NULL},
        /* the stage says another device than the profile was measured on */
        {"cpu", "m-box.json", "cpu", "e-cpu.json", 2,
         "stages[0].profile: \"m-box.json\" was made on device \"box\", but the stage's device "
         "is \"cpu\""},
        /* a profile of another model */
        {"box", "m-box.json", "box3", "m-deep.json", 2,
         "stages[1].profile: \"m-deep.json\" describes a different model than stage 0's profile "
         "(n_layer 3 vs 2)"},
        /* two profiles of one device */
        {"box", "m-box.json", "box", "m-box-again.json", 2,
         "stages[1].profile: \"m-box-again.json\" is a second profile of device \"box\" that "
         "disagrees with stages[0]'s"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cf[1024];
        keep(cf, cluster("c.json", cases[i].dev0, cases[i].prof0, cases[i].dev1,
                         cases[i].prof1));
        remove(plan);
        snprintf(args, sizeof args, "plan --cluster '%s' --quiet -o '%s'", cf, plan);
        run(args, cases[i].status, cases[i].says);
        CU_ASSERT_EQUAL(access(plan, F_OK) == 0, cases[i].status == 0);
    }
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("measured profiles", NULL, NULL);
    CU_add_test(s, "tiny model: every layer, times, memory, provenance", test_measured_tiny);
    CU_add_test(s, "gpt-tiny: every layer, times, memory, provenance", test_measured_gpt_tiny);
    CU_add_test(s, "the scans catch faulty layers", test_scans_catch_faults);
    CU_add_test(s, "option errors", test_options);
    CU_add_test(s, "measured profiles in clusters", test_clusters);
    CU_add_test(s, "the host link, against an emulated one", test_host_link);
    return test_main();
}
