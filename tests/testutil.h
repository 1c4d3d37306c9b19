/* Helpers shared by the CUnit test programs: temporary folders and files, running the
 * `ballast` executable, a seeded random source and tolerance checks. */
#ifndef BALLAST_TESTUTIL_H
#define BALLAST_TESTUTIL_H

#include <CUnit/CUnit.h>
#include <stdint.h>

/* Path of the ballast executable under test and of the source tree (set by CMake). */
#ifndef BALLAST_EXE
#error "BALLAST_EXE must be defined"
#endif
#ifndef BALLAST_SOURCE_DIR
#error "BALLAST_SOURCE_DIR must be defined"
#endif

/* A fresh temporary folder for this process (removed by test_cleanup). */
const char *test_tmpdir(void);
/* tmpdir/name, in a static buffer rotated over 8 slots. */
const char *test_path(const char *name);
/* Writes text to tmpdir/name and returns the path (test_path). */
const char *test_write(const char *name, const char *text);
/* Reads a whole file (caller frees), NULL if unreadable. */
char *test_read(const char *path);
void test_cleanup(void);

/* Runs `ballast ARGS` (a shell-quoted argument string) and returns its exit status; its
 * stdout and stderr go to out/err (caller frees; either may be NULL to discard). */
int test_run(const char *args, char **out, char **err);
/* The same under `timeout LIMIT_S` (a hang is killed and reads as status 124). */
int test_run_limited(int limit_s, const char *args, char **out, char **err);

/* splitmix64: reproducible across platforms. */
struct test_rng {
    uint64_t s;
};
uint64_t test_rng_next(struct test_rng *r);
/* Uniform in [lo, hi]. */
int64_t test_rng_int(struct test_rng *r, int64_t lo, int64_t hi);
double test_rng_double(struct test_rng *r, double lo, double hi);

/* |got - ref| <= atol + rtol * |ref| */
int test_close(double got, double ref, double atol, double rtol);

/* Runs the registered suites; returns the process exit status (0 if all passed). */
int test_main(void);

#endif
