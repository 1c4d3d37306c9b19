/* plan_speed --search: `--method optimal --repartition` on random clusters, not only on the
 * shipped ones it was tuned on (issue 11, "Search time").
 *
 * Each instance: plan_speed_cluster.c's random cluster of S stages (1.5 S blocks of a GPT 4096
 * or 8192 wide, 2 to 4 kinds of GPU, block times varying along the model). Instances no
 * arrangement fits are counted and skipped. Prints one row per instance (its CPU seconds) and
 * the medians per size. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "cluster.h"
#include "devices.h"
#include "planner.h"
#include "plan_speed_search.h"
#include "stats.h"

static double median_of(double *v, int n)
{
    return n > 0 ? stats_median(v, n) : NAN;
}

struct search_args {
    int sizes[8], n_sizes, instances, first, M;
    uint64_t seed;
    double time_limit_s, gap;
    long nodes;
};

static int parse_search_args(int argc, char **argv, struct search_args *a)
{
    *a = (struct search_args){.sizes = {64, 128}, .n_sizes = 2, .instances = 7, .seed = 11,
                              .gap = -1};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--sizes") == 0 && v) {
            a->n_sizes = 0;
            for (char *p = argv[++i]; *p && a->n_sizes < 8;) {
                a->sizes[a->n_sizes++] = (int)strtol(p, &p, 10);
                p += *p == ',';
            }
        } else if (strcmp(argv[i], "--instances") == 0 && v) {
            a->instances = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--first") == 0 && v) {
            a->first = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--micro-batches") == 0 && v) {
            a->M = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--seed") == 0 && v) {
            a->seed = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--time-limit") == 0 && v) {
            a->time_limit_s = atof(argv[++i]);
        } else if (strcmp(argv[i], "--search-gap") == 0 && v) {
            a->gap = atof(argv[++i]);
        } else if (strcmp(argv[i], "--search-nodes") == 0 && v) {
            a->nodes = atol(argv[++i]);
        } else {
            fprintf(stderr,
                    "usage: plan_speed --search [--sizes 64,128] [--instances N] [--first I]\n"
                    "                  [--seed N] [--micro-batches M] [--time-limit S]\n"
                    "                  [--search-nodes N] [--search-gap G]\n"
                    "  random clusters per size (stages), timed with --method optimal "
                    "--repartition\n");
            return 2;
        }
    }
    for (int z = 0; z < a->n_sizes; z++)
        if (a->sizes[z] < 8 || a->sizes[z] > 1024)
            return fprintf(stderr, "plan_speed: --sizes: 8 to 1024 stages\n"), 2;
    return a->instances >= 1 && a->first >= 0 && a->M >= 0 ? 0 : (fprintf(stderr, "plan_speed: bad count\n"), 2);
}

/* One instance: plans it, prints its row; *secs and *gap get its time and certified gap. */
static int run_instance(const struct device_table *t, const struct search_args *a, int S,
                        int i, double *secs, double *gap)
{
    struct cluster c;
    struct plan_options o;
    struct plan p;
    struct err e;
    char what[160] = "";
    err_clear(&e);
    plan_options_default(&o);
    o.repartition = 1;
    o.min_gain = 0; /* the search's fastest plan: its gap, not --min-gain's simpler one */
    if (a->nodes > 0)
        o.search_nodes = a->nodes;
    o.time_limit_s = a->time_limit_s;
    if (a->gap >= 0)
        o.search_gap = a->gap;
    int rc = plan_speed_random_cluster(t, a->seed, S, i, a->M, &c, what, sizeof what, &e);
    double t0 = clock_cpu_s();
    if (rc == ERR_OK)
        rc = planner_make(&c, &o, &p, &e);
    *secs = clock_cpu_s() - t0;
    printf("%6d %4d %6d  %-50s", S, c.n_layers, c.micro_batches, what);
    cluster_free(&c);
    if (rc) {
        printf(" exit %d (%.*s)\n", rc, 60, e.msg);
        return rc;
    }
    *gap = p.optimality_gap;
    printf(" %9.3f %8.3f%% %8ld %6ld %12.3f %12.3f %s\n", *secs, 100 * p.optimality_gap,
           p.search.nodes, p.search.splits, p.iteration_ms, p.search.lower_bound,
           p.search.exhausted ? "exhausted" : "stopped");
    plan_free(&p);
    return ERR_OK;
}

int search_bench_main(int argc, char **argv, const struct device_table *t)
{
    struct search_args a;
    if (parse_search_args(argc, argv, &a))
        return 2;
    printf("plan_speed --search: --method optimal --repartition on %d random clusters per size, "
           "seed %llu\n%6s %4s %6s  %-50s %9s %9s %8s %6s %12s %12s\n",
           a.instances, (unsigned long long)a.seed, "stages", "N", "M", "kinds", "cpu s",
           "gap", "nodes", "sims", "plan ms", "bound ms");
    double *secs = malloc((size_t)a.instances * sizeof *secs);
    double *gaps = malloc((size_t)a.instances * sizeof *gaps);
    int rc = secs && gaps ? 0 : 1;
    for (int z = 0; z < a.n_sizes && rc == 0; z++) {
        int n = 0, nofit = 0;
        double worst_s = 0, worst_gap = 0;
        for (int i = 0; i < a.instances; i++) {
            int r = run_instance(t, &a, a.sizes[z], a.first + i, &secs[n], &gaps[n]);
            if (r == ERR_NOFIT) {
                nofit++;
                continue;
            }
            if (r) {
                rc = r;
                break;
            }
            worst_s = secs[n] > worst_s ? secs[n] : worst_s;
            worst_gap = gaps[n] > worst_gap ? gaps[n] : worst_gap;
            n++;
        }
        printf("%d stages: %d planned (%d fit none): median %.3f cpu s (worst %.3f), median gap "
               "%.3f%% (worst %.3f%%)\n",
               a.sizes[z], n, nofit, median_of(secs, n), worst_s, 100 * median_of(gaps, n),
               100 * worst_gap);
    }
    free(secs);
    free(gaps);
    return rc;
}
