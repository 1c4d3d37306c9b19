/* plan_speed --search: the time `--method optimal --repartition` takes on random clusters. */
#ifndef BALLAST_PLAN_SPEED_SEARCH_H
#define BALLAST_PLAN_SPEED_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#include "cluster.h"
#include "devices.h"
#include "err.h"

/* argv[0] is "--search"; returns the exit status. */
int search_bench_main(int argc, char **argv, const struct device_table *t);

/* Instance i of S stages for `seed` (plan_speed_cluster.c); M = 0: 2S micro-batches. *what
 * gets its width and kinds; the caller frees c with cluster_free. */
int plan_speed_random_cluster(const struct device_table *t, uint64_t seed, int S, int i, int M,
                              struct cluster *c, char *what, size_t what_size, struct err *e);

#endif
