/* Medians of timing samples, for the profiler and the benches, and the sort under them. */
#ifndef BALLAST_STATS_H
#define BALLAST_STATS_H

/* v[0..n-1] in ascending order. */
void stats_sort(double *v, int n);
/* The median of v[0..n-1], n >= 1 (the mean of the middle two when n is even); sorts v. */
double stats_median(double *v, int n);
/* v[n/2] of v sorted, n >= 1: the median for odd n, the upper of the middle two for even n
 * (the timing loops that report one measured sample rather than a mean of two); sorts v. */
double stats_upper_median(double *v, int n);

#endif
