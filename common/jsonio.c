#include "jsonio.h"

#include "fileio.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Each kind's cap: what the largest such file Ballast makes needs, with room to spare (a plan
 * of 128 stages is about 120 KB, 5.5 MB with its arenas laid out; a profile of a custom model
 * of 65536 layers about 40 MB). A larger input is a mistake, refused before it costs minutes
 * and gigabytes. */
static const struct {
    const char *name;
    int64_t max_bytes;
} kinds[] = {
    [JSONIO_MODEL] = {"a model file", (int64_t)1 << 20},
    [JSONIO_DEVICES] = {"a device table", (int64_t)1 << 20},
    [JSONIO_LINKS] = {"a link table", (int64_t)1 << 20},
    [JSONIO_CHECKPOINT] = {"a checkpoint manifest", (int64_t)1 << 20},
    [JSONIO_CLUSTER] = {"a cluster file", (int64_t)16 << 20},
    [JSONIO_PROFILE] = {"a profile", (int64_t)64 << 20},
    [JSONIO_PLAN] = {"a plan file", (int64_t)64 << 20},
    [JSONIO_SHARE] = {"a share file", (int64_t)64 << 20},
    [JSONIO_ANY] = {"a JSON file", (int64_t)64 << 20},
};

static const char *type_name(const cJSON *item)
{
    if (item == NULL)
        return "nothing";
    if (cJSON_IsNull(item))
        return "null";
    if (cJSON_IsBool(item))
        return "a boolean";
    if (cJSON_IsNumber(item))
        return "a number";
    if (cJSON_IsString(item))
        return "a string";
    if (cJSON_IsArray(item))
        return "an array";
    if (cJSON_IsObject(item))
        return "an object";
    return "an unknown value";
}

void jsonio_path_key(char out[JSONIO_PATH_MAX], const char *path, const char *key)
{
    if (path == NULL || path[0] == '\0')
        snprintf(out, JSONIO_PATH_MAX, "%s", key);
    else
        snprintf(out, JSONIO_PATH_MAX, "%s.%s", path, key);
}

void jsonio_path_index(char out[JSONIO_PATH_MAX], const char *path, int index)
{
    snprintf(out, JSONIO_PATH_MAX, "%s[%d]", path ? path : "", index);
}

static int compare_keys(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Where an item is: its parent's place and its key or index. The path is written out only
 * for a message: formatting it for every value cost most of the time a large file took. */
struct place {
    const struct place *up;
    const cJSON *item;
    int index;
};

static void place_path(const struct place *p, char out[JSONIO_PATH_MAX])
{
    char up[JSONIO_PATH_MAX];
    if (p == NULL) {
        out[0] = '\0';
        return;
    }
    place_path(p->up, up);
    if (p->item->string != NULL)
        jsonio_path_key(out, up, p->item->string);
    else
        jsonio_path_index(out, up, p->index);
}

/* The first key of `item` (an object of n > 1 members) that appears twice, or NULL; sorting
 * makes an object of many members cost n log n, not n^2. */
static const char *repeated_key(const cJSON *item, int n, int *oom)
{
    const char **keys = malloc((size_t)n * sizeof *keys);
    const char *twice = NULL;
    *oom = keys == NULL;
    if (keys == NULL)
        return NULL;
    int k = 0;
    for (const cJSON *a = item->child; a != NULL; a = a->next)
        keys[k++] = a->string;
    qsort(keys, (size_t)n, sizeof *keys, compare_keys);
    for (k = 1; k < n && twice == NULL; k++)
        if (strcmp(keys[k - 1], keys[k]) == 0)
            twice = keys[k];
    free(keys);
    return twice;
}

/* Duplicate keys are legal JSON but a file that sets a field twice is almost surely wrong,
 * and cJSON would silently use the first. */
static int check_duplicates(const cJSON *item, const struct place *at, const char *file,
                            struct err *e)
{
    int n = 0, oom = 0;
    for (const cJSON *a = item->child; a != NULL; a = a->next)
        n++;
    const char *twice = cJSON_IsObject(item) && n > 1 ? repeated_key(item, n, &oom) : NULL;
    if (oom)
        return err_set(e, ERR_FAIL, "%s: out of memory", file);
    if (twice != NULL) {
        char path[JSONIO_PATH_MAX], sub[JSONIO_PATH_MAX];
        place_path(at, path);
        jsonio_path_key(sub, path, twice);
        return err_set(e, ERR_INPUT, "%s: %s: the key appears more than once", file, sub);
    }
    struct place here = {at, NULL, 0};
    for (const cJSON *a = item->child; a != NULL; a = a->next, here.index++) {
        here.item = a;
        if ((cJSON_IsObject(a) || cJSON_IsArray(a)) && check_duplicates(a, &here, file, e))
            return e->code;
    }
    return ERR_OK;
}

/* malloc's bytes for a request of n: a 16-byte aligned chunk with an 8-byte header, 32 at
 * least (glibc on 64-bit hosts). */
static int64_t heap_bytes(int64_t n)
{
    int64_t chunk = (n + 8 + 15) / 16 * 16;
    return chunk < 32 ? 32 : chunk;
}

/* cJSON gives every value a node and every string (a value or a key) its own copy of the
 * text between the quotes (less its escapes: the raw length bounds it). */
int64_t jsonio_tree_bytes(const char *text, size_t len, int64_t *values)
{
    int64_t bytes = 0, n = 0;
    size_t i = 0;
    while (i < len) {
        char c = text[i];
        if (c == '"') {
            size_t start = ++i;
            while (i < len && text[i] != '"')
                i += text[i] == '\\' ? 2 : 1;
            bytes += heap_bytes((int64_t)(i - start) + 1);
            i++;
            size_t j = i;
            while (j < len && (text[j] == ' ' || text[j] == '\t' || text[j] == '\n' ||
                               text[j] == '\r'))
                j++;
            n += j >= len || text[j] != ':'; /* a key's node is its value's */
            continue;
        }
        if (c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n') {
            n++;
            while (i < len && strchr(",]} \t\n\r\"[{:", text[i]) == NULL)
                i++;
            continue;
        }
        n += c == '[' || c == '{';
        i++;
    }
    *values = n;
    return bytes + n * heap_bytes((int64_t)sizeof(cJSON));
}

/* A file whose tree would take more than JSONIO_MEMORY_FACTOR times its size: refused before
 * parsing, naming the numbers. */
static int check_tree_bytes(const char *text, size_t len, const char *file, struct err *e)
{
    int64_t values, bytes = jsonio_tree_bytes(text, len, &values);
    int64_t most = JSONIO_MEMORY_FACTOR * (int64_t)len + JSONIO_MEMORY_SLACK;
    if (bytes <= most)
        return ERR_OK;
    return err_set(e, ERR_INPUT,
                   "%s: %lld JSON values in %lld bytes would take %lld bytes of memory to parse, "
                   "more than the %lld accepted (%d times the file's size, and 1 MiB): a "
                   "Ballast file is not this dense",
                   file, (long long)values, (long long)len, (long long)bytes, (long long)most,
                   JSONIO_MEMORY_FACTOR);
}

cJSON *jsonio_parse(const char *text, size_t len, const char *file, struct err *e)
{
    const char *end = NULL;
    if (check_tree_bytes(text, len, file, e))
        return NULL;
    /* cJSON counts the terminating NUL in the length when it must check that nothing but
     * whitespace follows the value. */
    cJSON *root = cJSON_ParseWithLengthOpts(text, len + 1, &end, 1);
    if (root == NULL) {
        /* cJSON reports where parsing stopped; turn that into a line and column. */
        size_t off = end ? (size_t)(end - text) : 0;
        int line = 1, col = 1;
        if (off > len)
            off = len;
        for (size_t i = 0; i < off; i++) {
            if (text[i] == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        err_set(e, ERR_INPUT, "%s: not valid JSON (line %d, column %d)", file, line, col);
        return NULL;
    }
    if (check_duplicates(root, NULL, file, e)) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

cJSON *jsonio_read_kind(const char *file, enum jsonio_kind kind, struct err *e)
{
    int fd;
    int64_t size;
    if (fileio_open_input(file, 0, &fd, &size, e))
        return NULL;
    if (size > kinds[kind].max_bytes) {
        close(fd);
        err_set(e, ERR_INPUT, "%s: %lld bytes, larger than the %lld bytes (%lld MiB) accepted "
                "for %s", file, (long long)size, (long long)kinds[kind].max_bytes,
                (long long)(kinds[kind].max_bytes >> 20), kinds[kind].name);
        return NULL;
    }
    char *buf = malloc((size_t)size + 1);
    if (buf == NULL) {
        close(fd);
        err_set(e, ERR_FAIL, "%s: out of memory reading %lld bytes", file, (long long)size);
        return NULL;
    }
    errno = 0;
    int bad = fileio_read_all(fd, buf, size);
    close(fd);
    buf[size] = '\0';
    if (bad)
        err_set(e, ERR_INPUT, "%s: read error: %s", file,
                errno ? strerror(errno) : "the file shrank while being read");
    else if (memchr(buf, '\0', (size_t)size) != NULL)
        bad = err_set(e, ERR_INPUT, "%s: not valid JSON (contains a NUL byte)", file);
    cJSON *root = bad ? NULL : jsonio_parse(buf, (size_t)size, file, e);
    free(buf);
    return root;
}

cJSON *jsonio_read(const char *file, struct err *e)
{
    return jsonio_read_kind(file, JSONIO_ANY, e);
}

static int write_json(const char *file, const cJSON *root, int formatted, struct err *e)
{
    char *text = formatted ? cJSON_Print(root) : cJSON_PrintUnformatted(root);
    if (text == NULL)
        return err_set(e, ERR_FAIL, "%s: out of memory formatting JSON", file);
    struct fileio_out out;
    if (fileio_out_open(&out, file, e)) {
        free(text);
        return e->code;
    }
    int ok = fileio_write_all(out.fd, text, (int64_t)strlen(text)) == 0 &&
             fileio_write_all(out.fd, "\n", 1) == 0;
    free(text);
    return fileio_out_commit(&out, file, ok, e);
}

int jsonio_write(const char *file, const cJSON *root, struct err *e)
{
    return write_json(file, root, 1, e);
}

int jsonio_write_compact(const char *file, const cJSON *root, struct err *e)
{
    return write_json(file, root, 0, e);
}

int jsonio_expect_object(const cJSON *item, const char *file, const char *path, struct err *e)
{
    if (cJSON_IsObject(item))
        return ERR_OK;
    return err_set(e, ERR_INPUT, "%s: %s: expected an object, found %s", file,
                   path[0] ? path : "(top level)", type_name(item));
}

int jsonio_expect_array(const cJSON *item, const char *file, const char *path, struct err *e)
{
    if (cJSON_IsArray(item))
        return ERR_OK;
    return err_set(e, ERR_INPUT, "%s: %s: expected an array, found %s", file, path,
                   type_name(item));
}

int jsonio_check_format(const cJSON *root, const char *file, const char *kind, int version,
                        struct err *e)
{
    char want[64];
    const char *got;
    if (jsonio_expect_object(root, file, "", e))
        return e->code;
    snprintf(want, sizeof want, "ballast-%s/%d", kind, version);
    if (jsonio_str(root, file, "", "format", &got, e))
        return e->code;
    if (strcmp(got, want) != 0)
        return err_set(e, ERR_INPUT, "%s: format: \"%s\", expected \"%s\"", file, got, want);
    return ERR_OK;
}

int jsonio_check_keys(const cJSON *obj, const char *file, const char *path,
                      const char *const *allowed, struct err *e)
{
    for (const cJSON *m = obj->child; m != NULL; m = m->next) {
        int known = 0;
        for (const char *const *a = allowed; *a != NULL && !known; a++)
            known = strcmp(*a, m->string) == 0;
        if (!known) {
            char sub[JSONIO_PATH_MAX], list[512] = "";
            size_t used = 0;
            for (const char *const *a = allowed; *a != NULL; a++)
                used += (size_t)snprintf(list + used, used < sizeof list ? sizeof list - used : 0,
                                         "%s%s", a == allowed ? "" : ", ", *a);
            jsonio_path_key(sub, path, m->string);
            return err_set(e, ERR_INPUT, "%s: %s: unknown field (known fields: %s)", file, sub,
                           list);
        }
    }
    return ERR_OK;
}

static const cJSON *member(const cJSON *obj, const char *file, const char *path, const char *key,
                           char sub[JSONIO_PATH_MAX], struct err *e)
{
    jsonio_path_key(sub, path, key);
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (item == NULL)
        err_set(e, ERR_INPUT, "%s: %s: missing", file, sub);
    return item;
}

const cJSON *jsonio_array(const cJSON *obj, const char *file, const char *path, const char *key,
                          char sub[JSONIO_PATH_MAX], struct err *e)
{
    const cJSON *a = member(obj, file, path, key, sub, e);
    return a != NULL && jsonio_expect_array(a, file, sub, e) == ERR_OK ? a : NULL;
}

int jsonio_int_value(const cJSON *item, const char *file, const char *path, int64_t lo,
                     int64_t hi, int64_t *out, struct err *e)
{
    if (!cJSON_IsNumber(item))
        return err_set(e, ERR_INPUT, "%s: %s: expected an integer, found %s", file, path,
                       type_name(item));
    double d = item->valuedouble;
    if (!isfinite(d) || fabs(d) > (double)JSONIO_INT_MAX)
        return err_set(e, ERR_INPUT, "%s: %s: %g is out of range (integers below 2^53)", file,
                       path, d);
    if (d != floor(d))
        return err_set(e, ERR_INPUT, "%s: %s: %g is not an integer", file, path, d);
    int64_t v = (int64_t)d;
    if (v < lo || v > hi)
        return err_set(e, ERR_INPUT, "%s: %s: %lld is outside [%lld, %lld]", file, path,
                       (long long)v, (long long)lo, (long long)hi);
    *out = v;
    return ERR_OK;
}

int jsonio_int(const cJSON *obj, const char *file, const char *path, const char *key,
               int64_t lo, int64_t hi, int64_t *out, struct err *e)
{
    char sub[JSONIO_PATH_MAX];
    const cJSON *item = member(obj, file, path, key, sub, e);
    if (item == NULL)
        return e->code;
    return jsonio_int_value(item, file, sub, lo, hi, out, e);
}

int jsonio_int_opt(const cJSON *obj, const char *file, const char *path, const char *key,
                   int64_t lo, int64_t hi, int64_t *out, struct err *e)
{
    if (cJSON_GetObjectItemCaseSensitive(obj, key) == NULL)
        return ERR_OK;
    return jsonio_int(obj, file, path, key, lo, hi, out, e);
}

int jsonio_num(const cJSON *obj, const char *file, const char *path, const char *key, double lo,
               double hi, double *out, struct err *e)
{
    char sub[JSONIO_PATH_MAX];
    const cJSON *item = member(obj, file, path, key, sub, e);
    if (item == NULL)
        return e->code;
    if (!cJSON_IsNumber(item))
        return err_set(e, ERR_INPUT, "%s: %s: expected a number, found %s", file, sub,
                       type_name(item));
    double d = item->valuedouble;
    if (!isfinite(d) || d < lo || d > hi)
        return err_set(e, ERR_INPUT, "%s: %s: %g is outside [%g, %g]", file, sub, d, lo, hi);
    *out = d;
    return ERR_OK;
}

int jsonio_num_opt(const cJSON *obj, const char *file, const char *path, const char *key,
                   double lo, double hi, double *out, struct err *e)
{
    if (cJSON_GetObjectItemCaseSensitive(obj, key) == NULL)
        return ERR_OK;
    return jsonio_num(obj, file, path, key, lo, hi, out, e);
}

int jsonio_str(const cJSON *obj, const char *file, const char *path, const char *key,
               const char **out, struct err *e)
{
    char sub[JSONIO_PATH_MAX];
    const cJSON *item = member(obj, file, path, key, sub, e);
    if (item == NULL)
        return e->code;
    if (!cJSON_IsString(item))
        return err_set(e, ERR_INPUT, "%s: %s: expected a string, found %s", file, sub,
                       type_name(item));
    *out = item->valuestring;
    return ERR_OK;
}

int jsonio_str_copy(const cJSON *obj, const char *file, const char *path, const char *key,
                    char *dst, size_t cap, struct err *e)
{
    const char *s = "";
    if (jsonio_str(obj, file, path, key, &s, e))
        return e->code;
    if (strlen(s) >= cap) {
        char sub[JSONIO_PATH_MAX];
        jsonio_path_key(sub, path, key);
        return err_set(e, ERR_INPUT, "%s: %s: longer than %zu characters", file, sub, cap - 1);
    }
    if (s[0] == '\0') {
        char sub[JSONIO_PATH_MAX];
        jsonio_path_key(sub, path, key);
        return err_set(e, ERR_INPUT, "%s: %s: empty", file, sub);
    }
    memcpy(dst, s, strlen(s) + 1);
    return ERR_OK;
}

int jsonio_check_text(const cJSON *obj, const char *file, const char *path,
                      const char *const *keys, struct err *e)
{
    for (const char *const *k = keys; *k != NULL; k++) {
        const char *s;
        if (cJSON_GetObjectItemCaseSensitive(obj, *k) != NULL &&
            jsonio_str(obj, file, path, *k, &s, e))
            return e->code;
    }
    return ERR_OK;
}

int jsonio_bool(const cJSON *obj, const char *file, const char *path, const char *key, int *out,
                struct err *e)
{
    char sub[JSONIO_PATH_MAX];
    const cJSON *item = member(obj, file, path, key, sub, e);
    if (item == NULL)
        return e->code;
    if (!cJSON_IsBool(item))
        return err_set(e, ERR_INPUT, "%s: %s: expected true or false, found %s", file, sub,
                       type_name(item));
    *out = cJSON_IsTrue(item);
    return ERR_OK;
}

void jsonio_add_int(cJSON *obj, const char *key, int64_t value)
{
    cJSON_AddNumberToObject(obj, key, (double)value);
}
