/* Measured profiles: every planning layer of a model run through the runtime's backend table
 * (runtime/backend.h: the very layer code `ballast train` runs) on arenas carved by
 * runtime/layout.c, timed, and its memory measured by scanning the arenas.
 *
 * Time: the layers run by the runtime's executor (runtime/exec.h, the loop `train` runs) as a
 * one-stage pipeline runs a micro-batch, forward through them in order and backward in reverse (in groups of consecutive layers whose arenas fit
 * `budget_bytes`; all of them when they fit), and just before a layer's backward one of its
 * recompute options, in turn; `warmup` untimed passes, then enough timed ones that every
 * forward, backward and option is timed at least `repeats` times; the profile keeps medians.
 * Each span is timed by `timer` (CUDA events) where given, else by the host's monotonic clock
 * around `sync` (exact on the CPU, whose calls return when their work is done).
 *
 * Memory: each layer runs as a one-layer stage (its output goes to the send buffer, as a
 * stage's last layer's does; its input and its output's gradient arrive as a neighbour's
 * would) on arenas that, with a guard band past each, are filled with a poison word (a
 * signalling NaN, which arithmetic never produces and no token id equals) and downloaded after
 * each step. A 64-byte line (SIZES_ALIGN, the carving's unit) counts as used when some word of
 * it no longer holds the poison. Per layer:
 *   act_bytes        slot lines holding data by the end of the backward, the layer keeping
 *                    everything (its input, as it arrived, and what the forward keeps);
 *   ckpt_bytes       slot lines after the forward, the layer recomputed whole (its input);
 *   options          per recompute option, the slot lines after the forward (kept_bytes) and
 *                    the transient lines the recompute writes (transient_bytes);
 *   out_bytes        bytes the forward writes to the workspace (its output, sent on); the
 *                    head sends nothing on and reports the loss's 4 bytes, as sizes.c does;
 *   workspace_bytes  workspace lines used from the forward to the end of the backward
 *                    (output, arriving gradient, the backward's scratch);
 *   state_bytes      the persistent lines one AdamW step over the layer touches: a NaN put in
 *                    every gradient reaches each weight, m and v the update reads it for, so
 *                    weights, gradients, m and v each count the lines that changed.
 * Every recompute (whole, each option) must regenerate bit for bit what the forward left in
 * the transient. These are what the runtime touches, not what sizes.c says; every difference
 * from the size functions is reported. */
#ifndef BALLAST_MEASURE_H
#define BALLAST_MEASURE_H

#include <stdio.h>

#include "backend.h"
#include "err.h"
#include "model.h"
#include "profile.h"

/* A device timer: the device time of the work queued between start and stop. */
struct measure_timer {
    const char *name;
    int (*start)(struct measure_timer *t, struct err *e);
    int (*stop)(struct measure_timer *t, double *ms, struct err *e);
    void *impl;
};

struct measure_options {
    int repeats;    /* timed samples of each span, at least 1 */
    int warmup;     /* untimed passes before them */
    int64_t budget_bytes; /* arenas of the layers timed together, at most (one layer at least) */
    FILE *progress; /* a terminal to draw a progress bar on, or NULL */
    FILE *report;   /* where differences from the size functions are written, or NULL */
    struct measure_timer *timer; /* CUDA events, or NULL: the host clock around `sync` */
};

/* Measures every layer of `m` on the backend and fills out->layers, out->model and
 * out->estimated (0); the caller fills out->device and adds the host to out->provenance
 * (created here when NULL). *mismatches counts the byte counts that differ from the size
 * functions (each one written to o->report). out is the caller's to profile_free. */
int measure_profile(struct backend *be, const struct model *m, const struct measure_options *o,
                    struct profile *out, int *mismatches, struct err *e);

/* The device's link to host memory, each way: what offload's copies take (backend.h's
 * copy_async, on its copy lanes: the copy threads' memcpy on the CPU, pinned buffers and a
 * copy stream per direction on CUDA). latency_us: the median of small copies; gbps: bytes
 * over the median time of `bytes`-sized copies less that latency, in the slower direction. */
int measure_host_link(struct backend *be, int64_t bytes, int repeats, double *gbps,
                      double *latency_us, struct err *e);

#endif
