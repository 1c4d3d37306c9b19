/* The pause between polls of something another rank or a device completes (an MPI request, a
 * NCCL transfer's event): none for the first 50 us of a wait (a message about to land), then a
 * sixteenth of the time waited so far, between 20 us and 1 ms. A long wait so costs about one
 * poll a millisecond, well under 1% of a core, instead of spinning; it wakes at most 1 ms, or
 * 1/16 of its length, after the thing it waits for completes. C and CUDA. */
#ifndef BALLAST_BACKOFF_H
#define BALLAST_BACKOFF_H

#include <time.h>

#include "clock.h"

/* Pauses after `waited_s` seconds of waiting. */
static inline void backoff_pause(double waited_s)
{
    if (waited_s < 50e-6)
        return;
    double s = waited_s / 16;
    s = s < 20e-6 ? 20e-6 : s > 1e-3 ? 1e-3 : s;
    struct timespec ts = {0, (long)(s * 1e9)};
    nanosleep(&ts, NULL);
}

#endif
