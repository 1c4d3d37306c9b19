/* The MPI transport: MPI_Isend / MPI_Irecv on host buffers. */
#include <stdlib.h>

#include "mpicheck.h"
#include "transport.h"

struct mpi_transport {
    MPI_Comm comm;
    int n;
    MPI_Request *reqs; /* MPI_REQUEST_NULL when free */
};

static int take_request_slot(struct mpi_transport *m, int *req, struct err *e)
{
    for (int i = 0; i < m->n; i++)
        if (m->reqs[i] == MPI_REQUEST_NULL) {
            *req = i;
            return ERR_OK;
        }
    return err_set(e, ERR_FAIL, "internal: more than %d transfers in flight", m->n);
}

static int count_of(int64_t bytes, struct err *e)
{
    if (bytes < 0 || bytes > 0x7fffffff)
        return err_set(e, ERR_FAIL, "a transfer of %lld bytes is beyond one MPI message",
                       (long long)bytes);
    return ERR_OK;
}

static int mpi_isend(struct transport *t, const void *buf, int64_t bytes, int peer, int tag,
                     int *req, struct err *e)
{
    struct mpi_transport *m = t->impl;
    if (count_of(bytes, e) || take_request_slot(m, req, e))
        return e->code;
    MPI_CHECK(MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, m->comm, &m->reqs[*req]), e);
    return ERR_OK;
}

static int mpi_irecv(struct transport *t, void *buf, int64_t bytes, int peer, int tag, int *req,
                     struct err *e)
{
    struct mpi_transport *m = t->impl;
    if (count_of(bytes, e) || take_request_slot(m, req, e))
        return e->code;
    MPI_CHECK(MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, m->comm, &m->reqs[*req]), e);
    return ERR_OK;
}

/* Ranks often share cores (2 cores, 3 ranks here): mpicheck_wait sleeps between polls. */
static int mpi_wait(struct transport *t, int req, struct err *e)
{
    struct mpi_transport *m = t->impl;
    return mpicheck_wait(&m->reqs[req], "MPI_Test of a transfer between stages", e);
}

static void mpi_free(struct transport *t)
{
    struct mpi_transport *m = t->impl;
    if (m != NULL) {
        for (int i = 0; i < m->n; i++)
            if (m->reqs[i] != MPI_REQUEST_NULL) {
                MPI_RELEASE(MPI_Cancel(&m->reqs[i]));
                MPI_RELEASE(MPI_Request_free(&m->reqs[i]));
            }
        free(m->reqs);
        free(m);
    }
    t->impl = NULL;
}

static const struct transport_ops mpi_ops = {
    .name = "mpi",
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .wait = mpi_wait,
    .free = mpi_free,
};

int transport_mpi_init(struct transport *t, const void *comm, int max_requests, struct err *e)
{
    struct mpi_transport *m = calloc(1, sizeof *m);
    if (m != NULL)
        m->reqs = malloc(sizeof *m->reqs * (size_t)max_requests);
    if (m == NULL || m->reqs == NULL) {
        if (m != NULL)
            free(m->reqs);
        free(m);
        return err_set(e, ERR_FAIL, "out of memory for the MPI transport");
    }
    m->comm = *(const MPI_Comm *)comm;
    m->n = max_requests;
    for (int i = 0; i < max_requests; i++)
        m->reqs[i] = MPI_REQUEST_NULL;
    t->ops = &mpi_ops;
    t->impl = m;
    MPI_CHECK(MPI_Comm_rank(m->comm, &t->rank), e);
    MPI_CHECK(MPI_Comm_size(m->comm, &t->size), e);
    return ERR_OK;
}
