/* Planning speed: a 96-block GPT on 8, 16, 32 and 64 stages of mixed GPUs, every method,
 * the DP alone against the DP with --verify (every stage solved again by GLPK), side by side
 * in one run, repeated; prints medians and the ratio GLPK/DP.
 *
 * The model is 96 blocks 4096 wide (about 19B parameters, bf16, sequence 2048, micro-batch 2).
 * GPT-3 175B itself (12288 wide) cannot hold its weights, gradients and Adam state on 8 or 16
 * stages without tensor parallelism (32.6 GB of state per block), so every method would
 * report "no plan fits" there. At 4096 wide a block's state is 3.6 GB: 12 blocks (43 GB) fit
 * an 80 GB GPU at 8 stages, while what a block keeps for its backward (1.07 GB per
 * micro-batch, 34 MB when recomputed) times the micro-batches in flight (S - s in 1F1B) does
 * not, at 8 stages and at 64 alike: the knapsack must choose on every pipeline size. Stages are
 * A100-80GB, H100-80GB and H200 in contiguous groups (each kind's stages together), with
 * estimated profiles from configs/devices.json; 1F1B with 2S micro-batches, 2 GiB reserved per
 * stage.
 *
 * The timed call is planner_make (in memory: no files read), which includes the simulation
 * of the pipeline that every plan reports.
 *
 * --search: the time of `--method optimal --repartition` on random clusters: random device
 * kinds and counts, layer times varying along the model (plan_speed_search.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "cluster.h"
#include "devices.h"
#include "estimate.h"
#include "planner.h"
#include "plan_speed_search.h"
#include "stats.h"

static const char *const kinds[] = {"A100-80GB", "H100-80GB", "H200"};
#define N_KINDS 3

static const struct model model96 = {.n_layer = 96, .n_embd = 4096, .n_head = 32,
                                     .seq_len = 2048, .vocab_size = 50257, .micro_batch = 2,
                                     .dtype = MODEL_DTYPE_BF16};

/* The cluster of S stages; its profiles are estimated once per device kind. */
static int make_cluster(const struct device_table *t, int S, struct cluster *c, struct err *e)
{
    memset(c, 0, sizeof *c);
    c->schedule = SCHEDULE_1F1B;
    c->micro_batches = 2 * S;
    c->reserve_bytes = (int64_t)2 << 30;
    c->model = model96;
    c->n_layers = model_layer_count(&model96);
    c->n_stages = S;
    c->n_profiles = N_KINDS;
    c->stages = calloc((size_t)S, sizeof *c->stages);
    c->profiles = calloc(N_KINDS, sizeof *c->profiles);
    if (c->stages == NULL || c->profiles == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int k = 0; k < N_KINDS; k++) {
        const struct device_spec *d = devices_find(t, kinds[k]);
        if (d == NULL)
            return err_set(e, ERR_INPUT, "device %s is not in the device table", kinds[k]);
        if (estimate_profile(t, d, &model96, &c->profiles[k], e))
            return e->code;
    }
    for (int s = 0; s < S; s++) {
        struct cluster_stage *st = &c->stages[s];
        st->profile = s * N_KINDS / S;
        snprintf(st->device, sizeof st->device, "%s", kinds[st->profile]);
        st->memory_bytes = c->profiles[st->profile].device.memory_bytes;
        st->host_memory_bytes = (int64_t)128 << 30; /* for optimal+offload; others ignore it */
        st->host_link = c->profiles[st->profile].host_link;
        cluster_even_split(c->n_layers, S, s, &st->first, &st->last);
    }
    return ERR_OK;
}

/* One planning run: its time, and what it gave. */
struct outcome {
    int rc;
    int recomputing; /* stages that recompute something */
    int agree;
    char msg[96];
};

static double plan_once(const struct cluster *c, const char *method, int verify,
                        struct outcome *out)
{
    struct plan_options o;
    struct plan p;
    struct err e;
    plan_options_default(&o);
    err_clear(&e);
    int offload = strcmp(method, "optimal+offload") == 0;
    plan_method_parse(offload ? "optimal" : method, &o, &e);
    o.actions = offload ? PLAN_ACTION_RECOMPUTE | PLAN_ACTION_OFFLOAD : o.actions;
    o.verify = verify;
    double t0 = clock_now_ms();
    out->rc = planner_make(c, &o, &p, &e);
    double ms = clock_now_ms() - t0;
    out->recomputing = 0;
    out->agree = 1;
    out->msg[0] = '\0';
    if (out->rc == ERR_OK) {
        for (int s = 0; s < p.n_stages; s++)
            for (int l = 0; l < plan_stage_layer_count(&p.stages[s]); l++)
                if (p.stages[s].actions[l].choice) {
                    out->recomputing++;
                    break;
                }
        out->agree = !p.verify.present || p.verify.agree;
        plan_free(&p);
    } else {
        snprintf(out->msg, sizeof out->msg, "%.*s", (int)strcspn(e.msg, "\n"), e.msg);
    }
    return ms;
}

/* The command line: 0, or the exit status of a usage error (printed). */
static int parse_speed_args(int argc, char **argv, int *repeat, int *quick, int *search)
{
    *repeat = 21;
    *quick = 0;
    *search = argc > 1 && strcmp(argv[1], "--search") == 0;
    for (int i = 1; i < argc && !*search; i++) {
        if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) {
            *repeat = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--quick") == 0) {
            *quick = 1;
        } else {
            fprintf(stderr, "usage: plan_speed [--repeat N] [--quick]\n"
                            "       plan_speed --search [options] (--search --help)\n"
                            "  --repeat N  runs of each row and column (default 21)\n"
                            "  --quick     8 and 64 stages, 3 runs: a smoke test\n");
            return 2;
        }
    }
    if (*quick)
        *repeat = 3;
    if (*repeat < 1 || *repeat > 10000) {
        fprintf(stderr, "plan_speed: --repeat: expected 1 to 10000\n");
        return 2;
    }
    return 0;
}

/* The methods timed; GLPK checks (--verify) those that solve knapsacks. */
static const struct {
    const char *name;
    int knapsack;
} timed_methods[] = {{"none", 0},   {"full", 0},    {"block:4", 0},        {"uniform-min", 0},
                     {"patent", 1}, {"optimal", 1}, {"optimal+offload", 1}};

/* The row of timed_methods[m] on cluster c of S stages, `repeat` runs into dp and both; 1
 * when its GLPK run failed or disagreed, else 0. */
static int time_method(const struct cluster *c, int S, size_t m, int repeat, double *dp,
                       double *both)
{
    int knapsack = timed_methods[m].knapsack;
    struct outcome a, b = {0};
    /* side by side: the DP and the DP checked by GLPK alternate, run after run */
    for (int r = 0; r < repeat; r++) {
        dp[r] = plan_once(c, timed_methods[m].name, 0, &a);
        if (knapsack)
            both[r] = plan_once(c, timed_methods[m].name, 1, &b);
    }
    char result[64];
    if (a.rc == ERR_OK)
        snprintf(result, sizeof result, "%d/%d recompute", a.recomputing, S);
    else
        snprintf(result, sizeof result, "exit %d (%s)", a.rc,
                 a.rc == ERR_NOFIT ? "no fit" : "error");
    double dp_min = dp[0];
    for (int r = 1; r < repeat; r++)
        dp_min = dp[r] < dp_min ? dp[r] : dp_min;
    double dp_med = stats_median(dp, repeat);
    if (!knapsack) {
        printf("%6d  %-12s %-22s %10.3f %10.3f %14s %8s\n", S, timed_methods[m].name, result,
               dp_med, dp_min, "-", "-");
        return 0;
    }
    double both_med = stats_median(both, repeat);
    printf("%6d  %-12s %-22s %10.3f %10.3f %14.3f %8.1f%s\n", S, timed_methods[m].name, result,
           dp_med, dp_min, both_med, both_med / dp_med,
           b.rc != ERR_OK ? "  (GLPK run failed)" : b.agree ? "" : "  DISAGREE");
    if (b.rc != ERR_OK && b.msg[0])
        printf("        %s\n", b.msg);
    return b.rc != a.rc || !b.agree;
}

/* The table: every method on each pipeline size (8 and 64 when quick). 0; 1 when a GLPK run
 * failed or disagreed; an error's status. */
static int time_sizes(const struct device_table *t, int repeat, int quick)
{
    static const int sizes[] = {8, 16, 32, 64};
    printf("plan_speed: GPT 96 blocks x 4096 (bf16, seq 2048, micro-batch 2) on A100-80GB | "
           "H100-80GB | H200 stages, 1F1B, M = 2S; planner_make in memory; %d runs each, "
           "medians in ms\n\n",
           repeat);
    printf("%6s  %-12s %-22s %10s %10s %14s %8s\n", "stages", "method", "result", "DP ms",
           "DP min", "DP+GLPK ms", "GLPK/DP");
    double *dp = malloc((size_t)repeat * sizeof *dp), *both = malloc((size_t)repeat * sizeof *both);
    struct err e;
    err_clear(&e);
    int rc = 0;
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
        int S = sizes[z];
        if (quick && S != 8 && S != 64)
            continue;
        struct cluster c;
        if (make_cluster(t, S, &c, &e)) {
            fprintf(stderr, "plan_speed: %s\n", e.msg);
            rc = e.code;
            cluster_free(&c);
            break;
        }
        for (size_t m = 0; m < sizeof timed_methods / sizeof timed_methods[0]; m++)
            if (time_method(&c, S, m, repeat, dp, both))
                rc = 1;
        cluster_free(&c);
    }
    free(dp);
    free(both);
    return rc;
}

int main(int argc, char **argv)
{
    int repeat, quick, search;
    int status = parse_speed_args(argc, argv, &repeat, &quick, &search);
    if (status)
        return status;
    struct device_table t;
    struct err e;
    err_clear(&e);
    if (devices_load(devices_default_file(), &t, &e)) {
        fprintf(stderr, "plan_speed: %s\n", e.msg);
        return e.code;
    }
    status = search ? search_bench_main(argc - 1, argv + 1, &t) : time_sizes(&t, repeat, quick);
    devices_free(&t);
    return status;
}
