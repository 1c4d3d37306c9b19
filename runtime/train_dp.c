#include "train_dp.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "mpicheck.h"

#define DP_CHUNK (1 << 26) /* floats per MPI_Iallgather: MPI counts are ints */

int train_dp_split(struct train_dp *d, MPI_Comm world, int n_stages, int dp, struct err *e)
{
    int w;
    d->dp = dp;
    d->pipeline = d->grads = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_rank(world, &w), e);
    d->replica = w / n_stages;
    d->stage = w % n_stages;
    ERR_TRY(mpicheck_gate(world, "every rank before splitting the replicas (MPI_Ibarrier)", e));
    MPI_CHECK(MPI_Comm_split(world, d->replica, d->stage, &d->pipeline), e);
    MPI_CHECK(MPI_Comm_set_errhandler(d->pipeline, MPI_ERRORS_RETURN), e);
    MPI_CHECK(MPI_Comm_split(world, d->stage, d->replica, &d->grads), e);
    MPI_CHECK(MPI_Comm_set_errhandler(d->grads, MPI_ERRORS_RETURN), e);
    return ERR_OK;
}

void train_dp_free(struct train_dp *d)
{
    if (d->pipeline != MPI_COMM_NULL)
        MPI_RELEASE(MPI_Comm_free(&d->pipeline));
    if (d->grads != MPI_COMM_NULL)
        MPI_RELEASE(MPI_Comm_free(&d->grads));
    free(d->mine);
    free(d->all);
    d->mine = d->all = NULL;
    free(d->lo);
    free(d->len);
    free(d->weights);
    free(d->counts);
    free(d->displs);
    free(d->rcounts);
    free(d->rdispls);
    free(d->packed);
    free(d->state);
    for (int k = 0; d->buckets != NULL && k < d->n_buckets; k++)
        if (d->buckets[k].req != MPI_REQUEST_NULL) {
            MPI_RELEASE(MPI_Cancel(&d->buckets[k].req));
            MPI_RELEASE(MPI_Request_free(&d->buckets[k].req));
        }
    free(d->buckets);
    d->buckets = NULL;
    d->lo = d->len = d->weights = NULL;
    d->counts = d->displs = d->rcounts = d->rdispls = NULL;
    d->packed = d->state = NULL;
    allreduce_nccl_free(d->nccl); /* before the backend's stream goes: train.c frees us first */
    d->nccl = NULL;
}

int train_dp_setup(struct train_dp *d, struct backend *be, const char *gpu_uuid,
                   const char *prefer, struct err *e)
{
    char(*ids)[TRANSPORT_ID_MAX] = calloc((size_t)d->dp, sizeof *ids), mine[TRANSPORT_ID_MAX];
    enum transport_kind kind = TRANSPORT_MPI;
    char why[256];
    if (ids == NULL)
        return err_set(e, ERR_FAIL, "out of memory choosing the gradients' transport");
    snprintf(mine, sizeof mine, "%s", gpu_uuid);
    MPI_Request q;
    int rc = mpicheck_collective(MPI_Iallgather(mine, TRANSPORT_ID_MAX, MPI_CHAR, ids,
                                                TRANSPORT_ID_MAX, MPI_CHAR, d->grads, &q),
                                 &q, "the replicas' GPUs (MPI_Iallgather)", e);
    /* --transport nccl names the pipeline's: the replicas take NCCL where they can */
    if (rc == ERR_OK)
        transport_choose((const char(*)[TRANSPORT_ID_MAX])ids, d->dp, d->replica,
                         strcmp(prefer, "mpi") == 0 ? "mpi" : "auto", &kind, why, sizeof why);
    free(ids);
    if (rc != ERR_OK || kind != TRANSPORT_NCCL || d->shard)
        return rc;
    /* replica 0 makes the id (NCCL's examples' bootstrap); its last byte says it could */
    unsigned char id[TRANSPORT_NCCL_ID_BYTES + 1] = {0};
    if (d->replica == 0)
        id[TRANSPORT_NCCL_ID_BYTES] = transport_nccl_unique_id(id, e) == ERR_OK;
    if (mpicheck_collective(MPI_Ibcast(id, (int)sizeof id, MPI_BYTE, 0, d->grads, &q), &q,
                            "the NCCL id of the gradients (MPI_Ibcast)", e))
        return e->code;
    if (!id[TRANSPORT_NCCL_ID_BYTES])
        return d->replica == 0 ? e->code
                               : err_set(e, ERR_FAIL, "replica 0 of stage %d could not make "
                                         "the NCCL id of the gradients", d->stage);
    return allreduce_nccl_init(&d->nccl, id, d->replica, d->dp, be, e);
}

const char *train_dp_reduce_kind(const struct train_dp *d)
{
    return d->nccl != NULL ? "nccl" : "mpi";
}

/* Copies the weights of the parameters in slice [lo, lo + n) floats of a section between the
 * weights section `w` and `p`, packed in order (to_packed: w to p; p NULL: counts only).
 * Returns the elements. */
static int64_t pack_slice(const struct stage_layout *lay, int64_t lo, int64_t n, char *w,
                          char *p, int to_packed)
{
    int64_t got = 0, elem = sizes_weight_elem_bytes(lay->dtype);
    for (int li = 0; li < lay->n_layers; li++)
        for (int k = 0; k < lay->layers[li].n_params; k++) {
            int64_t first, count = layout_tensor_slice(lay, li, k, 4 * lo, 4 * n, &first);
            if (p != NULL && count > 0) {
                char *at = w + lay->layers[li].weight_off[k] + elem * first;
                memcpy(to_packed ? p + elem * got : at, to_packed ? at : p + elem * got,
                       (size_t)(elem * count));
            }
            got += count;
        }
    return got;
}

/* ZeRO-1: every replica's slice (floats), and the buffers of the collectives over them. */
static int shard_init(struct train_dp *d, const struct stage_layout *lay, struct err *e)
{
    size_t n = (size_t)d->dp;
    if (lay->section_bytes / 4 > INT_MAX - DP_CHUNK)
        return err_set(e, ERR_INPUT, "stage %d: %lld parameters: sharding the optimizer over "
                       "replicas takes at most %d parameters a stage (MPI counts are ints)",
                       d->stage, (long long)(lay->section_bytes / 4), INT_MAX - DP_CHUNK);
    d->lo = malloc(sizeof *d->lo * n);
    d->len = malloc(sizeof *d->len * n);
    d->weights = malloc(sizeof *d->weights * n);
    d->counts = malloc(sizeof(int) * n);
    d->displs = malloc(sizeof(int) * n);
    d->rcounts = malloc(sizeof(int) * n);
    d->rdispls = malloc(sizeof(int) * n);
    d->packed = malloc((size_t)lay->section_bytes + 1);
    if (!d->lo || !d->len || !d->weights || !d->counts || !d->displs || !d->rcounts ||
        !d->rdispls || !d->packed)
        return err_set(e, ERR_FAIL, "out of memory sharding the optimizer");
    for (int q = 0; q < d->dp; q++) {
        layout_shard_range(lay, q, d->dp, &d->lo[q], &d->len[q]);
        d->lo[q] /= 4;
        d->len[q] /= 4;
        d->weights[q] = pack_slice(lay, d->lo[q], d->len[q], NULL, NULL, 1);
    }
    return ERR_OK;
}

/* Floats per MPI call over the slices: displacements up to dp of them are ints too. */
static int64_t shard_step(const struct train_dp *d)
{
    return DP_CHUNK / d->dp > 0 ? DP_CHUNK / d->dp : 1;
}

static int64_t clamp_chunk(int64_t left, int64_t step)
{
    return left <= 0 ? 0 : left < step ? left : step;
}

/* Every replica's n floats of `mine` gathered, chunk by chunk, and summed in replica order
 * into `out` (may be `mine`), times `scale`. */
static int gather_sum(struct train_dp *d, float *mine, float *out, int64_t n, float scale,
                      const char *what, struct err *e)
{
    for (int64_t at = 0; at < n; at += DP_CHUNK) {
        int count = (int)(n - at < DP_CHUNK ? n - at : DP_CHUNK);
        MPI_Request q;
        if (mpicheck_collective(MPI_Iallgather(mine + at, count, MPI_FLOAT, d->all, count,
                                               MPI_FLOAT, d->grads, &q),
                                &q, what, e))
            return e->code;
        for (int i = 0; i < count; i++) {
            float sum = d->all[i];
            for (int rr = 1; rr < d->dp; rr++)
                sum += d->all[(int64_t)rr * count + i];
            out[at + i] = sum * scale;
        }
    }
    return ERR_OK;
}

/* ZeRO-1: slice q of every replica's n floats of `mine` to replica q (MPI_Ialltoallv), which
 * sums the dp copies of its slice in replica order into its place in `mine`, times `scale`:
 * gather_sum's numbers, for this replica's slice only. */
static int reduce_scatter(struct train_dp *d, float *mine, float scale, struct err *e)
{
    int me = d->replica;
    int64_t step = shard_step(d), cap = d->len[0] < step ? d->len[0] : step;
    for (int64_t c = 0; c < d->len[0]; c += step) {
        int count = (int)clamp_chunk(d->len[me] - c, step);
        for (int q = 0; q < d->dp; q++) {
            d->counts[q] = (int)clamp_chunk(d->len[q] - c, step);
            d->displs[q] = (int)(d->lo[q] + c);
            d->rcounts[q] = count;
            d->rdispls[q] = (int)(q * cap);
        }
        MPI_Request q;
        if (mpicheck_collective(MPI_Ialltoallv(mine, d->counts, d->displs, MPI_FLOAT, d->all,
                                               d->rcounts, d->rdispls, MPI_FLOAT, d->grads, &q),
                                &q, "the replicas' gradient slices (MPI_Ialltoallv)", e))
            return e->code;
        for (int i = 0; i < count; i++) {
            float sum = d->all[i];
            for (int rr = 1; rr < d->dp; rr++)
                sum += d->all[(int64_t)rr * cap + i];
            mine[d->lo[me] + c + i] = sum * scale;
        }
    }
    return ERR_OK;
}

/* Whether the gradients go in buckets (train_dp.h): over MPI, not sharded. */
static int bucketed(const struct train_dp *d)
{
    return d->bucket_bytes > 0 && d->nccl == NULL && !d->shard;
}

/* The buckets of the stage's layers, last to first: a bucket closes once it holds
 * bucket_bytes (the simulator's rule, planner/sim/sim.c sim_buckets), and one MPI call's floats at
 * most (DP_CHUNK: a larger layer takes several). */
static int buckets_init(struct train_dp *d, const struct stage_layout *lay, struct err *e)
{
    d->buckets = calloc((size_t)lay->n_layers + (size_t)(lay->section_bytes / 4 / DP_CHUNK) + 1,
                        sizeof *d->buckets);
    if (d->buckets == NULL)
        return err_set(e, ERR_FAIL, "out of memory for the gradient buckets");
    struct train_dp_bucket *b = NULL;
    for (int li = lay->n_layers - 1; li >= 0; li--) {
        int64_t off, bytes, w_off, w_bytes;
        layout_layer_ranges(lay, li, &off, &bytes, &w_off, &w_bytes);
        for (int64_t at = off / 4, end = (off + bytes) / 4; at < end;) {
            if (b == NULL || 4 * b->n >= d->bucket_bytes || b->n == DP_CHUNK) {
                b = &d->buckets[d->n_buckets++];
                *b = (struct train_dp_bucket){.lo = at + (end - at), .req = MPI_REQUEST_NULL};
            }
            int64_t take = end - at < DP_CHUNK - b->n ? end - at : DP_CHUNK - b->n;
            end -= take; /* the layer's top floats first: the bucket grows downwards */
            b->lo -= take;
            b->n += take;
            b->layer = li;
        }
    }
    return ERR_OK;
}

/* The host copies of the gradients and the replicas' (all of them at once when bucketed). */
static int buffers_init(struct train_dp *d, const struct stage_runner *r, struct err *e)
{
    int64_t bytes = r->lay.section_bytes, n = bytes / (int64_t)sizeof(float);
    int64_t room = bucketed(d) ? n : (n < DP_CHUNK ? n : DP_CHUNK);
    d->n = n;
    d->mine = malloc((size_t)bytes + 1);
    d->all = malloc(sizeof *d->all * (size_t)d->dp * (size_t)room + 1);
    if (d->mine == NULL || d->all == NULL)
        return err_set(e, ERR_FAIL, "out of memory for the gradient all-reduce (%lld bytes)",
                       (long long)bytes * (d->dp + 1));
    if (d->shard)
        return shard_init(d, &r->lay, e);
    return bucketed(d) ? buckets_init(d, &r->lay, e) : ERR_OK;
}

/* Bucket b's gradients gathered from every replica, without waiting. */
static int bucket_start(struct train_dp *d, struct stage_runner *r, struct train_dp_bucket *b,
                        struct err *e)
{
    ERR_TRY(stage_state_get(r, r->lay.grads_at + 4 * b->lo, d->mine + b->lo, 4 * b->n, e));
    MPI_CHECK(MPI_Iallgather(d->mine + b->lo, (int)b->n, MPI_FLOAT, d->all + d->dp * b->lo,
                             (int)b->n, MPI_FLOAT, d->grads, &b->req),
              e);
    b->started = 1;
    return ERR_OK;
}

int train_dp_layer_grads(void *ctx, struct stage_runner *r, int li, struct err *e)
{
    struct train_dp *d = ctx;
    if (!bucketed(d))
        return ERR_OK;
    if (d->mine == NULL)
        ERR_TRY(buffers_init(d, r, e));
    while (d->next < d->n_buckets && d->buckets[d->next].layer >= li)
        ERR_TRY(bucket_start(d, r, &d->buckets[d->next++], e));
    for (int k = 0; k < d->next; k++) { /* MPI moves a nonblocking collective on in its calls */
        int done;
        MPI_CHECK(MPI_Test(&d->buckets[k].req, &done, MPI_STATUS_IGNORE), e);
    }
    return ERR_OK;
}

/* The buckets: those not started yet started, then each waited for and summed in replica
 * order (gather_sum's arithmetic). */
static int buckets_reduce(struct train_dp *d, struct stage_runner *r, float scale,
                          struct err *e)
{
    while (d->next < d->n_buckets)
        ERR_TRY(bucket_start(d, r, &d->buckets[d->next++], e));
    for (int k = 0; k < d->n_buckets; k++) {
        struct train_dp_bucket *b = &d->buckets[k];
        const float *all = d->all + d->dp * b->lo;
        ERR_TRY(mpicheck_wait(&b->req, "the replicas' gradients (MPI_Iallgather)", e));
        for (int64_t i = 0; i < b->n; i++) {
            float sum = all[i];
            for (int rr = 1; rr < d->dp; rr++)
                sum += all[(int64_t)rr * b->n + i];
            d->mine[b->lo + i] = sum * scale;
        }
        b->started = 0;
    }
    d->next = 0;
    return ERR_OK;
}

int train_dp_reduce(void *ctx, struct stage_runner *r, struct err *e)
{
    struct train_dp *d = ctx;
    double t0 = exec_now_ms();
    int64_t bytes = r->lay.section_bytes, n = bytes / (int64_t)sizeof(float);
    if (d->mine == NULL)
        ERR_TRY(buffers_init(d, r, e));
    float scale = (float)(1.0 / d->dp);
    if (d->nccl != NULL) { /* on the device, in NCCL's order */
        ERR_TRY(allreduce_nccl_sum(d->nccl, (float *)(r->persistent + r->lay.grads_at), n, scale,
                                   e));
        d->step_ms = exec_now_ms() - t0;
        return ERR_OK;
    }
    if (bucketed(d)) {
        ERR_TRY(buckets_reduce(d, r, scale, e));
        ERR_TRY(stage_state_put(r, r->lay.grads_at, d->mine, bytes, e));
        d->step_ms = exec_now_ms() - t0;
        return ERR_OK;
    }
    ERR_TRY(stage_state_get(r, r->lay.grads_at, d->mine, bytes, e));
    if (d->shard) { /* this replica's slice only: the others are theirs to update */
        int64_t lo = d->lo[d->replica], len = d->len[d->replica];
        ERR_TRY(reduce_scatter(d, d->mine, scale, e));
        ERR_TRY(stage_state_put(r, r->lay.grads_at + 4 * lo, d->mine + lo, 4 * len, e));
    } else {
        ERR_TRY(gather_sum(d, d->mine, d->mine, n, scale,
                           "the replicas' gradients (MPI_Iallgather)", e));
        ERR_TRY(stage_state_put(r, r->lay.grads_at, d->mine, bytes, e));
    }
    d->step_ms = exec_now_ms() - t0;
    return ERR_OK;
}

/* Replica q's count[q] elements of `type` at `send` (MPI_IN_PLACE: already at their place)
 * into recv + at[q] elements, on every replica (root < 0, MPI_Iallgatherv) or on root
 * (MPI_Igatherv), in chunks. */
static int gatherv(struct train_dp *d, const char *send, const int64_t *count, const int64_t *at,
                   MPI_Datatype type, int elem, char *recv, int root, const char *what,
                   struct err *e)
{
    int64_t most = 0, step = shard_step(d);
    for (int q = 0; q < d->dp; q++)
        most = count[q] > most ? count[q] : most;
    for (int64_t c = 0; c < most; c += step) {
        for (int q = 0; q < d->dp; q++) {
            d->counts[q] = (int)clamp_chunk(count[q] - c, step);
            d->displs[q] = (int)(at[q] + c);
        }
        const void *from = send == MPI_IN_PLACE ? MPI_IN_PLACE : send + c * elem;
        int n = d->counts[d->replica];
        MPI_Request q;
        if (root < 0)
            ERR_TRY(mpicheck_collective(MPI_Iallgatherv(from, n, type, recv, d->counts,
                                                        d->displs, type, d->grads, &q),
                                        &q, what, e));
        else
            ERR_TRY(mpicheck_collective(MPI_Igatherv(from, n, type, recv, d->counts, d->displs,
                                                     type, root, d->grads, &q),
                                        &q, what, e));
    }
    return ERR_OK;
}

int train_dp_gather_params(void *ctx, struct stage_runner *r, struct err *e)
{
    struct train_dp *d = ctx;
    const struct stage_layout *lay = &r->lay;
    double t0 = exec_now_ms();
    int me = d->replica, elem = sizes_weight_elem_bytes(lay->dtype);
    char *w = (char *)d->mine; /* the weights section (no longer than an fp32 section) */
    ERR_TRY(stage_state_get(r, 0, w, lay->weights_bytes, e));
    pack_slice(lay, d->lo[me], d->len[me], w, d->packed + elem * d->lo[me], 1);
    MPI_Datatype type = elem == 4 ? MPI_FLOAT : MPI_UINT16_T; /* fp32 or 16-bit weights */
    ERR_TRY(gatherv(d, MPI_IN_PLACE, d->weights, d->lo, type, elem, d->packed, -1,
                    "the replicas' updated weights (MPI_Iallgatherv)", e));
    for (int q = 0; q < d->dp; q++)
        if (q != me)
            pack_slice(lay, d->lo[q], d->len[q], w, d->packed + elem * d->lo[q], 0);
    ERR_TRY(stage_state_put(r, 0, w, lay->weights_bytes, e));
    d->step_ms += exec_now_ms() - t0;
    return ERR_OK;
}

int train_dp_gather_state(struct train_dp *d, struct stage_runner *r, struct err *e)
{
    const struct stage_layout *lay = &r->lay;
    int me = d->replica, n_opt = model_dtype_16bit(lay->dtype) ? 3 : 2;
    int64_t S = lay->section_bytes, opt_at = lay->grads_at + S, off[4];
    if (!d->shard || d->dp <= 1 || d->lo == NULL) /* d->lo: set by the first step's reduction */
        return ERR_OK;
    if (me == 0 && d->state == NULL && (d->state = malloc((size_t)(n_opt * S) + 1)) == NULL)
        return err_set(e, ERR_FAIL, "out of memory gathering the optimizer state (%lld bytes)",
                       (long long)(n_opt * S));
    off[0] = lay->grads_at; /* the reduced gradients, then [master,] m, v */
    for (int j = 0; j < n_opt; j++)
        off[j + 1] = opt_at + j * S;
    for (int j = 0; j <= n_opt; j++) {
        char *recv = j == 0 ? (char *)d->mine : d->state + (j - 1) * S;
        ERR_TRY(stage_state_get(r, off[j] + 4 * d->lo[me], d->packed, 4 * d->len[me], e));
        ERR_TRY(gatherv(d, d->packed, d->len, d->lo, MPI_FLOAT, 4, recv, 0,
                        "the replicas' optimizer state (MPI_Igatherv)", e));
    }
    if (me == 0) {
        ERR_TRY(stage_state_put(r, lay->grads_at, d->mine, S, e));
        r->shard_state = d->state;
    }
    return ERR_OK;
}

int train_dp_loss(struct train_dp *d, const double *mb_loss, int M, double *loss,
                  struct err *e)
{
    double *all = malloc(sizeof *all * (size_t)M * (size_t)d->dp);
    if (all == NULL)
        return err_set(e, ERR_FAIL, "out of memory gathering the losses");
    MPI_Request q;
    int rc = mpicheck_collective(MPI_Iallgather(mb_loss, M, MPI_DOUBLE, all, M, MPI_DOUBLE,
                                                d->grads, &q),
                                 &q, "the replicas' losses (MPI_Iallgather)", e);
    double sum = 0;
    for (int i = 0; rc == ERR_OK && i < M * d->dp; i++)
        sum += all[i];
    if (rc == ERR_OK)
        *loss = sum / (M * d->dp);
    free(all);
    return rc;
}
