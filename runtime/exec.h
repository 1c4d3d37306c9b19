/* The executor: one stage's micro-batches through its layers, in the schedule's order
 * (schedule.h), through the backend table. `train` (stage.c) and the profiler (measure.c) both
 * run it; what differs between them is behind two tables:
 *
 *   port     where the stage's data comes from and goes: the data set and the transport
 *            (stage.c), or the profiler's host buffers;
 *   actions  per layer, what it keeps between its forward and its backward and how it gets it
 *            back, at the hook points before_forward, after_forward, prefetch (ahead of the
 *            layer's backward), before_backward and after_backward, composed per layer from
 *            parts (struct exec_hooks): none keeps everything; exec_recompute keeps what the
 *            layout leaves in the slot and reruns the forward into the transient in
 *            before_backward; exec_offload sends tensors to host memory and back.
 *
 * Activations of micro-batch m live in slot m mod in_flight; each layer's forward writes its
 * output straight into the next layer's checkpoint in the slot, the last layer (unless it is
 * the head) into the workspace's `out`, which is sent on without waiting. Backward hands the
 * gradient from layer to layer through the workspace; a stage that does not start with the
 * embedding sends its first layer's `dinp` back.
 *
 * Memory actually live is counted as buffers are taken and released, and its high-water mark
 * is `peak`:
 *   persistent   always;
 *   slot         from the moment its micro-batch's input is posted for receipt (or drawn)
 *                until that micro-batch's backward ends (the port counts it in);
 *   transient    what the running recomputed layer regenerates, while it runs (first forward,
 *                or recompute and backward);
 *   workspace    the union of the regions in use: the running backward's workspace (all of
 *                the layer's but `out`, and the head's `losses`), a forward's `out` (the
 *                head's `losses`), and regions whose send has not completed. A region is not
 *                reused before its send completes; the next backward does not wait for the
 *                last forward's `out` to be sent, since it does not touch it.
 *   staging      offload's staging buffers (layout.h): always, like persistent.
 * Host memory (off.host_peak, times.host_peak per step) counts a layer's offloaded bytes from
 * its copy out to the end of its backward: at most in_flight x the host slot.
 *
 * Offload (exec_offload, alone or around exec_recompute): a layer's forward writes its offloaded
 * tensors into a staging buffer (claimed at its forward, or before the previous layer's when
 * that writes an offloaded input),
 * after_forward copies them to the micro-batch's host slot and the buffer is free once the
 * copy is; the prefetch, started at its trigger (layer_layout.ahead), copies them
 * back into a staging buffer (after the copy out, when the trigger comes first), and
 * before_backward waits for it, late or not; after_backward frees the buffer. With the plan's
 * arena there is no pool: each layer's micro-batch has a forward and a backward staging object
 * at the plan's offsets (arena.h), in use over the plan's lifetimes; the forward's copy out is
 * waited for when its object's lifetime ends, and a prefetch starts no earlier than its
 * backward object's lifetime begins.
 *
 * Every forward, recompute and backward is a span timed by the host clock around the
 * backend's sync, or by the config's device timer; each is reported to on_span and, with
 * record_events, kept as an event. */
#ifndef BALLAST_EXEC_H
#define BALLAST_EXEC_H

#include <stdint.h>

#include "backend.h"
#include "layout.h"
#include "schedule.h"

enum stage_event_kind {
    STAGE_EV_FORWARD,
    STAGE_EV_RECOMPUTE,
    STAGE_EV_BACKWARD,
    STAGE_EV_SEND,
    STAGE_EV_RECV, /* waiting for data: idle */
    STAGE_EV_OPTIMIZER,
    STAGE_EV_STALL,       /* waiting for an offload copy, or for the host optimizer's weights */
    STAGE_EV_COPY_OUT,    /* a copy to host memory, on its lane (the trace's, not the step's) */
    STAGE_EV_COPY_IN,     /* a copy (prefetch) from host memory, on its lane */
    STAGE_EV_HOST_UPDATE, /* the host optimizer's AdamW of one layer, on its own thread */
    STAGE_EV_WEIGHT,      /* a split backward's weight pass (schedule.h) */
    STAGE_EV_KINDS
};

struct stage_event {
    int32_t kind, step, micro, layer; /* layer -1: the whole stage */
    double t0_ms, t1_ms;              /* since the runner's origin */
};

/* Milliseconds spent in one step (host_peak includes the host optimizer's mirror). Offload: `stall` the compute waited for copies (a late
 * prefetch, or a staging buffer still being copied out), copy[dir] each copy lane's busy
 * time, late_prefetches the prefetches that had not arrived when their backward wanted them,
 * host_peak the most bytes offloaded at once. */
struct stage_times {
    double fwd, bwd, recompute, send, idle, optimizer;
    double stall, copy[2];
    double host_update; /* the host optimizer's AdamW, layer by layer, as it finished */
    int late_prefetches;
    int64_t host_peak;
};

/* sum += t over the timed spans (fwd .. host_update); the counts and peaks are not sums. */
void stage_times_add(struct stage_times *sum, const struct stage_times *t);

struct executor;
struct arena_run; /* arena_run.h */

/* One part of what a layer does with its memory; each hook may be NULL; `li` is the layer's
 * index in the stage. */
struct exec_action {
    const char *name;
    int (*before_forward)(struct executor *x, int li, int micro, struct err *e);
    int (*after_forward)(struct executor *x, int li, int micro, struct err *e);
    int (*prefetch)(struct executor *x, int li, int micro, struct err *e);
    /* v: the layer's tensors for this micro-batch, its output gradient in place */
    int (*before_backward)(struct executor *x, int li, int micro, const struct layer_view *v,
                           struct err *e);
    int (*after_backward)(struct executor *x, int li, int micro, struct err *e);
};

extern const struct exec_action exec_recompute, exec_offload, exec_stream;

/* A layer's parts, outermost first (exec_init: offload, then recompute; none: the layer keeps
 * everything). before_forward, prefetch and before_backward run outermost first,
 * after_forward and after_backward innermost first, so that each part finds the layer as the
 * parts around it leave it: a layer recomputed from tensors that come back from host memory
 * waits for them before it reruns, and frees its transient before they go. */
#define EXEC_PARTS_MAX 3
struct exec_hooks {
    const struct exec_action *part[EXEC_PARTS_MAX];
    int n;
};

struct exec_port {
    /* The micro-batch's input into the first layer's checkpoint (tokens or an activation),
     * and the targets into the head's when the stage has it; counts the slot live
     * (exec_mem_add) if it is not yet. */
    int (*input)(struct executor *x, int micro, struct err *e);
    /* The gradient of the stage's output (not on the head's stage) into `dst`. */
    int (*output_grad)(struct executor *x, int micro, void *dst, struct err *e);
    /* Sends `bytes` at `buf` to stage `peer`; NULL: nothing is sent, the region is free at
     * once. */
    int (*isend)(struct executor *x, const void *buf, int64_t bytes, int peer, int micro,
                 int *req, struct err *e);
    int (*wait)(struct executor *x, int req, struct err *e);
    /* After micro-batch `micro`'s backward and its send, its slot free again; may be NULL. */
    int (*backward_done)(struct executor *x, int micro, struct err *e);
    /* The optimizer on the host (hostmirror.h); may be NULL. Before layer li's first forward
     * of the step (its weights must be the updated ones), and after its last backward (its
     * gradients are complete). */
    int (*first_forward)(struct executor *x, int li, struct err *e);
    int (*last_backward)(struct executor *x, int li, struct err *e);
};

struct exec_config {
    const struct model *model;
    const struct stage_layout *lay;
    char *persistent, *activations, *transient, *workspace; /* backend memory, the caller's */
    /* the plan's reuse layout: `activations` is the one arena, `workspace` its workspace
     * object and `transient` unused; NULL: the slots carving */
    struct arena_run *arena;
    struct backend *be;
    const struct exec_port *port;
    void *ctx; /* the caller's, for its hooks */
    enum schedule schedule;
    /* the schedule's ops (this GPU's of n_stages, with the layout's chunks); the loss's 1/M */
    int stage, n_stages, micro_batches;
    int64_t limit_bytes;                /* more live is a bug in the accounting */
    /* Offload (the layout's offload masks): the staging buffers (backend memory, live
     * always) and the host slots (host_alloc), the caller's; per layer, how many layer-ops
     * ahead of its backward its prefetch starts (< 1: 1), growing by one after a late
     * prefetch up to prefetch_depth (the staging buffers' room); host bytes beyond
     * host_limit_bytes (< 0: none) fail. The trigger is the layout's (layer_layout.ahead). */
    char *staging, *host;
    /* Streamed weights (exec_stream.c; layout.h): the device's weights buffers (the layout's
     * n_wbuf), the streamed layers' weights in host memory from the weights section's
     * dev_weights_bytes on, and their gradients' landing from the fp32 section's host_lo on
     * (the host mirror's, hostmirror.h) */
    char *wbufs, *host_weights, *host_landing;
    int prefetch_depth;
    int64_t host_limit_bytes;
    int record_events;
    /* a device timer for the spans; NULL: the host clock around sync */
    int (*timer_start)(struct executor *x, struct err *e);
    int (*timer_stop)(struct executor *x, double *ms, struct err *e);
    /* every forward, recompute and backward span, as it ends; may be NULL */
    void (*on_span)(struct executor *x, int kind, int micro, int li, double ms);
};

/* Workspace regions in use at once: the running layer's, and each chunk's output and input
 * gradient on their way (schedule.h) */
#define EXEC_WS_REGIONS (4 + 2 * SCHEDULE_CHUNKS_MAX)

struct exec_ws_region {
    int used;
    int64_t off, len; /* bytes of the workspace */
    int req;          /* transfer in flight, -1 none */
};

/* A staging buffer: free, written by a forward, being copied out, or prefetched for (and
 * then read by) a backward. */
enum { STG_FREE, STG_FWD, STG_OUT, STG_IN };

struct exec_staging {
    int state, ev;  /* ev: the copy out or in */
    int li, micro;  /* whose tensors it holds */
};

/* Offload's state (exec.c). Layer-ops: every layer's forward or backward, in the stage's
 * order; op i's layer li is layer-op i x n + li (forward) or i x n + n - 1 - li (backward). */
struct exec_offload {
    struct exec_staging *buf; /* lay->n_staging */
    /* per layer li and micro-batch m, at [li x M + m]: the staging buffer holding its
     * offloaded tensors (-1 none); its copy out this step (-1 not yet); a prefetch asked
     * before that copy */
    int *held, *out_ev;
    unsigned char *pending;
    int *ahead; /* per layer */
    int *first, *next; /* prefetches to start at each layer-op: lists of backward layer-ops */
    int lop;           /* the layer-op running */
    int *outs, n_outs; /* with the plan's arena: forward staging objects being copied out */
    int64_t host_live, host_peak;
    /* with record_events: the step's copies (2 x layers x M at most), timed at its end */
    struct exec_copy {
        int ev, li, micro, dir;
    } *copies;
    int n_copies;
};

/* Streamed weights' state (exec_stream.c), by the offload's layer-ops: a layer's weights come
 * into a buffer at the layer-op before its use (at its own for the step's first), a backward's
 * gradients too (zeroed for the layer's first backward of the step), and a backward's go back
 * to the host after it. */
struct exec_stream {
    struct exec_wbuf {
        int state; /* STG_FREE, STG_IN (fetched for held layer-op lop), STG_OUT */
        int lop, li, ev_w, ev_g, ev_out;
    } *buf;
    int *held;             /* per layer-op of the step: its buffer, -1 none */
    int *out_ev;           /* per layer: its gradients' last copy out, -1 none */
    unsigned char *summed; /* per layer: a backward this step (its gradients come in) */
    /* per layer: a backward's buffer whose gradients wait for the layer's backward running
     * now to send its own (the next layer-op is the same layer's: a stage of one layer), -1 */
    int *waiting;
    int lop;               /* the layer-op running */
};

struct executor {
    struct exec_config c;
    struct exec_offload off;
    struct exec_stream stream;
    struct exec_hooks *hooks;          /* per layer, from its layout (exec_init) */
    struct schedule_op *ops;           /* n_ops, schedule_ops' */
    int n_ops, chunk;                  /* chunk: the running op's */
    int splits;                        /* the schedule splits the backward (weight passes) */
    struct layer_wgrad *wgrad;         /* per layer and slot: what B leaves W (splits) */
    int wgrad_slots;                   /* the chunks' most in flight */
    double *mb_loss;                   /* head's stage: M */
    float loss_scale; /* the backward starts from the loss times this (fp16's dynamic loss
                         scale, lossscale.h); 1 unless the caller sets it */
    float *host_losses;                /* (B,T) staging */
    struct exec_ws_region ws[EXEC_WS_REGIONS];
    int64_t live, peak, ws_live; /* with an arena, peak is persistent + its highest byte in
                                    use at once */
    int phase;                   /* ARENA_FORWARD or ARENA_BACKWARD: the op running */
    int op, first_forward_op; /* the op running; the step's first forward */
    /* per chunk: its last op that touches the gradients (B, or W where the backward splits),
     * whose layers' gradients are final as it passes them (exec_port.last_backward) */
    int last_grads_op[SCHEDULE_CHUNKS_MAX];
    struct stage_times times; /* of the last step */
    struct stage_event *events;
    int n_events, cap_events;
    double origin_ms;
    int64_t step;
};

int exec_init(struct executor *x, const struct exec_config *c, struct err *e);
void exec_free(struct executor *x);

/* Runs the schedule's 2M operations of step x->step, then waits for every send. */
int exec_run(struct executor *x, struct err *e);

/* For ports and actions. */
int exec_mem_add(struct executor *x, int64_t delta, struct err *e);
/* Waits for transfer `req`, the wait an event of `kind`. */
int exec_wait(struct executor *x, int req, int kind, int micro, struct err *e);
void exec_event(struct executor *x, int kind, int micro, int layer, double t0, double t1);
/* The same for another step than the running one (work that ends in the next step). */
void exec_event_at(struct executor *x, int kind, int64_t step, int micro, int layer, double t0,
                   double t1);
/* Host memory beside the offloaded tensors (the host optimizer's mirror): live always,
 * counted in the host peak and against host_limit_bytes. */
void exec_host_resident(struct executor *x, int64_t bytes);
/* With an arena, object (kind, micro, li) of the running phase comes into use (exec_arena_in)
 * or goes out of use; nothing without one. */
int exec_arena_in(struct executor *x, int kind, int micro, int li, struct err *e);
void exec_arena_out(struct executor *x, int kind, int micro, int li);
/* Layer li's tensors for micro-batch `micro` (its slot). */
void exec_view(const struct executor *x, int li, int micro, struct layer_view *v);
/* Compute waiting for copy `ev` of layer li's tensors (a stall event when late: *late), and
 * a copy submitted this step noted for the trace: for the parts. */
int exec_copy_wait(struct executor *x, int ev, int li, int micro, int *late, struct err *e);
void exec_copy_note(struct executor *x, int ev, int li, int micro, int dir);
/* exec_stream.c: set-up and release, the start of a step and of each layer-op, a streamed
 * layer's view, the step's copies out awaited, and layer li's last gradient copy out (-1:
 * none). */
int exec_stream_init(struct executor *x, struct err *e);
void exec_stream_free(struct executor *x);
void exec_stream_begin_step(struct executor *x);
int exec_stream_tick(struct executor *x, struct err *e);
void exec_stream_view(const struct executor *x, int li, struct layer_view *v);
int exec_stream_drain(struct executor *x, struct err *e);
int exec_stream_out_event(const struct executor *x, int li);
/* Runs the layer's recompute of `v` as a timed span. */
int exec_recompute_span(struct executor *x, int li, int micro, const struct layer_view *v,
                        struct err *e);

/* An activation (B,T,C) or its gradient: what crosses between stages. */
int64_t exec_boundary_bytes(const struct model *m);

double exec_now_ms(void);

#endif
