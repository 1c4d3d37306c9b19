#include <stdio.h>
#include <unistd.h>

#include "bench.h"
#include "cli.h"

static void help(const struct bench_options *d)
{
    printf("usage: ballast bench [--out DIR] [--clusters LIST] [--models LIST] [--detail NAME]\n"
           "                     [--devices FILE] [--no-plots] [--no-fp16]\n\n"
           "Plans every cluster with every method (none, full, uniform-min, patent, optimal),\n"
           "simulates each plan and compares them: iteration time, speed-up over full and over\n"
           "uniform-min, memory per stage against its limit, \"does not fit\" where a method\n"
           "cannot fit. Clusters whose profiles describe another model get profiles estimated\n"
           "for each stage's device. Writes results.csv, memory.csv, results.md, and PNG plots\n"
           "made with gnuplot (iteration time, memory per stage, a Gantt chart) with their\n"
           "data and scripts. A bf16 model on a cluster with GPUs lacking bf16 tensor cores\n"
           "(V100, T4) is benched in fp16 too (MODEL-fp16), with what those GPUs contribute.\n\n"
           "  --out DIR        where the results go (default %s)\n"
           "  --clusters LIST  cluster files or folders of them, comma-separated (default\n"
           "                   %s; CPU clusters are left out)\n"
           "  --models LIST    model files or names in configs/models, comma-separated\n"
           "                   (default %s)\n"
           "  --detail NAME    the cluster whose memory per stage and timeline are drawn\n"
           "                   (default v100-a100-8, else the first)\n"
           "  --devices FILE   the device table for estimated profiles (default %s)\n"
           "  --no-plots       write the gnuplot scripts and data but do not run gnuplot\n"
           "  --no-fp16        bench no fp16 twins of bf16 models\n\n"
           "exit status: 0 done (methods that do not fit are results, not errors), 1 failure\n"
           "while running (gnuplot included), 2 bad input\n",
           d->out_dir, d->clusters, d->models, d->devices_file);
}

const struct cli_opt cmd_bench_options[] = {
    {"--out", CLI_VALUE},     {"--clusters", CLI_VALUE}, {"--models", CLI_VALUE},
    {"--detail", CLI_VALUE},  {"--devices", CLI_VALUE},  {"--no-plots", CLI_FLAG},
    {"--no-fp16", CLI_FLAG},
    {NULL, CLI_FLAG}};

int cmd_bench(int argc, char **argv)
{
    struct bench_options o;
    const char *v;
    struct err e;
    err_clear(&e);
    bench_options_default(&o);
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            help(&o);
            return ERR_OK;
        } else if ((r = cli_option(argc, argv, &i, "--out", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            o.out_dir = v;
        } else if ((r = cli_option(argc, argv, &i, "--clusters", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            o.clusters = v;
        } else if ((r = cli_option(argc, argv, &i, "--models", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            o.models = v;
        } else if ((r = cli_option(argc, argv, &i, "--detail", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            o.detail = v;
        } else if ((r = cli_option(argc, argv, &i, "--devices", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            o.devices_file = v;
        } else if (cli_flag(argv, i, "--no-plots")) {
            o.plots = 0;
        } else if (cli_flag(argv, i, "--no-fp16")) {
            o.fp16 = 0;
        } else {
            return cli_usage_error("bench", "unknown option \"%s\"", argv[i]);
        }
    }
    if (o.out_dir[0] == '\0')
        return cli_usage_error("bench", "--out: empty folder name");
    if (bench_run(&o, stderr, stdout, &e))
        return cli_fail("bench", &e);
    printf("\nwrote %s/results.csv, memory.csv, results.md%s\n", o.out_dir,
           o.plots ? " and the plots (iteration.png, memory.png, gantt.png)" : "");
    return ERR_OK;
}
