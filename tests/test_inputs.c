/* Inputs bounded and named (issue 27): JSON read once, within a size cap per kind, in memory
 * a small multiple of its size (the estimate against glibc's own count, the peak against a
 * run on a tiny file); free-text and derived fields typed; arena objects of their stage;
 * messages naming the file; -o through a symbolic link; a killed pool search leaving nothing
 * behind; --repartition's default time limit. Each case failed before its fix. */
/* wait4 */
#define _DEFAULT_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "jsonio.h"
#include "testutil.h"

#define CONFIGS BALLAST_SOURCE_DIR "/configs"

/* Runs `ballast` with args (NULL-terminated, the command first) and `env` ("NAME=VALUE" or
 * NULL) in a child of its own: its exit status (-signal if killed), its peak resident KiB and
 * its stderr (caller frees). kill_after_s > 0: SIGKILL after that long. */
static int run_child(const char *const *args, const char *env, double kill_after_s, long *kb,
                     char **err)
{
    const char *errfile = test_path("child.stderr");
    char errpath[1024];
    snprintf(errpath, sizeof errpath, "%s", errfile);
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY), fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC,
                                                          0644);
        dup2(null, 1);
        dup2(fd, 2);
        if (env != NULL)
            putenv((char *)env);
        char *argv[32] = {(char *)BALLAST_EXE};
        for (int i = 0; args[i] != NULL && i < 30; i++)
            argv[i + 1] = (char *)args[i];
        execv(BALLAST_EXE, argv);
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    if (kill_after_s > 0) {
        struct timespec ts = {(time_t)kill_after_s,
                              (long)((kill_after_s - (time_t)kill_after_s) * 1e9)};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
    }
    wait4(pid, &status, 0, &ru);
    if (kb != NULL)
        *kb = ru.ru_maxrss;
    if (err != NULL)
        *err = test_read(errpath);
    return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
}

/* A plan of configs/clusters/NAME.json with `extra` arguments, written to tmpdir/OUT. */
static const char *plan_of(const char *cluster, const char *extra, const char *out)
{
    char args[2048], path[1024];
    snprintf(path, sizeof path, "%s", test_path(out));
    snprintf(args, sizeof args, "plan --cluster %s/clusters/%s.json %s --quiet -o %s", CONFIGS,
             cluster, extra, path);
    CU_ASSERT_EQUAL_FATAL(test_run(args, NULL, NULL), 0);
    return test_path(out);
}

/* Runs `ballast ARGS` expecting exit `want` and every needle in its stderr. */
static void expect(const char *args, int want, const char *const *needles)
{
    char *err = NULL;
    int rc = test_run_limited(120, args, NULL, &err);
    int ok = rc == want;
    for (int i = 0; needles[i] != NULL && err != NULL; i++)
        ok = ok && strstr(err, needles[i]) != NULL;
    if (!ok)
        fprintf(stderr, "\nballast %s\n  exit %d (expected %d), stderr:\n%s\n", args, rc, want,
                err ? err : "(none)");
    CU_ASSERT(ok);
    free(err);
}

/* A file of `bytes` bytes: a plan's format and an array of zeros, `{"format": ..., "x":
 * [0,0,...]}`: two bytes a value, each value a 64-byte cJSON node. */
static const char *dense_file(const char *name, long bytes)
{
    const char *path = test_path(name);
    FILE *f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    long n = (bytes - 40) / 2;
    fputs("{\"format\":\"ballast-plan/1\",\"x\":[", f);
    for (long i = 0; i < n; i++)
        fputs("0,", f);
    fputs("0]}", f);
    fclose(f);
    return path;
}

/* A file too dense to parse in a small multiple of its size is refused before parsing: the
 * run's peak memory stays within twice the file of a run on a tiny file. */
static void test_dense_file(void)
{
    const long bytes = 32L << 20;
    char dense[1024], tiny[1024];
    snprintf(dense, sizeof dense, "%s", dense_file("dense.json", bytes));
    snprintf(tiny, sizeof tiny, "%s", test_write("tiny.json", "{}"));
    long kb_dense, kb_tiny;
    char *err = NULL;
    const char *a[] = {"simulate", "--plan", dense, NULL}, *b[] = {"simulate", "--plan", tiny,
                                                                  NULL};
    CU_ASSERT_EQUAL(run_child(b, NULL, 0, &kb_tiny, NULL), 2);
    CU_ASSERT_EQUAL(run_child(a, NULL, 0, &kb_dense, &err), 2);
    CU_ASSERT(err && strstr(err, dense) && strstr(err, "JSON values in") &&
              strstr(err, "times the file's size"));
    if ((kb_dense - kb_tiny) * 1024 > 2 * bytes)
        fprintf(stderr, "\n%ld KiB against %ld KiB on a tiny file\n", kb_dense, kb_tiny);
    CU_ASSERT((kb_dense - kb_tiny) * 1024 <= 2 * bytes);
    free(err);
}

/* A large plan Ballast makes (mixed-64's arenas laid out) parses within JSONIO_MEMORY_FACTOR
 * times its size, measured as the simulation's peak over a run on a tiny file. */
static void test_large_plan(void)
{
    char plan[1024], tiny[1024];
    snprintf(plan, sizeof plan, "%s", plan_of("mixed-64", "--arena greedy", "arena-plan.json"));
    snprintf(tiny, sizeof tiny, "%s", test_write("tiny.json", "{}"));
    struct stat st;
    CU_ASSERT_FATAL(stat(plan, &st) == 0);
    long kb_plan, kb_tiny;
    const char *a[] = {"simulate", "--plan", plan, "--quiet", NULL},
               *b[] = {"simulate", "--plan", tiny, NULL};
    CU_ASSERT_EQUAL(run_child(b, NULL, 0, &kb_tiny, NULL), 2);
    CU_ASSERT_EQUAL(run_child(a, NULL, 0, &kb_plan, NULL), 0);
    CU_ASSERT((kb_plan - kb_tiny) * 1024 <= JSONIO_MEMORY_FACTOR * (long)st.st_size);
}

/* jsonio_tree_bytes against glibc's count of the bytes cJSON's parse allocates. */
static void check_estimate(const char *text, const char *what)
{
    size_t n = strlen(text);
    int64_t values, est = jsonio_tree_bytes(text, n, &values);
    struct mallinfo2 before = mallinfo2();
    cJSON *root = cJSON_ParseWithLength(text, n);
    struct mallinfo2 after = mallinfo2();
    CU_ASSERT_FATAL(root != NULL);
    double actual = (double)(after.uordblks - before.uordblks);
    if (!test_close((double)est, actual, 0, 0.02))
        fprintf(stderr, "\n%s: estimate %lld bytes, glibc %.0f\n", what, (long long)est, actual);
    CU_ASSERT(test_close((double)est, actual, 0, 0.02));
    cJSON_Delete(root);
}

static void test_estimate(void)
{
    char *profile = test_read(CONFIGS "/profiles/estimated/gpt-175b/H100-80GB.json");
    char *plan = test_read(plan_of("mixed-64", "--arena greedy", "arena-plan.json"));
    CU_ASSERT_FATAL(profile != NULL && plan != NULL);
    check_estimate(profile, "a profile");
    check_estimate(plan, "a plan with arenas");
    /* values of every type, keys and strings with escapes, nested */
    size_t cap = 4 << 20, len = 0;
    char *mixed = malloc(cap);
    len += (size_t)sprintf(mixed, "{\"a\":[");
    for (int i = 0; i < 20000; i++)
        len += (size_t)sprintf(mixed + len, "%s{\"k%d\":\"x\\\"y\\\\z%d\",\"n\":-1.5e3,"
                               "\"t\":true,\"f\":false,\"z\":null,\"e\":[],\"o\":{}}",
                               i ? "," : "", i, i);
    sprintf(mixed + len, "]}");
    check_estimate(mixed, "every kind of value");
    free(mixed);
    free(profile);
    free(plan);
}

/* Each kind's cap, checked before reading (a sparse file: nothing to read anyway). */
static void test_caps(void)
{
    const char *model = test_path("big-model.json"), *cluster = test_path("big-cluster.json");
    char m[1024], c[1024], args[4096];
    snprintf(m, sizeof m, "%s", model);
    snprintf(c, sizeof c, "%s", cluster);
    int fd = open(m, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CU_ASSERT_FATAL(fd >= 0 && ftruncate(fd, (1 << 20) + 1) == 0);
    close(fd);
    fd = open(c, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CU_ASSERT_FATAL(fd >= 0 && ftruncate(fd, (16 << 20) + 1) == 0);
    close(fd);
    snprintf(args, sizeof args, "profile --model %s --estimate --device cpu -o %s", m,
             test_path("out.json"));
    expect(args, 2, (const char *[]){m, "1048577 bytes", "accepted for a model file", NULL});
    snprintf(args, sizeof args, "plan --cluster %s --quiet", c);
    expect(args, 2, (const char *[]){c, "16777217 bytes", "accepted for a cluster file", NULL});
}

/* How many times a run opens `file` (strace -f: every process mpirun starts too). */
static int opens_of(const char *command, const char *file)
{
    char cmd[8192], log[1024];
    snprintf(log, sizeof log, "%s", test_path("strace.log"));
    snprintf(cmd, sizeof cmd, "strace -f -qq -e trace=open,openat -o '%s' %s > /dev/null 2>&1",
             log, command);
    if (system(cmd) != 0)
        return -1;
    char *text = test_read(log), needle[1100];
    snprintf(needle, sizeof needle, "\"%s\"", file);
    int n = 0;
    for (const char *p = text; p != NULL && (p = strstr(p, needle)) != NULL; p++)
        n++;
    free(text);
    return n;
}

/* plan, simulate and train parse each input once (train: once a rank). */
static void test_parsed_once(void)
{
    if (system("strace -V > /dev/null 2>&1") != 0) {
        fprintf(stderr, "\nstrace is missing (scripts/deps.sh installs it): not checked\n");
        CU_FAIL("strace missing");
        return;
    }
    char cmd[4096], cluster[1024], plan[1024];
    snprintf(cluster, sizeof cluster, "%s", CONFIGS "/clusters/cpu-3.json");
    snprintf(plan, sizeof plan, "%s", plan_of("cpu-3", "", "cpu3.json"));
    snprintf(cmd, sizeof cmd, "'%s' plan --cluster %s --quiet", BALLAST_EXE, cluster);
    CU_ASSERT_EQUAL(opens_of(cmd, cluster), 1);
    snprintf(cmd, sizeof cmd, "'%s' simulate --plan %s --quiet", BALLAST_EXE, plan);
    CU_ASSERT_EQUAL(opens_of(cmd, plan), 1);
    snprintf(cmd, sizeof cmd, "mpirun --allow-run-as-root --oversubscribe -np 3 '%s' train "
             "--plan %s --steps 1 --quiet", BALLAST_EXE, plan);
    CU_ASSERT_EQUAL(opens_of(cmd, plan), 3);
}

/* A copy of configs/clusters/cpu-3.json with its profiles' paths absolute and `member` (a
 * JSON member, or "") added at the top. */
static const char *cpu3_with(const char *name, const char *member)
{
    char *text = test_read(CONFIGS "/clusters/cpu-3.json");
    CU_ASSERT_FATAL(text != NULL);
    size_t cap = strlen(text) + 4096, o = 0;
    char *out = malloc(cap);
    const char *rel = "\"../profiles/";
    o += (size_t)snprintf(out, cap, "{%s%s", member, member[0] ? "," : "");
    for (const char *p = text + 1; *p != '\0';) {
        if (strncmp(p, rel, strlen(rel)) == 0) {
            o += (size_t)snprintf(out + o, cap - o, "\"%s/profiles/", CONFIGS);
            p += strlen(rel);
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    const char *path = test_write(name, out);
    free(out);
    free(text);
    return path;
}

static const char *set_member(const char *path, const char *key, const char *value,
                              const char *out);

/* Free text must be text, in every file that has it. */
static void test_text_fields(void)
{
    char args[4096], file[1024], cpu3[1024];
    snprintf(cpu3, sizeof cpu3, "%s", cpu3_with("cpu3.json", ""));
    snprintf(file, sizeof file, "%s", set_member(cpu3, "name", "7", "name.json"));
    snprintf(args, sizeof args, "plan --cluster %s --quiet", file);
    expect(args, 2, (const char *[]){file, "name: expected a string, found a number", NULL});
    snprintf(file, sizeof file, "%s", set_member(cpu3, "description", "[1]", "desc.json"));
    snprintf(args, sizeof args, "plan --cluster %s --quiet", file);
    expect(args, 2, (const char *[]){file, "description: expected a string, found an array",
                                     NULL});
    snprintf(file, sizeof file, "%s",
             set_member(CONFIGS "/models/gpt-tiny.json", "name", "{}", "model.json"));
    snprintf(args, sizeof args, "profile --model %s --estimate --device cpu -o %s", file,
             test_path("p.json"));
    expect(args, 2, (const char *[]){file, "name: expected a string, found an object", NULL});
    snprintf(file, sizeof file, "%s",
             set_member(CONFIGS "/devices.json", "host_memory_note", "false", "devices.json"));
    snprintf(args, sizeof args, "profile --model %s/models/gpt-tiny.json --estimate --device cpu "
             "--devices %s -o %s", CONFIGS, file, test_path("p.json"));
    expect(args, 2, (const char *[]){file, "assumptions.host_memory_note: expected a string",
                                     NULL});
}

/* Replaces the first `from` in tmpdir/NAME's text with `to`, written as tmpdir/OUT. */
static const char *edit(const char *path, const char *from, const char *to, const char *out)
{
    char *text = test_read(path);
    CU_ASSERT_FATAL(text != NULL);
    char *at = strstr(text, from);
    CU_ASSERT_FATAL(at != NULL);
    size_t n = strlen(text) + strlen(to) + 1;
    char *edited = malloc(n);
    snprintf(edited, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    const char *written = test_write(out, edited);
    free(edited);
    free(text);
    return written;
}

/* PATH's text with the first member `key`'s value (a string or a scalar) replaced by
 * `value`, written as tmpdir/OUT. */
static const char *set_member(const char *path, const char *key, const char *value,
                              const char *out)
{
    char *text = test_read(path), name[128];
    CU_ASSERT_FATAL(text != NULL);
    snprintf(name, sizeof name, "\"%s\":", key);
    char *at = strstr(text, name);
    CU_ASSERT_FATAL(at != NULL);
    char *v = at + strlen(name);
    while (*v == ' ' || *v == '\t')
        v++;
    char *end = v + 1;
    if (*v == '"')
        while (*end != '"')
            end += *end == '\\' ? 2 : 1;
    else
        end = v + strcspn(v, ",}]\n") - 1;
    size_t n = strlen(text) + strlen(value) + 1;
    char *edited = malloc(n);
    snprintf(edited, n, "%.*s%s%s", (int)(v - text), text, value, end + 1);
    const char *written = test_write(out, edited);
    free(edited);
    free(text);
    return written;
}

/* ballast-replicas/1's derived numbers: numbers, integers where they count. */
static void test_replicas_fields(void)
{
    char args[4096], file[1024], pipes[1024], text[2048];
    const char *stage = "{\"device\": \"cpu\", \"memory_bytes\": 134217728, \"profile\": \""
                        CONFIGS "/profiles/estimated/gpt-tiny/cpu.json\"}";
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", \"micro_batches\": 4, "
             "\"pipelines\": [{\"stages\": [%s, %s]}, {\"name\": \"b\", \"stages\": [%s]}]}",
             stage, stage, stage);
    snprintf(pipes, sizeof pipes, "%s", test_write("pipes.json", text));
    char replicas[1024];
    snprintf(replicas, sizeof replicas, "%s", test_path("replicas.json"));
    snprintf(args, sizeof args, "plan --cluster %s --quiet -o %s", pipes, replicas);
    char *err = NULL;
    if (test_run(args, NULL, &err) != 0)
        fprintf(stderr, "\nballast %s:\n%s\n", args, err ? err : "");
    free(err);
    CU_ASSERT_FATAL(access(replicas, F_OK) == 0);
    static const struct {
        const char *from, *to, *needle;
    } cases[] = {
        {"step_ms", "\"fast\"", "step_ms: expected a number"},
        {"replicas", "1.5", "replicas: 1.5 is not an integer"},
        {"global_batch", "[]", "global_batch: expected an integer"},
        {"alone_ms", "true", "pipelines[0].alone_ms: expected a number"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(file, sizeof file, "%s", set_member(replicas, cases[i].from, cases[i].to,
                                                     "r.json"));
        snprintf(args, sizeof args, "simulate --plan %s --quiet", file);
        expect(args, 2, (const char *[]){file, cases[i].needle, NULL});
    }
}

/* An arena object with layer -1 that is not the workspace, or a micro-batch past the plan's,
 * is no object of the stage. */
static void test_arena_objects(void)
{
    char plan[1024], file[1024], args[4096];
    snprintf(plan, sizeof plan, "%s", plan_of("cpu-3", "--arena greedy", "arena.json"));
    snprintf(file, sizeof file, "%s",
             edit(plan, "\"objects\":\t[{\n\t\t\t\t\t\t\"kind\":\t\"kept\",\n\t\t\t\t\t\t\"micro\":\t0,"
                  "\n\t\t\t\t\t\t\"layer\":\t0", "\"objects\":\t[{\"kind\": \"kept\", \"micro\": 0, "
                  "\"layer\": -1", "layer.json"));
    snprintf(args, sizeof args, "simulate --plan %s --quiet", file);
    expect(args, 2, (const char *[]){file, "stages[0].arena.objects[0].layer: -1, expected 0..2",
                                     NULL});
    snprintf(file, sizeof file, "%s",
             edit(plan, "\"objects\":\t[{\n\t\t\t\t\t\t\"kind\":\t\"kept\",\n\t\t\t\t\t\t\"micro\":\t0",
                  "\"objects\":\t[{\"kind\": \"kept\", \"micro\": 99", "micro.json"));
    snprintf(args, sizeof args, "simulate --plan %s --quiet", file);
    expect(args, 2, (const char *[]){file, "stages[0].arena.objects[0].micro: 99, expected 0..3",
                                     NULL});
}

/* Messages that named no file: a stage's host memory with no host link (plan), and the plan's
 * arena against the runtime's layout (train). */
static void test_messages_name_file(void)
{
    char args[4096], file[1024], plan[1024];
    snprintf(file, sizeof file, "%s",
             cpu3_with("host.json", "\"shard_optimizer\": false"));
    snprintf(file, sizeof file, "%s",
             edit(file, "\"memory_bytes\": 37748736", "\"memory_bytes\": 37748736, "
                  "\"host_memory_bytes\": 1073741824", "host.json"));
    snprintf(args, sizeof args, "plan --cluster %s --actions recompute,offload --quiet", file);
    expect(args, 2, (const char *[]){file, "stages[0].host_memory_bytes: 1073741824",
                                     "no host_link", NULL});
    /* a second workspace object of 0 bytes: in no byte's way, so the plan loads; the runtime's
     * workspace is not 0 bytes */
    snprintf(plan, sizeof plan, "%s", plan_of("cpu-3", "--arena greedy", "arena.json"));
    snprintf(file, sizeof file, "%s",
             edit(plan, "\"objects\":\t[", "\"objects\":\t[{\"kind\": \"workspace\", \"micro\": "
                  "-1, \"layer\": -1, \"bytes\": 0, \"first\": 0, \"last\": 0, \"offset\": 0}, ",
                  "twice.json"));
    snprintf(args, sizeof args, "mpirun --allow-run-as-root --oversubscribe -np 3 '%s' train "
             "--plan %s --steps 1 --quiet 2>&1", BALLAST_EXE, file);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "timeout -k 5 120 %s", args);
    FILE *p = popen(cmd, "r");
    CU_ASSERT_FATAL(p != NULL);
    char out[65536];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    char want[1200];
    snprintf(want, sizeof want, "%s: stages[0].arena.objects[0]: workspace", file);
    if (strstr(out, want) == NULL)
        fprintf(stderr, "\nexpected \"%s\" in:\n%s\n", want, out);
    CU_ASSERT(strstr(out, want) != NULL && strstr(out, "gives it another size") != NULL);
    CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 2);
}

/* -o onto a symbolic link writes the file it points to and keeps the link; a link to nothing
 * is refused. */
static void test_output_symlink(void)
{
    char plan[1024], target[1024], link_[1024], dangling[1024], args[4096];
    snprintf(plan, sizeof plan, "%s", plan_of("cpu-3", "", "cpu3.json"));
    snprintf(target, sizeof target, "%s", test_write("target.json", "{}"));
    snprintf(link_, sizeof link_, "%s", test_path("link.json"));
    snprintf(dangling, sizeof dangling, "%s", test_path("dangling.json"));
    unlink(link_);
    unlink(dangling);
    CU_ASSERT_FATAL(symlink("target.json", link_) == 0 && symlink("nowhere.json", dangling) == 0);
    snprintf(args, sizeof args, "simulate --plan %s --quiet -o %s", plan, link_);
    CU_ASSERT_EQUAL(test_run(args, NULL, NULL), 0);
    struct stat st;
    CU_ASSERT(lstat(link_, &st) == 0 && S_ISLNK(st.st_mode));
    char *text = test_read(target);
    CU_ASSERT(text != NULL && strstr(text, "ballast-simulation/1") != NULL);
    free(text);
    snprintf(args, sizeof args, "simulate --plan %s --quiet -o %s", plan, dangling);
    expect(args, 2, (const char *[]){dangling, "leads nowhere", NULL});
    CU_ASSERT(lstat(dangling, &st) == 0 && S_ISLNK(st.st_mode));
    /* nothing left beside the target */
    DIR *d = opendir(test_tmpdir());
    struct dirent *ent;
    int temps = 0;
    while (d != NULL && (ent = readdir(d)) != NULL)
        temps += strstr(ent->d_name, ".tmp.") != NULL;
    closedir(d);
    CU_ASSERT_EQUAL(temps, 0);
}

static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *ent;
    int n = 0;
    while (d != NULL && (ent = readdir(d)) != NULL)
        n += strcmp(ent->d_name, ".") != 0 && strcmp(ent->d_name, "..") != 0;
    if (d != NULL)
        closedir(d);
    return n;
}

/* A pool search with micro_batch_sizes other than the model's, killed (SIGKILL, which no
 * handler sees) a second in, leaves nothing in $TMPDIR. The pool is large enough that the
 * search takes several seconds (about 5 on 2 cores). */
static void test_killed_pool(void)
{
    char pool[4096], tmp[1024], env[1100];
    snprintf(tmp, sizeof tmp, "%s", test_path("pool-tmp"));
    CU_ASSERT_FATAL(mkdir(tmp, 0755) == 0 || errno == EEXIST);
    const char *p = CONFIGS "/profiles/estimated/gpt-13b";
    snprintf(pool, sizeof pool,
             "{\"format\":\"ballast-cluster/1\",\"schedule\":\"1f1b\",\"global_batch\":2048,"
             "\"micro_batch_sizes\":[1,2,4,8],\"link\":{\"gbps\":100,\"latency_us\":5},"
             "\"dp_link\":{\"gbps\":100,\"latency_us\":10},\"pool\":["
             "{\"device\":\"A100-80GB\",\"count\":256,\"per_node\":8,\"memory_bytes\":"
             "85198045184,\"profile\":\"%s/A100-80GB.json\",\"node_link\":{\"gbps\":2400,"
             "\"latency_us\":2}},{\"device\":\"V100-32GB\",\"count\":256,\"per_node\":8,"
             "\"memory_bytes\":34089730048,\"profile\":\"%s/V100-32GB.json\",\"node_link\":"
             "{\"gbps\":1200,\"latency_us\":2}}]}",
             p, p);
    char file[1024];
    snprintf(file, sizeof file, "%s", test_write("pool.json", pool));
    snprintf(env, sizeof env, "TMPDIR=%s", tmp);
    const char *args[] = {"plan", "--cluster", file, "--quiet", NULL};
    int rc = run_child(args, env, 1.0, NULL, NULL);
    CU_ASSERT_EQUAL(rc, -SIGKILL); /* still searching when killed */
    CU_ASSERT_EQUAL(entries(tmp), 0);
}

/* --repartition without --time-limit stops at the default and says so, with the certified
 * gap, even with --quiet (this search takes over a minute here without it). */
static void test_repartition_default_limit(void)
{
    char args[1024];
    /* an exact search without a node budget, which takes longer than the default limit */
    snprintf(args, sizeof args, "plan --cluster %s/clusters/mixed-64.json --micro-batches 16384 "
             "--repartition --search-gap 0 --search-nodes 1000000000 --quiet", CONFIGS);
    char want[128];
    snprintf(want, sizeof want, "--time-limit %g s, the default",
             10.0 /* PLAN_REPARTITION_TIME_LIMIT_DEFAULT_S */);
    expect(args, 0, (const char *[]){"--repartition stopped at its time limit", want,
                                     "certified: none is faster than", NULL});
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("inputs bounded and named", NULL, NULL);
    CU_add_test(s, "a file too dense for its size is refused before parsing", test_dense_file);
    CU_add_test(s, "a large plan parses within JSONIO_MEMORY_FACTOR times its size",
                test_large_plan);
    CU_add_test(s, "the tree's bytes, estimated, against glibc's count", test_estimate);
    CU_add_test(s, "each kind of file has its size cap", test_caps);
    CU_add_test(s, "plan, simulate and train open each input once", test_parsed_once);
    CU_add_test(s, "name, description and notes are strings", test_text_fields);
    CU_add_test(s, "a replicas file's derived numbers are numbers", test_replicas_fields);
    CU_add_test(s, "arena objects belong to their stage", test_arena_objects);
    CU_add_test(s, "messages name their file", test_messages_name_file);
    CU_add_test(s, "-o writes through a symbolic link", test_output_symlink);
    CU_add_test(s, "a killed pool search leaves no temporary files", test_killed_pool);
    CU_add_test(s, "--repartition has a default time limit", test_repartition_default_limit);
    return test_main();
}
