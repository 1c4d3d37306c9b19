/* Moving activations forward and gradients backward between neighbouring stages: a table of
 * non-blocking point-to-point operations on backend buffers. MPI (host memory; host-staged
 * for a GPU backend) is the one here; NCCL plugs in behind the same table. Control traffic
 * (start-up status, the loss, metrics, traces) stays on MPI: that is bootstrap, not data.
 *
 * A transfer is posted with isend/irecv, which return a request handle, and completes in wait;
 * the buffer belongs to the transport in between. Messages between one pair of stages with
 * one tag arrive in the order they were posted. */
#ifndef BALLAST_TRANSPORT_H
#define BALLAST_TRANSPORT_H

#include <stdint.h>

#include "err.h"

struct transport;

struct transport_ops {
    const char *name;
    int (*isend)(struct transport *t, const void *buf, int64_t bytes, int peer, int tag,
                 int *req, struct err *e);
    int (*irecv)(struct transport *t, void *buf, int64_t bytes, int peer, int tag, int *req,
                 struct err *e);
    int (*wait)(struct transport *t, int req, struct err *e);
    void (*free)(struct transport *t);
};

struct transport {
    const struct transport_ops *ops;
    int rank, size;
    void *impl;
};

/* MPI over `comm` (an MPI_Comm passed as a pointer so this header needs no mpi.h); at most
 * `max_requests` transfers in flight. */
int transport_mpi_init(struct transport *t, const void *comm, int max_requests, struct err *e);

#endif
