/* The pool search's index of shapes by GPUs (fit_index.h) against a scan of every entry: the
 * same entries, in the same order, for random rows, budgets, needs and runs, before and after
 * capacities fall. */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>

#include "fit_index.h"
#include "testutil.h"

/* Entry e fits left for need within `most` replicas, read off its row the plain way. */
static int scan_fits(const int32_t *rows, int K, int64_t e, const int64_t *left, int64_t need,
                     int64_t most)
{
    const int32_t *row = rows + e * (K + 1);
    if (row[0] < 1)
        return 0;
    /* the fewest whole replicas that take need at the row's capacity, one at least */
    int64_t replicas = 1;
    while (replicas * row[0] < need)
        replicas++;
    if (replicas > most)
        return 0;
    for (int k = 0; k < K; k++)
        if (replicas * row[1 + k] > left[k])
            return 0;
    return 1;
}

/* Rows of n entries over K kinds: GPUs of each kind as a shape's are (a few stage counts times
 * a few tp, often 0), capacities from 0 to `cap`. */
static int32_t *random_rows(struct test_rng *r, int64_t n, int K, int cap)
{
    int32_t *rows = malloc((size_t)(n > 0 ? n : 1) * (size_t)(K + 1) * sizeof *rows);
    CU_ASSERT_FATAL(rows != NULL);
    for (int64_t e = 0; e < n; e++) {
        int32_t *row = rows + e * (K + 1);
        row[0] = (int32_t)test_rng_int(r, 0, cap);
        for (int k = 0; k < K; k++)
            row[1 + k] = test_rng_int(r, 0, 2) == 0
                             ? 0
                             : (int32_t)(test_rng_int(r, 1, 12) << test_rng_int(r, 0, 3));
    }
    return rows;
}

static void test_against_scan(void)
{
    struct test_rng r = {20261128};
    const int64_t sizes[] = {0, 1, 16, 17, 300, 5000, 40000};
    const int kinds[] = {1, 2, 3, 6};
    long queries = 0, found = 0, empty = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
        for (size_t ki = 0; ki < sizeof kinds / sizeof *kinds; ki++) {
            int64_t n = sizes[si];
            int K = kinds[ki];
            int32_t *rows = random_rows(&r, n, K, 64);
            fit_index_t *x = fit_index_make(rows, n, K);
            CU_ASSERT_FATAL(x != NULL);
            int64_t *got = malloc((size_t)(n + 1) * sizeof *got);
            CU_ASSERT_FATAL(got != NULL);
            for (int q = 0; q < 60; q++) {
                int64_t left[8], need = test_rng_int(&r, -5, q % 2 ? 40 : 300);
                int64_t most = q % 4 == 0 ? test_rng_int(&r, 0, 6) : 1000;
                for (int k = 0; k < K; k++)
                    left[k] = test_rng_int(&r, 0, q % 3 == 0 ? 8 : 100);
                int64_t from = test_rng_int(&r, -2, n), to = test_rng_int(&r, from, n + 3);
                if (q % 5 == 0)
                    from = 0, to = n;
                int64_t m = fit_index_find(x, left, need, most, from, to, got), at = 0, bad = 0;
                for (int64_t e = from < 0 ? 0 : from; e < to && e < n; e++)
                    if (scan_fits(rows, K, e, left, need, most))
                        bad += at >= m || got[at++] != e;
                bad += at != m;
                if (bad)
                    fprintf(stderr, "\nn %lld K %d query %d: %lld found, the scan %lld\n",
                            (long long)n, K, q, (long long)m, (long long)at);
                CU_ASSERT(bad == 0);
                queries++;
                found += m;
                empty += m == 0;
                /* capacities fall between queries, as the search lowers them */
                for (int d = 0; n > 0 && d < 20; d++) {
                    int64_t e = test_rng_int(&r, 0, n - 1);
                    int32_t *cap = rows + e * (K + 1);
                    *cap = (int32_t)test_rng_int(&r, 0, *cap);
                    fit_index_lower(x, e, *cap);
                }
            }
            free(got);
            fit_index_free(x);
            free(rows);
        }
    fprintf(stderr, " [%ld queries, %ld entries found, %ld found none] ", queries, found, empty);
    CU_ASSERT(found > 10000); /* not vacuous: most queries find some, some none */
    CU_ASSERT(empty > queries / 10 && empty < queries / 2 + queries / 4);
}

/* By hand: three entries of two kinds. (cap 4, 2 A + 0 B): 8 A left hold 4 replicas, 16
 * micro-batches; (cap 3, 1 A + 2 B) with 2 B left: one replica, 3; (cap 0, ...): none. */
static void test_by_hand(void)
{
    int32_t rows[] = {4, 2, 0, 3, 1, 2, 0, 1, 1};
    fit_index_t *x = fit_index_make(rows, 3, 2);
    int64_t got[3], left[2] = {8, 2}, seven[2] = {7, 2};
    CU_ASSERT_FATAL(x != NULL);
    CU_ASSERT_EQUAL(fit_index_find(x, left, 3, 100, 0, 3, got), 2);
    CU_ASSERT(got[0] == 0 && got[1] == 1);
    CU_ASSERT_EQUAL(fit_index_find(x, left, 4, 100, 0, 3, got), 1); /* 3 < 4 for the second */
    CU_ASSERT_EQUAL(got[0], 0);
    CU_ASSERT_EQUAL(fit_index_find(x, left, 16, 100, 0, 3, got), 1);
    CU_ASSERT_EQUAL(fit_index_find(x, left, 17, 100, 0, 3, got), 0);
    CU_ASSERT_EQUAL(fit_index_find(x, left, 16, 3, 0, 3, got), 0); /* 4 replicas, 3 allowed */
    /* 7 A hold 3.5 replicas of the first: 14 micro-batches at a fraction, 12 whole */
    CU_ASSERT_EQUAL(fit_index_find(x, seven, 13, 100, 0, 3, got), 0);
    CU_ASSERT_EQUAL(fit_index_find(x, seven, 12, 100, 0, 3, got), 1);
    CU_ASSERT_EQUAL(fit_index_find(x, left, 3, 100, 1, 3, got), 1); /* from entry 1 on */
    CU_ASSERT_EQUAL(got[0], 1);
    fit_index_lower(x, 0, 2); /* 4 replicas take 8 micro-batches now */
    CU_ASSERT_EQUAL(fit_index_find(x, left, 9, 100, 0, 3, got), 0);
    CU_ASSERT_EQUAL(fit_index_find(x, left, 8, 100, 0, 3, got), 1);
    fit_index_free(x);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("shapes by GPUs: index vs scan", NULL, NULL);
    CU_add_test(s, "by hand", test_by_hand);
    CU_add_test(s, "the same entries as a scan", test_against_scan);
    return test_main();
}
