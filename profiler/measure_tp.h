/* Measured profiles for a (device, tp) pair (`ballast profile --device cpu|cuda:N --tp T`):
 * each GPU's share of every layer of a tensor-parallel group of T, as Megatron-LM splits a
 * layer with sequence parallelism (cost.h cost_group), run on the device through the backend
 * table (the kernels `ballast train` runs), each of its forward, backward and recompute
 * options timed as one span, medians:
 *   a block   its norms on its T/t tokens, the q/k/v and MLP input GEMMs on every token for
 *             its columns (3C/t; Llama (NH + 2 KV) hs / t and 2F/t), the attention of its NH/t
 *             heads (KV/t), the output and MLP projections on its rows (C/t, 4C/t or F/t);
 *   the head  its norm on T/t tokens, the logits of its V/t words and their cross-entropy;
 *   the embedding  the lookup of every token (its part of the vocabulary's rows), as on one
 *             GPU;
 * the AdamW steps on the GPU's share of each layer's parameters (on the device, and by the CPU
 * backend on the host's cores). Each pass of a layer adds its collectives (a block's 2
 * all-gathers and 2 reduce-scatters, the embedding's and head's 1, of b*s*h elements):
 * measured over NCCL across the node's GPUs when the caller could (collective_ms), else over
 * `node_link` (cost.h cost_tp_collective_ms). Memory per GPU is the size functions' as the
 * cost model divides it (estimate_memory, cluster_group_profile): a share is not a layer the
 * runtime lays out and scans. */
#ifndef BALLAST_MEASURE_TP_H
#define BALLAST_MEASURE_TP_H

#include "measure.h"

struct measure_tp_options {
    int tp;
    struct link node_link;  /* the collectives' link when not measured */
    double collective_ms;   /* one collective of b*s*h measured (cuda_tp_collectives_ms, the
                               mean of an all-gather and a reduce-scatter); < 0: node_link's */
    int host_threads;       /* the host AdamW's threads */
};

/* Fills p->layers (p's device, host link and provenance, from hostinfo_open, stay), "tp"
 * and estimated 0. ERR_INPUT when tp does not divide the heads. */
int measure_tp_profile(struct backend *be, const struct model *m,
                       const struct measure_tp_options *to, const struct measure_options *o,
                       struct profile *p, struct err *e);

#endif
