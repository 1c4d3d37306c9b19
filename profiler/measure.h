/* Measured profiles: every planning layer of a model run through the runtime's backend table
 * (runtime/backend.h: the very layer code `ballast train` runs) on arenas carved by
 * runtime/layout.c, timed, and its memory measured by scanning the arenas.
 *
 * Each layer runs as a one-layer stage (its output goes to the workspace's send buffer, as a
 * stage's last layer does; its input and its output's gradient arrive as a neighbour's
 * would), once laid out keeping its activations and once recomputed.
 *
 * Time: the layers run as a one-stage pipeline runs a micro-batch, forward through them in
 * order and backward in reverse (in groups of consecutive layers whose arenas fit
 * `budget_bytes`, all of them when they fit), `warmup` untimed passes, then `repeats` timed
 * ones; fwd_ms and bwd_ms are each layer's medians. Each span is timed by the backend's device
 * timer (CUDA events) where it has one, else by the host's monotonic clock around `sync`
 * (exact on the CPU, whose calls return when their work is done).
 *
 * Memory: every arena, and a guard band past its end, is filled with a poison word (a
 * signalling NaN, which no arithmetic produces and no token id equals) and downloaded after
 * each step. A 64-byte line (SIZES_ALIGN, the carving's unit) counts as used when some word
 * of it no longer holds the poison. Per layer:
 *   act_bytes        lines of the activation slot holding data after the forward, the layer
 *                    kept (its input, as it arrived, and what the forward keeps);
 *   ckpt_bytes       the same, the layer laid out recomputed (the slot keeps its input only);
 *                    what the recompute then regenerates into the transient is checked to be
 *                    act - ckpt and bitwise what the forward left there;
 *   out_bytes        bytes the forward writes to the workspace (its output, sent on); the
 *                    head sends nothing on and reports the loss's 4 bytes, as sizes.c does;
 *   workspace_bytes  lines of the workspace used from the forward to the end of the backward
 *                    (output, arriving gradient, the backward's scratch);
 *   state_bytes      the persistent arena one AdamW step over the layer touches: a NaN put in
 *                    every gradient reaches each weight, m and v that the update reads it for,
 *                    so weights, gradients, m and v each count the lines that changed.
 * These are what the runtime touches, not what sizes.c says; every difference from the size
 * functions is reported. */
#ifndef BALLAST_MEASURE_H
#define BALLAST_MEASURE_H

#include <stdio.h>

#include "backend.h"
#include "err.h"
#include "model.h"
#include "profile.h"

struct measure_options {
    int repeats;    /* timed forward and backward passes, at least 1 */
    int warmup;     /* untimed pairs before them */
    int64_t budget_bytes; /* arenas of the layers timed together, at most (one layer at least) */
    FILE *progress; /* a terminal to draw a progress bar on, or NULL */
    FILE *report;   /* where differences from the size functions are written, or NULL */
};

/* Measures every layer of `m` on the backend and fills out->layers, out->model and
 * out->estimated (0); the caller fills out->device and adds the host to out->provenance
 * (created here when NULL). *mismatches counts the byte counts that differ from the size
 * functions (each one written to o->report). out is the caller's to profile_free. */
int measure_profile(struct backend *be, const struct model *m, const struct measure_options *o,
                    struct profile *out, int *mismatches, struct err *e);

#endif
