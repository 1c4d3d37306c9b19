/* Chrome trace files (the Trace Event Format that Perfetto and chrome://tracing open): named
 * tracks and complete slices on them. `ballast simulate` writes its simulated timeline with
 * it; `ballast train` its measured one.
 *
 * A track is a (pid, tid) pair; tracks appear in the order they are named. Slices on one
 * track must nest or follow each other (the format's rule for "X" events). Times are given
 * in milliseconds and written in microseconds, as the format wants. */
#ifndef BALLAST_TRACE_H
#define BALLAST_TRACE_H

#include "err.h"

struct trace;

/* A number attached to a slice (shown in the viewer's details pane). */
struct trace_arg {
    const char *key;
    double value;
};

/* NULL when out of memory. */
struct trace *trace_init(void);
void trace_free(struct trace *t);

void trace_name_process(struct trace *t, int pid, const char *name);
void trace_name_track(struct trace *t, int pid, int tid, const char *name);
/* A slice `name` of category `cat` from start_ms lasting dur_ms, with n_args numbers. */
void trace_add_slice(struct trace *t, int pid, int tid, const char *name, const char *cat,
                     double start_ms, double dur_ms, const struct trace_arg *args, int n_args);

/* Writes {"traceEvents": [...], "displayTimeUnit": "ms"} to `file`. Fails (ERR_FAIL) if any
 * earlier call ran out of memory, so callers need not check each one. */
int trace_write(const struct trace *t, const char *file, struct err *e);

#endif
