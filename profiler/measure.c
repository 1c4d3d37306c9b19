#include "measure.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "layout.h"
#include "rng.h"
#include "sizes.h"

#define POISON 0x7FA5A5A5u /* a signalling NaN: arithmetic only ever yields quiet ones */
#define GUARD_BYTES 4096   /* past each arena's end: a layer writing there is caught */
#define LINE SIZES_ALIGN
#define SEED 0x70726f66696c65ull /* the weights and inputs need only be plausible */

#define TRY(call)                                                                            \
    do {                                                                                     \
        int try_rc_ = (call);                                                                \
        if (try_rc_ != ERR_OK)                                                               \
            return try_rc_;                                                                  \
    } while (0)

enum arena { ARENA_PERSISTENT, ARENA_ACT, ARENA_TRANSIENT, ARENA_WS, ARENAS };

/* The inputs a layer receives, drawn once on the host. */
struct inputs {
    int32_t *tokens, *targets; /* (B,T) */
    float *act, *dout;         /* (B,T,C) */
};

/* One layer under measurement: its two layouts and the arenas both use. */
struct probe {
    struct backend *be;
    const struct model *m;
    const struct inputs *in;
    struct stage_layout keep, rec;
    char *dev[ARENAS];      /* backend memory: arena, then guard */
    int64_t bytes[ARENAS];  /* without the guard */
    uint32_t *host, *saved; /* downloads, as large as the largest arena + guard */
    const uint32_t *poison; /* as large */
};

/* What the scans found, in bytes. */
struct measured {
    int64_t state, act, ckpt, out, workspace, regenerated;
    int64_t regen_differs; /* words where the recompute did not give the forward's value */
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v in place. */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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

static int64_t used_words(const uint32_t *w, int64_t bytes)
{
    int64_t used = 0;
    for (int64_t i = 0; i < bytes / 4; i++)
        used += w[i] != POISON;
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
    in->tokens = malloc(sizeof(int32_t) * (size_t)BT);
    in->targets = malloc(sizeof(int32_t) * (size_t)BT);
    in->act = malloc(sizeof(float) * (size_t)BTC);
    in->dout = malloc(sizeof(float) * (size_t)BTC);
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
        in->act[i] = (float)rng_normal(rng_key(SEED, 3, 0, (uint64_t)i));
        in->dout[i] = (float)(1e-3 * rng_normal(rng_key(SEED, 4, 0, (uint64_t)i)));
    }
    return ERR_OK;
}

/* Weights as training starts them (layout_param_init), gradients and AdamW state zero, for
 * every layer of `sl` in the persistent arena at `base`; `buf` holds the largest tensor. */
static int params_init(struct backend *be, const struct model *m, const struct stage_layout *sl,
                       char *base, float *buf, struct err *e)
{
    for (int li = 0; li < sl->n_layers; li++) {
        const struct layer_layout *L = &sl->layers[li];
        for (int k = 0; k < L->n_params; k++) {
            float std, fill;
            layout_param_init(m, L->params[k].name, &std, &fill);
            for (int64_t i = 0; i < L->params[k].elems; i++)
                buf[i] = std == 0 ? fill
                                  : (float)(std * rng_normal(rng_key(SEED, 5, (uint64_t)L->layer,
                                                                     ((uint64_t)k << 40) |
                                                                         (uint64_t)i)));
            TRY(be->ops->upload(be, base + L->param_off[k], buf, 4 * L->params[k].elems, e));
        }
    }
    return be->ops->zero(be, base + sl->section_bytes, 3 * sl->section_bytes, e);
}

/* ---- one layer through the backend table ---- */

static void view(struct probe *p, const struct stage_layout *sl, struct layer_view *v)
{
    layout_view(sl, p->m, 0, p->dev[ARENA_PERSISTENT], p->dev[ARENA_ACT],
                p->dev[ARENA_TRANSIENT], p->dev[ARENA_WS], v);
}

/* The layer's input arrives in its checkpoint, as the previous stage's output (or the data)
 * would: tokens; activations; activations and targets. */
static int put_input(struct backend *be, const struct inputs *in, const struct layer_view *v,
                     struct err *e)
{
    const struct model *m = v->model;
    int64_t BT = (int64_t)m->micro_batch * m->seq_len;
    switch (v->kind) {
    case MODEL_LAYER_EMBED:
        return be->ops->upload(be, v->kept[EMBED_TOKENS], in->tokens, 4 * BT, e);
    case MODEL_LAYER_BLOCK:
        return be->ops->upload(be, v->kept[BLOCK_INP], in->act, 4 * BT * m->n_embd, e);
    case MODEL_LAYER_HEAD:
        TRY(be->ops->upload(be, v->kept[HEAD_INP], in->act, 4 * BT * m->n_embd, e));
        return be->ops->upload(be, v->kept[HEAD_TARGETS], in->targets, 4 * BT, e);
    }
    return ERR_OK;
}

/* The gradient of the output arrives from the next stage (the head has none). */
static int put_dout(struct backend *be, const struct inputs *in, const struct layer_view *v,
                    struct err *e)
{
    const struct model *m = v->model;
    if (v->kind == MODEL_LAYER_HEAD)
        return ERR_OK;
    void *dst = v->ws[v->kind == MODEL_LAYER_EMBED ? EMBED_DOUT : BLOCK_DOUT];
    return be->ops->upload(be, dst, in->dout, 4 * (int64_t)m->micro_batch * m->seq_len * m->n_embd,
                           e);
}

/* Where a stage's last layer puts its output: the send buffer (the head: nowhere). */
static void *send_buffer(const struct layer_view *v)
{
    return v->kind == MODEL_LAYER_EMBED   ? v->ws[EMBED_OUT]
           : v->kind == MODEL_LAYER_BLOCK ? v->ws[BLOCK_OUT]
                                          : NULL;
}

static int forward(struct backend *be, const struct layer_view *v, void *out, struct err *e)
{
    return be->ops->layer[v->kind].forward(be, v, out, e);
}

static int backward(struct backend *be, const struct layer_view *v, struct err *e)
{
    float scale = (float)(1.0 / ((double)v->model->micro_batch * v->model->seq_len));
    return be->ops->layer[v->kind].backward(be, v, scale, e);
}

/* ---- memory ---- */

/* Activations, checkpoint, output, workspace and recompute, by poison and scan. */
static int measure_activations(struct probe *p, struct measured *r, struct err *e)
{
    const struct backend_ops *ops = p->be->ops;
    struct layer_view v;
    /* kept: input, forward, gradient, backward; then what the slot and workspace hold */
    view(p, &p->keep, &v);
    for (int a = ARENA_ACT; a < ARENAS; a++)
        TRY(poison(p, (enum arena)a, e));
    TRY(put_input(p->be, p->in, &v, e));
    TRY(forward(p->be, &v, send_buffer(&v), e));
    TRY(fetch(p, ARENA_WS, p->host, e));
    r->out = v.kind == MODEL_LAYER_HEAD ? 4 : 4 * used_words(p->host, span(p, ARENA_WS));
    TRY(put_dout(p->be, p->in, &v, e));
    TRY(backward(p->be, &v, e));
    TRY(fetch(p, ARENA_WS, p->host, e));
    r->workspace = used_lines(p->host, span(p, ARENA_WS));
    TRY(fetch(p, ARENA_ACT, p->host, e));
    r->act = used_lines(p->host, span(p, ARENA_ACT));

    /* recomputed: the slot keeps the input; the forward's other tensors go to the transient,
     * and the recompute must regenerate exactly them */
    view(p, &p->rec, &v);
    for (int a = ARENA_ACT; a < ARENAS; a++)
        TRY(poison(p, (enum arena)a, e));
    TRY(put_input(p->be, p->in, &v, e));
    TRY(forward(p->be, &v, send_buffer(&v), e));
    TRY(fetch(p, ARENA_ACT, p->host, e));
    r->ckpt = used_lines(p->host, span(p, ARENA_ACT));
    TRY(fetch(p, ARENA_TRANSIENT, p->saved, e));
    TRY(poison(p, ARENA_TRANSIENT, e));
    TRY(ops->layer[v.kind].recompute(p->be, &v, e));
    TRY(fetch(p, ARENA_TRANSIENT, p->host, e));
    r->regenerated = used_lines(p->host, span(p, ARENA_TRANSIENT));
    r->regen_differs = 0;
    for (int64_t i = 0; i < span(p, ARENA_TRANSIENT) / 4; i++)
        r->regen_differs += p->host[i] != p->saved[i];
    return ERR_OK;
}

/* The persistent bytes one AdamW step over the layer touches. The gradients hold the poison
 * (a NaN): every weight, m and v the update reads a gradient for turns NaN, so changed lines
 * of the weights count the gradients read too. The guard past the arena must not change. */
static int measure_state(struct probe *p, int64_t *state, struct err *e)
{
    const struct layer_layout *L = &p->keep.layers[0];
    int64_t S = p->keep.section_bytes, total = span(p, ARENA_PERSISTENT);
    char *base = p->dev[ARENA_PERSISTENT];
    struct adamw_params hp = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    TRY(p->be->ops->upload(p->be, base + S, p->poison, S, e));
    TRY(p->be->ops->upload(p->be, base + 4 * S, p->poison, GUARD_BYTES, e));
    TRY(fetch(p, ARENA_PERSISTENT, p->saved, e));
    for (int k = 0; k < L->n_params; k++) {
        int64_t off = L->param_off[k];
        TRY(p->be->ops->adamw(p->be, (float *)(base + off), (float *)(base + S + off),
                              (float *)(base + 2 * S + off), (float *)(base + 3 * S + off),
                              L->params[k].elems, &hp, 1, layout_param_decays(L->params[k].name),
                              e));
    }
    TRY(fetch(p, ARENA_PERSISTENT, p->host, e));
    /* a line counts when some word in it changed; the gradients' when their weights did */
    int64_t per = LINE / 4, changed = 0, weights = 0;
    for (int64_t line = 0; line < total / LINE; line++)
        for (int64_t i = 0; i < per; i++)
            if (p->host[line * per + i] != p->saved[line * per + i]) {
                changed += LINE;
                weights += line * LINE < S ? LINE : 0;
                break;
            }
    *state = changed + weights;
    return ERR_OK;
}

/* ---- time ---- */

static int span_begin(struct backend *be, double *t0, struct err *e)
{
    if (be->ops->timer_start != NULL)
        return be->ops->timer_start(be, e);
    TRY(be->ops->sync(be, e));
    *t0 = now_ms();
    return ERR_OK;
}

static int span_end(struct backend *be, double t0, double *ms, struct err *e)
{
    if (be->ops->timer_stop != NULL)
        return be->ops->timer_stop(be, ms, e);
    TRY(be->ops->sync(be, e));
    *ms = now_ms() - t0;
    return ERR_OK;
}

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
    double t = now_ms();
    if (!force && t - pr->last_ms < 100)
        return;
    pr->last_ms = t;
    int fill = (int)(WIDTH * pr->done / (pr->total > 0 ? pr->total : 1));
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[WIDTH] = '\0';
    fprintf(pr->f, "\rprofile [%s] %3d%%  %-16s", bar,
            (int)(100 * pr->done / (pr->total > 0 ? pr->total : 1)), name);
    fflush(pr->f);
}

/* Times layers first..last laid out as one stage (layout.c: one persistent arena, one
 * activation slot, one workspace they share) and run as the executor (stage.c) runs a
 * micro-batch: forward in order, each layer writing its output into the next one's
 * checkpoint, then backward in reverse, each layer's input gradient copied into the next
 * one's output gradient; `warmup` untimed passes, then `repeats` timed ones, medians. Between
 * two uses of a layer's tensors the other layers pass through the caches, as in training: a
 * layer repeated on its own runs from warm caches and measures too little (on the project's
 * CPU a block by about a fifth). */
static int measure_times(struct backend *be, const struct model *m, const struct inputs *in,
                         int first, int last, const struct measure_options *o, float *buf,
                         double *scratch, struct layer_cost *c, struct progress *pr,
                         struct err *e)
{
    struct stage_layout sl;
    TRY(layout_init(&sl, m, first, last, NULL, 1, e));
    int k = sl.n_layers, rc = ERR_OK;
    int64_t bytes[3] = {sl.persistent_bytes, sl.slot_bytes, sl.workspace_bytes};
    char *arena[3] = {NULL, NULL, NULL};
    for (int a = 0; a < 3 && rc == ERR_OK; a++)
        rc = be->ops->alloc(be, bytes[a], (void **)&arena[a], e);
    if (rc == ERR_OK)
        rc = params_init(be, m, &sl, arena[0], buf, e);
    struct layer_view v, next = {0}, prev = {0};
    double t0 = 0, ms;
    int64_t act = 4 * (int64_t)m->micro_batch * m->seq_len * m->n_embd;
    for (int i = 0; i < o->warmup + o->repeats && rc == ERR_OK; i++) {
        int timed = i >= o->warmup;
        double *f = scratch + (timed ? i - o->warmup : 0), *b = f + (int64_t)k * o->repeats;
        layout_view(&sl, m, 0, arena[0], arena[1], NULL, arena[2], &v);
        rc = put_input(be, in, &v, e);
        for (int li = 0; li < k && rc == ERR_OK; li++) {
            void *out = send_buffer(&v);
            if (li + 1 < k) {
                layout_view(&sl, m, li + 1, arena[0], arena[1], NULL, arena[2], &next);
                out = next.kept[0];
                if (next.kind == MODEL_LAYER_HEAD) /* the targets arrive with the data */
                    rc = be->ops->upload(be, next.kept[HEAD_TARGETS], in->targets,
                                         act / m->n_embd, e);
            }
            if (rc == ERR_OK)
                rc = span_begin(be, &t0, e);
            if (rc == ERR_OK)
                rc = forward(be, &v, out, e);
            if (rc == ERR_OK)
                rc = span_end(be, t0, &ms, e);
            if (timed)
                f[(int64_t)li * o->repeats] = ms;
            v = next;
        }
        for (int li = k - 1; li >= 0 && rc == ERR_OK; li--) {
            layout_view(&sl, m, li, arena[0], arena[1], NULL, arena[2], &v);
            if (li == k - 1) {
                rc = put_dout(be, in, &v, e);
            } else {
                void *src = prev.ws[prev.kind == MODEL_LAYER_HEAD ? HEAD_DINP : BLOCK_DINP];
                void *dst = v.ws[v.kind == MODEL_LAYER_EMBED ? EMBED_DOUT : BLOCK_DOUT];
                if (src != dst)
                    rc = be->ops->copy(be, dst, src, act, e);
            }
            if (rc == ERR_OK)
                rc = span_begin(be, &t0, e);
            if (rc == ERR_OK)
                rc = backward(be, &v, e);
            if (rc == ERR_OK)
                rc = span_end(be, t0, &ms, e);
            if (timed)
                b[(int64_t)li * o->repeats] = ms;
            prev = v;
        }
        pr->done += k;
        progress_draw(pr, c[k - 1].name, 0);
    }
    for (int li = 0; li < k && rc == ERR_OK; li++) {
        c[li].fwd_ms = median(scratch + (int64_t)li * o->repeats, o->repeats);
        c[li].bwd_ms = median(scratch + (int64_t)(k + li) * o->repeats, o->repeats);
    }
    for (int a = 0; a < 3; a++)
        if (arena[a] != NULL)
            be->ops->release(be, arena[a]);
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
    layout_free(&p->rec);
}

static int probe_init(struct probe *p, int layer, struct err *e)
{
    unsigned char one = 1;
    TRY(layout_init(&p->keep, p->m, layer, layer, NULL, 1, e));
    if (layout_init(&p->rec, p->m, layer, layer, &one, 1, e))
        return e->code;
    p->bytes[ARENA_PERSISTENT] = p->keep.persistent_bytes;
    p->bytes[ARENA_ACT] = p->keep.activation_bytes;
    p->bytes[ARENA_TRANSIENT] = p->rec.transient_bytes;
    p->bytes[ARENA_WS] = p->keep.workspace_bytes;
    for (int a = 0; a < ARENAS; a++)
        TRY(p->be->ops->alloc(p->be, span(p, (enum arena)a), (void **)&p->dev[a], e));
    return ERR_OK;
}

/* Differences from the size functions, each written to `report`. */
static int compare(FILE *report, const struct model *m, int layer, const struct measured *r)
{
    struct layer_sizes s;
    char name[MODEL_LAYER_NAME_MAX];
    sizes_layer(m, layer, &s);
    model_layer_name(m, layer, name);
    const char *field[5] = {"state_bytes", "act_bytes", "ckpt_bytes", "out_bytes",
                            "workspace_bytes"};
    int64_t got[5] = {r->state, r->act, r->ckpt, r->out, r->workspace};
    int64_t want[5] = {s.state_bytes, s.act_bytes, s.ckpt_bytes, s.out_bytes,
                       s.workspace_bytes};
    int n = 0;
    for (int k = 0; k < 5; k++)
        if (got[k] != want[k]) {
            n++;
            if (report != NULL)
                fprintf(report,
                        "ballast profile: %s: %s: measured %lld bytes, the size functions "
                        "(common/sizes.c) say %lld\n",
                        name, field[k], (long long)got[k], (long long)want[k]);
        }
    if (r->regenerated != r->act - r->ckpt || r->regen_differs != 0) {
        n++;
        if (report != NULL)
            fprintf(report,
                    "ballast profile: %s: the recompute regenerates %lld bytes (%lld words "
                    "unlike the forward's), but the layer keeps %lld beyond its input\n",
                    name, (long long)r->regenerated, (long long)r->regen_differs,
                    (long long)(r->act - r->ckpt));
    }
    return n;
}

static int measure_memory(struct probe *p, int layer, const struct measure_options *o,
                          struct layer_cost *c, struct progress *pr, int *mismatches,
                          struct err *e)
{
    struct measured r;
    model_layer_name(p->m, layer, c->name);
    progress_draw(pr, c->name, 1);
    TRY(probe_init(p, layer, e));
    TRY(params_init(p->be, p->m, &p->keep, p->dev[ARENA_PERSISTENT], (float *)p->host, e));
    TRY(measure_activations(p, &r, e));
    TRY(measure_state(p, &r.state, e));
    pr->done++;
    *mismatches += compare(o->report, p->m, layer, &r);
    c->state_bytes = r.state;
    c->act_bytes = r.act;
    c->ckpt_bytes = r.ckpt;
    c->out_bytes = r.out;
    c->workspace_bytes = r.workspace;
    return ERR_OK;
}

int measure_profile(struct backend *be, const struct model *m, const struct measure_options *o,
                    struct profile *out, int *mismatches, struct err *e)
{
    if (o->repeats < 1 || o->warmup < 0)
        return err_set(e, ERR_INPUT, "repeats %d, warm-up %d: expected at least 1 and 0",
                       o->repeats, o->warmup);
    int n = model_layer_count(m);
    *mismatches = 0;
    out->model = *m;
    out->estimated = 0;
    out->layers = calloc((size_t)n, sizeof *out->layers);
    if (out->layers == NULL)
        return err_set(e, ERR_FAIL, "out of memory for %d layers", n);
    out->n_layers = n;

    /* host buffers as large as the largest layer's largest arena */
    int64_t largest = 0;
    for (int l = 0; l < n; l++) {
        struct layer_sizes s;
        sizes_layer(m, l, &s);
        int64_t a[3] = {s.state_bytes, s.act_bytes, s.workspace_bytes};
        for (int k = 0; k < 3; k++)
            largest = a[k] > largest ? a[k] : largest;
    }
    size_t words = (size_t)((largest + GUARD_BYTES) / 4);
    struct inputs in = {0};
    uint32_t *host = malloc(4 * words), *saved = malloc(4 * words), *pois = malloc(4 * words);
    double *scratch = malloc(sizeof(double) * 2 * (size_t)o->repeats * (size_t)n);
    int rc = ERR_OK, groups = 0;
    if (!host || !saved || !pois || !scratch)
        rc = err_set(e, ERR_FAIL, "out of host memory (%lld bytes) to scan the arenas",
                     (long long)(12 * (int64_t)words));
    else
        rc = inputs_init(&in, m, e);
    if (rc == ERR_OK) {
        for (size_t i = 0; i < words; i++)
            pois[i] = POISON;
        struct probe proto = {.be = be, .m = m, .in = &in, .host = host, .saved = saved,
                              .poison = pois};
        struct progress pr = {o->progress, 0, (int64_t)n * (1 + o->warmup + o->repeats), 0};
        for (int l = 0; l < n && rc == ERR_OK; l++) {
            struct probe p = proto;
            rc = measure_memory(&p, l, o, &out->layers[l], &pr, mismatches, e);
            probe_free(&p);
        }
        /* time: consecutive layers as one stage, as many as fit the budget */
        for (int l = 0, last; l < n && rc == ERR_OK; l = last + 1) {
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
            groups++;
            rc = measure_times(be, m, &in, l, last, o, (float *)host, scratch, &out->layers[l],
                               &pr, e);
        }
        if (pr.f != NULL) {
            if (rc == ERR_OK)
                progress_draw(&pr, "done", 1);
            fputc('\n', pr.f);
        }
    }
    inputs_free(&in);
    free(host);
    free(saved);
    free(pois);
    free(scratch);
    if (rc == ERR_OK && out->provenance == NULL)
        out->provenance = cJSON_CreateObject();
    if (rc == ERR_OK) {
        cJSON *meas = cJSON_AddObjectToObject(out->provenance, "measurement");
        cJSON_AddStringToObject(meas, "method",
                                "the runtime's layers through its backend table "
                                "(runtime/backend.h) on arenas carved by runtime/layout.c; "
                                "time: the layers as one stage, a micro-batch forward then "
                                "backward; memory: each layer as a one-layer stage, the 64-byte "
                                "lines of poisoned arenas it used");
        cJSON_AddNumberToObject(meas, "warmup", o->warmup);
        cJSON_AddNumberToObject(meas, "repeats", o->repeats);
        cJSON_AddNumberToObject(meas, "stages_timed", groups);
        cJSON_AddStringToObject(meas, "statistic", "median");
        cJSON_AddStringToObject(meas, "timer", be->ops->timer_start != NULL
                                                   ? "device timer (CUDA events)"
                                                   : "host monotonic clock around sync");
        cJSON_AddNumberToObject(meas, "size_function_mismatches", *mismatches);
    }
    return rc;
}
