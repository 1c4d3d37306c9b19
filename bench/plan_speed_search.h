/* plan_speed --search: the time `--method optimal --repartition` takes on random clusters. */
#ifndef BALLAST_PLAN_SPEED_SEARCH_H
#define BALLAST_PLAN_SPEED_SEARCH_H

#include "devices.h"

/* argv[0] is "--search"; returns the exit status. */
int search_bench_main(int argc, char **argv, const struct device_table *t);

/* The median of v[0..n-1] (sorts v; n >= 1). */
double plan_speed_median(double *v, int n);

#endif
