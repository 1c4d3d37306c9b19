/* Every MPI call is wrapped in MPI_CHECK: on failure it fills the struct err with the call,
 * file:line, host, rank and MPI's own message, and returns the status up the stack (the
 * communicators use MPI_ERRORS_RETURN so that errors reach us instead of aborting). */
#ifndef BALLAST_MPICHECK_H
#define BALLAST_MPICHECK_H

#include <mpi.h>

#include "err.h"

int mpicheck_fail(int rc, const char *call, const char *file, int line, struct err *e);

/* Completes `req` by polling (sleeping between polls, so that a waiting rank leaves the core
 * to the rank it waits for). After timeout_s seconds (> 0; 0 waits for ever) it fails with
 * ERR_FAIL naming `peer`, the rank that went silent, and `what` it was to send or receive;
 * the request is left pending (the caller aborts). `peer` < 0: a collective, whose silent
 * rank nobody can name. */
int mpicheck_wait(MPI_Request *req, double timeout_s, int peer, const char *what,
                  struct err *e);

/* A nonblocking call's return code `mpi_rc` and its request `req`, completed under the
 * deadline as mpicheck_wait does. */
int mpicheck_collective(int mpi_rc, MPI_Request *req, double timeout_s, int peer,
                        const char *what, struct err *e);

/* Every rank passes verdict = {its status, its rank if it failed else size}; all get back the
 * worst status and the first rank that failed. The statuses go to rank 0 on `ctl` (a
 * communicator nothing else uses) and the verdict comes back, every wait under timeout_s: a
 * rank that never reports is named by rank 0. Fails only when MPI or the deadline does. */
int mpicheck_agree(MPI_Comm ctl, int rank, int size, double timeout_s, int verdict[2],
                   struct err *e);

#define MPI_CHECK(call, e)                                                                   \
    do {                                                                                     \
        int mpi_rc_ = (call);                                                                \
        if (mpi_rc_ != MPI_SUCCESS)                                                          \
            return mpicheck_fail(mpi_rc_, #call, __FILE__, __LINE__, (e));                   \
    } while (0)

#endif
