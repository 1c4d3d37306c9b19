#include "train_dp.h"

#include <stdlib.h>

#include "exec.h"
#include "mpicheck.h"

#define DP_CHUNK (1 << 26) /* floats per MPI_Iallgather: MPI counts are ints */

int train_dp_split(struct train_dp *d, MPI_Comm world, int n_stages, int dp, double timeout_s,
                   struct err *e)
{
    int w;
    d->dp = dp;
    d->timeout_s = timeout_s;
    d->pipeline = d->grads = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_rank(world, &w), e);
    d->replica = w / n_stages;
    d->stage = w % n_stages;
    MPI_CHECK(MPI_Comm_split(world, d->replica, d->stage, &d->pipeline), e);
    MPI_CHECK(MPI_Comm_set_errhandler(d->pipeline, MPI_ERRORS_RETURN), e);
    MPI_CHECK(MPI_Comm_split(world, d->stage, d->replica, &d->grads), e);
    MPI_CHECK(MPI_Comm_set_errhandler(d->grads, MPI_ERRORS_RETURN), e);
    return ERR_OK;
}

void train_dp_free(struct train_dp *d)
{
    if (d->pipeline != MPI_COMM_NULL)
        MPI_Comm_free(&d->pipeline);
    if (d->grads != MPI_COMM_NULL)
        MPI_Comm_free(&d->grads);
    free(d->mine);
    free(d->all);
    d->mine = d->all = NULL;
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
                                &q, d->timeout_s, -1, what, e))
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

int train_dp_reduce(void *ctx, struct stage_runner *r, struct err *e)
{
    struct train_dp *d = ctx;
    double t0 = exec_now_ms();
    int64_t bytes = r->lay.section_bytes, n = bytes / (int64_t)sizeof(float);
    if (d->mine == NULL) {
        d->n = n;
        d->mine = malloc((size_t)bytes + 1);
        d->all = malloc(sizeof *d->all * (size_t)d->dp * (size_t)(n < DP_CHUNK ? n : DP_CHUNK) + 1);
        if (d->mine == NULL || d->all == NULL)
            return err_set(e, ERR_FAIL, "out of memory for the gradient all-reduce (%lld bytes)",
                           (long long)bytes * (d->dp + 1));
    }
    ERR_TRY(stage_state_get(r, r->lay.grads_at, d->mine, bytes, e));
    ERR_TRY(gather_sum(d, d->mine, d->mine, n, (float)(1.0 / d->dp),
                       "the replicas' gradients (MPI_Iallgather)", e));
    ERR_TRY(stage_state_put(r, r->lay.grads_at, d->mine, bytes, e));
    d->step_ms = exec_now_ms() - t0;
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
                                 &q, d->timeout_s, -1,
                                 "the replicas' losses (MPI_Iallgather)", e);
    double sum = 0;
    for (int i = 0; rc == ERR_OK && i < M * d->dp; i++)
        sum += all[i];
    if (rc == ERR_OK)
        *loss = sum / (M * d->dp);
    free(all);
    return rc;
}
