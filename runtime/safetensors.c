/* safetensors in and out (safetensors.h). Tensors are read and written as the host's bytes:
 * the format is little-endian, as are the hosts Ballast runs on (x86-64, AArch64). */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fileio.h"
#include "half.h"
#include "model_kind.h"
#include "progress.h"

/* Ballast's parameter name, Hugging Face's (after "h.{i}." in a block), whether it is
 * transposed (Conv1D), and Ballast's column count in units of n_embd (0: a vector). */
struct st_name {
    const char *ballast, *hf;
    int transposed, cols_c;
};

static const struct st_name st_names[] = {
    {"wte", "wte.weight", 0, 1},
    {"wpe", "wpe.weight", 0, 1},
    {"ln1_w", "ln_1.weight", 0, 0},
    {"ln1_b", "ln_1.bias", 0, 0},
    {"qkv_w", "attn.c_attn.weight", 1, 1},
    {"qkv_b", "attn.c_attn.bias", 0, 0},
    {"proj_w", "attn.c_proj.weight", 1, 1},
    {"proj_b", "attn.c_proj.bias", 0, 0},
    {"ln2_w", "ln_2.weight", 0, 0},
    {"ln2_b", "ln_2.bias", 0, 0},
    {"fc_w", "mlp.c_fc.weight", 1, 1},
    {"fc_b", "mlp.c_fc.bias", 0, 0},
    {"fcproj_w", "mlp.c_proj.weight", 1, 4},
    {"fcproj_b", "mlp.c_proj.bias", 0, 0},
    {"lnf_w", "ln_f.weight", 0, 0},
    {"lnf_b", "ln_f.bias", 0, 0},
    {"lm_w", "lm_head.weight", 0, 1},
};

static const char *const st_dtype_names[] = {"F32", "BF16", "F16"};
static const int st_dtype_bytes[] = {4, 2, 2};

/* The file's dtype for a model's weights: what it computes with. */
static int st_dtype_of(enum model_dtype dt)
{
    return dt == MODEL_DTYPE_BF16 ? ST_BF16 : dt == MODEL_DTYPE_FP16 ? ST_F16 : ST_F32;
}

/* Element i of a tensor of st_dtype `dtype` at `src`, as fp32 (exact). */
static float st_element(int dtype, const unsigned char *src, int64_t i)
{
    float f;
    uint16_t h;
    if (dtype == ST_F32) {
        memcpy(&f, src + 4 * i, 4);
        return f;
    }
    memcpy(&h, src + 2 * i, 2);
    return dtype == ST_F16 ? fp16_to_float(h) : bf16_to_float(h);
}

#define ST_PIECES_MAX 3

/* Llama's names (LlamaForCausalLM's, after "model.layers.{i}." in a block). Ballast fuses q, k
 * and v into qkv_w and gate over up into fc_w, row blocks of one (out, in) matrix: each block
 * is its own file tensor, none transposed. */
struct st_llama_name {
    const char *ballast, *hf[ST_PIECES_MAX];
};

static const struct st_llama_name st_llama_names[] = {
    {"wte", {"model.embed_tokens.weight"}},
    {"ln1_w", {"input_layernorm.weight"}},
    {"qkv_w", {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}},
    {"proj_w", {"self_attn.o_proj.weight"}},
    {"ln2_w", {"post_attention_layernorm.weight"}},
    {"fc_w", {"mlp.gate_proj.weight", "mlp.up_proj.weight"}},
    {"fcproj_w", {"mlp.down_proj.weight"}},
    {"lnf_w", {"model.norm.weight"}},
    {"lm_w", {"lm_head.weight"}},
};

/* One parameter as the file holds it: n tensors (row blocks of Ballast's matrix, in order),
 * Conv1D-transposed (GPT's, n 1), whether the file may hold more rows (wpe: more positions),
 * and the tensor to read when lm_head.weight is missing (Hugging Face leaves it out of a
 * tied model). */
struct st_param {
    struct st_tensor t[ST_PIECES_MAX];
    int n, transposed, more_rows;
    const char *tied;
};

static void shape_2d(struct st_tensor *t, int64_t rows, int64_t cols)
{
    t->ndim = 2;
    t->shape[0] = rows;
    t->shape[1] = cols;
}

static int describe_gpt(const struct model *m, const struct layer_layout *L, int k,
                        struct st_param *p, struct err *e)
{
    const struct st_name *n = NULL;
    for (size_t i = 0; i < sizeof st_names / sizeof st_names[0]; i++)
        if (strcmp(st_names[i].ballast, L->params[k].name) == 0)
            n = &st_names[i];
    if (n == NULL)
        return err_set(e, ERR_INPUT, "parameter %s of layer %d has no safetensors name",
                       L->params[k].name, L->layer);
    struct st_tensor *t = &p->t[0];
    p->n = 1;
    p->transposed = n->transposed;
    p->more_rows = strcmp(n->ballast, "wpe") == 0;
    p->tied = "wte.weight";
    if (L->kind == MODEL_LAYER_BLOCK)
        snprintf(t->name, sizeof t->name, "h.%d.%s", L->layer - 1, n->hf);
    else
        snprintf(t->name, sizeof t->name, "%s", n->hf);
    int64_t elems = L->params[k].elems;
    t->ndim = 1;
    t->shape[0] = elems;
    if (n->cols_c != 0) {
        int64_t cols = (int64_t)n->cols_c * m->n_embd, rows = elems / cols;
        shape_2d(t, n->transposed ? cols : rows, n->transposed ? rows : cols);
    }
    return ERR_OK;
}

static int describe_llama(const struct model *m, const struct layer_layout *L, int k,
                          struct st_param *p, struct err *e)
{
    const struct st_llama_name *n = NULL;
    for (size_t i = 0; i < sizeof st_llama_names / sizeof st_llama_names[0]; i++)
        if (strcmp(st_llama_names[i].ballast, L->params[k].name) == 0)
            n = &st_llama_names[i];
    if (n == NULL)
        return err_set(e, ERR_INPUT, "parameter %s of layer %d has no safetensors name",
                       L->params[k].name, L->layer);
    int64_t hs = m->n_embd / m->n_head, F = m->ffn_hidden, elems = L->params[k].elems;
    int64_t qkv_rows[] = {m->n_head * hs, m->n_kv_head * hs, m->n_kv_head * hs};
    int64_t fc_rows[] = {F, F};
    const int64_t *rows = strcmp(n->ballast, "qkv_w") == 0  ? qkv_rows
                          : strcmp(n->ballast, "fc_w") == 0 ? fc_rows
                                                            : NULL;
    int64_t cols = strcmp(n->ballast, "fcproj_w") == 0 ? F : m->n_embd;
    int vector = strstr(n->ballast, "ln") == n->ballast;
    p->n = 0;
    p->tied = "model.embed_tokens.weight";
    for (int i = 0; i < ST_PIECES_MAX && n->hf[i] != NULL; i++) {
        struct st_tensor *t = &p->t[p->n++];
        if (L->kind == MODEL_LAYER_BLOCK)
            snprintf(t->name, sizeof t->name, "model.layers.%d.%s", L->layer - 1, n->hf[i]);
        else
            snprintf(t->name, sizeof t->name, "%s", n->hf[i]);
        t->ndim = 1;
        t->shape[0] = elems;
        if (!vector)
            shape_2d(t, rows != NULL ? rows[i] : elems / cols, cols);
    }
    return ERR_OK;
}

/* Parameter k of layer L as the file names and shapes it (shapes in the file's layout). */
static int describe_param(const struct model *m, const struct layer_layout *L, int k,
                          struct st_param *p, struct err *e)
{
    /* Hugging Face's checkpoint layouts, by model_type (model_kind.hf_type) */
    static const struct {
        const char *hf_type;
        int (*describe)(const struct model *, const struct layer_layout *, int,
                        struct st_param *, struct err *);
    } layouts[] = {{"gpt2", describe_gpt}, {"llama", describe_llama}};
    const struct model_kind_info *kind = model_kind_of(m);
    memset(p, 0, sizeof *p);
    for (size_t i = 0; kind->hf_type != NULL && i < sizeof layouts / sizeof layouts[0]; i++)
        if (strcmp(layouts[i].hf_type, kind->hf_type) == 0)
            return layouts[i].describe(m, L, k, p, e);
    return err_set(e, ERR_INPUT, "a %s model has no Hugging Face checkpoint layout Ballast knows",
                   kind->name);
}

static int64_t elems_of(const struct st_tensor *t)
{
    return t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0];
}

/* (rows, cols) to (cols, rows), elements of `es` bytes. */
static void transpose(void *dst, const void *src, int64_t rows, int64_t cols, int es)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            memcpy((char *)dst + (c * rows + r) * es, (const char *)src + (r * cols + c) * es,
                   (size_t)es);
}

int st_stage_collect(struct stage_runner *r, struct st_tensor **t, int *n, char **blob,
                     struct err *e)
{
    const struct stage_layout *lay = &r->lay;
    int half = model_dtype_16bit(lay->dtype), es = sizes_weight_elem_bytes(lay->dtype), count = 0;
    for (int li = 0; li < lay->n_layers; li++)
        count += lay->layers[li].n_params * ST_PIECES_MAX;
    *t = calloc((size_t)count, sizeof **t);
    *blob = malloc((size_t)(lay->param_count * es) + 1);
    char *tmp = NULL;
    *n = 0;
    if (*t == NULL || *blob == NULL)
        return err_set(e, ERR_FAIL, "out of memory collecting the weights");
    int64_t at = 0;
    int rc = ERR_OK;
    for (int li = 0; li < lay->n_layers && rc == ERR_OK; li++) {
        const struct layer_layout *L = &lay->layers[li];
        for (int k = 0; k < L->n_params && rc == ERR_OK; k++) {
            struct st_param p;
            if ((rc = describe_param(r->c.model, L, k, &p, e)))
                break;
            char *dst = *blob + at;
            for (int i = 0; i < p.n; i++) { /* the pieces' bytes follow each other */
                struct st_tensor *d = &(*t)[(*n)++];
                *d = p.t[i];
                d->dtype = st_dtype_of(lay->dtype);
                d->offset = at;
                d->bytes = elems_of(d) * es;
                at += d->bytes;
            }
            int64_t from = half ? L->weight_off[k] : lay->master_at + L->param_off[k];
            int64_t bytes = L->params[k].elems * es;
            if (!p.transposed) {
                rc = stage_state_get(r, from, dst, bytes, e);
                continue;
            }
            free(tmp);
            if ((tmp = malloc((size_t)bytes)) == NULL) {
                rc = err_set(e, ERR_FAIL, "out of memory collecting %s", p.t[0].name);
                break;
            }
            rc = stage_state_get(r, from, tmp, bytes, e);
            if (rc == ERR_OK) /* Ballast's (out, in) as the file's [in, out] */
                transpose(dst, tmp, p.t[0].shape[1], p.t[0].shape[0], es);
        }
    }
    free(tmp);
    return rc;
}

static cJSON *header_of(const struct st_tensor *t, int n)
{
    cJSON *h = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    cJSON_AddStringToObject(meta, "writer", "ballast");
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_AddObjectToObject(h, t[i].name);
        cJSON_AddStringToObject(o, "dtype", st_dtype_names[t[i].dtype]);
        cJSON *shape = cJSON_AddArrayToObject(o, "shape"),
              *off = cJSON_AddArrayToObject(o, "data_offsets");
        for (int d = 0; d < t[i].ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(at + t[i].bytes)));
        at += t[i].bytes;
    }
    return h;
}

/* ERR_FAIL naming the first tensor holding a NaN or an infinity, and the element. */
static int check_finite(const char *file, const struct st_tensor *t, int n, char *const *blobs,
                        struct err *e)
{
    for (int i = 0; i < n; i++) {
        const unsigned char *src = (const unsigned char *)blobs[i] + t[i].offset;
        for (int64_t j = 0; j < t[i].bytes / st_dtype_bytes[t[i].dtype]; j++) {
            float v = st_element(t[i].dtype, src, j);
            if (!isfinite(v))
                return err_set(e, ERR_FAIL, "%s: not written: %s holds %g at element %lld "
                               "(weights that are not finite)",
                               file, t[i].name, (double)v, (long long)j);
        }
    }
    return ERR_OK;
}

int st_write(const char *file, const struct st_tensor *t, int n, char *const *blobs,
             struct err *e)
{
    ERR_TRY(check_finite(file, t, n, blobs, e));
    cJSON *h = header_of(t, n);
    char *text = h != NULL ? cJSON_PrintUnformatted(h) : NULL;
    cJSON_Delete(h);
    if (text == NULL)
        return err_set(e, ERR_FAIL, "%s: out of memory writing the header", file);
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    char *head = malloc(8 + padded);
    if (head == NULL) {
        free(text);
        return err_set(e, ERR_FAIL, "%s: out of memory writing the header", file);
    }
    for (int b = 0; b < 8; b++)
        head[b] = (char)((uint64_t)padded >> (8 * b) & 255);
    memcpy(head + 8, text, len);
    memset(head + 8 + len, ' ', padded - len); /* the format's padding */
    free(text);
    struct fileio_out out;
    if (fileio_out_open(&out, file, e)) {
        free(head);
        return e->code;
    }
    int ok = fileio_write_all(out.fd, head, 8 + (int64_t)padded) == 0;
    for (int i = 0; i < n && ok; i++, progress_tick())
        ok = fileio_write_all(out.fd, blobs[i] + t[i].offset, t[i].bytes) == 0;
    free(head);
    return fileio_out_commit(&out, file, ok, e);
}

void st_stage_path(const char *pattern, int stage, char *out, size_t size)
{
    const char *at = strstr(pattern, ST_STAGE_MARK);
    if (at == NULL)
        snprintf(out, size, "%s", pattern);
    else
        snprintf(out, size, "%.*s%d%s", (int)(at - pattern), pattern, stage,
                 at + strlen(ST_STAGE_MARK));
}

/* ---- reading ---- */

struct st_file {
    const char *name;
    unsigned char *map;
    int64_t size, data_at;
    cJSON *header;
};

static int64_t json_int(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 9e15 &&
                   v->valuedouble == (double)(int64_t)v->valuedouble
               ? (int64_t)v->valuedouble
               : -1;
}

/* A tensor entry's fields, its bytes within the file (truncated files are caught here). */
static int check_entry(const struct st_file *f, const cJSON *o, struct err *e)
{
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype"),
                *shape = cJSON_GetObjectItemCaseSensitive(o, "shape"),
                *off = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
    if (!cJSON_IsString(dt))
        return err_set(e, ERR_INPUT, "%s: %s.dtype: missing or not a string", f->name,
                       o->string);
    if (!cJSON_IsArray(shape))
        return err_set(e, ERR_INPUT, "%s: %s.shape: missing or not an array", f->name,
                       o->string);
    const cJSON *s;
    cJSON_ArrayForEach(s, shape)
    {
        if (json_int(s) < 0)
            return err_set(e, ERR_INPUT, "%s: %s.shape: not a list of sizes", f->name,
                           o->string);
    }
    int64_t begin = json_int(cJSON_GetArrayItem(off, 0)),
            end = json_int(cJSON_GetArrayItem(off, 1));
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || begin < 0 || end < begin)
        return err_set(e, ERR_INPUT, "%s: %s.data_offsets: expected [begin, end], begin <= end",
                       f->name, o->string);
    if (f->data_at + end > f->size)
        return err_set(e, ERR_INPUT,
                       "%s: %s.data_offsets: [%lld, %lld], past the %lld bytes of tensor data "
                       "the file holds (truncated)",
                       f->name, o->string, (long long)begin, (long long)end,
                       (long long)(f->size - f->data_at));
    return ERR_OK;
}

static int st_open(struct st_file *f, const char *file, struct err *e)
{
    memset(f, 0, sizeof *f);
    f->name = file;
    int fd;
    if (fileio_open_input(file, 0, &fd, &f->size, e))
        return e->code;
    if (f->size < 8) {
        close(fd);
        return err_set(e, ERR_INPUT, "%s: %lld bytes, shorter than the 8-byte header length",
                       file, (long long)f->size);
    }
    void *p = mmap(NULL, (size_t)f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return err_set(e, ERR_INPUT, "%s: cannot map: %s", file, strerror(errno));
    f->map = p;
    uint64_t n = 0;
    for (int b = 7; b >= 0; b--)
        n = n << 8 | f->map[b];
    if (n > (uint64_t)f->size - 8)
        return err_set(e, ERR_INPUT,
                       "%s: header length %llu runs past the file's %lld bytes (not "
                       "safetensors, or truncated)",
                       file, (unsigned long long)n, (long long)f->size);
    if (n > ST_HEADER_MAX) /* before anything is allocated for it */
        return err_set(e, ERR_INPUT,
                       "%s: header length %llu, over the %d bytes a safetensors header may take "
                       "(Hugging Face's reader's cap)",
                       file, (unsigned long long)n, ST_HEADER_MAX);
    f->data_at = 8 + (int64_t)n;
    f->header = cJSON_ParseWithLength((const char *)f->map + 8, (size_t)n);
    if (!cJSON_IsObject(f->header))
        return err_set(e, ERR_INPUT, "%s: header: the %llu bytes after the length are not a "
                                     "JSON object",
                       file, (unsigned long long)n);
    const cJSON *o;
    cJSON_ArrayForEach(o, f->header)
    {
        if (strcmp(o->string, "__metadata__") == 0)
            continue;
        if (!cJSON_IsObject(o))
            return err_set(e, ERR_INPUT, "%s: %s: not an object", file, o->string);
        ERR_TRY(check_entry(f, o, e));
    }
    return ERR_OK;
}

static void st_close(struct st_file *f)
{
    cJSON_Delete(f->header);
    if (f->map != NULL)
        munmap(f->map, (size_t)f->size);
}

/* The file's tensor for `want`, piece of `p` (dtype and shape checked; wpe may hold more
 * positions than the model uses: the first ones are taken) as fp32 in Ballast's layout. */
static int read_tensor(const struct st_file *f, const struct st_tensor *want,
                       const struct st_param *p, float *out, float *tmp, struct err *e)
{
    const char *name = want->name;
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(f->header, name);
    if (o == NULL && strcmp(name, "lm_head.weight") == 0) /* tied, as Hugging Face saves it */
        o = cJSON_GetObjectItemCaseSensitive(f->header, name = p->tied);
    if (o == NULL)
        return err_set(e, ERR_INPUT, "%s: %s: missing", f->name, want->name);
    const char *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype")->valuestring;
    int dtype = -1;
    for (int d = 0; d < (int)(sizeof st_dtype_names / sizeof *st_dtype_names); d++)
        dtype = strcmp(dt, st_dtype_names[d]) == 0 ? d : dtype;
    if (dtype < 0)
        return err_set(e, ERR_INPUT, "%s: %s.dtype: \"%s\", expected F32, BF16 or F16",
                       f->name, name, dt);
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape");
    int ndim = cJSON_GetArraySize(shape), more_rows = p->more_rows;
    int64_t got[2] = {json_int(cJSON_GetArrayItem(shape, 0)),
                      json_int(cJSON_GetArrayItem(shape, 1))};
    int fits = ndim == want->ndim && (more_rows ? got[0] >= want->shape[0]
                                                : got[0] == want->shape[0]);
    if (ndim == 2)
        fits = fits && got[1] == want->shape[1];
    if (!fits) {
        char g[64], w[64];
        if (ndim <= 2)
            snprintf(g, sizeof g, ndim == 2 ? "[%lld, %lld]" : "[%lld]", (long long)got[0],
                     (long long)got[1]);
        else
            snprintf(g, sizeof g, "%d dimensions", ndim);
        snprintf(w, sizeof w, want->ndim == 2 ? "[%lld, %lld]" : "[%lld]",
                 (long long)want->shape[0], (long long)want->shape[1]);
        return err_set(e, ERR_INPUT, "%s: %s.shape: %s, expected %s%s", f->name, name, g, w,
                       more_rows ? " (or more positions)" : "");
    }
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
    int64_t begin = json_int(cJSON_GetArrayItem(off, 0)),
            end = json_int(cJSON_GetArrayItem(off, 1));
    int64_t elems = elems_of(want), stored, bytes;
    /* a crafted shape's product is checked, not overflowed */
    if (__builtin_mul_overflow(got[0], ndim == 2 ? got[1] : 1, &stored) ||
        __builtin_mul_overflow(stored, (int64_t)st_dtype_bytes[dtype], &bytes))
        return err_set(e, ERR_INPUT, "%s: %s.shape: [%lld, %lld] holds more bytes than a file "
                       "can", f->name, name, (long long)got[0], (long long)got[1]);
    if (end - begin != bytes)
        return err_set(e, ERR_INPUT,
                       "%s: %s.data_offsets: %lld bytes, but a %s tensor of %lld elements "
                       "takes %lld",
                       f->name, name, (long long)(end - begin), dt, (long long)stored,
                       (long long)bytes);
    const unsigned char *src = f->map + f->data_at + begin;
    float *dst = p->transposed ? tmp : out;
    for (int64_t i = 0; i < elems; i++) {
        dst[i] = st_element(dtype, src, i);
        if (!isfinite(dst[i]))
            return err_set(e, ERR_INPUT, "%s: %s: element %lld is %g: weights must be finite",
                           f->name, name, (long long)i, (double)dst[i]);
    }
    if (p->transposed) /* the file's [in, out] as Ballast's (out, in) */
        transpose(out, tmp, want->shape[0], want->shape[1], 4);
    return ERR_OK;
}

/* One parameter, `name` in `file`: its fp32 master weights and, for a 16-bit model, the
 * compute copy rounded, which must stay finite (fp16 ends at 65504). */
static int put_param(struct stage_runner *r, const struct layer_layout *L, int k,
                     const float *v, uint16_t *half, const char *file, const char *name,
                     struct err *e)
{
    int64_t elems = L->params[k].elems;
    enum model_dtype dt = r->lay.dtype;
    ERR_TRY(stage_state_put(r, r->lay.master_at + L->param_off[k], v, 4 * elems, e));
    if (!model_dtype_16bit(dt))
        return ERR_OK;
    half_narrow(dt, half, v, elems);
    for (int64_t i = 0; i < elems; i++)
        if (!isfinite(half_to_float(dt, half[i])))
            return err_set(e, ERR_INPUT, "%s: %s: element %lld is %g, beyond what %s holds "
                           "(the model computes in %s)", file, name, (long long)i,
                           (double)v[i], model_dtype_name(dt), model_dtype_name(dt));
    return stage_state_put(r, L->weight_off[k], half, 2 * elems, e);
}

int st_stage_load(struct stage_runner *r, const char *file, struct err *e)
{
    struct st_file f;
    int rc = st_open(&f, file, e);
    int64_t most = 0;
    for (int li = 0; li < r->lay.n_layers; li++)
        for (int k = 0; k < r->lay.layers[li].n_params; k++)
            if (r->lay.layers[li].params[k].elems > most)
                most = r->lay.layers[li].params[k].elems;
    float *v = malloc(sizeof(float) * (size_t)(most + 1)),
          *tmp = malloc(sizeof(float) * (size_t)(most + 1));
    uint16_t *half = malloc(sizeof(uint16_t) * (size_t)(most + 1));
    if (rc == ERR_OK && (v == NULL || tmp == NULL || half == NULL))
        rc = err_set(e, ERR_FAIL, "%s: out of memory reading the weights", file);
    for (int li = 0; li < r->lay.n_layers && rc == ERR_OK; li++) {
        const struct layer_layout *L = &r->lay.layers[li];
        for (int k = 0; k < L->n_params && rc == ERR_OK; k++) {
            struct st_param p;
            int64_t at = 0; /* the pieces are row blocks of one matrix */
            rc = describe_param(r->c.model, L, k, &p, e);
            for (int i = 0; i < p.n && rc == ERR_OK; at += elems_of(&p.t[i++]))
                rc = read_tensor(&f, &p.t[i], &p, v + at, tmp, e);
            if (rc == ERR_OK)
                rc = put_param(r, L, k, v, half, file, p.t[0].name, e);
            progress_tick();
        }
    }
    free(v);
    free(tmp);
    free(half);
    st_close(&f);
    return rc;
}
