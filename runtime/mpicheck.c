/* MPI calls checked, and waits for other ranks that sleep (mpicheck.h). */
#include "mpicheck.h"

#include <stdio.h>
#include <unistd.h>

#include "backoff.h"
#include "clock.h"
#include "progress.h"

int mpicheck_fail(int rc, const char *call, const char *file, int line, struct err *e)
{
    char msg[MPI_MAX_ERROR_STRING], host[256];
    int len = 0, rank = -1, init = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "error %d", rc);
    MPI_Initialized(&init);
    if (init)
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    return err_set(e, ERR_FAIL, "%s failed at %s:%d on %s rank %d: %s", call, file, line, host,
                   rank, msg);
}

int mpicheck_wait(MPI_Request *req, const char *what, struct err *e)
{
    double start = clock_now_s();
    progress_waiting(1);
    for (;;) {
        int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || done) {
            progress_waiting(0);
            return rc != MPI_SUCCESS ? mpicheck_fail(rc, what, __FILE__, __LINE__, e) : ERR_OK;
        }
        backoff_pause(clock_now_s() - start);
    }
}

int mpicheck_collective(int mpi_rc, MPI_Request *req, const char *what, struct err *e)
{
    if (mpi_rc != MPI_SUCCESS)
        return mpicheck_fail(mpi_rc, what, __FILE__, __LINE__, e);
    return mpicheck_wait(req, what, e);
}

int mpicheck_agree(MPI_Comm comm, int size, int verdict[2], struct err *e)
{
    /* one maximum over both: the worst status, and size - the first rank that failed */
    int mine[2] = {verdict[0], size - verdict[1]}, all[2];
    MPI_Request q;
    ERR_TRY(mpicheck_collective(MPI_Iallreduce(mine, all, 2, MPI_INT, MPI_MAX, comm, &q), &q,
                                "the ranks' statuses (MPI_Iallreduce)", e));
    verdict[0] = all[0];
    verdict[1] = size - all[1];
    return ERR_OK;
}

int mpicheck_agree_flag(MPI_Comm comm, int rank, int size, int mine, int *first,
                        struct err *e)
{
    int verdict[2] = {mine != 0, mine ? rank : size};
    ERR_TRY(mpicheck_agree(comm, size, verdict, e));
    *first = verdict[0] ? verdict[1] : -1;
    return ERR_OK;
}

int mpicheck_gate(MPI_Comm comm, const char *what, struct err *e)
{
    MPI_Request q;
    return mpicheck_collective(MPI_Ibarrier(comm, &q), &q, what, e);
}
