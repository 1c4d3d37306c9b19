/* Dynamic loss scaling for fp16 models, as the frameworks run it. The step's loss is
 * multiplied by `scale` before the backward (so fp16 activation gradients keep their small
 * values); the fp32 parameter gradients are multiplied by 1/scale before the optimizer; a NaN
 * or an infinity in any rank's gradients (or loss) is an overflow: every rank skips the step
 * (no optimizer update, AdamW's step count stays) and the scale is updated:
 *
 *   overflow   growth_tracker = 0; hysteresis_tracker -= 1; when it is <= 0 the scale
 *              becomes max(scale x backoff, min) -- and when the scale is at min already,
 *              the run stops: nothing smaller is allowed, and gradients still overflow
 *   no overflow  growth_tracker += 1; when it reaches window: growth_tracker = 0,
 *              hysteresis_tracker = hysteresis, scale x= growth (kept when the product is
 *              not finite)
 *
 * which is Megatron-LM's DynamicGradScaler.update (megatron/core/optimizer/grad_scaler.py,
 * NVIDIA/Megatron-LM at 00caa53a), with DeepSpeed's stop at the minimum (its DynamicLossScaler
 * raises "Current loss scale already at minimum", deepspeed/runtime/fp16/loss_scaler.py,
 * microsoft/DeepSpeed at 03365187) and PyTorch's guard on growth (_amp_update_scale_, which
 * keeps the scale when scale x growth is not finite). With hysteresis 1 it is PyTorch's
 * GradScaler step for step. The scale is fp32, each product rounded to fp32, as all three keep
 * it; 1/scale is computed in double and rounded to fp32 (GradScaler's and Megatron's
 * inv_scale). Defaults: DeepSpeed's fp16 section (initial_scale_power 16, loss_scale_window
 * 1000, hysteresis 2, min_loss_scale 1) with factors 2 and 0.5. */
#ifndef BALLAST_LOSSSCALE_H
#define BALLAST_LOSSSCALE_H

#include <stdint.h>

#include "err.h"

struct lossscale_config {
    double initial, min, growth, backoff;
    int64_t window; /* growth interval: steps without an overflow before the scale grows */
    int64_t hysteresis; /* overflows before the scale backs off */
};

#define LOSSSCALE_DEFAULTS {65536.0, 1.0, 2.0, 0.5, 1000, 2}

/* Everything a resume needs (checkpoints carry it). */
struct lossscale {
    float scale;
    int64_t growth_tracker, hysteresis_tracker;
    int64_t skipped; /* steps skipped over the whole run, resumed ones included */
};

enum lossscale_verdict {
    LOSSSCALE_STEP,   /* no overflow: the optimizer steps */
    LOSSSCALE_SKIP,   /* overflow: the step is skipped */
    LOSSSCALE_AT_MIN, /* overflow with the scale at its minimum: the run stops */
};

/* ERR_INPUT naming the option (the train command's: --initial-loss-scale, --min-loss-scale,
 * --loss-scale-growth, --loss-scale-backoff, --loss-scale-window, --hysteresis) and the
 * numbers, when a setting is out of range: initial and min in (0, FLT_MAX] with min <=
 * initial, growth > 1 and finite, backoff in (0, 1), window and hysteresis >= 1. */
int lossscale_check(const struct lossscale_config *c, struct err *e);
void lossscale_init(struct lossscale *s, const struct lossscale_config *c);
/* The update above, after a step whose gradients overflowed (`overflow`) or not. */
enum lossscale_verdict lossscale_update(struct lossscale *s, const struct lossscale_config *c,
                                        int overflow);
/* 1/scale, rounded to fp32. */
float lossscale_inverse(const struct lossscale *s);

#endif
