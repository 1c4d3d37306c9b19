/* --init and --save-weights (train_weights.h). */
#include "train_weights.h"

#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "mpicheck.h"
#include "safetensors.h"

#define WEIGHTS_CHUNK (1 << 30) /* bytes per message: MPI counts are ints */

int train_weights_load(struct stage_runner *st, const char *pattern, int stage, struct err *e)
{
    char file[FILEIO_PATH_MAX];
    st_stage_path(pattern, stage, file, sizeof file);
    return st_stage_load(st, file, e);
}

/* One stage's tensors: descriptions and bytes (st_stage_collect). */
struct stage_weights {
    struct st_tensor *t;
    int n;
    char *blob;
    long long bytes;
};

static void weights_free(struct stage_weights *w)
{
    free(w->t);
    free(w->blob);
    memset(w, 0, sizeof *w);
}

/* This rank's own file of the stage's tensors. */
static int write_own(const struct stage_weights *w, const char *file, struct err *e)
{
    char **blobs = malloc(sizeof *blobs * (size_t)(w->n + 1));
    if (blobs == NULL)
        return err_set(e, ERR_FAIL, "out of memory writing the weights");
    for (int i = 0; i < w->n; i++)
        blobs[i] = w->blob;
    int rc = st_write(file, w->t, w->n, blobs, e);
    free(blobs);
    return rc;
}

/* Sends (rank > 0) or receives `bytes` at p in chunks, every wait sleeping. */
static int move_bytes(char *p, long long bytes, int peer, int send, MPI_Comm comm,
                      struct err *e)
{
    for (long long at = 0; at < bytes; at += WEIGHTS_CHUNK) {
        int n = (int)(bytes - at < WEIGHTS_CHUNK ? bytes - at : WEIGHTS_CHUNK);
        MPI_Request q;
        if (send)
            ERR_TRY(mpicheck_collective(MPI_Isend(p + at, n, MPI_BYTE, peer, 0, comm, &q), &q,
                                        "MPI_Isend of weights", e));
        else
            ERR_TRY(mpicheck_collective(MPI_Irecv(p + at, n, MPI_BYTE, peer, 0, comm, &q), &q,
                                        "MPI_Irecv of weights", e));
    }
    return ERR_OK;
}

/* Whether every rank of `comm` has succeeded so far, this rank's status *rc agreed with
 * theirs (a failure of MPI itself becomes this rank's). */
static int all_ok(MPI_Comm comm, int rank, int size, int *rc, struct err *e)
{
    int verdict[2] = {*rc, *rc != ERR_OK ? rank : size};
    struct err in;
    err_clear(&in);
    if (mpicheck_agree(comm, size, verdict, &in) != ERR_OK) {
        if (*rc == ERR_OK)
            *rc = err_set(e, in.code, "%s", in.msg);
        return 0;
    }
    return verdict[0] == ERR_OK;
}

/* Rank 0's room for every rank's tensors: counts[s] and bytes[s] of rank s's. */
struct gathered {
    int *counts;
    long long *bytes;
    struct st_tensor *t;
    char **blobs, *all;
    int total;
};

static void gathered_free(struct gathered *g)
{
    free(g->counts);
    free(g->bytes);
    free(g->t);
    free(g->blobs);
    free(g->all);
}

static int gathered_alloc(struct gathered *g, int size, struct err *e)
{
    long long sum = 0;
    g->total = 0;
    for (int s = 0; s < size; s++) {
        g->total += g->counts[s];
        sum += g->bytes[s];
    }
    g->t = malloc(sizeof *g->t * (size_t)(g->total + 1));
    g->blobs = malloc(sizeof *g->blobs * (size_t)(g->total + 1));
    g->all = malloc((size_t)sum + 1);
    if (g->t == NULL || g->blobs == NULL || g->all == NULL)
        return err_set(e, ERR_FAIL, "out of memory gathering the weights (%lld bytes)", sum);
    return ERR_OK;
}

/* Rank 0 receives every other rank's tensors into g, beside its own. */
static int receive_all(struct gathered *g, const struct stage_weights *w, MPI_Comm comm,
                       int size, struct err *e)
{
    long long at = 0;
    for (int s = 0, k = 0; s < size; k += g->counts[s], at += g->bytes[s], s++) {
        struct st_tensor *t = g->t + k;
        char *blob = g->all + at;
        if (s == 0) {
            memcpy(t, w->t, sizeof *t * (size_t)w->n);
            memcpy(blob, w->blob, (size_t)w->bytes);
        } else {
            ERR_TRY(move_bytes((char *)t, (long long)sizeof *t * g->counts[s], s, 0, comm, e));
            ERR_TRY(move_bytes(blob, g->bytes[s], s, 0, comm, e));
        }
        for (int i = 0; i < g->counts[s]; i++)
            g->blobs[k + i] = blob;
    }
    return ERR_OK;
}

/* Every rank's tensors to rank 0, which writes one file: the sizes first, then rank 0's
 * memory for them agreed, then the bytes. */
static int gather_write(const struct stage_weights *w, MPI_Comm comm, int rank, int size,
                        const char *file, struct err *e)
{
    struct gathered g = {0};
    MPI_Request q;
    int rc = ERR_OK;
    if (rank == 0) {
        g.counts = calloc((size_t)size, sizeof *g.counts);
        g.bytes = calloc((size_t)size, sizeof *g.bytes);
        if (g.counts == NULL || g.bytes == NULL)
            rc = err_set(e, ERR_FAIL, "out of memory gathering the weights");
    }
    if (all_ok(comm, rank, size, &rc, e) &&
        (mpicheck_collective(MPI_Igather(&w->n, 1, MPI_INT, g.counts, 1, MPI_INT, 0, comm, &q),
                             &q, "the weights' counts (MPI_Igather)", e) ||
         mpicheck_collective(MPI_Igather(&w->bytes, 1, MPI_LONG_LONG, g.bytes, 1, MPI_LONG_LONG,
                                         0, comm, &q),
                             &q, "the weights' sizes (MPI_Igather)", e)))
        rc = e->code;
    if (rc == ERR_OK && rank == 0)
        rc = gathered_alloc(&g, size, e);
    if (all_ok(comm, rank, size, &rc, e)) {
        if (rank > 0 && (move_bytes((char *)w->t, (long long)sizeof *w->t * w->n, 0, 1, comm, e) ||
                         move_bytes(w->blob, w->bytes, 0, 1, comm, e)))
            rc = e->code;
        if (rank == 0 && receive_all(&g, w, comm, size, e) == ERR_OK)
            rc = st_write(file, g.t, g.total, g.blobs, e);
        else if (rank == 0)
            rc = e->code;
    }
    gathered_free(&g);
    return rc;
}

int train_weights_save(struct stage_runner *st, MPI_Comm comm, const char *pattern,
                       struct err *e)
{
    int rank, size;
    MPI_CHECK(MPI_Comm_rank(comm, &rank), e);
    MPI_CHECK(MPI_Comm_size(comm, &size), e);
    struct stage_weights w = {0};
    int rc = st_stage_collect(st, &w.t, &w.n, &w.blob, e);
    for (int i = 0; rc == ERR_OK && i < w.n; i++)
        w.bytes += w.t[i].bytes;
    int ok = all_ok(comm, rank, size, &rc, e);
    if (ok && strstr(pattern, ST_STAGE_MARK) != NULL) {
        char file[FILEIO_PATH_MAX];
        st_stage_path(pattern, rank, file, sizeof file);
        rc = write_own(&w, file, e);
    } else if (ok) {
        rc = gather_write(&w, comm, rank, size, pattern, e);
    }
    weights_free(&w);
    return rc;
}
