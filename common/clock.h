/* The clocks read in the tree, each in one place: the monotonic clock (every deadline, time
 * limit and wall-clock timing) and the process's CPU time (timings on a shared machine, where
 * wall time counts the other jobs too). */
#ifndef BALLAST_CLOCK_H
#define BALLAST_CLOCK_H

#include <time.h>

static inline double clock_seconds(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds (milliseconds) on the monotonic clock. */
static inline double clock_now_s(void)
{
    return clock_seconds(CLOCK_MONOTONIC);
}

static inline double clock_now_ms(void)
{
    return 1e3 * clock_seconds(CLOCK_MONOTONIC);
}

/* The process's CPU time in seconds, all its threads together. */
static inline double clock_cpu_s(void)
{
    return clock_seconds(CLOCK_PROCESS_CPUTIME_ID);
}

#endif
