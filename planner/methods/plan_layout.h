/* What every way of planning starts from (plan_layout.c: the methods, the repartition search
 * and the frameworks' plans, plan_for.c) and the tie-break it ends with (plan_finish.c). */
#ifndef BALLAST_PLAN_LAYOUT_H
#define BALLAST_PLAN_LAYOUT_H

#include "cluster.h"
#include "planner.h"
#include "repartition.h"

/* The plan's stages, layers, limits, loads and the profiles' assumptions from the cluster:
 * what a method chooses on. */
int plan_layout(const struct cluster *c, const struct plan_options *o, struct plan *out,
                struct err *e);
/* The cluster with its stages in the arrangement's order, split and links; it shares c's
 * profiles (free only out->stages). */
int arranged_cluster(const struct cluster *c, const struct arrangement *a, struct cluster *out,
                     struct err *e);
/* The plan's stages' memory_bytes summed (the tie-break of equal steps). */
int64_t plan_memory(const struct plan *p);
/* planner_make for a framework (o->framework, plan_for.c). */
int plan_for_framework(const struct cluster *c, const struct plan_options *o, struct plan *out,
                       struct err *e);

#endif
