/* plan --export against the plan file it exports, and --micro-batches auto against planning
 * every micro-batch size by hand. */
#include <CUnit/CUnit.h>
#include <ctype.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "planner.h"
#include "testutil.h"

#define CONFIGS BALLAST_SOURCE_DIR "/configs/"
#define MAX_STAGES 64

struct counts {
    int n;
    int blocks[MAX_STAGES];
    int recompute[MAX_STAGES]; /* whole or in part */
    int partial[MAX_STAGES];   /* in part: a recompute option */
    int attn, mlp;             /* blocks whose option recomputes the attention, the MLP */
    int tp[MAX_STAGES], dp[MAX_STAGES]; /* absent from the plan: 1 */
};

/* The first and last block's layer: a GPT's embedding and head are not blocks; every layer
 * of a custom model counts as one. */
static void block_range(const cJSON *plan, int *lo, int *hi)
{
    const cJSON *model = cJSON_GetObjectItem(plan, "model");
    const cJSON *n_layer = cJSON_GetObjectItem(model, "n_layer");
    if (n_layer != NULL) {
        *lo = 1;
        *hi = n_layer->valueint;
        return;
    }
    *lo = 0;
    *hi = 1 << 30;
}

/* Blocks and recomputed blocks per stage, from a plan file (layer 0 is the embedding, the
 * last the head): `recompute` lists whole layers, `recompute_options` the others. */
static void plan_counts(const char *plan_file, struct counts *c)
{
    char *text = test_read(plan_file);
    cJSON *p = cJSON_Parse(text);
    free(text);
    CU_ASSERT_FATAL(p != NULL);
    int b_lo, b_hi;
    block_range(p, &b_lo, &b_hi);
    const cJSON *st;
    c->n = c->attn = c->mlp = 0;
    cJSON_ArrayForEach(st, cJSON_GetObjectItem(p, "stages"))
    {
        const cJSON *range = cJSON_GetObjectItem(st, "layers"), *r;
        int first = cJSON_GetArrayItem(range, 0)->valueint;
        int last = cJSON_GetArrayItem(range, 1)->valueint;
        int lo = first < b_lo ? b_lo : first, hi = last > b_hi ? b_hi : last;
        c->blocks[c->n] = hi >= lo ? hi - lo + 1 : 0;
        const cJSON *tp = cJSON_GetObjectItem(st, "tp"), *dp = cJSON_GetObjectItem(st, "dp");
        c->tp[c->n] = tp ? tp->valueint : 1;
        c->dp[c->n] = dp ? dp->valueint : 1;
        c->recompute[c->n] = 0;
        c->partial[c->n] = 0;
        cJSON_ArrayForEach(r, cJSON_GetObjectItem(st, "recompute"))
            c->recompute[c->n] += r->valueint >= b_lo && r->valueint <= b_hi;
        cJSON_ArrayForEach(r, cJSON_GetObjectItem(st, "recompute_options"))
        {
            int l = cJSON_GetObjectItem(r, "layer")->valueint;
            const char *name = cJSON_GetObjectItem(r, "option")->valuestring;
            if (l < b_lo || l > b_hi)
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

/* The keys each framework's source accepts (tests/data/export_keys.json, quoted with the
 * commit and file they come from). */
static cJSON *framework_keys(const char *framework)
{
    static cJSON *all;
    if (all == NULL) {
        char *text = test_read(BALLAST_SOURCE_DIR "/tests/data/export_keys.json");
        all = cJSON_Parse(text);
        free(text);
    }
    CU_ASSERT_FATAL(all != NULL);
    cJSON *f = cJSON_GetObjectItem(all, framework);
    CU_ASSERT_FATAL(f != NULL && cJSON_GetObjectItem(f, "commit") != NULL);
    return cJSON_GetObjectItem(f, "keys");
}

/* 1 when `key` is one the framework accepts and `value` (NULL: any) one of its values. */
static int accepted(const char *framework, const char *key, const char *value)
{
    const cJSON *k, *v;
    cJSON_ArrayForEach(k, framework_keys(framework))
    {
        if (strcmp(cJSON_GetObjectItem(k, "key")->valuestring, key) != 0)
            continue;
        const cJSON *values = cJSON_GetObjectItem(k, "values");
        if (value == NULL || values == NULL)
            return 1;
        cJSON_ArrayForEach(v, values) if (strcmp(v->valuestring, value) == 0) return 1;
        return 0;
    }
    return 0;
}

struct run {
    int rc;
    char *out, *err;
    struct counts c;
    int bf16, gpipe, micro_batches, custom;
    int flash, shard; /* the model's attention is flash; the cluster's shard_optimizer */
    /* per stage: what keeping its recomputed embed or head adds, the plan's bytes, the limit */
    double more[MAX_STAGES], memory[MAX_STAGES], limit[MAX_STAGES];
};

/* The frameworks keep the embedding and the head: a stage whose plan recomputes one (whole)
 * holds v * (act - ckpt) more. */
static void kept_ends(const cJSON *plan, struct run *r)
{
    int b_lo, b_hi;
    block_range(plan, &b_lo, &b_hi);
    const cJSON *st, *l;
    int s = 0;
    cJSON_ArrayForEach(st, cJSON_GetObjectItem(plan, "stages"))
    {
        int first = cJSON_GetArrayItem(cJSON_GetObjectItem(st, "layers"), 0)->valueint;
        int v = cJSON_GetObjectItem(st, "in_flight")->valueint;
        r->more[s] = 0;
        r->memory[s] = cJSON_GetObjectItem(st, "memory_bytes")->valuedouble;
        r->limit[s] = cJSON_GetObjectItem(st, "memory_limit_bytes")->valuedouble;
        cJSON_ArrayForEach(l, cJSON_GetObjectItem(st, "recompute"))
        {
            if (l->valueint >= b_lo && l->valueint <= b_hi)
                continue;
            const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(st, "layer_costs"),
                                                l->valueint - first);
            r->more[s] += v * (cJSON_GetObjectItem(c, "act_bytes")->valuedouble -
                               cJSON_GetObjectItem(c, "ckpt_bytes")->valuedouble);
        }
        s++;
    }
}

/* Each stage holding more than planned is said, with its need against its limit. */
static void check_kept_ends(const struct run *r, const char *framework)
{
    for (int s = 0; s < r->c.n; s++) {
        char say[160];
        snprintf(say, sizeof say, "export %s: note: stage %d recomputes its ", framework, s);
        CU_ASSERT((strstr(r->err, say) != NULL) == (r->more[s] > 0));
        snprintf(say, sizeof say, "export %s: note: stage %d may not fit", framework, s);
        CU_ASSERT((strstr(r->err, say) != NULL) == (r->memory[s] + r->more[s] > r->limit[s]));
    }
}

static void run_export(const char *cluster, const char *extra, const char *format, struct run *r)
{
    char args[2048];
    const char *plan = test_path("export-plan.json");
    remove(plan);
    char file[1024];
    snprintf(file, sizeof file, "%s%s", cluster[0] == '/' ? "" : CONFIGS, cluster);
    snprintf(args, sizeof args, "plan --cluster '%s' %s --export %s -o '%s'", file, extra,
             format, plan);
    r->rc = test_run(args, &r->out, &r->err);
    CU_ASSERT_FATAL(r->out && r->err);
    /* the plan itself, for the counts, also where the export was refused */
    snprintf(args, sizeof args, "plan --cluster '%s' %s --quiet -o '%s'", file, extra, plan);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    plan_counts(plan, &r->c);
    char *text = test_read(plan);
    cJSON *p = cJSON_Parse(text);
    free(text);
    const cJSON *model = cJSON_GetObjectItem(p, "model");
    const cJSON *dtype = cJSON_GetObjectItem(model, "dtype");
    const cJSON *kind = cJSON_GetObjectItem(model, "kind");
    r->custom = kind != NULL && strcmp(kind->valuestring, "custom") == 0;
    const cJSON *attention = cJSON_GetObjectItem(model, "attention");
    r->flash = attention != NULL && strcmp(attention->valuestring, "flash") == 0;
    text = test_read(file);
    cJSON *c = cJSON_Parse(text);
    free(text);
    r->shard = cJSON_IsTrue(cJSON_GetObjectItem(c, "shard_optimizer"));
    cJSON_Delete(c);
    r->bf16 = dtype != NULL && strcmp(dtype->valuestring, "bf16") == 0;
    r->gpipe = strcmp(cJSON_GetObjectItem(p, "schedule")->valuestring, "gpipe") == 0;
    r->micro_batches = cJSON_GetObjectItem(p, "micro_batches")->valueint;
    kept_ends(p, r);
    cJSON_Delete(p);
}

static void run_free(struct run *r)
{
    free(r->out);
    free(r->err);
}

/* A line ending in a backslash continues a shell command: no comment may follow it, and
 * every argument line but the last continues. */
static int shell_continuations_clean(const char *text)
{
    const char *line = text;
    int continued = 0, args = 0, open = 0;
    while (*line) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (continued && line[0] == '#')
            return 0;
        if (line[0] == '-') {
            if (args && !continued)
                return 0; /* an argument line after one that ended the command */
            args++;
        }
        continued = len > 0 && line[len - 1] == '\\';
        open = continued;
        line += len + (end ? 1 : 0);
    }
    return !open && args > 0;
}

static int total(const int *v, int n)
{
    int t = 0;
    for (int s = 0; s < n; s++)
        t += v[s];
    return t;
}

/* Megatron-LM, NeMo and ColossalAI take one tp for every stage: a plan whose stages differ is
 * refused (exit 2, nothing written) naming the first that differs and both numbers; 1 when it
 * was. */
static int refused_tp(const struct run *r)
{
    int s = 1;
    while (s < r->c.n && r->c.tp[s] == r->c.tp[0])
        s++;
    if (s == r->c.n)
        return 0;
    char want[160];
    snprintf(want, sizeof want, "stage %d has tp %d and stage 0 tp %d", s, r->c.tp[s],
             r->c.tp[0]);
    CU_ASSERT_EQUAL(r->rc, 2);
    CU_ASSERT(strstr(r->err, want) != NULL);
    CU_ASSERT(r->out[0] == '\0');
    return 1;
}

/* The GPUs to launch on, tp x pp x dp, which the framework turns into dp. */
static void check_launch(const struct run *r)
{
    char want[128];
    snprintf(want, sizeof want, "# launch on %d GPUs (tp %d, pp %d, dp %d);",
             r->c.tp[0] * r->c.n * r->c.dp[0], r->c.tp[0], r->c.n, r->c.dp[0]);
    CU_ASSERT(strstr(r->out, want) != NULL);
}

/* ColossalAI: every keyword of HybridParallelPlugin(...) one its __init__ takes; GPT-2's
 * forward recomputes all of a stage's blocks or none, said on stderr when that is more. */
static void check_colossalai(const char *cluster, const char *extra)
{
    struct run r;
    run_export(cluster, extra, "colossalai", &r);
    if (refused_tp(&r)) {
        run_free(&r);
        return;
    }
    CU_ASSERT_EQUAL_FATAL(r.rc, 0);
    check_launch(&r);
    char tp[64];
    snprintf(tp, sizeof tp, "\n    tp_size=%d,\n", r.c.tp[0]);
    CU_ASSERT(strstr(r.out, tp) != NULL);
    CU_ASSERT((strstr(r.out, "\n    enable_sequence_parallelism=True,\n    "
                             "sequence_parallelism_mode=\"split_gather\",\n") != NULL) ==
              (r.c.tp[0] > 1));
    CU_ASSERT((strstr(r.out, "\n    zero_stage=1,\n") != NULL) == r.shard);
    CU_ASSERT((strstr(r.out, "\n    enable_flash_attention=True,\n") != NULL) ==
              (r.flash && !r.custom));
    CU_ASSERT((strstr(r.err, "attn_implementation=\"eager\"") != NULL) == (!r.flash && !r.custom));
    const char *call = strstr(r.out, "plugin = HybridParallelPlugin(\n");
    CU_ASSERT_FATAL(call != NULL);
    int n_keys = 0;
    for (const char *line = strchr(call, '\n') + 1; *line && *line != ')';
         line = strchr(line, '\n') + 1) {
        char key[64], value[256];
        CU_ASSERT_FATAL(sscanf(line, " %63[a-z_]=%255[^\n]", key, value) == 2);
        size_t len = strlen(value);
        if (len && value[len - 1] == ',')
            value[--len] = '\0';
        if (value[0] == '"') { /* a string: its text */
            memmove(value, value + 1, len);
            value[strlen(value) - 1] = '\0';
        }
        CU_ASSERT(accepted("colossalai", key, value[0] == '[' ? NULL : value));
        n_keys++;
    }
    CU_ASSERT(n_keys >= 6);
    /* regressions: the keyword __init__ lacks; fp16 by default */
    CU_ASSERT(strstr(r.out, "enable_gradient_checkpointing") == NULL);
    const char *precision = r.bf16 ? "precision=\"bf16\"" : "precision=\"fp32\"";
    if (r.custom) /* no dtype: the user's to set, and said */
        precision = "carries no dtype";
    CU_ASSERT(strstr(r.custom ? r.err : r.out, precision) != NULL);
    CU_ASSERT(!r.custom || strstr(r.out, "precision=") == NULL);
    int got[MAX_STAGES];
    CU_ASSERT_EQUAL(parse_list(r.out, "num_layers_per_stage=", got), r.c.n);
    for (int s = 0; s < r.c.n; s++)
        CU_ASSERT_EQUAL(got[s], r.c.blocks[s]);
    int recomputed = total(r.c.recompute, r.c.n), blocks = total(r.c.blocks, r.c.n);
    CU_ASSERT((strstr(r.out, "model.gradient_checkpointing_enable(") != NULL) == (recomputed > 0));
    char more[128];
    snprintf(more, sizeof more, "recomputes every block or none; recomputing all ");
    CU_ASSERT((strstr(r.err, more) != NULL) ==
              (!r.custom && recomputed > 0 && recomputed < blocks));
    /* a custom model's per-stage counts, which the Llama-like policies read */
    CU_ASSERT((parse_list(r.out, "num_ckpt_layers_per_stage=", got) == r.c.n) ==
              (r.custom && recomputed > 0));
    if (r.custom && recomputed > 0)
        for (int s = 0; s < r.c.n; s++)
            CU_ASSERT_EQUAL(got[s], r.c.recompute[s]);
    if (!r.custom && recomputed > 0 && recomputed < blocks) {
        snprintf(more, sizeof more, ": %d block(s) more in all", blocks - recomputed);
        CU_ASSERT(strstr(r.err, more) != NULL);
    }
    CU_ASSERT((strstr(r.err, "GPipe; ColossalAI runs 1F1B") != NULL) == r.gpipe);
    check_kept_ends(&r, "ColossalAI");
    run_free(&r);
}

/* NeMo: a two-level YAML of keys megatron_gpt_config.yaml and the model take; the split as
 * NeMo makes it from the first and last stage's blocks (the rest even) equals the plan's, or
 * the export is refused naming the split; recomputation never less than the plan's. */
static void check_nemo(const char *cluster, const char *extra)
{
    struct run r;
    run_export(cluster, extra, "nemo", &r);
    if (refused_tp(&r)) {
        run_free(&r);
        return;
    }
    int S = r.c.n, middle_even = 1;
    for (int s = 2; s < S - 1; s++)
        middle_even = middle_even && r.c.blocks[s] == r.c.blocks[1];
    /* Megatron-core takes no first or last count below 1: two stages set the first (and the
     * last is the rest), more set either where it differs from the middle */
    int first_zero = S >= 2 && r.c.blocks[0] == 0 && (S == 2 || r.c.blocks[1] != 0);
    int last_zero = S >= 2 && r.c.blocks[S - 1] == 0 && (S == 2 || r.c.blocks[1] != 0);
    if (first_zero || last_zero)
        middle_even = 0;
    CU_ASSERT_EQUAL(r.rc, middle_even ? 0 : 2);
    if (r.rc != 0) {
        char split[512];
        int n = 0;
        for (int s = 0; s < S; s++)
            n += snprintf(split + n, sizeof split - (size_t)n, "%s%d", s ? ", " : "",
                          r.c.blocks[s]);
        CU_ASSERT(strstr(r.err, split) != NULL);
        CU_ASSERT(strstr(r.out, "model:") == NULL); /* nothing half-written */
        run_free(&r);
        return;
    }
    check_launch(&r);
    char section[64] = "", sub[64] = "", key[64], value[128];
    int pp = 0, first = -1, last = -1, num_layers = -1, n_keys = 0, tp = -1, sp = 0;
    char backend[32] = "", optim[64] = "";
    char granularity[32] = "", method[32] = "", modules[128] = "";
    for (const char *line = r.out; *line; line = strchr(line, '\n') + 1) {
        if (line[0] == '#')
            continue;
        if (line[0] != ' ') {
            CU_ASSERT_FATAL(sscanf(line, "%63[a-z_]:", section) == 1);
            continue;
        }
        const char *eol = strchr(line, '\n');
        if (eol[-1] == ':' && line[2] != ' ') { /* a section in model: (optim:) */
            CU_ASSERT_FATAL(sscanf(line, " %63[a-z_]:", sub) == 1);
            continue;
        }
        CU_ASSERT_FATAL(sscanf(line, " %63[a-z_]: %127[^\n]", key, value) == 2);
        char full[160];
        if (strncmp(line, "    ", 4) == 0)
            snprintf(full, sizeof full, "%s.%s.%s", section, sub, key);
        else
            snprintf(full, sizeof full, "%s.%s", section, key);
        CU_ASSERT(accepted("nemo", full, value[0] == '[' || isdigit((unsigned char)value[0]) ?
                                              NULL : value));
        n_keys++;
        if (strcmp(key, "pipeline_model_parallel_size") == 0)
            pp = atoi(value);
        else if (strcmp(full, "model.tensor_model_parallel_size") == 0)
            tp = atoi(value);
        else if (strcmp(full, "model.sequence_parallel") == 0)
            sp = strcmp(value, "True") == 0;
        else if (strcmp(full, "model.attention_backend") == 0)
            snprintf(backend, sizeof backend, "%s", value);
        else if (strcmp(full, "model.optim.name") == 0)
            snprintf(optim, sizeof optim, "%s", value);
        else if (strcmp(key, "num_layers_in_first_pipeline_stage") == 0)
            first = atoi(value);
        else if (strcmp(key, "num_layers_in_last_pipeline_stage") == 0)
            last = atoi(value);
        else if (strcmp(key, "activations_checkpoint_granularity") == 0)
            snprintf(granularity, sizeof granularity, "%s", value);
        else if (strcmp(key, "activations_checkpoint_method") == 0)
            snprintf(method, sizeof method, "%s", value);
        else if (strcmp(key, "activations_checkpoint_num_layers") == 0)
            num_layers = strcmp(value, "null") == 0 ? -1 : atoi(value);
        else if (strcmp(key, "recompute_modules") == 0)
            snprintf(modules, sizeof modules, "%s", value);
    }
    CU_ASSERT(n_keys >= 4);
    CU_ASSERT(strstr(r.out, "  mcore_gpt: True\n") != NULL);
    CU_ASSERT_EQUAL(tp, r.c.tp[0]);
    CU_ASSERT_EQUAL(sp, r.c.tp[0] > 1);
    CU_ASSERT(strcmp(backend, r.custom ? "" : r.flash ? "flash" : "unfused") == 0);
    CU_ASSERT(strcmp(optim, r.shard ? "distributed_fused_adam" : "") == 0);
    const char *precision = r.bf16 ? "  precision: bf16\n" : "  precision: 32\n";
    if (r.custom) /* no dtype: the user's to set, and said */
        precision = "carries no dtype";
    CU_ASSERT(strstr(r.custom ? r.err : r.out, precision) != NULL);
    CU_ASSERT(!r.custom || strstr(r.out, "precision:") == NULL);
    /* regression: read only by the legacy transformer */
    CU_ASSERT(strstr(r.out, "activations_checkpoint_layers_per_pipeline") == NULL);
    /* NeMo's split: first and last as set, the rest evenly (it checks divisibility) */
    CU_ASSERT_EQUAL_FATAL(pp, S);
    int rest = total(r.c.blocks, S), stages = S;
    if (first >= 0)
        rest -= first, stages--;
    if (last >= 0)
        rest -= last, stages--;
    CU_ASSERT_FATAL(stages > 0 && rest % stages == 0);
    for (int s = 0; s < S; s++) {
        int nemo = s == 0 && first >= 0 ? first : s == S - 1 && last >= 0 ? last : rest / stages;
        CU_ASSERT_EQUAL(nemo, r.c.blocks[s]);
    }
    int whole = 0, partial = total(r.c.partial, S), recomputed = total(r.c.recompute, S);
    whole = recomputed - partial;
    if (whole == 0 && partial > 0) {
        CU_ASSERT(strcmp(granularity, "selective") == 0 && strcmp(method, "null") == 0);
        CU_ASSERT(num_layers == -1);
        CU_ASSERT((strstr(modules, "core_attn") != NULL) == (r.c.attn > 0));
        CU_ASSERT((strstr(modules, "mlp") != NULL) == (r.c.mlp > 0));
    } else if (recomputed > 0) {
        CU_ASSERT(strcmp(granularity, "full") == 0 && strcmp(method, "block") == 0);
        int over = 0;
        for (int s = 0; s < S; s++) {
            int got = num_layers < r.c.blocks[s] ? num_layers : r.c.blocks[s];
            CU_ASSERT(got >= r.c.recompute[s]);
            over += got - r.c.recompute[s];
        }
        CU_ASSERT((over > 0) == (strstr(r.err, "block(s) more in all") != NULL));
    } else {
        CU_ASSERT(strcmp(granularity, "null") == 0);
    }
    run_free(&r);
}

/* Megatron-LM: every flag one its parser makes, continued lines clean, the layout string
 * every stage's blocks, E first, L last, --bf16 for bf16 models, 1F1B said for GPipe plans. */
static void check_megatron(const char *cluster, const char *extra)
{
    struct run r;
    run_export(cluster, extra, "megatron", &r);
    if (refused_tp(&r)) {
        run_free(&r);
        return;
    }
    CU_ASSERT_EQUAL_FATAL(r.rc, 0);
    check_launch(&r);
    char tp[64];
    snprintf(tp, sizeof tp, "\n--tensor-model-parallel-size %d%s \\\n", r.c.tp[0],
             r.c.tp[0] > 1 ? " --sequence-parallel" : "");
    CU_ASSERT(strstr(r.out, tp) != NULL);
    CU_ASSERT((strstr(r.out, " --sequence-parallel") != NULL) == (r.c.tp[0] > 1));
    CU_ASSERT((strstr(r.out, "\n--use-distributed-optimizer") != NULL) == r.shard);
    CU_ASSERT((strstr(r.out, "\n--attention-backend flash") != NULL) == (r.flash && !r.custom));
    CU_ASSERT((strstr(r.out, "\n--attention-backend unfused") != NULL) ==
              (!r.flash && !r.custom));
    CU_ASSERT(shell_continuations_clean(r.out));
    /* every flag one Megatron-LM takes, every value one of its choices */
    for (const char *at = strstr(r.out, "\n--"); at; at = strstr(at + 1, " --")) {
        char flag[64], value[64];
        int n = sscanf(at + 1, "%63s %63s", flag, value);
        int takes_value = n == 2 && value[0] != '-' && value[0] != '\\' && value[0] != '"' &&
                          !isdigit((unsigned char)value[0]);
        CU_ASSERT(accepted("megatron", flag, takes_value ? value : NULL));
    }
    CU_ASSERT((strstr(r.out, "\n--bf16 \\\n") != NULL || strstr(r.out, "\n--bf16\n") != NULL) ==
              r.bf16);
    CU_ASSERT((strstr(r.err, "GPipe; Megatron-LM runs 1F1B") != NULL) == r.gpipe);
    check_kept_ends(&r, "Megatron-LM");
    const char *lay = strstr(r.out, "--pipeline-model-parallel-layout \"");
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
        CU_ASSERT(s < r.c.n && blocks == r.c.blocks[s]);
        CU_ASSERT((memchr(p, 'L', (size_t)(bar - p)) != NULL) == (s == r.c.n - 1));
        p = *bar == '|' ? bar + 1 : bar;
    }
    CU_ASSERT_EQUAL(s, r.c.n);
    /* selective recomputation when no block is recomputed whole, else whole blocks with the
     * blocks recomputed in part counted whole */
    int partial = total(r.c.partial, r.c.n), whole = total(r.c.recompute, r.c.n) - partial;
    const char *sel = strstr(r.out, "--recompute-granularity selective \\\n--recompute-modules");
    CU_ASSERT((sel != NULL) == (whole == 0 && partial > 0));
    if (sel) {
        char line[128];
        snprintf(line, sizeof line,
                 "--recompute-granularity selective \\\n--recompute-modules%s%s\n",
                 r.c.attn ? " core_attn" : "", r.c.mlp ? " mlp" : "");
        CU_ASSERT(strncmp(sel, line, strlen(line)) == 0);
    }
    for (s = 0; s < r.c.n && !sel; s++)
        most = r.c.recompute[s] > most ? r.c.recompute[s] : most;
    const char *rn = strstr(r.out, "--recompute-method block --recompute-num-layers ");
    CU_ASSERT((rn != NULL) == (most > 0));
    if (rn)
        CU_ASSERT_EQUAL(atoi(rn + strlen("--recompute-method block --recompute-num-layers ")),
                        most);
    CU_ASSERT((partial > 0 && !sel) == (strstr(r.err, "only in part") != NULL));
    run_free(&r);
}

/* FlagScale: a YAML whose every key path (system.hetero.…) its source takes; the split, the
 * meshes (tp, cp, ep, dp, pp per device kind, in pipeline order) and each stage's recomputed
 * blocks in every micro-batch exactly the plan's (blocks recomputed in part counted whole). */
static void check_flagscale(const char *cluster, const char *extra)
{
    struct run r;
    run_export(cluster, extra, "flagscale", &r);
    CU_ASSERT_EQUAL_FATAL(r.rc, 0);
    char path[3][64] = {"", "", ""}, key[64], value[256];
    int S = r.c.n, split[MAX_STAGES], n_split = -1, meshes[5 * MAX_STAGES], n_mesh = -1;
    int per_stage[MAX_STAGES], staged = 0, pp = 0, selective = 0, n_keys = 0;
    for (const char *line = r.out; *line; line = strchr(line, '\n') + 1) {
        if (line[0] == '#')
            continue;
        int depth = (int)(strspn(line, " ") / 2);
        if (strncmp(line + 2 * depth, "- [", 3) == 0) { /* [stages, micro-batches, blocks] */
            int v[3];
            CU_ASSERT_FATAL(sscanf(line + 2 * depth, "- [%d, %d, %d]", &v[0], &v[1], &v[2]) == 3);
            CU_ASSERT_EQUAL(v[1], r.micro_batches); /* every micro-batch alike */
            CU_ASSERT_FATAL(v[0] >= 1 && staged + v[0] <= S);
            for (int i = 0; i < v[0]; i++)
                per_stage[staged++] = v[2];
            continue;
        }
        CU_ASSERT_FATAL(depth < 3);
        value[0] = '\0';
        CU_ASSERT_FATAL(sscanf(line + 2 * depth, "%63[a-z_0-9]:%255[^\n]", key, value) >= 1);
        snprintf(path[depth], sizeof path[depth], "%s", key);
        const char *v = value[0] == ' ' ? value + 1 : value;
        if (v[0] == '\0')
            continue; /* a section */
        char full[256];
        snprintf(full, sizeof full, "%s", path[0]);
        for (int d = 1; d <= depth; d++)
            snprintf(full + strlen(full), sizeof full - strlen(full), ".%s", path[d]);
        CU_ASSERT(accepted("flagscale", full,
                           v[0] == '[' || isdigit((unsigned char)v[0]) ? NULL : v));
        n_keys++;
        if (strcmp(key, "pipeline_model_parallel_size") == 0)
            pp = atoi(v);
        else if (strcmp(key, "hetero_pipeline_layer_split") == 0)
            n_split = parse_list(line, "split:", split);
        else if (strcmp(key, "hetero_process_meshes") == 0)
            n_mesh = parse_list(line, "meshes:", meshes);
        else if (strcmp(key, "recompute_granularity") == 0)
            selective = strcmp(v, "selective") == 0;
    }
    CU_ASSERT(n_keys >= 5);
    CU_ASSERT_EQUAL(pp, S);
    CU_ASSERT_EQUAL_FATAL(n_split, S);
    for (int s = 0; s < S; s++)
        CU_ASSERT_EQUAL(split[s], r.c.blocks[s]);
    CU_ASSERT_FATAL(n_mesh > 0 && n_mesh % 5 == 0);
    int mesh_stages = 0, any_tp = 0;
    for (int m = 0; m < n_mesh; m += 5) { /* tp, cp, ep, dp, pp: each stage's tp and dp */
        CU_ASSERT(meshes[m + 1] == 1 && meshes[m + 2] == 1);
        for (int s = mesh_stages; s < mesh_stages + meshes[m + 4] && s < S; s++)
            CU_ASSERT(meshes[m] == r.c.tp[s] && meshes[m + 3] == r.c.dp[s]);
        any_tp = any_tp || meshes[m] > 1;
        mesh_stages += meshes[m + 4];
    }
    CU_ASSERT_EQUAL(mesh_stages, S);
    CU_ASSERT((strstr(r.out, "\n  sequence_parallel: True\n") != NULL) == any_tp);
    CU_ASSERT((strstr(r.out, "\n  use_distributed_optimizer: True\n") != NULL) == r.shard);
    CU_ASSERT((strstr(r.out, "\n  attention_backend: flash\n") != NULL) == (r.flash && !r.custom));
    CU_ASSERT((strstr(r.out, "\n  attention_backend: unfused\n") != NULL) ==
              (!r.flash && !r.custom));
    /* Ballast's heads are untied: FlagScale then takes any first and last tp */
    CU_ASSERT((strstr(r.out, "\n  untie_embeddings_and_output_weights: True\n") != NULL) ==
              !r.custom);
    CU_ASSERT((strstr(r.out, "    bf16: True\n") != NULL) == r.bf16);
    int partial = total(r.c.partial, S), recomputed = total(r.c.recompute, S);
    CU_ASSERT(selective == (recomputed == partial && partial > 0));
    if (!selective && recomputed > 0) {
        CU_ASSERT_EQUAL(staged, S);
        for (int s = 0; s < S; s++)
            CU_ASSERT_EQUAL(per_stage[s], r.c.recompute[s]);
    } else {
        CU_ASSERT_EQUAL(staged, 0);
    }
    CU_ASSERT((strstr(r.err, "GPipe; FlagScale runs 1F1B") != NULL) == r.gpipe);
    check_kept_ends(&r, "FlagScale");
    run_free(&r);
}

static void check_all_formats(const char *cluster, const char *extra)
{
    check_colossalai(cluster, extra);
    check_nemo(cluster, extra);
    check_megatron(cluster, extra);
    check_flagscale(cluster, extra);
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
    check_all_formats("clusters/cpu-3.json", "");
    check_all_formats("clusters/cpu-3.json", "--method block:2");
    /* a custom model: every layer a block, no dtype */
    check_all_formats("clusters/custom/example-4.json", "");
    check_all_formats("clusters/custom/example-4.json", "--method full");
}

/* cpu-3 under --method full with its last stage's memory cut to what the plan needs: the
 * plan recomputes the head, the frameworks keep it, so the export says that stage may not
 * fit, with its need and limit. */
static const char *write_cluster(cJSON *c)
{
    char *s = cJSON_Print(c);
    const char *path = test_write("tight-cluster.json", s);
    cJSON_free(s);
    return path;
}

static void test_export_kept_head_overflows(void)
{
    char args[2048], *text = test_read(CONFIGS "clusters/cpu-3.json");
    cJSON *c = cJSON_Parse(text);
    free(text);
    cJSON *st;
    cJSON_ArrayForEach(st, cJSON_GetObjectItem(c, "stages"))
    {
        char prof[1024];
        snprintf(prof, sizeof prof, "%sclusters/%s", CONFIGS,
                 cJSON_GetObjectItem(st, "profile")->valuestring);
        cJSON_SetValuestring(cJSON_GetObjectItem(st, "profile"), prof);
    }
    const char *plan = test_path("tight-plan.json");
    snprintf(args, sizeof args, "plan --cluster '%s' --method full --quiet -o '%s'",
             write_cluster(c), plan);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    text = test_read(plan);
    cJSON *p = cJSON_Parse(text);
    free(text);
    const cJSON *last = cJSON_GetArrayItem(cJSON_GetObjectItem(p, "stages"), 2);
    double slack = cJSON_GetObjectItem(last, "memory_limit_bytes")->valuedouble -
                   cJSON_GetObjectItem(last, "memory_bytes")->valuedouble;
    cJSON_Delete(p);
    cJSON *mem = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(c, "stages"), 2),
                                     "memory_bytes");
    cJSON_SetNumberValue(mem, mem->valuedouble - slack);
    snprintf(args, sizeof args, "plan --cluster '%s' --method full --export megatron",
             write_cluster(c));
    cJSON_Delete(c);
    char *out = NULL, *err = NULL;
    CU_ASSERT_EQUAL(test_run(args, &out, &err), 0);
    CU_ASSERT(err && strstr(err, "stage 2 may not fit as Megatron-LM runs it"));
    CU_ASSERT(err && strstr(err, "stage 1 may not fit") == NULL);
    free(out);
    free(err);
}

/* The defects found against the frameworks' source: ColossalAI's keyword __init__ lacked
 * and its fp16 default, NeMo's legacy-only key and the even split it cannot run
 * (v100-a100-8: refused, exit 2), Megatron-LM's unfinished --recompute-modules line, no
 * --bf16, and a GPipe plan exported without a word. */
static void test_export_regressions(void)
{
    struct run r;
    run_export("clusters/v100-a100-8.json", "", "nemo", &r);
    CU_ASSERT_EQUAL(r.rc, 2);
    CU_ASSERT(strstr(r.err, "[4, 4, 4, 4, 6, 6, 6, 6]") != NULL);
    run_free(&r);
    run_export("clusters/t4-4090-4.json", "", "megatron", &r);
    CU_ASSERT_EQUAL_FATAL(r.rc, 0);
    CU_ASSERT(r.gpipe && strstr(r.err, "Megatron-LM runs 1F1B") != NULL);
    CU_ASSERT(strstr(r.out, "--recompute-granularity selective \\\n") != NULL);
    CU_ASSERT(strstr(r.out, "\n--bf16 \\\n") != NULL);
    run_free(&r);
    run_export("clusters/v100-a100-8.json", "", "colossalai", &r);
    CU_ASSERT(strstr(r.out, "enable_gradient_checkpointing=") == NULL);
    CU_ASSERT(strstr(r.out, "num_ckpt_layers_per_stage") == NULL);
    CU_ASSERT(strstr(r.out, "precision=\"bf16\"") != NULL);
    run_free(&r);
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

/* A plan that offloads cannot be expressed per stage by NeMo, ColossalAI or FlagScale:
 * refused, exit 2, with the stage and the bytes; Megatron-LM refuses this one (its stage 0
 * offloads the attn+mlp option's tensors, and Megatron-LM offloads nothing inside a dense
 * MLP) naming the layer and the bytes; the same cluster planned without offload exports. */
static void test_export_refuses_offload(void)
{
    const char *frameworks[] = {"megatron", "nemo", "colossalai", "flagscale"};
    for (int k = 0; k < 4; k++) {
        char args[1024], *out = NULL, *err = NULL;
        snprintf(args, sizeof args,
                 "plan --cluster %s/configs/clusters/cpu-3-offload.json --actions "
                 "recompute,offload --export %s --quiet",
                 BALLAST_SOURCE_DIR, frameworks[k]);
        CU_ASSERT_EQUAL(test_run(args, &out, &err), 2);
        if (k == 0) {
            CU_ASSERT(err != NULL && strstr(err, "stage 0 layer 1 (block.0) sends attn+mlp") &&
                      strstr(err, "bytes per micro-batch") && strstr(err, "--offload-modules"));
        } else {
            CU_ASSERT(err != NULL && strstr(err, "stage 0 sends") != NULL &&
                      strstr(err, "without --actions offload") != NULL);
        }
        free(out);
        free(err);
    }
    char args[1024], *out = NULL, *err = NULL;
    snprintf(args, sizeof args,
             "plan --cluster %s/configs/clusters/cpu-3-offload.json --export megatron --quiet",
             BALLAST_SOURCE_DIR);
    CU_ASSERT_EQUAL(test_run(args, &out, &err), 0);
    free(out);
    free(err);
}

/* cpu-3-offload with roomy stages, planned recompute-only (nothing recomputed): blocks
 * [2, 3, 1] per stage. */
static void roomy_offload_plan(struct plan *p)
{
    struct cluster c;
    struct plan_options o;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(cluster_load(BALLAST_SOURCE_DIR "/configs/clusters/cpu-3-offload.json", &c,
                                 &e) == ERR_OK);
    for (int s = 0; s < c.n_stages; s++)
        c.stages[s].memory_bytes = (int64_t)1 << 30;
    plan_options_default(&o);
    CU_ASSERT_FATAL(planner_make(&c, &o, p, &e) == ERR_OK);
    cluster_free(&c);
}

/* The first k[s] blocks of every stage send the attn option's tensors to host memory, the
 * rest keep all; stage memory as the cost model has it. */
static void offload_attn(struct plan *p, const int *k)
{
    for (int s = 0; s < p->n_stages; s++) {
        struct plan_stage *st = &p->stages[s];
        for (int l = 0, block = 0; l < plan_stage_layer_count(st); l++) {
            st->offload_option[l] = -1;
            st->prefetch_ahead[l] = 0;
            if (model_layer_kind(&p->model, st->first + l) != MODEL_LAYER_BLOCK)
                continue;
            CU_ASSERT_FATAL(strcmp(st->layers[l].options[0].name, "attn") == 0);
            if (block++ < k[s]) {
                st->offload_option[l] = 0;
                st->prefetch_ahead[l] = 1;
            }
        }
        struct stage_cost c;
        plan_stage_cost(p, st, &c);
        st->memory_bytes = c.memory_bytes;
        st->host_memory_bytes = c.host_memory_bytes;
    }
}

/* planner_export's exit code for megatron, its output and standard error (run as `ballast
 * plan` does, standard error to a file). */
static int export_megatron(const struct plan *p, char **out, char **err_text)
{
    struct err e;
    err_clear(&e);
    FILE *f = fopen(test_path("mo.sh"), "w"), *saved = stderr;
    FILE *note = fopen(test_path("mo.err"), "w");
    CU_ASSERT_FATAL(f != NULL && note != NULL);
    stderr = note;
    int rc = planner_export(f, p, "megatron", 0, &e);
    stderr = saved;
    fclose(f);
    if (rc)
        fprintf(note, "%s\n", e.msg);
    fclose(note);
    *out = test_read(test_path("mo.sh"));
    *err_text = test_read(test_path("mo.err"));
    return rc;
}

/* Megatron-LM's fine-grained activation offloading (megatron/core/pipeline_parallel/
 * fine_grained_activation_offload.py, post_warmup_callback): of a chunk's `groups` eligible
 * groups, the last int(groups x (1 - fraction)) stay on the device. */
static int megatron_offloaded(int groups, double fraction)
{
    return groups - (int)(groups * (1 - fraction));
}

/* Megatron-LM takes an offload of the attn option's tensors on the first blocks of every
 * stage in one fraction: every flag one its parser makes (tests/data/export_keys.json), the
 * fraction giving each stage's count by Megatron-LM's own rule; refused (exit 2, with the
 * numbers) where no fraction gives the plan's counts, where the blocks are not the first,
 * where the plan also recomputes, and where a stage has no room for Megatron-LM's reload
 * margin. */
static void test_export_megatron_offload(void)
{
    static const int cases[][3] = {{2, 3, 1}, {1, 2, 1}, {1, 0, 0}};
    for (int t = 0; t < 3; t++) {
        struct plan p;
        char *out, *err;
        roomy_offload_plan(&p);
        CU_ASSERT_FATAL(p.n_stages == 3);
        offload_attn(&p, cases[t]);
        int rc = export_megatron(&p, &out, &err);
        if (t == 2) { /* stage 0 offloads half, stage 1 none: no one fraction */
            CU_ASSERT_EQUAL(rc, ERR_INPUT);
            CU_ASSERT(err && strstr(err, "[1 of 2, 0 of 3, 0 of 1]"));
        } else {
            CU_ASSERT_EQUAL_FATAL(rc, ERR_OK);
            CU_ASSERT(shell_continuations_clean(out));
            for (const char *at = strstr(out, "\n--"); at; at = strstr(at + 1, " --")) {
                char flag[64], value[64];
                int n = sscanf(at + 1, "%63s %63s", flag, value);
                int takes_value = n == 2 && value[0] != '-' && value[0] != '\\' &&
                                  value[0] != '"' && !isdigit((unsigned char)value[0]);
                CU_ASSERT(accepted("megatron", flag, takes_value ? value : NULL));
            }
            CU_ASSERT(strstr(out, "--fine-grained-activation-offloading") &&
                      strstr(out, "--offload-modules core_attn") &&
                      strstr(out, "--min-offloaded-tensor-size 0") &&
                      strstr(out, "NVTE_CPU_OFFLOAD_V1=1"));
            const char *fr = strstr(out, "--activation-offload-fraction ");
            double f = fr ? atof(fr + strlen("--activation-offload-fraction ")) : 1.0;
            CU_ASSERT((fr == NULL) == (t == 0)); /* every block: the default 1.0 */
            int blocks[3] = {2, 3, 1};
            for (int s = 0; s < 3; s++)
                CU_ASSERT_EQUAL(megatron_offloaded(blocks[s], f), cases[t][s]);
            CU_ASSERT(err && strstr(err, "reload margin") && strstr(err, "core attention"));
        }
        free(out);
        free(err);
        plan_free(&p);
    }
    /* not the first blocks: stage 1 offloads its second block only */
    struct plan p;
    char *out, *err;
    roomy_offload_plan(&p);
    offload_attn(&p, (const int[]){2, 3, 1});
    p.stages[1].offload_option[0] = -1; /* block.2 keeps all, block.3 and block.4 offload */
    p.stages[1].prefetch_ahead[0] = 0;
    CU_ASSERT_EQUAL(export_megatron(&p, &out, &err), ERR_INPUT);
    CU_ASSERT(err && strstr(err, "[2 of 2, 2 of 3, 1 of 1]"));
    free(out);
    free(err);
    /* also recomputing a block */
    offload_attn(&p, (const int[]){1, 3, 1});
    p.stages[0].recompute[2] = COST_FULL; /* block.1, which does not offload */
    CU_ASSERT_EQUAL(export_megatron(&p, &out, &err), ERR_INPUT);
    CU_ASSERT(err && strstr(err, "recomputes 1 block(s)"));
    free(out);
    free(err);
    /* no room on stage 1 for one block's attention tensors more */
    p.stages[0].recompute[2] = COST_KEEP;
    offload_attn(&p, (const int[]){2, 3, 1});
    p.stages[1].memory_limit_bytes = p.stages[1].memory_bytes;
    CU_ASSERT_EQUAL(export_megatron(&p, &out, &err), ERR_INPUT);
    CU_ASSERT(err && strstr(err, "reload margin") && strstr(err, "stage 1 would need"));
    free(out);
    free(err);
    plan_free(&p);
}

/* A Llama plan: ColossalAI's llama policy and NeMo take its precision from the model. */
static void test_export_llama_precision(void)
{
    char args[1024], *out = NULL, *err = NULL;
    snprintf(args, sizeof args,
             "plan --cluster %s/configs/clusters/llama2-7b-h100-a100-8.json --export colossalai "
             "--quiet",
             BALLAST_SOURCE_DIR);
    CU_ASSERT_EQUAL(test_run(args, &out, &err), 0);
    CU_ASSERT(out != NULL && strstr(out, "precision=\"bf16\"") != NULL &&
              strstr(out, "LlamaForCausalLM") != NULL);
    free(out);
    free(err);
    snprintf(args, sizeof args,
             "plan --cluster %s/configs/clusters/llama2-7b-h100-a100-8.json --export nemo --quiet",
             BALLAST_SOURCE_DIR);
    out = err = NULL;
    int rc = test_run(args, &out, &err);
    CU_ASSERT(rc == 2 || (rc == 0 && out != NULL && strstr(out, "precision: bf16") != NULL));
    free(out);
    free(err);
}

/* cpu-3's cluster on `profile` with every stage of tp `tp` and dp `dp` (shard_optimizer when
 * `shard`), written as `name`; stage `other` (-1: none) on device "cpu2" (the same profile,
 * renamed) with tp `other_tp`. */
static const char *tp_cluster(const char *name, int tp, int dp, int shard, int other,
                              int other_tp, const char *profile)
{
    char *text = test_read(CONFIGS "clusters/cpu-3.json");
    cJSON *c = cJSON_Parse(text), *st;
    free(text);
    text = test_read(profile);
    cJSON *prof = cJSON_Parse(text);
    free(text);
    cJSON_SetValuestring(cJSON_GetObjectItem(cJSON_GetObjectItem(prof, "device"), "name"),
                         "cpu2");
    char *s = cJSON_Print(prof), cpu2[1024];
    snprintf(cpu2, sizeof cpu2, "%s", test_write("cpu2.json", s));
    cJSON_free(s);
    cJSON_Delete(prof);
    int k = 0;
    cJSON_ArrayForEach(st, cJSON_GetObjectItem(c, "stages"))
    {
        cJSON_SetValuestring(cJSON_GetObjectItem(st, "profile"), k == other ? cpu2 : profile);
        if (k == other)
            cJSON_SetValuestring(cJSON_GetObjectItem(st, "device"), "cpu2");
        cJSON_AddNumberToObject(st, "tp", k == other ? other_tp : tp);
        cJSON_AddNumberToObject(st, "dp", dp);
        k++;
    }
    if (shard)
        cJSON_AddTrueToObject(c, "shard_optimizer");
    s = cJSON_Print(c);
    const char *path = test_write(name, s);
    cJSON_free(s);
    cJSON_Delete(c);
    return path;
}

/* Plans with tp and dp (cpu-3's GPT, 4 heads): every format's keys, the tp, sequence
 * parallelism, the distributed optimizer and the meshes checked against the plan file
 * (check_*); a tp per stage refused by Megatron-LM, NeMo and ColossalAI with the stage and
 * both numbers, taken by FlagScale's meshes (Ballast's untied head lets the first and last
 * tp differ). */
static void test_export_tpdp(void)
{
    const char *cpu = CONFIGS "profiles/estimated/gpt-tiny/cpu.json";
    char path[1024];
    snprintf(path, sizeof path, "%s", tp_cluster("tp2dp2.json", 2, 2, 1, -1, 0, cpu));
    check_all_formats(path, "");
    snprintf(path, sizeof path, "%s", tp_cluster("tp4dp3.json", 4, 3, 0, -1, 0, cpu));
    check_all_formats(path, "--method full");
    /* the middle stage tp 4: FlagScale only */
    snprintf(path, sizeof path, "%s", tp_cluster("tp-middle.json", 2, 2, 1, 1, 4, cpu));
    check_all_formats(path, "");
    /* the last stage tp 4: FlagScale only */
    snprintf(path, sizeof path, "%s", tp_cluster("tp-last.json", 2, 1, 0, 2, 4, cpu));
    check_all_formats(path, "");
    /* the FlagScale export of the middle one, by hand */
    struct run r;
    snprintf(path, sizeof path, "%s", test_path("tp-middle.json"));
    run_export(path, "", "flagscale", &r);
    CU_ASSERT_EQUAL(r.rc, 0);
    CU_ASSERT(strstr(r.out, "hetero_process_meshes: [2, 1, 1, 2, 1, 4, 1, 1, 2, 1, 2, 1, 1, 2, "
                            "1]\n    hetero_device_types: [\"cpu\", \"cpu2\", \"cpu\"]\n") != NULL);
    run_free(&r);
}

/* A flash GPT (gpt-tiny-flash, estimated on the CPU): every format sets the framework's flash
 * kernel (check_*: Megatron-LM and NeMo --attention-backend flash, FlagScale its
 * attention_backend, ColossalAI enable_flash_attention), the materialized plans above the
 * unfused backend or ColossalAI's note. */
static void test_export_flash(void)
{
    char args[2048], prof[1024];
    snprintf(prof, sizeof prof, "%s", test_path("gpt-tiny-flash-cpu.json"));
    snprintf(args, sizeof args,
             "profile --model '%smodels/gpt-tiny-flash.json' --estimate --device cpu -o '%s'",
             CONFIGS, prof);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    char path[1024];
    snprintf(path, sizeof path, "%s", tp_cluster("flash.json", 1, 1, 0, -1, 0, prof));
    check_all_formats(path, "");
    check_all_formats(path, "--method full");
    snprintf(path, sizeof path, "%s", tp_cluster("flash-tp.json", 2, 2, 1, -1, 0, prof));
    check_all_formats(path, "");
    struct run r;
    run_export(path, "", "megatron", &r);
    CU_ASSERT(r.flash && strstr(r.out, "--attention-backend flash") != NULL);
    run_free(&r);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("export", NULL, NULL);
    CU_add_test(s, "exports describe the plan they export", test_exports);
    CU_add_test(s, "export defects found against the frameworks' source", test_export_regressions);
    CU_add_test(s, "export: a kept head that overflows is said", test_export_kept_head_overflows);
    CU_add_test(s, "export: a plan that offloads is refused", test_export_refuses_offload);
    CU_add_test(s, "export: Megatron-LM's activation offloading", test_export_megatron_offload);
    CU_add_test(s, "export: a Llama plan's precision", test_export_llama_precision);
    CU_add_test(s, "export: tp, dp and the distributed optimizer", test_export_tpdp);
    CU_add_test(s, "export: flash attention", test_export_flash);
    CU_add_test(s, "--micro-batches auto is the fastest size", test_micro_batches_auto);
    CU_add_test(s, "--micro-batches auto rescales a measured profile's options",
                test_micro_batches_auto_measured);
    return test_main();
}
