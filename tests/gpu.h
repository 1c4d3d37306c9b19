/* GPU tests: skipped, with the reason on stderr and exit status 77 (CTest's SKIP_RETURN_CODE),
 * when this build has no CUDA backend or the machine no usable CUDA device. */
#ifndef BALLAST_TEST_GPU_H
#define BALLAST_TEST_GPU_H

#include <stdio.h>
#include <stdlib.h>

#include "cuda_device.h"

#define GPU_SKIP 77

static inline void gpu_require(const char *test)
{
    int n = 0;
    char why[512] = "";
    cuda_device_count(&n, why, (int)sizeof why);
    if (n == 0) {
        fprintf(stderr, "SKIP %s: no GPU to run on (%s)\n", test, why);
        exit(GPU_SKIP);
    }
    struct cuda_device_info info;
    struct err e;
    if (cuda_device_query(0, &info, &e) == ERR_OK)
        fprintf(stderr, "%s on cuda:0: %s (sm_%d%d, %d SMs, %.1f GiB)\n", test, info.name,
                info.cc_major, info.cc_minor, info.multiprocessors,
                (double)info.total_bytes / (1 << 30));
}

#endif
