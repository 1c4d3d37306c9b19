/* Training on an activation arena carved from the plan's reuse layout (plan --arena): with
 * every layout the losses and the final state are bitwise those of the plain run (the slots
 * carving, no arena in the plan), no two objects in use at once share a byte (--check-arena),
 * and each stage's measured peak is its plan's memory within 2% (train_run_ok). The plans
 * recompute each stage's first layer, which leaves holes in the slots carving that the
 * layouts fill: the arenas are smaller than the slots'. A plan whose lifetimes are wrong is
 * caught by --check-arena. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "reference.h"
#include "traintest.h"

#define NP 3
#define LIMIT_S 180

static char cluster_file[1024];

#define ROOMY 1073741824LL
#define TIGHT 37748736LL /* stage 1 under block:1: fits with the greedy arena, not the slots' */

static void write_cluster(const char *schedule, long long stage1)
{
    char text[2048], name[64];
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"%s\", \"micro_batches\": 4, "
             "\"stages\": ["
             "{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
             "\"%s/configs/profiles/estimated/gpt-tiny/cpu.json\", \"layers\": [0, 2]},"
             "{\"device\": \"cpu\", \"memory_bytes\": %lld, \"profile\": "
             "\"%s/configs/profiles/estimated/gpt-tiny/cpu.json\", \"layers\": [3, 5]},"
             "{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
             "\"%s/configs/profiles/estimated/gpt-tiny/cpu.json\", \"layers\": [6, 7]}]}",
             schedule, BALLAST_SOURCE_DIR, stage1, BALLAST_SOURCE_DIR, BALLAST_SOURCE_DIR);
    snprintf(name, sizeof name, "arena-cluster-%s-%lld.json", schedule, stage1);
    snprintf(cluster_file, sizeof cluster_file, "%s", test_write(name, text));
}

/* `ballast plan --method block:1 [--arena METHOD]` into tmpdir/NAME. */
static const char *make_plan(const char *arena, const char *name)
{
    char flags[256];
    snprintf(flags, sizeof flags, "--method block:1 %s%s", arena ? "--arena " : "",
             arena ? arena : "");
    return train_plan_cluster(cluster_file, flags, name);
}

static int same_losses(const struct train_metrics *a, const struct train_metrics *b)
{
    if (a->n_steps != b->n_steps || a->n_steps == 0)
        return 0;
    for (int i = 0; i < a->n_steps; i++)
        if (a->loss[i] != b->loss[i])
            return 0;
    return 1;
}

static int run(const char *plan, const char *dir, const char *metrics, struct train_metrics *m)
{
    char extra[2048];
    snprintf(extra, sizeof extra, "--threads 1 --steps 3 --check-arena --save '%s'", dir);
    return train_run_ok(NP, LIMIT_S, plan, extra, metrics, m);
}

static void test_gpipe(void)
{
    write_cluster("gpipe", ROOMY);
    const char *plain = make_plan(NULL, "gpipe-plain.json");
    const char *greedy = make_plan("greedy", "gpipe-greedy.json");
    struct train_metrics a, b;
    if (run(plain, test_path("ck-gpipe-plain"), "m-gpipe-plain.json", &a) ||
        run(greedy, test_path("ck-gpipe-greedy"), "m-gpipe-greedy.json", &b))
        return;
    CU_ASSERT(same_losses(&a, &b));
    write_cluster("1f1b", ROOMY);
}

static void test_layouts_bitwise(void)
{
    const char *plain = make_plan(NULL, "plain.json");
    char plain_dir[1024];
    snprintf(plain_dir, sizeof plain_dir, "%s", test_path("ck-plain"));
    struct train_metrics ref;
    if (run(plain, plain_dir, "m-plain.json", &ref))
        return;
    const char *methods[] = {"slots", "greedy", "ga", "exact"};
    for (int k = 0; k < 4; k++) {
        char name[64], dir[1024];
        snprintf(name, sizeof name, "plan-%s.json", methods[k]);
        const char *plan = make_plan(methods[k], name);
        struct plan p;
        struct err e;
        err_clear(&e);
        CU_ASSERT_EQUAL_FATAL(plan_load(plan, &p, &e), ERR_OK);
        /* the layouts other than slots use less than the slots carving on stage 1 */
        struct stage_cost c;
        plan_stage_cost(&p, &p.stages[1], &c);
        if (k > 0)
            CU_ASSERT(p.stages[1].arena->bytes < cost_arena_bytes(&c));
        plan_free(&p);
        snprintf(name, sizeof name, "m-%s.json", methods[k]);
        snprintf(dir, sizeof dir, "%s", test_path(methods[k]));
        struct train_metrics m;
        if (run(plan, dir, name, &m))
            continue;
        CU_ASSERT(same_losses(&ref, &m));
        for (int s = 0; s < NP; s++) {
            char fa[1200], fb[1200];
            snprintf(fa, sizeof fa, "%s/stage-%d-step-3.ckpt", plain_dir, s);
            snprintf(fb, sizeof fb, "%s/stage-%d-step-3.ckpt", dir, s);
            int same = train_files_equal(fa, fb);
            if (!same)
                fprintf(stderr, "\n%s: stage %d's state differs from the plain run's\n",
                        methods[k], s);
            CU_ASSERT(same);
        }
    }
}

/* Stage 1 given 36 MiB: block:1 fits there only on the greedy arena (plan --arena fits on
 * the laid-out bytes). It trains bitwise as block:1 does on the roomy cluster with no arena,
 * and its peak is its plan's within 2% (train_run_ok). */
static void test_fits_only_with_arena(void)
{
    const char *plain = make_plan(NULL, "roomy-plain.json");
    write_cluster("1f1b", TIGHT);
    const char *tight = make_plan("greedy", "tight-greedy.json");
    write_cluster("1f1b", ROOMY);
    struct plan p, q;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(plan_load(plain, &p, &e) == ERR_OK && plan_load(tight, &q, &e) == ERR_OK);
    struct stage_cost c;
    plan_stage_cost(&q, &q.stages[1], &c);
    CU_ASSERT(q.stages[1].memory_bytes <= TIGHT);
    CU_ASSERT(cost_memory_with_arena(&c, cost_arena_bytes(&c)) > TIGHT); /* slots: over */
    for (int s = 0; s < NP; s++)
        CU_ASSERT(ref_same_actions(&p.stages[s], &q.stages[s]));
    plan_free(&p);
    plan_free(&q);
    struct train_metrics a, b;
    if (run(plain, test_path("ck-roomy"), "m-roomy.json", &a) ||
        run(tight, test_path("ck-tight"), "m-tight.json", &b))
        return;
    CU_ASSERT(same_losses(&a, &b));
    for (int s = 0; s < NP; s++) {
        char fa[1200], fb[1200];
        snprintf(fa, sizeof fa, "%s/stage-%d-step-3.ckpt", test_path("ck-roomy"), s);
        snprintf(fb, sizeof fb, "%s/stage-%d-step-3.ckpt", test_path("ck-tight"), s);
        CU_ASSERT(train_files_equal(fa, fb));
    }
    printf("\n  stage 1: planned %lld, measured peak %lld (slots would be %lld) ", b.planned[1],
           b.peak[1], (long long)cost_memory_with_arena(&c, cost_arena_bytes(&c)));
}

/* Object b of stage 1 moved onto object a's bytes, its stated lifetime shrunk to one tick
 * after a's so that the plan's own check passes: the run finds them in use at once. */
static void test_check_catches_wrong_lifetimes(void)
{
    const char *plan = make_plan("slots", "plan-slots-lie.json");
    char *text = test_read(plan);
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON *arena = cJSON_GetObjectItem(
        cJSON_GetArrayItem(cJSON_GetObjectItem(root, "stages"), 1), "arena");
    CU_ASSERT_FATAL(train_arena_lie(arena, 5) == 0);
    char *bad = cJSON_Print(root);
    cJSON_Delete(root);
    const char *file = test_write("plan-lie.json", bad);
    free(bad);
    char args[2048];
    snprintf(args, sizeof args, "--plan '%s' --threads 1 --steps 1 --quiet --check-arena", file);
    struct train_run r = train_exec(NP, LIMIT_S, args);
    CU_ASSERT_EQUAL(r.status, 1);
    CU_ASSERT(r.err != NULL && strstr(r.err, "--check-arena") != NULL);
    if (r.status != 1)
        fprintf(stderr, "\nstatus %d: %s\n", r.status, r.err ? r.err : "");
    train_run_free(&r);
}

/* The n_stages checkpoints of step 3 in directories a and b are the same bytes. */
static int same_states(const char *a, const char *b, int n_stages)
{
    int same = 1;
    for (int s = 0; s < n_stages; s++) {
        char fa[1200], fb[1200];
        snprintf(fa, sizeof fa, "%s/stage-%d-step-3.ckpt", a, s);
        snprintf(fb, sizeof fb, "%s/stage-%d-step-3.ckpt", b, s);
        if (!train_files_equal(fa, fb)) {
            fprintf(stderr, "\n%s: stage %d's state differs from %s's\n", b, s, a);
            same = 0;
        }
    }
    return same;
}

/* Trains `plan` on np ranks into checkpoint directory tmpdir/NAME (--check-arena, the host
 * link emulated at `gbps`); 1 when it is bitwise the run in tmpdir/REF. */
static int offload_run(int np, const char *plan, const char *name, double gbps, const char *ref)
{
    char extra[2048], metrics[128];
    struct train_metrics m;
    snprintf(extra, sizeof extra, "--threads 1 --steps 3 --check-arena --host-link-gbps %g "
             "--save '%s'", gbps, test_path(name));
    snprintf(metrics, sizeof metrics, "m-%s.json", name);
    if (train_run_ok(np, LIMIT_S, plan, extra, metrics, &m))
        return 0;
    return ref == NULL || same_states(test_path(ref), test_path(name), np);
}

/* Layers of the plan's stage s that send everything they keep to the host. */
static int whole_offloads(const char *plan, int s)
{
    struct plan p;
    struct err e;
    err_clear(&e);
    if (plan_load(plan, &p, &e) != ERR_OK)
        return -1;
    int n = 0;
    for (int l = 0; l < plan_stage_layer_count(&p.stages[s]); l++)
        n += p.stages[s].actions[l].place == COST_PLACE_HOST;
    plan_free(&p);
    return n;
}

/* Offload on the arena: its staging buffers are arena objects (plan --actions
 * recompute,offload --arena), and with --arena-cap the layers above the cap go to host memory
 * whole, their inputs included. On 3 ranks (cpu-3-offload: stage 0 offloads options, and
 * stage 1 whole layers under the cap) and on 1 (the same model on one roomy stage, which only
 * the cap makes offload), each trains bitwise as the plan with no arena, with --check-arena,
 * its peak within 2% of the plan (train_run_ok), on a fast and on a slow emulated link (where
 * copies out outlast their objects' lifetimes and the compute waits for them). */
static void test_offload_bitwise(void)
{
    const char *three = BALLAST_SOURCE_DIR "/configs/clusters/cpu-3-offload.json";
    const char *off = "--method optimal --actions recompute,offload";
    char flags[256];
    CU_ASSERT(offload_run(NP, train_plan_cluster(three, off, "off-plain.json"), "ck-off-plain", 100,
                          NULL));
    snprintf(flags, sizeof flags, "%s --arena greedy", off);
    CU_ASSERT(offload_run(NP, train_plan_cluster(three, flags, "off-greedy.json"), "ck-off-greedy",
                          100, "ck-off-plain"));
    snprintf(flags, sizeof flags, "%s --arena exact --arena-cap 31000000", off);
    const char *capped = train_plan_cluster(three, flags, "off-cap.json");
    CU_ASSERT(whole_offloads(capped, 1) > 0);
    CU_ASSERT(offload_run(NP, capped, "ck-off-cap", 100, "ck-off-plain"));
    CU_ASSERT(offload_run(NP, capped, "ck-off-cap-slow", 2, "ck-off-plain"));

    char text[1024];
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 4, "
             "\"stages\": [{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
             "\"%s/configs/profiles/estimated/gpt-tiny/cpu.json\", \"layers\": [0, 7], "
             "\"host_memory_bytes\": 1073741824, \"host_link\": {\"gbps\": 100, "
             "\"latency_us\": 10}}]}", BALLAST_SOURCE_DIR);
    char one[1024]; /* test_write's path is overwritten by the next test_path */
    snprintf(one, sizeof one, "%s", test_write("one-offload.json", text));
    CU_ASSERT(offload_run(1, train_plan_cluster(one, off, "one-plain.json"), "ck-one-plain", 100,
                          NULL));
    snprintf(flags, sizeof flags, "%s --arena greedy --arena-cap 25000000", off);
    capped = train_plan_cluster(one, flags, "one-cap.json");
    CU_ASSERT(whole_offloads(capped, 0) > 0);
    CU_ASSERT(offload_run(1, capped, "ck-one-cap", 100, "ck-one-plain"));
}

int main(void)
{
    write_cluster("1f1b", ROOMY);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("train_arena", NULL, NULL);
    CU_add_test(s, "every layout: bitwise the plain run, peak within 2% of the plan",
                test_layouts_bitwise);
    CU_add_test(s, "GPipe: the greedy layout bitwise the plain run", test_gpipe);
    CU_add_test(s, "a stage that fits only with the greedy arena: bitwise, peak within 2%",
                test_fits_only_with_arena);
    CU_add_test(s, "--check-arena catches objects in use at once", test_check_catches_wrong_lifetimes);
    CU_add_test(s, "offload on the arena, and under a cap: bitwise the plan without an arena "
                   "on 3 and 1 ranks", test_offload_bitwise);
    return test_main();
}
