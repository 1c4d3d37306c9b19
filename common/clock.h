/* Seconds on the monotonic clock: the one reading behind every deadline, time limit and
 * timing in the tree. */
#ifndef BALLAST_CLOCK_H
#define BALLAST_CLOCK_H

#include <time.h>

static inline double clock_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
