/* The activation arena's layouts side by side (not a test: it measures and prints).
 *
 * For every GPU cluster of configs/clusters, every model (gpt-1.3b, gpt-13b, gpt-175b by
 * default; profiles estimated per device where the cluster's are for another model, as
 * `ballast bench` does) and every recompute method that fits, each stage's arena is laid out
 * by slots (today's carving), greedy, ga and exact, in the same run. Per method: arena / lower
 * bound and the solve time; where exact proves its layout optimal, the gaps of greedy, ga and
 * slots to it; and what today's carving costs against the best layout found. One CSV line
 * per stage goes to --csv.
 *
 *   build/bench/arena_bench [--models a,b] [--clusters DIR] [--ga-time S] [--exact-time S]
 *                           [--csv FILE] */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena_plan.h"
#include "bench.h"
#include "cluster.h"
#include "cost.h"
#include "devices.h"
#include "planner.h"

enum { SLOTS, GREEDY, GA, EXACT, N_LAYOUTS };
static const char *const layouts[N_LAYOUTS] = {"slots", "greedy", "ga", "exact"};
static const char *const recomputes[] = {"none", "full", "uniform-min", "patent", "optimal"};
#define N_RECOMPUTES 5

struct tally {
    int stages;
    double ratio_sum, ratio_max, ms_sum, ms_max;
};

struct totals {
    struct tally by[N_LAYOUTS];
    int proven, exact_tried, improved_by_ga;
    double gap_sum[N_LAYOUTS], gap_max[N_LAYOUTS]; /* against a proven exact */
    double slots_over_best_sum, slots_over_best_max;
    int slots_above_best;
    /* a device cap at 90% of the lower bound: bytes that must go to host, / lower bound */
    double host_sum[N_LAYOUTS];
    int ga_less_host;
};

struct args {
    const char *models, *clusters, *csv;
    double ga_time, exact_time;
};

static void tally_add(struct tally *t, double ratio, double ms)
{
    t->stages++;
    t->ratio_sum += ratio;
    t->ratio_max = ratio > t->ratio_max ? ratio : t->ratio_max;
    t->ms_sum += ms;
    t->ms_max = ms > t->ms_max ? ms : t->ms_max;
}

/* With a device cap at 90% of the lower bound: the bytes above it for slots, greedy and ga
 * (which optimises them first). */
static void capped(const struct arena_object *o, int n, int in_flight, const struct args *a,
                   int64_t lb, struct totals *t, struct err *e)
{
    int64_t host[EXACT];
    for (int k = 0; k < EXACT; k++) {
        struct arena_options opt;
        arena_options_default(&opt);
        snprintf(opt.method, sizeof opt.method, "%s", layouts[k]);
        opt.time_limit_s = a->ga_time;
        opt.cap_bytes = lb - lb / 10;
        struct arena_object *copy = malloc(sizeof *copy * (size_t)(n + 1));
        struct arena ar;
        struct arena_result r;
        if (copy == NULL)
            return;
        memcpy(copy, o, sizeof *copy * (size_t)n);
        host[k] = arena_layout(copy, n, in_flight, &opt, &ar, &r, e) ? -1 : ar.host_bytes;
        arena_free(&ar);
        err_clear(e);
        t->host_sum[k] += lb ? (double)host[k] / (double)lb : 0;
    }
    t->ga_less_host += host[GA] < host[GREEDY];
}

/* Every layout of stage s of p; one CSV line. */
static int bench_stage(const struct plan *p, int s, const struct args *a, const char *label,
                       FILE *csv, struct totals *t, struct err *e)
{
    struct arena_object *o;
    int n;
    ERR_TRY(arena_stage_objects(p, s, &o, &n, e));
    int64_t bytes[N_LAYOUTS], lb = 0;
    double ms[N_LAYOUTS];
    int proven = 0;
    for (int k = 0; k < N_LAYOUTS; k++) {
        struct arena_options opt;
        arena_options_default(&opt);
        snprintf(opt.method, sizeof opt.method, "%s", layouts[k]);
        opt.time_limit_s = k == EXACT ? a->exact_time : a->ga_time;
        struct arena_object *copy = malloc(sizeof *copy * (size_t)(n + 1));
        if (copy == NULL) {
            free(o);
            return err_set(e, ERR_FAIL, "out of memory");
        }
        memcpy(copy, o, sizeof *copy * (size_t)n);
        struct arena ar;
        struct arena_result r;
        if (arena_layout(copy, n, p->stages[s].in_flight, &opt, &ar, &r, e)) {
            arena_free(&ar);
            free(o);
            return e->code;
        }
        bytes[k] = ar.bytes;
        ms[k] = ar.solve_ms;
        lb = ar.lower_bound_bytes;
        proven = k == EXACT ? ar.proven : proven;
        arena_free(&ar);
    }
    capped(o, n, p->stages[s].in_flight, a, lb, t, e);
    free(o);
    int64_t best = bytes[GREEDY];
    for (int k = 0; k < N_LAYOUTS; k++) {
        tally_add(&t->by[k], lb ? (double)bytes[k] / (double)lb : 1.0, ms[k]);
        best = k != SLOTS && bytes[k] < best ? bytes[k] : best;
    }
    t->exact_tried++;
    t->proven += proven;
    t->improved_by_ga += bytes[GA] < bytes[GREEDY];
    for (int k = 0; proven && k < N_LAYOUTS; k++) {
        double gap = (double)(bytes[k] - bytes[EXACT]) / (double)bytes[EXACT];
        t->gap_sum[k] += gap;
        t->gap_max[k] = gap > t->gap_max[k] ? gap : t->gap_max[k];
    }
    double over = (double)(bytes[SLOTS] - best) / (double)best;
    t->slots_over_best_sum += over;
    t->slots_over_best_max = over > t->slots_over_best_max ? over : t->slots_over_best_max;
    t->slots_above_best += bytes[SLOTS] > best;
    if (csv != NULL)
        fprintf(csv, "%s,%d,%d,%lld,%lld,%lld,%lld,%lld,%d,%.3f,%.3f,%.3f,%.3f\n", label, s, n,
                (long long)lb, (long long)bytes[SLOTS], (long long)bytes[GREEDY],
                (long long)bytes[GA], (long long)bytes[EXACT], proven, ms[SLOTS], ms[GREEDY],
                ms[GA], ms[EXACT]);
    return ERR_OK;
}

/* Every recompute method on one cluster with one model. */
static int bench_case(const struct cluster *c, const char *name, const char *model,
                      const struct args *a, FILE *csv, struct totals *t, struct err *e)
{
    for (int r = 0; r < N_RECOMPUTES; r++) {
        struct plan_options o;
        struct plan p;
        plan_options_default(&o);
        ERR_TRY(plan_method_parse(recomputes[r], &o, e));
        int rc = planner_make(c, &o, &p, e);
        if (rc == ERR_NOFIT) {
            err_clear(e);
            continue;
        }
        if (rc)
            return rc;
        char label[256];
        snprintf(label, sizeof label, "%s,%s,%s", name, model, recomputes[r]);
        for (int s = 0; s < p.n_stages && rc == ERR_OK; s++)
            rc = bench_stage(&p, s, a, label, csv, t, e);
        plan_free(&p);
        if (rc)
            return rc;
        fprintf(stderr, ".");
    }
    return ERR_OK;
}

static int gpu_cluster(const struct cluster *c)
{
    for (int s = 0; s < c->n_stages; s++)
        if (strcmp(cluster_stage_profile(c, s)->device.kind, "cpu") == 0)
            return 0;
    return 1;
}

/* Every cluster file of the folder with every model. */
static int bench_all(const struct args *a, const struct device_table *dt, FILE *csv,
                     struct totals *t, struct err *e)
{
    struct dirent **list;
    int nf = scandir(a->clusters, &list, NULL, alphasort);
    if (nf < 0)
        return err_set(e, ERR_INPUT, "--clusters: cannot read %s", a->clusters);
    char models[1024];
    int rc = ERR_OK;
    for (int f = 0; f < nf; f++) {
        const char *fn = list[f]->d_name;
        size_t len = strlen(fn);
        char file[2048];
        struct cluster c;
        snprintf(file, sizeof file, "%s/%s", a->clusters, fn);
        if (rc || len < 6 || strcmp(fn + len - 5, ".json") != 0 || cluster_load(file, &c, e)) {
            err_clear(e);
            free(list[f]);
            continue;
        }
        snprintf(models, sizeof models, "%s", a->models);
        for (char *m = strtok(models, ","); m && rc == ERR_OK && gpu_cluster(&c);
             m = strtok(NULL, ",")) {
            char path[1024], note[BENCH_NOTE_MAX];
            struct model model;
            struct cluster mc;
            snprintf(path, sizeof path, "%s/configs/models/%s.json", BALLAST_SOURCE_DIR, m);
            if ((rc = model_load(path, &model, e)) != ERR_OK)
                break;
            int fit = bench_cluster_for_model(&c, &model, dt, &mc, note, e);
            if (fit == ERR_NOFIT) {
                err_clear(e);
                continue;
            }
            if ((rc = fit) == ERR_OK) {
                fprintf(stderr, "%s %s ", fn, m);
                rc = bench_case(&mc, fn, m, a, csv, t, e);
                fprintf(stderr, "\n");
                cluster_free(&mc);
            }
        }
        cluster_free(&c);
        free(list[f]);
    }
    free(list);
    return rc;
}

static void print_totals(const struct totals *t, const struct args *a)
{
    printf("\n| layout | stages | arena / lower bound: mean | max | solve ms: mean | max |\n"
           "|---|---|---|---|---|---|\n");
    for (int k = 0; k < N_LAYOUTS; k++) {
        const struct tally *b = &t->by[k];
        printf("| %s | %d | %.4f | %.4f | %.2f | %.1f |\n", layouts[k], b->stages,
               b->stages ? b->ratio_sum / b->stages : 0, b->ratio_max,
               b->stages ? b->ms_sum / b->stages : 0, b->ms_max);
    }
    printf("\nexact proved %d of %d stages optimal (time limit %g s); ga beat greedy on %d; "
           "ga limits: %g s\n", t->proven, t->exact_tried, a->exact_time, t->improved_by_ga,
           a->ga_time);
    printf("gaps to a proven exact (mean, max):");
    for (int k = 0; k < EXACT; k++)
        printf("  %s %.4f%% %.4f%%", layouts[k],
               t->proven ? 100 * t->gap_sum[k] / t->proven : 0, 100 * t->gap_max[k]);
    printf("\nwith a device cap at 90%% of the lower bound, bytes to host / lower bound (mean): "
           "slots %.4f, greedy %.4f, ga %.4f; ga sends less than greedy on %d stages\n",
           t->host_sum[SLOTS] / (t->exact_tried ? t->exact_tried : 1),
           t->host_sum[GREEDY] / (t->exact_tried ? t->exact_tried : 1),
           t->host_sum[GA] / (t->exact_tried ? t->exact_tried : 1), t->ga_less_host);
    printf("today's carving (slots) above the best layout found: %d of %d stages, mean "
           "%.4f%%, max %.4f%%\n", t->slots_above_best, t->exact_tried,
           t->exact_tried ? 100 * t->slots_over_best_sum / t->exact_tried : 0,
           100 * t->slots_over_best_max);
}

static int parse_bench_args(int argc, char **argv, struct args *a)
{
    *a = (struct args){"gpt-1.3b,gpt-13b,gpt-175b", BALLAST_SOURCE_DIR "/configs/clusters", NULL,
                       0.5, 2};
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v != NULL && strcmp(argv[i], "--models") == 0)
            a->models = v;
        else if (v != NULL && strcmp(argv[i], "--clusters") == 0)
            a->clusters = v;
        else if (v != NULL && strcmp(argv[i], "--csv") == 0)
            a->csv = v;
        else if (v != NULL && strcmp(argv[i], "--ga-time") == 0 && atof(v) > 0)
            a->ga_time = atof(v);
        else if (v != NULL && strcmp(argv[i], "--exact-time") == 0 && atof(v) > 0)
            a->exact_time = atof(v);
        else {
            fprintf(stderr, "arena_bench: bad option \"%s\"\nusage: arena_bench [--models a,b] "
                    "[--clusters DIR] [--ga-time S] [--exact-time S] [--csv FILE]\n", argv[i]);
            return ERR_INPUT;
        }
    }
    return ERR_OK;
}

int main(int argc, char **argv)
{
    struct args a;
    struct err e;
    err_clear(&e);
    if (parse_bench_args(argc, argv, &a))
        return ERR_INPUT;
    struct device_table dt = {0};
    if (devices_load(devices_default_file(), &dt, &e)) {
        fprintf(stderr, "arena_bench: %s\n", e.msg);
        return e.code;
    }
    FILE *csv = a.csv ? fopen(a.csv, "w") : NULL;
    if (a.csv && csv == NULL) {
        fprintf(stderr, "arena_bench: cannot write %s\n", a.csv);
        devices_free(&dt);
        return ERR_INPUT;
    }
    if (csv)
        fprintf(csv, "cluster,model,recompute,stage,objects,lower_bound,slots,greedy,ga,exact,"
                "proven,slots_ms,greedy_ms,ga_ms,exact_ms\n");
    struct totals t = {0};
    int rc = bench_all(&a, &dt, csv, &t, &e);
    if (csv)
        fclose(csv);
    devices_free(&dt);
    if (rc) {
        fprintf(stderr, "arena_bench: %s\n", e.msg);
        return rc;
    }
    print_totals(&t, &a);
    return ERR_OK;
}
