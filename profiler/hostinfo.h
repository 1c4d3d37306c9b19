/* Where a measured profile is made: the backend for a `--device` (cpu, cuda:N), the device's
 * name, kind and memory, and the provenance a measured profile carries (device, host, date,
 * threads, library versions). */
#ifndef BALLAST_HOSTINFO_H
#define BALLAST_HOSTINFO_H

#include <cjson/cJSON.h>

#include "backend.h"
#include "err.h"
#include "profile.h"

/* Parses "cpu" (index -1) or "cuda:N" (index N). Fails (ERR_INPUT) on anything else. */
int hostinfo_parse_device(const char *text, int *cuda_index, struct err *e);

/* Opens the backend of `device` ("cpu" with `threads` threads, or "cuda:N"; threads 0 for
 * CUDA) and describes it: d gets the device's name (the CPU model, or the CUDA device name),
 * kind and total memory, and prov (an object) what the profile was made with. A CUDA device
 * in a build without the CUDA backend is refused (ERR_INPUT), never emulated. On success the
 * caller frees the backend (be->ops->free). */
int hostinfo_open(const char *device, int threads, struct backend *be, struct device_info *d,
                  cJSON *prov, struct err *e);

#endif
