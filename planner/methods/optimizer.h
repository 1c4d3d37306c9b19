/* The optimizer on the host as the planner's searches see it (--actions ...,optimizer;
 * docs/cost-model.md "The optimizer on the host"): a stage whose optimizer is on the host is the same stage with each
 * layer's state_bytes cut to what stays on the device (devstate_l) and its host memory cut
 * by the mirror. Every search over activation actions (knapsack, offload, GLPK) then runs
 * unchanged on that view. With --actions ...,optimizer-fraction the host takes the optimizer
 * of the stage's last layers only, from layer `from` on (cost.h): the same view of those. */
#ifndef BALLAST_OPTIMIZER_H
#define BALLAST_OPTIMIZER_H

#include "plan.h"

#define OPTIMIZER_SPLITS_ALL 8
#define OPTIMIZER_SPLITS_MAX 16

/* A plan that shares p's everything but stage s, whose layers (owned by the view) are the
 * host view and whose host limit has the mirror taken off; optimizer_view_free frees it. */
struct optimizer_view {
    struct plan plan;
    struct plan_stage *stages;
    int stage;
};

/* With --actions ...,weights the stage's last `stream` layers also stream their weights
 * (cost.h "Streamed weights"): in the view their state_bytes are 0, the host memory loses
 * their weights' copy and the device memory the weights buffers, and the view's actions
 * (owned) say which layers stream. Whether stage s may: the optimizer view's conditions, and
 * room for those on the host and the device. */
int optimizer_stream_possible(const struct plan *p, int s, int from, int stream);
int optimizer_view_init_stream(const struct plan *p, int s, int from, int stream,
                               struct optimizer_view *v, struct err *e);
/* The stream counts stage s tries with its optimizer hosted from `from`: every one up to
 * OPTIMIZER_SPLITS_ALL hosted layers, else a grid keeping one and all; returns the count. */
int optimizer_streams(const struct plan *p, int s, int from, int stream[OPTIMIZER_SPLITS_MAX]);

/* Whether stage s may put its optimizer on the host: host memory and a host link, every
 * layer's state split, and the mirror within the host memory. When not, *why (if not NULL)
 * says which in words. */
int optimizer_host_possible(const struct plan *p, int s, const char **why);
/* The same for the layers from `from` on (relative to the stage's first). */
int optimizer_host_possible_from(const struct plan *p, int s, int from, const char **why);
/* The view of p with stage s's optimizer on the host (optimizer_host_possible must hold). */
int optimizer_view_init(const struct plan *p, int s, struct optimizer_view *v, struct err *e);
/* The same with the host taking layers from `from` on (optimizer_host_possible_from). */
int optimizer_view_init_from(const struct plan *p, int s, int from, struct optimizer_view *v,
                             struct err *e);
/* The fractions stage s may host with --actions ...,optimizer-fraction: into from[] the
 * first hosted layer of each (1 .. n-1; 0, the whole stage, is --actions optimizer's), every
 * one for a stage of at most OPTIMIZER_SPLITS_ALL layers, else a grid of them that keeps
 * the first and last; returns the count (at most OPTIMIZER_SPLITS_MAX). */
int optimizer_splits(const struct plan *p, int s, int from[OPTIMIZER_SPLITS_MAX]);
void optimizer_view_free(struct optimizer_view *v);

#endif
