/* Helpers shared by the `ballast train` test programs (CPU and CUDA): running mpirun with a
 * time limit, reading metrics, a run that must succeed with its memory checked against the
 * plan, and plans rewritten to take given recompute choices. */
#ifndef BALLAST_TRAINTEST_H
#define BALLAST_TRAINTEST_H

#include <stddef.h>
#include <stdint.h>

#include "testutil.h"

#define TRAIN_MAX_STEPS 512
#define TRAIN_MAX_STAGES 8

struct train_run {
    int status; /* exit status, -1 if killed */
    double seconds;
    char *out, *err;
};

/* `ballast plan --cluster CLUSTER FLAGS --quiet` into tmpdir/NAME, asserted to succeed; the
 * path (one of 8 buffers, reused in turn). */
const char *train_plan_cluster(const char *cluster, const char *flags, const char *name);

/* timeout LIMIT mpirun --allow-run-as-root --oversubscribe -np NP ballast train ARGS */
struct train_run train_exec(int np, int limit_s, const char *args);
void train_run_free(struct train_run *r);

/* A job running in the background (`timeout LIMIT mpirun ... ENV ballast train ARGS`), for a
 * test that acts on it while it runs: its output files, its status once it ended. */
struct train_job {
    char out[1024], err[1024], status[1024];
    int code;   /* its exit status, -1 until it ended */
    char *text; /* its stderr, once ended (train_job_wait) */
};

/* `env` goes before the executable (mpirun's "-x NAME=VALUE", or ""); files tmpdir/NAME.*. */
void train_job_start(struct train_job *j, const char *name, int np, int limit_s, const char *env,
                     const char *args);
/* Whether `text` came in its stdout within `within_s` seconds. */
int train_job_saw(const struct train_job *j, const char *text, double within_s);
/* Waits for its end (at most `limit_s` + 10 s: its own limit ends it first). */
void train_job_wait(struct train_job *j, int limit_s);
void train_job_free(struct train_job *j);
/* The pid of its rank `rank` (OMPI_COMM_WORLD_RANK) whose command line mentions `mark` (its
 * plan, say), or -1. */
int train_find_rank(int rank, const char *mark);
void train_sleep_s(double s);

struct train_metrics {
    int n_steps, n_stages;
    double loss[TRAIN_MAX_STEPS];
    double loss_scale[TRAIN_MAX_STEPS]; /* fp16 runs; 0 where the metrics have none */
    int skipped[TRAIN_MAX_STEPS];       /* fp16 runs: the step overflowed and was skipped */
    long long peak[TRAIN_MAX_STAGES], planned[TRAIN_MAX_STAGES];
    double recompute_ms[TRAIN_MAX_STAGES];
    char transport[64];
};

/* The file parsed (cJSON_Delete), or NULL if it is missing or not JSON. */
struct cJSON *train_json_read(const char *file);

/* 0, or -1 if the file is missing or not JSON. */
int train_metrics_read(const char *file, struct train_metrics *m);

/* A run that must succeed: `--plan PLAN --metrics tmpdir/NAME --quiet EXTRA` on np ranks;
 * asserts status 0, np stages, and each stage's peak within 2% of its planned bytes. */
int train_run_ok(int np, int limit_s, const char *plan, const char *extra, const char *metrics_name,
             struct train_metrics *m);

/* Plan tmpdir/NAME: plan `from` whose stage `s` looks planned from a profile that under-states
 * memory (every byte count zero), with memory_limit_bytes `limit`: consistent, fitting on
 * paper, and refused by the runtime's own sizes. Its path (test_write's buffer). */
const char *train_plan_understated(const char *from, int s, long long limit, const char *name);

/* Writes plan `to`: plan `from` whose layers take the given choices by global layer ("attn",
 * "mlp", "attn+mlp", "full"; NULL keeps), each stage's memory, recompute and stage time from
 * the cost model: a consistent plan that makes the runtime apply exactly these options. */
void train_plan_with_choices(const char *from, const char *to, const char *const *choice);

/* Plan `to`: plan `from` with the optimizer on the host in the stages of `mask` (bit s),
 * each with host_limit_bytes `limit` (0: its own host_memory_bytes), and every number the
 * cost model's. */
void train_plan_host_optimizer(const char *from, const char *to, unsigned mask, int64_t limit);
/* The same with each such stage's last layers from its `host_from`-th on hosting theirs (a
 * fraction of the optimizer; 0: all of them; a stage with no layer from there on keeps its
 * optimizer on the device). */
void train_plan_host_optimizer_from(const char *from, const char *to, unsigned mask,
                                    int host_from, int64_t limit);

/* Plan `to`: plan `from` with every layer that may (cost_whole_offload) keeping its tensors
 * in host memory between forward and backward, prefetched one layer ahead, over a 200 Gbit/s
 * host link, each stage's host limit its host memory, and every number the cost model's. */
void train_plan_offload(const char *from, const char *to);

/* The same steps with the same loss scales and skipped steps (fp16; the first difference
 * printed); 0 for no steps. */
int train_same_scaling(const struct train_metrics *a, const struct train_metrics *b);

/* A plan stage's "arena" (cJSON) made to lie: the kept object of `layer`'s micro-batch 1
 * moved onto micro-batch 0's bytes, its stated lifetime shrunk to one tick after the other's
 * and the lower bound restated, so that the plan's own checks pass and only a run with
 * --check-arena finds the two in use at once. 0, or -1 when there are no such objects. */
struct cJSON;
int train_arena_lie(struct cJSON *arena, int layer);

/* The same steps with bitwise equal losses (the first difference printed); 0 for no steps. */
int train_same_losses(const struct train_metrics *a, const struct train_metrics *b);

int train_files_equal(const char *a, const char *b);

/* Writes plan `plan` (size bytes): n_stages even CPU stages of 1 GiB, 2 micro-batches, 1F1B,
 * `ballast plan --method METHOD`, for a GPT of 2 blocks, n_embd 32, 2 heads, seq_len 16,
 * micro_batch 2, vocab_size `vocab`, `dtype`; its files named after `name`. Meant for a
 * suite's setup: a failure is printed, and shows as the runs on the plan failing. */
void train_plan_gpt(const char *name, int vocab, const char *dtype, int n_stages,
                    const char *method, char *plan, size_t size);

/* The same for the model file's text `model_text`. */
void train_plan_model(const char *name, const char *model_text, int n_stages,
                      const char *method, char *plan, size_t size);

#endif
