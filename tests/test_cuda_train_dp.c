/* `mpirun -np 2 ballast train --device cuda` on a plan of one stage replicated twice (dp 2),
 * each replica on a GPU of its own: the gradients go over NCCL (ncclAllReduce, then a scale
 * by 1/2), against the same run with --transport mpi (the replicas' gradients gathered and
 * summed in replica order on the host): NCCL's ring adds in its own order, so the losses
 * agree within 1e-4 relative, not bitwise. The metrics name what carried each stage's
 * all-reduce. Skipped (exit 77) without a GPU, and with one GPU (NCCL refuses two ranks on
 * one GPU), saying so. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "testutil.h"
#include "traintest.h"

#define RUN_LIMIT_S 300

static char plan[1024];

static int setup(void)
{
    test_write("cudp.json", "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", \"n_layer\": 2, "
                            "\"n_embd\": 32, \"n_head\": 2, \"seq_len\": 16, \"vocab_size\": 64, "
                            "\"micro_batch\": 2, \"dtype\": \"fp32\"}");
    char args[4096], model[1024], prof[1024], cluster[1024];
    snprintf(model, sizeof model, "%s", test_path("cudp.json"));
    snprintf(prof, sizeof prof, "%s", test_path("prof-cudp.json"));
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu -o '%s'", model,
             prof);
    if (test_run(args, NULL, NULL) != 0)
        fprintf(stderr, "profile failed\n");
    snprintf(cluster, sizeof cluster, "%s",
             test_write("cluster-cudp.json",
                        "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", "
                        "\"micro_batches\": 2, \"stages\": [{\"device\": \"cpu\", "
                        "\"memory_bytes\": 1073741824, \"profile\": \"prof-cudp.json\", "
                        "\"dp\": 2}]}"));
    snprintf(plan, sizeof plan, "%s",
             train_plan_cluster(cluster, "--method none", "plan-cudp.json"));
    return 0;
}

/* 2 ranks, 4 steps on the GPUs: its metrics and stage 0's "allreduce" (kind, 8 bytes). */
static int run(const char *extra, const char *name, struct train_metrics *m, char *kind)
{
    char args[4096], metrics[1024];
    snprintf(metrics, sizeof metrics, "%s", test_path(name));
    snprintf(args, sizeof args, "--plan '%s' --device cuda --steps 4 --quiet --metrics '%s' %s",
             plan, metrics, extra);
    struct train_run r = train_exec(2, RUN_LIMIT_S, args);
    CU_ASSERT_EQUAL(r.status, 0);
    if (r.status != 0)
        fprintf(stderr, "\ntrain %s: status %d\n%s\n", args, r.status, r.err ? r.err : "");
    int status = r.status;
    train_run_free(&r);
    if (status != 0 || train_metrics_read(metrics, m))
        return -1;
    cJSON *o = train_json_read(metrics);
    const cJSON *st = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "stages"), 0);
    const cJSON *k = cJSON_GetObjectItem(st, "allreduce");
    snprintf(kind, 8, "%s", cJSON_IsString(k) ? k->valuestring : "");
    cJSON_Delete(o);
    return 0;
}

static void test_nccl_against_mpi(void)
{
    struct train_metrics nccl, mpi;
    char kind[2][8];
    if (run("", "nccl.json", &nccl, kind[0]) || run("--transport mpi", "mpi.json", &mpi, kind[1]))
        return;
    CU_ASSERT_STRING_EQUAL(kind[0], "nccl");
    CU_ASSERT_STRING_EQUAL(kind[1], "mpi");
    CU_ASSERT_EQUAL_FATAL(nccl.n_steps, 4);
    CU_ASSERT_EQUAL_FATAL(mpi.n_steps, 4);
    CU_ASSERT(nccl.loss[0] == mpi.loss[0]); /* the same weights and samples before any sum */
    for (int i = 0; i < 4; i++)
        if (!test_close(nccl.loss[i], mpi.loss[i], 0, 1e-4)) {
            fprintf(stderr, "\nstep %d: loss %.9g over NCCL, %.9g over MPI\n", i + 1,
                    nccl.loss[i], mpi.loss[i]);
            CU_FAIL("NCCL's losses within 1e-4 of MPI's");
        }
    CU_ASSERT(mpi.loss[3] < mpi.loss[0]);
}

int main(void)
{
    gpu_require("test_cuda_train_dp");
    int n = 0;
    char why[256];
    cuda_device_count(&n, why, sizeof why);
    if (n < 2) {
        fprintf(stderr, "SKIP test_cuda_train_dp: %d GPU here; NCCL needs a GPU per replica\n", n);
        return GPU_SKIP;
    }
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("cuda_train_dp", setup, NULL);
    CU_add_test(s, "dp 2: the gradients over NCCL = over MPI within 1e-4", test_nccl_against_mpi);
    return test_main();
}
