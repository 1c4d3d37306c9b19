/* Where a rank of `ballast train` computes (train.h): on a GPU or on the CPU, and then with
 * how many threads. Shared by one plan's run (train.c) and jobs sharing GPUs (train_share.c). */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "plan.h"
#include "train.h"

/* The cores this process may run on (its affinity: mpirun may bind it), else the host's. */
static int available_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 0 ? (int)cores : 1;
}

int train_cpu_threads(int requested, int n_local, int speak)
{
    int cores = available_cores(), share = cores / n_local > 0 ? cores / n_local : 1;
    if (requested > 0 && requested > share && speak)
        fprintf(stderr,
                "ballast train: warning: --threads %d: %d rank%s of this node run %d threads on "
                "its %d core%s (%d each keeps a thread per core); the CPU kernels slow down "
                "many times when threads outnumber cores\n",
                requested, n_local, n_local > 1 ? "s" : "", requested * n_local, cores,
                cores > 1 ? "s" : "", share);
    return requested > 0 ? requested : share;
}

/* Whether a stage computes on a GPU: --device, else the plan's device_kind (every plan has
 * one: plan_load refuses a plan without it). */
int train_stage_on_cuda(const char *device, const struct plan_stage *st)
{
    if (strcmp(device, "auto") != 0)
        return strcmp(device, "cuda") == 0;
    return strcmp(st->device_kind, "cuda") == 0;
}
