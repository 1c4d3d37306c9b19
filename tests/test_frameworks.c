/* The frameworks as planning targets and the exports (issue 24), against readers written here
 * from each framework's semantics, independent of planner/methods/framework.c: a Megatron-LM layout
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

#include "choice.h"
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
    int pp; /* pipeline ranks: S, or S / v where each rank holds v chunks (interleaved) */
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
    CU_ASSERT_EQUAL(pp, s->pp > 0 ? s->pp : s->S);
}

/* The per-rank file's PIPELINE_STAGES: each line's recompute fields, a pipeline rank each;
 * a rank's chunks (stage k on rank k mod pp) take its fields, the first n of each chunk's
 * blocks (Megatron-core's block method counts within each chunk's TransformerBlock). */
static void read_stages_py(const char *py, struct setting *s)
{
    const char *at = strstr(py, "PIPELINE_STAGES = [");
    int pp = s->pp > 0 ? s->pp : s->S;
    CU_ASSERT_FATAL(at != NULL);
    for (int k = 0; k < pp; k++) {
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
    const char *end = strstr(at, "\n]"), *more = strstr(at + 1, "\n    {");
    CU_ASSERT(end != NULL && (more == NULL || more > end)); /* a line a rank, no more */
    for (int k = s->S - 1; k >= pp; k--) { /* ranks' fields onto their later chunks */
        int rank = k % pp;
        s->n[k] = s->n[rank] < s->blocks[k] ? s->n[rank] : s->blocks[k];
        memcpy(s->modules[k], s->modules[rank], sizeof s->modules[k]);
    }
    for (int k = 0; k < pp; k++)
        s->n[k] = s->n[k] < s->blocks[k] ? s->n[k] : s->blocks[k];
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
    /* a layout of pp x v stages: stage i on rank i mod pp, its chunk i / pp
     * (pipeline_parallel_layer_layout.py) */
    s->pp = atoi(value_of(text, "--pipeline-model-parallel-size"));
    CU_ASSERT_FATAL(s->pp > 0 && s->S % s->pp == 0);
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

/* A YAML list of recompute modules, "[core_attn, mlp]", as "core_attn mlp". */
static const char *yaml_modules(const char *text)
{
    static char mods[64];
    const char *m = value_of(text, "recompute_modules:");
    int j = 0;
    for (; *m && j < 63; m++)
        if (*m != '[' && *m != ']' && *m != ',')
            mods[j++] = *m;
    mods[j] = '\0';
    return mods;
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
        every_stage(s, 0, yaml_modules(text));
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
        every_stage(s, 0, yaml_modules(text));
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
            st->actions[l].choice = COST_KEEP;
            st->actions[l].place = COST_PLACE_DEVICE;
            st->actions[l].offload_option = -1;
            st->actions[l].prefetch_ahead = 0;
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
                st->actions[l].choice = COST_FULL;
            else if (s->modules[k][0]) {
                CU_ASSERT_FATAL(option >= 0);
                st->actions[l].choice = (unsigned char)(COST_OPTION + option);
            } else if (offloaded < off) {
                CU_ASSERT_FATAL(option >= 0);
                st->actions[l].offload_option = (signed char)option;
                st->actions[l].prefetch_ahead = COST_PREFETCH_AHEAD;
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
    for (int k = 0; k < p.n_stages / (p.virtual_stages > 1 ? p.virtual_stages : 1); k++)
        gpus += p.stages[k].tp; /* a GPU once: its first chunk is stage k */
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

/* `plan --for T [--repartition] --min-gain G` in process: its status. */
static int plan_for_gain(const struct cluster *c, const char *target, int repartition,
                         double min_gain, struct plan *out)
{
    struct plan_options o;
    struct err e;
    err_clear(&e);
    plan_options_default(&o);
    o.repartition = repartition;
    o.min_gain = min_gain;
    o.framework = framework_find(target, NULL);
    o.estimate = estimate_profile;
    o.estimate_for = estimate_for_framework;
    return planner_make(c, &o, out, &e);
}

/* --min-gain with --for: against the same target's fastest plan (--min-gain 0), each margin's
 * plan steps within that margin of it and is no less simple (choice_key), and a wider margin
 * never gives a less simple plan; a plan slower than the fastest says how much faster that
 * was. */
static void test_min_gain(void)
{
    static const double gains[] = {0.005, 0.05, 0.25};
    struct test_rng r = {31};
    int simpler = 0, compared = 0;
    for (int k = 0; k < 10; k++) {
        struct cluster c;
        random_cluster(&r, k, &c);
        for (int t = 0; t < N_TARGETS; t++) {
            struct plan fastest;
            struct plan_options plain;
            plan_options_default(&plain);
            if (plan_for_gain(&c, targets[t], k % 2, 0, &fastest))
                continue;
            struct choice_key prev, key;
            choice_key_of(&fastest, &plain, &prev);
            for (size_t g = 0; g < sizeof gains / sizeof gains[0]; g++) {
                struct plan p;
                CU_ASSERT_FATAL(plan_for_gain(&c, targets[t], k % 2, gains[g], &p) == ERR_OK);
                CU_ASSERT(p.iteration_ms <= choice_cap(fastest.iteration_ms, gains[g]));
                choice_key_of(&p, &plain, &key);
                CU_ASSERT(choice_key_cmp(&key, &prev) <= 0);
                if (p.iteration_ms > choice_cap(fastest.iteration_ms, 0)) {
                    CU_ASSERT(fabs(p.fastest_ms - fastest.iteration_ms) <=
                              1e-9 * fastest.iteration_ms);
                    simpler++;
                }
                prev = key;
                compared++;
                plan_free(&p);
            }
            plan_free(&fastest);
        }
        cluster_free(&c);
    }
    CU_ASSERT(compared > 60);
    CU_ASSERT(simpler > 0); /* not vacuous: some margin kept a slower, simpler plan */
}

static double plan_ms_file(const char *file)
{
    char *text = test_read(file);
    cJSON *p = cJSON_Parse(text);
    free(text);
    double ms = cJSON_GetObjectItem(p, "iteration_ms")->valuedouble;
    cJSON_Delete(p);
    return ms;
}

/* ---- the command line: files, refusals, other plan files ---- */

/* `ballast ARGS`: its status, with standard error in *err (caller frees). */
static int run(const char *args, char **err)
{
    return test_run(args, NULL, err);
}

static const char *config(const char *name)
{
    static char path[8][1024];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 1024, "%s%s", CONFIGS, name);
    return p;
}

/* `ballast profile --model MODEL --estimate --device DEVICE EXTRA -o PATH`. */
static void estimate_file(const char *model, const char *device, const char *extra,
                          const char *path)
{
    char args[4096];
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device %s %s -o '%s'", model,
             device, extra, path);
    CU_ASSERT_FATAL(run(args, NULL) == 0);
}

/* A cluster file of `stages` gpt-tiny stages on `device` (its profile estimated with `model`,
 * a model file), each of `memory` bytes: its path. */
static const char *tiny_cluster(const char *name, const char *model, const char *device,
                                int stages, long long memory)
{
    char prof[1024], text[4096];
    snprintf(prof, sizeof prof, "%s", test_path("tiny-profile.json"));
    estimate_file(model, device, "", prof);
    int n = snprintf(text, sizeof text, "{\"format\": \"ballast-cluster/1\", \"schedule\": "
                     "\"1f1b\", \"micro_batches\": 4, \"stages\": [");
    for (int s = 0; s < stages; s++)
        n += snprintf(text + n, sizeof text - (size_t)n,
                      "%s{\"device\": \"%s\", \"memory_bytes\": %lld, \"profile\": "
                      "\"tiny-profile.json\"}", s ? ", " : "", device, memory);
    snprintf(text + n, sizeof text - (size_t)n, "]}");
    return test_write(name, text);
}

/* Bad input: an unknown target, a file of another format, a split the framework cannot run
 * (exit 2); a stage that does not fit as the framework runs it (exit 3, the stage and its
 * bytes); nothing written on any of them. */
static void test_refusals(void)
{
    char args[4096], *err = NULL, plan[1024], out[1024];
    snprintf(plan, sizeof plan, "%s", test_path("refuse-plan.json"));
    snprintf(out, sizeof out, "%s", test_path("refuse-out.txt"));
    snprintf(args, sizeof args, "plan --cluster '%s' --quiet -o '%s'", config("clusters/cpu-3.json"),
             plan);
    CU_ASSERT_FATAL(run(args, NULL) == 0);
    snprintf(args, sizeof args, "export --plan '%s' --to pytorch -o '%s'", plan, out);
    CU_ASSERT_EQUAL(run(args, &err), 2);
    CU_ASSERT(err && strstr(err, "\"pytorch\", expected megatron"));
    free(err);
    snprintf(args, sizeof args, "export --plan '%s' --to megatron -o '%s'",
             config("clusters/cpu-3.json"), out);
    CU_ASSERT_EQUAL(run(args, &err), 2);
    CU_ASSERT(err && strstr(err, "format: \"ballast-cluster/1\", expected a plan"));
    free(err);
    /* cpu-3's split, 2 blocks, 3, 1: NeMo's middle is one stage, so it runs; its first stage
     * of one block alone on a two-stage cut refuses below */
    char cut[4096];
    snprintf(cut, sizeof cut, "%s", test_read(config("clusters/cpu-3.json")));
    char *text = test_read(config("clusters/cpu-3.json"));
    cJSON *c = cJSON_Parse(text);
    free(text);
    cJSON *st = cJSON_GetObjectItem(c, "stages");
    cJSON_AddItemToArray(st, cJSON_Duplicate(cJSON_GetArrayItem(st, 2), 1));
    int ranges[4][2] = {{0, 1}, {2, 4}, {5, 5}, {6, 7}}; /* blocks 1, 3, 1, 1: middle uneven */
    for (int s = 0; s < 4; s++) {
        cJSON *r = cJSON_GetObjectItem(cJSON_GetArrayItem(st, s), "layers");
        cJSON_SetNumberValue(cJSON_GetArrayItem(r, 0), ranges[s][0]);
        cJSON_SetNumberValue(cJSON_GetArrayItem(r, 1), ranges[s][1]);
        cJSON_ReplaceItemInObject(cJSON_GetArrayItem(st, s), "profile",
                                  cJSON_CreateString(config("profiles/estimated/gpt-tiny/cpu.json")));
    }
    char *json = cJSON_Print(c);
    const char *uneven = test_write("uneven.json", json);
    cJSON_free(json);
    snprintf(args, sizeof args, "plan --cluster '%s' --quiet -o '%s'", uneven, plan);
    CU_ASSERT_FATAL(run(args, NULL) == 0);
    remove(out);
    snprintf(args, sizeof args, "export --plan '%s' --to nemo -o '%s'", plan, out);
    CU_ASSERT_EQUAL(run(args, &err), 2);
    CU_ASSERT(err && strstr(err, "stage 2 holds 1 blocks and stage 1 3"));
    CU_ASSERT(test_read(out) == NULL);
    free(err);
    /* --method full recomputes the head, which the frameworks keep: with the last stage cut
     * to that plan's memory, no setting fits there */
    snprintf(args, sizeof args, "plan --cluster '%s' --method full --quiet -o '%s'",
             config("clusters/cpu-3.json"), plan);
    CU_ASSERT_FATAL(run(args, NULL) == 0);
    text = test_read(plan);
    cJSON *p = cJSON_Parse(text);
    free(text);
    double need = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(p, "stages"), 2),
                                      "memory_bytes")->valuedouble;
    cJSON_Delete(p);
    cJSON_SetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(st, 2), "memory_bytes"), need);
    cJSON_DeleteItemFromArray(st, 3);
    int three[3][2] = {{0, 2}, {3, 5}, {6, 7}};
    for (int s = 0; s < 3; s++) {
        cJSON *r = cJSON_GetObjectItem(cJSON_GetArrayItem(st, s), "layers");
        cJSON_SetNumberValue(cJSON_GetArrayItem(r, 0), three[s][0]);
        cJSON_SetNumberValue(cJSON_GetArrayItem(r, 1), three[s][1]);
    }
    json = cJSON_Print(c);
    const char *tight = test_write("tight.json", json);
    cJSON_free(json);
    cJSON_Delete(c);
    snprintf(args, sizeof args, "plan --cluster '%s' --method full --quiet -o '%s'", tight, plan);
    CU_ASSERT_FATAL(run(args, NULL) == 0);
    snprintf(args, sizeof args, "export --plan '%s' --to megatron -o '%s'", plan, out);
    CU_ASSERT_EQUAL(run(args, &err), 3);
    char want[128];
    snprintf(want, sizeof want, "over its %.0f-byte limit", need);
    CU_ASSERT(err && strstr(err, "stage 2 (cpu, 1 blocks) needs") && strstr(err, want));
    CU_ASSERT(test_read(out) == NULL);
    free(err);
}

/* Precision and attention on devices below compute capability 8.0 (no bf16 tensor cores): bf16
 * refused with fp16 as the way out, flash attention with materialized attention; an fp16
 * materialized plan exports with dynamic loss scaling and the unfused kernel. A plan whose
 * stages' profiles assume different kernels is refused. */
static void test_devices(void)
{
    const char *kinds[] = {"bf16", "fp16\", \"attention\": \"flash", "fp16"};
    const char *want[] = {"no bf16 tensor cores", "FlashAttention", NULL};
    for (int k = 0; k < 3; k++) {
        char model[4096], args[4096], plan[1024], *err = NULL, *out = NULL;
        snprintf(model, sizeof model,
                 "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", \"n_layer\": 4, "
                 "\"n_embd\": 64, \"n_head\": 4, \"seq_len\": 64, \"vocab_size\": 256, "
                 "\"micro_batch\": 2, \"dtype\": \"%s\"}", kinds[k]);
        const char *cluster = tiny_cluster("v100.json", test_write("v100-model.json", model),
                                           "V100-32GB", 2, 30000000000LL);
        snprintf(plan, sizeof plan, "%s", test_path("v100-plan.json"));
        snprintf(args, sizeof args, "plan --cluster '%s' --quiet -o '%s'", cluster, plan);
        CU_ASSERT_FATAL(run(args, NULL) == 0);
        snprintf(args, sizeof args, "export --plan '%s' --to megatron", plan);
        int rc = test_run(args, &out, &err);
        if (want[k] != NULL) {
            CU_ASSERT_EQUAL(rc, 2);
            CU_ASSERT(err && strstr(err, want[k]) && strstr(err, "V100-32GB"));
            CU_ASSERT(err && strstr(err, k == 0 ? "\"dtype\": \"fp16\"" : "\"materialized\""));
        } else {
            CU_ASSERT_EQUAL(rc, 0);
            CU_ASSERT(out && strstr(out, "--fp16 \\\n--initial-loss-scale 4294967296 \\\n"
                                         "--min-loss-scale 1 \\\n--loss-scale-window 1000 \\\n"
                                         "--hysteresis 2"));
            CU_ASSERT(out && strstr(out, "--attention-backend unfused"));
        }
        free(err);
        free(out);
    }
    /* one stage's profile made --for megatron (flash), the other Ballast's (materialized) */
    char args[4096], prof[2][1024], plan[1024], text[4096], *err = NULL;
    const char *gpus[2] = {"A100-40GB", "A100-80GB"};
    for (int k = 0; k < 2; k++) {
        snprintf(prof[k], sizeof prof[k], "%s", test_path(k ? "plain.json" : "for-megatron.json"));
        estimate_file(config("models/gpt-tiny.json"), gpus[k], k ? "" : "--for megatron",
                      prof[k]);
    }
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 4, "
             "\"stages\": [{\"device\": \"A100-40GB\", \"memory_bytes\": 40000000000, "
             "\"profile\": \"for-megatron.json\"}, {\"device\": \"A100-80GB\", \"memory_bytes\": "
             "80000000000, \"profile\": \"plain.json\"}]}");
    snprintf(plan, sizeof plan, "%s", test_path("mixed-plan.json"));
    snprintf(args, sizeof args, "plan --cluster '%s' --quiet -o '%s'", test_write("mixed.json", text),
             plan);
    CU_ASSERT_FATAL(run(args, NULL) == 0);
    snprintf(args, sizeof args, "export --plan '%s' --to megatron", plan);
    CU_ASSERT_EQUAL(run(args, &err), 2);
    CU_ASSERT(err && strstr(err, "\"mixed\""));
    free(err);
}

/* A pool's plan (tp and dp, the distributed optimizer) and replicas files: alike pipelines are
 * one pipeline's replicas (FlagScale's meshes with dp 2); pipelines that differ are refused
 * naming the pipeline. */
static void test_pool_and_replicas(void)
{
    char args[4096], text[4096], prof[1024], plan[1024], *err = NULL, *out = NULL;
    snprintf(prof, sizeof prof, "%s", test_path("pool-a100.json"));
    estimate_file(config("models/gpt-tiny.json"), "A100-40GB", "", prof);
    snprintf(text, sizeof text,
             "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"global_batch\":16,"
             "\"link\":{\"gbps\":10,\"latency_us\":5},\"shard_optimizer\":true,\"pool\":["
             "{\"device\":\"A100-40GB\",\"count\":4,\"per_node\":2,\"memory_bytes\":40000000000,"
             "\"profile\":\"pool-a100.json\",\"node_link\":{\"gbps\":400,\"latency_us\":1}}]}");
    snprintf(plan, sizeof plan, "%s", test_path("pool-plan.json"));
    snprintf(args, sizeof args, "plan --cluster '%s' --quiet -o '%s'", test_write("pool.json", text),
             plan);
    CU_ASSERT_FATAL(run(args, NULL) == 0);
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(plan_load(plan, &p, &e) == ERR_OK);
    for (int t = 0; t < N_TARGETS; t++) {
        int rc, replanned;
        check_export(&p, targets[t], &rc, &replanned); /* launch: sum of tp x dp GPUs */
        CU_ASSERT(rc == 0);
    }
    plan_free(&p);
    /* two pipelines of cpu-3's stages: a replicas file */
    char *c3 = test_read(config("clusters/cpu-3.json"));
    cJSON *c = cJSON_Parse(c3);
    free(c3);
    cJSON *stages = cJSON_DetachItemFromObject(c, "stages"), *st;
    cJSON_ArrayForEach(st, stages)
        cJSON_ReplaceItemInObject(st, "profile",
                                  cJSON_CreateString(config("profiles/estimated/gpt-tiny/cpu.json")));
    cJSON *pipes = cJSON_AddArrayToObject(c, "pipelines");
    for (int k = 0; k < 2; k++) {
        cJSON *pipe = cJSON_CreateObject();
        cJSON_AddItemToObject(pipe, "stages", cJSON_Duplicate(stages, 1));
        cJSON_AddItemToArray(pipes, pipe);
    }
    char *json = cJSON_Print(c);
    snprintf(plan, sizeof plan, "%s", test_path("replicas.json"));
    snprintf(args, sizeof args, "plan --cluster '%s' --quiet -o '%s'", test_write("two.json", json),
             plan);
    cJSON_free(json);
    CU_ASSERT_FATAL(run(args, NULL) == 0);
    snprintf(args, sizeof args, "export --plan '%s' --to flagscale", plan);
    CU_ASSERT_EQUAL(test_run(args, &out, NULL), 0);
    CU_ASSERT(out && strstr(out, "hetero_process_meshes: [1, 1, 1, 2, 3]"));
    CU_ASSERT(out && strstr(out, "launch on 6 GPUs (tp 1, pp 3, dp 2)"));
    free(out);
    /* the second pipeline without its last stage (its layers moved to the one before) */
    cJSON *second = cJSON_GetObjectItem(cJSON_GetArrayItem(pipes, 1), "stages");
    cJSON_DeleteItemFromArray(second, 2);
    cJSON_SetNumberValue(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(second, 1),
                                                                "layers"), 1), 7);
    json = cJSON_Print(c);
    snprintf(args, sizeof args, "plan --cluster '%s' --quiet -o '%s'", test_write("two.json", json),
             plan);
    cJSON_free(json);
    cJSON_Delete(stages);
    cJSON_Delete(c);
    CU_ASSERT_FATAL(run(args, NULL) == 0);
    for (int t = 0; t < N_TARGETS; t++) {
        snprintf(args, sizeof args, "export --plan '%s' --to %s", plan, targets[t]);
        CU_ASSERT_EQUAL(run(args, &err), 2);
        CU_ASSERT(err && strstr(err, "pipelines[1] has 2 stages against pipeline 0's 3"));
        free(err);
    }
}

/* The cluster a plan runs on, in its stages' order with their links and memory (profiles of
 * `model`'s estimated ones): its path. */
static const char *cluster_of_plan(const char *plan_file, const char *model)
{
    char *text = test_read(plan_file);
    cJSON *p = cJSON_Parse(text), *c = cJSON_CreateObject(), *st;
    free(text);
    cJSON_AddStringToObject(c, "format", "ballast-cluster/1");
    cJSON_AddStringToObject(c, "schedule", "1f1b");
    cJSON_AddNumberToObject(c, "micro_batches", cJSON_GetObjectItem(p, "micro_batches")->valueint);
    cJSON_AddNumberToObject(c, "reserve_bytes",
                            cJSON_GetObjectItem(p, "reserve_bytes")->valuedouble);
    cJSON *stages = cJSON_AddArrayToObject(c, "stages");
    cJSON_ArrayForEach(st, cJSON_GetObjectItem(p, "stages"))
    {
        cJSON *o = cJSON_CreateObject();
        const char *device = cJSON_GetObjectItem(st, "device")->valuestring;
        char prof[1024];
        snprintf(prof, sizeof prof, "%sprofiles/estimated/%s/%s.json", CONFIGS, model, device);
        cJSON_AddStringToObject(o, "device", device);
        cJSON_AddNumberToObject(o, "memory_bytes",
                                cJSON_GetObjectItem(st, "capacity_bytes")->valuedouble);
        cJSON_AddStringToObject(o, "profile", prof);
        if (cJSON_GetObjectItem(st, "link"))
            cJSON_AddItemToObject(o, "link", cJSON_Duplicate(cJSON_GetObjectItem(st, "link"), 1));
        cJSON_AddItemToArray(stages, o);
    }
    char *json = cJSON_Print(c);
    const char *path = test_write("plan-cluster.json", json);
    cJSON_free(json);
    cJSON_Delete(c);
    cJSON_Delete(p);
    return path;
}

/* `ballast check` reads what `ballast export` wrote (Megatron-LM's arguments, NeMo's and
 * FlagScale's YAML, ColossalAI's keywords) back into the plan's step and memory; a
 * configuration that runs out of memory says which stage and by how much (exit 3). */
static void test_check(void)
{
    const char *cluster = config("clusters/llama2-7b-h100-a100-8.json");
    const char *from[] = {"megatron-cli", "nemo-cli", "flagscale", "colossalai"};
    const char *as[] = {"megatron", "nemo", "flagscale", "colossalai"};
    for (int k = 0; k < 4; k++) {
        char args[65536], plan[1024], file[1024], *out = NULL, *err = NULL;
        snprintf(plan, sizeof plan, "%s", test_path("check-plan.json"));
        snprintf(file, sizeof file, "%s", test_path(k == 3 ? "check.py" : "check.yaml"));
        snprintf(args, sizeof args, "plan --cluster '%s' --for %s --repartition --quiet -o '%s'",
                 cluster, from[k], plan);
        CU_ASSERT_FATAL(run(args, NULL) == 0);
        double ms = plan_ms_file(plan);
        snprintf(args, sizeof args, "export --plan '%s' --to %s -o '%s'", plan, from[k], file);
        CU_ASSERT_FATAL(run(args, NULL) == 0);
        char *text = test_read(file), config_text[32768] = "";
        if (k == 0) { /* the arguments, one a line, as a shell takes them */
            for (const char *l = text; *l; l += strcspn(l, "\n") + 1)
                if (l[0] == '-') {
                    strncat(config_text, l, strcspn(l, "\n"));
                    strcat(config_text, "\n");
                }
        } else if (k == 3) { /* the plugin's keywords, and the checkpointing switch */
            const char *call = strstr(text, "HybridParallelPlugin(\n") + 22;
            strncat(config_text, call, (size_t)(strstr(call, "\n)") - call));
            if (strstr(text, "gradient_checkpointing_enable"))
                strcat(config_text, " gradient_checkpointing=True");
        } else {
            snprintf(config_text, sizeof config_text, "%s", file);
        }
        free(text);
        char ordered[1024]; /* the search's device order, which the export's header gives */
        snprintf(ordered, sizeof ordered, "%s", cluster_of_plan(plan, "llama2-7b"));
        snprintf(args, sizeof args, "check --from %s --config '%s' --cluster '%s' --same-split",
                 as[k], config_text, ordered);
        CU_ASSERT_EQUAL(test_run(args, &out, &err), 0);
        char want[128];
        snprintf(want, sizeof want, "your configuration: step %.3f ms", ms);
        if (!out || !strstr(out, want))
            printf("\n  check --from %s: %s%s\n", as[k], out ? out : "", err ? err : "");
        CU_ASSERT(out && strstr(out, want));
        snprintf(want, sizeof want, "Ballast's best for");
        CU_ASSERT(out && strstr(out, want));
        free(out);
        free(err);
    }
    /* every block kept on a cluster too small for that: the stage that runs out, by how much */
    char args[4096], *out = NULL, *err = NULL;
    const char *small = tiny_cluster("oom.json", config("models/gpt-tiny.json"), "cpu", 3,
                                     20000000);
    snprintf(args, sizeof args, "check --from megatron --config '--pipeline-model-parallel-size "
             "3 --num-layers 6 --micro-batch-size 4 --global-batch-size 16' --cluster '%s'",
             small);
    CU_ASSERT_EQUAL(test_run(args, &out, &err), 3);
    CU_ASSERT(out && strstr(out, "out of memory by"));
    CU_ASSERT(err && strstr(err, "run out of memory"));
    free(out);
    free(err);
    snprintf(args, sizeof args, "check --from megatron --config '--pipeline-model-parallel-size "
             "2' --cluster '%s'", config("clusters/cpu-3.json"));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err && strstr(err, "pipeline size 2, but the cluster has 3 stages"));
    free(err);
    /* ColossalAI's per-stage counts without their list: refused by name, not a crash */
    snprintf(args, sizeof args, "check --from colossalai --config 'tp_size=1, pp_size=4, "
             "microbatch_size=1, gradient_checkpoint_config=Foo(num_ckpt_layers_per_stage=3)' "
             "--cluster '%s' --same-split", config("clusters/t4-4090-4.json"));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err && strstr(err, "check: gradient_checkpoint_config: \""));
    free(err);
}

/* The per-rank file runs: each rank's apply() sets its stage's fields, the recompute the plan
 * gives that stage (its recomputed blocks, counted from the plan file). */
static void test_stages_py(void)
{
    const char *cluster = config("clusters/h100-a100-l4-16.json");
    char args[4096], plan[1024], py[1024];
    snprintf(plan, sizeof plan, "%s", test_path("py-plan.json"));
    snprintf(py, sizeof py, "%s", test_path("ballast_stages.py"));
    snprintf(args, sizeof args, "plan --cluster '%s' --for megatron --quiet -o '%s'", cluster,
             plan);
    CU_ASSERT_FATAL(run(args, NULL) == 0);
    snprintf(args, sizeof args, "export --plan '%s' --to megatron -o '%s'", plan,
             test_path("py-launch.txt"));
    CU_ASSERT_FATAL(run(args, NULL) == 0); /* ballast_stages.py beside it */
    char *text = test_read(py);
    CU_ASSERT_FATAL(text != NULL);
    free(text);
    text = test_read(plan);
    cJSON *p = cJSON_Parse(text), *st;
    free(text);
    int want[MAX_STAGES], partial[MAX_STAGES], S = 0;
    cJSON_ArrayForEach(st, cJSON_GetObjectItem(p, "stages"))
    {
        partial[S] = cJSON_GetArraySize(cJSON_GetObjectItem(st, "recompute_options"));
        want[S++] = cJSON_GetArraySize(cJSON_GetObjectItem(st, "recompute"));
    }
    cJSON_Delete(p);
    snprintf(args, sizeof args,
             "cd '%s' && python3 -c 'import types, ballast_stages as b\n"
             "for r in range(len(b.PIPELINE_STAGES)):\n"
             "    c = b.apply(types.SimpleNamespace(), r)\n"
             "    print(r, c.recompute_granularity, c.recompute_num_layers or 0)'",
             test_tmpdir());
    FILE *f = popen(args, "r");
    CU_ASSERT_FATAL(f != NULL);
    char line[256], granularity[32];
    int rows = 0, r, n;
    while (fgets(line, sizeof line, f) && sscanf(line, "%d %31s %d", &r, granularity, &n) == 3) {
        CU_ASSERT(r == rows && r < S && n == want[r]);
        CU_ASSERT(strcmp(granularity, n ? "full" : partial[r] ? "selective" : "None") == 0);
        rows++;
    }
    CU_ASSERT_EQUAL(pclose(f), 0);
    CU_ASSERT_EQUAL(rows, S);
}

/* cpu-3-offload with roomy stages, planned recompute-only (nothing recomputed): blocks
 * [2, 3, 1] per stage. */
static void roomy_offload_plan(struct plan *p)
{
    struct cluster c;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(cluster_load(CONFIGS "clusters/cpu-3-offload.json", &c, &e) == ERR_OK);
    for (int s = 0; s < c.n_stages; s++)
        c.stages[s].memory_bytes = (int64_t)1 << 30;
    CU_ASSERT_FATAL(plan_for(&c, "ballast", 0, p) == ERR_OK);
    cluster_free(&c);
}

/* The first k[s] blocks of every stage send the attn option's tensors to host memory, the
 * rest keep all; costed and simulated. */
static void offload_attn(struct plan *p, const int *k)
{
    for (int s = 0; s < p->n_stages; s++) {
        struct plan_stage *st = &p->stages[s];
        for (int l = 0, block = 0; l < plan_stage_layer_count(st); l++) {
            st->actions[l].offload_option = -1;
            st->actions[l].prefetch_ahead = 0;
            if (!is_block(p, st->first + l))
                continue;
            CU_ASSERT_FATAL(strcmp(st->layers[l].options[0].name, "attn") == 0);
            if (block++ < k[s]) {
                st->actions[l].offload_option = 0;
                st->actions[l].prefetch_ahead = COST_PREFETCH_AHEAD;
            }
        }
    }
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(planner_finish(p, &e) == ERR_OK);
}

/* Megatron-LM's fine-grained activation offloading says an offload of the attn option's
 * tensors on the first blocks of every stage in one fraction (the reader gives each stage
 * int-rounded counts by Megatron-LM's own rule, post_warmup_callback: of a chunk's groups, the
 * last int(groups x (1 - fraction)) stay): exported as it is, with the reload margin said.
 * Where no fraction gives the plan's counts, the blocks are not the first, the plan also
 * recomputes, or a stage has no room for the margin, the framework's own settings are planned
 * again (a note, its numbers). */
static void test_megatron_offload(void)
{
    static const int cases[][3] = {{2, 3, 1}, {1, 2, 1}, {1, 0, 0}};
    for (int t = 0; t < 3; t++) {
        struct plan p;
        struct exported x = {0};
        roomy_offload_plan(&p);
        offload_attn(&p, cases[t]);
        int rc, replanned;
        check_export(&p, "megatron", &rc, &replanned);
        CU_ASSERT_EQUAL(rc, 0);
        CU_ASSERT_EQUAL(replanned, t == 2); /* [1 of 2, 0 of 3, 0 of 1]: no one fraction */
        export_read(&p, "megatron", &x);
        CU_ASSERT((strstr(x.out, "--fine-grained-activation-offloading") != NULL) == (t < 2));
        CU_ASSERT((strstr(x.err, "reload margin") != NULL) == (t < 2));
        if (t == 2)
            CU_ASSERT(strstr(x.err, "[1 of 2, 0 of 3, 0 of 1]") != NULL);
        exported_free(&x);
        plan_free(&p);
    }
    struct plan p;
    const char *why[] = {"[2 of 2, 2 of 3, 1 of 1]", "recomputes 1 layer(s)",
                         "stage 1 would need"};
    for (int t = 0; t < 3; t++) {
        struct exported x = {0};
        roomy_offload_plan(&p);
        offload_attn(&p, (const int[]){t == 1 ? 1 : 2, 3, 1});
        if (t == 0) { /* block.2 keeps all, block.3 and block.4 offload */
            p.stages[1].actions[0].offload_option = -1;
            p.stages[1].actions[0].prefetch_ahead = 0;
        }
        if (t == 1) /* block.1, which does not offload, recomputed */
            p.stages[0].actions[2].choice = COST_FULL;
        struct err e;
        err_clear(&e);
        CU_ASSERT_FATAL(planner_finish(&p, &e) == ERR_OK);
        if (t == 2) /* no room on stage 1 for one block's attention tensors more */
            p.stages[1].memory_limit_bytes = p.stages[1].memory_bytes;
        int rc, replanned;
        check_export(&p, "megatron", &rc, &replanned);
        CU_ASSERT(rc == 0 && replanned);
        export_read(&p, "megatron", &x);
        CU_ASSERT(x.err && strstr(x.err, why[t]));
        CU_ASSERT(x.out && strstr(x.out, "offloading") == NULL);
        exported_free(&x);
        plan_free(&p);
    }
}

/* ---- interleaved 1F1B and the other schedules (docs/schedules.md) ---- */

/* planner_make for `target` under schedule `kind` (interleaved: v chunks a GPU). */
static int plan_schedule(const struct cluster *c, const char *target, enum schedule kind, int v,
                         int repartition, struct plan *out, struct err *e)
{
    struct plan_options o;
    err_clear(e);
    plan_options_default(&o);
    o.framework = framework_find(target, NULL);
    o.schedule = (int)kind;
    o.virtual_stages = kind == SCHEDULE_INTERLEAVED ? v : 0;
    o.repartition = repartition;
    o.min_gain = 0; /* each rank the fastest of its menu, which ranks_least checks */
    o.estimate = estimate_profile;
    o.estimate_for = estimate_for_framework;
    return planner_make(c, &o, out, e);
}

/* Whether the plan's blocks all have the profile option `name`. */
static int has_option(const struct plan *p, const char *name)
{
    for (int s = 0; s < p->n_stages; s++)
        for (int l = 0; l < plan_stage_layer_count(&p->stages[s]); l++) {
            const struct layer_cost *c = &p->stages[s].layers[l];
            int found = 0;
            for (int o = 0; o < c->n_options; o++)
                found |= strcmp(c->options[o].name, name) == 0;
            if (is_block(p, p->stages[s].first + l) && !found)
                return 0;
        }
    return 1;
}

/* Each pipeline rank's one setting (its chunks' fields alike, the first N of each chunk's
 * blocks) is the least recompute of every setting Megatron-LM has that fits the GPU: none,
 * the first N blocks for every N, each module set; tried on the plan's other ranks as they
 * are, by brute force. */
static void ranks_least(const struct plan *plan, const struct setting *read)
{
    static const char *const sets[] = {"core_attn", "mlp", "core_attn mlp"};
    int most = 0, pp = read->pp;
    for (int k = 0; k < read->S; k++)
        most = read->blocks[k] > most ? read->blocks[k] : most;
    for (int g = 0; g < pp; g++) {
        double chosen = 0, least = INFINITY;
        for (int k = g; k < read->S; k += pp)
            chosen += plan->stages[k].recompute_ms;
        for (int t = 0; t <= most + 3; t++) {
            int N = t <= most ? t : 0;
            const char *mods = t <= most ? "" : sets[t - most - 1];
            if (mods[0] && !has_option(plan, module_option(mods)))
                continue;
            struct setting s = *read;
            struct plan q;
            for (int k = g; k < s.S; k += pp) {
                s.n[k] = N < s.blocks[k] ? N : s.blocks[k];
                snprintf(s.modules[k], sizeof s.modules[k], "%s", s.blocks[k] ? mods : "");
            }
            plan_copy(plan, &q);
            CU_ASSERT_FATAL(apply_setting(&q, &s) == 0);
            double ms = 0;
            int fits = 1;
            for (int k = g; k < s.S; k += pp) {
                ms += q.stages[k].recompute_ms;
                fits &= q.stages[k].memory_bytes <= q.stages[k].memory_limit_bytes;
            }
            least = fits && ms < least ? ms : least;
            plan_free(&q);
        }
        CU_ASSERT(chosen <= least * (1 + 1e-9) + 1e-12);
        if (!(chosen <= least * (1 + 1e-9) + 1e-12))
            printf("\n  rank %d recomputes %.6f ms, a setting that fits %.6f\n", g, chosen, least);
    }
}

/* Random clusters under interleaved 1F1B: --for megatron plans each rank's chunks alike (the
 * least recompute that fits, by brute force) and its export reads back to the plan's step and
 * memory; Ballast's interleaved plan exports to Megatron-LM, its settings made again rank by
 * rank where its chunks differ; NeMo, FlagScale and ColossalAI refuse a virtual pipeline, and
 * every target zb-h1 and v-half, each with its reason. */
static void test_interleaved(void)
{
    struct test_rng r = {29};
    int planned = 0, recomputing = 0, exported = 0;
    for (int k = 0; k < 60 && (planned < 12 || exported < 4); k++) {
        struct cluster c;
        struct plan p;
        struct err e;
        random_cluster(&r, 40 + k, &c);
        int v = c.n_layers >= 3 * c.n_stages ? (int)test_rng_int(&r, 2, 3) : 2;
        if (c.n_layers < v * c.n_stages) { /* a chunk a layer at least */
            cluster_free(&c);
            continue;
        }
        /* the GPUs' memory between what recomputing every layer and keeping them all need
         * under interleaved (random_cluster's is 1F1B's) */
        double hi[MAX_STAGES], lo[MAX_STAGES];
        c.schedule = SCHEDULE_INTERLEAVED;
        c.virtual_stages = v;
        c.micro_batches = c.n_stages * (int)test_rng_int(&r, 1, 3);
        for (int g = 0; g < c.n_stages; g++)
            c.stages[g].memory_bytes = 1LL << 34;
        method_memory(&c, METHOD_NONE, hi);
        method_memory(&c, METHOD_FULL, lo);
        for (int g = 0; g < c.n_stages; g++) /* stage g is GPU g's first chunk */
            c.stages[g].memory_bytes = (int64_t)(lo[g] + (hi[g] - lo[g]) * test_rng_double(&r, 0.3, 1.2));
        c.schedule = SCHEDULE_1F1B;
        for (int t = 0; t < N_TARGETS; t++) {
            int rc = plan_schedule(&c, targets[t], SCHEDULE_INTERLEAVED, v, 0, &p, &e);
            int inapplicable = rc == ERR_INPUT && strstr(e.msg, "model chunks (one each");
            if (strncmp(targets[t], "megatron", 8) != 0) {
                CU_ASSERT(inapplicable || (rc == ERR_INPUT && strstr(e.msg, "virtual pipeline")));
                if (rc == ERR_OK)
                    plan_free(&p);
                continue;
            }
            CU_ASSERT(rc == ERR_OK || rc == ERR_NOFIT || inapplicable);

            if (rc != ERR_OK)
                continue;
            planned++;
            struct exported x = {0};
            export_read(&p, targets[t], &x);
            CU_ASSERT_FATAL(x.rc == ERR_OK);
            CU_ASSERT(strstr(x.err, "cannot run the plan as it is") == NULL);
            CU_ASSERT_EQUAL(x.s.S, p.n_stages);
            CU_ASSERT_EQUAL(x.s.pp, p.n_stages / v);
            if (strcmp(targets[t], "megatron") == 0) /* per rank; megatron-cli: one for all */
                ranks_least(&p, &x.s);
            for (int s = 0; s < p.n_stages; s++)
                recomputing += p.stages[s].recompute_ms > 0;
            exported_free(&x);
            int xrc, replanned;
            check_export(&p, targets[t], &xrc, &replanned);
            CU_ASSERT(xrc == 0 && replanned == 0);
            plan_free(&p);
        }
        if (plan_schedule(&c, "ballast", SCHEDULE_INTERLEAVED, v, 0, &p, &e) == ERR_OK) {
            for (int t = 0; t < N_TARGETS; t++) {
                int xrc, replanned;
                check_export(&p, targets[t], &xrc, &replanned);
                CU_ASSERT(strncmp(targets[t], "megatron", 8) == 0 ? xrc == 0 || xrc == ERR_NOFIT
                                                                   : xrc == ERR_INPUT);
                exported += xrc == 0;
            }
            plan_free(&p);
        }
        for (int z = 0; z < 2; z++) {
            enum schedule kind = z ? SCHEDULE_V_HALF : SCHEDULE_ZB_H1;
            if (plan_schedule(&c, "ballast", kind, 0, 0, &p, &e) != ERR_OK)
                continue;
            for (int t = 0; t < N_TARGETS; t++) {
                int xrc, replanned;
                check_export(&p, targets[t], &xrc, &replanned);
                CU_ASSERT_EQUAL(xrc, ERR_INPUT);
                struct plan q;
                int rc = plan_schedule(&c, targets[t], kind, 0, 0, &q, &e);
                CU_ASSERT(rc == ERR_INPUT && strstr(e.msg, "splits each block's backward"));
                if (rc == ERR_OK)
                    plan_free(&q);
            }
            plan_free(&p);
        }
        cluster_free(&c);
    }
    CU_ASSERT(planned >= 8);
    CU_ASSERT(recomputing > 0);
    CU_ASSERT(exported > 0);
}

/* The schedule refusals of planning --for a framework and of check. */
static void test_schedule_refusals(void)
{
    struct cluster c;
    struct plan p;
    struct err e;
    char file[1024];
    err_clear(&e);
    snprintf(file, sizeof file, "%sclusters/llama2-7b-h100-a100-8.json", CONFIGS);
    CU_ASSERT_FATAL(cluster_load(file, &c, &e) == ERR_OK);
    c.micro_batches = 12; /* not a multiple of its 8 GPUs */
    CU_ASSERT(plan_schedule(&c, "megatron", SCHEDULE_INTERLEAVED, 2, 0, &p, &e) == ERR_INPUT &&
              strstr(e.msg, "The remainder of M") != NULL);
    c.micro_batches = 16;
    CU_ASSERT(plan_schedule(&c, "megatron", SCHEDULE_INTERLEAVED, 2, 1, &p, &e) == ERR_INPUT &&
              strstr(e.msg, "--repartition") != NULL);
    CU_ASSERT(plan_schedule(&c, "nemo", SCHEDULE_INTERLEAVED, 2, 0, &p, &e) == ERR_INPUT &&
              strstr(e.msg, "no longer supported for nemo 1.0") != NULL);
    CU_ASSERT(plan_schedule(&c, "flagscale", SCHEDULE_INTERLEAVED, 2, 0, &p, &e) == ERR_INPUT &&
              strstr(e.msg, "virtual pipeline not support now!") != NULL);
    CU_ASSERT(plan_schedule(&c, "megatron", SCHEDULE_INTERLEAVED, 1, 0, &p, &e) == ERR_OK);
    plan_free(&p); /* one chunk a GPU: 1F1B */
    cluster_free(&c);
    char *err = NULL;
    char args[2048];
    snprintf(args, sizeof args, "check --from megatron --config '--pipeline-model-parallel-size 8 "
             "--num-layers-per-virtual-pipeline-stage 2 --bf16' --cluster '%s'", file);
    CU_ASSERT(run(args, &err) == 2 && strstr(err, "virtual pipeline") != NULL);
    free(err);
    snprintf(args, sizeof args, "check --from megatron --config '--pipeline-model-parallel-size 8 "
             "--pipeline-model-parallel-layout Et|t*2|t*2|t*2|t*2|t*2|t*2|t*2|t*3|t*2|t*2|t*2|"
             "t*2|t*2|t*2|t*2L --bf16' --cluster '%s'", file);
    CU_ASSERT(run(args, &err) == 2 && strstr(err, "2 chunks a rank") != NULL);
    free(err);
    snprintf(args, sizeof args, "plan --cluster '%s' --for megatron --schedule auto", file);
    CU_ASSERT(run(args, &err) == 2 && strstr(err, "plans the schedule it is given") != NULL);
    free(err);
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
    CU_add_test(s, "--min-gain: the simplest settings within the margin", test_min_gain);
    CU_add_test(s, "refusals: target, format, split, a stage that does not fit", test_refusals);
    CU_add_test(s, "devices below compute capability 8.0; mixed kernels", test_devices);
    CU_add_test(s, "a pool's plan and replicas files", test_pool_and_replicas);
    CU_add_test(s, "check reads the exports back", test_check);
    CU_add_test(s, "the per-rank file runs", test_stages_py);
    CU_add_test(s, "Megatron-LM's activation offloading", test_megatron_offload);
    CU_add_test(s, "interleaved: a rank's chunks alike, read back; schedules refused",
                test_interleaved);
    CU_add_test(s, "the schedules --for and check refuse", test_schedule_refusals);
    int rc = test_main();
    cJSON_Delete(all_keys);
    devices_free(&devices);
    return rc;
}
