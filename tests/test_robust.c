/* Robustness of the command line against hostile or mistaken files: every case below once
 * hung, crashed or threw work away (issue 11). Hangs run under `timeout`, so a regression fails
 * here instead of stopping the suite. (Stopped ranks: test_liveness.c.) */
#include <CUnit/CUnit.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "traintest.h"

#define LIMIT_S 30 /* a case that should take a second; more means it hangs */

static char model[1024], fifo[1024], plan1[1024], plan2[1024], plan3[1024];

static void write_cluster(const char *name, int n, const char *profile)
{
    char text[2048];
    int len = snprintf(text, sizeof text,
                       "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", "
                       "\"micro_batches\": 4, \"stages\": [");
    for (int s = 0; s < n; s++)
        len += snprintf(text + len, sizeof text - (size_t)len,
                        "%s{\"device\": \"cpu\", \"memory_bytes\": 1073741824, \"profile\": "
                        "\"%s\"}",
                        s ? ", " : "", profile);
    snprintf(text + len, sizeof text - (size_t)len, "]}");
    test_write(name, text);
}

static void make_plan(int n, char *plan)
{
    char cluster[64], name[64], args[4096];
    snprintf(cluster, sizeof cluster, "cluster-%d.json", n);
    snprintf(name, sizeof name, "plan-%d.json", n);
    write_cluster(cluster, n, "prof.json");
    snprintf(plan, 1024, "%s", test_path(name));
    snprintf(args, sizeof args, "plan --cluster '%s' --method none --unit 1K --quiet -o '%s'",
             test_path(cluster), plan);
    if (test_run(args, NULL, NULL) != 0)
        fprintf(stderr, "plan of %d stages failed\n", n);
}

static int setup(void)
{
    /* vocab 256: byte-level data files can be used */
    snprintf(model, sizeof model, "%s",
             test_write("model.json", "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", "
                                      "\"n_layer\": 2, \"n_embd\": 32, \"n_head\": 2, "
                                      "\"seq_len\": 16, \"vocab_size\": 256, \"micro_batch\": "
                                      "2, \"dtype\": \"fp32\"}"));
    char args[4096];
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu -o '%s'", model,
             test_path("prof.json"));
    if (test_run(args, NULL, NULL) != 0)
        return 1;
    make_plan(1, plan1);
    make_plan(2, plan2);
    make_plan(3, plan3);
    snprintf(fifo, sizeof fifo, "%s", test_path("fifo.json"));
    return mkfifo(fifo, 0644);
}

/* `ballast ARGS` ends within LIMIT_S with `status` and `needle` in its stderr. */
static void expect(const char *args, int status, const char *needle)
{
    char *err = NULL;
    int got = test_run_limited(LIMIT_S, args, NULL, &err);
    CU_ASSERT_EQUAL(got, status);
    CU_ASSERT(err != NULL && strstr(err, needle) != NULL);
    if (got != status || err == NULL || strstr(err, needle) == NULL)
        fprintf(stderr, "\nballast %s: status %d (expected %d), stderr:\n%s\n(expected \"%s\")\n",
                args, got, status, err ? err : "", needle);
    free(err);
}

/* The same for `mpirun -np NP ballast train ARGS`. */
static void expect_train(int np, const char *args, int status, const char *needle)
{
    struct train_run r = train_exec(np, LIMIT_S, args);
    CU_ASSERT_EQUAL(r.status, status);
    CU_ASSERT(r.err != NULL && strstr(r.err, needle) != NULL);
    if (r.status != status || r.err == NULL || strstr(r.err, needle) == NULL)
        fprintf(stderr, "\ntrain -np %d %s: status %d (expected %d), stderr:\n%s\n"
                        "(expected \"%s\")\n",
                np, args, r.status, status, r.err ? r.err : "", needle);
    train_run_free(&r);
}

static void test_fifo_inputs(void)
{
    char args[4096], needle[1200];
    snprintf(needle, sizeof needle, "%s: not a regular file", fifo);
    snprintf(args, sizeof args, "plan --cluster '%s'", fifo);
    expect(args, 2, needle);
    snprintf(args, sizeof args, "simulate --plan '%s'", fifo);
    expect(args, 2, needle);
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu", fifo);
    expect(args, 2, needle);
    /* a stage's profile, named by the cluster */
    write_cluster("cluster-fifo.json", 2, "fifo.json");
    snprintf(args, sizeof args, "plan --cluster '%s'", test_path("cluster-fifo.json"));
    expect(args, 2, needle);
    snprintf(args, sizeof args, "--plan '%s'", fifo);
    expect_train(1, args, 2, needle);
    snprintf(args, sizeof args, "--plan '%s' --data '%s'", plan1, fifo);
    expect_train(1, args, 2, needle);
}

/* A sparse 65 MiB file: larger than the caps of a cluster, a profile and a plan (16, 64 and
 * 64 MiB), read from nowhere. */
static void test_size_cap(void)
{
    const char *big = test_path("big.json");
    char path[1024], args[4096], needle[1200];
    snprintf(path, sizeof path, "%s", big);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CU_ASSERT_FATAL(fd >= 0);
    CU_ASSERT_FATAL(ftruncate(fd, (off_t)65 << 20) == 0);
    close(fd);
    snprintf(needle, sizeof needle, "%s: %lld bytes, larger than the ", path,
             (long long)65 << 20);
    snprintf(args, sizeof args, "plan --cluster '%s'", path);
    expect(args, 2, needle);
    write_cluster("cluster-big.json", 2, "big.json");
    snprintf(args, sizeof args, "plan --cluster '%s'", test_path("cluster-big.json"));
    expect(args, 2, needle);
    snprintf(args, sizeof args, "--plan '%s'", path);
    expect_train(1, args, 2, needle);
}

/* A read-only file with known contents (unchanged: 1 if they are still there). */
static void make_readonly(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CU_ASSERT_FATAL(fd >= 0 && write(fd, "keep\n", 5) == 5);
    close(fd);
    chmod(path, 0444);
}

static int unchanged(const char *path)
{
    char *text = test_read(path);
    int same = text != NULL && strcmp(text, "keep\n") == 0;
    free(text);
    return same;
}

/* Outputs are checked before the first step: a run of 10^6 steps ends at once. */
static void test_train_outputs_first(void)
{
    char args[4096], ro[1024], needle[1200];
    snprintf(args, sizeof args, "--plan '%s' --steps 1000000 --metrics '%s/no-such-dir/m.json'",
             plan2, test_tmpdir());
    expect_train(2, args, 2, "--metrics: ");
    snprintf(ro, sizeof ro, "%s", test_path("ro-trace.json"));
    make_readonly(ro);
    snprintf(needle, sizeof needle, "--trace: %s: exists and is read-only", ro);
    snprintf(args, sizeof args, "--plan '%s' --steps 1000000 --trace '%s'", plan2, ro);
    expect_train(2, args, 2, needle);
    CU_ASSERT(unchanged(ro));
    snprintf(args, sizeof args, "--plan '%s' --steps 1000000 --save '%s/sub'", plan2, ro);
    expect_train(2, args, 2, "--save: ");
}

static void test_readonly_outputs(void)
{
    char args[4096], ro[1024], needle[1200];
    snprintf(ro, sizeof ro, "%s", test_path("ro.json"));
    make_readonly(ro);
    snprintf(needle, sizeof needle, "%s: exists and is read-only; not replacing it", ro);
    snprintf(args, sizeof args, "plan --cluster '%s' --quiet -o '%s'",
             test_path("cluster-2.json"), ro);
    expect(args, 2, needle);
    snprintf(args, sizeof args, "simulate --plan '%s' --quiet -o '%s'", plan2, ro);
    expect(args, 2, needle);
    snprintf(args, sizeof args, "simulate --plan '%s' --quiet --trace '%s'", plan2, ro);
    expect(args, 2, needle);
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu -o '%s'", model,
             ro);
    expect(args, 2, needle);
    snprintf(args, sizeof args, "--plan '%s' --steps 1 --metrics '%s'", plan1, ro);
    expect_train(1, args, 2, needle);
    CU_ASSERT(unchanged(ro));
}

/* A pid that no process has: a child that has exited and been reaped. */
static pid_t dead_pid(void)
{
    pid_t p = fork();
    if (p == 0)
        _exit(0);
    waitpid(p, NULL, 0);
    return p;
}

static void touch(const char *dir, const char *name)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CU_ASSERT(fd >= 0);
    if (fd >= 0)
        close(fd);
}

/* How many entries of `dir` contain `part`. */
static int count_entries(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *ent;
    while (d != NULL && (ent = readdir(d)) != NULL)
        n += strstr(ent->d_name, part) != NULL;
    if (d != NULL)
        closedir(d);
    return n;
}

/* Temporaries a killed writer left (its pid gone) are removed by the next successful write
 * of the same output; a live writer's stays; a successful write leaves none of its own. */
static void test_stale_temporaries(void)
{
    char dir[1024], name[256], args[4096];
    long dead = (long)dead_pid(), live = (long)getpid();
    snprintf(dir, sizeof dir, "%s", test_path("temps"));
    CU_ASSERT_FATAL(mkdir(dir, 0755) == 0);
    snprintf(name, sizeof name, "out.json.tmp.%ld", dead); /* the old naming */
    touch(dir, name);
    snprintf(name, sizeof name, "out.json.tmp.%ld.k3Xq9Z", dead);
    touch(dir, name);
    snprintf(name, sizeof name, "out.json.tmp.%ld.a1b2c3", live);
    touch(dir, name);
    snprintf(name, sizeof name, "other.json.tmp.%ld", dead); /* another output's */
    touch(dir, name);
    snprintf(args, sizeof args, "plan --cluster '%s' --quiet -o '%s/out.json'",
             test_path("cluster-2.json"), dir);
    CU_ASSERT_EQUAL(test_run_limited(LIMIT_S, args, NULL, NULL), 0);
    CU_ASSERT_EQUAL(count_entries(dir, "out.json.tmp."), 1); /* the live one */
    CU_ASSERT_EQUAL(count_entries(dir, "other.json.tmp."), 1);

    /* checkpoints likewise */
    char ck[1024];
    snprintf(ck, sizeof ck, "%s", test_path("ck-temps"));
    CU_ASSERT_FATAL(mkdir(ck, 0755) == 0);
    snprintf(name, sizeof name, "stage-0-step-2.ckpt.tmp.%ld", dead);
    touch(ck, name);
    snprintf(name, sizeof name, "checkpoint.json.tmp.%ld.zzzzzz", dead);
    touch(ck, name);
    snprintf(args, sizeof args, "--plan '%s' --steps 2 --quiet --save '%s'", plan1, ck);
    struct train_run r = train_exec(1, LIMIT_S, args);
    CU_ASSERT_EQUAL(r.status, 0);
    train_run_free(&r);
    CU_ASSERT_EQUAL(count_entries(ck, ".tmp."), 0);
    CU_ASSERT_EQUAL(count_entries(ck, "stage-0-step-2.ckpt"), 1);
}

/* A checkpoint whose header promises 2^63 - 64 bytes of state: refused as damaged (the size
 * arithmetic once overflowed: undefined behaviour, caught by UBSan). payload_bytes is the
 * header's last field, at byte 112 of 120. */
static void test_crafted_checkpoint(void)
{
    char ck[1024], file[1200], args[4096], needle[1300];
    snprintf(ck, sizeof ck, "%s", test_path("ck-crafted"));
    snprintf(args, sizeof args, "--plan '%s' --steps 1 --quiet --save '%s'", plan1, ck);
    struct train_run r = train_exec(1, LIMIT_S, args);
    CU_ASSERT_EQUAL_FATAL(r.status, 0);
    train_run_free(&r);
    snprintf(file, sizeof file, "%s/stage-0-step-1.ckpt", ck);
    int fd = open(file, O_WRONLY);
    CU_ASSERT_FATAL(fd >= 0);
    int64_t huge = INT64_MAX - 63;
    CU_ASSERT(pwrite(fd, &huge, sizeof huge, 112) == (ssize_t)sizeof huge);
    close(fd);
    snprintf(needle, sizeof needle, "%s: ", file);
    snprintf(args, sizeof args, "--plan '%s' --steps 2 --resume '%s'", plan1, ck);
    expect_train(1, args, 2, "(truncated or damaged)");
    expect_train(1, args, 2, needle);
}

/* Issue 27: a run killed while writing step 3's checkpoint leaves its temporaries; a resumed
 * run that saves at other steps (here 4) removes them once its own checkpoint is complete
 * (before, only a later write of the same step's file did). */
static void test_temporaries_of_other_steps(void)
{
    char ck[1024], name[256], args[4096];
    long dead = (long)dead_pid();
    snprintf(ck, sizeof ck, "%s", test_path("ck-other-steps"));
    snprintf(args, sizeof args, "--plan '%s' --steps 2 --quiet --save '%s'", plan2, ck);
    struct train_run r = train_exec(2, LIMIT_S, args);
    CU_ASSERT_EQUAL_FATAL(r.status, 0);
    train_run_free(&r);
    for (int s = 0; s < 2; s++) {
        snprintf(name, sizeof name, "stage-%d-step-3.ckpt.tmp.%ld.k3Xq9Z", s, dead);
        touch(ck, name);
    }
    snprintf(args, sizeof args, "--plan '%s' --steps 4 --quiet --resume '%s' --save '%s'",
             plan2, ck, ck);
    r = train_exec(2, LIMIT_S, args);
    CU_ASSERT_EQUAL(r.status, 0);
    train_run_free(&r);
    CU_ASSERT_EQUAL(count_entries(ck, ".tmp."), 0);
    CU_ASSERT_EQUAL(count_entries(ck, "-step-4.ckpt"), 2);
    CU_ASSERT_EQUAL(count_entries(ck, "-step-2.ckpt"), 0);
}

/* Issue 27: rank 0 cannot write its checkpoint (a file-size limit: EFBIG, as a full disk gives
 * ENOSPC). Every rank stops with status 1 and nothing is left half-written: no temporary, no
 * stage file of the step no manifest names (before, rank 0 aborted the job while rank 1 was
 * writing, or after it had). */
static void test_checkpoint_write_fails(void)
{
    char ck[1024], cmd[8192], err[1024];
    snprintf(ck, sizeof ck, "%s", test_path("ck-full"));
    snprintf(err, sizeof err, "%s", test_path("ck-full.err"));
    const char *train = "'%s' train --plan '%s' --steps 2 --quiet --threads 1 --save '%s'";
    char one[2048];
    snprintf(one, sizeof one, train, BALLAST_EXE, plan2, ck);
    snprintf(cmd, sizeof cmd,
             "timeout -k 5 %d mpirun --allow-run-as-root --oversubscribe -np 1 sh -c \"ulimit -f "
             "64; exec %s\" : -np 1 %s > /dev/null 2> '%s'",
             LIMIT_S, one, one, err);
    int status = system(cmd);
    int code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    char *text = test_read(err), needle[1200];
    snprintf(needle, sizeof needle, "%s/stage-0-step-2.ckpt", ck);
    CU_ASSERT_EQUAL(code, 1);
    CU_ASSERT(text != NULL && strstr(text, needle) != NULL &&
              strstr(text, "File too large") != NULL);
    CU_ASSERT_EQUAL(count_entries(ck, ".tmp."), 0);
    CU_ASSERT_EQUAL(count_entries(ck, ".ckpt"), 0);
    CU_ASSERT_EQUAL(count_entries(ck, "checkpoint.json"), 0);
    if (code != 1 || count_entries(ck, ".ckpt") != 0)
        fprintf(stderr, "\nfailed checkpoint: status %d, %d files, stderr:\n%s\n", code,
                count_entries(ck, ".ckpt"), text ? text : "");
    free(text);
}

/* Issue 27: --threads beyond a rank's share of the cores (mpirun binds a rank or two to a
 * core each) warns, with the numbers. */
static void test_threads_warning(void)
{
    char args[4096];
    snprintf(args, sizeof args, "--plan '%s' --steps 1 --quiet --threads 64", plan1);
    expect_train(1, args, 0, "warning: --threads 64: 1 rank of this node run 64 threads on its ");
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("robust", setup, NULL);
    CU_add_test(s, "a FIFO as any input is refused, not waited on", test_fifo_inputs);
    CU_add_test(s, "a JSON file over the size cap is refused before reading", test_size_cap);
    CU_add_test(s, "train checks its output paths before the first step",
                test_train_outputs_first);
    CU_add_test(s, "a read-only output file is not replaced", test_readonly_outputs);
    CU_add_test(s, "stale temporaries are removed, live ones kept", test_stale_temporaries);
    CU_add_test(s, "a checkpoint header promising 2^63 bytes is refused",
                test_crafted_checkpoint);
    CU_add_test(s, "temporaries of steps a resumed run never writes are removed",
                test_temporaries_of_other_steps);
    CU_add_test(s, "a checkpoint one rank cannot write stops every rank, nothing half-written",
                test_checkpoint_write_fails);
    CU_add_test(s, "--threads beyond the cores warns with the numbers", test_threads_warning);
    return test_main();
}
