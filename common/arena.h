/* A stage's activation arena laid out by a reuse plan: every activation object of one step
 * (what it is, its bytes, its lifetime) and its offset in one arena. The planner lays the
 * objects out (planner/arena.h); the plan file carries the layout; the runtime carves the
 * arena from it (runtime/arena_run.h).
 *
 * Time is counted in ticks: op t of the stage's schedule (schedule.h, 2M ops) runs its n
 * layers as ticks t*n .. t*n+n-1, a forward layer li at t*n + li, a backward layer li at
 * t*n + (n-1-li). An object is live from tick `first` to tick `last`, both included; two
 * objects whose lifetimes share a tick must not share a byte.
 *
 * Objects (runtime/exec.h says when the executor touches them):
 *   kept       layer li's kept tensors of micro-batch m that it does not regenerate (the
 *              action row's kept_bytes): from the forward that writes them (layer li-1's
 *              forward writes layer li's input; the first layer's input is the receive
 *              buffer, live from when its receipt is posted; the head's targets are written
 *              as the micro-batch starts) to the end of layer li's backward
 *   transient  what a recomputed layer regenerates (transient_bytes), once in its forward
 *              and once in its backward: one tick each
 *   workspace  the largest workspace; it holds the send buffers too, and a send completes
 *              when the transport says, so it is live the whole step
 *   staging    an offloaded layer's tensors on the device (runtime/exec.h), two per
 *              micro-batch: the forward's, from the tick that writes them (layer li-1's when
 *              its input goes to the host too) to the tick after the forward, during which
 *              they are copied out (the runtime waits for the copy before the object ends);
 *              the backward's, from the furthest tick a prefetch may be triggered (the plan's
 *              largest prefetch_ahead, at least 1, layer-ops before the backward) to the end
 *              of the backward
 * A transient and a staging object have a phase (forward or backward); the others 0. */
#ifndef BALLAST_ARENA_H
#define BALLAST_ARENA_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "err.h"

enum arena_kind { ARENA_KEPT, ARENA_TRANSIENT, ARENA_WORKSPACE, ARENA_STAGING, ARENA_KINDS };
enum arena_phase { ARENA_FORWARD = 0, ARENA_BACKWARD = 1 };

#define ARENA_METHOD_MAX 16

struct arena_object {
    enum arena_kind kind;
    int micro, layer, phase; /* layer: global index; -1 and 0 where they do not apply */
    int64_t bytes;
    int first, last; /* ticks, inclusive */
    int64_t offset;  /* in the arena; -1: not placed */
};

struct arena {
    char method[ARENA_METHOD_MAX];
    int64_t bytes;             /* max offset + bytes */
    int64_t lower_bound_bytes; /* the most bytes live at one tick */
    int64_t host_bytes;        /* bytes of objects above the device cap (0: none or no cap) */
    int proven;                /* exact: optimality proven within its time limit; others 0
                                  (the plan's "proven") */
    const char *note;          /* what the method says of it (static text; not in the file) */
    double solve_ms;
    int n;
    struct arena_object *objects; /* owned */
};

const char *arena_kind_name(enum arena_kind k);
/* Whether objects of kind k come in a forward and a backward phase (transient, staging). */
int arena_kind_phased(enum arena_kind k);

void arena_free(struct arena *a);
/* A deep copy (objects duplicated). */
int arena_copy(struct arena *dst, const struct arena *src, struct err *e);

/* The most bytes live at one tick. */
int64_t arena_lower_bound(const struct arena_object *o, int n);
/* max offset + bytes of the placed objects. */
int64_t arena_extent(const struct arena_object *o, int n);
/* 1 when objects i and j are live at a common tick. */
int arena_lifetimes_meet(const struct arena_object *a, const struct arena_object *b);
/* ERR_FAIL naming the first two objects live at once that share a byte, or an object not
 * placed; ERR_OK otherwise. */
int arena_check(const struct arena *a, struct err *e);
/* The bytes of objects that end above `cap` (<= 0: no cap). */
int64_t arena_above_cap(const struct arena_object *o, int n, int64_t cap);

cJSON *arena_to_json(const struct arena *a);
/* Reads an arena object of a plan at `path`; checks offsets against bytes and overlaps. */
int arena_from_json(const cJSON *o, const char *file, const char *path, struct arena *a,
                    struct err *e);

#endif
