/* Simulator speed: the median time of one sim_makespan call (the searches' path: no tasks
 * recorded) for S = 8, 32, 128 stages and M = 8, 64, 512 micro-batches, 1F1B and GPipe, and of
 * sim_makespan_periodic under 1F1B. Stages have random forward, backward and recompute times,
 * every boundary a link, no host lanes (as the pool and repartition searches simulate them).
 * Prints one table of CPU time per call; `sim_speed S M` times one size. Never decides pass
 * or fail. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "clock.h"
#include "sim.h"
#include "stats.h"

#define REPEATS 9

static void random_stages(struct sim_stage *st, int S, unsigned *seed)
{
    for (int s = 0; s < S; s++) {
        double f = 1 + (double)(rand_r(seed) % 1000) / 500;
        st[s] = (struct sim_stage){
            .fwd_ms = f,
            .bwd_ms = 2 * f,
            .recompute_ms = rand_r(seed) % 2 ? f / 3 : 0,
            .out_bytes = (int64_t)16 << 20,
            .link = {.present = s + 1 < S, .gbps = 100, .latency_us = 5},
        };
    }
}

/* The median over REPEATS rounds of the mean time of one call, in ns; a round lasts about
 * 20 ms. `which`: 0 sim_makespan, 1 sim_makespan_periodic. */
static double median_ns(enum schedule sch, int which, int S, int M, const struct sim_stage *st)
{
    double t[REPEATS], ms;
    int simulated, calls = 1 + (int)(4e6 / ((double)S * M));
    struct err e = {0};
    for (int r = 0; r < REPEATS; r++) {
        double t0 = 1e9 * clock_cpu_s(); /* the simulator runs on one thread */
        for (int i = 0; i < calls; i++)
            if (which ? sim_makespan_periodic(sch, S, M, st, &ms, &simulated, &e)
                      : sim_makespan(sch, S, M, st, &ms, &e)) {
                fprintf(stderr, "sim_speed: %s\n", e.msg);
                exit(1);
            }
        t[r] = (1e9 * clock_cpu_s() - t0) / calls;
    }
    return stats_upper_median(t, REPEATS);
}

static void row(int S, int M)
{
    unsigned seed = 17u * (unsigned)S + (unsigned)M;
    struct sim_stage *st = malloc((size_t)S * sizeof *st);
    if (st == NULL)
        exit(1);
    random_stages(st, S, &seed);
    printf("%5d %5d %14.0f %14.0f %14.0f\n", S, M, median_ns(SCHEDULE_1F1B, 0, S, M, st),
           median_ns(SCHEDULE_GPIPE, 0, S, M, st), median_ns(SCHEDULE_1F1B, 1, S, M, st));
    free(st);
}

int main(int argc, char **argv)
{
    static const int Ss[] = {8, 32, 128}, Ms[] = {8, 64, 512};
    printf("median ns per call\n%5s %5s %14s %14s %14s\n", "S", "M", "1f1b makespan",
           "gpipe makespan", "1f1b periodic");
    if (argc == 3) {
        row(atoi(argv[1]), atoi(argv[2]));
        return 0;
    }
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            row(Ss[i], Ms[j]);
    return 0;
}
