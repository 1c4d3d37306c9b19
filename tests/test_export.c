/* plan --export against the plan file it exports, and --micro-batches auto against planning
 * every micro-batch size by hand. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define CONFIGS BALLAST_SOURCE_DIR "/configs/"
#define MAX_STAGES 64

struct counts {
    int n;
    int blocks[MAX_STAGES];
    int recompute[MAX_STAGES]; /* whole or in part */
    int partial[MAX_STAGES];   /* in part: a recompute option */
    int attn, mlp;             /* blocks whose option recomputes the attention, the MLP */
};

/* Blocks and recomputed blocks per stage, from a plan file (layer 0 is the embedding, the
 * last the head): `recompute` lists whole layers, `recompute_options` the others. */
static void plan_counts(const char *plan_file, struct counts *c)
{
    char *text = test_read(plan_file);
    cJSON *p = cJSON_Parse(text);
    free(text);
    CU_ASSERT_FATAL(p != NULL);
    int n_layer = cJSON_GetObjectItem(cJSON_GetObjectItem(p, "model"), "n_layer")->valueint;
    const cJSON *st;
    c->n = c->attn = c->mlp = 0;
    cJSON_ArrayForEach(st, cJSON_GetObjectItem(p, "stages"))
    {
        const cJSON *range = cJSON_GetObjectItem(st, "layers"), *r;
        int first = cJSON_GetArrayItem(range, 0)->valueint;
        int last = cJSON_GetArrayItem(range, 1)->valueint;
        int lo = first < 1 ? 1 : first, hi = last > n_layer ? n_layer : last;
        c->blocks[c->n] = hi >= lo ? hi - lo + 1 : 0;
        c->recompute[c->n] = 0;
        c->partial[c->n] = 0;
        cJSON_ArrayForEach(r, cJSON_GetObjectItem(st, "recompute"))
            c->recompute[c->n] += r->valueint >= 1 && r->valueint <= n_layer;
        cJSON_ArrayForEach(r, cJSON_GetObjectItem(st, "recompute_options"))
        {
            int l = cJSON_GetObjectItem(r, "layer")->valueint;
            const char *name = cJSON_GetObjectItem(r, "option")->valuestring;
            if (l < 1 || l > n_layer)
                continue;
            c->recompute[c->n]++;
            c->partial[c->n]++;
            c->attn += strstr(name, "attn") != NULL;
            c->mlp += strstr(name, "mlp") != NULL;
        }
        c->n++;
    }
    cJSON_Delete(p);
}

/* Parses "[a, b, c]" after `key` in text. */
static int parse_list(const char *text, const char *key, int *out)
{
    const char *at = strstr(text, key);
    if (at == NULL)
        return -1;
    at = strchr(at, '[');
    int n = 0;
    while (at && *at != ']') {
        at++;
        char *end;
        long v = strtol(at, &end, 10);
        if (end == at)
            break;
        out[n++] = (int)v;
        at = end;
    }
    return n;
}

static void run_export(const char *cluster, const char *extra, const char *format, char **out,
                       struct counts *c)
{
    char args[2048];
    const char *plan = test_path("export-plan.json");
    snprintf(args, sizeof args, "plan --cluster '%s%s' %s --export %s -o '%s'", CONFIGS, cluster,
             extra, format, plan);
    char *err = NULL;
    CU_ASSERT_EQUAL_FATAL(test_run(args, out, &err), 0);
    CU_ASSERT(err && strstr(err, "stage")); /* the table went to standard error */
    free(err);
    plan_counts(plan, c);
}

/* A line ending in a backslash continues a shell command: no comment may follow it. */
static int shell_continuations_clean(const char *text)
{
    const char *line = text;
    int continued = 0;
    while (*line) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (continued && line[0] == '#')
            return 0;
        continued = len > 0 && line[len - 1] == '\\';
        line += len + (end ? 1 : 0);
    }
    return !continued;
}

static void check_all_formats(const char *cluster, const char *extra)
{
    struct counts c;
    char *out = NULL;
    int got[MAX_STAGES];

    run_export(cluster, extra, "colossalai", &out, &c);
    CU_ASSERT_EQUAL(parse_list(out, "num_layers_per_stage=", got), c.n);
    for (int s = 0; s < c.n; s++)
        CU_ASSERT_EQUAL(got[s], c.blocks[s]);
    CU_ASSERT_EQUAL(parse_list(out, "num_ckpt_layers_per_stage=", got), c.n);
    for (int s = 0; s < c.n; s++)
        CU_ASSERT_EQUAL(got[s], c.recompute[s]);
    free(out);

    /* NeMo: stage s recomputes n0 - int(s * k) blocks; never fewer than the plan */
    run_export(cluster, extra, "nemo", &out, &c);
    const char *a = strstr(out, "activations_checkpoint_num_layers:");
    const char *b = strstr(out, "activations_checkpoint_layers_per_pipeline:");
    CU_ASSERT_FATAL(a && b);
    int n0 = atoi(a + strlen("activations_checkpoint_num_layers:"));
    double k = atof(b + strlen("activations_checkpoint_layers_per_pipeline:"));
    CU_ASSERT(strstr(out, "activations_checkpoint_method: block") != NULL);
    int excess = 0;
    for (int s = 0; s < c.n; s++) {
        int nemo = n0 - (int)(s * k);
        nemo = nemo > c.blocks[s] ? c.blocks[s] : nemo;
        CU_ASSERT(nemo >= c.recompute[s]);
        excess += nemo - c.recompute[s];
    }
    CU_ASSERT((excess > 0) == (strstr(out, "more block(s) in all") != NULL));
    free(out);

    /* Megatron: the layout string holds every stage's blocks, E first, L last */
    run_export(cluster, extra, "megatron", &out, &c);
    CU_ASSERT(shell_continuations_clean(out));
    const char *lay = strstr(out, "--pipeline-model-parallel-layout \"");
    CU_ASSERT_FATAL(lay != NULL);
    lay += strlen("--pipeline-model-parallel-layout \"");
    CU_ASSERT(lay[0] == 'E');
    int s = 0, most = 0;
    for (const char *p = lay; *p && *p != '"'; s++) {
        const char *bar = strpbrk(p, "|\"");
        int blocks = 0;
        for (const char *q = p; q < bar; q++)
            if (*q == 't')
                blocks += q[1] == '*' ? atoi(q + 2) : 1;
        CU_ASSERT(s < c.n && blocks == c.blocks[s]);
        CU_ASSERT((memchr(p, 'L', (size_t)(bar - p)) != NULL) == (s == c.n - 1));
        p = *bar == '|' ? bar + 1 : bar;
    }
    CU_ASSERT_EQUAL(s, c.n);
    /* selective recomputation when no block is recomputed whole, else whole blocks with the
     * blocks recomputed in part counted whole */
    int whole = 0, partial = 0;
    for (s = 0; s < c.n; s++) {
        whole += c.recompute[s] - c.partial[s];
        partial += c.partial[s];
    }
    const char *sel = strstr(out, "--recompute-granularity selective --recompute-modules");
    CU_ASSERT((sel != NULL) == (whole == 0 && partial > 0));
    if (sel) {
        char line[128];
        snprintf(line, sizeof line, "--recompute-granularity selective --recompute-modules%s%s\n",
                 c.attn ? " core_attn" : "", c.mlp ? " mlp" : "");
        CU_ASSERT(strncmp(sel, line, strlen(line)) == 0);
    }
    for (s = 0; s < c.n && !sel; s++)
        most = c.recompute[s] > most ? c.recompute[s] : most;
    const char *rn = strstr(out, "--recompute-method block --recompute-num-layers ");
    CU_ASSERT((rn != NULL) == (most > 0));
    if (rn)
        CU_ASSERT_EQUAL(atoi(rn + strlen("--recompute-method block --recompute-num-layers ")),
                        most);
    CU_ASSERT((partial > 0 && !sel) == (strstr(out, "only in part") != NULL));
    free(out);
}

static void test_exports(void)
{
    /* options and whole blocks; options only (selective in Megatron-LM); whole layers */
    check_all_formats("clusters/v100-a100-8.json", "");
    check_all_formats("clusters/t4-4090-4.json", "");
    check_all_formats("clusters/v100-a100-8.json", "--whole-layers");
    check_all_formats("clusters/t4-4090-4.json", "--method patent");
    check_all_formats("clusters/h100-a100-l4-16.json", "--repartition");
    check_all_formats("clusters/cpu-3.json", "--method full");
}

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
    CU_add_test(s, "exports describe the plan they export", test_exports);
    CU_add_test(s, "--micro-batches auto is the fastest size", test_micro_batches_auto);
    CU_add_test(s, "--micro-batches auto rescales a measured profile's options",
                test_micro_batches_auto_measured);
    return test_main();
}
