/* Where a measured profile is made: the backend for a `--device` (cpu, cuda:N), the device's
 * name, kind and memory, and the provenance a measured profile carries (device, host, date,
 * threads, library versions). */
#ifndef BALLAST_HOSTINFO_H
#define BALLAST_HOSTINFO_H

#include <cjson/cJSON.h>

#include "backend.h"
#include "err.h"
#include "measure.h"
#include "profile.h"

/* Parses "cpu" (index -1) or "cuda:N" (index N). Fails (ERR_INPUT) on anything else. */
int hostinfo_parse_device(const char *text, int *cuda_index, struct err *e);

/* Opens the backend of `device` ("cpu" with `threads` threads, or "cuda:N"; threads 0 for
 * CUDA) and describes it: d gets the device's name (the CPU model, or the CUDA device name),
 * kind and total memory, and prov (an object) what the profile was made with. On a GPU,
 * `timer` gets CUDA events on the backend's stream; on the CPU its `start` is NULL (the host
 * clock is exact there). A CUDA device in a build without the CUDA backend is refused
 * (ERR_INPUT), never emulated. On success hostinfo_close releases both. */
int hostinfo_open(const char *device, int threads, struct backend *be,
                  struct measure_timer *timer, struct device_info *d, cJSON *prov,
                  struct err *e);
void hostinfo_close(struct backend *be, struct measure_timer *timer);

#endif
