/* Checkpoints: every stage's state (stage_state_get: the persistent arena, weights,
 * gradients of the last step, AdamW m and v, and with the optimizer on the host its mirror)
 * with the step reached, in DIR:
 *
 *   DIR/stage-<s>-step-<N>.ckpt   one per stage: a fixed header (struct ckpt_header: model,
 *                                 stage split, micro-batches, seed, data identity, step),
 *                                 the arena, and an FNV-1a 64 checksum of both; written to a
 *                                 temporary file, fsynced and renamed
 *   DIR/checkpoint.json           {"format": "ballast-checkpoint/1", "step": N, "n_stages",
 *                                 "files", and for an fp16 model "loss_scale": {"scale",
 *                                 "growth_tracker", "hysteresis_tracker", "skipped_steps"}
 *                                 (lossscale.h: the same on every rank)}: written (atomically)
 *                                 by rank 0 only after every stage's file of step N is in
 *                                 place; then older files are removed.
 * No file holds a NaN or an infinity in its weights or optimizer state: a stage's file is
 * refused on the way in and not written on the way out (naming the tensor). The gradients are
 * not checked: they are the last step's scratch (an fp16 step skipped for an overflow leaves
 * infinities there) and every step starts them from zero.
 * A crash at any point leaves the manifest naming a complete set of files.
 *
 * The data source is a pure function of (seed, step, micro-batch), so the step is the data
 * position. What the training arithmetic depends on must match to resume (model, stage split,
 * micro-batches, seed, data); the recompute sets and the schedule may differ, since results
 * are bitwise the same with any of them. */
#ifndef BALLAST_CKPT_H
#define BALLAST_CKPT_H

#include <stdint.h>

#include "data.h"
#include "err.h"
#include "lossscale.h"
#include "model.h"
#include "stage.h"

struct ckpt_identity {
    struct model model;
    int n_stages, stage, first, last, micro_batches;
    uint64_t seed;
    int data_kind;
    uint64_t data_bytes, data_hash;
    int64_t section_bytes, persistent_bytes;
};

void ckpt_identity_of(struct ckpt_identity *id, const struct stage_runner *r,
                      const struct data_source *d, uint64_t seed);

/* Before training: creates `dir` if missing and checks that files can be written there and
 * that its manifest, if present, can be replaced (ERR_INPUT naming what is wrong). */
int ckpt_check_dir(const char *dir, struct err *e);
int ckpt_write_stage(const char *dir, const struct ckpt_identity *id, int64_t step,
                     struct stage_runner *r, struct err *e);
/* ls: the loss scaler's state (NULL: none, fp32 and bf16). */
int ckpt_write_manifest(const char *dir, int64_t step, int n_stages, const struct lossscale *ls,
                        struct err *e);
/* Once every stage's file of step `keep` is in place and named by the manifest: removes this
 * stage's files of other steps, and its temporaries of any step (left by a write that was
 * killed: none of this stage's is under way now, and a resumed run may never write that step
 * again). */
void ckpt_remove_older(const char *dir, int stage, int64_t keep);
/* Removes this stage's file of `step`: a checkpoint that did not complete on every stage, which
 * no manifest names. */
void ckpt_remove_step(const char *dir, int stage, int64_t step);

/* *has_ls: whether the manifest has "loss_scale", then in *ls. */
int ckpt_read_manifest(const char *dir, int64_t *step, int *n_stages, struct lossscale *ls,
                       int *has_ls, struct err *e);
/* Refuses (ERR_INPUT, naming the file and the numbers) a file that is truncated, damaged
 * (checksum), or written for another model, stage split, micro-batch count, seed or data. */
int ckpt_read_stage(const char *dir, const struct ckpt_identity *id, int64_t step,
                    struct stage_runner *r, struct err *e);

#endif
