/* `ballast plan --share`: one plan for jobs that time-share a cluster's devices (share.h).
 * Per device, every job's persistent bytes (sum state_l of its stage) are laid end to end;
 * what is left below the capacity, less the reserve, is the temporary budget every job's
 * activations, transient and workspace must fit, and each job's method chooses its actions
 * for that budget:
 *   sum_j persistent_j + max_j temporary_j + reserve <= capacity. */
#ifndef BALLAST_SHARE_PLAN_H
#define BALLAST_SHARE_PLAN_H

#include "planner.h"
#include "share.h"

/* One job: its cluster file and its method ("FILE.json" or "FILE.json:METHOD"). */
struct share_job_spec {
    const char *cluster_file;
    struct plan_options o;
};

/* "FILE[:METHOD]": the method after the first ':' after the last '/', else `defaults`'. */
int share_job_parse(const char *arg, const struct plan_options *defaults, char *file,
                    size_t file_cap, struct share_job_spec *out, struct err *e);

/* ERR_INPUT when the clusters differ in devices, memory or reserve, or a job asks for
 * --repartition (it would move the persistent bytes); ERR_NOFIT naming the device and the
 * numbers when the persistent regions and the reserve exceed a device, or naming the job and
 * its temporary budget when its method cannot fit that. */
int planner_share(const struct share_job_spec *jobs, int n, struct share *out, struct err *e);

/* Per device: capacity, reserve, each job's persistent and temporary, the region used. */
void planner_share_print(FILE *f, const struct share *s);

#endif
