/* `ballast train`: one MPI rank per stage of a plan. MPI must be initialised by the caller
 * (MPI_THREAD_MULTIPLE, for the heartbeat).
 *
 * Failure handling: set-up problems (bad plan, wrong rank count, a stage that does not fit
 * its limit, a refused checkpoint) are collected with an MPI_Iallreduce, so every rank returns
 * the same non-zero status within the time of the set-up; the rank that found the problem
 * prints it. So are failures to write a checkpoint or the weights (a full disk): every rank
 * stops with status 1, nothing half-written left behind. A failure inside a step (an MPI
 * error, a data file changed under the run) prints and calls MPI_Abort. A rank that stops or
 * dies is the heartbeat's (heartbeat.h): every rank names it and the job ends with status 1.
 * Metrics and trace files are written only after the last step, each atomically: a failed run
 * leaves none. */
#ifndef BALLAST_TRAIN_H
#define BALLAST_TRAIN_H

#include <stdint.h>

#include <mpi.h>

#include "err.h"
#include "lossscale.h"

struct heartbeat;
struct plan;
struct plan_stage;

#define TRAIN_DEFAULT_LR 1e-3
/* The heartbeat's deadline: a live rank's heartbeat thread beats every second whatever its
 * work (a step of minutes, a checkpoint of gigabytes), so half a minute without one means the
 * process is stopped, dead or cut off. */
#define TRAIN_DEFAULT_TIMEOUT_S 30
/* A rank alive but making no progress at all (no layer computed, no piece of a file read or
 * written, no copy, while it waits on no other rank) this long is stuck: generous, since a
 * single layer of a large model on a CPU may compute for minutes. */
#define TRAIN_DEFAULT_STALL_S 600

struct train_options {
    const char *plan_file;
    const struct plan *plan;  /* plan_file loaded by the caller (NULL: train_run loads it);
                                 the caller frees it after train_run */
    const char *data_file;    /* NULL: the synthetic source */
    int data_format;          /* enum data_format: llm.c tokens (0, the default) or bytes */
    const char *metrics_file; /* may be NULL */
    const char *trace_file;   /* may be NULL */
    const char *save_dir;     /* may be NULL */
    const char *resume_dir;   /* may be NULL */
    const char *init_file;    /* safetensors weights to start from (safetensors.h); NULL */
    const char *save_weights_file; /* safetensors written at the end; NULL */
    int64_t steps;            /* the step to train up to (a resumed run continues to it) */
    int64_t save_every;       /* with save_dir: every N steps (0: at the end only) */
    uint64_t seed;
    double lr;
    int threads; /* 0: the host's cores shared evenly among the ranks on it */
    const char *device;    /* "auto" (the plan's devices), "cpu" or "cuda" */
    const char *transport; /* "auto", "mpi" or "nccl" (transport.h) */
    int quiet;   /* no per-step lines */
    double timeout_s; /* the heartbeat's deadline: a rank silent this long is stopped */
    double stall_s;   /* a rank alive but without progress this long is stuck */
    struct heartbeat *heartbeat; /* this process's (heartbeat.h); NULL: none */
    double host_link_gbps; /* CPU stages: the host link offload's copies emulate (0: none) */
    int check_arena;  /* verify that no two objects of the plan's arena in use share a byte */
    /* an fp16 model's dynamic loss scaling (lossscale.h; LOSSSCALE_DEFAULTS unless the
     * options set it; a resumed run continues its checkpoint's scale and counters) */
    struct lossscale_config loss_scale;
    /* --share (train_share.c): the jobs of share_file in turn, `slice` steps at a time, until
     * each has run `steps`; switch_full: the baseline that copies a job's device state to
     * host at switch-out and back at switch-in */
    const char *share_file;
    int64_t slice;
    int switch_full;
};

/* Whether a stage computes on a GPU: `device` (--device) "cpu" or "cuda", or "auto" for the
 * plan's device_kind. */
int train_stage_on_cuda(const char *device, const struct plan_stage *st);

/* In --init and --save-weights with --share: replaced by each job's name. */
#define TRAIN_JOB_MARK "{job}"

/* CPU threads for a rank of a node of n_local ranks: `requested` (--threads), or 0 for the
 * node's cores shared evenly. When more are asked for than a rank's share, `speak` (one rank
 * of the node) warns with the numbers: kernels slow down many times when threads outnumber
 * cores. */
int train_cpu_threads(int requested, int n_local, int speak);

/* Returns the exit status (err.h): 0, 1 failure while running, 2 bad input, 3 the plan's
 * stage does not fit its memory. Messages are printed here, by the rank concerned. */
int train_run(const struct train_options *o);
/* The same for o->share_file (train_run passes it on, with this rank and the rank count of
 * MPI_COMM_WORLD, whose errors return). */
int train_share_run(const struct train_options *o, int rank, int size);

#endif
