/* plan_speed --search: the time `--method optimal --repartition` takes on random clusters. */
#ifndef BALLAST_PLAN_SPEED_SEARCH_H
#define BALLAST_PLAN_SPEED_SEARCH_H

/* argv[0] is "--search"; returns the exit status. */
int search_bench_main(int argc, char **argv);

#endif
