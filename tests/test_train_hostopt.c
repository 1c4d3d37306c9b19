/* `ballast train` with "optimizer": "host" stages (a plan made by `ballast plan`, its stages'
 * optimizer moved to the host and their memory from the cost model), on 1 and 3 ranks, 1F1B:
 *   - losses bitwise those of the same plan with the optimizer on the device, every stage's
 *     device peak within 2% of the plan's memory_bytes, its host peak the plan's
 *     host_memory_bytes (the mirror, 4 fp32 copies of its parameters), host_update_ms > 0;
 *   - `ballast plan --actions recompute,optimizer` for a device too small for the optimizer
 *     state: it hosts the optimizer, and the plan trains with the device plan's losses;
 *   - 2 steps, --save, --resume to 4: the checkpoint files of step 4 (mirror included) are
 *     byte for byte those of 4 straight steps;
 *   - a host_limit_bytes below the mirror: exit 2 on every rank before the first step, the
 *     numbers named;
 *   - a fraction (each stage's last layers' optimizer on the host, the rest on the device): the
 *     device plan's losses and its checkpoint files byte for byte (weights, gradients, m, v),
 *     the host peak the plan's mirror, and a resume across the two plans. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "plan.h"
#include "traintest.h"

static char plan1[1024], plan3[1024], plan3x4[1024];

/* A number of stage s in a metrics file (-1 when missing). */
static double stage_value(const char *metrics, int s, const char *key)
{
    cJSON *o = train_json_read(metrics);
    const cJSON *st = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "stages"), s),
                *it = cJSON_GetObjectItem(st, key);
    double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
    cJSON_Delete(o);
    return v;
}

static void check_equal(int np, const char *plan, unsigned mask)
{
    char host[1024], name[64];
    snprintf(name, sizeof name, "host-%d-%x.json", np, mask);
    snprintf(host, sizeof host, "%s", test_path(name));
    train_plan_host_optimizer(plan, host, mask, 0);
    struct train_metrics dev, on_host;
    CU_ASSERT_EQUAL_FATAL(train_run_ok(np, 120, plan, "--steps 3", "dev.metrics", &dev), 0);
    CU_ASSERT_EQUAL_FATAL(train_run_ok(np, 120, host, "--steps 3", "host.metrics", &on_host), 0);
    CU_ASSERT(train_same_losses(&dev, &on_host));
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(plan_load(host, &p, &e), ERR_OK);
    const char *metrics = test_path("host.metrics");
    for (int s = 0; s < np; s++) {
        int on = mask >> s & 1;
        int64_t peak = (int64_t)stage_value(metrics, s, "host_peak_bytes");
        CU_ASSERT_EQUAL(peak, on ? p.stages[s].host_memory_bytes : 0);
        CU_ASSERT(on ? stage_value(metrics, s, "host_update_ms") > 0
                     : stage_value(metrics, s, "host_update_ms") == 0);
        printf("\n  %d ranks, stage %d optimizer on the %s: device peak %lld (planned %lld), "
               "host peak %lld, host update %.3f ms/step",
               np, s, on ? "host" : "device", on_host.peak[s], on_host.planned[s],
               (long long)peak, stage_value(metrics, s, "host_update_ms"));
    }
    plan_free(&p);
}

/* Each of 3 stages' checkpoint files of `step` in dirs a and b: byte for byte the same. */
static int same_step_files(const char *a, const char *b, int step)
{
    int same = 1;
    for (int s = 0; s < 3; s++) {
        char fa[1200], fb[1200];
        snprintf(fa, sizeof fa, "%s/stage-%d-step-%d.ckpt", a, s, step);
        snprintf(fb, sizeof fb, "%s/stage-%d-step-%d.ckpt", b, s, step);
        same &= train_files_equal(fa, fb);
    }
    return same;
}

static void test_one_rank(void)
{
    check_equal(1, plan1, 1);
}

static void test_three_ranks(void)
{
    check_equal(3, plan3, 7);
    check_equal(3, plan3, 2); /* only the middle stage: a mixed pipeline */
}

/* `ballast plan --actions recompute,optimizer` for a stage too small for the optimizer's
 * state on the device: the planner puts it on the host, and the plan trains with the device
 * plan's losses, its peaks as planned. */
static void test_planned(void)
{
    char text[1024], prof[1024], cluster[1024], plan[1024], args[4096];
    snprintf(prof, sizeof prof, "%s", test_path("hostopt1-prof.json"));
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", "
             "\"micro_batches\": 2, \"stages\": [{\"device\": \"cpu\", "
             "\"memory_bytes\": 500000, \"host_memory_bytes\": 100000000, "
             "\"host_link\": {\"gbps\": 200, \"latency_us\": 10}, \"profile\": \"%s\"}]}",
             prof);
    snprintf(cluster, sizeof cluster, "%s", test_write("small-cluster.json", text));
    snprintf(plan, sizeof plan, "%s", test_path("small-plan.json"));
    snprintf(args, sizeof args,
             "plan --cluster '%s' --method optimal --actions recompute,optimizer --unit 1024 "
             "--quiet -o '%s'",
             cluster, plan);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(plan_load(plan, &p, &e), ERR_OK);
    CU_ASSERT_EQUAL(p.stages[0].optimizer, COST_PLACE_HOST);
    int64_t host_planned = p.stages[0].host_memory_bytes;
    plan_free(&p);
    struct train_metrics dev, on_host;
    CU_ASSERT_EQUAL_FATAL(train_run_ok(1, 120, plan1, "--steps 3", "dev1.metrics", &dev), 0);
    CU_ASSERT_EQUAL_FATAL(train_run_ok(1, 120, plan, "--steps 3", "small.metrics", &on_host),
                          0);
    CU_ASSERT(train_same_losses(&dev, &on_host));
    CU_ASSERT_EQUAL((int64_t)stage_value(test_path("small.metrics"), 0, "host_peak_bytes"),
                    host_planned);
}

static void test_resume(void)
{
    char host[1024], a[1024], b[1024], extra[4096];
    snprintf(host, sizeof host, "%s", test_path("host-resume.json"));
    train_plan_host_optimizer(plan3, host, 7, 0);
    snprintf(a, sizeof a, "%s", test_path("ckpt-straight"));
    snprintf(b, sizeof b, "%s", test_path("ckpt-resumed"));
    struct train_metrics m;
    snprintf(extra, sizeof extra, "--steps 4 --save '%s'", a);
    CU_ASSERT_EQUAL_FATAL(train_run_ok(3, 120, host, extra, "straight.metrics", &m), 0);
    snprintf(extra, sizeof extra, "--steps 2 --save '%s'", b);
    CU_ASSERT_EQUAL_FATAL(train_run_ok(3, 120, host, extra, "first.metrics", &m), 0);
    snprintf(extra, sizeof extra, "--steps 4 --resume '%s' --save '%s'", b, b);
    CU_ASSERT_EQUAL_FATAL(train_run_ok(3, 120, host, extra, "resumed.metrics", &m), 0);
    CU_ASSERT(same_step_files(a, b, 4));
}

static void test_host_limit(void)
{
    char host[1024], args[2048];
    snprintf(host, sizeof host, "%s", test_path("host-limit.json"));
    train_plan_host_optimizer(plan3, host, 7, 1000);
    snprintf(args, sizeof args, "--plan '%s' --steps 2", host);
    struct train_run r = train_exec(3, 120, args);
    CU_ASSERT_EQUAL(r.status, 2);
    CU_ASSERT(r.err != NULL && strstr(r.err, "host_limit_bytes") != NULL &&
              strstr(r.err, "1000") != NULL);
    CU_ASSERT(r.out == NULL || strstr(r.out, "step 1/") == NULL);
    if (r.err != NULL)
        printf("\n  %.300s", r.err);
    train_run_free(&r);
}

/* Each stage's layers but its first (of 3 stages: embed + block 0, blocks 1-2, block 3 +
 * head) host their optimizer; the first's stays on the device. */
static void test_fraction(void)
{
    char split[1024], dev_dir[1024], split_dir[1024], extra[4096];
    const char *plan3 = plan3x4;
    snprintf(split, sizeof split, "%s", test_path("host-split.json"));
    train_plan_host_optimizer_from(plan3, split, 7, 1, 0);
    snprintf(dev_dir, sizeof dev_dir, "%s", test_path("ckpt-dev"));
    snprintf(split_dir, sizeof split_dir, "%s", test_path("ckpt-split"));
    struct train_metrics dev, part;
    snprintf(extra, sizeof extra, "--steps 3 --save '%s'", dev_dir);
    CU_ASSERT_EQUAL_FATAL(train_run_ok(3, 120, plan3, extra, "dev3.metrics", &dev), 0);
    snprintf(extra, sizeof extra, "--steps 3 --save '%s'", split_dir);
    CU_ASSERT_EQUAL_FATAL(train_run_ok(3, 120, split, extra, "split.metrics", &part), 0);
    CU_ASSERT(train_same_losses(&dev, &part));
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(plan_load(split, &p, &e), ERR_OK);
    CU_ASSERT(same_step_files(dev_dir, split_dir, 3));
    for (int s = 0; s < 3; s++) {
        CU_ASSERT(p.stages[s].optimizer == COST_PLACE_HOST && p.stages[s].optimizer_from == 1);
        CU_ASSERT(plan_stage_optimizer_fraction(&p.stages[s]) > 0 &&
                  plan_stage_optimizer_fraction(&p.stages[s]) < 1);
        int64_t peak = (int64_t)stage_value(test_path("split.metrics"), s, "host_peak_bytes");
        CU_ASSERT_EQUAL(peak, p.stages[s].host_memory_bytes);
        CU_ASSERT(stage_value(test_path("split.metrics"), s, "host_update_ms") > 0);
        CU_ASSERT(stage_value(test_path("split.metrics"), s, "optimizer_ms") > 0);
        printf("\n  stage %d: %.0f%% of its optimizer on the host, host peak %lld (planned %lld), "
               "device peak %lld (planned %lld)",
               s, 100 * plan_stage_optimizer_fraction(&p.stages[s]), (long long)peak,
               (long long)p.stages[s].host_memory_bytes, part.peak[s], part.planned[s]);
    }
    plan_free(&p);
    /* the device plan's checkpoint resumed by the split plan: its files of step 4 are the
     * device plan's own */
    snprintf(extra, sizeof extra, "--steps 4 --save '%s'", dev_dir);
    CU_ASSERT_EQUAL_FATAL(train_run_ok(3, 120, plan3, extra, "dev4.metrics", &dev), 0);
    snprintf(extra, sizeof extra, "--steps 4 --resume '%s' --save '%s'", split_dir, split_dir);
    CU_ASSERT_EQUAL_FATAL(train_run_ok(3, 120, split, extra, "split4.metrics", &part), 0);
    CU_ASSERT(same_step_files(dev_dir, split_dir, 4));
}

int main(void)
{
    train_plan_gpt("hostopt1", 64, "fp32", 1, "none", plan1, sizeof plan1);
    train_plan_gpt("hostopt3", 64, "fp32", 3, "none", plan3, sizeof plan3);
    train_plan_model("hostopt3x4",
                     "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", \"n_layer\": 4, "
                     "\"n_embd\": 32, \"n_head\": 2, \"seq_len\": 16, \"vocab_size\": 64, "
                     "\"micro_batch\": 2, \"dtype\": \"fp32\"}",
                     3, "none", plan3x4, sizeof plan3x4);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("train with the optimizer on the host", NULL, NULL);
    CU_add_test(s, "1 rank: the device optimizer's losses, peaks as planned", test_one_rank);
    CU_add_test(s, "3 ranks: the same, all stages and one", test_three_ranks);
    CU_add_test(s, "planned for a small device: on the host, the same losses", test_planned);
    CU_add_test(s, "resumed from a checkpoint: the same files", test_resume);
    CU_add_test(s, "a host limit below the mirror: exit 2 on every rank", test_host_limit);
    CU_add_test(s, "a fraction: the device's losses and files", test_fraction);
    return test_main();
}
