/* One-line planning: `ballast plan --model llama2-7b --gpus 8xA100-40GB,8xV100-32GB
 * --global-batch 512` writes the pool cluster that question stands for (a "pool" of the GPUs
 * with devices.json's memory, links from configs/links.json, host memory per node shared by
 * its GPUs) and a profile per device, estimated from the datasheet unless --profile gives one,
 * beside the plan; `ballast plan` then plans that file as it plans any pool, so the answer is
 * the one the same cluster written by hand gets, and the file can be edited and planned again
 * with --cluster. */
#ifndef BALLAST_PLAN_GPUS_H
#define BALLAST_PLAN_GPUS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "err.h"

#define PLAN_GPUS_KINDS_MAX 6 /* pool.h POOL_KINDS_MAX */

struct plan_gpus {
    const char *model;        /* --model: a name in configs/models or a model file */
    const char *gpus;         /* --gpus N1xDEVICE1,N2xDEVICE2 */
    const char *nodes;        /* --nodes: nodes per kind, or one count for every kind */
    const char *node_link;    /* --node-link: a preset or a rate, one for all or one per kind */
    const char *network;      /* --network: between nodes and replicas */
    const char *host_memory;  /* --host-memory: per node, shared by its GPUs */
    const char *reserve;      /* --reserve: per GPU */
    const char *save_cluster; /* --save-cluster: where the cluster goes */
    const char *profiles[PLAN_GPUS_KINDS_MAX]; /* --profile, each given once */
    int n_profiles;
    long seq_len; /* --seq-len; 0: the model's */
};

/* Reads plan option argv[*i] if it is one of one-line planning's (*i moves past its value):
 * returns 1 if taken, with *rc ERR_OK or a usage error's status (printed); 0 if not one. */
int plan_gpus_option(int argc, char **argv, int *i, struct plan_gpus *g, int *rc);
/* Whether any option of one-line planning was given. */
int plan_gpus_given(const struct plan_gpus *g);
/* Writes the cluster for `global_batch` samples a step and its profiles, beside `plan_file`
 * (NULL: in the current folder, named after the model and the GPUs) or at --save-cluster;
 * prints where to `out` and sets `cluster` to its path. ERR_INPUT for unknown names (the
 * message lists the known ones), counts that cannot make a pipeline (the message says why). */
int plan_gpus_write(const struct plan_gpus *g, long global_batch, const char *plan_file,
                    char *cluster, size_t cap, struct err *e);

/* "cluster: FILE (profiles in ...); edit it and plan it again: ..." */
void plan_gpus_print_written(FILE *f, const char *cluster);

#endif
