#include "train.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* pause */

#include "backend.h"
#include "ckpt.h"
#include "cuda_device.h"
#include "fileio.h"
#include "heartbeat.h"
#include "mpicheck.h"
#include "plan.h"
#include "report.h"
#include "safetensors.h"
#include "stage.h"
#include "train_dp.h"
#include "train_weights.h"
#include "transport.h"

struct run {
    const struct train_options *o;
    MPI_Comm comm;
    int rank, size; /* in this replica's pipeline (comm): rank is the stage */
    int world_rank, world_size;
    struct train_dp dp; /* dp.dp replicas (train_dp.h); comm is dp.pipeline once split */
    double reduce_ms;   /* the all-reduce, summed over the steps timed */
    struct plan plan;
    int plan_loaded;
    struct data_source data;
    int data_loaded;
    struct backend be;
    struct transport tp;
    int on_cuda;                  /* this rank's stage computes on a GPU */
    struct cuda_device_info gpu;  /* its GPU */
    int64_t context_bytes;        /* see report.h */
    int context_includes_others;
    int64_t nccl_bytes;
    enum transport_kind transport;
    char transport_why[256];
    struct stage_runner stage;
    int stage_ready;
    struct layout_place *place; /* this rank's layers: where each one's tensors go */
    int64_t start_step; /* steps already done (resume) */
    struct lossscale resume_scale; /* the checkpoint's loss scaler, when it has one */
    int resume_has_scale;
    long long nan_step; /* BALLAST_TEST_NONFINITE's step (1-based; 0: none) and world rank */
    int nan_rank;
};

/* Prints this rank's message, naming its stage (and replica). */
static void report_stage_error(const struct run *r, const struct err *e)
{
    if (r->dp.dp > 1)
        fprintf(stderr, "ballast train: replica %d, stage %d: %s\n", r->dp.replica, r->rank,
                e->msg);
    else
        fprintf(stderr, "ballast train: stage %d: %s\n", r->rank, e->msg);
    fflush(stderr);
}

static void fail_now(struct run *r, const struct err *e)
{
    report_stage_error(r, e);
    MPI_RELEASE(MPI_Abort(MPI_COMM_WORLD, ERR_FAIL));
}

/* Every rank passes its status; all get the worst, and the first rank that failed (a rank
 * that never arrives, stopped or dead, is the heartbeat's to name). */
static int agree(struct run *r, int rc, int *first_failed)
{
    struct err e;
    err_clear(&e);
    int verdict[2] = {rc, rc != ERR_OK ? r->world_rank : r->world_size}; /* worst, 1st failed */
    if (mpicheck_agree(MPI_COMM_WORLD, r->world_size, verdict, &e))
        fail_now(r, &e);
    if (first_failed != NULL)
        *first_failed = verdict[1];
    return verdict[0];
}

/* stage_config.agree_flag: the lowest world rank whose flag is set, over every rank of every
 * replica (mpicheck_agree_flag: a rank that never arrives is the heartbeat's to name). */
static int agree_flag(void *ctx, int mine, int *first, struct err *e)
{
    struct run *r = ctx;
    if (r->nan_step == r->stage.x.step + 1 && r->nan_rank == r->world_rank)
        mine = 1;
    return mpicheck_agree_flag(MPI_COMM_WORLD, r->world_rank, r->world_size, mine, first, e);
}

/* Every output path, before the first step: a typo must not throw a finished run away. Each
 * rank checks (ranks may see different file systems). */
static int check_outputs(const struct train_options *o, struct err *e)
{
    struct err in;
    err_clear(&in);
    if (o->metrics_file != NULL && fileio_out_check(o->metrics_file, &in))
        return err_set(e, in.code, "--metrics: %s", in.msg);
    if (o->trace_file != NULL && fileio_out_check(o->trace_file, &in))
        return err_set(e, in.code, "--trace: %s", in.msg);
    if (o->save_dir != NULL && ckpt_check_dir(o->save_dir, &in))
        return err_set(e, in.code, "--save: %s", in.msg);
    if (o->save_weights_file != NULL && fileio_out_check(o->save_weights_file, &in))
        return err_set(e, in.code, "--save-weights: %s", in.msg);
    return ERR_OK;
}

/* Checks every rank makes identically: the plan, the rank count, the data, the manifest. */
/* What every stage of the plan must be for this runtime: one GPU (no tp), one dp, and the
 * optimizer sharded on the device only; every replica at micro_batches. */
static int check_stages(const struct plan *p, const char *file, struct err *e)
{
    int dp = p->stages[0].dp;
    for (int s = 0; s < p->n_stages; s++) {
        if (p->stages[s].tp > 1) /* the command line refuses it first, with the advice */
            return err_set(e, ERR_INPUT, "%s: stages[%d]: tp %d: ballast train runs one GPU per "
                           "stage; a plan with tensor parallelism is for export",
                           file, s, p->stages[s].tp);
        if (p->stages[s].dp != dp)
            return err_set(e, ERR_INPUT, "%s: stages[%d]: dp %d, but stages[0] has dp %d: "
                           "every stage of a pipeline takes one dp",
                           file, s, p->stages[s].dp, dp);
        /* the host mirror keeps every parameter's state: sharding it is ZeRO-1 on the host */
        if (dp > 1 && p->stages[s].optimizer == COST_PLACE_HOST && p->stages[s].shard_optimizer)
            return err_set(e, ERR_INPUT, "%s: stages[%d]: the optimizer on the host and "
                           "shard_optimizer with dp %d: ballast train shards the optimizer on "
                           "the device only (plan without --actions optimizer, or a cluster "
                           "without shard_optimizer)",
                           file, s, dp);
    }
    if (p->replica_micro_batches != NULL) /* a pool plan dealing the batch unevenly */
        return err_set(e, ERR_INPUT,
                       "%s: replica_micro_batches: its %d replicas take from %d micro-batches "
                       "down, but ballast train runs every replica at micro_batches; plan the "
                       "pool with a global batch its dp divides (or a \"dp\" that does)",
                       file, dp, p->micro_batches);
    return ERR_OK;
}

/* " on G GPUs (C chunks each)" when a rank runs several chunks, else "". */
static void chunks_text(const struct plan *p, char *out, size_t size)
{
    int gpus = plan_shape(p).gpus;
    out[0] = '\0';
    if (gpus != p->n_stages)
        snprintf(out, size, " on %d GPUs (%d chunks each)", gpus, p->n_stages / gpus);
}

/* The ranks, the transport and the device the run was started with, against the plan: a rank
 * runs a GPU's chunks (virtual stages), a replica's GPUs each a rank. */
static int check_launch(const struct run *r, struct err *e)
{
    const struct train_options *o = r->o;
    const struct plan *p = &r->plan;
    int dp = p->stages[0].dp, gpus = plan_shape(p).gpus;
    char per[64];
    chunks_text(p, per, sizeof per);
    const char *unit = gpus != p->n_stages ? "GPU" : "stage";
    if (gpus * dp != r->world_size && dp > 1)
        return err_set(e, ERR_INPUT,
                       "%s: the plan has %d stages%s and dp %d, one MPI rank per %s of each "
                       "replica, %d ranks, but this run has %d ranks (mpirun -np %d)",
                       o->plan_file, p->n_stages, per, dp, unit, gpus * dp, r->world_size,
                       gpus * dp);
    if (gpus != r->world_size && dp == 1)
        return err_set(e, ERR_INPUT,
                       "%s: the plan has %d stages%s, one MPI rank %s, but this run has %d "
                       "ranks (mpirun -np %d)",
                       o->plan_file, p->n_stages, per, gpus != p->n_stages ? "per GPU" : "each",
                       r->world_size, gpus);
    if (gpus != p->n_stages && strcmp(o->transport, "nccl") == 0)
        return err_set(e, ERR_INPUT, "--transport nccl: schedule %s holds %d chunks a GPU, whose "
                       "messages go over MPI (NCCL matches messages by order and joins "
                       "neighbouring ranks only)", schedule_name(p->schedule),
                       p->n_stages / gpus);
    if (strcmp(o->device, "auto") != 0 && strcmp(o->device, "cpu") != 0 &&
        strcmp(o->device, "cuda") != 0)
        return err_set(e, ERR_INPUT, "--device: \"%s\", expected auto, cpu or cuda", o->device);
    return ERR_OK;
}

/* What this runtime can run of the plan's model: message tags for every micro-batch (with
 * chunks, per chunk and direction too), rows within 32-bit BLAS dimensions, and every layer's
 * recompute choice one it can apply. */
static int check_runnable(const struct run *r, struct err *e)
{
    const char *file = r->o->plan_file;
    const struct plan *p = &r->plan;
    const struct model *m = &p->model;
    int *tag_ub, found = 0;
    int64_t tags = plan_shape(p).gpus == p->n_stages
                       ? p->micro_batches
                       : (int64_t)2 * p->n_stages * p->micro_batches;
    if (MPI_OK(MPI_Comm_get_attr(r->comm, MPI_TAG_UB, &tag_ub, &found)) && found &&
        tags > *tag_ub)
        return err_set(e, ERR_INPUT, "%s: micro_batches: %d need message tags up to %lld, more "
                       "than this MPI's largest tag %d", file, p->micro_batches,
                       (long long)tags, *tag_ub);
    if ((int64_t)m->micro_batch * m->seq_len > 0x7fffffff)
        return err_set(e, ERR_INPUT,
                       "%s: model: micro_batch x seq_len = %lld rows is beyond 32-bit BLAS "
                       "dimensions",
                       file, (long long)m->micro_batch * m->seq_len);
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        for (int l = 0; l < plan_stage_layer_count(st); l++) {
            uint32_t regen;
            struct err inner;
            err_clear(&inner);
            if (layout_regen(m, st->first + l, st->actions[l].choice, &st->layers[l], &regen,
                             &inner))
                return err_set(e, inner.code, "%s: stages[%d].recompute_options: %s", file, s,
                               inner.msg);
        }
    }
    return ERR_OK;
}

/* --resume: the checkpoint's step and stages against the plan and --steps (an fp16 run's has
 * its loss scaler). */
static int read_resume(struct run *r, struct err *e)
{
    const struct train_options *o = r->o;
    const struct plan *p = &r->plan;
    int n_stages;
    char per[64];
    chunks_text(p, per, sizeof per);
    ERR_TRY(ckpt_read_manifest(o->resume_dir, &r->start_step, &n_stages, &r->resume_scale,
                               &r->resume_has_scale, e));
    if (p->model.dtype == MODEL_DTYPE_FP16 && !r->resume_has_scale)
        return err_set(e, ERR_INPUT, "%s/checkpoint.json: loss_scale: missing, and the "
                       "plan's model is fp16 (a checkpoint of an fp16 run has its loss "
                       "scaler's state)", o->resume_dir);
    if (n_stages != plan_shape(p).gpus)
        return err_set(e, ERR_INPUT,
                       "%s/checkpoint.json: n_stages: %d, but the plan %s has %d stages%s",
                       o->resume_dir, n_stages, o->plan_file, p->n_stages, per);
    if (r->start_step >= o->steps)
        return err_set(e, ERR_INPUT,
                       "%s: the checkpoint is at step %lld and --steps is %lld: nothing to "
                       "train (raise --steps)",
                       o->resume_dir, (long long)r->start_step, (long long)o->steps);
    return ERR_OK;
}

/* What every rank does before its stage: the plan loaded and checked against this run, the
 * data opened (a file read whole by rank 0 alone; its hash then shared: share_data), and a
 * checkpoint to resume from read. */
static int setup_global(struct run *r, struct err *e)
{
    const struct train_options *o = r->o;
    if (o->plan != NULL)
        r->plan = *o->plan; /* a shallow copy: the caller's to free */
    else if (plan_load(o->plan_file, &r->plan, e))
        return e->code;
    r->plan_loaded = o->plan == NULL;
    heartbeat_layout(o->heartbeat, r->plan.n_stages); /* names ranks by replica and stage */
    const struct model *m = &r->plan.model;
    ERR_TRY(check_stages(&r->plan, o->plan_file, e));
    ERR_TRY(check_launch(r, e));
    ERR_TRY(check_runnable(r, e));
    if (o->data_file != NULL ? data_open_file(&r->data, o->data_file, o->data_format, m, o->seed,
                                              r->world_rank == 0, e)
                             : data_init_synthetic(&r->data, m, o->seed, e))
        return e->code;
    r->data_loaded = 1;
    return o->resume_dir != NULL ? read_resume(r, e) : ERR_OK;
}

/* Rank 0 read the data file whole (setup_global): every rank takes its hash (the checkpoints'
 * identity of the data) and checks that it sees a file of the same size. */
static int share_data(struct run *r, struct err *e)
{
    if (r->data.kind != DATA_FILE)
        return ERR_OK;
    uint64_t seen[2] = {r->data.hash, (uint64_t)r->data.n_bytes};
    MPI_Request q;
    ERR_TRY(mpicheck_collective(MPI_Ibcast(seen, 2, MPI_UINT64_T, 0, MPI_COMM_WORLD, &q), &q,
                                "the data file's hash (MPI_Ibcast)", e));
    if ((int64_t)seen[1] != r->data.n_bytes)
        return err_set(e, ERR_INPUT, "--data %s: %lld bytes on rank %d's host, %lld on rank 0's: "
                       "every rank must read the same file", r->o->data_file,
                       (long long)r->data.n_bytes, r->world_rank, (long long)seen[1]);
    r->data.hash = seen[0];
    return ERR_OK;
}

/* A plan made from a profile of another implementation carries other byte counts: this
 * runtime allocates what its own layers need, and says so, field by field (for a layer
 * recomputed with an option, that option's bytes too). */
static void compare_stage_costs(const struct run *r, const struct plan_stage *st,
                                const struct layout_place *place, int *shown_all)
{
    const struct model *m = &r->plan.model;
    int shown = *shown_all;
    for (int l = st->first; l <= st->last; l++) {
        const struct layer_cost *c = &st->layers[l - st->first];
        int choice = st->actions[l - st->first].choice;
        struct layer_sizes s;
        sizes_layer(m, l, &s);
        const char *names[8] = {"state_bytes", "act_bytes", "ckpt_bytes", "workspace_bytes",
                                "out_bytes", "kept_bytes", "transient_bytes", "wgrad_bytes"};
        int64_t plan[8] = {c->state_bytes, c->act_bytes, c->ckpt_bytes, c->workspace_bytes,
                           c->out_bytes, 0, 0, c->wgrad_bytes};
        int64_t here[8] = {s.state_bytes, s.act_bytes, s.ckpt_bytes, s.workspace_bytes,
                           s.out_bytes, 0, 0,
                           c->wgrad_bytes > 0 ? sizes_wgrad_bytes(m, model_layer_kind(m, l)) : 0};
        if (st->shard_optimizer && st->dp > 1) { /* the plan's ZeRO-1 share (cost.h) */
            struct layer_cost whole = {.state_bytes = s.state_bytes}, mine;
            struct cost_group g = {.tp = 1, .dp = st->dp, .shard_optimizer = 1,
                                   .tp_efficiency = 1, .dtype = m->dtype};
            cost_group_layer(&whole, model_layer_kind(m, l), &g, &mine);
            here[0] = mine.state_bytes;
        }
        if (choice >= COST_OPTION) {
            const struct recompute_option *o = &c->options[choice - COST_OPTION];
            plan[5] = o->kept_bytes;
            plan[6] = o->transient_bytes;
            sizes_regen_bytes(m, model_layer_kind(m, l), place[l - st->first].regen, &here[5],
                              &here[6]);
        }
        for (int k = 0; k < 8; k++) {
            if (plan[k] == here[k])
                continue;
            if (shown++ == 0)
                fprintf(stderr,
                        "ballast train: stage %d: warning: the plan's layer costs are not this "
                        "runtime's (a profile of another implementation?); training allocates "
                        "its own sizes, so measured memory will differ from planned:\n",
                        st->index);
            fprintf(stderr, "  %s: %s%s%s %lld in the plan, %lld here\n", c->name,
                    k >= 5 ? cost_choice_name(c, choice) : "", k >= 5 ? " " : "", names[k],
                    (long long)plan[k], (long long)here[k]);
        }
    }
    *shown_all = shown;
}

/* The rank's stages: one, or its GPU's chunks (their places end to end). */
static void compare_layer_costs(const struct run *r)
{
    int members[SCHEDULE_CHUNKS_MAX], n = plan_gpu_stages(&r->plan, r->rank, members), at = 0;
    int shown = 0;
    for (int k = 0; k < n; k++) {
        const struct plan_stage *st = &r->plan.stages[members[k]];
        compare_stage_costs(r, st, r->place + at, &shown);
        at += plan_stage_layer_count(st);
    }
}

/* The GPU readings passed from rank to rank of a node (below): per GPU, the device memory in
 * use when the last rank on it finished starting. */
struct gpu_reading {
    char uuid[CUDA_DEVICE_ID_MAX];
    int64_t used_bytes;
};

/* This rank's backend: the CPU, or GPU (local rank) mod (GPUs of the node). */
static int start_backend(struct run *r, int local_rank, int n_local,
                         struct gpu_reading *readings, int *n_readings, struct err *e)
{
    const struct plan_stage *st = &r->plan.stages[r->rank];
    r->on_cuda = train_stage_on_cuda(r->o->device, st);
    if (!r->on_cuda)
        return backend_cpu_init(&r->be, train_cpu_threads(r->o->threads, n_local,
                                                          local_rank == 0),
                                e);
    int n = 0;
    char why[256] = "";
    cuda_device_count(&n, why, (int)sizeof why);
    if (n == 0 && strcmp(r->o->device, "cuda") == 0)
        return err_set(e, ERR_INPUT, "--device cuda: no CUDA device is usable here (%s)", why);
    if (n == 0)
        return err_set(e, ERR_INPUT,
                       "the plan puts this stage on %s, a CUDA device, but no CUDA device is "
                       "usable here (%s); --device cpu trains it on the CPU",
                       st->device, why);
    int gpu = local_rank % n;
    if (cuda_device_query(gpu, &r->gpu, e) || backend_cuda_init(&r->be, gpu, e))
        return e->code;
    struct cuda_backend_memory mem;
    backend_cuda_memory(&r->be, &mem);
    r->context_bytes = mem.used_at_start_bytes;
    r->context_includes_others = 1;
    for (int i = 0; i < *n_readings; i++)
        if (strcmp(readings[i].uuid, r->gpu.uuid) == 0) {
            r->context_bytes = mem.used_at_start_bytes - readings[i].used_bytes;
            r->context_includes_others = 0;
        }
    return ERR_OK;
}

/* A checkpoint's identity names the step's global batch: dp replicas of M micro-batches
 * train as one pipeline of dp x M does (the same samples, the same averaged gradients), so
 * either resumes the other's checkpoint, and a checkpoint of another dp is refused. */
static void checkpoint_identity(const struct run *r, struct ckpt_identity *id)
{
    ckpt_identity_of(id, &r->stage, &r->data, r->o->seed);
    id->micro_batches *= r->dp.dp;
}

/* This rank's stage: backend, arenas, weights drawn from the seed. */
static int setup_stage(struct run *r, int local_rank, int n_local, struct gpu_reading *readings,
                       int *n_readings, struct err *e)
{
    const struct train_options *o = r->o;
    const struct plan *p = &r->plan;
    const struct plan_stage *st = &p->stages[r->rank];
    if (start_backend(r, local_rank, n_local, readings, n_readings, e))
        return e->code;
    struct stage_config c;
    if (stage_config_of_plan(&c, p, r->rank, o->lr, &r->place, e)) /* checked in setup_global */
        return e->code;
    compare_layer_costs(r);
    c.record_events = o->trace_file != NULL;
    c.check_arena = o->check_arena;
    char arena_where[FILEIO_PATH_MAX + 32];
    snprintf(arena_where, sizeof arena_where, "%s: stages[%d].arena", o->plan_file, r->rank);
    c.arena_where = arena_where;
    c.host_link_gbps = o->host_link_gbps;
    c.host_threads = r->be.threads;
    if (r->dp.dp > 1) {
        c.reduce_grads = train_dp_reduce;
        c.layer_grads = train_dp_layer_grads;
        c.reduce_ctx = &r->dp;
        r->dp.bucket_bytes = st->dp_bucket_bytes;
    }
    if (p->model.dtype == MODEL_DTYPE_FP16)
        c.loss_scale = &o->loss_scale;
    c.agree_flag = agree_flag;
    c.agree_ctx = r;
    if (r->dp.dp > 1 && st->shard_optimizer) { /* ZeRO-1 (train_dp.h) */
        r->dp.shard = 1;
        c.shard = r->dp.replica;
        c.shards = r->dp.dp;
        c.gather_params = train_dp_gather_params;
    }
    /* the transport is set up once every stage has started; the runner keeps its address */
    if (stage_init(&r->stage, &c, &r->be, &r->tp, &r->data, o->seed, e))
        return e->code;
    r->stage_ready = 1;
    if (r->on_cuda) { /* what the next rank on this GPU will find in use */
        int64_t free_b, total_b;
        if (cuda_mem_info(&free_b, &total_b, e))
            return e->code;
        int i = 0;
        while (i < *n_readings && strcmp(readings[i].uuid, r->gpu.uuid) != 0)
            i++;
        if (i == *n_readings)
            (*n_readings)++;
        snprintf(readings[i].uuid, sizeof readings[i].uuid, "%s", r->gpu.uuid);
        readings[i].used_bytes = total_b - free_b;
    }
    return ERR_OK;
}

/* The stage's weights and state from the checkpoint (--resume) or a safetensors file
 * (--init). */
static int load_state(struct run *r, struct err *e)
{
    const struct train_options *o = r->o;
    if (o->resume_dir != NULL) {
        struct ckpt_identity id;
        checkpoint_identity(r, &id);
        ERR_TRY(ckpt_read_stage(o->resume_dir, &id, r->start_step, &r->stage, e));
        if (r->stage.c.loss_scale != NULL)
            r->stage.scaler = r->resume_scale;
    }
    return o->init_file != NULL ? train_weights_load(&r->stage, o->init_file, r->rank, e)
                                : ERR_OK;
}

/* The ranks of a node set their stages up one after the other, in local-rank order: device
 * memory readings (cudaMemGetInfo is whole-device) then belong to the rank that takes them.
 * Each rank passes the readings on even when it failed, so that no rank waits for ever;
 * nothing in a turn may be collective over the ranks. Reading the weights (a checkpoint may
 * take long) comes after the turn, on every rank at once: the turns cost the node the sum of
 * its ranks' set-ups only. */
static int setup_stages_in_turn(struct run *r, struct err *e)
{
    MPI_Comm local;
    int lrank = 0, lsize = 1, n = 0;
    ERR_TRY(mpicheck_gate(MPI_COMM_WORLD, "every rank before the start-up turns (MPI_Ibarrier)",
                          e));
    /* over the world: the replicas' ranks on a node share its GPUs too */
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, r->world_rank,
                                  MPI_INFO_NULL, &local),
              e);
    MPI_CHECK(MPI_Comm_rank(local, &lrank), e);
    MPI_CHECK(MPI_Comm_size(local, &lsize), e);
    struct gpu_reading *readings = calloc((size_t)lsize, sizeof *readings);
    if (readings == NULL) {
        MPI_RELEASE(MPI_Comm_free(&local));
        return err_set(e, ERR_FAIL, "out of memory starting the stage");
    }
    int rc = ERR_OK, bytes = (int)(sizeof *readings * (size_t)lsize);
    MPI_Request q;
    if (lrank > 0 && /* the rank before this one on the node, however long it takes */
        (mpicheck_collective(MPI_Irecv(&n, 1, MPI_INT, lrank - 1, 0, local, &q), &q,
                             "MPI_Irecv of the start-up turn", e) ||
         mpicheck_collective(MPI_Irecv(readings, bytes, MPI_BYTE, lrank - 1, 1, local, &q), &q,
                             "MPI_Irecv of the start-up turn", e)))
        fail_now(r, e);
    if (rc == ERR_OK)
        rc = setup_stage(r, lrank, lsize, readings, &n, e);
    if (lrank + 1 < lsize &&
        (!MPI_OK(MPI_Send(&n, 1, MPI_INT, lrank + 1, 0, local)) ||
         !MPI_OK(MPI_Send(readings, bytes, MPI_BYTE, lrank + 1, 1, local))) &&
        rc == ERR_OK)
        rc = err_set(e, ERR_FAIL, "MPI_Send of the start-up turn failed");
    free(readings);
    MPI_RELEASE(MPI_Comm_free(&local));
    return rc == ERR_OK ? load_state(r, e) : rc;
}

/* Which transport the pipeline uses, from every rank's GPU (the ranks' ids gathered): on
 * GPUs holding several chunks, MPI, whose messages go by tag (NCCL matches them by order and
 * joins neighbouring ranks only). */
static int choose_transport(struct run *r, int chunks, struct err *e)
{
    char(*ids)[TRANSPORT_ID_MAX] = calloc((size_t)r->size, sizeof *ids);
    if (ids == NULL)
        return err_set(e, ERR_FAIL, "out of memory choosing the transport");
    char mine[TRANSPORT_ID_MAX] = "";
    if (r->on_cuda)
        snprintf(mine, sizeof mine, "%s", r->gpu.uuid);
    int rc = ERR_OK;
    MPI_Request q;
    if (mpicheck_collective(MPI_Iallgather(mine, TRANSPORT_ID_MAX, MPI_CHAR, ids, TRANSPORT_ID_MAX,
                                          MPI_CHAR, r->comm, &q),
                        &q, "the ranks' GPUs (MPI_Iallgather)", e))
        rc = e->code;
    const char *prefer = chunks > 1 ? "mpi" : r->o->transport; /* setup_global: not nccl */
    if (rc == ERR_OK &&
        transport_choose((const char(*)[TRANSPORT_ID_MAX])ids, r->size, r->rank, prefer,
                         &r->transport, r->transport_why, (int)sizeof r->transport_why))
        rc = err_set(e, ERR_INPUT, "--transport %s: %s", r->o->transport, r->transport_why);
    if (rc == ERR_OK && chunks > 1 && strcmp(r->o->transport, "auto") == 0)
        snprintf(r->transport_why, sizeof r->transport_why, "schedule %s: %d chunks a GPU, "
                 "their messages by tag", schedule_name(r->plan.schedule), chunks);
    free(ids);
    return rc;
}

/* NCCL's links: rank 0 makes every link's ids and broadcasts them (NCCL's examples'
 * bootstrap), then each rank joins its neighbours. */
static int start_nccl(struct run *r, int max_requests, struct err *e)
{
    int n_ids = 2 * (r->size - 1);
    unsigned char(*nccl_ids)[TRANSPORT_NCCL_ID_BYTES] = calloc((size_t)n_ids, sizeof *nccl_ids);
    if (nccl_ids == NULL)
        return err_set(e, ERR_FAIL, "out of memory for the NCCL ids");
    int rc = ERR_OK;
    for (int i = 0; r->rank == 0 && i < n_ids && rc == ERR_OK; i++)
        rc = transport_nccl_unique_id(nccl_ids[i], e);
    int all = agree(r, rc, NULL);
    MPI_Request q;
    if (all == ERR_OK &&
        mpicheck_collective(MPI_Ibcast(nccl_ids, n_ids * TRANSPORT_NCCL_ID_BYTES, MPI_BYTE, 0,
                                      r->comm, &q),
                        &q, "the NCCL ids from", e))
        all = e->code;
    if (all == ERR_OK)
        all = transport_nccl_init(&r->tp, r->rank, r->size,
                                  (const unsigned char(*)[TRANSPORT_NCCL_ID_BYTES])nccl_ids, &r->be,
                                  max_requests, &r->nccl_bytes, e);
    else if (rc == ERR_OK)
        all = err_set(e, ERR_FAIL, "rank 0 could not make the NCCL ids");
    free(nccl_ids);
    return all;
}

/* Every rank's GPU (or none), gathered; the same choice on every rank (transport_choose). */
static int setup_pipeline_transport(struct run *r, struct err *e)
{
    const struct plan *p = &r->plan;
    int chunks = plan_shape(p).chunks;
    if (choose_transport(r, chunks, e))
        return e->code;
    /* a send and a receive per micro-batch in flight, in each direction, at most (per chunk) */
    int max_requests = 4 * p->micro_batches * chunks + 8;
    int64_t act = sizes_activation_bytes(&p->model);
    switch (r->transport) {
    case TRANSPORT_MPI:
        return transport_mpi_init(&r->tp, &r->comm, max_requests, e);
    case TRANSPORT_MPI_STAGED:
        return transport_staged_init(&r->tp, &r->comm, max_requests, &r->be, act, e);
    case TRANSPORT_NCCL:
        break;
    }
    return start_nccl(r, max_requests, e);
}

/* The pipeline's transport, then the replicas' (train_dp.h). */
static int setup_transport(struct run *r, struct err *e)
{
    ERR_TRY(setup_pipeline_transport(r, e));
    return r->dp.dp > 1 ? train_dp_setup(&r->dp, &r->be, r->on_cuda ? r->gpu.uuid : "",
                                         r->o->transport, e)
                        : ERR_OK;
}

/* The checkpoint of `step`: every stage's file, then the manifest naming them. The ranks
 * agree after each: a rank that could not write (a full disk) has left no temporary, every
 * rank that wrote removes its file of this step (no manifest names it), the first rank that
 * failed says why, and every rank stops (ERR_FAIL) with the last complete checkpoint in
 * place. Nothing is killed while writing, so nothing is left half-written. */
static int save(struct run *r, int64_t step, struct err *e)
{
    struct ckpt_identity id;
    checkpoint_identity(r, &id);
    /* the replicas hold the same weights: replica 0's are the checkpoint (with a sharded
     * optimizer, once it has every replica's slice) */
    if (train_dp_gather_state(&r->dp, &r->stage, e))
        fail_now(r, e);
    int first, rc = r->dp.replica == 0
                        ? ckpt_write_stage(r->o->save_dir, &id, step, &r->stage, e)
                        : ERR_OK;
    int all = agree(r, rc, &first);
    /* the manifest names step N only once every stage's file of step N is on disk */
    const struct lossscale *ls = r->stage.c.loss_scale != NULL ? &r->stage.scaler : NULL;
    if (all == ERR_OK && r->world_rank == 0)
        rc = ckpt_write_manifest(r->o->save_dir, step, r->size, ls, e);
    if (all == ERR_OK)
        all = agree(r, rc, &first);
    if (all != ERR_OK) {
        if (r->world_rank == first)
            report_stage_error(r, e);
        if (r->dp.replica == 0)
            ckpt_remove_step(r->o->save_dir, r->rank, step);
        return err_set(e, ERR_FAIL, "stopped at step %lld: rank %d (replica %d, stage %d) could "
                       "not write the checkpoint (its message above); %s keeps the last "
                       "complete checkpoint, if any", (long long)step, first, first / r->size,
                       first % r->size, r->o->save_dir);
    }
    if (r->dp.replica == 0)
        ckpt_remove_older(r->o->save_dir, r->rank, step);
    return ERR_OK;
}

/* --save-weights: replica 0's stages write (the replicas hold the same weights); every rank
 * learns the outcome, the first that failed says why. */
static int save_weights(struct run *r, struct err *e)
{
    int first, rc = r->dp.replica == 0
                        ? train_weights_save(&r->stage, r->comm, r->o->save_weights_file, e)
                        : ERR_OK;
    if (agree(r, rc, &first) == ERR_OK)
        return ERR_OK;
    if (r->world_rank == first)
        report_stage_error(r, e);
    return err_set(e, ERR_FAIL, "--save-weights: rank %d (replica %d, stage %d) could not write "
                   "the weights (its message above)", first, first / r->size, first % r->size);
}

static void free_run(struct run *r)
{
    if (r->stage_ready)
        stage_free(&r->stage);
    if (r->tp.ops != NULL)
        r->tp.ops->free(&r->tp);
    train_dp_free(&r->dp); /* its NCCL communicator uses the backend's stream */
    if (r->be.ops != NULL)
        r->be.ops->free(&r->be);
    if (r->data_loaded)
        data_free(&r->data);
    if (r->plan_loaded)
        plan_free(&r->plan);
    free(r->place);
}

/* Rank 0 gathers every stage's numbers and events, then writes and prints. */
static int gather_report(struct run *r, struct report *rep, const struct report_stage *mine,
                         struct err *e)
{
    const struct train_options *o = r->o;
    struct report_stage *all = NULL;
    int *counts = NULL, *displs = NULL;
    struct stage_event *events = NULL;
    int rc = ERR_OK;
    if (r->rank == 0) {
        all = calloc((size_t)r->size, sizeof *all);
        counts = calloc((size_t)r->size, sizeof *counts);
        displs = calloc((size_t)r->size, sizeof *displs);
        if (all == NULL || counts == NULL || displs == NULL)
            rc = err_set(e, ERR_FAIL, "out of memory gathering the report");
    }
    MPI_Request q;
    if (rc == ERR_OK &&
        mpicheck_collective(MPI_Igather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine,
                                       MPI_BYTE, 0, r->comm, &q),
                        &q, "the stage reports (MPI_Igather)", e))
        rc = e->code;
    if (rc == ERR_OK && o->trace_file != NULL) {
        int n = r->stage.x.n_events * (int)sizeof(struct stage_event), total = 0;
        if (mpicheck_collective(MPI_Igather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, r->comm, &q),
                            &q, "the trace sizes (MPI_Igather)", e))
            rc = e->code;
        if (rc == ERR_OK && r->rank == 0) {
            for (int s = 0; s < r->size; s++) {
                displs[s] = total;
                total += counts[s];
            }
            events = malloc((size_t)total + 1);
            if (events == NULL)
                rc = err_set(e, ERR_FAIL, "out of memory gathering the trace");
        }
        if (rc == ERR_OK &&
            mpicheck_collective(MPI_Igatherv(r->stage.x.events, n, MPI_BYTE, events, counts,
                                            displs, MPI_BYTE, 0, r->comm, &q),
                            &q, "the trace (MPI_Igatherv)", e))
            rc = e->code;
        if (r->rank == 0)
            for (int s = 0; s < r->size; s++)
                counts[s] /= (int)sizeof(struct stage_event);
    }
    if (rc == ERR_OK && r->world_rank == 0) {
        rep->stages = all;
        rep->n_stages = r->size;
        if (o->metrics_file != NULL)
            rc = report_write_metrics(o->metrics_file, rep, e);
        if (rc == ERR_OK && o->trace_file != NULL)
            rc = report_write_trace(o->trace_file, &r->plan.model, rep, counts, events, e);
        report_print_summary(stdout, rep);
        fflush(stdout);
    }
    free(all);
    free(counts);
    free(displs);
    free(events);
    return rc;
}

/* The rank that runs the head (the last virtual stage): the last, or with a V the first. */
static int head_rank(const struct run *r)
{
    return r->plan.stages[r->plan.n_stages - 1].gpu;
}

/* The head's loss to every rank. */
static int share_loss(struct run *r, double *loss, struct err *e)
{
    MPI_Request q;
    return mpicheck_collective(MPI_Ibcast(loss, 1, MPI_DOUBLE, head_rank(r), r->comm, &q), &q,
                               "the loss (MPI_Ibcast)", e);
}

/* Each step's offload figures over the stages: stall, late prefetches and copy time summed,
 * the host peak the largest. */
static int sum_steps(struct run *r, struct report *rep, struct err *e)
{
    int n = rep->n_steps;
    double *sum = malloc(sizeof *sum * 3 * (size_t)n);
    int64_t *peak = malloc(sizeof *peak * (size_t)n);
    int rc = sum == NULL || peak == NULL ? err_set(e, ERR_FAIL, "out of memory") : ERR_OK;
    for (int i = 0; rc == ERR_OK && i < n; i++) {
        const struct report_step *st = &rep->steps[i];
        sum[3 * i] = st->stall_ms;
        sum[3 * i + 1] = st->late_prefetches;
        sum[3 * i + 2] = st->copy_ms;
        peak[i] = st->host_peak_bytes;
    }
    MPI_Request q;
    if (rc == ERR_OK &&
        (mpicheck_collective(MPI_Iallreduce(MPI_IN_PLACE, sum, 3 * n, MPI_DOUBLE, MPI_SUM,
                                            r->comm, &q),
                             &q, "the steps' offload figures (MPI_Iallreduce)", e) ||
         mpicheck_collective(MPI_Iallreduce(MPI_IN_PLACE, peak, n, MPI_INT64_T, MPI_MAX, r->comm,
                                            &q),
                             &q, "the steps' host peaks (MPI_Iallreduce)", e)))
        rc = e->code;
    for (int i = 0; rc == ERR_OK && i < n; i++) {
        struct report_step *st = &rep->steps[i];
        st->stall_ms = sum[3 * i];
        st->late_prefetches = (int)sum[3 * i + 1];
        st->copy_ms = sum[3 * i + 2];
        st->host_peak_bytes = peak[i];
    }
    free(sum);
    free(peak);
    return rc;
}

/* dp replicas (train_dp.h): this rank's pipeline becomes comm, its stage rank; the replica
 * draws its own micro-batches of each step. */
static int split_replicas(struct run *r, struct err *e)
{
    const struct plan *p = &r->plan;
    int gpus = plan_shape(p).gpus;
    ERR_TRY(train_dp_split(&r->dp, MPI_COMM_WORLD, gpus, p->stages[0].dp, e));
    r->comm = r->dp.pipeline;
    r->rank = r->dp.stage;
    r->size = gpus;
    r->data.micro_offset = r->dp.replica * p->micro_batches;
    return ERR_OK;
}

/* A verdict that ends the run (stage.h), as the message every rank returns: the step, what
 * was found and by which rank first (world rank, replica and stage). */
static int stop_verdict(const struct run *r, int64_t step, struct err *e)
{
    const struct stage_runner *s = &r->stage;
    int w = s->last.first;
    char where[96], scale[32];
    report_scale_text(s->last.loss_scale, scale);
    if (r->dp.dp > 1)
        snprintf(where, sizeof where, "rank %d: replica %d, stage %d", w, w / r->size,
                 w % r->size);
    else
        snprintf(where, sizeof where, "stage %d", w);
    if (s->last.verdict == STAGE_AT_MIN)
        return err_set(e, ERR_FAIL, "step %lld: the gradients overflow fp16 at the minimum loss "
                       "scale %s (--min-loss-scale; first on %s): stopped, nothing of the step "
                       "saved", (long long)step + 1, scale, where);
    return err_set(e, ERR_FAIL, "step %lld: a NaN or an infinity in the loss or the gradients "
                   "(first on %s): stopped before the optimizer step, nothing of it saved",
                   (long long)step + 1, where);
}

/* Rank 0's line for a step. */
static void print_step(const struct run *r, const struct report *rep, const struct report_step *st)
{
    char scale[96] = "", value[32];
    report_scale_text(st->loss_scale, value);
    if (r->stage.c.loss_scale != NULL)
        snprintf(scale, sizeof scale, "  scale %s%s", value,
                 st->skipped ? " (overflow: step skipped)" : "");
    printf("step %lld/%lld  loss %.6f%s  %.1f ms  %.0f tokens/s\n", (long long)st->step,
           (long long)r->o->steps, st->loss, scale, st->ms,
           (double)rep->tokens_per_step / (st->ms * 1e-3));
    fflush(stdout);
}

/* What the steps after a run's first add up (a one-step run counts its only step). */
struct loop_sums {
    struct stage_times t;
    int counted;
    double timed_ms;
};

static void loop_sums_add(struct loop_sums *a, const struct stage_times *t, double ms)
{
    stage_times_add(&a->t, t);
    a->counted++;
    a->timed_ms += ms;
}

/* The run's report before its steps: what it trains, how, and a row for each step to come. */
static int report_begin(const struct run *r, struct report *rep, struct err *e)
{
    const struct plan *p = &r->plan;
    const struct model *m = &p->model;
    int64_t n_steps = r->o->steps - r->start_step;
    *rep = (struct report){
        .plan_file = r->o->plan_file,
        .schedule = schedule_name(p->schedule),
        .micro_batches = p->micro_batches,
        .threads = r->be.threads,
        .dp = r->dp.dp,
        .tokens_per_step = (int64_t)r->dp.dp * p->micro_batches * m->micro_batch * m->seq_len,
        .data = r->o->data_file != NULL ? r->o->data_file : "synthetic",
        .entropy_floor = data_entropy_floor(&r->data),
        .transport = transport_kind_name(r->transport),
        .transport_reason = r->transport_why,
        .loss_scale = r->stage.c.loss_scale,
    };
    rep->steps = calloc((size_t)n_steps, sizeof *rep->steps);
    return rep->steps != NULL
               ? ERR_OK
               : err_set(e, ERR_FAIL, "out of memory for %lld steps", (long long)n_steps);
}

/* Rank 0's first line. */
static void print_start(const struct run *r)
{
    const struct train_options *o = r->o;
    const struct plan *p = &r->plan;
    const struct model *m = &p->model;
    char replicas[64] = "";
    if (r->world_rank != 0 || o->quiet)
        return;
    if (r->dp.dp > 1)
        snprintf(replicas, sizeof replicas, " x %d replicas (gradients over %s)", r->dp.dp,
                 train_dp_reduce_kind(&r->dp));
    printf("train: %s, %d stages%s, %s, %s, %d micro-batches of %d x %d tokens, rank 0 on %s "
           "(%d threads), transport %s, steps %lld..%lld\n",
           o->plan_file, p->n_stages, replicas, schedule_name(p->schedule),
           model_dtype_name(m->dtype), p->micro_batches, m->micro_batch, m->seq_len,
           r->on_cuda ? r->gpu.name : "the CPU", r->be.threads,
           transport_kind_name(r->transport), (long long)r->start_step + 1, (long long)o->steps);
}

/* One step: trained, its loss gathered, its row written and printed, a checkpoint saved when
 * due. A verdict that stops the run (a NaN, the minimum loss scale) is returned as the error
 * every rank returns. */
static int run_step(struct run *r, int64_t i, struct report *rep, struct loop_sums *acc,
                    struct err *e)
{
    const struct train_options *o = r->o;
    int64_t n_steps = o->steps - r->start_step, step = r->start_step + i;
    double t0 = exec_now_ms(), loss = 0;
    if (stage_step(&r->stage, step, &loss, e))
        fail_now(r, e);
    if (r->stage.last.verdict == STAGE_NONFINITE || r->stage.last.verdict == STAGE_AT_MIN)
        return stop_verdict(r, step, e); /* every rank has the verdict: nothing is written */
    if (r->dp.dp > 1 && r->rank == head_rank(r) &&
        train_dp_loss(&r->dp, r->stage.x.mb_loss, r->plan.micro_batches, &loss, e))
        fail_now(r, e);
    if (share_loss(r, &loss, e))
        fail_now(r, e);
    double ms = exec_now_ms() - t0;
    const struct stage_times *now = &r->stage.x.times;
    rep->steps[i] = (struct report_step){step + 1,
                                         loss,
                                         ms,
                                         now->stall,
                                         now->late_prefetches,
                                         now->copy[0] + now->copy[1],
                                         now->host_peak,
                                         r->stage.last.loss_scale,
                                         r->stage.last.verdict == STAGE_SKIPPED};
    acc->t.late_prefetches += now->late_prefetches; /* every step's, the first too */
    rep->n_steps = (int)i + 1;
    if (i > 0 || n_steps == 1) {
        loop_sums_add(acc, now, ms);
        r->reduce_ms += r->dp.step_ms;
    }
    if (r->world_rank == 0 && !o->quiet)
        print_step(r, rep, &rep->steps[i]);
    if (o->save_dir != NULL &&
        ((o->save_every > 0 && (step + 1) % o->save_every == 0) || i == n_steps - 1))
        return save(r, step + 1, e);
    return ERR_OK;
}

/* This rank's figures against its plan: memory, and time per micro-batch over the steps
 * counted (a GPU holding chunks: over them; its memory is the GPU's already). */
static void stage_report(const struct run *r, const struct loop_sums *acc,
                         struct report_stage *mine)
{
    const struct plan *p = &r->plan;
    const struct plan_stage *st = &p->stages[r->rank];
    const struct stage_times *t = &acc->t;
    double stage_ms = 0, recompute_ms = 0, per_mb = (double)acc->counted * p->micro_batches;
    int members[SCHEDULE_CHUNKS_MAX], n_members = plan_gpu_stages(p, r->rank, members);
    for (int k = 0; k < n_members; k++) {
        stage_ms += p->stages[members[k]].stage_ms;
        recompute_ms += p->stages[members[k]].recompute_ms;
    }
    *mine = (struct report_stage){
        .index = r->rank,
        .first = st->first,
        .last = st->last,
        .peak_bytes = r->stage.x.peak,
        .planned_bytes = st->memory_bytes - p->reserve_bytes,
        .reserve_bytes = p->reserve_bytes,
        .arena_bytes = r->stage.lay.arena_bytes,
        .planned_stage_ms = stage_ms,
        .planned_recompute_ms = recompute_ms,
        .fwd_ms = t->fwd / per_mb,
        .bwd_ms = t->bwd / per_mb,
        .recompute_ms = t->recompute / per_mb,
        .send_ms = t->send / per_mb,
        .idle_ms = t->idle / per_mb,
        .optimizer_ms = t->optimizer / acc->counted,
        .host_update_ms = t->host_update / acc->counted,
        .allreduce_ms = r->reduce_ms / acc->counted,
        .host_peak_bytes = r->stage.x.off.host_peak,
        .host_bytes = r->stage.lay.host_bytes,
        .staging_bytes = r->stage.lay.staging_bytes,
        .copy_ms = (t->copy[0] + t->copy[1]) / (2.0 * per_mb),
        .stall_ms = t->stall / acc->counted,
        .late_prefetches = t->late_prefetches,
    };
    snprintf(mine->device, sizeof mine->device, "%s", st->device);
    snprintf(mine->backend, sizeof mine->backend, "%s", r->on_cuda ? "cuda" : "cpu");
    snprintf(mine->allreduce, sizeof mine->allreduce, "%s", train_dp_reduce_kind(&r->dp));
    for (int k = 0; k < n_members; k++)
        for (int l = 0; l < plan_stage_layer_count(&p->stages[members[k]]); l++)
            mine->n_recompute += p->stages[members[k]].actions[l].choice != COST_KEEP; /* or part */
}

/* A CUDA rank's device memory beside its arenas, as the metrics report it. */
static void stage_report_cuda(struct run *r, struct report_stage *mine)
{
    struct cuda_backend_memory mem;
    int64_t free_b = 0, total_b = 0;
    struct err me;
    backend_cuda_memory(&r->be, &mem);
    if (cuda_mem_info(&free_b, &total_b, &me) == ERR_OK)
        mine->device_used_end_bytes = total_b - free_b;
    mine->device_total_bytes = total_b;
    snprintf(mine->gpu, sizeof mine->gpu, "%s", r->gpu.name);
    snprintf(mine->gpu_uuid, sizeof mine->gpu_uuid, "%s", r->gpu.uuid);
    mine->gpu_ordinal = r->gpu.ordinal;
    mine->context_bytes = r->context_bytes;
    mine->context_includes_others = r->context_includes_others;
    mine->cublas_bytes = mem.blas_bytes;
    mine->cublas_workspace_bytes = mem.blas_workspace_bytes;
    mine->nccl_bytes = r->nccl_bytes;
}

/* Every stage starts together, runs its steps, drains its last host updates, saves the
 * weights when asked, and reports. */
static int train_loop(struct run *r, struct err *e)
{
    struct report rep;
    struct loop_sums acc = {0};
    ERR_TRY(report_begin(r, &rep, e));
    print_start(r);
    MPI_Request q;
    int rc = mpicheck_collective(MPI_Ibarrier(r->comm, &q), &q, "every stage to start", e);
    if (rc == ERR_OK)
        stage_set_origin(&r->stage);
    for (int64_t i = 0; rc == ERR_OK && i < r->o->steps - r->start_step; i++)
        rc = run_step(r, i, &rep, &acc, e);
    if (rc == ERR_OK && stage_drain(&r->stage, e)) /* the last host updates, into the trace */
        fail_now(r, e);
    if (rc == ERR_OK && r->o->save_weights_file != NULL)
        rc = save_weights(r, e);
    struct report_stage mine;
    if (rc == ERR_OK) {
        rep.tokens_per_s = (double)rep.tokens_per_step * acc.counted / (acc.timed_ms * 1e-3);
        rep.scaler = r->stage.scaler;
        stage_report(r, &acc, &mine);
        if (r->on_cuda)
            stage_report_cuda(r, &mine);
        rc = sum_steps(r, &rep, e);
    }
    if (rc == ERR_OK)
        rc = gather_report(r, &rep, &mine, e);
    free(rep.steps);
    return rc;
}

/* Fault injection for the heartbeat's tests: BALLAST_TEST_FAULT=RANK:KIND makes world rank
 * RANK, before it says anything, stop (KIND stop: SIGSTOP, as a rank stopped or stuck in the
 * kernel would), sleep for ever neither progressing nor waiting (sleep: a library retrying a
 * failed allocation), or wait for ever on a message nobody sends (wait: with every other rank
 * then waiting on it, a deadlock). */
static void inject_fault(int world_rank, struct err *e)
{
    const char *f = getenv("BALLAST_TEST_FAULT");
    int rank = -1;
    char kind[16] = "";
    if (f == NULL || sscanf(f, "%d:%15s", &rank, kind) != 2 || rank != world_rank)
        return;
    if (strcmp(kind, "stop") == 0)
        raise(SIGSTOP);
    while (strcmp(kind, "sleep") == 0)
        pause();
    int never;
    MPI_Request q;
    if (strcmp(kind, "wait") == 0)
        mpicheck_collective(MPI_Irecv(&never, 1, MPI_INT, 0, 0, MPI_COMM_SELF, &q), &q,
                            "a message nobody sends (BALLAST_TEST_FAULT)", e);
}

/* This rank in MPI_COMM_WORLD, with its errors returned, and the tests' hooks: an injected
 * fault, and "STEP:RANK" in BALLAST_TEST_NONFINITE: that rank finds a NaN in its gradients at
 * that step, as if its backward had made one. */
static int start_rank(struct run *r, struct err *e)
{
    r->comm = MPI_COMM_WORLD;
    r->dp = (struct train_dp){.dp = 1, .pipeline = MPI_COMM_NULL, .grads = MPI_COMM_NULL};
    if (!MPI_OK(MPI_Comm_set_errhandler(r->comm, MPI_ERRORS_RETURN)) ||
        !MPI_OK(MPI_Comm_rank(r->comm, &r->rank)) || !MPI_OK(MPI_Comm_size(r->comm, &r->size)))
        return ERR_FAIL;
    r->world_rank = r->rank;
    r->world_size = r->size;
    inject_fault(r->world_rank, e);
    const char *nan = getenv("BALLAST_TEST_NONFINITE");
    if (nan == NULL || sscanf(nan, "%lld:%d", &r->nan_step, &r->nan_rank) != 2)
        r->nan_step = 0;
    return ERR_OK;
}

/* What every rank sets up alike (the plan, the replicas, the data file and the outputs): the
 * agreed status, said by the first rank that failed (rank 0 when all did; usually all share
 * one file system). */
static int setup_alike(struct run *r, struct err *e)
{
    int first_failed, rc = setup_global(r, e);
    int all = agree(r, rc, &first_failed);
    if (all == ERR_OK && r->plan.stages[0].dp > 1 && split_replicas(r, e)) {
        fprintf(stderr, "ballast train: %s\n", e->msg);
        return ERR_FAIL;
    }
    if (all == ERR_OK) {
        rc = share_data(r, e);
        if (rc == ERR_OK)
            rc = check_outputs(r->o, e);
        all = agree(r, rc, &first_failed);
    }
    if (all != ERR_OK && rc != ERR_OK && r->world_rank == first_failed)
        fprintf(stderr, "ballast train: %s\n", e->msg);
    return all;
}

/* This rank's own set-up, its stages then its transport: each rank speaks for itself, but
 * for the transport's choice, the same on every rank, which rank 0 says. */
static int setup_own(struct run *r, struct err *e)
{
    for (int phase = 0; phase < 2; phase++) {
        err_clear(e);
        int first_failed, rc = phase == 0 ? setup_stages_in_turn(r, e) : setup_transport(r, e);
        int all = agree(r, rc, &first_failed);
        if (all == ERR_OK)
            continue;
        int global = phase == 1 && rc == ERR_INPUT;
        if (rc != ERR_OK && global && r->world_rank == 0)
            fprintf(stderr, "ballast train: %s\n", e->msg);
        else if (rc != ERR_OK && !global)
            fprintf(stderr, "ballast train: stage %d: %s\n", r->rank, e->msg);
        else if (rc == ERR_OK && r->world_rank == 0)
            fprintf(stderr, "ballast train: stopped: rank %d (replica %d, stage %d) could not "
                            "start\n",
                    first_failed, first_failed / r->size, first_failed % r->size);
        return all;
    }
    return ERR_OK;
}

int train_run(const struct train_options *o)
{
    struct run r;
    struct err e;
    memset(&r, 0, sizeof r);
    err_clear(&e);
    r.o = o;
    if (start_rank(&r, &e)) {
        fprintf(stderr, "ballast train: MPI_COMM_WORLD is unusable\n");
        return ERR_FAIL;
    }
    if (o->share_file != NULL)
        return train_share_run(o, r.rank, r.size);
    int all = setup_alike(&r, &e);
    if (all == ERR_OK)
        all = setup_own(&r, &e);
    if (all == ERR_OK) {
        /* rank 0 writes the files; any rank's failure is everyone's, the first one's said */
        int first_failed, rc = train_loop(&r, &e);
        all = agree(&r, rc, &first_failed);
        if (all != ERR_OK && r.world_rank == first_failed)
            fprintf(stderr, "ballast train: %s\n", e.msg);
    }
    free_run(&r);
    return all;
}
