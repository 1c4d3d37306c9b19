/* `ballast plan --share` and `mpirun ballast train --share` end to end, on two GPT jobs of
 * different sizes over the same two CPU stages. References: each job's plan trained alone
 * (losses bitwise), the share file's regions recomputed here from each plan's cost model,
 * the switches' bytes from the regions, and the devices' capacity. Runs pin --threads 1 and
 * each has a time limit. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "plan.h"
#include "share.h"
#include "testutil.h"
#include "traintest.h"

#define RUN_LIMIT_S 120
#define CAPACITY 2000000L
#define MAX_SWITCHES 64

static char share2[1024], share3[1024];

static void write_job(const char *name, int n_layer, int n_embd, int seq_len, long memory)
{
    char text[1024], file[64], prof[1024], args[4096];
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", \"n_layer\": %d, "
             "\"n_embd\": %d, \"n_head\": 2, \"seq_len\": %d, \"vocab_size\": 64, "
             "\"micro_batch\": 2, \"dtype\": \"fp32\"}",
             n_layer, n_embd, seq_len);
    snprintf(file, sizeof file, "model-%s.json", name);
    test_write(file, text);
    snprintf(prof, sizeof prof, "%s", test_path(name));
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu -o '%s.prof'",
             test_path(file), prof);
    if (test_run(args, NULL, NULL) != 0)
        fprintf(stderr, "profile of %s failed\n", name);
    /* the layers split in halves (the numbers below are this split's) */
    int layers = n_layer + 2, half = layers / 2;
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 4, "
             "\"stages\": [{\"device\": \"cpu\", \"memory_bytes\": %ld, \"profile\": \"%s.prof\", "
             "\"layers\": [0, %d]}, {\"device\": \"cpu\", \"memory_bytes\": %ld, \"profile\": "
             "\"%s.prof\", \"layers\": [%d, %d]}]}",
             memory, name, half - 1, memory, name, half, layers - 1);
    snprintf(file, sizeof file, "%s.json", name);
    test_write(file, text);
}

/* ballast plan --share JOBS --unit 1K -o OUT: its status, stderr in *err if asked. */
static int plan_share(const char *jobs, const char *out, char **err)
{
    char args[4096];
    snprintf(args, sizeof args, "plan --share %s --unit 1K --quiet -o '%s'", jobs, out);
    return test_run(args, NULL, err);
}

static int setup(void)
{
    write_job("small", 2, 32, 16, CAPACITY);
    write_job("wide", 3, 48, 32, CAPACITY);
    write_job("tight", 3, 48, 32, 1000000); /* its persistent bytes alone nearly fill it */
    write_job("small-tight", 2, 32, 16, 1000000);
    snprintf(share2, sizeof share2, "%s", test_path("share2.json"));
    snprintf(share3, sizeof share3, "%s", test_path("share3.json"));
    char jobs[2048];
    snprintf(jobs, sizeof jobs, "'%s' '%s:patent'", test_path("small.json"),
             test_path("wide.json"));
    if (plan_share(jobs, share2, NULL) != 0)
        fprintf(stderr, "plan --share of two jobs failed\n");
    snprintf(jobs, sizeof jobs, "'%s' '%s' '%s'", test_path("small.json"), test_path("wide.json"),
             test_path("small.json"));
    if (plan_share(jobs, share3, NULL) != 0)
        fprintf(stderr, "plan --share of three jobs failed\n");
    return 0;
}

/* ---- the plan ---- */

/* Regions end to end, the temporary region the largest of the plans' temporaries, and
 * sum persistent + max temporary + reserve within capacity, on every device. */
static void check_regions(const char *file, int n_jobs)
{
    struct share s;
    struct err e;
    err_clear(&e);
    int rc = share_load(file, &s, &e);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(s.n_jobs, n_jobs);
    CU_ASSERT_EQUAL(s.n_devices, 2);
    for (int d = 0; d < s.n_devices; d++) {
        const struct share_device *dv = &s.devices[d];
        int64_t end = 0, most = 0, sum = 0;
        for (int j = 0; j < s.n_jobs; j++) {
            struct stage_cost c;
            plan_stage_cost(&s.jobs[j].plan, &s.jobs[j].plan.stages[d], &c);
            int64_t temporary = c.memory_bytes - c.reserve_bytes - c.state_bytes;
            CU_ASSERT_EQUAL(dv->persistent[j].offset, (end + 255) / 256 * 256);
            CU_ASSERT_EQUAL(dv->persistent[j].bytes, c.state_bytes);
            end = dv->persistent[j].offset + dv->persistent[j].bytes;
            sum += c.state_bytes;
            most = temporary > most ? temporary : most;
        }
        CU_ASSERT(dv->temporary.offset >= end);
        CU_ASSERT_EQUAL(dv->temporary.bytes, most);
        CU_ASSERT(sum + most + dv->reserve_bytes <= CAPACITY);
        CU_ASSERT(dv->temporary.offset + dv->temporary.bytes + dv->reserve_bytes <= CAPACITY);
        CU_ASSERT_EQUAL(dv->capacity_bytes, CAPACITY);
    }
    CU_ASSERT_STRING_EQUAL(s.jobs[0].plan.method, "optimal");
    share_free(&s);
}

static int recomputes(const struct plan *p)
{
    int n = 0;
    for (int s = 0; s < p->n_stages; s++)
        for (int l = 0; l < plan_stage_layer_count(&p->stages[s]); l++)
            n += p->stages[s].actions[l].choice != COST_KEEP;
    return n;
}

static void test_plan_regions(void)
{
    check_regions(share2, 2);
    check_regions(share3, 3);
    struct share two, three;
    struct err e;
    err_clear(&e);
    if (share_load(share2, &two, &e) || share_load(share3, &three, &e)) {
        CU_FAIL("share files do not load");
        return;
    }
    CU_ASSERT_STRING_EQUAL(two.jobs[1].plan.method, "patent"); /* "wide.json:patent" */
    /* with a third job's persistent region the wide job's budget shrinks: it recomputes
     * where with two jobs it keeps everything */
    CU_ASSERT_EQUAL(recomputes(&two.jobs[1].plan), 0);
    CU_ASSERT(recomputes(&three.jobs[1].plan) > 0);
    CU_ASSERT_STRING_EQUAL(three.jobs[2].name, "small-3");
    share_free(&two);
    share_free(&three);
}

static void test_plan_refused(void)
{
    char jobs[2048], *err = NULL;
    /* persistent regions alone over device 1: 1192448 (wide) + 237056 (small) > 1000000 */
    snprintf(jobs, sizeof jobs, "'%s' '%s'", test_path("small-tight.json"),
             test_path("tight.json"));
    CU_ASSERT_EQUAL(plan_share(jobs, test_path("no.json"), &err), 3);
    CU_ASSERT(err != NULL && strstr(err, "device 1 (cpu)") && strstr(err, "persistent") &&
              strstr(err, "1000000"));
    free(err);
    err = NULL;
    /* different devices' memory */
    snprintf(jobs, sizeof jobs, "'%s' '%s'", test_path("small.json"), test_path("tight.json"));
    CU_ASSERT_EQUAL(plan_share(jobs, test_path("no.json"), &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "stages[0]"));
    free(err);
    err = NULL;
    snprintf(jobs, sizeof jobs, "'%s:fastest'", test_path("small.json"));
    CU_ASSERT_EQUAL(plan_share(jobs, test_path("no.json"), &err), 2);
    CU_ASSERT(err != NULL && strstr(err, "fastest"));
    free(err);
    CU_ASSERT_PTR_NULL(test_read(test_path("no.json")));
    CU_ASSERT_EQUAL(test_run("plan --share", NULL, NULL), 2);
    snprintf(jobs, sizeof jobs, "plan --share '%s' --cluster '%s'", test_path("small.json"),
             test_path("small.json"));
    CU_ASSERT_EQUAL(test_run(jobs, NULL, NULL), 2);
}

/* Persistent regions fit, but the temporary budget left is under what the job needs even
 * recomputing everything: the job and its budget are named. */
static void test_plan_temporary_refused(void)
{
    char jobs[4096], *err = NULL;
    snprintf(jobs, sizeof jobs, "'%s' '%s'", test_path("wide.json"), test_path("wide.json"));
    int rc = plan_share(jobs, test_path("no.json"), &err);
    CU_ASSERT_EQUAL(rc, 3);
    CU_ASSERT(err != NULL && strstr(err, "job wide") && strstr(err, "temporary") &&
              strstr(err, "device 1 (cpu): 2000000 - reserve 0 - persistent"));
    if (rc != 3)
        fprintf(stderr, "\n%s\n", err ? err : "");
    free(err);
}

/* ---- training ---- */

struct share_metrics {
    int n_jobs, n_switches;
    struct train_metrics job[3];
    long long moved[MAX_SWITCHES], temporary[MAX_SWITCHES];
    char from[MAX_SWITCHES][16], to[MAX_SWITCHES][16];
    long long peak[2], planned[2];
};

static int read_share_metrics(const char *file, struct share_metrics *m)
{
    cJSON *o = train_json_read(file);
    memset(m, 0, sizeof *m);
    if (o == NULL)
        return -1;
    const cJSON *it, *st;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "jobs")) {
        struct train_metrics *j = &m->job[m->n_jobs++];
        cJSON_ArrayForEach(st, cJSON_GetObjectItem(it, "steps"))
            j->loss[j->n_steps++] = cJSON_GetObjectItem(st, "loss")->valuedouble;
        cJSON_ArrayForEach(st, cJSON_GetObjectItem(it, "stages"))
            j->peak[j->n_stages++] = (long long)cJSON_GetObjectItem(st, "peak_bytes")->valuedouble;
    }
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "switches")) {
        int i = m->n_switches++;
        m->moved[i] = (long long)cJSON_GetObjectItem(it, "persistent_bytes_moved")->valuedouble;
        m->temporary[i] = (long long)cJSON_GetObjectItem(it, "temporary_bytes")->valuedouble;
        snprintf(m->from[i], sizeof m->from[i], "%s", cJSON_GetObjectItem(it, "from")->valuestring);
        snprintf(m->to[i], sizeof m->to[i], "%s", cJSON_GetObjectItem(it, "to")->valuestring);
    }
    int d = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "devices")) {
        m->peak[d] = (long long)cJSON_GetObjectItem(it, "peak_bytes")->valuedouble;
        m->planned[d] = (long long)cJSON_GetObjectItem(it, "planned_bytes")->valuedouble;
        d++;
    }
    cJSON_Delete(o);
    return 0;
}

/* Each job's plan as a file of its own: the same job trained alone. */
static void write_job_plans(void)
{
    struct share s;
    struct err e;
    err_clear(&e);
    if (share_load(share2, &s, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return;
    }
    for (int j = 0; j < s.n_jobs; j++) {
        char name[64];
        snprintf(name, sizeof name, "alone-%d.json", j);
        if (plan_write(test_path(name), &s.jobs[j].plan, &e))
            fprintf(stderr, "%s\n", e.msg);
    }
    share_free(&s);
}

static int alone(int j, struct train_metrics *m)
{
    char plan[1024], metrics[64];
    snprintf(plan, sizeof plan, "%s", test_path(j ? "alone-1.json" : "alone-0.json"));
    snprintf(metrics, sizeof metrics, "alone-m%d.json", j);
    return train_run_ok(2, RUN_LIMIT_S, plan, "--steps 3 --threads 1", metrics, m);
}

static int run_share(const char *extra, const char *name, struct share_metrics *m)
{
    char args[4096], path[1024];
    snprintf(path, sizeof path, "%s", test_path(name));
    snprintf(args, sizeof args, "--share '%s' --steps 3 --threads 1 --quiet --metrics '%s' %s",
             share2, path, extra);
    struct train_run r = train_exec(2, RUN_LIMIT_S, args);
    CU_ASSERT_EQUAL(r.status, 0);
    if (r.status != 0)
        fprintf(stderr, "\ntrain %s: %d\n%s\n", args, r.status, r.err ? r.err : "");
    int status = r.status;
    train_run_free(&r);
    return status != 0 || read_share_metrics(path, m) != 0 ? -1 : 0;
}

/* The persistent bytes of job j summed over the devices, from the share file. */
static long long persistent_of(const struct share *s, const char *job)
{
    long long sum = 0;
    for (int j = 0; j < s->n_jobs; j++)
        for (int d = 0; d < s->n_devices && strcmp(s->jobs[j].name, job) == 0; d++)
            sum += s->devices[d].persistent[j].bytes;
    return sum;
}

static void check_run(const struct share_metrics *m, const struct train_metrics alone_m[2],
                      int switches, int full)
{
    struct share s;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(share_load(share2, &s, &e), 0);
    CU_ASSERT_EQUAL(m->n_jobs, 2);
    CU_ASSERT(m->job[0].n_steps == 3 && train_same_losses(&m->job[0], &alone_m[0]));
    CU_ASSERT(m->job[1].n_steps == 3 && train_same_losses(&m->job[1], &alone_m[1]));
    CU_ASSERT_EQUAL(m->n_switches, switches);
    for (int i = 0; i < m->n_switches; i++) {
        long long want = full ? persistent_of(&s, m->from[i]) + persistent_of(&s, m->to[i]) : 0;
        CU_ASSERT_EQUAL(m->moved[i], want);
        CU_ASSERT(m->temporary[i] > 0);
    }
    for (int d = 0; d < 2 && !full; d++) {
        long long planned = s.devices[d].temporary.bytes;
        for (int j = 0; j < s.n_jobs; j++)
            planned += s.devices[d].persistent[j].bytes;
        CU_ASSERT_EQUAL(m->planned[d], planned);
        int ok = llabs(m->peak[d] - planned) <= 0.02 * (double)planned;
        if (!ok)
            fprintf(stderr, "\ndevice %d: peak %lld, planned %lld\n", d, m->peak[d], planned);
        CU_ASSERT(ok);
    }
    share_free(&s);
}

static void test_train_bitwise(void)
{
    struct train_metrics a[2];
    struct share_metrics k1, k2, full1, full2;
    write_job_plans();
    if (alone(0, &a[0]) || alone(1, &a[1]))
        return;
    if (run_share("--slice 1", "k1.json", &k1) == 0)
        check_run(&k1, a, 5, 0); /* a b a b a b */
    if (run_share("--slice 2", "k2.json", &k2) == 0)
        check_run(&k2, a, 3, 0); /* a a b b a b */
    if (run_share("--slice 1 --switch full", "f1.json", &full1) == 0)
        check_run(&full1, a, 5, 1);
    if (run_share("--slice 2 --switch full", "f2.json", &full2) == 0)
        check_run(&full2, a, 3, 1);
}

/* ---- --init, --save-weights, --check-arena (issue 27: once silently ignored) ---- */

/* Job j's name in share2. */
static void job_name(int j, char *out, size_t size)
{
    struct share s;
    struct err e;
    err_clear(&e);
    snprintf(out, size, "?");
    if (share_load(share2, &s, &e) == ERR_OK) {
        snprintf(out, size, "%s", s.jobs[j].name);
        share_free(&s);
    }
}

/* train --share share2 EXTRA fails with `status` before any step, stderr has `needle`. */
static void expect_share_fails(const char *extra, int status, const char *needle)
{
    char args[4096];
    snprintf(args, sizeof args, "--share '%s' --steps 2 --threads 1 %s", share2, extra);
    struct train_run r = train_exec(2, RUN_LIMIT_S, args);
    int ok = r.status == status && r.err != NULL && strstr(r.err, needle) != NULL &&
             r.out != NULL && strstr(r.out, " step ") == NULL;
    if (!ok)
        fprintf(stderr, "\ntrain %s: status %d (expected %d)\n%s\n(expected \"%s\")\n", args,
                r.status, status, r.err ? r.err : "", needle);
    CU_ASSERT(ok);
    train_run_free(&r);
}

/* Job j trained alone `steps` steps, `flag` (--save-weights or --init) its files
 * alone-wJ-{stage}.st. */
static int alone_weights(int j, int steps, const char *flag, struct train_metrics *m)
{
    char plan[1024], w[1024], extra[4096], metrics[64];
    snprintf(plan, sizeof plan, "%s", test_path(j ? "alone-1.json" : "alone-0.json"));
    snprintf(w, sizeof w, "%s", test_path(j ? "alone-w1-{stage}.st" : "alone-w0-{stage}.st"));
    snprintf(extra, sizeof extra, "--steps %d --threads 1 %s '%s'", steps, flag, w);
    snprintf(metrics, sizeof metrics, "alone-%s%d.json", flag + 2, j);
    return train_run_ok(2, RUN_LIMIT_S, plan, extra, metrics, m);
}

/* Each job's weights after 3 steps, per stage, byte for byte those it writes trained alone
 * (its runs are bitwise: test_train_bitwise), with either switch; read back by --init, each
 * job starts where the same file starts it alone. */
static void test_train_share_weights(void)
{
    char names[2][64], extra[4096];
    struct share_metrics sm, fm, im;
    struct train_metrics a[2], ia[2];
    write_job_plans();
    for (int j = 0; j < 2; j++) {
        job_name(j, names[j], sizeof names[j]);
        if (alone_weights(j, 3, "--save-weights", &a[j]))
            return;
    }
    snprintf(extra, sizeof extra, "--save-weights '%s'", test_path("share-{job}-{stage}.st"));
    if (run_share(extra, "sw.json", &sm))
        return;
    snprintf(extra, sizeof extra, "--switch full --save-weights '%s'",
             test_path("full-{job}-{stage}.st"));
    if (run_share(extra, "fw.json", &fm))
        return;
    for (int j = 0; j < 2; j++)
        for (int st = 0; st < 2; st++) {
            char alone_w[1024], name[256];
            snprintf(name, sizeof name, "alone-w%d-%d.st", j, st);
            snprintf(alone_w, sizeof alone_w, "%s", test_path(name));
            snprintf(name, sizeof name, "share-%s-%d.st", names[j], st);
            CU_ASSERT(train_files_equal(alone_w, test_path(name)));
            snprintf(name, sizeof name, "full-%s-%d.st", names[j], st);
            CU_ASSERT(train_files_equal(alone_w, test_path(name)));
        }
    /* --init: one file per job and stage */
    snprintf(extra, sizeof extra, "--steps 1 --init '%s'", test_path("share-{job}-{stage}.st"));
    if (run_share(extra, "iw.json", &im))
        return;
    for (int j = 0; j < 2; j++) {
        if (alone_weights(j, 1, "--init", &ia[j]))
            return;
        CU_ASSERT(train_same_losses(&im.job[j], &ia[j]));
        CU_ASSERT(ia[j].loss[0] < a[j].loss[0]); /* trained weights: a lower first loss */
    }
}

/* Paths checked on every rank before any work: a missing --init, --save-weights into a
 * missing folder, and one --save-weights file for two jobs, refused (status 2). */
static void test_train_share_paths(void)
{
    char extra[4096], needle[2048], name[64];
    job_name(0, name, sizeof name);
    snprintf(extra, sizeof extra, "--init '%s'", test_path("none-{job}.st"));
    snprintf(needle, sizeof needle, "--init: job %s: %s", name, test_path("none-"));
    expect_share_fails(extra, 2, needle);
    snprintf(extra, sizeof extra, "--save-weights '%s'", test_path("no-dir/w-{job}.st"));
    snprintf(needle, sizeof needle, "--save-weights: job %s: ", name);
    expect_share_fails(extra, 2, needle);
    snprintf(extra, sizeof extra, "--save-weights '%s'", test_path("w.st"));
    expect_share_fails(extra, 2, "would write one file: put {job} in the name");
}

/* Job 0's stage 0 (two micro-batches in flight) laid out by a lying arena (traintest.h) for
 * its first block: --check-arena finds it. */
static void test_train_share_check_arena(void)
{
    const char *arena_plan = train_plan_cluster(test_path("small.json"), "--arena slots",
                                                "small-arena.json");
    cJSON *ap = train_json_read(arena_plan), *root = train_json_read(share2);
    CU_ASSERT_FATAL(ap != NULL && root != NULL);
    cJSON *from = cJSON_GetArrayItem(cJSON_GetObjectItem(ap, "stages"), 0);
    cJSON *job = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "jobs"), 0);
    cJSON *to = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(job, "plan"), "stages"),
                                   0);
    cJSON *arena = cJSON_DetachItemFromObject(from, "arena");
    CU_ASSERT_FATAL(arena != NULL);
    CU_ASSERT_FATAL(train_arena_lie(arena, 1) == 0); /* block 0 */
    cJSON_AddItemToObject(to, "arena", arena);
    char *text = cJSON_Print(root);
    const char *lie = test_write("share-lie.json", text);
    free(text);
    cJSON_Delete(root);
    cJSON_Delete(ap);
    char args[4096];
    snprintf(args, sizeof args, "--share '%s' --steps 1 --threads 1 --quiet --check-arena", lie);
    struct train_run r = train_exec(2, RUN_LIMIT_S, args);
    CU_ASSERT_EQUAL(r.status, 1);
    CU_ASSERT(r.err != NULL && strstr(r.err, "--check-arena") != NULL);
    if (r.status != 1)
        fprintf(stderr, "\nshare, lying arena: status %d\n%s\n", r.status, r.err ? r.err : "");
    train_run_free(&r);
}

/* ---- refused share files ---- */

/* share2 with one change, written to `name`; returns its path. */
static const char *tampered(const char *name, void (*change)(cJSON *root))
{
    cJSON *root = train_json_read(share2);
    if (root == NULL)
        return test_path("missing.json");
    change(root);
    char *out = cJSON_Print(root);
    const char *path = test_write(name, out);
    free(out);
    cJSON_Delete(root);
    return path;
}

static cJSON *device_region(cJSON *root, int d, int j)
{
    cJSON *dv = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "devices"), d);
    return j < 0 ? cJSON_GetObjectItem(dv, "temporary")
                 : cJSON_GetArrayItem(cJSON_GetObjectItem(dv, "persistent"), j);
}

static void set_number(cJSON *o, const char *key, double delta)
{
    cJSON *it = cJSON_GetObjectItem(o, key);
    cJSON_SetNumberValue(it, it->valuedouble + delta);
}

/* The wide job's region on device 1 a KiB short of its state (the temporary moved down). */
static void short_persistent(cJSON *root)
{
    set_number(device_region(root, 1, 1), "bytes", -1024);
    set_number(device_region(root, 1, -1), "offset", -1024);
}
static void no_devices(cJSON *root)
{
    cJSON_DeleteItemFromObject(root, "devices");
}
static void wrong_job(cJSON *root)
{
    cJSON_ReplaceItemInObject(device_region(root, 0, 1), "job", cJSON_CreateString("other"));
}
static void overlap(cJSON *root)
{
    set_number(device_region(root, 0, 1), "offset", -256);
}
static void over_capacity(cJSON *root)
{
    set_number(device_region(root, 1, -1), "bytes", 1e7);
}
static void bad_plan(cJSON *root)
{
    cJSON *job = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "jobs"), 1);
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(job, "plan"), "stages");
}
static void bad_format(cJSON *root)
{
    cJSON_ReplaceItemInObject(root, "format", cJSON_CreateString("ballast-plan/1"));
}

/* train --share FILE on np ranks: status `status`, stderr has every needle, nothing ran. */
static void expect_refused(int np, const char *file, int status, const char *a, const char *b)
{
    char args[4096];
    snprintf(args, sizeof args, "--share '%s' --steps 2 --threads 1 --metrics '%s'", file,
             test_path("refused-m.json"));
    struct train_run r = train_exec(np, RUN_LIMIT_S, args);
    int ok = r.status == status && r.err != NULL && strstr(r.err, a) != NULL &&
             (b == NULL || strstr(r.err, b) != NULL) && r.out != NULL &&
             strstr(r.out, "step") == NULL;
    if (!ok)
        fprintf(stderr, "\ntrain %s: status %d (expected %d)\n%s\n%s\n", args, r.status, status,
                r.err ? r.err : "", r.out ? r.out : "");
    CU_ASSERT(ok);
    CU_ASSERT_PTR_NULL(test_read(test_path("refused-m.json")));
    train_run_free(&r);
}

static void test_train_refused(void)
{
    expect_refused(2, tampered("short.json", short_persistent), 3, "persistent region holds",
                   "job wide");
    expect_refused(2, tampered("nodev.json", no_devices), 2, "nodev.json: devices: missing",
                   NULL);
    expect_refused(2, tampered("job.json", wrong_job), 2,
                   "job.json: devices[0].persistent[1].job", NULL);
    expect_refused(2, tampered("overlap.json", overlap), 2,
                   "overlap.json: devices[0].persistent[1].offset", NULL);
    expect_refused(2, tampered("over.json", over_capacity), 3,
                   "over.json: devices[1]: the regions end at", "capacity_bytes 2000000");
    expect_refused(2, tampered("plan.json", bad_plan), 2, "plan.json: jobs[1].plan: stages",
                   NULL);
    expect_refused(2, tampered("format.json", bad_format), 2, "format.json: format", NULL);
    expect_refused(3, share2, 2, "2 stages, one MPI rank each", "3 ranks");
}

/* Rank 1 stops before its first word (BALLAST_TEST_FAULT): under --share, too, rank 0 names
 * it after its heartbeat's deadline (--timeout 3) and the job ends non-zero, not killed by the
 * test's limit. */
static void test_train_silent_rank(void)
{
    char args[4096];
    snprintf(args, sizeof args, "-x BALLAST_TEST_FAULT=1:stop '%s' train --share '%s' --steps 2 "
             "--threads 1 --timeout 3", BALLAST_EXE, share2);
    char cmd[8192], epath[1024];
    snprintf(epath, sizeof epath, "%s", test_path("silent.stderr"));
    snprintf(cmd, sizeof cmd,
             "timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe -np 2 %s > /dev/null "
             "2> '%s'", args, epath);
    int status = system(cmd);
    int code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    char *err = test_read(epath);
    int ok = code != 0 && code != 124 && code != 137 && err != NULL &&
             strstr(err, "rank 0 (replica 0, stage 0): rank 1 (replica 0, stage 1) went "
                         "silent") != NULL;
    if (!ok)
        fprintf(stderr, "\nshare, silent rank: status %d\n%s\n", code, err ? err : "");
    CU_ASSERT(ok);
    free(err);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("share", setup, NULL);
    CU_add_test(s, "regions end to end, the temporary the largest, within capacity",
                test_plan_regions);
    CU_add_test(s, "persistent regions over a device, mixed devices, bad methods: refused",
                test_plan_refused);
    CU_add_test(s, "a job whose temporary cannot fit its budget: refused, named",
                test_plan_temporary_refused);
    CU_add_test(s, "each job bitwise as trained alone, K = 1 and 2, share and full switches",
                test_train_bitwise);
    CU_add_test(s, "bad or too small share files refused before anything runs",
                test_train_refused);
    CU_add_test(s, "--save-weights and --init per job and stage, as each job alone",
                test_train_share_weights);
    CU_add_test(s, "--init and --save-weights paths checked before any work",
                test_train_share_paths);
    CU_add_test(s, "--check-arena checks a job's arena", test_train_share_check_arena);
    CU_add_test(s, "a rank silent at start-up ends a --share job after --timeout, named",
                test_train_silent_rank);
    return test_main();
}
