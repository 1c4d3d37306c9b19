/* Streamed weights (exec.h's exec_stream; cost.h "Streamed weights"): a streamed layer's
 * weights and gradients stay in host memory between their uses. Each forward and backward
 * takes one of the layout's weights buffers, fetched at the layer-op before it (the step's
 * first layer-op fetches its own); a backward's buffer also gets the gradients summed so far
 * (zeroed for the layer's first backward of the step, as the device's gradients are at the
 * step's start), its kernels add to them as they would to the device's, and they go back to
 * the host's landing section after it. So the arithmetic, and its order, is the device's: the
 * host optimizer (hostmirror.c) steps on the landing's gradients and writes the next step's
 * weights into the host's copy. */
#include <stdlib.h>
#include <string.h>

#include "exec.h"

static const struct layer_layout *layer_of(const struct executor *x, int li)
{
    return &x->c.lay->layers[li];
}

static int layer_streams(const struct executor *x, int li)
{
    return li >= x->c.lay->stream_from;
}

static char *wbuf(const struct executor *x, int b)
{
    return x->c.wbufs + (int64_t)b * x->c.lay->wbuf_bytes;
}

/* Layer-op k of the step: its op, its layer, whether it is a forward. */
static void lop_of(const struct executor *x, int k, int *op, int *li, int *forward)
{
    int n = x->c.lay->n_layers;
    *op = k / n;
    *forward = x->ops[*op].pass == SCHEDULE_F;
    *li = *forward ? k % n : n - 1 - k % n;
}

int exec_stream_init(struct executor *x, struct err *e)
{
    struct exec_stream *s = &x->stream;
    size_t n = (size_t)x->c.lay->n_layers, lops = 2 * n * (size_t)x->c.micro_batches;
    s->buf = calloc((size_t)x->c.lay->n_wbuf, sizeof *s->buf);
    s->held = malloc(lops * sizeof *s->held);
    s->out_ev = malloc(n * sizeof *s->out_ev);
    s->waiting = malloc(n * sizeof *s->waiting);
    s->summed = calloc(n, 1);
    if (!s->buf || !s->held || !s->out_ev || !s->waiting || !s->summed)
        return err_set(e, ERR_FAIL, "out of memory setting up stage %d", x->c.stage);
    for (size_t k = 0; k < lops; k++)
        s->held[k] = -1;
    for (size_t li = 0; li < n; li++)
        s->out_ev[li] = s->waiting[li] = -1;
    return ERR_OK;
}

void exec_stream_free(struct executor *x)
{
    free(x->stream.buf);
    free(x->stream.held);
    free(x->stream.out_ev);
    free(x->stream.waiting);
    free(x->stream.summed);
    memset(&x->stream, 0, sizeof x->stream);
}

void exec_stream_begin_step(struct executor *x)
{
    struct exec_stream *s = &x->stream;
    if (s->buf == NULL)
        return;
    s->lop = 0;
    memset(s->summed, 0, (size_t)x->c.lay->n_layers);
}

/* A free buffer; else the one whose gradients went out first, once they have. */
static int buffer_get(struct executor *x, int *out, struct err *e)
{
    struct exec_stream *s = &x->stream;
    int pick = -1, late;
    for (int b = 0; b < x->c.lay->n_wbuf; b++) {
        if (s->buf[b].state == STG_FREE) {
            *out = b;
            return ERR_OK;
        }
        if (s->buf[b].state == STG_OUT && (pick < 0 || s->buf[b].ev_out < s->buf[pick].ev_out))
            pick = b;
    }
    if (pick < 0)
        return err_set(e, ERR_FAIL, "internal: stage %d has all %d weights buffers in use",
                       x->c.stage, x->c.lay->n_wbuf);
    ERR_TRY(exec_copy_wait(x, s->buf[pick].ev_out, s->buf[pick].li, -1, &late, e));
    s->buf[pick].state = STG_FREE;
    *out = pick;
    return ERR_OK;
}

/* The gradients summed so far into buffer b of layer li's next backward, after the last
 * backward's have gone out. */
static int grads_in(struct executor *x, int b, int li, int micro, struct err *e)
{
    struct exec_stream *s = &x->stream;
    const struct stage_layout *lay = x->c.lay;
    int64_t sec_off, sec_bytes, w_off, w_bytes;
    layout_layer_ranges(lay, li, &sec_off, &sec_bytes, &w_off, &w_bytes);
    ERR_TRY(x->c.be->ops->copy_async(x->c.be, BACKEND_FROM_HOST, wbuf(x, b) + w_bytes,
                                     x->c.host_landing + (sec_off - lay->host_lo), sec_bytes,
                                     s->out_ev[li], &s->buf[b].ev_g, e));
    exec_copy_note(x, s->buf[b].ev_g, li, micro, BACKEND_FROM_HOST);
    return ERR_OK;
}

/* Layer-op k's weights (and a backward's gradients) on their way into a buffer. The step's
 * first forward of a layer waits for its update on the host (exec_port.first_forward). */
static int stream_fetch(struct executor *x, int k, struct err *e)
{
    struct exec_stream *s = &x->stream;
    const struct stage_layout *lay = x->c.lay;
    int op, li, forward, b = -1;
    lop_of(x, k, &op, &li, &forward);
    if (!layer_streams(x, li) || s->held[k] >= 0)
        return ERR_OK;
    if (forward && op == x->first_forward_op && x->c.port->first_forward != NULL)
        ERR_TRY(x->c.port->first_forward(x, li, e));
    ERR_TRY(buffer_get(x, &b, e));
    int64_t sec_off, sec_bytes, w_off, w_bytes;
    layout_layer_ranges(lay, li, &sec_off, &sec_bytes, &w_off, &w_bytes);
    struct exec_wbuf *w = &s->buf[b];
    *w = (struct exec_wbuf){STG_IN, k, li, -1, -1, -1};
    int micro = x->ops[op].micro;
    ERR_TRY(x->c.be->ops->copy_async(x->c.be, BACKEND_FROM_HOST, wbuf(x, b),
                                     x->c.host_weights + (w_off - lay->dev_weights_bytes),
                                     w_bytes, -1, &w->ev_w, e));
    exec_copy_note(x, w->ev_w, li, micro, BACKEND_FROM_HOST);
    s->held[k] = b;
    if (forward)
        return ERR_OK;
    if (!s->summed[li]) {
        s->summed[li] = 1;
        return x->c.be->ops->zero(x->c.be, wbuf(x, b) + w_bytes, sec_bytes, e);
    }
    if (k > 0 && s->held[k - 1] >= 0) {
        int prev_op, prev_li, prev_forward;
        lop_of(x, k - 1, &prev_op, &prev_li, &prev_forward);
        if (prev_li == li && !prev_forward) {
            s->waiting[li] = b; /* the layer's backward running now sends its sum first */
            return ERR_OK;
        }
    }
    return grads_in(x, b, li, micro, e);
}

int exec_stream_tick(struct executor *x, struct err *e)
{
    struct exec_stream *s = &x->stream;
    if (s->buf == NULL)
        return ERR_OK;
    int k = s->lop++, lops = 2 * x->c.micro_batches * x->c.lay->n_layers;
    ERR_TRY(stream_fetch(x, k, e));
    return k + 1 < lops ? stream_fetch(x, k + 1, e) : ERR_OK;
}

/* The layer-op running (exec_stream_tick's last). */
static int running(const struct executor *x)
{
    return x->stream.lop - 1;
}

void exec_stream_view(const struct executor *x, int li, struct layer_view *v)
{
    int n = x->c.lay->n_layers;
    int k = x->op * n + (x->ops[x->op].pass == SCHEDULE_F ? li : n - 1 - li);
    int b = x->stream.held[k];
    layout_view_weights(x->c.lay, li, b >= 0 ? wbuf(x, b) : NULL, v);
}

/* Before a forward or a backward: its weights (and gradients) arrived. */
static int arrive(struct executor *x, int li, int micro, struct err *e)
{
    struct exec_stream *s = &x->stream;
    int b = s->held[running(x)], late;
    if (b < 0)
        return err_set(e, ERR_FAIL, "internal: stage %d: layer %d's weights were never "
                       "fetched", x->c.stage, layer_of(x, li)->layer);
    ERR_TRY(exec_copy_wait(x, s->buf[b].ev_w, li, micro, &late, e));
    if (s->buf[b].ev_g >= 0)
        ERR_TRY(exec_copy_wait(x, s->buf[b].ev_g, li, micro, &late, e));
    return ERR_OK;
}

static int arrive_forward(struct executor *x, int li, int micro, struct err *e)
{
    return arrive(x, li, micro, e);
}

static int arrive_backward(struct executor *x, int li, int micro, const struct layer_view *v,
                           struct err *e)
{
    (void)v;
    return arrive(x, li, micro, e);
}

static int release_forward(struct executor *x, int li, int micro, struct err *e)
{
    (void)li;
    (void)micro;
    (void)e;
    int k = running(x);
    x->stream.buf[x->stream.held[k]].state = STG_FREE;
    x->stream.held[k] = -1;
    return ERR_OK;
}

/* After a backward: the gradients summed so far back to the host's landing. */
static int send_grads(struct executor *x, int li, int micro, struct err *e)
{
    struct exec_stream *s = &x->stream;
    const struct stage_layout *lay = x->c.lay;
    int k = running(x), b = s->held[k];
    int64_t sec_off, sec_bytes, w_off, w_bytes;
    layout_layer_ranges(lay, li, &sec_off, &sec_bytes, &w_off, &w_bytes);
    ERR_TRY(x->c.be->ops->copy_async(x->c.be, BACKEND_TO_HOST,
                                     x->c.host_landing + (sec_off - lay->host_lo),
                                     wbuf(x, b) + w_bytes, sec_bytes, -1, &s->buf[b].ev_out, e));
    exec_copy_note(x, s->buf[b].ev_out, li, micro, BACKEND_TO_HOST);
    s->buf[b].state = STG_OUT;
    s->out_ev[li] = s->buf[b].ev_out;
    s->held[k] = -1;
    if (s->waiting[li] < 0)
        return ERR_OK;
    int next = s->waiting[li];
    s->waiting[li] = -1;
    return grads_in(x, next, li, micro, e);
}

const struct exec_action exec_stream = {
    .name = "stream",
    .before_forward = arrive_forward,
    .after_forward = release_forward,
    .before_backward = arrive_backward,
    .after_backward = send_grads,
};

int exec_stream_drain(struct executor *x, struct err *e)
{
    struct exec_stream *s = &x->stream;
    for (int b = 0; s->buf != NULL && b < x->c.lay->n_wbuf; b++) {
        int late;
        if (s->buf[b].state != STG_OUT)
            continue;
        ERR_TRY(exec_copy_wait(x, s->buf[b].ev_out, s->buf[b].li, -1, &late, e));
        s->buf[b].state = STG_FREE;
    }
    return ERR_OK;
}

int exec_stream_out_event(const struct executor *x, int li)
{
    return x->stream.out_ev != NULL ? x->stream.out_ev[li] : -1;
}
