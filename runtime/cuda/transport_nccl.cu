// The NCCL transport (see transport.h): per link and direction a 2-rank communicator and a
// stream, ncclSend / ncclRecv ordered after the compute stream by events, completion by an
// event per request. NCCL's own examples are the model: ids from rank 0 (broadcast by the
// caller with MPI), ncclCommInitRank, teardown in a fixed order.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl.cuh"

extern "C" {
#include "backend.h"
#include "backoff.h"
#include "progress.h"
#include "cuda_device.h"
#include "transport.h"
}

static_assert(sizeof(ncclUniqueId) == TRANSPORT_NCCL_ID_BYTES, "NCCL's unique id size");

// The four one-way channels of a stage: what it receives from the previous stage
// (activations), sends back to it (gradients), sends to the next (activations) and receives
// from it (gradients).
enum { CH_ACT_IN, CH_GRAD_OUT, CH_ACT_OUT, CH_GRAD_IN, CH_COUNT };

struct channel {
    ncclComm_t comm; // nullptr: this stage has no such neighbour
    cudaStream_t stream;
    int peer; // the neighbour's rank in the 2-rank communicator
};

struct nccl_transport {
    channel ch[CH_COUNT];
    cudaStream_t compute;
    int n;
    cudaEvent_t *done;  // per request slot: the transfer's completion on its channel
    cudaEvent_t *ready; // per request slot: the compute stream's point it follows
    int *used, *chan;
    int failed; // an error was seen: tear down with ncclCommAbort
};

static int take_slot(nccl_transport *x, int *req, struct err *e)
{
    for (int i = 0; i < x->n; i++)
        if (!x->used[i]) {
            *req = i;
            return ERR_OK;
        }
    return err_set(e, ERR_FAIL, "internal: more than %d NCCL transfers in flight", x->n);
}

static int channel_for(const struct transport *t, int peer, bool send, int *c, struct err *e)
{
    if (peer == t->rank - 1)
        *c = send ? CH_GRAD_OUT : CH_ACT_IN;
    else if (peer == t->rank + 1)
        *c = send ? CH_ACT_OUT : CH_GRAD_IN;
    else
        return err_set(e, ERR_FAIL, "internal: rank %d asked NCCL to reach rank %d, not a neighbour",
                       t->rank, peer);
    return ERR_OK;
}

static int post(struct transport *t, void *buf, int64_t bytes, int peer, bool send, int *req,
                struct err *e)
{
    nccl_transport *x = (nccl_transport *)t->impl;
    int c = 0;
    if (channel_for(t, peer, send, &c, e) || take_slot(x, req, e))
        return e->code;
    channel *ch = &x->ch[c];
    if (ch->comm == nullptr)
        return err_set(e, ERR_FAIL, "internal: rank %d has no NCCL channel to rank %d", t->rank,
                       peer);
    // the buffer is written (send) or may still be read (receive) by queued compute
    CUDA_CHECK(cudaEventRecord(x->ready[*req], x->compute), e);
    CUDA_CHECK(cudaStreamWaitEvent(ch->stream, x->ready[*req], 0), e);
    if (send)
        NCCL_CHECK(ncclSend(buf, (size_t)bytes, ncclUint8, ch->peer, ch->comm, ch->stream), e);
    else
        NCCL_CHECK(ncclRecv(buf, (size_t)bytes, ncclUint8, ch->peer, ch->comm, ch->stream), e);
    CUDA_CHECK(cudaEventRecord(x->done[*req], ch->stream), e);
    x->used[*req] = 1;
    x->chan[*req] = c;
    return ERR_OK;
}

static int nccl_isend(struct transport *t, const void *buf, int64_t bytes, int peer, int tag,
                      int *req, struct err *e)
{
    int rc = post(t, (void *)buf, bytes, peer, true, req, e);
    if (rc)
        ((nccl_transport *)t->impl)->failed = 1;
    return rc;
}

static int nccl_irecv(struct transport *t, void *buf, int64_t bytes, int peer, int tag, int *req,
                      struct err *e)
{
    int rc = post(t, buf, bytes, peer, false, req, e);
    if (rc)
        ((nccl_transport *)t->impl)->failed = 1;
    return rc;
}

static int poll_event(cudaEvent_t ev, ncclComm_t comm, double start, struct err *e)
{
    for (long polls = 0;; polls++) {
        cudaError_t rc = cudaEventQuery(ev);
        if (rc == cudaSuccess)
            return ERR_OK;
        if (rc != cudaErrorNotReady)
            CUDA_CHECK(rc, e);
        if (polls % 64 == 63) {
            ncclResult_t async = ncclSuccess;
            NCCL_CHECK(ncclCommGetAsyncError(comm, &async), e);
            NCCL_CHECK(async, e);
        }
        backoff_pause(clock_now_s() - start);
    }
}

int nccl_wait_event(cudaEvent_t ev, ncclComm_t comm, struct err *e)
{
    double start = clock_now_s();
    progress_waiting(1);
    int rc = poll_event(ev, comm, start, e);
    progress_waiting(0);
    return rc;
}

// Polls the completion event; between polls, asks NCCL for asynchronous errors (a peer that
// died), so that a broken pipeline fails instead of waiting for ever.
static int poll_done(const struct transport *t, cudaEvent_t ev, int c, struct err *e)
{
    nccl_transport *x = (nccl_transport *)t->impl;
    return nccl_wait_event(ev, x->ch[c].comm, e);
}

static int nccl_wait(struct transport *t, int req, struct err *e)
{
    nccl_transport *x = (nccl_transport *)t->impl;
    if (req < 0 || req >= x->n || !x->used[req])
        return err_set(e, ERR_FAIL, "internal: wait on NCCL request %d, which is not in flight",
                       req);
    int rc = poll_done(t, x->done[req], x->chan[req], e);
    x->used[req] = 0;
    if (rc)
        x->failed = 1;
    return rc;
}

// Fixed order: streams drained (unless something failed), communicators in link order (the
// order they were made in), then events and streams.
static void nccl_free(struct transport *t)
{
    nccl_transport *x = (nccl_transport *)t->impl;
    if (x == nullptr)
        return;
    for (int c = 0; c < CH_COUNT; c++) {
        channel *ch = &x->ch[c];
        if (ch->comm != nullptr) {
            if (x->failed) {
                ncclCommAbort(ch->comm);
            } else {
                cudaStreamSynchronize(ch->stream);
                ncclCommFinalize(ch->comm);
                ncclCommDestroy(ch->comm);
            }
        }
        if (ch->stream != nullptr)
            cudaStreamDestroy(ch->stream);
    }
    for (int i = 0; i < x->n; i++) {
        if (x->done != nullptr && x->done[i] != nullptr)
            cudaEventDestroy(x->done[i]);
        if (x->ready != nullptr && x->ready[i] != nullptr)
            cudaEventDestroy(x->ready[i]);
    }
    free(x->done);
    free(x->ready);
    free(x->used);
    free(x->chan);
    free(x);
    t->impl = nullptr;
}

static const struct transport_ops nccl_ops = {"nccl", nccl_isend, nccl_irecv, nccl_wait,
                                              nccl_free};

extern "C" int transport_nccl_unique_id(unsigned char id[TRANSPORT_NCCL_ID_BYTES],
                                        struct err *e)
{
    ncclUniqueId u;
    NCCL_CHECK(ncclGetUniqueId(&u), e);
    memcpy(id, &u, sizeof u);
    return ERR_OK;
}

static int open_channel(channel *ch, const unsigned char *id, int my_rank_in_comm, struct err *e)
{
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    CUDA_CHECK(cudaStreamCreateWithFlags(&ch->stream, cudaStreamNonBlocking), e);
    NCCL_CHECK(ncclCommInitRank(&ch->comm, 2, u, my_rank_in_comm), e);
    ch->peer = 1 - my_rank_in_comm;
    return ERR_OK;
}

// One byte over each channel, in link order (link rank-1 before link rank, as every rank
// does), so that NCCL's lazy connections and their buffers exist before the first step.
static int connect_all(struct transport *t, void *scratch, struct err *e)
{
    nccl_transport *x = (nccl_transport *)t->impl;
    const int order[CH_COUNT] = {CH_ACT_IN, CH_GRAD_OUT, CH_ACT_OUT, CH_GRAD_IN};
    for (int i = 0; i < CH_COUNT; i++) {
        channel *ch = &x->ch[order[i]];
        if (ch->comm == nullptr)
            continue;
        bool send = order[i] == CH_GRAD_OUT || order[i] == CH_ACT_OUT;
        if (send)
            NCCL_CHECK(ncclSend(scratch, 1, ncclUint8, ch->peer, ch->comm, ch->stream), e);
        else
            NCCL_CHECK(ncclRecv(scratch, 1, ncclUint8, ch->peer, ch->comm, ch->stream), e);
        CUDA_CHECK(cudaStreamSynchronize(ch->stream), e);
    }
    return ERR_OK;
}

static int nccl_transport_open(struct transport *t, int rank, int size,
                               const unsigned char (*ids)[TRANSPORT_NCCL_ID_BYTES],
                               struct backend *be, int max_requests, int64_t *device_bytes,
                               struct err *e)
{
    nccl_transport *x = (nccl_transport *)t->impl;
    x->compute = (cudaStream_t)backend_cuda_stream(be);
    x->n = max_requests;
    x->done = (cudaEvent_t *)calloc((size_t)max_requests, sizeof *x->done);
    x->ready = (cudaEvent_t *)calloc((size_t)max_requests, sizeof *x->ready);
    x->used = (int *)calloc((size_t)max_requests, sizeof *x->used);
    x->chan = (int *)calloc((size_t)max_requests, sizeof *x->chan);
    if (x->done == nullptr || x->ready == nullptr || x->used == nullptr || x->chan == nullptr)
        return err_set(e, ERR_FAIL, "out of memory for the NCCL transport");
    size_t f0 = 0, f1 = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&f0, &total), e);
    for (int i = 0; i < max_requests; i++) {
        CUDA_CHECK(cudaEventCreateWithFlags(&x->done[i], cudaEventDisableTiming), e);
        CUDA_CHECK(cudaEventCreateWithFlags(&x->ready[i], cudaEventDisableTiming), e);
    }
    // link rank-1 (this rank is rank 1 of its communicators), then link rank (rank 0)
    if (rank > 0) {
        if (open_channel(&x->ch[CH_ACT_IN], ids[2 * (rank - 1)], 1, e) ||
            open_channel(&x->ch[CH_GRAD_OUT], ids[2 * (rank - 1) + 1], 1, e))
            return e->code;
    }
    if (rank + 1 < size) {
        if (open_channel(&x->ch[CH_ACT_OUT], ids[2 * rank], 0, e) ||
            open_channel(&x->ch[CH_GRAD_IN], ids[2 * rank + 1], 0, e))
            return e->code;
    }
    void *scratch = nullptr;
    CUDA_CHECK(cudaMalloc(&scratch, 256), e);
    int rc = connect_all(t, scratch, e);
    cudaFree(scratch);
    if (rc)
        return rc;
    CUDA_CHECK(cudaMemGetInfo(&f1, &total), e);
    *device_bytes = (int64_t)f0 - (int64_t)f1;
    return ERR_OK;
}

extern "C" int transport_nccl_init(struct transport *t, int rank, int size,
                                   const unsigned char (*ids)[TRANSPORT_NCCL_ID_BYTES],
                                   struct backend *be, int max_requests, int64_t *device_bytes,
                                   struct err *e)
{
    memset(t, 0, sizeof *t);
    *device_bytes = 0;
    if (!backend_is_cuda(be))
        return err_set(e, ERR_INPUT, "nccl: rank %d does not compute on a GPU", rank);
    nccl_transport *x = (nccl_transport *)calloc(1, sizeof *x);
    if (x == nullptr)
        return err_set(e, ERR_FAIL, "out of memory for the NCCL transport");
    t->ops = &nccl_ops;
    t->impl = x;
    t->rank = rank;
    t->size = size;
    if (nccl_transport_open(t, rank, size, ids, be, max_requests, device_bytes, e)) {
        x->failed = 1;
        nccl_free(t);
        t->ops = nullptr;
        return e->code;
    }
    return ERR_OK;
}
