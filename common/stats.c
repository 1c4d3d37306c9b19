#include "stats.h"

#include <stdlib.h>

static int ascending(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void stats_sort(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, ascending);
}

double stats_median(double *v, int n)
{
    stats_sort(v, n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double stats_upper_median(double *v, int n)
{
    stats_sort(v, n);
    return v[n / 2];
}
