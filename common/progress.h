/* How far this process has got, for the heartbeat (runtime/heartbeat.h) to tell its peers: a
 * count of units of work done, ticked from any thread (a layer's forward, backward or
 * recompute; a piece of a file read or written; a copy to or from host memory; a host
 * optimizer's layer; a wait on another rank that completed), and whether the main thread is
 * waiting on another rank now. A rank that is alive but neither progresses nor waits is stuck
 * (a library retrying a failed allocation for ever); a rank that waits is not. Process-wide,
 * like the process it describes. */
#ifndef BALLAST_PROGRESS_H
#define BALLAST_PROGRESS_H

#ifdef __cplusplus
extern "C" {
#endif

void progress_tick(void);
unsigned long long progress_count(void);

/* The main thread begins (1) or ends (0) a wait on another rank or a device; an end ticks. */
void progress_waiting(int waiting);
int progress_is_waiting(void);

#ifdef __cplusplus
}
#endif

#endif
