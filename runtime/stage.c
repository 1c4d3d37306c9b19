#include "stage.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bf16.h"
#include "rng.h"

double stage_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* An activation (B,T,C) or its gradient: what crosses between stages. */
static int64_t out_bytes(const struct model *m)
{
    return (int64_t)m->micro_batch * m->seq_len * m->n_embd * sizes_act_elem_bytes(m->dtype);
}

/* ---- live memory ---- */

static int mem_add(struct stage_runner *r, int64_t delta, struct err *e)
{
    r->live += delta;
    if (r->live > r->peak)
        r->peak = r->live;
    /* The arenas were checked against the limit at start-up and nothing lives outside them,
     * so this can only fire on a bug in the accounting or the executor. */
    if (r->live > r->c.limit_bytes - r->c.reserve_bytes)
        return err_set(e, ERR_FAIL,
                       "internal: stage %d has %lld bytes live, over its limit %lld",
                       r->c.stage, (long long)r->live,
                       (long long)(r->c.limit_bytes - r->c.reserve_bytes));
    return ERR_OK;
}

static int64_t ws_union(const struct stage_runner *r)
{
    struct stage_ws_region s[STAGE_WS_REGIONS];
    int n = 0;
    for (int i = 0; i < STAGE_WS_REGIONS; i++)
        if (r->ws[i].used) {
            int j = n++;
            while (j > 0 && s[j - 1].off > r->ws[i].off) {
                s[j] = s[j - 1];
                j--;
            }
            s[j] = r->ws[i];
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

static int ws_update(struct stage_runner *r, struct err *e)
{
    int64_t u = ws_union(r);
    int rc = mem_add(r, u - r->ws_live, e);
    r->ws_live = u;
    return rc;
}

static void event(struct stage_runner *r, int kind, int micro, int layer, double t0, double t1)
{
    double *acc[STAGE_EV_KINDS] = {&r->times.fwd,  &r->times.recompute, &r->times.bwd,
                                   &r->times.send, &r->times.idle,      &r->times.optimizer};
    *acc[kind] += t1 - t0;
    if (!r->c.record_events)
        return;
    if (r->n_events == r->cap_events) {
        int cap = r->cap_events ? 2 * r->cap_events : 1024;
        struct stage_event *p = realloc(r->events, sizeof *p * (size_t)cap);
        if (p == NULL)
            return; /* the trace loses events; the run goes on */
        r->events = p;
        r->cap_events = cap;
    }
    r->events[r->n_events++] = (struct stage_event){kind, (int32_t)r->step, micro, layer,
                                                    t0 - r->origin_ms, t1 - r->origin_ms};
}

static int transfer_wait(struct stage_runner *r, int req, int kind, int micro, struct err *e)
{
    double t0 = stage_now_ms();
    ERR_TRY(r->tp->ops->wait(r->tp, req, e));
    event(r, kind, micro, -1, t0, stage_now_ms());
    return ERR_OK;
}

/* Claims [off, off+len) of the workspace, first waiting for any send still reading it. */
static int ws_take(struct stage_runner *r, int64_t off, int64_t len, int *id, struct err *e)
{
    for (int i = 0; i < STAGE_WS_REGIONS; i++) {
        struct stage_ws_region *w = &r->ws[i];
        if (w->used && w->req >= 0 && w->off < off + len && off < w->off + w->len) {
            ERR_TRY(transfer_wait(r, w->req, STAGE_EV_SEND, -1, e));
            w->used = 0;
        }
    }
    for (int i = 0; i < STAGE_WS_REGIONS; i++)
        if (!r->ws[i].used) {
            r->ws[i] = (struct stage_ws_region){1, off, len, -1};
            *id = i;
            return ws_update(r, e);
        }
    return err_set(e, ERR_FAIL, "internal: stage %d claims more than %d workspace regions",
                   r->c.stage, STAGE_WS_REGIONS);
}

static int ws_give(struct stage_runner *r, int id, struct err *e)
{
    r->ws[id].used = 0;
    return ws_update(r, e);
}

/* Sends `bytes` from the start of region `id`; the region stays live until the send is done. */
static int ws_send(struct stage_runner *r, int id, int64_t bytes, int peer, int micro,
                   struct err *e)
{
    double t0 = stage_now_ms();
    ERR_TRY(r->be->ops->sync(r->be, e));
    ERR_TRY(r->tp->ops->isend(r->tp, r->workspace + r->ws[id].off, bytes, peer, micro,
                          &r->ws[id].req, e));
    event(r, STAGE_EV_SEND, micro, -1, t0, stage_now_ms());
    return ERR_OK;
}

static int ws_drain(struct stage_runner *r, struct err *e)
{
    for (int i = 0; i < STAGE_WS_REGIONS; i++)
        if (r->ws[i].used && r->ws[i].req >= 0) {
            ERR_TRY(transfer_wait(r, r->ws[i].req, STAGE_EV_SEND, -1, e));
            ERR_TRY(ws_give(r, i, e));
        }
    return ERR_OK;
}

/* ---- tensors of one layer and micro-batch ---- */

static void view_make(const struct stage_runner *r, int li, int slot, struct layer_view *v)
{
    layout_view(&r->lay, r->c.model, li, r->persistent,
                r->activations + (int64_t)slot * r->lay.slot_bytes, r->transient, r->workspace,
                v);
}

static int post_input(struct stage_runner *r, int micro, struct err *e)
{
    int slot = micro % r->c.in_flight;
    struct layer_view v;
    view_make(r, 0, slot, &v);
    ERR_TRY(mem_add(r, r->lay.slot_bytes, e));
    return r->tp->ops->irecv(r->tp, v.kept[0], out_bytes(r->c.model), r->c.stage - 1, micro,
                             &r->slot_req[slot], e);
}

static int timed_sync(struct stage_runner *r, double *t, struct err *e)
{
    ERR_TRY(r->be->ops->sync(r->be, e));
    *t = stage_now_ms();
    return ERR_OK;
}

static int forward(struct stage_runner *r, int micro, struct err *e)
{
    const struct model *m = r->c.model;
    const struct backend_ops *ops = r->be->ops;
    int slot = micro % r->c.in_flight, n = r->lay.n_layers;
    int last_stage = r->c.stage == r->c.n_stages - 1;
    int64_t BT = (int64_t)m->micro_batch * m->seq_len;
    struct layer_view v, next;
    double t0, t1;
    view_make(r, 0, slot, &v);
    if (r->c.stage == 0) {
        ERR_TRY(mem_add(r, r->lay.slot_bytes, e));
            data_batch(r->data, r->step, micro, r->host_tokens, NULL);
        ERR_TRY(ops->upload(r->be, v.kept[EMBED_TOKENS], r->host_tokens, BT * 4, e));
    } else {
        ERR_TRY(transfer_wait(r, r->slot_req[slot], STAGE_EV_RECV, micro, e));
        r->slot_req[slot] = -1;
    }
    if (last_stage) {
        struct layer_view h;
        view_make(r, n - 1, slot, &h);
        data_batch(r->data, r->step, micro, NULL, r->host_targets);
        ERR_TRY(ops->upload(r->be, h.kept[HEAD_TARGETS], r->host_targets, BT * 4, e));
    }
    int out_id = -1;
    for (int li = 0; li < n; li++) {
        const struct layer_layout *L = &r->lay.layers[li];
        void *out = NULL;
        int loss_id = -1;
        if (li + 1 < n) {
            view_make(r, li + 1, slot, &next);
            out = next.kept[0];
        } else if (!last_stage) {
            int k = L->kind == MODEL_LAYER_EMBED ? EMBED_OUT : BLOCK_OUT;
            ERR_TRY(ws_take(r, L->ws_off[k], sizes_tensor_bytes(&L->ws[k]), &out_id, e));
            out = v.ws[k];
        }
        if (L->kind == MODEL_LAYER_HEAD)
            ERR_TRY(ws_take(r, L->ws_off[HEAD_LOSSES], sizes_tensor_bytes(&L->ws[HEAD_LOSSES]),
                        &loss_id, e));
        if (L->regen)
            ERR_TRY(mem_add(r, L->transient_bytes, e));
        ERR_TRY(timed_sync(r, &t0, e));
        ERR_TRY(ops->layer[L->kind].forward(r->be, &v, out, e));
        ERR_TRY(timed_sync(r, &t1, e));
        event(r, STAGE_EV_FORWARD, micro, L->layer, t0, t1);
        if (L->regen)
            ERR_TRY(mem_add(r, -L->transient_bytes, e));
        if (loss_id >= 0) {
            ERR_TRY(ops->download(r->be, r->host_losses, v.ws[HEAD_LOSSES], BT * 4, e));
            double sum = 0;
            for (int64_t i = 0; i < BT; i++)
                sum += r->host_losses[i];
            r->mb_loss[micro] = sum / (double)BT;
            ERR_TRY(ws_give(r, loss_id, e));
        }
        if (li + 1 < n)
            v = next;
    }
    if (out_id >= 0)
        ERR_TRY(ws_send(r, out_id, out_bytes(m), r->c.stage + 1, micro, e));
    return ERR_OK;
}

/* The workspace a layer's backward touches: everything but the forward's `out` (and the
 * head's `losses`), so that an `out` still being sent does not hold the backward up. */
static void backward_span(const struct layer_layout *L, int64_t *off, int64_t *len)
{
    int64_t lo = 0, hi = L->ws_bytes;
    if (L->kind == MODEL_LAYER_HEAD)
        hi = L->ws_off[HEAD_LOSSES];
    else
        lo = L->ws_off[L->kind == MODEL_LAYER_EMBED ? EMBED_DOUT : BLOCK_DOUT];
    *off = lo;
    *len = hi - lo;
}

static int backward(struct stage_runner *r, int micro, struct err *e)
{
    const struct model *m = r->c.model;
    const struct backend_ops *ops = r->be->ops;
    int slot = micro % r->c.in_flight, n = r->lay.n_layers;
    float loss_scale =
        (float)(1.0 / ((double)m->micro_batch * m->seq_len * r->c.micro_batches));
    struct layer_view v, prev = {0};
    int prev_id = -1, cur_id;
    double t0, t1;
    for (int li = n - 1; li >= 0; li--) {
        const struct layer_layout *L = &r->lay.layers[li];
        int64_t off, len;
        view_make(r, li, slot, &v);
        backward_span(L, &off, &len);
        ERR_TRY(ws_take(r, off, len, &cur_id, e));
        int dout = L->kind == MODEL_LAYER_EMBED ? EMBED_DOUT : BLOCK_DOUT;
        if (li == n - 1 && r->c.stage < r->c.n_stages - 1) {
            int req;
            ERR_TRY(r->tp->ops->irecv(r->tp, v.ws[dout], out_bytes(m), r->c.stage + 1, micro, &req,
                                  e));
            ERR_TRY(transfer_wait(r, req, STAGE_EV_RECV, micro, e));
        } else if (li < n - 1) {
            /* the gradient of this layer's output is the next layer's dinp */
            void *src = prev.ws[prev.kind == MODEL_LAYER_HEAD ? HEAD_DINP : BLOCK_DINP];
            if (src != v.ws[dout])
                ERR_TRY(ops->copy(r->be, v.ws[dout], src, out_bytes(m), e));
            ERR_TRY(ws_give(r, prev_id, e));
        }
        if (L->regen) {
            ERR_TRY(mem_add(r, L->transient_bytes, e));
            ERR_TRY(timed_sync(r, &t0, e));
            ERR_TRY(ops->layer[L->kind].recompute(r->be, &v, e));
            ERR_TRY(timed_sync(r, &t1, e));
            event(r, STAGE_EV_RECOMPUTE, micro, L->layer, t0, t1);
        }
        ERR_TRY(timed_sync(r, &t0, e));
        ERR_TRY(ops->layer[L->kind].backward(r->be, &v, loss_scale, e));
        ERR_TRY(timed_sync(r, &t1, e));
        event(r, STAGE_EV_BACKWARD, micro, L->layer, t0, t1);
        if (L->regen)
            ERR_TRY(mem_add(r, -L->transient_bytes, e));
        prev = v;
        prev_id = cur_id;
    }
    ERR_TRY(mem_add(r, -r->lay.slot_bytes, e));
    if (r->c.stage > 0) {
        /* keep only the first layer's dinp live while it is sent back */
        const struct layer_layout *L = &r->lay.layers[0];
        int k = L->kind == MODEL_LAYER_HEAD ? HEAD_DINP : BLOCK_DINP, send_id;
        ERR_TRY(ws_take(r, L->ws_off[k], sizes_tensor_bytes(&L->ws[k]), &send_id, e));
        ERR_TRY(ws_give(r, prev_id, e));
        ERR_TRY(ws_send(r, send_id, out_bytes(m), r->c.stage - 1, micro, e));
        if (micro + r->c.in_flight < r->c.micro_batches)
            ERR_TRY(post_input(r, micro + r->c.in_flight, e));
    } else {
        ERR_TRY(ws_give(r, prev_id, e));
    }
    return ERR_OK;
}

int stage_step(struct stage_runner *r, int64_t step, double *loss, struct err *e)
{
    int M = r->c.micro_batches;
    r->step = step;
    memset(&r->times, 0, sizeof r->times);
    ERR_TRY(r->be->ops->zero(r->be, r->persistent + r->lay.grads_at, r->lay.section_bytes, e));
    if (r->c.stage > 0)
        for (int micro = 0; micro < r->c.in_flight && micro < M; micro++)
            ERR_TRY(post_input(r, micro, e));
    for (int i = 0; i < 2 * M; i++)
        ERR_TRY(r->ops[i].backward ? backward(r, r->ops[i].micro, e)
                               : forward(r, r->ops[i].micro, e));
    ERR_TRY(ws_drain(r, e));

    double t0 = stage_now_ms();
    char *w = r->persistent;
    const struct stage_layout *lay = &r->lay;
    for (int li = 0; li < lay->n_layers; li++) {
        const struct layer_layout *L = &lay->layers[li];
        for (int k = 0; k < L->n_params; k++) {
            int64_t off = L->param_off[k];
            ERR_TRY(r->be->ops->adamw(r->be, w + L->weight_off[k], (float *)(w + lay->master_at + off),
                                  (float *)(w + lay->grads_at + off),
                                  (float *)(w + lay->m_at + off), (float *)(w + lay->v_at + off),
                                  L->params[k].elems, lay->dtype, &r->c.adamw, (int)(step + 1),
                                  layout_param_decays(L->params[k].name), e));
        }
    }
    ERR_TRY(r->be->ops->sync(r->be, e));
    event(r, STAGE_EV_OPTIMIZER, -1, -1, t0, stage_now_ms());
    if (r->c.stage == r->c.n_stages - 1) {
        double sum = 0;
        for (int micro = 0; micro < M; micro++)
            sum += r->mb_loss[micro];
        *loss = sum / M;
    }
    return ERR_OK;
}

/* ---- set-up ---- */

/* Weights by global layer index, tensor index and element: the same numbers whatever the
 * stage split. Drawn on the host in chunks and uploaded into the fp32 master weights, and for
 * bf16 rounded (to nearest, ties to even) into the weights the layers compute with. */
static int init_params(struct stage_runner *r, uint64_t seed, struct err *e)
{
    enum { CHUNK = 1 << 16 };
    const struct stage_layout *lay = &r->lay;
    int bf16 = lay->dtype == MODEL_DTYPE_BF16;
    float *buf = malloc(sizeof(float) * CHUNK);
    uint16_t *half = malloc(sizeof(uint16_t) * CHUNK);
    if (buf == NULL || half == NULL) {
        free(buf);
        free(half);
        return err_set(e, ERR_FAIL, "out of memory initialising weights");
    }
    int rc = ERR_OK;
    for (int li = 0; li < r->lay.n_layers && rc == ERR_OK; li++) {
        const struct layer_layout *L = &r->lay.layers[li];
        for (int k = 0; k < L->n_params && rc == ERR_OK; k++) {
            float std, fill;
            layout_param_init(r->c.model, L->params[k].name, &std, &fill);
            for (int64_t i0 = 0; i0 < L->params[k].elems && rc == ERR_OK; i0 += CHUNK) {
                int64_t n = L->params[k].elems - i0 < CHUNK ? L->params[k].elems - i0 : CHUNK;
                for (int64_t i = 0; i < n; i++)
                    buf[i] = std == 0 ? fill
                                      : (float)(std * rng_normal(rng_key(
                                                          seed, RNG_WEIGHTS,
                                                          ((uint64_t)L->layer << 8) | (uint64_t)k,
                                                          (uint64_t)(i0 + i))));
                rc = r->be->ops->upload(r->be,
                                        r->persistent + lay->master_at + L->param_off[k] + 4 * i0,
                                        buf, 4 * n, e);
                if (rc == ERR_OK && bf16) {
                    for (int64_t i = 0; i < n; i++)
                        half[i] = bf16_from_float(buf[i]);
                    rc = r->be->ops->upload(r->be, r->persistent + L->weight_off[k] + 2 * i0,
                                            half, 2 * n, e);
                }
            }
        }
    }
    free(buf);
    free(half);
    /* gradients, m and v */
    if (rc == ERR_OK)
        rc = r->be->ops->zero(r->be, r->persistent + lay->grads_at, lay->section_bytes, e);
    if (rc == ERR_OK)
        rc = r->be->ops->zero(r->be, r->persistent + lay->m_at, 2 * lay->section_bytes, e);
    return rc;
}

int stage_init(struct stage_runner *r, const struct stage_config *c, struct backend *be,
               struct transport *tp, const struct data_source *data, uint64_t seed,
               struct err *e)
{
    memset(r, 0, sizeof *r);
    r->c = *c;
    r->be = be;
    r->tp = tp;
    r->data = data;
    const struct model *m = c->model;
    if (!(be->ops->dtypes & BACKEND_DTYPE_BIT(m->dtype)))
        return err_set(e, ERR_INPUT, "model.dtype: \"%s\": the %s backend does not compute %s%s",
                       model_dtype_name(m->dtype), be->ops->name, model_dtype_name(m->dtype),
                       m->dtype == MODEL_DTYPE_BF16 ? " (bf16 is the CUDA backend's)" : "");
    ERR_TRY(layout_init(&r->lay, m, c->first, c->last, c->regen, c->in_flight, e));
    if (layout_check_limit(&r->lay, m, c->limit_bytes, c->reserve_bytes, e)) {
        layout_free(&r->lay);
        return e->code;
    }
    int64_t BT = (int64_t)m->micro_batch * m->seq_len;
    int M = c->micro_batches;
    r->host_tokens = malloc(sizeof(int32_t) * (size_t)BT);
    r->host_targets = malloc(sizeof(int32_t) * (size_t)BT);
    r->host_losses = malloc(sizeof(float) * (size_t)BT);
    r->ops = malloc(sizeof *r->ops * 2 * (size_t)M);
    r->mb_loss = calloc((size_t)M, sizeof *r->mb_loss);
    r->slot_req = malloc(sizeof(int) * (size_t)c->in_flight);
    if (!r->host_tokens || !r->host_targets || !r->host_losses || !r->ops || !r->mb_loss ||
        !r->slot_req) {
        stage_free(r);
        return err_set(e, ERR_FAIL, "out of memory setting up stage %d", c->stage);
    }
    for (int s = 0; s < c->in_flight; s++)
        r->slot_req[s] = -1;
    schedule_ops(c->schedule, c->n_stages, c->stage, M, r->ops);
    void **arena[4] = {(void **)&r->persistent, (void **)&r->activations,
                       (void **)&r->transient, (void **)&r->workspace};
    int64_t bytes[4] = {r->lay.persistent_bytes, r->lay.activation_bytes,
                        r->lay.transient_bytes, r->lay.workspace_bytes};
    for (int i = 0; i < 4; i++)
        if (bytes[i] > 0 && be->ops->alloc(be, bytes[i], arena[i], e)) {
            stage_free(r);
            return e->code;
        }
    r->live = r->peak = r->lay.persistent_bytes;
    if (init_params(r, seed, e)) {
        stage_free(r);
        return e->code;
    }
    return ERR_OK;
}

void stage_free(struct stage_runner *r)
{
    if (r->be != NULL && r->be->ops != NULL) {
        r->be->ops->release(r->be, r->persistent);
        r->be->ops->release(r->be, r->activations);
        r->be->ops->release(r->be, r->transient);
        r->be->ops->release(r->be, r->workspace);
    }
    free(r->host_tokens);
    free(r->host_targets);
    free(r->host_losses);
    free(r->ops);
    free(r->mb_loss);
    free(r->slot_req);
    free(r->events);
    layout_free(&r->lay);
    memset(r, 0, sizeof *r);
}

void stage_set_origin(struct stage_runner *r)
{
    r->origin_ms = stage_now_ms();
}

int stage_state_get(struct stage_runner *r, int64_t off, void *buf, int64_t n, struct err *e)
{
    return r->be->ops->download(r->be, buf, r->persistent + off, n, e);
}

int stage_state_put(struct stage_runner *r, int64_t off, const void *buf, int64_t n,
                    struct err *e)
{
    return r->be->ops->upload(r->be, r->persistent + off, buf, n, e);
}
