/* One pipeline stage: its arenas, its layers and the executor of one training step.
 *
 * The executor runs the stage's schedule (schedule.h) through the backend and transport
 * tables. Activations of micro-batch m arrive in (or, on stage 0, are drawn into) slot
 * m mod in_flight; each layer's forward writes its output straight into the next layer's
 * checkpoint in the slot, the stage's last layer into the workspace's `out`, which is sent on
 * without waiting. A recomputed layer keeps in the slot only what it does not regenerate (its
 * checkpoint when recomputed whole) and regenerates the rest into the transient just before
 * its backward. Backward hands the gradient from
 * layer to layer through the workspace and sends the first layer's `dinp` back.
 *
 * Memory actually live is counted as buffers are taken and released, and its high-water mark
 * is `peak_bytes`:
 *   persistent   always;
 *   slot         from the moment its micro-batch's input is posted for receipt (or drawn)
 *                until that micro-batch's backward ends;
 *   transient    what the running recomputed layer regenerates, while it runs (first forward,
 *                or recompute and backward);
 *   workspace    the union of the regions in use: the running backward's workspace (all of
 *                the layer's but `out`, and the head's `losses`), a forward's `out` (the
 *                head's `losses`), and regions whose send has not completed. A region is not
 *                reused before its send completes; the next backward does not wait for the
 *                last forward's `out` to be sent, since it does not touch it. */
#ifndef BALLAST_STAGE_H
#define BALLAST_STAGE_H

#include <stdint.h>

#include "backend.h"
#include "cluster.h"
#include "data.h"
#include "layout.h"
#include "schedule.h"
#include "transport.h"

struct stage_config {
    const struct model *model;
    int stage, n_stages, micro_batches;
    enum schedule schedule;
    int first, last;
    const uint32_t *regen; /* per layer of the stage, the kept tensors it regenerates
                              (layout_regen); NULL: none */
    int in_flight;
    struct adamw_params adamw;
    int64_t limit_bytes, reserve_bytes; /* the arenas must fit limit - reserve */
    int record_events;
};

/* Milliseconds spent in one step. */
struct stage_times {
    double fwd, bwd, recompute, send, idle, optimizer;
};

enum stage_event_kind {
    STAGE_EV_FORWARD,
    STAGE_EV_RECOMPUTE,
    STAGE_EV_BACKWARD,
    STAGE_EV_SEND,
    STAGE_EV_RECV, /* waiting for data: idle */
    STAGE_EV_OPTIMIZER,
    STAGE_EV_KINDS
};

struct stage_event {
    int32_t kind, step, micro, layer; /* layer -1: the whole stage */
    double t0_ms, t1_ms;              /* since the runner's origin */
};

#define STAGE_WS_REGIONS 8

struct stage_ws_region {
    int used;
    int64_t off, len; /* bytes of the workspace */
    int req;          /* transfer in flight, -1 none */
};

struct stage_runner {
    struct stage_config c;
    struct stage_layout lay;
    struct backend *be;
    struct transport *tp;
    const struct data_source *data;
    char *persistent, *activations, *transient, *workspace; /* backend memory, owned */
    int32_t *host_tokens, *host_targets;                    /* (B,T) staging */
    float *host_losses;                                     /* (B,T) staging */
    struct schedule_op *ops;                                /* 2M */
    double *mb_loss;                                        /* last stage: M */
    int *slot_req;                                          /* per slot, -1 none */
    struct stage_ws_region ws[STAGE_WS_REGIONS];
    int64_t live, peak, ws_live;
    struct stage_times times; /* of the last step */
    struct stage_event *events;
    int n_events, cap_events;
    double origin_ms;
    int64_t step;
};

/* Lays out and allocates the stage (ERR_NOFIT, naming the layer, if it does not fit),
 * weights drawn from `seed` by global layer index, optimizer state zero. */
int stage_init(struct stage_runner *r, const struct stage_config *c, struct backend *be,
               struct transport *tp, const struct data_source *data, uint64_t seed,
               struct err *e);
void stage_free(struct stage_runner *r);

/* Sets the zero of event times (call after a barrier on every rank). */
void stage_set_origin(struct stage_runner *r);

/* Runs step `step` (0-based; AdamW's t is step + 1). On the last stage *loss is the step's
 * mean loss (micro-batch means summed in order 0..M-1, over M); elsewhere it is untouched. */
int stage_step(struct stage_runner *r, int64_t step, double *loss, struct err *e);

/* The persistent arena (weights | gradients | m | v) as host bytes, in chunks, for
 * checkpoints: `get` downloads [off, off+n) into buf, `put` uploads. */
int stage_state_get(struct stage_runner *r, int64_t off, void *buf, int64_t n, struct err *e);
int stage_state_put(struct stage_runner *r, int64_t off, const void *buf, int64_t n,
                    struct err *e);

double stage_now_ms(void);

#endif
