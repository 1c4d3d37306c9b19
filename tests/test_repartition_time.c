/* --repartition under --time-limit on a cluster of the size the limit is for: 128 stages of
 * four kinds (plan_speed_cluster.c's instance 1 of seed 11, whose 24 orders' bound tables
 * alone took 1.8 s when 0.2 s was asked). The timed search must take well under the untimed
 * one (CPU time: the limit is wall time, so load only shortens the timed run) and still
 * return a plan with a certified gap; each run's bound must be under the other's plan. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <time.h>

#include "clock.h"
#include "cluster.h"
#include "devices.h"
#include "plan_speed_search.h"
#include "planner.h"
#include "testutil.h"

/* Plans c with --method optimal --repartition [--time-limit limit_s]; *secs its CPU time. */
static void plan_timed(const struct cluster *c, double limit_s, struct plan *p, double *secs)
{
    struct plan_options o;
    struct err e;
    err_clear(&e);
    plan_options_default(&o);
    o.repartition = 1;
    o.time_limit_s = limit_s;
    double t0 = clock_cpu_s();
    CU_ASSERT_EQUAL_FATAL(planner_make(c, &o, p, &e), ERR_OK);
    *secs = clock_cpu_s() - t0;
}

static void test_time_limit(void)
{
    struct device_table t;
    struct cluster c;
    struct err e;
    char what[160];
    err_clear(&e);
    CU_ASSERT_FATAL(devices_load(BALLAST_SOURCE_DIR "/configs/devices.json", &t, &e) == ERR_OK);
    CU_ASSERT_FATAL(plan_speed_random_cluster(&t, 11, 128, 1, 0, &c, what, sizeof what, &e) ==
                    ERR_OK);
    struct plan full, timed;
    double full_s, timed_s;
    plan_timed(&c, 0, &full, &full_s);
    plan_timed(&c, 0.2, &timed, &timed_s);
    printf("\n%s: untimed %.3f s (gap %.3f%%), --time-limit 0.2: %.3f s (gap %.3f%%)\n", what,
           full_s, 100 * full.optimality_gap, timed_s, 100 * timed.optimality_gap);
    CU_ASSERT(timed_s < 0.5 * full_s);
    CU_ASSERT(timed.search.present && !timed.search.exhausted);
    CU_ASSERT(isfinite(timed.optimality_gap) && timed.optimality_gap >= 0);
    CU_ASSERT(timed.search.lower_bound > 0);
    CU_ASSERT(test_close(timed.iteration_ms / (1 + timed.optimality_gap),
                         timed.search.lower_bound, 1e-6, 1e-9));
    CU_ASSERT(timed.search.lower_bound <= full.iteration_ms * (1 + 1e-9));
    CU_ASSERT(full.search.lower_bound <= timed.iteration_ms * (1 + 1e-9));
    plan_free(&full);
    plan_free(&timed);
    cluster_free(&c);
    devices_free(&t);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("repartition_time", NULL, NULL);
    CU_add_test(s, "--time-limit 0.2 on 128 stages: well under the untimed search, with a gap",
                test_time_limit);
    return test_main();
}
