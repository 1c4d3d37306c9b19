/* Offloading, the planning side (issue 12): the formats, the simulator's host lanes, and the
 * optimal method with --actions recompute,offload against brute force (every action of
 * every layer of every stage, scored by the simulator), GLPK, and PipeOffload's rules. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "devices.h"
#include "offload.h"
#include "plan_instance.h"
#include "planner.h"
#include "sim.h"
#include "testutil.h"

#define GIB ((int64_t)1 << 30)

/* ---- formats ---- */

/* The T4/RTX4090 cluster with host memory on every stage; `host_link` is a stage member
 * ("" for none). */
static const char *host_cluster(const char *name, int host, const char *host_link)
{
    char text[4096], stages[3000] = "";
    const char *dev[4] = {"T4", "T4", "RTX4090", "RTX4090"};
    for (int s = 0; s < 4; s++) {
        const char *d = dev[s];
        char one[700];
        snprintf(one, sizeof one,
                 "%s{\"device\":\"%s\",\"memory_bytes\":%lld,\"profile\":\"%s/configs/profiles/"
                 "estimated/gpt-1.3b/%s.json\"%s%s%s%s}",
                 s ? "," : "", d, (long long)(s < 2 ? 14 : 22) * GIB, BALLAST_SOURCE_DIR, d,
                 host ? ",\"host_memory_bytes\":" : "", host ? "137438953472" : "",
                 host_link[0] ? "," : "", host_link);
        strcat(stages, one);
    }
    snprintf(text, sizeof text,
             "{\"format\":\"ballast-cluster/1\",\"schedule\":\"gpipe\",\"micro_batches\":8,"
             "\"stages\":[%s]}",
             stages);
    return test_write(name, text);
}

static void test_cluster_host_fields(void)
{
    struct cluster c;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(cluster_load(host_cluster("h.json", 1, ""), &c, &e) == ERR_OK);
    /* no link given: the datasheet's PCIe 3 (T4) and 4 (RTX4090) x16 at the pinned share */
    CU_ASSERT_EQUAL(c.stages[0].host_memory_bytes, 128 * GIB);
    CU_ASSERT(c.stages[0].host_link.present && test_close(c.stages[0].host_link.gbps, 102.4, 0, 1e-12));
    CU_ASSERT(test_close(c.stages[3].host_link.gbps, 204.8, 0, 1e-12));
    cluster_free(&c);
    CU_ASSERT_FATAL(cluster_load(host_cluster("h2.json", 1,
                                              "\"host_link\":{\"gbps\":50,\"latency_us\":7}"),
                                 &c, &e) == ERR_OK);
    CU_ASSERT(c.stages[1].host_link.gbps == 50 && c.stages[1].host_link.latency_us == 7);
    cluster_free(&c);
    CU_ASSERT_FATAL(cluster_load(host_cluster("h3.json", 0, ""), &c, &e) == ERR_OK);
    CU_ASSERT(c.stages[0].host_memory_bytes == 0 && !c.stages[0].host_link.present);
    cluster_free(&c);
}

/* Each GPU's host_link_gbs is its PCIe generation's x16 figure (3/4/5: 16/32/64 GB/s each
 * way), the generation its datasheet source names. */
static void test_devices_pcie(void)
{
    struct device_table t;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(devices_load(BALLAST_SOURCE_DIR "/configs/devices.json", &t, &e) == ERR_OK);
    int checked = 0;
    for (int i = 0; i < t.n; i++) {
        const struct device_spec *d = &t.devices[i];
        const char *gen = strstr(d->source, "PCIe ");
        if (strcmp(d->kind, "cuda") != 0)
            continue;
        CU_ASSERT_FATAL(gen != NULL);
        double want = gen[5] == '3' ? 16 : gen[5] == '4' ? 32 : gen[5] == '5' ? 64 : -1;
        CU_ASSERT(d->host_link_gbs == want);
        struct link l = devices_host_link(d);
        CU_ASSERT(l.present && test_close(l.gbps, want * 8 * 0.8, 0, 1e-12));
        checked++;
    }
    CU_ASSERT(checked >= 9);
    devices_free(&t);
}

static void test_bad_input(void)
{
    char *err = NULL;
    char args[1024];
    /* a link of 0 */
    snprintf(args, sizeof args, "plan --quiet --actions recompute,offload --cluster %s",
             host_cluster("z.json", 1, "\"host_link\":{\"gbps\":0}"));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err && strstr(err, "z.json") && strstr(err, "host_link") && strstr(err, "gbps"));
    free(err);
    /* offload asked where no stage has host memory */
    snprintf(args, sizeof args, "plan --quiet --actions offload --cluster %s",
             host_cluster("n.json", 0, ""));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err && strstr(err, "host_memory_bytes"));
    free(err);
    snprintf(args, sizeof args, "plan --quiet --actions offload,swap --cluster %s",
             host_cluster("n.json", 1, ""));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err && strstr(err, "--actions"));
    free(err);
    snprintf(args, sizeof args, "plan --quiet --method patent --actions offload --cluster %s",
             host_cluster("n.json", 1, ""));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    free(err);
}

/* A plan with offload is written, read back the same, and refused once its host memory is
 * not the cost model's. */
static void test_plan_round_trip(void)
{
    char args[1024], *err = NULL, plan[1024];
    snprintf(plan, sizeof plan, "%s", test_path("off.plan.json"));
    snprintf(args, sizeof args, "plan --quiet --actions recompute,offload --cluster %s -o %s",
             host_cluster("r.json", 1, ""), plan);
    CU_ASSERT_FATAL(test_run(args, NULL, NULL) == 0);
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(plan_load(plan, &p, &e) == ERR_OK);
    int offloaded = 0;
    for (int s = 0; s < p.n_stages; s++) {
        struct plan_stage *st = &p.stages[s];
        struct stage_cost c;
        plan_stage_cost(&p, st, &c);
        offloaded += plan_stage_offloads(st);
        CU_ASSERT(st->host_memory_bytes == c.host_memory_bytes);
        CU_ASSERT(st->host_memory_bytes <= st->host_limit_bytes);
        CU_ASSERT(!plan_stage_offloads(st) || (st->staging_bytes > 0 && st->copy_ms > 0));
    }
    CU_ASSERT(offloaded > 0);
    plan_free(&p);
    snprintf(args, sizeof args, "simulate --plan %s -o %s --trace %s", plan,
             test_path("sim.json"), test_path("trace.json"));
    CU_ASSERT(test_run(args, NULL, NULL) == 0);
    char *sim = test_read(test_path("sim.json")), *trace = test_read(test_path("trace.json"));
    CU_ASSERT(sim && strstr(sim, "stall_ms") && strstr(sim, "copy_in_ms"));
    /* the copy lanes are tracks of the trace, with their slices */
    CU_ASSERT(trace && strstr(trace, "to host (") && strstr(trace, "from host (") &&
              strstr(trace, "prefetch-from-host") && strstr(trace, "copy-to-host"));
    free(sim);
    free(trace);
    /* tamper: one byte more host memory than the cost model's */
    char *text = test_read(plan);
    char *at = strstr(text, "\"host_memory_bytes\":");
    CU_ASSERT_FATAL(at != NULL);
    long long v = atoll(at + 20);
    char *rest = strchr(at + 20, ',');
    char *edited = malloc(strlen(text) + 32);
    snprintf(edited, strlen(text) + 32, "%.*s\"host_memory_bytes\":%lld%s", (int)(at - text), text,
             v + 1, rest);
    const char *bad = test_write("bad.plan.json", edited);
    CU_ASSERT(plan_load(bad, &p, &e) == ERR_INPUT);
    CU_ASSERT(strstr(e.msg, "host_memory_bytes") != NULL);
    free(text);
    free(edited);
    free(err);
}

/* ---- simulator ---- */

/* One stage, one micro-batch, two layers (1 ms forward, 2 ms backward, 3 ms copies, prefetch
 * one layer-op ahead), worked by hand: outs [1,4] [4,7]; layer 1's prefetch waits for its
 * out, [7,10] (stall 8), backward [10,12]; layer 0's is issued at 10, [10,13] (stall 1),
 * backward [13,15]. */
static void test_sim_by_hand(void)
{
    struct sim_layer y[2] = {{.fwd_ms = 1, .bwd_ms = 2, .copy_ms = 3, .ahead = 1},
                             {.fwd_ms = 1, .bwd_ms = 2, .copy_ms = 3, .ahead = 1}};
    struct sim_stage st = {.fwd_ms = 2, .bwd_ms = 4, .n_layers = 2, .layers = y};
    struct sim_result r;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(sim_run(SCHEDULE_1F1B, 1, 1, &st, &r, &e) == ERR_OK);
    CU_ASSERT(test_close(r.iteration_ms, 15, 1e-12, 0));
    CU_ASSERT(test_close(r.stall_ms[0], 9, 1e-12, 0));
    CU_ASSERT(test_close(r.copy_out_ms[0], 6, 1e-12, 0) && test_close(r.copy_in_ms[0], 6, 1e-12, 0));
    sim_result_free(&r);
    /* two layer-ops ahead: both prefetches issued earlier, layer 0's at the step's start */
    y[0].ahead = y[1].ahead = 2;
    CU_ASSERT_FATAL(sim_run(SCHEDULE_1F1B, 1, 1, &st, &r, &e) == ERR_OK);
    CU_ASSERT(r.iteration_ms <= 15);
    sim_result_free(&r);
}

/* Layer by layer with no copies is the stage as one forward and one backward. */
static void test_sim_layers_without_copies(void)
{
    struct test_rng rng = {7};
    for (int trial = 0; trial < 20; trial++) {
        int S = (int)test_rng_int(&rng, 1, 5), M = (int)test_rng_int(&rng, 1, 9);
        struct sim_stage st[5], whole[5];
        struct sim_layer y[5][3];
        for (int s = 0; s < S; s++) {
            whole[s] = (struct sim_stage){.out_bytes = 1000, .link = {1, 10, 5}};
            for (int l = 0; l < 3; l++) {
                y[s][l] = (struct sim_layer){.fwd_ms = test_rng_double(&rng, 0.5, 2),
                                             .bwd_ms = test_rng_double(&rng, 1, 4),
                                             .recompute_ms = test_rng_double(&rng, 0, 1)};
                whole[s].fwd_ms += y[s][l].fwd_ms;
                whole[s].bwd_ms += y[s][l].bwd_ms;
                whole[s].recompute_ms += y[s][l].recompute_ms;
            }
            st[s] = whole[s];
            st[s].n_layers = 3;
            st[s].layers = y[s];
        }
        for (int g = 0; g < 2; g++) {
            double a, b;
            struct err e;
            err_clear(&e);
            CU_ASSERT(sim_makespan(g, S, M, st, &a, &e) == ERR_OK);
            CU_ASSERT(sim_makespan(g, S, M, whole, &b, &e) == ERR_OK);
            CU_ASSERT(test_close(a, b, 1e-9, 1e-12));
        }
    }
}

/* ---- planner ---- */

/* A custom model of n layers on S stages (split as evenly as may be unless `uneven`), each
 * layer with `options` partial options (1 or 2), M micro-batches, in memory. */
static void instance_make_sized(struct instance *in, struct test_rng *r, enum schedule sched,
                                double gbps, int64_t host, int n, int S, int M, int options,
                                int uneven)
{
    instance_init(in, n, S, sched, M, gbps, host);
    for (int l = 0; l < n; l++) {
        struct layer_cost *c = &in->prof.layers[l];
        c->fwd_ms = test_rng_double(r, 1, 4);
        c->bwd_ms = 2 * c->fwd_ms;
        c->state_bytes = test_rng_int(r, 1, 4) * GIB;
        c->act_bytes = test_rng_int(r, 2, 8) * GIB;
        c->ckpt_bytes = c->act_bytes / 8;
        c->out_bytes = c->ckpt_bytes;
        c->workspace_bytes = GIB / 4;
        instance_attn_option(c, r);
        if (options > 1) /* an `mlp` option: a smaller share, a cheaper recompute */
            instance_mlp_option(c, r);
    }
    struct cluster *c = &in->c;
    for (int s = 0; s < S; s++) {
        struct cluster_stage *st = &c->stages[s];
        if (uneven && s > 0) /* one layer more or less than the even split, at random */
            st->first = c->stages[s - 1].last + 1;
        if (uneven && s + 1 < S) {
            int64_t last = st->last + test_rng_int(r, -1, 1);
            int64_t most = n - (S - s - 1); /* every later stage keeps a layer */
            st->last = (int)(last < st->first ? st->first : last > most - 1 ? most - 1 : last);
        } else if (uneven) {
            st->last = n - 1;
        }
        /* between keeping nothing and keeping everything */
        int64_t all = 0, state = 0;
        int v = schedule_in_flight(sched, S, s, c->micro_batches);
        for (int l = st->first; l <= st->last; l++) {
            all += in->prof.layers[l].act_bytes * v;
            state += in->prof.layers[l].state_bytes;
        }
        st->memory_bytes = state + 8 * GIB + (int64_t)(test_rng_double(r, 0.2, 0.9) * (double)all);
    }
}

/* 2 stages x 2 layers with one partial option, 4 micro-batches. */
static void instance_make(struct instance *in, struct test_rng *r, enum schedule sched,
                          double gbps, int64_t host)
{
    instance_make_sized(in, r, sched, gbps, host, 4, 2, 4, 1, 0);
}

/* Plans with the knapsack's memory unit `unit` bytes (0: the default). */
static int plan_with_unit(const struct instance *in, int actions, int64_t unit, struct plan *p)
{
    struct plan_options o;
    struct err e;
    plan_options_default(&o);
    err_clear(&e);
    o.actions = actions;
    o.unit_bytes = unit > 0 ? unit : o.unit_bytes;
    return planner_make(&in->c, &o, p, &e);
}

static void test_exact_against_brute_force(void)
{
    struct test_rng rng = {42};
    static const int sets[] = {PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD, PLAN_ACTION_OFFLOAD};
    int checked = 0, offloaded = 0;
    for (int trial = 0; trial < 16; trial++) {
        struct instance in;
        instance_make(&in, &rng, trial % 2 ? SCHEDULE_GPIPE : SCHEDULE_1F1B,
                      test_rng_double(&rng, 20, 400), test_rng_int(&rng, 4, 64) * GIB);
        for (int k = 0; k < 2; k++) {
            struct plan p;
            int rc = plan_with(&in, sets[k], 0, &p);
            double want;
            if (rc == ERR_OK) {
                double got = p.iteration_ms;
                for (int s = 0; s < p.n_stages; s++)
                    offloaded += plan_stage_offloads(&p.stages[s]);
                want = instance_brute_force(&p, sets[k], 0);
                CU_ASSERT(test_close(got, want, 1e-9, 1e-12));
                if (!test_close(got, want, 1e-9, 1e-12))
                    printf("\ntrial %d actions %d: planner %.9g ms, brute force %.9g ms\n",
                           trial, sets[k], got, want);
                plan_free(&p);
                checked++;
            } else {
                CU_ASSERT_EQUAL(rc, ERR_NOFIT);
            }
        }
        instance_free(&in);
    }
    printf(" [%d plans, %d offloading stages] ", checked, offloaded);
    CU_ASSERT(checked >= 8);
    CU_ASSERT(offloaded > 0);
}

/* The verify MILP's least recompute equals the search's, stage by stage. */
static void test_verify_milp(void)
{
    struct test_rng rng = {5};
    int verified = 0;
    for (int trial = 0; trial < 6; trial++) {
        struct instance in;
        struct plan p;
        instance_make(&in, &rng, SCHEDULE_1F1B, 100, test_rng_int(&rng, 2, 40) * GIB);
        if (plan_with(&in, PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD, 1, &p) == ERR_OK) {
            CU_ASSERT(p.verify.present && p.verify.agree);
            verified++;
            plan_free(&p);
        }
        instance_free(&in);
    }
    CU_ASSERT(verified >= 3);
}

/* Frees the recompute-only plan and the one with offload, each where it was made (rc a, c). */
static void plans_free(int a, struct plan *rec, int c, struct plan *both)
{
    if (a == ERR_OK)
        plan_free(rec);
    if (c == ERR_OK)
        plan_free(both);
}

/* PipeOffload's rules: a superset of actions is never slower; a very slow link gets no
 * offload; a fast link and a roomy host make a tight stage offload instead of recompute. */
static void test_pipeoffload_rules(void)
{
    struct test_rng rng = {99};
    int tight = 0;
    for (int trial = 0; trial < 10; trial++) {
        struct instance in;
        struct plan rec, off, both;
        instance_make(&in, &rng, trial % 2 ? SCHEDULE_GPIPE : SCHEDULE_1F1B, 200, 200 * GIB);
        int a = plan_with(&in, PLAN_ACTION_RECOMPUTE, 0, &rec);
        int b = plan_with(&in, PLAN_ACTION_OFFLOAD, 0, &off);
        int c = plan_with(&in, PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD, 0, &both);
        CU_ASSERT(c == ERR_OK || (a != ERR_OK && b != ERR_OK));
        if (a == ERR_OK && c == ERR_OK)
            CU_ASSERT(both.iteration_ms <= rec.iteration_ms);
        if (b == ERR_OK && c == ERR_OK)
            CU_ASSERT(both.iteration_ms <= off.iteration_ms);
        if (a == ERR_OK)
            plan_free(&rec);
        if (b == ERR_OK)
            plan_free(&off);
        if (c == ERR_OK)
            plan_free(&both);
        /* very slow link: nothing offloaded, the plan is the recompute-only one */
        for (int s = 0; s < in.c.n_stages; s++)
            in.c.stages[s].host_link.gbps = 1e-4;
        a = plan_with(&in, PLAN_ACTION_RECOMPUTE, 0, &rec);
        c = plan_with(&in, PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD, 0, &both);
        CU_ASSERT_EQUAL(a, c);
        if (a == ERR_OK) {
            for (int s = 0; s < both.n_stages; s++)
                CU_ASSERT(!plan_stage_offloads(&both.stages[s]));
            CU_ASSERT(both.iteration_ms == rec.iteration_ms);
            plan_free(&rec);
            plan_free(&both);
        }
        /* fast link, roomy host: the first stage (in flight longest) offloads and
         * recomputes nothing where recompute-only had to recompute. Offloading a layer
         * saves v x its bytes and costs up to three staging buffers of them (cost.h), so
         * the rule is for stages holding more micro-batches than that: GPipe with 8. */
        in.c.schedule = SCHEDULE_GPIPE;
        in.c.micro_batches = 8;
        for (int s = 0; s < in.c.n_stages; s++)
            in.c.stages[s].host_link = (struct link){1, 1e6, 0};
        a = plan_with(&in, PLAN_ACTION_RECOMPUTE, 0, &rec);
        c = plan_with(&in, PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD, 0, &both);
        if (a == ERR_OK && c == ERR_OK && rec.stages[0].recompute_ms > 0) {
            tight++;
            CU_ASSERT(plan_stage_offloads(&both.stages[0]));
            CU_ASSERT(both.stages[0].recompute_ms < rec.stages[0].recompute_ms);
            CU_ASSERT(both.iteration_ms < rec.iteration_ms);
        }
        plans_free(a, &rec, c, &both);
        instance_free(&in);
    }
    CU_ASSERT(tight > 0);
}

/* A superset of actions is never slower, on stages too long for the search to enumerate
 * (up to 16 layers of two options each: 6^16 action combinations) and clusters of up to 8
 * stages: the plan with offload simulates no slower than the recompute-only one. */
static void test_superset_never_slower(void)
{
    struct test_rng rng = {2024};
    int compared = 0, faster = 0;
    for (int trial = 0; trial < 300; trial++) {
        struct instance in;
        struct plan rec, both;
        int S = (int)test_rng_int(&rng, 2, 8), per = (int)test_rng_int(&rng, 3, 16);
        int M = (int)test_rng_int(&rng, S, 3 * S);
        /* links from ones whose copies take longer than the layers to ones they hide in */
        double gbps = pow(10, test_rng_double(&rng, 2, 5));
        instance_make_sized(&in, &rng, trial % 2 ? SCHEDULE_GPIPE : SCHEDULE_1F1B, gbps,
                            test_rng_int(&rng, 2, 200) * GIB, S * per, S, M, 1 + trial % 3 % 2,
                            trial % 4 >= 2);
        /* a coarse knapsack unit now and then: its recompute-only choice is then not the
         * least the exact search finds on the device alone */
        int64_t unit = trial % 3 == 2 ? test_rng_int(&rng, 64, 1024) << 20 : 0;
        int a = plan_with_unit(&in, PLAN_ACTION_RECOMPUTE, unit, &rec);
        int c = plan_with_unit(&in, PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD, unit, &both);
        CU_ASSERT(a != ERR_OK || c == ERR_OK);
        if (a == ERR_OK && c == ERR_OK) {
            compared++;
            faster += both.iteration_ms < rec.iteration_ms;
            CU_ASSERT(both.iteration_ms <= rec.iteration_ms);
            if (!(both.iteration_ms <= rec.iteration_ms))
                printf("\ntrial %d (%d stages x %d layers): offload %.9g ms, recompute-only "
                       "%.9g ms\n",
                       trial, S, per, both.iteration_ms, rec.iteration_ms);
        }
        plans_free(a, &rec, c, &both);
        instance_free(&in);
    }
    printf(" [%d compared, %d faster with offload] ", compared, faster);
    CU_ASSERT(compared >= 12);
    CU_ASSERT(faster > 0);
}

/* --repartition with offload: the recompute-only search's split and order, each stage's
 * actions then with offload: never slower than recompute-only --repartition, and a plan that
 * offloads carries no gap (the search's bound is for recompute only). */
static void test_repartition_with_offload(void)
{
    struct test_rng rng = {77};
    int compared = 0, offloading = 0;
    for (int trial = 0; trial < 40; trial++) {
        struct instance in;
        struct plan rec, both;
        struct plan_options o;
        struct err e;
        int S = (int)test_rng_int(&rng, 2, 5), per = (int)test_rng_int(&rng, 2, 6);
        int M = (int)test_rng_int(&rng, S, 3 * S);
        double gbps = pow(10, test_rng_double(&rng, 2, 5));
        instance_make_sized(&in, &rng, trial % 2 ? SCHEDULE_GPIPE : SCHEDULE_1F1B, gbps,
                            test_rng_int(&rng, 2, 200) * GIB, S * per, S, M, 1 + trial % 2,
                            trial % 3 == 0);
        plan_options_default(&o);
        err_clear(&e);
        o.repartition = 1;
        int a = planner_make(&in.c, &o, &rec, &e);
        o.actions = PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD;
        int c = planner_make(&in.c, &o, &both, &e);
        CU_ASSERT(a != ERR_OK || c == ERR_OK);
        if (c == ERR_OK) {
            int any = 0;
            for (int s = 0; s < both.n_stages; s++)
                any |= plan_stage_offloads(&both.stages[s]);
            offloading += any;
            CU_ASSERT(strcmp(both.method, "optimal+repartition") == 0);
            CU_ASSERT(any ? both.optimality_gap < 0 && !both.search.present
                          : both.search.present);
        }
        if (a == ERR_OK && c == ERR_OK) {
            compared++;
            CU_ASSERT(both.iteration_ms <= rec.iteration_ms);
            if (!(both.iteration_ms <= rec.iteration_ms))
                printf("\ntrial %d: offload %.9g ms, recompute-only %.9g ms\n", trial,
                       both.iteration_ms, rec.iteration_ms);
        }
        plans_free(a, &rec, c, &both);
        instance_free(&in);
    }
    printf(" [%d compared, %d offloading] ", compared, offloading);
    CU_ASSERT(compared >= 10);
    CU_ASSERT(offloading > 0);
    /* on the command line (refused before, exit 2): the report says where split and order
     * came from */
    char args[1024], *out = NULL;
    snprintf(args, sizeof args,
             "plan --method optimal+repartition --actions recompute,offload --cluster %s",
             host_cluster("rp.json", 1, ""));
    CU_ASSERT_EQUAL(test_run(args, &out, NULL), 0);
    CU_ASSERT(out && strstr(out, "split and order: --repartition's search with recompute only"));
    free(out);
    /* the optimizer on the host, too: chosen on the searched split, and then no gap (the
     * search's bound is for recompute only) */
    struct plan p;
    struct err e;
    const char *file = test_path("rp-opt.json");
    snprintf(args, sizeof args,
             "plan --method optimal --repartition --actions recompute,optimizer --quiet --cluster "
             "%s/configs/clusters/cpu-3-offload.json -o %s",
             BALLAST_SOURCE_DIR, file);
    CU_ASSERT_EQUAL(test_run(args, NULL, NULL), 0);
    err_clear(&e);
    CU_ASSERT_FATAL(plan_load(file, &p, &e) == ERR_OK);
    int hosts = 0;
    for (int s = 0; s < p.n_stages; s++)
        hosts += p.stages[s].optimizer == COST_PLACE_HOST;
    CU_ASSERT(hosts > 0);
    CU_ASSERT(p.optimality_gap < 0 && !p.search.present);
    plan_free(&p);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("offload_plan", NULL, NULL);
    CU_add_test(s, "cluster host fields", test_cluster_host_fields);
    CU_add_test(s, "devices' PCIe host links", test_devices_pcie);
    CU_add_test(s, "bad input", test_bad_input);
    CU_add_test(s, "plan round trip", test_plan_round_trip);
    CU_add_test(s, "simulator by hand", test_sim_by_hand);
    CU_add_test(s, "layers without copies", test_sim_layers_without_copies);
    CU_add_test(s, "exact against brute force", test_exact_against_brute_force);
    CU_add_test(s, "verify MILP", test_verify_milp);
    CU_add_test(s, "PipeOffload rules", test_pipeoffload_rules);
    CU_add_test(s, "superset never slower", test_superset_never_slower);
    CU_add_test(s, "repartition with offload", test_repartition_with_offload);
    return test_main();
}
