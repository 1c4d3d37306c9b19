/* A fraction of the optimizer on the host (--actions ...,optimizer-fraction; issue 31): the
 * cost model and the simulator by hand, the planner against brute force over every optimizer
 * place of every stage (device, host, the host from each of its layers on) and every action of
 * every layer, the fraction's plans against the whole optimizer's (never slower, the same
 * where no stage splits), plan files with a split and without (older files), and the export
 * to Megatron-LM's one global fraction. */
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

enum {
    WHOLE = PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OPTIMIZER,
    FRACTION = WHOLE | PLAN_ACTION_OPTIMIZER_FRACTION,
};

/* ---- cost model and simulator by hand ---- */

/* Three layers, layer k of param 10(k+1), grad 10(k+1), optimizer 20(k+1); the host takes the
 * last two: the device keeps layer 0's state and the others' weights and gradients, the host
 * mirrors 4 x their gradients; with ZeRO-1 over 3 replicas a mirror is a third (rounded up). */
static void test_cost_by_hand(void)
{
    struct layer_cost l[3];
    memset(l, 0, sizeof l);
    for (int k = 0; k < 3; k++) {
        l[k].has_split = 1;
        l[k].param_bytes = 10 * (k + 1);
        l[k].grad_bytes = 10 * (k + 1);
        l[k].optimizer_bytes = 20 * (k + 1);
        l[k].state_bytes = 40 * (k + 1);
        l[k].act_bytes = l[k].ckpt_bytes = 1;
    }
    struct cost_actions a = {.optimizer = COST_PLACE_HOST, .optimizer_from = 1};
    struct stage_cost c;
    cost_stage_actions(l, 3, &a, 1, 0, &c);
    CU_ASSERT_EQUAL(c.state_bytes, 40 + 40 + 60);
    CU_ASSERT_EQUAL(c.host_memory_bytes, 4 * (20 + 30));
    CU_ASSERT_EQUAL(cost_stage_mirror(l, 3, 1), 200);
    CU_ASSERT(test_close(cost_optimizer_fraction(l, 3, 1), 100.0 / 120.0, 1e-15, 0));
    CU_ASSERT(test_close(cost_optimizer_fraction(l, 3, 3), 0, 0, 0));
    a.optimizer_from = 0; /* the whole stage, as before fractions */
    cost_stage_actions(l, 3, &a, 1, 0, &c);
    CU_ASSERT_EQUAL(c.state_bytes, 20 + 40 + 60);
    CU_ASSERT_EQUAL(c.host_memory_bytes, 4 * 60);
    a.optimizer = COST_PLACE_DEVICE; /* the device ignores optimizer_from */
    a.optimizer_from = 2;
    cost_stage_actions(l, 3, &a, 1, 0, &c);
    CU_ASSERT_EQUAL(c.state_bytes, 240);
    CU_ASSERT_EQUAL(c.host_memory_bytes, 0);
    for (int k = 0; k < 3; k++)
        l[k].optimizer_shards = 3;
    CU_ASSERT_EQUAL(cost_layer_mirror(&l[0]), 14); /* 40 / 3 up */
    CU_ASSERT_EQUAL(cost_stage_mirror(l, 3, 1), 27 + 40);
}

/* One stage, one micro-batch, two layers (1 ms forward, 2 ms backward): layer 1's optimizer
 * on the host (gradients 3 ms down, AdamW 4 ms, parameters 1 ms up), layer 0's on the device
 * (5 ms). Forwards [0,2]; backwards layer 1 [2,4], layer 0 [4,6]. Host: down [4,7], AdamW
 * [7,11], up [11,12]; device: [6,11]. The step ends at 12; with the device's 7 ms, at 13. */
static void test_sim_split_by_hand(void)
{
    struct layer_cost l[2];
    memset(l, 0, sizeof l);
    struct sim_layer y[2] = {{.fwd_ms = 1, .bwd_ms = 2}, {.fwd_ms = 1, .bwd_ms = 2}};
    struct link host = {1, 8, 0}; /* 1e6 bytes a millisecond */
    for (int k = 0; k < 2; k++) {
        l[k].has_split = 1;
        l[k].grad_bytes = 3000000;
        l[k].param_bytes = 1000000;
        l[k].optimizer_ms = k == 0 ? 5 : 100; /* layer 1's is the host's */
        l[k].host_optimizer_ms = 4;
    }
    struct sim_stage st = {.fwd_ms = 2, .bwd_ms = 4};
    sim_stage_optimizer_from(l, 2, COST_PLACE_HOST, 1, &host, &st, y);
    CU_ASSERT(st.host_optimizer && st.host_from == 1 && st.n_layers == 2);
    CU_ASSERT(test_close(st.optimizer_ms, 5, 0, 0));
    struct sim_result r;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(sim_run(SCHEDULE_1F1B, 1, 1, &st, &r, &e) == ERR_OK);
    CU_ASSERT(test_close(r.iteration_ms, 12, 1e-12, 0));
    CU_ASSERT(test_close(r.update_ms[0], 5 + 4, 1e-12, 0));
    CU_ASSERT(test_close(r.copy_out_ms[0], 3, 1e-12, 0) && test_close(r.copy_in_ms[0], 1, 1e-12, 0));
    sim_result_free(&r);
    st.optimizer_ms = 7;
    CU_ASSERT_FATAL(sim_run(SCHEDULE_1F1B, 1, 1, &st, &r, &e) == ERR_OK);
    CU_ASSERT(test_close(r.iteration_ms, 13, 1e-12, 0));
    sim_result_free(&r);
    /* a host part starting past the stage's layers is refused */
    st.host_from = 2;
    CU_ASSERT_EQUAL(sim_run(SCHEDULE_1F1B, 1, 1, &st, &r, &e), ERR_INPUT);
}

/* ---- planner ---- */

/* instance_hostopt_make's instance, its layers' host steps twice as slow and device steps
 * twice as fast (so hosting less is worth it). */
static void instance_make(struct instance *in, struct test_rng *r, enum schedule sched,
                          double gbps, int64_t host, double room)
{
    instance_hostopt_make(in, r, sched, gbps, host, room);
    for (int l = 0; l < in->prof.n_layers; l++) {
        in->prof.layers[l].host_optimizer_ms *= 2;
        in->prof.layers[l].optimizer_ms /= 2;
    }
}

static int splits(const struct plan *p)
{
    int n = 0;
    for (int s = 0; s < p->n_stages; s++)
        n += p->stages[s].optimizer == COST_PLACE_HOST && p->stages[s].optimizer_from > 0;
    return n;
}

/* The planner's step is brute force's over every optimizer place and layer action; it is
 * never slower than the whole optimizer's, and equal to it (places and all) where it splits
 * no stage; fraction 0 and 1 alone (--actions optimizer) are brute force restricted to
 * them. */
static void test_exact_against_brute_force(void)
{
    struct test_rng rng = {31};
    int checked = 0, split = 0, faster = 0, same = 0;
    static const int offload[] = {0, PLAN_ACTION_OFFLOAD};
    for (int trial = 0; trial < 24; trial++) {
        struct instance in;
        instance_make(&in, &rng, trial % 3 == 2 ? SCHEDULE_GPIPE : SCHEDULE_1F1B,
                      test_rng_double(&rng, 20, 800), test_rng_int(&rng, 8, 40) * GIB, -1);
        for (int k = 0; k < 2; k++) {
            struct plan p, w;
            int rc = plan_with(&in, FRACTION | offload[k], 0, &p);
            int rw = plan_with(&in, WHOLE | offload[k], 0, &w);
            CU_ASSERT(rc == ERR_OK || rc == ERR_NOFIT);
            CU_ASSERT(rw == ERR_OK || rw == ERR_NOFIT);
            CU_ASSERT(rw != ERR_OK || rc == ERR_OK); /* a superset fits where a subset does */
            if (rc != ERR_OK)
                continue;
            int split_here = splits(&p) > 0, same_places = 1;
            for (int s = 0; rw == ERR_OK && s < p.n_stages; s++)
                same_places &= p.stages[s].optimizer == w.stages[s].optimizer &&
                               p.stages[s].optimizer_from == 0;
            double want = instance_brute_force(&p, FRACTION | offload[k], 0);
            CU_ASSERT(test_close(p.iteration_ms, want, 1e-9, 1e-12));
            if (!test_close(p.iteration_ms, want, 1e-9, 1e-12))
                printf("\ntrial %d offload %d: planner %.9g ms, brute force %.9g ms\n", trial, k,
                       p.iteration_ms, want);
            split += split_here;
            if (rw == ERR_OK) {
                CU_ASSERT(p.iteration_ms <= w.iteration_ms);
                faster += p.iteration_ms < w.iteration_ms;
                if (!split_here) {
                    CU_ASSERT_EQUAL(p.iteration_ms, w.iteration_ms);
                    CU_ASSERT(same_places);
                    same++;
                }
                double whole = instance_brute_force(&w, WHOLE | offload[k], 0);
                CU_ASSERT(test_close(w.iteration_ms, whole, 1e-9, 1e-12));
                if (!test_close(w.iteration_ms, whole, 1e-9, 1e-12))
                    printf("\ntrial %d offload %d whole: planner %.9g ms, brute force %.9g ms\n",
                           trial, k, w.iteration_ms, whole);
                plan_free(&w);
            }
            plan_free(&p);
            checked++;
        }
        instance_free(&in);
    }
    printf(" [%d plans, %d split a stage's optimizer, %d faster than the whole optimizer's, "
           "%d the same] ",
           checked, split, faster, same);
    CU_ASSERT(checked >= 24 && split > 0 && faster > 0 && same > 0);
}

/* Roomy devices: no stage hosts anything, and the plan is the recompute-only one. */
static void test_roomy(void)
{
    struct test_rng rng = {5};
    struct instance in;
    struct plan rec, frac;
    instance_make(&in, &rng, SCHEDULE_1F1B, 100, 64 * GIB, 1);
    CU_ASSERT_FATAL(plan_with(&in, PLAN_ACTION_RECOMPUTE, 0, &rec) == ERR_OK);
    CU_ASSERT_FATAL(plan_with(&in, FRACTION, 1, &frac) == ERR_OK);
    CU_ASSERT_EQUAL(frac.iteration_ms, rec.iteration_ms);
    CU_ASSERT(frac.verify.present && frac.verify.agree);
    for (int s = 0; s < frac.n_stages; s++)
        CU_ASSERT_EQUAL(frac.stages[s].optimizer, COST_PLACE_DEVICE);
    plan_free(&rec);
    plan_free(&frac);
    instance_free(&in);
}

/* A plan whose stage 0 hosts its last layer's optimizer (made by the planner on a random
 * instance where it chooses one), or 0 when none did. */
static int split_plan(struct plan *p, struct instance *in)
{
    struct test_rng rng = {31};
    for (int trial = 0; trial < 200; trial++) {
        instance_make(in, &rng, SCHEDULE_1F1B, test_rng_double(&rng, 20, 800),
                      test_rng_int(&rng, 8, 40) * GIB, -1);
        if (plan_with(in, FRACTION, 0, p) == ERR_OK) {
            if (splits(p) > 0)
                return 1;
            plan_free(p);
        }
        instance_free(in);
    }
    return 0;
}

static char *read_text(const char *file)
{
    FILE *f = fopen(file, "rb");
    char *text = calloc(1 << 20, 1);
    if (f != NULL && text != NULL)
        text[fread(text, 1, (1 << 20) - 1, f)] = '\0';
    if (f != NULL)
        fclose(f);
    return text;
}

/* `text` with its first `from` replaced by `to`, written to tmpdir/name; loaded there. */
static int load_edited(const char *text, const char *from, const char *to, const char *name,
                       struct plan *q, struct err *e)
{
    char *out = malloc(strlen(text) + strlen(to) + 1);
    const char *at = strstr(text, from);
    CU_ASSERT_FATAL(out != NULL && at != NULL);
    sprintf(out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    const char *f = test_write(name, out);
    free(out);
    err_clear(e);
    return plan_load(f, q, e);
}

/* Written and read back; the older "host" (every layer) still reads; a split without its
 * layers, a range that is not the stage's last layers, and a fraction that is not the cost
 * model's are refused, named. */
static void test_plan_file(void)
{
    struct instance in;
    struct plan p, q;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(split_plan(&p, &in));
    int s = p.stages[0].optimizer_from > 0 ? 0 : 1;
    const struct plan_stage *st = &p.stages[s];
    const char *f = test_path("split-plan.json");
    CU_ASSERT_FATAL(plan_write(f, &p, &e) == ERR_OK);
    CU_ASSERT_FATAL(plan_load(f, &q, &e) == ERR_OK);
    CU_ASSERT_EQUAL(q.stages[s].optimizer, COST_PLACE_HOST);
    CU_ASSERT_EQUAL(q.stages[s].optimizer_from, st->optimizer_from);
    CU_ASSERT_EQUAL(q.stages[s].host_memory_bytes, st->host_memory_bytes);
    CU_ASSERT_EQUAL(q.iteration_ms, p.iteration_ms);
    plan_free(&q);
    char *text = read_text(f), range[64], frac[64];
    CU_ASSERT_FATAL(strstr(text, "\"optimizer\":\t\"split\"") != NULL);
    snprintf(range, sizeof range, "\"optimizer_host_layers\":\t[%d, %d]",
             st->first + st->optimizer_from, st->last);
    CU_ASSERT_FATAL(strstr(text, range) != NULL);
    CU_ASSERT_EQUAL(load_edited(text, range, "\"x\": 0", "split-nolayers.json", &q, &e),
                    ERR_INPUT);
    CU_ASSERT(strstr(e.msg, "optimizer_host_layers: missing") != NULL);
    char wrong[64];
    snprintf(wrong, sizeof wrong, "\"optimizer_host_layers\": [%d, %d]", st->first, st->last);
    CU_ASSERT_EQUAL(load_edited(text, range, wrong, "split-all.json", &q, &e), ERR_INPUT);
    CU_ASSERT(strstr(e.msg, "leaves its first layer's on the device") != NULL);
    snprintf(frac, sizeof frac, "\"optimizer_fraction\":\t%.17g",
             plan_stage_optimizer_fraction(st));
    if (strstr(text, frac) != NULL) { /* cJSON may print it shorter */
        CU_ASSERT_EQUAL(load_edited(text, frac, "\"optimizer_fraction\": 0.999", "split-frac.json",
                                    &q, &e),
                        ERR_INPUT);
        CU_ASSERT(strstr(e.msg, "optimizer_fraction: 0.999") != NULL);
    }
    free(text);
    /* an older plan: "host" and nothing else hosts every layer */
    struct plan_stage *w = &p.stages[s];
    w->optimizer_from = 0;
    w->host_limit_bytes = 1000 * GIB;
    w->memory_limit_bytes = w->capacity_bytes = 1000 * GIB;
    CU_ASSERT_FATAL(planner_finish(&p, &e) == ERR_OK);
    CU_ASSERT_FATAL(plan_write(f, &p, &e) == ERR_OK);
    text = read_text(f);
    CU_ASSERT_FATAL(strstr(text, "\"optimizer\":\t\"host\"") != NULL);
    snprintf(range, sizeof range, "\"optimizer_host_layers\":\t[%d, %d]", w->first, w->last);
    CU_ASSERT_EQUAL(load_edited(text, range, "\"x\": 0", "old-host.json", &q, &e), ERR_OK);
    CU_ASSERT(q.stages[s].optimizer == COST_PLACE_HOST && q.stages[s].optimizer_from == 0);
    plan_free(&q);
    free(text);
    plan_free(&p);
    instance_free(&in);
}

static void set_optimizer_bytes(struct layer_cost *c, int64_t bytes)
{
    c->state_bytes += bytes - c->optimizer_bytes;
    c->optimizer_bytes = bytes;
}

/* Megatron-LM's fraction is one for every rank: the same share on every stage exports as it
 * is, as --optimizer-offload-fraction; different shares are planned again for Megatron-LM,
 * said with the reason. */
static void test_export(void)
{
    struct instance in;
    struct plan p;
    struct err e;
    char text[8192], note[8192];
    CU_ASSERT_FATAL(split_plan(&p, &in));
    for (int s = 0; s < p.n_stages; s++) { /* 2 layers a stage: each hosts its last one's */
        p.stages[s].optimizer = COST_PLACE_HOST;
        p.stages[s].optimizer_from = 1;
    }
    for (int l = 0; l < 2; l++) /* shares 2/3 and 1/2 */
        for (int s = 0; s < p.n_stages; s++)
            set_optimizer_bytes(&p.stages[s].layers[l], (s == 0 ? l + 1 : 1) * GIB);
    err_clear(&e);
    CU_ASSERT_FATAL(planner_finish(&p, &e) == ERR_OK);
    CU_ASSERT_EQUAL(instance_export(&p, "megatron", text, note, sizeof text, &e), ERR_OK);
    CU_ASSERT(strstr(note, "cannot run the plan as it is (the stages keep different shares of "
                           "their optimizer on the host (0.667 and stage 1's 0.5)") != NULL);
    /* shares made equal: exported as they are */
    for (int s = 0; s < p.n_stages; s++)
        for (int l = 0; l < 2; l++)
            set_optimizer_bytes(&p.stages[s].layers[l], (l + 1) * GIB);
    err_clear(&e);
    CU_ASSERT_FATAL(planner_finish(&p, &e) == ERR_OK);
    CU_ASSERT_EQUAL(instance_export(&p, "megatron", text, note, sizeof text, &e), ERR_OK);
    CU_ASSERT(strstr(text, "--optimizer-cpu-offload \\\n--optimizer-offload-fraction 0.6667") !=
              NULL);
    CU_ASSERT(strstr(note, "cannot run the plan as it is") == NULL);
    plan_free(&p);
    instance_free(&in);
}

/* `ballast plan --actions` takes optimizer-fraction (which needs nothing else) and names it
 * among the actions when refusing a typo. */
static void test_actions_parse(void)
{
    struct plan_options o;
    struct err e;
    plan_options_default(&o);
    err_clear(&e);
    CU_ASSERT_EQUAL(plan_actions_parse("recompute,optimizer-fraction", &o, &e), ERR_OK);
    CU_ASSERT_EQUAL(o.actions, FRACTION);
    CU_ASSERT_EQUAL(plan_actions_parse("optimizer-fractions", &o, &e), ERR_INPUT);
    CU_ASSERT(strstr(e.msg, "optimizer-fraction") != NULL);
    o.actions = PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OPTIMIZER_FRACTION; /* without optimizer */
    err_clear(&e);
    CU_ASSERT_EQUAL(plan_options_check(&o, &e), ERR_INPUT);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("optimizer fraction", NULL, NULL);
    CU_add_test(s, "cost model by hand", test_cost_by_hand);
    CU_add_test(s, "simulator: a split step by hand", test_sim_split_by_hand);
    CU_add_test(s, "exact against brute force; never slower than the whole", test_exact_against_brute_force);
    CU_add_test(s, "roomy devices: nothing on the host", test_roomy);
    CU_add_test(s, "plan files", test_plan_file);
    CU_add_test(s, "export to Megatron-LM", test_export);
    CU_add_test(s, "--actions", test_actions_parse);
    return test_main();
}
