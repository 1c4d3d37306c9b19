/* Planning the schedules of schedule.h, against independent references:
 *   - a GPU holding several chunks (interleaved, v-half) takes the least recompute over its
 *     chunks together: the DP's choice against brute force over every keep/full combination
 *     of the GPU's layers, its memory written here from the definition (each chunk's state,
 *     in-flight x kept and workspace, one transient, the reserve), GLPK agreeing (--verify);
 *   - --schedule auto is the fastest of the schedules it tries, each planned alone, and a
 *     superset of schedules never gives a slower plan;
 *   - a chunked plan reads back (its GPUs' memory checked) and simulates to its step;
 *   - --repartition's chunked plans never slower than the cluster's own split;
 *   - what the planner refuses, with the reason. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "jsonio.h"
#include "plan.h"
#include "reference.h"
#include "sim.h"
#include "testutil.h"

#define CASES 60
#define GPUS_MAX 3
#define GPU_LAYERS_MAX 7

/* A custom profile of n random layers (reference.h's costs, in bytes). */
static void save_profile(const char *name, int n, struct layer_cost *layers)
{
    struct profile p = {.model = {.kind = MODEL_KIND_CUSTOM, .name = "random model"},
                        .n_layers = n, .layers = layers, .estimated = 1};
    snprintf(p.device.name, sizeof p.device.name, "dev");
    snprintf(p.device.kind, sizeof p.device.kind, "cuda");
    p.device.memory_bytes = JSONIO_INT_MAX;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(profile_write(test_path(name), &p, &e) == ERR_OK);
}

/* The GPU's memory for flags (1: recomputed whole) over its chunks' layers end to end, from
 * the definition (cost.h cost_chunks_memory). */
static __int128 gpu_memory(const struct plan *p, const int *members, int n,
                           const unsigned char *flags)
{
    __int128 m = p->reserve_bytes;
    int64_t transient = 0;
    for (int k = 0, at = 0; k < n; k++) {
        const struct plan_stage *st = &p->stages[members[k]];
        int64_t workspace = 0;
        for (int l = 0; l < plan_stage_layer_count(st); l++, at++) {
            const struct layer_cost *c = &st->layers[l];
            m += c->state_bytes + (__int128)st->in_flight * (flags[at] ? c->ckpt_bytes
                                                                       : c->act_bytes);
            if (flags[at] && c->act_bytes - c->ckpt_bytes > transient)
                transient = c->act_bytes - c->ckpt_bytes;
            workspace = c->workspace_bytes > workspace ? c->workspace_bytes : workspace;
        }
        m += workspace;
    }
    return m + transient;
}

/* The least recompute time of the GPU's layers that fits its limit (-1: none fits). */
static double brute_force(const struct plan *p, const int *members, int n, int *layers)
{
    double best = -1;
    *layers = 0;
    for (int k = 0; k < n; k++)
        *layers += plan_stage_layer_count(&p->stages[members[k]]);
    for (uint64_t mask = 0; mask < ((uint64_t)1 << *layers); mask++) {
        unsigned char flags[64];
        double ms = 0;
        ref_flags(mask, *layers, flags);
        for (int k = 0, at = 0; k < n; k++) {
            const struct plan_stage *st = &p->stages[members[k]];
            for (int l = 0; l < plan_stage_layer_count(st); l++, at++)
                ms += flags[at] ? st->layers[l].fwd_ms : 0;
        }
        if (gpu_memory(p, members, n, flags) <= p->stages[members[0]].memory_limit_bytes &&
            (best < 0 || ms < best))
            best = ms;
    }
    return best;
}

/* A random cluster of 2 or 3 GPUs, each 2 to 7 layers of a custom model, limits between all
 * recomputed and nothing recomputed; schedule `sched`. Returns the cluster file. */
static const char *write_cluster(struct test_rng *rng, const char *sched)
{
    int G = (int)test_rng_int(rng, 2, GPUS_MAX), count[GPUS_MAX], L = 0;
    for (int g = 0; g < G; g++)
        L += count[g] = (int)test_rng_int(rng, 2, GPU_LAYERS_MAX);
    struct layer_cost layers[GPUS_MAX * GPU_LAYERS_MAX];
    ref_random_layers(rng, L, 1, layers);
    save_profile("prof.json", L, layers);
    static char text[8192];
    int M = (int)test_rng_int(rng, 1, 8), p_reserve = (int)test_rng_int(rng, 0, 100);
    enum schedule kind;
    if (schedule_parse(sched, &kind) != 0 || schedule_fixed_chunks(kind, 2) != 2)
        kind = SCHEDULE_INTERLEAVED; /* the limits as a GPU's two chunks would need */
    struct schedule_shape sh = schedule_shape_of(kind, G, 2, M);
    int used = snprintf(text, sizeof text,
                        "{\"format\": \"ballast-cluster/1\", \"schedule\": \"%s\", "
                        "\"micro_batches\": %d, \"reserve_bytes\": %d, \"stages\": [",
                        sched, M, p_reserve);
    for (int g = 0, first = 0; g < G; first += count[g++]) {
        /* the GPU's chunks' layers (each chunk a v-th of count[g], the virtual stages
         * tiling the model in order), at most M in flight: from about all recomputed to all
         * kept, some below */
        __int128 keep = p_reserve, full = p_reserve;
        int64_t most = 0;
        for (int j = 0, at = 0; j < G * 2; j++) {
            int c, on = schedule_gpu(&sh, j, &c), n = count[on];
            int size = (c + 1) * n / 2 - c * n / 2;
            for (int l = at; l < at + size && on == g; l++) {
                keep += layers[l].state_bytes + (__int128)M * layers[l].act_bytes +
                        layers[l].workspace_bytes;
                full += layers[l].state_bytes + (__int128)M * layers[l].ckpt_bytes +
                        layers[l].workspace_bytes;
                most = layers[l].act_bytes > most ? layers[l].act_bytes : most;
            }
            at += size;
        }
        full += most;
        int64_t limit = (int64_t)(full + (keep - full) * test_rng_double(rng, -0.2, 1.0));
        limit = limit > JSONIO_INT_MAX ? JSONIO_INT_MAX : limit < 1 ? 1 : limit;
        used += snprintf(text + used, sizeof text - (size_t)used,
                         "%s{\"device\": \"dev\", \"memory_bytes\": %lld, \"profile\": "
                         "\"prof.json\", \"layers\": [%d, %d]}",
                         g ? ", " : "", (long long)limit, first, first + count[g] - 1);
    }
    snprintf(text + used, sizeof text - (size_t)used, "]}\n");
    return test_write("cluster.json", text);
}

static void test_gpu_knapsack(void)
{
    struct test_rng rng = {2929};
    static const char *const scheds[] = {"interleaved", "v-half"};
    int planned = 0, nofit = 0, recomputing = 0;
    char plan_file[1024], cluster[1024];
    snprintf(plan_file, sizeof plan_file, "%s", test_path("plan.json"));
    for (int i = 0; i < CASES; i++) {
        snprintf(cluster, sizeof cluster, "%s", write_cluster(&rng, scheds[i % 2]));
        char args[3072], *err = NULL;
        snprintf(args, sizeof args,
                 "plan --cluster '%s' --method optimal --min-gain 0 --whole-layers --verify "
                 "--unit 1 --quiet -o '%s'",
                 cluster, plan_file);
        remove(plan_file);
        int rc = test_run(args, NULL, &err);
        struct plan p;
        struct err e;
        err_clear(&e);
        /* nothing fits exactly when recomputing every layer (whole layers' least memory) does
         * not; otherwise brute force over the plan's layout (its chunks, in-flight counts and
         * limits) below */
        snprintf(args, sizeof args, "plan --cluster '%s' --method full --unit 1 --quiet", cluster);
        CU_ASSERT_EQUAL(test_run(args, NULL, NULL), rc);
        CU_ASSERT(rc == 0 || rc == 3);
        if (rc == 3)
            CU_ASSERT(err != NULL && strstr(err, "GPU ") != NULL); /* said per GPU */
        if (rc != 0) {
            nofit += rc == 3;
            free(err);
            continue;
        }
        free(err);
        CU_ASSERT_FATAL(plan_load(plan_file, &p, &e) == ERR_OK);
        CU_ASSERT(p.virtual_stages == 2);
        CU_ASSERT(p.verify.present && p.verify.agree);
        for (int g = 0; g < p.n_stages / p.virtual_stages; g++) {
            int members[SCHEDULE_CHUNKS_MAX], n = plan_gpu_stages(&p, g, members), layers;
            double want = brute_force(&p, members, n, &layers), got = 0;
            recomputing += want > 0;
            for (int k = 0; k < n; k++)
                got += p.stages[members[k]].recompute_ms;
            CU_ASSERT(want >= 0 && fabs(got - want) <= 1e-9 * (1 + want));
            if (!(want >= 0 && fabs(got - want) <= 1e-9 * (1 + want)))
                fprintf(stderr, "\ncase %d GPU %d (%d layers): DP %.9g ms, brute force %.9g\n",
                        i, g, layers, got, want);
            CU_ASSERT(p.stages[members[0]].memory_bytes <=
                      p.stages[members[0]].memory_limit_bytes);
        }
        plan_free(&p);
        planned++;
    }
    CU_ASSERT(planned > CASES / 3 && recomputing > CASES / 3); /* not vacuous */
    CU_ASSERT(nofit > 0);
    fprintf(stderr, "\n%d planned (%d GPUs recomputing), %d fit nowhere\n", planned,
            recomputing, nofit);
}

/* iteration_ms of `ballast plan --cluster C FLAGS`, or -1 when nothing fits (exit 3). */
static double step_of(const char *cluster, const char *flags, const char *name)
{
    char args[4096], plan_file[1024];
    snprintf(plan_file, sizeof plan_file, "%s", test_path(name));
    snprintf(args, sizeof args, "plan --cluster '%s' %s --quiet -o '%s'", cluster, flags,
             plan_file);
    char *err = NULL;
    int rc = test_run(args, NULL, &err);
    /* 2: the schedule does not apply here (too few layers for its chunks), said as such */
    int inapplicable = rc == 2 && err != NULL && strstr(err, "chunk") != NULL;
    CU_ASSERT(rc == 0 || rc == 3 || inapplicable);
    if (rc != 0 && rc != 3 && !inapplicable)
        fprintf(stderr, "\nplan %s %s: %d %s\n", cluster, flags, rc, err ? err : "");
    free(err);
    if (rc != 0)
        return -1;
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(plan_load(plan_file, &p, &e) == ERR_OK);
    /* the plan simulates to its own step */
    struct sim_result r;
    CU_ASSERT_FATAL(sim_plan(&p, &r, &e) == ERR_OK);
    CU_ASSERT_DOUBLE_EQUAL(r.iteration_ms, p.iteration_ms, 1e-9 * p.iteration_ms);
    double ms = p.iteration_ms;
    sim_result_free(&r);
    plan_free(&p);
    return ms;
}

/* --schedule auto against each schedule planned alone. At --min-gain 0 it is the fastest of
 * them, bitwise, and a superset of schedules is never slower. At the default margin (0.5%)
 * it is the first candidate, in auto's order, whose own plan steps within the margin of the
 * fastest step any schedule's plan has. */
static void check_auto(const char *cluster, const char *extra)
{
    static const char *const one[] = {"--schedule 1f1b",
                                      "--schedule gpipe",
                                      "--schedule zb-h1",
                                      "--schedule v-half",
                                      "--schedule interleaved --virtual-stages 2",
                                      "--schedule interleaved --virtual-stages 3",
                                      "--schedule interleaved --virtual-stages 4"};
    enum { N = sizeof one / sizeof one[0] };
    char flags[512];
    double best = -1, alone[N];
    for (int k = 0; k < N; k++) {
        snprintf(flags, sizeof flags, "%s --min-gain 0 %s", one[k], extra);
        double ms = step_of(cluster, flags, "one.json");
        if (ms >= 0 && (best < 0 || ms < best))
            best = ms;
        snprintf(flags, sizeof flags, "%s %s", one[k], extra);
        alone[k] = step_of(cluster, flags, "one.json");
    }
    snprintf(flags, sizeof flags, "--schedule auto --min-gain 0 %s", extra);
    double all = step_of(cluster, flags, "auto.json");
    CU_ASSERT(all == best); /* the same plans, planned alone: bitwise the same steps */
    if (all != best)
        fprintf(stderr, "\n%s %s: auto %.9g ms, the best alone %.9g\n", cluster, extra, all,
                best);
    /* a superset of schedules never gives a slower plan */
    snprintf(flags, sizeof flags, "--schedule auto --min-gain 0 --virtual-stages 2 %s", extra);
    double fewer = step_of(cluster, flags, "fewer.json");
    CU_ASSERT(all >= 0 ? fewer < 0 || all <= fewer : fewer < 0);
    /* the default margin: the first within 0.5% of the fastest */
    double want = -1;
    for (int k = 0; k < N && want < 0 && best >= 0; k++)
        if (alone[k] >= 0 && alone[k] <= best * 1.005 * (1 + 1e-12))
            want = alone[k];
    snprintf(flags, sizeof flags, "--schedule auto %s", extra);
    double simple = step_of(cluster, flags, "auto.json");
    CU_ASSERT(simple == want);
    CU_ASSERT(simple <= best * 1.005 * (1 + 1e-12));
    if (simple != want)
        fprintf(stderr, "\n%s %s: auto at 0.5%% %.9g ms, the first within 0.5%% %.9g\n",
                cluster, extra, simple, want);
}

static void test_auto_is_the_best(void)
{
    check_auto(BALLAST_SOURCE_DIR "/configs/clusters/llama2-7b-h100-a100-8.json", "");
    check_auto(BALLAST_SOURCE_DIR "/configs/clusters/llama2-7b-h100-a100-8.json",
               "--repartition");
    check_auto(BALLAST_SOURCE_DIR "/configs/clusters/t4-4090-4.json", "");
    struct test_rng rng = {31};
    for (int i = 0; i < 6; i++) {
        char cluster[1024];
        snprintf(cluster, sizeof cluster, "%s", write_cluster(&rng, "1f1b"));
        check_auto(cluster, "--unit 1");
    }
}

/* --repartition plans zb-h1, v-half and interleaved on 1f1b's split (a GPU it leaves fewer
 * layers than chunks borrowing from the fullest: both clusters' slow GPUs get one layer) or
 * on the cluster's own split: never slower than the cluster's split planned alone, and the
 * plan reads back and simulates to its step (step_of). */
static void test_repartition_no_worse(void)
{
    static const char *const clusters[] = {"t4-4090-4", "v100-a100-8"};
    static const char *const shapes[] = {"--schedule zb-h1", "--schedule v-half",
                                         "--schedule interleaved --virtual-stages 2"};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 3; k++) {
            char cluster[1024], flags[512];
            snprintf(cluster, sizeof cluster, "%s/configs/clusters/%s.json",
                     BALLAST_SOURCE_DIR, clusters[i]);
            snprintf(flags, sizeof flags, "%s --min-gain 0", shapes[k]);
            double own = step_of(cluster, flags, "own.json");
            snprintf(flags, sizeof flags, "%s --min-gain 0 --repartition --search-nodes 300",
                     shapes[k]);
            double searched = step_of(cluster, flags, "searched.json");
            CU_ASSERT(own > 0 && searched > 0 && searched <= own);
            if (!(own > 0 && searched > 0 && searched <= own))
                fprintf(stderr, "\n%s %s: --repartition %.9g ms, the cluster's split %.9g\n",
                        clusters[i], shapes[k], searched, own);
        }
}

/* A cluster of plan p's GPUs in its order (each its capacity, the test's profile), GPU g
 * holding n[g] layers in order; returns the file. */
static const char *cluster_of_counts(const struct plan *p, const char *sched, const int *n,
                                     int G)
{
    static char text[8192];
    int used = snprintf(text, sizeof text,
                        "{\"format\": \"ballast-cluster/1\", \"schedule\": \"%s\", "
                        "\"micro_batches\": %d, \"reserve_bytes\": %lld, \"stages\": [",
                        sched, p->micro_batches, (long long)p->reserve_bytes);
    for (int g = 0, first = 0, s = 0; g < G; first += n[g++]) {
        while (p->stages[s].gpu != g)
            s++;
        used += snprintf(text + used, sizeof text - (size_t)used,
                         "%s{\"device\": \"dev\", \"memory_bytes\": %lld, \"profile\": "
                         "\"prof.json\", \"layers\": [%d, %d]}",
                         g ? ", " : "", (long long)p->stages[s].capacity_bytes, first,
                         first + n[g] - 1);
    }
    snprintf(text + used, sizeof text - (size_t)used, "]}\n");
    return test_write("moved.json", text);
}

/* --repartition's split for a chunked or split schedule is a local optimum: moving one layer
 * between neighbouring GPUs (each keeping a layer a chunk), planned on that split alone,
 * never steps faster; the split itself planned alone steps as the plan does. */
static void test_repartition_local_optimum(void)
{
    struct test_rng rng = {5151};
    static const char *const scheds[] = {"zb-h1", "v-half", "interleaved"};
    int checked = 0;
    for (int i = 0; i < 24; i++) {
        const char *sched = scheds[i % 3];
        char cluster[1024], flags[256];
        snprintf(cluster, sizeof cluster, "%s", write_cluster(&rng, sched));
        snprintf(flags, sizeof flags, "--min-gain 0 --unit 1 --repartition");
        if (step_of(cluster, flags, "polished.json") < 0)
            continue;
        struct plan p;
        struct err e;
        err_clear(&e);
        CU_ASSERT_FATAL(plan_load(test_path("polished.json"), &p, &e) == ERR_OK);
        int n[GPUS_MAX] = {0}, G = 0, chunks = p.virtual_stages > 0 ? p.virtual_stages : 1;
        for (int s = 0; s < p.n_stages; s++) {
            int g = p.virtual_stages > 1 ? p.stages[s].gpu : s;
            n[g] += plan_stage_layer_count(&p.stages[s]);
            G = g + 1 > G ? g + 1 : G;
        }
        for (int s = 0; s < p.n_stages; s++)
            p.stages[s].gpu = p.virtual_stages > 1 ? p.stages[s].gpu : s;
        double same = step_of(cluster_of_counts(&p, sched, n, G), "--min-gain 0 --unit 1",
                             "same.json");
        CU_ASSERT_DOUBLE_EQUAL(same, p.iteration_ms, 1e-9 * p.iteration_ms);
        for (int m = 0; m < 2 * (G - 1); m++) {
            int g = m / 2, from = m % 2 ? g + 1 : g, to = m % 2 ? g : g + 1;
            if (n[from] <= chunks)
                continue;
            n[from]--;
            n[to]++;
            double moved = step_of(cluster_of_counts(&p, sched, n, G), "--min-gain 0 --unit 1",
                                   "moved-plan.json");
            CU_ASSERT(moved < 0 || moved >= p.iteration_ms * (1 - 1e-9));
            if (!(moved < 0 || moved >= p.iteration_ms * (1 - 1e-9)))
                fprintf(stderr, "\n%s: a layer from GPU %d to %d steps %.9g ms, the plan %.9g\n",
                        sched, from, to, moved, p.iteration_ms);
            n[from]++;
            n[to]--;
            checked++;
        }
        plan_free(&p);
    }
    CU_ASSERT(checked >= 10); /* not vacuous */
}

/* exit 2 and a message saying `needle` */
static void expect_refused(const char *args, const char *needle)
{
    char *err = NULL;
    int rc = test_run(args, NULL, &err);
    int ok = rc == 2 && err != NULL && strstr(err, needle) != NULL;
    CU_ASSERT(ok);
    if (!ok)
        fprintf(stderr, "\nballast %s: exit %d, expected 2 saying \"%s\": %s\n", args, rc,
                needle, err ? err : "");
    free(err);
}

static void test_refusals(void)
{
    const char *c = BALLAST_SOURCE_DIR "/configs/clusters/llama2-7b-h100-a100-8.json";
    const char *cpu = BALLAST_SOURCE_DIR "/configs/clusters/cpu-3-offload.json";
    char args[2048];
    snprintf(args, sizeof args, "plan --cluster '%s' --schedule zb-h1 --actions "
                                "recompute,offload --quiet", cpu);
    expect_refused(args, "offload and a host optimizer are planned and run with schedules");
    snprintf(args, sizeof args, "plan --cluster '%s' --schedule interleaved --actions "
                                "recompute,optimizer-fraction --quiet", cpu);
    expect_refused(args, "1f1b and gpipe (a fraction of the optimizer too), not interleaved");
    snprintf(args, sizeof args, "plan --cluster '%s' --schedule interleaved --arena greedy "
                                "--quiet", c);
    expect_refused(args, "--arena lays out stages of schedules 1f1b and gpipe");
    snprintf(args, sizeof args, "plan --cluster '%s' --schedule zb-h1 --virtual-stages 2", c);
    expect_refused(args, "--virtual-stages 2: schedule zb-h1 holds 1 model chunk");
    snprintf(args, sizeof args, "plan --cluster '%s' --schedule interleaved --virtual-stages 8",
             c);
    expect_refused(args, "8 GPUs x 8 chunks is more than the model's 34 layers");
    snprintf(args, sizeof args, "plan --cluster '%s' --schedule zigzag", c);
    expect_refused(args, "--schedule: \"zigzag\", expected \"1f1b\"");
    /* the cluster file's fields */
    test_write("bad.json", "{\"format\": \"ballast-cluster/1\", \"schedule\": \"zb-h1\", "
                           "\"virtual_stages\": 3, \"micro_batches\": 4, \"stages\": []}");
    snprintf(args, sizeof args, "plan --cluster '%s'", test_path("bad.json"));
    expect_refused(args, "virtual_stages: 3, but schedule \"zb-h1\" holds 1 model chunk");
}

/* The summary under the table counts a GPU holding several chunks once: 4 H100s and 4 A100s,
 * 4 pipeline ranks each. */
static void test_kinds_count_gpus(void)
{
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, "plan --cluster '%s' --schedule interleaved --virtual-stages 2",
             BALLAST_SOURCE_DIR "/configs/clusters/llama2-7b-h100-a100-8.json");
    CU_ASSERT_EQUAL_FATAL(test_run(args, &out, NULL), 0);
    CU_ASSERT(out != NULL && strstr(out, "H100-80GB        4      -      4") != NULL);
    CU_ASSERT(out != NULL && strstr(out, "A100-80GB        4      -      4") != NULL);
    free(out);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("planning schedules", NULL, NULL);
    CU_add_test(s, "a GPU's chunks: the DP against brute force, GLPK agreeing",
                test_gpu_knapsack);
    CU_add_test(s, "--schedule auto: the fastest schedule, or the first within --min-gain",
                test_auto_is_the_best);
    CU_add_test(s, "--repartition: chunked schedules never slower than the cluster's split",
                test_repartition_no_worse);
    CU_add_test(s, "--repartition: a chunked schedule's split a local optimum",
                test_repartition_local_optimum);
    CU_add_test(s, "refusals with their reasons", test_refusals);
    CU_add_test(s, "the kinds summary counts a GPU once", test_kinds_count_gpus);
    return test_main();
}
