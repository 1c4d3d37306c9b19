/* A pool of GPUs read once (issue 31): the pool file's kinds, each kind's profile loaded once
 * and made again in memory at every micro-batch size searched, and any candidate pipeline's
 * cluster built from them, without files or JSON. What the pool search (pool.c, pool_mixed.c)
 * plans and bounds comes from here.
 *
 * A pool file is a cluster file with "pool" (a list of kinds: "device", "count", "per_node"?,
 * "memory_bytes", "profile", "node_link"?, "host_link"?, "node_host_memory_bytes"?,
 * "tp_profiles"?: [{"tp", "profile"}], each tp from 2 to per_node once) and
 * "global_batch" (samples a step, all replicas together) instead of "stages"; optional "dp"
 * (the one dp of identical replicas searched) and "micro_batch_sizes" (each dividing the
 * global batch; absent: the model's own). Its other members are a cluster's. */
#ifndef BALLAST_POOL_MODEL_H
#define BALLAST_POOL_MODEL_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "cluster.h"
#include "err.h"
#include "planner.h"
#include "profile.h"

#define POOL_KINDS_MAX 6
/* Most "micro_batch_sizes". */
#define POOL_SIZES_MAX 16

/* Most "tp_profiles" of a kind. */
#define POOL_TP_PROFILES_MAX 16

struct pool_model_kind {
    char device[PROFILE_NAME_MAX];
    int64_t count, per_node; /* per_node: count when the file gives none */
    /* "tp_profiles": a profile made for (the kind, tp) per tp given (owned), taken by its
     * stages of that tp at the model's micro-batch size; stages of another tp or size take
     * the kind's profile and its tp_efficiency */
    int n_tp_profiles;
    int tp_of[POOL_TP_PROFILES_MAX];
    const char *tp_path[POOL_TP_PROFILES_MAX]; /* as written (in the parsed file, while read) */
    struct profile tp_profile[POOL_TP_PROFILES_MAX];
    /* one stage of the kind at tp 1, dp 1 as the cluster file reads it (its host link
     * resolved once; host_memory_bytes a GPU's share of node_host_memory_bytes) */
    struct cluster_stage stage;
    /* per size index: the costs of one GPU of the kind (owned) */
    struct profile profile[POOL_SIZES_MAX];
};

struct repart_cache;

struct pool_model {
    const char *file;
    int K;
    struct pool_model_kind kind[POOL_KINDS_MAX];
    int64_t global_batch, only_dp; /* only_dp: the file's "dp", 0 when absent */
    int n_sizes, sizes[POOL_SIZES_MAX];
    int model_size; /* the index of the model's own micro-batch size in sizes, -1: none */
    struct model model; /* at the model's own micro-batch size */
    enum schedule schedule;
    int64_t reserve_bytes;
    struct link link, dp_link;
    int shard_optimizer;
    int64_t dp_bucket_bytes;
    /* --repartition's range costs, kept for every pipeline planned in the pool (owned) */
    struct repart_cache *ranges;
};

/* Reads and checks the pool of the parsed file `root` (read from `file`), loading each kind's
 * profile once; with "micro_batch_sizes", each kind's profile at each size is made in memory
 * (microbatch.c's rules; o->estimate remakes estimated ones). ERR_INPUT naming the field and
 * the numbers for a bad pool. `deadline` (CLOCK_MONOTONIC seconds, INFINITY: none) stops the
 * remaking of profiles with ERR_NOFIT saying so. */
int pool_model_load(const cJSON *root, const char *file, const struct plan_options *o,
                    double deadline, struct pool_model *pm, struct err *e);
void pool_model_free(struct pool_model *pm);

/* The micro-batches of a step at size index i: global_batch / sizes[i]. */
int64_t pool_model_batches(const struct pool_model *pm, int size);

/* One pipeline of a candidate: at micro-batch size index `size`, stages[k] stages of tp[k]
 * GPUs of kind k (kind after kind, in the pool's order), replicated dp times, M micro-batches
 * the most a replica takes. reduce_alone: its gradients are reduced even at tp 1 and dp 1 (it
 * is one of several pipelines reducing together, replicas.h). */
struct pool_pipe {
    int size, dp, M;
    int tp[POOL_KINDS_MAX], stages[POOL_KINDS_MAX];
    int reduce_alone;
};

/* The pipeline's cluster, as the cluster file listing those stages would read (each stage
 * takes its kind's members with "tp" and "dp"; layers evenly split). ERR_INPUT when a tp
 * does not suit the model (cluster_group_apply's message). */
int pool_model_cluster(const struct pool_model *pm, const struct pool_pipe *p,
                       struct cluster *c, struct err *e);

#endif
