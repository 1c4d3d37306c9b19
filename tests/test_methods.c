/* Every planning method (docs/cost-model.md, "Methods") on random small clusters, each plan checked
 * against brute force over every stage's recompute subsets (tests/reference.h) and against the
 * cost model: none, full, block:N, uniform-min, patent (with and without --reduce) and
 * optimal. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "cost.h"
#include "knapsack.h"
#include "planner.h"
#include "reference.h"
#include "testutil.h"

#define CLUSTERS 1200
#define STAGES_MAX 5
#define STAGE_LAYERS_MAX 12
#define PROFILES_MAX 3

static unsigned char ch[64]; /* a plan stage's choices (ref_plan_choices) */

/* A random cluster built in memory: 1 to 5 stages of up to `longest` layers (some of 14 when
 * longest is 12), 1 to 3 profiles (device kinds) with their own random layer costs (and up to
 * `options` recompute options per layer), random schedule, micro-batches, reserve, explicit
 * or even layer splits and limits around the interesting range. */
static void random_cluster(struct test_rng *rng, int64_t unit, int longest, int options,
                           struct cluster *c)
{
    memset(c, 0, sizeof *c);
    int S = (int)test_rng_int(rng, 1, STAGES_MAX);
    int count[STAGES_MAX], explicit_split = test_rng_int(rng, 0, 1) == 1, L = 0;
    for (int s = 0; s < S; s++) {
        count[s] = (int)test_rng_int(rng, 1, test_rng_int(rng, 0, 9) == 0 && longest == 12
                                                 ? 14
                                                 : longest);
        L += count[s];
    }
    if (L < 3) { /* a model has embed, at least one block and head */
        count[S - 1] += 3 - L;
        L = 3;
    }
    c->schedule = test_rng_int(rng, 0, 1) ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
    c->micro_batches = (int)test_rng_int(rng, 1, 8);
    c->reserve_bytes = test_rng_int(rng, 0, 1) ? 0 : test_rng_int(rng, 0, 50 * unit);
    c->n_stages = S;
    c->n_layers = L;
    c->model = (struct model){.n_layer = L - 2, .n_embd = 64, .n_head = 4, .seq_len = 16,
                              .vocab_size = 100, .micro_batch = 1, .dtype = MODEL_DTYPE_FP32};
    c->n_profiles = (int)test_rng_int(rng, 1, S < PROFILES_MAX ? S : PROFILES_MAX);
    c->profiles = calloc((size_t)c->n_profiles, sizeof *c->profiles);
    c->stages = calloc((size_t)S, sizeof *c->stages);
    CU_ASSERT_FATAL(c->profiles != NULL && c->stages != NULL);
    for (int k = 0; k < c->n_profiles; k++) {
        struct profile *p = &c->profiles[k];
        snprintf(p->device.name, sizeof p->device.name, "dev%d", k);
        p->model = c->model;
        p->n_layers = L;
        p->layers = calloc((size_t)L, sizeof *p->layers);
        CU_ASSERT_FATAL(p->layers != NULL);
        ref_random_layers(rng, L, unit, p->layers);
        for (int l = 0; l < L; l++)
            ref_random_options(rng, options, &p->layers[l]);
    }
    int first = 0;
    for (int s = 0; s < S; s++) {
        struct cluster_stage *st = &c->stages[s];
        st->profile = (int)test_rng_int(rng, 0, c->n_profiles - 1);
        snprintf(st->device, sizeof st->device, "%s", c->profiles[st->profile].device.name);
        if (explicit_split) {
            st->first = first;
            st->last = first + count[s] - 1;
            first = st->last + 1;
        } else {
            cluster_even_split(L, S, s, &st->first, &st->last);
        }
        int v = schedule_in_flight(c->schedule, S, s, c->micro_batches);
        st->memory_bytes = ref_random_limit(rng, c->profiles[st->profile].layers + st->first,
                                            st->last - st->first + 1, v, c->reserve_bytes, unit);
        c->profiles[st->profile].device.memory_bytes = (int64_t)1 << 53;
    }
}

/* The reference's view of stage s with the given limit. */
static struct ref_stage stage_ref(const struct cluster *c, int s, int64_t limit, int64_t unit)
{
    const struct cluster_stage *st = &c->stages[s];
    return (struct ref_stage){st->last - st->first + 1,
                              cluster_stage_profile(c, s)->layers + st->first,
                              schedule_in_flight(c->schedule, c->n_stages, s, c->micro_batches),
                              c->reserve_bytes, limit, unit};
}

static int64_t mask_bytes(const struct ref_stage *r, uint64_t mask)
{
    unsigned char f[REF_LAYERS_MAX];
    struct stage_cost cost;
    ref_flags(mask, r->n, f);
    cost_stage(r->layers, r->n, f, r->in_flight, r->reserve_bytes, &cost);
    return cost.memory_bytes;
}

static uint64_t first_n(int n, int count)
{
    return n >= count ? ((uint64_t)1 << count) - 1 : ((uint64_t)1 << n) - 1;
}

/* Properties every plan has: each stage's numbers are the cost model's for its choice and fit
 * its limit; before, in flight and limits as defined; bottleneck and most loaded stage. */
static void check_plan_numbers(const struct cluster *c, const struct plan *p, int star,
                               int64_t star_limit)
{
    CU_ASSERT_EQUAL(p->n_stages, c->n_stages);
    CU_ASSERT_EQUAL(p->most_loaded_stage, star);
    int bottleneck = 0;
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        struct ref_stage r = stage_ref(c, s, c->stages[s].memory_bytes, 1);
        struct stage_cost cost;
        cost_stage(r.layers, r.n, ref_plan_choices(st, ch), r.in_flight, r.reserve_bytes,
                   &cost);
        CU_ASSERT_EQUAL(st->first, c->stages[s].first);
        CU_ASSERT_EQUAL(st->last, c->stages[s].last);
        CU_ASSERT_EQUAL(st->in_flight, r.in_flight);
        CU_ASSERT_EQUAL(st->memory_bytes, cost.memory_bytes);
        CU_ASSERT(st->memory_bytes <= st->memory_limit_bytes);
        CU_ASSERT_EQUAL(st->memory_limit_bytes, s == star ? star_limit : c->stages[s].memory_bytes);
        CU_ASSERT_EQUAL(st->capacity_bytes, c->stages[s].memory_bytes);
        CU_ASSERT_EQUAL(st->memory_before_bytes, mask_bytes(&r, 0));
        CU_ASSERT(test_close(st->recompute_ms, cost.recompute_ms, 1e-12, 1e-12));
        CU_ASSERT(test_close(st->stage_ms, cost.stage_ms, 1e-12, 1e-12));
        if (st->stage_ms > p->stages[bottleneck].stage_ms)
            bottleneck = s;
    }
    CU_ASSERT_EQUAL(p->bottleneck_stage, bottleneck);
    CU_ASSERT(p->iteration_ms >= 0);
}

/* The most loaded stage: largest memory before / capacity (compared exactly, as products),
 * ties to the earlier stage. */
static int most_loaded(const struct cluster *c)
{
    int star = 0;
    __int128 star_before = 0;
    for (int s = 0; s < c->n_stages; s++) {
        struct ref_stage r = stage_ref(c, s, c->stages[s].memory_bytes, 1);
        __int128 before = mask_bytes(&r, 0);
        if (s == 0 || before * c->stages[star].memory_bytes >
                          star_before * c->stages[s].memory_bytes) {
            star = s;
            star_before = before;
        }
    }
    return star;
}

static int failures;

static void report(int i, const char *method, const char *what)
{
    if (failures++ < 8)
        fprintf(stderr, "\ncluster %d, %s: %s\n", i, method, what);
}

/* The fixed-choice methods: none, full, block:N, uniform-min. `mask_of(s, n)` is the method's
 * choice for a stage of n layers. */
static void check_fixed(int i, const struct cluster *c, int star, const char *method,
                        int rc, const struct plan *p, int block_n)
{
    int fits = 1;
    for (int s = 0; s < c->n_stages; s++) {
        struct ref_stage r = stage_ref(c, s, c->stages[s].memory_bytes, 1);
        fits = fits && mask_bytes(&r, first_n(block_n, r.n)) <= r.limit_bytes;
    }
    if ((rc == ERR_NOFIT) != !fits)
        report(i, method, "exit 3 differs from brute force");
    CU_ASSERT_EQUAL(rc, fits ? ERR_OK : ERR_NOFIT);
    if (rc != ERR_OK || !fits)
        return;
    check_plan_numbers(c, p, star, c->stages[star].memory_bytes);
    for (int s = 0; s < c->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        int n = plan_stage_layer_count(st);
        CU_ASSERT_EQUAL(ref_mask(ref_plan_choices(st, ch), n), first_n(block_n, n));
    }
}

static int plan_with(const struct cluster *c, const char *method, double reduce, int64_t unit,
                     double time_unit, int verify, struct plan *p, struct err *e)
{
    struct plan_options o;
    plan_options_default(&o);
    err_clear(e);
    CU_ASSERT_FATAL(plan_method_parse(method, &o, e) == ERR_OK);
    o.reduce = reduce;
    o.unit_bytes = unit;
    o.time_unit_ms = time_unit;
    o.verify = verify;
    o.min_gain = 0; /* each stage's least recompute, which the reference is */
    return planner_make(c, &o, p, e);
}

static void test_methods_brute_force(void)
{
    static const int64_t units[] = {1, 7, 1000, 1 << 20};
    struct test_rng rng = {4242};
    int planned[6] = {0}, nofit[6] = {0};
    failures = 0;
    for (int i = 0; i < CLUSTERS; i++) {
        struct cluster c;
        struct plan p;
        struct err e;
        int64_t unit = units[test_rng_int(&rng, 0, 3)];
        random_cluster(&rng, unit, STAGE_LAYERS_MAX, 0, &c);
        int star = most_loaded(&c), S = c.n_stages, longest = 0;
        for (int s = 0; s < S; s++)
            if (c.stages[s].last - c.stages[s].first + 1 > longest)
                longest = c.stages[s].last - c.stages[s].first + 1;

        /* none, full, block:N */
        int block_n = (int)test_rng_int(&rng, 0, longest + 1);
        char name[32];
        const int fixed_n[3] = {0, REF_LAYERS_MAX, block_n};
        for (int k = 0; k < 3; k++) {
            snprintf(name, sizeof name, k == 0 ? "none" : k == 1 ? "full" : "block:%d", block_n);
            int rc = plan_with(&c, name, 0, unit, 1e-3, 0, &p, &e);
            check_fixed(i, &c, star, name, rc, &p, fixed_n[k]);
            rc == ERR_OK ? planned[k]++ : nofit[k]++;
            if (rc == ERR_OK)
                plan_free(&p);
        }

        /* uniform-min: the least N that fits every stage (N fits, N - 1 does not) */
        int least = -1;
        for (int n = 0; n <= longest && least < 0; n++) {
            int all = 1;
            for (int s = 0; s < S; s++) {
                struct ref_stage r = stage_ref(&c, s, c.stages[s].memory_bytes, 1);
                all = all && mask_bytes(&r, first_n(n, r.n)) <= r.limit_bytes;
            }
            if (all)
                least = n;
        }
        int rc = plan_with(&c, "uniform-min", 0, unit, 1e-3, 0, &p, &e);
        if (least < 0) {
            CU_ASSERT_EQUAL(rc, ERR_NOFIT);
            nofit[3]++;
        } else {
            check_fixed(i, &c, star, "uniform-min", rc, &p, least);
            planned[3]++;
            if (rc == ERR_OK)
                plan_free(&p);
        }

        /* optimal: every stage its least recompute in units, ties by least units */
        struct ref_best ref[STAGES_MAX];
        int feasible = 1;
        for (int s = 0; s < S; s++) {
            struct ref_stage r = stage_ref(&c, s, c.stages[s].memory_bytes, unit);
            ref_min_recompute(&r, &ref[s]);
            feasible = feasible && ref[s].feasible;
        }
        int verify = i % 10 == 0;
        rc = plan_with(&c, "optimal", 0, unit, 1e-3, verify, &p, &e);
        if ((rc == ERR_NOFIT) != !feasible)
            report(i, "optimal", "exit 3 differs from brute force");
        CU_ASSERT_EQUAL(rc, feasible ? ERR_OK : ERR_NOFIT);
        if (rc == ERR_OK && feasible) {
            planned[5]++;
            check_plan_numbers(&c, &p, star, c.stages[star].memory_bytes);
            for (int s = 0; s < S; s++) {
                struct ref_stage r = stage_ref(&c, s, c.stages[s].memory_bytes, unit);
                uint64_t m = ref_mask(ref_plan_choices(&p.stages[s], ch), r.n);
                CU_ASSERT(ref_units(&r, m) <= ref_cap(&r));
                CU_ASSERT(test_close(ref_recompute_ms(&r, m), ref[s].recompute_ms, REF_ATOL,
                                     REF_RTOL));
                CU_ASSERT(ref_units(&r, m) <= ref[s].units);
            }
            if (verify)
                CU_ASSERT(p.verify.present && p.verify.agree);
            plan_free(&p);
        } else {
            nofit[5]++;
        }

        /* patent: the most loaded stage (maybe with a reduced limit) its least recompute, the
         * others the closest recompute time in time units, ties by least units */
        double reduce = test_rng_int(&rng, 0, 2) == 0 ? test_rng_double(&rng, 0.3, 1.0) : 0;
        double wanted = test_rng_int(&rng, 0, 1) ? 1e-3 : 0.1, time_unit = wanted;
        for (int s = 0; s < S; s++) {
            struct ref_stage r = stage_ref(&c, s, 1, 1);
            double total = 0;
            for (int l = 0; l < r.n; l++)
                total += r.layers[l].fwd_ms;
            if (total / 2e4 > time_unit)
                time_unit = total / 2e4; /* keeps the balancing tables small */
        }
        int64_t cap_star = c.stages[star].memory_bytes, limit_star = cap_star;
        if (reduce > 0) {
            struct ref_stage r = stage_ref(&c, star, cap_star, 1);
            double d = floor(reduce * (double)mask_bytes(&r, 0));
            if (d < (double)cap_star)
                limit_star = (int64_t)d;
        }
        struct ref_stage rs = stage_ref(&c, star, limit_star, unit);
        ref_min_recompute(&rs, &ref[star]);
        rc = plan_with(&c, "patent", reduce, unit, time_unit, verify, &p, &e);
        feasible = ref[star].feasible;
        for (int s = 0; s < S; s++)
            if (s != star) {
                struct ref_stage r = stage_ref(&c, s, c.stages[s].memory_bytes, unit);
                ref_min_recompute(&r, &ref[s]); /* only its feasibility matters here */
                feasible = feasible && ref[s].feasible;
            }
        if ((rc == ERR_NOFIT) != !feasible)
            report(i, "patent", "exit 3 differs from brute force");
        CU_ASSERT_EQUAL(rc, feasible ? ERR_OK : ERR_NOFIT);
        if (rc != ERR_OK || !feasible) {
            nofit[4]++;
            cluster_free(&c);
            continue;
        }
        planned[4]++;
        check_plan_numbers(&c, &p, star, limit_star);
        uint64_t m = ref_mask(ref_plan_choices(&p.stages[star], ch), rs.n);
        CU_ASSERT(ref_units(&rs, m) <= ref_cap(&rs));
        CU_ASSERT(test_close(ref_recompute_ms(&rs, m), ref[star].recompute_ms, REF_ATOL, REF_RTOL));
        CU_ASSERT(ref_units(&rs, m) <= ref[star].units);
        double target_ms = p.stages[star].recompute_ms;
        for (int s = 0; s < S; s++) {
            if (s == star)
                continue;
            struct ref_stage r = stage_ref(&c, s, c.stages[s].memory_bytes, unit);
            struct knap_problem kp;
            struct ref_best best;
            CU_ASSERT_FATAL(knap_build(&kp, r.layers, r.n, r.in_flight, r.reserve_bytes,
                                       r.limit_bytes, unit, &e) == ERR_OK);
            double tu = knap_balance_time_unit(&kp, time_unit);
            knap_free(&kp);
            int64_t target = llround(target_ms / tu);
            ref_balance(&r, target, tu, &best);
            uint64_t ms = ref_mask(ref_plan_choices(&p.stages[s], ch), r.n);
            int64_t q = 0;
            for (int l = 0; l < r.n; l++)
                if (ms >> l & 1)
                    q += ref_time_units(&r.layers[l], tu);
            int64_t d = q > target ? q - target : target - q;
            if (d != best.distance || ref_units(&r, ms) != best.units)
                report(i, "patent", "a balanced stage differs from brute force");
            CU_ASSERT(ref_units(&r, ms) <= ref_cap(&r));
            CU_ASSERT_EQUAL(d, best.distance);
            CU_ASSERT(ref_units(&r, ms) == best.units);
        }
        if (verify)
            CU_ASSERT(p.verify.present && p.verify.agree);
        plan_free(&p);
        cluster_free(&c);
    }
    fprintf(stderr, "\n  planned / no fit: none %d/%d, full %d/%d, block %d/%d, uniform-min %d/%d, "
                    "patent %d/%d, optimal %d/%d ",
            planned[0], nofit[0], planned[1], nofit[1], planned[2], nofit[2], planned[3], nofit[3],
            planned[4], nofit[4], planned[5], nofit[5]);
    /* both outcomes were exercised for every method */
    for (int k = 0; k < 6; k++)
        CU_ASSERT(planned[k] > CLUSTERS / 50 && nofit[k] > CLUSTERS / 50);
}

/* With recompute options in the profiles: optimal gives every stage its least recompute over
 * every combination of its layers' choices (ties by least units), never a slower iteration
 * than with whole layers only (--whole-layers: the least recompute over every subset), and
 * patent ignores the options. Stages of up to 6 layers of 2 to 4 choices. */
#define OPTION_CLUSTERS 400

static void test_optimal_options(void)
{
    static const int64_t units[] = {1, 7, 1000, 1 << 20};
    struct test_rng rng = {4343};
    int planned = 0, nofit = 0, faster = 0, partial = 0;
    failures = 0;
    for (int i = 0; i < OPTION_CLUSTERS; i++) {
        struct cluster c;
        struct plan p, whole, patent, patent_whole;
        struct err e;
        int64_t unit = units[test_rng_int(&rng, 0, 3)];
        random_cluster(&rng, unit, 6, 2, &c);
        int S = c.n_stages, feasible = 1, verify = i % 10 == 0;
        struct ref_best ref[STAGES_MAX];
        for (int s = 0; s < S; s++) {
            struct ref_stage r = stage_ref(&c, s, c.stages[s].memory_bytes, unit);
            ref_min_recompute_choices(&r, &ref[s]);
            feasible = feasible && ref[s].feasible;
        }
        int rc = plan_with(&c, "optimal", 0, unit, 1e-3, verify, &p, &e);
        if ((rc == ERR_NOFIT) != !feasible)
            report(i, "optimal with options", "exit 3 differs from brute force");
        CU_ASSERT_EQUAL(rc, feasible ? ERR_OK : ERR_NOFIT);
        if (rc != ERR_OK || !feasible) {
            nofit++;
            if (rc == ERR_OK)
                plan_free(&p);
            cluster_free(&c);
            continue;
        }
        planned++;
        check_plan_numbers(&c, &p, most_loaded(&c), c.stages[most_loaded(&c)].memory_bytes);
        for (int s = 0; s < S; s++) {
            struct ref_stage r = stage_ref(&c, s, c.stages[s].memory_bytes, unit);
            const unsigned char *choice = ref_plan_choices(&p.stages[s], ch);
            if (!test_close(ref_choice_ms(&r, choice), ref[s].recompute_ms, REF_ATOL, REF_RTOL) ||
                ref_choice_units(&r, choice) > ref[s].units)
                report(i, "optimal with options", "a stage differs from every combination");
            CU_ASSERT(ref_choice_units(&r, choice) <= ref_cap(&r));
            CU_ASSERT(test_close(ref_choice_ms(&r, choice), ref[s].recompute_ms, REF_ATOL,
                                 REF_RTOL));
            CU_ASSERT(ref_choice_units(&r, choice) <= ref[s].units);
            for (int l = 0; l < r.n; l++)
                partial += choice[l] >= COST_OPTION;
        }
        if (verify)
            CU_ASSERT(p.verify.present && p.verify.agree);
        /* whole layers only: each stage's least recompute over subsets, never faster */
        struct plan_options o;
        plan_options_default(&o);
        o.unit_bytes = unit;
        o.whole_layers = 1;
        o.min_gain = 0;
        err_clear(&e);
        rc = planner_make(&c, &o, &whole, &e);
        CU_ASSERT(rc == ERR_OK || rc == ERR_NOFIT);
        if (rc == ERR_OK) {
            for (int s = 0; s < S; s++) {
                struct ref_stage r = stage_ref(&c, s, c.stages[s].memory_bytes, unit);
                struct ref_best b;
                ref_min_recompute(&r, &b);
                uint64_t m = ref_mask(ref_plan_choices(&whole.stages[s], ch), r.n);
                CU_ASSERT(m < ((uint64_t)1 << r.n));
                for (int l = 0; l < r.n; l++)
                    CU_ASSERT(whole.stages[s].actions[l].choice <= COST_FULL);
                CU_ASSERT(test_close(ref_recompute_ms(&r, m), b.recompute_ms, REF_ATOL, REF_RTOL));
                CU_ASSERT(ref_units(&r, m) <= b.units);
            }
            CU_ASSERT(p.iteration_ms <= whole.iteration_ms * (1 + 1e-12) + 1e-9);
            faster += p.iteration_ms < whole.iteration_ms * (1 - 1e-9);
            plan_free(&whole);
        }
        /* patent recomputes whole layers: the same plan with and without the options */
        double time_unit = 0.01;
        for (int s = 0; s < S; s++) {
            struct ref_stage r = stage_ref(&c, s, 1, 1);
            double total = 0;
            for (int l = 0; l < r.n; l++)
                total += r.layers[l].fwd_ms;
            if (total / 2e4 > time_unit)
                time_unit = total / 2e4; /* keeps the balancing tables small */
        }
        int a = plan_with(&c, "patent", 0, unit, time_unit, 0, &patent, &e);
        for (int k = 0; k < c.n_profiles; k++)
            for (int l = 0; l < c.n_layers; l++)
                c.profiles[k].layers[l].n_options = 0;
        int b = plan_with(&c, "patent", 0, unit, time_unit, 0, &patent_whole, &e);
        CU_ASSERT_EQUAL(a, b);
        if (a == ERR_OK && b == ERR_OK) {
            for (int s = 0; s < S; s++)
                CU_ASSERT(ref_same_actions(&patent.stages[s], &patent_whole.stages[s]));
            plan_free(&patent_whole);
        }
        if (a == ERR_OK)
            plan_free(&patent);
        plan_free(&p);
        cluster_free(&c);
    }
    fprintf(stderr, " [%d planned, %d no fit, %d faster with options, %d layers with an "
                    "option] ",
            planned, nofit, faster, partial);
    CU_ASSERT(planned > OPTION_CLUSTERS / 4 && nofit > OPTION_CLUSTERS / 50);
    CU_ASSERT(faster > OPTION_CLUSTERS / 20 && partial > OPTION_CLUSTERS / 5);
}

/* Options a library caller gets wrong are refused, not divided by. */
static void test_bad_options(void)
{
    struct test_rng rng = {5};
    struct cluster c;
    struct plan p;
    struct err e;
    random_cluster(&rng, 1000, STAGE_LAYERS_MAX, 0, &c);
    CU_ASSERT_EQUAL(plan_with(&c, "optimal", 0, 0, 1e-3, 0, &p, &e), ERR_INPUT);
    CU_ASSERT_EQUAL(plan_with(&c, "patent", 0, 1000, 0, 0, &p, &e), ERR_INPUT);
    CU_ASSERT_EQUAL(plan_with(&c, "patent", 1.5, 1000, 1e-3, 0, &p, &e), ERR_INPUT);
    CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "reduce 1.5"));
    cluster_free(&c);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("methods vs brute force", NULL, NULL);
    CU_add_test(s, "every method on random clusters", test_methods_brute_force);
    CU_add_test(s, "optimal with recompute options", test_optimal_options);
    CU_add_test(s, "bad options", test_bad_options);
    return test_main();
}
