/* `ballast bench`: every recomputation method on the same clusters and models, side by side.
 *
 * For each cluster file (CPU clusters skipped) and each model, the cluster is planned with
 * every method of BENCH_METHODS and each plan simulated (optimal at --min-gain 0: the methods
 * are compared by the fastest plan each finds, not by a simpler one). A cluster whose
 * profiles describe another model gets profiles estimated in memory for each stage's device
 * (the device table), and explicit `layers` ranges scaled to the model's layer count. A bf16
 * model on a cluster with GPUs lacking bf16 tensor cores (V100, T4) is benched in fp16 beside
 * it (its "twin"), with what those GPUs contribute in each. The results go to a folder:
 * results.csv, memory.csv, results.md and gnuplot scripts with their data and PNGs. */
#ifndef BALLAST_BENCH_H
#define BALLAST_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "cluster.h"
#include "devices.h"
#include "err.h"
#include "plan.h"
#include "sim.h"

#define BENCH_METHODS 6 /* none, full, uniform-min, patent, optimal, optimal+repartition */
#define BENCH_NAME_MAX 64
#define BENCH_NOTE_MAX 256

extern const char *const bench_method_names[BENCH_METHODS];
enum { BENCH_NONE, BENCH_FULL, BENCH_UNIFORM_MIN, BENCH_PATENT, BENCH_OPTIMAL, BENCH_REPARTITION };

/* One method's outcome on one case. */
struct bench_result {
    int fits;
    double iteration_ms, bubble_fraction;
    int64_t *memory_bytes; /* per stage, when it fits */
    double *recompute_ms;  /* per stage and micro-batch, when it fits */
    /* per stage: repartitioning reorders the stages, so each plan says which stage is where */
    char (*devices)[PROFILE_NAME_MAX];
    int64_t *limit_bytes;
    double plan_ms; /* wall time of planning */
    /* The GPUs without bf16 tensor cores (bench_older_fill): their share of the step's model
     * FLOPs and their mean busy share of the simulated step (NaN: none, or a custom model);
     * the GPUs given no block (the embedding or head alone). */
    double older_work, older_busy;
    int blockless;
};

/* One cluster with one model. */
struct bench_case {
    char cluster[BENCH_NAME_MAX];
    char model[BENCH_NAME_MAX];
    struct model m;            /* the model benched (model: its name) */
    char note[BENCH_NOTE_MAX]; /* layers scaled, or why the case cannot run */
    int runnable;              /* 0: more stages than the model has layers */
    int estimated;             /* profiles estimated here: the cluster's are for another model */
    int fp16_twin;             /* the fp16 twin of the bf16 case before it (bench_fp16_twin) */
    int n_older;               /* stages on GPUs without bf16 tensor cores */
    int n_stages, micro_batches, n_layers;
    enum schedule schedule;
    char (*devices)[PROFILE_NAME_MAX]; /* per stage */
    int64_t *limit_bytes;              /* per stage */
    int64_t *before_bytes;             /* per stage, nothing recomputed */
    struct bench_result method[BENCH_METHODS];
};

struct bench_options {
    const char *out_dir;      /* created if missing */
    const char *clusters;     /* comma-separated cluster files or folders of them */
    const char *models;       /* comma-separated model files or names in configs/models */
    const char *devices_file; /* for estimated profiles */
    const char *detail;       /* cluster for the memory and Gantt plots; NULL: a default */
    int plots;                /* run gnuplot */
    int fp16;                 /* bench bf16 models in fp16 too where GPUs lack bf16 tensor cores */
};

/* Defaults: out/bench, the shipped clusters, the 1.3B, 13B and 175B models, plots on, fp16
 * twins on. */
void bench_options_default(struct bench_options *o);

/* Runs the bench, printing a progress line per case to `progress` (may be NULL) and the
 * tables to `out`. Methods that do not fit are reported, not errors. */
int bench_run(const struct bench_options *o, FILE *progress, FILE *out, struct err *e);

/* The cluster `c` (whose profiles describe another model) for model `m`: the same stages,
 * memory and links, a profile estimated for each stage's device, and explicit layer ranges
 * scaled to m's layer count by their boundaries (note says so). ERR_NOFIT (note says why)
 * when it has more stages than `m` has layers; ERR_INPUT for a device the table lacks. */
int bench_cluster_for_model(const struct cluster *c, const struct model *m,
                            const struct device_table *t, struct cluster *out,
                            char note[BENCH_NOTE_MAX], struct err *e);

/* fp16 beside bf16 (bench_fp16.c). The stages of `c` on devices of `t` without bf16 tensor
 * cores ("bf16_tensor": false). */
int bench_older_count(const struct cluster *c, const struct device_table *t);
/* The older GPUs' work and busy shares and the GPUs without a block in plan `p`, simulated as
 * `sim`, into r. */
void bench_older_fill(const struct plan *p, const struct sim_result *sim,
                      const struct device_table *t, struct bench_result *r);
/* Whether bf16 model `m` gets an fp16 twin (not when the listed models hold it already): 1
 * and *twin, `m` in fp16. */
int bench_fp16_twin(const struct model *m, const struct model *listed, int n_listed,
                    struct model *twin);
/* The table of each twin beside its bf16 case (nothing without twins). */
void bench_write_fp16_md(FILE *f, const struct bench_case *cases, int n);

/* Writers (bench_report.c): the files of a finished run. `detail` indexes the case whose
 * memory per stage and Gantt chart are drawn (-1: none); `gantt` is its optimal plan. */
int bench_write_csv(const char *dir, const struct bench_case *cases, int n, struct err *e);
int bench_write_markdown(const char *dir, FILE *also, const struct bench_case *cases, int n,
                         int detail, struct err *e);
int bench_write_plots(const char *dir, const struct bench_case *cases, int n, int detail,
                      const struct plan *gantt, int run_gnuplot, struct err *e);

#endif
