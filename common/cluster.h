/* The cluster file (ballast-cluster/1): the pipeline's stages, each a device with its memory
 * and its profile, the schedule and the micro-batches per step. */
#ifndef BALLAST_CLUSTER_H
#define BALLAST_CLUSTER_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>

#include "err.h"
#include "profile.h"
#include "schedule.h"

#define CLUSTER_PATH_MAX 4096
#define CLUSTER_STAGES_MAX 4096


struct cluster_stage {
    char device[PROFILE_NAME_MAX];
    int64_t memory_bytes;
    int profile; /* index into cluster.profiles */
    int first, last; /* global layer indices, inclusive */
    struct link link; /* to the next stage; overrides the cluster's */
    int64_t host_memory_bytes; /* host memory it may offload to; 0: no offload */
    struct link host_link;     /* its own, else its profile's, else devices.json's */
    /* Tensor and data parallelism (cost.h cost_group): tp GPUs of the device in one node,
     * the stage replicated dp times; 1 and 1 unless given. */
    int tp, dp;
    int per_node;          /* GPUs of the device in a node; 0: not given */
    struct link node_link; /* between its tp GPUs */
    struct link dp_link;   /* to its replicas: the cluster's dp_link, else its link (the
                              last stage: the cluster's link); set by cluster_group_apply */
};

struct cluster {
    enum schedule schedule;
    int schedule_auto;  /* "schedule": "auto": the planner picks (schedule then says 1f1b) */
    int virtual_stages; /* interleaved's model chunks a GPU; 0: not given */
    int layers_given;   /* the stages give their "layers" */
    int micro_batches;
    int64_t reserve_bytes;
    struct link link; /* default link between stages */
    int n_stages;
    struct cluster_stage *stages;
    int n_profiles; /* distinct profile files */
    struct profile *profiles;
    struct model model; /* the model every profile describes */
    int n_layers;
    int shard_optimizer;  /* "shard_optimizer": optimizer state sharded over dp (ZeRO-1) */
    struct link dp_link;  /* between replicas; absent: each stage's link */
    /* "dp_bucket_bytes": the gradient bucket of the replicas' reduction (planner/sim/sim.h;
     * absent: COST_DP_BUCKET_BYTES_DEFAULT; 0: one reduction after the last backward) */
    int64_t dp_bucket_bytes;
    /* per profile, per layer: the gradient bytes on each GPU of its stages' tp group,
     * all-reduced over dp replicas (NULL when the profile's stages have tp = dp = 1) */
    int64_t **grad_bytes;
    const char *file; /* the file it was read from, for messages (the caller's string, not
                         copied; NULL: built in memory) */
};

/* Reads and validates a cluster and the profiles it names (paths relative to the cluster
 * file). Stages without "layers" get cluster_default_split. On failure nothing is left
 * allocated. */
int cluster_load(const char *file, struct cluster *c, struct err *e);
/* The same from the parsed file `root` (profile paths relative to `file`). */
int cluster_parse(const cJSON *root, const char *file, struct cluster *c, struct err *e);
void cluster_free(struct cluster *c);

const struct profile *cluster_stage_profile(const struct cluster *c, int stage);
/* The path of a profile named `rel` in `cluster_file`: as written when absolute, else
 * relative to the cluster file's folder. */
void cluster_profile_path(const char *cluster_file, const char *rel,
                          char out[CLUSTER_PATH_MAX]);
/* For offload or a host optimizer: every stage with host_memory_bytes has a host link, and
 * some stage has host_memory_bytes (ERR_INPUT naming the file and the stage otherwise). */
int cluster_check_host_memory(const struct cluster *c, struct err *e);
/* Warns on `out`, a line per stage, when a CPU stage's measured profile ran more threads
 * (provenance.threads) than a rank of this cluster gets by default: the cores of the machine
 * (the profile's provenance.cores_online, else this host's) shared by the cluster's CPU
 * stages, at least 1, as `ballast train` shares a host among its ranks. The cluster file
 * does not say which host a stage runs on, so its CPU stages are taken to share one. `root`
 * is the file the cluster was parsed from (the profile paths as it writes them).
 * Returns the number of lines written. */
int cluster_warn_cpu_threads(const cJSON *root, const struct cluster *c, FILE *out);
/* The link from `stage` to `stage + 1`: the stage's own, else the cluster's, else free. */
static inline struct link cluster_link(const struct cluster *c, int stage)
{
    return c->stages[stage].link.present ? c->stages[stage].link : c->link;
}

/* cluster_group.c: a stage's "tp", "dp", "per_node" and "node_link"; the cluster's
 * "shard_optimizer" and "dp_link"; then (once every stage is read) the checks (tp divides the
 * heads and fits a node, one dp for the pipeline, one tp per device) and every grouped
 * profile's layers replaced by their costs on each GPU of the group. */
int cluster_group_read_stage(const cJSON *obj, const char *file, const char *path,
                             struct cluster_stage *st, struct err *e);
int cluster_group_read(const cJSON *root, const char *file, struct cluster *c, struct err *e);
int cluster_group_apply(struct cluster *c, const char *file, struct err *e);
/* The gradient bytes of every stage even at tp 1 and dp 1 (a pipeline reducing them with other
 * pipelines, replicas.h); nothing when cluster_group_apply made them. */
int cluster_group_grads(struct cluster *c, struct err *e);
void cluster_group_free(struct cluster *c);
/* Heterogeneous replicas: a cluster file may list "pipelines", each {"stages", and its own
 * "micro_batches", "link", "reserve_bytes" if it gives them} with the file's other members
 * shared, instead of "stages". The count (0 for a file with "stages"), and pipeline k as a
 * cluster of its own (the file itself when it gives "stages"): cluster_pipelines.c. */
int cluster_pipeline_count(const cJSON *root, const char *file, int *n, struct err *e);
int cluster_parse_pipeline(const cJSON *root, const char *file, int k, struct cluster *c,
                           struct err *e);
/* cluster_parse's answer to a file without "stages", or with "pipelines" too. */
int cluster_group_no_stages(const cJSON *root, const char *file, struct err *e);

/* Whether tp GPUs may split the model's layers: tp divides the heads (and a Llama's key/value
 * heads); a custom model has none known. `where` names the field in the message. */
int cluster_check_tp(const struct model *m, int tp, const char *where, struct err *e);
/* Profile p (of one GPU) as each GPU of a tensor-parallel group of tp sees it, nothing
 * sharded (an estimated profile for a (device, tp) pair): its "tp" becomes tp. ERR_INPUT when
 * tp does not divide the model's heads, or p is already a group's. */
int cluster_group_profile(struct profile *p, int tp, const struct link *node_link,
                          struct err *e);
/* The group whose costs profile k's layers hold in a loaded cluster (cost.h cost_group: its
 * first stage's tp, over the profile's own unless `one_gpu`, the stage's dp and node link,
 * the cluster's shard_optimizer, model and dtype); returns whether the cluster is grouped at
 * all (some stage has tp or dp above 1: then cluster_load applied the groups). */
struct cost_group;
int cluster_profile_group(const struct cluster *c, int k, int one_gpu, struct cost_group *g);
/* Profile p's layers as each GPU of group g sees them (cost_group_layer). */
void cluster_group_layers(struct profile *p, const struct model *m, const struct cost_group *g);

/* Gradient bytes on each GPU of `stage` for its layers first..last, reduced over dp. */
int64_t cluster_grad_bytes(const struct cluster *c, int stage, int first, int last);
/* Their all-reduce over the stage's dp replicas on its dp_link (cost_dp_allreduce_ms). */
double cluster_allreduce_ms(const struct cluster *c, int stage, int first, int last);

/* Even split of n layers over S stages: stage s gets [s*n/S, (s+1)*n/S - 1]. */
void cluster_even_split(int n_layers, int n_stages, int stage, int *first, int *last);
/* The split of a cluster whose stages give no "layers", as the frameworks deal a model: its
 * B blocks evenly, floor(B / S) to each stage and one more to each of the B mod S stages in
 * the middle (the first and last stages hold the embedding and the head besides). A custom
 * model's layers (or a model with fewer blocks than stages) are split evenly. */
void cluster_default_split(const struct model *m, int n_layers, int n_stages, int stage,
                           int *first, int *last);

#endif
