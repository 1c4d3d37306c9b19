/* The pipeline schedule as data: the order in which each GPU of a pipeline runs the passes of
 * its model chunks in one step. The simulator (planner/sim/sim.c) and the executor
 * (runtime/exec.c) both run what schedule_ops says, and the activation slots of every stage
 * are what schedule_in_flights counts by replaying that order.
 *
 * A pipeline of p GPUs holds v model chunks on each GPU: p x v virtual stages, numbered in
 * model order (the plan's stages). A micro-batch runs forward through every virtual stage
 * and backward in reverse; a pass of a chunk is a forward (F), a backward (B), or, where the
 * backward is split, its input-gradient pass (B) and its weight-gradient pass (W).
 *
 *   1f1b         v = 1. GPU s: min(p-s-1, M) warm-up forwards, then one forward and one
 *                backward alternately, then the remaining backwards.
 *   gpipe        v = 1. Every forward, then every backward.
 *   interleaved  Megatron-LM's interleaved 1F1B: virtual stage c*p + s on GPU s (chunk c).
 *                The forwards go in groups of p micro-batches, each group through chunk 0,
 *                then chunk 1, ...; the backwards likewise with the chunks reversed; GPU s
 *                runs (v-1)*p + 2(p-s-1) warm-up forwards, then alternates. With M not a
 *                multiple of p the order is that of the next multiple with the missing
 *                micro-batches' passes left out (a sub-order of a deadlock-free order is
 *                one). v = 1 is 1f1b.
 *   zb-h1        v = 1, the backward split (Qi et al., "Zero Bubble Pipeline Parallelism",
 *                ICLR 2024, the handcrafted ZB-H1): GPU s runs 1F1B's warm-up, then for each
 *                micro-batch i a forward, B of i and W of i - s, then the W passes left.
 *                The critical path runs through B alone and W fills the bubble: with equal
 *                F, B and W the bubble is (p-1) passes, a third of 1F1B's 3(p-1); every GPU
 *                holds p micro-batches (1F1B's first GPU).
 *   v-half       v = 2 in a V: virtual stage s and 2p-1-s on GPU s, the backward split. The
 *                order is the one a list scheduler makes with every pass one unit long:
 *                whenever a GPU is free it runs a B whose input is there, else a forward
 *                (of its return chunk first), else a W; virtual stage j holds at most
 *                floor((2p-j)/2) + 1 micro-batches, about half of what 1F1B over 2p stages
 *                holds, so a GPU holds about (p+2)/2 full stages' activations where 1F1B's
 *                first holds p (Qi et al., "Pipeline Parallelism with Controllable Memory",
 *                NeurIPS 2024, call this family V-Half).
 *
 * On every chunk the forwards, the B passes and the W passes each run in micro-batch order
 * 0..M-1, so gradients accumulate in the same order under every schedule and on any number
 * of stages: training is bitwise the same. */
#ifndef BALLAST_SCHEDULE_H
#define BALLAST_SCHEDULE_H

#include "err.h"

enum schedule {
    SCHEDULE_1F1B,
    SCHEDULE_GPIPE,
    SCHEDULE_INTERLEAVED,
    SCHEDULE_ZB_H1,
    SCHEDULE_V_HALF,
    SCHEDULE_KINDS
};

/* Most model chunks a GPU holds (interleaved's virtual_stages). */
#define SCHEDULE_CHUNKS_MAX 8

enum schedule_pass { SCHEDULE_F = 0, SCHEDULE_B = 1, SCHEDULE_W = 2 };

struct schedule_op {
    int pass;  /* SCHEDULE_F, SCHEDULE_B (the backward, or its input-gradient pass), _W */
    int micro;
    int chunk; /* of the GPU's chunks, 0 .. v-1 */
};

/* A pipeline: p GPUs with v chunks each, M micro-batches a step. */
struct schedule_shape {
    enum schedule kind;
    int gpus, chunks, micro_batches;
};

static inline struct schedule_shape schedule_shape_of(enum schedule kind, int gpus, int chunks,
                                                      int micro_batches)
{
    return (struct schedule_shape){kind, gpus, chunks, micro_batches};
}

const char *schedule_name(enum schedule s);
/* "1f1b", "gpipe", "interleaved", "zb-h1", "v-half"; -1 for anything else. */
int schedule_parse(const char *text, enum schedule *out);
/* The names, comma-separated, for messages. */
const char *schedule_names(void);

/* Whether the schedule splits the backward into B and W passes. */
int schedule_splits(enum schedule s);
/* Chunks a GPU holds: v for interleaved (1 .. SCHEDULE_CHUNKS_MAX), 2 for v-half, else 1. */
int schedule_fixed_chunks(enum schedule s, int virtual_stages);
/* ERR_INPUT, saying why, unless p >= 1, M >= 1 and v is the schedule's. */
int schedule_check(const struct schedule_shape *sh, struct err *e);

int schedule_virtual_stages(const struct schedule_shape *sh);
/* The GPU of virtual stage j, and its chunk there. */
int schedule_gpu(const struct schedule_shape *sh, int j, int *chunk);
/* The virtual stage of GPU g's chunk c. */
int schedule_vstage(const struct schedule_shape *sh, int g, int c);

/* Passes each GPU runs in a step: v x M x (2, or 3 when the backward is split). */
int schedule_op_count(const struct schedule_shape *sh);
/* GPU g's passes in order into ops[0 .. schedule_op_count - 1]. ERR_FAIL when out of memory
 * (v-half's scheduler). */
int schedule_ops(const struct schedule_shape *sh, int g, struct schedule_op *ops, struct err *e);
/* Every GPU's ops, GPU g's at all + g x schedule_op_count (v-half's scheduler runs once). */
int schedule_all_ops(const struct schedule_shape *sh, struct schedule_op *all, struct err *e);
/* Per virtual stage, the most micro-batches whose forward has run there and whose last pass
 * there (W where the backward is split, else B) has not, at any point of schedule_ops' order:
 * the activation slots it needs. out has schedule_virtual_stages entries. */
int schedule_in_flights(const struct schedule_shape *sh, int *out, struct err *e);

/* The same count for stage `stage` of a schedule of one chunk a GPU (1f1b, gpipe, zb-h1;
 * interleaved is 1f1b then); -1 for v-half or when out of memory. */
int schedule_in_flight(enum schedule kind, int n_stages, int stage, int micro_batches);

/* 1F1B and GPipe, closed form, for the simulator's fast path (which walks the order without
 * holding it); schedule_ops gives the same ops. */

/* Forwards before the stage's first backward: the micro-batches on their way to the last
 * stage (1F1B), or all of them (GPipe). Never more than the stage before's (the simulator's
 * order relies on it). */
static inline int schedule_warmup(enum schedule sch, int n_stages, int stage, int micro_batches)
{
    int w = sch == SCHEDULE_GPIPE ? micro_batches : n_stages - stage - 1;
    return w < micro_batches ? w : micro_batches;
}

/* Op k (0 .. 2M-1) of a stage with `warmup` warm-up forwards: the warm-up, then M - warmup
 * pairs of a forward and a backward, then the remaining backwards. */
static inline struct schedule_op schedule_op_at(int warmup, int micro_batches, int k)
{
    int w = warmup, M = micro_batches;
    if (k < w)
        return (struct schedule_op){SCHEDULE_F, k, 0};
    if (k >= 2 * M - w)
        return (struct schedule_op){SCHEDULE_B, k - M, 0};
    int j = k - w;
    return (struct schedule_op){j & 1, j & 1 ? j >> 1 : w + (j >> 1), 0};
}

#endif
