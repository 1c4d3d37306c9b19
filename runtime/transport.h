/* Moving activations forward and gradients backward between neighbouring stages: a table of
 * non-blocking point-to-point operations on backend buffers. Three implementations:
 *   mpi         MPI_Isend / MPI_Irecv on host buffers (the CPU backend);
 *   mpi-staged  the same through host copies of device buffers (a CUDA backend whose GPU is
 *               shared with another rank, which NCCL refuses; or MPI asked for);
 *   nccl        ncclSend / ncclRecv between GPUs, one communicator and one stream per link
 *               and direction, ordered after the compute stream by events.
 * transport_choose picks one; control traffic (start-up status, the loss, metrics, traces)
 * stays on MPI: that is bootstrap, not data.
 *
 * A transfer is posted with isend/irecv, which return a request handle, and completes in wait;
 * the buffer belongs to the transport in between. Only neighbours talk (peer = rank +- 1), and
 * messages between one pair of stages in one direction are matched in the order they were
 * posted (NCCL has no tags; MPI's tag, the micro-batch, agrees with that order because the
 * executor posts in micro-batch order). */
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
    /* wait has no time limit: a peer that stopped or died is the heartbeat's to find
     * (heartbeat.h), which ends the job. */
};

/* MPI over `comm` (an MPI_Comm passed as a pointer so this header needs no mpi.h); at most
 * `max_requests` transfers in flight. */
int transport_mpi_init(struct transport *t, const void *comm, int max_requests, struct err *e);

struct backend;

/* MPI through host memory for a backend whose buffers the host cannot address: a send
 * downloads the buffer into a host staging buffer (after the backend's queued work) and sends
 * that; a receive lands in one and is uploaded in wait. Staging buffers come from a pool that
 * grows to the transfers in flight, each at most max_bytes. */
int transport_staged_init(struct transport *t, const void *comm, int max_requests,
                          struct backend *be, int64_t max_bytes, struct err *e);

/* NCCL between GPUs, one rank per GPU (runtime/cuda/transport_nccl.cu). Link l joins ranks l
 * and l+1 with two 2-rank communicators, activations (l sends) and gradients (l+1 sends):
 * ids[2l] and ids[2l+1], made by rank 0 with transport_nccl_unique_id and broadcast with MPI.
 * Each communicator carries messages one way in posting order on a stream of its own, so an
 * early receive never holds a send up; a transfer waits for the backend's queued work by an
 * event. Start-up sends one byte over every communicator (NCCL connects lazily) and reports
 * how far the device's free memory fell in `device_bytes` (NCCL's buffers). wait() polls,
 * and fails instead of hanging when NCCL reports an asynchronous error. In a build without
 * CUDA both fail with ERR_INPUT. */
#define TRANSPORT_NCCL_ID_BYTES 128
int transport_nccl_unique_id(unsigned char id[TRANSPORT_NCCL_ID_BYTES], struct err *e);
int transport_nccl_init(struct transport *t, int rank, int size,
                        const unsigned char (*ids)[TRANSPORT_NCCL_ID_BYTES], struct backend *be,
                        int max_requests, int64_t *device_bytes, struct err *e);

/* The data-parallel gradient all-reduce over NCCL (runtime/cuda/allreduce_nccl.cu), for a
 * stage whose dp replicas each have a GPU of their own: one communicator across them (ranks
 * are replicas) from `id` (replica 0's transport_nccl_unique_id, broadcast with MPI), on the
 * backend's stream. NCCL's ring adds in its own order, not the replicas': the result is the
 * MPI path's (train_dp.h) within float rounding (1e-4 relative), not bitwise. In a build
 * without CUDA init fails with ERR_INPUT. */
struct allreduce_nccl;
int allreduce_nccl_init(struct allreduce_nccl **out,
                        const unsigned char id[TRANSPORT_NCCL_ID_BYTES], int replica, int dp,
                        struct backend *be, struct err *e);
/* n device floats at buf summed over the replicas in place, then times scale; returns once
 * done (ERR_FAIL on a NCCL error). */
int allreduce_nccl_sum(struct allreduce_nccl *a, float *buf, int64_t n, float scale,
                       struct err *e);
void allreduce_nccl_free(struct allreduce_nccl *a);

/* ---- choosing ---- */

#define TRANSPORT_ID_MAX 64

enum transport_kind { TRANSPORT_MPI, TRANSPORT_MPI_STAGED, TRANSPORT_NCCL };

const char *transport_kind_name(enum transport_kind k);

/* The transport for a run of n ranks, gpu_ids[r] the UUID of rank r's GPU ("" for a rank on
 * the CPU): NCCL when every rank computes on a GPU of its own; otherwise MPI, host-staged on
 * the ranks with a GPU. `why` (cap bytes) says which: the two ranks that share a GPU, or the
 * first rank on the CPU. `prefer` "auto", "mpi" or "nccl": "nccl" where NCCL cannot run is
 * refused (ERR_INPUT, the reason in `why`). `kind` is this rank's (`self`). */
int transport_choose(const char (*gpu_ids)[TRANSPORT_ID_MAX], int n, int self,
                     const char *prefer, enum transport_kind *kind, char *why, int cap);

#endif
