/* MPI calls checked, and every wait for another rank under a deadline (mpicheck.h). */
#include "mpicheck.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

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

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int mpicheck_wait(MPI_Request *req, double timeout_s, int peer, const char *what,
                  struct err *e)
{
    double start = now_s();
    int done = 0;
    for (long polls = 0;; polls++) {
        MPI_CHECK(MPI_Test(req, &done, MPI_STATUS_IGNORE), e);
        if (done)
            return ERR_OK;
        if (polls > 200) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
        if (timeout_s > 0 && polls % 64 == 0 && now_s() - start > timeout_s && peer < 0)
            return err_set(e, ERR_FAIL,
                           "waited %.0f s for %s: a rank went silent (stopped, died or out of "
                           "memory); --timeout SECONDS sets this limit",
                           timeout_s, what);
        if (timeout_s > 0 && polls % 64 == 0 && now_s() - start > timeout_s)
            return err_set(e, ERR_FAIL,
                           "waited %.0f s for %s rank %d: rank %d went silent (stopped, died or "
                           "out of memory); --timeout SECONDS sets this limit",
                           timeout_s, what, peer, peer);
    }
}

int mpicheck_collective(int mpi_rc, MPI_Request *req, double timeout_s, int peer,
                        const char *what, struct err *e)
{
    if (mpi_rc != MPI_SUCCESS)
        return mpicheck_fail(mpi_rc, what, __FILE__, __LINE__, e);
    return mpicheck_wait(req, timeout_s, peer, what, e);
}

int mpicheck_agree(MPI_Comm ctl, int rank, int size, double timeout_s, int verdict[2],
                   struct err *e)
{
    MPI_Request q;
    for (int k = 1; rank == 0 && k < size; k++) {
        int got[2];
        ERR_TRY(mpicheck_collective(MPI_Irecv(got, 2, MPI_INT, k, 0, ctl, &q), &q, timeout_s, k,
                                    "the status of", e));
        verdict[0] = got[0] > verdict[0] ? got[0] : verdict[0];
        verdict[1] = got[1] < verdict[1] ? got[1] : verdict[1];
    }
    /* the others wait longer than rank 0, so that its message, naming the rank it is
     * missing, is the one the job ends on */
    if (rank > 0)
        ERR_TRY(mpicheck_collective(MPI_Isend(verdict, 2, MPI_INT, 0, 0, ctl, &q), &q,
                                    2 * timeout_s, 0, "the status to be taken by", e));
    return mpicheck_collective(MPI_Ibcast(verdict, 2, MPI_INT, 0, ctl, &q), &q, 2 * timeout_s, 0,
                               "the verdict from", e);
}
