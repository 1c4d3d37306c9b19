#include "exec.h"

#include "arena_run.h"
#include "clock.h"
#include "gpt_layers.h"
#include "progress.h"

#include <stdlib.h>
#include <string.h>

void stage_times_add(struct stage_times *sum, const struct stage_times *t)
{
    sum->fwd += t->fwd;
    sum->bwd += t->bwd;
    sum->recompute += t->recompute;
    sum->send += t->send;
    sum->idle += t->idle;
    sum->optimizer += t->optimizer;
    sum->host_update += t->host_update;
    sum->stall += t->stall;
    sum->copy[0] += t->copy[0];
    sum->copy[1] += t->copy[1];
}

int64_t exec_boundary_bytes(const struct model *m)
{
    return (int64_t)m->micro_batch * m->seq_len * m->n_embd * sizes_act_elem_bytes(m->dtype);
}

/* ---- live memory ---- */

int exec_mem_add(struct executor *x, int64_t delta, struct err *e)
{
    x->live += delta;
    /* With an arena the slot is not one block: its objects come and go one by one, and the
     * peak is the arena's highest byte in use (exec_arena_in), inside the checked arena. */
    if (x->c.arena != NULL)
        return ERR_OK;
    if (x->live > x->peak)
        x->peak = x->live;
    /* The arenas were checked against the limit at start-up and nothing lives outside them,
     * so this can only fire on a bug in the accounting or the executor. */
    if (x->live > x->c.limit_bytes)
        return err_set(e, ERR_FAIL,
                       "internal: stage %d has %lld bytes live, over its limit %lld",
                       x->c.stage, (long long)x->live, (long long)x->c.limit_bytes);
    return ERR_OK;
}

static int arena_in(struct executor *x, int kind, int micro, int li, int phase, struct err *e)
{
    if (x->c.arena == NULL)
        return ERR_OK;
    ERR_TRY(arena_run_in(x->c.arena, kind, micro, li, phase, e));
    if (x->c.lay->persistent_bytes + x->c.arena->peak > x->peak)
        x->peak = x->c.lay->persistent_bytes + x->c.arena->peak;
    return ERR_OK;
}

int exec_arena_in(struct executor *x, int kind, int micro, int li, struct err *e)
{
    return arena_in(x, kind, micro, li, x->phase, e);
}

void exec_arena_out(struct executor *x, int kind, int micro, int li)
{
    if (x->c.arena != NULL)
        arena_run_out(x->c.arena, kind, micro, li, x->phase);
}

static int64_t ws_union(const struct executor *x)
{
    struct exec_ws_region s[EXEC_WS_REGIONS];
    int n = 0;
    for (int i = 0; i < EXEC_WS_REGIONS; i++)
        if (x->ws[i].used) {
            int j = n++;
            while (j > 0 && s[j - 1].off > x->ws[i].off) {
                s[j] = s[j - 1];
                j--;
            }
            s[j] = x->ws[i];
        }
    int64_t total = 0, end = 0;
    for (int i = 0; i < n; i++) {
        int64_t lo = s[i].off > end ? s[i].off : end, hi = s[i].off + s[i].len;
        if (hi > lo)
            total += hi - lo;
        if (hi > end)
            end = hi;
    }
    return total;
}

static int ws_update(struct executor *x, struct err *e)
{
    if (x->c.lay->n_chunks > 1) /* each chunk's workspace is its own, live always (exec_init) */
        return ERR_OK;
    int64_t u = ws_union(x);
    int rc = exec_mem_add(x, u - x->ws_live, e);
    x->ws_live = u;
    return rc;
}

int exec_wait(struct executor *x, int req, int kind, int micro, struct err *e)
{
    double t0 = exec_now_ms();
    ERR_TRY(x->c.port->wait(x, req, e));
    exec_event(x, kind, micro, -1, t0, exec_now_ms());
    return ERR_OK;
}

/* Claims [off, off+len) of the workspace, first waiting for any send still reading it. */
static int ws_take(struct executor *x, int64_t off, int64_t len, int *id, struct err *e)
{
    for (int i = 0; i < EXEC_WS_REGIONS; i++) {
        struct exec_ws_region *w = &x->ws[i];
        if (w->used && w->req >= 0 && w->off < off + len && off < w->off + w->len) {
            ERR_TRY(exec_wait(x, w->req, STAGE_EV_SEND, -1, e));
            w->used = 0;
        }
    }
    for (int i = 0; i < EXEC_WS_REGIONS; i++)
        if (!x->ws[i].used) {
            x->ws[i] = (struct exec_ws_region){1, off, len, -1};
            *id = i;
            return ws_update(x, e);
        }
    return err_set(e, ERR_FAIL, "internal: stage %d claims more than %d workspace regions",
                   x->c.stage, EXEC_WS_REGIONS);
}

static int ws_give(struct executor *x, int id, struct err *e)
{
    x->ws[id].used = 0;
    return ws_update(x, e);
}

/* Sends `bytes` from the start of region `id`; the region stays live until the send is done. */
static int ws_send(struct executor *x, int id, int64_t bytes, int peer, int micro,
                   struct err *e)
{
    if (x->c.port->isend == NULL)
        return ws_give(x, id, e);
    double t0 = exec_now_ms();
    ERR_TRY(x->c.be->ops->sync(x->c.be, e));
    ERR_TRY(x->c.port->isend(x, x->c.workspace + x->ws[id].off, bytes, peer, micro,
                             &x->ws[id].req, e));
    exec_event(x, STAGE_EV_SEND, micro, -1, t0, exec_now_ms());
    return ERR_OK;
}

static int ws_drain(struct executor *x, struct err *e)
{
    for (int i = 0; i < EXEC_WS_REGIONS; i++)
        if (x->ws[i].used && x->ws[i].req >= 0) {
            ERR_TRY(exec_wait(x, x->ws[i].req, STAGE_EV_SEND, -1, e));
            ERR_TRY(ws_give(x, i, e));
        }
    return ERR_OK;
}

/* ---- spans ---- */

static int span_begin(struct executor *x, double *t0, struct err *e)
{
    if (x->c.timer_start != NULL) {
        *t0 = exec_now_ms();
        return x->c.timer_start(x, e);
    }
    ERR_TRY(x->c.be->ops->sync(x->c.be, e));
    *t0 = exec_now_ms();
    return ERR_OK;
}

static int span_end(struct executor *x, int kind, int micro, int li, double t0, struct err *e)
{
    double t1, ms;
    if (x->c.timer_stop != NULL) {
        ERR_TRY(x->c.timer_stop(x, &ms, e));
        t1 = t0 + ms;
    } else {
        ERR_TRY(x->c.be->ops->sync(x->c.be, e));
        t1 = exec_now_ms();
        ms = t1 - t0;
    }
    exec_event(x, kind, micro, x->c.lay->layers[li].layer, t0, t1);
    progress_tick();
    if (x->c.on_span != NULL)
        x->c.on_span(x, kind, micro, li, ms);
    return ERR_OK;
}

int exec_recompute_span(struct executor *x, int li, int micro, const struct layer_view *v,
                        struct err *e)
{
    double t0;
    ERR_TRY(span_begin(x, &t0, e));
    ERR_TRY(backend_layers(x->c.be, v->model)[v->kind].recompute(x->c.be, v, e));
    return span_end(x, STAGE_EV_RECOMPUTE, micro, li, t0, e);
}

/* ---- actions ---- */

/* Layer li's parts' hook `name` (exec.h): outermost part first where `outer_first`,
 * innermost first otherwise; returns from the caller on an error. */
#define HOOKS(x, li, outer_first, name, ...)                                                   \
    do {                                                                                       \
        const struct exec_hooks *h_ = &(x)->hooks[li];                                         \
        for (int k_ = 0; k_ < h_->n; k_++) {                                                   \
            const struct exec_action *a_ = h_->part[(outer_first) ? k_ : h_->n - 1 - k_];      \
            if (a_->name != NULL)                                                              \
                ERR_TRY(a_->name(x, li, __VA_ARGS__));                                         \
        }                                                                                      \
    } while (0)

/* The regenerated tensors are live in the transient while the forward writes them and from
 * the rerun to the end of the backward. */
static int transient_in(struct executor *x, int li, int micro, struct err *e)
{
    ERR_TRY(exec_arena_in(x, ARENA_TRANSIENT, micro, li, e));
    return exec_mem_add(x, x->c.lay->layers[li].transient_bytes, e);
}

static int transient_out(struct executor *x, int li, int micro, struct err *e)
{
    exec_arena_out(x, ARENA_TRANSIENT, micro, li);
    return exec_mem_add(x, -x->c.lay->layers[li].transient_bytes, e);
}

static int rerun(struct executor *x, int li, int micro, const struct layer_view *v,
                 struct err *e)
{
    ERR_TRY(transient_in(x, li, micro, e));
    return exec_recompute_span(x, li, micro, v, e);
}

const struct exec_action exec_recompute = {
    .name = "recompute",
    .before_forward = transient_in,
    .after_forward = transient_out,
    .before_backward = rerun,
    .after_backward = transient_out,
};

/* ---- offload: staging buffers, copies, prefetch triggers ---- */

static int *off_at(const struct executor *x, int *a, int li, int micro)
{
    return &a[(size_t)li * (size_t)x->c.micro_batches + (size_t)micro];
}

/* Buffer b: of the pool, or with the plan's arena the staging object of cell b (below). */
static char *staging_of(const struct executor *x, int b)
{
    if (x->c.arena != NULL)
        return x->c.activations + arena_run_staging_at(x->c.arena, b / 2 / x->c.lay->n_layers,
                                                       b / 2 % x->c.lay->n_layers, b % 2);
    return x->c.staging + (int64_t)b * x->c.lay->staging_buf_bytes;
}

static char *host_of(const struct executor *x, int li, int micro)
{
    const struct stage_layout *lay = x->c.lay;
    return x->c.host + (int64_t)(micro % lay->in_flight) * lay->host_slot_bytes +
           lay->layers[li].host_off;
}

/* ---- offload on the plan's arena: each layer's micro-batch has its own two staging objects
 * (arena.h), buffer 2 x (micro x n + li) + phase, in use over the plan's lifetimes: the
 * forward's until the tick after its last, when its copy out must be done ---- */

static int arena_staging_get(struct executor *x, int li, int micro, int phase, int *out,
                             struct err *e)
{
    *out = 2 * (micro * x->c.lay->n_layers + li) + phase;
    if (x->off.buf[*out].state != STG_FREE)
        return err_set(e, ERR_FAIL, "internal: stage %d: layer %d's staging object for "
                       "micro-batch %d is taken twice", x->c.stage, x->c.lay->layers[li].layer,
                       micro);
    return arena_in(x, ARENA_STAGING, micro, li, phase, e);
}

/* The forward staging objects whose lifetime ends before layer-op `lop` (every one when
 * lop is past the step): their copies out finish, then they go out of use. */
static int arena_staging_expire(struct executor *x, int lop, struct err *e)
{
    struct exec_offload *o = &x->off;
    for (int i = 0; i < o->n_outs; i++) {
        struct exec_staging *b = &o->buf[o->outs[i]];
        int first, last, late;
        arena_run_staging_ticks(x->c.arena, b->micro, b->li, ARENA_FORWARD, &first, &last);
        if (last >= lop)
            continue;
        ERR_TRY(exec_copy_wait(x, b->ev, b->li, b->micro, &late, e));
        arena_run_out(x->c.arena, ARENA_STAGING, b->micro, b->li, ARENA_FORWARD);
        b->state = STG_FREE;
        o->outs[i--] = o->outs[--o->n_outs];
    }
    return ERR_OK;
}

/* A prefetch triggered at layer-op t starts no earlier than its staging object's lifetime. */
static int arena_trigger(const struct executor *x, int li, int micro, int t)
{
    int first, last;
    if (x->c.arena == NULL)
        return t;
    arena_run_staging_ticks(x->c.arena, micro, li, ARENA_BACKWARD, &first, &last);
    return t > first ? t : first;
}

/* A free staging buffer; else the one whose copy out started first, once it is done. With
 * the plan's arena: the object of layer li's micro-batch in `phase`. */
static int staging_get(struct executor *x, int li, int micro, int phase, int *out,
                       struct err *e)
{
    struct exec_offload *o = &x->off;
    int pick = -1, late;
    if (x->c.arena != NULL)
        return arena_staging_get(x, li, micro, phase, out, e);
    for (int b = 0; b < x->c.lay->n_staging; b++) {
        if (o->buf[b].state == STG_FREE) {
            *out = b;
            return ERR_OK;
        }
        if (o->buf[b].state == STG_OUT && (pick < 0 || o->buf[b].ev < o->buf[pick].ev))
            pick = b;
    }
    if (pick < 0)
        return err_set(e, ERR_FAIL, "internal: stage %d has all %d staging buffers in use",
                       x->c.stage, x->c.lay->n_staging);
    ERR_TRY(exec_copy_wait(x, o->buf[pick].ev, o->buf[pick].li, o->buf[pick].micro, &late, e));
    *out = pick;
    return ERR_OK;
}

/* A staging buffer for layer li's forward of `micro` when it offloads any of `which` and has
 * none yet: at its forward's start, or, when its input is offloaded, before the previous
 * layer writes that input. *claimed: whether it took one (the view changes). */
static int staging_claim(struct executor *x, int li, int micro, uint32_t which, int *claimed,
                         struct err *e)
{
    int *held = off_at(x, x->off.held, li, micro);
    *claimed = (x->c.lay->layers[li].offload & which) != 0 && *held < 0;
    if (!*claimed)
        return ERR_OK;
    ERR_TRY(staging_get(x, li, micro, ARENA_FORWARD, held, e));
    x->off.buf[*held].state = STG_FWD;
    return ERR_OK;
}

void exec_host_resident(struct executor *x, int64_t bytes)
{
    x->off.host_live += bytes;
    if (x->off.host_live > x->off.host_peak)
        x->off.host_peak = x->off.host_live;
}

static int host_add(struct executor *x, int64_t delta, struct err *e)
{
    struct exec_offload *o = &x->off;
    o->host_live += delta;
    if (o->host_live > o->host_peak)
        o->host_peak = o->host_live;
    if (o->host_live > x->times.host_peak)
        x->times.host_peak = o->host_live;
    if (x->c.host_limit_bytes >= 0 && o->host_live > x->c.host_limit_bytes)
        return err_set(e, ERR_NOFIT,
                       "stage %d: %lld bytes offloaded to host memory, over its "
                       "host_memory_bytes %lld",
                       x->c.stage, (long long)o->host_live, (long long)x->c.host_limit_bytes);
    return ERR_OK;
}

/* The step's copies as events on their lanes; all have finished or are about to (each
 * prefetch was waited for, and each follows its copy out). */
static int copy_events(struct executor *x, struct err *e)
{
    struct exec_offload *o = &x->off;
    for (int i = 0; i < o->n_copies && x->c.be->ops->copy_span != NULL; i++) {
        const struct exec_copy *c = &o->copies[i];
        double t0, t1;
        int known;
        ERR_TRY(x->c.be->ops->copy_span(x->c.be, c->ev, &t0, &t1, &known, e));
        if (known)
            exec_event(x, c->dir == BACKEND_TO_HOST ? STAGE_EV_COPY_OUT : STAGE_EV_COPY_IN,
                       c->micro, x->c.lay->layers[c->li].layer, t0, t1);
    }
    o->n_copies = 0;
    return ERR_OK;
}

static int prefetch_start(struct executor *x, int li, int micro, struct err *e)
{
    struct exec_offload *o = &x->off;
    int out_ev = *off_at(x, o->out_ev, li, micro), *held = off_at(x, o->held, li, micro);
    if (out_ev < 0) { /* the tensors have not left yet: follow them when they do */
        o->pending[(size_t)li * (size_t)x->c.micro_batches + (size_t)micro] = 1;
        return ERR_OK;
    }
    ERR_TRY(staging_get(x, li, micro, ARENA_BACKWARD, held, e));
    o->buf[*held].state = STG_IN;
    ERR_TRY(x->c.be->ops->copy_async(x->c.be, BACKEND_FROM_HOST, staging_of(x, *held),
                                     host_of(x, li, micro), x->c.lay->layers[li].offload_bytes,
                                     out_ev, &o->buf[*held].ev, e));
    exec_copy_note(x, o->buf[*held].ev, li, micro, BACKEND_FROM_HOST);
    return ERR_OK;
}

/* The start of the next layer-op: the prefetches triggered there. */
static int offload_tick(struct executor *x, struct err *e)
{
    struct exec_offload *o = &x->off;
    if (o->first == NULL)
        return ERR_OK;
    int n = x->c.lay->n_layers;
    if (x->c.arena != NULL)
        ERR_TRY(arena_staging_expire(x, o->lop, e));
    for (int q = o->first[o->lop]; q >= 0; q = o->next[q])
        ERR_TRY(prefetch_start(x, n - 1 - q % n, x->ops[q / n].micro, e));
    o->lop++;
    return ERR_OK;
}

/* Each offloaded backward layer-op q on the list of layer-op max(0, q - ahead). */
static void offload_begin_step(struct executor *x)
{
    struct exec_offload *o = &x->off;
    if (o->first == NULL)
        return;
    int n = x->c.lay->n_layers, M = x->c.micro_batches, n_lops = 2 * M * n;
    for (int p = 0; p < n_lops; p++)
        o->first[p] = -1;
    for (int q = n_lops - 1; q >= 0; q--) {
        int li = n - 1 - q % n;
        if (x->ops[q / n].pass != SCHEDULE_B || x->c.lay->layers[li].offload == 0)
            continue;
        int t = q - o->ahead[li] > 0 ? q - o->ahead[li] : 0;
        t = arena_trigger(x, li, x->ops[q / n].micro, t);
        o->next[q] = o->first[t];
        o->first[t] = q;
    }
    for (int i = 0; i < n * M; i++) {
        o->out_ev[i] = -1;
        o->pending[i] = 0;
    }
    o->lop = 0;
}

/* After the forward: the offloaded tensors leave for their host slot. */
static int offload_out(struct executor *x, int li, int micro, struct err *e)
{
    struct exec_offload *o = &x->off;
    int *held = off_at(x, o->held, li, micro), *out_ev = off_at(x, o->out_ev, li, micro);
    int64_t bytes = x->c.lay->layers[li].offload_bytes;
    ERR_TRY(host_add(x, bytes, e));
    ERR_TRY(x->c.be->ops->copy_async(x->c.be, BACKEND_TO_HOST, host_of(x, li, micro),
                                     staging_of(x, *held), bytes, -1, out_ev, e));
    exec_copy_note(x, *out_ev, li, micro, BACKEND_TO_HOST);
    o->buf[*held] = (struct exec_staging){STG_OUT, *out_ev, li, micro};
    if (x->c.arena != NULL)
        o->outs[o->n_outs++] = *held;
    *held = -1;
    if (o->pending[(size_t)li * (size_t)x->c.micro_batches + (size_t)micro])
        return prefetch_start(x, li, micro, e);
    return ERR_OK;
}

/* Before the backward: the prefetch must have arrived; a late one starts earlier next step. */
static int offload_ready(struct executor *x, int li, int micro, const struct layer_view *v,
                         struct err *e)
{
    struct exec_offload *o = &x->off;
    int b = *off_at(x, o->held, li, micro), late;
    if (b < 0 || o->buf[b].state != STG_IN)
        return err_set(e, ERR_FAIL, "internal: stage %d: layer %d's prefetch for micro-batch "
                       "%d was never started", x->c.stage, x->c.lay->layers[li].layer, micro);
    ERR_TRY(exec_copy_wait(x, o->buf[b].ev, li, micro, &late, e));
    if (late) {
        x->times.late_prefetches++;
        if (o->ahead[li] < x->c.prefetch_depth)
            o->ahead[li]++;
    }
    return ERR_OK;
}

static int offload_release(struct executor *x, int li, int micro, struct err *e)
{
    int *held = off_at(x, x->off.held, li, micro);
    x->off.buf[*held].state = STG_FREE;
    *held = -1;
    if (x->c.arena != NULL)
        arena_run_out(x->c.arena, ARENA_STAGING, micro, li, ARENA_BACKWARD);
    return host_add(x, -x->c.lay->layers[li].offload_bytes, e);
}

const struct exec_action exec_offload = {
    .name = "offload",
    .after_forward = offload_out,
    .before_backward = offload_ready,
    .after_backward = offload_release,
};

/* ---- one micro-batch ---- */

void exec_view(const struct executor *x, int li, int micro, struct layer_view *v)
{
    const struct stage_layout *lay = x->c.lay;
    if (x->c.arena != NULL) {
        arena_run_view(x->c.arena, lay, x->c.model, li, micro, x->phase, x->c.activations,
                       x->c.persistent, v);
        return;
    }
    const struct layout_chunk *ch = &lay->chunks[lay->layers[li].chunk];
    layout_view(lay, x->c.model, li, x->c.persistent,
                x->c.activations + ch->act_at + (int64_t)(micro % ch->in_flight) * ch->slot_bytes,
                x->c.transient, x->c.workspace, v);
    if (lay->layers[li].offload) {
        int b = *off_at(x, x->off.held, li, micro);
        layout_view_staging(lay, li, b >= 0 ? staging_of(x, b) : NULL, v);
    }
    if (li >= lay->stream_from)
        exec_stream_view(x, li, v);
}

/* The head's loss of the micro-batch, the mean over its B x T positions. */
static int read_loss(struct executor *x, int micro, const struct layer_view *v, struct err *e)
{
    const struct model *m = x->c.model;
    int64_t BT = (int64_t)m->micro_batch * m->seq_len;
    ERR_TRY(x->c.be->ops->download(x->c.be, x->host_losses, v->ws[HEAD_LOSSES], BT * 4, e));
    double sum = 0;
    for (int64_t i = 0; i < BT; i++)
        sum += x->host_losses[i];
    x->mb_loss[micro] = sum / (double)BT;
    return ERR_OK;
}

/* Chunk c's forward of `micro` through its layers lo .. hi-1. */
static int chunk_forward(struct executor *x, int c, int micro, struct err *e)
{
    const struct stage_layout *lay = x->c.lay;
    const struct backend_layer_ops *layers = backend_layers(x->c.be, x->c.model);
    int lo = lay->chunks[c].lo, n = lay->chunks[c].hi;
    struct layer_view v, next;
    double t0;
    x->phase = ARENA_FORWARD;
    /* the first layer's input and the head's targets arrive with the micro-batch */
    ERR_TRY(exec_arena_in(x, ARENA_KEPT, micro, lo, e));
    if (lay->layers[n - 1].kind == MODEL_LAYER_HEAD)
        ERR_TRY(exec_arena_in(x, ARENA_KEPT, micro, n - 1, e));
    ERR_TRY(x->c.port->input(x, micro, e));
    exec_view(x, lo, micro, &v);
    int out_id = -1, claimed;
    for (int li = lo; li < n; li++) {
        const struct layer_layout *L = &lay->layers[li];
        void *out = NULL;
        int loss_id = -1;
        ERR_TRY(offload_tick(x, e));
        ERR_TRY(exec_stream_tick(x, e));
        ERR_TRY(staging_claim(x, li, micro, ~0u, &claimed, e));
        if (claimed || li >= lay->stream_from) /* a buffer now held: the view changes */
            exec_view(x, li, micro, &v);
        if (li + 1 < n) {
            ERR_TRY(exec_arena_in(x, ARENA_KEPT, micro, li + 1, e));
            ERR_TRY(staging_claim(x, li + 1, micro, REGEN_BIT(0), &claimed, e));
            exec_view(x, li + 1, micro, &next);
            out = next.kept[0];
        } else if (L->kind != MODEL_LAYER_HEAD) {
            int k = L->kind == MODEL_LAYER_EMBED ? EMBED_OUT : BLOCK_OUT;
            ERR_TRY(ws_take(x, L->ws_off[k], sizes_tensor_bytes(&L->ws[k]), &out_id, e));
            out = v.ws[k];
        }
        if (L->kind == MODEL_LAYER_HEAD)
            ERR_TRY(ws_take(x, L->ws_off[HEAD_LOSSES], sizes_tensor_bytes(&L->ws[HEAD_LOSSES]),
                            &loss_id, e));
        if (x->op == x->first_forward_op && x->c.port->first_forward != NULL)
            ERR_TRY(x->c.port->first_forward(x, li, e));
        HOOKS(x, li, 1, before_forward, micro, e);
        ERR_TRY(span_begin(x, &t0, e));
        ERR_TRY(layers[L->kind].forward(x->c.be, &v, out, e));
        ERR_TRY(span_end(x, STAGE_EV_FORWARD, micro, li, t0, e));
        HOOKS(x, li, 0, after_forward, micro, e);
        if (loss_id >= 0) {
            ERR_TRY(read_loss(x, micro, &v, e));
            ERR_TRY(ws_give(x, loss_id, e));
        }
        if (li + 1 < n)
            v = next;
    }
    if (out_id >= 0)
        ERR_TRY(ws_send(x, out_id, exec_boundary_bytes(x->c.model), lay->chunks[c].vstage + 1,
                        micro, e));
    return ERR_OK;
}

/* The workspace a layer's backward touches: everything but the forward's `out` (and the
 * head's `losses`), so that an `out` still being sent does not hold the backward up. */
static void backward_span(const struct layer_layout *L, int64_t *off, int64_t *len)
{
    int64_t lo = L->ws_off[0], hi = L->ws_off[0] + L->ws_bytes; /* its chunk's workspace */
    if (L->kind == MODEL_LAYER_HEAD)
        hi = L->ws_off[HEAD_LOSSES];
    else
        lo = L->ws_off[L->kind == MODEL_LAYER_EMBED ? EMBED_DOUT : BLOCK_DOUT];
    *off = lo;
    *len = hi - lo;
}

/* The gradient of layer li's output into v's `dout`: from the next stage for the chunk's
 * last layer, else the next layer's `dinp` (whose region is then given back). */
static int take_dout(struct executor *x, int li, int last, int micro,
                     const struct layer_view *v, const struct layer_view *next, int next_id,
                     struct err *e)
{
    int dout = v->kind == MODEL_LAYER_EMBED ? EMBED_DOUT : BLOCK_DOUT;
    if (li == last)
        return v->kind == MODEL_LAYER_HEAD ? ERR_OK
                                           : x->c.port->output_grad(x, micro, v->ws[dout], e);
    void *src = next->ws[next->kind == MODEL_LAYER_HEAD ? HEAD_DINP : BLOCK_DINP];
    int64_t bytes = exec_boundary_bytes(x->c.model);
    if (src != v->ws[dout])
        ERR_TRY(x->c.be->ops->copy(x->c.be, v->ws[dout], src, bytes, e));
    return ws_give(x, next_id, e);
}

/* Layer li's weight-pass record for micro-batch `micro` (a split backward): one per layer
 * and slot of its chunk, as the weight pass tensors are. */
static struct layer_wgrad *wgrad_of(const struct executor *x, int li, int micro)
{
    const struct stage_layout *lay = x->c.lay;
    int v = lay->chunks[lay->layers[li].chunk].in_flight;
    return &x->wgrad[(size_t)li * (size_t)x->wgrad_slots + (size_t)(micro % v)];
}

/* The micro-batch is done with chunk c: its slot free (and, over a transport, the receipt of
 * a later one posted into it). */
static int release_slot(struct executor *x, int c, int micro, struct err *e)
{
    ERR_TRY(exec_mem_add(x, -x->c.lay->chunks[c].slot_bytes, e));
    return x->c.port->backward_done != NULL ? x->c.port->backward_done(x, micro, e) : ERR_OK;
}

/* Whether the op running makes chunk c's gradients final layer by layer (its last B, or W
 * where the backward splits) with every chunk above it in the model done: the hook's layers
 * then come top down, as the replicas' buckets start (train_dp.c); else the step's end
 * reduces them. */
static int grads_final(const struct executor *x, int c)
{
    const struct stage_layout *lay = x->c.lay;
    if (x->op != x->last_grads_op[c])
        return 0;
    for (int k = 0; k < lay->n_chunks; k++)
        if (lay->chunks[k].lo > lay->chunks[c].lo && x->last_grads_op[k] > x->op)
            return 0;
    return 1;
}

/* Chunk c's backward of `micro`, layers hi-1 down to lo: whole, or where the schedule splits
 * it the input-gradient pass of its split layers (weight_pass does the rest). */
static int chunk_backward(struct executor *x, int c, int micro, struct err *e)
{
    const struct model *m = x->c.model;
    const struct stage_layout *lay = x->c.lay;
    const struct backend_layer_ops *layers = backend_layers(x->c.be, x->c.model);
    int lo = lay->chunks[c].lo, n = lay->chunks[c].hi;
    /* d (scaled step loss) / d (token loss): the step's loss is the mean over M micro-batches
     * of B x T tokens, times the loss scale */
    float dloss =
        (float)(x->loss_scale / ((double)m->micro_batch * m->seq_len * x->c.micro_batches));
    struct layer_view v, prev = {0};
    int prev_id = -1, cur_id;
    double t0;
    x->phase = ARENA_BACKWARD;
    for (int li = n - 1; li >= lo; li--) {
        const struct layer_layout *L = &lay->layers[li];
        int64_t off, len;
        ERR_TRY(offload_tick(x, e));
        ERR_TRY(exec_stream_tick(x, e));
        HOOKS(x, li, 1, prefetch, micro, e);
        exec_view(x, li, micro, &v);
        if (L->n_wstash > 0) {
            v.wgrad = wgrad_of(x, li, micro);
            v.wgrad->n = 0;
        }
        backward_span(L, &off, &len);
        ERR_TRY(ws_take(x, off, len, &cur_id, e));
        ERR_TRY(take_dout(x, li, n - 1, micro, &v, &prev, prev_id, e));
        HOOKS(x, li, 1, before_backward, micro, &v, e);
        ERR_TRY(span_begin(x, &t0, e));
        ERR_TRY(layers[L->kind].backward(x->c.be, &v, dloss, e));
        ERR_TRY(span_end(x, STAGE_EV_BACKWARD, micro, li, t0, e));
        HOOKS(x, li, 0, after_backward, micro, e);
        if (grads_final(x, c) && x->c.port->last_backward != NULL)
            ERR_TRY(x->c.port->last_backward(x, li, e));
        exec_arena_out(x, ARENA_KEPT, micro, li);
        prev = v;
        prev_id = cur_id;
    }
    if (lay->layers[lo].kind != MODEL_LAYER_EMBED) {
        /* keep only the first layer's dinp live while it is sent back */
        const struct layer_layout *L = &lay->layers[lo];
        int k = L->kind == MODEL_LAYER_HEAD ? HEAD_DINP : BLOCK_DINP, send_id;
        ERR_TRY(ws_take(x, L->ws_off[k], sizes_tensor_bytes(&L->ws[k]), &send_id, e));
        ERR_TRY(ws_give(x, prev_id, e));
        ERR_TRY(ws_send(x, send_id, exec_boundary_bytes(m), lay->chunks[c].vstage - 1, micro,
                        e));
    } else {
        ERR_TRY(ws_give(x, prev_id, e));
    }
    return x->splits ? ERR_OK : release_slot(x, c, micro, e);
}

/* Chunk c's weight pass of `micro` (a split backward): each split layer's products' weight
 * gradients, then the slot, which held their inputs and output gradients, is free. */
static int weight_pass(struct executor *x, int c, int micro, struct err *e)
{
    const struct stage_layout *lay = x->c.lay;
    double t0;
    for (int li = lay->chunks[c].hi - 1; li >= lay->chunks[c].lo; li--) {
        struct layer_view v;
        if (lay->layers[li].n_wstash > 0) {
            exec_view(x, li, micro, &v);
            ERR_TRY(span_begin(x, &t0, e));
            ERR_TRY(layer_weight_pass(x->c.be, &v, wgrad_of(x, li, micro), e));
            ERR_TRY(span_end(x, STAGE_EV_WEIGHT, micro, li, t0, e));
        }
        if (grads_final(x, c) && x->c.port->last_backward != NULL)
            ERR_TRY(x->c.port->last_backward(x, li, e));
    }
    return release_slot(x, c, micro, e);
}

int exec_run(struct executor *x, struct err *e)
{
    offload_begin_step(x);
    exec_stream_begin_step(x);
    x->times.host_peak = x->off.host_live; /* the mirror, live always */
    for (x->op = 0; x->op < x->n_ops; x->op++) {
        const struct schedule_op *op = &x->ops[x->op];
        x->chunk = op->chunk;
        ERR_TRY(op->pass == SCHEDULE_F   ? chunk_forward(x, op->chunk, op->micro, e)
                : op->pass == SCHEDULE_B ? chunk_backward(x, op->chunk, op->micro, e)
                                         : weight_pass(x, op->chunk, op->micro, e));
    }
    ERR_TRY(ws_drain(x, e));
    ERR_TRY(exec_stream_drain(x, e));
    if (x->c.arena != NULL && x->off.outs != NULL)
        ERR_TRY(arena_staging_expire(x, 2 * x->c.micro_batches * x->c.lay->n_layers, e));
    if (x->off.buf == NULL && x->stream.buf == NULL)
        return ERR_OK;
    ERR_TRY(copy_events(x, e));
    return x->c.be->ops->copy_ms(x->c.be, x->times.copy, e);
}

/* ---- set-up ---- */

static int offload_init(struct executor *x, struct err *e)
{
    struct exec_offload *o = &x->off;
    size_t n = (size_t)x->c.lay->n_layers, M = (size_t)x->c.micro_batches;
    /* with the plan's arena: a forward and a backward staging object per layer and
     * micro-batch, at most all of the forward ones being copied out */
    size_t n_buf = x->c.arena != NULL ? 2 * n * M : (size_t)x->c.lay->n_staging;
    o->buf = calloc(n_buf, sizeof *o->buf);
    if (x->c.arena != NULL && (o->outs = malloc(sizeof *o->outs * n * M)) == NULL)
        return err_set(e, ERR_FAIL, "out of memory setting up stage %d", x->c.stage);
    o->held = malloc(sizeof *o->held * n * M);
    o->out_ev = malloc(sizeof *o->out_ev * n * M);
    o->pending = malloc(n * M);
    o->ahead = malloc(sizeof *o->ahead * n);
    o->first = malloc(sizeof *o->first * 2 * n * M);
    o->next = malloc(sizeof *o->next * 2 * n * M);
    if (!o->buf || !o->held || !o->out_ev || !o->pending || !o->ahead || !o->first ||
        !o->next)
        return err_set(e, ERR_FAIL, "out of memory setting up stage %d", x->c.stage);
    for (size_t i = 0; i < n * M; i++)
        o->held[i] = -1;
    for (size_t li = 0; li < n; li++) {
        int a = x->c.lay->layers[li].ahead;
        o->ahead[li] = a < 1 ? 1 : a > x->c.prefetch_depth ? x->c.prefetch_depth : a;
    }
    return ERR_OK;
}

int exec_init(struct executor *x, const struct exec_config *c, struct err *e)
{
    memset(x, 0, sizeof *x);
    x->c = *c;
    x->loss_scale = 1;
    int M = c->micro_batches, n = c->lay->n_layers;
    struct schedule_shape sh = schedule_shape_of(c->schedule, c->n_stages, c->lay->n_chunks, M);
    x->n_ops = schedule_op_count(&sh);
    x->splits = schedule_splits(c->schedule);
    for (int k = 0; k < c->lay->n_chunks; k++)
        if (c->lay->chunks[k].in_flight > x->wgrad_slots)
            x->wgrad_slots = c->lay->chunks[k].in_flight;
    x->ops = malloc(sizeof *x->ops * (size_t)x->n_ops);
    x->mb_loss = calloc((size_t)M, sizeof *x->mb_loss);
    x->hooks = calloc((size_t)n, sizeof *x->hooks);
    x->host_losses =
        malloc(sizeof(float) * (size_t)c->model->micro_batch * (size_t)c->model->seq_len);
    x->wgrad = x->splits ? calloc((size_t)n * (size_t)x->wgrad_slots, sizeof *x->wgrad) : NULL;
    if (!x->ops || !x->mb_loss || !x->hooks || !x->host_losses || (x->splits && !x->wgrad)) {
        exec_free(x);
        return err_set(e, ERR_FAIL, "out of memory setting up stage %d", c->stage);
    }
    if (schedule_check(&sh, e) || schedule_ops(&sh, c->stage, x->ops, e)) {
        exec_free(x);
        return e->code;
    }
    x->first_forward_op = -1;
    for (int i = 0; i < x->n_ops; i++) {
        if (x->ops[i].pass != SCHEDULE_F) /* the last to touch the gradients */
            x->last_grads_op[x->ops[i].chunk] = i;
        else if (x->first_forward_op < 0)
            x->first_forward_op = i;
    }
    for (int li = 0; li < n; li++) { /* outermost first: what comes back, then reruns */
        const struct layer_layout *L = &c->lay->layers[li];
        struct exec_hooks *h = &x->hooks[li];
        if (li >= c->lay->stream_from)
            h->part[h->n++] = &exec_stream;
        if (L->offload)
            h->part[h->n++] = &exec_offload;
        if (L->regen)
            h->part[h->n++] = &exec_recompute;
    }
    /* the staging buffers are device memory set aside for the copies: live always (with the
     * plan's arena, staging objects in it) */
    x->live = x->peak = c->lay->persistent_bytes + (c->arena != NULL ? 0 : c->lay->staging_bytes);
    /* a GPU's chunks each keep a workspace of their own, whose output and input gradient may
     * be on their way while another chunk runs: reserved for them, live always */
    if (c->lay->n_chunks > 1)
        x->live = x->peak = x->live + c->lay->workspace_bytes;
    /* the step's copies for the trace: at most 2 a layer-op offloaded, 3 streamed */
    size_t copies = 5 * (size_t)n * 2 * (size_t)M;
    int copying = c->lay->n_staging > 0 || c->lay->n_wbuf > 0;
    if (copying && c->record_events &&
        (x->off.copies = malloc(sizeof *x->off.copies * copies)) == NULL) {
        exec_free(x);
        return err_set(e, ERR_FAIL, "out of memory setting up stage %d", c->stage);
    }
    if ((c->lay->n_staging > 0 && offload_init(x, e)) ||
        (c->lay->n_wbuf > 0 && exec_stream_init(x, e))) {
        exec_free(x);
        return e->code;
    }
    return ERR_OK;
}

void exec_free(struct executor *x)
{
    free(x->ops);
    free(x->wgrad);
    free(x->mb_loss);
    free(x->hooks);
    free(x->host_losses);
    free(x->events);
    free(x->off.buf);
    free(x->off.outs);
    free(x->off.held);
    free(x->off.out_ev);
    free(x->off.pending);
    free(x->off.ahead);
    free(x->off.first);
    free(x->off.next);
    free(x->off.copies);
    exec_stream_free(x);
    memset(x, 0, sizeof *x);
}
