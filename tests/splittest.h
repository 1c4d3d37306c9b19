/* The split backward of a layer (schedule.h's zb-h1 and v-half) against its fused backward,
 * on one backend: two micro-batches' backwards whole, against their two input-gradient
 * passes followed by their two weight passes (the order a split schedule runs them). */
#ifndef BALLAST_SPLITTEST_H
#define BALLAST_SPLITTEST_H

#include "backend.h"

/* v: a layer after its forward (its params, grads, kept and ws allocated, the grads zero);
 * dout, dinp: its workspace indices of the output's and the input's gradients; g0, g1: the
 * two output gradients. 1 when the gradients and both input gradients are bitwise the same
 * and the weight pass did the parameter products' share (the split's B alone leaves those
 * gradients as they were); 0 otherwise (printed). */
int split_matches_fused(struct backend *be, struct layer_view *v, int dout, int dinp,
                        const float *g0, const float *g1);

#endif
