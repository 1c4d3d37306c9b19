/* Offload from the planner to the runtime: the shipped cpu-3-offload cluster planned with
 * `--actions recompute,offload` (stage 0 sends kept tensors to host memory instead of
 * recomputing them) trains on three ranks with every stage's measured device peak equal to
 * its plan's memory within 2% (train_run_ok) and host peak within the plan's host memory,
 * and its losses are bitwise those of the same cluster trained with nothing offloaded or
 * recomputed (`--method none` on a roomy copy: what the layers compute does not depend on
 * where their tensors wait). Streamed weights the same way: a GPT whose weights outweigh its
 * activations on two 30 MiB CPU stages plans only with `--actions ...,weights` and trains at
 * its planned device memory, its host peak its plan's host memory, bitwise as a roomy run. */
#include <CUnit/Basic.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "traintest.h"

#define NP 3
#define LIMIT_S 180


/* The tid of the trace's track named `name`, -1 if none. */
static int track_tid(const cJSON *events, const char *name)
{
    const cJSON *ev;
    cJSON_ArrayForEach(ev, events)
    {
        const cJSON *args = cJSON_GetObjectItem(ev, "args");
        const char *what = cJSON_GetStringValue(cJSON_GetObjectItem(ev, "name"));
        const char *named = cJSON_GetStringValue(cJSON_GetObjectItem(args, "name"));
        if (what && strcmp(what, "thread_name") == 0 && named && strcmp(named, name) == 0)
            return (int)cJSON_GetNumberValue(cJSON_GetObjectItem(ev, "tid"));
    }
    return -1;
}

/* The copies of one lane, in the order written (each lane runs first in first out). */
struct copy_span {
    double ts, dur;
    int step, micro;
    char layer[64];
};

static int lane_spans(const cJSON *events, int tid, const char *cat, struct copy_span *out,
                      int cap)
{
    int n = 0;
    const cJSON *ev;
    cJSON_ArrayForEach(ev, events)
    {
        const char *c = cJSON_GetStringValue(cJSON_GetObjectItem(ev, "cat"));
        const char *ph = cJSON_GetStringValue(cJSON_GetObjectItem(ev, "ph"));
        if (tid < 0 || (int)cJSON_GetNumberValue(cJSON_GetObjectItem(ev, "tid")) != tid ||
            ph == NULL || strcmp(ph, "X") != 0) /* not the tracks' names */
            continue;
        CU_ASSERT(c != NULL && strcmp(c, cat) == 0); /* nothing else on a copy lane */
        if (c == NULL || strcmp(c, cat) != 0 || n == cap)
            continue;
        const cJSON *args = cJSON_GetObjectItem(ev, "args");
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(ev, "name"));
        out[n] = (struct copy_span){cJSON_GetNumberValue(cJSON_GetObjectItem(ev, "ts")),
                                    cJSON_GetNumberValue(cJSON_GetObjectItem(ev, "dur")),
                                    (int)cJSON_GetNumberValue(cJSON_GetObjectItem(args, "step")),
                                    (int)cJSON_GetNumberValue(
                                        cJSON_GetObjectItem(args, "micro_batch")),
                                    ""};
        snprintf(out[n].layer, sizeof out[n].layer, "%s", name ? name + strlen(cat) : "");
        n++;
    }
    return n;
}

/* Stage s's copy lanes in the runtime's trace, as the simulator's trace has them: a track
 * each way with `copies` spans (every offloaded layer's tensors, out and back, per
 * micro-batch and step) when it offloads, none when it does not; a lane's copies one after
 * another; each prefetch after its copy out. */
static void check_copy_lanes(const char *file, int s, int copies)
{
    cJSON *j = train_json_read(file);
    CU_ASSERT_FATAL(j != NULL);
    const cJSON *events = cJSON_GetObjectItem(j, "traceEvents");
    char to[64], from[64];
    snprintf(to, sizeof to, "stage %d to host", s);
    snprintf(from, sizeof from, "stage %d from host", s);
    int out_tid = track_tid(events, to), in_tid = track_tid(events, from);
    CU_ASSERT((out_tid >= 0) == (copies > 0) && (in_tid >= 0) == (copies > 0));
    struct copy_span *out = calloc((size_t)copies + 1, sizeof *out),
                     *in = calloc((size_t)copies + 1, sizeof *in);
    CU_ASSERT_FATAL(out != NULL && in != NULL);
    int n_out = lane_spans(events, out_tid, "copy to host", out, copies + 1);
    int n_in = lane_spans(events, in_tid, "copy from host", in, copies + 1);
    CU_ASSERT_EQUAL(n_out, copies);
    CU_ASSERT_EQUAL(n_in, copies);
    for (int i = 0; i + 1 < n_out; i++)
        CU_ASSERT(out[i].ts + out[i].dur <= out[i + 1].ts + 1e-3);
    for (int i = 0; i + 1 < n_in; i++)
        CU_ASSERT(in[i].ts + in[i].dur <= in[i + 1].ts + 1e-3);
    int matched = 0;
    for (int i = 0; i < n_in; i++)
        for (int k = 0; k < n_out; k++)
            if (out[k].step == in[i].step && out[k].micro == in[i].micro &&
                strcmp(out[k].layer, in[i].layer) == 0) {
                matched++;
                CU_ASSERT(in[i].ts >= out[k].ts + out[k].dur - 1e-3);
            }
    CU_ASSERT_EQUAL(matched, n_in);
    free(out);
    free(in);
    cJSON_Delete(j);
}

static void test_planned_offload_trains(void)
{
    const char *cluster = BALLAST_SOURCE_DIR "/configs/clusters/cpu-3-offload.json";
    const char *off = train_plan_cluster(cluster, "--actions recompute,offload", "offload.json");
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(plan_load(off, &p, &e) == ERR_OK);
    int offloads = 0, per_stage[NP] = {0};
    int64_t host_planned = p.stages[0].host_memory_bytes;
    for (int s = 0; s < p.n_stages && s < NP; s++)
        for (int l = 0; l < plan_stage_layer_count(&p.stages[s]); l++)
            per_stage[s] += layer_action_offloads(&p.stages[s].actions[l]);
    offloads = per_stage[0];
    CU_ASSERT(offloads > 0); /* the lever this test is about */
    int M = p.micro_batches;
    plan_free(&p);

    struct train_metrics m, ref;
    char args[1200];
    snprintf(args, sizeof args, "--steps 3 --host-link-gbps 100 --trace '%s'",
             test_path("offload-trace.json"));
    CU_ASSERT_FATAL(train_run_ok(NP, LIMIT_S, off, args, "offload-metrics.json", &m) == 0);
    for (int s = 0; s < NP; s++)
        check_copy_lanes(test_path("offload-trace.json"), s, per_stage[s] * M * 3);
    /* the host peak the runtime measured against the plan's host memory */
    cJSON *j = train_json_read(test_path("offload-metrics.json"));
    CU_ASSERT_FATAL(j != NULL);
    const cJSON *st0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "stages"), 0);
    double host_peak = cJSON_GetNumberValue(cJSON_GetObjectItem(st0, "host_peak_bytes"));
    CU_ASSERT(host_peak > 0 && host_peak <= (double)host_planned);
    cJSON_Delete(j);

    /* the reference: nothing offloaded or recomputed, on stages roomy enough */
    char text[4096];
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 4, "
             "\"stages\": ["
             "{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
             "\"%s/configs/profiles/estimated/gpt-tiny/cpu.json\", \"layers\": [0, 2]},"
             "{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
             "\"%s/configs/profiles/estimated/gpt-tiny/cpu.json\", \"layers\": [3, 5]},"
             "{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
             "\"%s/configs/profiles/estimated/gpt-tiny/cpu.json\", \"layers\": [6, 7]}]}",
             BALLAST_SOURCE_DIR, BALLAST_SOURCE_DIR, BALLAST_SOURCE_DIR);
    const char *roomy = train_plan_cluster(test_write("roomy-cluster.json", text), "--method none",
                                  "roomy.json");
    CU_ASSERT_FATAL(train_run_ok(NP, LIMIT_S, roomy, "--steps 3", "roomy-metrics.json", &ref) ==
                    0);
    CU_ASSERT(train_same_losses(&m, &ref));
}

/* A cluster of two CPU stages of `mib` MiB each (layers 0-6 and 7-13) with 1 GiB of host
 * memory over a 100 Gb/s link, on the estimated profile `profile`; its path. */
static const char *wide_cluster(const char *profile, int mib, const char *name)
{
    char text[2048];
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 4, "
             "\"stages\": [{\"device\": \"cpu\", \"memory_bytes\": \"%dMiB\", \"profile\": \"%s\", "
             "\"layers\": [0, 6], \"host_memory_bytes\": \"1GiB\", \"host_link\": {\"gbps\": "
             "100}}, {\"device\": \"cpu\", \"memory_bytes\": \"%dMiB\", \"profile\": \"%s\", "
             "\"layers\": [7, 13], \"host_memory_bytes\": \"1GiB\", \"host_link\": {\"gbps\": "
             "100}}]}",
             mib, profile, mib, profile);
    return test_write(name, text);
}

static void test_planned_streaming_trains(void)
{
    const char *model = test_write(
        "wide.json", "{\"format\": \"ballast-model/1\", \"name\": \"gpt-wide-short\", "
                     "\"kind\": \"gpt\", \"n_layer\": 12, \"n_embd\": 256, \"n_head\": 4, "
                     "\"seq_len\": 16, \"vocab_size\": 256, \"micro_batch\": 1, "
                     "\"dtype\": \"fp32\"}");
    char args[1024], profile[512];
    snprintf(profile, sizeof profile, "%s", test_path("wide-cpu.json"));
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu -o '%s'", model,
             profile);
    CU_ASSERT_FATAL(test_run(args, NULL, NULL) == 0);
    const char *tight = wide_cluster(profile, 30, "wide-30.json");
    snprintf(args, sizeof args, "plan --cluster '%s' --actions recompute,optimizer -o '%s'",
             tight, test_path("no.json"));
    CU_ASSERT_EQUAL(test_run(args, NULL, NULL), 3); /* the weights alone do not fit */
    const char *streamed = train_plan_cluster(tight, "--actions recompute,optimizer,weights",
                                              "streamed.json");
    struct plan p;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(plan_load(streamed, &p, &e) == ERR_OK);
    int64_t host_planned[2];
    for (int s = 0; s < 2; s++) {
        CU_ASSERT(plan_stage_streams(&p.stages[s]) > 0);
        host_planned[s] = p.stages[s].host_memory_bytes;
    }
    plan_free(&p);
    struct train_metrics m, ref;
    CU_ASSERT_FATAL(train_run_ok(2, LIMIT_S, streamed, "--steps 3 --host-link-gbps 100",
                                 "streamed-metrics.json", &m) == 0);
    cJSON *j = train_json_read(test_path("streamed-metrics.json"));
    CU_ASSERT_FATAL(j != NULL);
    for (int s = 0; s < 2; s++) {
        const cJSON *st = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "stages"), s);
        CU_ASSERT_EQUAL(cJSON_GetNumberValue(cJSON_GetObjectItem(st, "host_peak_bytes")),
                        (double)host_planned[s]);
        CU_ASSERT_EQUAL(cJSON_GetNumberValue(cJSON_GetObjectItem(st, "peak_bytes")),
                        cJSON_GetNumberValue(cJSON_GetObjectItem(st, "planned_bytes")));
    }
    cJSON_Delete(j);
    const char *roomy = train_plan_cluster(wide_cluster(profile, 1024, "wide-roomy.json"),
                                           "--method none", "wide-roomy-plan.json");
    CU_ASSERT_FATAL(train_run_ok(2, LIMIT_S, roomy, "--steps 3", "wide-roomy-metrics.json",
                                 &ref) == 0);
    CU_ASSERT(train_same_losses(&m, &ref));
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("offload end to end", NULL, NULL);
    CU_add_test(s, "a planned offload trains at its planned memory, bitwise as keeping all",
                test_planned_offload_trains);
    CU_add_test(s, "streamed weights: only they fit; trained at the plan's memory, bitwise",
                test_planned_streaming_trains);
    return test_main();
}
