/* `ballast train` under every schedule against one process (mpirun, CPU ranks): the losses and
 * the trained weights (--save-weights, tensor by tensor) bitwise those of the same model
 * trained whole on one rank, for 1F1B, ZB-H1 (its backward split into input-gradient and
 * weight passes), interleaved (v 2, 3, 4 chunks a GPU, with M not a multiple of the GPUs
 * too) and v-half, with layers recomputed or kept; every rank's measured peak within 2% of
 * the plan (train_run_ok). And what a chunked run refuses: NCCL. */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "testutil.h"
#include "traintest.h"

#define LIMIT_S 120

/* A cluster of n CPU stages on the model's estimated profile; planned with `flags`. */
static const char *plan_of(int n, int micro_batches, const char *flags, const char *name)
{
    char text[2048], cname[64];
    int len = snprintf(text, sizeof text,
                       "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", "
                       "\"micro_batches\": %d, \"stages\": [",
                       micro_batches);
    for (int s = 0; s < n; s++)
        len += snprintf(text + len, sizeof text - (size_t)len,
                        "%s{\"device\": \"cpu\", \"memory_bytes\": 1073741824, "
                        "\"profile\": \"prof.json\"}",
                        s ? ", " : "");
    snprintf(text + len, sizeof text - (size_t)len, "]}");
    snprintf(cname, sizeof cname, "cluster-%s.json", name);
    char cluster[1024];
    snprintf(cluster, sizeof cluster, "%s", test_write(cname, text));
    char pname[64];
    snprintf(pname, sizeof pname, "plan-%s.json", name);
    return train_plan_cluster(cluster, flags, pname);
}

static int setup(void)
{
    /* 8 planning layers: embed, 6 blocks, head; messages of 2 x 32 x 64 floats (16 KiB: past
     * MPI's eager sends, so a send completes only when its receive is posted) */
    test_write("model.json", "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", \"n_layer\": 6, "
                             "\"n_embd\": 64, \"n_head\": 2, \"seq_len\": 32, \"vocab_size\": 64, "
                             "\"micro_batch\": 2, \"dtype\": \"fp32\"}");
    char args[4096], model[1024];
    snprintf(model, sizeof model, "%s", test_path("model.json"));
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu -o '%s'", model,
             test_path("prof.json"));
    return test_run(args, NULL, NULL);
}

/* The safetensors file's tensors: name -> bytes (a cJSON object of base offsets). */
struct tensors {
    char *data;
    long size;
    cJSON *header;
    long at; /* where the data starts */
};

static int tensors_read(const char *file, struct tensors *t)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen(file, "rb");
    if (f == NULL)
        return -1;
    fseek(f, 0, SEEK_END);
    t->size = ftell(f);
    rewind(f);
    t->data = malloc((size_t)t->size + 1);
    size_t got = t->data ? fread(t->data, 1, (size_t)t->size, f) : 0;
    fclose(f);
    if (got != (size_t)t->size || t->size < 8)
        return -1;
    unsigned long long n = 0;
    for (int b = 7; b >= 0; b--)
        n = n << 8 | (unsigned char)t->data[b];
    t->at = 8 + (long)n;
    t->header = cJSON_ParseWithLength(t->data + 8, (size_t)n);
    return t->header != NULL ? 0 : -1;
}

/* Every tensor of a in b with the same bytes, and as many. */
static int same_tensors(const char *fa, const char *fb)
{
    struct tensors a = {0}, b = {0};
    int ok = tensors_read(fa, &a) == 0 && tensors_read(fb, &b) == 0 &&
             cJSON_GetArraySize(a.header) == cJSON_GetArraySize(b.header);
    const cJSON *ta, *list = ok ? a.header : NULL;
    cJSON_ArrayForEach(ta, list)
    {
        if (strcmp(ta->string, "__metadata__") == 0)
            continue;
        const cJSON *tb = cJSON_GetObjectItem(b.header, ta->string);
        const cJSON *oa = cJSON_GetObjectItem(ta, "data_offsets"),
                    *ob = cJSON_GetObjectItem(tb, "data_offsets");
        long a0 = (long)cJSON_GetArrayItem(oa, 0)->valuedouble,
             a1 = (long)cJSON_GetArrayItem(oa, 1)->valuedouble;
        long b0 = ob ? (long)cJSON_GetArrayItem(ob, 0)->valuedouble : 0,
             b1 = ob ? (long)cJSON_GetArrayItem(ob, 1)->valuedouble : -1;
        if (tb == NULL || a1 - a0 != b1 - b0 ||
            memcmp(a.data + a.at + a0, b.data + b.at + b0, (size_t)(a1 - a0)) != 0) {
            fprintf(stderr, "\n%s: tensor %s differs from %s's\n", fb, ta->string, fa);
            ok = 0;
        }
    }
    cJSON_Delete(a.header);
    cJSON_Delete(b.header);
    free(a.data);
    free(b.data);
    return ok;
}

/* One run of `plan` on np ranks: its losses and weights against the reference's. */
static void check_run(int np, const char *plan, const char *name, const struct train_metrics *ref,
                      const char *ref_weights)
{
    char extra[2048], weights[1024], metrics[64];
    struct train_metrics m;
    snprintf(weights, sizeof weights, "%s", test_path(name));
    strcat(weights, ".safetensors");
    snprintf(extra, sizeof extra, "--steps 3 --timeout 60 --save-weights '%s'", weights);
    snprintf(metrics, sizeof metrics, "m-%s.json", name);
    if (train_run_ok(np, LIMIT_S, plan, extra, metrics, &m))
        return;
    int losses = train_same_losses(ref, &m), same = same_tensors(ref_weights, weights);
    if (!losses || !same)
        fprintf(stderr, "\n%s: losses %s, weights %s\n", name, losses ? "equal" : "differ",
                same ? "equal" : "differ");
    CU_ASSERT(losses);
    CU_ASSERT(same);
}

static struct train_metrics reference;
static char reference_weights[1024];

static int reference_run(void)
{
    char extra[2048];
    snprintf(reference_weights, sizeof reference_weights, "%s", test_path("one.safetensors"));
    snprintf(extra, sizeof extra, "--steps 3 --save-weights '%s'", reference_weights);
    const char *plan = plan_of(1, 4, "--method none --unit 1K", "one");
    return train_run_ok(1, LIMIT_S, plan, extra, "m-one.json", &reference);
}

static void test_one_chunk(void)
{
    if (reference_run())
        return;
    check_run(2, plan_of(2, 4, "--method none --unit 1K", "1f1b"), "1f1b", &reference,
              reference_weights);
    check_run(2, plan_of(2, 4, "--method none --unit 1K --schedule zb-h1", "zb2"), "zb2",
              &reference, reference_weights);
    /* block 1 and the head recomputed: their backwards whole, the other blocks split */
    check_run(3, plan_of(3, 4, "--method block:1 --unit 1K --schedule zb-h1", "zb3"), "zb3",
              &reference, reference_weights);
}

static void test_chunks(void)
{
    if (reference.n_steps == 0 && reference_run())
        return;
    check_run(2, plan_of(2, 4, "--method none --unit 1K --schedule interleaved", "il2"), "il2",
              &reference, reference_weights);
    /* three GPUs, four micro-batches: the order of six with two left out */
    check_run(3, plan_of(3, 4,
                         "--method block:1 --unit 1K --schedule interleaved --virtual-stages 2",
                         "il3"),
              "il3", &reference, reference_weights);
    check_run(2, plan_of(2, 4,
                         "--method none --unit 1K --schedule interleaved --virtual-stages 4",
                         "il4"),
              "il4", &reference, reference_weights);
    check_run(2, plan_of(2, 4, "--method none --unit 1K --schedule v-half", "vh2"), "vh2",
              &reference, reference_weights);
    check_run(3, plan_of(3, 4, "--method block:1 --unit 1K --schedule v-half", "vh3"), "vh3",
              &reference, reference_weights);
}

static void test_nccl_refused(void)
{
    const char *plan = plan_of(2, 4, "--method none --unit 1K --schedule interleaved", "nccl");
    char args[2048];
    snprintf(args, sizeof args, "--plan '%s' --steps 1 --transport nccl --quiet", plan);
    struct train_run r = train_exec(2, LIMIT_S, args);
    CU_ASSERT_EQUAL(r.status, 2);
    CU_ASSERT(r.err != NULL && strstr(r.err, "interleaved") != NULL &&
              strstr(r.err, "nccl") != NULL);
    if (r.status != 2 || r.err == NULL || strstr(r.err, "interleaved") == NULL)
        fprintf(stderr, "\nexpected 2 and a message, got %d: %s\n", r.status,
                r.err ? r.err : "(none)");
    train_run_free(&r);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("train under every schedule", setup, NULL);
    CU_add_test(s, "1f1b, zb-h1: losses and weights bitwise one process's", test_one_chunk);
    CU_add_test(s, "interleaved (v 2, 3, 4), v-half: losses and weights bitwise one process's",
                test_chunks);
    CU_add_test(s, "a chunked run over NCCL is refused", test_nccl_refused);
    return test_main();
}
