/* The end of an MPI test program's main, shared by the tests that run on several ranks. */
#ifndef BALLAST_TEST_MPITEST_H
#define BALLAST_TEST_MPITEST_H

#include <mpi.h>

#include "testutil.h"

/* Runs the registered tests on every rank, finalizes MPI and returns the worst rank's status:
 * a failure on any rank fails the test. */
static inline int mpi_test_main(void)
{
    int rc = test_main(), worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return worst;
}

#endif
