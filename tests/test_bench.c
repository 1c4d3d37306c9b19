/* `ballast bench`: on a small subset it writes the tables and the PNGs with the right rows,
 * and its numbers are those `ballast plan` + `ballast simulate` give for the same cluster and
 * method. Clusters adapted to another model: layer ranges scaled by hand-computed boundaries,
 * profiles identical to the committed estimated ones. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "testjson.h"
#include "testutil.h"

#define CLUSTERS BALLAST_SOURCE_DIR "/configs/clusters/"

/* Splits a CSV line into at most `max` fields (quoted fields hold no quotes here). */
static int csv_fields(char *line, char **f, int max)
{
    int n = 0;
    char *p = line;
    while (n < max) {
        if (*p == '"') {
            f[n++] = ++p;
            p = strchr(p, '"');
            if (p == NULL)
                break;
            *p++ = '\0';
        } else {
            f[n++] = p;
            p += strcspn(p, ",\n");
        }
        if (*p != ',')
            break;
        *p++ = '\0';
    }
    char *nl = strchr(f[n - 1], '\n');
    if (nl)
        *nl = '\0';
    return n;
}

static int is_png(const char *path)
{
    static const unsigned char magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    unsigned char buf[8];
    FILE *f = fopen(path, "rb");
    int ok = f != NULL && fread(buf, 1, 8, f) == 8 && memcmp(buf, magic, 8) == 0;
    if (f != NULL) {
        fseek(f, 0, SEEK_END);
        ok = ok && ftell(f) > 4096; /* a drawn chart, not an empty canvas */
        fclose(f);
    }
    return ok;
}

/* Plans and simulates `cluster` with `method` through the CLI; returns iteration_ms from
 * simulate's result (NaN if it does not fit) and the plan's per-stage memory. */
static double plan_and_simulate(const char *cluster, const char *method, int64_t *memory,
                                int max_stages)
{
    char args[4096], pf[1024], rf[1024];
    snprintf(pf, sizeof pf, "%s/ref-%s-plan.json", test_tmpdir(), method);
    snprintf(rf, sizeof rf, "%s/ref-%s-result.json", test_tmpdir(), method);
    snprintf(args, sizeof args, "plan --cluster '%s' --method %s%s --quiet -o '%s'", cluster,
             method, strncmp(method, "optimal", 7) == 0 ? " --min-gain 0" : "", pf);
    int rc = test_run(args, NULL, NULL);
    if (rc == 3)
        return NAN;
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    snprintf(args, sizeof args, "simulate --plan '%s' -o '%s' --quiet", pf, rf);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    char *text = test_read(rf);
    cJSON *r = cJSON_Parse(text);
    free(text);
    double it = cJSON_GetObjectItemCaseSensitive(r, "iteration_ms")->valuedouble;
    cJSON_Delete(r);
    text = test_read(pf);
    cJSON *p = cJSON_Parse(text);
    free(text);
    const cJSON *st;
    int s = 0;
    cJSON_ArrayForEach(st, cJSON_GetObjectItemCaseSensitive(p, "stages"))
    {
        if (s < max_stages)
            memory[s] = (int64_t)cJSON_GetObjectItemCaseSensitive(st, "memory_bytes")->valuedouble;
        s++;
    }
    cJSON_Delete(p);
    return it;
}

static void test_small_subset(void)
{
    static const char *const methods[BENCH_METHODS] = {"none",    "full",
                                                       "uniform-min", "patent",
                                                       "optimal", "optimal+repartition"};
    char out[1024], args[4096], path[1200], *stdout_text = NULL, *stderr_text = NULL;
    snprintf(out, sizeof out, "%s/bench", test_tmpdir());
    snprintf(args, sizeof args,
             "bench --models gpt-1.3b --clusters '%st4-4090-4.json' --out '%s' --no-fp16",
             CLUSTERS, out);
    CU_ASSERT_EQUAL_FATAL(test_run(args, &stdout_text, &stderr_text), 0);
    CU_ASSERT(stderr_text && strstr(stderr_text, "bench [ 1/1] t4-4090-4 x gpt-1.3b"));
    CU_ASSERT(stdout_text && strstr(stdout_text, "| t4-4090-4 | 4 | 8 | does not fit |"));
    free(stdout_text);
    free(stderr_text);

    /* the reference: plan + simulate per method */
    double ref[BENCH_METHODS];
    int64_t mem[BENCH_METHODS][4];
    char cluster[1024];
    snprintf(cluster, sizeof cluster, "%st4-4090-4.json", CLUSTERS);
    for (int m = 0; m < BENCH_METHODS; m++)
        ref[m] = plan_and_simulate(cluster, methods[m], mem[m], 4);
    CU_ASSERT(isnan(ref[0])); /* nothing recomputed does not fit on the T4s */

    snprintf(path, sizeof path, "%s/results.csv", out);
    char *csv = test_read(path);
    CU_ASSERT_FATAL(csv != NULL);
    char *save = NULL, *line = strtok_r(csv, "\n", &save);
    CU_ASSERT(line && strncmp(line, "cluster,model,", 14) == 0);
    int rows = 0;
    for (line = strtok_r(NULL, "\n", &save); line; line = strtok_r(NULL, "\n", &save), rows++) {
        char *f[24];
        int n = csv_fields(line, f, 24);
        CU_ASSERT_EQUAL_FATAL(n, 19);
        CU_ASSERT_STRING_EQUAL(f[0], "t4-4090-4");
        CU_ASSERT_STRING_EQUAL(f[1], "gpt-1.3b");
        CU_ASSERT_STRING_EQUAL(f[2], "4");
        CU_ASSERT_STRING_EQUAL(f[4], "gpipe");
        CU_ASSERT_FATAL(rows < BENCH_METHODS);
        CU_ASSERT_STRING_EQUAL(f[6], methods[rows]);
        if (isnan(ref[rows])) {
            CU_ASSERT_STRING_EQUAL(f[7], "does not fit");
            CU_ASSERT_STRING_EQUAL(f[8], "");
            continue;
        }
        CU_ASSERT_STRING_EQUAL(f[7], "ok");
        CU_ASSERT(test_close(atof(f[8]), ref[rows], 1e-3, 1e-9)); /* 3 decimals written */
        CU_ASSERT(test_close(atof(f[10]), ref[1] / ref[rows], 1e-4, 1e-6));
        CU_ASSERT(test_close(atof(f[11]), ref[2] / ref[rows], 1e-4, 1e-6));
        CU_ASSERT(atof(f[12]) > 0 && atof(f[12]) <= 1); /* it fits */
        CU_ASSERT(atof(f[13]) > 0);                     /* planning took some time */
    }
    CU_ASSERT_EQUAL(rows, BENCH_METHODS);
    free(csv);

    /* memory.csv: a row per stage of every method that fits, the plan's bytes */
    snprintf(path, sizeof path, "%s/memory.csv", out);
    csv = test_read(path);
    CU_ASSERT_FATAL(csv != NULL);
    rows = 0;
    save = NULL;
    strtok_r(csv, "\n", &save);
    for (line = strtok_r(NULL, "\n", &save); line; line = strtok_r(NULL, "\n", &save), rows++) {
        char *f[16];
        CU_ASSERT_EQUAL_FATAL(csv_fields(line, f, 16), 9);
        int m = 0, s = atoi(f[3]);
        while (m < BENCH_METHODS && strcmp(methods[m], f[2]) != 0)
            m++;
        CU_ASSERT_FATAL(m < BENCH_METHODS && s >= 0 && s < 4 && !isnan(ref[m]));
        CU_ASSERT_EQUAL(atoll(f[7]), mem[m][s]);
        CU_ASSERT(atoll(f[7]) <= atoll(f[5]));
    }
    CU_ASSERT_EQUAL(rows, 5 * 4); /* five methods fit, four stages */
    free(csv);

    static const char *const files[] = {"results.md", "iteration.gp", "iteration.dat",
                                        "memory.gp", "memory.dat", "gantt.gp", "gantt.dat",
                                        "gantt-trace.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", out, files[i]);
        char *text = test_read(path);
        CU_ASSERT(text != NULL && strlen(text) > 100);
        free(text);
    }
    static const char *const pngs[] = {"iteration.png", "memory.png", "gantt.png"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", out, pngs[i]);
        CU_ASSERT(is_png(path));
    }
    /* repartitioning searches a superset of the cluster's own split; the markdown names the
     * fastest method's time in bold, to the decimal */
    CU_ASSERT(ref[5] <= ref[4] * (1 + 1e-12));
    int fastest = 0;
    for (int m = 1; m < BENCH_METHODS; m++)
        if (!isnan(ref[m]) && (isnan(ref[fastest]) || ref[m] < ref[fastest]))
            fastest = m;
    snprintf(path, sizeof path, "%s/results.md", out);
    char *md = test_read(path), bold[64];
    snprintf(bold, sizeof bold, "**%.1f**", ref[fastest]);
    CU_ASSERT(md && strstr(md, bold));
    free(md);
}

/* v100-a100-8 splits GPT-13B's 42 layers by hand at 0, 5, 9, 13, 17, 23, 29, 35; for the
 * 26 layers of GPT-1.3B the same fractions are 0, 3.10, 5.57, 8.05, 10.52, 14.24, 17.95,
 * 21.67, rounded: 0, 3, 6, 8, 11, 14, 18, 22. */
static void test_scaled_layers(void)
{
    struct cluster c, a;
    struct model m;
    struct device_table t;
    struct err e;
    char note[BENCH_NOTE_MAX];
    err_clear(&e);
    CU_ASSERT_FATAL(cluster_load(CLUSTERS "v100-a100-8.json", &c, &e) == ERR_OK);
    CU_ASSERT_FATAL(model_load(BALLAST_SOURCE_DIR "/configs/models/gpt-1.3b.json", &m, &e) ==
                    ERR_OK);
    CU_ASSERT_FATAL(devices_load(BALLAST_SOURCE_DIR "/configs/devices.json", &t, &e) == ERR_OK);
    CU_ASSERT_FATAL(bench_cluster_for_model(&c, &m, &t, &a, note, &e) == ERR_OK);
    static const int first[8] = {0, 3, 6, 8, 11, 14, 18, 22};
    for (int s = 0; s < 8; s++) {
        CU_ASSERT_EQUAL(a.stages[s].first, first[s]);
        CU_ASSERT_EQUAL(a.stages[s].last, s < 7 ? first[s + 1] - 1 : 25);
        CU_ASSERT_EQUAL(a.stages[s].memory_bytes, c.stages[s].memory_bytes);
        CU_ASSERT_EQUAL(a.stages[s].link.gbps, c.stages[s].link.gbps);
    }
    CU_ASSERT(strstr(note, "42 layers scaled to 26") != NULL);
    CU_ASSERT_EQUAL(a.n_profiles, 2); /* one per kind of device */
    cluster_free(&a);

    /* a tiny model squeezes every stage to one layer and stays a tiling */
    CU_ASSERT_FATAL(model_load(BALLAST_SOURCE_DIR "/configs/models/gpt-tiny.json", &m, &e) ==
                    ERR_OK);
    CU_ASSERT_FATAL(bench_cluster_for_model(&c, &m, &t, &a, note, &e) == ERR_OK);
    for (int s = 0; s < 8; s++)
        CU_ASSERT(a.stages[s].first == s && a.stages[s].last == s);
    cluster_free(&a);
    cluster_free(&c);

    /* more stages than layers: cannot run, and says why */
    CU_ASSERT_FATAL(cluster_load(CLUSTERS "a100-h100-h200-32.json", &c, &e) == ERR_OK);
    CU_ASSERT_FATAL(model_load(BALLAST_SOURCE_DIR "/configs/models/gpt-1.3b.json", &m, &e) ==
                    ERR_OK);
    CU_ASSERT_EQUAL(bench_cluster_for_model(&c, &m, &t, &a, note, &e), ERR_NOFIT);
    CU_ASSERT(strstr(note, "32 stages, but the model has 26 layers") != NULL);
    cluster_free(&c);
    devices_free(&t);
}

/* An evenly split GPT-13B cluster adapted to GPT-175B: an even split of the 98 layers, and
 * profiles equal to the committed estimated ones that `ballast profile --estimate` wrote. */
static void test_estimated_profiles(void)
{
    struct cluster c, a;
    struct model m;
    struct device_table t;
    struct profile ref;
    struct err e;
    char note[BENCH_NOTE_MAX];
    err_clear(&e);
    CU_ASSERT_FATAL(cluster_load(CLUSTERS "a100-h100-h200-32.json", &c, &e) == ERR_OK);
    CU_ASSERT_FATAL(model_load(BALLAST_SOURCE_DIR "/configs/models/gpt-175b.json", &m, &e) ==
                    ERR_OK);
    CU_ASSERT_FATAL(devices_load(BALLAST_SOURCE_DIR "/configs/devices.json", &t, &e) == ERR_OK);
    CU_ASSERT_FATAL(bench_cluster_for_model(&c, &m, &t, &a, note, &e) == ERR_OK);
    CU_ASSERT_STRING_EQUAL(note, "");
    for (int s = 0; s < 32; s++) {
        int first, last;
        cluster_default_split(&m, 98, 32, s, &first, &last);
        CU_ASSERT(a.stages[s].first == first && a.stages[s].last == last);
    }
    CU_ASSERT_FATAL(profile_load(BALLAST_SOURCE_DIR
                                 "/configs/profiles/estimated/gpt-175b/H100-80GB.json",
                                 &ref, &e) == ERR_OK);
    const struct profile *got = cluster_stage_profile(&a, 8); /* the first H100 */
    CU_ASSERT_STRING_EQUAL(got->device.name, "H100-80GB");
    CU_ASSERT_EQUAL_FATAL(got->n_layers, ref.n_layers);
    int same = 1;
    for (int l = 0; l < ref.n_layers; l++) {
        const struct layer_cost *x = &got->layers[l], *y = &ref.layers[l];
        same = same && test_close(x->fwd_ms, y->fwd_ms, 1e-12, 1e-12) &&
               test_close(x->bwd_ms, y->bwd_ms, 1e-12, 1e-12) &&
               x->state_bytes == y->state_bytes && x->act_bytes == y->act_bytes &&
               x->ckpt_bytes == y->ckpt_bytes && x->out_bytes == y->out_bytes;
    }
    CU_ASSERT(same);
    profile_free(&ref);
    cluster_free(&a);
    cluster_free(&c);
    devices_free(&t);
}

/* GPT FLOPs of layer l of 26 (GPT-1.3B: B 1, T 2048, C 2048, V 50257), forward and backward,
 * by hand from its GEMMs alone (3x the forward's): a block's 24 BTC^2 + 4 BT^2 C, the head's
 * 2 BTCV, the embedding none. The pointwise operations the bench also counts add under 1%. */
static double gpt13_flops(int l)
{
    const double B = 1, T = 2048, C = 2048, V = 50257;
    if (l == 0)
        return 0;
    return l == 25 ? 3 * 2 * B * T * C * V : 3 * (24 * B * T * C * C + 4 * B * T * T * C);
}

/* The fp16 twin on the T4 + RTX 4090 pair: a progress line and CSV rows of its own, its
 * optimal+repartition step that of `ballast plan` + `simulate` on fp16 profiles, and the T4s'
 * share of the work (FLOPs by hand on the plan's layers), busy share (simulate's busy_ms) and
 * the stages without a block as the CSV and the Markdown table state them. */
static void test_fp16_twin(void)
{
    char out[1024], args[4096], path[1200], *err = NULL, *md = NULL;
    snprintf(out, sizeof out, "%s/bench16", test_tmpdir());
    snprintf(args, sizeof args, "bench --models gpt-1.3b --clusters '%st4-4090-4.json' --out '%s' "
             "--no-plots", CLUSTERS, out);
    CU_ASSERT_EQUAL_FATAL(test_run(args, &md, &err), 0);
    CU_ASSERT(err && strstr(err, "bench [ 1/2] t4-4090-4 x gpt-1.3b:") &&
              strstr(err, "bench [ 2/2] t4-4090-4 x gpt-1.3b-fp16:"));
    free(err);

    /* the reference: the cluster on fp16 profiles, planned and simulated */
    cJSON *c = test_cluster_estimated(CLUSTERS "t4-4090-4.json",
                                      BALLAST_SOURCE_DIR "/configs/models/gpt-1.3b-fp16.json");
    char *text = cJSON_Print(c);
    cJSON_Delete(c);
    const cJSON *st;
    char cluster[1024], pf[1024], rf[1024];
    snprintf(cluster, sizeof cluster, "%s", test_write("t4-4090-4-fp16.json", text));
    free(text);
    snprintf(pf, sizeof pf, "%s/twin-plan.json", test_tmpdir());
    snprintf(rf, sizeof rf, "%s/twin-sim.json", test_tmpdir());
    snprintf(args, sizeof args,
             "plan --cluster '%s' --method optimal --repartition --min-gain 0 --quiet -o '%s'",
             cluster, pf);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    snprintf(args, sizeof args, "simulate --plan '%s' -o '%s' --quiet", pf, rf);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    cJSON *p = test_read_json(pf), *r = test_read_json(rf);
    double it = test_num(r, "iteration_ms");
    double all = 0, t4 = 0, busy = 0;
    int blockless = 0, s = 0;
    cJSON_ArrayForEach(st, cJSON_GetObjectItemCaseSensitive(p, "stages"))
    {
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(st, "layers");
        int first = cJSON_GetArrayItem(l, 0)->valueint, last = cJSON_GetArrayItem(l, 1)->valueint;
        double flops = 0;
        for (int k = first; k <= last; k++)
            flops += gpt13_flops(k);
        all += flops;
        blockless += first == last && (first == 0 || first == 25);
        if (strcmp(cJSON_GetObjectItemCaseSensitive(st, "device")->valuestring, "T4") == 0) {
            t4 += flops;
            const cJSON *rs = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r, "stages"), s);
            busy += test_num(rs, "busy_ms") / it / 2;
        }
        s++;
    }
    cJSON_Delete(p);
    cJSON_Delete(r);

    snprintf(path, sizeof path, "%s/results.csv", out);
    char *csv = test_read(path), *save = NULL, *line = strtok_r(csv, "\n", &save);
    CU_ASSERT_FATAL(line != NULL);
    CU_ASSERT(strstr(line, ",older_gpus,older_work_share,older_busy_share,gpus_without_block") !=
              NULL);
    int rows = 0;
    double bf16_work = NAN;
    for (line = strtok_r(NULL, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *f[24];
        CU_ASSERT_EQUAL_FATAL(csv_fields(line, f, 24), 19);
        CU_ASSERT_STRING_EQUAL(f[15], "2"); /* two T4s */
        if (strcmp(f[6], "optimal+repartition") != 0)
            continue;
        if (strcmp(f[1], "gpt-1.3b") == 0) {
            bf16_work = atof(f[16]);
            continue;
        }
        CU_ASSERT_STRING_EQUAL(f[1], "gpt-1.3b-fp16");
        CU_ASSERT_STRING_EQUAL(f[5], "estimated");
        CU_ASSERT(test_close(atof(f[8]), it, 1e-3, 1e-9));
        CU_ASSERT(test_close(atof(f[16]), t4 / all, 1e-4, 0.01));
        CU_ASSERT(test_close(atof(f[17]), busy, 1e-4, 1e-6));
        CU_ASSERT_EQUAL(atoi(f[18]), blockless);
        rows++;
    }
    CU_ASSERT_EQUAL(rows, 1);
    CU_ASSERT(t4 / all > bf16_work); /* in fp16 the T4s take more of the work */
    free(csv);
    char row[256];
    snprintf(row, sizeof row, "| t4-4090-4 | gpt-1.3b | 2 |");
    CU_ASSERT(md && strstr(md, "## fp16 beside bf16") && strstr(md, row));
    printf(" [T4s' share of the work: bf16 %.0f%%, fp16 %.0f%%] ", 100 * bf16_work,
           100 * t4 / all);
    free(md);
}

static void test_bad_input(void)
{
    char *err = NULL, args[2048];
    snprintf(args, sizeof args, "bench --clusters /nonexistent --out '%s/b1'", test_tmpdir());
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err && strstr(err, "/nonexistent"));
    free(err);
    snprintf(args, sizeof args, "bench --models gpt-7t --clusters '%st4-4090-4.json' --out '%s/b2'",
             CLUSTERS, test_tmpdir());
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err && strstr(err, "--models: gpt-7t: \"gpt-7t\" is neither a model file") &&
              strstr(err, "known: custom-example, gpt-1.3b"));
    free(err);
    snprintf(args, sizeof args,
             "bench --models gpt-1.3b --clusters '%st4-4090-4.json' --detail nowhere --out '%s/b3'",
             CLUSTERS, test_tmpdir());
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err && strstr(err, "--detail: no cluster named \"nowhere\""));
    free(err);
    snprintf(args, sizeof args, "bench --clusters '%scpu-3.json' --out '%s/b4'", CLUSTERS,
             test_tmpdir());
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err && strstr(err, "no GPU cluster"));
    free(err);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("bench", NULL, NULL);
    CU_add_test(s, "a small subset: rows, numbers of plan + simulate, PNGs", test_small_subset);
    CU_add_test(s, "layer ranges scaled at the same boundaries", test_scaled_layers);
    CU_add_test(s, "profiles estimated in memory equal the committed ones",
                test_estimated_profiles);
    CU_add_test(s, "fp16 beside bf16: the twin's numbers of plan + simulate", test_fp16_twin);
    CU_add_test(s, "bad input exits 2 naming what is wrong", test_bad_input);
    return test_main();
}
