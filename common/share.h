/* The share file (ballast-share/1): jobs that time-share one cluster's devices (docs/formats.md,
 * "share"). Each job has its own plan over the same devices in the same stage order; per
 * device, every job keeps a persistent region (weights, gradients, optimizer state: the whole
 * run) and all jobs take turns in one temporary region (activations, transient, workspace:
 * one step). A job's persistent region starts where the previous job's ends, the temporary
 * region after the last; each starts on a SHARE_ALIGN boundary:
 *
 *   0 | job 0 persistent | job 1 persistent | ... | temporary | (reserve) capacity
 *
 *   {"format": "ballast-share/1",
 *    "jobs": [{"name", "cluster", "method", "plan": {ballast-plan/1}}],
 *    "devices": [{"stage", "device", "capacity_bytes", "reserve_bytes",
 *                 "persistent": [{"job", "offset", "bytes"}]   (one per job, in job order)
 *                 "temporary": {"offset", "bytes"}}]} */
#ifndef BALLAST_SHARE_H
#define BALLAST_SHARE_H

#include <stdint.h>

#include "err.h"
#include "plan.h"

#define SHARE_JOBS_MAX 8
#define SHARE_NAME_MAX 64
#define SHARE_ALIGN 256

struct share_region {
    int64_t offset, bytes;
};

struct share_device {
    char device[PROFILE_NAME_MAX];
    int64_t capacity_bytes, reserve_bytes;
    struct share_region persistent[SHARE_JOBS_MAX]; /* per job */
    struct share_region temporary;
};

struct share_job {
    char name[SHARE_NAME_MAX];
    char cluster[CLUSTER_PATH_MAX]; /* the job's cluster file, as given */
    struct plan plan;
};

struct share {
    int n_jobs, n_devices; /* n_devices: every plan's stage count */
    struct share_job jobs[SHARE_JOBS_MAX];
    struct share_device *devices; /* owned */
};

int64_t share_align(int64_t bytes);
/* A stage's persistent and temporary bytes in a plan, by the cost model: sum state_l, and
 * M - reserve - that. */
void share_stage_bytes(const struct plan *p, int stage, int64_t *persistent,
                       int64_t *temporary);

int share_write(const char *file, const struct share *s, struct err *e);
/* Reads and checks a share file: every job's plan (messages name jobs[j].plan), the same
 * stage count and devices in every plan, one persistent region per job in job order, regions
 * in the order above without overlap (ERR_INPUT, naming the field), and every device's
 * regions and reserve within its capacity (ERR_NOFIT, with the numbers). */
int share_load(const char *file, struct share *s, struct err *e);
void share_free(struct share *s);

#endif
