/* The frameworks as planning targets and the exports (issue 24), against readers written here
 * from each framework's semantics, independent of planner/framework.c: a Megatron-LM layout
 * string gives each stage's blocks and --recompute-num-layers N each stage's first N of them
 * (or the per-rank file each stage's own); NeMo's first and last counts with the rest even;
 * ColossalAI's and FlagScale's lists. The reader's per-stage actions, put on the plan's layer
 * costs, are costed and simulated, and must give the plan's step and every stage's memory
 * exactly (an export with no note), or the numbers the note prints (a plan the framework
 * cannot say as it is, planned again). Every key an export writes is one
 * tests/data/export_keys.json quotes from the framework's source. */
#define _GNU_SOURCE /* open_memstream */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "estimate.h"
#include "export.h"
#include "framework.h"
#include "plan.h"
#include "planner.h"
#include "testutil.h"

#define CONFIGS BALLAST_SOURCE_DIR "/configs/"
#define MAX_STAGES 64
#define GIB 1073741824.0

static const char *const targets[] = {"megatron", "megatron-cli", "nemo", "nemo-cli",
                                      "colossalai", "flagscale"};
#define N_TARGETS 6

/* ---- the keys each framework's source accepts ---- */

static cJSON *all_keys;

/* Whether `key` (and `value`, NULL: any) is one export_keys.json quotes for `framework` in
 * its list `list` ("keys", or ColossalAI's "model_keys"). */
static int accepted_in(const char *framework, const char *list, const char *key,
                       const char *value);

static int accepted(const char *framework, const char *key, const char *value)
{
    return accepted_in(framework, "keys", key, value);
}

static int accepted_in(const char *framework, const char *list, const char *key,
                       const char *value)
{
    if (all_keys == NULL) {
        char *text = test_read(BALLAST_SOURCE_DIR "/tests/data/export_keys.json");
        all_keys = cJSON_Parse(text);
        free(text);
    }
    CU_ASSERT_FATAL(all_keys != NULL);
    const cJSON *f = cJSON_GetObjectItem(all_keys, framework), *k, *v;
    CU_ASSERT_FATAL(f != NULL && cJSON_GetObjectItem(f, "commit") != NULL);
    cJSON_ArrayForEach(k, cJSON_GetObjectItem(f, list))
    {
        if (strcmp(cJSON_GetObjectItem(k, "key")->valuestring, key) != 0)
            continue;
        const cJSON *values = cJSON_GetObjectItem(k, "values");
        if (value == NULL || values == NULL)
            return 1;
        cJSON_ArrayForEach(v, values) if (strcmp(v->valuestring, value) == 0) return 1;
        return 0;
    }
    printf("\n  %s: key %s (value %s) is not in export_keys.json\n", framework, key,
           value ? value : "-");
    return 0;
}

/* ---- what a framework's configuration says, read from its semantics ---- */

struct setting {
    int S;
    int blocks[MAX_STAGES];
    int n[MAX_STAGES];            /* its first n blocks recomputed whole */
    char modules[MAX_STAGES][32]; /* or these recompute modules on every block ("" none) */
    int host;                     /* every stage's optimizer on the host */
    double offload_fraction;      /* Megatron-LM's activation offloading; 0 none */
    int tp, dp, gpus, micro_batch, global_batch;
};

/* "[a, b, c]" after `key`: the count read. */
static int parse_list(const char *text, const char *key, int *out)
{
    const char *at = strstr(text, key);
    if (at == NULL || (at = strchr(at, '[')) == NULL)
        return -1;
    int n = 0;
    for (at++; *at && *at != ']';) {
        char *end;
        long v = strtol(at, &end, 10);
        if (end == at) {
            at++;
            continue;
        }
        out[n++] = (int)v;
        at = end;
    }
    return n;
}

/* The value after `key` up to the end of its line (static buffer), or NULL. */
static const char *value_of(const char *text, const char *key)
{
    static char v[256];
    const char *at = strstr(text, key);
    if (at == NULL)
        return NULL;
    at += strlen(key);
    while (*at == ' ' || *at == '=' || *at == ':')
        at++;
    size_t n = strcspn(at, "\n");
    snprintf(v, sizeof v, "%.*s", (int)(n < sizeof v ? n : sizeof v - 1), at);
    return v;
}

/* The launch comment every export has: GPUs, tp, pp, dp; and the step's samples. */
static void read_launch(const char *text, struct setting *s)
{
    const char *at = strstr(text, "launch on ");
    CU_ASSERT_FATAL(at != NULL);
    int pp;
    CU_ASSERT_FATAL(sscanf(at, "launch on %d GPUs (tp %d, pp %d, dp %d)", &s->gpus, &s->tp, &pp,
                           &s->dp) == 4);
    CU_ASSERT_EQUAL(pp, s->S);
}

/* The per-rank file's PIPELINE_STAGES: each line's recompute fields. */
static void read_stages_py(const char *py, struct setting *s)
{
    const char *at = strstr(py, "PIPELINE_STAGES = [");
    CU_ASSERT_FATAL(at != NULL);
    for (int k = 0; k < s->S; k++) {
        at = strstr(at, "\n    {");
        CU_ASSERT_FATAL(at != NULL);
        at++;
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)strcspn(at, "\n"), at);
        s->n[k] = 0;
        s->modules[k][0] = '\0';
        if (strstr(line, "\"recompute_granularity\": \"full\"")) {
            CU_ASSERT(strstr(line, "\"recompute_method\": \"block\"") != NULL);
            s->n[k] = atoi(strstr(line, "\"recompute_num_layers\": ") + 24);
        } else if (strstr(line, "\"recompute_granularity\": \"selective\"")) {
            const char *m = strstr(line, "\"recompute_modules\": [");
            CU_ASSERT_FATAL(m != NULL);
            m += 22;
            int j = 0;
            for (; *m && *m != ']' && j < 31; m++)
                if (*m != '"' && *m != ',')
                    s->modules[k][j++] = *m == ' ' ? ' ' : *m;
            s->modules[k][j] = '\0';
        }
    }
}

/* One recompute setting for every stage: the first N blocks (block method), or modules. */
static void every_stage(struct setting *s, int N, const char *modules)
{
    for (int k = 0; k < s->S; k++) {
        s->n[k] = N < s->blocks[k] ? N : s->blocks[k];
        snprintf(s->modules[k], sizeof s->modules[k], "%s", modules);
    }
}

/* Megatron-LM: arguments one a line (comments aside); the layout string's stages, E the
 * embedding, t a block (t*n n of them), L the loss. */
static void read_megatron(const char *text, const char *py, struct setting *s)
{
    char args[32768] = "";
    for (const char *line = text; *line; line += strcspn(line, "\n") + (line[strcspn(line, "\n")] != 0)) {
        size_t n = strcspn(line, "\n");
        if (line[0] == '#' || n == 0)
            continue;
        CU_ASSERT(line[0] == '-'); /* an argument line, continued from the one before */
        strncat(args, line, n);
        strcat(args, " ");
    }
    for (char *tok = strtok(args, " \\"); tok != NULL; tok = strtok(NULL, " \\"))
        if (strncmp(tok, "--", 2) == 0)
            CU_ASSERT(accepted("megatron", tok, NULL));
    const char *layout = strstr(text, "--pipeline-model-parallel-layout \"");
    CU_ASSERT_FATAL(layout != NULL);
    layout += 34;
    s->S = 0;
    int count = 0;
    for (const char *c = layout; *c != '"'; c++) {
        if (*c == '|') {
            s->blocks[s->S++] = count;
            count = 0;
        } else if (*c == 't') {
            count += c[1] == '*' ? atoi(c + 2) : 1;
        }
    }
    s->blocks[s->S++] = count;
    CU_ASSERT_EQUAL(atoi(value_of(text, "--pipeline-model-parallel-size")), s->S);
    const char *g = value_of(text, "--recompute-granularity");
    every_stage(s, 0, "");
    if (g && strncmp(g, "full", 4) == 0) {
        CU_ASSERT(strncmp(value_of(text, "--recompute-method"), "block", 5) == 0);
        every_stage(s, atoi(value_of(text, "--recompute-num-layers")), "");
    } else if (g && strncmp(g, "selective", 9) == 0) {
        char mods[64];
        snprintf(mods, sizeof mods, "%s", value_of(text, "--recompute-modules"));
        mods[strcspn(mods, "\\")] = '\0';
        while (mods[0] && mods[strlen(mods) - 1] == ' ')
            mods[strlen(mods) - 1] = '\0';
        every_stage(s, 0, mods);
    }
    if (py != NULL)
        read_stages_py(py, s);
    s->host = strstr(text, "--optimizer-cpu-offload") != NULL;
    const char *f = value_of(text, "--activation-offload-fraction");
    s->offload_fraction = strstr(text, "--fine-grained-activation-offloading") ? (f ? atof(f) : 1)
                                                                                : 0;
    s->micro_batch = value_of(text, "--micro-batch-size") ? atoi(value_of(text, "--micro-batch-size")) : 0;
    s->global_batch = value_of(text, "--global-batch-size") ? atoi(value_of(text, "--global-batch-size")) : 0;
}

/* Every "  key: value" of a two- or three-level YAML as "section.key" (and "section.sub.key"),
 * checked against the framework's keys. */
static void yaml_keys(const char *text, const char *framework)
{
    char section[64] = "", sub[64] = "";
    for (const char *line = text; *line; line += strcspn(line, "\n") + 1) {
        size_t n = strcspn(line, "\n");
        char l[512], key[64], value[256] = "";
        snprintf(l, sizeof l, "%.*s", (int)n, line);
        if (l[0] == '#' || n == 0)
            continue;
        int indent = (int)strspn(l, " ");
        if (l[indent] == '#' || l[indent] == '-')
            continue;
        CU_ASSERT_FATAL(sscanf(l + indent, "%63[a-z_0-9]:%255[^\n]", key, value) >= 1);
        if (indent == 0) {
            snprintf(section, sizeof section, "%s", key);
            continue;
        }
        char *v = value + strspn(value, " ");
        if (v[0] == '\0') {
            snprintf(sub, sizeof sub, "%s", key);
            continue;
        }
        char full[256];
        if (indent >= 4)
            snprintf(full, sizeof full, "%s.%s.%s", section, sub, key);
        else
            snprintf(full, sizeof full, "%s.%s", section, key);
        int plain = v[0] == '[' || v[0] == '"' || isdigit((unsigned char)v[0]);
        CU_ASSERT(accepted(framework, full, plain ? NULL : v));
    }
}

/* NeMo (Megatron-core's split): the first and last stage's counts when given, the rest even. */
static void read_nemo(const char *text, const char *py, struct setting *s)
{
    yaml_keys(text, "nemo");
    s->S = atoi(value_of(text, "pipeline_model_parallel_size:"));
    int L = atoi(value_of(text, "\n  num_layers:"));
    const char *f = value_of(text, "num_layers_in_first_pipeline_stage:");
    int first = f ? atoi(f) : -1; /* value_of's buffer is reused */
    const char *l = value_of(text, "num_layers_in_last_pipeline_stage:");
    int last = l ? atoi(l) : -1;
    int rest = L - (first > 0 ? first : 0) - (last > 0 ? last : 0);
    int shared = s->S - (first > 0) - (last > 0);
    for (int k = 0; k < s->S; k++)
        s->blocks[k] = shared > 0 ? rest / shared : 0;
    if (first > 0)
        s->blocks[0] = first;
    if (last > 0)
        s->blocks[s->S - 1] = last;
    CU_ASSERT(shared == 0 || rest % shared == 0);
    const char *g = value_of(text, "activations_checkpoint_granularity:");
    every_stage(s, 0, "");
    if (g && strcmp(g, "full") == 0) {
        CU_ASSERT(strcmp(value_of(text, "activations_checkpoint_method:"), "block") == 0);
        every_stage(s, atoi(value_of(text, "activations_checkpoint_num_layers:")), "");
    } else if (g && strcmp(g, "selective") == 0) {
        char mods[64];
        const char *m = value_of(text, "recompute_modules:");
        int j = 0;
        for (; *m; m++)
            if (*m != '[' && *m != ']' && *m != ',')
                mods[j++] = *m;
        mods[j] = '\0';
        every_stage(s, 0, mods);
    }
    if (py != NULL)
        read_stages_py(py, s);
    s->micro_batch = atoi(value_of(text, "micro_batch_size:"));
    s->global_batch = atoi(value_of(text, "global_batch_size:"));
}

/* ColossalAI: num_layers_per_stage; HuggingFace's gradient_checkpointing_enable() recomputes
 * every block of a GPT-2 stage, the first num_ckpt_layers_per_stage[s] of a Llama one. */
static void read_colossalai(const char *text, int gpt2, struct setting *s)
{
    const char *call = strstr(text, "HybridParallelPlugin(\n");
    CU_ASSERT_FATAL(call != NULL);
    for (const char *line = strchr(call, '\n') + 1; *line && *line != ')';
         line = strchr(line, '\n') + 1) {
        char key[64];
        CU_ASSERT_FATAL(sscanf(line, " %63[a-z_]=", key) == 1);
        CU_ASSERT(accepted("colossalai", key, NULL));
    }
    const char *config = strstr(text, "Config(\n");
    if (config != NULL) { /* the HuggingFace config's keywords */
        const char *cls = config;
        while (cls > text && cls[-1] != ' ')
            cls--;
        for (const char *line = strchr(config, '\n') + 1; *line && *line != ')';
             line = strchr(line, '\n') + 1) {
            char key[64], full[160];
            CU_ASSERT_FATAL(sscanf(line, " %63[a-z_]=", key) == 1);
            snprintf(full, sizeof full, "%.*s.%s", (int)(config + 6 - cls), cls, key);
            CU_ASSERT(accepted_in("colossalai", "model_keys", full, NULL));
        }
    }
    s->S = parse_list(text, "num_layers_per_stage=", s->blocks);
    int on = strstr(text, "model.gradient_checkpointing_enable(") != NULL, ckpt[MAX_STAGES];
    int listed = parse_list(text, "num_ckpt_layers_per_stage=", ckpt);
    for (int k = 0; k < s->S; k++) {
        s->n[k] = !on ? 0 : gpt2 ? s->blocks[k] : listed > 0 ? ckpt[k] : s->blocks[k];
        s->modules[k][0] = '\0';
    }
    CU_ASSERT(!gpt2 || listed < 0);
    s->micro_batch = atoi(value_of(text, "microbatch_size="));
    s->global_batch = 0;
}

/* FlagScale: the layer split, each row [stages, micro-batches, blocks] of the per-stage
 * counts (every micro-batch of the step alike), or selective for every stage. */
static void read_flagscale(const char *text, int M, struct setting *s)
{
    yaml_keys(text, "flagscale");
    s->S = parse_list(text, "hetero_pipeline_layer_split:", s->blocks);
    CU_ASSERT_EQUAL(atoi(value_of(text, "pipeline_model_parallel_size:")), s->S);
    every_stage(s, 0, "");
    const char *g = value_of(text, "recompute_granularity:");
    if (g && strcmp(g, "selective") == 0) {
        char mods[64];
        const char *m = value_of(text, "recompute_modules:");
        int j = 0;
        for (; *m; m++)
            if (*m != '[' && *m != ']' && *m != ',')
                mods[j++] = *m;
        mods[j] = '\0';
        every_stage(s, 0, mods);
    } else if (g) {
        const char *row = strstr(text, "recompute_num_layers_per_stage_micro_batch:");
        CU_ASSERT_FATAL(row != NULL);
        for (int k = 0; k < s->S;) {
            int run, micro, n;
            row = strstr(row, "- [");
            CU_ASSERT_FATAL(row && sscanf(row, "- [%d, %d, %d]", &run, &micro, &n) == 3);
            CU_ASSERT_EQUAL(micro, M);
            for (int r = 0; r < run; r++)
                s->n[k++] = n;
            row++;
        }
    }
    s->micro_batch = atoi(value_of(text, "micro_batch_size:"));
    s->global_batch = atoi(value_of(text, "global_batch_size:"));
}

/* ---- the reader's actions on the plan's layer costs ---- */

static int is_block(const struct plan *p, int layer)
{
    return model_layer_kind(&p->model, layer) == MODEL_LAYER_BLOCK;
}

/* The profile option Megatron-core's modules stand for in a --for profile. */
static const char *module_option(const char *modules)
{
    if (strstr(modules, "core_attn") && strstr(modules, "mlp"))
        return "attn+mlp";
    return strstr(modules, "core_attn") ? "attn" : "mlp";
}

/* Plan p (its file) with the setting's actions, costed and simulated: 0, or -1 when the
 * split differs. */
static int apply_setting(struct plan *p, const struct setting *s)
{
    if (s->S != p->n_stages)
        return -1;
    for (int k = 0; k < s->S; k++) {
        struct plan_stage *st = &p->stages[k];
        int blocks = 0, offloaded = 0;
        for (int l = st->first; l <= st->last; l++)
            blocks += is_block(p, l);
        if (blocks != s->blocks[k])
            return -1;
        int off = s->offload_fraction > 0 ? blocks - (int)(blocks * (1 - s->offload_fraction)) : 0;
        st->optimizer = s->host ? COST_PLACE_HOST : COST_PLACE_DEVICE;
        for (int l = 0, b = 0; l < plan_stage_layer_count(st); l++) {
            st->recompute[l] = COST_KEEP;
            st->place[l] = COST_PLACE_DEVICE;
            st->offload_option[l] = -1;
            st->prefetch_ahead[l] = 0;
            if (!is_block(p, st->first + l))
                continue;
            const struct layer_cost *c = &st->layers[l];
            const char *want = s->modules[k][0] ? module_option(s->modules[k])
                               : offloaded < off ? "attn"
                                                 : NULL;
            int option = -1;
            for (int o = 0; want && o < c->n_options; o++)
                if (strcmp(c->options[o].name, want) == 0)
                    option = o;
            if (b < s->n[k])
                st->recompute[l] = COST_FULL;
            else if (s->modules[k][0]) {
                CU_ASSERT_FATAL(option >= 0);
                st->recompute[l] = (unsigned char)(COST_OPTION + option);
            } else if (offloaded < off) {
                CU_ASSERT_FATAL(option >= 0);
                st->offload_option[l] = (signed char)option;
                st->prefetch_ahead[l] = COST_PREFETCH_AHEAD;
                offloaded++;
            }
            b++;
        }
    }
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(planner_finish(p, &e) == ERR_OK);
    return 0;
}

/* ---- one export, read back ---- */

struct exported {
    int rc;
    char *out, *err, *py;
    struct setting s;
};

static void exported_free(struct exported *x)
{
    free(x->out);
    free(x->err);
    free(x->py);
}

static struct device_table devices;

/* A copy of p (its file form round-trips exactly). */
static void plan_copy(const struct plan *p, struct plan *out)
{
    struct err e;
    err_clear(&e);
    cJSON *j = plan_to_json(p);
    CU_ASSERT_FATAL(plan_parse(j, "copy", out, &e) == ERR_OK);
    cJSON_Delete(j);
}

/* planner_export of p to `to` (the work of `ballast export`), read back. */
static void export_read(const struct plan *p, const char *to, struct exported *x)
{
    size_t n1, n2, n3;
    char *py;
    FILE *out = open_memstream(&x->out, &n1), *err = open_memstream(&x->err, &n2),
         *stages = open_memstream(&py, &n3);
    struct export_options o = {.to = to, .devices = &devices, .note = err, .stages = stages,
                               .stages_module = "ballast_stages", .plan_name = "plan.json"};
    struct err e;
    err_clear(&e);
    x->rc = planner_export(out, p, &o, &e);
    fclose(out);
    fclose(stages);
    fprintf(err, "%s", e.msg);
    fclose(err);
    x->py = n3 > 0 ? py : NULL;
    if (n3 == 0)
        free(py);
    if (x->rc != 0)
        return;
    memset(&x->s, 0, sizeof x->s);
    if (strncmp(to, "megatron", 8) == 0)
        read_megatron(x->out, x->py, &x->s);
    else if (strncmp(to, "nemo", 4) == 0)
        read_nemo(x->out, x->py, &x->s);
    else if (strcmp(to, "colossalai") == 0)
        read_colossalai(x->out, p->model.kind == MODEL_KIND_GPT, &x->s);
    else
        read_flagscale(x->out, p->micro_batches, &x->s);
    read_launch(x->out, &x->s);
    CU_ASSERT(x->py == NULL || strncmp(to, "megatron", 8) == 0 || strncmp(to, "nemo", 4) == 0);
    CU_ASSERT(x->py == NULL || strstr(x->out, "per-rank recompute") != NULL);
    if (p->model.kind != MODEL_KIND_CUSTOM)
        CU_ASSERT_EQUAL(x->s.micro_batch, p->model.micro_batch);
}

/* The note's numbers of a plan made again: step and each stage's GiB as the framework runs
 * it; 0 when there is no such note. */
static int note_numbers(const char *err, double *step, double *gib, int S)
{
    const char *at = strstr(err, "cannot run the plan as it is");
    if (at == NULL)
        return 0;
    at = strstr(at, "limit GiB\n");
    CU_ASSERT_FATAL(at != NULL);
    at += 10;
    for (int k = 0; k < S; k++) {
        int index, blocks;
        char device[64];
        double was, now, limit;
        CU_ASSERT_FATAL(sscanf(at, " %d %63s %d %lf %lf %lf", &index, device, &blocks, &was,
                               &now, &limit) == 6);
        gib[k] = now;
        at = strchr(at, '\n') + 1;
    }
    at = strstr(at, "runs it ");
    CU_ASSERT_FATAL(at != NULL);
    *step = atof(at + 8);
    return 1;
}

/* The export of `plan` to `to`, read back, costed and simulated: the plan's numbers exactly
 * when no note was made, else the note's. *replanned: a note was made. */
static void check_export(const struct plan *plan, const char *to, int *rc, int *replanned)
{
    struct exported x = {0};
    export_read(plan, to, &x);
    *rc = x.rc;
    *replanned = 0;
    if (x.rc != 0) {
        CU_ASSERT(x.rc == ERR_INPUT || x.rc == ERR_NOFIT);
        CU_ASSERT(strstr(x.err, x.rc == ERR_NOFIT ? "over its" : "--to") != NULL);
        exported_free(&x);
        return;
    }
    struct plan p;
    plan_copy(plan, &p);
    double step, gib[MAX_STAGES];
    if (apply_setting(&p, &x.s) != 0) {
        printf("\n  --to %s: the reader's split differs from the plan's:\n%s\n", to, x.out);
        CU_FAIL_FATAL("split");
    }
    *replanned = note_numbers(x.err, &step, gib, p.n_stages);
    if (!*replanned && !test_close(p.iteration_ms, plan->iteration_ms, 1e-9, 1e-12))
        printf("\n  --to %s: read back %.6f ms, planned %.6f:\n%s\n%s\n", to, p.iteration_ms,
               plan->iteration_ms, x.out, x.err);
    if (!*replanned) {
        CU_ASSERT(test_close(p.iteration_ms, plan->iteration_ms, 1e-9, 1e-12));
        for (int k = 0; k < p.n_stages; k++)
            CU_ASSERT_EQUAL(p.stages[k].memory_bytes, plan->stages[k].memory_bytes);
    } else {
        CU_ASSERT(test_close(p.iteration_ms, step, 5e-4, 0));
        for (int k = 0; k < p.n_stages; k++) {
            CU_ASSERT(test_close(p.stages[k].memory_bytes / GIB, gib[k], 5e-4, 0));
            CU_ASSERT(p.stages[k].memory_bytes <= p.stages[k].memory_limit_bytes);
        }
    }
    int gpus = 0;
    for (int k = 0; k < p.n_stages; k++)
        gpus += p.stages[k].tp;
    CU_ASSERT_EQUAL(x.s.gpus, gpus * p.stages[0].dp);
    if (x.s.global_batch > 0)
        CU_ASSERT_EQUAL(x.s.global_batch, p.micro_batches * p.model.micro_batch * p.stages[0].dp);
    plan_free(&p);
    exported_free(&x);
}

/* ---- planning for a target ---- */

/* `ballast plan --cluster C [--repartition] --for T` in process: its status. */
static int plan_for(const struct cluster *c, const char *target, int repartition,
                    struct plan *out)
{
    struct plan_options o;
    struct err e;
    err_clear(&e);
    plan_options_default(&o);
    o.repartition = repartition;
    o.framework = framework_find(target, NULL);
    o.estimate = estimate_profile;
    o.estimate_for = estimate_for_framework;
    int rc = planner_make(c, &o, out, &e);
    if (rc != 0 && rc != ERR_NOFIT && !strstr(e.msg, "cannot run this split"))
        printf("\n  plan --for %s: %s\n", target, e.msg);
    return rc;
}

/* The blocks of each stage of the cluster's own split. */
static int cluster_split(const struct cluster *c, int *blocks)
{
    for (int s = 0; s < c->n_stages; s++) {
        blocks[s] = 0;
        for (int l = c->stages[s].first; l <= c->stages[s].last; l++)
            blocks[s] += model_layer_kind(&c->model, l) == MODEL_LAYER_BLOCK;
    }
    return c->n_stages;
}

/* Whether the target's configuration can say a split: Megatron-LM's layout any; NeMo's first
 * and last count (at least 1) and the rest even; ColossalAI's and FlagScale's lists at least
 * one block a stage. */
static int split_runnable(const char *target, const int *blocks, int S)
{
    if (strncmp(target, "megatron", 8) == 0)
        return 1;
    for (int s = 0; s < S; s++)
        if (blocks[s] < 1)
            return 0;
    for (int s = 2; strncmp(target, "nemo", 4) == 0 && s < S - 1; s++)
        if (blocks[s] != blocks[1])
            return 0;
    return 1;
}

/* A plan made --for a target exports to it with no note, and is what the readers read. On
 * the cluster's own split, a target that cannot run that split refuses. */
static void for_and_back(const struct cluster *c, int repartition, double *ms)
{
    int blocks[MAX_STAGES], S = cluster_split(c, blocks);
    for (int t = 0; t < N_TARGETS; t++) {
        struct plan p;
        int rc = plan_for(c, targets[t], repartition, &p);
        int runnable = repartition || split_runnable(targets[t], blocks, S);
        CU_ASSERT(runnable ? rc == 0 || rc == ERR_NOFIT : rc == ERR_INPUT);
        ms[t] = rc == 0 ? p.iteration_ms : INFINITY;
        if (rc != 0)
            continue;
        CU_ASSERT(strcmp(p.framework.target, targets[t]) == 0);
        int xrc, replanned;
        check_export(&p, targets[t], &xrc, &replanned);
        CU_ASSERT_EQUAL(xrc, 0);
        CU_ASSERT_EQUAL(replanned, 0);
        plan_free(&p);
    }
    /* per-rank settings are a superset of the command line's: never slower */
    CU_ASSERT(ms[0] <= ms[1] * (1 + 1e-12));
    CU_ASSERT(ms[2] <= ms[3] * (1 + 1e-12));
}

/* A Ballast plan exported to every target: the plan (no note), the framework's numbers
 * beside it (a note), or a refusal with the reason. */
static void ballast_to_all(const struct cluster *c, int repartition, int *replans)
{
    struct plan p;
    if (plan_for(c, "ballast", repartition, &p) != 0)
        return;
    for (int t = 0; t < N_TARGETS; t++) {
        int rc, replanned;
        check_export(&p, targets[t], &rc, &replanned);
        *replans += replanned;
    }
    plan_free(&p);
}

/* Shipped clusters whose devices run bf16 (V100 and T4 ones are refused: below). */
static const char *const shipped[] = {"llama2-7b-h100-a100-8.json", "h100-a100-l4-16.json",
                                      "llama3-8b-h100-h200-16.json", "cpu-3.json",
                                      "llama-cpu-3.json"};

static void test_shipped(void)
{
    int replans = 0;
    for (size_t k = 0; k < sizeof shipped / sizeof *shipped; k++) {
        char file[1024];
        struct cluster c;
        struct err e;
        double ms[N_TARGETS], again[N_TARGETS];
        err_clear(&e);
        snprintf(file, sizeof file, "%sclusters/%s", CONFIGS, shipped[k]);
        CU_ASSERT_FATAL(cluster_load(file, &c, &e) == ERR_OK);
        for_and_back(&c, 0, ms);
        for_and_back(&c, 1, again);
        for (int t = 0; t < N_TARGETS; t++) /* searching the split never loses */
            CU_ASSERT(again[t] <= ms[t] * (1 + 1e-9) || isinf(ms[t]));
        ballast_to_all(&c, 0, &replans);
        ballast_to_all(&c, 1, &replans);
        cluster_free(&c);
    }
    CU_ASSERT(replans > 0); /* the comparison is exercised */
}

/* ---- random small clusters ---- */

/* Each stage's memory under `method` (none or full) on the cluster as it is. */
static void method_memory(const struct cluster *c, enum plan_method method, double *memory)
{
    struct plan_options o;
    struct plan p;
    struct err e;
    err_clear(&e);
    plan_options_default(&o);
    o.method = method;
    CU_ASSERT_FATAL(planner_make(c, &o, &p, &e) == ERR_OK);
    for (int s = 0; s < p.n_stages; s++)
        memory[s] = (double)p.stages[s].memory_bytes;
    plan_free(&p);
}

/* A random GPT or Llama on the CPU (estimated), S stages whose memory lies between what
 * recomputing every layer needs and a little more than keeping them all does. */
static void random_cluster(struct test_rng *r, int k, struct cluster *c)
{
    int llama = (int)test_rng_int(r, 0, 1), heads = 2 << test_rng_int(r, 0, 2);
    int L = (int)test_rng_int(r, 3, 9), S = (int)test_rng_int(r, 2, 4);
    char text[4096], name[64], prof_name[64], path[1024];
    struct model m;
    struct profile prof;
    struct err e;
    err_clear(&e);
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-model/1\", \"kind\": \"%s\", \"n_layer\": %d, "
             "\"n_embd\": %d, \"n_head\": %d, %s\"seq_len\": %d, \"vocab_size\": %d, "
             "\"micro_batch\": %d, \"dtype\": \"%s\"%s}",
             llama ? "llama" : "gpt", L, heads * 16, heads,
             llama ? "\"n_kv_head\": 2, \"ffn_hidden\": 96, \"rope_theta\": 10000, "
                     "\"norm_eps\": 1e-5, "
                   : "",
             (int)test_rng_int(r, 32, 128), (int)test_rng_int(r, 100, 400),
             (int)test_rng_int(r, 1, 3), test_rng_int(r, 0, 1) ? "bf16" : "fp32",
             test_rng_int(r, 0, 2) == 0 ? ", \"attention\": \"flash\"" : "");
    snprintf(name, sizeof name, "rmodel%d.json", k);
    snprintf(path, sizeof path, "%s", test_write(name, text));
    CU_ASSERT_FATAL(model_load(path, &m, &e) == ERR_OK);
    CU_ASSERT_FATAL(estimate_profile(&devices, devices_find(&devices, "cpu"), &m, &prof, &e) ==
                    ERR_OK);
    snprintf(prof_name, sizeof prof_name, "rprof%d.json", k);
    CU_ASSERT_FATAL(profile_write(test_path(prof_name), &prof, &e) == ERR_OK);
    profile_free(&prof);
    int n = snprintf(text, sizeof text,
                     "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", "
                     "\"micro_batches\": %d, \"stages\": [",
                     (int)test_rng_int(r, 2, 8));
    for (int s = 0; s < S; s++)
        n += snprintf(text + n, sizeof text - (size_t)n,
                      "%s{\"device\": \"cpu\", \"memory_bytes\": %lld, \"profile\": \"%s\"}",
                      s ? ", " : "", 1LL << 34, prof_name);
    snprintf(text + n, sizeof text - (size_t)n, "]}");
    snprintf(name, sizeof name, "rcluster%d.json", k);
    CU_ASSERT_FATAL(cluster_load(test_write(name, text), c, &e) == ERR_OK);
    double hi[MAX_STAGES], lo[MAX_STAGES];
    method_memory(c, METHOD_NONE, hi);
    method_memory(c, METHOD_FULL, lo);
    for (int s = 0; s < S; s++)
        c->stages[s].memory_bytes = (int64_t)(lo[s] + (hi[s] - lo[s]) * test_rng_double(r, 0.2, 1.2));
}

static void test_random(void)
{
    struct test_rng r = {24};
    int replans = 0, planned = 0;
    for (int k = 0; k < 14; k++) {
        struct cluster c;
        double ms[N_TARGETS];
        random_cluster(&r, k, &c);
        for_and_back(&c, k % 2, ms);
        for (int t = 0; t < N_TARGETS; t++)
            planned += !isinf(ms[t]);
        ballast_to_all(&c, 0, &replans);
        cluster_free(&c);
    }
    CU_ASSERT(planned > 20);
    CU_ASSERT(replans > 0);
}

int main(void)
{
    CU_initialize_registry();
    struct err e;
    err_clear(&e);
    if (devices_load(devices_default_file(), &devices, &e)) {
        printf("%s\n", e.msg);
        return 1;
    }
    CU_pSuite s = CU_add_suite("frameworks", NULL, NULL);
    CU_add_test(s, "shipped clusters: --for each target, exported and read back", test_shipped);
    CU_add_test(s, "random clusters: --for each target, exported and read back", test_random);
    int rc = test_main();
    cJSON_Delete(all_keys);
    devices_free(&devices);
    return rc;
}
