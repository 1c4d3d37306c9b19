#include "jsonio.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Larger than any file Ballast writes (a 96-block profile is tens of KiB). */
#define JSONIO_FILE_MAX ((long)256 << 20)

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

/* Duplicate keys are legal JSON but a file that sets a field twice is almost surely wrong,
 * and cJSON would silently use the first. */
static int check_duplicates(const cJSON *item, const char *file, const char *path, struct err *e)
{
    char sub[JSONIO_PATH_MAX];
    int index = 0;
    for (const cJSON *a = item->child; a != NULL; a = a->next, index++) {
        if (cJSON_IsObject(item)) {
            for (const cJSON *b = a->next; b != NULL; b = b->next)
                if (a->string && b->string && strcmp(a->string, b->string) == 0) {
                    jsonio_path_key(sub, path, a->string);
                    return err_set(e, ERR_INPUT, "%s: %s: the key appears more than once", file,
                                   sub);
                }
            jsonio_path_key(sub, path, a->string ? a->string : "?");
        } else {
            jsonio_path_index(sub, path, index);
        }
        if ((cJSON_IsObject(a) || cJSON_IsArray(a)) && check_duplicates(a, file, sub, e))
            return e->code;
    }
    return ERR_OK;
}

cJSON *jsonio_parse(const char *text, size_t len, const char *file, struct err *e)
{
    const char *end = NULL;
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
    if (check_duplicates(root, file, "", e)) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

cJSON *jsonio_read(const char *file, struct err *e)
{
    FILE *f = fopen(file, "rb");
    if (f == NULL) {
        err_set(e, ERR_INPUT, "%s: cannot open: %s", file, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        err_set(e, ERR_INPUT, "%s: cannot read (not a regular file?)", file);
        goto fail;
    }
    if (size > JSONIO_FILE_MAX) {
        err_set(e, ERR_INPUT, "%s: %ld bytes, larger than the %ld bytes any Ballast file has",
                file, size, JSONIO_FILE_MAX);
        goto fail;
    }
    buf = malloc((size_t)size + 1);
    if (buf == NULL) {
        err_set(e, ERR_FAIL, "%s: out of memory reading %ld bytes", file, size);
        goto fail;
    }
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        err_set(e, ERR_INPUT, "%s: read error: %s", file, strerror(errno));
        goto fail;
    }
    buf[size] = '\0';
    if (memchr(buf, '\0', (size_t)size) != NULL) {
        err_set(e, ERR_INPUT, "%s: not valid JSON (contains a NUL byte)", file);
        goto fail;
    }
    fclose(f);
    cJSON *root = jsonio_parse(buf, (size_t)size, file, e);
    free(buf);
    return root;
fail:
    free(buf);
    fclose(f);
    return NULL;
}

static int write_json(const char *file, const cJSON *root, int formatted, struct err *e)
{
    char *text = formatted ? cJSON_Print(root) : cJSON_PrintUnformatted(root);
    if (text == NULL)
        return err_set(e, ERR_FAIL, "%s: out of memory formatting JSON", file);
    size_t n = strlen(text);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", file, (long)getpid()) >= (int)sizeof tmp) {
        free(text);
        return err_set(e, ERR_INPUT, "%s: path too long", file);
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        free(text);
        return err_set(e, ERR_FAIL, "%s: cannot create: %s", file, strerror(errno));
    }
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, text + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    int ok = done == n && write(fd, "\n", 1) == 1 && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    free(text);
    if (!ok || rename(tmp, file) != 0) {
        int saved = errno;
        unlink(tmp);
        return err_set(e, ERR_FAIL, "%s: cannot write: %s", file, strerror(saved));
    }
    return ERR_OK;
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

int jsonio_int_value(const cJSON *item, const char *file, const char *path, int64_t lo,
                     int64_t hi, int64_t *out, struct err *e)
{
    if (!cJSON_IsNumber(item))
        return err_set(e, ERR_INPUT, "%s: %s: expected an integer, found %s", file, path,
                       type_name(item));
    double d = item->valuedouble;
    if (!isfinite(d) || fabs(d) > (double)JSONIO_INT_MAX)
        return err_set(e, ERR_INPUT, "%s: %s: %g is out of range (integers up to 2^53)", file,
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
    const char *s;
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
