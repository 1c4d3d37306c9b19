/* Human units (common/units.h): sizes, rates and latencies parsed against values computed by
 * hand; malformed ones refused with the reason; a cluster, a profile and a device table written
 * with units load to exactly what the same files with plain numbers load to; a malformed unit
 * in a file is refused by the command line with the file and the field; --unit and the other
 * options with units plan as their plain numbers do. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "devices.h"
#include "testutil.h"
#include "units.h"

#define KiB ((int64_t)1 << 10)
#define MiB ((int64_t)1 << 20)
#define GiB ((int64_t)1 << 30)
#define TiB ((int64_t)1 << 40)

static void test_sizes(void)
{
    static const struct {
        const char *text;
        int64_t bytes;
    } good[] = {
        {"40GiB", 40 * GiB},         {"32GB", 32000000000},       {"1.5 TiB", 3 * TiB / 2},
        {"0.5KiB", 512},             {"4096", 4096},              {"4096B", 4096},
        {"512M", 512 * MiB},         {"1G", GiB},                 {"2K", 2048},
        {"1.25kB", 1250},            {"1.25KB", 1250},            {"7PB", 7000000000000000},
        {"0", 0},                    {"42505273344", 42505273344}, {"1.000GiB", GiB},
        {"0.001MB", 1000},           {"3MiB", 3 * MiB},           {"2TB", 2000000000000},
    };
    for (size_t k = 0; k < sizeof good / sizeof good[0]; k++) {
        int64_t v = -1;
        char why[UNITS_WHY_MAX] = "";
        int rc = units_parse_bytes(good[k].text, &v, why);
        CU_ASSERT(rc == 0 && v == good[k].bytes);
        if (rc != 0 || v != good[k].bytes)
            fprintf(stderr, "\n\"%s\": %d, %lld (%s), expected %lld\n", good[k].text, rc,
                    (long long)v, why, (long long)good[k].bytes);
    }
    static const struct {
        const char *text, *why;
    } bad[] = {
        {"40gib", "unknown unit \"gib\""}, {"32Gb", "counts bits"},
        {"0.3B", "whole number of bytes"}, {"-1GiB", "not a size"},
        {"GiB", "not a size"},             {"1e9", "unknown unit \"e9\""},
        {"1..5GB", "not a size"},          {"9PiB", "too large"},
        {"", "not a size"},                {"5.", "not a size"},
        {"40 GiBs", "unknown unit \"GiBs\""}, {"1234567890123456789", "not a size"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int64_t v = 12345;
        char why[UNITS_WHY_MAX] = "";
        int rc = units_parse_bytes(bad[k].text, &v, why);
        CU_ASSERT(rc == -1 && v == 12345 && strstr(why, bad[k].why) != NULL);
        if (rc != -1 || strstr(why, bad[k].why) == NULL)
            fprintf(stderr, "\n\"%s\": %d, \"%s\", expected \"%s\"\n", bad[k].text, rc, why,
                    bad[k].why);
    }
}

static void test_rates_and_times(void)
{
    static const struct {
        const char *text;
        double bps;
    } rates[] = {
        {"100Gbps", 100e9}, {"100 Gb/s", 100e9}, {"400Gbit/s", 400e9}, {"800Mbps", 800e6},
        {"1.6Tbps", 1.6e12}, {"50GB/s", 400e9},  {"50GBps", 400e9},    {"1GiB/s", 8.0 * GiB},
        {"25", 25e9},       {"2.5kbps", 2500},   {"300 GB/s", 2400e9},
    };
    for (size_t k = 0; k < sizeof rates / sizeof rates[0]; k++) {
        double v = -1;
        char why[UNITS_WHY_MAX] = "";
        int rc = units_parse_rate(rates[k].text, 1e9, &v, why);
        CU_ASSERT(rc == 0 && test_close(v, rates[k].bps, 0, 1e-15));
        if (rc != 0 || !test_close(v, rates[k].bps, 0, 1e-15))
            fprintf(stderr, "\n\"%s\": %d, %g (%s)\n", rates[k].text, rc, v, why);
    }
    static const char *const bad_rates[] = {"100Gibps", "100 gbps", "fast", "100G", "-5Gbps",
                                            "100Gbps!", NULL};
    for (int k = 0; bad_rates[k] != NULL; k++) {
        double v = 0;
        char why[UNITS_WHY_MAX] = "";
        CU_ASSERT(units_parse_rate(bad_rates[k], 1e9, &v, why) == -1 &&
                  strstr(why, "not a rate") != NULL);
    }
    static const struct {
        const char *text;
        double us;
    } times[] = {{"3us", 3}, {"3\xc2\xb5s", 3}, {"500ns", 0.5}, {"0.5ms", 500}, {"2s", 2e6},
                 {"3", 3}};
    for (size_t k = 0; k < sizeof times / sizeof times[0]; k++) {
        double v = -1;
        char why[UNITS_WHY_MAX] = "";
        CU_ASSERT(units_parse_us(times[k].text, &v, why) == 0 &&
                  test_close(v, times[k].us, 0, 1e-15));
    }
    double v;
    char why[UNITS_WHY_MAX];
    CU_ASSERT(units_parse_us("3 sec", &v, why) == -1 && strstr(why, "not a time") != NULL);
}

/* Every size formatted is read back as itself, and reads as a person would write it. */
static void test_format(void)
{
    static const struct {
        int64_t bytes;
        const char *text;
    } cases[] = {{40 * GiB, "40GiB"},   {32000000000, "32GB"}, {3 * GiB / 2, "1536MiB"},
                 {42505273344, "42505273344"}, {1, "1"}, {0, "0"}, {2 * TiB, "2TiB"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char buf[64];
        units_format_bytes(cases[k].bytes, buf, sizeof buf);
        CU_ASSERT_STRING_EQUAL(buf, cases[k].text);
    }
    struct test_rng rng = {7};
    for (int k = 0; k < 2000; k++) {
        int64_t b = test_rng_int(&rng, 0, 1 << 20) << test_rng_int(&rng, 0, 30);
        char buf[64];
        int64_t back = -1;
        char why[UNITS_WHY_MAX];
        units_format_bytes(b, buf, sizeof buf);
        CU_ASSERT(units_parse_bytes(buf, &back, why) == 0 && back == b);
    }
}

static const char *const cluster_text =
    "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 4,\n"
    " \"reserve_bytes\": %s, \"link\": {\"gbps\": %s, \"latency_us\": %s},\n"
    " \"stages\": [\n"
    "  {\"device\": \"T4\", \"memory_bytes\": %s, \"profile\": \"t4.json\",\n"
    "   \"host_memory_bytes\": %s, \"host_link\": {\"gbps\": %s}},\n"
    "  {\"device\": \"T4\", \"memory_bytes\": %s, \"profile\": \"t4.json\"}]}\n";

static const char *cluster_file(const char *name, const char *const v[8])
{
    char text[2048];
    snprintf(text, sizeof text, cluster_text, v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
    return test_write(name, text);
}

static int make_profile(void)
{
    char args[2048];
    const char *model = test_write("model.json",
                                   "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", "
                                   "\"n_layer\": 4, \"n_embd\": 128, \"n_head\": 4, "
                                   "\"seq_len\": 128, \"vocab_size\": 256, \"micro_batch\": 4, "
                                   "\"dtype\": \"fp32\"}");
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device T4 -o '%s'", model,
             test_path("t4.json"));
    return test_run(args, NULL, NULL);
}

/* The same cluster with units and with plain numbers loads to the same numbers. */
static void test_cluster_files(void)
{
    CU_ASSERT_FATAL(make_profile() == 0);
    static const char *const human[8] = {"\"1GiB\"",  "\"100Gbps\"", "\"5us\"",
                                         "\"14GiB\"", "\"64GB\"",   "\"16GB/s\"",
                                         "\"12GiB\""};
    static const char *const plain[8] = {"1073741824",  "100",         "5",
                                         "15032385536", "64000000000", "128",
                                         "12884901888"};
    struct cluster a, b;
    struct err e;
    err_clear(&e);
    if (cluster_load(cluster_file("human.json", human), &a, &e) != ERR_OK)
        fprintf(stderr, "\n%s\n", e.msg);
    CU_ASSERT_FATAL(e.code == ERR_OK);
    CU_ASSERT_FATAL(cluster_load(cluster_file("plain.json", plain), &b, &e) == ERR_OK);
    CU_ASSERT(a.reserve_bytes == GiB && a.reserve_bytes == b.reserve_bytes);
    CU_ASSERT(a.link.gbps == 100 && a.link.latency_us == 5 && a.link.gbps == b.link.gbps &&
              a.link.latency_us == b.link.latency_us);
    CU_ASSERT(a.stages[0].memory_bytes == 14 * GiB &&
              a.stages[0].memory_bytes == b.stages[0].memory_bytes);
    CU_ASSERT(a.stages[1].memory_bytes == 12 * GiB &&
              a.stages[1].memory_bytes == b.stages[1].memory_bytes);
    CU_ASSERT(a.stages[0].host_memory_bytes == 64000000000 &&
              a.stages[0].host_memory_bytes == b.stages[0].host_memory_bytes);
    CU_ASSERT(a.stages[0].host_link.gbps == 128 &&
              a.stages[0].host_link.gbps == b.stages[0].host_link.gbps);
    cluster_free(&a);
    cluster_free(&b);

    /* refused by the command line, exit 2, naming the file and the field */
    static const struct {
        int field;
        const char *value, *says;
    } bad[] = {
        {3, "\"14 GiBs\"", "stages[0].memory_bytes: \"14 GiBs\" is not a size: unknown unit"},
        {0, "\"1Gb\"", "reserve_bytes: \"1Gb\" is not a size: \"Gb\" counts bits"},
        {1, "\"fast\"", "link.gbps: \"fast\" is not a rate"},
        {2, "\"5 weeks\"", "link.latency_us: \"5 weeks\" is not a time"},
        {4, "\"0.5B\"", "stages[0].host_memory_bytes: \"0.5B\" is not a whole number of bytes"},
        {6, "\"0GiB\"", "stages[1].memory_bytes: \"0GiB\" is 0 bytes, outside [1,"},
        {5, "true", "stages[0].host_link.gbps: expected a number (Gbit/s) or a string"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        const char *v[8];
        memcpy(v, human, sizeof v);
        v[bad[k].field] = bad[k].value;
        char args[2048], *err = NULL;
        const char *file = cluster_file("bad.json", v);
        snprintf(args, sizeof args, "plan --cluster '%s' --quiet", file);
        int rc = test_run(args, NULL, &err);
        char want[512];
        snprintf(want, sizeof want, "%s: %s", file, bad[k].says);
        CU_ASSERT(rc == 2 && err != NULL && strstr(err, want) != NULL);
        if (rc != 2 || err == NULL || strstr(err, want) == NULL)
            fprintf(stderr, "\nexit %d, stderr %s\nexpected: %s\n", rc, err ? err : "", want);
        free(err);
    }
}

/* A node's host memory shared by its GPUs: a stage of tp 2 in a node of 4 gets half of it
 * (by hand: 1 TiB x 2 / 4), as its host_memory_bytes; without per_node, or with
 * host_memory_bytes too, it is refused. */
static void test_node_host_memory(void)
{
    CU_ASSERT_FATAL(make_profile() == 0);
    static const char *const text =
        "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 4,\n"
        " \"stages\": [{\"device\": \"T4\", \"memory_bytes\": \"12GiB\", \"profile\": "
        "\"t4.json\", \"tp\": 2, %s}]}\n";
    char json[1024];
    struct cluster c;
    struct err e;
    err_clear(&e);
    snprintf(json, sizeof json, text, "\"per_node\": 4, \"node_host_memory_bytes\": \"1TiB\"");
    CU_ASSERT_FATAL(cluster_load(test_write("node.json", json), &c, &e) == ERR_OK);
    CU_ASSERT(c.stages[0].host_memory_bytes == TiB / 2);
    cluster_free(&c);
    static const char *const bad[] = {
        "\"node_host_memory_bytes\": \"1TiB\"",
        "\"per_node\": 4, \"node_host_memory_bytes\": \"1TiB\", \"host_memory_bytes\": 1"};
    for (int k = 0; k < 2; k++) {
        err_clear(&e);
        snprintf(json, sizeof json, text, bad[k]);
        CU_ASSERT(cluster_load(test_write("node-bad.json", json), &c, &e) == ERR_INPUT &&
                  strstr(e.msg, "stages[0].node_host_memory_bytes") != NULL);
    }
}

/* A profile and a device table with units read as their plain twins. */
static void test_profile_and_devices(void)
{
    CU_ASSERT_FATAL(make_profile() == 0);
    char *text = test_read(test_path("t4.json"));
    CU_ASSERT_FATAL(text != NULL);
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON *layer = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "layers"), 1);
    int64_t act = (int64_t)cJSON_GetObjectItem(layer, "act_bytes")->valuedouble;
    /* act_bytes of a block of this model is a whole number of KiB */
    CU_ASSERT_FATAL(act % KiB == 0);
    char human[64];
    snprintf(human, sizeof human, "%lld KiB", (long long)(act / KiB));
    cJSON_ReplaceItemInObject(layer, "act_bytes", cJSON_CreateString(human));
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "device"), "memory_bytes",
                              cJSON_CreateString("15GiB"));
    char *out = cJSON_Print(root);
    const char *file = test_write("t4-human.json", out);
    free(out);
    cJSON_Delete(root);
    struct profile p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(profile_load(file, &p, &e) == ERR_OK);
    CU_ASSERT(p.layers[1].act_bytes == act && p.device.memory_bytes == 15 * GiB);
    profile_free(&p);

    const char *devices = test_write(
        "devices.json",
        "{\"format\": \"ballast-devices/1\", \"description\": \"x\", \"assumptions\": "
        "{\"gemm_efficiency\": 0.6, \"memory_efficiency\": 0.8}, \"devices\": [{\"name\": \"X\", "
        "\"kind\": \"cuda\", \"peak_tflops_16bit\": 100, \"peak_tflops_fp32\": 10, "
        "\"memory_bytes\": \"24GB\", \"memory_bandwidth_gbs\": \"8Tbps\", \"host_link_gbs\": "
        "\"256Gbps\", \"op_overhead_us\": 5, \"source\": \"s\"}]}");
    struct device_table t;
    CU_ASSERT_FATAL(devices_load(devices, &t, &e) == ERR_OK);
    CU_ASSERT(t.devices[0].memory_bytes == 24000000000);
    CU_ASSERT(test_close(t.devices[0].memory_bandwidth_gbs, 1000, 0, 1e-12)); /* GB/s */
    CU_ASSERT(test_close(t.devices[0].host_link_gbs, 32, 0, 1e-12));
    devices_free(&t);
}

/* Options with units plan as their plain numbers do; a malformed one is a usage error. */
static void test_command_line(void)
{
    const char *cluster = BALLAST_SOURCE_DIR "/configs/clusters/cpu-3.json";
    char args[2048], *a = NULL, *b = NULL, *err = NULL;
    snprintf(args, sizeof args, "plan --cluster '%s' --unit 64KiB", cluster);
    CU_ASSERT(test_run(args, &a, NULL) == 0);
    snprintf(args, sizeof args, "plan --cluster '%s' --unit 65536", cluster);
    CU_ASSERT(test_run(args, &b, NULL) == 0);
    CU_ASSERT(a != NULL && b != NULL && strcmp(a, b) == 0);
    free(a);
    free(b);
    snprintf(args, sizeof args, "plan --cluster '%s' --unit 64Kib", cluster);
    CU_ASSERT(test_run(args, NULL, &err) == 2 && err && strstr(err, "--unit: \"64Kib\""));
    free(err);
    err = NULL;
    snprintf(args, sizeof args,
             "profile --model '%s/configs/models/gpt-tiny.json' --estimate --device T4 --tp 2 "
             "--node-link-gbps 1.5Tib/s",
             BALLAST_SOURCE_DIR);
    CU_ASSERT(test_run(args, NULL, &err) == 2 && err &&
              strstr(err, "--node-link-gbps: \"1.5Tib/s\""));
    free(err);
    snprintf(args, sizeof args,
             "profile --model '%s/configs/models/gpt-tiny.json' --estimate --device T4 --tp 2 "
             "--node-link-gbps 150GB/s --node-link-latency-us 0.003ms",
             BALLAST_SOURCE_DIR);
    CU_ASSERT(test_run(args, &a, NULL) == 0);
    snprintf(args, sizeof args,
             "profile --model '%s/configs/models/gpt-tiny.json' --estimate --device T4 --tp 2 "
             "--node-link-gbps 1200 --node-link-latency-us 3",
             BALLAST_SOURCE_DIR);
    CU_ASSERT(test_run(args, &b, NULL) == 0);
    CU_ASSERT(a != NULL && b != NULL && strcmp(a, b) == 0);
    free(a);
    free(b);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("units", NULL, NULL);
    CU_add_test(s, "sizes", test_sizes);
    CU_add_test(s, "rates and times", test_rates_and_times);
    CU_add_test(s, "format", test_format);
    CU_add_test(s, "cluster files", test_cluster_files);
    CU_add_test(s, "profile and devices", test_profile_and_devices);
    CU_add_test(s, "host memory per node", test_node_host_memory);
    CU_add_test(s, "command line", test_command_line);
    return test_main();
}
