/* Liveness of the ranks of `ballast train` by heartbeat, not by how long a wait lasts.
 *
 * Each rank runs a heartbeat thread beside its work. Every `period` (deadline / 8, between
 * 0.05 s and 1 s) the thread of every rank sends a small message to world rank 0, and rank 0's
 * thread sends one to every other rank, on MPI_COMM_WORLD with a tag nothing else uses (the
 * largest tag, above every micro-batch index the transports use). A beat says that its
 * process runs, and how far it has got (progress.h: its count of work done, and whether its
 * main thread waits on another rank). A rank busy computing, reading a large checkpoint or
 * stalled on its own offload copies beats on and progresses, so its peers wait for it as long
 * as it takes. Rank 0 judges, every period:
 *   - silent: a rank not heard from for `deadline` seconds (stopped by SIGSTOP, dead, or its
 *     messages no longer arriving);
 *   - cut off: a rank heard, whose beats say it has not heard rank 0 for `deadline` seconds
 *     (messages to it no longer arrive);
 *   - stuck: a rank alive whose count has not moved for `stall` seconds while it waits on no
 *     one (a library retrying a failed allocation for ever);
 *   - deadlock: every rank waiting on another and no count moving for `stall` seconds;
 * names them (world rank, and with the layout known, replica and stage: world rank w is
 * replica w / S, stage w % S), tells every other rank, waits briefly for each to say it has
 * printed the verdict, and ends the process with status 1; mpirun then ends the job. Every
 * other rank prints the verdict it receives, or, when rank 0 itself falls silent, names rank 0
 * (two periods after the deadline, so that rank 0 speaks first when it is the one that hears
 * nobody), and ends with status 1. So every rank names the rank that actually stopped (not a
 * neighbour waiting on it: the neighbour still beats, and waits), within deadline + period,
 * wherever its main thread is: in a kernel, a collective, a communicator's set-up or a
 * blocking MPI call. Waits on other ranks (mpicheck_wait) need no time limit of their own.
 *
 * The thread calls MPI concurrently with the main thread: MPI must provide
 * MPI_THREAD_MULTIPLE (MPI_Init_thread). One heartbeat per process (it watches the process).
 *
 * At the end every rank leaves: it tells rank 0 it is done (so that a rank finishing first is
 * not taken for a silent one), the thread stops calling MPI, and MPI_Finalize, which waits
 * for every rank, is guarded: if it has not returned `deadline` seconds later, the process
 * ends with the run's status. */
#ifndef BALLAST_HEARTBEAT_H
#define BALLAST_HEARTBEAT_H

#include "err.h"

struct heartbeat;

/* Starts this rank's heartbeat over MPI_COMM_WORLD with `deadline_s` and `stall_s` (> 0).
 * Collective in effect: every rank calls it right after MPI_Init_thread. Without
 * MPI_THREAD_MULTIPLE there is none: *out is NULL, ERR_OK, and `why` (cap bytes) says so. */
int heartbeat_start(struct heartbeat **out, double deadline_s, double stall_s, char *why,
                    int cap, struct err *e);

/* Names ranks by replica and stage from now on: the run has n_stages stages per pipeline
 * (world rank w is replica w / n_stages, stage w % n_stages). NULL h: nothing. */
void heartbeat_layout(struct heartbeat *h, int n_stages);

/* This rank is done with MPI but MPI_Finalize: tells rank 0, stops the thread's MPI calls
 * (returns once it has), and from now on guards MPI_Finalize: `status` is the exit status if
 * it hangs. NULL h: nothing. */
void heartbeat_leave(struct heartbeat *h, int status);

/* After heartbeat_leave and MPI_Finalize: stops the thread and frees. NULL h: nothing. */
void heartbeat_free(struct heartbeat *h);

#endif
