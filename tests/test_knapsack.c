/* The knapsack DP of planner/solvers/knapsack.h against brute force over every subset of a stage's
 * layers (tests/reference.h), on random stages of up to 14 layers; with recompute options,
 * the multiple-choice DP against every combination of choices, on stages of up to 10 layers
 * of 2 to 4 choices each. */
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

/* ---- multiple choice: layers with recompute options ---- */

#define MC_INSTANCES 1200
#define MC_LAYERS_MAX 10
#define MC_COMBOS_MAX 4096

/* 1 to 10 layers of 2 to 4 choices each (at most MC_COMBOS_MAX combinations in all). */
static void random_mc_instance(struct test_rng *rng, struct instance *in)
{
    static const int64_t units[] = {1, 7, 1000, 1 << 20};
    in->n = (int)test_rng_int(rng, 1, MC_LAYERS_MAX);
    in->in_flight = (int)test_rng_int(rng, 1, 8);
    in->unit = units[test_rng_int(rng, 0, 3)];
    in->reserve = test_rng_int(rng, 0, 3) == 0 ? 0 : test_rng_int(rng, 0, 100 * in->unit);
    ref_random_layers(rng, in->n, in->unit, in->layers);
    long combos = 1;
    for (int l = 0; l < in->n; l++) {
        if (combos * 2 > MC_COMBOS_MAX) {
            in->n = l; /* no room for another layer */
            break;
        }
        ref_random_options(rng, 2, &in->layers[l]);
        while (combos * (2 + in->layers[l].n_options) > MC_COMBOS_MAX)
            in->layers[l].n_options--;
        combos *= 2 + in->layers[l].n_options;
    }
    in->limit = ref_random_limit(rng, in->layers, in->n, in->in_flight, in->reserve, in->unit);
}

static void build_options(const struct instance *in, struct knap_problem *kp)
{
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(knap_build_options(kp, in->layers, in->n, in->in_flight, in->reserve,
                                       in->limit, in->unit, &e) == ERR_OK);
}

/* Every combination of choices: knap_units is the documented units (exact when they fit,
 * above cap otherwise), and a combination that fits in units fits in bytes. */
static void check_every_combination(const struct instance *in, const struct knap_problem *kp)
{
    struct ref_stage rs = ref_of(in);
    unsigned char c[MC_LAYERS_MAX] = {0};
    int l;
    do {
        __int128 u = ref_choice_units(&rs, c);
        int64_t ku = knap_units(kp, c);
        CU_ASSERT(u <= kp->cap ? u == ku : ku > kp->cap);
        CU_ASSERT(test_close(knap_recompute_ms(kp, c), ref_choice_ms(&rs, c), 1e-12, 1e-12));
        if (u <= kp->cap) {
            struct stage_cost cost;
            cost_stage(in->layers, in->n, c, in->in_flight, in->reserve, &cost);
            CU_ASSERT(cost.memory_bytes <= in->limit);
        }
        for (l = 0; l < in->n && ++c[l] == 2 + in->layers[l].n_options; l++)
            c[l] = 0;
    } while (l < in->n);
}

/* The multiple-choice DP (through the entry point and directly) against every combination:
 * the same least time, no more units among ties, infeasible exactly when nothing fits. */
static void test_choices_brute_force(void)
{
    struct test_rng rng = {909};
    int feasible = 0, infeasible = 0, partial = 0, ties = 0, whole_only = 0, floors_close = 0;
    failures = 0;
    for (int i = 0; i < MC_INSTANCES; i++) {
        struct instance in;
        struct knap_problem kp;
        struct ref_best ref;
        random_mc_instance(&rng, &in);
        build_options(&in, &kp);
        struct ref_stage rs = ref_of(&in);
        if (i % 10 == 0)
            check_every_combination(&in, &kp);
        ref_min_recompute_choices(&rs, &ref);
        whole_only += !kp.multi;
        /* the relaxation's floor: never above the least time, and near it on most */
        double floor = knap_recompute_floor(&kp);
        CU_ASSERT(ref.feasible ? floor <= ref.recompute_ms : 1);
        CU_ASSERT(isinf(floor) ? !ref.feasible : 1);
        floors_close += ref.feasible && ref.recompute_ms > 0 && floor >= 0.8 * ref.recompute_ms;
        for (int k = 0; k < 2; k++) {
            unsigned char c[MC_LAYERS_MAX];
            struct err e;
            err_clear(&e);
            int rc = k == 0 ? knap_min_recompute(&kp, c, &e) : knap_min_recompute_mc(&kp, c, &e);
            if (!ref.feasible) {
                if (rc != ERR_NOFIT)
                    report(i, &in, "fits, the brute force says nothing does");
                CU_ASSERT(rc == ERR_NOFIT);
                continue;
            }
            CU_ASSERT_FATAL(rc == ERR_OK);
            __int128 u = ref_choice_units(&rs, c);
            double r = ref_choice_ms(&rs, c);
            struct stage_cost cost;
            cost_stage(in.layers, in.n, c, in.in_flight, in.reserve, &cost);
            CU_ASSERT(u <= kp.cap);
            CU_ASSERT(cost.memory_bytes <= in.limit);
            CU_ASSERT(test_close(cost.recompute_ms, r, 1e-12, 1e-12));
            if (!test_close(r, ref.recompute_ms, REF_ATOL, REF_RTOL) || u > ref.units)
                report(i, &in, k == 0 ? "the entry point differs from the brute force"
                                      : "the multiple-choice DP differs from the brute force");
            CU_ASSERT(test_close(r, ref.recompute_ms, REF_ATOL, REF_RTOL));
            CU_ASSERT(u <= ref.units);
            if (k == 0)
                for (int l = 0; l < in.n; l++)
                    if (c[l] >= COST_OPTION) {
                        partial++;
                        break;
                    }
        }
        feasible += ref.feasible;
        infeasible += !ref.feasible;
        ties += ref.feasible && ref.recompute_ms == 0 && ref.units < ref_units(&rs, 0);
        knap_free(&kp);
    }
    fprintf(stderr, " [%d feasible, %d infeasible, %d with options chosen, %d whole layers "
                    "only, %d floors within 20%%] ",
            feasible, infeasible, partial, whole_only, floors_close);
    CU_ASSERT(floors_close > MC_INSTANCES / 5);
    CU_ASSERT(feasible > MC_INSTANCES / 2);
    CU_ASSERT(infeasible > MC_INSTANCES / 20);
    CU_ASSERT(partial > MC_INSTANCES / 5);
    CU_ASSERT(whole_only > 0);
    CU_ASSERT(ties > 0);
}

/* On whole layers (no options) the multiple-choice DP answers like the single-choice DP:
 * against the brute force over every subset. */
static void test_choices_whole_layers(void)
{
    struct test_rng rng = {910};
    failures = 0;
    for (int i = 0; i < INSTANCES / 3; i++) {
        struct instance in;
        struct knap_problem kp;
        struct ref_best ref;
        unsigned char f[LAYERS_MAX];
        struct err e;
        random_instance(&rng, &in);
        build(&in, &kp);
        struct ref_stage rs = ref_of(&in);
        ref_min_recompute(&rs, &ref);
        err_clear(&e);
        int rc = knap_min_recompute_mc(&kp, f, &e);
        CU_ASSERT_EQUAL(rc, ref.feasible ? ERR_OK : ERR_NOFIT);
        if (rc == ERR_OK && ref.feasible) {
            uint64_t m = ref_mask(f, in.n);
            if (!test_close(ref_recompute_ms(&rs, m), ref.recompute_ms, REF_ATOL, REF_RTOL) ||
                ref_units(&rs, m) > ref.units)
                report(i, &in, "the multiple-choice DP on whole layers");
            CU_ASSERT(test_close(ref_recompute_ms(&rs, m), ref.recompute_ms, REF_ATOL, REF_RTOL));
            CU_ASSERT(ref_units(&rs, m) <= ref.units);
        }
        knap_free(&kp);
    }
}

/* By hand, unit 1, v 2, nothing fixed: a (act 10, fwd 5) with option "half" (kept 4,
 * transient 6, 1 ms); b (act 4, fwd 1). Units (kept + transient): keep both 20 + 8 = 28;
 * full a 10 + 8 = 18 (5 ms); half a 8 + 8 + 6 = 22 (1 ms); keep a, full b 20 + 4 = 24 (1 ms);
 * half a, full b 8 + 6 = 14 (2 ms); full both 10 (6 ms). */
static void test_choices_by_hand(void)
{
    struct layer_cost l[2] = {LAYER("a", 5, 10, 0, 10, 0, 0, 0), LAYER("b", 1, 2, 0, 4, 0, 0, 0)};
    l[0].n_options = 1;
    l[0].options[0] = (struct recompute_option){"half", 4, 6, 1.0};
    struct knap_problem kp;
    struct err e;
    unsigned char c[2];
    err_clear(&e);
    /* cap 22: half a, keep b (1 ms; keep a, full b also takes 1 ms but 24 units) */
    CU_ASSERT_FATAL(knap_build_options(&kp, l, 2, 2, 0, 22, 1, &e) == ERR_OK);
    CU_ASSERT_EQUAL_FATAL(knap_min_recompute(&kp, c, &e), ERR_OK);
    CU_ASSERT(c[0] == COST_OPTION && c[1] == COST_KEEP);
    CU_ASSERT_EQUAL(knap_units(&kp, c), 22);
    struct stage_cost cost;
    cost_stage(l, 2, c, 2, 0, &cost);
    CU_ASSERT_EQUAL(cost.memory_bytes, 22);
    CU_ASSERT_DOUBLE_EQUAL(cost.recompute_ms, 1.0, 1e-12);
    knap_free(&kp);
    /* cap 24: both 1 ms choices fit; the fewer units win */
    CU_ASSERT_FATAL(knap_build_options(&kp, l, 2, 2, 0, 24, 1, &e) == ERR_OK);
    CU_ASSERT_EQUAL_FATAL(knap_min_recompute(&kp, c, &e), ERR_OK);
    CU_ASSERT(c[0] == COST_OPTION && c[1] == COST_KEEP);
    knap_free(&kp);
    /* cap 21: half a, full b (2 ms) */
    CU_ASSERT_FATAL(knap_build_options(&kp, l, 2, 2, 0, 21, 1, &e) == ERR_OK);
    CU_ASSERT_EQUAL_FATAL(knap_min_recompute(&kp, c, &e), ERR_OK);
    CU_ASSERT(c[0] == COST_OPTION && c[1] == COST_FULL);
    CU_ASSERT_EQUAL(knap_units(&kp, c), 14);
    knap_free(&kp);
    /* without the option, cap 21 needs full a (5 ms) */
    CU_ASSERT_FATAL(knap_build(&kp, l, 2, 2, 0, 21, 1, &e) == ERR_OK);
    CU_ASSERT_EQUAL_FATAL(knap_min_recompute(&kp, c, &e), ERR_OK);
    CU_ASSERT(c[0] == COST_FULL && c[1] == COST_KEEP);
    knap_free(&kp);
    /* cap 9: not even full recomputation (10) */
    CU_ASSERT_FATAL(knap_build_options(&kp, l, 2, 2, 0, 9, 1, &e) == ERR_OK);
    CU_ASSERT_EQUAL(knap_min_recompute(&kp, c, &e), ERR_NOFIT);
    CU_ASSERT_EQUAL(knap_min_recompute_mc(&kp, c, &e), ERR_NOFIT);
    knap_free(&kp);
}

/* Too many states is refused with a message about the unit. Layer i keeps 2^i bytes (v 1,
 * 1-byte unit) and recomputes in 2^i ms: every subset kept is a state no other beats (more
 * units, less time), and half of the 2^30 subsets fit. */
static void test_choices_too_many_states(void)
{
    struct layer_cost l[30];
    for (int i = 0; i < 30; i++) {
        int64_t b = (int64_t)1 << i;
        l[i] = (struct layer_cost)LAYER("x", (double)b, 1, 0, b, 0, 0, 0);
        l[i].n_options = 1;
        l[i].options[0] = (struct recompute_option){"half", b / 2, b - b / 2, (double)b / 4};
    }
    struct knap_problem kp;
    struct err e;
    unsigned char c[30];
    err_clear(&e);
    CU_ASSERT_FATAL(knap_build_options(&kp, l, 30, 1, 0, (int64_t)1 << 29, 1, &e) == ERR_OK);
    int rc = knap_min_recompute(&kp, c, &e);
    CU_ASSERT_EQUAL(rc, ERR_INPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "--unit"));
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
    CU_add_test(s, "options by hand", test_choices_by_hand);
    CU_add_test(s, "options: least recompute = every combination", test_choices_brute_force);
    CU_add_test(s, "multiple-choice DP on whole layers = brute force", test_choices_whole_layers);
    CU_add_test(s, "options: too many states are refused", test_choices_too_many_states);
    return test_main();
}
