#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cluster.h"
#include "planner.h"

static void help(void)
{
    printf("usage: ballast plan --cluster CLUSTER.json [--method M] [--reduce D] [--verify]\n"
           "                    [--repartition [--search-nodes N]] [--whole-layers]\n"
           "                    [--unit BYTES] [--time-unit MS] [-o PLAN.json] [--export FORMAT]\n"
           "                    [--quiet]\n\n"
           "Chooses, for every pipeline stage, the layers to recompute so that the stage fits its\n"
           "memory, and prints the plan as a table.\n\n"
           "  --cluster FILE   the cluster (ballast-cluster/1) and, through it, the profiles\n"
           "  --method M       none | full | block:N | uniform-min | patent | optimal (default)\n"
           "                     none, full     nothing / every layer recomputed\n"
           "                     block:N        the first N layers of every stage (Megatron)\n"
           "                     uniform-min    the least single N that makes every stage fit\n"
           "                     patent         the published load-aware method: the most loaded\n"
           "                                    stage's least recompute (0-1 knapsack), the others\n"
           "                                    balanced to its recompute time\n"
           "                     optimal        least iteration time (each stage's least recompute)\n"
           "  --reduce D       patent: the most loaded stage must drop to D x its memory (0 < D <= 1)\n"
           "  --verify         solve each stage as a MILP with GLPK too; exit 1 if they disagree\n"
           "  --repartition    optimal: also choose each stage's layers and the order of the\n"
           "                   device kinds along the pipeline (each kind's stages together);\n"
           "                   the plan reports its certified optimality_gap\n"
           "  --search-nodes N branch-and-bound node budget of --repartition (default %d)\n"
           "  --whole-layers   optimal: recompute whole layers only, ignoring the profiles'\n"
           "                   recompute options (attention or MLP activation only, say)\n"
           "  --micro-batches N|auto\n"
           "                   micro-batches per step (default: the cluster's); auto tries every\n"
           "                   micro-batch size dividing the global batch and keeps the fastest\n"
           "  --global-batch G samples per step for auto (default: the cluster's micro-batches\n"
           "                   x the model's micro_batch)\n"
           "  --unit BYTES     knapsack memory unit (default 1MiB; suffixes K, M, G)\n"
           "  --time-unit MS   patent's balancing time unit (default 0.001 ms)\n"
           "  -o FILE          write the plan (ballast-plan/1)\n"
           "  --export FORMAT  print the plan as colossalai, nemo or megatron settings on\n"
           "                   standard output (the table goes to standard error)\n"
           "  --quiet          no table\n\n"
           "exit status: 0 planned, 1 --verify disagreed, 2 bad input, 3 no plan fits\n",
           PLAN_SEARCH_NODES_DEFAULT);
}

int cmd_plan(int argc, char **argv)
{
    const char *cluster_file = NULL, *out_file = NULL, *export_format = NULL, *v;
    struct plan_options o;
    int quiet = 0, reduce_given = 0, auto_micro = 0;
    long micro_batches = 0, global_batch = 0;
    struct err e;
    err_clear(&e);
    plan_options_default(&o);
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            help();
            return ERR_OK;
        } else if ((r = cli_option(argc, argv, &i, "--cluster", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            cluster_file = v;
        } else if ((r = cli_option(argc, argv, &i, "--method", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            if (plan_method_parse(v, &o, &e))
                return cli_fail("plan", &e);
        } else if ((r = cli_option(argc, argv, &i, "--reduce", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            if (cli_parse_double(v, &o.reduce) || !(o.reduce > 0 && o.reduce <= 1))
                return cli_usage_error("plan", "--reduce: \"%s\", expected a number in (0, 1]",
                                       v);
            reduce_given = 1;
        } else if ((r = cli_option(argc, argv, &i, "--unit", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            if (cli_parse_bytes(v, &o.unit_bytes))
                return cli_usage_error("plan", "--unit: \"%s\", expected a positive byte count",
                                       v);
        } else if ((r = cli_option(argc, argv, &i, "--time-unit", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            if (cli_parse_double(v, &o.time_unit_ms) || !(o.time_unit_ms > 0))
                return cli_usage_error("plan", "--time-unit: \"%s\", expected milliseconds > 0",
                                       v);
        } else if ((r = cli_option(argc, argv, &i, "-o", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            out_file = v;
        } else if ((r = cli_option(argc, argv, &i, "--search-nodes", &v)) != 0) {
            long n;
            if (r < 0)
                return ERR_INPUT;
            if (cli_parse_int(v, 1, 1L << 40, &n))
                return cli_usage_error("plan", "--search-nodes: \"%s\", expected a count >= 1",
                                       v);
            o.search_nodes = n;
        } else if (cli_flag(argv, i, "--repartition")) {
            o.repartition = 1;
        } else if (cli_flag(argv, i, "--whole-layers")) {
            o.whole_layers = 1;
        } else if ((r = cli_option(argc, argv, &i, "--micro-batches", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            if (strcmp(v, "auto") == 0)
                auto_micro = 1;
            else if (cli_parse_int(v, 1, 1 << 20, &micro_batches))
                return cli_usage_error("plan", "--micro-batches: \"%s\", expected a count >= 1 "
                                               "or auto", v);
        } else if ((r = cli_option(argc, argv, &i, "--global-batch", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            if (cli_parse_int(v, 1, 1 << 20, &global_batch))
                return cli_usage_error("plan", "--global-batch: \"%s\", expected a count >= 1",
                                       v);
        } else if ((r = cli_option(argc, argv, &i, "--export", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            if (strcmp(v, "colossalai") && strcmp(v, "nemo") && strcmp(v, "megatron"))
                return cli_usage_error("plan", "--export: \"%s\", expected colossalai, nemo or "
                                               "megatron", v);
            export_format = v;
        } else if (cli_flag(argv, i, "--verify")) {
            o.verify = 1;
        } else if (cli_flag(argv, i, "--quiet")) {
            quiet = 1;
        } else {
            return cli_usage_error("plan", "unknown option \"%s\"", argv[i]);
        }
    }
    if (cluster_file == NULL)
        return cli_usage_error("plan", "--cluster is required");
    if (o.repartition && o.method != METHOD_OPTIMAL)
        return cli_usage_error("plan", "--repartition applies to --method optimal only");
    if (o.whole_layers && o.method != METHOD_OPTIMAL)
        return cli_usage_error("plan", "--whole-layers applies to --method optimal only (the "
                                       "other methods recompute whole layers anyway)");
    if (reduce_given && o.method != METHOD_PATENT)
        return cli_usage_error("plan", "--reduce applies to --method patent only");
    char name[PLAN_METHOD_MAX];
    if (o.verify && o.method != METHOD_PATENT && o.method != METHOD_OPTIMAL)
        return cli_usage_error("plan", "--verify checks the knapsack methods (patent, optimal); "
                                       "method %s solves no optimisation",
                               plan_method_name(&o, name));

    if (global_batch && !auto_micro)
        return cli_usage_error("plan", "--global-batch applies to --micro-batches auto");
    if (cli_check_output("plan", out_file))
        return ERR_INPUT;
    struct cluster c;
    if (cluster_load(cluster_file, &c, &e))
        return cli_fail("plan", &e);
    cluster_warn_cpu_threads(cluster_file, &c, stderr);
    if (micro_batches)
        c.micro_batches = (int)micro_batches;
    struct plan p;
    int rc;
    if (auto_micro) {
        if (!global_batch)
            global_batch = (long)c.micro_batches * c.model.micro_batch;
        rc = planner_make_auto(&c, &o, (int)global_batch,
                               quiet ? NULL : (export_format ? stderr : stdout), &p, &e);
    } else {
        rc = planner_make(&c, &o, &p, &e);
    }
    cluster_free(&c);
    if (rc)
        return cli_fail("plan", &e);
    if (!quiet)
        planner_print(export_format ? stderr : stdout, &p);
    if (export_format != NULL && planner_export(stdout, &p, export_format, &e)) {
        plan_free(&p);
        return cli_fail("plan", &e);
    }
    if (out_file != NULL && plan_write(out_file, &p, &e)) {
        plan_free(&p);
        return cli_fail("plan", &e);
    }
    rc = p.verify.present && !p.verify.agree ? ERR_FAIL : ERR_OK;
    if (rc)
        fprintf(stderr, "ballast plan: the DP and GLPK disagree (DP %.9g, GLPK %.9g)\n",
                p.verify.dp_objective, p.verify.milp_objective);
    plan_free(&p);
    return rc;
}
