/* Data-parallel pipelines for ballast train: a plan whose stages carry dp > 1 runs on S x dp
 * ranks. World rank w is replica w / S's stage w % S (replica r's stage s is rank r*S + s):
 * each replica's pipeline has its own communicator (its transport's; ranks are stages), and
 * each stage's dp ranks a gradient communicator (ranks are replicas). After a stage's last
 * backward of the step its gradients are gathered from every replica (MPI_Iallgather) and
 * summed in replica order, then scaled by 1/dp: every rank adds the same numbers in the same
 * order, so the replicas stay bitwise equal and a run is bitwise reproducible; the sum is
 * grouped differently from one pipeline of dp x M micro-batches (which accumulates them in
 * one buffer), so it equals that pipeline's within float rounding, not bitwise.
 *
 * Over MPI the gradients go in buckets (the plan's dp_bucket_bytes, as the simulator's,
 * planner/sim/sim.h): as each layer's last backward of the step ends (layers last to first), a
 * bucket that its layers complete starts its MPI_Iallgather, which progresses while the
 * backward goes on; after the last backward each bucket is waited for and summed as above,
 * so the numbers are the unbucketed reduction's, bit for bit. 0: one reduction after the
 * last backward.
 *
 * ZeRO-1 (the plan's shard_optimizer): replica r keeps AdamW's state only for slice r of the
 * stage's parameters (layout_shard_range). Its gradients' slice q goes to replica q
 * (MPI_Ialltoallv), which sums the dp copies of its slice in replica order and scales them as
 * above; it updates its slice with the same AdamW, element by element, and every replica
 * gathers the others' updated weights (MPI_Iallgatherv). Each number is computed as the
 * unsharded run computes it, so the two are bitwise equal. */
#ifndef BALLAST_TRAIN_DP_H
#define BALLAST_TRAIN_DP_H

#include <mpi.h>

#include "err.h"
#include "stage.h"
#include "transport.h"

struct train_dp {
    int dp, replica, stage;
    MPI_Comm pipeline, grads; /* MPI_COMM_NULL until split */
    float *mine, *all; /* host copies: this stage's gradients, and every replica's */
    int64_t n;         /* floats in them */
    double step_ms;    /* the last step's reduction, from its last backward's end */
    /* Buckets (above): contiguous ranges of the gradient section, in the order they start;
     * `layer` the lowest layer in each (its last backward completes it) */
    int64_t bucket_bytes;
    int n_buckets, next;
    struct train_dp_bucket {
        int64_t lo, n; /* floats */
        int layer;
        MPI_Request req; /* MPI_REQUEST_NULL once waited for (or not started) */
        int started;
    } *buckets;
    /* ZeRO-1 */
    int shard;                 /* the plan's shard_optimizer */
    int64_t *lo, *len;         /* per replica, its slice of an fp32 section in floats */
    int64_t *weights;          /* per replica, the weights in its slice (elements) */
    int *counts, *displs, *rcounts, *rdispls; /* per replica, one MPI call's */
    char *packed, *state;      /* the replicas' weights slices; replica 0's gathered state */
    struct allreduce_nccl *nccl; /* non-NULL: the gradients go over NCCL (train_dp_setup) */
};

/* Splits `world` (n_stages * dp ranks, checked by the caller) into the pipelines and the
 * gradient groups. */
int train_dp_split(struct train_dp *d, MPI_Comm world, int n_stages, int dp, struct err *e);
void train_dp_free(struct train_dp *d);

/* Once the stage's backend is up (every replica of the stage calls it): the gradients go
 * over NCCL (transport.h allreduce_nccl) when every replica of the stage computes on a GPU
 * of its own (transport_choose over their GPUs, gpu_uuid "" on the CPU), the optimizer is not
 * sharded and `prefer` (--transport) is not "mpi"; over MPI otherwise. NCCL sums in its ring
 * order, so that path equals the MPI one within 1e-4 relative, not bitwise. */
int train_dp_setup(struct train_dp *d, struct backend *be, const char *gpu_uuid,
                   const char *prefer, struct err *e);
/* "nccl" or "mpi": where the gradients go. */
const char *train_dp_reduce_kind(const struct train_dp *d);

/* stage_config.reduce_grads, ctx a struct train_dp: the replicas' gradients summed in replica
 * order and scaled by 1/dp. */
int train_dp_reduce(void *ctx, struct stage_runner *r, struct err *e);
/* stage_config.layer_grads: layer li's gradients are final; the buckets it completes start
 * (MPI, not sharded), and those started progress. */
int train_dp_layer_grads(void *ctx, struct stage_runner *r, int li, struct err *e);

/* stage_config.gather_params with shard: every replica's slice of the updated weights into
 * every replica's weights. */
int train_dp_gather_params(void *ctx, struct stage_runner *r, struct err *e);

/* With shard, before a checkpoint (every replica calls it): replica 0 gathers the reduced
 * gradients and every slice of the optimizer's state, so that stage_state_get reads the
 * stage's whole state as the unsharded run keeps it. Nothing otherwise. */
int train_dp_gather_state(struct train_dp *d, struct stage_runner *r, struct err *e);

/* On a last stage: the step's loss over every replica's M micro-batch losses, summed in the
 * order one pipeline of dp x M micro-batches takes them, over dp x M. */
int train_dp_loss(struct train_dp *d, const double *mb_loss, int M, double *loss,
                  struct err *e);

#endif
