#include "measure.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec.h"
#include "half.h"
#include "layout.h"
#include "rng.h"
#include "sizes.h"
#include "stats.h"

#define POISON 0x7FA57DA5u /* a NaN as fp32, in bf16 (upper half) and in fp16 (both halves),
                              with payloads arithmetic never yields (it makes canonical NaNs),
                              and larger than any token id */
#define GUARD_BYTES 4096   /* past each arena's end: a layer writing there is caught */
#define LINE SIZES_ALIGN
#define SEED 0x70726f66696c65ull /* the weights and inputs need only be plausible */

enum arena { ARENA_PERSISTENT, ARENA_ACT, ARENA_TRANSIENT, ARENA_WS, ARENAS };

/* What a layer receives, drawn once on the host: tokens and targets (B,T); an activation and
 * an output gradient (B,T,C) in the model's activation dtype, `act_bytes` each. */
struct inputs {
    int32_t *tokens, *targets;
    void *act, *dout;
    int64_t act_bytes;
};

/* One layer under measurement, as a one-layer stage: its layout keeping everything and its
 * layout recomputed whole, and the arenas (each with its guard band) that every layout of it
 * uses. */
struct probe {
    struct backend *be;
    const struct model *m;
    const struct inputs *in;
    struct stage_layout keep, full;
    char *dev[ARENAS];
    int64_t bytes[ARENAS];  /* without the guard */
    uint32_t *host, *saved; /* downloads, as large as the largest arena + guard */
    const uint32_t *poison; /* as large */
};

/* What the scans found, in bytes. */
struct regen_scan {
    int64_t kept, regenerated; /* slot lines used after the forward; transient lines the
                                  recompute wrote */
    int64_t forward_transient; /* transient lines the forward wrote */
    int64_t differs;           /* transient words where the recompute's differ */
};

struct measured {
    int64_t state, act, out, workspace;
    int64_t param, grad, optimizer; /* state's split */
    struct regen_scan full, opt[PROFILE_OPTIONS_MAX];
};

/* ---- the host link ---- */

/* One copy to or from host memory, start to finish, in milliseconds. */
static int timed_copy(struct backend *be, int dir, char *dev, char *host, int64_t bytes,
                      double *ms, struct err *e)
{
    int ev;
    ERR_TRY(be->ops->sync(be, e));
    double t0 = exec_now_ms();
    ERR_TRY(be->ops->copy_async(be, dir, dir == BACKEND_TO_HOST ? host : dev,
                                dir == BACKEND_TO_HOST ? dev : host, bytes, -1, &ev, e));
    ERR_TRY(be->ops->event_wait(be, ev, e));
    ERR_TRY(be->ops->sync(be, e)); /* CUDA: the compute stream waited for the copy */
    *ms = exec_now_ms() - t0;
    return ERR_OK;
}

static int link_median(struct backend *be, int dir, char *dev, char *host, int64_t bytes,
                       int repeats, double *t, double *ms, struct err *e)
{
    for (int i = 0; i < repeats; i++)
        ERR_TRY(timed_copy(be, dir, dev, host, bytes, &t[i], e));
    *ms = stats_median(t, repeats);
    return ERR_OK;
}

int measure_host_link(struct backend *be, int64_t bytes, int repeats, double *gbps,
                      double *latency_us, struct err *e)
{
    enum { SMALL = SIZES_ALIGN };
    char *dev = NULL, *host = NULL;
    double *t = malloc(sizeof *t * (size_t)(repeats + 1)), lat = 0, big[2] = {0, 0};
    int rc = t == NULL ? err_set(e, ERR_FAIL, "out of memory timing the host link") : ERR_OK;
    if (rc == ERR_OK)
        rc = be->ops->alloc(be, bytes, (void **)&dev, e);
    if (rc == ERR_OK)
        rc = be->ops->host_alloc(be, bytes, (void **)&host, e);
    if (rc == ERR_OK) /* the copy lanes start, buffers are touched: untimed */
        rc = be->ops->zero(be, dev, bytes, e);
    if (rc == ERR_OK) {
        memset(host, 0, (size_t)bytes);
        double warm;
        rc = timed_copy(be, BACKEND_TO_HOST, dev, host, bytes, &warm, e);
    }
    for (int dir = 0; dir < 2 && rc == ERR_OK; dir++) {
        double small;
        rc = link_median(be, dir, dev, host, SMALL, repeats, t, &small, e);
        if (rc == ERR_OK)
            rc = link_median(be, dir, dev, host, bytes, repeats, t, &big[dir], e);
        if (rc == ERR_OK && small > lat)
            lat = small;
    }
    if (rc == ERR_OK) {
        double slow = big[0] > big[1] ? big[0] : big[1];
        /* A small copy about as slow as the big one (a fast memcpy behind a thread hand-off)
         * resolves no latency to subtract: the big copy's whole time is its wire time, a
         * bandwidth that errs low, never the absurd one a near-zero difference gives. */
        double wire = slow - lat >= 0.5 * slow ? slow - lat : slow;
        *latency_us = lat * 1e3;
        *gbps = (double)bytes * 8 / (wire * 1e6);
    }
    be->ops->release(be, dev);
    be->ops->host_release(be, host);
    free(t);
    return rc;
}

/* ---- scans ---- */

static int64_t span(const struct probe *p, enum arena a)
{
    return p->bytes[a] + GUARD_BYTES;
}

static int poison(struct probe *p, enum arena a, struct err *e)
{
    return p->be->ops->upload(p->be, p->dev[a], p->poison, span(p, a), e);
}

static int fetch(struct probe *p, enum arena a, uint32_t *dst, struct err *e)
{
    return p->be->ops->download(p->be, dst, p->dev[a], span(p, a), e);
}

/* Bytes of the 64-byte lines in [0, bytes) holding a word other than the poison. */
static int64_t used_lines(const uint32_t *w, int64_t bytes)
{
    int64_t used = 0, per = LINE / 4;
    for (int64_t line = 0; line < bytes / LINE; line++)
        for (int64_t i = 0; i < per; i++)
            if (w[line * per + i] != POISON) {
                used += LINE;
                break;
            }
    return used;
}

/* Bytes in [0, bytes) of the elements (`unit` bytes: 4, or 2 for a 16-bit model) that are no
 * longer the poison's. */
static int64_t used_bytes(const uint32_t *w, int64_t bytes, int unit)
{
    int64_t used = 0;
    for (int64_t i = 0; i < bytes / 4; i++) {
        if (unit == 4)
            used += w[i] != POISON ? 4 : 0;
        else
            used += ((w[i] & 0xffffu) != (POISON & 0xffffu) ? 2 : 0) +
                    ((w[i] >> 16) != (POISON >> 16) ? 2 : 0);
    }
    return used;
}

/* ---- inputs and weights ---- */

static void inputs_free(struct inputs *in)
{
    free(in->tokens);
    free(in->targets);
    free(in->act);
    free(in->dout);
}

static int inputs_init(struct inputs *in, const struct model *m, struct err *e)
{
    int64_t BT = (int64_t)m->micro_batch * m->seq_len, BTC = BT * m->n_embd;
    int elem = sizes_act_elem_bytes(m->dtype);
    in->act_bytes = BTC * elem;
    in->tokens = malloc(sizeof(int32_t) * (size_t)BT);
    in->targets = malloc(sizeof(int32_t) * (size_t)BT);
    in->act = malloc((size_t)in->act_bytes);
    in->dout = malloc((size_t)in->act_bytes);
    if (!in->tokens || !in->targets || !in->act || !in->dout) {
        inputs_free(in);
        return err_set(e, ERR_FAIL, "out of host memory for one micro-batch's inputs");
    }
    for (int64_t i = 0; i < BT; i++) {
        in->tokens[i] = (int32_t)(rng_key(SEED, 1, 0, (uint64_t)i) % (uint64_t)m->vocab_size);
        in->targets[i] = (int32_t)(rng_key(SEED, 2, 0, (uint64_t)i) % (uint64_t)m->vocab_size);
    }
    /* a residual stream of unit scale, and a small gradient */
    for (int64_t i = 0; i < BTC; i++) {
        float a = (float)rng_normal(rng_key(SEED, 3, 0, (uint64_t)i));
        float d = (float)(1e-3 * rng_normal(rng_key(SEED, 4, 0, (uint64_t)i)));
        if (elem == 2) {
            ((uint16_t *)in->act)[i] = half_from_float(m->dtype, a);
            ((uint16_t *)in->dout)[i] = half_from_float(m->dtype, d);
        } else {
            ((float *)in->act)[i] = a;
            ((float *)in->dout)[i] = d;
        }
    }
    return ERR_OK;
}

/* Weights as training starts them (layout_param_init) in the fp32 master weights and, for a
 * 16-bit model, its 16-bit weights; gradients and AdamW's moments zero. Every layer of `sl`, in the
 * persistent arena at `base`; `buf` holds the largest tensor in fp32. */
static int params_init(struct backend *be, const struct model *m, const struct stage_layout *sl,
                       char *base, float *buf, struct err *e)
{
    for (int li = 0; li < sl->n_layers; li++) {
        const struct layer_layout *L = &sl->layers[li];
        for (int k = 0; k < L->n_params; k++) {
            float std, fill;
            int64_t n = L->params[k].elems;
            layout_param_init(m, L->params[k].name, &std, &fill);
            /* a 7B model's draws take minutes on one core */
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < n; i++)
                buf[i] = std == 0 ? fill
                                  : (float)(std * rng_normal(rng_key(SEED, 5, (uint64_t)L->layer,
                                                                     ((uint64_t)k << 40) |
                                                                         (uint64_t)i)));
            ERR_TRY(be->ops->upload(be, base + sl->master_at + L->param_off[k], buf, 4 * n, e));
            if (model_dtype_16bit(sl->dtype)) {
                uint16_t *half = (uint16_t *)buf; /* in place: element i after element i */
                for (int64_t i = 0; i < n; i++)
                    half[i] = half_from_float(sl->dtype, buf[i]);
                ERR_TRY(be->ops->upload(be, base + L->weight_off[k], half, 2 * n, e));
            }
        }
    }
    ERR_TRY(be->ops->zero(be, base + sl->grads_at, sl->section_bytes, e));
    return be->ops->zero(be, base + sl->m_at, 2 * sl->section_bytes, e);
}

/* ---- one layer through the backend table ---- */

/* The layer's input arrives in its checkpoint, as the previous stage's output (or the data)
 * would: tokens; an activation; an activation and targets. */
static int put_input(struct backend *be, const struct inputs *in, const struct layer_view *v,
                     struct err *e)
{
    int64_t BT = (int64_t)v->model->micro_batch * v->model->seq_len;
    switch (v->kind) {
    case MODEL_LAYER_EMBED:
        return be->ops->upload(be, v->kept[EMBED_TOKENS], in->tokens, 4 * BT, e);
    case MODEL_LAYER_BLOCK:
        return be->ops->upload(be, v->kept[BLOCK_INP], in->act, in->act_bytes, e);
    case MODEL_LAYER_HEAD:
        ERR_TRY(be->ops->upload(be, v->kept[HEAD_INP], in->act, in->act_bytes, e));
        return be->ops->upload(be, v->kept[HEAD_TARGETS], in->targets, 4 * BT, e);
    }
    return ERR_OK;
}

/* The gradient of the output arrives from the next stage (the head has none). */
static int put_dout(struct backend *be, const struct inputs *in, const struct layer_view *v,
                    struct err *e)
{
    if (v->kind == MODEL_LAYER_HEAD)
        return ERR_OK;
    void *dst = v->ws[v->kind == MODEL_LAYER_EMBED ? EMBED_DOUT : BLOCK_DOUT];
    return be->ops->upload(be, dst, in->dout, in->act_bytes, e);
}

/* Where a stage's last layer puts its output: the send buffer (the head: nowhere). */
static void *send_buffer(const struct layer_view *v)
{
    return v->kind == MODEL_LAYER_EMBED   ? v->ws[EMBED_OUT]
           : v->kind == MODEL_LAYER_BLOCK ? v->ws[BLOCK_OUT]
                                          : NULL;
}

static int layer_forward(struct backend *be, const struct layer_view *v, void *out, struct err *e)
{
    return backend_layers(be, v->model)[v->kind].forward(be, v, out, e);
}

static int layer_backward(struct backend *be, const struct layer_view *v, struct err *e)
{
    float scale = (float)(1.0 / ((double)v->model->micro_batch * v->model->seq_len));
    return backend_layers(be, v->model)[v->kind].backward(be, v, scale, e);
}

/* ---- memory ---- */

static void view(struct probe *p, const struct stage_layout *sl, struct layer_view *v)
{
    layout_view(sl, p->m, 0, p->dev[ARENA_PERSISTENT], p->dev[ARENA_ACT],
                p->dev[ARENA_TRANSIENT], p->dev[ARENA_WS], v);
}

/* Kept: input, forward, output gradient, backward; then what the slot and workspace hold. */
static int measure_kept(struct probe *p, struct measured *r, struct err *e)
{
    struct layer_view v;
    view(p, &p->keep, &v);
    for (int a = ARENA_ACT; a < ARENAS; a++)
        ERR_TRY(poison(p, (enum arena)a, e));
    ERR_TRY(put_input(p->be, p->in, &v, e));
    ERR_TRY(layer_forward(p->be, &v, send_buffer(&v), e));
    ERR_TRY(fetch(p, ARENA_WS, p->host, e));
    r->out = v.kind == MODEL_LAYER_HEAD
                 ? 4
                 : used_bytes(p->host, span(p, ARENA_WS), sizes_act_elem_bytes(p->m->dtype));
    ERR_TRY(put_dout(p->be, p->in, &v, e));
    ERR_TRY(layer_backward(p->be, &v, e));
    ERR_TRY(fetch(p, ARENA_WS, p->host, e));
    r->workspace = used_lines(p->host, span(p, ARENA_WS));
    ERR_TRY(fetch(p, ARENA_ACT, p->host, e));
    r->act = used_lines(p->host, span(p, ARENA_ACT));
    return ERR_OK;
}

/* The layer regenerating `regen` (the whole layer, or an option): the slot keeps the rest,
 * the forward writes the regenerated tensors to the transient, and the recompute must write
 * exactly them again, bit for bit. */
static int measure_regen(struct probe *p, uint32_t regen, struct regen_scan *r, struct err *e)
{
    struct stage_layout sl;
    struct layer_view v;
    ERR_TRY(layout_init(&sl, p->m, p->keep.first, p->keep.last, &regen, 1, e));
    layout_view(&sl, p->m, 0, p->dev[ARENA_PERSISTENT], p->dev[ARENA_ACT],
                p->dev[ARENA_TRANSIENT], p->dev[ARENA_WS], &v);
    layout_free(&sl);
    for (int a = ARENA_ACT; a < ARENAS; a++)
        ERR_TRY(poison(p, (enum arena)a, e));
    ERR_TRY(put_input(p->be, p->in, &v, e));
    ERR_TRY(layer_forward(p->be, &v, send_buffer(&v), e));
    ERR_TRY(fetch(p, ARENA_ACT, p->host, e));
    r->kept = used_lines(p->host, span(p, ARENA_ACT));
    ERR_TRY(fetch(p, ARENA_TRANSIENT, p->saved, e));
    r->forward_transient = used_lines(p->saved, span(p, ARENA_TRANSIENT));
    ERR_TRY(poison(p, ARENA_TRANSIENT, e));
    ERR_TRY(backend_layers(p->be, v.model)[v.kind].recompute(p->be, &v, e));
    ERR_TRY(fetch(p, ARENA_TRANSIENT, p->host, e));
    r->regenerated = used_lines(p->host, span(p, ARENA_TRANSIENT));
    r->differs = 0;
    for (int64_t i = 0; i < span(p, ARENA_TRANSIENT) / 4; i++)
        r->differs += p->host[i] != p->saved[i];
    return ERR_OK;
}

/* One AdamW step over layer li of a stage laid out by sl whose persistent arena is `base`, as
 * the runtime steps it (the hyper-parameters do not change the work). */
static int adamw_layer(struct backend *be, const struct stage_layout *sl, int li, char *base,
                       struct err *e)
{
    const struct layer_layout *L = &sl->layers[li];
    struct adamw_params hp = adamw_params_gpt(1e-3f);
    for (int k = 0; k < L->n_params; k++) {
        int64_t off = L->param_off[k];
        ERR_TRY(be->ops->adamw(be, base + L->weight_off[k],
                               (float *)(base + sl->master_at + off),
                               (float *)(base + sl->grads_at + off),
                               (float *)(base + sl->m_at + off), (float *)(base + sl->v_at + off),
                               L->params[k].elems, sl->dtype, &hp, 1,
                               layout_param_decays(L->params[k].name), e));
    }
    return ERR_OK;
}

/* The persistent bytes one AdamW step over the layer touches. The gradients hold the poison
 * (a NaN): every master weight, m and v the update reads a gradient for turns NaN, so the
 * changed lines of the master weights count the gradients read too. The guard past the arena
 * must not change. */
static int measure_state(struct probe *p, struct measured *r, struct err *e)
{
    const struct stage_layout *sl = &p->keep;
    int64_t S = sl->section_bytes, total = span(p, ARENA_PERSISTENT);
    char *base = p->dev[ARENA_PERSISTENT];
    ERR_TRY(p->be->ops->upload(p->be, base + sl->grads_at, p->poison, S, e));
    ERR_TRY(p->be->ops->upload(p->be, base + sl->persistent_bytes, p->poison, GUARD_BYTES, e));
    ERR_TRY(fetch(p, ARENA_PERSISTENT, p->saved, e));
    ERR_TRY(adamw_layer(p->be, sl, 0, base, e));
    ERR_TRY(p->be->ops->sync(p->be, e));
    ERR_TRY(fetch(p, ARENA_PERSISTENT, p->host, e));
    /* a line counts when some word in it changed; the gradients' when their masters did. The
     * split: the weights' lines (an fp32 model's weights are its masters), the gradients'
     * (as many as the masters'), and the optimizer's own: m, v and a 16-bit model's masters. */
    int64_t per = LINE / 4, changed = 0, masters = 0, own = 0;
    for (int64_t line = 0; line < total / LINE; line++)
        for (int64_t i = 0; i < per; i++)
            if (p->host[line * per + i] != p->saved[line * per + i]) {
                int64_t at = line * LINE;
                int master = at >= sl->master_at && at < sl->master_at + S;
                changed += LINE;
                masters += master ? LINE : 0;
                own += (at >= sl->m_at && at < sl->m_at + S) ||
                               (at >= sl->v_at && at < sl->v_at + S) ||
                               (master && sl->master_at != 0)
                           ? LINE
                           : 0;
                break;
            }
    r->state = changed + masters;
    r->grad = masters;
    r->optimizer = own;
    r->param = changed - own;
    return ERR_OK;
}

/* ---- time ---- */

struct progress {
    FILE *f;
    int64_t done, total;
    double last_ms;
};

static void progress_draw(struct progress *pr, const char *name, int force)
{
    enum { WIDTH = 32 };
    if (pr->f == NULL)
        return;
    double t = exec_now_ms();
    if (!force && t - pr->last_ms < 100)
        return;
    pr->last_ms = t;
    int64_t total = pr->total > 0 ? pr->total : 1;
    int fill = (int)(WIDTH * pr->done / total);
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[WIDTH] = '\0';
    fprintf(pr->f, "\rprofile [%s] %3d%%  %-16s", bar, (int)(100 * pr->done / total), name);
    fflush(pr->f);
}

/* Samples of one group: per layer forward and backward, and each option's recompute. */
struct samples {
    int passes;          /* timed passes */
    double *fwd, *bwd;   /* [layer][pass] */
    double *opt;         /* [layer][option][pass / options] */
};

/* A group of layers timed as the executor runs them: the executor's context. */
struct timing {
    const struct measure_options *o;
    struct backend *be;
    const struct inputs *in;
    const struct layer_cost *c;
    struct samples *s;
    int pass, at; /* the pass, and the timed pass it is (negative during the warm-up) */
    int option;   /* the option of the layer being recomputed */
};

/* The group's input arrives as a stage's does: the data, or the previous stage's output; the
 * head's targets with the data. */
static int timing_input(struct executor *x, int micro, struct err *e)
{
    struct timing *t = x->c.ctx;
    int n = x->c.lay->n_layers;
    struct layer_view v;
    ERR_TRY(exec_mem_add(x, x->c.lay->slot_bytes, e));
    exec_view(x, 0, micro, &v);
    ERR_TRY(put_input(t->be, t->in, &v, e));
    exec_view(x, n - 1, micro, &v);
    if (n > 1 && v.kind == MODEL_LAYER_HEAD)
        return t->be->ops->upload(t->be, v.kept[HEAD_TARGETS], t->in->targets,
                                  4 * (int64_t)v.model->micro_batch * v.model->seq_len, e);
    return ERR_OK;
}

/* The gradient of the group's output arrives as the next stage's would. */
static int timing_output_grad(struct executor *x, int micro, void *dst, struct err *e)
{
    struct timing *t = x->c.ctx;
    return t->be->ops->upload(t->be, dst, t->in->dout, t->in->act_bytes, e);
}

/* Nothing is sent: isend NULL. */
static const struct exec_port timing_port = {
    .input = timing_input,
    .output_grad = timing_output_grad,
};

/* Just before the layer's backward, as in training, one of its recompute options (in turn,
 * pass by pass) regenerates its tensors into the transient as the executor's layout of that
 * option puts them. The forward kept everything, so the backward reads the slot's. */
static int time_option(struct executor *x, int li, int micro, const struct layer_view *kept,
                       struct err *e)
{
    struct timing *t = x->c.ctx;
    const struct layer_cost *L = &t->c[li];
    struct stage_layout sl;
    struct layer_view v = *kept;
    uint32_t regen = 0;
    t->option = (t->at >= 0 ? t->at : t->pass) % L->n_options;
    sizes_find_option(v.model, v.kind, L->options[t->option].name, &regen);
    ERR_TRY(layout_init(&sl, v.model, v.layer, v.layer, &regen, 1, e));
    for (int k = 0; k < sl.layers[0].n_kept; k++)
        if (regen >> k & 1)
            v.kept[k] = x->c.transient + sl.layers[0].kept_off[k];
    v.regen = regen;
    layout_free(&sl);
    return exec_recompute_span(x, li, micro, &v, e);
}

static const struct exec_action option_timing = {
    .name = "time a recompute option",
    .before_backward = time_option,
};

static void timing_span(struct executor *x, int kind, int micro, int li, double ms)
{
    struct timing *t = x->c.ctx;
    struct samples *s = t->s;
    if (t->at < 0)
        return;
    if (kind == STAGE_EV_FORWARD)
        s->fwd[(int64_t)li * s->passes + t->at] = ms;
    else if (kind == STAGE_EV_BACKWARD)
        s->bwd[(int64_t)li * s->passes + t->at] = ms;
    else if (kind == STAGE_EV_RECOMPUTE) {
        int per = s->passes / t->c[li].n_options, k = t->at / t->c[li].n_options;
        if (k < per)
            s->opt[((int64_t)li * PROFILE_OPTIONS_MAX + t->option) * per + k] = ms;
    }
}

static int timer_start(struct executor *x, struct err *e)
{
    struct measure_timer *tm = ((struct timing *)x->c.ctx)->o->timer;
    return tm->start(tm, e);
}

static int timer_stop(struct executor *x, double *ms, struct err *e)
{
    struct measure_timer *tm = ((struct timing *)x->c.ctx)->o->timer;
    return tm->stop(tm, ms, e);
}

/* The median of `repeats` timed AdamW steps over layer li (after `warmup` untimed ones): by
 * `timer` where given, else the host clock around sync. */
static int time_adamw(struct backend *be, const struct stage_layout *sl, int li, char *base,
                      const struct measure_options *o, struct measure_timer *timer, double *ms,
                      struct err *e)
{
    double *v = malloc((size_t)o->repeats * sizeof *v);
    int rc = v != NULL ? ERR_OK : err_set(e, ERR_FAIL, "out of host memory");
    for (int r = -o->warmup; r < o->repeats && rc == ERR_OK; r++) {
        double t0 = 0, d = 0;
        rc = timer != NULL ? timer->start(timer, e) : be->ops->sync(be, e);
        t0 = exec_now_ms();
        if (rc == ERR_OK)
            rc = adamw_layer(be, sl, li, base, e);
        if (rc == ERR_OK)
            rc = timer != NULL ? timer->stop(timer, &d, e) : be->ops->sync(be, e);
        if (rc == ERR_OK && timer == NULL)
            d = exec_now_ms() - t0;
        if (r >= 0)
            v[r] = d;
    }
    if (rc == ERR_OK)
        *ms = stats_median(v, o->repeats);
    free(v);
    return rc;
}

/* The same step on the host's threads (the CPU backend's AdamW, the arithmetic a host
 * optimizer runs), over a zeroed host copy of the layer's persistent state alone: as many
 * threads as the profiled CPU backend has, or every core online next to a GPU. */
static int time_host_adamw(const struct backend *dev, const struct model *m, int layer,
                           const struct measure_options *o, double *ms, struct err *e)
{
    struct backend cpu;
    struct stage_layout one;
    int threads = strcmp(dev->ops->name, "cpu") == 0 && dev->threads > 0
                      ? dev->threads
                      : (int)sysconf(_SC_NPROCESSORS_ONLN);
    ERR_TRY(layout_init(&one, m, layer, layer, NULL, 1, e));
    char *base = calloc(1, (size_t)one.persistent_bytes);
    int rc = base != NULL ? backend_cpu_init(&cpu, threads > 0 ? threads : 1, e)
                          : err_set(e, ERR_FAIL, "out of host memory (%lld bytes) for the host "
                                                 "AdamW of layer %d",
                                    (long long)one.persistent_bytes, layer);
    if (rc == ERR_OK) {
        rc = time_adamw(&cpu, &one, 0, base, o, NULL, ms, e);
        cpu.ops->free(&cpu);
    }
    free(base);
    layout_free(&one);
    return rc;
}

/* Times layers first..last laid out as one stage (layout.c: one persistent arena, one
 * activation slot, one workspace they share) and run by the executor (exec.h) as a one-stage
 * pipeline runs a micro-batch, each layer keeping everything and, just before its backward,
 * one of its recompute options in turn. Between two uses of a layer's tensors the other
 * layers pass through the caches, as in training: a layer repeated on its own runs from warm
 * caches and measures too little (on the project's CPU a block by about a fifth). */
static int run_group(struct backend *be, const struct model *m, const struct inputs *in,
                     const struct stage_layout *sl, char *arena[4], const struct measure_options *o,
                     struct samples *s, struct layer_cost *c, struct progress *pr,
                     struct err *e)
{
    struct timing t = {.o = o, .be = be, .in = in, .c = c, .s = s};
    struct exec_config xc = {
        .model = m,
        .lay = sl,
        .persistent = arena[0],
        .activations = arena[1],
        .transient = arena[2],
        .workspace = arena[3],
        .be = be,
        .port = &timing_port,
        .ctx = &t,
        .schedule = SCHEDULE_1F1B,
        .stage = 0,
        .n_stages = 1,
        .micro_batches = 1,
        .limit_bytes = INT64_MAX,
        .timer_start = o->timer != NULL ? timer_start : NULL,
        .timer_stop = o->timer != NULL ? timer_stop : NULL,
        .on_span = timing_span,
    };
    struct executor x;
    ERR_TRY(exec_init(&x, &xc, e));
    for (int li = 0; li < sl->n_layers; li++)
        if (c[li].n_options > 0)
            x.hooks[li] = (struct exec_hooks){{&option_timing}, 1};
    int rc = ERR_OK;
    for (t.pass = 0; t.pass < o->warmup + s->passes && rc == ERR_OK; t.pass++) {
        t.at = t.pass - o->warmup;
        rc = exec_run(&x, e);
        pr->done += sl->n_layers;
        progress_draw(pr, c[sl->n_layers - 1].name, 0);
    }
    exec_free(&x);
    return rc;
}

/* The first layer of the same kind and sizes as `layer`, if it comes before it, or -1. Such
 * layers carve the same arenas and write the same tensors (only their weights' values differ):
 * one memory scan and one host AdamW timing serve them all, a model's blocks done once rather
 * than n_layer times (each scan reads every arena several times over, and a 7B block's host
 * AdamW takes seconds: minutes for the 32 blocks). */
static int earlier_twin(const struct model *m, int layer)
{
    struct layer_sizes s, t;
    sizes_layer(m, layer, &s);
    for (int j = 0; j < layer; j++) {
        sizes_layer(m, j, &t);
        if (model_layer_kind(m, j) == model_layer_kind(m, layer) && memcmp(&s, &t, sizeof s) == 0)
            return j;
    }
    return -1;
}

/* Lays out layers first..last as one stage, allocates its arenas (and a transient for the
 * largest recompute), times them (run_group) and keeps the medians. c[] already names the
 * layers and their options. */
static int measure_times(struct backend *be, const struct model *m, const struct inputs *in,
                         int first, int last, const struct measure_options *o, float *buf,
                         struct layer_cost *c, struct progress *pr, struct err *e)
{
    struct stage_layout sl;
    ERR_TRY(layout_init(&sl, m, first, last, NULL, 1, e));
    int k = sl.n_layers, most = 1, rc = ERR_OK;
    int64_t transient = 0; /* the whole layer's regenerated tensors: no option has more */
    for (int li = 0; li < k; li++) {
        struct layer_sizes z;
        sizes_layer(m, first + li, &z);
        most = c[li].n_options > most ? c[li].n_options : most;
        transient = z.act_bytes - z.ckpt_bytes > transient ? z.act_bytes - z.ckpt_bytes
                                                           : transient;
    }
    /* every option of every layer timed `repeats` times: one option per pass, in turn */
    struct samples s = {o->repeats * most, NULL, NULL, NULL};
    s.fwd = malloc(sizeof(double) * (size_t)(2 * k * s.passes));
    s.opt = malloc(sizeof(double) * (size_t)(k * PROFILE_OPTIONS_MAX * s.passes));
    int64_t bytes[4] = {sl.persistent_bytes, sl.slot_bytes, transient, sl.workspace_bytes};
    char *arena[4] = {NULL, NULL, NULL, NULL};
    if (s.fwd == NULL || s.opt == NULL)
        rc = err_set(e, ERR_FAIL, "out of host memory for %d layers' samples", k);
    s.bwd = s.fwd + (int64_t)k * s.passes;
    /* with the scan's guard band: a layer writing past its arena (which the scan reports)
     * must not corrupt the heap while it is timed */
    for (int a = 0; a < 4 && rc == ERR_OK; a++)
        rc = be->ops->alloc(be, bytes[a] + GUARD_BYTES, (void **)&arena[a], e);
    if (rc == ERR_OK)
        rc = params_init(be, m, &sl, arena[0], buf, e);
    if (rc == ERR_OK)
        rc = run_group(be, m, in, &sl, arena, o, &s, c, pr, e);
    for (int li = 0; li < k && rc == ERR_OK; li++) {
        rc = time_adamw(be, &sl, li, arena[0], o, o->timer, &c[li].optimizer_ms, e);
        /* the host's AdamW of a twin's state is the same work, timed already (c[0] is
         * layer `first` of the profile's layers) */
        int twin = earlier_twin(m, first + li);
        if (rc == ERR_OK && twin >= 0)
            c[li].host_optimizer_ms = c[twin - first].host_optimizer_ms;
        else if (rc == ERR_OK)
            rc = time_host_adamw(be, m, first + li, o, &c[li].host_optimizer_ms, e);
    }
    for (int li = 0; li < k && rc == ERR_OK; li++) {
        c[li].fwd_ms = stats_median(s.fwd + (int64_t)li * s.passes, s.passes);
        c[li].bwd_ms = stats_median(s.bwd + (int64_t)li * s.passes, s.passes);
        int per = c[li].n_options > 0 ? s.passes / c[li].n_options : 0;
        for (int j = 0; j < c[li].n_options; j++)
            c[li].options[j].recompute_ms =
                stats_median(s.opt + ((int64_t)li * PROFILE_OPTIONS_MAX + j) * per, per);
    }
    for (int a = 0; a < 4; a++)
        if (arena[a] != NULL)
            be->ops->release(be, arena[a]);
    free(s.fwd);
    free(s.opt);
    layout_free(&sl);
    return rc;
}

/* ---- a layer, and every layer ---- */

static void probe_free(struct probe *p)
{
    for (int a = 0; a < ARENAS; a++)
        if (p->dev[a] != NULL)
            p->be->ops->release(p->be, p->dev[a]);
    layout_free(&p->keep);
    layout_free(&p->full);
}

static int probe_init(struct probe *p, int layer, struct err *e)
{
    uint32_t full = sizes_full_regen(p->m, model_layer_kind(p->m, layer));
    ERR_TRY(layout_init(&p->keep, p->m, layer, layer, NULL, 1, e));
    ERR_TRY(layout_init(&p->full, p->m, layer, layer, &full, 1, e));
    p->bytes[ARENA_PERSISTENT] = p->keep.persistent_bytes;
    p->bytes[ARENA_ACT] = p->keep.activation_bytes;
    p->bytes[ARENA_TRANSIENT] = p->full.transient_bytes; /* options regenerate less */
    p->bytes[ARENA_WS] = p->keep.workspace_bytes;
    for (int a = 0; a < ARENAS; a++)
        ERR_TRY(p->be->ops->alloc(p->be, span(p, (enum arena)a), (void **)&p->dev[a], e));
    return ERR_OK;
}

/* One line on `report` when a measured byte count is not the size functions'. */
static int differs(FILE *report, const char *layer, const char *what, int64_t got, int64_t want)
{
    if (got == want)
        return 0;
    if (report != NULL)
        fprintf(report,
                "ballast profile: %s: %s: measured %lld bytes, the size functions "
                "(common/sizes.c) say %lld\n",
                layer, what, (long long)got, (long long)want);
    return 1;
}

/* A recompute that does not regenerate what the forward kept in the transient, bitwise. */
static int regen_wrong(FILE *report, const char *layer, const char *what,
                       const struct regen_scan *r)
{
    if (r->regenerated == r->forward_transient && r->differs == 0)
        return 0;
    if (report != NULL)
        fprintf(report,
                "ballast profile: %s: %s: the recompute regenerates %lld bytes (%lld words "
                "unlike the forward's), but the forward kept %lld in the transient\n",
                layer, what, (long long)r->regenerated, (long long)r->differs,
                (long long)r->forward_transient);
    return 1;
}

/* Differences from the size functions, each written to `report`. */
static int compare(FILE *report, const struct model *m, int layer, const struct measured *r,
                   const struct layer_cost *c, const struct sizes_option *opt)
{
    struct layer_sizes s;
    char name[MODEL_LAYER_NAME_MAX], what[64];
    sizes_layer(m, layer, &s);
    model_layer_name(m, layer, name);
    int n = differs(report, name, "state_bytes", r->state, s.state_bytes) +
            differs(report, name, "param_bytes", r->param, s.param_bytes) +
            differs(report, name, "grad_bytes", r->grad, s.grad_bytes) +
            differs(report, name, "optimizer_bytes", r->optimizer, s.optimizer_bytes) +
            differs(report, name, "act_bytes", r->act, s.act_bytes) +
            differs(report, name, "ckpt_bytes", r->full.kept, s.ckpt_bytes) +
            differs(report, name, "out_bytes", r->out, s.out_bytes) +
            differs(report, name, "workspace_bytes", r->workspace, s.workspace_bytes) +
            regen_wrong(report, name, "recomputed whole", &r->full);
    for (int j = 0; j < c->n_options; j++) {
        int64_t kept, transient;
        sizes_regen_bytes(m, model_layer_kind(m, layer), opt[j].regen, &kept, &transient);
        snprintf(what, sizeof what, "option %s: kept_bytes", opt[j].name);
        n += differs(report, name, what, r->opt[j].kept, kept);
        snprintf(what, sizeof what, "option %s: transient_bytes", opt[j].name);
        n += differs(report, name, what, r->opt[j].regenerated, transient);
        snprintf(what, sizeof what, "option %s", opt[j].name);
        n += regen_wrong(report, name, what, &r->opt[j]);
    }
    return n;
}

static int measure_memory(struct probe *p, int layer, const struct measure_options *o,
                          struct layer_cost *c, struct progress *pr, int *mismatches,
                          struct err *e)
{
    struct measured r;
    struct sizes_option opt[SIZES_OPTIONS_MAX];
    enum model_layer_kind kind = model_layer_kind(p->m, layer);
    model_layer_name(p->m, layer, c->name);
    progress_draw(pr, c->name, 1);
    ERR_TRY(probe_init(p, layer, e));
    ERR_TRY(params_init(p->be, p->m, &p->keep, p->dev[ARENA_PERSISTENT], (float *)p->host, e));
    ERR_TRY(measure_kept(p, &r, e));
    ERR_TRY(measure_regen(p, sizes_full_regen(p->m, kind), &r.full, e));
    c->n_options = sizes_recompute_options(p->m, kind, opt);
    if (c->n_options > PROFILE_OPTIONS_MAX)
        c->n_options = PROFILE_OPTIONS_MAX;
    for (int j = 0; j < c->n_options; j++) {
        ERR_TRY(measure_regen(p, opt[j].regen, &r.opt[j], e));
        snprintf(c->options[j].name, sizeof c->options[j].name, "%s", opt[j].name);
        c->options[j].kept_bytes = r.opt[j].kept;
        c->options[j].transient_bytes = r.opt[j].regenerated;
    }
    ERR_TRY(measure_state(p, &r, e));
    pr->done++;
    *mismatches += compare(o->report, p->m, layer, &r, c, opt);
    c->state_bytes = r.state;
    c->has_split = 1;
    c->param_bytes = r.param;
    c->grad_bytes = r.grad;
    c->optimizer_bytes = r.optimizer;
    c->act_bytes = r.act;
    c->ckpt_bytes = r.full.kept;
    c->out_bytes = r.out;
    c->workspace_bytes = r.workspace;
    return ERR_OK;
}

/* Host buffers as large as the largest layer's largest arena (with the guard band): what an
 * arena is read into, what it was before, and the poison it is filled with. */
struct scan_buffers {
    uint32_t *host, *saved, *poison;
};

static int scan_buffers_init(struct scan_buffers *b, const struct model *m, struct err *e)
{
    int64_t largest = 0;
    for (int l = 0; l < model_layer_count(m); l++) {
        struct layer_sizes s;
        sizes_layer(m, l, &s);
        int64_t a[3] = {s.state_bytes, s.act_bytes, s.workspace_bytes};
        for (int k = 0; k < 3; k++)
            largest = a[k] > largest ? a[k] : largest;
    }
    size_t words = (size_t)((largest + GUARD_BYTES) / 4);
    b->host = malloc(4 * words);
    b->saved = malloc(4 * words);
    b->poison = malloc(4 * words);
    if (!b->host || !b->saved || !b->poison)
        return err_set(e, ERR_FAIL, "out of host memory (%lld bytes) to scan the arenas",
                       (long long)(12 * (int64_t)words));
    for (size_t i = 0; i < words; i++)
        b->poison[i] = POISON;
    return ERR_OK;
}

static void scan_buffers_free(struct scan_buffers *b)
{
    free(b->host);
    free(b->saved);
    free(b->poison);
}

/* The most recompute options of a layer: a group's timed passes are repeats x that. */
static int most_options(const struct model *m)
{
    int most = 1;
    for (int kind = MODEL_LAYER_EMBED; kind <= MODEL_LAYER_HEAD; kind++) {
        struct sizes_option opt[SIZES_OPTIONS_MAX];
        int k = sizes_recompute_options(m, (enum model_layer_kind)kind, opt);
        most = k > most ? k : most;
    }
    return most;
}

/* Every layer's memory, each as a one-layer stage; a layer of the same kind and sizes as an
 * earlier one takes its bytes (earlier_twin). */
static int measure_all_memory(const struct probe *proto, const struct measure_options *o,
                              struct profile *out, struct progress *pr, int *mismatches,
                              struct err *e)
{
    const struct model *m = proto->m;
    for (int l = 0; l < out->n_layers; l++) {
        int twin = earlier_twin(m, l);
        if (twin >= 0) {
            out->layers[l] = out->layers[twin];
            model_layer_name(m, l, out->layers[l].name);
            pr->done++;
            continue;
        }
        struct probe p = *proto;
        int rc = measure_memory(&p, l, o, &out->layers[l], pr, mismatches, e);
        probe_free(&p);
        ERR_TRY(rc);
    }
    return ERR_OK;
}

/* Every layer's times: consecutive layers as one stage, as many as fit the budget; *groups
 * the stages timed. */
static int measure_all_times(struct backend *be, const struct model *m, const struct inputs *in,
                             const struct measure_options *o, float *buf, struct profile *out,
                             struct progress *pr, int *groups, struct err *e)
{
    int n = out->n_layers;
    for (int l = 0, last; l < n; l = last + 1) {
        int64_t state = 0, kept = 0, ws = 0;
        for (last = l; last < n; last++) {
            struct layer_sizes s;
            sizes_layer(m, last, &s);
            state += s.state_bytes;
            kept += s.act_bytes;
            ws = s.workspace_bytes > ws ? s.workspace_bytes : ws;
            if (state + kept + ws > o->budget_bytes && last > l)
                break;
        }
        last--;
        (*groups)++;
        ERR_TRY(measure_times(be, m, in, l, last, o, buf, &out->layers[l], pr, e));
    }
    return ERR_OK;
}

/* How the profile was measured, in its provenance. */
static void add_provenance(struct profile *out, const struct measure_options *o, int groups,
                           int mismatches)
{
    if (out->provenance == NULL)
        out->provenance = cJSON_CreateObject();
    cJSON *meas = cJSON_AddObjectToObject(out->provenance, "measurement");
    cJSON_AddStringToObject(meas, "method",
                            "the runtime's layers through its backend table "
                            "(runtime/backend.h) on arenas carved by runtime/layout.c; "
                            "time: the layers as one stage, a micro-batch forward then "
                            "backward, one recompute option of each layer before its "
                            "backward in turn; optimizer_ms: the backend's AdamW over each "
                            "layer's parameters; host_optimizer_ms: the CPU backend's AdamW "
                            "over a host copy of the layer's state; memory: each layer as "
                            "a one-layer stage (layers of one kind and the same sizes "
                            "scanned once), the 64-byte lines of poisoned arenas it used");
    cJSON_AddNumberToObject(meas, "warmup", o->warmup);
    cJSON_AddNumberToObject(meas, "repeats", o->repeats);
    cJSON_AddNumberToObject(meas, "stages_timed", groups);
    cJSON_AddStringToObject(meas, "statistic", "median");
    cJSON_AddStringToObject(meas, "timer",
                            o->timer != NULL ? o->timer->name : "host monotonic clock around sync");
    cJSON_AddNumberToObject(meas, "size_function_mismatches", mismatches);
}

int measure_profile(struct backend *be, const struct model *m, const struct measure_options *o,
                    struct profile *out, int *mismatches, struct err *e)
{
    if (o->repeats < 1 || o->warmup < 0)
        return err_set(e, ERR_INPUT, "repeats %d, warm-up %d: expected at least 1 and 0",
                       o->repeats, o->warmup);
    if (!(be->ops->dtypes & BACKEND_DTYPE_BIT(m->dtype)))
        return err_set(e, ERR_INPUT, "dtype \"%s\": the %s backend does not compute it",
                       model_dtype_name(m->dtype), be->ops->name);
    int n = model_layer_count(m), groups = 0;
    *mismatches = 0;
    out->model = *m;
    out->estimated = 0;
    out->layers = calloc((size_t)n, sizeof *out->layers);
    if (out->layers == NULL)
        return err_set(e, ERR_FAIL, "out of memory for %d layers", n);
    out->n_layers = n;
    struct inputs in = {0};
    struct scan_buffers b = {0};
    int rc = scan_buffers_init(&b, m, e);
    if (rc == ERR_OK)
        rc = inputs_init(&in, m, e);
    int started = rc == ERR_OK; /* the progress bar drawn from here on */
    struct progress pr = {o->progress, 0,
                          (int64_t)n * (1 + o->warmup + (int64_t)o->repeats * most_options(m)), 0};
    struct probe proto = {.be = be, .m = m, .in = &in, .host = b.host, .saved = b.saved,
                          .poison = b.poison};
    if (rc == ERR_OK)
        rc = measure_all_memory(&proto, o, out, &pr, mismatches, e);
    if (rc == ERR_OK)
        rc = measure_all_times(be, m, &in, o, (float *)b.host, out, &pr, &groups, e);
    if (pr.f != NULL && started) {
        if (rc == ERR_OK) {
            pr.done = pr.total;
            progress_draw(&pr, "done", 1);
        }
        fputc('\n', pr.f);
    }
    inputs_free(&in);
    scan_buffers_free(&b);
    if (rc == ERR_OK)
        add_provenance(out, o, groups, *mismatches);
    return rc;
}
