/* The schedules as data (common/schedule.h), against independent checks: every GPU's program
 * runs every pass of its chunks exactly once, each kind of pass in micro-batch order, a W after
 * its B; the program is deadlock-free (the simulator runs every pass); the in-flight counts
 * equal a brute-force recount over every prefix of the order; and the simulated bubbles on
 * uniform stages are the ones worked out by hand: 1F1B (p-1)(F+B), interleaved (p-1)(F+B)/v
 * (bubble fraction (p-1)/(v m) of the work), ZB-H1 (p-1) passes with F = B = W, a third of
 * 1F1B's, and v-half's at most 1F1B's while a GPU holds about half of 1F1B's first stage.
 * S 1..9, M 1..17, v 1..4. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"
#include "testutil.h"

#define S_MAX 9
#define M_MAX 17
#define OPS_MAX (SCHEDULE_CHUNKS_MAX * M_MAX * 3)

static int shape_ok(enum schedule kind, int v)
{
    return v == schedule_fixed_chunks(kind, v);
}

/* For every GPU: each (chunk, pass) runs micro-batches 0..M-1 in order, W after its B. */
static int check_program(const struct schedule_shape *sh, int g, const struct schedule_op *ops,
                         int n)
{
    int next[SCHEDULE_CHUNKS_MAX][3] = {{0}}, split = schedule_splits(sh->kind);
    for (int k = 0; k < n; k++) {
        const struct schedule_op *o = &ops[k];
        if (o->chunk < 0 || o->chunk >= sh->chunks || o->pass < 0 || o->pass > 2 ||
            (o->pass == SCHEDULE_W && !split) || o->micro != next[o->chunk][o->pass])
            return 0;
        if (o->pass == SCHEDULE_W && next[o->chunk][SCHEDULE_B] <= o->micro)
            return 0;
        if (o->pass == SCHEDULE_B && next[o->chunk][SCHEDULE_F] <= o->micro)
            return 0;
        next[o->chunk][o->pass]++;
    }
    for (int c = 0; c < sh->chunks; c++)
        for (int pass = 0; pass < (split ? 3 : 2); pass++)
            if (next[c][pass] != sh->micro_batches)
                return 0;
    (void)g;
    return 1;
}

/* The most micro-batches of chunk c between their forward and their last pass over any
 * prefix of the order, each prefix recounted from scratch. */
static int brute_in_flight(const struct schedule_shape *sh, const struct schedule_op *ops,
                           int n, int c)
{
    int most = 0, last = schedule_splits(sh->kind) ? SCHEDULE_W : SCHEDULE_B;
    for (int k = 0; k <= n; k++) {
        int held = 0;
        for (int m = 0; m < sh->micro_batches; m++) {
            int fwd = 0, done = 0;
            for (int i = 0; i < k; i++)
                if (ops[i].chunk == c && ops[i].micro == m) {
                    fwd |= ops[i].pass == SCHEDULE_F;
                    done |= ops[i].pass == last;
                }
            held += fwd && !done;
        }
        most = held > most ? held : most;
    }
    return most;
}

static void check_shape(enum schedule kind, int p, int v, int M, int *failures)
{
    struct schedule_shape sh = schedule_shape_of(kind, p, v, M);
    struct err e;
    err_clear(&e);
    int V = schedule_virtual_stages(&sh), n = schedule_op_count(&sh), flights[S_MAX * 8];
    struct schedule_op *all = malloc((size_t)p * n * sizeof *all);
    CU_ASSERT_FATAL(all != NULL);
    CU_ASSERT_FATAL(schedule_all_ops(&sh, all, &e) == ERR_OK);
    CU_ASSERT_FATAL(schedule_in_flights(&sh, flights, &e) == ERR_OK);
    for (int g = 0; g < p; g++) {
        struct schedule_op one[OPS_MAX];
        CU_ASSERT_FATAL(schedule_ops(&sh, g, one, &e) == ERR_OK);
        int same = memcmp(one, all + (size_t)g * n, (size_t)n * sizeof *one) == 0;
        int ok = check_program(&sh, g, one, n);
        CU_ASSERT(same && ok);
        for (int c = 0; c < v; c++) {
            int j = schedule_vstage(&sh, g, c), chunk;
            CU_ASSERT_EQUAL(schedule_gpu(&sh, j, &chunk), g);
            CU_ASSERT_EQUAL(chunk, c);
            int want = brute_in_flight(&sh, one, n, c);
            CU_ASSERT_EQUAL(flights[j], want);
            if (v == 1)
                CU_ASSERT_EQUAL(schedule_in_flight(kind, p, j, M), want);
            if ((flights[j] != want || !same || !ok) && (*failures)++ < 5)
                fprintf(stderr, "\n%s p %d v %d M %d GPU %d chunk %d: program ok %d, in flight "
                        "%d, brute force %d\n", schedule_name(kind), p, v, M, g, c, ok,
                        flights[j], want);
        }
    }
    /* deadlock-free: the simulator runs every pass */
    struct sim_stage st[S_MAX * 8];
    for (int j = 0; j < V; j++)
        st[j] = (struct sim_stage){.fwd_ms = 1 + j % 3, .bwd_ms = 1 + j % 2,
                                   .w_ms = schedule_splits(kind) ? 1 : 0};
    struct sim_result r;
    int rc = sim_run_shape(&sh, st, &r, &e);
    CU_ASSERT(rc == ERR_OK);
    if (rc && (*failures)++ < 5)
        fprintf(stderr, "\n%s p %d v %d M %d: %s\n", schedule_name(kind), p, v, M, e.msg);
    if (rc == ERR_OK)
        sim_result_free(&r);
    free(all);
}

static void test_every_schedule(void)
{
    int failures = 0;
    for (int kind = 0; kind < SCHEDULE_KINDS; kind++)
        for (int p = 1; p <= S_MAX; p++)
            for (int v = 1; v <= 4; v++)
                for (int M = 1; M <= M_MAX && shape_ok((enum schedule)kind, v); M++)
                    check_shape((enum schedule)kind, p, v, M, &failures);
}

/* Uniform stages: each virtual stage's passes F, B (and W), no links. The step and each
 * GPU's busy time. */
static double step_ms(enum schedule kind, int p, int v, int M, double F, double B, double W,
                      double *busy)
{
    struct schedule_shape sh = schedule_shape_of(kind, p, v, M);
    struct sim_stage st[64];
    struct sim_result r;
    struct err e;
    err_clear(&e);
    for (int j = 0; j < p * v; j++)
        st[j] = (struct sim_stage){.fwd_ms = F, .bwd_ms = B, .w_ms = W};
    CU_ASSERT_FATAL(sim_run_shape(&sh, st, &r, &e) == ERR_OK);
    double ms = r.iteration_ms;
    *busy = ms * (1 - r.bubble_fraction);
    sim_result_free(&r);
    return ms;
}

static void test_ideal_bubbles(void)
{
    double busy, tol = 1e-9;
    for (int p = 2; p <= 8; p *= 2)
        for (int m = 1; m <= 4; m *= 2) {
            int M = m * p;
            /* 1F1B: the work of M micro-batches and (p-1)(F+B) */
            double one = step_ms(SCHEDULE_1F1B, p, 1, M, 1, 2, 0, &busy);
            CU_ASSERT_DOUBLE_EQUAL(one, 3.0 * M + 3.0 * (p - 1), tol);
            /* GPipe: the same, every forward first */
            CU_ASSERT_DOUBLE_EQUAL(step_ms(SCHEDULE_GPIPE, p, 1, M, 1, 2, 0, &busy), one, tol);
            /* interleaved: chunks of 1/v of the work; bubble (p-1)(F+B)/v, (p-1)/(v M) of it */
            for (int v = 2; v <= 4; v++) {
                double ms = step_ms(SCHEDULE_INTERLEAVED, p, v, M, 1.0 / v, 2.0 / v, 0, &busy);
                CU_ASSERT_DOUBLE_EQUAL(ms - 3.0 * M, 3.0 * (p - 1) / v, 1e-9);
                CU_ASSERT_DOUBLE_EQUAL((ms - 3.0 * M) / (3.0 * M), (p - 1.0) / (v * M), 1e-9);
            }
            /* ZB-H1 with F = B = W: (p-1) passes of bubble, a third of 1F1B's 3(p-1) */
            double zb = step_ms(SCHEDULE_ZB_H1, p, 1, M, 1, 1, 1, &busy);
            double oneb = step_ms(SCHEDULE_1F1B, p, 1, M, 1, 2, 0, &busy);
            CU_ASSERT_DOUBLE_EQUAL(zb - 3.0 * M, (p - 1.0), tol);
            CU_ASSERT_DOUBLE_EQUAL((zb - 3.0 * M) / (oneb - 3.0 * M), 1.0 / 3, tol);
            /* v-half: half chunks; never a longer bubble than 1F1B's */
            double vh = step_ms(SCHEDULE_V_HALF, p, 2, M, 0.5, 0.5, 0.5, &busy);
            CU_ASSERT(vh - 3.0 * M <= 3.0 * (p - 1) + tol);
        }
}

/* ZB-H1 holds p micro-batches on every GPU (1F1B's first); v-half's virtual stage j at most
 * floor((2p-j)/2) + 1, a GPU's two chunks about half of 1F1B's first GPU's p whole stages. */
static void test_in_flight_by_hand(void)
{
    struct err e;
    err_clear(&e);
    for (int p = 1; p <= S_MAX; p++) {
        int f[2 * S_MAX];
        struct schedule_shape zb = schedule_shape_of(SCHEDULE_ZB_H1, p, 1, 2 * p);
        CU_ASSERT_FATAL(schedule_in_flights(&zb, f, &e) == ERR_OK);
        for (int s = 0; s < p; s++)
            CU_ASSERT_EQUAL(f[s], p);
        struct schedule_shape vh = schedule_shape_of(SCHEDULE_V_HALF, p, 2, 4 * p);
        CU_ASSERT_FATAL(schedule_in_flights(&vh, f, &e) == ERR_OK);
        for (int g = 0; g < p; g++) {
            int a = schedule_vstage(&vh, g, 0), b = schedule_vstage(&vh, g, 1);
            CU_ASSERT(f[a] <= (2 * p - a) / 2 + 1 && f[b] <= (2 * p - b) / 2 + 1);
            /* two half-size chunks: (f[a] + f[b]) / 2 whole stages, against 1F1B's p */
            CU_ASSERT(f[a] + f[b] <= p + 3);
        }
    }
}

static void test_refusals(void)
{
    struct err e;
    err_clear(&e);
    struct schedule_shape bad[] = {
        schedule_shape_of(SCHEDULE_INTERLEAVED, 4, 0, 8),
        schedule_shape_of(SCHEDULE_INTERLEAVED, 4, SCHEDULE_CHUNKS_MAX + 1, 8),
        schedule_shape_of(SCHEDULE_V_HALF, 4, 1, 8),
        schedule_shape_of(SCHEDULE_ZB_H1, 4, 2, 8),
        schedule_shape_of(SCHEDULE_1F1B, 0, 1, 8),
        schedule_shape_of(SCHEDULE_1F1B, 4, 1, 0),
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err_clear(&e);
        CU_ASSERT_EQUAL(schedule_check(&bad[i], &e), ERR_INPUT);
        CU_ASSERT(strstr(e.msg, schedule_name(bad[i].kind)) != NULL);
    }
    enum schedule k;
    CU_ASSERT_EQUAL(schedule_parse("zb-h1", &k), 0);
    CU_ASSERT_EQUAL(k, SCHEDULE_ZB_H1);
    CU_ASSERT_EQUAL(schedule_parse("zb", &k), -1);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("schedule order", NULL, NULL);
    CU_add_test(s, "every schedule: programs, in-flight by brute force, deadlock-free",
                test_every_schedule);
    CU_add_test(s, "ideal bubbles on uniform stages, by hand", test_ideal_bubbles);
    CU_add_test(s, "in-flight counts by hand", test_in_flight_by_hand);
    CU_add_test(s, "bad shapes refused", test_refusals);
    return test_main();
}
