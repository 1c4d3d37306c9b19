/* Measured profiles for (device, tp): each GPU's share of every layer run on the device through
 * the backend table (measure_tp.h). */
#include "measure_tp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "cost.h"
#include "estimate.h"
#include "exec.h"
#include "kernels_cpu.h"
#include "llama_layers.h"
#include "model_kind.h"
#include "sizes.h"
#include "stats.h"

/* The buffers of a shard's operations, by role (each sized for the largest use, in fp32
 * elements, so that the model's activation dtype always fits). */
enum role {
    R_X,    /* a layer's input on its T/t tokens */
    R_LN,   /* a norm's output, all-gathered to every token */
    R_QKV,  /* q, k, v of the GPU's heads */
    R_ATT,  /* the attention probabilities (or flash's log-sum-exp) */
    R_ATTY, /* the attention output of the GPU's heads */
    R_RES,  /* the residual after attention */
    R_FCH,  /* the MLP's input projection (SwiGLU: gate and up) */
    R_FCG,  /* its activation */
    R_OUT,  /* the layer's output (before the reduce-scatter); the head's logits */
    R_D1, R_D2, R_D3, R_DRES, R_DATT, R_DX, /* gradients */
    R_ROLES
};

struct shard {
    struct backend *be;
    const struct model *m;
    enum model_dtype dt;
    int t, B, T, N, Ns, C, Cs, NHs, KVs, HS, F, QKV, Vs;
    int flash;
    int rmsnorm, swiglu, rotary, biases, gqa; /* the kind's traits (model_kind.h) */
    float eps, theta;
    void *buf[R_ROLES];
    void *w, *w2;        /* weights (the model's dtype) */
    float *dw, *dw2;     /* their gradients */
    float *s0, *s1;      /* per-row statistics, log-sum-exp, its backward's sums */
    int32_t *tokens;
    int kind;            /* the layer's (enum model_layer_kind) */
};

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static void shard_dims(struct shard *s, const struct model *m, int t)
{
    s->m = m;
    s->dt = m->dtype;
    s->t = t;
    s->B = m->micro_batch;
    s->T = m->seq_len;
    s->N = s->B * s->T;
    s->Ns = (s->N + t - 1) / t;
    s->C = m->n_embd;
    s->Cs = m->n_embd / t;
    s->NHs = m->n_head / t;
    s->HS = m->n_embd / m->n_head;
    const struct model_kind_info *k = model_kind_of(m);
    s->rmsnorm = k->rmsnorm;
    s->swiglu = k->swiglu;
    s->rotary = k->rotary;
    s->biases = k->biases;
    s->gqa = k->gqa;
    s->KVs = model_kv_heads(m) / t;
    s->F = (int)(model_ffn_hidden(m) / t);
    s->QKV = (s->NHs + 2 * s->KVs) * s->HS;
    s->Vs = (m->vocab_size + t - 1) / t;
    s->flash = m->attention == MODEL_ATTENTION_FLASH;
    s->eps = m->norm_eps;
    s->theta = m->rope_theta;
}

/* Elements of each role's buffer. */
static int64_t role_elems(const struct shard *s, enum role r)
{
    int64_t N = s->N, C = s->C, att = s->flash ? (int64_t)s->B * s->NHs * s->T
                                               : (int64_t)s->B * s->NHs * s->T * s->T;
    switch (r) {
    case R_QKV:
        return N * s->QKV;
    case R_D3: /* dqkv, and SwiGLU's gradient of gate and up */
        return max64(N * s->QKV, N * 2 * s->F);
    case R_ATT:
    case R_DATT:
        return att;
    case R_ATTY:
        return N * s->Cs;
    case R_FCH:
    case R_D2:
        return N * 2 * s->F;
    case R_FCG:
        return N * s->F;
    case R_OUT:
        return max64(N * C, N * s->Vs);
    default:
        return N * C;
    }
}

static void shard_free(struct shard *s)
{
    for (int r = 0; r < R_ROLES; r++)
        s->be->ops->release(s->be, s->buf[r]);
    void *more[] = {s->w, s->w2, s->dw, s->dw2, s->s0, s->s1, s->tokens};
    for (size_t k = 0; k < sizeof more / sizeof *more; k++)
        s->be->ops->release(s->be, more[k]);
}

struct piece {
    void **p;
    int64_t bytes;
};

/* Every buffer, zeroed (the operations' times do not depend on the values; zero tokens are in
 * every GPU's part of the vocabulary). */
static int shard_alloc(struct shard *s, struct err *e)
{
    int64_t C = s->C, V = s->m->vocab_size;
    int64_t weights = max64(max64(V * C, (int64_t)s->T * C),
                            max64(C * s->QKV, max64(C * 2 * s->F, C * s->Vs)));
    int64_t rows = max64(s->N, (int64_t)s->B * s->NHs * s->T);
    struct piece all[R_ROLES + 7];
    int n = 0;
    for (int r = 0; r < R_ROLES; r++)
        all[n++] = (struct piece){&s->buf[r], 4 * role_elems(s, (enum role)r)};
    all[n++] = (struct piece){&s->w, 4 * weights};
    all[n++] = (struct piece){&s->w2, 4 * weights};
    all[n++] = (struct piece){(void **)&s->dw, 4 * weights};
    all[n++] = (struct piece){(void **)&s->dw2, 4 * weights};
    all[n++] = (struct piece){(void **)&s->s0, 4 * rows};
    all[n++] = (struct piece){(void **)&s->s1, 4 * rows};
    all[n++] = (struct piece){(void **)&s->tokens, 4 * (int64_t)s->N};
    for (int k = 0; k < n; k++) {
        ERR_TRY(s->be->ops->alloc(s->be, all[k].bytes, all[k].p, e));
        ERR_TRY(s->be->ops->zero(s->be, *all[k].p, all[k].bytes, e));
    }
    return ERR_OK;
}

/* ---- the shard's operations (measure_tp.h: which share each GPU runs) ---- */

static void *at(const struct shard *s, enum role r)
{
    return s->buf[r];
}

static int gpt_attention(struct shard *s, void *out, struct err *e)
{
    const struct flash_kernels *f;
    if (!s->flash)
        return s->be->ops->attention_forward(s->be, s->dt, out, at(s, R_ATT), at(s, R_QKV), s->B,
                                             s->T, s->Cs, s->NHs, e);
    ERR_TRY(backend_flash(s->be, &f, e));
    return f->forward(s->be, s->dt, out, s->s0, at(s, R_QKV), s->B, s->T, s->NHs, s->KVs, s->HS,
                      e);
}

static int llama_attention(struct shard *s, void *out, struct err *e)
{
    const struct flash_kernels *f;
    if (!s->flash)
        return s->be->ops->llama->attention_forward(s->be, s->dt, out, at(s, R_ATT),
                                                    at(s, R_QKV), s->B, s->T, s->NHs, s->KVs,
                                                    s->HS, e);
    ERR_TRY(backend_flash(s->be, &f, e));
    return f->forward(s->be, s->dt, out, s->s0, at(s, R_QKV), s->B, s->T, s->NHs, s->KVs, s->HS,
                      e);
}

static int shard_attention_backward(struct shard *s, struct err *e)
{
    const struct flash_kernels *f;
    if (s->flash) {
        ERR_TRY(backend_flash(s->be, &f, e));
        return f->backward(s->be, s->dt, at(s, R_D3), s->s1, at(s, R_D1), at(s, R_QKV),
                           at(s, R_ATTY), s->s0, s->B, s->T, s->NHs, s->KVs, s->HS, e);
    }
    if (s->gqa)
        return s->be->ops->llama->attention_backward(s->be, s->dt, at(s, R_D3), at(s, R_DATT),
                                                     at(s, R_D1), at(s, R_QKV), at(s, R_ATT),
                                                     s->B, s->T, s->NHs, s->KVs, s->HS, e);
    return s->be->ops->attention_backward(s->be, s->dt, at(s, R_D3), at(s, R_DATT), at(s, R_D1),
                                          at(s, R_QKV), at(s, R_ATT), s->B, s->T, s->Cs, s->NHs,
                                          e);
}

/* A norm over the GPU's T/t tokens (LayerNorm or RMSNorm) and its backward. */
static int norm(struct shard *s, void *out, const void *in, float *stat, struct err *e)
{
    if (s->rmsnorm)
        return s->be->ops->llama->rmsnorm_forward(s->be, s->dt, out, stat, in, s->w2, s->Ns,
                                                  s->C, s->eps, e);
    return s->be->ops->layernorm_forward(s->be, s->dt, out, stat, s->s1, in, s->w2, s->w2,
                                         s->Ns, s->C, e);
}

static int norm_backward(struct shard *s, void *dinp, const void *dout, const void *in,
                         float *stat, struct err *e)
{
    if (s->rmsnorm)
        return s->be->ops->llama->rmsnorm_backward(s->be, s->dt, dinp, s->dw2, dout, in, s->w2,
                                                   stat, s->Ns, s->C, e);
    return s->be->ops->layernorm_backward(s->be, s->dt, dinp, s->dw2, s->dw2, dout, in, s->w2,
                                          stat, s->s1, s->Ns, s->C, e);
}

static int mm(struct shard *s, void *out, const void *add, const void *in, int C, int OC,
              struct err *e)
{
    return s->be->ops->matmul_forward(s->be, s->dt, out, add, in, s->w, s->biases ? s->w2 : NULL,
                                      s->N, C, OC, e);
}

static int mm_back(struct shard *s, void *dinp, const void *dout, const void *in, int C, int OC,
                   struct err *e)
{
    return s->be->ops->matmul_backward(s->be, s->dt, dinp, s->dw, s->biases ? s->dw2 : NULL, dout,
                                       in, s->w, s->N, C, OC, e);
}

static int rope(struct shard *s, void *x, int backward, struct err *e)
{
    const struct llama_kernels *k = s->be->ops->llama;
    int64_t off = (int64_t)s->NHs * s->HS * sizes_act_elem_bytes(s->dt);
    int (*f)(struct backend *, enum model_dtype, void *, int, int, int, int, int, float,
             struct err *) = backward ? k->rope_backward : k->rope_forward;
    ERR_TRY(f(s->be, s->dt, x, s->B, s->T, s->NHs, s->QKV, s->HS, s->theta, e));
    return f(s->be, s->dt, (char *)x + off, s->B, s->T, s->KVs, s->QKV, s->HS, s->theta, e);
}

static int mlp_activation(struct shard *s, struct err *e)
{
    if (s->swiglu)
        return s->be->ops->llama->swiglu_forward(s->be, s->dt, at(s, R_FCG), at(s, R_FCH), s->N,
                                                 s->F, e);
    return s->be->ops->gelu_forward(s->be, s->dt, at(s, R_FCG), at(s, R_FCH),
                                    (int64_t)s->N * s->F, e);
}

static int shard_block_forward(struct shard *s, struct err *e)
{
    ERR_TRY(norm(s, at(s, R_LN), at(s, R_X), s->s0, e));
    ERR_TRY(mm(s, at(s, R_QKV), NULL, at(s, R_LN), s->C, s->QKV, e));
    if (s->rotary)
        ERR_TRY(rope(s, at(s, R_QKV), 0, e));
    ERR_TRY((s->gqa ? llama_attention : gpt_attention)(s, at(s, R_ATTY), e));
    ERR_TRY(mm(s, at(s, R_RES), at(s, R_X), at(s, R_ATTY), s->Cs, s->C, e));
    ERR_TRY(norm(s, at(s, R_LN), at(s, R_RES), s->s0, e));
    ERR_TRY(mm(s, at(s, R_FCH), NULL, at(s, R_LN), s->C, s->swiglu ? 2 * s->F : s->F, e));
    ERR_TRY(mlp_activation(s, e));
    return mm(s, at(s, R_OUT), at(s, R_RES), at(s, R_FCG), s->F, s->C, e);
}

static int shard_block_backward(struct shard *s, struct err *e)
{
    const struct backend_ops *o = s->be->ops;
    ERR_TRY(mm_back(s, at(s, R_D2), at(s, R_OUT), at(s, R_FCG), s->F, s->C, e));
    if (s->swiglu)
        ERR_TRY(o->llama->swiglu_backward(s->be, s->dt, at(s, R_D3), at(s, R_FCH), at(s, R_D2),
                                          s->N, s->F, e));
    else
        ERR_TRY(o->gelu_backward(s->be, s->dt, at(s, R_D2), at(s, R_FCH), at(s, R_D2),
                                 (int64_t)s->N * s->F, e));
    ERR_TRY(mm_back(s, at(s, R_D1), at(s, s->swiglu ? R_D3 : R_D2), at(s, R_LN), s->C,
                    s->swiglu ? 2 * s->F : s->F, e));
    ERR_TRY(norm_backward(s, at(s, R_DRES), at(s, R_D1), at(s, R_RES), s->s0, e));
    ERR_TRY(mm_back(s, at(s, R_D1), at(s, R_DRES), at(s, R_ATTY), s->Cs, s->C, e));
    ERR_TRY(shard_attention_backward(s, e));
    if (s->rotary)
        ERR_TRY(rope(s, at(s, R_D3), 1, e));
    ERR_TRY(mm_back(s, at(s, R_D1), at(s, R_D3), at(s, R_LN), s->C, s->QKV, e));
    return norm_backward(s, at(s, R_DX), at(s, R_D1), at(s, R_X), s->s0, e);
}

/* The embedding's lookup gathers every token on every GPU (its vocabulary part's rows). */
static int shard_embed_forward(struct shard *s, struct err *e)
{
    if (s->rotary) /* no position embedding */
        return s->be->ops->llama->embedding_forward(s->be, s->dt, at(s, R_OUT), s->tokens, s->w,
                                                    s->B, s->T, s->C, e);
    return s->be->ops->encoder_forward(s->be, s->dt, at(s, R_OUT), s->tokens, s->w, s->w2, s->B,
                                       s->T, s->C, e);
}

static int shard_embed_backward(struct shard *s, struct err *e)
{
    if (s->rotary) /* no position embedding */
        return s->be->ops->llama->embedding_backward(s->be, s->dt, s->dw, at(s, R_OUT),
                                                     s->tokens, s->B, s->T, s->C, s->Vs, e);
    return s->be->ops->encoder_backward(s->be, s->dt, s->dw, s->dw2, at(s, R_OUT), s->tokens,
                                        s->B, s->T, s->C, s->Vs, e);
}

static int shard_head_forward(struct shard *s, struct err *e)
{
    ERR_TRY(norm(s, at(s, R_LN), at(s, R_X), s->s0, e));
    ERR_TRY(s->be->ops->matmul_forward(s->be, s->dt, at(s, R_OUT), NULL, at(s, R_LN), s->w, NULL,
                                       s->N, s->C, s->Vs, e));
    return s->be->ops->crossentropy_forward(s->be, s->dt, at(s, R_OUT), s->s1, s->tokens, s->N,
                                            s->Vs, e);
}

static int shard_head_backward(struct shard *s, struct err *e)
{
    ERR_TRY(s->be->ops->crossentropy_backward(s->be, s->dt, at(s, R_OUT), s->tokens, 1.0f, s->N,
                                              s->Vs, e));
    ERR_TRY(s->be->ops->matmul_backward(s->be, s->dt, at(s, R_D1), s->dw, NULL, at(s, R_OUT),
                                        at(s, R_LN), s->w, s->N, s->C, s->Vs, e));
    return norm_backward(s, at(s, R_DX), at(s, R_D1), at(s, R_X), s->s0, e);
}

/* A recompute option's forward operations: the attention probabilities, the MLP's
 * activation, or both (the runtime's options, models/sizes.h). */
static int option_forward(struct shard *s, const char *name, struct err *e)
{
    if (strstr(name, "attn") != NULL)
        ERR_TRY((s->gqa ? llama_attention : gpt_attention)(s, NULL, e));
    if (strstr(name, "mlp") != NULL)
        ERR_TRY(mlp_activation(s, e));
    return ERR_OK;
}

/* ---- timing ---- */

typedef int (*shard_fn)(struct shard *s, const void *arg, struct err *e);

/* The median of o->repeats runs of fn after o->warmup, each timed by o->timer or by the host
 * clock around the backend's sync. */
static int time_median(struct shard *s, shard_fn fn, const void *arg,
                       const struct measure_options *o, double *ms, struct err *e)
{
    double *v = malloc((size_t)o->repeats * sizeof *v);
    int rc = v != NULL ? ERR_OK : err_set(e, ERR_FAIL, "out of host memory");
    for (int r = -o->warmup; r < o->repeats && rc == ERR_OK; r++) {
        double t0, d = 0;
        rc = o->timer != NULL ? o->timer->start(o->timer, e) : s->be->ops->sync(s->be, e);
        t0 = exec_now_ms();
        if (rc == ERR_OK)
            rc = fn(s, arg, e);
        if (rc == ERR_OK)
            rc = o->timer != NULL ? o->timer->stop(o->timer, &d, e) : s->be->ops->sync(s->be, e);
        if (rc == ERR_OK && o->timer == NULL)
            d = exec_now_ms() - t0;
        if (r >= 0)
            v[r] = d;
    }
    if (rc == ERR_OK) {
        *ms = stats_upper_median(v, o->repeats);
    }
    free(v);
    return rc;
}

static int run_forward(struct shard *s, const void *arg, struct err *e)
{
    (void)arg;
    return s->kind == MODEL_LAYER_EMBED  ? shard_embed_forward(s, e)
           : s->kind == MODEL_LAYER_HEAD ? shard_head_forward(s, e)
                                         : shard_block_forward(s, e);
}

static int run_backward(struct shard *s, const void *arg, struct err *e)
{
    (void)arg;
    return s->kind == MODEL_LAYER_EMBED  ? shard_embed_backward(s, e)
           : s->kind == MODEL_LAYER_HEAD ? shard_head_backward(s, e)
                                         : shard_block_backward(s, e);
}

static int run_option(struct shard *s, const void *arg, struct err *e)
{
    return option_forward(s, arg, e);
}

/* AdamW over the GPU's share of a layer's parameters: n elements. */
struct adamw_run {
    struct backend *be;
    int64_t n;
    void *weights;
    float *master, *g, *m, *v;
};

static int run_adamw(struct shard *s, const void *arg, struct err *e)
{
    const struct adamw_run *a = arg;
    struct adamw_params hp = adamw_params_gpt(1e-3f);
    void *weights = s->dt == MODEL_DTYPE_FP32 ? (void *)a->master : a->weights; /* its own */
    return a->be->ops->adamw(a->be, weights, a->master, a->g, a->m, a->v, a->n, s->dt, &hp, 1,
                             1, e);
}

static int adamw_alloc(struct adamw_run *a, struct backend *be, int64_t n, struct err *e)
{
    *a = (struct adamw_run){.be = be, .n = n};
    void **p[] = {&a->weights, (void **)&a->master, (void **)&a->g, (void **)&a->m,
                  (void **)&a->v};
    for (size_t k = 0; k < sizeof p / sizeof *p; k++) {
        ERR_TRY(be->ops->alloc(be, 4 * (n > 0 ? n : 1), p[k], e));
        ERR_TRY(be->ops->zero(be, *p[k], 4 * (n > 0 ? n : 1), e));
    }
    return ERR_OK;
}

static void adamw_free(struct adamw_run *a)
{
    void *p[] = {a->weights, a->master, a->g, a->m, a->v};
    for (size_t k = 0; k < sizeof p / sizeof *p; k++)
        a->be->ops->release(a->be, p[k]);
}

/* The layer's optimizer steps on its share: on the device, and with the CPU backend's AdamW
 * on the host's cores (what a host optimizer runs). */
static int time_optimizer(struct shard *s, struct backend *host, struct layer_cost *c,
                          const struct measure_options *o, struct err *e)
{
    int64_t n = c->grad_bytes / 4; /* fp32 gradients: the share's parameter count */
    struct adamw_run dev, cpu;
    struct measure_options ho = *o;
    ho.timer = NULL;
    int rc = adamw_alloc(&dev, s->be, n, e);
    if (rc == ERR_OK)
        rc = time_median(s, run_adamw, &dev, o, &c->optimizer_ms, e);
    adamw_free(&dev);
    if (rc == ERR_OK && host != NULL && (rc = adamw_alloc(&cpu, host, n, e)) == ERR_OK)
        rc = time_median(s, run_adamw, &cpu, &ho, &c->host_optimizer_ms, e);
    if (host != NULL && rc == ERR_OK)
        adamw_free(&cpu);
    return rc;
}

/* The group's collectives of one pass (cost.h: a block 4, the embedding and head 1), each of
 * b*s*h elements: measured ms each, or over the node link. */
static double collectives_ms(const struct measure_tp_options *to, int kind, int tp,
                             int64_t bytes)
{
    double one = to->collective_ms >= 0 ? to->collective_ms
                                        : cost_tp_collective_ms(&to->node_link, tp, bytes);
    return cost_tp_collectives((enum model_layer_kind)kind) * one;
}

static int time_layer(struct shard *s, struct backend *host, struct layer_cost *c,
                      const struct measure_tp_options *to, int64_t tensor,
                      const struct measure_options *o, struct err *e)
{
    double comm = collectives_ms(to, s->kind, s->t, tensor);
    ERR_TRY(time_median(s, run_forward, NULL, o, &c->fwd_ms, e));
    ERR_TRY(time_median(s, run_backward, NULL, o, &c->bwd_ms, e));
    c->fwd_ms += comm;
    c->bwd_ms += comm;
    for (int k = 0; k < c->n_options; k++) /* inside the layer: no collectives */
        ERR_TRY(time_median(s, run_option, c->options[k].name, o, &c->options[k].recompute_ms,
                            e));
    return c->has_split ? time_optimizer(s, host, c, o, e) : ERR_OK;
}

int measure_tp_profile(struct backend *be, const struct model *m,
                       const struct measure_tp_options *to, const struct measure_options *o,
                       struct profile *p, struct err *e)
{
    struct shard s = {.be = be};
    struct backend cpu = {0};
    struct device_info device = p->device;
    cJSON *prov = p->provenance;
    p->provenance = NULL;
    if (estimate_memory(m, p, e) ||
        cluster_group_profile(p, to->tp, &to->node_link, e)) { /* memory per GPU, "tp" */
        p->provenance = prov;
        return e->code;
    }
    p->device = device;
    p->provenance = prov;
    p->estimated = 0;
    shard_dims(&s, m, to->tp);
    int rc = shard_alloc(&s, e);
    if (rc == ERR_OK)
        rc = backend_cpu_init(&cpu, to->host_threads > 0 ? to->host_threads : 1, e);
    int64_t tensor = cost_tp_tensor_bytes(m);
    for (int l = 0; l < p->n_layers && rc == ERR_OK; l++) {
        s.kind = model_layer_kind(m, l);
        rc = time_layer(&s, &cpu, &p->layers[l], to, tensor, o, e);
        if (o->progress != NULL)
            fprintf(o->progress, "\rprofile --tp %d: layer %d of %d", to->tp, l + 1,
                    p->n_layers);
    }
    if (o->progress != NULL)
        fprintf(o->progress, "\n");
    if (cpu.ops != NULL)
        cpu.ops->free(&cpu);
    shard_free(&s);
    if (rc == ERR_OK && prov != NULL) {
        cJSON_AddNumberToObject(prov, "tp", to->tp);
        cJSON_AddStringToObject(prov, "tp_method",
                                "each GPU's share of every layer (Megatron-LM's tensor "
                                "parallelism with sequence parallelism: heads, GEMM columns or "
                                "rows, and tokens / tp) run on the device through the backend "
                                "table, medians; the embedding's lookup of every token as on "
                                "one GPU; memory per GPU as the cost model divides the size "
                                "functions'");
        cJSON_AddStringToObject(prov, "collectives",
                                to->collective_ms >= 0 ? "measured over NCCL on this node"
                                                       : "over the node link given");
        if (to->collective_ms >= 0)
            cJSON_AddNumberToObject(prov, "collective_ms", to->collective_ms);
        else
            cJSON_AddNumberToObject(prov, "node_link_gbps", to->node_link.gbps);
    }
    return rc;
}
