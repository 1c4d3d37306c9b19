/* A user's framework configuration as key = value pairs, their keys as Megatron-LM names, read
 * once (check_read.h). */
#include "check_read.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "framework.h"

#define KV_MAX 512

struct kv {
    char key[128];
    char value[1024];
};

struct kvs {
    int n;
    struct kv items[KV_MAX];
};

static int kv_add(struct kvs *k, const char *key, size_t key_len, const char *value,
                  size_t value_len, struct err *e)
{
    if (k->n == KV_MAX)
        return err_set(e, ERR_INPUT, "check: more than %d settings", KV_MAX);
    struct kv *it = &k->items[k->n++];
    snprintf(it->key, sizeof it->key, "%.*s", (int)key_len, key);
    snprintf(it->value, sizeof it->value, "%.*s", (int)value_len, value);
    return ERR_OK;
}

/* The next word of a command line (double or single quotes group, backslash-newline is a
 * space): its start and length in *w, *n; 0 at the end. */
static int next_word(const char **at, char *word, size_t size)
{
    const char *s = *at;
    while (*s && (isspace((unsigned char)*s) || (*s == '\\' && s[1] == '\n')))
        s += *s == '\\' ? 2 : 1;
    if (*s == '\0')
        return 0;
    size_t n = 0;
    char quote = 0;
    for (; *s && (quote || !isspace((unsigned char)*s)); s++) {
        if ((*s == '"' || *s == '\'') && (!quote || quote == *s)) {
            quote = quote ? 0 : *s;
            continue;
        }
        if (*s == '\\' && s[1] == '\n') {
            s++;
            continue;
        }
        if (n + 1 < size)
            word[n++] = *s;
    }
    word[n] = '\0';
    *at = s;
    return 1;
}

/* Megatron-LM's arguments: --name [values...]; a switch reads "true". */
static int from_args(const char *text, struct kvs *k, struct err *e)
{
    char word[1024], key[128] = "", value[1024] = "";
    const char *at = text;
    int open = 0;
    while (next_word(&at, word, sizeof word)) {
        if (strncmp(word, "--", 2) == 0 && !isdigit((unsigned char)word[2])) {
            if (open && kv_add(k, key, strlen(key), value[0] ? value : "true",
                               strlen(value[0] ? value : "true"), e))
                return e->code;
            snprintf(key, sizeof key, "%s", word + 2);
            for (char *c = key; *c; c++)
                *c = *c == '-' ? '_' : *c;
            value[0] = '\0';
            open = 1;
            continue;
        }
        if (!open)
            return err_set(e, ERR_INPUT, "check --from megatron: \"%s\" is not an argument "
                           "(expected --name value ...)", word);
        size_t n = strlen(value);
        snprintf(value + n, sizeof value - n, "%s%s", n ? " " : "", word);
    }
    if (open && kv_add(k, key, strlen(key), value[0] ? value : "true",
                       strlen(value[0] ? value : "true"), e))
        return e->code;
    return ERR_OK;
}

/* key=value pairs separated by spaces or commas outside brackets (Hydra overrides, keyword
 * arguments); a leading + or ++ of an override is dropped. */
static int from_assignments(const char *text, struct kvs *k, struct err *e)
{
    const char *s = text;
    while (*s) {
        while (*s && (isspace((unsigned char)*s) || *s == ','))
            s++;
        if (*s == '\0')
            break;
        while (*s == '+')
            s++;
        const char *key = s, *eq = strchr(s, '=');
        if (eq == NULL)
            return err_set(e, ERR_INPUT, "check: \"%s\": expected key=value", key);
        const char *v = eq + 1, *end = v;
        for (int depth = 0; *end && (depth || !(isspace((unsigned char)*end) || *end == ','));
             end++)
            depth += *end == '[' || *end == '(' ? 1 : *end == ']' || *end == ')' ? -1 : 0;
        size_t key_len = (size_t)(eq - key);
        while (key_len && isspace((unsigned char)key[key_len - 1]))
            key_len--;
        if (kv_add(k, key, key_len, v, (size_t)(end - v), e))
            return e->code;
        s = end;
    }
    return ERR_OK;
}

/* ---- YAML: nested mappings as dotted keys, sequences as "[a, b]" (nested "[[..], [..]]") ---- */

static int yaml_next(yaml_parser_t *p, yaml_event_t *ev, const char *file, struct err *e)
{
    if (!yaml_parser_parse(p, ev))
        return err_set(e, ERR_INPUT, "%s: line %zu: %s", file, p->problem_mark.line + 1,
                       p->problem ? p->problem : "YAML error");
    return ERR_OK;
}

static int yaml_value(yaml_parser_t *p, yaml_event_t *ev, const char *path, struct kvs *k,
                      char *seq, size_t seq_size, const char *file, struct err *e);

/* A sequence's items into `out` as "[a, b]". */
static int yaml_sequence(yaml_parser_t *p, char *out, size_t size, const char *file,
                         struct err *e)
{
    size_t n = (size_t)snprintf(out, size, "[");
    for (int first = 1;; first = 0) {
        yaml_event_t ev;
        char item[1024] = "";
        if (yaml_next(p, &ev, file, e))
            return e->code;
        if (ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        int rc = yaml_value(p, &ev, NULL, NULL, item, sizeof item, file, e);
        yaml_event_delete(&ev);
        if (rc)
            return rc;
        n += (size_t)snprintf(out + n, n < size ? size - n : 0, "%s%s", first ? "" : ", ", item);
    }
    snprintf(out + (n < size ? n : size - 1), n < size ? size - n : 1, "]");
    return ERR_OK;
}

/* The value that starts with `ev` at `path` (NULL inside a sequence: its text into `seq`). */
static int yaml_value(yaml_parser_t *p, yaml_event_t *ev, const char *path, struct kvs *k,
                      char *seq, size_t seq_size, const char *file, struct err *e)
{
    char text[1024];
    if (ev->type == YAML_SCALAR_EVENT) {
        snprintf(text, sizeof text, "%.*s", (int)ev->data.scalar.length,
                 (const char *)ev->data.scalar.value);
    } else if (ev->type == YAML_SEQUENCE_START_EVENT) {
        if (yaml_sequence(p, text, sizeof text, file, e))
            return e->code;
    } else if (ev->type == YAML_MAPPING_START_EVENT && path != NULL) {
        for (;;) {
            yaml_event_t key, val;
            if (yaml_next(p, &key, file, e))
                return e->code;
            if (key.type == YAML_MAPPING_END_EVENT) {
                yaml_event_delete(&key);
                return ERR_OK;
            }
            char sub[256];
            snprintf(sub, sizeof sub, "%s%s%.*s", path, path[0] ? "." : "",
                     key.type == YAML_SCALAR_EVENT ? (int)key.data.scalar.length : 0,
                     key.type == YAML_SCALAR_EVENT ? (const char *)key.data.scalar.value : "");
            yaml_event_delete(&key);
            int rc = yaml_next(p, &val, file, e) ||
                     yaml_value(p, &val, sub, k, NULL, 0, file, e);
            yaml_event_delete(&val);
            if (rc)
                return e->code;
        }
    } else {
        return err_set(e, ERR_INPUT, "%s: %s: a value of a kind check does not read", file,
                       path ? path : "a sequence item");
    }
    if (path == NULL) {
        snprintf(seq, seq_size, "%s", text);
        return ERR_OK;
    }
    return kv_add(k, path, strlen(path), text, strlen(text), e);
}

static int from_yaml(const char *file, struct kvs *k, struct err *e)
{
    FILE *f = fopen(file, "rb");
    if (f == NULL)
        return err_set(e, ERR_INPUT, "%s: cannot open", file);
    yaml_parser_t p;
    yaml_event_t ev;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_file(&p, f);
    int rc = ERR_OK;
    while (rc == ERR_OK && yaml_next(&p, &ev, file, e) == ERR_OK) {
        int done = ev.type == YAML_STREAM_END_EVENT;
        if (ev.type == YAML_MAPPING_START_EVENT)
            rc = yaml_value(&p, &ev, "", k, NULL, 0, file, e);
        yaml_event_delete(&ev);
        if (done)
            break;
    }
    yaml_parser_delete(&p);
    fclose(f);
    return e->code;
}

/* ---- each framework's keys as Megatron-LM's names ---- */

static const struct {
    const char *framework, *key, *as;
} names[] = {
    {"nemo", "model.pipeline_model_parallel_size", "pipeline_model_parallel_size"},
    {"nemo", "model.tensor_model_parallel_size", "tensor_model_parallel_size"},
    {"nemo", "model.num_layers_in_first_pipeline_stage", "decoder_first_pipeline_num_layers"},
    {"nemo", "model.num_layers_in_last_pipeline_stage", "decoder_last_pipeline_num_layers"},
    {"nemo", "model.num_layers", "num_layers"},
    {"nemo", "model.hidden_size", "hidden_size"},
    {"nemo", "model.num_attention_heads", "num_attention_heads"},
    {"nemo", "model.ffn_hidden_size", "ffn_hidden_size"},
    {"nemo", "model.encoder_seq_length", "seq_length"},
    {"nemo", "model.num_query_groups", "num_query_groups"},
    {"nemo", "model.micro_batch_size", "micro_batch_size"},
    {"nemo", "model.global_batch_size", "global_batch_size"},
    {"nemo", "model.activations_checkpoint_granularity", "recompute_granularity"},
    {"nemo", "model.activations_checkpoint_method", "recompute_method"},
    {"nemo", "model.activations_checkpoint_num_layers", "recompute_num_layers"},
    {"nemo", "model.recompute_modules", "recompute_modules"},
    {"nemo", "model.attention_backend", "attention_backend"},
    {"nemo", "model.hidden_dropout", "hidden_dropout"},
    {"nemo", "model.attention_dropout", "attention_dropout"},
    {"nemo", "model.optim.name", "optimizer_name"},
    {"nemo", "trainer.precision", "precision"},
    {"colossalai", "tp_size", "tensor_model_parallel_size"},
    {"colossalai", "pp_size", "pipeline_model_parallel_size"},
    {"colossalai", "num_layers_per_stage", "hetero_pipeline_layer_split"},
    {"colossalai", "microbatch_size", "micro_batch_size"},
    {"colossalai", "num_microbatches", "num_microbatches"},
    {"colossalai", "precision", "precision"},
    {"colossalai", "zero_stage", "zero_stage"},
    {"colossalai", "num_ckpt_layers_per_stage", "recompute_per_stage"},
    {"colossalai", "gradient_checkpointing", "gradient_checkpointing"},
    {"colossalai", "enable_flash_attention", "enable_flash_attention"},
};

#define N_NAMES ((int)(sizeof names / sizeof names[0]))

/* k's key as Megatron-LM's name for `framework` (FlagScale's launcher flattens its sections:
 * the last part); NULL for a key of another framework's table that this one lacks. */
static const char *megatron_name(const char *framework, const char *key)
{
    if (strcmp(framework, "megatron") == 0)
        return key;
    if (strcmp(framework, "flagscale") == 0) {
        const char *dot = strrchr(key, '.');
        return dot ? dot + 1 : key;
    }
    for (int i = 0; i < N_NAMES; i++)
        if (strcmp(names[i].framework, framework) == 0 && strcmp(names[i].key, key) == 0)
            return names[i].as;
    if (strcmp(framework, "colossalai") == 0 && strstr(key, "gradient_checkpoint_config"))
        return "gradient_checkpoint_config";
    return NULL;
}

/* ---- one reading of Megatron-LM's names ---- */

static int number(const char *key, const char *v, long lo, long hi, int *out, struct err *e)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < lo || n > hi)
        return err_set(e, ERR_INPUT, "check: %s: \"%s\", expected a whole number in %ld..%ld",
                       key, v, lo, hi);
    *out = (int)n;
    return ERR_OK;
}

static int truth(const char *v)
{
    return strcmp(v, "true") == 0 || strcmp(v, "True") == 0 || strcmp(v, "1") == 0;
}

/* "[a, b, c]" (or "a b c") into out: the count, -1 when not numbers. */
static int int_list(const char *v, int *out, int max)
{
    int n = 0;
    for (const char *s = v; *s;) {
        if (isdigit((unsigned char)*s)) {
            char *end;
            if (n == max)
                return -1;
            out[n++] = (int)strtol(s, &end, 10);
            s = end;
        } else if (strchr("[], ", *s)) {
            s++;
        } else if (*s == ')') { /* the end of a call around the list */
            break;
        } else {
            return -1;
        }
    }
    return n;
}

/* A Megatron-LM layout string: E, t (t*n), L per stage, | between; the blocks per stage. */
static int layout(const char *v, struct check_config *c, struct err *e)
{
    c->n_blocks = 0;
    int count = 0;
    for (const char *s = v;; s++) {
        if (*s == '|' || *s == '\0') {
            if (c->n_blocks == CHECK_STAGES_MAX)
                return err_set(e, ERR_INPUT, "check: pipeline_model_parallel_layout: too many "
                               "stages");
            c->blocks[c->n_blocks++] = count;
            count = 0;
            if (*s == '\0')
                return ERR_OK;
        } else if (*s == 't' && s[1] == '*') {
            char *end;
            count += (int)strtol(s + 2, &end, 10);
            s = end - 1;
        } else if (*s == 't') {
            count++;
        } else if (*s != 'E' && *s != 'L' && *s != ' ') {
            return err_set(e, ERR_INPUT, "check: pipeline_model_parallel_layout: \"%s\": only E, "
                           "t, t*n, L and | are read (no repeats in parentheses, no other "
                           "layer kinds)", v);
        }
    }
}

static int modules(const char *v, unsigned *out, struct err *e)
{
    *out = 0;
    char word[64];
    for (const char *s = v; *s;) {
        size_t n = strcspn(s, " ,[]'\"");
        snprintf(word, sizeof word, "%.*s", (int)n, s);
        if (n == 0) {
            s++;
            continue;
        }
        if (strcmp(word, "core_attn") == 0)
            *out |= FW_MODULE_CORE_ATTN;
        else if (strcmp(word, "mlp") == 0)
            *out |= FW_MODULE_MLP;
        else
            return err_set(e, ERR_INPUT, "check: recompute_modules: \"%s\" (a dense model's "
                           "modules read here: core_attn, mlp)", word);
        s += n;
    }
    return ERR_OK;
}

/* FlagScale's [[stages, n0, v0, n1, v1, ...], ...]: one count a stage when every micro-batch
 * of it recomputes alike. */
static int per_stage_rows(const char *v, struct check_config *c, struct err *e)
{
    c->n_per_stage = 0;
    for (const char *row = strchr(v + 1, '['); row != NULL; row = strchr(row + 1, '[')) {
        int items[64], n = int_list(row, items, 64);
        const char *end = strchr(row, ']');
        if (n < 3 || n % 2 == 0 || end == NULL)
            return err_set(e, ERR_INPUT, "check: recompute_num_layers_per_stage_micro_batch: "
                           "expected rows [stages, micro-batches, blocks, ...]");
        for (int k = 4; k < n; k += 2)
            if (items[k] != items[2])
                return err_set(e, ERR_INPUT, "check: recompute_num_layers_per_stage_micro_batch:"
                               " a stage recomputes %d blocks in some micro-batches and %d in "
                               "others; Ballast's cost model takes one action a layer in every "
                               "micro-batch", items[2], items[k]);
        for (int s = 0; s < items[0] && c->n_per_stage < CHECK_STAGES_MAX; s++)
            c->recompute[c->n_per_stage++] = items[2];
        row = end;
    }
    return ERR_OK;
}

static int precision(const char *v, struct check_config *c, struct err *e)
{
    c->dtype_given = 1;
    if (strstr(v, "bf16"))
        c->dtype = MODEL_DTYPE_BF16;
    else if (strstr(v, "16") || strstr(v, "fp16"))
        c->dtype = MODEL_DTYPE_FP16;
    else if (strstr(v, "32"))
        c->dtype = MODEL_DTYPE_FP32;
    else
        return err_set(e, ERR_INPUT, "check: precision: \"%s\", expected bf16, fp16 (16-mixed) "
                       "or fp32 (32)", v);
    return ERR_OK;
}

static int attention(const char *v, struct check_config *c, struct err *e)
{
    c->attention_given = strcmp(v, "auto") != 0;
    if (strcmp(v, "flash") == 0 || strcmp(v, "fused") == 0 || strcmp(v, "auto") == 0)
        c->attention = MODEL_ATTENTION_FLASH;
    else if (strcmp(v, "unfused") == 0 || strcmp(v, "local") == 0)
        c->attention = MODEL_ATTENTION_MATERIALIZED;
    else
        return err_set(e, ERR_INPUT, "check: attention_backend: \"%s\", expected flash, fused, "
                       "unfused, local or auto", v);
    return ERR_OK;
}

/* A group of settings' reader: ERR_OK or an error's status for a key of its group, NOT_MINE
 * for any other key (or value it leaves to the list of ignored settings). */
#define NOT_MINE (-1)

/* A key read nowhere, added to the list of ignored settings (as far as it has room). */
static void note_ignored(struct check_config *c, const char *key)
{
    size_t n = strlen(c->ignored);
    if (n + strlen(key) + 3 < sizeof c->ignored)
        snprintf(c->ignored + n, sizeof c->ignored - n, "%s%s", n ? ", " : "", key);
}

/* A list of per-stage counts (from `list` in v) into out, *n of them. */
static int stage_counts(const char *key, const char *v, const char *list, int *out, int *n,
                        struct err *e)
{
    *n = list != NULL ? int_list(list, out, CHECK_STAGES_MAX) : -1; /* NULL: no "[" */
    return *n < 0 ? err_set(e, ERR_INPUT,
                            "check: %s: \"%s\": expected a list of whole numbers, one a stage "
                            "([a, b, ...])",
                            key, v)
                  : ERR_OK;
}

/* The whole numbers: parallel sizes, layers per stage, batches, the model's shape. */
static int count_setting(const char *key, const char *v, struct check_config *c, struct err *e)
{
    const struct {
        const char *key;
        int *out;
    } ints[] = {{"pipeline_model_parallel_size", &c->pp}, {"tensor_model_parallel_size", &c->tp},
                {"decoder_first_pipeline_num_layers", &c->first},
                {"decoder_last_pipeline_num_layers", &c->last},
                {"recompute_num_layers", &c->recompute_num_layers},
                {"micro_batch_size", &c->micro_batch}, {"global_batch_size", &c->global_batch},
                {"num_microbatches", &c->micro_batches}, {"num_layers", &c->num_layers},
                {"hidden_size", &c->hidden_size}, {"num_attention_heads", &c->num_heads},
                {"ffn_hidden_size", &c->ffn_hidden}, {"seq_length", &c->seq_len},
                {"num_query_groups", &c->kv_groups}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        if (strcmp(key, ints[i].key) == 0)
            return strcmp(v, "null") == 0 || strcmp(v, "None") == 0
                       ? ERR_OK
                       : number(key, v, 0, 1 << 30, ints[i].out, e);
    return NOT_MINE;
}

/* The layers of each stage, as a layout string or a list. */
static int split_setting(const char *key, const char *v, struct check_config *c, struct err *e)
{
    if (strcmp(key, "pipeline_model_parallel_layout") == 0)
        return layout(v, c, e);
    if (strcmp(key, "hetero_pipeline_layer_split") == 0)
        return stage_counts(key, v, v, c->blocks, &c->n_blocks, e);
    return NOT_MINE;
}

/* What is recomputed: granularity, method, modules, and blocks in all or per stage. */
static int recompute_setting(const char *key, const char *v, struct check_config *c,
                             struct err *e)
{
    if (strcmp(key, "recompute_granularity") == 0)
        return snprintf(c->granularity, sizeof c->granularity, "%s",
                        strcmp(v, "null") == 0 ? "" : v), ERR_OK;
    if (strcmp(key, "recompute_method") == 0 && strcmp(v, "block") != 0 && strcmp(v, "null") != 0)
        return err_set(e, ERR_INPUT, "check: recompute_method: \"%s\": only block is read "
                       "(uniform recomputes groups of layers, which Ballast does not cost)", v);
    if (strcmp(key, "recompute_method") == 0)
        return ERR_OK;
    if (strcmp(key, "recompute_modules") == 0)
        return modules(v, &c->modules, e);
    if (strcmp(key, "recompute_activations") == 0 && truth(v))
        return snprintf(c->granularity, sizeof c->granularity, "selective"),
               c->modules = FW_MODULE_CORE_ATTN, ERR_OK;
    if (strcmp(key, "recompute_num_layers_per_stage_micro_batch") == 0)
        return per_stage_rows(v, c, e);
    if (strcmp(key, "recompute_per_stage") == 0)
        return stage_counts(key, v, v, c->recompute, &c->n_per_stage, e);
    if (strcmp(key, "gradient_checkpoint_config") == 0 && strstr(v, "num_ckpt_layers_per_stage"))
        return stage_counts(key, v, strchr(strstr(v, "num_ckpt_layers_per_stage"), '['),
                            c->recompute, &c->n_per_stage, e);
    if (strcmp(key, "gradient_checkpointing") == 0)
        return c->all_blocks = truth(v), ERR_OK;
    return NOT_MINE;
}

/* The data type and the attention kernel. */
static int numerics_setting(const char *key, const char *v, struct check_config *c,
                            struct err *e)
{
    if (strcmp(key, "bf16") == 0 && truth(v))
        return c->dtype_given = 1, c->dtype = MODEL_DTYPE_BF16, ERR_OK;
    if (strcmp(key, "fp16") == 0 && truth(v))
        return c->dtype_given = 1, c->dtype = MODEL_DTYPE_FP16, ERR_OK;
    if (strcmp(key, "precision") == 0)
        return precision(v, c, e);
    if (strcmp(key, "attention_backend") == 0)
        return attention(v, c, e);
    if (strcmp(key, "enable_flash_attention") == 0 && truth(v))
        return c->attention_given = 1, c->attention = MODEL_ATTENTION_FLASH, ERR_OK;
    return NOT_MINE;
}

/* Where the optimizer runs (the host) and whether it is sharded. */
static int optimizer_setting(const char *key, const char *v, struct check_config *c,
                             struct err *e)
{
    if (strcmp(key, "optimizer_cpu_offload") == 0)
        return c->host_optimizer = truth(v), ERR_OK;
    if (strcmp(key, "optimizer_offload_fraction") == 0 && atof(v) != 1.0)
        return err_set(e, ERR_INPUT, "check: optimizer_offload_fraction: %s: only 1.0 (the whole "
                       "optimizer on the host) is read", v);
    if (strcmp(key, "use_distributed_optimizer") == 0 ||
        (strcmp(key, "optimizer_name") == 0 && strstr(v, "distributed")))
        return c->shard = truth(v) || strstr(v, "distributed") != NULL, ERR_OK;
    if (strcmp(key, "zero_stage") == 0)
        return c->shard = atoi(v) >= 1, ERR_OK;
    return NOT_MINE;
}

/* The largest dropout (hidden or attention). */
static int dropout_setting(const char *key, const char *v, struct check_config *c,
                           struct err *e)
{
    (void)e;
    if (strcmp(key, "hidden_dropout") != 0 && strcmp(key, "attention_dropout") != 0)
        return NOT_MINE;
    double d = atof(v);
    c->dropout = d > c->dropout ? d : c->dropout;
    return ERR_OK;
}

/* One setting (Megatron-LM's name `key`); one that no group reads is listed as ignored. */
static int read_one(const char *key, const char *v, struct check_config *c, struct err *e)
{
    static int (*const groups[])(const char *, const char *, struct check_config *,
                                 struct err *) = {
        count_setting,    split_setting,     recompute_setting,
        numerics_setting, optimizer_setting, dropout_setting};
    for (size_t i = 0; i < sizeof groups / sizeof *groups; i++) {
        int rc = groups[i](key, v, c, e);
        if (rc != NOT_MINE)
            return rc;
    }
    note_ignored(c, key);
    return ERR_OK;
}

/* A virtual pipeline (interleaved 1F1B) set by key: refused, check scores one chunk a rank. */
static int virtual_pipeline(const char *key, const char *v, struct err *e)
{
    static const char *const keys[] = {"num_layers_per_virtual_pipeline_stage",
                                       "num_virtual_stages_per_pipeline_rank",
                                       "virtual_pipeline_model_parallel_size"};
    size_t n = strlen(key);
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        size_t m = strlen(keys[i]);
        if (n < m || strcmp(key + n - m, keys[i]) != 0 || strcmp(v, "null") == 0 ||
            strcmp(v, "None") == 0 || (i == 2 && strcmp(v, "1") == 0))
            continue;
        return err_set(e, ERR_INPUT, "check: %s: %s sets a virtual pipeline (interleaved "
                       "1F1B); check scores one chunk a rank: plan the cluster with --for "
                       "megatron --schedule interleaved --virtual-stages V to compare "
                       "(docs/schedules.md)", key, v);
    }
    return ERR_OK;
}

int check_read(const char *framework, const char *text, struct check_config *out,
               struct err *e)
{
    static struct kvs k; /* large; the CLI reads one configuration */
    memset(out, 0, sizeof *out);
    out->pp = out->tp = 1;
    out->first = out->last = out->recompute_num_layers = -1;
    out->dropout = strcmp(framework, "megatron") == 0 ? 0.1 : 0; /* its defaults */
    k.n = 0;
    int rc;
    if (strcmp(framework, "megatron") == 0)
        rc = from_args(text, &k, e);
    else if (strcmp(framework, "colossalai") == 0)
        rc = from_assignments(text, &k, e);
    else if (strcmp(framework, "nemo") == 0 && strchr(text, '=') != NULL)
        rc = from_assignments(text, &k, e);
    else if (strcmp(framework, "nemo") == 0 || strcmp(framework, "flagscale") == 0)
        rc = from_yaml(text, &k, e);
    else
        rc = err_set(e, ERR_INPUT, "check --from: \"%s\", expected megatron, nemo, colossalai "
                     "or flagscale", framework);
    for (int i = 0; i < k.n && rc == ERR_OK; i++) {
        const char *key = megatron_name(framework, k.items[i].key);
        const char *v = k.items[i].value;
        rc = virtual_pipeline(k.items[i].key, v, e);
        if (rc)
            break;
        if (key == NULL)
            note_ignored(out, k.items[i].key);
        else
            rc = read_one(key, v, out, e);
    }
    if (rc == ERR_OK && strcmp(framework, "megatron") == 0 && out->pp > 1 &&
        out->n_blocks > out->pp && out->n_blocks % out->pp == 0)
        rc = err_set(e, ERR_INPUT, "check: pipeline_model_parallel_layout: %d stages over "
                     "pipeline_model_parallel_size %d is a virtual pipeline of %d chunks a rank; "
                     "check scores one chunk a rank (1F1B): plan the cluster with --for megatron "
                     "--schedule interleaved --virtual-stages %d to compare (docs/schedules.md)",
                     out->n_blocks, out->pp, out->n_blocks / out->pp, out->n_blocks / out->pp);
    return rc;
}
