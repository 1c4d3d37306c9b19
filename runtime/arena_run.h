/* The activation arena carved from a plan's reuse layout (common/arena.h): one allocation in
 * place of the slots, the transient and the workspace (layout.h), each object of the stage at
 * the plan's offset. The executor says when it starts and stops using each object
 * (arena_run_in / arena_run_out); the highest byte in use at once, over the step, is the
 * arena's measured peak. With `check`, every object coming into use is compared with every
 * object in use: two sharing a byte fail the run (ERR_FAIL, naming both), whatever the plan's
 * lifetimes said. */
#ifndef BALLAST_ARENA_RUN_H
#define BALLAST_ARENA_RUN_H

#include <stdint.h>

#include "arena.h"
#include "backend.h"
#include "layout.h"

struct arena_live {
    int kind, micro, li, phase;
    int64_t off, len;
};

struct arena_run {
    const struct stage_layout *lay; /* not owned */
    int micro_batches, n_layers, check;
    int64_t bytes;         /* the arena */
    int64_t *kept_at;      /* [micro * n_layers + li]: offset, -1 none */
    int64_t *transient_at; /* [(micro * n_layers + li) * 2 + phase] */
    int64_t *staging_at;   /* the same cells: an offloaded layer's staging objects */
    int *staging_first, *staging_last; /* their lifetimes in ticks (layer-ops, arena.h) */
    int64_t *slot_start;   /* [li]: the layer's first kept byte within a slot (layout.h) */
    int64_t workspace_at;
    struct arena_live *live; /* in use now */
    int n_live, cap_live;
    int64_t peak; /* the highest byte in use at once */
};

/* Maps the plan's objects onto the stage's layout: every object of the layers, micro-batches
 * and sizes the layout has, and nothing else (ERR_INPUT naming the object otherwise, after
 * `where`, the arena's place: "plan.json: stages[2].arena"). The workspace is in use from the
 * start. */
int arena_run_init(struct arena_run *a, const struct arena *plan, const struct stage_layout *lay,
                   int micro_batches, int check, const char *where, struct err *e);
void arena_run_free(struct arena_run *a);

/* Layer li's tensors for `micro` in `phase` (arena.h) given the arena's and the persistent
 * arena's bases. */
void arena_run_view(const struct arena_run *a, const struct stage_layout *lay,
                    const struct model *m, int li, int micro, int phase, char *base,
                    char *persistent, struct layer_view *v);

/* Object (kind, micro, li, phase) comes into use (nothing if it is already, or has no
 * bytes); goes out of use. */
int arena_run_in(struct arena_run *a, int kind, int micro, int li, int phase, struct err *e);
void arena_run_out(struct arena_run *a, int kind, int micro, int li, int phase);

/* Offload: the offset and the lifetime (ticks) of layer li's staging object for `micro` in
 * `phase`, which the executor uses in place of a staging buffer of its pool. */
int64_t arena_run_staging_at(const struct arena_run *a, int micro, int li, int phase);
void arena_run_staging_ticks(const struct arena_run *a, int micro, int li, int phase, int *first,
                             int *last);

#endif
