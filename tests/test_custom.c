/* Profiles of any model (`"model": {"kind": "custom", "name": ...}`, any layer names, no GPT
 * fields): planned exactly by the DP against brute force over every combination of each
 * stage's choices (tests/reference.h), through the files and the command line; every method,
 * --verify, --repartition, simulate, export and bench on the shipped example; and `train` and
 * measured or estimated `profile` refusing a custom model with exit 2. */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cluster.h"
#include "cost.h"
#include "jsonio.h"
#include "model_ops.h"
#include "plan.h"
#include "reference.h"
#include "testutil.h"

#define CASES 150
#define STAGES_MAX 4
#define STAGE_LAYERS_MAX 6
#define EXAMPLE BALLAST_SOURCE_DIR "/configs/clusters/custom/example-4.json"
#define EXAMPLE_MODEL BALLAST_SOURCE_DIR "/configs/models/custom-example.json"

static const char *const words[] = {"conv", "mixer", "ssm", "moe", "pool", "norm", "proj",
                                    "lstm", "expert/3", "Attention (x)"};

/* n random layers (tests/reference.h's costs in `unit` bytes) with random names and up to
 * two random recompute options each. */
static void random_layers(struct test_rng *rng, int n, int64_t unit, struct layer_cost *layers)
{
    ref_random_layers(rng, n, unit, layers);
    for (int l = 0; l < n; l++) {
        snprintf(layers[l].name, sizeof layers[l].name, "%s.%d",
                 words[test_rng_int(rng, 0, sizeof words / sizeof words[0] - 1)], l);
        ref_random_options(rng, 2, &layers[l]);
    }
}

/* A profile of the custom model "random model" on `device`, written to tmpdir/NAME. */
static void save_profile(const char *name, const char *device, int n, struct layer_cost *layers)
{
    struct profile p = {.model = {.kind = MODEL_KIND_CUSTOM, .name = "random model"},
                        .n_layers = n, .layers = layers, .estimated = 1};
    snprintf(p.device.name, sizeof p.device.name, "%s", device);
    snprintf(p.device.kind, sizeof p.device.kind, "cuda");
    p.device.memory_bytes = JSONIO_INT_MAX;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(profile_write(test_path(name), &p, &e) == ERR_OK);
}

/* A random cluster of 1 to 4 stages over two custom profiles of the same layers (whose times
 * and bytes differ), with limits around the interesting range. */
static const char *write_cluster(struct test_rng *rng, int64_t unit)
{
    int S = (int)test_rng_int(rng, 1, STAGES_MAX), count[STAGES_MAX], L = 0;
    for (int s = 0; s < S; s++)
        L += count[s] = (int)test_rng_int(rng, 1, STAGE_LAYERS_MAX);
    struct layer_cost a[STAGES_MAX * STAGE_LAYERS_MAX], b[STAGES_MAX * STAGE_LAYERS_MAX];
    random_layers(rng, L, unit, a);
    random_layers(rng, L, unit, b);
    for (int l = 0; l < L; l++) /* one model: the same layer names on both devices */
        snprintf(b[l].name, sizeof b[l].name, "%s", a[l].name);
    save_profile("a.json", "devA", L, a);
    save_profile("b.json", "devB", L, b);

    enum schedule sched = test_rng_int(rng, 0, 1) ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
    int M = (int)test_rng_int(rng, 1, 8);
    int64_t reserve = test_rng_int(rng, 0, 1) ? 0 : test_rng_int(rng, 0, 50 * unit);
    static char text[8192];
    int used = snprintf(text, sizeof text,
                        "{\"format\": \"ballast-cluster/1\", \"schedule\": \"%s\", "
                        "\"micro_batches\": %d, \"reserve_bytes\": %lld, \"stages\": [",
                        schedule_name(sched), M, (long long)reserve);
    for (int s = 0, first = 0; s < S; first += count[s++]) {
        int on_b = (int)test_rng_int(rng, 0, 1);
        int v = schedule_in_flight(sched, S, s, M);
        int64_t limit = ref_random_limit(rng, (on_b ? b : a) + first, count[s], v, reserve, unit);
        limit = limit > JSONIO_INT_MAX ? JSONIO_INT_MAX : limit;
        limit = limit > reserve ? limit : reserve + 1; /* a cluster leaves each stage some */
        used += snprintf(text + used, sizeof text - (size_t)used,
                         "%s{\"device\": \"%s\", \"memory_bytes\": %lld, \"profile\": \"%s\", "
                         "\"layers\": [%d, %d]}",
                         s ? ", " : "", on_b ? "devB" : "devA", (long long)limit,
                         on_b ? "b.json" : "a.json", first, first + count[s] - 1);
    }
    snprintf(text + used, sizeof text - (size_t)used, "]}\n");
    return test_write("cluster.json", text);
}

/* optimal with --verify on random custom clusters: exit 3 exactly when brute force finds no
 * combination that fits; otherwise each stage's recompute time is brute force's least, its
 * memory units no more than brute force's among those, GLPK agrees, the plan keeps the
 * layers' names and its model, and it simulates. */
static void test_dp_against_brute_force(void)
{
    static const int64_t units[] = {1, 7, 1000};
    struct test_rng rng = {1010};
    int planned = 0, nofit = 0, partial = 0;
    char plan_file[1024], cluster_file[1024]; /* test_path's buffers rotate */
    snprintf(plan_file, sizeof plan_file, "%s", test_path("plan.json"));
    for (int i = 0; i < CASES; i++) {
        int64_t unit = units[test_rng_int(&rng, 0, 2)];
        snprintf(cluster_file, sizeof cluster_file, "%s", write_cluster(&rng, unit));
        struct cluster c;
        struct err e;
        err_clear(&e);
        if (cluster_load(cluster_file, &c, &e) != ERR_OK)
            fprintf(stderr, "\ncase %d: %s\n", i, e.msg);
        CU_ASSERT_FATAL(e.code == ERR_OK);
        CU_ASSERT_EQUAL(c.model.kind, MODEL_KIND_CUSTOM);
        struct ref_best ref[STAGES_MAX];
        int feasible = 1;
        for (int s = 0; s < c.n_stages; s++) {
            struct ref_stage r = {c.stages[s].last - c.stages[s].first + 1,
                                  cluster_stage_profile(&c, s)->layers + c.stages[s].first,
                                  schedule_in_flight(c.schedule, c.n_stages, s, c.micro_batches),
                                  c.reserve_bytes, c.stages[s].memory_bytes, unit};
            ref_min_recompute_choices(&r, &ref[s]);
            feasible = feasible && ref[s].feasible;
        }
        char args[2048];
        snprintf(args, sizeof args,
                 "plan --cluster '%s' --method optimal --min-gain 0 --verify --unit %lld --quiet "
                 "-o '%s'",
                 cluster_file, (long long)unit, plan_file);
        remove(plan_file);
        char *err = NULL;
        int rc = test_run(args, NULL, &err);
        CU_ASSERT_EQUAL(rc, feasible ? 0 : 3);
        if (rc != (feasible ? 0 : 3))
            fprintf(stderr, "\ncase %d: exit %d, brute force %s\n%s\n", i, rc,
                    feasible ? "fits" : "does not fit", err ? err : "");
        free(err);
        if (rc != 0) {
            nofit++;
            cluster_free(&c);
            continue;
        }
        planned++;
        struct plan p;
        CU_ASSERT_FATAL(plan_load(plan_file, &p, &e) == ERR_OK);
        CU_ASSERT(p.model.kind == MODEL_KIND_CUSTOM && p.model.layer_count == c.n_layers);
        CU_ASSERT(p.verify.present && p.verify.agree);
        for (int s = 0; s < c.n_stages; s++) {
            const struct plan_stage *st = &p.stages[s];
            struct ref_stage r = {st->last - st->first + 1,
                                  cluster_stage_profile(&c, s)->layers + st->first,
                                  st->in_flight, c.reserve_bytes, c.stages[s].memory_bytes, unit};
            unsigned char buf[64];
            const unsigned char *choice = ref_plan_choices(st, buf);
            CU_ASSERT(ref_choice_units(&r, choice) <= ref_cap(&r));
            CU_ASSERT(test_close(ref_choice_ms(&r, choice), ref[s].recompute_ms, REF_ATOL,
                                 REF_RTOL));
            CU_ASSERT(ref_choice_units(&r, choice) <= ref[s].units);
            for (int l = 0; l < r.n; l++) {
                CU_ASSERT_STRING_EQUAL(st->layers[l].name, r.layers[l].name);
                partial += st->actions[l].choice >= COST_OPTION;
            }
        }
        plan_free(&p);
        snprintf(args, sizeof args, "simulate --plan '%s'", plan_file);
        CU_ASSERT_EQUAL(test_run(args, NULL, NULL), 0);
        cluster_free(&c);
    }
    fprintf(stderr, "\n  planned %d, no fit %d, layers on a recompute option %d ", planned,
            nofit, partial);
    CU_ASSERT(planned > CASES / 5 && nofit > CASES / 20 && partial > 0);
}

/* The shipped example: every method plans (the baselines none and block:2 may not fit), --verify agrees, --repartition
 * plans, the plan simulates, every export says the framework cannot be told the layers, and
 * bench runs the custom model on its own cluster. */
static void test_example_everywhere(void)
{
    static const char *const methods[] = {"none", "full", "block:2", "uniform-min", "patent",
                                          "optimal --verify", "optimal --repartition",
                                          "optimal --whole-layers", NULL};
    char args[2048], plan_file[1024], bench_dir[1024];
    snprintf(plan_file, sizeof plan_file, "%s", test_path("example-plan.json"));
    snprintf(bench_dir, sizeof bench_dir, "%s", test_path("bench"));
    for (int i = 0; methods[i] != NULL; i++) {
        char *out = NULL;
        snprintf(args, sizeof args, "plan --cluster '%s' --method %s -o '%s'", EXAMPLE,
                 methods[i], plan_file);
        char *err = NULL;
        int rc = test_run(args, &out, &err);
        int baseline = i < 4;
        CU_ASSERT(rc == 0 || (rc == 3 && baseline));
        if (!(rc == 0 || (rc == 3 && baseline)))
            fprintf(stderr, "\nballast %s: exit %d\n%s\n", args, rc, err ? err : "");
        free(err);
        if (rc == 0)
            CU_ASSERT(out != NULL && strstr(out, "model custom \"speech-encdec-example\"") != NULL);
        free(out);
    }
    snprintf(args, sizeof args, "plan --cluster '%s' --quiet -o '%s'", EXAMPLE, plan_file);
    CU_ASSERT_FATAL(test_run(args, NULL, NULL) == 0);
    snprintf(args, sizeof args, "simulate --plan '%s'", plan_file);
    CU_ASSERT_EQUAL(test_run(args, NULL, NULL), 0);
    static const char *const formats[] = {"colossalai", "nemo", "megatron"};
    for (int k = 0; k < 3; k++) {
        char *out = NULL;
        snprintf(args, sizeof args, "plan --cluster '%s' --export %s -o '%s'", EXAMPLE,
                 formats[k], test_path("export-plan.json")); /* per-rank files beside it */
        CU_ASSERT_EQUAL(test_run(args, &out, NULL), 0);
        CU_ASSERT(out != NULL && strstr(out, "the model is custom") != NULL);
        free(out);
    }
    snprintf(args, sizeof args,
             "bench --clusters '%s' --models '%s' --no-plots --out '%s'", EXAMPLE, EXAMPLE_MODEL,
             bench_dir);
    CU_ASSERT_EQUAL(test_run(args, NULL, NULL), 0);
    char csv[1024];
    snprintf(csv, sizeof csv, "%s/results.csv", bench_dir);
    char *text = test_read(csv);
    CU_ASSERT(text != NULL && strstr(text, "example-4,custom-example,4,8,1f1b,cluster,optimal,ok,"));
    free(text);
}

/* `mpirun ... ballast train ARGS`: exit status, stderr in *err (caller frees). */
static int run_train(const char *args, char **err)
{
    char cmd[4096];
    const char *err_file = test_path("train.err");
    snprintf(cmd, sizeof cmd,
             "timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe -np 4 '%s' train %s "
             ">/dev/null 2>'%s'",
             BALLAST_EXE, args, err_file);
    int status = system(cmd);
    *err = test_read(err_file);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* A custom model has no layers to run: train, measured and estimated profile refuse it with
 * exit 2 and say why; --micro-batches auto cannot rescale its profiles. */
static void test_refusals(void)
{
    char args[2048], *err = NULL, plan_file[1024];
    snprintf(plan_file, sizeof plan_file, "%s", test_path("refused-plan.json"));
    snprintf(args, sizeof args, "plan --cluster '%s' --quiet -o '%s'", EXAMPLE, plan_file);
    CU_ASSERT_FATAL(test_run(args, NULL, NULL) == 0);
    snprintf(args, sizeof args, "--plan '%s' --steps 1", plan_file);
    CU_ASSERT_EQUAL(run_train(args, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "no layers to run for a custom model") != NULL);
    free(err);
    static const char *const profile[] = {"--device cpu", "--estimate --device L4"};
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args, "profile --model '%s' %s -o '%s'", EXAMPLE_MODEL, profile[k],
                 test_path("refused-profile.json"));
        err = NULL;
        CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
        CU_ASSERT(err != NULL && strstr(err, "no layers to run for a custom model") != NULL);
        free(err);
    }
    snprintf(args, sizeof args, "plan --cluster '%s' --micro-batches auto --quiet", EXAMPLE);
    err = NULL;
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "custom") != NULL);
    free(err);
}

/* Bad custom profiles and clusters: exit 2 naming the file and the field. */
static void test_bad_input(void)
{
    static const struct {
        const char *model, *layer2, *expect;
    } cases[] = {
        {"{\"kind\": \"custom\", \"name\": \"m\", \"n_layer\": 2}", "b", "model.n_layer: unknown field"},
        {"{\"kind\": \"custom\"}", "b", "model.name: missing"},
        {"{\"kind\": \"custom\", \"name\": \"\"}", "b", "model.name: empty"},
        {"{\"kind\": \"custom\", \"name\": \"m\", \"layer_count\": 3}", "b", "layers: 2 entries, but model.layer_count is 3"},
        {"{\"kind\": \"custom\", \"name\": \"m\"}", "", "layers[1].name: empty"},
        {"{\"kind\": \"mamba\", \"name\": \"m\"}", "b", "model.kind: \"mamba\" is not a model kind"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[2048], args[2048], *err = NULL;
        snprintf(text, sizeof text,
                 "{\"format\": \"ballast-profile/1\", \"estimated\": true, \"device\": {\"name\": "
                 "\"d\", \"kind\": \"cpu\", \"memory_bytes\": 1000000}, \"model\": %s, \"layers\": "
                 "[{\"name\": \"a\", \"fwd_ms\": 1, \"bwd_ms\": 2, \"state_bytes\": 10, "
                 "\"act_bytes\": 20, \"ckpt_bytes\": 5, \"out_bytes\": 4, \"workspace_bytes\": 1}, "
                 "{\"name\": \"%s\", \"fwd_ms\": 1, \"bwd_ms\": 2, \"state_bytes\": 10, "
                 "\"act_bytes\": 20, \"ckpt_bytes\": 5, \"out_bytes\": 4, \"workspace_bytes\": 1}]}",
                 cases[i].model, cases[i].layer2);
        test_write("bad-profile.json", text);
        const char *cluster = test_write(
            "bad-cluster.json", "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", "
                                "\"micro_batches\": 2, \"stages\": [{\"device\": \"d\", "
                                "\"memory_bytes\": 1000000, \"profile\": \"bad-profile.json\"}]}");
        snprintf(args, sizeof args, "plan --cluster '%s'", cluster);
        CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
        if (err == NULL || strstr(err, cases[i].expect) == NULL)
            fprintf(stderr, "\ncase %zu: expected \"%s\" in: %s\n", i, cases[i].expect,
                    err ? err : "");
        CU_ASSERT(err != NULL && strstr(err, "bad-profile.json") != NULL &&
                  strstr(err, cases[i].expect) != NULL);
        free(err);
    }
}

/* Two profiles of one custom model must name the same layers. */
static void test_profiles_disagree(void)
{
    const char *layer = "\"fwd_ms\": 1, \"bwd_ms\": 2, \"state_bytes\": 10, \"act_bytes\": 20, "
                        "\"ckpt_bytes\": 5, \"out_bytes\": 4, \"workspace_bytes\": 1";
    for (int k = 0; k < 2; k++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "{\"format\": \"ballast-profile/1\", \"estimated\": true, \"device\": {\"name\": "
                 "\"d%d\", \"kind\": \"cuda\", \"memory_bytes\": 1000000}, \"model\": {\"kind\": "
                 "\"custom\", \"name\": \"m\"}, \"layers\": [{\"name\": \"in\", %s}, {\"name\": "
                 "\"%s\", %s}]}",
                 k, layer, k ? "mlp" : "attn", layer);
        test_write(k ? "d1.json" : "d0.json", text);
    }
    const char *cluster = test_write(
        "two.json", "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", "
                    "\"micro_batches\": 2, \"stages\": [{\"device\": \"d0\", \"memory_bytes\": "
                    "1000000, \"profile\": \"d0.json\"}, {\"device\": \"d1\", \"memory_bytes\": "
                    "1000000, \"profile\": \"d1.json\"}]}");
    char args[2048], *err = NULL;
    snprintf(args, sizeof args, "plan --cluster '%s'", cluster);
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "names layer 1 \"mlp\", but stage 0's profile names it "
                                         "\"attn\"") != NULL);
    free(err);
}

/* GPT dispatches through its table, which gives the size functions' numbers; a custom model
 * has none. */
static void test_model_ops(void)
{
    struct model gpt = {.kind = MODEL_KIND_GPT, .n_layer = 3, .n_embd = 32, .n_head = 4,
                        .seq_len = 16, .vocab_size = 50, .micro_batch = 2,
                        .dtype = MODEL_DTYPE_BF16};
    struct model custom = {.kind = MODEL_KIND_CUSTOM, .name = "x", .layer_count = 7};
    const struct model_ops *ops = model_ops_of(&gpt);
    CU_ASSERT_PTR_EQUAL(ops, &model_ops_gpt);
    CU_ASSERT_PTR_NULL(model_ops_of(&custom));
    CU_ASSERT_EQUAL(model_param_count(&custom), 0);
    CU_ASSERT_EQUAL(model_layer_count(&custom), 7);
    CU_ASSERT_EQUAL(ops->layer_count(&gpt), 5);
    int64_t params = 0;
    for (int l = 0; l < ops->layer_count(&gpt); l++) {
        struct layer_sizes a, b;
        struct sizes_tensor t[SIZES_TENSORS_MAX];
        ops->layer_sizes(&gpt, l, &a);
        sizes_layer(&gpt, l, &b);
        CU_ASSERT(memcmp(&a, &b, sizeof a) == 0);
        params += a.params;
        int n = ops->layer_tensors(&gpt, l, SIZES_KEPT, t);
        CU_ASSERT_EQUAL(sizes_tensors_bytes(t, n), a.act_bytes);
        struct sizes_option o[SIZES_OPTIONS_MAX];
        CU_ASSERT_EQUAL(ops->recompute_options(&gpt, l, o), l == 0 || l == 4 ? 0 : 3);
        double fwd, bwd;
        ops->layer_flops(&gpt, l, &fwd, &bwd);
        CU_ASSERT(fwd > 0 && bwd > fwd);
    }
    CU_ASSERT_EQUAL(ops->param_count(&gpt), params);
    /* GPT-2's initialisation: layer-norm gains 1, biases 0, residual projections scaled */
    float std, fill;
    ops->param_init(&gpt, "ln1_w", &std, &fill);
    CU_ASSERT(std == 0 && fill == 1);
    ops->param_init(&gpt, "qkv_b", &std, &fill);
    CU_ASSERT(std == 0 && fill == 0);
    ops->param_init(&gpt, "fcproj_w", &std, &fill);
    CU_ASSERT(test_close(std, 0.02 / 2.449489742783178, 1e-7, 0));
    CU_ASSERT(ops->param_decays("wte") && !ops->param_decays("ln2_b"));
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("custom models", NULL, NULL);
    CU_add_test(s, "the DP against brute force on custom profiles", test_dp_against_brute_force);
    CU_add_test(s, "the example: every method, simulate, export, bench", test_example_everywhere);
    CU_add_test(s, "train and profile refuse a custom model", test_refusals);
    CU_add_test(s, "bad custom profiles", test_bad_input);
    CU_add_test(s, "profiles of one custom model name the same layers", test_profiles_disagree);
    CU_add_test(s, "model_ops: GPT's table, none for custom", test_model_ops);
    return test_main();
}
