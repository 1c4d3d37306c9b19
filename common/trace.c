#include "trace.h"

#include <cjson/cJSON.h>
#include <stdlib.h>

#include "jsonio.h"

struct trace {
    cJSON *root;
    cJSON *events; /* root's "traceEvents" */
    int n_tracks;  /* sort index of the next track named */
    int failed;    /* an allocation failed: the trace is incomplete */
};

struct trace *trace_init(void)
{
    struct trace *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->root = cJSON_CreateObject();
    t->events = t->root ? cJSON_AddArrayToObject(t->root, "traceEvents") : NULL;
    if (t->events == NULL || cJSON_AddStringToObject(t->root, "displayTimeUnit", "ms") == NULL) {
        trace_free(t);
        return NULL;
    }
    return t;
}

void trace_free(struct trace *t)
{
    if (t == NULL)
        return;
    cJSON_Delete(t->root);
    free(t);
}

/* {"ph": ph, "pid": pid, "tid": tid, "name": name} appended to the events, or NULL. */
static cJSON *add_event(struct trace *t, const char *ph, int pid, int tid, const char *name)
{
    cJSON *ev = cJSON_CreateObject();
    if (ev == NULL || cJSON_AddStringToObject(ev, "ph", ph) == NULL ||
        cJSON_AddNumberToObject(ev, "pid", pid) == NULL ||
        (tid >= 0 && cJSON_AddNumberToObject(ev, "tid", tid) == NULL) ||
        cJSON_AddStringToObject(ev, "name", name) == NULL ||
        !cJSON_AddItemToArray(t->events, ev)) {
        cJSON_Delete(ev);
        t->failed = 1;
        return NULL;
    }
    return ev;
}

/* A metadata event ("ph": "M") whose args hold one string or one number. */
static void add_metadata(struct trace *t, int pid, int tid, const char *what, const char *key,
                         const char *text, int number)
{
    cJSON *ev = add_event(t, "M", pid, tid, what);
    cJSON *args = ev ? cJSON_AddObjectToObject(ev, "args") : NULL;
    if (args == NULL || (text ? cJSON_AddStringToObject(args, key, text)
                              : cJSON_AddNumberToObject(args, key, number)) == NULL)
        t->failed = 1;
}

void trace_name_process(struct trace *t, int pid, const char *name)
{
    add_metadata(t, pid, -1, "process_name", "name", name, 0);
}

void trace_name_track(struct trace *t, int pid, int tid, const char *name)
{
    add_metadata(t, pid, tid, "thread_name", "name", name, 0);
    add_metadata(t, pid, tid, "thread_sort_index", "sort_index", NULL, t->n_tracks++);
}

void trace_add_slice(struct trace *t, int pid, int tid, const char *name, const char *cat,
                     double start_ms, double dur_ms, const struct trace_arg *args, int n_args)
{
    cJSON *ev = add_event(t, "X", pid, tid, name);
    if (ev == NULL)
        return;
    cJSON *a = NULL;
    if (cJSON_AddStringToObject(ev, "cat", cat) == NULL ||
        cJSON_AddNumberToObject(ev, "ts", start_ms * 1e3) == NULL ||
        cJSON_AddNumberToObject(ev, "dur", dur_ms * 1e3) == NULL ||
        (a = cJSON_AddObjectToObject(ev, "args")) == NULL) {
        t->failed = 1;
        return;
    }
    for (int i = 0; i < n_args; i++)
        if (cJSON_AddNumberToObject(a, args[i].key, args[i].value) == NULL)
            t->failed = 1;
}

int trace_write(const struct trace *t, const char *file, struct err *e)
{
    if (t->failed)
        return err_set(e, ERR_FAIL, "%s: out of memory while recording the trace", file);
    return jsonio_write_compact(file, t->root, e);
}
