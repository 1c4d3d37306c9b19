// The CUDA backend: device memory from cudaMalloc (no managed memory), one stream, one cuBLAS
// handle with a workspace of its own, and the kernels of kernels.cu, queued on that stream;
// the layers over them are gpt_layers.c's, the CPU backend's. fp32, bf16 and fp16 (kernels.cuh).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.cuh"
#include "kernels.cuh"

extern "C" {
#include "backend.h"
#include "clock.h"
#include "cuda_device.h"
#include "gpt_layers.h"
#include "llama_layers.h"
}

// cuBLAS's workspace: its documentation recommends 32 MiB on Hopper (4 MiB before it); a
// fixed, explicit buffer also makes the GEMMs deterministic from run to run.
#define BLAS_WORKSPACE_BYTES ((size_t)32 << 20)
#define MAX_ALLOCS 64

// Copies to and from pinned host memory (backend.h's copy_async): a stream per direction
// and a ring of events per stream; event number 2 x seq + lane names the stop event of the
// lane's copy seq (from 1). A copy's fence orders it after the compute stream's queued work.
#define COPY_RING 256

struct copy_lane {
    cudaStream_t stream;
    cudaEvent_t fence[COPY_RING], start[COPY_RING], stop[COPY_RING];
    int64_t queued, timed; // copies submitted; copies whose time copy_ms has taken
};

struct cuda_impl {
    int device;
    struct copy_lane lane[2];
    int lanes_ready;
    // The host clock (exec_now_ms's) when `ref` ran, for the copies' times (copy_span).
    cudaEvent_t ref;
    double ref_ms;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    // unscale's flag: pinned host memory the kernel writes through its mapping, so that the
    // check takes no device memory beside the plan's arenas
    int *found_host, *found_dev;
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

static kctx ctx_of(struct backend *be, enum model_dtype dt)
{
    cuda_impl *c = impl_of(be);
    return kctx{c->stream, c->blas, dt};
}

kctx cuda_kctx(struct backend *be, enum model_dtype dt)
{
    return ctx_of(be, dt);
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

// ---- kernels: kernels.cu's on the backend's stream, in the model's dtype ----

static int cu_encoder_forward(struct backend *be, enum model_dtype dt, void *out,
                              const int32_t *tokens, const void *wte, const void *wpe, int B,
                              int T, int C, struct err *e)
{
    return k_encoder_forward(ctx_of(be, dt), out, tokens, wte, wpe, B, T, C, e);
}

static int cu_encoder_backward(struct backend *be, enum model_dtype dt, float *dwte,
                               float *dwpe, const void *dout, const int32_t *tokens, int B,
                               int T, int C, int V, struct err *e)
{
    return k_encoder_backward(ctx_of(be, dt), dwte, dwpe, dout, tokens, B, T, C, V, e);
}

static int cu_layernorm_forward(struct backend *be, enum model_dtype dt, void *out, float *mean,
                                float *rstd, const void *inp, const void *w, const void *b,
                                int N, int C, struct err *e)
{
    return k_layernorm_forward(ctx_of(be, dt), out, mean, rstd, inp, w, b, N, C, e);
}

static int cu_layernorm_backward(struct backend *be, enum model_dtype dt, void *dinp, float *dw,
                                 float *db, const void *dout, const void *inp, const void *w,
                                 const float *mean, const float *rstd, int N, int C,
                                 struct err *e)
{
    return k_layernorm_backward(ctx_of(be, dt), dinp, dw, db, dout, inp, w, mean, rstd, N, C,
                                e);
}

static int cu_matmul_forward(struct backend *be, enum model_dtype dt, void *out,
                             const void *add, const void *inp, const void *w, const void *bias,
                             int N, int C, int OC, struct err *e)
{
    return k_matmul_forward(ctx_of(be, dt), out, add, inp, w, bias, N, C, OC, e);
}

static int cu_matmul_backward(struct backend *be, enum model_dtype dt, void *dinp, float *dw,
                              float *dbias, const void *dout, const void *inp, const void *w,
                              int N, int C, int OC, struct err *e)
{
    return k_matmul_backward(ctx_of(be, dt), dinp, dw, dbias, dout, inp, w, N, C, OC, e);
}

static int cu_attention_forward(struct backend *be, enum model_dtype dt, void *out, void *att,
                                const void *qkv, int B, int T, int C, int NH, struct err *e)
{
    return k_attention_forward(ctx_of(be, dt), out, att, qkv, B, T, C, NH, e);
}

static int cu_attention_backward(struct backend *be, enum model_dtype dt, void *dqkv,
                                 void *datt, const void *dout, const void *qkv, const void *att,
                                 int B, int T, int C, int NH, struct err *e)
{
    return k_attention_backward(ctx_of(be, dt), dqkv, datt, dout, qkv, att, B, T, C, NH, e);
}

static int cu_gelu_forward(struct backend *be, enum model_dtype dt, void *out, const void *inp,
                           int64_t n, struct err *e)
{
    return k_gelu_forward(ctx_of(be, dt), out, inp, n, e);
}

static int cu_gelu_backward(struct backend *be, enum model_dtype dt, void *dinp,
                            const void *inp, const void *dout, int64_t n, struct err *e)
{
    return k_gelu_backward(ctx_of(be, dt), dinp, inp, dout, n, e);
}

static int cu_crossentropy_forward(struct backend *be, enum model_dtype dt, void *probs,
                                   float *losses, const int32_t *targets, int N, int V,
                                   struct err *e)
{
    return k_crossentropy_forward(ctx_of(be, dt), probs, losses, targets, N, V, e);
}

static int cu_crossentropy_backward(struct backend *be, enum model_dtype dt, void *probs,
                                    const int32_t *targets, float dloss, int N, int V,
                                    struct err *e)
{
    return k_crossentropy_backward(ctx_of(be, dt), probs, targets, dloss, N, V, e);
}

// ---- optimizer ----

static int cu_adamw(struct backend *be, void *weights, float *master, const float *g, float *m,
                    float *v, int64_t n, enum model_dtype dtype, const struct adamw_params *p,
                    int t, int decay, struct err *e)
{
    if ((dtype == MODEL_DTYPE_FP32) != (weights == (void *)master))
        return err_set(e, ERR_FAIL, "internal: AdamW on %s weights %s the master weights",
                       model_dtype_name(dtype), weights == (void *)master ? "that are" : "apart from");
    // the bias corrections as the CPU computes them
    float c1 = 1.0f - powf(p->beta1, (float)t), c2 = 1.0f - powf(p->beta2, (float)t);
    return k_adamw(ctx_of(be, dtype), weights, master, g, m, v, n, p->lr, p->beta1, p->beta2,
                   p->eps, decay ? p->weight_decay : 0.0f, c1, c2, e);
}

static int cu_unscale(struct backend *be, float *x, int64_t n, float mul, int *found,
                      struct err *e)
{
    cuda_impl *c = impl_of(be);
    *c->found_host = 0;
    ERR_TRY(k_unscale(ctx_of(be, MODEL_DTYPE_FP32), x, n, mul, c->found_dev, e));
    CUDA_CHECK(cudaStreamSynchronize(c->stream), e);
    if (*(volatile int *)c->found_host)
        *found = 1;
    return ERR_OK;
}

// ---- host memory and the copy lanes ----

static int cu_host_alloc(struct backend *be, int64_t bytes, void **out, struct err *e)
{
    *out = nullptr;
    if (bytes <= 0)
        return ERR_OK;
    cudaError_t rc = cudaHostAlloc(out, (size_t)bytes, cudaHostAllocDefault);
    if (rc == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        *out = nullptr;
        return err_set(e, ERR_NOFIT, "cuda:%d: out of pinned host memory allocating %lld bytes",
                       impl_of(be)->device, (long long)bytes);
    }
    CUDA_CHECK(rc, e);
    return ERR_OK;
}

static void cu_host_release(struct backend *be, void *p)
{
    if (p != nullptr)
        cudaFreeHost(p);
}

static int lanes_init(cuda_impl *c, struct err *e)
{
    for (int d = 0; d < 2; d++) {
        copy_lane *l = &c->lane[d];
        CUDA_CHECK(cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking), e);
        for (int i = 0; i < COPY_RING; i++) {
            CUDA_CHECK(cudaEventCreateWithFlags(&l->fence[i], cudaEventDisableTiming), e);
            CUDA_CHECK(cudaEventCreate(&l->start[i]), e);
            CUDA_CHECK(cudaEventCreate(&l->stop[i]), e);
        }
    }
    CUDA_CHECK(cudaEventCreate(&c->ref), e);
    CUDA_CHECK(cudaEventRecord(c->ref, c->stream), e);
    CUDA_CHECK(cudaEventSynchronize(c->ref), e);
    c->ref_ms = clock_now_ms();
    c->lanes_ready = 1;
    return ERR_OK;
}

static void lanes_free(cuda_impl *c)
{
    for (int d = 0; c->lanes_ready && d < 2; d++) {
        copy_lane *l = &c->lane[d];
        cudaStreamSynchronize(l->stream);
        for (int i = 0; i < COPY_RING; i++) {
            cudaEventDestroy(l->fence[i]);
            cudaEventDestroy(l->start[i]);
            cudaEventDestroy(l->stop[i]);
        }
        cudaStreamDestroy(l->stream);
    }
    if (c->lanes_ready)
        cudaEventDestroy(c->ref);
    c->lanes_ready = 0;
}

// The stop event of copy `ev`, or nullptr when its ring entry has been reused (it is done:
// an entry is reused only after its copy finished).
static cudaEvent_t event_of(cuda_impl *c, int ev)
{
    copy_lane *l = &c->lane[ev & 1];
    int64_t seq = ev / 2;
    if (ev < 0 || seq <= l->queued - COPY_RING)
        return nullptr;
    return l->stop[seq % COPY_RING];
}

static int cu_copy_async(struct backend *be, int dir, void *dst, const void *src, int64_t bytes,
                         int after, int *ev, struct err *e)
{
    cuda_impl *c = impl_of(be);
    if (!c->lanes_ready)
        ERR_TRY(lanes_init(c, e));
    copy_lane *l = &c->lane[dir & 1];
    cudaEvent_t dep = event_of(c, after);
    int64_t seq = l->queued + 1, i = seq % COPY_RING;
    if (seq > COPY_RING) // the entry's last copy: rarely still running this far back
        CUDA_CHECK(cudaEventSynchronize(l->stop[i]), e);
    CUDA_CHECK(cudaEventRecord(l->fence[i], c->stream), e);
    CUDA_CHECK(cudaStreamWaitEvent(l->stream, l->fence[i], 0), e);
    if (dep != nullptr)
        CUDA_CHECK(cudaStreamWaitEvent(l->stream, dep, 0), e);
    CUDA_CHECK(cudaEventRecord(l->start[i], l->stream), e);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)bytes,
                               dir == BACKEND_TO_HOST ? cudaMemcpyDeviceToHost
                                                      : cudaMemcpyHostToDevice,
                               l->stream),
               e);
    CUDA_CHECK(cudaEventRecord(l->stop[i], l->stream), e);
    l->queued = seq;
    *ev = (int)(2 * seq + (dir & 1));
    return ERR_OK;
}

static int cu_event_query(struct backend *be, int ev, int *done, struct err *e)
{
    cudaEvent_t x = event_of(impl_of(be), ev);
    cudaError_t rc = x != nullptr ? cudaEventQuery(x) : cudaSuccess;
    *done = rc == cudaSuccess;
    if (rc != cudaErrorNotReady)
        CUDA_CHECK(rc, e);
    return ERR_OK;
}

static int cu_event_wait(struct backend *be, int ev, struct err *e)
{
    cuda_impl *c = impl_of(be);
    cudaEvent_t x = event_of(c, ev);
    if (x != nullptr)
        CUDA_CHECK(cudaStreamWaitEvent(c->stream, x, 0), e);
    return ERR_OK;
}

static int cu_copy_ms(struct backend *be, double ms[2], struct err *e)
{
    cuda_impl *c = impl_of(be);
    for (int d = 0; c->lanes_ready && d < 2; d++) {
        copy_lane *l = &c->lane[d];
        if (l->timed < l->queued - COPY_RING)
            l->timed = l->queued - COPY_RING; // reused entries: their times are gone
        while (l->timed < l->queued) {
            int64_t i = (l->timed + 1) % COPY_RING;
            if (cudaEventQuery(l->stop[i]) != cudaSuccess)
                break;
            float t = 0;
            CUDA_CHECK(cudaEventElapsedTime(&t, l->start[i], l->stop[i]), e);
            ms[d] += t;
            l->timed++;
        }
    }
    cudaGetLastError(); // a NotReady from the query is not an error
    return ERR_OK;
}

static int cu_copy_span(struct backend *be, int ev, double *t0_ms, double *t1_ms, int *known,
                        struct err *e)
{
    cuda_impl *c = impl_of(be);
    cudaEvent_t stop = c->lanes_ready ? event_of(c, ev) : nullptr;
    *known = stop != nullptr;
    if (!*known)
        return ERR_OK;
    float a = 0, b = 0;
    CUDA_CHECK(cudaEventSynchronize(stop), e);
    CUDA_CHECK(cudaEventElapsedTime(&a, c->ref, c->lane[ev & 1].start[(ev / 2) % COPY_RING]), e);
    CUDA_CHECK(cudaEventElapsedTime(&b, c->ref, stop), e);
    *t0_ms = c->ref_ms + a;
    *t1_ms = c->ref_ms + b;
    return ERR_OK;
}

static void cu_free(struct backend *be)
{
    cuda_impl *c = impl_of(be);
    if (c != nullptr) {
        cudaSetDevice(c->device);
        lanes_free(c);
        if (c->stream != nullptr)
            cudaStreamSynchronize(c->stream);
        for (int i = 0; i < MAX_ALLOCS; i++)
            if (c->ptr[i] != nullptr)
                cudaFree(c->ptr[i]);
        if (c->blas != nullptr)
            cublasDestroy(c->blas);
        if (c->blas_ws != nullptr)
            cudaFree(c->blas_ws);
        if (c->found_host != nullptr)
            cudaFreeHost(c->found_host);
        if (c->stream != nullptr)
            cudaStreamDestroy(c->stream);
        free(c);
    }
    be->impl = nullptr;
    be->ops = nullptr;
}

static const struct backend_ops cuda_ops = {
    "cuda",
    BACKEND_DTYPE_BIT(MODEL_DTYPE_FP32) | BACKEND_DTYPE_BIT(MODEL_DTYPE_BF16) |
        BACKEND_DTYPE_BIT(MODEL_DTYPE_FP16),
    cu_alloc,
    cu_release,
    cu_upload,
    cu_download,
    cu_copy,
    cu_zero,
    cu_sync,
    GPT_LAYER_OPS,
    cu_encoder_forward,
    cu_encoder_backward,
    cu_layernorm_forward,
    cu_layernorm_backward,
    cu_matmul_forward,
    cu_matmul_backward,
    cu_attention_forward,
    cu_attention_backward,
    cu_gelu_forward,
    cu_gelu_backward,
    cu_crossentropy_forward,
    cu_crossentropy_backward,
    cu_adamw,
    cu_unscale,
    cu_host_alloc,
    cu_host_release,
    cu_copy_async,
    cu_event_query,
    cu_event_wait,
    cu_copy_ms,
    cu_copy_span,
    cu_free,
    &llama_kernels_cuda,
    &flash_kernels_cuda,
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

static int cuda_impl_init(cuda_impl *c, int device, struct err *e)
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
    CUDA_CHECK(cudaHostAlloc((void **)&c->found_host, sizeof(int), cudaHostAllocMapped), e);
    CUDA_CHECK(cudaHostGetDevicePointer((void **)&c->found_dev, c->found_host, 0), e);
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
    if (cuda_impl_init(c, device, e)) {
        cu_free(be);
        return e->code;
    }
    return ERR_OK;
}
