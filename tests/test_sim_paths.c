/* The simulator's two paths, bitwise: the iteration time alone (sim_makespan, the searches'
 * path, which the compiler builds without any recording) against the full simulation with
 * every task and per-stage total recorded (sim_run, the reference), on random stage sets of
 * up to 64 stages and 512 micro-batches: links present or absent, recompute, layers whose
 * activations go to the host and are prefetched back, the optimizer on the device or on the
 * host, data-parallel all-reduce, both schedules. The periodic shortcut agrees with both
 * within its rounding where it extrapolates. The full run's tasks are checked against its own iteration time: each
 * stage's tasks follow one another on the stage, and none ends after the step. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"
#include "sim.h"
#include "testutil.h"

#define S_MAX 64
#define M_MAX 512
#define LAYERS_MAX 4
#define TRIALS 120

/* Stage s of a random set: when `layered`, LAYERS_MAX layers at most, each possibly copied to
 * the host, and the optimizer possibly on the host; the stage's sums are its layers'. */
static void random_stage(struct test_rng *rng, int S, int s, int layered, struct sim_stage *st,
                         struct sim_layer *ly)
{
    *st = (struct sim_stage){
        .fwd_ms = test_rng_double(rng, 0.1, 10),
        .bwd_ms = test_rng_double(rng, 0.1, 20),
        .recompute_ms = test_rng_int(rng, 0, 1) ? test_rng_double(rng, 0, 10) : 0,
        .out_bytes = test_rng_int(rng, 0, 1 << 30),
        .allreduce_ms = test_rng_int(rng, 0, 2) == 0 ? test_rng_double(rng, 0, 30) : 0,
        .optimizer_ms = test_rng_int(rng, 0, 1) ? test_rng_double(rng, 0, 15) : 0,
    };
    if (s + 1 < S && test_rng_int(rng, 0, 3) > 0)
        st->link = (struct link){.present = 1,
                                 .gbps = test_rng_double(rng, 1, 3000),
                                 .latency_us = test_rng_double(rng, 0, 50)};
    if (!layered)
        return;
    int n = (int)test_rng_int(rng, 1, LAYERS_MAX);
    st->fwd_ms = st->bwd_ms = st->recompute_ms = 0;
    for (int l = 0; l < n; l++) {
        ly[l] = (struct sim_layer){
            .fwd_ms = test_rng_double(rng, 0.05, 3),
            .bwd_ms = test_rng_double(rng, 0.05, 6),
            .recompute_ms = test_rng_int(rng, 0, 2) == 0 ? test_rng_double(rng, 0, 3) : 0,
        };
        if (test_rng_int(rng, 0, 1)) {
            ly[l].copy_ms = test_rng_double(rng, 0.01, 8);
            ly[l].ahead = (int)test_rng_int(rng, 1, 2 * n);
        }
        st->fwd_ms += ly[l].fwd_ms;
        st->bwd_ms += ly[l].bwd_ms;
        st->recompute_ms += ly[l].recompute_ms;
    }
    st->n_layers = n;
    st->layers = ly;
    if (test_rng_int(rng, 0, 1)) {
        st->host_optimizer = 1;
        st->optimizer_ms = 0;
        for (int l = 0; l < n; l++) {
            ly[l].grad_ms = test_rng_double(rng, 0, 4);
            ly[l].update_ms = test_rng_double(rng, 0, 6);
            ly[l].param_ms = test_rng_double(rng, 0, 4);
        }
    }
}

/* The full run's own consistency: per stage, compute tasks (forward, recompute, backward)
 * never overlap in the order recorded, and no task ends after the step (within rounding: a
 * layer's backward starts at t + (r + b) of the one before, whose slice ends at (t + r) + b). */
static void check_tasks(const struct sim_result *r)
{
    double *free_at = calloc((size_t)r->n_stages, sizeof *free_at);
    int overlaps = 0, late = 0;
    for (int i = 0; i < r->n_tasks; i++) {
        const struct sim_task *t = &r->tasks[i];
        late += t->end_ms > r->iteration_ms * (1 + 1e-12);
        if (t->kind > SIM_BACKWARD)
            continue;
        overlaps += t->start_ms < free_at[t->stage] * (1 - 1e-12);
        free_at[t->stage] = t->end_ms;
    }
    CU_ASSERT_EQUAL(overlaps, 0);
    CU_ASSERT_EQUAL(late, 0);
    free(free_at);
}

static void test_makespan_equals_full_run(void)
{
    struct test_rng rng = {2026};
    struct sim_stage *st = calloc(S_MAX, sizeof *st);
    struct sim_layer *ly = calloc((size_t)S_MAX * LAYERS_MAX, sizeof *ly);
    int layered_trials = 0, periodic_checked = 0;
    for (int trial = 0; trial < TRIALS; trial++) {
        /* half the trials small, where warm-ups exceed M and fill and drain dominate */
        int big = trial % 2;
        int S = (int)test_rng_int(&rng, 1, big ? S_MAX : 9);
        int M = (int)test_rng_int(&rng, 1, big ? M_MAX : 24);
        int layered_share = (int)test_rng_int(&rng, 0, 2); /* none, some, every stage */
        int any_layers = 0;
        for (int s = 0; s < S; s++) {
            int layered = layered_share == 2 || (layered_share == 1 && test_rng_int(&rng, 0, 2) == 0);
            random_stage(&rng, S, s, layered, &st[s], &ly[s * LAYERS_MAX]);
            any_layers |= layered;
        }
        layered_trials += any_layers;
        for (int k = 0; k < 2; k++) {
            enum schedule sched = k ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
            struct sim_result r;
            struct err e;
            double alone = NAN;
            err_clear(&e);
            CU_ASSERT_FATAL(sim_run(sched, S, M, st, &r, &e) == ERR_OK);
            CU_ASSERT_FATAL(sim_makespan(sched, S, M, st, &alone, &e) == ERR_OK);
            /* bitwise, not within a tolerance */
            CU_ASSERT(memcmp(&alone, &r.iteration_ms, sizeof alone) == 0);
            check_tasks(&r);
            /* the periodic shortcut: within rounding; a pipeline with a stage run layer by
             * layer whole, so exactly (it once extrapolated from times never written) */
            double fast = NAN;
            int simulated = 0;
            CU_ASSERT(sim_makespan_periodic(sched, S, M, st, &fast, &simulated, &e) == ERR_OK);
            CU_ASSERT(test_close(fast, r.iteration_ms, 1e-9, 1e-9));
            if (any_layers)
                CU_ASSERT(simulated == M && memcmp(&fast, &alone, sizeof fast) == 0);
            periodic_checked += !any_layers && simulated < M;
            sim_result_free(&r);
        }
    }
    /* the mix covered both kinds of stage */
    CU_ASSERT(layered_trials > TRIALS / 3 && layered_trials < TRIALS);
    CU_ASSERT(periodic_checked > 0); /* some runs were extrapolated */
    free(st);
    free(ly);
}

/* The simulator runs warm-ups and cool-downs in an order that needs each stage's warm-up no
 * longer than the stage before's; schedule_op_at's ops are test_sim.c's program()'s, which
 * its longest-path reference builds independently. */
static void test_warmups_shrink(void)
{
    int longer = 0;
    for (int sch = 0; sch < 2; sch++)
        for (int S = 1; S <= 40; S++)
            for (int M = 1; M <= 50; M++)
                for (int s = 1; s < S; s++)
                    longer += schedule_warmup((enum schedule)sch, S, s, M) >
                              schedule_warmup((enum schedule)sch, S, s - 1, M);
    CU_ASSERT_EQUAL(longer, 0);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("sim paths", NULL, NULL);
    CU_add_test(s, "sim_makespan equals sim_run's iteration bitwise", test_makespan_equals_full_run);
    CU_add_test(s, "warm-ups shrink down the pipeline", test_warmups_shrink);
    return test_main();
}
