/* The knapsack DP of planner/knapsack.h against brute force over every subset of a stage's
 * layers (tests/reference.h), on random stages of up to 14 layers. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cost.h"
#include "knapsack.h"
#include "reference.h"
#include "testutil.h"

/* A layer's costs by position (name, fwd, bwd, state, act, ckpt, out, workspace), without
 * recompute options. */
#define LAYER(n_, f_, b_, s_, a_, c_, o_, w_)                                                  \
    {.name = n_, .fwd_ms = f_, .bwd_ms = b_, .state_bytes = s_, .act_bytes = a_,               \
     .ckpt_bytes = c_, .out_bytes = o_, .workspace_bytes = w_}

#define INSTANCES 1500
#define LAYERS_MAX 14

struct instance {
    int n;
    int in_flight;
    int64_t reserve, limit, unit;
    struct layer_cost layers[LAYERS_MAX];
};

static void random_instance(struct test_rng *rng, struct instance *in)
{
    static const int64_t units[] = {1, 7, 1000, 1 << 20};
    in->n = (int)test_rng_int(rng, 1, LAYERS_MAX);
    in->in_flight = (int)test_rng_int(rng, 1, 8);
    in->unit = units[test_rng_int(rng, 0, 3)];
    in->reserve = test_rng_int(rng, 0, 3) == 0 ? 0 : test_rng_int(rng, 0, 100 * in->unit);
    ref_random_layers(rng, in->n, in->unit, in->layers);
    in->limit = ref_random_limit(rng, in->layers, in->n, in->in_flight, in->reserve, in->unit);
}

static struct ref_stage ref_of(const struct instance *in)
{
    return (struct ref_stage){in->n, in->layers, in->in_flight, in->reserve, in->limit,
                              in->unit};
}

static void build(const struct instance *in, struct knap_problem *kp)
{
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(knap_build(kp, in->layers, in->n, in->in_flight, in->reserve, in->limit,
                               in->unit, &e) == ERR_OK);
}

/* knap_build's units are the documented ones (knapsack.h), and units never under-estimate
 * bytes: every subset that fits in units fits in bytes by the cost model. */
static void test_units_match_bytes(void)
{
    struct test_rng rng = {101};
    int checked = 0, unit_fits = 0;
    for (int i = 0; i < INSTANCES; i++) {
        struct instance in;
        struct knap_problem kp;
        random_instance(&rng, &in);
        build(&in, &kp);
        struct ref_stage rs = ref_of(&in);
        CU_ASSERT(kp.cap == (ref_cap(&rs) < 0 ? -1 : ref_cap(&rs)));
        CU_ASSERT(ref_fixed_bytes(&rs) == kp.fixed_bytes);
        unsigned char flags[LAYERS_MAX];
        for (uint64_t m = 0; m < (uint64_t)1 << in.n; m++) {
            ref_flags(m, in.n, flags);
            __int128 u = ref_units(&rs, m);
            /* exact for a subset that fits, above cap for one that does not */
            int64_t ku = knap_units(&kp, flags);
            CU_ASSERT(u <= kp.cap ? u == ku : ku > kp.cap);
            if (u <= kp.cap) {
                struct stage_cost c;
                cost_stage(in.layers, in.n, flags, in.in_flight, in.reserve, &c);
                CU_ASSERT(c.memory_bytes <= in.limit);
                unit_fits++;
            }
            checked++;
        }
        knap_free(&kp);
    }
    CU_ASSERT(unit_fits > checked / 10);
}

static int failures;

static void report(int i, const struct instance *in, const char *what)
{
    if (failures++ < 5)
        fprintf(stderr, "\ninstance %d (n %d, v %d, unit %lld, limit %lld): %s\n", i, in->n,
                in->in_flight, (long long)in->unit, (long long)in->limit, what);
}

/* Least recompute: same time as the brute force, fits, ties by least units, infeasible
 * exactly when no subset fits. */
/* The three ways to solve a stage's least recompute: the entry point (which picks one of the
 * other two), the DP table and every subset. Each is held to the brute force. */
typedef int (*min_recompute_fn)(const struct knap_problem *, unsigned char *, struct err *);

static int subsets(const struct knap_problem *p, unsigned char *flags, struct err *e)
{
    (void)e;
    return knap_min_recompute_subsets(p, flags);
}

static void test_min_recompute(void)
{
    static const min_recompute_fn solvers[] = {knap_min_recompute, knap_min_recompute_dp,
                                               subsets};
    static const char *const names[] = {"the DP", "the DP table", "the subsets"};
    struct test_rng rng = {202};
    int feasible = 0, infeasible = 0, ties = 0;
    failures = 0;
    for (int i = 0; i < INSTANCES; i++) {
        struct instance in;
        struct knap_problem kp;
        struct ref_best ref;
        unsigned char flags[LAYERS_MAX];
        random_instance(&rng, &in);
        build(&in, &kp);
        struct ref_stage rs = ref_of(&in);
        ref_min_recompute(&rs, &ref);
        feasible += ref.feasible;
        infeasible += !ref.feasible;
        for (int k = 0; k < 3; k++) {
            struct err e;
            err_clear(&e);
            int rc = solvers[k](&kp, flags, &e);
            if (!ref.feasible) {
                if (rc != ERR_NOFIT)
                    report(i, &in, names[k]);
                CU_ASSERT(rc == ERR_NOFIT);
                continue;
            }
            CU_ASSERT_FATAL(rc == ERR_OK);
            uint64_t m = ref_mask(flags, in.n);
            __int128 u = ref_units(&rs, m);
            double r = ref_recompute_ms(&rs, m);
            struct stage_cost c;
            cost_stage(in.layers, in.n, flags, in.in_flight, in.reserve, &c);
            CU_ASSERT(u <= kp.cap);
            CU_ASSERT(c.memory_bytes <= in.limit);
            if (!test_close(r, ref.recompute_ms, REF_ATOL, REF_RTOL))
                report(i, &in, names[k]);
            CU_ASSERT(test_close(r, ref.recompute_ms, REF_ATOL, REF_RTOL));
            if (u > ref.units)
                report(i, &in, names[k]);
            CU_ASSERT(u <= ref.units);
        }
        ties += ref.feasible && ref.units < ref_units(&rs, 0) && ref.recompute_ms == 0;
        knap_free(&kp);
    }
    fprintf(stderr, " [%d feasible, %d infeasible] ", feasible, infeasible);
    CU_ASSERT(feasible > INSTANCES / 2);
    CU_ASSERT(infeasible > INSTANCES / 20);
    CU_ASSERT(ties > 0); /* free recomputation (zero-time layers) was exercised */
}

/* The balancing time unit for a stage: at least `wanted`, coarse enough that the table stays
 * small in a test (the DP's own coarsening is tested separately). */
static double time_unit(struct test_rng *rng, const struct knap_problem *kp)
{
    static const double wanted[] = {1e-3, 0.01, 0.25, 1.0};
    double total = 0;
    for (int l = 0; l < kp->n; l++)
        total += kp->fwd[l];
    double u = wanted[test_rng_int(rng, 0, 3)];
    if (total / 2e4 > u)
        u = total / 2e4;
    return knap_balance_time_unit(kp, u);
}

/* Closest recompute time to a target: the brute force's least distance in time units, ties by
 * least units, infeasible exactly when no subset fits. */
static void test_balance(void)
{
    struct test_rng rng = {303};
    int feasible = 0, infeasible = 0, exact = 0;
    failures = 0;
    for (int i = 0; i < INSTANCES; i++) {
        struct instance in;
        struct knap_problem kp;
        struct ref_best ref;
        struct err e;
        unsigned char flags[LAYERS_MAX];
        random_instance(&rng, &in);
        build(&in, &kp);
        struct ref_stage rs = ref_of(&in);
        double unit = time_unit(&rng, &kp);
        int64_t qsum = 0;
        for (int l = 0; l < in.n; l++)
            qsum += ref_time_units(&in.layers[l], unit);
        int64_t target = test_rng_int(&rng, 0, qsum + 10);
        ref_balance(&rs, target, unit, &ref);
        err_clear(&e);
        int64_t distance = -1;
        int rc = knap_balance(&kp, target, unit, flags, &distance, &e);
        if (!ref.feasible) {
            infeasible++;
            CU_ASSERT(rc == ERR_NOFIT);
            knap_free(&kp);
            continue;
        }
        feasible++;
        CU_ASSERT_FATAL(rc == ERR_OK);
        uint64_t m = ref_mask(flags, in.n);
        __int128 u = ref_units(&rs, m);
        int64_t q = 0;
        for (int l = 0; l < in.n; l++)
            if (flags[l])
                q += ref_time_units(&in.layers[l], unit);
        struct stage_cost c;
        cost_stage(in.layers, in.n, flags, in.in_flight, in.reserve, &c);
        CU_ASSERT(u <= kp.cap);
        CU_ASSERT(c.memory_bytes <= in.limit);
        CU_ASSERT_EQUAL(distance, ref.distance);
        CU_ASSERT_EQUAL(q > target ? q - target : target - q, ref.distance);
        if (distance != ref.distance)
            report(i, &in, "distance differs from the brute force's");
        if (u != ref.units)
            report(i, &in, "units differ from the brute force's least among ties");
        CU_ASSERT(u == ref.units);
        exact += ref.distance == 0;
        knap_free(&kp);
    }
    fprintf(stderr, " [%d feasible, %d infeasible, %d exact] ", feasible, infeasible, exact);
    CU_ASSERT(feasible > INSTANCES / 2);
    CU_ASSERT(infeasible > INSTANCES / 20);
    CU_ASSERT(exact > INSTANCES / 20);
}

/* The transient is not a knapsack item: keeping the layer with the largest act - ckpt can be
 * what makes a stage fit. By hand, unit 1, v 2: layers (d, fwd) = (10, 1), (4, 1), (4, 1);
 * fixed 0, cap 17. Recompute all: 10 units; keep only the first: 20 + 4 = 24 > 17; keep one
 * of the small ones: 8 + 10 = 18 > 17; so the least recompute is all three (3 ms)... unless
 * cap is 18, when keeping one small layer fits (2 ms) at 18 units. */
static void test_transient_by_hand(void)
{
    struct layer_cost l[3] = {LAYER("a", 1, 2, 0, 10, 0, 0, 0),
                              LAYER("b", 1, 2, 0, 4, 0, 0, 0),
                              LAYER("c", 1, 2, 0, 4, 0, 0, 0)};
    struct knap_problem kp;
    struct err e;
    unsigned char f[3];
    err_clear(&e);
    CU_ASSERT_FATAL(knap_build(&kp, l, 3, 2, 0, 17, 1, &e) == ERR_OK);
    CU_ASSERT_EQUAL(knap_min_recompute(&kp, f, &e), ERR_OK);
    CU_ASSERT(f[0] && f[1] && f[2]);
    CU_ASSERT_EQUAL(knap_units(&kp, f), 10);
    knap_free(&kp);
    CU_ASSERT_FATAL(knap_build(&kp, l, 3, 2, 0, 18, 1, &e) == ERR_OK);
    CU_ASSERT_EQUAL(knap_min_recompute(&kp, f, &e), ERR_OK);
    CU_ASSERT_DOUBLE_EQUAL(knap_recompute_ms(&kp, f), 2.0, 1e-12);
    CU_ASSERT(f[0] && f[1] + f[2] == 1);
    CU_ASSERT_EQUAL(knap_units(&kp, f), 18);
    knap_free(&kp);
    /* 9 units: even full recomputation (transient 10) does not fit */
    CU_ASSERT_FATAL(knap_build(&kp, l, 3, 2, 0, 9, 1, &e) == ERR_OK);
    CU_ASSERT_EQUAL(knap_min_recompute(&kp, f, &e), ERR_NOFIT);
    int64_t d;
    CU_ASSERT_EQUAL(knap_balance(&kp, 0, 1.0, f, &d, &e), ERR_NOFIT);
    knap_free(&kp);
}

/* Two choices whose recompute times differ by 1e-4 ms are not a tie, even when a long layer
 * that is kept makes the kept time a million ms. Unit 2, v 2: (act, fwd) = big (10, 1e6),
 * a (17, 2.0), b (18, 2.0001); w = 10, 17, 18; t = 5, 9, 9; cap 37. Keeping big and b and
 * recomputing a takes 28 + 9 = 37 units: 2.0 ms, the least. */
static void test_tie_tolerance(void)
{
    struct layer_cost l[3] = {LAYER("big", 1e6, 1, 0, 10, 0, 0, 0),
                              LAYER("a", 2.0, 1, 0, 17, 0, 0, 0),
                              LAYER("b", 2.0001, 1, 0, 18, 0, 0, 0)};
    struct knap_problem kp;
    struct err e;
    unsigned char f[3];
    err_clear(&e);
    CU_ASSERT_FATAL(knap_build(&kp, l, 3, 2, 0, 74, 2, &e) == ERR_OK);
    CU_ASSERT_EQUAL(kp.cap, 37);
    CU_ASSERT_EQUAL_FATAL(knap_min_recompute(&kp, f, &e), ERR_OK);
    CU_ASSERT(!f[0] && f[1] && !f[2]);
    CU_ASSERT_DOUBLE_EQUAL(knap_recompute_ms(&kp, f), 2.0, 1e-12);
    knap_free(&kp);
}

/* Long layers make the balancing DP coarsen its time unit; rounding each layer's time to the
 * nearest unit must not push the table past its limit (fwd 10000.37 ms x 14 layers did). */
static void test_balance_coarse_unit(void)
{
    struct layer_cost l[14];
    for (int i = 0; i < 14; i++)
        l[i] = (struct layer_cost)LAYER("x", 10000.37, 1, 0, 100, 0, 0, 0);
    struct knap_problem kp;
    struct err e;
    unsigned char f[14];
    err_clear(&e);
    /* 700 bytes: kept layers take 100 each and the transient 100: at most 6 kept */
    CU_ASSERT_FATAL(knap_build(&kp, l, 14, 1, 0, 700, 1, &e) == ERR_OK);
    double unit = knap_balance_time_unit(&kp, 1e-3);
    CU_ASSERT(unit > 1e-3);
    int64_t q = ref_time_units(&l[0], unit), d = -1;
    /* closest to 3.4 layers' time with at least 8 recomputed: 8 layers */
    int rc = knap_balance(&kp, (int64_t)(3.4 * (double)q), unit, f, &d, &e);
    CU_ASSERT_EQUAL_FATAL(rc, ERR_OK);
    int count = 0;
    for (int i = 0; i < 14; i++)
        count += f[i];
    CU_ASSERT_EQUAL(count, 8);
    CU_ASSERT_EQUAL(d, 8 * q - (int64_t)(3.4 * (double)q));
    knap_free(&kp);
}

/* A table too large for the DP is refused with a message about the unit, before anything is
 * allocated for it: a 1-byte unit on a stage of tens of GiB. */
static void test_table_too_large(void)
{
    struct layer_cost l[2] = {LAYER("a", 1, 2, 0, (int64_t)40 << 30, 0, 0, 0),
                              LAYER("b", 2, 4, 0, (int64_t)40 << 30, 0, 0, 0)};
    struct knap_problem kp;
    struct err e;
    unsigned char f[2];
    err_clear(&e);
    CU_ASSERT_FATAL(knap_build(&kp, l, 2, 1, 0, (int64_t)60 << 30, 1, &e) == ERR_OK);
    CU_ASSERT_EQUAL(knap_min_recompute_dp(&kp, f, &e), ERR_INPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "--unit"));
    /* two layers need no table: keeping either costs 40 GiB on top of the other's 40 GiB
     * transient, over the 60 GiB limit, so both are recomputed */
    err_clear(&e);
    CU_ASSERT_EQUAL(knap_min_recompute(&kp, f, &e), ERR_OK);
    CU_ASSERT(f[0] == 1 && f[1] == 1);
    knap_free(&kp);
    /* past KNAP_SUBSETS_MAX layers the entry point takes the table, and refuses it too */
    struct layer_cost many[KNAP_SUBSETS_MAX + 1];
    unsigned char g[KNAP_SUBSETS_MAX + 1];
    for (int i = 0; i <= KNAP_SUBSETS_MAX; i++)
        many[i] = (struct layer_cost)LAYER("m", 1, 2, 0, (int64_t)4 << 30, 0, 0, 0);
    err_clear(&e);
    CU_ASSERT_FATAL(knap_build(&kp, many, KNAP_SUBSETS_MAX + 1, 1, 0, (int64_t)60 << 30, 1, &e) ==
                    ERR_OK);
    CU_ASSERT_EQUAL(knap_min_recompute(&kp, g, &e), ERR_INPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "--unit"));
    knap_free(&kp);
}

/* Hostile sizes: act 2^53 bytes, 2^20 micro-batches in flight, a 1-byte unit. Keeping either
 * layer needs 2^73 units; recomputing both needs 2^53, exactly the limit. Sums of such weights
 * must not wrap around into "fits". */
static void test_no_overflow(void)
{
    int64_t big = (int64_t)1 << 53;
    struct layer_cost l[3] = {LAYER("a", 1, 2, 0, big, 0, 0, 0),
                              LAYER("b", 2, 4, 0, big, 0, 0, 0),
                              LAYER("c", 3, 4, 0, big, 0, 0, 0)};
    struct knap_problem kp;
    struct err e;
    unsigned char f[3] = {0, 0, 0};
    err_clear(&e);
    CU_ASSERT_FATAL(knap_build(&kp, l, 3, 1 << 20, 0, big, 1, &e) == ERR_OK);
    CU_ASSERT_EQUAL_FATAL(knap_min_recompute(&kp, f, &e), ERR_OK);
    CU_ASSERT(f[0] && f[1] && f[2]);
    knap_free(&kp);
    /* one byte less: nothing fits */
    CU_ASSERT_FATAL(knap_build(&kp, l, 3, 1 << 20, 0, big - 1, 1, &e) == ERR_OK);
    CU_ASSERT_EQUAL(knap_min_recompute(&kp, f, &e), ERR_NOFIT);
    knap_free(&kp);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("knapsack DP vs brute force", NULL, NULL);
    CU_add_test(s, "transient by hand", test_transient_by_hand);
    CU_add_test(s, "units match bytes on every subset", test_units_match_bytes);
    CU_add_test(s, "least recompute = brute force", test_min_recompute);
    CU_add_test(s, "closest recompute = brute force", test_balance);
    CU_add_test(s, "ties are relative to the recompute time", test_tie_tolerance);
    CU_add_test(s, "balancing with a coarsened time unit", test_balance_coarse_unit);
    CU_add_test(s, "a table too large is refused", test_table_too_large);
    CU_add_test(s, "hostile sizes do not wrap around", test_no_overflow);
    return test_main();
}
