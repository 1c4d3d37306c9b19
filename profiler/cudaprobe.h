/* The profiler's own use of the CUDA runtime, compiled only where the CUDA backend is
 * (BALLAST_WITH_CUDA): CUDA events on the backend's stream to time spans, and the versions of
 * the CUDA runtime, driver and cuBLAS for a profile's provenance. */
#ifndef BALLAST_CUDAPROBE_H
#define BALLAST_CUDAPROBE_H

#include <cjson/cJSON.h>

#include "err.h"
#include "measure.h"

/* A timer recording two CUDA events on `stream` (a cudaStream_t: backend_cuda_stream) of the
 * calling thread's current device; cudaprobe_timer_free releases them. */
int cudaprobe_timer_init(struct measure_timer *t, void *stream, struct err *e);
void cudaprobe_timer_free(struct measure_timer *t);

/* Adds "cuda_runtime", "cuda_driver" and "cublas" versions to the object `lib`. */
int cudaprobe_versions(cJSON *lib, struct err *e);

#endif
