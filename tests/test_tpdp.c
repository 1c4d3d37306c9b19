/* Tensor and data parallelism (issue 17): a stage's costs on each GPU of its group against
 * Megatron-LM's published formulas worked by hand, the simulator's data-parallel step against
 * its critical path derived by hand, and clusters that cannot be built refused with their
 * numbers. */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "cost.h"
#include "jsonio.h"
#include "plan.h"
#include "planner.h"
#include "pool.h"
#include "replicas.h"
#include "sim.h"
#include "testutil.h"

/* GPT, s = 32, b = 2, h = 64, a = 8, bf16: one b*s*h tensor is 2 * 32 * 64 * 2 = 8192 bytes. */
#define SEQ 32
#define BATCH 2
#define HIDDEN 64
#define HEADS 8
#define SBH (SEQ * BATCH * HIDDEN)
/* Korthikanti et al. 2022, eq. (1): a block keeps s*b*h*(34 + 5*a*s/h) bytes (16-bit). */
#define BLOCK_ACT ((int64_t)SBH * (34 + 5 * HEADS * SEQ / HIDDEN))
/* A block's parameters, 12h^2 + 13h, at the runtime's 18 bytes each in bf16. */
#define BLOCK_PARAMS ((int64_t)12 * HIDDEN * HIDDEN + 13 * HIDDEN)

static const char *model_json(const char *kind)
{
    static char buf[512];
    snprintf(buf, sizeof buf,
             "{\"kind\":\"%s\",\"n_layer\":2,\"n_embd\":%d,\"n_head\":%d,\"seq_len\":%d,"
             "\"vocab_size\":128,\"micro_batch\":%d,\"dtype\":\"bf16\"%s}",
             kind, HIDDEN, HEADS, SEQ, BATCH,
             strcmp(kind, "llama") == 0 ? ",\"n_kv_head\":2,\"ffn_hidden\":128,"
                                          "\"rope_theta\":10000,\"norm_eps\":1e-5"
                                        : "");
    return buf;
}

/* A layer of fwd ms forward and twice that backward with `params` parameters and `act` bytes
 * kept; a block has an option "attn" that regenerates 4*s*b*h bytes in 2 ms. */
static void layer_json(char *out, size_t cap, const char *name, int64_t params, int64_t act,
                       double fwd)
{
    char option[160] = "";
    if (strncmp(name, "block", 5) == 0)
        snprintf(option, sizeof option,
                 ",\"recompute_options\":[{\"name\":\"attn\",\"kept_bytes\":%lld,"
                 "\"transient_bytes\":%lld,\"recompute_ms\":2}]",
                 (long long)(act - 4 * SBH), (long long)(4 * SBH));
    snprintf(out, cap,
             "{\"name\":\"%s\",\"fwd_ms\":%g,\"bwd_ms\":%g,\"state_bytes\":%lld,"
             "\"act_bytes\":%lld,\"ckpt_bytes\":%d,\"out_bytes\":%d,\"workspace_bytes\":10000%s}",
             name, fwd, 2 * fwd, (long long)(18 * params), (long long)act, 2 * SBH, 2 * SBH,
             option);
}

/* A profile of the model on `device`, its layers of fwd ms forward, with tp_efficiency 0.8;
 * returns its path (caller frees). */
static char *write_device_profile(const char *name, const char *kind, const char *device,
                                  double fwd)
{
    char l[4][512], text[4096];
    layer_json(l[0], sizeof l[0], "embed", 128 * HIDDEN + SEQ * HIDDEN, 2 * SBH, fwd);
    layer_json(l[1], sizeof l[1], "block.0", BLOCK_PARAMS, BLOCK_ACT, fwd);
    layer_json(l[2], sizeof l[2], "block.1", BLOCK_PARAMS, BLOCK_ACT, fwd);
    layer_json(l[3], sizeof l[3], "head", 128 * HIDDEN, 6 * SBH, fwd);
    snprintf(text, sizeof text,
             "{\"format\":\"ballast-profile/1\",\"device\":{\"name\":\"%s\",\"kind\":\"cuda\","
             "\"memory_bytes\":1000000000},\"estimated\":true,\"tp_efficiency\":0.8,"
             "\"model\":%s,\"layers\":[%s,%s,%s,%s]}",
             device, model_json(kind), l[0], l[1], l[2], l[3]);
    return strdup(test_write(name, text));
}

/* On device "G", 8 ms forward a layer. */
static char *write_profile(const char *name, const char *kind)
{
    return write_device_profile(name, kind, "G", 8);
}

/* Two stages of device G, `stage` (tp, dp, ...) on each, the cluster's `extra` members. */
static const char *write_cluster(const char *name, const char *profile, const char *stage0,
                                 const char *stage1, const char *extra)
{
    char text[2048];
    snprintf(text, sizeof text,
             "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"micro_batches\":4%s,"
             "\"stages\":[{\"device\":\"G\",\"memory_bytes\":900000000,\"profile\":\"%s\","
             "\"layers\":[0,1]%s},{\"device\":\"G\",\"memory_bytes\":900000000,"
             "\"profile\":\"%s\",\"layers\":[2,3]%s}]}",
             extra, profile, stage0, profile, stage1);
    return test_write(name, text);
}

#define GROUP ",\"tp\":4,\"dp\":2,\"per_node\":8,\"node_link\":{\"gbps\":100,\"latency_us\":2}"

/* One ring all-gather or reduce-scatter of the 8192-byte tensor over 4 GPUs at 100 Gb/s,
 * 2 us: 3 steps of 2048 bytes. */
static const double collective_ms = 3 * (0.002 + 2048 * 8 / 100e9 * 1e3);

static void test_block_by_hand(void)
{
    char *prof = write_profile("g.json", "gpt");
    const char *file = write_cluster("c.json", prof, GROUP, GROUP, ",\"shard_optimizer\":true");
    struct cluster c;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(cluster_load(file, &c, &e), ERR_OK);
    const struct layer_cost *b = &cluster_stage_profile(&c, 0)->layers[1];
    /* activations with sequence parallelism: s*b*h*(34 + 5as/h) / t */
    CU_ASSERT_EQUAL(b->act_bytes, (int64_t)SBH * 54 / 4);
    CU_ASSERT_EQUAL(b->ckpt_bytes, 2 * SBH / 4);
    CU_ASSERT_EQUAL(b->out_bytes, 2 * SBH / 4);
    CU_ASSERT_EQUAL(b->options[0].kept_bytes, (BLOCK_ACT - 4 * SBH) / 4);
    CU_ASSERT_EQUAL(b->options[0].transient_bytes, 4 * SBH / 4);
    /* 2-byte weights and 4-byte gradients / t, 12 bytes of optimizer / (t * d) */
    CU_ASSERT_EQUAL(b->state_bytes, BLOCK_PARAMS * 6 / 4 + BLOCK_PARAMS * 12 / 8);
    /* workspace / t plus the gathered input */
    CU_ASSERT_EQUAL(b->workspace_bytes, 2500 + 2 * SBH);
    /* compute / (t * 0.8) plus 2 all-gathers and 2 reduce-scatters a pass */
    CU_ASSERT_DOUBLE_EQUAL(b->fwd_ms, 8 / 3.2 + 4 * collective_ms, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(b->bwd_ms, 16 / 3.2 + 4 * collective_ms, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(b->options[0].recompute_ms, 2 / 3.2, 1e-12);
    const struct layer_cost *emb = &cluster_stage_profile(&c, 0)->layers[0];
    CU_ASSERT_DOUBLE_EQUAL(emb->fwd_ms, 8 / 3.2 + collective_ms, 1e-12);
    CU_ASSERT_EQUAL(emb->workspace_bytes, 2500);
    /* gradients all-reduced over dp: 4 bytes a parameter / t */
    CU_ASSERT_EQUAL(cluster_grad_bytes(&c, 1, 2, 2), BLOCK_PARAMS * 4 / 4);
    cluster_free(&c);

    /* not sharded: the optimizer / t only */
    file = write_cluster("c2.json", prof, GROUP, GROUP, "");
    CU_ASSERT_EQUAL_FATAL(cluster_load(file, &c, &e), ERR_OK);
    CU_ASSERT_EQUAL(cluster_stage_profile(&c, 1)->layers[2].state_bytes, BLOCK_PARAMS * 18 / 4);
    cluster_free(&c);
    free(prof);
}

/* tp = dp = 1 leaves the profile's numbers as they are. */
static void test_one_gpu_unchanged(void)
{
    char *prof = write_profile("g1.json", "gpt");
    const char *file = write_cluster("c1.json", prof, "", "", ",\"shard_optimizer\":true");
    struct cluster c;
    struct profile p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(cluster_load(file, &c, &e), ERR_OK);
    CU_ASSERT_EQUAL_FATAL(profile_load(prof, &p, &e), ERR_OK);
    CU_ASSERT_EQUAL(memcmp(cluster_stage_profile(&c, 0)->layers, p.layers,
                           (size_t)p.n_layers * sizeof *p.layers),
                    0);
    CU_ASSERT_EQUAL(cluster_grad_bytes(&c, 0, 0, 3), 0);
    profile_free(&p);
    cluster_free(&c);
    free(prof);
}

/* A cluster refused: exit 2 from `ballast plan` and every fragment in its message. */
static void refused(const char *name, const char *file, const char *const *want)
{
    char args[1024], *err = NULL;
    snprintf(args, sizeof args, "plan --cluster %s -o %s", file, test_path("never.json"));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    for (int k = 0; want[k] != NULL; k++)
        if (err == NULL || strstr(err, want[k]) == NULL) {
            fprintf(stderr, "%s: missing \"%s\" in: %s\n", name, want[k], err ? err : "");
            CU_FAIL("message");
        }
    free(err);
}

static void test_bad_clusters(void)
{
    char *gpt = write_profile("gb.json", "gpt"), *llama = write_profile("lb.json", "llama");
    refused("tp 3", write_cluster("b1.json", gpt, ",\"tp\":3", ",\"tp\":3", ""),
            (const char *const[]){"stages[0].tp", "3 does not divide the model's n_head 8", NULL});
    refused("kv heads", write_cluster("b2.json", llama, ",\"tp\":4", ",\"tp\":4", ""),
            (const char *const[]){"stages[0].tp", "4 does not divide the model's n_kv_head 2",
                                  NULL});
    refused("node", write_cluster("b3.json", gpt, ",\"tp\":8,\"per_node\":4", "", ""),
            (const char *const[]){"stages[0].tp", "8 GPUs", "only 4 (per_node)", NULL});
    refused("dp", write_cluster("b4.json", gpt, ",\"dp\":2", ",\"dp\":4", ""),
            (const char *const[]){"stages[1].dp: 4", "stages[0].dp is 2", NULL});
    refused("tp per device", write_cluster("b5.json", gpt, ",\"tp\":2", ",\"tp\":4", ""),
            (const char *const[]){"stages[1].tp: 4", "has tp 2", NULL});
    free(gpt);
    free(llama);
}

/* Two stages, two micro-batches, 1F1B, forward 1 ms and backward 2 ms, free links:
 *   stage 0  F0 [0,1]  F1 [1,2]  B0 [4,6]  B1 [7,9]
 *   stage 1  F0 [1,2]  B0 [2,4]  F1 [4,5]  B1 [5,7]
 * so the last backwards end at 9 and 7, and each stage's all-reduce starts there. */
static double dp_step(double allreduce0, double allreduce1)
{
    struct sim_stage st[2] = {{.fwd_ms = 1, .bwd_ms = 2, .allreduce_ms = allreduce0},
                              {.fwd_ms = 1, .bwd_ms = 2, .allreduce_ms = allreduce1}};
    struct sim_result r;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(sim_run(SCHEDULE_1F1B, 2, 2, st, &r, &e), ERR_OK);
    double ms = r.iteration_ms, periodic;
    int simulated;
    CU_ASSERT_EQUAL(sim_makespan_periodic(SCHEDULE_1F1B, 2, 2, st, &periodic, &simulated, &e),
                    ERR_OK);
    CU_ASSERT_DOUBLE_EQUAL(periodic, ms, 1e-12);
    sim_result_free(&r);
    return ms;
}

static void test_dp_step_by_hand(void)
{
    CU_ASSERT_DOUBLE_EQUAL(dp_step(0, 0), 9, 1e-12);
    /* stage 1's reduction overlaps stage 0's drain and still ends last: 7 + 3 */
    CU_ASSERT_DOUBLE_EQUAL(dp_step(0.5, 3), 10, 1e-12);
    /* hidden under the drain: stage 0's 9 + 0.5 */
    CU_ASSERT_DOUBLE_EQUAL(dp_step(0.5, 1), 9.5, 1e-12);
    /* the ring: 2 (dp - 1) steps of bytes / dp, 4 MB over 4 replicas at 200 Gb/s, 5 us */
    struct link l = {.present = 1, .gbps = 200, .latency_us = 5};
    CU_ASSERT_DOUBLE_EQUAL(cost_dp_allreduce_ms(&l, 4, 4000000), 6 * (0.005 + 0.04), 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(cost_dp_allreduce_ms(&l, 1, 4000000), 0, 0);
}

/* A planned tp 4 x dp 2 pipeline: its step is the same pipeline's last backwards plus each
 * stage's all-reduce of its gradients (per GPU: 4 bytes a parameter / tp) over the dp link. */
static void test_planned_dp_step(void)
{
    char *prof = write_profile("gp.json", "gpt");
    const char *file = write_cluster("cp.json", prof, GROUP, GROUP,
                                     ",\"dp_link\":{\"gbps\":50,\"latency_us\":10}");
    char args[1024], plan_file[512];
    snprintf(plan_file, sizeof plan_file, "%s", test_path("plan.json"));
    snprintf(args, sizeof args, "plan --cluster %s --method optimal -o %s", file, plan_file);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(plan_load(plan_file, &p, &e), ERR_OK);
    int64_t params[2] = {128 * HIDDEN + SEQ * HIDDEN + BLOCK_PARAMS, BLOCK_PARAMS + 128 * HIDDEN};
    double allreduce[2];
    for (int s = 0; s < 2; s++) {
        CU_ASSERT_EQUAL(p.stages[s].tp, 4);
        CU_ASSERT_EQUAL(p.stages[s].dp, 2);
        CU_ASSERT_EQUAL(p.stages[s].allreduce_bytes, params[s] * 4 / 4);
        allreduce[s] = 2 * (0.010 + params[s] / 2.0 * 8 / 50e9 * 1e3);
        p.stages[s].dp = 1; /* the same pipeline alone */
    }
    struct sim_result r;
    CU_ASSERT_EQUAL_FATAL(sim_plan(&p, &r, &e), ERR_OK);
    double last[2] = {0, 0}, want = 0;
    for (int i = 0; i < r.n_tasks; i++)
        if (r.tasks[i].kind == SIM_BACKWARD && r.tasks[i].end_ms > last[r.tasks[i].stage])
            last[r.tasks[i].stage] = r.tasks[i].end_ms;
    for (int s = 0; s < 2; s++)
        want = last[s] + allreduce[s] > want ? last[s] + allreduce[s] : want;
    CU_ASSERT(test_close(p.iteration_ms, want, 1e-9, 1e-12));
    CU_ASSERT(p.iteration_ms > r.iteration_ms);
    sim_result_free(&r);
    char *err = NULL;
    snprintf(args, sizeof args, "train --plan %s --steps 1", plan_file);
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "stages[0]: tp 4, dp 2") != NULL &&
              strstr(err, "is for export") != NULL);
    free(err);
    plan_free(&p);
    free(prof);
}

/* A pipeline of 1F1B over 2 micro-batches, the model's 4 layers of 0.5 ms forward and 1 ms
 * backward each, `S` stages splitting them evenly, dp replicas, `gradients` bytes per stage,
 * each layer 100 bytes of state, replicas linked at `gbps`. */
static void pipeline(struct plan *p, int S, int dp, int64_t gradients, double gbps)
{
    int first[2] = {0, 2}, last[2] = {S == 1 ? 3 : 1, 3};
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(plan_init(p, S, first, last, &e), ERR_OK);
    p->schedule = SCHEDULE_1F1B;
    p->micro_batches = 2;
    p->model = (struct model){.kind = MODEL_KIND_GPT, .n_layer = 2, .n_embd = 64, .n_head = 8,
                              .seq_len = 32, .vocab_size = 128, .micro_batch = 2};
    for (int s = 0; s < S; s++) {
        struct plan_stage *st = &p->stages[s];
        for (int l = 0; l <= st->last - st->first; l++)
            st->layers[l] = (struct layer_cost){.fwd_ms = 0.5, .bwd_ms = 1, .state_bytes = 100};
        st->dp = dp;
        st->allreduce_bytes = gradients;
        st->dp_link = (struct link){.present = 1, .gbps = gbps};
    }
}

/* Pipeline A: 2 stages (last backwards end at 9 and 7 ms, dp_step's), 4 MB of gradients each,
 * at 100 Gb/s; pipeline B: 1 stage (F0 [0,2] B0 [2,6] F1 [6,8] B1 [8,12]), 8 MB, at 50 Gb/s.
 * Segments from the last layer: [2,3] (A's stage 1, B's stage 0) and [0,1] (A's stage 0, B's
 * stage 0). Each moves max(4 MB, B's half of 8 MB) = 4 MB over N = 2 replicas at the slower
 * 50 Gb/s: 2 (N-1) x 2 MB = 0.64 ms. [2,3] waits for B (12): [12, 12.64]; [0,1] waits for B's
 * link: [12.64, 13.28]. */
static void test_heterogeneous_by_hand(void)
{
    struct plan p[2];
    pipeline(&p[0], 2, 1, 4000000, 100);
    pipeline(&p[1], 1, 1, 8000000, 50);
    struct replicas_result r;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(replicas_step(p, 2, &r, &e), ERR_OK);
    CU_ASSERT_DOUBLE_EQUAL(r.pipeline_ms[0], 9, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(r.pipeline_ms[1], 12, 1e-12);
    CU_ASSERT_EQUAL(r.n_segments, 2);
    CU_ASSERT_EQUAL(r.replicas, 2);
    CU_ASSERT_EQUAL(r.global_batch, 2 * 2 + 2 * 2);
    CU_ASSERT_DOUBLE_EQUAL(r.step_ms, 13.28, 1e-9);
    replicas_result_free(&r);
    /* an optimizer step of 0.25 ms a layer: each stage steps once its own segments are
     * reduced, as the simulator runs a stage's step after its reduction: B's one stage (4
     * layers) at 13.28 + 1, A's stage 0 (2 layers) at 13.28 + 0.5, A's stage 1 at 12.64 +
     * 0.5 */
    for (int k = 0; k < 2; k++)
        for (int s = 0; s < p[k].n_stages; s++)
            for (int l = 0; l <= p[k].stages[s].last - p[k].stages[s].first; l++)
                p[k].stages[s].layers[l].optimizer_ms = 0.25;
    CU_ASSERT_EQUAL_FATAL(replicas_step(p, 2, &r, &e), ERR_OK);
    CU_ASSERT_DOUBLE_EQUAL(r.pipeline_ms[1], 13, 1e-12); /* alone: 12 + 1 */
    CU_ASSERT_DOUBLE_EQUAL(r.step_ms, 14.28, 1e-9);
    replicas_result_free(&r);
    /* one pipeline of dp 3: exactly the simulator's data-parallel step */
    struct plan *one = &p[0];
    for (int s = 0; s < 2; s++)
        one->stages[s].dp = 3;
    struct sim_result sr;
    CU_ASSERT_EQUAL_FATAL(replicas_step(one, 1, &r, &e), ERR_OK);
    CU_ASSERT_EQUAL_FATAL(sim_plan(one, &sr, &e), ERR_OK);
    CU_ASSERT_DOUBLE_EQUAL(r.step_ms, sr.iteration_ms, 1e-12);
    /* stage 0: 9 + 2 (3-1) x 1333334 bytes at 100 Gb/s, then its 2 layers' step */
    CU_ASSERT_DOUBLE_EQUAL(sr.iteration_ms, 9 + 4 * (1333334 * 8 / 100e9 * 1e3) + 0.5, 1e-12);
    sim_result_free(&sr);
    replicas_result_free(&r);
    plan_free(&p[0]);
    plan_free(&p[1]);
}

/* A cluster of two pipelines, planned and simulated by the command line. */
static void test_pipelines_cli(void)
{
    char *prof = write_profile("gh.json", "gpt");
    char text[2048], args[1024], out[512], sim[512], *err = NULL;
    snprintf(text, sizeof text,
             "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"micro_batches\":4,"
             "\"dp_link\":{\"gbps\":25},\"pipelines\":[{\"stages\":["
             "{\"device\":\"G\",\"memory_bytes\":900000000,\"profile\":\"%s\",\"tp\":2,"
             "\"dp\":2},{\"device\":\"G\",\"memory_bytes\":900000000,\"profile\":\"%s\","
             "\"tp\":2,\"dp\":2}]},{\"micro_batches\":2,\"stages\":[{\"device\":\"G\","
             "\"memory_bytes\":900000000,\"profile\":\"%s\"}]}]}",
             prof, prof, prof);
    const char *file = test_write("pipes.json", text);
    snprintf(out, sizeof out, "%s", test_path("replicas.json"));
    snprintf(sim, sizeof sim, "%s", test_path("sim.json"));
    snprintf(args, sizeof args, "plan --cluster %s -o %s", file, out);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    snprintf(args, sizeof args, "simulate --plan %s -o %s --quiet", out, sim);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    struct err e;
    err_clear(&e);
    cJSON *planned = jsonio_read(out, &e), *simulated = jsonio_read(sim, &e);
    CU_ASSERT_FATAL(planned != NULL && simulated != NULL);
    double step = cJSON_GetObjectItem(planned, "step_ms")->valuedouble;
    CU_ASSERT_DOUBLE_EQUAL(cJSON_GetObjectItem(simulated, "iteration_ms")->valuedouble, step,
                           1e-9);
    CU_ASSERT_EQUAL(cJSON_GetObjectItem(planned, "replicas")->valueint, 3);
    /* 2 x 4 micro-batches + 1 x 2, of 2 samples */
    CU_ASSERT_EQUAL(cJSON_GetObjectItem(planned, "global_batch")->valueint, 20);
    cJSON_Delete(planned);
    cJSON_Delete(simulated);
    /* the pipeline alone is refused by commands that take one */
    snprintf(args, sizeof args, "train --plan %s", out);
    CU_ASSERT_EQUAL(test_run(args, NULL, NULL), 2);
    snprintf(text + strlen(text) - 5, 64, ",\"tp\":3}]}]}");
    file = test_write("pipes3.json", text);
    snprintf(args, sizeof args, "plan --cluster %s", file);
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    if (err != NULL && strstr(err, "pipelines[1]") == NULL)
        fprintf(stderr, "%s\n", err);
    CU_ASSERT(err != NULL && strstr(err, "pipelines[1]") != NULL &&
              strstr(err, "stages[0].tp: 3 does not divide the model's n_head 8") != NULL);
    free(err);
    free(prof);
}

/* An estimated profile for (A100-80GB, tp 2) serves stages of tp 2 with the memory the
 * one-GPU estimate split by the cluster has, its times per degree no faster (test_tp_profiles
 * has them against the one-GPU estimate), and only those stages. */
static void test_estimate_for_tp(void)
{
    char one[512], two[512], args[1024], *err = NULL;
    snprintf(one, sizeof one, "%s", test_path("a100.json"));
    snprintf(two, sizeof two, "%s", test_path("a100-tp2.json"));
    const char *model = BALLAST_SOURCE_DIR "/configs/models/gpt-tiny.json";
    snprintf(args, sizeof args, "profile --model %s --estimate --device A100-80GB -o %s", model,
             one);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    snprintf(args, sizeof args,
             "profile --model %s --estimate --device A100-80GB --tp 2 --node-link-gbps 2400 "
             "--node-link-latency-us 3 -o %s",
             model, two);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    struct cluster c[2];
    struct profile p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(profile_load(two, &p, &e), ERR_OK);
    CU_ASSERT_EQUAL(p.tp, 2);
    const char *files[2] = {one, two};
    for (int k = 0; k < 2; k++) {
        char text[1024], name[16];
        snprintf(text, sizeof text,
                 "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"micro_batches\":4,"
                 "\"stages\":[{\"device\":\"A100-80GB\",\"memory_bytes\":80000000000,"
                 "\"profile\":\"%s\",\"tp\":2,\"dp\":2,\"node_link\":{\"gbps\":2400,"
                 "\"latency_us\":3}}],\"shard_optimizer\":true}",
                 files[k]);
        snprintf(name, sizeof name, "e%d.json", k);
        CU_ASSERT_EQUAL_FATAL(cluster_load(test_write(name, text), &c[k], &e), ERR_OK);
    }
    const struct profile *a = cluster_stage_profile(&c[0], 0), *b = cluster_stage_profile(&c[1], 0);
    for (int l = 0; l < a->n_layers; l++) {
        CU_ASSERT_EQUAL(a->layers[l].act_bytes, b->layers[l].act_bytes);
        CU_ASSERT_EQUAL(a->layers[l].state_bytes, b->layers[l].state_bytes);
        /* per degree, each GPU's share on the roofline: never faster than the one-GPU time
         * split ideally (tp_efficiency 1.0), the collectives the same */
        CU_ASSERT(b->layers[l].fwd_ms >= a->layers[l].fwd_ms * (1 - 1e-12));
        CU_ASSERT_EQUAL(a->layers[l].act_bytes, (p.layers[l].act_bytes));
    }
    CU_ASSERT_EQUAL(cluster_grad_bytes(&c[0], 0, 0, a->n_layers - 1),
                    cluster_grad_bytes(&c[1], 0, 0, a->n_layers - 1));
    cluster_free(&c[0]);
    cluster_free(&c[1]);
    profile_free(&p);
    char text[1024];
    snprintf(text, sizeof text,
             "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"micro_batches\":4,"
             "\"stages\":[{\"device\":\"A100-80GB\",\"memory_bytes\":80000000000,"
             "\"profile\":\"%s\",\"tp\":4}]}",
             two);
    snprintf(args, sizeof args, "plan --cluster %s", test_write("e4.json", text));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "stages[0].tp: 4, but its profile's costs are per GPU "
                                         "of a group of tp 2") != NULL);
    free(err);
}

/* The pool test's two kinds: G (4 GPUs, 2 a node, 8 ms a layer) and H (2 GPUs, 2 a node,
 * 5 ms a layer, 1.2 MB each: a stage of H holds at most about two layers). */
static const char *pool_kinds[2] = {"G", "H"};
static const int pool_count[2] = {4, 2};

static void pool_stage_json(char *out, size_t cap, int k, const char *profile, int tp, int dp,
                            int first, int last)
{
    snprintf(out, cap,
             "{\"device\":\"%s\",\"memory_bytes\":%d,\"profile\":\"%s\",\"per_node\":2,"
             "\"node_link\":{\"gbps\":400,\"latency_us\":1},\"tp\":%d,\"dp\":%d,"
             "\"layers\":[%d,%d]}",
             pool_kinds[k], k == 0 ? 900000000 : 1200000, profile, tp, dp, first, last);
}

/* The least step of every split of the 4 layers over the stages in `order` (kind per stage):
 * compositions by the bits of a 3-bit cut mask. */
static double best_split(const char *const profiles[2], const int *order, int S, int dp,
                         const int tp[2], int M)
{
    double best = -1;
    for (int mask = 0; mask < 8; mask++) {
        if (__builtin_popcount(mask) != S - 1)
            continue;
        char stages[4096] = "", one[512], text[5000];
        int first = 0, s = 0;
        for (int l = 0; l < 4; l++)
            if (l == 3 || (mask >> l & 1)) {
                int k = order[s++];
                pool_stage_json(one, sizeof one, k, profiles[k], tp[k], dp, first, l);
                strcat(stages, s > 1 ? "," : "");
                strcat(stages, one);
                first = l + 1;
            }
        snprintf(text, sizeof text,
                 "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"micro_batches\":%d,"
                 "\"link\":{\"gbps\":100,\"latency_us\":2},\"dp_link\":{\"gbps\":10,"
                 "\"latency_us\":5},\"shard_optimizer\":true,\"stages\":[%s]}",
                 M, stages);
        struct cluster c;
        struct plan p;
        struct plan_options o;
        struct err e;
        err_clear(&e);
        plan_options_default(&o);
        o.min_gain = 0; /* the fastest, which the brute force is */
        CU_ASSERT_EQUAL_FATAL(cluster_load(test_write("brute.json", text), &c, &e), ERR_OK);
        int rc = planner_make(&c, &o, &p, &e);
        cluster_free(&c);
        CU_ASSERT(rc == ERR_OK || rc == ERR_NOFIT);
        if (rc == ERR_OK && (best < 0 || p.iteration_ms < best))
            best = p.iteration_ms;
        if (rc == ERR_OK)
            plan_free(&p);
    }
    return best;
}

/* Brute force over the pool search's space: every dp up to the micro-batches (the replicas
 * taking ceil(B / dp) the most), tp and stage count per kind, every order of the kinds along
 * the pipeline and every split (each planned by --method optimal on its fixed split). */
static double pool_brute_force(const char *const profiles[2], int global_batch)
{
    double best = -1;
    int B = global_batch / BATCH;
    for (int dp = 1; dp <= B; dp++) {
        for (int code = 0; code < 2 * 2 * 5 * 3; code++) {
            int tp[2] = {1 + code % 2, 1 + code / 2 % 2};
            int n[2] = {code / 4 % 5, code / 20}; /* stages of G (0-4) and of H (0-2) */
            if (n[0] + n[1] < 1 || n[0] + n[1] > 4 || (n[0] == 0 && tp[0] > 1) ||
                (n[1] == 0 && tp[1] > 1) ||
                dp * tp[0] * n[0] > pool_count[0] || dp * tp[1] * n[1] > pool_count[1])
                continue;
            for (int first = 0; first < 2; first++) {
                if (n[0] > 0 && n[1] > 0 ? 0 : first == 1)
                    continue; /* one kind: one order */
                int order[4], S = 0; /* at most the model's 4 layers */
                for (int g = 0; g < 2; g++)
                    for (int j = 0; j < n[first ^ g]; j++)
                        order[S++] = first ^ g;
                double t = best_split(profiles, order, S, dp, tp, (B + dp - 1) / dp);
                if (t >= 0 && (best < 0 || t < best))
                    best = t;
            }
        }
    }
    return best;
}

static void test_pool_against_brute_force(void)
{
    char *g = write_device_profile("pg.json", "gpt", "G", 8);
    char *h = write_device_profile("ph.json", "gpt", "H", 5);
    const char *const profiles[2] = {g, h};
    int batches[2] = {4, 8};
    for (int b = 0; b < 2; b++) {
        char kinds[2][512], text[2048];
        for (int k = 0; k < 2; k++) {
            pool_stage_json(kinds[k], sizeof kinds[k], k, profiles[k], 1, 1, 0, 0);
            /* the stage's fields less tp, dp, layers, plus count */
            char *cut = strstr(kinds[k], ",\"tp\"");
            snprintf(cut, sizeof kinds[k] - (size_t)(cut - kinds[k]), ",\"count\":%d}",
                     pool_count[k]);
        }
        snprintf(text, sizeof text,
                 "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"global_batch\":%d,"
                 "\"link\":{\"gbps\":100,\"latency_us\":2},\"dp_link\":{\"gbps\":10,"
                 "\"latency_us\":5},\"shard_optimizer\":true,\"pool\":[%s,%s]}",
                 batches[b], kinds[0], kinds[1]);
        struct plan p;
        struct plan_options o;
        struct pool_result r;
        struct err e;
        err_clear(&e);
        plan_options_default(&o);
        o.min_gain = 0; /* the fastest, which the brute force is */
        char file[512];
        snprintf(file, sizeof file, "%s", test_write("pool.json", text));
        /* by default --repartition's search gap: within it of the best */
        CU_ASSERT_EQUAL_FATAL(pool_search(file, &o, &p, &r, &e), ERR_OK);
        double brute = pool_brute_force(profiles, batches[b]), gapped = p.iteration_ms;
        CU_ASSERT(gapped <= brute * (1 + o.search_gap) * (1 + 1e-12));
        plan_free(&p);
        o.search_gap = 0; /* exact */
        if (pool_search(file, &o, &p, &r, &e) != ERR_OK)
            fprintf(stderr, "%s\n", e.msg);
        CU_ASSERT_EQUAL_FATAL(e.code, ERR_OK);
        printf("\n  global batch %d: %ld candidates, %ld fit; dp %d, G %d x tp %d, H %d x tp %d: "
               "%.6f ms (brute force %.6f ms)",
               batches[b], r.candidates, r.fitted, r.dp, r.stages[0], r.tp[0], r.stages[1],
               r.tp[1], p.iteration_ms, brute);
        CU_ASSERT(brute > 0 && test_close(p.iteration_ms, brute, 1e-9, 1e-12));
        /* H alone cannot hold the model: planned and not fitting, or left for its memory */
        CU_ASSERT(r.fitted < r.candidates || r.cannot_fit > 0);
        plan_free(&p);
    }
    /* more GPUs a node than the pool has */
    char text[2048], args[1024], *err = NULL;
    snprintf(text, sizeof text,
             "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"global_batch\":4,"
             "\"pool\":[{\"device\":\"H\",\"count\":2,\"per_node\":4,\"memory_bytes\":1200000,"
             "\"profile\":\"%s\"}]}",
             h);
    snprintf(args, sizeof args, "plan --cluster %s", test_write("badpool.json", text));
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "pool[0].per_node: 4 GPUs a node, but the pool has "
                                         "only 2 of \"H\"") != NULL);
    free(err);
    free(g);
    free(h);
}

/* The pruned search against the exhaustive one (every candidate planned) on small pools of G
 * and H: the same plan (step, dp, tp and stages), and no more candidates planned. */
static void test_pool_pruned_exact(void)
{
    char *g = write_device_profile("qg.json", "gpt", "G", 8);
    char *h = write_device_profile("qh.json", "gpt", "H", 5);
    static const int pools[4][3] = {{4, 2, 4}, {8, 2, 8}, {8, 4, 16}, {2, 4, 8}}; /* G, H, batch */
    for (int i = 0; i < 4; i++) {
        char text[2048];
        snprintf(text, sizeof text,
                 "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"global_batch\":%d,"
                 "\"link\":{\"gbps\":100,\"latency_us\":2},\"dp_link\":{\"gbps\":10,"
                 "\"latency_us\":5},\"shard_optimizer\":true,\"pool\":["
                 "{\"device\":\"G\",\"count\":%d,\"per_node\":2,\"memory_bytes\":900000000,"
                 "\"profile\":\"%s\",\"node_link\":{\"gbps\":400,\"latency_us\":1}},"
                 "{\"device\":\"H\",\"count\":%d,\"per_node\":2,\"memory_bytes\":1200000,"
                 "\"profile\":\"%s\",\"node_link\":{\"gbps\":400,\"latency_us\":1}}]}",
                 pools[i][2], pools[i][0], g, pools[i][1], h);
        char file[512];
        snprintf(file, sizeof file, "%s", test_write("pruned.json", text));
        struct plan all, pruned;
        struct pool_result ra, rp;
        struct plan_options o;
        struct err e;
        err_clear(&e);
        plan_options_default(&o);
        o.search_gap = 0;
        CU_ASSERT_EQUAL_FATAL(pool_search_pruned(file, &o, 0, &all, &ra, &e), ERR_OK);
        CU_ASSERT_EQUAL_FATAL(pool_search_pruned(file, &o, 1, &pruned, &rp, &e), ERR_OK);
        printf("\n  G %d, H %d, batch %d: %ld candidates planned of %ld; %.6f ms (all: %.6f)",
               pools[i][0], pools[i][1], pools[i][2], rp.candidates, ra.candidates,
               pruned.iteration_ms, all.iteration_ms);
        CU_ASSERT_EQUAL(pruned.iteration_ms, all.iteration_ms);
        double all_dp_ms = all.iteration_ms;
        CU_ASSERT_EQUAL(rp.dp, ra.dp);
        CU_ASSERT_EQUAL(rp.micro_batches, ra.micro_batches);
        CU_ASSERT(memcmp(rp.tp, ra.tp, sizeof rp.tp) == 0);
        CU_ASSERT(memcmp(rp.stages, ra.stages, sizeof rp.stages) == 0);
        CU_ASSERT(rp.candidates <= ra.candidates);
        plan_free(&all);
        plan_free(&pruned);
        /* "dp": 1, the best single pipeline: no faster than the best of every dp */
        char *end = strrchr(text, '}');
        snprintf(end, sizeof text - (size_t)(end - text), ",\"dp\":1}");
        snprintf(file, sizeof file, "%s", test_write("pruned1.json", text));
        CU_ASSERT_EQUAL_FATAL(pool_search_pruned(file, &o, 0, &all, &ra, &e), ERR_OK);
        CU_ASSERT_EQUAL_FATAL(pool_search_pruned(file, &o, 1, &pruned, &rp, &e), ERR_OK);
        CU_ASSERT(ra.dp == 1 && rp.dp == 1);
        CU_ASSERT_EQUAL(pruned.iteration_ms, all.iteration_ms);
        CU_ASSERT(pruned.iteration_ms >= all_dp_ms);
        plan_free(&all);
        plan_free(&pruned);
    }
    free(g);
    free(h);
}

/* Exports carry the plan's tp (with sequence parallelism) and dp; one tp for the frameworks
 * that take one, one per device kind for FlagScale. */
static void test_exports(void)
{
    char *g = write_device_profile("xg.json", "gpt", "G", 8);
    char *h = write_device_profile("xh.json", "gpt", "H", 5);
    const char *file = write_cluster("x.json", g, GROUP, GROUP, "");
    static const char *const want[4][2] = {
        {"megatron", "--tensor-model-parallel-size 4 \\\n--sequence-parallel"},
        {"colossalai", "# launch on 16 GPUs (tp 4, pp 2, dp 2)"},
        {"nemo", "tensor_model_parallel_size: 4\n  sequence_parallel: True"},
        {"flagscale", "hetero_process_meshes: [4, 1, 1, 2, 2]"},
    };
    char args[1024], *out = NULL, *err = NULL;
    for (int k = 0; k < 4; k++) {
        snprintf(args, sizeof args, "plan --cluster %s --quiet --export %s", file, want[k][0]);
        CU_ASSERT_EQUAL(test_run(args, &out, NULL), 0);
        if (out == NULL || strstr(out, want[k][1]) == NULL) {
            fprintf(stderr, "%s: missing \"%s\" in:\n%s\n", want[k][0], want[k][1],
                    out ? out : "");
            CU_FAIL("export");
        }
        free(out);
    }
    char text[2048];
    snprintf(text, sizeof text,
             "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"micro_batches\":4,"
             "\"stages\":[{\"device\":\"G\",\"memory_bytes\":900000000,\"profile\":\"%s\","
             "\"tp\":2},{\"device\":\"H\",\"memory_bytes\":900000000,\"profile\":\"%s\","
             "\"tp\":4}]}",
             g, h);
    file = test_write("x2.json", text);
    snprintf(args, sizeof args, "plan --cluster %s --quiet --export megatron", file);
    CU_ASSERT_EQUAL(test_run(args, NULL, &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "stage 1 has tp 4 and stage 0 tp 2") != NULL);
    free(err);
    snprintf(args, sizeof args, "plan --cluster %s --quiet --export flagscale", file);
    CU_ASSERT_EQUAL(test_run(args, &out, NULL), 0);
    CU_ASSERT(out != NULL && strstr(out, "hetero_process_meshes: [2, 1, 1, 1, 1, 4, 1, 1, 1, 1]"));
    free(out);
    free(g);
    free(h);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("tpdp", NULL, NULL);
    CU_add_test(s, "a block on each GPU of tp 4 x dp 2, by hand", test_block_by_hand);
    CU_add_test(s, "tp = dp = 1 changes nothing", test_one_gpu_unchanged);
    CU_add_test(s, "bad clusters refused with their numbers", test_bad_clusters);
    CU_add_test(s, "the data-parallel step's critical path by hand", test_dp_step_by_hand);
    CU_add_test(s, "a planned tp x dp pipeline's step", test_planned_dp_step);
    CU_add_test(s, "heterogeneous replicas' step by hand", test_heterogeneous_by_hand);
    CU_add_test(s, "a cluster of pipelines planned and simulated", test_pipelines_cli);
    CU_add_test(s, "an estimate for a (device, tp) pair", test_estimate_for_tp);
    CU_add_test(s, "the pool search against brute force", test_pool_against_brute_force);
    CU_add_test(s, "the pruned pool search equals the exhaustive one", test_pool_pruned_exact);
    CU_add_test(s, "exports carry tp and dp", test_exports);
    return test_main();
}
