/* The files of a bench run: tables (CSV, Markdown) and gnuplot scripts with their data, run
 * to make the PNGs. Each script reads only files next to it, so `cd DIR && gnuplot X.gp`
 * redraws a plot. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "sim.h"
#include "trace.h"

#define GIB 1073741824.0

static int open_out(const char *dir, const char *name, FILE **f, struct err *e)
{
    char path[CLUSTER_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *f = fopen(path, "w");
    if (*f == NULL)
        return err_set(e, ERR_FAIL, "%s: cannot create: %s", path, strerror(errno));
    return ERR_OK;
}

static int close_out(const char *dir, const char *name, FILE *f, struct err *e)
{
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return err_set(e, ERR_FAIL, "%s/%s: cannot write: %s", dir, name, strerror(errno));
    return ERR_OK;
}

/* A plot's data file and gnuplot script, both open or neither. */
static int open_plot(const char *dir, const char *data, FILE **d, const char *script, FILE **g,
                     struct err *e)
{
    if (open_out(dir, data, d, e))
        return e->code;
    if (open_out(dir, script, g, e)) {
        fclose(*d);
        return e->code;
    }
    return ERR_OK;
}

/* Closes both (the script unwritten when the data fails). */
static int close_plot(const char *dir, const char *data, FILE *d, const char *script, FILE *g,
                      struct err *e)
{
    if (close_out(dir, data, d, e)) {
        fclose(g);
        return e->code;
    }
    return close_out(dir, script, g, e);
}

static const char *status_name(const struct bench_case *k, int m)
{
    return !k->runnable ? "cannot run" : k->method[m].fits ? "ok" : "does not fit";
}

/* ref / this when both fit, else NaN (a speed-up of this method over ref) */
static double speedup(const struct bench_case *k, int m, int ref)
{
    if (!k->runnable || !k->method[m].fits || !k->method[ref].fits)
        return NAN;
    return k->method[ref].iteration_ms / k->method[m].iteration_ms;
}

/* Cases drawn in the iteration plot: those where full recomputation fits (the reference). */
static int plotted(const struct bench_case *k)
{
    return k->runnable && k->method[BENCH_FULL].fits;
}

static int count_plotted(const struct bench_case *cases, int n)
{
    int c = 0;
    for (int i = 0; i < n; i++)
        c += plotted(&cases[i]);
    return c;
}

static void csv_text(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void csv_num(FILE *f, double v, const char *fmt)
{
    fputc(',', f);
    if (!isnan(v))
        fprintf(f, fmt, v);
}

int bench_write_csv(const char *dir, const struct bench_case *cases, int n, struct err *e)
{
    FILE *f;
    if (open_out(dir, "results.csv", &f, e))
        return e->code;
    fprintf(f, "cluster,model,stages,micro_batches,schedule,profiles,method,status,iteration_ms,"
               "bubble_fraction,speedup_vs_full,speedup_vs_uniform_min,max_memory_fraction,"
               "plan_ms,note,older_gpus,older_work_share,older_busy_share,"
               "gpus_without_block\n");
    for (int i = 0; i < n; i++) {
        const struct bench_case *k = &cases[i];
        for (int m = 0; m < BENCH_METHODS; m++) {
            const struct bench_result *r = &k->method[m];
            int ok = k->runnable && r->fits;
            double most = NAN;
            for (int s = 0; ok && s < k->n_stages; s++) {
                double frac = (double)r->memory_bytes[s] / (double)r->limit_bytes[s];
                most = isnan(most) || frac > most ? frac : most;
            }
            fprintf(f, "%s,%s,%d,%d,%s,%s,%s,%s", k->cluster, k->model, k->n_stages,
                    k->micro_batches, schedule_name(k->schedule),
                    k->estimated ? "estimated" : "cluster", bench_method_names[m],
                    status_name(k, m));
            csv_num(f, ok ? r->iteration_ms : NAN, "%.3f");
            csv_num(f, ok ? r->bubble_fraction : NAN, "%.4f");
            csv_num(f, speedup(k, m, BENCH_FULL), "%.4f");
            csv_num(f, speedup(k, m, BENCH_UNIFORM_MIN), "%.4f");
            csv_num(f, most, "%.4f");
            csv_num(f, k->runnable ? r->plan_ms : NAN, "%.3f");
            fputc(',', f);
            csv_text(f, k->note);
            fprintf(f, ",%d", k->n_older);
            csv_num(f, ok ? r->older_work : NAN, "%.4f");
            csv_num(f, ok ? r->older_busy : NAN, "%.4f");
            if (ok)
                fprintf(f, ",%d", r->blockless);
            else
                fputc(',', f);
            fputc('\n', f);
        }
    }
    if (close_out(dir, "results.csv", f, e) || open_out(dir, "memory.csv", &f, e))
        return e->code;
    fprintf(f, "cluster,model,method,stage,device,memory_limit_bytes,memory_before_bytes,"
               "memory_bytes,recompute_ms\n");
    for (int i = 0; i < n; i++) {
        const struct bench_case *k = &cases[i];
        for (int m = 0; k->runnable && m < BENCH_METHODS; m++)
            for (int s = 0; k->method[m].fits && s < k->n_stages; s++)
                /* before: with nothing recomputed at this position, for the cluster's own
                 * order and split (repartitioned plans put other stages there) */
                fprintf(f, "%s,%s,%s,%d,%s,%lld,%lld,%lld,%.6f\n", k->cluster, k->model,
                        bench_method_names[m], s, k->method[m].devices[s],
                        (long long)k->method[m].limit_bytes[s],
                        (long long)k->before_bytes[s], (long long)k->method[m].memory_bytes[s],
                        k->method[m].recompute_ms[s]);
    }
    return close_out(dir, "memory.csv", f, e);
}

/* The fastest fitting method of a case, -1 if none fits. */
static int fastest(const struct bench_case *k)
{
    int best = -1;
    for (int m = 0; k->runnable && m < BENCH_METHODS; m++)
        if (k->method[m].fits &&
            (best < 0 || k->method[m].iteration_ms < k->method[best].iteration_ms))
            best = m;
    return best;
}

static void md_ratio(FILE *f, double v)
{
    if (isnan(v))
        fprintf(f, " - |");
    else
        fprintf(f, " %.3fx |", v);
}

/* One table per model: a row per cluster, iteration ms per method (the fastest in bold), and
 * optimal's speed-ups. */
static void md_tables(FILE *f, const struct bench_case *cases, int n)
{
    for (int i = 0; i < n; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++)
            first = strcmp(cases[j].model, cases[i].model) != 0;
        if (!first)
            continue;
        fprintf(f, "\n### %s\n\n| cluster | stages | micro-batches |", cases[i].model);
        for (int m = 0; m < BENCH_METHODS; m++)
            fprintf(f, " %s |", bench_method_names[m]);
        fprintf(f, " optimal vs full | vs uniform-min | vs patent | optimal+repartition vs full "
                   "| vs uniform-min | vs patent | vs optimal | repartition planning ms |\n"
                   "|---|---:|---:|");
        for (int m = 0; m < BENCH_METHODS + 8; m++)
            fprintf(f, "---:|");
        fprintf(f, "\n");
        for (int j = i; j < n; j++) {
            const struct bench_case *k = &cases[j];
            if (strcmp(k->model, cases[i].model) != 0)
                continue;
            fprintf(f, "| %s%s | %d | %d |", k->cluster, k->note[0] ? " *" : "", k->n_stages,
                    k->micro_batches);
            int best = fastest(k);
            for (int m = 0; m < BENCH_METHODS; m++) {
                if (!k->runnable)
                    fprintf(f, " cannot run |");
                else if (!k->method[m].fits)
                    fprintf(f, " does not fit |");
                else
                    fprintf(f, m == best ? " **%.1f** |" : " %.1f |", k->method[m].iteration_ms);
            }
            md_ratio(f, speedup(k, BENCH_OPTIMAL, BENCH_FULL));
            md_ratio(f, speedup(k, BENCH_OPTIMAL, BENCH_UNIFORM_MIN));
            md_ratio(f, speedup(k, BENCH_OPTIMAL, BENCH_PATENT));
            md_ratio(f, speedup(k, BENCH_REPARTITION, BENCH_FULL));
            md_ratio(f, speedup(k, BENCH_REPARTITION, BENCH_UNIFORM_MIN));
            md_ratio(f, speedup(k, BENCH_REPARTITION, BENCH_PATENT));
            md_ratio(f, speedup(k, BENCH_REPARTITION, BENCH_OPTIMAL));
            if (k->runnable && k->method[BENCH_REPARTITION].fits)
                fprintf(f, " %.1f |", k->method[BENCH_REPARTITION].plan_ms);
            else
                fprintf(f, " - |");
            fprintf(f, "\n");
        }
    }
}

static void md_memory(FILE *f, const struct bench_case *k)
{
    fprintf(f, "\n## Memory per stage: %s with %s (GiB)\n\n"
               "`limit` is the stage's memory; `before` is the cost model's memory with nothing "
               "recomputed (method none); the others are each method's plan on the cluster's own "
               "split (optimal+repartition reorders the stages: see memory.csv).\n\n"
               "| stage | device | limit | before |",
            k->cluster, k->model);
    for (int m = 1; m < BENCH_REPARTITION; m++)
        fprintf(f, " %s |", bench_method_names[m]);
    fprintf(f, "\n|---:|---|---:|---:|");
    for (int m = 1; m < BENCH_REPARTITION; m++)
        fprintf(f, "---:|");
    fprintf(f, "\n");
    for (int s = 0; s < k->n_stages; s++) {
        double lim = (double)k->limit_bytes[s];
        fprintf(f, "| %d | %s | %.2f | %.2f%s |", s, k->devices[s], lim / GIB,
                k->before_bytes[s] / GIB, k->before_bytes[s] > k->limit_bytes[s] ? " (over)" : "");
        for (int m = 1; m < BENCH_REPARTITION; m++) {
            if (k->method[m].fits)
                fprintf(f, " %.2f |", k->method[m].memory_bytes[s] / GIB);
            else
                fprintf(f, " does not fit |");
        }
        fprintf(f, "\n");
    }
}

int bench_write_markdown(const char *dir, FILE *also, const struct bench_case *cases, int n,
                         int detail, struct err *e)
{
    FILE *f;
    if (open_out(dir, "results.md", &f, e))
        return e->code;
    for (int pass = 0; pass < 2; pass++) {
        FILE *o = pass == 0 ? f : also;
        if (o == NULL)
            continue;
        fprintf(o, "# Ballast bench: recomputation methods side by side\n\n"
                   "Simulated iteration time of one training step in ms (`ballast simulate`'s "
                   "schedule, transfers included), every method planned on the same cluster in "
                   "the same run; speed-ups are ratios of those times. \"does not fit\": the "
                   "method leaves a stage over its memory; \"cannot run\": more stages than the "
                   "model has layers.\n");
        md_tables(o, cases, n);
        int notes = 0;
        for (int i = 0; i < n; i++)
            if (cases[i].note[0]) {
                if (notes++ == 0)
                    fprintf(o, "\n\\* ");
                else
                    fprintf(o, "; ");
                fprintf(o, "%s with %s: %s", cases[i].cluster, cases[i].model, cases[i].note);
            }
        if (notes)
            fprintf(o, ".\n");
        fprintf(o, "\nProfiles: the clusters' own (estimated) profiles for their model; for the "
                   "other models, profiles estimated in memory for each stage's device from "
                   "configs/devices.json.\n");
        bench_write_fp16_md(o, cases, n);
        if (detail >= 0)
            md_memory(o, &cases[detail]);
        if (pass == 0) {
            fprintf(o, "\n## Plots\n\n");
            if (count_plotted(cases, n) > 0)
                fprintf(o, "![iteration time per method](iteration.png)\n\n");
            if (detail >= 0)
                fprintf(o, "![memory per stage](memory.png)\n\n![simulated timeline of "
                           "optimal's plan](gantt.png)\n\n");
            fprintf(o, "Data and gnuplot scripts are next to them: `gnuplot iteration.gp` (and "
                       "memory.gp, gantt.gp) in this folder redraws them; gantt-trace.json "
                       "opens in ui.perfetto.dev.\n");
        }
    }
    return close_out(dir, "results.md", f, e);
}

/* Quotes a label for a gnuplot double-quoted string. */
static void gp_label(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
}

/* The x axis of a plot with a column per stage: the stage numbers (every one up to 32 stages,
 * then every 4th or 8th, so that they stay readable) and under them each run of stages of one
 * device, named once, between dashed lines. */
static void gp_stage_axis(FILE *g, const char (*devices)[PROFILE_NAME_MAX], int n)
{
    int every = n <= 32 ? 1 : n <= 64 ? 4 : 8;
    fprintf(g, "set xtics (");
    for (int s = 0, first = 1; s < n; s++)
        if (s % every == 0 || s == n - 1) {
            fprintf(g, "%s\"%d\" %d", first ? "" : ", ", s, s);
            first = 0;
        }
    fprintf(g, ") nomirror\n");
    for (int s = 0, start = 0; s < n; s++) {
        if (s + 1 < n && strcmp(devices[s + 1], devices[start]) == 0)
            continue;
        fprintf(g, "set label \"");
        gp_label(g, devices[start]);
        if (s > start)
            fprintf(g, " (%d-%d)", start, s);
        fprintf(g, "\" at first %.1f, graph -0.075 center font \",11\"\n", (start + s) / 2.0);
        if (s + 1 < n)
            fprintf(g, "set arrow from first %.1f, graph 0 to first %.1f, graph 1 nohead dt 2 "
                       "lc rgb \"#888888\"\n",
                    s + 0.5, s + 0.5);
        start = s + 1;
    }
}

static const char *const method_colors[BENCH_METHODS] = {"#9e9e9e", "#d62728", "#ff7f0e",
                                                         "#9467bd", "#2ca02c", "#1f77b4"};

/* iteration.dat's columns: the group, each method's time over full's, whether each fits, and
 * full's time. */
static void iteration_columns(FILE *d)
{
    fprintf(d, "# group");
    for (int m = 0; m < BENCH_METHODS; m++)
        fprintf(d, " %s/full", bench_method_names[m]);
    for (int m = 0; m < BENCH_METHODS; m++)
        fprintf(d, " fits_%s", bench_method_names[m]);
    fprintf(d, " full_ms\n");
}

/* iteration.gp's picture, title and axes, for `groups` groups (slant: labels slanted). */
static void iteration_setup(FILE *g, int groups, int slant)
{
    fprintf(g, "# Iteration time per method, relative to full recomputation, per cluster and "
               "model.\n# Data: iteration.dat (NaN: the method does not fit). Run: gnuplot "
               "iteration.gp\n");
    fprintf(g, "set terminal pngcairo size %d,%d font \"sans,10\"\nset output "
               "\"iteration.png\"\nset datafile missing \"NaN\"\n",
            slant ? 400 + 70 * groups : 1800, slant ? 1000 : 800);
    fprintf(g, "set title \"Simulated iteration time relative to full recomputation (lower is "
               "faster; x: the method does not fit)\"\n");
    fprintf(g, "set ylabel \"iteration time / full recomputation's\"\nset style fill solid 0.85 "
               "border -1\nset boxwidth 0.15\nset grid ytics\nset key outside right top\n"
               "set xtics nomirror font \",9\"%s\nset bmargin %d\nset lmargin %d\n",
            slant ? " rotate by 35 right" : "", slant ? 17 : 6, slant ? 30 : 10);
}

/* A plotted case's row of iteration.dat (group `group`); *top: the highest ratio so far. */
static void iteration_row(FILE *d, const struct bench_case *k, int group, double *top)
{
    fprintf(d, "%d", group);
    for (int m = 0; m < BENCH_METHODS; m++) {
        double rel = k->method[m].fits
                         ? k->method[m].iteration_ms / k->method[BENCH_FULL].iteration_ms
                         : NAN;
        *top = rel > *top ? rel : *top;
        if (isnan(rel))
            fprintf(d, " NaN");
        else
            fprintf(d, " %.6f", rel);
    }
    for (int m = 0; m < BENCH_METHODS; m++)
        fprintf(d, " %d", k->method[m].fits);
    fprintf(d, " %.3f\n", k->method[BENCH_FULL].iteration_ms);
}

/* A plotted case's x tic: cluster, model and full's time, on three lines or (slant) one. */
static void iteration_tic(FILE *g, const struct bench_case *k, int group, int slant)
{
    fprintf(g, "%s\"", group ? ", " : "");
    gp_label(g, k->cluster);
    fprintf(g, slant ? ", " : "\\n");
    gp_label(g, k->model);
    fprintf(g, "%sfull %.2f s%s\" %d", slant ? " (" : "\\n",
            k->method[BENCH_FULL].iteration_ms / 1e3, slant ? ")" : "", group);
}

/* The plot command: a method's boxes where it fits, a cross where it does not; a series only
 * where it has points (gnuplot warns about an empty one). */
static void iteration_series(FILE *g, const struct bench_case *cases, int n)
{
    fprintf(g, "plot \\\n");
    int misses[BENCH_METHODS] = {0}, fits[BENCH_METHODS] = {0}, first = 1;
    for (int i = 0; i < n; i++)
        for (int m = 0; m < BENCH_METHODS; m++) {
            misses[m] += plotted(&cases[i]) && !cases[i].method[m].fits;
            fits[m] += plotted(&cases[i]) && cases[i].method[m].fits;
        }
    for (int m = 0; m < BENCH_METHODS; m++) {
        double x = (m - 2) * 0.16;
        if (fits[m]) {
            fprintf(g, "%s  \"iteration.dat\" using ($1 + %.2f):%d with boxes lc rgb \"%s\" "
                       "title \"%s\"",
                    first ? "" : ", \\\n", x, m + 2, method_colors[m], bench_method_names[m]);
            first = 0;
        }
        if (misses[m]) {
            fprintf(g, "%s  \"iteration.dat\" using ($1 + %.2f):(column(%d) == 0 ? 0.03 : 1/0) "
                       "with points pt 2 ps 1.2 lc rgb \"%s\" ",
                    first ? "" : ", \\\n", x, BENCH_METHODS + 2 + m, method_colors[m]);
            if (fits[m])
                fprintf(g, "notitle");
            else
                fprintf(g, "title \"%s (does not fit)\"", bench_method_names[m]);
            first = 0;
        }
    }
    fprintf(g, "\n");
}

/* Iteration time of every method relative to full recomputation, one group per case. */
static int plot_iteration(const char *dir, const struct bench_case *cases, int n, struct err *e)
{
    FILE *d, *g;
    if (open_plot(dir, "iteration.dat", &d, "iteration.gp", &g, e))
        return e->code;
    /* past 10 groups the labels are one line each, slanted, so that they do not overlap */
    int slant = count_plotted(cases, n) > 10;
    iteration_columns(d);
    iteration_setup(g, count_plotted(cases, n), slant);
    fprintf(g, "set xtics (");
    int groups = 0;
    double top = 1;
    for (int i = 0; i < n; i++)
        if (plotted(&cases[i])) {
            iteration_row(d, &cases[i], groups, &top);
            iteration_tic(g, &cases[i], groups, slant);
            groups++;
        }
    fprintf(g, ")\nset xrange [-0.6:%d.6]\nset yrange [0:%.3f]\n", groups - 1, top * 1.12);
    fprintf(g, "set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc "
               "rgb \"#444444\"\n");
    iteration_series(g, cases, n);
    return close_plot(dir, "iteration.dat", d, "iteration.gp", g, e);
}

/* Memory per stage of the detail case: before, each fitting method's, and the limit. */
static int plot_memory(const char *dir, const struct bench_case *k, struct err *e)
{
    FILE *d, *g;
    if (open_plot(dir, "memory.dat", &d, "memory.gp", &g, e))
        return e->code;
    fprintf(d, "# %s with %s, GiB per stage: stage limit before", k->cluster, k->model);
    for (int m = 1; m < BENCH_REPARTITION; m++)
        fprintf(d, " %s", bench_method_names[m]);
    fprintf(d, "\n");
    for (int s = 0; s < k->n_stages; s++) {
        fprintf(d, "%d %.4f %.4f", s, k->limit_bytes[s] / GIB, k->before_bytes[s] / GIB);
        for (int m = 1; m < BENCH_REPARTITION; m++) {
            if (k->method[m].fits)
                fprintf(d, " %.4f", k->method[m].memory_bytes[s] / GIB);
            else
                fprintf(d, " NaN");
        }
        fprintf(d, "\n");
    }
    double top = 0;
    for (int s = 0; s < k->n_stages; s++) {
        top = fmax(top, k->limit_bytes[s] / GIB);
        top = fmax(top, k->before_bytes[s] / GIB);
    }
    fprintf(g, "# Memory per stage against its limit. Data: memory.dat. Run: gnuplot "
               "memory.gp\n");
    fprintf(g, "set terminal pngcairo size %d,760 font \"sans,11\"\nset output "
               "\"memory.png\"\nset datafile missing \"NaN\"\n",
            k->n_stages > 24 ? 500 + 26 * k->n_stages : 1400);
    fprintf(g, "set title \"");
    gp_label(g, k->cluster);
    fprintf(g, " with ");
    gp_label(g, k->model);
    fprintf(g, ": memory per stage (GiB), nothing recomputed (before) and each method's plan, "
               "against the stage's limit\"\n");
    fprintf(g, "set ylabel \"GiB\"\nset style fill solid 0.85 border -1\nset boxwidth 0.14\n"
               "set grid ytics\nset key outside right top\nset xrange [-0.6:%d.6]\n"
               "set yrange [0:%.2f]\nset bmargin 6\nset xlabel \"stage\" offset 0,-1.6\n",
               k->n_stages - 1, top * 1.1);
    gp_stage_axis(g, (const char(*)[PROFILE_NAME_MAX])k->devices, k->n_stages);
    fprintf(g, "plot \\\n  \"memory.dat\" using ($1 - 0.30):3 with boxes lc rgb \"%s\" "
               "title \"before (none)\", \\\n",
            method_colors[BENCH_NONE]);
    for (int m = 1; m < BENCH_REPARTITION; m++)
        fprintf(g, "  \"memory.dat\" using ($1 + %.2f):%d with boxes lc rgb \"%s\" title "
                   "\"%s\", \\\n",
                -0.30 + 0.15 * m, m + 3, method_colors[m], bench_method_names[m]);
    fprintf(g, "  \"memory.dat\" using ($1 - 0.42):2:(0.84):(0) with vectors nohead lw 3 lc "
               "rgb \"black\" title \"limit\"\n");
    return close_plot(dir, "memory.dat", d, "memory.gp", g, e);
}

/* A Gantt chart with hundreds of micro-batches is a row per device kind: the share of its
 * stages forwarding, recomputing and backwarding in each of GANTT_BINS slices of the step. */
#define GANTT_AGGREGATE_MICRO 100
#define GANTT_BINS 240

static const enum sim_kind gantt_kinds[3] = {SIM_FORWARD, SIM_RECOMPUTE, SIM_BACKWARD};
static const char *const gantt_colors[3] = {"#6baed6", "#fd8d3c", "#08519c"};

/* The device kinds in pipeline order: kind[s] is stage s's row; returns the count. */
static int gantt_rows(const struct plan *p, int *kind, int *stages)
{
    int n = 0;
    for (int s = 0; s < p->n_stages; s++) {
        kind[s] = -1;
        for (int t = 0; t < s && kind[s] < 0; t++)
            if (strcmp(p->stages[t].device, p->stages[s].device) == 0)
                kind[s] = kind[t];
        if (kind[s] < 0)
            kind[s] = n++;
        stages[kind[s]]++;
    }
    return n;
}

/* gantt.dat of the per-kind chart: blocks forward, recompute, backward; each line a slice's
 * box (centre, row's centre, half width, half height) stacked from the row's bottom. */
static void gantt_aggregate_data(FILE *d, const struct plan *p, const struct sim_result *r,
                                 const int *kind, const int *stages, int rows, double *busy)
{
    double width = r->iteration_ms / GANTT_BINS;
    double *share = calloc((size_t)rows * GANTT_BINS * 3, sizeof *share);
    for (int i = 0; share != NULL && i < r->n_tasks; i++) {
        const struct sim_task *t = &r->tasks[i];
        int b = t->kind == SIM_FORWARD ? 0 : t->kind == SIM_RECOMPUTE ? 1
                : t->kind == SIM_BACKWARD ? 2 : -1;
        for (int j = (int)(t->start_ms / width); b >= 0 && j < GANTT_BINS && j * width < t->end_ms;
             j++) {
            double overlap = fmin(t->end_ms, (j + 1) * width) - fmax(t->start_ms, j * width);
            int k = kind[t->stage];
            share[((size_t)k * GANTT_BINS + j) * 3 + b] += overlap / (width * stages[k]);
            busy[k] += overlap / (r->iteration_ms * stages[k]);
        }
    }
    fprintf(d, "# x_s row half_width half_height; blocks: forward, recompute, backward\n");
    for (int b = 0; b < 3; b++) {
        fprintf(d, "%s# %s\n", b ? "\n\n" : "", sim_kind_name(gantt_kinds[b]));
        for (int k = 0; k < rows; k++)
            for (int j = 0; share != NULL && j < GANTT_BINS; j++) {
                const double *v = &share[((size_t)k * GANTT_BINS + j) * 3];
                double below = 0;
                for (int c = 0; c < b; c++)
                    below += v[c];
                if (v[b] > 0)
                    fprintf(d, "%.6f %.6f %.6f %.6f\n", (j + 0.5) * width / 1e3,
                            k + 0.4 - 0.8 * (below + v[b] / 2), width / 2e3, 0.4 * v[b]);
            }
        fprintf(d, "-1 -10 0 0\n"); /* every block has a row */
    }
    free(share);
}

/* gantt.dat of the per-stage chart: blocks forward, recompute, backward, and the labels of
 * boxes wide enough to name. */
static void gantt_stage_data(FILE *d, const struct sim_result *r)
{
    fprintf(d, "# stage start_s end_s micro_batch; blocks: forward, recompute, backward, "
               "labels (boxes wide enough to name)\n");
    for (int b = 0; b < 4; b++) {
        if (b > 0)
            fprintf(d, "\n\n");
        fprintf(d, "# %s\n", b < 3 ? sim_kind_name(gantt_kinds[b]) : "labels");
        for (int i = 0; i < r->n_tasks; i++) {
            const struct sim_task *t = &r->tasks[i];
            int compute = t->kind == SIM_FORWARD || t->kind == SIM_RECOMPUTE ||
                          t->kind == SIM_BACKWARD;
            if (!compute || (b < 3 && t->kind != gantt_kinds[b]) ||
                (b == 3 && t->end_ms - t->start_ms < 0.012 * r->iteration_ms))
                continue;
            fprintf(d, "%d %.6f %.6f %d\n", t->stage, t->start_ms / 1e3, t->end_ms / 1e3,
                    t->micro);
        }
    }
    /* at least one row per block, so that gnuplot finds every index */
    fprintf(d, "\n\n# end\n-1 0 0 0\n");
}

/* gantt-trace.json: the simulated step as a Chrome trace (ui.perfetto.dev). */
static void write_trace(const char *dir, const struct plan *p, const struct sim_result *r,
                        struct err *e)
{
    struct trace *t = trace_init();
    char path[CLUSTER_PATH_MAX];
    snprintf(path, sizeof path, "%s/gantt-trace.json", dir);
    if (t == NULL) {
        err_set(e, ERR_FAIL, "out of memory");
        return;
    }
    sim_trace_add(t, 1, p, r);
    trace_write(t, path, e);
    trace_free(t);
}

/* The chart's rows: a row per stage, or (aggregate) per device kind, kind[s] being stage s's
 * with stages[] and busy[] per kind. */
struct gantt_layout {
    int aggregate, rows;
    int *kind, *stages;
    double *busy;
};

static void gantt_layout_init(struct gantt_layout *l, const struct plan *p)
{
    l->aggregate = p->micro_batches >= GANTT_AGGREGATE_MICRO;
    l->kind = calloc((size_t)p->n_stages, sizeof *l->kind);
    l->stages = calloc((size_t)p->n_stages, sizeof *l->stages);
    l->busy = calloc((size_t)p->n_stages, sizeof *l->busy);
    l->rows = l->kind && l->stages ? gantt_rows(p, l->kind, l->stages) : 0;
}

static void gantt_layout_free(struct gantt_layout *l)
{
    free(l->kind);
    free(l->stages);
    free(l->busy);
}

/* gantt.gp's picture, title and axes. */
static void gantt_setup(FILE *g, const struct bench_case *k, const struct plan *p,
                        const struct sim_result *r, const struct gantt_layout *l)
{
    fprintf(g, "# Simulated timeline of one step. Data: gantt.dat. Run: gnuplot gantt.gp\n");
    fprintf(g, "set terminal pngcairo size 1800,%d font \"sans,11\"\nset output \"gantt.png\"\n",
            l->aggregate ? 260 + 110 * l->rows : 300 + 40 * p->n_stages);
    fprintf(g, "set title \"");
    gp_label(g, k->cluster);
    fprintf(g, " with ");
    gp_label(g, k->model);
    fprintf(g, ", method %s (the fastest): simulated %s step, %d micro-batches, %.3f s, bubble "
               "%.1f%%%s\"\n",
            p->method, schedule_name(p->schedule), p->micro_batches, r->iteration_ms / 1e3,
            100 * r->bubble_fraction,
            l->aggregate ? "\\nper device kind: the share of its stages busy, in 240 slices of "
                           "the step (gantt-trace.json has every operation)"
                         : " (labels: micro-batch)");
    fprintf(g, "set xlabel \"time (s)\"\nset xrange [0:%.6f]\nset yrange [%d.5:-0.5]\n",
            r->iteration_ms / 1e3 * 1.01, (l->aggregate ? l->rows : p->n_stages) - 1);
}

/* The rows' names: a stage's number and device, or a device kind's stages and busy share. */
static void gantt_ytics(FILE *g, const struct plan *p, const struct gantt_layout *l)
{
    const int *kind = l->kind;
    fprintf(g, "set ytics (");
    for (int s = 0, first = 1; s < p->n_stages && kind != NULL; s++) {
        if (l->aggregate && (s > 0 && kind[s] == kind[s - 1]))
            continue;
        fprintf(g, "%s\"", first ? "" : ", ");
        if (!l->aggregate)
            fprintf(g, "%d ", s);
        gp_label(g, p->stages[s].device);
        if (l->aggregate)
            fprintf(g, "\\n%d stages, busy %.0f%%%%", l->stages[kind[s]], 100 * l->busy[kind[s]]);
        fprintf(g, "\" %d", l->aggregate ? kind[s] : s);
        first = 0;
    }
    fprintf(g, ")\n");
}

/* The plot command: the three blocks, and a row per stage's micro-batch labels. */
static void gantt_series(FILE *g, int aggregate)
{
    fprintf(g, "set style fill solid 0.9 %s\nset key outside right top\n"
               "set grid xtics\nplot \\\n",
            aggregate ? "noborder" : "border rgb \"white\"");
    for (int b = 0; b < 3; b++)
        fprintf(g, "  \"gantt.dat\" index %d using %s with boxxyerror lc rgb \"%s\" title "
                   "\"%s\"%s\n",
                b, aggregate ? "1:2:3:4" : "(($2+$3)/2):1:(($3-$2)/2):(0.38)", gantt_colors[b],
                sim_kind_name(gantt_kinds[b]), b < 2 || !aggregate ? ", \\" : "");
    if (!aggregate)
        fprintf(g, "  \"gantt.dat\" index 3 using (($2+$3)/2):1:(sprintf(\"%%d\", $4)) with "
                   "labels font \",8\" tc rgb \"black\" notitle\n");
}

/* The Gantt chart of a plan's simulated step: a row per stage and a box per operation, or
 * with hundreds of micro-batches a row per device kind (above). Also writes the timeline as a
 * Chrome trace, every operation of every stage. */
static int plot_gantt(const char *dir, const struct bench_case *k, const struct plan *p,
                      struct err *e)
{
    struct sim_result r;
    if (sim_plan(p, &r, e))
        return e->code;
    FILE *d, *g;
    if (open_plot(dir, "gantt.dat", &d, "gantt.gp", &g, e)) {
        sim_result_free(&r);
        return e->code;
    }
    struct gantt_layout l;
    gantt_layout_init(&l, p);
    if (l.aggregate && l.busy != NULL)
        gantt_aggregate_data(d, p, &r, l.kind, l.stages, l.rows, l.busy);
    else
        gantt_stage_data(d, &r);
    gantt_setup(g, k, p, &r, &l);
    gantt_ytics(g, p, &l);
    gantt_series(g, l.aggregate);
    gantt_layout_free(&l);
    if (close_plot(dir, "gantt.dat", d, "gantt.gp", g, e) == ERR_OK)
        write_trace(dir, p, &r, e);
    sim_result_free(&r);
    return e->code;
}

/* Runs `gnuplot script` in dir. */
static int run_gnuplot(const char *dir, const char *script, struct err *e)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return err_set(e, ERR_FAIL, "cannot start gnuplot: %s", strerror(errno));
    if (pid == 0) {
        if (chdir(dir) != 0)
            _exit(126);
        execlp("gnuplot", "gnuplot", script, (char *)NULL);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return err_set(e, ERR_FAIL, "waiting for gnuplot: %s", strerror(errno));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        return err_set(e, ERR_FAIL, "gnuplot not found (Debian package gnuplot-nox); the data "
                                    "and scripts are in %s",
                       dir);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return err_set(e, ERR_FAIL, "gnuplot %s failed in %s (status %d)", script, dir,
                       WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return ERR_OK;
}

int bench_write_plots(const char *dir, const struct bench_case *cases, int n, int detail,
                      const struct plan *gantt, int run, struct err *e)
{
    if (count_plotted(cases, n) > 0 &&
        (plot_iteration(dir, cases, n, e) || (run && run_gnuplot(dir, "iteration.gp", e))))
        return e->code;
    if (detail >= 0 &&
        (plot_memory(dir, &cases[detail], e) || (run && run_gnuplot(dir, "memory.gp", e))))
        return e->code;
    if (detail >= 0 && gantt != NULL &&
        (plot_gantt(dir, &cases[detail], gantt, e) || (run && run_gnuplot(dir, "gantt.gp", e))))
        return e->code;
    return ERR_OK;
}
