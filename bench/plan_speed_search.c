/* plan_speed --search: `--method optimal --repartition` on random clusters, not only on the
 * shipped ones it was tuned on (issue 11, "Search time").
 *
 * Each instance: a GPT of 8192 width (the shipped GPT-76B's blocks: 14.5 GB of state, 1 GB
 * kept per micro-batch) or of 4096 (a quarter of the state: more layers fit a stage, so far
 * more splits do), 1.5 S blocks (98 layers at 64 stages, 194 at 128), bf16, sequence
 * 2048, micro-batch 1; K = 2..4 device kinds drawn from five GPUs, in equal groups or random
 * counts (each at least S/8), in a random order; nodes of 8 on NVLink, InfiniBand between
 * them; 1F1B with M = 2S unless --micro-batches. Profiles are estimated per kind, then every
 * block's times (forward, backward, recompute options) are scaled by one factor that varies
 * along the model, a slow wave times a ramp, the same on every kind: real models are not
 * uniform (wider blocks, MoE layers, attention windows). Instances no arrangement fits are
 * counted and skipped. Prints one row per instance (its CPU seconds) and the medians per size. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster.h"
#include "devices.h"
#include "estimate.h"
#include "planner.h"
#include "plan_speed_search.h"

static const char *const gpus[] = {"A100-40GB", "A100-80GB", "H100-80GB", "H200", "V100-32GB"};
#define N_GPUS 5
#define KINDS_MAX 4

struct rng {
    uint64_t s;
};

static uint64_t rng_next(struct rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_double(struct rng *r, double lo, double hi)
{
    return lo + (hi - lo) * (double)(rng_next(r) >> 11) / 9007199254740992.0;
}

static int rng_int(struct rng *r, int lo, int hi)
{
    return lo + (int)(rng_next(r) % (uint64_t)(hi - lo + 1));
}

/* Scales every block's times by the instance's factor along the model. */
static void vary_along_model(struct profile *p, double amp, double freq, double phase, double ramp)
{
    int n = p->n_layers;
    for (int l = 1; l + 1 < n; l++) {
        double x = (double)l / n;
        double f = exp(amp * sin(2 * M_PI * freq * x + phase) + ramp * (x - 0.5));
        struct layer_cost *lc = &p->layers[l];
        lc->fwd_ms *= f;
        lc->bwd_ms *= f;
        for (int k = 0; k < lc->n_options; k++)
            lc->options[k].recompute_ms *= f;
    }
}

/* Stage counts of K kinds adding up to S, each at least S/8. */
static void kind_counts(struct rng *r, int S, int K, int equal, int *count)
{
    int floor_count = S / 8 > 1 ? S / 8 : 1, left = S - K * floor_count;
    for (int k = 0; k < K; k++)
        count[k] = equal ? S / K + (k < S % K) : floor_count;
    for (; !equal && left > 0; left--)
        count[rng_int(r, 0, K - 1)]++;
}

static int random_cluster(const struct device_table *t, struct rng *r, int S, int M,
                          struct cluster *c, char *what, size_t what_size, struct err *e)
{
    int K = rng_int(r, 2, KINDS_MAX), equal = rng_int(r, 0, 1), picked[N_GPUS], count[KINDS_MAX];
    for (int g = 0; g < N_GPUS; g++)
        picked[g] = g;
    for (int g = 0; g < K; g++) { /* the first K of a random shuffle, in that order */
        int j = rng_int(r, g, N_GPUS - 1), tmp = picked[g];
        picked[g] = picked[j];
        picked[j] = tmp;
    }
    kind_counts(r, S, K, equal, count);
    double amp = rng_double(r, 0, 0.4), freq = rng_double(r, 0.5, 3);
    double phase = rng_double(r, 0, 2 * M_PI), ramp = rng_double(r, -0.6, 0.6);
    int width = rng_int(r, 0, 1) ? 8192 : 4096;
    memset(c, 0, sizeof *c);
    c->schedule = SCHEDULE_1F1B;
    c->micro_batches = M > 0 ? M : 2 * S;
    c->reserve_bytes = (int64_t)2 << 30;
    c->model = (struct model){.n_layer = 3 * S / 2, .n_embd = width, .n_head = width / 128,
                              .seq_len = 2048, .vocab_size = 50257, .micro_batch = 1,
                              .dtype = MODEL_DTYPE_BF16};
    c->n_layers = model_layer_count(&c->model);
    c->n_stages = S;
    c->n_profiles = K;
    c->link = (struct link){1, 400, 5};
    c->stages = calloc((size_t)S, sizeof *c->stages);
    c->profiles = calloc((size_t)K, sizeof *c->profiles);
    if (c->stages == NULL || c->profiles == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    size_t used = (size_t)snprintf(what, what_size, "w%d ", width);
    for (int k = 0, s = 0; k < K; k++) {
        const struct device_spec *d = devices_find(t, gpus[picked[k]]);
        if (d == NULL)
            return err_set(e, ERR_INPUT, "device %s is not in the device table", gpus[picked[k]]);
        if (estimate_profile(t, d, &c->model, &c->profiles[k], e))
            return e->code;
        vary_along_model(&c->profiles[k], amp, freq, phase, ramp);
        used += (size_t)snprintf(what + used, what_size - used, "%s%dx%s", k ? "+" : "",
                                 count[k], gpus[picked[k]]);
        for (int q = 0; q < count[k]; q++, s++) {
            struct cluster_stage *st = &c->stages[s];
            st->profile = k;
            snprintf(st->device, sizeof st->device, "%s", gpus[picked[k]]);
            st->memory_bytes = d->memory_bytes;
            if (s % 8 != 7)
                st->link = (struct link){1, 2400, 3};
            cluster_even_split(c->n_layers, S, s, &st->first, &st->last);
        }
    }
    return ERR_OK;
}

/* The process's CPU time: the search runs on one thread, and on a shared machine its wall
 * time measures the other jobs. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double median_of(double *v, int n)
{
    return n > 0 ? plan_speed_median(v, n) : NAN;
}

struct search_args {
    int sizes[8], n_sizes, instances, first, M;
    uint64_t seed;
    double time_limit_s, gap;
    long nodes;
};

static int parse_args(int argc, char **argv, struct search_args *a)
{
    *a = (struct search_args){.sizes = {64, 128}, .n_sizes = 2, .instances = 7, .seed = 11,
                              .gap = -1};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--sizes") == 0 && v) {
            a->n_sizes = 0;
            for (char *p = argv[++i]; *p && a->n_sizes < 8;) {
                a->sizes[a->n_sizes++] = (int)strtol(p, &p, 10);
                p += *p == ',';
            }
        } else if (strcmp(argv[i], "--instances") == 0 && v) {
            a->instances = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--first") == 0 && v) {
            a->first = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--micro-batches") == 0 && v) {
            a->M = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--seed") == 0 && v) {
            a->seed = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--time-limit") == 0 && v) {
            a->time_limit_s = atof(argv[++i]);
        } else if (strcmp(argv[i], "--search-gap") == 0 && v) {
            a->gap = atof(argv[++i]);
        } else if (strcmp(argv[i], "--search-nodes") == 0 && v) {
            a->nodes = atol(argv[++i]);
        } else {
            fprintf(stderr,
                    "usage: plan_speed --search [--sizes 64,128] [--instances N] [--first I]\n"
                    "                  [--seed N] [--micro-batches M] [--time-limit S]\n"
                    "                  [--search-nodes N] [--search-gap G]\n"
                    "  random clusters per size (stages), timed with --method optimal "
                    "--repartition\n");
            return 2;
        }
    }
    for (int z = 0; z < a->n_sizes; z++)
        if (a->sizes[z] < 8 || a->sizes[z] > 1024)
            return fprintf(stderr, "plan_speed: --sizes: 8 to 1024 stages\n"), 2;
    return a->instances >= 1 && a->first >= 0 && a->M >= 0 ? 0 : (fprintf(stderr, "plan_speed: bad count\n"), 2);
}

/* One instance: plans it, prints its row; *secs and *gap get its time and certified gap. */
static int run_instance(const struct device_table *t, const struct search_args *a, int S,
                        int i, double *secs, double *gap)
{
    struct rng r = {a->seed * 1000003u + (uint64_t)S * 1009u + (uint64_t)i};
    struct cluster c;
    struct plan_options o;
    struct plan p;
    struct err e;
    char what[160] = "";
    err_clear(&e);
    plan_options_default(&o);
    o.repartition = 1;
    if (a->nodes > 0)
        o.search_nodes = a->nodes;
    o.time_limit_s = a->time_limit_s;
    if (a->gap >= 0)
        o.search_gap = a->gap;
    int rc = random_cluster(t, &r, S, a->M, &c, what, sizeof what, &e);
    double t0 = cpu_s();
    if (rc == ERR_OK)
        rc = planner_make(&c, &o, &p, &e);
    *secs = cpu_s() - t0;
    printf("%6d %4d %6d  %-50s", S, c.n_layers, c.micro_batches, what);
    cluster_free(&c);
    if (rc) {
        printf(" exit %d (%.*s)\n", rc, 60, e.msg);
        return rc;
    }
    *gap = p.optimality_gap;
    printf(" %9.3f %8.3f%% %8ld %6ld %12.3f %12.3f %s\n", *secs, 100 * p.optimality_gap,
           p.search.nodes, p.search.splits, p.iteration_ms, p.search.lower_bound,
           p.search.exhausted ? "exhausted" : "stopped");
    plan_free(&p);
    return ERR_OK;
}

int search_bench_main(int argc, char **argv, const struct device_table *t)
{
    struct search_args a;
    if (parse_args(argc, argv, &a))
        return 2;
    printf("plan_speed --search: --method optimal --repartition on %d random clusters per size, "
           "seed %llu\n%6s %4s %6s  %-50s %9s %9s %8s %6s %12s %12s\n",
           a.instances, (unsigned long long)a.seed, "stages", "N", "M", "kinds", "cpu s",
           "gap", "nodes", "sims", "plan ms", "bound ms");
    double *secs = malloc((size_t)a.instances * sizeof *secs);
    double *gaps = malloc((size_t)a.instances * sizeof *gaps);
    int rc = secs && gaps ? 0 : 1;
    for (int z = 0; z < a.n_sizes && rc == 0; z++) {
        int n = 0, nofit = 0;
        double worst_s = 0, worst_gap = 0;
        for (int i = 0; i < a.instances; i++) {
            int r = run_instance(t, &a, a.sizes[z], a.first + i, &secs[n], &gaps[n]);
            if (r == ERR_NOFIT) {
                nofit++;
                continue;
            }
            if (r) {
                rc = r;
                break;
            }
            worst_s = secs[n] > worst_s ? secs[n] : worst_s;
            worst_gap = gaps[n] > worst_gap ? gaps[n] : worst_gap;
            n++;
        }
        printf("%d stages: %d planned (%d fit none): median %.3f cpu s (worst %.3f), median gap "
               "%.3f%% (worst %.3f%%)\n",
               a.sizes[z], n, nofit, median_of(secs, n), worst_s, 100 * median_of(gaps, n),
               100 * worst_gap);
    }
    free(secs);
    free(gaps);
    return rc;
}
