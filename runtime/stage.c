#include "stage.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "rng.h"

/* ---- the port: data set and transport ---- */

static struct stage_runner *runner(struct executor *x)
{
    return x->c.ctx;
}

/* The rank that runs virtual stage j, and the tag of a message to virtual stage j (the
 * activation into it, or the gradient of its output): the micro-batch where each rank holds
 * one chunk (the order of posting matches them, as NCCL needs), one per receiving chunk,
 * direction and micro-batch otherwise (MPI matches by tag). */
static int rank_of(const struct stage_runner *r, int j)
{
    int chunk;
    return schedule_gpu(&r->shape, j, &chunk);
}

static int tag_of(const struct stage_runner *r, int j, int gradient, int micro)
{
    return r->shape.chunks == 1 ? micro : micro + r->c.micro_batches * (2 * j + gradient);
}

static int *slot_req(struct stage_runner *r, int chunk, int micro)
{
    int at = 0;
    for (int k = 0; k < chunk; k++)
        at += r->lay.chunks[k].in_flight;
    return &r->slot_req[at + micro % r->lay.chunks[chunk].in_flight];
}

/* Posts the receipt of micro-batch `micro`'s activation into its slot of chunk c, live from
 * now. */
static int post_input(struct stage_runner *r, int c, int micro, struct err *e)
{
    struct layer_view v;
    const struct layout_chunk *ch = &r->lay.chunks[c];
    exec_view(&r->x, ch->lo, micro, &v);
    ERR_TRY(exec_arena_in(&r->x, ARENA_KEPT, micro, ch->lo, e));
    ERR_TRY(exec_mem_add(&r->x, ch->slot_bytes, e));
    return r->tp->ops->irecv(r->tp, v.kept[0], exec_boundary_bytes(r->c.model),
                             rank_of(r, ch->vstage - 1), tag_of(r, ch->vstage, 0, micro),
                             slot_req(r, c, micro), e);
}

static int port_input(struct executor *x, int micro, struct err *e)
{
    struct stage_runner *r = runner(x);
    const struct model *m = r->c.model;
    const struct layout_chunk *ch = &r->lay.chunks[x->chunk];
    int64_t BT = (int64_t)m->micro_batch * m->seq_len;
    struct layer_view v;
    exec_view(x, ch->lo, micro, &v);
    if (ch->vstage == 0) {
        ERR_TRY(exec_mem_add(x, ch->slot_bytes, e));
        ERR_TRY(data_batch(r->data, x->step, micro, r->host_tokens, NULL, e));
        ERR_TRY(r->be->ops->upload(r->be, v.kept[EMBED_TOKENS], r->host_tokens, BT * 4, e));
    } else {
        int *req = slot_req(r, x->chunk, micro);
        ERR_TRY(exec_wait(x, *req, STAGE_EV_RECV, micro, e));
        *req = -1;
    }
    if (ch->vstage == schedule_virtual_stages(&r->shape) - 1) {
        struct layer_view h;
        exec_view(x, ch->hi - 1, micro, &h);
        ERR_TRY(data_batch(r->data, x->step, micro, NULL, r->host_targets, e));
        ERR_TRY(r->be->ops->upload(r->be, h.kept[HEAD_TARGETS], r->host_targets, BT * 4, e));
    }
    return ERR_OK;
}

static int port_output_grad(struct executor *x, int micro, void *dst, struct err *e)
{
    struct stage_runner *r = runner(x);
    int req, j = r->lay.chunks[x->chunk].vstage;
    ERR_TRY(r->tp->ops->irecv(r->tp, dst, exec_boundary_bytes(r->c.model), rank_of(r, j + 1),
                              tag_of(r, j, 1, micro), &req, e));
    return exec_wait(x, req, STAGE_EV_RECV, micro, e);
}

/* To virtual stage `peer`: the activation of the next, or the gradient of the previous's
 * output. */
static int port_isend(struct executor *x, const void *buf, int64_t bytes, int peer, int micro,
                      int *req, struct err *e)
{
    struct stage_runner *r = runner(x);
    int gradient = peer < r->lay.chunks[x->chunk].vstage;
    return r->tp->ops->isend(r->tp, buf, bytes, rank_of(r, peer),
                             tag_of(r, peer, gradient, micro), req, e);
}

static int port_wait(struct executor *x, int req, struct err *e)
{
    struct stage_runner *r = runner(x);
    return r->tp->ops->wait(r->tp, req, e);
}

/* The slot is free: the receipt of the micro-batch in_flight later goes into it. */
static int port_backward_done(struct executor *x, int micro, struct err *e)
{
    struct stage_runner *r = runner(x);
    const struct layout_chunk *ch = &r->lay.chunks[x->chunk];
    if (ch->vstage > 0 && micro + ch->in_flight < r->c.micro_batches)
        return post_input(r, x->chunk, micro + ch->in_flight, e);
    return ERR_OK;
}

static int host_optimizer(const struct stage_runner *r)
{
    return r->lay.mirror_bytes > 0;
}

/* Whether layer li's optimizer is on the host (the stage's last layers', or all). */
static int hosts(const struct stage_runner *r, int li)
{
    return host_optimizer(r) && li >= r->lay.host_from;
}

/* Whether the host optimizer's updates wait for the end of the step's backward: for the
 * replicas' gradients, or for the verdict on an fp16 step, which may be skipped. */
static int defer_updates(const struct stage_runner *r)
{
    return r->c.reduce_grads != NULL || r->c.loss_scale != NULL;
}

/* AdamW's t for step `step` (0-based): the steps stepped so far, this one included. */
static int adamw_t(const struct stage_runner *r, int64_t step)
{
    return (int)(step + 1 - r->scaler.skipped);
}

static int port_first_forward(struct executor *x, int li, struct err *e)
{
    struct stage_runner *r = runner(x);
    return hosts(r, li) ? hostmirror_weights_ready(&r->mirror, x, li, e) : ERR_OK;
}

/* Deferred host updates start after the step's verdict (stage_step); the replicas' reduction
 * may start on these gradients now. */
static int port_last_backward(struct executor *x, int li, struct err *e)
{
    struct stage_runner *r = runner(x);
    if (r->c.layer_grads != NULL)
        ERR_TRY(r->c.layer_grads(r->c.reduce_ctx, r, li, e));
    return hosts(r, li) && !defer_updates(r)
               ? hostmirror_grads_done(&r->mirror, x, li, x->step, adamw_t(r, x->step), e)
               : ERR_OK;
}

static const struct exec_port stage_port = {
    .input = port_input,
    .output_grad = port_output_grad,
    .isend = port_isend,
    .wait = port_wait,
    .backward_done = port_backward_done,
    .first_forward = port_first_forward,
    .last_backward = port_last_backward,
};

/* ---- one step ---- */

/* AdamW over the parameters whose optimizer state the stage keeps: all of them, or with
 * ZeRO-1 the slice [shard_lo, shard_lo + shard_bytes) of the fp32 sections, element by element
 * as the whole would be updated (with a fraction of the optimizer on the host, the slice of
 * the layers before it). */
static int optimizer_step(struct stage_runner *r, int64_t step, struct err *e)
{
    double t0 = exec_now_ms();
    char *w = r->persistent;
    const struct stage_layout *lay = &r->lay;
    int64_t lo = lay->shard_lo, welem = sizes_weight_elem_bytes(lay->dtype);
    for (int li = 0; li < lay->n_layers; li++) {
        const struct layer_layout *L = &lay->layers[li];
        for (int k = 0; k < L->n_params; k++) {
            int64_t first, n = layout_tensor_slice(lay, li, k, lo, lay->shard_bytes, &first);
            int64_t a = L->param_off[k] + 4 * first, at = a - lo;
            if (n == 0)
                continue;
            ERR_TRY(r->be->ops->adamw(r->be, w + L->weight_off[k] + welem * first,
                                      (float *)(w + lay->dev_master_at + at),
                                      (float *)(w + lay->dev_grads_at + a),
                                      (float *)(w + lay->dev_m_at + at),
                                      (float *)(w + lay->dev_v_at + at), n,
                                      lay->dtype, &r->c.adamw, adamw_t(r, step),
                                      layout_param_decays(L->params[k].name), e));
        }
    }
    ERR_TRY(r->be->ops->sync(r->be, e));
    exec_event(&r->x, STAGE_EV_OPTIMIZER, -1, -1, t0, exec_now_ms());
    return ERR_OK;
}

static int sharded(const struct stage_runner *r);

/* Whether the streamed layers' gradients, in the host's landing once the step's copies are
 * done (exec_stream_drain), hold a NaN or an infinity. */
static int streamed_nonfinite(const struct stage_runner *r)
{
    const struct stage_layout *lay = &r->lay;
    if (lay->stream_from >= lay->n_layers)
        return 0;
    const float *g = (const float *)(hostmirror_landing(&r->mirror) +
                                     (lay->dev_section_bytes - lay->host_lo));
    for (int64_t i = 0; i < (lay->section_bytes - lay->dev_section_bytes) / 4; i++)
        if (!isfinite(g[i]))
            return 1;
    return 0;
}

/* The step's verdict (stage_step): this rank's gradients (its slice of them with ZeRO-1, whose
 * other slices it did not reduce) unscaled and checked in one pass, with a last stage's
 * losses; the flag agreed over every rank; then the loss scale's update. */
static int step_verdict(struct stage_runner *r, struct err *e)
{
    const struct stage_layout *lay = &r->lay;
    const struct lossscale_config *ls = r->c.loss_scale;
    int64_t lo = sharded(r) ? lay->shard_lo : 0,
            bytes = sharded(r) ? lay->shard_bytes : lay->dev_section_bytes;
    int mine = 0;
    ERR_TRY(r->be->ops->unscale(r->be, (float *)(r->persistent + lay->dev_grads_at + lo),
                                bytes / 4, ls != NULL ? lossscale_inverse(&r->scaler) : 1.0f,
                                &mine, e));
    mine |= streamed_nonfinite(r); /* (not scaled: streaming runs without loss scaling) */
    for (int micro = 0; stage_has_head(r) && micro < r->c.micro_batches; micro++)
        mine |= !isfinite(r->x.mb_loss[micro]);
    r->last.first = mine ? 0 : -1;
    if (r->c.agree_flag != NULL)
        ERR_TRY(r->c.agree_flag(r->c.agree_ctx, mine, &r->last.first, e));
    int found = r->last.first >= 0;
    if (ls == NULL) {
        r->last.verdict = found ? STAGE_NONFINITE : STAGE_STEPPED;
        return ERR_OK;
    }
    enum lossscale_verdict v = lossscale_update(&r->scaler, ls, found);
    r->last.verdict = v == LOSSSCALE_STEP   ? STAGE_STEPPED
                      : v == LOSSSCALE_SKIP ? STAGE_SKIPPED
                                            : STAGE_AT_MIN;
    return ERR_OK;
}

int stage_step(struct stage_runner *r, int64_t step, double *loss, struct err *e)
{
    int M = r->c.micro_batches;
    r->x.step = step;
    r->x.loss_scale = r->last.loss_scale = r->c.loss_scale != NULL ? r->scaler.scale : 1.0f;
    memset(&r->x.times, 0, sizeof r->x.times);
    /* the host optimizer zeroes each of its layers' gradients before its first forward, once
     * they have gone down; those before host_lo are the device's */
    if (r->lay.host_lo > 0)
        ERR_TRY(r->be->ops->zero(r->be, r->persistent + r->lay.dev_grads_at, r->lay.host_lo, e));
    for (int c = 0; c < r->lay.n_chunks; c++)
        for (int micro = 0; r->lay.chunks[c].vstage > 0 && micro < r->lay.chunks[c].in_flight &&
                            micro < M;
             micro++)
            ERR_TRY(post_input(r, c, micro, e));
    ERR_TRY(exec_run(&r->x, e));
    if (r->c.reduce_grads != NULL)
        ERR_TRY(r->c.reduce_grads(r->c.reduce_ctx, r, e));
    ERR_TRY(step_verdict(r, e));
    int stepped = r->last.verdict == STAGE_STEPPED;
    for (int li = r->lay.n_layers - 1; stepped && defer_updates(r) && hosts(r, li); li--)
        /* in the order their last backwards ended */
        ERR_TRY(hostmirror_grads_done(&r->mirror, &r->x, li, step, adamw_t(r, step), e));
    /* the layers the host does not step (all of them, without a mirror) */
    if (stepped && r->lay.host_from > 0)
        ERR_TRY(optimizer_step(r, step, e));
    if (stepped && r->c.gather_params != NULL)
        ERR_TRY(r->c.gather_params(r->c.reduce_ctx, r, e));
    if (stage_has_head(r)) {
        double sum = 0;
        for (int micro = 0; micro < M; micro++)
            sum += r->x.mb_loss[micro];
        *loss = sum / M;
    }
    return ERR_OK;
}

int stage_has_head(const struct stage_runner *r)
{
    return layout_chunk_of(&r->lay, schedule_virtual_stages(&r->shape) - 1) >= 0;
}

/* ---- set-up ---- */

/* Weights by global layer index, tensor index and element: the same numbers whatever the
 * stage split. Drawn on the host in chunks and uploaded into the fp32 master weights, and for
 * a 16-bit model rounded (to nearest, ties to even) into the weights the layers compute with. */
static int init_params(struct stage_runner *r, uint64_t seed, struct err *e)
{
    enum { CHUNK = 1 << 16 };
    const struct stage_layout *lay = &r->lay;
    int half = model_dtype_16bit(lay->dtype);
    float *buf = malloc(sizeof(float) * CHUNK);
    uint16_t *narrow = malloc(sizeof(uint16_t) * CHUNK);
    if (buf == NULL || narrow == NULL) {
        free(buf);
        free(narrow);
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
                rc = stage_state_put(r, lay->master_at + L->param_off[k] + 4 * i0, buf, 4 * n,
                                     e);
                if (rc == ERR_OK && half) {
                    half_narrow(lay->dtype, narrow, buf, n);
                    rc = stage_state_put(r, L->weight_off[k] + 2 * i0, narrow, 2 * n, e);
                }
            }
        }
    }
    free(buf);
    free(narrow);
    /* gradients, m and v (the host mirror starts zeroed) */
    if (rc == ERR_OK)
        rc = r->be->ops->zero(r->be, r->persistent + lay->dev_grads_at, lay->dev_section_bytes,
                              e);
    if (rc == ERR_OK && lay->shard_bytes > 0)
        rc = r->be->ops->zero(r->be, r->persistent + lay->dev_m_at, 2 * lay->shard_bytes, e);
    return rc;
}

int64_t stage_temporary_bytes(const struct stage_runner *r)
{
    const struct stage_layout *lay = &r->lay;
    return r->c.arena != NULL ? r->c.arena->bytes
                              : lay->activation_bytes + lay->transient_bytes + lay->workspace_bytes;
}

/* The arenas in the caller's regions (stage_config): nothing allocated. */
static int stage_carve(struct stage_runner *r, struct err *e)
{
    const struct stage_config *c = &r->c;
    const struct stage_layout *lay = &r->lay;
    if (lay->persistent_bytes > c->persistent_bytes ||
        stage_temporary_bytes(r) > c->temporary_bytes)
        return err_set(e, ERR_NOFIT, "its persistent region holds %lld bytes and it needs %lld "
                       "(weights, gradients, optimizer state); the temporary region holds %lld "
                       "and it needs %lld (activations %lld + transient %lld + workspace %lld)",
                       (long long)c->persistent_bytes, (long long)lay->persistent_bytes,
                       (long long)c->temporary_bytes, (long long)stage_temporary_bytes(r),
                       (long long)lay->activation_bytes, (long long)lay->transient_bytes,
                       (long long)lay->workspace_bytes);
    r->persistent = c->persistent;
    r->activations = c->temporary;
    if (c->arena != NULL) /* the plan's arena holds the transient and the workspace too */
        return ERR_OK;
    r->transient = r->activations + lay->activation_bytes;
    r->workspace = r->transient + lay->transient_bytes;
    return ERR_OK;
}

/* The host buffers of a micro-batch's tokens and targets, and each slot's pending request. */
static int alloc_host_side(struct stage_runner *r, struct err *e)
{
    const struct stage_config *c = &r->c;
    int64_t BT = (int64_t)c->model->micro_batch * c->model->seq_len;
    r->host_tokens = malloc(sizeof(int32_t) * (size_t)BT);
    r->host_targets = malloc(sizeof(int32_t) * (size_t)BT);
    int slots = 0;
    for (int k = 0; k < r->lay.n_chunks; k++)
        slots += r->lay.chunks[k].in_flight;
    r->slot_req = malloc(sizeof(int) * (size_t)slots);
    if (!r->host_tokens || !r->host_targets || !r->slot_req)
        return err_set(e, ERR_FAIL, "out of memory setting up stage %d", c->stage);
    for (int s = 0; s < slots; s++)
        r->slot_req[s] = -1;
    return ERR_OK;
}

/* The layout's arenas on the backend (or carved from the caller's persistent memory, or the
 * slots, transient and workspace as one arena by a reuse plan), the staging buffer and the
 * pinned host memory of offloaded tensors. */
static int alloc_arenas(struct stage_runner *r, struct err *e)
{
    const struct stage_config *c = &r->c;
    void **arena[4] = {(void **)&r->persistent, (void **)&r->activations,
                       (void **)&r->transient, (void **)&r->workspace};
    int64_t bytes[4] = {r->lay.persistent_bytes, r->lay.activation_bytes,
                        r->lay.transient_bytes, r->lay.workspace_bytes};
    if (c->arena != NULL) { /* one arena for the slots, the transient and the workspace */
        ERR_TRY(arena_run_init(&r->arena, c->arena, &r->lay, c->micro_batches, c->check_arena,
                               c->arena_where != NULL ? c->arena_where : "arena", e));
        bytes[1] = c->arena->bytes;
        bytes[2] = bytes[3] = 0;
    }
    if (c->persistent != NULL)
        ERR_TRY(stage_carve(r, e));
    for (int i = 0; i < 4 && c->persistent == NULL; i++)
        if (bytes[i] > 0)
            ERR_TRY(r->be->ops->alloc(r->be, bytes[i], arena[i], e));
    if (r->lay.staging_bytes > 0 && c->arena == NULL)
        ERR_TRY(r->be->ops->alloc(r->be, r->lay.staging_bytes, (void **)&r->staging, e));
    if (r->lay.host_bytes > 0 &&
        r->be->ops->host_alloc(r->be, r->lay.host_bytes, (void **)&r->host, e))
        return err_set(e, ERR_NOFIT, "stage %d: host memory for offloaded tensors: %s",
                       c->stage, e->msg);
    return ERR_OK;
}

/* Host staging, receipt handles, the four arenas and the executor over them. */
static int stage_alloc(struct stage_runner *r, struct err *e)
{
    const struct stage_config *c = &r->c;
    ERR_TRY(alloc_host_side(r, e));
    ERR_TRY(alloc_arenas(r, e));
    struct exec_config xc = {
        .model = c->model,
        .lay = &r->lay,
        .persistent = r->persistent,
        .activations = r->activations,
        .transient = r->transient,
        .workspace = c->arena != NULL ? r->activations + r->arena.workspace_at : r->workspace,
        .arena = c->arena != NULL ? &r->arena : NULL,
        .be = r->be,
        .port = &stage_port,
        .ctx = r,
        .schedule = c->schedule,
        .stage = c->stage,
        .n_stages = c->n_stages,
        .micro_batches = c->micro_batches,
        .limit_bytes = c->limit_bytes - c->reserve_bytes,
        .record_events = c->record_events,
        .staging = r->staging,
        .host = r->host,
        .prefetch_depth = r->depth,
        .host_limit_bytes = c->host_limit_bytes,
    };
    if (host_optimizer(r)) {
        ERR_TRY(hostmirror_init(&r->mirror, r->be, &r->lay, r->persistent, &c->adamw,
                                c->host_threads, e));
        xc.host_weights = hostmirror_weights(&r->mirror);
        xc.host_landing = hostmirror_landing(&r->mirror);
    }
    if (r->lay.n_wbuf > 0) /* after the activations' staging buffers */
        xc.wbufs = r->staging + (int64_t)r->lay.n_staging * r->lay.staging_buf_bytes;
    ERR_TRY(exec_init(&r->x, &xc, e));
    exec_host_resident(&r->x, r->lay.mirror_bytes);
    return ERR_OK;
}

/* Whether layer l of plan stage st runs its backward split: the plan costed its weight pass
 * (cost.h: a layer kept whole on the device, under a schedule that splits). */
static int splits(const struct plan_stage *st, int l)
{
    const struct layer_action *a = &st->actions[l];
    return st->layers[l].wgrad_bytes > 0 && a->choice == COST_KEEP && !layer_action_offloads(a);
}

int stage_config_of_plan(struct stage_config *c, const struct plan *p, int s, double lr,
                         struct layout_place **place, struct err *e)
{
    int members[SCHEDULE_CHUNKS_MAX], k = plan_gpu_stages(p, s, members), n = 0;
    for (int i = 0; i < k; i++)
        n += plan_stage_layer_count(&p->stages[members[i]]);
    *place = calloc((size_t)n, sizeof **place);
    if (*place == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    const struct plan_stage *st = &p->stages[members[0]];
    *c = (struct stage_config){
        .model = &p->model,
        .stage = s,
        .n_stages = p->n_stages / k,
        .micro_batches = p->micro_batches,
        .schedule = p->schedule,
        .first = st->first,
        .last = st->last,
        .place = *place,
        .in_flight = st->in_flight,
        .n_chunks = k,
        .adamw = adamw_params_gpt((float)lr),
        .limit_bytes = st->memory_limit_bytes,
        .reserve_bytes = p->reserve_bytes,
        .arena = st->arena,
    };
    for (int i = 0, at = 0; i < k; i++) {
        const struct plan_stage *ch = &p->stages[members[i]];
        c->chunks[i] = (struct layout_chunk_spec){ch->first, ch->last, members[i], ch->in_flight};
        for (int l = 0; l < plan_stage_layer_count(ch); l++, at++)
            ERR_TRY(layout_place_of(&p->model, ch->first + l, l, &ch->actions[l],
                                    &ch->layers[l], splits(ch, l), &(*place)[at], e));
    }
    c->optimizer = st->optimizer;
    c->optimizer_from = st->optimizer_from;
    c->stream_layers = plan_stage_streams(st);
    if (plan_stage_offloads(st) || st->optimizer == COST_PLACE_HOST)
        c->host_limit_bytes = st->host_limit_bytes;
    return ERR_OK;
}

/* How many layer-ops ahead a prefetch may start (late ones move up to it): by default the
 * plan's furthest, whose staging buffers the plan counted. */
static int prefetch_depth(const struct stage_config *c)
{
    int depth = 1, n = c->last - c->first + 1;
    for (int li = 0; c->place != NULL && li < n; li++)
        if (c->place[li].offload != 0 && c->place[li].ahead > depth)
            depth = c->place[li].ahead;
    return c->prefetch_depth > 0 ? c->prefetch_depth : depth;
}

/* The host slots and the optimizer's mirror must fit the host memory free now, before
 * anything is allocated. */
static int check_host_free(const struct stage_runner *r, struct err *e)
{
    long long avail = -1, kb;
    char line[256];
    int64_t need = r->lay.host_bytes + r->lay.mirror_bytes;
    FILE *f = need > 0 ? fopen("/proc/meminfo", "r") : NULL;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1)
            avail = kb * 1024;
    if (f != NULL)
        fclose(f);
    if (avail >= 0 && need > avail)
        return err_set(e, ERR_NOFIT,
                       "stage %d: offloading and the optimizer's mirror need %lld bytes of host "
                       "memory (%d in flight x %lld, and %lld), but this host has %lld available",
                       r->c.stage, (long long)need, r->lay.in_flight,
                       (long long)r->lay.host_slot_bytes, (long long)r->lay.mirror_bytes, avail);
    return ERR_OK;
}

/* With the plan's arena: state + arena within limit - reserve. */
static int arena_check_limit(const struct stage_runner *r, struct err *e)
{
    int64_t need = r->lay.persistent_bytes + r->c.arena->bytes;
    if (need > r->c.limit_bytes - r->c.reserve_bytes)
        return err_set(e, ERR_NOFIT, "layers %d-%d do not fit the memory limit: state %lld + "
                       "arena %lld = %lld bytes, over memory_limit_bytes %lld minus "
                       "reserve_bytes %lld", r->c.first, r->c.last,
                       (long long)r->lay.persistent_bytes, (long long)r->c.arena->bytes,
                       (long long)need, (long long)r->c.limit_bytes,
                       (long long)r->c.reserve_bytes);
    return ERR_OK;
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
        return err_set(e, ERR_INPUT, "model.dtype: \"%s\": the %s backend does not compute %s",
                       model_dtype_name(m->dtype), be->ops->name, model_dtype_name(m->dtype));
    struct layout_chunk_spec one = {c->first, c->last, c->stage, c->in_flight};
    int n_chunks = c->n_chunks > 0 ? c->n_chunks : 1;
    r->shape = schedule_shape_of(c->schedule, c->n_stages, n_chunks, c->micro_batches);
    if (c->optimizer == COST_PLACE_HOST && (n_chunks > 1 || schedule_splits(c->schedule)))
        return err_set(e, ERR_INPUT, "the optimizer on the host runs with schedules 1f1b and "
                       "gpipe, not %s", schedule_name(c->schedule));
    struct layout_spec spec = {
        .chunks = c->n_chunks > 0 ? c->chunks : &one,
        .n_chunks = n_chunks,
        .place = c->place,
        .prefetch_depth = r->depth = prefetch_depth(c),
        .optimizer = c->optimizer,
        .optimizer_from = c->optimizer_from,
        .shard = c->shard,
        .shards = c->shards,
        .stream_layers = c->stream_layers,
    };
    if (c->stream_layers > 0 &&
        (c->loss_scale != NULL || c->reduce_grads != NULL || c->arena != NULL))
        return err_set(e, ERR_INPUT, "streamed weights run without fp16's loss scaling, data "
                       "parallelism or the plan's arena (layers %d-%d)", c->first, c->last);
    ERR_TRY(layout_stage(&r->lay, m, &spec, e));
    be->host_link_gbps = c->host_link_gbps;
    be->host_link_latency_us = c->host_link_latency_us;
    /* with the plan's arena the staging buffers are objects in it (arena_run.h) */
    if ((c->arena != NULL
             ? arena_check_limit(r, e)
             : layout_check_limit(&r->lay, m, c->limit_bytes, c->reserve_bytes, e)) ||
        layout_check_host(&r->lay, c->host_limit_bytes, e) || check_host_free(r, e)) {
        layout_free(&r->lay);
        return e->code;
    }
    if (stage_alloc(r, e) || init_params(r, seed, e)) {
        stage_free(r);
        return e->code;
    }
    if (c->loss_scale != NULL)
        lossscale_init(&r->scaler, c->loss_scale);
    return ERR_OK;
}

void stage_free(struct stage_runner *r)
{
    if (r->mirror.lay != NULL) /* first: its copies and thread use the arenas */
        hostmirror_free(&r->mirror);
    if (r->be != NULL && r->be->ops != NULL && r->c.persistent == NULL) {
        r->be->ops->release(r->be, r->persistent);
        r->be->ops->release(r->be, r->activations);
        r->be->ops->release(r->be, r->transient);
        r->be->ops->release(r->be, r->workspace);
        r->be->ops->release(r->be, r->staging);
        r->be->ops->host_release(r->be, r->host);
    }
    free(r->host_tokens);
    free(r->host_targets);
    free(r->slot_req);
    exec_free(&r->x);
    arena_run_free(&r->arena);
    layout_free(&r->lay);
    memset(r, 0, sizeof *r);
}

void stage_set_origin(struct stage_runner *r)
{
    r->x.origin_ms = exec_now_ms();
}

int stage_drain(struct stage_runner *r, struct err *e)
{
    return host_optimizer(r) ? hostmirror_drain(&r->mirror, &r->x, e) : ERR_OK;
}

int64_t stage_state_bytes(const struct stage_runner *r)
{
    return r->lay.state_bytes;
}

/* The first piece of the stage's state [off, off+n), laid out as the optimizer on the device
 * keeps it: weights and gradients on the device; of the optimizer's sections the device's
 * slice [shard_lo, shard_lo + shard_bytes) at *dev, the host mirror's [host_lo, section) at
 * *mirror (master | m | v: the state has no fp32 master, whose weights are the device's), or
 * with ZeRO-1 another replica's (both -1). Returns its bytes. */
static int64_t state_piece(const struct stage_layout *lay, int64_t off, int64_t n, int64_t *dev,
                           int64_t *mirror)
{
    int64_t opt_at = lay->grads_at + lay->section_bytes, S = lay->section_bytes;
    int64_t lo = lay->shard_lo, hi = lo + lay->shard_bytes, q = (off - opt_at) / S,
            x = (off - opt_at) % S, g = off - lay->grads_at, end;
    int64_t host = S - lay->host_lo; /* a mirror section's bytes */
    *dev = *mirror = -1;
    if (off < lay->dev_weights_bytes) {
        *dev = off;
        end = lay->dev_weights_bytes - off;
    } else if (off < lay->weights_bytes) { /* streamed weights: the host's copy */
        *mirror = 4 * host + off - lay->dev_weights_bytes;
        end = lay->weights_bytes - off;
    } else if (g < lay->dev_section_bytes) {
        *dev = lay->dev_grads_at + g;
        end = lay->dev_section_bytes - g;
    } else if (off < opt_at) { /* streamed gradients: the landing */
        *mirror = 3 * host + g - lay->host_lo;
        end = S - g;
    } else if (x >= lo && x < hi) {
        *dev = opt_at + q * lay->shard_bytes + x - lo;
        end = hi - x;
    } else if (x >= lay->host_lo) {
        *mirror = (q + (lay->dtype == MODEL_DTYPE_FP32)) * (S - lay->host_lo) + x - lay->host_lo;
        end = S - x;
    } else {
        end = (x < lo ? lo : lay->host_lo) - x;
    }
    return n < end ? n : end;
}

static int sharded(const struct stage_runner *r)
{
    return r->c.shards > 1 && !host_optimizer(r);
}

int stage_state_get(struct stage_runner *r, int64_t off, void *buf, int64_t n, struct err *e)
{
    const struct stage_layout *lay = &r->lay;
    if (host_optimizer(r))
        ERR_TRY(stage_drain(r, e));
    while (n > 0) {
        int64_t dev, at, len = state_piece(lay, off, n, &dev, &at);
        if (dev >= 0)
            ERR_TRY(r->be->ops->download(r->be, buf, r->persistent + dev, len, e));
        else if (at >= 0)
            memcpy(buf, r->mirror.mem + at, (size_t)len);
        else if (r->shard_state != NULL)
            memcpy(buf, r->shard_state + (off - lay->grads_at - lay->section_bytes), (size_t)len);
        else
            return err_set(e, ERR_FAIL, "internal: stage %d keeps slice %d of %d of its "
                           "optimizer state, and the others' were not gathered",
                           r->c.stage, r->c.shard, r->c.shards);
        buf = (char *)buf + len;
        off += len;
        n -= len;
    }
    return ERR_OK;
}

int stage_state_put(struct stage_runner *r, int64_t off, const void *buf, int64_t n,
                    struct err *e)
{
    const struct stage_layout *lay = &r->lay;
    if (host_optimizer(r))
        ERR_TRY(stage_drain(r, e));
    while (n > 0) {
        int64_t dev, at, len = state_piece(lay, off, n, &dev, &at);
        if (dev >= 0) /* else another replica's slice */
            ERR_TRY(r->be->ops->upload(r->be, r->persistent + dev, buf, len, e));
        else if (at >= 0)
            memcpy(r->mirror.mem + at, buf, (size_t)len);
        /* fp32: the mirror's master weights are its layers' weights (a section's offsets) */
        int64_t a = off > lay->host_lo ? off : lay->host_lo,
                b = off + len < lay->weights_bytes ? off + len : lay->weights_bytes;
        if (host_optimizer(r) && lay->dtype == MODEL_DTYPE_FP32 && a < b)
            memcpy(r->mirror.mem + (a - lay->host_lo), (const char *)buf + (a - off),
                   (size_t)(b - a));
        buf = (const char *)buf + len;
        off += len;
        n -= len;
    }
    return ERR_OK;
}

/* Section s of the state's values (stage_state_check): where it starts, the element size, and
 * its name; the weights (s 0), then the optimizer's sections after the gradients. */
static int64_t value_section(const struct stage_layout *lay, int s, int *elem, const char **name)
{
    static const char *const names16[] = {"weights", "master weights", "AdamW m", "AdamW v"};
    static const char *const names32[] = {"weights", "AdamW m", "AdamW v"};
    int half = model_dtype_16bit(lay->dtype);
    *name = half ? names16[s] : names32[s];
    *elem = s == 0 ? (int)sizes_weight_elem_bytes(lay->dtype) : 4;
    return s == 0 ? 0 : lay->grads_at + (int64_t)s * lay->section_bytes;
}

int stage_state_check(const struct stage_runner *r, int64_t off, const void *buf, int64_t n,
                      struct err *e)
{
    const struct stage_layout *lay = &r->lay;
    int sections = model_dtype_16bit(lay->dtype) ? 4 : 3;
    for (int s = 0; s < sections; s++) {
        int elem;
        const char *what;
        int64_t base = value_section(lay, s, &elem, &what);
        for (int li = 0; li < lay->n_layers; li++) {
            const struct layer_layout *L = &lay->layers[li];
            for (int k = 0; k < L->n_params; k++) {
                int64_t t0 = base + (s == 0 ? L->weight_off[k] : L->param_off[k]);
                int64_t a = t0 > off ? t0 : off, b = t0 + L->params[k].elems * elem;
                b = b < off + n ? b : off + n;
                for (int64_t x = a; x < b; x += elem) {
                    const char *p = (const char *)buf + (x - off);
                    float v;
                    if (elem == 2) {
                        uint16_t h;
                        memcpy(&h, p, sizeof h);
                        v = half_to_float(lay->dtype, h);
                    } else {
                        memcpy(&v, p, sizeof v);
                    }
                    if (isfinite(v))
                        continue;
                    char layer[MODEL_LAYER_NAME_MAX];
                    model_layer_name(r->c.model, L->layer, layer);
                    return err_set(e, ERR_FAIL, "layer %s's %s, %s: element %lld is %g", layer,
                                   L->params[k].name, what, (long long)((x - t0) / elem),
                                   (double)v);
                }
            }
        }
    }
    return ERR_OK;
}
