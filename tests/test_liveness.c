/* Liveness by heartbeat (runtime/heartbeat.h), end to end on mpirun: a rank stopped (SIGSTOP)
 * at start-up or mid-run is named by every other rank (world rank, replica, stage: the one
 * stopped, not a neighbour waiting on it) and the job ends with status 1 within the deadline;
 * a rank alive but stuck, and a deadlock, are named after --stall; a slow but live rank is
 * waited for (issue 27). The references are the faults themselves: the rank the test stopped,
 * the world layout of the plan, and the run finishing. Waiting ranks sleep: their CPU time is
 * read from /proc while they wait. */
#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "testutil.h"
#include "traintest.h"

#define DEADLINE_S 2 /* --timeout of the runs below */
/* How long after the deadline a job may take to end: the verdict's rounds, the other ranks'
 * acknowledgements, mpirun ending the job, a loaded machine. */
#define SLACK_S 12
#define LIMIT_S 90 /* a run killed by `timeout` (status 124/137) hung */

static char plan3[1024], plan_dp[1024];

static int setup(void)
{
    train_plan_gpt("live", 64, "fp32", 3, "none", plan3, sizeof plan3);
    return 0;
}

/* The job failed (status 1, not killed by its limit) and each of the `n` reporters printed
 * `verdict` as "ballast train: <reporter>: <verdict>". */
static void expect_named(const struct train_job *j, const char *const *reporters, int n,
                         const char *verdict)
{
    int ok = j->code == 1 && j->text != NULL;
    CU_ASSERT_EQUAL(j->code, 1);
    for (int i = 0; ok && i < n; i++) {
        char line[512];
        snprintf(line, sizeof line, "ballast train: %s: %s", reporters[i], verdict);
        int found = strstr(j->text, line) != NULL;
        CU_ASSERT(found);
        ok &= found;
    }
    if (!ok)
        fprintf(stderr, "\nstatus %d (expected 1), stderr:\n%s\n(expected from each of %d ranks: "
                        "\"%s\")\n",
                j->code, j->text ? j->text : "", n, verdict);
}

/* Runs `plan` on np ranks until step 2, stops world rank `victim` (SIGSTOP), and expects the
 * job to end within the deadline (plus slack), every other rank naming the victim. */
static void stop_mid_run(const char *name, const char *plan, int np, int victim,
                         const char *const *reporters, const char *verdict)
{
    char args[4096];
    struct train_job j;
    snprintf(args, sizeof args, "--plan '%s' --threads 1 --steps 1000000 --timeout %d", plan,
             DEADLINE_S);
    train_job_start(&j, name, np, LIMIT_S, "", args);
    CU_ASSERT_FATAL(train_job_saw(&j, "step 2/", 60));
    int pid = train_find_rank(victim, plan);
    CU_ASSERT_FATAL(pid > 0);
    double t0 = clock_now_s();
    kill(pid, SIGSTOP);
    train_job_wait(&j, LIMIT_S);
    double took = clock_now_s() - t0;
    kill(pid, SIGKILL); /* if mpirun has not already */
    expect_named(&j, reporters, np - 1, verdict);
    CU_ASSERT(took <= DEADLINE_S + SLACK_S);
    fprintf(stderr, "\n  %s: the job ended %.1f s after the stop (deadline %d s)\n", name, took,
            DEADLINE_S);
    train_job_free(&j);
}

static void test_stopped_mid_run(void)
{
    const char *reporters[] = {"rank 0 (replica 0, stage 0)", "rank 2 (replica 0, stage 2)"};
    stop_mid_run("mid", plan3, 3, 1, reporters, "rank 1 (replica 0, stage 1) went silent");
}

/* Stage 2 stops: stage 1 waits on it, stage 0 on stage 1 (a chain of waits). Every rank names
 * stage 2, not the neighbour waiting on it. */
static void test_chain_of_waits(void)
{
    const char *reporters[] = {"rank 0 (replica 0, stage 0)", "rank 1 (replica 0, stage 1)"};
    stop_mid_run("chain", plan3, 3, 2, reporters, "rank 2 (replica 0, stage 2) went silent");
}

/* Two replicas of two stages: world rank 3 is replica 1's stage 1, named so by world ranks. */
static void test_dp_world_numbers(void)
{
    /* two stages of two replicas of the same model: world rank w is replica w / 2, stage
     * w % 2 */
    char cluster[1024];
    snprintf(cluster, sizeof cluster, "%s",
             test_write("live-dp-cluster.json",
                        "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", "
                        "\"micro_batches\": 2, \"stages\": ["
                        "{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
                        "\"live-prof.json\", \"dp\": 2},"
                        "{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
                        "\"live-prof.json\", \"dp\": 2}]}"));
    snprintf(plan_dp, sizeof plan_dp, "%s", train_plan_cluster(cluster, "--method none",
                                                                "live-dp-plan.json"));
    const char *reporters[] = {"rank 0 (replica 0, stage 0)", "rank 1 (replica 0, stage 1)",
                               "rank 2 (replica 1, stage 0)"};
    stop_mid_run("dp", plan_dp, 4, 3, reporters, "rank 3 (replica 1, stage 1) went silent");
}

/* Rank 1 stops before its first word: the others wait for it in the set-up's agreement. */
static void test_stopped_at_start(void)
{
    char args[4096];
    struct train_job j;
    snprintf(args, sizeof args, "--plan '%s' --threads 1 --steps 2 --timeout %d", plan3,
             DEADLINE_S);
    double t0 = clock_now_s();
    train_job_start(&j, "start", 3, LIMIT_S, "-x BALLAST_TEST_FAULT=1:stop", args);
    train_job_wait(&j, LIMIT_S);
    const char *reporters[] = {"rank 0 (replica 0, stage 0)", "rank 2 (replica 0, stage 2)"};
    expect_named(&j, reporters, 2, "rank 1 (replica 0, stage 1) went silent");
    CU_ASSERT(clock_now_s() - t0 <= DEADLINE_S + SLACK_S);
    train_job_free(&j);
}

/* CPU seconds process `pid` has used (user + system), or -1. */
static double cpu_s(int pid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* past the command's name */
    unsigned long long ut = 0, st = 0;
    if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
                            &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Rank 1 sleeps for ever before its first word (alive, beating, neither progressing nor
 * waiting): after --stall every rank names it stuck. Meanwhile ranks 0 and 2 wait for it in
 * the set-up's agreement, sleeping: together they use under 5% of a core. */
static void test_stuck_rank(void)
{
    char args[4096];
    struct train_job j;
    int stall = 8;
    snprintf(args, sizeof args, "--plan '%s' --threads 1 --steps 2 --timeout %d --stall %d",
             plan3, DEADLINE_S, stall);
    train_job_start(&j, "stuck", 3, LIMIT_S, "-x BALLAST_TEST_FAULT=1:sleep", args);
    int w[2] = {-1, -1};
    for (int i = 0; i < 100 && (w[0] < 0 || w[1] < 0); i++, train_sleep_s(0.05)) {
        w[0] = train_find_rank(0, plan3);
        w[1] = train_find_rank(2, plan3);
    }
    double a0 = 0, a1 = 0, t0, t1;
    train_sleep_s(3); /* past their start-up, into the wait */
    t0 = clock_now_s();
    for (int k = 0; k < 2; k++)
        a0 += cpu_s(w[k]);
    train_sleep_s(3);
    t1 = clock_now_s();
    for (int k = 0; k < 2; k++)
        a1 += cpu_s(w[k]);
    train_job_wait(&j, LIMIT_S);
    const char *reporters[] = {"rank 0 (replica 0, stage 0)", "rank 1 (replica 0, stage 1)",
                               "rank 2 (replica 0, stage 2)"};
    expect_named(&j, reporters, 3, "rank 1 (replica 0, stage 1) is stuck");
    double share = (a1 - a0) / (2 * (t1 - t0));
    fprintf(stderr, "\n  two waiting ranks used %.2f%% of a core each\n", 100 * share);
    CU_ASSERT(w[0] > 0 && w[1] > 0 && a0 >= 0 && share < 0.05);
    train_job_free(&j);
}

/* Rank 1 waits on a message nobody sends and the others on rank 1: every rank waits, nobody
 * progresses; after --stall the deadlock is named. */
static void test_deadlock(void)
{
    char args[4096];
    struct train_job j;
    snprintf(args, sizeof args, "--plan '%s' --threads 1 --steps 2 --timeout %d --stall 3",
             plan3, DEADLINE_S);
    train_job_start(&j, "deadlock", 3, LIMIT_S, "-x BALLAST_TEST_FAULT=1:wait", args);
    train_job_wait(&j, LIMIT_S);
    const char *reporters[] = {"rank 0 (replica 0, stage 0)", "rank 2 (replica 0, stage 2)"};
    expect_named(&j, reporters, 2, "every rank has waited on another for");
    train_job_free(&j);
}

/* Offload over an emulated host link slow enough that stage 0 finishes a step seconds after
 * the others, which wait for its next step's first activation several deadlines at a time:
 * it is waited on, and the run finishes. */
static void test_slow_rank_finishes(void)
{
    char cluster[1024], args[4096];
    snprintf(cluster, sizeof cluster, "%s/configs/clusters/cpu-3-offload.json",
             BALLAST_SOURCE_DIR);
    const char *plan = train_plan_cluster(cluster, "--actions recompute,offload",
                                          "live-offload.json");
    snprintf(args, sizeof args,
             "--plan '%s' --threads 1 --steps 2 --timeout %d --host-link-gbps 0.03 --metrics '%s'",
             plan, DEADLINE_S, test_path("live-slow.json"));
    struct train_job j;
    train_job_start(&j, "slow", 3, LIMIT_S, "", args);
    train_job_wait(&j, LIMIT_S);
    CU_ASSERT_EQUAL(j.code, 0);
    if (j.code != 0)
        fprintf(stderr, "\nslow rank: status %d, stderr:\n%s\n", j.code,
                j.text ? j.text : "");
    /* a step of several deadlines: the waits were long */
    cJSON *metrics = train_json_read(test_path("live-slow.json"));
    const cJSON *step = cJSON_GetArrayItem(cJSON_GetObjectItem(metrics, "steps"), 0);
    double ms = cJSON_GetNumberValue(cJSON_GetObjectItem(step, "ms"));
    fprintf(stderr, "\n  the step took %.1f s with a %d s deadline\n", ms / 1000, DEADLINE_S);
    CU_ASSERT(ms > 2 * DEADLINE_S * 1000);
    cJSON_Delete(metrics);
    train_job_free(&j);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("liveness", setup, NULL);
    CU_add_test(s, "a rank stopped mid-run is named by every rank, the job ends in the deadline",
                test_stopped_mid_run);
    CU_add_test(s, "along a chain of waits the stopped rank is named, not its neighbour",
                test_chain_of_waits);
    CU_add_test(s, "with replicas the stopped rank is named by world rank, replica and stage",
                test_dp_world_numbers);
    CU_add_test(s, "a rank stopped at start-up is named by every rank", test_stopped_at_start);
    CU_add_test(s, "a rank alive but stuck is named after --stall; waiting ranks sleep",
                test_stuck_rank);
    CU_add_test(s, "every rank waiting and nobody progressing is a deadlock, named",
                test_deadlock);
    CU_add_test(s, "a slow but live rank (a slow host link) is waited for: the run finishes",
                test_slow_rank_finishes);
    return test_main();
}
