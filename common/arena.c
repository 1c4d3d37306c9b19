#include "arena.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonio.h"

static const char *const kind_names[ARENA_KINDS] = {"kept", "transient", "workspace", "staging"};

const char *arena_kind_name(enum arena_kind k)
{
    return k >= 0 && k < ARENA_KINDS ? kind_names[k] : "?";
}

int arena_kind_phased(enum arena_kind k)
{
    return k == ARENA_TRANSIENT || k == ARENA_STAGING;
}

void arena_free(struct arena *a)
{
    free(a->objects);
    memset(a, 0, sizeof *a);
}

int arena_copy(struct arena *dst, const struct arena *src, struct err *e)
{
    *dst = *src;
    dst->objects = malloc(sizeof *dst->objects * (size_t)(src->n ? src->n : 1));
    if (dst->objects == NULL)
        return err_set(e, ERR_FAIL, "out of memory copying an arena of %d objects", src->n);
    memcpy(dst->objects, src->objects, sizeof *dst->objects * (size_t)src->n);
    return ERR_OK;
}

/* A change of live bytes at a tick; ends (at last + 1) sort before starts at the same tick. */
struct live_event {
    int tick;
    int64_t delta;
};

static int event_cmp(const void *pa, const void *pb)
{
    const struct live_event *a = pa, *b = pb;
    if (a->tick != b->tick)
        return a->tick < b->tick ? -1 : 1;
    return (a->delta > b->delta) - (a->delta < b->delta);
}

int64_t arena_lower_bound(const struct arena_object *o, int n)
{
    struct live_event *ev = malloc(sizeof *ev * (size_t)(2 * n + 1));
    if (ev == NULL)
        return -1;
    for (int i = 0; i < n; i++) {
        ev[2 * i] = (struct live_event){o[i].first, o[i].bytes};
        ev[2 * i + 1] = (struct live_event){o[i].last + 1, -o[i].bytes};
    }
    qsort(ev, (size_t)(2 * n), sizeof *ev, event_cmp);
    int64_t live = 0, most = 0;
    for (int i = 0; i < 2 * n; i++) {
        live += ev[i].delta;
        if (live > most)
            most = live;
    }
    free(ev);
    return most;
}

int64_t arena_extent(const struct arena_object *o, int n)
{
    int64_t top = 0;
    for (int i = 0; i < n; i++)
        if (o[i].offset >= 0 && o[i].offset + o[i].bytes > top)
            top = o[i].offset + o[i].bytes;
    return top;
}

int arena_lifetimes_meet(const struct arena_object *a, const struct arena_object *b)
{
    return a->first <= b->last && b->first <= a->last;
}

int64_t arena_above_cap(const struct arena_object *o, int n, int64_t cap)
{
    int64_t above = 0;
    for (int i = 0; cap > 0 && i < n; i++)
        if (o[i].offset + o[i].bytes > cap)
            above += o[i].bytes;
    return above;
}

static void describe_object(const struct arena_object *o, char *buf, size_t len)
{
    snprintf(buf, len, "%s (micro-batch %d, layer %d%s, %lld bytes at %lld, ticks %d-%d)",
             arena_kind_name(o->kind), o->micro, o->layer,
             arena_kind_phased(o->kind) ? (o->phase ? ", backward" : ", forward") : "",
             (long long)o->bytes, (long long)o->offset, o->first, o->last);
}

int arena_check(const struct arena *a, struct err *e)
{
    const struct arena_object *o = a->objects;
    char da[160], db[160];
    for (int i = 0; i < a->n; i++) {
        if (o[i].offset < 0 || o[i].offset + o[i].bytes > a->bytes) {
            describe_object(&o[i], da, sizeof da);
            return err_set(e, ERR_FAIL, "arena %s of %lld bytes: object %d, %s, is outside it",
                           a->method, (long long)a->bytes, i, da);
        }
        for (int j = i + 1; j < a->n; j++)
            if (arena_lifetimes_meet(&o[i], &o[j]) && o[i].offset < o[j].offset + o[j].bytes &&
                o[j].offset < o[i].offset + o[i].bytes) {
                describe_object(&o[i], da, sizeof da);
                describe_object(&o[j], db, sizeof db);
                return err_set(e, ERR_FAIL, "arena %s: objects %d, %s, and %d, %s, are live at "
                               "once and share bytes", a->method, i, da, j, db);
            }
    }
    return ERR_OK;
}

cJSON *arena_to_json(const struct arena *a)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "method", a->method);
    jsonio_add_int(o, "bytes", a->bytes);
    jsonio_add_int(o, "lower_bound_bytes", a->lower_bound_bytes);
    if (a->host_bytes > 0)
        jsonio_add_int(o, "host_bytes", a->host_bytes);
    cJSON_AddBoolToObject(o, "proven", a->proven);
    cJSON_AddNumberToObject(o, "solve_ms", a->solve_ms);
    cJSON *list = cJSON_AddArrayToObject(o, "objects");
    for (int i = 0; i < a->n; i++) {
        const struct arena_object *b = &a->objects[i];
        cJSON *it = cJSON_CreateObject();
        cJSON_AddStringToObject(it, "kind", arena_kind_name(b->kind));
        cJSON_AddNumberToObject(it, "micro", b->micro);
        cJSON_AddNumberToObject(it, "layer", b->layer);
        if (arena_kind_phased(b->kind))
            cJSON_AddStringToObject(it, "phase", b->phase ? "backward" : "forward");
        jsonio_add_int(it, "bytes", b->bytes);
        cJSON_AddNumberToObject(it, "first", b->first);
        cJSON_AddNumberToObject(it, "last", b->last);
        jsonio_add_int(it, "offset", b->offset);
        cJSON_AddItemToArray(list, it);
    }
    return o;
}

static int object_from_json(const cJSON *it, const char *file, const char *path,
                            struct arena_object *b, struct err *e)
{
    const char *kind, *phase = "forward";
    int64_t micro, layer, first, last;
    if (jsonio_expect_object(it, file, path, e) || jsonio_str(it, file, path, "kind", &kind, e))
        return e->code;
    int k = 0;
    while (k < ARENA_KINDS && strcmp(kind_names[k], kind) != 0)
        k++;
    if (k == ARENA_KINDS)
        return err_set(e, ERR_INPUT, "%s: %s.kind: \"%s\", expected kept, transient, workspace "
                       "or staging", file, path, kind);
    if (jsonio_int(it, file, path, "micro", -1, 1 << 20, &micro, e) ||
        jsonio_int(it, file, path, "layer", -1, 1 << 20, &layer, e) ||
        jsonio_int(it, file, path, "bytes", 0, JSONIO_INT_MAX, &b->bytes, e) ||
        jsonio_int(it, file, path, "first", 0, 1 << 30, &first, e) ||
        jsonio_int(it, file, path, "last", first, 1 << 30, &last, e) ||
        jsonio_int(it, file, path, "offset", 0, JSONIO_INT_MAX, &b->offset, e))
        return e->code;
    if (arena_kind_phased((enum arena_kind)k) &&
        cJSON_GetObjectItemCaseSensitive(it, "phase") != NULL &&
        jsonio_str(it, file, path, "phase", &phase, e))
        return e->code;
    if (strcmp(phase, "forward") != 0 && strcmp(phase, "backward") != 0)
        return err_set(e, ERR_INPUT, "%s: %s.phase: \"%s\", expected forward or backward", file,
                       path, phase);
    b->kind = (enum arena_kind)k;
    b->micro = (int)micro;
    b->layer = (int)layer;
    b->phase = strcmp(phase, "backward") == 0;
    b->first = (int)first;
    b->last = (int)last;
    return ERR_OK;
}

/* "proven" (optional, false when absent): only exact proves, so true elsewhere is wrong. */
static int proven_from_json(const cJSON *o, const char *file, const char *path, struct arena *a,
                            struct err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "proven");
    if (v == NULL)
        return ERR_OK;
    if (!cJSON_IsBool(v))
        return err_set(e, ERR_INPUT, "%s: %s.proven: expected true or false", file, path);
    a->proven = cJSON_IsTrue(v);
    if (a->proven && strcmp(a->method, "exact") != 0)
        return err_set(e, ERR_INPUT, "%s: %s.proven: true, but method \"%s\" proves nothing "
                       "(only exact does)", file, path, a->method);
    return ERR_OK;
}

int arena_from_json(const cJSON *o, const char *file, const char *path, struct arena *a,
                    struct err *e)
{
    memset(a, 0, sizeof *a);
    char sub[JSONIO_PATH_MAX];
    if (jsonio_expect_object(o, file, path, e) ||
        jsonio_str_copy(o, file, path, "method", a->method, sizeof a->method, e) ||
        jsonio_int(o, file, path, "bytes", 0, JSONIO_INT_MAX, &a->bytes, e) ||
        jsonio_int(o, file, path, "lower_bound_bytes", 0, JSONIO_INT_MAX, &a->lower_bound_bytes,
                   e) ||
        jsonio_int_opt(o, file, path, "host_bytes", 0, JSONIO_INT_MAX, &a->host_bytes, e) ||
        proven_from_json(o, file, path, a, e))
        return e->code;
    const cJSON *list = jsonio_array(o, file, path, "objects", sub, e);
    if (list == NULL)
        return e->code;
    a->n = cJSON_GetArraySize(list);
    a->objects = calloc((size_t)(a->n ? a->n : 1), sizeof *a->objects);
    if (a->objects == NULL)
        return err_set(e, ERR_FAIL, "%s: out of memory", file);
    int i = 0;
    for (const cJSON *it = list->child; it != NULL; it = it->next, i++) {
        char ip[JSONIO_PATH_MAX];
        jsonio_path_index(ip, sub, i);
        if (object_from_json(it, file, ip, &a->objects[i], e)) {
            arena_free(a);
            return e->code;
        }
    }
    int64_t lb = arena_lower_bound(a->objects, a->n);
    if (lb != a->lower_bound_bytes || arena_check(a, e)) {
        if (lb != a->lower_bound_bytes)
            err_set(e, ERR_INPUT, "%s: %s.lower_bound_bytes: %lld, but its objects give %lld",
                    file, path, (long long)a->lower_bound_bytes, (long long)lb);
        else {
            char why[ERR_MSG_MAX];
            snprintf(why, sizeof why, "%s", e->msg);
            err_set(e, ERR_INPUT, "%s: %s: %s", file, path, why);
        }
        arena_free(a);
        return ERR_INPUT;
    }
    return ERR_OK;
}
