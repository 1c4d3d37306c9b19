/* What the framework writers (megatron.c, nemo.c, colossalai.c, flagscale.c) share: the job
 * export.c prepares, the model's and batch's settings as one list of items, the header, and
 * the per-rank Python file. */
#ifndef BALLAST_EXPORT_CORE_H
#define BALLAST_EXPORT_CORE_H

#include <stdio.h>

#include "export.h"
#include "framework.h"

struct export_job {
    const struct plan *p;          /* the plan as the framework runs it */
    const struct framework *f;
    const struct fw_settings *fs;  /* its settings, a stage each (a virtual stage each where a
                                      GPU holds several chunks: schedule.h) */
    int pp;                        /* pipeline ranks: GPUs of the pipeline */
    const struct fw_settings *ranks; /* each pipeline rank's one setting (fs with one chunk a
                                        GPU; with several, the chunks' setting merged) */
    const struct export_options *o;
    int per_rank;                  /* the stages' recompute settings differ: the Python file */
    int tp;                        /* stage 0's */
    int dp;                        /* replicas of the pipeline */
    int shard;                     /* the optimizer state sharded over dp */
    int global_batch;              /* micro-batches x micro-batch x dp */
    enum model_attention attention; /* what the layer costs assume */
    const char *offload;           /* Megatron-LM's activation offloading flags, or NULL */
    FILE *note;
};

/* Megatron-LM's argument names (without the dashes, '-' as '_') of the model's shape, batch,
 * dropout and precision, with their values ("" for a switch): one list every writer maps to
 * its own keys. */
#define EXPORT_ITEMS_MAX 40
struct export_item {
    const char *name;  /* num_layers, hidden_size, ..., bf16, fp16, initial_loss_scale */
    char value[32];
    int precision;     /* a precision item (FlagScale's precision: section) */
};
int export_items(const struct export_job *x, struct export_item *items);

/* "# Ballast plan ..." lines: what it is for, its step, the device of each pipeline rank. */
void export_header(FILE *f, const struct export_job *x, const char *comment);
/* The launch: how many GPUs, and that the framework takes dp from the world size. */
void export_launch(FILE *f, const struct export_job *x, const char *comment);
/* The per-rank Python file: each pipeline rank's TransformerConfig recompute fields, apply()
 * and the rank checks (megatron.c and nemo.c add their lines to call it). */
void export_stages_py(FILE *f, const struct export_job *x, const char *framework_commit);
/* A layout of the blocks as a list "[a, b, c]" (recompute 0) or recomputed blocks (1). */
void export_list(FILE *f, const struct export_job *x, int recompute);

int export_megatron(FILE *f, const struct export_job *x, struct err *e);
int export_nemo(FILE *f, const struct export_job *x, struct err *e);
int export_colossalai(FILE *f, const struct export_job *x, struct err *e);
int export_flagscale(FILE *f, const struct export_job *x, struct err *e);

/* Megatron-LM's fine-grained activation offloading of a plan that offloads (megatron_offload.c):
 * *ok 1 and its flags (one argument a line) in `text` when Megatron-LM can say the plan's
 * offloads, with what it runs differently said on `note`; *ok 0 with `why` when not. */
int megatron_offload_flags(const struct plan *p, FILE *note, char *text, size_t size, int *ok,
                           char *why, size_t why_size, struct err *e);

#endif
