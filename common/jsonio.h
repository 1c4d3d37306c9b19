/* Reading and writing Ballast's JSON files with messages that name the file and the field.
 *
 * Every getter takes the file name and the JSON path of the object (e.g. "stages[2]", or ""
 * at the top level) so a message reads `cluster.json: stages[2].memory_bytes: ...`.
 * Integers are JSON numbers with no fractional part and magnitude below 2^53: every such
 * integer is exact in a double, while 2^53 + 1 would silently read as 2^53. */
#ifndef BALLAST_JSONIO_H
#define BALLAST_JSONIO_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "err.h"

#define JSONIO_INT_MAX (((int64_t)1 << 53) - 1)
#define JSONIO_PATH_MAX 256

/* The kinds of JSON file Ballast reads, each with the largest size it accepts (jsonio.c's
 * table; docs/reliability.md lists them). */
enum jsonio_kind {
    JSONIO_MODEL,      /* ballast-model/1: 1 MiB */
    JSONIO_DEVICES,    /* ballast-devices/1: 1 MiB */
    JSONIO_LINKS,      /* ballast-links/1 (configs/links.json): 1 MiB */
    JSONIO_CHECKPOINT, /* a checkpoint's manifest: 1 MiB */
    JSONIO_CLUSTER,    /* ballast-cluster/1 (stages, pipelines or a pool): 16 MiB */
    JSONIO_PROFILE,    /* ballast-profile/1: 64 MiB (a custom model of 65536 layers) */
    JSONIO_PLAN,       /* ballast-plan/1 or ballast-replicas/1: 64 MiB */
    JSONIO_SHARE,      /* ballast-share/1 (a plan per job): 64 MiB */
    JSONIO_ANY,        /* another JSON file (a trace, say): 64 MiB */
};
/* A parsed tree takes about this many times its text's bytes at most (plus
 * JSONIO_MEMORY_SLACK); a file whose values are denser is refused before it is parsed.
 * Ballast's own files take under 9 times, minified. */
#define JSONIO_MEMORY_FACTOR 16
#define JSONIO_MEMORY_SLACK ((int64_t)1 << 20)

/* Reads and parses a whole file; rejects files that are not regular files, larger than the
 * kind's cap (checked before reading), whose tree would take more than JSONIO_MEMORY_FACTOR
 * times their size (checked before parsing), not JSON, or that repeat a key inside one
 * object. Time and memory are linear in the file's size. The caller owns the result
 * (cJSON_Delete). */
cJSON *jsonio_read_kind(const char *file, enum jsonio_kind kind, struct err *e);
/* jsonio_read_kind for JSONIO_ANY. */
cJSON *jsonio_read(const char *file, struct err *e);
/* Parses text the same way (text[len] must be the terminating NUL); `file` names it in
 * messages. */
cJSON *jsonio_parse(const char *text, size_t len, const char *file, struct err *e);
/* The bytes of heap (malloc's overhead included) cJSON takes to parse `text` into a tree,
 * and its count of values, from one pass over the text without parsing it. */
int64_t jsonio_tree_bytes(const char *text, size_t len, int64_t *values);
/* Writes `root` to `file` atomically (fileio.h: a unique temporary, fsync, rename); refuses
 * to replace a read-only file. */
int jsonio_write(const char *file, const cJSON *root, struct err *e);
/* The same without indentation: for large machine-read files (traces). */
int jsonio_write_compact(const char *file, const cJSON *root, struct err *e);

/* Checks `"format": "ballast-<kind>/<version>"`. */
int jsonio_check_format(const cJSON *root, const char *file, const char *kind, int version,
                        struct err *e);
/* Fails on a member of `obj` whose name is not in the NULL-terminated list `allowed`. */
int jsonio_check_keys(const cJSON *obj, const char *file, const char *path,
                      const char *const *allowed, struct err *e);
/* Checks that `item` is an object (or an array), naming `path` otherwise. */
int jsonio_expect_object(const cJSON *item, const char *file, const char *path, struct err *e);
int jsonio_expect_array(const cJSON *item, const char *file, const char *path, struct err *e);
/* The array obj.key must hold, its path written to sub; NULL (the error in e) when it is
 * missing or not an array. */
const cJSON *jsonio_array(const cJSON *obj, const char *file, const char *path, const char *key,
                          char sub[JSONIO_PATH_MAX], struct err *e);

/* Joins a path and a key or an index: ("stages", 2) -> "stages[2]", ("", "x") -> "x". */
void jsonio_path_key(char out[JSONIO_PATH_MAX], const char *path, const char *key);
void jsonio_path_index(char out[JSONIO_PATH_MAX], const char *path, int index);

/* Required members: fail if absent, of the wrong type or outside [lo, hi]. */
int jsonio_int(const cJSON *obj, const char *file, const char *path, const char *key,
               int64_t lo, int64_t hi, int64_t *out, struct err *e);
int jsonio_num(const cJSON *obj, const char *file, const char *path, const char *key,
               double lo, double hi, double *out, struct err *e);
int jsonio_str(const cJSON *obj, const char *file, const char *path, const char *key,
               const char **out, struct err *e);
int jsonio_bool(const cJSON *obj, const char *file, const char *path, const char *key,
                int *out, struct err *e);
/* Optional members: absent leaves *out as it is. */
int jsonio_int_opt(const cJSON *obj, const char *file, const char *path, const char *key,
                   int64_t lo, int64_t hi, int64_t *out, struct err *e);
int jsonio_num_opt(const cJSON *obj, const char *file, const char *path, const char *key,
                   double lo, double hi, double *out, struct err *e);
/* Checks a number already in hand (an array element, say) the same way. */
int jsonio_int_value(const cJSON *item, const char *file, const char *path, int64_t lo,
                     int64_t hi, int64_t *out, struct err *e);

/* Free text (a "name", a "description", a "note"): each member of `keys` (NULL-terminated)
 * that `obj` has must be a string. */
int jsonio_check_text(const cJSON *obj, const char *file, const char *path,
                      const char *const *keys, struct err *e);

/* Strings copied into fixed buffers must fit: fails naming the field otherwise. */
int jsonio_str_copy(const cJSON *obj, const char *file, const char *path, const char *key,
                    char *dst, size_t cap, struct err *e);

/* Adds an integer-valued number (bytes, counts) to an object. */
void jsonio_add_int(cJSON *obj, const char *key, int64_t value);

#endif
