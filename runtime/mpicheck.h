/* Every MPI call in runtime/ goes through one of the wrappers below (tests/test_promises.py
 * fails on one that does not), the communicators using MPI_ERRORS_RETURN so that errors reach
 * us instead of aborting:
 *   MPI_CHECK(call, e)        on failure fills the struct err with the call, file:line, host,
 *                             rank and MPI's own message, and returns the status up the stack;
 *   mpicheck_collective(call, &req, what, e)   a nonblocking call, then its completion;
 *   MPI_OK(call)              true when the call succeeded, where the caller handles a failure
 *                             in place (a probe loop, an optional attribute);
 *   MPI_RELEASE(call)         teardown and last resort (freeing, cancelling, aborting): a
 *                             failure leaves nothing to do, so its status is dropped on purpose.
 *
 * Waits on other ranks have no time limit of their own: whether the rank waited for is alive
 * is the heartbeat's to judge (heartbeat.h), which ends the job when one stops. A waiting rank
 * sleeps between polls (backoff.h) rather than spinning. */
#ifndef BALLAST_MPICHECK_H
#define BALLAST_MPICHECK_H

#include <mpi.h>

#include "err.h"

int mpicheck_fail(int rc, const char *call, const char *file, int line, struct err *e);

/* Completes `req` (an MPI call's request, `what` naming it in a failure), sleeping between
 * polls. */
int mpicheck_wait(MPI_Request *req, const char *what, struct err *e);

/* A nonblocking call's return code `mpi_rc` and its request `req`, completed as
 * mpicheck_wait does. */
int mpicheck_collective(int mpi_rc, MPI_Request *req, const char *what, struct err *e);

/* Every rank of `comm` (size ranks) passes verdict = {its status, its rank if it failed else
 * size}; all get back the worst status and the first rank that failed (one MPI_Iallreduce).
 * Fails only when MPI does. */
int mpicheck_agree(MPI_Comm comm, int size, int verdict[2], struct err *e);
/* The same agreement over a flag (stage_config.agree_flag): *first the lowest rank of `comm`
 * whose `mine` is set, -1 when none is. */
int mpicheck_agree_flag(MPI_Comm comm, int rank, int size, int mine, int *first,
                        struct err *e);

/* Every rank of `comm` arrived (an MPI_Ibarrier, waited for sleeping): called before a
 * blocking collective MPI has no nonblocking form of (MPI_Comm_split, MPI_Comm_split_type),
 * so that a rank arriving first sleeps here instead of spinning there. */
int mpicheck_gate(MPI_Comm comm, const char *what, struct err *e);

#define MPI_OK(call) ((call) == MPI_SUCCESS)
#define MPI_RELEASE(call) ((void)(call))

#define MPI_CHECK(call, e)                                                                   \
    do {                                                                                     \
        int mpi_rc_ = (call);                                                                \
        if (mpi_rc_ != MPI_SUCCESS)                                                          \
            return mpicheck_fail(mpi_rc_, #call, __FILE__, __LINE__, (e));                   \
    } while (0)

#endif
