/* The knapsack DP against the same per-stage problem solved as a MILP by GLPK
 * (planner/solvers/milp.h), on random stages of up to 40 layers, and `ballast plan --verify` on random
 * clusters written to files. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "knapsack.h"
#include "milp.h"
#include "profile.h"
#include "reference.h"
#include "testutil.h"

#define INSTANCES 1000
#define LAYERS_MAX 40

static void random_stage(struct test_rng *rng, int *n, struct layer_cost *layers,
                         struct knap_problem *kp)
{
    static const int64_t units[] = {1, 7, 1000, 1 << 20};
    int64_t unit = units[test_rng_int(rng, 0, 3)];
    int v = (int)test_rng_int(rng, 1, 8);
    int64_t reserve = test_rng_int(rng, 0, 100 * unit);
    struct err e;
    *n = (int)test_rng_int(rng, 1, LAYERS_MAX);
    ref_random_layers(rng, *n, unit, layers);
    int64_t limit = ref_random_limit(rng, layers, *n, v, reserve, unit);
    err_clear(&e);
    CU_ASSERT_FATAL(knap_build(kp, layers, *n, v, reserve, limit, unit, &e) == ERR_OK);
}

static void test_dp_equals_glpk(void)
{
    struct test_rng rng = {777};
    int both_fit = 0, neither = 0, balanced = 0, timeouts = 0;
    for (int i = 0; i < INSTANCES; i++) {
        struct layer_cost layers[LAYERS_MAX];
        struct knap_problem kp;
        struct err e;
        unsigned char f[LAYERS_MAX];
        int n;
        random_stage(&rng, &n, layers, &kp);

        double milp_ms = -1;
        err_clear(&e);
        int dp = knap_min_recompute(&kp, f, &e);
        err_clear(&e);
        int glpk = milp_min_recompute(&kp, &milp_ms, &e);
        CU_ASSERT_EQUAL(dp, glpk);
        if (dp != glpk)
            fprintf(stderr, "\ninstance %d: DP %d, GLPK %d (%s)\n", i, dp, glpk, e.msg);
        if (dp == ERR_OK && glpk == ERR_OK) {
            double dp_ms = knap_recompute_ms(&kp, f);
            CU_ASSERT(test_close(dp_ms, milp_ms, 1e-6, 1e-7));
            if (!test_close(dp_ms, milp_ms, 1e-6, 1e-7))
                fprintf(stderr, "\ninstance %d (n %d): DP %.12g ms, GLPK %.12g ms\n", i, n, dp_ms,
                        milp_ms);
            both_fit++;
        } else {
            neither++;
        }

        /* balancing towards a random target */
        double total = 0;
        for (int l = 0; l < n; l++)
            total += layers[l].fwd_ms;
        double unit = knap_balance_time_unit(&kp, total / 2e4 > 1e-3 ? total / 2e4 : 1e-3);
        int64_t qsum = 0, distance = -1;
        for (int l = 0; l < n; l++)
            qsum += knap_time_units(&kp, l, unit);
        int64_t target = test_rng_int(&rng, 0, qsum);
        double milp_units = -1;
        err_clear(&e);
        dp = knap_balance(&kp, target, unit, f, &distance, &e);
        err_clear(&e);
        glpk = milp_balance(&kp, target, unit, &milp_units, &e);
        if (glpk == ERR_FAIL && strstr(e.msg, "not verified") != NULL) {
            timeouts++; /* GLPK's branch and bound gave up (milp.h): nothing to compare */
            knap_free(&kp);
            continue;
        }
        CU_ASSERT_EQUAL(dp, glpk);
        if (dp == ERR_OK && glpk == ERR_OK) {
            CU_ASSERT(test_close((double)distance, milp_units, 1e-6, 1e-9));
            if (!test_close((double)distance, milp_units, 1e-6, 1e-9))
                fprintf(stderr, "\ninstance %d (n %d): DP distance %lld, GLPK %.12g\n", i, n,
                        (long long)distance, milp_units);
            balanced++;
        }
        knap_free(&kp);
    }
    fprintf(stderr, " [%d fit, %d do not, %d balanced, %d GLPK time-outs] ", both_fit, neither,
            balanced, timeouts);
    CU_ASSERT(both_fit > INSTANCES / 2 && neither > INSTANCES / 50);
    CU_ASSERT(balanced >= INSTANCES / 2 && timeouts <= INSTANCES / 100);
}

/* With recompute options: the multiple-choice DP against GLPK's model of the same problem, on
 * stages of up to 30 layers of 2 to 4 choices. A quarter of the stages repeat one layer (a
 * model's blocks), whose permutations GLPK's model must not search one by one. */
#define OPTION_INSTANCES 250
#define OPTION_LAYERS_MAX 30

static void test_options_dp_equals_glpk(void)
{
    static const int64_t units[] = {1, 7, 1000, 1 << 20};
    struct test_rng rng = {779};
    int both_fit = 0, neither = 0, timeouts = 0, partial = 0;
    for (int i = 0; i < OPTION_INSTANCES; i++) {
        struct layer_cost layers[OPTION_LAYERS_MAX];
        struct knap_problem kp;
        struct err e;
        unsigned char c[OPTION_LAYERS_MAX];
        int64_t unit = units[test_rng_int(&rng, 0, 3)];
        int v = (int)test_rng_int(&rng, 1, 8);
        int64_t reserve = test_rng_int(&rng, 0, 100 * unit);
        int n = (int)test_rng_int(&rng, 1, OPTION_LAYERS_MAX);
        ref_random_layers(&rng, n, unit, layers);
        for (int l = 0; l < n; l++)
            ref_random_options(&rng, 2, &layers[l]);
        if (i % 4 == 0) /* alike layers */
            for (int l = 1; l < n; l++)
                layers[l] = layers[0];
        int64_t limit = ref_random_limit(&rng, layers, n, v, reserve, unit);
        err_clear(&e);
        CU_ASSERT_FATAL(knap_build_options(&kp, layers, n, v, reserve, limit, unit, &e) ==
                        ERR_OK);
        double milp_ms = -1;
        int dp = knap_min_recompute(&kp, c, &e);
        err_clear(&e);
        int glpk = milp_min_recompute(&kp, &milp_ms, &e);
        if (glpk == ERR_FAIL && strstr(e.msg, "not verified") != NULL) {
            timeouts++;
            knap_free(&kp);
            continue;
        }
        CU_ASSERT_EQUAL(dp, glpk);
        if (dp != glpk)
            fprintf(stderr, "\ninstance %d: DP %d, GLPK %d (%s)\n", i, dp, glpk, e.msg);
        if (dp == ERR_OK && glpk == ERR_OK) {
            double dp_ms = knap_recompute_ms(&kp, c);
            CU_ASSERT(knap_units(&kp, c) <= kp.cap);
            CU_ASSERT(test_close(dp_ms, milp_ms, 1e-6, 1e-7));
            if (!test_close(dp_ms, milp_ms, 1e-6, 1e-7))
                fprintf(stderr, "\ninstance %d (n %d): DP %.12g ms, GLPK %.12g ms\n", i, n,
                        dp_ms, milp_ms);
            for (int l = 0; l < n; l++)
                if (c[l] >= COST_OPTION) {
                    partial++;
                    break;
                }
            both_fit++;
        } else {
            neither++;
        }
        knap_free(&kp);
    }
    fprintf(stderr, " [%d fit, %d do not, %d with options chosen, %d GLPK time-outs] ",
            both_fit, neither, partial, timeouts);
    CU_ASSERT(both_fit > OPTION_INSTANCES / 2 && neither > OPTION_INSTANCES / 50);
    CU_ASSERT(partial > OPTION_INSTANCES / 5);
    CU_ASSERT(timeouts <= OPTION_INSTANCES / 100);
}

/* A profile with random layer costs for a model of L layers, written as `name`; the caller
 * frees it. */
static void write_profile(struct test_rng *rng, const char *name, const char *device, int L,
                          int64_t unit, struct profile *p)
{
    struct err e;
    memset(p, 0, sizeof *p);
    snprintf(p->device.name, sizeof p->device.name, "%s", device);
    snprintf(p->device.kind, sizeof p->device.kind, "cuda");
    p->device.memory_bytes = (int64_t)1 << 53;
    p->model = (struct model){.n_layer = L - 2, .n_embd = 64, .n_head = 4, .seq_len = 16,
                              .vocab_size = 100, .micro_batch = 1, .dtype = MODEL_DTYPE_FP32};
    p->n_layers = L;
    p->layers = calloc((size_t)L, sizeof *p->layers);
    CU_ASSERT_FATAL(p->layers != NULL);
    ref_random_layers(rng, L, unit, p->layers);
    for (int l = 0; l < L; l++)
        model_layer_name(&p->model, l, p->layers[l].name);
    err_clear(&e);
    CU_ASSERT_FATAL(profile_write(test_path(name), p, &e) == ERR_OK);
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    CU_ASSERT_FATAL(cJSON_IsNumber(v));
    return v->valuedouble;
}

/* `ballast plan --verify` on random clusters of 2 to 4 stages of up to 40 layers: exit 0,
 * verify.agree true, both objectives recorded and equal, and (optimal) the DP objective is the
 * plan's total recompute time. */
static void test_plan_verify_cli(void)
{
    struct test_rng rng = {888};
    int planned = 0;
    for (int i = 0; i < 24; i++) {
        int S = (int)test_rng_int(&rng, 2, 4), L = 0, count[4];
        for (int s = 0; s < S; s++)
            L += count[s] = (int)test_rng_int(&rng, 1, LAYERS_MAX);
        if (L < 3)
            count[S - 1] += 3 - L, L = 3;
        int64_t unit = 1 << 20;
        int M = (int)test_rng_int(&rng, 1, 6), gpipe = i % 2;
        struct profile prof[2];
        write_profile(&rng, "verify-a.json", "devA", L, unit, &prof[0]);
        write_profile(&rng, "verify-b.json", "devB", L, unit, &prof[1]);
        char cluster[8192];
        int used = snprintf(cluster, sizeof cluster,
                            "{\"format\": \"ballast-cluster/1\", \"schedule\": \"%s\", "
                            "\"micro_batches\": %d, \"stages\": [",
                            gpipe ? "gpipe" : "1f1b", M);
        int first = 0;
        for (int s = 0; s < S; s++) {
            int b = (int)test_rng_int(&rng, 0, 1);
            int v = gpipe ? M : (S - s < M ? S - s : M);
            int64_t mem = ref_random_limit(&rng, prof[b].layers + first, count[s], v, 0, unit);
            used += snprintf(cluster + used, sizeof cluster - (size_t)used,
                             "%s{\"device\": \"%s\", \"memory_bytes\": %lld, \"profile\": "
                             "\"verify-%s.json\", \"layers\": [%d, %d]}",
                             s ? ", " : "", b ? "devB" : "devA", (long long)mem, b ? "b" : "a",
                             first, first + count[s] - 1);
            first += count[s];
        }
        profile_free(&prof[0]);
        profile_free(&prof[1]);
        snprintf(cluster + used, sizeof cluster - (size_t)used, "]}");
        const char *cfile = test_write("verify-cluster.json", cluster);
        char args[2048];
        const char *method = i % 3 == 0 ? "patent" : "optimal";
        snprintf(args, sizeof args, "plan --cluster '%s' --method %s --verify --quiet -o '%s'",
                 cfile, method, test_path("verify-plan.json"));
        remove(test_path("verify-plan.json"));
        char *err = NULL;
        int rc = test_run(args, NULL, &err);
        CU_ASSERT(rc == 0 || rc == 3);
        if (rc != 0 && rc != 3)
            fprintf(stderr, "\ncluster %d: exit %d: %s\n", i, rc, err ? err : "");
        free(err);
        if (rc != 0)
            continue;
        planned++;
        char *text = test_read(test_path("verify-plan.json"));
        cJSON *plan = cJSON_Parse(text);
        free(text);
        CU_ASSERT_FATAL(plan != NULL);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(plan, "verify");
        CU_ASSERT_FATAL(cJSON_IsObject(v));
        CU_ASSERT(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "agree")));
        double dp = num(v, "dp_objective"), milp = num(v, "milp_objective");
        CU_ASSERT(test_close(dp, milp, 1e-6, 1e-6));
        if (strcmp(method, "optimal") == 0) {
            double total = 0;
            const cJSON *st;
            cJSON_ArrayForEach(st, cJSON_GetObjectItemCaseSensitive(plan, "stages"))
                total += num(st, "recompute_ms");
            CU_ASSERT(test_close(dp, total, 1e-9, 1e-9));
        }
        cJSON_Delete(plan);
    }
    fprintf(stderr, " [%d of 24 planned] ", planned);
    CU_ASSERT(planned >= 12);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("knapsack DP vs GLPK", NULL, NULL);
    CU_add_test(s, "least recompute and balancing = GLPK", test_dp_equals_glpk);
    CU_add_test(s, "with recompute options, least recompute = GLPK", test_options_dp_equals_glpk);
    CU_add_test(s, "ballast plan --verify", test_plan_verify_cli);
    return test_main();
}
