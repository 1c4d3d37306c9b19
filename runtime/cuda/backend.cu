// The CUDA backend: device memory from cudaMalloc (no managed memory), one stream, one cuBLAS
// handle with a workspace of its own, and the kernels of kernels.cu composed into the GPT's
// layers in the order of backend_cpu.c.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.cuh"
#include "kernels.cuh"

extern "C" {
#include "backend.h"
#include "cuda_device.h"
#include "sizes.h"
}

// cuBLAS's workspace: its documentation recommends 32 MiB on Hopper (4 MiB before it); a
// fixed, explicit buffer also makes the GEMMs deterministic from run to run.
#define BLAS_WORKSPACE_BYTES ((size_t)32 << 20)
#define MAX_ALLOCS 64

struct cuda_impl {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    struct cuda_backend_memory mem;
    void *ptr[MAX_ALLOCS];
    int64_t bytes[MAX_ALLOCS];
};

int cudacheck_fail(const char *call, const char *file, int line, const char *what,
                   struct err *e)
{
    char host[256];
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}, *rank = "-1";
    for (int i = 0; i < 3; i++)
        if (getenv(vars[i]) != nullptr) {
            rank = getenv(vars[i]);
            break;
        }
    return err_set(e, ERR_FAIL, "%s failed at %s:%d on %s rank %s: %s", call, file, line, host,
                   rank, what);
}

static cuda_impl *impl_of(const struct backend *be)
{
    return (cuda_impl *)be->impl;
}

static kctx ctx_of(struct backend *be, const struct layer_view *l)
{
    cuda_impl *c = impl_of(be);
    return kctx{c->stream, c->blas, l->model->dtype == MODEL_DTYPE_BF16};
}

// ---- memory ----

static int cu_alloc(struct backend *be, int64_t bytes, void **out, struct err *e)
{
    cuda_impl *c = impl_of(be);
    *out = nullptr;
    if (bytes <= 0)
        return ERR_OK;
    int slot = 0;
    while (slot < MAX_ALLOCS && c->ptr[slot] != nullptr)
        slot++;
    if (slot == MAX_ALLOCS)
        return err_set(e, ERR_FAIL, "internal: the cuda backend holds %d allocations already",
                       MAX_ALLOCS);
    cudaError_t rc = cudaMalloc(out, (size_t)bytes); // 256-byte aligned: SIZES_ALIGN holds
    if (rc == cudaErrorMemoryAllocation) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        *out = nullptr;
        return err_set(e, ERR_NOFIT,
                       "cuda:%d: out of device memory allocating %lld bytes (%lld free of %lld)",
                       c->device, (long long)bytes, (long long)free_b, (long long)total_b);
    }
    CUDA_CHECK(rc, e);
    c->ptr[slot] = *out;
    c->bytes[slot] = bytes;
    c->mem.arena_bytes += bytes;
    return ERR_OK;
}

static void cu_release(struct backend *be, void *p)
{
    cuda_impl *c = impl_of(be);
    if (p == nullptr)
        return;
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (c->ptr[i] == p) {
            c->mem.arena_bytes -= c->bytes[i];
            c->ptr[i] = nullptr;
        }
    cudaFree(p);
}

// The host buffer may be reused as soon as these return: both wait for their copy.
static int cu_upload(struct backend *be, void *dst, const void *src, int64_t bytes,
                     struct err *e)
{
    cuda_impl *c = impl_of(be);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyHostToDevice, c->stream), e);
    CUDA_CHECK(cudaStreamSynchronize(c->stream), e);
    return ERR_OK;
}

static int cu_download(struct backend *be, void *dst, const void *src, int64_t bytes,
                       struct err *e)
{
    cuda_impl *c = impl_of(be);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToHost, c->stream), e);
    CUDA_CHECK(cudaStreamSynchronize(c->stream), e);
    return ERR_OK;
}

static int cu_copy(struct backend *be, void *dst, const void *src, int64_t bytes, struct err *e)
{
    CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice,
                               impl_of(be)->stream),
               e);
    return ERR_OK;
}

static int cu_zero(struct backend *be, void *dst, int64_t bytes, struct err *e)
{
    CUDA_CHECK(cudaMemsetAsync(dst, 0, (size_t)bytes, impl_of(be)->stream), e);
    return ERR_OK;
}

static int cu_sync(struct backend *be, struct err *e)
{
    CUDA_CHECK(cudaStreamSynchronize(impl_of(be)->stream), e);
    return ERR_OK;
}

#define I32(p) ((const int32_t *)(p))

static int64_t act_bytes(const struct model *m, int64_t elems)
{
    return elems * sizes_act_elem_bytes(m->dtype);
}

// ---- embed ----

static int embed_forward(struct backend *be, const struct layer_view *l, void *out,
                         struct err *e)
{
    const struct model *m = l->model;
    return k_encoder_forward(ctx_of(be, l), out, I32(l->kept[EMBED_TOKENS]), l->params[EMBED_WTE],
                             l->params[EMBED_WPE], m->micro_batch, m->seq_len, m->n_embd, e);
}

static int unsupported(const struct layer_view *l, struct err *e)
{
    return err_set(e, ERR_FAIL,
                   "internal: the cuda backend cannot regenerate kept tensors 0x%x of layer %d",
                   (unsigned)l->regen, l->layer);
}

static int embed_recompute(struct backend *be, const struct layer_view *l, struct err *e)
{
    // the tokens are all the backward needs, and they are the checkpoint
    return l->regen == 0 ? ERR_OK : unsupported(l, e);
}

static int embed_backward(struct backend *be, const struct layer_view *l, float loss_scale,
                          struct err *e)
{
    const struct model *m = l->model;
    return k_encoder_backward(ctx_of(be, l), l->grads[EMBED_WTE], l->grads[EMBED_WPE],
                              l->ws[EMBED_DOUT], I32(l->kept[EMBED_TOKENS]), m->micro_batch,
                              m->seq_len, m->n_embd, m->vocab_size, e);
}

// ---- block ----

static int block_kept_forward(struct backend *be, const struct layer_view *l, struct err *e)
{
    const struct model *m = l->model;
    kctx k = ctx_of(be, l);
    int B = m->micro_batch, T = m->seq_len, C = m->n_embd, N = B * T;
    void *const *p = l->params, *const *kp = l->kept;
    ERR_TRY(k_layernorm_forward(k, kp[BLOCK_LN1], (float *)kp[BLOCK_LN1_MEAN],
                            (float *)kp[BLOCK_LN1_RSTD], kp[BLOCK_INP], p[BLOCK_LN1_W],
                            p[BLOCK_LN1_B], N, C, e));
    ERR_TRY(k_matmul_forward(k, kp[BLOCK_QKV], nullptr, kp[BLOCK_LN1], p[BLOCK_QKV_W],
                         p[BLOCK_QKV_B], N, C, 3 * C, e));
    ERR_TRY(k_attention_forward(k, kp[BLOCK_ATTY], kp[BLOCK_ATT], kp[BLOCK_QKV], B, T, C, m->n_head,
                            e));
    ERR_TRY(k_matmul_forward(k, kp[BLOCK_RES2], kp[BLOCK_INP], kp[BLOCK_ATTY], p[BLOCK_PROJ_W],
                         p[BLOCK_PROJ_B], N, C, C, e));
    ERR_TRY(k_layernorm_forward(k, kp[BLOCK_LN2], (float *)kp[BLOCK_LN2_MEAN],
                            (float *)kp[BLOCK_LN2_RSTD], kp[BLOCK_RES2], p[BLOCK_LN2_W],
                            p[BLOCK_LN2_B], N, C, e));
    ERR_TRY(k_matmul_forward(k, kp[BLOCK_FCH], nullptr, kp[BLOCK_LN2], p[BLOCK_FC_W], p[BLOCK_FC_B],
                         N, C, 4 * C, e));
    return k_gelu_forward(k, kp[BLOCK_FCH_GELU], kp[BLOCK_FCH], (int64_t)N * 4 * C, e);
}

static int block_forward(struct backend *be, const struct layer_view *l, void *out,
                         struct err *e)
{
    const struct model *m = l->model;
    int N = m->micro_batch * m->seq_len, C = m->n_embd;
    ERR_TRY(block_kept_forward(be, l, e));
    return k_matmul_forward(ctx_of(be, l), out, l->kept[BLOCK_RES2], l->kept[BLOCK_FCH_GELU],
                            l->params[BLOCK_FCPROJ_W], l->params[BLOCK_FCPROJ_B], N, 4 * C, C, e);
}

// The whole block, or a partial option (backend.h): the attention probabilities from the kept
// qkv (not att v: atty is kept), the GELU from the kept fch, or both; the same kernels as the
// forward on the same inputs, so the same bits.
static int block_recompute(struct backend *be, const struct layer_view *l, struct err *e)
{
    const struct model *m = l->model;
    const uint32_t att = REGEN_BIT(BLOCK_ATT), gelu = REGEN_BIT(BLOCK_FCH_GELU);
    if (l->regen == sizes_full_regen(m, MODEL_LAYER_BLOCK))
        return block_kept_forward(be, l, e);
    if (l->regen & ~(att | gelu))
        return unsupported(l, e);
    kctx k = ctx_of(be, l);
    void *const *kp = l->kept;
    if (l->regen & att)
        ERR_TRY(k_attention_forward(k, nullptr, kp[BLOCK_ATT], kp[BLOCK_QKV], m->micro_batch,
                                m->seq_len, m->n_embd, m->n_head, e));
    if (l->regen & gelu)
        ERR_TRY(k_gelu_forward(k, kp[BLOCK_FCH_GELU], kp[BLOCK_FCH],
                           (int64_t)m->micro_batch * m->seq_len * 4 * m->n_embd, e));
    return ERR_OK;
}

static int block_backward(struct backend *be, const struct layer_view *l, float loss_scale,
                          struct err *e)
{
    const struct model *m = l->model;
    kctx k = ctx_of(be, l);
    int B = m->micro_batch, T = m->seq_len, C = m->n_embd, N = B * T;
    void *const *p = l->params, *const *kp = l->kept, *const *w = l->ws;
    float *const *g = l->grads;
    // dout: the output's gradient; it becomes the gradient of res2 in place
    void *dres = w[BLOCK_DOUT], *d4 = w[BLOCK_D4], *dln = w[BLOCK_DLN];
    ERR_TRY(k_matmul_backward(k, d4, g[BLOCK_FCPROJ_W], g[BLOCK_FCPROJ_B], dres, kp[BLOCK_FCH_GELU],
                          p[BLOCK_FCPROJ_W], N, 4 * C, C, e));
    ERR_TRY(k_gelu_backward(k, d4, kp[BLOCK_FCH], d4, (int64_t)N * 4 * C, e));
    ERR_TRY(k_matmul_backward(k, dln, g[BLOCK_FC_W], g[BLOCK_FC_B], d4, kp[BLOCK_LN2], p[BLOCK_FC_W],
                          N, C, 4 * C, e));
    ERR_TRY(k_layernorm_backward(k, dres, g[BLOCK_LN2_W], g[BLOCK_LN2_B], dln, kp[BLOCK_RES2],
                             p[BLOCK_LN2_W], (const float *)kp[BLOCK_LN2_MEAN],
                             (const float *)kp[BLOCK_LN2_RSTD], N, C, e));
    ERR_TRY(k_matmul_backward(k, dln, g[BLOCK_PROJ_W], g[BLOCK_PROJ_B], dres, kp[BLOCK_ATTY],
                          p[BLOCK_PROJ_W], N, C, C, e));
    ERR_TRY(k_attention_backward(k, w[BLOCK_DQKV], w[BLOCK_DATT], dln, kp[BLOCK_QKV], kp[BLOCK_ATT], B,
                             T, C, m->n_head, e));
    ERR_TRY(k_matmul_backward(k, dln, g[BLOCK_QKV_W], g[BLOCK_QKV_B], w[BLOCK_DQKV], kp[BLOCK_LN1],
                          p[BLOCK_QKV_W], N, C, 3 * C, e));
    // the residual carries dres straight to the input; ln1 adds its share
    ERR_TRY(cu_copy(be, w[BLOCK_DINP], dres, act_bytes(m, (int64_t)N * C), e));
    return k_layernorm_backward(k, w[BLOCK_DINP], g[BLOCK_LN1_W], g[BLOCK_LN1_B], dln,
                                kp[BLOCK_INP], p[BLOCK_LN1_W], (const float *)kp[BLOCK_LN1_MEAN],
                                (const float *)kp[BLOCK_LN1_RSTD], N, C, e);
}

// ---- head ----

static int head_kept_forward(struct backend *be, const struct layer_view *l, float *losses,
                             struct err *e)
{
    const struct model *m = l->model;
    kctx k = ctx_of(be, l);
    int N = m->micro_batch * m->seq_len, C = m->n_embd, V = m->vocab_size;
    void *const *kp = l->kept;
    ERR_TRY(k_layernorm_forward(k, kp[HEAD_LNF], (float *)kp[HEAD_LNF_MEAN],
                            (float *)kp[HEAD_LNF_RSTD], kp[HEAD_INP], l->params[HEAD_LNF_W],
                            l->params[HEAD_LNF_B], N, C, e));
    ERR_TRY(k_matmul_forward(k, kp[HEAD_PROBS], nullptr, kp[HEAD_LNF], l->params[HEAD_LM_W], nullptr,
                         N, C, V, e));
    return k_crossentropy_forward(k, kp[HEAD_PROBS], losses, I32(kp[HEAD_TARGETS]), N, V, e);
}

static int head_forward(struct backend *be, const struct layer_view *l, void *out,
                        struct err *e)
{
    return head_kept_forward(be, l, (float *)l->ws[HEAD_LOSSES], e);
}

static int head_recompute(struct backend *be, const struct layer_view *l, struct err *e)
{
    if (l->regen != sizes_full_regen(l->model, MODEL_LAYER_HEAD))
        return unsupported(l, e);
    return head_kept_forward(be, l, nullptr, e);
}

static int head_backward(struct backend *be, const struct layer_view *l, float loss_scale,
                         struct err *e)
{
    const struct model *m = l->model;
    kctx k = ctx_of(be, l);
    int N = m->micro_batch * m->seq_len, C = m->n_embd, V = m->vocab_size;
    void *const *kp = l->kept, *const *w = l->ws;
    // probs become d logits in place: the micro-batch is done with them
    ERR_TRY(k_crossentropy_backward(k, kp[HEAD_PROBS], I32(kp[HEAD_TARGETS]), loss_scale, N, V, e));
    ERR_TRY(k_matmul_backward(k, w[HEAD_DLNF], l->grads[HEAD_LM_W], nullptr, kp[HEAD_PROBS],
                          kp[HEAD_LNF], l->params[HEAD_LM_W], N, C, V, e));
    ERR_TRY(cu_zero(be, w[HEAD_DINP], act_bytes(m, (int64_t)N * C), e));
    return k_layernorm_backward(k, w[HEAD_DINP], l->grads[HEAD_LNF_W], l->grads[HEAD_LNF_B],
                                w[HEAD_DLNF], kp[HEAD_INP], l->params[HEAD_LNF_W],
                                (const float *)kp[HEAD_LNF_MEAN],
                                (const float *)kp[HEAD_LNF_RSTD], N, C, e);
}

// ---- optimizer ----

static int cu_adamw(struct backend *be, void *weights, float *master, const float *g, float *m,
                    float *v, int64_t n, enum model_dtype dtype, const struct adamw_params *p,
                    int t, int decay, struct err *e)
{
    cuda_impl *c = impl_of(be);
    if ((dtype == MODEL_DTYPE_FP32) != (weights == (void *)master))
        return err_set(e, ERR_FAIL, "internal: AdamW on %s weights %s the master weights",
                       model_dtype_name(dtype), weights == (void *)master ? "that are" : "apart from");
    // the bias corrections as the CPU computes them
    float c1 = 1.0f - powf(p->beta1, (float)t), c2 = 1.0f - powf(p->beta2, (float)t);
    kctx k{c->stream, c->blas, dtype == MODEL_DTYPE_BF16};
    return k_adamw(k, weights, master, g, m, v, n, p->lr, p->beta1, p->beta2, p->eps,
                   decay ? p->weight_decay : 0.0f, c1, c2, e);
}

static void cu_free(struct backend *be)
{
    cuda_impl *c = impl_of(be);
    if (c != nullptr) {
        cudaSetDevice(c->device);
        if (c->stream != nullptr)
            cudaStreamSynchronize(c->stream);
        for (int i = 0; i < MAX_ALLOCS; i++)
            if (c->ptr[i] != nullptr)
                cudaFree(c->ptr[i]);
        if (c->blas != nullptr)
            cublasDestroy(c->blas);
        if (c->blas_ws != nullptr)
            cudaFree(c->blas_ws);
        if (c->stream != nullptr)
            cudaStreamDestroy(c->stream);
        free(c);
    }
    be->impl = nullptr;
    be->ops = nullptr;
}

static const struct backend_ops cuda_ops = {
    "cuda",
    BACKEND_DTYPE_BIT(MODEL_DTYPE_FP32) | BACKEND_DTYPE_BIT(MODEL_DTYPE_BF16),
    cu_alloc,
    cu_release,
    cu_upload,
    cu_download,
    cu_copy,
    cu_zero,
    cu_sync,
    {
        {embed_forward, embed_recompute, embed_backward},
        {block_forward, block_recompute, block_backward},
        {head_forward, head_recompute, head_backward},
    },
    cu_adamw,
    cu_free,
};

// ---- set-up and the C API of cuda_device.h ----

extern "C" int cuda_built(void)
{
    return 1;
}

extern "C" int cuda_device_count(int *n, char *why, int why_cap)
{
    *n = 0;
    cudaError_t rc = cudaGetDeviceCount(n);
    if (rc != cudaSuccess) {
        cudaGetLastError(); // not sticky: clear it
        *n = 0;
        if (why != nullptr && why_cap > 0)
            snprintf(why, (size_t)why_cap, "cudaGetDeviceCount: %s", cudaGetErrorString(rc));
    } else if (*n == 0 && why != nullptr && why_cap > 0) {
        snprintf(why, (size_t)why_cap, "cudaGetDeviceCount: no CUDA device");
    }
    return ERR_OK;
}

extern "C" int cuda_device_query(int ordinal, struct cuda_device_info *out, struct err *e)
{
    cudaDeviceProp prop;
    memset(out, 0, sizeof *out);
    CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal), e);
    CUDA_CHECK(cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof out->pci_bus_id, ordinal), e);
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    snprintf(out->uuid, sizeof out->uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
             u[15]);
    out->ordinal = ordinal;
    snprintf(out->name, sizeof out->name, "%s", prop.name);
    out->total_bytes = (int64_t)prop.totalGlobalMem;
    out->cc_major = prop.major;
    out->cc_minor = prop.minor;
    out->multiprocessors = prop.multiProcessorCount;
    return ERR_OK;
}

extern "C" int cuda_mem_info(int64_t *free_bytes, int64_t *total_bytes, struct err *e)
{
    size_t f = 0, t = 0;
    CUDA_CHECK(cudaMemGetInfo(&f, &t), e);
    *free_bytes = (int64_t)f;
    *total_bytes = (int64_t)t;
    return ERR_OK;
}

extern "C" int backend_cuda_memory(const struct backend *be, struct cuda_backend_memory *out)
{
    if (!backend_is_cuda(be))
        return ERR_INPUT;
    *out = impl_of(be)->mem;
    return ERR_OK;
}

extern "C" void *backend_cuda_stream(const struct backend *be)
{
    return backend_is_cuda(be) ? (void *)impl_of(be)->stream : nullptr;
}

extern "C" int backend_is_cuda(const struct backend *be)
{
    return be != nullptr && be->ops == &cuda_ops;
}

static int init(cuda_impl *c, int device, struct err *e)
{
    size_t f0 = 0, f1 = 0, total = 0;
    CUDA_CHECK(cudaSetDevice(device), e);
    CUDA_CHECK(cudaFree(nullptr), e); // creates the context now, so that it is measured here
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), e);
    CUDA_CHECK(cudaMemGetInfo(&f0, &total), e);
    c->mem.total_bytes = (int64_t)total;
    c->mem.used_at_start_bytes = (int64_t)(total - f0);
    CUBLAS_CHECK(cublasCreate(&c->blas), e);
    CUBLAS_CHECK(cublasSetStream(c->blas, c->stream), e);
    CUBLAS_CHECK(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH), e); // no TF32 for fp32
    CUDA_CHECK(cudaMalloc(&c->blas_ws, BLAS_WORKSPACE_BYTES), e);
    CUBLAS_CHECK(cublasSetWorkspace(c->blas, c->blas_ws, BLAS_WORKSPACE_BYTES), e);
    CUDA_CHECK(cudaMemGetInfo(&f1, &total), e);
    c->mem.blas_bytes = (int64_t)f0 - (int64_t)f1;
    c->mem.blas_workspace_bytes = (int64_t)BLAS_WORKSPACE_BYTES;
    return ERR_OK;
}

extern "C" int backend_cuda_init(struct backend *be, int device, struct err *e)
{
    int n = 0;
    char why[256] = "";
    memset(be, 0, sizeof *be);
    cuda_device_count(&n, why, (int)sizeof why);
    if (n == 0)
        return err_set(e, ERR_INPUT, "cuda:%d: no CUDA device is usable here (%s)", device, why);
    if (device < 0 || device >= n)
        return err_set(e, ERR_INPUT, "cuda:%d: this machine has %d CUDA device%s (cuda:0%s)",
                       device, n, n == 1 ? "" : "s", n == 1 ? "" : " and up");
    cuda_impl *c = (cuda_impl *)calloc(1, sizeof *c);
    if (c == nullptr)
        return err_set(e, ERR_FAIL, "out of memory for the cuda backend");
    c->device = device;
    c->mem.device = device;
    be->ops = &cuda_ops;
    be->threads = 1;
    be->impl = c;
    if (init(c, device, e)) {
        cu_free(be);
        return e->code;
    }
    return ERR_OK;
}
