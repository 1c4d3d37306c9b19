/* The optimizer on the host, the planning side (issue 13): the simulator's optimizer step by
 * hand, and the optimal method with --actions ...,optimizer against brute force (every
 * optimizer place of every stage and every action of every layer, scored by the simulator),
 * GLPK, and the rule that a stage hosts its optimizer only where the device cannot hold its
 * state or where that is faster. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "plan_instance.h"
#include "planner.h"
#include "sim.h"
#include "testutil.h"

#define GIB ((int64_t)1 << 30)

/* ---- simulator ---- */

/* One stage, one micro-batch, two layers (1 ms forward, 2 ms backward), the optimizer on the
 * host with gradients 3 ms down, AdamW 4 ms, parameters 1 ms up. Forwards [0,1] [1,2];
 * backwards layer 1 [2,4], layer 0 [4,6]. Layer 1: down [4,7], AdamW [7,11], up [11,12];
 * layer 0: down waits for the lane [7,10], AdamW waits for the threads [11,15], up [15,16].
 * The step ends at 16: 10 ms after the last backward. */
static void test_sim_host_step_by_hand(void)
{
    struct sim_layer y[2];
    for (int l = 0; l < 2; l++)
        y[l] = (struct sim_layer){.fwd_ms = 1, .bwd_ms = 2, .grad_ms = 3, .update_ms = 4,
                                  .param_ms = 1};
    struct sim_stage st = {.fwd_ms = 2, .bwd_ms = 4, .n_layers = 2, .layers = y,
                           .host_optimizer = 1};
    struct sim_result r;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(sim_run(SCHEDULE_1F1B, 1, 1, &st, &r, &e) == ERR_OK);
    CU_ASSERT(test_close(r.iteration_ms, 16, 1e-12, 0));
    CU_ASSERT(test_close(r.tail_ms[0], 10, 1e-12, 0));
    CU_ASSERT(test_close(r.update_ms[0], 8, 1e-12, 0));
    CU_ASSERT(test_close(r.copy_out_ms[0], 6, 1e-12, 0) && test_close(r.copy_in_ms[0], 2, 1e-12, 0));
    struct sim_stage_totals t;
    sim_stage_totals(&r, 0, &t);
    CU_ASSERT(test_close(t.grad_ms, 6, 1e-12, 0) && test_close(t.update_ms, 8, 1e-12, 0) &&
              test_close(t.param_ms, 2, 1e-12, 0));
    sim_result_free(&r);
    /* bad steps are refused, not simulated */
    y[1].update_ms = -1;
    CU_ASSERT_EQUAL(sim_run(SCHEDULE_1F1B, 1, 1, &st, &r, &e), ERR_INPUT);
    CU_ASSERT(strstr(e.msg, "host step") != NULL);
    y[1].update_ms = 4;
    struct sim_stage none = {.fwd_ms = 1, .bwd_ms = 1, .host_optimizer = 1};
    err_clear(&e);
    CU_ASSERT_EQUAL(sim_run(SCHEDULE_1F1B, 1, 1, &none, &r, &e), ERR_INPUT);
    none = (struct sim_stage){.fwd_ms = 1, .bwd_ms = 1, .optimizer_ms = NAN};
    err_clear(&e);
    CU_ASSERT_EQUAL(sim_run(SCHEDULE_1F1B, 1, 1, &none, &r, &e), ERR_INPUT);
    err_clear(&e);
    /* a host step of no time is no step: the iteration is the backward's end */
    for (int l = 0; l < 2; l++)
        y[l].grad_ms = y[l].update_ms = y[l].param_ms = 0;
    CU_ASSERT_FATAL(sim_run(SCHEDULE_1F1B, 1, 1, &st, &r, &e) == ERR_OK);
    CU_ASSERT(test_close(r.iteration_ms, 6, 1e-12, 0));
    sim_result_free(&r);
}

/* Two stages, two micro-batches, 1F1B, 1 ms forward and 2 ms backward each, no link cost;
 * the optimizer on the device, 10 ms on stage 0 and 1 ms on stage 1. Stage 1: F0 [1,2],
 * B0 [2,4], F1 [4,5], B1 [5,7], step [7,8]; stage 0: F0 [0,1], F1 [1,2], B0 [4,6], B1 [7,9],
 * step [9,19]. */
static void test_sim_device_step_by_hand(void)
{
    struct sim_stage st[2] = {{.fwd_ms = 1, .bwd_ms = 2, .optimizer_ms = 10},
                              {.fwd_ms = 1, .bwd_ms = 2, .optimizer_ms = 1}};
    struct sim_result r;
    struct err e;
    double ms;
    int simulated;
    err_clear(&e);
    CU_ASSERT_FATAL(sim_run(SCHEDULE_1F1B, 2, 2, st, &r, &e) == ERR_OK);
    CU_ASSERT(test_close(r.iteration_ms, 19, 1e-12, 0));
    CU_ASSERT(test_close(r.tail_ms[0], 10, 1e-12, 0) && test_close(r.tail_ms[1], 1, 1e-12, 0));
    sim_result_free(&r);
    /* the same without the step: 9 */
    st[0].optimizer_ms = st[1].optimizer_ms = 0;
    CU_ASSERT_FATAL(sim_makespan(SCHEDULE_1F1B, 2, 2, st, &ms, &e) == ERR_OK);
    CU_ASSERT(test_close(ms, 9, 1e-12, 0));
    /* many micro-batches: stage 0's last backward ends after stage 1's, so the step adds
     * stage 0's 10 ms; the periodic shortcut agrees with the whole simulation */
    double none, whole;
    CU_ASSERT_FATAL(sim_makespan(SCHEDULE_1F1B, 2, 500, st, &none, &e) == ERR_OK);
    st[0].optimizer_ms = 10, st[1].optimizer_ms = 1;
    CU_ASSERT_FATAL(sim_makespan(SCHEDULE_1F1B, 2, 500, st, &whole, &e) == ERR_OK);
    CU_ASSERT_FATAL(sim_makespan_periodic(SCHEDULE_1F1B, 2, 500, st, &ms, &simulated, &e) ==
                    ERR_OK);
    CU_ASSERT(simulated < 500);
    CU_ASSERT(test_close(ms, whole, 1e-9, 1e-12));
    CU_ASSERT(test_close(whole, none + 10, 1e-9, 0));
}

/* ---- planner ---- */

static void test_exact_against_brute_force(void)
{
    struct test_rng rng = {13};
    static const int sets[] = {PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OPTIMIZER,
                               PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD |
                                   PLAN_ACTION_OPTIMIZER,
                               PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OPTIMIZER |
                                   PLAN_ACTION_WEIGHTS,
                               PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD |
                                   PLAN_ACTION_OPTIMIZER | PLAN_ACTION_WEIGHTS};
    int checked = 0, hosted = 0, kept = 0, streamed = 0;
    for (int trial = 0; trial < 16; trial++) {
        struct instance in;
        instance_hostopt_make(&in, &rng, trial % 2 ? SCHEDULE_GPIPE : SCHEDULE_1F1B,
                      test_rng_double(&rng, 20, 800), test_rng_int(&rng, 8, 40) * GIB, -1);
        for (int k = 0; k < 4; k++) {
            struct plan p;
            int rc = plan_with(&in, sets[k], 0, &p);
            if (rc != ERR_OK) {
                CU_ASSERT_EQUAL(rc, ERR_NOFIT);
                continue;
            }
            double got = p.iteration_ms;
            int host = 0;
            for (int s = 0; s < p.n_stages; s++) {
                host |= (p.stages[s].optimizer == COST_PLACE_HOST) << s;
                streamed += plan_stage_streams(&p.stages[s]) > 0;
            }
            double want = instance_brute_force(&p, sets[k], 0);
            CU_ASSERT(test_close(got, want, 1e-9, 1e-12));
            if (!test_close(got, want, 1e-9, 1e-12))
                printf("\ntrial %d actions %d: planner %.9g ms, brute force %.9g ms\n", trial,
                       sets[k], got, want);
            /* a hosted optimizer: the device cannot hold that stage's state with any
             * actions, or every way it can is slower */
            for (int s = 0; s < p.n_stages; s++)
                if (host >> s & 1) {
                    hosted++;
                    CU_ASSERT(instance_brute_force(&p, sets[k], 1 << s) > got);
                } else {
                    kept++;
                }
            plan_free(&p);
            checked++;
        }
        instance_free(&in);
    }
    printf(" [%d plans, %d stages host their optimizer, %d keep it, %d stream weights] ",
           checked, hosted, kept, streamed);
    CU_ASSERT(checked >= 16);
    CU_ASSERT(hosted > 0 && kept > 0);
}

/* Streamed weights: one stage of 4 layers whose device memory may need them; the planner
 * (--actions ...,weights) against every optimizer place, stream count and layer action. */
static void test_stream_against_brute_force(void)
{
    struct test_rng rng = {29};
    /* (no offload: 3 actions a layer keep the search exhaustive on 4 layers) */
    static const int sets[] = {PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OPTIMIZER |
                                   PLAN_ACTION_WEIGHTS,
                               PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OPTIMIZER |
                                   PLAN_ACTION_OPTIMIZER_FRACTION | PLAN_ACTION_WEIGHTS};
    int checked = 0, streamed = 0, nofit = 0;
    for (int trial = 0; trial < 24; trial++) {
        struct instance in;
        instance_stream_make(&in, &rng, trial % 2 ? SCHEDULE_GPIPE : SCHEDULE_1F1B,
                             test_rng_double(&rng, 20, 800), 64 * GIB);
        for (int k = 0; k < 2; k++) {
            struct plan p;
            int rc = plan_with(&in, sets[k], 1, &p);
            if (rc != ERR_OK) {
                CU_ASSERT_EQUAL(rc, ERR_NOFIT);
                nofit++;
                continue;
            }
            double got = p.iteration_ms, want = instance_brute_force(&p, sets[k], 0);
            CU_ASSERT(test_close(got, want, 1e-9, 1e-12));
            if (!test_close(got, want, 1e-9, 1e-12))
                printf("\ntrial %d actions %d: planner %.9g ms, brute force %.9g ms\n", trial,
                       sets[k], got, want);
            CU_ASSERT(p.verify.present && p.verify.agree); /* GLPK on the same view */
            streamed += plan_stage_streams(&p.stages[0]) > 0;
            plan_free(&p);
            checked++;
        }
        instance_free(&in);
    }
    printf(" [%d plans, %d stream weights, %d fit nothing] ", checked, streamed, nofit);
    CU_ASSERT(checked >= 24 && streamed > 0);
}

/* Room for every weight on the device and a slow host link: no layer streams; the same stage
 * with less room than its optimizer on the host needs with every layer recomputed, but more
 * than streaming all its weights needs, streams. */
static void test_stream_slow_link(void)
{
    struct test_rng rng = {31};
    int actions = PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OPTIMIZER | PLAN_ACTION_WEIGHTS;
    struct instance in;
    struct plan p;
    int64_t tight = 0;
    for (;;) { /* the memory every layer recomputed needs: hosting the optimizer, streaming */
        instance_stream_make(&in, &rng, SCHEDULE_1F1B, 1, 64 * GIB);
        struct layer_action full[4];
        struct stage_cost hosted, streamed;
        for (int l = 0; l < 4; l++)
            full[l] = (struct layer_action){.choice = COST_FULL, .offload_option = -1};
        struct cost_actions a = {full, COST_PLACE_HOST, 0};
        int v = schedule_in_flight(SCHEDULE_1F1B, 1, 0, in.c.micro_batches);
        cost_stage_actions(in.prof.layers, 4, &a, v, in.c.reserve_bytes, &hosted);
        for (int l = 0; l < 4; l++)
            full[l].weights = COST_PLACE_HOST;
        cost_stage_actions(in.prof.layers, 4, &a, v, in.c.reserve_bytes, &streamed);
        tight = (hosted.memory_bytes + streamed.memory_bytes) / 2;
        if (streamed.memory_bytes < hosted.memory_bytes)
            break;
        instance_free(&in);
    }
    in.c.stages[0].memory_bytes = 1000 * GIB;
    CU_ASSERT_EQUAL_FATAL(plan_with(&in, actions, 0, &p), ERR_OK);
    CU_ASSERT_EQUAL(plan_stage_streams(&p.stages[0]), 0);
    plan_free(&p);
    in.c.stages[0].memory_bytes = tight;
    CU_ASSERT_EQUAL_FATAL(plan_with(&in, actions, 0, &p), ERR_OK);
    CU_ASSERT(plan_stage_streams(&p.stages[0]) > 0);
    plan_free(&p);
    instance_free(&in);
}

/* A superset of actions is never slower; where the device holds everything and the host step
 * is slow, the optimizer stays on the device and the plan is the recompute-only one; the
 * verify MILP agrees with the search on the stages' chosen places. */
static void test_rules_and_verify(void)
{
    struct test_rng rng = {21};
    int verified = 0, fits_anyway = 0;
    for (int trial = 0; trial < 8; trial++) {
        struct instance in;
        struct plan rec, opt;
        instance_hostopt_make(&in, &rng, SCHEDULE_1F1B, 100, 64 * GIB, -1);
        int a = plan_with(&in, PLAN_ACTION_RECOMPUTE, 0, &rec);
        int b = plan_with(&in, PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OPTIMIZER, 1, &opt);
        CU_ASSERT(b == ERR_OK || a != ERR_OK);
        if (a == ERR_OK && b == ERR_OK)
            CU_ASSERT(opt.iteration_ms <= rec.iteration_ms);
        if (b == ERR_OK) {
            CU_ASSERT(opt.verify.present && opt.verify.agree);
            verified++;
            plan_free(&opt);
        }
        if (a == ERR_OK)
            plan_free(&rec);
        /* roomy devices, a slow host: the device keeps every optimizer */
        for (int l = 0; l < in.prof.n_layers; l++)
            in.prof.layers[l].host_optimizer_ms = 1e4;
        for (int s = 0; s < in.c.n_stages; s++)
            in.c.stages[s].memory_bytes = 1000 * GIB;
        a = plan_with(&in, PLAN_ACTION_RECOMPUTE, 0, &rec);
        b = plan_with(&in, PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OPTIMIZER, 0, &opt);
        CU_ASSERT_FATAL(a == ERR_OK && b == ERR_OK);
        for (int s = 0; s < opt.n_stages; s++)
            CU_ASSERT(opt.stages[s].optimizer == COST_PLACE_DEVICE);
        CU_ASSERT(opt.iteration_ms == rec.iteration_ms);
        fits_anyway++;
        plan_free(&rec);
        plan_free(&opt);
        instance_free(&in);
    }
    CU_ASSERT(verified >= 4 && fits_anyway == 8);
}

/* A plan with a hosted optimizer survives the file: written, read back with the cost model's
 * checks; the stage's host memory holds the mirror; too little host memory is refused. */
static void test_plan_round_trip(void)
{
    struct test_rng rng = {3};
    struct instance in;
    struct plan p, q;
    struct err e;
    err_clear(&e);
    /* every stage just fits with its optimizer on the host, and its state (2 GiB more per
     * layer at least) does not fit beside even the least activations */
    instance_hostopt_make(&in, &rng, SCHEDULE_1F1B, 100, 64 * GIB, 0);
    CU_ASSERT_FATAL(plan_with(&in, PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OPTIMIZER, 0, &p) == ERR_OK);
    int64_t mirror = 0;
    for (int l = 0; l < plan_stage_layer_count(&p.stages[0]); l++)
        mirror += 4 * p.stages[0].layers[l].grad_bytes;
    CU_ASSERT_EQUAL(p.stages[0].optimizer, COST_PLACE_HOST);
    CU_ASSERT(p.stages[0].host_memory_bytes >= mirror);
    const char *f = test_path("hostopt-plan.json");
    CU_ASSERT_FATAL(plan_write(f, &p, &e) == ERR_OK);
    if (plan_load(f, &q, &e) != ERR_OK)
        printf("\n%s\n", e.msg);
    CU_ASSERT_FATAL(e.code == ERR_OK);
    CU_ASSERT_EQUAL(q.stages[0].optimizer, COST_PLACE_HOST);
    CU_ASSERT_EQUAL(q.stages[0].memory_bytes, p.stages[0].memory_bytes);
    plan_free(&q);
    p.stages[0].host_limit_bytes = mirror - 1;
    CU_ASSERT_FATAL(plan_write(f, &p, &e) == ERR_OK);
    CU_ASSERT_EQUAL(plan_load(f, &q, &e), ERR_INPUT);
    CU_ASSERT(strstr(e.msg, "host_memory_bytes") != NULL && strstr(e.msg, "host_limit_bytes"));
    plan_free(&p);
    instance_free(&in);
}

/* Megatron-LM's switch is global: every stage on the host exports as it is; some stages do
 * not, and NeMo has no switch: both plan the framework's settings again (with the optimizer
 * where the framework can put it), said with the reason. */
static void test_export(void)
{
    struct test_rng rng = {3};
    struct instance in;
    struct plan p;
    struct err e;
    char text[8192], note[8192];
    instance_hostopt_make(&in, &rng, SCHEDULE_1F1B, 100, 64 * GIB, 1);
    CU_ASSERT_FATAL(plan_with(&in, PLAN_ACTION_RECOMPUTE, 0, &p) == ERR_OK);
    err_clear(&e);
    CU_ASSERT_EQUAL(instance_export(&p, "megatron", text, note, sizeof text, &e), ERR_OK);
    CU_ASSERT(strstr(text, "optimizer-cpu-offload") == NULL);
    for (int s = 0; s < p.n_stages; s++)
        p.stages[s].optimizer = COST_PLACE_HOST;
    CU_ASSERT_FATAL(planner_finish(&p, &e) == ERR_OK);
    CU_ASSERT_EQUAL(instance_export(&p, "megatron", text, note, sizeof text, &e), ERR_OK);
    CU_ASSERT(strstr(text, "--optimizer-cpu-offload \\\n--optimizer-offload-fraction 1.0 \\\n"
                           "--use-precision-aware-optimizer") != NULL);
    CU_ASSERT(strstr(note, "cannot run the plan as it is") == NULL);
    int rc = instance_export(&p, "nemo", text, note, sizeof text, &e);
    CU_ASSERT(rc == ERR_OK || rc == ERR_NOFIT);
    CU_ASSERT(strstr(rc ? e.msg : note, "the plan keeps the optimizer on the host, which NeMo "
                                       "has no setting for") != NULL);
    CU_ASSERT(strstr(text, "optimizer") == NULL);
    err_clear(&e);
    p.stages[1].optimizer = COST_PLACE_DEVICE;
    CU_ASSERT_FATAL(planner_finish(&p, &e) == ERR_OK);
    rc = instance_export(&p, "megatron", text, note, sizeof text, &e);
    CU_ASSERT(rc == ERR_OK || rc == ERR_NOFIT);
    CU_ASSERT(strstr(rc ? e.msg : note, "1 of 2 stages keep their optimizer on the host") !=
              NULL);
    plan_free(&p);
    instance_free(&in);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("host optimizer", NULL, NULL);
    CU_add_test(s, "simulator: host step by hand", test_sim_host_step_by_hand);
    CU_add_test(s, "simulator: device step by hand", test_sim_device_step_by_hand);
    CU_add_test(s, "exact against brute force", test_exact_against_brute_force);
    CU_add_test(s, "streamed weights: exact against brute force",
                test_stream_against_brute_force);
    CU_add_test(s, "streamed weights: none over a slow link with room", test_stream_slow_link);
    CU_add_test(s, "rules and verify", test_rules_and_verify);
    CU_add_test(s, "plan round trip", test_plan_round_trip);
    CU_add_test(s, "export", test_export);
    return test_main();
}
