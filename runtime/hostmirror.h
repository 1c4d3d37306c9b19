/* The optimizer on the host (a plan stage's "optimizer": "host"): the device keeps the
 * weights and the fp32 gradients (layout_spec's optimizer), a host mirror holds the fp32
 * master weights, AdamW's m and v and a landing section for the gradients, and AdamW runs on
 * the stage's own host thread, layer by layer:
 *   1. after a layer's last backward of the step, its gradients go down on the backend's
 *      copy lane (copy_async, to host) into the landing section;
 *   2. once they have landed, the host thread steps the layer (adamw_update: the arithmetic
 *      and element order of the CPU backend's device step, so weights stay bitwise equal)
 *      and, for a 16-bit model, rounds the master weights into the layer's landing range;
 *   3. the new weights go up (copy_async, from host) as soon as the main thread sees the
 *      update done, and the layer's first forward of the next step waits for them (a stall
 *      when late), then zeroes the layer's gradients for the new step.
 * A streamed layer (layout.h) sends its gradients to the landing after each backward
 * (exec_stream.c): its step waits for the last of those, and its update writes its weights
 * into the mirror's copy of them, from where each use fetches them. 
 * Every backend call stays on the stage's thread, which drives the hand-offs at each layer's
 * hooks; the host thread touches host memory only. On CUDA the mirror is pinned host memory
 * and the copies run on the copy streams, so only the hand-off to the host thread waits on
 * the host for a copy (its event is polled), never the compute stream. */
#ifndef BALLAST_HOSTMIRROR_H
#define BALLAST_HOSTMIRROR_H

#include <pthread.h>
#include <stdint.h>

#include "backend.h"
#include "exec.h"
#include "layout.h"

struct hostmirror_done {
    int li;
    int64_t step;
    double t0, t1;
};

struct hostmirror {
    struct backend *be;
    const struct stage_layout *lay;
    char *persistent; /* the device's weights | gradients */
    char *mem;        /* master | m | v | landing: host_alloc, owned */
    struct adamw_params adamw;
    int threads;
    /* per layer: where its update stands (hostmirror.c), its copies' events, its step and
     * that step's AdamW t */
    int *state, *down_ev, *up_ev, *t;
    int64_t *step;
    /* the host thread's queue of layers, and the updates it finished (under mu) */
    pthread_t thread;
    int started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int *queue, q_head, q_len;
    struct hostmirror_done *done;
    int n_done;
};

/* Allocates the zeroed mirror (lay->mirror_bytes) and starts the host thread, whose AdamW
 * uses `threads` OpenMP threads. */
int hostmirror_init(struct hostmirror *h, struct backend *be, const struct stage_layout *lay,
                    char *persistent, const struct adamw_params *p, int threads, struct err *e);
/* Waits for the copies and the update in flight, stops the thread, frees the mirror. */
void hostmirror_free(struct hostmirror *h);

/* After layer li's last backward of step `step` (0-based), whose AdamW step is t (from 1). */
int hostmirror_grads_done(struct hostmirror *h, struct executor *x, int li, int64_t step, int t,
                          struct err *e);
/* Before layer li's first forward: its updated weights in place, its gradients zeroed. */
int hostmirror_weights_ready(struct hostmirror *h, struct executor *x, int li, struct err *e);
/* Every update finished and its weights on the device (before reading or writing state). */
int hostmirror_drain(struct hostmirror *h, struct executor *x, struct err *e);
/* Streamed weights (layout.h): the landing section's start (the gradients of the section's
 * byte host_lo), and the host's copy of the streamed layers' weights (the weights section's
 * byte dev_weights_bytes), which a streamed layer's update writes. */
char *hostmirror_landing(const struct hostmirror *h);
char *hostmirror_weights(const struct hostmirror *h);

#endif
