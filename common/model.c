#include "model.h"

#include <stdio.h>
#include <string.h>

#include "jsonio.h"
#include "model_kind.h"

/* GPT's fields; a kind's own (model_kind.fields) come after n_head. */
static const char *const model_keys[] = {"format",     "kind",       "n_layer",     "n_embd",
                                         "n_head",     "seq_len",    "vocab_size",  "micro_batch",
                                         "dtype",      "attention",  "name",       "description",
                                         NULL};
#define KIND_FIELDS_AT 5

/* A custom model is its name (and, in plans, its layer count): the layers and their costs
 * are its profiles'. */
static const char *const custom_keys[] = {"format", "kind", "name", "description", "layer_count",
                                          NULL};
/* Free text: strings when given. */
static const char *const text_keys[] = {"name", "description", NULL};

static int custom_from_json(const struct model_kind_info *k, const cJSON *obj, const char *file,
                            const char *path, struct model *m, struct err *e)
{
    int64_t count = 0;
    *m = (struct model){.kind = model_kind_id(k)};
    if (jsonio_check_keys(obj, file, path, custom_keys, e) ||
        jsonio_check_text(obj, file, path, text_keys, e) ||
        jsonio_str_copy(obj, file, path, "name", m->name, sizeof m->name, e) ||
        jsonio_int_opt(obj, file, path, "layer_count", 1, MODEL_CUSTOM_LAYERS_MAX, &count, e))
        return e->code;
    if (m->name[0] == '\0') {
        char sub[JSONIO_PATH_MAX];
        jsonio_path_key(sub, path, "name");
        return err_set(e, ERR_INPUT, "%s: %s: empty; a custom model needs a name", file, sub);
    }
    m->layer_count = (int)count;
    return ERR_OK;
}

/* The kind a file names, before its fields are checked; NULL when it names none. */
static const struct model_kind_info *kind_named(const cJSON *obj)
{
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(obj, "kind");
    return cJSON_IsString(kind) ? model_kind_find(kind->valuestring) : NULL;
}

/* The kind's own fields, then what its traits ask of the shape. */
static int kind_fields(const struct model_kind_info *k, const cJSON *obj, const char *file,
                       const char *path, struct model *m, struct err *e)
{
    for (int i = 0; i < k->n_fields; i++) {
        const struct model_field *f = &k->fields[i];
        char *at = (char *)m + f->offset;
        int64_t v;
        if (!f->integer) {
            ERR_TRY(jsonio_num(obj, file, path, f->name, f->lo, f->hi, (double *)(void *)at, e));
            continue;
        }
        ERR_TRY(jsonio_int(obj, file, path, f->name, (int64_t)f->lo, (int64_t)f->hi, &v, e));
        *(int *)(void *)at = (int)v;
    }
    char sub[JSONIO_PATH_MAX];
    if (k->gqa && m->n_head % m->n_kv_head != 0) {
        jsonio_path_key(sub, path, "n_kv_head");
        return err_set(e, ERR_INPUT, "%s: %s: n_head %d is not a multiple of n_kv_head %d", file,
                       sub, m->n_head, m->n_kv_head);
    }
    if (k->rotary && m->n_embd / m->n_head % 2 != 0) {
        jsonio_path_key(sub, path, "n_head");
        return err_set(e, ERR_INPUT,
                       "%s: %s: head size n_embd/n_head = %d is odd; rotary positions rotate "
                       "pairs",
                       file, sub, m->n_embd / m->n_head);
    }
    return ERR_OK;
}

/* GPT's keys with the kind's fields after n_head, NULL-terminated. */
static void kind_keys(const struct model_kind_info *k, const char *keys[])
{
    int n = 0;
    for (int i = 0; i < KIND_FIELDS_AT; i++)
        keys[n++] = model_keys[i];
    for (int i = 0; i < k->n_fields; i++)
        keys[n++] = k->fields[i].name;
    for (int i = KIND_FIELDS_AT; model_keys[i] != NULL; i++)
        keys[n++] = model_keys[i];
    keys[n] = NULL;
}

/* The optional "attention": absent means materialized, today's behaviour. */
static int attention_field(const cJSON *obj, const char *file, const char *path,
                           struct model *m, struct err *e)
{
    const char *name;
    m->attention = MODEL_ATTENTION_MATERIALIZED;
    if (cJSON_GetObjectItemCaseSensitive(obj, "attention") == NULL)
        return ERR_OK;
    ERR_TRY(jsonio_str(obj, file, path, "attention", &name, e));
    if (strcmp(name, "flash") == 0) {
        m->attention = MODEL_ATTENTION_FLASH;
    } else if (strcmp(name, "materialized") != 0) {
        char sub[JSONIO_PATH_MAX];
        jsonio_path_key(sub, path, "attention");
        return err_set(e, ERR_INPUT, "%s: %s: \"%s\", expected \"materialized\" or \"flash\"",
                       file, sub, name);
    }
    return ERR_OK;
}

/* The model's "dtype": fp32, bf16 or fp16, by model_dtype_name's names. */
static int dtype_field(const char *dtype, const char *file, const char *path, struct model *m,
                       struct err *e)
{
    for (int d = MODEL_DTYPE_FP32; d <= MODEL_DTYPE_FP16; d++)
        if (strcmp(dtype, model_dtype_name((enum model_dtype)d)) == 0) {
            m->dtype = (enum model_dtype)d;
            return ERR_OK;
        }
    char sub[JSONIO_PATH_MAX];
    jsonio_path_key(sub, path, "dtype");
    return err_set(e, ERR_INPUT, "%s: %s: \"%s\", expected \"fp32\", \"bf16\" or \"fp16\"",
                   file, sub, dtype);
}

int model_from_json(const cJSON *obj, const char *file, const char *path, struct model *m,
                    struct err *e)
{
    const char *kind, *dtype, *keys[sizeof model_keys / sizeof *model_keys + MODEL_FIELDS_MAX];
    const struct model_kind_info *k;
    int64_t n_layer, n_embd, n_head, seq_len, vocab, micro;
    if (jsonio_expect_object(obj, file, path, e))
        return e->code;
    k = kind_named(obj);
    if (k != NULL && k->custom)
        return custom_from_json(k, obj, file, path, m, e);
    if (jsonio_str(obj, file, path, "kind", &kind, e))
        return e->code;
    if (k == NULL) {
        char sub[JSONIO_PATH_MAX], names[256];
        jsonio_path_key(sub, path, "kind");
        model_kind_names(names, sizeof names);
        return err_set(e, ERR_INPUT, "%s: %s: \"%s\" is not a model kind Ballast knows (%s)",
                       file, sub, kind, names);
    }
    kind_keys(k, keys);
    if (jsonio_check_keys(obj, file, path, keys, e) ||
        jsonio_check_text(obj, file, path, text_keys, e))
        return e->code;
    *m = (struct model){.kind = model_kind_id(k)};
    if (jsonio_int(obj, file, path, "n_layer", 1, 4096, &n_layer, e) ||
        jsonio_int(obj, file, path, "n_embd", 1, 1 << 20, &n_embd, e) ||
        jsonio_int(obj, file, path, "n_head", 1, 1 << 20, &n_head, e) ||
        jsonio_int(obj, file, path, "seq_len", 1, 1 << 24, &seq_len, e) ||
        jsonio_int(obj, file, path, "vocab_size", 2, INT32_MAX, &vocab, e) ||
        jsonio_int(obj, file, path, "micro_batch", 1, 1 << 20, &micro, e) ||
        jsonio_str(obj, file, path, "dtype", &dtype, e))
        return e->code;
    if (n_embd % n_head != 0) {
        char sub[JSONIO_PATH_MAX];
        jsonio_path_key(sub, path, "n_head");
        return err_set(e, ERR_INPUT, "%s: %s: n_embd %lld is not a multiple of n_head %lld",
                       file, sub, (long long)n_embd, (long long)n_head);
    }
    if (dtype_field(dtype, file, path, m, e) || attention_field(obj, file, path, m, e))
        return e->code;
    m->n_layer = (int)n_layer;
    m->n_embd = (int)n_embd;
    m->n_head = (int)n_head;
    m->seq_len = (int)seq_len;
    m->vocab_size = (int)vocab;
    m->micro_batch = (int)micro;
    if (kind_fields(k, obj, file, path, m, e))
        return e->code;
    /* Every byte count must be representable; a model too large for that is bad input. */
    if (model_check_sizes(m, file, path, e))
        return e->code;
    return ERR_OK;
}

int model_load(const char *file, struct model *m, struct err *e)
{
    cJSON *root = jsonio_read_kind(file, JSONIO_MODEL, e);
    if (root == NULL)
        return e->code;
    int rc = jsonio_check_format(root, file, "model", 1, e);
    if (rc == ERR_OK)
        rc = model_from_json(root, file, "", m, e);
    cJSON_Delete(root);
    return rc;
}

cJSON *model_to_json(const struct model *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", model_kind_name(m->kind));
    if (model_is_custom(m)) {
        cJSON_AddStringToObject(o, "name", m->name);
        if (m->layer_count > 0)
            cJSON_AddNumberToObject(o, "layer_count", m->layer_count);
        return o;
    }
    cJSON_AddNumberToObject(o, "n_layer", m->n_layer);
    cJSON_AddNumberToObject(o, "n_embd", m->n_embd);
    cJSON_AddNumberToObject(o, "n_head", m->n_head);
    cJSON_AddNumberToObject(o, "seq_len", m->seq_len);
    cJSON_AddNumberToObject(o, "vocab_size", m->vocab_size);
    cJSON_AddNumberToObject(o, "micro_batch", m->micro_batch);
    cJSON_AddStringToObject(o, "dtype", model_dtype_name(m->dtype));
    /* only when not the default, so that files written before the field stay as they were */
    if (m->attention != MODEL_ATTENTION_MATERIALIZED)
        cJSON_AddStringToObject(o, "attention", model_attention_name(m->attention));
    const struct model_kind_info *k = model_kind_of(m);
    for (int i = 0; i < k->n_fields; i++) {
        const char *at = (const char *)m + k->fields[i].offset;
        cJSON_AddNumberToObject(o, k->fields[i].name, k->fields[i].integer
                                                          ? *(const int *)(const void *)at
                                                          : *(const double *)(const void *)at);
    }
    return o;
}

int model_equal(const struct model *a, const struct model *b)
{
    if (a->kind != b->kind)
        return 0;
    if (model_is_custom(a))
        return strcmp(a->name, b->name) == 0 && a->layer_count == b->layer_count;
    return a->n_layer == b->n_layer && a->n_embd == b->n_embd && a->n_head == b->n_head &&
           a->seq_len == b->seq_len && a->vocab_size == b->vocab_size &&
           a->micro_batch == b->micro_batch && a->dtype == b->dtype &&
           a->attention == b->attention &&
           a->n_kv_head == b->n_kv_head && a->ffn_hidden == b->ffn_hidden &&
           a->rope_theta == b->rope_theta && a->norm_eps == b->norm_eps;
}

int model_layer_count(const struct model *m)
{
    return model_is_custom(m) ? m->layer_count : m->n_layer + 2;
}

enum model_layer_kind model_layer_kind(const struct model *m, int layer)
{
    if (model_is_custom(m))
        return MODEL_LAYER_BLOCK;
    if (layer == 0)
        return MODEL_LAYER_EMBED;
    if (layer == m->n_layer + 1)
        return MODEL_LAYER_HEAD;
    return MODEL_LAYER_BLOCK;
}

void model_layer_name(const struct model *m, int layer, char name[MODEL_LAYER_NAME_MAX])
{
    if (model_is_custom(m)) {
        name[0] = '\0';
        return;
    }
    switch (model_layer_kind(m, layer)) {
    case MODEL_LAYER_EMBED:
        snprintf(name, MODEL_LAYER_NAME_MAX, "embed");
        break;
    case MODEL_LAYER_HEAD:
        snprintf(name, MODEL_LAYER_NAME_MAX, "head");
        break;
    default:
        snprintf(name, MODEL_LAYER_NAME_MAX, "block.%d", layer - 1);
    }
}

const char *model_dtype_name(enum model_dtype dtype)
{
    return dtype == MODEL_DTYPE_BF16 ? "bf16" : dtype == MODEL_DTYPE_FP16 ? "fp16" : "fp32";
}

int model_dtype_16bit(enum model_dtype dtype)
{
    return dtype == MODEL_DTYPE_BF16 || dtype == MODEL_DTYPE_FP16;
}

const char *model_attention_name(enum model_attention attention)
{
    return attention == MODEL_ATTENTION_FLASH ? "flash" : "materialized";
}

int model_check_sizes(const struct model *m, const char *file, const char *path, struct err *e)
{
    /* The largest products are B*NH*T*T (attention), B*T*V (logits) and V*C, 3*C*C
     * (weights); check them and the layer totals in 128-bit arithmetic. */
    __int128 B = m->micro_batch, T = m->seq_len, C = m->n_embd, NH = m->n_head,
             V = m->vocab_size;
    __int128 limit = (__int128)JSONIO_INT_MAX;
    /* flash keeps (B,NH,T) statistics instead of the probabilities */
    __int128 att = (m->attention == MODEL_ATTENTION_FLASH ? B * NH * T : B * NH * T * T) * 4, logits = B * T * V * 4, weights = V * C * 18,
             mlp = 12 * C * C * 18 + 16 * B * T * C * 4;
    __int128 model_state = (__int128)m->n_layer * 12 * C * C * 18 + 2 * V * C * 18;
    if (model_kind_of(m)->swiglu) {
        /* a block's weights are C (C + 2 C n_kv_head/n_head) + C C + 3 C ffn_hidden, its
         * widest activation the MLP's (B,T,2 ffn_hidden) */
        __int128 F = model_ffn_hidden(m),
                 block = C * C * 2 + C * C * 2 * model_kv_heads(m) / NH + 3 * C * F;
        mlp = block * 18 + (8 * B * T * C + 5 * B * T * F) * 4;
        model_state = (__int128)m->n_layer * block * 18 + 2 * V * C * 18;
    }
    if (att > limit || logits > limit || weights > limit || mlp > limit || model_state > limit)
        return err_set(e, ERR_INPUT,
                       "%s: %s: the model is too large: some byte count exceeds 2^53 "
                       "(micro_batch %d, seq_len %d, n_embd %d, n_head %d, vocab_size %d, "
                       "n_layer %d)",
                       file, path[0] ? path : "(top level)", m->micro_batch, m->seq_len, m->n_embd, m->n_head, m->vocab_size,
                       m->n_layer);
    return ERR_OK;
}
