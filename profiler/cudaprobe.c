#include "cudaprobe.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define CUDA_TRY(call)                                                                       \
    do {                                                                                     \
        cudaError_t cuda_rc_ = (call);                                                       \
        if (cuda_rc_ != cudaSuccess)                                                         \
            return err_set(e, ERR_FAIL, "%s failed at %s:%d: %s", #call, __FILE__, __LINE__, \
                           cudaGetErrorString(cuda_rc_));                                    \
    } while (0)

struct events {
    cudaEvent_t start, stop;
    cudaStream_t stream;
};

static int events_start(struct measure_timer *t, struct err *e)
{
    struct events *ev = t->impl;
    CUDA_TRY(cudaEventRecord(ev->start, ev->stream));
    return ERR_OK;
}

static int events_stop(struct measure_timer *t, double *ms, struct err *e)
{
    struct events *ev = t->impl;
    float elapsed = 0;
    CUDA_TRY(cudaEventRecord(ev->stop, ev->stream));
    CUDA_TRY(cudaEventSynchronize(ev->stop));
    CUDA_TRY(cudaEventElapsedTime(&elapsed, ev->start, ev->stop));
    *ms = elapsed;
    return ERR_OK;
}

int cudaprobe_timer_init(struct measure_timer *t, void *stream, struct err *e)
{
    struct events *ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return err_set(e, ERR_FAIL, "out of memory for two CUDA events");
    ev->stream = (cudaStream_t)stream;
    cudaError_t rc = cudaEventCreate(&ev->start);
    if (rc == cudaSuccess) {
        rc = cudaEventCreate(&ev->stop);
        if (rc != cudaSuccess)
            cudaEventDestroy(ev->start);
    }
    if (rc != cudaSuccess) {
        free(ev);
        return err_set(e, ERR_FAIL, "cudaEventCreate failed at %s:%d: %s", __FILE__, __LINE__,
                       cudaGetErrorString(rc));
    }
    t->name = "CUDA events on the backend's stream";
    t->start = events_start;
    t->stop = events_stop;
    t->impl = ev;
    return ERR_OK;
}

void cudaprobe_timer_free(struct measure_timer *t)
{
    struct events *ev = t->impl;
    if (ev != NULL) {
        cudaEventDestroy(ev->start);
        cudaEventDestroy(ev->stop);
        free(ev);
    }
    t->impl = NULL;
}

int cudaprobe_versions(cJSON *lib, struct err *e)
{
    int runtime = 0, driver = 0, major = 0, minor = 0, patch = 0;
    char text[64];
    CUDA_TRY(cudaRuntimeGetVersion(&runtime));
    CUDA_TRY(cudaDriverGetVersion(&driver));
    if (cublasGetProperty(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
        cublasGetProperty(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
        cublasGetProperty(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS)
        return err_set(e, ERR_FAIL, "cublasGetProperty failed at %s:%d", __FILE__, __LINE__);
    snprintf(text, sizeof text, "%d.%d", runtime / 1000, runtime % 1000 / 10);
    cJSON_AddStringToObject(lib, "cuda_runtime", text);
    snprintf(text, sizeof text, "%d.%d", driver / 1000, driver % 1000 / 10);
    cJSON_AddStringToObject(lib, "cuda_driver", text);
    snprintf(text, sizeof text, "%d.%d.%d", major, minor, patch);
    cJSON_AddStringToObject(lib, "cublas", text);
    return ERR_OK;
}
