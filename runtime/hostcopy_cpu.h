/* The CPU backend's copy lanes (backend.h's copy_async): one thread per direction, each
 * running its copies first in first out, so that copies to and from host memory overlap the
 * compute as a GPU's copy engines do. An emulated link (gbps > 0) stretches each copy to
 * latency + bytes / gbps by sleeping, as a PCIe link would take. Events are numbers:
 * 2 x (the copy's sequence number in its lane, from 1) + the lane. */
#ifndef BALLAST_HOSTCOPY_CPU_H
#define BALLAST_HOSTCOPY_CPU_H

#include <stdint.h>

#include "err.h"

struct hostcopy;

int hostcopy_start(struct hostcopy **h, struct err *e);
/* Waits for the copies queued, then stops the threads. */
void hostcopy_stop(struct hostcopy *h);
int hostcopy_submit(struct hostcopy *h, int dir, void *dst, const void *src, int64_t bytes,
                    int after, double gbps, double latency_us, int *ev, struct err *e);
int hostcopy_done(struct hostcopy *h, int ev);
void hostcopy_wait(struct hostcopy *h, int ev);
/* When copy `ev` ran (CLOCK_MONOTONIC ms, exec_now_ms's clock), waiting for it: 0 when its
 * record is gone (LANE_JOBS later copies on its lane reused it). */
int hostcopy_span(struct hostcopy *h, int ev, double *t0_ms, double *t1_ms);
/* Each lane's busy milliseconds since the last call, added into ms[lane]. */
void hostcopy_busy(struct hostcopy *h, double ms[2]);

#endif
