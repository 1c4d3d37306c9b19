/* Estimated profiles: per-layer times from datasheet figures (a roofline per operation) and
 * memory from the size functions the runtime allocates with. */
#ifndef BALLAST_ESTIMATE_H
#define BALLAST_ESTIMATE_H

#include "devices.h"
#include "model.h"
#include "profile.h"

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
/* The share of a layer's backward FLOPs that its weight-gradient pass takes when the backward
 * is split (sizes_wgrad_tensors): a block's matrix products' weight gradients; 0 for the
 * embedding and the head, which do not split. */
double estimate_wgrad_share(const struct model *m, int layer);

#endif
