#include "estimate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "sizes.h"

/* One operation of a layer: its arithmetic and the bytes it moves. GEMMs run at the tensor
 * (or fp32) peak; the rest on the vector units, usually bound by memory bandwidth. */
struct op {
    double flops;
    double bytes;
    int gemm;
    int wgrad; /* a weight gradient: a split backward's W pass (sizes_wgrad_tensors) */
};

#define OPS_MAX 32

struct op_list {
    int n;
    struct op ops[OPS_MAX];
};

static void add_op(struct op_list *l, double flops, double bytes, int gemm)
{
    l->ops[l->n++] = (struct op){flops, bytes, gemm, 0};
}

/* A GEMM (M,K) x (K,N) whose weight is (K,N): forward once; backward twice (input gradient
 * and weight gradient, the latter accumulated into fp32). */
static void add_gemm_ops(struct op_list *fwd, struct op_list *bwd, double M, double K, double N,
                         double e, int weight)
{
    double flops = 2 * M * K * N;
    double io = (M * K + K * N + M * N) * e;
    add_op(fwd, flops, io, 1);
    add_op(bwd, flops, io, 1);
    add_op(bwd, flops, io + (weight ? 2 * K * N * 4.0 : 0), 1);
    bwd->ops[bwd->n - 1].wgrad = weight;
}

/* An elementwise or reduction operation over `elems` values that reads `in` and writes `out`
 * arrays of that size; backward moves about twice as much. */
static void pointwise(struct op_list *fwd, struct op_list *bwd, double elems, double in,
                      double out, double flops_per, double e)
{
    add_op(fwd, flops_per * elems, (in + out) * elems * e, 0);
    add_op(bwd, 2 * flops_per * elems, 2 * (in + out) * elems * e, 0);
}

/* Tensor parallelism (Megatron-LM's, with sequence parallelism) splits a layer's work over t
 * GPUs: each holds NH/t heads (and KV/t key/value heads), the column-parallel GEMMs' output
 * columns and the row-parallel GEMMs' input rows / t, and the norms, residuals and dropout
 * between them on T/t tokens (their input all-gathered and output reduce-scattered around the
 * GEMMs: cost.h cost_group). t = 1 is one GPU. */

/* The attention probabilities: scores q k^T, then the causal softmax, of NH/t heads. */
static void attention_scores(struct op_list *fwd, struct op_list *bwd, const struct model *m,
                             double t)
{
    double B = m->micro_batch, T = m->seq_len, C = m->n_embd, NH = m->n_head;
    double e = sizes_act_elem_bytes(m->dtype);
    add_gemm_ops(fwd, bwd, B * (NH / t) * T, C / NH, T, e, 0);      /* q k^T */
    pointwise(fwd, bwd, B * (NH / t) * T * T, 1, 1, 5, e);  /* causal softmax */
}

/* Flash attention (FlashAttention-2, causal, as the runtime's kernels run it): the scores, the
 * online softmax and att v tile by tile in fast memory, so only q, k, v, the output and the
 * rows' fp32 log-sum-exp touch device memory. The backward recomputes the scores and their
 * exponentials tile by tile, then the four products of the materialised backward (d v, d p,
 * d q, d k) and d s = p (d p - D). */
static void flash_attention(struct op_list *fwd, struct op_list *bwd, const struct model *m,
                            double KV, double t)
{
    double B = m->micro_batch, T = m->seq_len, NH = m->n_head / t,
           HS = (double)m->n_embd / m->n_head;
    KV /= t;
    double e = sizes_act_elem_bytes(m->dtype);
    double scores = 2 * B * NH * T * T * HS, elems = B * NH * T * T;
    double qkv = B * T * (NH + 2 * KV) * HS * e, o = B * T * NH * HS * e, lse = B * NH * T * 4;
    add_op(fwd, 2 * scores, qkv + o + lse, 1);            /* q k^T and p v */
    add_op(fwd, 5 * elems, 0, 0);                         /* online softmax, in fast memory */
    add_op(bwd, scores, qkv + lse, 1);                    /* q k^T again */
    add_op(bwd, 5 * elems, 0, 0);                         /* p again from the log-sum-exp */
    add_op(bwd, 4 * scores, 2 * qkv + 2 * o + 2 * lse, 1); /* d v, d p, d q, d k */
    add_op(bwd, 3 * elems, 0, 0);                         /* d s */
}

/* The attention core of a block: scores, causal softmax and att v, materialised or flash;
 * KV the key/value heads (n_head for GPT); NH/t and KV/t of them. */
static void attention_core(struct op_list *fwd, struct op_list *bwd, const struct model *m,
                           double KV, double t)
{
    double B = m->micro_batch, T = m->seq_len, NH = m->n_head;
    double e = sizes_act_elem_bytes(m->dtype);
    if (m->attention == MODEL_ATTENTION_FLASH) {
        flash_attention(fwd, bwd, m, KV, t);
        return;
    }
    attention_scores(fwd, bwd, m, t);                        /* q k^T, causal softmax */
    add_gemm_ops(fwd, bwd, B * (NH / t) * T, T, m->n_embd / NH, e, 0); /* att v */
}

static void gelu(struct op_list *fwd, struct op_list *bwd, const struct model *m, double t)
{
    double e = sizes_act_elem_bytes(m->dtype);
    pointwise(fwd, bwd, (double)m->micro_batch * m->seq_len * 4 * m->n_embd / t, 1, 1, 10, e);
}

static void swiglu(struct op_list *fwd, struct op_list *bwd, const struct model *m, double t)
{
    double e = sizes_act_elem_bytes(m->dtype);
    pointwise(fwd, bwd, (double)m->micro_batch * m->seq_len * m->ffn_hidden / t, 2, 1, 6, e);
}

/* A Llama layer: RMSNorm (no mean), rotary positions on q and k, grouped-query attention
 * (the scores and att v are per query head, as GPT's), SwiGLU; no biases, no wpe. Each of t
 * GPUs: as layer_ops says. */
static void llama_layer_ops(const struct model *m, int layer, double t, struct op_list *fwd,
                            struct op_list *bwd)
{
    double B = m->micro_batch, T = m->seq_len, C = m->n_embd, NH = m->n_head,
           KV = m->n_kv_head, V = m->vocab_size, F = m->ffn_hidden;
    double e = sizes_act_elem_bytes(m->dtype);
    double BT = B * T, HS = C / NH, BTC = BT * C / t;
    switch (model_layer_kind(m, layer)) {
    case MODEL_LAYER_EMBED:
        add_op(fwd, 0, BT * 4 + BT * C * 4 + BT * C * e / t, 0);
        add_op(bwd, BT * C / t, BT * 4 + BT * C * e / t + 2 * BT * C * 4 / t, 0);
        break;
    case MODEL_LAYER_BLOCK:
        pointwise(fwd, bwd, BTC, 1, 1, 4, e);                     /* RMSNorm */
        add_gemm_ops(fwd, bwd, BT, C, (NH + 2 * KV) * HS / t, e, 1);      /* q, k, v */
        pointwise(fwd, bwd, BT * (NH + KV) * HS / t, 1, 1, 6, e); /* rotary positions */
        attention_core(fwd, bwd, m, KV, t);                       /* q k^T, softmax, att v */
        add_gemm_ops(fwd, bwd, BT, C / t, C, e, 1);                       /* o_proj */
        pointwise(fwd, bwd, BTC, 2, 1, 1, e);                     /* residual */
        pointwise(fwd, bwd, BTC, 1, 1, 4, e);                     /* RMSNorm */
        add_gemm_ops(fwd, bwd, BT, C, 2 * F / t, e, 1);                   /* gate and up */
        swiglu(fwd, bwd, m, t);
        add_gemm_ops(fwd, bwd, BT, F / t, C, e, 1);                       /* down */
        pointwise(fwd, bwd, BTC, 2, 1, 1, e);                     /* residual */
        break;
    case MODEL_LAYER_HEAD:
        pointwise(fwd, bwd, BTC, 1, 1, 4, e);                     /* final RMSNorm */
        add_gemm_ops(fwd, bwd, BT, C, V / t, e, 1);                       /* logits */
        pointwise(fwd, bwd, BT * V / t, 1, 1, 5, e);              /* softmax and cross-entropy */
        break;
    }
}

/* One layer's operations on each of t GPUs of a tensor-parallel group (above; t = 1: one GPU).
 * The embedding's vocabulary-parallel lookup gathers every token on every GPU (rows outside
 * its part of the vocabulary masked) and its sum is reduce-scattered; what follows is per
 * T/t tokens. */
static void layer_ops(const struct model *m, int layer, double t, struct op_list *fwd,
                      struct op_list *bwd)
{
    double B = m->micro_batch, T = m->seq_len, C = m->n_embd, NH = m->n_head,
           V = m->vocab_size;
    double e = sizes_act_elem_bytes(m->dtype);
    double BT = B * T, BTC = BT * C / t;
    fwd->n = bwd->n = 0;
    if (m->kind == MODEL_KIND_LLAMA) {
        llama_layer_ops(m, layer, t, fwd, bwd);
        return;
    }
    switch (model_layer_kind(m, layer)) {
    case MODEL_LAYER_EMBED:
        /* gather wte rows and add wpe; backward scatter-adds into the fp32 gradients */
        add_op(fwd, BTC, BT * 4 + BT * C * 4 + BTC * 4 + BTC * e, 0);
        add_op(bwd, 2 * BTC, BT * 4 + BTC * e + 4 * BTC * 4, 0);
        break;
    case MODEL_LAYER_BLOCK:
        pointwise(fwd, bwd, BTC, 1, 1, 8, e);             /* ln1 */
        add_gemm_ops(fwd, bwd, BT, C, 3 * C / t, e, 1);           /* qkv */
        attention_core(fwd, bwd, m, NH, t);               /* q k^T, softmax, att v */
        add_gemm_ops(fwd, bwd, BT, C / t, C, e, 1);               /* attention projection */
        pointwise(fwd, bwd, BTC, 2, 1, 1, e);             /* residual */
        pointwise(fwd, bwd, BTC, 1, 1, 8, e);             /* ln2 */
        add_gemm_ops(fwd, bwd, BT, C, 4 * C / t, e, 1);           /* fc */
        gelu(fwd, bwd, m, t);
        add_gemm_ops(fwd, bwd, BT, 4 * C / t, C, e, 1);           /* fc projection */
        pointwise(fwd, bwd, BTC, 2, 1, 1, e);             /* residual */
        break;
    case MODEL_LAYER_HEAD:
        pointwise(fwd, bwd, BTC, 1, 1, 8, e);             /* final layer norm */
        add_gemm_ops(fwd, bwd, BT, C, V / t, e, 1);               /* logits */
        pointwise(fwd, bwd, BT * V / t, 1, 1, 5, e);      /* softmax and cross-entropy */
        break;
    }
}

void estimate_layer_flops_tp(const struct model *m, int layer, int tp, double *fwd,
                             double *bwd)
{
    struct op_list f, b;
    layer_ops(m, layer, tp, &f, &b);
    *fwd = *bwd = 0;
    for (int i = 0; i < f.n; i++)
        *fwd += f.ops[i].flops;
    for (int i = 0; i < b.n; i++)
        *bwd += b.ops[i].flops;
}

void estimate_layer_flops(const struct model *m, int layer, double *fwd, double *bwd)
{
    struct op_list f, b;
    layer_ops(m, layer, 1, &f, &b);
    *fwd = *bwd = 0;
    for (int i = 0; i < f.n; i++)
        *fwd += f.ops[i].flops;
    for (int i = 0; i < b.n; i++)
        *bwd += b.ops[i].flops;
}

/* The roofline time of l's operations (only its weight gradients when `wgrad_only`). */
static double some_ops_ms(const struct op_list *l, const struct device_table *t,
                          const struct device_spec *d, enum model_dtype dtype, int wgrad_only)
{
    double tensor = devices_gemm_tflops(d, dtype) * 1e12 * t->gemm_efficiency;
    double vector = d->peak_tflops_fp32 * 1e12;
    double bw = d->memory_bandwidth_gbs * 1e9 * t->memory_efficiency;
    double s = 0;
    for (int i = 0; i < l->n; i++) {
        if (wgrad_only && !l->ops[i].wgrad)
            continue;
        double compute = l->ops[i].flops / (l->ops[i].gemm ? tensor : vector);
        double memory = l->ops[i].bytes / bw;
        s += (compute > memory ? compute : memory) + d->op_overhead_us * 1e-6;
    }
    return s * 1e3;
}

static double ops_ms(const struct op_list *l, const struct device_table *t,
                     const struct device_spec *d, enum model_dtype dtype)
{
    return some_ops_ms(l, t, d, dtype, 0);
}

double estimate_wgrad_share(const struct model *m, int layer)
{
    struct op_list f, b;
    double w = 0, all = 0;
    if (model_layer_kind(m, layer) != MODEL_LAYER_BLOCK || m->kind == MODEL_KIND_CUSTOM)
        return 0;
    layer_ops(m, layer, 1, &f, &b);
    for (int i = 0; i < b.n; i++) {
        all += b.ops[i].flops;
        w += b.ops[i].wgrad ? b.ops[i].flops : 0;
    }
    return all > 0 ? w / all : 0;
}

/* The forward operations that regenerate the kept tensors of `regen` (a partial recompute
 * option of sizes.h) from the others, on each of t GPUs; fails on a tensor it does not know
 * how to regenerate. */
static int regen_ops(const struct model *m, enum model_layer_kind kind, uint32_t regen,
                     double t, struct op_list *fwd, struct err *e)
{
    struct sizes_tensor kept[SIZES_TENSORS_MAX];
    struct op_list unused = {0};
    int n = sizes_layer_tensors(m, kind, SIZES_KEPT, kept);
    fwd->n = 0;
    for (int k = 0; k < n; k++) {
        if (!(regen >> k & 1))
            continue;
        if (strcmp(kept[k].name, "att") == 0)
            attention_scores(fwd, &unused, m, t);
        else if (strcmp(kept[k].name, "fch_gelu") == 0)
            gelu(fwd, &unused, m, t);
        else if (strcmp(kept[k].name, "fch_swiglu") == 0)
            swiglu(fwd, &unused, m, t);
        else
            return err_set(e, ERR_FAIL, "internal: no estimate for regenerating %s",
                           kept[k].name);
        unused.n = 0;
    }
    return ERR_OK;
}

/* One AdamW step of a layer, memory-bound: the bytes it touches over the bandwidth. On the
 * device it reads the gradients, reads and writes m and v (and a 16-bit model's fp32 master)
 * and writes the weights (an fp32 model's weights are its master: read and written); one
 * kernel per parameter tensor. On the host it reads the landed gradients, reads and writes
 * the mirror's master, m and v, and writes the weights to send up, at the table's stated
 * host memory bandwidth (0 when the table states none: the step is left unestimated). An fp16
 * model first unscales its gradients in place on the device, checking them for inf and NaN,
 * wherever the step then runs: one more read and write of the fp32 gradients at the device's
 * bandwidth, in both times (PyTorch's GradScaler.unscale_ and Megatron-LM's fp16 optimizer run
 * it as a pass of its own, _amp_foreach_non_finite_check_and_unscale_, over many tensors a
 * launch: no launch counted). */
static void estimate_optimizer(const struct device_table *t, const struct device_spec *d,
                               const struct model *m, int layer, const struct layer_sizes *s,
                               struct layer_cost *c)
{
    struct sizes_tensor params[SIZES_TENSORS_MAX];
    int kernels = sizes_layer_tensors_at(m, layer, SIZES_PARAMS, params);
    int weights_rw = m->dtype == MODEL_DTYPE_FP32 ? 2 : 1;
    double bw = d->memory_bandwidth_gbs * 1e9 * t->memory_efficiency;
    double device = (double)(weights_rw * s->param_bytes + s->grad_bytes + 2 * s->optimizer_bytes);
    double host = (double)(s->param_bytes + s->grad_bytes + 2 * 3 * s->grad_bytes);
    double unscale_ms = m->dtype == MODEL_DTYPE_FP16 ? 2.0 * (double)s->grad_bytes / bw * 1e3 : 0;
    c->has_split = 1;
    c->param_bytes = s->param_bytes;
    c->grad_bytes = s->grad_bytes;
    c->optimizer_bytes = s->optimizer_bytes;
    c->optimizer_ms = (device / bw + kernels * d->op_overhead_us * 1e-6) * 1e3 + unscale_ms;
    c->host_optimizer_ms =
        t->host_memory_bandwidth_gbs > 0
            ? host / (t->host_memory_bandwidth_gbs * 1e9) * 1e3 + unscale_ms
            : 0;
}

int estimate_tp_times(const struct device_table *t, const struct device_spec *d,
                      const struct link *node_link, int framework, struct profile *p,
                      struct err *e)
{
    const struct model *m = &p->model;
    double tp = p->tp;
    int64_t tensor = cost_tp_tensor_bytes(m);
    for (int l = 0; l < p->n_layers; l++) {
        struct layer_cost *c = &p->layers[l];
        enum model_layer_kind kind = model_layer_kind(m, l);
        struct op_list f, b;
        double comm = cost_tp_collectives(kind) * cost_tp_collective_ms(node_link, p->tp, tensor);
        layer_ops(m, l, 1, &f, &b);
        double whole = ops_ms(&f, t, d, m->dtype);
        layer_ops(m, l, tp, &f, &b);
        double part = ops_ms(&f, t, d, m->dtype);
        c->fwd_ms = part + comm;
        c->bwd_ms = ops_ms(&b, t, d, m->dtype) + comm;
        if (c->split_ms > 0) /* the weight pass: each GPU's share of the products */
            c->split_ms = some_ops_ms(&b, t, d, m->dtype, 1);
        struct sizes_option opt[SIZES_OPTIONS_MAX];
        int n = framework ? 0 : sizes_recompute_options(m, kind, opt);
        for (int k = 0; k < c->n_options; k++) {
            struct recompute_option *o = &c->options[k];
            if (k < n && regen_ops(m, kind, opt[k].regen, tp, &f, e))
                return e->code;
            /* a framework's modules: the runtime's options' share of the forward, kept */
            o->recompute_ms = k < n ? ops_ms(&f, t, d, m->dtype)
                                    : whole > 0 ? o->recompute_ms * tp * part / whole : 0;
        }
        struct layer_sizes s = {.param_bytes = c->param_bytes, .grad_bytes = c->grad_bytes,
                                .optimizer_bytes = c->optimizer_bytes};
        if (c->has_split)
            estimate_optimizer(t, d, m, l, &s, c);
    }
    cJSON *prov = p->provenance;
    if (prov != NULL) {
        cJSON_AddNumberToObject(prov, "tp", p->tp);
        cJSON_AddStringToObject(prov, "tp_method",
                                "each GPU's share of every operation (Megatron-LM's tensor "
                                "parallelism with sequence parallelism: heads, GEMM columns or "
                                "rows, and tokens / tp) on the roofline, plus its collectives "
                                "over the node link; memory per GPU as the cost model divides it");
        cJSON_AddNumberToObject(prov, "node_link_gbps", node_link->gbps);
        cJSON_AddNumberToObject(prov, "node_link_latency_us", node_link->latency_us);
    }
    return ERR_OK;
}

int estimate_memory(const struct model *m, struct profile *out, struct err *e)
{
    memset(out, 0, sizeof *out);
    int n = model_layer_count(m);
    out->layers = calloc((size_t)n, sizeof *out->layers);
    if (out->layers == NULL)
        return err_set(e, ERR_FAIL, "out of memory estimating %d layers", n);
    out->n_layers = n;
    out->model = *m;
    for (int l = 0; l < n; l++) {
        struct layer_cost *c = &out->layers[l];
        struct layer_sizes s;
        model_layer_name(m, l, c->name);
        sizes_layer(m, l, &s);
        c->state_bytes = s.state_bytes;
        c->act_bytes = s.act_bytes;
        c->ckpt_bytes = s.ckpt_bytes;
        c->out_bytes = s.out_bytes;
        c->workspace_bytes = s.workspace_bytes;
        c->has_split = 1;
        c->param_bytes = s.param_bytes;
        c->grad_bytes = s.grad_bytes;
        c->optimizer_bytes = s.optimizer_bytes;
        struct sizes_option opt[SIZES_OPTIONS_MAX];
        enum model_layer_kind kind = model_layer_kind(m, l);
        c->n_options = sizes_recompute_options(m, kind, opt);
        for (int k = 0; k < c->n_options; k++) {
            struct recompute_option *o = &c->options[k];
            snprintf(o->name, sizeof o->name, "%s", opt[k].name);
            sizes_regen_bytes(m, kind, opt[k].regen, &o->kept_bytes, &o->transient_bytes);
        }
    }
    return ERR_OK;
}

int estimate_profile(const struct device_table *t, const struct device_spec *d,
                     const struct model *m, struct profile *out, struct err *e)
{
    memset(out, 0, sizeof *out);
    if (devices_check_dtype(t, d, m->dtype, e) || estimate_memory(m, out, e))
        return e->code;
    out->estimated = 1;
    snprintf(out->device.name, sizeof out->device.name, "%s", d->name);
    snprintf(out->device.kind, sizeof out->device.kind, "%s", d->kind);
    out->device.memory_bytes = d->memory_bytes;
    out->host_link = devices_host_link(d);
    for (int l = 0; l < out->n_layers; l++) {
        struct layer_cost *c = &out->layers[l];
        struct layer_sizes s;
        struct op_list f, b;
        enum model_layer_kind kind = model_layer_kind(m, l);
        struct sizes_option opt[SIZES_OPTIONS_MAX];
        sizes_layer(m, l, &s);
        layer_ops(m, l, 1, &f, &b);
        c->fwd_ms = ops_ms(&f, t, d, m->dtype);
        c->bwd_ms = ops_ms(&b, t, d, m->dtype);
        if (kind == MODEL_LAYER_BLOCK) { /* the split a schedule may use */
            c->split_bytes = sizes_wgrad_bytes(m, MODEL_LAYER_BLOCK);
            c->split_ms = some_ops_ms(&b, t, d, m->dtype, 1);
        }
        estimate_optimizer(t, d, m, l, &s, c);
        sizes_recompute_options(m, kind, opt);
        for (int k = 0; k < c->n_options; k++) {
            if (regen_ops(m, kind, opt[k].regen, 1, &f, e)) {
                profile_free(out);
                return e->code;
            }
            c->options[k].recompute_ms = ops_ms(&f, t, d, m->dtype);
        }
    }
    cJSON *prov = cJSON_CreateObject();
    cJSON_AddStringToObject(prov, "method",
                            "roofline per operation from configs/devices.json; memory from the "
                            "runtime's size functions; a recompute option costs the forward "
                            "operations that regenerate its tensors");
    cJSON_AddStringToObject(prov, "device_source", d->source);
    cJSON_AddNumberToObject(prov, "gemm_efficiency", t->gemm_efficiency);
    cJSON_AddNumberToObject(prov, "memory_efficiency", t->memory_efficiency);
    cJSON_AddNumberToObject(prov, "gemm_peak_tflops", devices_gemm_tflops(d, m->dtype));
    cJSON_AddStringToObject(prov, "optimizer_method",
                            "AdamW memory-bound: on the device the bytes one step touches over "
                            "memory_bandwidth_gbs x memory_efficiency plus op_overhead_us per "
                            "parameter tensor; on the host the mirror's bytes over the table's "
                            "host_memory_bandwidth_gbs");
    if (t->host_memory_bandwidth_gbs > 0)
        cJSON_AddNumberToObject(prov, "host_memory_bandwidth_gbs_assumed",
                                t->host_memory_bandwidth_gbs);
    out->provenance = prov;
    return ERR_OK;
}

/* What a framework's GPT saves for backward, per micro-batch of b sequences of s tokens,
 * hidden h, a heads, vocabulary V, e bytes per activation element (Korthikanti et al.,
 * "Reducing Activation Recomputation in Large Transformer Models", 2022, section 4, with the
 * fp32 LayerNorm statistics and the attention kernel each framework uses, and dropout 0 as
 * every export sets it: a dropout of probability 0 keeps no mask):
 *   block  e*sbh * (1 LN1 in + 1 QKV in + 3 q,k,v + 1 attention out + 1 LN2 in + 1 fc1 in
 *          + 4 GELU in + 4 fc2 in) + 16 sb LayerNorm mean and rstd; then flash attention
 *          (Megatron-LM, NeMo, FlagScale: TransformerEngine) adds its fp32 log-sum-exp,
 *          4 asb, and eager attention (ColossalAI's HuggingFace GPT-2, whose plugin leaves
 *          enable_flash_attention off) its probabilities, e as^2 b;
 *   head   e*sbh * (1 LN in + 1 projection in) + 16 sb + the fp32 softmax of the logits the
 *          cross-entropy keeps, 4 sbV;
 *   embed  the token ids, 8 sb.
 * Options ("attn", "mlp", "attn+mlp") are the framework's recompute modules: core_attn frees
 * what the attention core saves beyond its inputs and output (the log-sum-exp, or the
 * probabilities), mlp recomputes the whole MLP from its input (frees GELU's input and
 * output, 8e sbh); ColossalAI's GPT-2 takes no recompute module, so it gets none. Times and
 * state stay the datasheet estimate's. */
static const char *const framework_names[] = {"megatron", "nemo", "colossalai", "flagscale"};

/* What each layer kind keeps in the framework, and its recompute modules. */
struct framework_acts {
    int64_t embed, block, head;
    int64_t core, mlp;  /* freed by the attention core's and the MLP's recompute modules */
    double mlp_share;   /* the whole MLP's share of a block's forward */
    double core_share;  /* the attention core's (scores and att v) */
    int modules;        /* 0: whole blocks only */
    double flash_core_ms; /* a flash model's attention core forward on the device, else 0 */
};

/* A block as the framework keeps it, with the recompute modules a framework with flash
 * attention takes (ColossalAI's GPT-2 and Llama take none). Their times: the runtime's
 * options (the probabilities, the activation) where it has them; a flash model's runtime has
 * no "attn" option, so the flash attention forward's roofline on the device stands in. */
static void framework_block(struct layer_cost *c, const struct framework_acts *a)
{
    double attn_ms = a->flash_core_ms, act_ms = 0;
    for (int k = 0; k < c->n_options; k++) {
        if (strcmp(c->options[k].name, "attn") == 0)
            attn_ms = c->options[k].recompute_ms;
        if (strcmp(c->options[k].name, "mlp") == 0)
            act_ms = c->options[k].recompute_ms;
    }
    double mlp_ms = c->fwd_ms * a->mlp_share + act_ms;
    c->act_bytes = a->block;
    c->n_options = 0;
    if (!a->modules)
        return;
    struct {
        const char *name;
        int64_t freed;
        double ms;
    } opt[] = {{"attn", a->core, attn_ms},
               {"mlp", a->mlp, mlp_ms},
               {"attn+mlp", a->core + a->mlp, attn_ms + mlp_ms}};
    for (int k = 0; k < 3; k++) {
        struct recompute_option *o = &c->options[c->n_options++];
        snprintf(o->name, sizeof o->name, "%s", opt[k].name);
        o->kept_bytes = a->block - opt[k].freed;
        o->transient_bytes = opt[k].freed;
        o->recompute_ms = opt[k].ms;
    }
}

static void gpt_acts(const struct model *m, int flash, struct framework_acts *a)
{
    int64_t s = m->seq_len, b = m->micro_batch, h = m->n_embd, heads = m->n_head,
            V = m->vocab_size;
    int64_t el = sizes_act_elem_bytes(m->dtype), sbh = s * b * h;
    a->core = flash ? 4 * heads * s * b : el * heads * s * s * b;
    a->mlp = 8 * el * sbh;
    a->embed = 8 * s * b;
    a->head = 2 * el * sbh + 16 * s * b + 4 * s * b * V;
    a->block = el * sbh * 16 + 16 * s * b + a->core;
    /* the MLP's GEMMs' FLOPs, 16 sbh^2 of 24 sbh^2 + 4 s^2 bh; the core's 4 s^2 bh */
    a->mlp_share = 16.0 * (double)h / (24.0 * (double)h + 4.0 * (double)s);
    a->core_share = 4.0 * (double)s / (24.0 * (double)h + 4.0 * (double)s);
    a->modules = flash;
}

/* A Llama block as each framework keeps it, with d = n_kv_head * head size and F the SwiGLU
 * width; no dropout (the frameworks' Llama configurations set attention and hidden dropout
 * to 0), rotary positions saving only their cos and sin tables (they do not need q or k for
 * the backward), flash attention's fp32 log-sum-exp 4 asb, the norms' fp32 rstd 4 sb each:
 *   Megatron-LM, NeMo (Megatron-core with TransformerEngine: norms fused into the following
 *   GEMM, which keep their input and output; TE's attention takes GQA as is)
 *     block  e (6 sbh + 2 sbd + 3 sbF) + 8 sb + 4 asb: norm 1 in and out, q, k and v, the
 *            attention output, norm 2 in and out, SwiGLU's input (2F) and output (F);
 *     head   e 2 sbh + 4 sb + the fp32 softmax of the logits, 4 sbV;
 *   ColossalAI (HuggingFace transformers 4.51.3's LlamaForCausalLM, pinned by ColossalAI, SDPA
 *   flash attention by default, its policy's fused norm off by default)
 *     block  e 9 sbh + 8 sbh + 4e sbF + 8 sb + 4 asb: each RMSNorm keeps an fp32 copy of its
 *            input (4 sbh), its bf16 normalised value and its output; q, k and v with k and v
 *            repeated to every query head (repeat_kv), SDPA's output and o_proj's contiguous
 *            copy of it; SiLU's input, its output, up and their product;
 *     head   4 sbh + 2e sbh + 4 sb + the log-softmax dist_cross_entropy keeps in the logits'
 *            own dtype, e sbV (no fp32 copy without tensor parallelism);
 *   embed  the token ids, 8 sb.
 * Recompute modules as GPT's: core_attn frees the log-sum-exp, mlp SwiGLU's input and output,
 * 3e sbF; ColossalAI recomputes whole blocks only. Read in Megatron-LM d98e8a64
 * (examples/llama/train_llama3_8b_h100_fp8.sh: dropouts 0, --attention-backend fused; rope
 * fusion on unless --no-rope-fusion), NeMo 8cfedd72 (LlamaConfig and
 * megatron_llama_config.yaml: dropouts 0, transformer_engine True) and ColossalAI 4f9953be
 * (requirements: transformers==4.51.3; HybridParallelPlugin: enable_fused_normalization and
 * enable_flash_attention False; shardformer/layer/loss.py dist_cross_entropy). */
static void llama_acts(const struct model *m, int colossalai, struct framework_acts *a)
{
    int64_t s = m->seq_len, b = m->micro_batch, h = m->n_embd, heads = m->n_head,
            V = m->vocab_size, F = m->ffn_hidden, d = (int64_t)m->n_kv_head * (h / heads);
    int64_t el = sizes_act_elem_bytes(m->dtype), sb = s * b, sbh = sb * h;
    a->core = 4 * heads * sb;
    a->mlp = 3 * el * sb * F;
    a->embed = 8 * sb;
    if (colossalai) {
        a->block = el * 9 * sbh + 8 * sbh + 4 * el * sb * F + 8 * sb + a->core;
        a->head = 4 * sbh + 2 * el * sbh + 4 * sb + el * sb * V;
    } else {
        a->block = el * (6 * sbh + 2 * sb * d + 3 * sb * F) + 8 * sb + a->core;
        a->head = 2 * el * sbh + 4 * sb + 4 * sb * V;
    }
    /* the MLP's GEMMs' FLOPs, 6 sbhF, of the block's 2 sbh (h + 2d) + 2 sbh^2 + 4 s^2 bh +
     * 6 sbhF; the core's 4 s^2 bh */
    double forward = 2.0 * (double)h + 2.0 * (double)d + 2.0 * (double)s + 3.0 * (double)F;
    a->mlp_share = 3.0 * (double)F / forward;
    a->core_share = 2.0 * (double)s / forward;
    a->modules = !colossalai;
}

/* The forward of a flash attention core (what core_attn recomputation reruns), on device d. */
static double flash_core_forward_ms(const struct device_table *t, const struct device_spec *d,
                                    const struct model *m)
{
    struct op_list f = {0}, unused = {0};
    flash_attention(&f, &unused, m, m->kind == MODEL_KIND_LLAMA ? m->n_kv_head : m->n_head, 1);
    return ops_ms(&f, t, d, m->dtype);
}

int estimate_for_framework(const struct device_table *t, const struct device_spec *d,
                           const struct model *m, const char *framework, struct profile *p,
                           struct err *e)
{
    int known = 0;
    for (size_t k = 0; k < sizeof framework_names / sizeof *framework_names; k++)
        known = known || strcmp(framework, framework_names[k]) == 0;
    if (!known)
        return err_set(e, ERR_INPUT,
                       "--for: \"%s\", expected megatron, nemo, colossalai or flagscale",
                       framework);
    if (m->kind == MODEL_KIND_CUSTOM)
        return err_set(e, ERR_INPUT, "--for %s: only for a GPT or Llama model (this one is %s)",
                       framework, model_kind_name(m->kind));
    int colossalai = strcmp(framework, "colossalai") == 0;
    /* every framework's Llama runs flash attention; ColossalAI's GPT-2 eager attention */
    int flash = m->kind == MODEL_KIND_LLAMA || !colossalai;
    struct framework_acts a;
    if (m->kind == MODEL_KIND_LLAMA)
        llama_acts(m, colossalai, &a);
    else
        gpt_acts(m, flash, &a);
    a.flash_core_ms = m->attention == MODEL_ATTENTION_FLASH ? flash_core_forward_ms(t, d, m) : 0;
    for (int l = 0; l < p->n_layers; l++) {
        struct layer_cost *c = &p->layers[l];
        enum model_layer_kind kind = model_layer_kind(m, l);
        if (kind == MODEL_LAYER_EMBED)
            c->act_bytes = a.embed;
        else if (kind == MODEL_LAYER_HEAD)
            c->act_bytes = a.head;
        else
            framework_block(c, &a);
    }
    cJSON_AddStringToObject(p->provenance, "for", framework);
    /* the kernel these activations assume, which an export must run */
    cJSON_AddStringToObject(p->provenance, "attention", flash ? "flash" : "materialized");
    cJSON_AddStringToObject(p->provenance, "for_method",
                            "activations as the framework saves them (Korthikanti et al. 2022 "
                            "with its attention kernel and loss; models/estimate.c "
                            "estimate_for_framework); times and state the datasheet estimate's");
    return ERR_OK;
}
