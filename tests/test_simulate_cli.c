/* `ballast simulate` on plans of shipped clusters: it agrees with the plan's iteration_ms,
 * its per-stage totals are the plan's layer costs times the micro-batches, and its trace is
 * valid JSON with exactly one slice per (stage, micro-batch, kind). Bad input exits 2. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static cJSON *read_json(const char *path)
{
    char *text = test_read(path);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    CU_ASSERT_PTR_NOT_NULL(v);
    return v && cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Plans `cluster` with `method` into tmp/NAME-plan.json and simulates it with -o and
 * --trace; returns the three parsed files (caller deletes). */
static int plan_and_simulate(const char *cluster, const char *method, const char *name,
                             cJSON **plan, cJSON **result, cJSON **trace)
{
    char args[4096], pf[1024], rf[1024], tf[1024];
    snprintf(pf, sizeof pf, "%s/%s-plan.json", test_tmpdir(), name);
    snprintf(rf, sizeof rf, "%s/%s-result.json", test_tmpdir(), name);
    snprintf(tf, sizeof tf, "%s/%s-trace.json", test_tmpdir(), name);
    snprintf(args, sizeof args, "plan --cluster '%s/configs/clusters/%s' --method %s --quiet -o '%s'",
             BALLAST_SOURCE_DIR, cluster, method, pf);
    if (test_run(args, NULL, NULL) != 0)
        return -1;
    char *out = NULL;
    snprintf(args, sizeof args, "simulate --plan '%s' -o '%s' --trace '%s'", pf, rf, tf);
    int rc = test_run(args, &out, NULL);
    CU_ASSERT(out != NULL && strstr(out, "iteration") != NULL);
    CU_ASSERT(out != NULL && strstr(out, "note:") == NULL); /* agrees with the plan */
    free(out);
    *plan = read_json(pf);
    *result = read_json(rf);
    *trace = read_json(tf);
    return rc;
}

/* Per micro-batch forward, backward and recompute of one plan stage, from its layer costs. */
static void stage_costs(const cJSON *stage, double *f, double *b, double *r)
{
    const cJSON *costs = cJSON_GetObjectItemCaseSensitive(stage, "layer_costs");
    const cJSON *rec = cJSON_GetObjectItemCaseSensitive(stage, "recompute");
    int first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(stage, "layers"), 0)->valueint;
    *f = *b = *r = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, costs)
    {
        *f += num(c, "fwd_ms");
        *b += num(c, "bwd_ms");
    }
    cJSON_ArrayForEach(c, rec)
        *r += num(cJSON_GetArrayItem(costs, c->valueint - first), "fwd_ms");
    /* layers recomputed in part: their option's time, found by name in their costs */
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(stage, "recompute_options"))
    {
        const cJSON *lc = cJSON_GetArrayItem(costs, (int)num(c, "layer") - first), *o;
        const char *name = cJSON_GetObjectItemCaseSensitive(c, "option")->valuestring;
        int found = 0;
        cJSON_ArrayForEach(o, cJSON_GetObjectItemCaseSensitive(lc, "recompute_options"))
            if (strcmp(cJSON_GetObjectItemCaseSensitive(o, "name")->valuestring, name) == 0) {
                *r += num(o, "recompute_ms");
                found++;
            }
        CU_ASSERT_EQUAL(found, 1);
    }
}

static void check_result(const cJSON *plan, const cJSON *result)
{
    double it = num(result, "iteration_ms");
    int M = (int)num(plan, "micro_batches");
    CU_ASSERT_STRING_EQUAL(cJSON_GetObjectItemCaseSensitive(result, "format")->valuestring,
                           "ballast-simulation/1");
    CU_ASSERT(test_close(it, num(plan, "iteration_ms"), 1e-9, 1e-12));
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(plan, "stages");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(result, "stages");
    int S = cJSON_GetArraySize(ps);
    CU_ASSERT_EQUAL_FATAL(cJSON_GetArraySize(rs), S);
    double idle = 0;
    for (int s = 0; s < S; s++) {
        const cJSON *p = cJSON_GetArrayItem(ps, s), *r = cJSON_GetArrayItem(rs, s);
        double f, b, rc;
        stage_costs(p, &f, &b, &rc);
        CU_ASSERT_EQUAL(num(r, "index"), s);
        CU_ASSERT(test_close(num(r, "fwd_ms"), M * f, 1e-9, 1e-9));
        CU_ASSERT(test_close(num(r, "bwd_ms"), M * b, 1e-9, 1e-9));
        CU_ASSERT(test_close(num(r, "recompute_ms"), M * rc, 1e-9, 1e-9));
        CU_ASSERT(test_close(num(r, "busy_ms"), M * (f + b + rc), 1e-9, 1e-9));
        CU_ASSERT(test_close(num(r, "busy_ms") + num(r, "idle_ms"), it, 1e-9, 1e-12));
        idle += num(r, "idle_ms");
    }
    CU_ASSERT(test_close(num(result, "bubble_fraction"), idle / (S * it), 1e-12, 1e-9));
}

/* A stage's optimizer step on the device: the sum of its layers' optimizer_ms. */
static double stage_optimizer_ms(const cJSON *stage)
{
    double ms = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(stage, "layer_costs"))
    {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(c, "optimizer_ms");
        ms += o != NULL ? o->valuedouble : 0;
    }
    return ms;
}

/* Slices keyed by (track, micro-batch, category): exactly one each, and one optimizer step
 * per stage of its layers' optimizer_ms, every track named, the last slice ending at
 * iteration_ms. */
static void check_trace(const cJSON *plan, const cJSON *trace, double iteration_ms)
{
    static const char *const kinds[] = {"forward", "recompute", "backward", "send-activations",
                                        "send-gradients"};
    int M = (int)num(plan, "micro_batches");
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(plan, "stages");
    int S = cJSON_GetArraySize(ps);
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(trace, "traceEvents");
    CU_ASSERT_FATAL(cJSON_IsArray(events));
    /* count[stage][micro][kind]; sends counted under their sending stage */
    int *count = calloc((size_t)S * M * 5, sizeof *count);
    int *named = calloc((size_t)3 * S + 4, sizeof *named);
    double *step_ms = calloc((size_t)S, sizeof *step_ms);
    int *steps = calloc((size_t)S, sizeof *steps);
    /* slices on one track must not overlap (the format's rule for "X" events): each starts
     * after the previous one on its track ends (the simulator emits a track's slices in order) */
    double *track_end = calloc((size_t)3 * S + 4, sizeof *track_end);
    int overlaps = 0;
    double end = 0;
    const cJSON *ev;
    cJSON_ArrayForEach(ev, events)
    {
        const char *ph = cJSON_GetObjectItemCaseSensitive(ev, "ph")->valuestring;
        const cJSON *tid = cJSON_GetObjectItemCaseSensitive(ev, "tid");
        const char *name = cJSON_GetObjectItemCaseSensitive(ev, "name")->valuestring;
        if (strcmp(ph, "M") == 0) {
            if (strcmp(name, "thread_name") == 0 && tid->valueint < 3 * S + 4)
                named[tid->valueint] = 1;
            continue;
        }
        CU_ASSERT_STRING_EQUAL(ph, "X");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(ev, "args");
        int m = (int)num(args, "micro_batch"), s = (int)num(args, "stage"), k = -1;
        const char *cat = cJSON_GetObjectItemCaseSensitive(ev, "cat")->valuestring;
        for (int i = 0; i < 5; i++)
            if (strcmp(cat, kinds[i]) == 0)
                k = i;
        double ts = num(ev, "ts"), dur = num(ev, "dur");
        if (strcmp(cat, "optimizer") == 0) { /* the step, after the stage's micro-batches */
            CU_ASSERT_FATAL(m == -1 && s >= 0 && s < S);
            steps[s]++;
            step_ms[s] += dur / 1e3;
        } else {
            CU_ASSERT_FATAL(k >= 0 && m >= 0 && m < M && s >= 0 && s < S);
            count[((size_t)s * M + m) * 5 + k]++;
        }
        CU_ASSERT(named[tid->valueint]); /* named before its first slice */
        CU_ASSERT(ts >= 0 && dur >= 0);
        overlaps += ts < track_end[tid->valueint] - 1e-6;
        track_end[tid->valueint] = ts + dur;
        end = fmax(end, (ts + dur) / 1e3);
    }
    CU_ASSERT(test_close(end, iteration_ms, 1e-6, 1e-9));
    CU_ASSERT_EQUAL(overlaps, 0);
    free(track_end);
    for (int s = 0; s < S; s++) {
        const cJSON *p = cJSON_GetArrayItem(ps, s);
        double f, b, rc;
        stage_costs(p, &f, &b, &rc);
        int recomputes = rc > 0; /* whole layers or options */
        int link_next = cJSON_GetObjectItemCaseSensitive(p, "link") != NULL && s + 1 < S;
        int link_prev = s > 0 && cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(ps, s - 1),
                                                                  "link") != NULL;
        int want[5] = {1, recomputes, 1, link_next, link_prev};
        int ok = 1;
        for (int m = 0; m < M; m++)
            for (int k = 0; k < 5; k++)
                ok = ok && count[((size_t)s * M + m) * 5 + k] == want[k];
        CU_ASSERT(ok);
        double step = stage_optimizer_ms(p);
        CU_ASSERT(steps[s] == (step > 0) && test_close(step_ms[s], step, 1e-6, 1e-9));
    }
    free(count);
    free(named);
    free(step_ms);
    free(steps);
}

static void check_cluster(const char *cluster, const char *method, const char *name)
{
    cJSON *plan = NULL, *result = NULL, *trace = NULL;
    CU_ASSERT_EQUAL_FATAL(plan_and_simulate(cluster, method, name, &plan, &result, &trace), 0);
    CU_ASSERT_FATAL(plan && result && trace);
    check_result(plan, result);
    check_trace(plan, trace, num(result, "iteration_ms"));
    cJSON_Delete(plan);
    cJSON_Delete(result);
    cJSON_Delete(trace);
}

static void test_v100_a100_optimal(void)
{
    check_cluster("v100-a100-8.json", "optimal", "va-opt");
}

static void test_v100_a100_full(void)
{
    check_cluster("v100-a100-8.json", "full", "va-full");
}

static void test_gpipe_patent(void)
{
    check_cluster("t4-4090-4.json", "patent", "t4-patent");
}

static void test_bad_input(void)
{
    char *err = NULL, args[2048];
    CU_ASSERT_EQUAL(test_run("simulate", NULL, &err), 2);
    CU_ASSERT(err && strstr(err, "--plan is required"));
    free(err);
    CU_ASSERT_EQUAL(test_run("simulate --plan /nonexistent/plan.json", NULL, &err), 2);
    CU_ASSERT(err && strstr(err, "/nonexistent/plan.json"));
    free(err);
    const char *junk = test_write("junk.json", "{\"format\": \"ballast-plan/1\", ");
    snprintf(args, sizeof args, "simulate --plan '%s'", junk);
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err && strstr(err, "junk.json"));
    free(err);
    /* a plan whose stage memory was edited is refused, naming the field */
    char *text = test_read(test_path("va-opt-plan.json"));
    CU_ASSERT_FATAL(text != NULL);
    cJSON *plan = cJSON_Parse(text);
    free(text);
    cJSON *st = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(plan, "stages"), 2);
    cJSON_ReplaceItemInObject(st, "memory_bytes", cJSON_CreateNumber(12345));
    text = cJSON_Print(plan);
    const char *edited = test_write("edited.json", text);
    free(text);
    cJSON_Delete(plan);
    snprintf(args, sizeof args, "simulate --plan '%s'", edited);
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err && strstr(err, "stages[2].memory_bytes"));
    free(err);
    CU_ASSERT_EQUAL(test_run("simulate --plan x.json --frobnicate", NULL, &err), 2);
    CU_ASSERT(err && strstr(err, "--frobnicate"));
    free(err);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("simulate", NULL, NULL);
    CU_add_test(s, "v100-a100-8 optimal: plan, result and trace agree", test_v100_a100_optimal);
    CU_add_test(s, "v100-a100-8 full: plan, result and trace agree", test_v100_a100_full);
    CU_add_test(s, "t4-4090-4 (GPipe) patent: plan, result and trace agree", test_gpipe_patent);
    CU_add_test(s, "bad input exits 2 naming the file", test_bad_input);
    return test_main();
}
