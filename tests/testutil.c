#include "testutil.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[512];

const char *test_tmpdir(void)
{
    if (tmpdir[0] == '\0') {
        const char *base = getenv("TMPDIR");
        snprintf(tmpdir, sizeof tmpdir, "%s/ballast-test-XXXXXX", base ? base : "/tmp");
        if (mkdtemp(tmpdir) == NULL) {
            perror("mkdtemp");
            exit(1);
        }
    }
    return tmpdir;
}

const char *test_path(const char *name)
{
    static char slots[8][1024];
    static int next;
    char *p = slots[next++ % 8];
    snprintf(p, 1024, "%s/%s", test_tmpdir(), name);
    return p;
}

const char *test_write(const char *name, const char *text)
{
    const char *path = test_path(name);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
    return path;
}

char *test_read(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (n + 1 == cap)
            buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (buf)
        buf[n] = '\0';
    return buf;
}

void test_cleanup(void)
{
    if (tmpdir[0] != '\0' && getenv("BALLAST_KEEP_TMP") == NULL) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", tmpdir);
    }
}

int test_run(const char *args, char **out, char **err)
{
    return test_run_limited(0, args, out, err);
}

int test_run_limited(int limit_s, const char *args, char **out, char **err)
{
    char cmd[8192], limit[64] = "";
    const char *o = test_path("run.stdout"), *e = test_path("run.stderr");
    char opath[1024], epath[1024];
    snprintf(opath, sizeof opath, "%s", o);
    snprintf(epath, sizeof epath, "%s", e);
    if (limit_s > 0)
        snprintf(limit, sizeof limit, "timeout -k 2 %d ", limit_s);
    snprintf(cmd, sizeof cmd, "%s'%s' %s > '%s' 2> '%s'", limit, BALLAST_EXE, args, opath,
             epath);
    int status = system(cmd);
    if (out)
        *out = test_read(opath);
    if (err)
        *err = test_read(epath);
    if (status == -1 || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

uint64_t test_rng_next(struct test_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int64_t test_rng_int(struct test_rng *r, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(test_rng_next(r) % (uint64_t)(hi - lo + 1));
}

double test_rng_double(struct test_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(test_rng_next(r) >> 11) / 9007199254740992.0);
}

int test_close(double got, double ref, double atol, double rtol)
{
    return fabs(got - ref) <= atol + rtol * fabs(ref);
}

int test_main(void)
{
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
    int ok = CU_get_error() == CUE_SUCCESS && failed == 0;
    CU_cleanup_registry();
    test_cleanup();
    return ok ? 0 : 1;
}
