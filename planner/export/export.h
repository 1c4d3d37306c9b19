/* The planner's output layer for frameworks: a plan as Megatron-LM, NeMo, ColossalAI or
 * FlagScale settings (`ballast export --to F`, `ballast plan --export F`).
 *
 * The plan's actions are read as the framework's settings (framework.h). When the framework
 * can say them exactly the export is the plan, with no note. When it cannot (a plan made for
 * Ballast or for another framework), the framework's best settings on the same split are
 * planned again from the plan's layer costs, and the note gives its step and every stage's
 * memory beside the plan's; a stage that cannot fit there is refused (ERR_NOFIT, the stage and
 * its bytes), and so is a split or tensor-parallel layout the framework cannot run
 * (ERR_INPUT). The launch is complete: the model's shape, micro-batch size, global batch,
 * sequence length, dropout 0, precision (bf16, or fp16 with dynamic loss scaling), parallel
 * sizes, the attention kernel the layer costs assume, recompute, offload and optimizer
 * settings, each key quoted with the framework's source in tests/data/export_keys.json.
 * Megatron-LM and NeMo with settings that differ per stage also get a small Python file that
 * sets each pipeline rank's TransformerConfig fields, and the lines that call it. */
#ifndef BALLAST_EXPORT_H
#define BALLAST_EXPORT_H

#include <stdio.h>

#include "devices.h"
#include "plan.h"

struct export_options {
    const char *to;                    /* a framework name (framework.h) */
    const struct device_table *devices; /* the precision and kernel checks; NULL: none */
    FILE *note;                        /* the comparison and what differs (standard error) */
    FILE *stages;                      /* per-rank settings: where the Python file goes; NULL:
                                          a per-rank export is refused */
    const char *stages_module;         /* its module name, as the added lines import it */
    const char *plan_name;             /* the plan file, for the header ("" when none) */
};

/* The plan as framework o->to runs it. ERR_INPUT for an unknown target, a plan the framework
 * cannot run (its split, tp, precision or attention kernel on a stage's device), ERR_NOFIT
 * when a stage does not fit as the framework runs it. Nothing is written on failure. */
int planner_export(FILE *out, const struct plan *p, const struct export_options *o,
                   struct err *e);
/* The same for the pipelines of a replicas file: pipelines alike (devices, split, tensor
 * parallelism, micro-batches) are one pipeline's data-parallel replicas; others are refused,
 * naming the pipeline and what differs. */
int planner_export_replicas(FILE *out, const struct plan *plans, int n,
                            const struct export_options *o, struct err *e);

#endif
