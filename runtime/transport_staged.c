/* MPI through host staging buffers, for a backend whose memory the host cannot address (a GPU
 * sharing its device with another rank). Ordering: a send downloads after the backend's queued
 * work (the backend's download waits for it); a receive is uploaded in wait, before the
 * executor queues anything that reads it. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "transport.h"

struct staged {
    struct transport inner; /* plain MPI on the host buffers */
    struct backend *be;
    int64_t max_bytes;
    int n;          /* request slots, as the inner transport's */
    void **host;    /* per request: its staging buffer, NULL when free */
    void **dst;     /* per request: the device buffer a receive lands in, NULL for a send */
    int64_t *bytes; /* per request */
    void **pool;    /* free staging buffers */
    int n_pool, n_alloc;
};

static void *take(struct staged *s, struct err *e)
{
    if (s->n_pool > 0)
        return s->pool[--s->n_pool];
    void *p = malloc((size_t)s->max_bytes);
    if (p == NULL)
        err_set(e, ERR_FAIL, "out of host memory for a %lld-byte staging buffer",
                (long long)s->max_bytes);
    else
        s->n_alloc++;
    return p;
}

static void give(struct staged *s, void *p)
{
    s->pool[s->n_pool++] = p; /* the pool holds every buffer ever allocated at most */
}

static int check_size(const struct staged *s, int64_t bytes, struct err *e)
{
    if (bytes < 0 || bytes > s->max_bytes)
        return err_set(e, ERR_FAIL, "internal: a %lld-byte transfer, staging buffers hold %lld",
                       (long long)bytes, (long long)s->max_bytes);
    return ERR_OK;
}

static int staged_isend(struct transport *t, const void *buf, int64_t bytes, int peer, int tag,
                        int *req, struct err *e)
{
    struct staged *s = t->impl;
    if (check_size(s, bytes, e))
        return e->code;
    void *h = take(s, e);
    if (h == NULL)
        return e->code;
    if (s->be->ops->download(s->be, h, buf, bytes, e) ||
        s->inner.ops->isend(&s->inner, h, bytes, peer, tag, req, e)) {
        give(s, h);
        return e->code;
    }
    s->host[*req] = h;
    s->dst[*req] = NULL;
    s->bytes[*req] = bytes;
    return ERR_OK;
}

static int staged_irecv(struct transport *t, void *buf, int64_t bytes, int peer, int tag,
                        int *req, struct err *e)
{
    struct staged *s = t->impl;
    if (check_size(s, bytes, e))
        return e->code;
    void *h = take(s, e);
    if (h == NULL)
        return e->code;
    if (s->inner.ops->irecv(&s->inner, h, bytes, peer, tag, req, e)) {
        give(s, h);
        return e->code;
    }
    s->host[*req] = h;
    s->dst[*req] = buf;
    s->bytes[*req] = bytes;
    return ERR_OK;
}

static int staged_wait(struct transport *t, int req, struct err *e)
{
    struct staged *s = t->impl;
    if (req < 0 || req >= s->n || s->host[req] == NULL)
        return err_set(e, ERR_FAIL, "internal: wait on staged request %d, which is not in flight",
                       req);
    int rc = s->inner.ops->wait(&s->inner, req, e);
    if (rc == ERR_OK && s->dst[req] != NULL)
        rc = s->be->ops->upload(s->be, s->dst[req], s->host[req], s->bytes[req], e);
    give(s, s->host[req]);
    s->host[req] = NULL;
    return rc;
}

static void staged_free(struct transport *t)
{
    struct staged *s = t->impl;
    if (s != NULL) {
        if (s->inner.ops != NULL)
            s->inner.ops->free(&s->inner); /* cancels what is in flight first */
        for (int i = 0; i < s->n; i++)
            if (s->host[i] != NULL)
                give(s, s->host[i]);
        for (int i = 0; i < s->n_pool; i++)
            free(s->pool[i]);
        free(s->host);
        free(s->dst);
        free(s->bytes);
        free(s->pool);
        free(s);
    }
    t->impl = NULL;
}

static const struct transport_ops staged_ops = {
    .name = "mpi (host-staged)",
    .isend = staged_isend,
    .irecv = staged_irecv,
    .wait = staged_wait,
    .free = staged_free,
};

int transport_staged_init(struct transport *t, const void *comm, int max_requests,
                          struct backend *be, int64_t max_bytes, struct err *e)
{
    memset(t, 0, sizeof *t);
    struct staged *s = calloc(1, sizeof *s);
    if (s == NULL)
        return err_set(e, ERR_FAIL, "out of memory for the staged transport");
    t->impl = s;
    t->ops = &staged_ops;
    s->be = be;
    s->max_bytes = max_bytes;
    s->n = max_requests;
    s->host = calloc((size_t)max_requests, sizeof *s->host);
    s->dst = calloc((size_t)max_requests, sizeof *s->dst);
    s->bytes = calloc((size_t)max_requests, sizeof *s->bytes);
    s->pool = calloc((size_t)max_requests, sizeof *s->pool);
    if (s->host == NULL || s->dst == NULL || s->bytes == NULL || s->pool == NULL) {
        staged_free(t);
        return err_set(e, ERR_FAIL, "out of memory for the staged transport");
    }
    if (transport_mpi_init(&s->inner, comm, max_requests, e)) {
        staged_free(t);
        return e->code;
    }
    t->rank = s->inner.rank;
    t->size = s->inner.size;
    return ERR_OK;
}
