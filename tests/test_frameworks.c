/* The frameworks as planning targets and the exports (issue 24), against readers written here
 * from each framework's semantics, independent of planner/framework.c: a Megatron-LM layout
 * string gives each stage's blocks and --recompute-num-layers N each stage's first N of them
 * (or the per-rank file each stage's own); NeMo's first and last counts with the rest even;
 * ColossalAI's and FlagScale's lists. The reader's per-stage actions, put on the plan's layer
 * costs, are costed and simulated, and must give the plan's step and every stage's memory
 * exactly (an export with no note), or the numbers the note prints (a plan the framework
 * cannot say as it is, planned again). Every key an export writes is one
 * tests/data/export_keys.json quotes from the framework's source. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void export_read(const char *plan_file, const char *to, struct exported *x)
{
    char args[4096];
    const char *out = test_path("export.txt"), *py = test_path("stages.py");
    char out_path[1024], py_path[1024];
    snprintf(out_path, sizeof out_path, "%s", out);
    snprintf(py_path, sizeof py_path, "%s", py);
    remove(out_path);
    remove(py_path);
    snprintf(args, sizeof args, "export --plan '%s' --to %s -o '%s' --stages '%s'", plan_file,
             to, out_path, py_path);
    x->rc = test_run(args, NULL, &x->err);
    x->out = test_read(out_path);
    x->py = test_read(py_path);
    CU_ASSERT_FATAL(x->err != NULL);
    if (x->rc != 0) {
        CU_ASSERT(x->out == NULL && x->py == NULL); /* nothing half-written */
        return;
    }
    CU_ASSERT_FATAL(x->out != NULL);
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(plan_load(plan_file, &p, &e) == ERR_OK);
    memset(&x->s, 0, sizeof x->s);
    if (strncmp(to, "megatron", 8) == 0)
        read_megatron(x->out, x->py, &x->s);
    else if (strncmp(to, "nemo", 4) == 0)
        read_nemo(x->out, x->py, &x->s);
    else if (strcmp(to, "colossalai") == 0)
        read_colossalai(x->out, p.model.kind == MODEL_KIND_GPT, &x->s);
    else
        read_flagscale(x->out, p.micro_batches, &x->s);
    read_launch(x->out, &x->s);
    CU_ASSERT(x->py == NULL || strncmp(to, "megatron", 8) == 0 || strncmp(to, "nemo", 4) == 0);
    CU_ASSERT(x->py == NULL || strstr(x->out, "per-rank recompute") != NULL);
    if (p.model.kind != MODEL_KIND_CUSTOM)
        CU_ASSERT_EQUAL(x->s.micro_batch, p.model.micro_batch);
    plan_free(&p);
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

/* The export of `plan_file` to `to`, read back, costed and simulated: the plan's numbers
 * exactly when no note was made, else the note's. *replanned: a note was made. */
static void check_export(const char *plan_file, const char *to, int *rc, int *replanned)
{
    struct exported x;
    export_read(plan_file, to, &x);
    *rc = x.rc;
    *replanned = 0;
    if (x.rc != 0) {
        CU_ASSERT(x.rc == 2 || x.rc == 3);
        CU_ASSERT(strstr(x.err, x.rc == 3 ? "over its" : "--to") != NULL);
        exported_free(&x);
        return;
    }
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(plan_load(plan_file, &p, &e) == ERR_OK);
    double was_ms = p.iteration_ms, step, gib[MAX_STAGES];
    int64_t was_memory[MAX_STAGES];
    for (int k = 0; k < p.n_stages; k++)
        was_memory[k] = p.stages[k].memory_bytes;
    if (apply_setting(&p, &x.s) != 0) {
        printf("\n  %s --to %s: the reader's split differs from the plan's:\n%s\n  read:",
               plan_file, to, x.out);
        for (int k = 0; k < x.s.S; k++)
            printf(" %d", x.s.blocks[k]);
        printf("\n");
        CU_FAIL_FATAL("split");
    }
    *replanned = note_numbers(x.err, &step, gib, p.n_stages);
    if (!*replanned && !test_close(p.iteration_ms, was_ms, 1e-9, 1e-12)) {
        char cp[2048];
        snprintf(cp, sizeof cp, "cp '%s' /tmp/fwt/fail.json", plan_file);
        if (system(cp)) {}
    }
    if (!*replanned && !test_close(p.iteration_ms, was_ms, 1e-9, 1e-12))
        printf("\n  %s --to %s: read back %.6f ms, planned %.6f:\n%s\n%s\n", plan_file, to,
               p.iteration_ms, was_ms, x.out, x.err);
    if (!*replanned) {
        CU_ASSERT(test_close(p.iteration_ms, was_ms, 1e-9, 1e-12));
        for (int k = 0; k < p.n_stages; k++)
            CU_ASSERT_EQUAL(p.stages[k].memory_bytes, was_memory[k]);
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

/* `ballast ARGS` that must succeed; its standard error printed when it does not. */
static void run_ok(const char *args)
{
    char *err = NULL;
    int rc = test_run(args, NULL, &err);
    if (rc != 0)
        printf("\n  ballast %s: exit %d\n  %s\n", args, rc, err ? err : "");
    free(err);
    CU_ASSERT_FATAL(rc == 0);
}

/* ---- planning for a target ---- */

/* `ballast plan --cluster C EXTRA --for T -o FILE`: its exit status. */
static int plan_for(const char *cluster, const char *target, const char *extra, const char *file)
{
    char args[4096];
    snprintf(args, sizeof args, "plan --cluster '%s' --for %s %s --quiet -o '%s'", cluster,
             target, extra, file);
    char *err = NULL;
    int rc = test_run(args, NULL, &err);
    if (rc != 0 && rc != 3 && (err == NULL || !strstr(err, "cannot run this split")))
        printf("\n  plan --for %s %s: %s\n", target, extra, err ? err : "");
    free(err);
    return rc;
}

static double plan_ms(const char *file)
{
    char *text = test_read(file);
    cJSON *p = cJSON_Parse(text);
    free(text);
    double ms = cJSON_GetObjectItem(p, "iteration_ms")->valuedouble;
    cJSON_Delete(p);
    return ms;
}

/* The blocks of each stage of the cluster's own split (a plan of it recomputing every layer):
 * the stage count, or 0 when not even that fits. */
static int cluster_split(const char *cluster, int *blocks)
{
    char args[4096], file[1024];
    snprintf(file, sizeof file, "%s", test_path("split-plan.json"));
    snprintf(args, sizeof args, "plan --cluster '%s' --method full --quiet -o '%s'", cluster,
             file);
    if (test_run(args, NULL, NULL) != 0)
        return 0;
    char *text = test_read(file);
    cJSON *p = cJSON_Parse(text), *st;
    free(text);
    int S = 0, L = cJSON_GetObjectItem(cJSON_GetObjectItem(p, "model"), "n_layer")->valueint;
    cJSON_ArrayForEach(st, cJSON_GetObjectItem(p, "stages"))
    {
        const cJSON *r = cJSON_GetObjectItem(st, "layers");
        int lo = cJSON_GetArrayItem(r, 0)->valueint, hi = cJSON_GetArrayItem(r, 1)->valueint;
        lo = lo < 1 ? 1 : lo; /* layer 0 is the embedding, L + 1 the head */
        hi = hi > L ? L : hi;
        blocks[S++] = hi >= lo ? hi - lo + 1 : 0;
    }
    cJSON_Delete(p);
    return S;
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
 * the cluster's own split, a target that cannot run that split refuses (exit 2). */
static void for_and_back(const char *cluster, const char *extra, double *ms)
{
    int blocks[MAX_STAGES], S = cluster_split(cluster, blocks);
    for (int t = 0; t < N_TARGETS; t++) {
        const char *plan = test_path("for-plan.json");
        char file[1024];
        snprintf(file, sizeof file, "%s", plan);
        int rc = plan_for(cluster, targets[t], extra, file);
        int runnable = strstr(extra, "--repartition") || split_runnable(targets[t], blocks, S);
        if (S > 0 || strstr(extra, "--repartition"))
            CU_ASSERT(runnable ? rc == 0 || rc == 3 : rc == 2);
        ms[t] = rc == 0 ? plan_ms(file) : INFINITY;
        if (rc != 0)
            continue;
        int xrc, replanned;
        check_export(file, targets[t], &xrc, &replanned);
        CU_ASSERT_EQUAL(xrc, 0);
        CU_ASSERT_EQUAL(replanned, 0);
    }
    /* per-rank settings are a superset of the command line's: never slower */
    CU_ASSERT(ms[0] <= ms[1] * (1 + 1e-12));
    CU_ASSERT(ms[2] <= ms[3] * (1 + 1e-12));
}

/* A Ballast plan exported to every target: the plan (no note), the framework's numbers
 * beside it (a note), or a refusal with the reason. */
static void ballast_to_all(const char *cluster, const char *extra, int *replans)
{
    const char *plan = test_path("ballast-plan.json");
    char file[1024], args[4096];
    snprintf(file, sizeof file, "%s", plan);
    snprintf(args, sizeof args, "plan --cluster '%s' %s --quiet -o '%s'", cluster, extra, file);
    if (test_run(args, NULL, NULL) != 0)
        return;
    for (int t = 0; t < N_TARGETS; t++) {
        int rc, replanned;
        check_export(file, targets[t], &rc, &replanned);
        *replans += replanned;
    }
}

/* Shipped clusters whose devices run bf16 (V100 and T4 ones are refused: below). */
static const char *const shipped[] = {"llama2-7b-h100-a100-8.json", "h100-a100-l4-16.json",
                                      "llama3-8b-h100-h200-16.json", "cpu-3.json",
                                      "llama-cpu-3.json"};

static void test_shipped(void)
{
    int replans = 0;
    for (size_t c = 0; c < sizeof shipped / sizeof *shipped; c++) {
        char cluster[1024];
        double ms[N_TARGETS], again[N_TARGETS];
        snprintf(cluster, sizeof cluster, "%sclusters/%s", CONFIGS, shipped[c]);
        for_and_back(cluster, "", ms);
        for_and_back(cluster, "--repartition", again);
        for (int t = 0; t < N_TARGETS; t++) /* searching the split never loses */
            CU_ASSERT(again[t] <= ms[t] * (1 + 1e-9) || isinf(ms[t]));
        ballast_to_all(cluster, "", &replans);
        ballast_to_all(cluster, "--repartition", &replans);
    }
    CU_ASSERT(replans > 0); /* the comparison is exercised */
}

/* ---- random small clusters ---- */

/* A random GPT or Llama on the CPU (estimated), S stages with memory between what recomputing
 * everything needs and what keeping everything does: the cluster file's path. */
static const char *random_cluster(struct test_rng *r, int k)
{
    int llama = (int)test_rng_int(r, 0, 1), heads = 2 << test_rng_int(r, 0, 2);
    int L = (int)test_rng_int(r, 3, 9), S = (int)test_rng_int(r, 2, 4);
    char text[4096], name[64], path[1024];
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
    snprintf(name, sizeof name, "rprof%d.json", k);
    char args[4096], prof[1024];
    snprintf(prof, sizeof prof, "%s", test_path(name));
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu -o '%s'", path,
             prof);
    run_ok(args);
    /* the even split's need with nothing and everything recomputed, stage by stage */
    int n = snprintf(text, sizeof text,
                     "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", "
                     "\"micro_batches\": %d, \"stages\": [",
                     (int)test_rng_int(r, 2, 8));
    for (int s = 0; s < S; s++)
        n += snprintf(text + n, sizeof text - (size_t)n,
                      "%s{\"device\": \"cpu\", \"memory_bytes\": %lld, \"profile\": \"%s\"}",
                      s ? ", " : "", 1LL << 34, name);
    snprintf(text + n, sizeof text - (size_t)n, "]}");
    snprintf(name, sizeof name, "rcluster%d.json", k);
    snprintf(path, sizeof path, "%s", test_write(name, text));
    /* memory between the two plans' needs */
    const char *none = test_path("rnone.json"), *full = test_path("rfull.json");
    char nf[1024], ff[1024];
    snprintf(nf, sizeof nf, "%s", none);
    snprintf(ff, sizeof ff, "%s", full);
    snprintf(args, sizeof args, "plan --cluster '%s' --method none --quiet -o '%s'", path, nf);
    run_ok(args);
    snprintf(args, sizeof args, "plan --cluster '%s' --method full --quiet -o '%s'", path, ff);
    run_ok(args);
    char *a = test_read(nf), *b = test_read(ff), *c = test_read(path);
    cJSON *pn = cJSON_Parse(a), *pf = cJSON_Parse(b), *cj = cJSON_Parse(c);
    free(a), free(b), free(c);
    for (int s = 0; s < S; s++) {
        double hi = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(pn, "stages"), s),
                                        "memory_bytes")->valuedouble;
        double lo = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(pf, "stages"), s),
                                        "memory_bytes")->valuedouble;
        double m = lo + (hi - lo) * test_rng_double(r, 0.2, 1.2);
        cJSON_SetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(
                                                     cJSON_GetObjectItem(cj, "stages"), s),
                                                 "memory_bytes"),
                             floor(m));
    }
    char *out = cJSON_Print(cj);
    snprintf(path, sizeof path, "%s", test_write(name, out));
    cJSON_free(out);
    cJSON_Delete(pn), cJSON_Delete(pf), cJSON_Delete(cj);
    return test_path(name);
}

static void test_random(void)
{
    struct test_rng r = {24};
    int replans = 0, planned = 0;
    for (int k = 0; k < 14; k++) {
        char cluster[1024];
        double ms[N_TARGETS];
        snprintf(cluster, sizeof cluster, "%s", random_cluster(&r, k));
        for_and_back(cluster, k % 2 ? "--repartition" : "", ms);
        for (int t = 0; t < N_TARGETS; t++)
            planned += !isinf(ms[t]);
        ballast_to_all(cluster, "", &replans);
    }
    CU_ASSERT(planned > 20);
    CU_ASSERT(replans > 0);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("frameworks", NULL, NULL);
    CU_add_test(s, "shipped clusters: --for each target, exported and read back", test_shipped);
    CU_add_test(s, "random clusters: --for each target, exported and read back", test_random);
    int rc = test_main();
    cJSON_Delete(all_keys);
    return rc;
}
