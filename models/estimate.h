/* Estimated profiles: per-layer times from datasheet figures (a roofline per operation) and
 * memory from the size functions the runtime allocates with. */
#ifndef BALLAST_ESTIMATE_H
#define BALLAST_ESTIMATE_H

#include "devices.h"
#include "model.h"
#include "profile.h"

/* Every layer of `m` named, with its memory from the size functions the runtime allocates
 * with (state and its split, activations, checkpoint, output, workspace, recompute options'
 * bytes) and no times: the part of a profile no device changes. Into `out` (the caller's to
 * profile_free). */
int estimate_memory(const struct model *m, struct profile *out, struct err *e);
/* Fills `out` (owned by the caller: profile_free) with one micro-batch of every layer of `m`
 * on device `d`, marked estimated. */
int estimate_profile(const struct device_table *t, const struct device_spec *d,
                     const struct model *m, struct profile *out, struct err *e);

/* Turns an estimated profile of a GPT or Llama `m` on device `d` into what `framework`
 * (megatron, nemo, colossalai) keeps: its attention kernel, its loss's logits and its recompute
 * modules (ERR_INPUT for another name or a custom model). */
int estimate_for_framework(const struct device_table *t, const struct device_spec *d,
                           const struct model *m, const char *framework, struct profile *p,
                           struct err *e);

/* Floating-point operations of one layer's forward and backward for one micro-batch, as the
 * runtime performs them (also the numerator of MFU). */
void estimate_layer_flops(const struct model *m, int layer, double *fwd, double *bwd);
/* The same on each of tp GPUs of a tensor-parallel group (Megatron-LM's, with sequence
 * parallelism): tp = 1 is estimate_layer_flops. */
void estimate_layer_flops_tp(const struct model *m, int layer, int tp, double *fwd,
                             double *bwd);

/* An estimated profile made a group's (cluster_group_profile: its memory per GPU, "tp") with
 * each layer's times estimated per degree: the roofline of each GPU's share of every operation
 * (heads, GEMM columns or rows, tokens / tp), which loses to op overheads and memory bandwidth
 * what tp_efficiency could only guess, plus the group's collectives over `node_link`
 * (cost.h); recompute options the same way (`framework`: a framework's modules, --for,
 * scaled as their layer's forward); a split backward's weight pass (split_ms) and the
 * optimizer's steps on each GPU's share. */
int estimate_tp_times(const struct device_table *t, const struct device_spec *d,
                      const struct link *node_link, int framework, struct profile *p,
                      struct err *e);

/* The share of a layer's backward FLOPs that its weight-gradient pass takes when the backward
 * is split (sizes_wgrad_tensors): a block's matrix products' weight gradients; 0 for the
 * embedding and the head, which do not split. */
double estimate_wgrad_share(const struct model *m, int layer);

#endif
