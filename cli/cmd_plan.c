#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cluster.h"
#include "estimate.h"
#include "framework.h"
#include "jsonio.h"
#include "plan_arena.h"
#include "plan_gpus.h"
#include "plan_kinds.h"
#include "planner.h"
#include "share_plan.h"

static void help(void)
{
    printf("usage: ballast plan --model NAME|MODEL.json --gpus N1xDEVICE1[,N2xDEVICE2...]\n"
           "                    --global-batch G [--nodes N1[,N2...]] [--seq-len T]\n"
           "                    [--node-link LINK[,LINK...]] [--network LINK]\n"
           "                    [--host-memory SIZE] [--reserve SIZE] [--profile PROFILE.json]...\n"
           "                    [--save-cluster CLUSTER.json] [-o PLAN.json] [options below]\n"
           "       ballast plan --cluster CLUSTER.json [--method M] [--reduce D] [--verify]\n"
           "                    [--repartition] [--search-nodes N] [--time-limit S]\n"
           "                    [--search-gap G] [--whole-layers] [--actions A,...]\n"
           "                    [--schedule S] [--virtual-stages V]\n"
           "                    [--min-gain G] [--micro-batches N|auto] [--global-batch G]\n"
           "                    [--unit SIZE] [--time-unit MS] [-o PLAN.json] [--for FRAMEWORK]\n"
           "                    [--export FRAMEWORK] [--quiet]\n"
           "                    [--arena M] [--explain-arena S] [--arena-cap SIZE]\n"
           "                    [--arena-seed N] [--arena-generations N] [--arena-stall N]\n"
           "                    [--arena-time-limit S]\n"
           "       ballast plan --share JOB1.json[:METHOD] JOB2.json[:METHOD] ... [-o SHARE.json]\n\n"
           "Chooses, for every pipeline stage, its layers and what it does with the activations\n"
           "it cannot hold (recompute them, or with --actions keep them in host memory) so that\n"
           "every stage fits its memory at the least cost in speed, and prints the plan as a\n"
           "table.\n\n"
           "One line: a pool of GPUs from the device table and link presets\n"
           "  --model M        a model of configs/models (llama2-7b, gpt-13b, ...) or a file\n"
           "  --gpus LIST      the GPUs, COUNTxDEVICE by kind (8xA100-40GB,8xV100-32GB); names\n"
           "                   of configs/devices.json. Each kind's profile is estimated from it\n"
           "  --global-batch G samples a step over every replica (also --micro-batches auto's)\n"
           "  --nodes N,...    nodes of each kind (one count: every kind); default: 8 GPUs a node\n"
           "                   (fewer when a kind has fewer)\n"
           "  --seq-len T      tokens a sample, in place of the model file's\n"
           "  --node-link L,...  the link inside a node (each kind's, or one for all): a preset\n"
           "                   of configs/links.json (nvlink2, nvlink3, nvlink4, pcie3, pcie4,\n"
           "                   pcie5) or a rate (\"900Gbps\", \"300GB/s\"); default: the device's\n"
           "  --network L      between nodes and replicas: a preset (ib-edr, ib-hdr, ib-ndr,\n"
           "                   ib-xdr, eth-25g, eth-100g, eth-400g) or a rate; default ib-hdr\n"
           "  --host-memory SIZE  host memory a node has for offload (\"1TiB\"), shared by its\n"
           "                   GPUs (for --actions offload or optimizer)\n"
           "  --reserve SIZE   device memory a GPU keeps for what no arena holds (CUDA context,\n"
           "                   libraries; default 2GiB)\n"
           "  --profile FILE   a profile (say, measured) for its device in place of the estimate\n"
           "  --save-cluster FILE  where the cluster goes (default: beside -o as\n"
           "                   PLAN.cluster.json, else MODEL-GPUS.cluster.json here); its profiles\n"
           "                   go to the folder of its name with .profiles\n\n"
           "  --cluster FILE   the cluster (ballast-cluster/1) and, through it, the profiles;\n"
           "                   with \"pipelines\" each is planned and the step of all written\n"
           "                   (ballast-replicas/1); with a \"pool\" of GPUs the fastest\n"
           "                   data-parallel pipeline is searched for, or heterogeneous\n"
           "                   pipelines when they step faster (then ballast-replicas/1;\n"
           "                   docs/formats.md, \"Pools\")\n"
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
           "  --time-limit S   --repartition stops after S seconds with the best plan found and\n"
           "                   its certified optimality_gap (default %g s); with a \"pool\",\n"
           "                   the whole search does (default: no limit)\n"
           "  --search-gap G   --repartition leaves what cannot beat its best plan by more than\n"
           "                   the fraction G: optimality_gap stays <= G (default 0.005; 0: exact)\n"
           "  --schedule S     the pipeline schedule (default: the cluster's): 1f1b, gpipe,\n"
           "                   interleaved (--virtual-stages V chunks a GPU, default 2), zb-h1,\n"
           "                   v-half, or auto: each planned, the least simulated step kept\n"
           "                   (docs/schedules.md)\n"
           "  --virtual-stages V  interleaved's model chunks a GPU (1 .. 8); with auto, the one\n"
           "                   interleaved tried (default 2, 3 and 4)\n"
           "  --whole-layers   optimal: recompute whole layers only, ignoring the profiles'\n"
           "                   recompute options (attention or MLP activation only, say)\n"
           "  --min-gain G     optimal: take an optional action (offload, the host optimizer,\n"
           "                   a partial recompute, an uneven split) only where it shortens\n"
           "                   the step by at least G of it (default 0.005, or 0.5%%; 0: the\n"
           "                   fastest plan); of the plans within G of the fastest, the\n"
           "                   simplest (docs/planning-choices.md)\n"
           "  --actions A,...  optimal: recompute (default), offload (kept tensors to the stages'\n"
           "                   host_memory_bytes over their host links), optimizer (a stage's\n"
           "                   AdamW on the host, a mirror in its host_memory_bytes),\n"
           "                   optimizer-fraction (optimizer, or of the stage's last layers only),\n"
           "                   weights (optimizer, and the last layers' weights streamed from\n"
           "                   host memory for each use), or several\n"
           "  --micro-batches N|auto\n"
           "                   micro-batches per step (default: the cluster's); auto tries every\n"
           "                   micro-batch size dividing the global batch and keeps the fastest\n"
           "  --global-batch G samples per step for auto, across the data-parallel replicas\n"
           "                   (default: the cluster's micro-batches x the model's\n"
           "                   micro_batch x the stages' dp)\n"
           "  --unit SIZE      knapsack memory unit (default 1MiB; \"64KiB\", \"1MB\", bytes)\n"
           "  --time-unit MS   patent's balancing time unit (default 0.001 ms)\n"
           "  -o FILE          write the plan (ballast-plan/1)\n"
           "  --for F          plan what framework F runs: ballast (default), megatron (per-rank\n"
           "                   recompute), megatron-cli (one setting), nemo, nemo-cli,\n"
           "                   colossalai or flagscale: its recompute forms and split, on its\n"
           "                   activation model (docs/frameworks.md)\n"
           "  --export F       print the plan as framework F's settings on standard output (the\n"
           "                   table goes to standard error): ballast export's shortcut\n"
           "  --quiet          no table\n"
           "  --share J1 J2 ...  jobs time-sharing the same devices (each a cluster file over the\n"
           "                   same stages, with its method after a colon, else --method): each\n"
           "                   job planned for the memory the jobs' persistent regions leave;\n"
           "                   -o writes ballast-share/1\n"
           "  --arena M        lay each stage's activation arena out by a reuse plan and make it\n"
           "                   the stage's memory: slots (today's carving), greedy (by size),\n"
           "                   ga (the published genetic search) or exact (GLPK MILP); stages fit\n"
           "                   on it, and optimal recomputes the least that fits it\n"
           "  --explain-arena S  print stage S's arena objects, lifetimes and offsets\n"
           "  --arena-cap SIZE the arena's device cap: the bytes above it must go to host memory;\n"
           "                   with --actions recompute,offload their layers are offloaded\n"
           "                   and the stage laid out again until it fits\n"
           "  --arena-seed N, --arena-generations N, --arena-stall N, --arena-time-limit S\n"
           "                   ga's seed and limits (default 1, 300, 60, 10 s; exact: the time)\n\n"
           "exit status: 0 planned, 1 --verify disagreed, 2 bad input, 3 no plan fits\n",
           PLAN_SEARCH_NODES_DEFAULT, PLAN_REPARTITION_TIME_LIMIT_DEFAULT_S);
}

const struct cli_opt cmd_plan_options[] = {
    {"--cluster", CLI_VALUE},       {"--method", CLI_VALUE},
    {"--reduce", CLI_VALUE},        {"--verify", CLI_FLAG},
    {"--repartition", CLI_FLAG},    {"--search-nodes", CLI_VALUE},
    {"--time-limit", CLI_VALUE},    {"--search-gap", CLI_VALUE},
    {"--whole-layers", CLI_FLAG},   {"--actions", CLI_VALUE},
    {"--micro-batches", CLI_VALUE}, {"--global-batch", CLI_VALUE},
    {"--unit", CLI_VALUE},          {"--time-unit", CLI_VALUE},
    {"-o", CLI_VALUE},              {"--export", CLI_VALUE},
    {"--for", CLI_VALUE},
    {"--quiet", CLI_FLAG},          {"--share", CLI_VALUES},
    {"--arena", CLI_VALUE},         {"--explain-arena", CLI_VALUE},
    {"--arena-cap", CLI_VALUE},     {"--arena-seed", CLI_VALUE},
    {"--arena-generations", CLI_VALUE}, {"--arena-stall", CLI_VALUE},
    {"--arena-time-limit", CLI_VALUE},  {"--model", CLI_VALUE},
    {"--gpus", CLI_VALUE},          {"--nodes", CLI_VALUE},
    {"--seq-len", CLI_VALUE},       {"--node-link", CLI_VALUE},
    {"--network", CLI_VALUE},       {"--host-memory", CLI_VALUE},
    {"--reserve", CLI_VALUE},       {"--profile", CLI_VALUE},
    {"--save-cluster", CLI_VALUE},  {"--min-gain", CLI_VALUE},
    {"--schedule", CLI_VALUE},      {"--virtual-stages", CLI_VALUE},
    {NULL, CLI_FLAG}};

/* What the command line asks for. */
struct plan_args {
    const char *cluster_file, *out_file, *export_format, *for_framework;
    struct plan_options o;
    int quiet, auto_micro, min_gain_given;
    int default_time_limit; /* --repartition without --time-limit */
    char **share; /* --share: the job arguments */
    int n_share;
    long micro_batches, global_batch, virtual_stages;
    struct plan_arena_args arena;
    struct plan_gpus gpus; /* one-line planning */
};

static int set_schedule(struct plan_options *o, const char *v)
{
    enum schedule kind;
    o->schedule_auto = strcmp(v, "auto") == 0;
    if (!o->schedule_auto && schedule_parse(v, &kind) != 0)
        return cli_usage_error("plan", "--schedule: \"%s\", expected %s or auto", v,
                               schedule_names());
    o->schedule = o->schedule_auto ? -1 : (int)kind;
    return ERR_OK;
}

/* A share in [0, 1), written as a fraction (0.005) or a percentage (0.5%). */
static int parse_fraction(const char *v, double *out)
{
    char text[64];
    size_t n = strlen(v);
    int percent = n > 0 && n < sizeof text && v[n - 1] == '%';
    snprintf(text, sizeof text, "%.*s", (int)(percent ? n - 1 : n), v);
    if (cli_parse_double(text, out))
        return -1;
    *out /= percent ? 100 : 1;
    return *out >= 0 && *out < 1 ? 0 : -1;
}

/* Sets option `name` from its value: ERR_OK or a usage error's status (printed). */
static int set_value(struct plan_args *a, const char *name, const char *v)
{
    struct plan_options *o = &a->o;
    struct err e;
    err_clear(&e);
    if (strcmp(name, "--cluster") == 0)
        a->cluster_file = v;
    else if (strcmp(name, "-o") == 0)
        a->out_file = v;
    else if (strcmp(name, "--method") == 0 && plan_method_parse(v, o, &e))
        return cli_fail("plan", &e);
    else if (strcmp(name, "--actions") == 0 && plan_actions_parse(v, o, &e))
        return cli_fail("plan", &e);
    else if (strcmp(name, "--reduce") == 0 &&
             (cli_parse_double(v, &o->reduce) || !(o->reduce > 0 && o->reduce <= 1)))
        return cli_usage_error("plan", "--reduce: \"%s\", expected a number in (0, 1]", v);
    else if (strcmp(name, "--unit") == 0 && cli_parse_bytes(v, &o->unit_bytes))
        return cli_usage_error("plan", "--unit: \"%s\", expected a positive byte count", v);
    else if (strcmp(name, "--time-unit") == 0 &&
             (cli_parse_double(v, &o->time_unit_ms) || !(o->time_unit_ms > 0)))
        return cli_usage_error("plan", "--time-unit: \"%s\", expected milliseconds > 0", v);
    else if (strcmp(name, "--search-nodes") == 0 && cli_parse_int(v, 1, 1L << 40, &o->search_nodes))
        return cli_usage_error("plan", "--search-nodes: \"%s\", expected a count >= 1", v);
    else if (strcmp(name, "--time-limit") == 0 &&
             (cli_parse_double(v, &o->time_limit_s) || !(o->time_limit_s > 0)))
        return cli_usage_error("plan", "--time-limit: \"%s\", expected seconds > 0", v);
    else if (strcmp(name, "--min-gain") == 0 && parse_fraction(v, &o->min_gain))
        return cli_usage_error("plan", "--min-gain: \"%s\", expected a share of the step in [0, "
                               "1) (0.005) or a percentage (0.5%%)", v);
    else if (strcmp(name, "--min-gain") == 0)
        a->min_gain_given = 1;
    else if (strcmp(name, "--search-gap") == 0 &&
             (cli_parse_double(v, &o->search_gap) || !(o->search_gap >= 0 && o->search_gap < 1)))
        return cli_usage_error("plan", "--search-gap: \"%s\", expected a fraction in [0, 1)", v);
    else if (strcmp(name, "--micro-batches") == 0 && strcmp(v, "auto") == 0)
        a->auto_micro = 1;
    else if (strcmp(name, "--micro-batches") == 0 && cli_parse_int(v, 1, 1 << 20, &a->micro_batches))
        return cli_usage_error("plan", "--micro-batches: \"%s\", expected a count >= 1 or auto",
                               v);
    else if (strcmp(name, "--global-batch") == 0 && cli_parse_int(v, 1, 1 << 20, &a->global_batch))
        return cli_usage_error("plan", "--global-batch: \"%s\", expected a count >= 1", v);
    else if ((strcmp(name, "--export") == 0 || strcmp(name, "--for") == 0) &&
             framework_find(v, NULL) == NULL)
        return cli_usage_error("plan", "%s: \"%s\", expected %s", name, v, framework_names());
    else if (strcmp(name, "--export") == 0 && framework_is_ballast(framework_find(v, NULL)))
        return cli_usage_error("plan", "--export: \"%s\" is Ballast's own plan file (-o)", v);
    else if (strcmp(name, "--export") == 0)
        a->export_format = v;
    else if (strcmp(name, "--schedule") == 0)
        return set_schedule(o, v);
    else if (strcmp(name, "--virtual-stages") == 0 &&
             cli_parse_int(v, 1, SCHEDULE_CHUNKS_MAX, &a->virtual_stages))
        return cli_usage_error("plan", "--virtual-stages: \"%s\", expected 1 to %d", v,
                               SCHEDULE_CHUNKS_MAX);
    else if (strcmp(name, "--virtual-stages") == 0)
        o->virtual_stages = (int)a->virtual_stages;
    else if (strcmp(name, "--for") == 0)
        o->framework = framework_find(v, NULL);
    return ERR_OK;
}

/* An option that takes a value at argv[*i] (then *i moves past it): *taken says whether it
 * was one; ERR_OK or a usage error's status (printed). */
static int value_option(int argc, char **argv, int *i, struct plan_args *a, int *taken)
{
    static const char *const names[] = {"--cluster", "--method", "--reduce", "--unit",
                                        "--time-unit", "-o", "--search-nodes", "--time-limit",
                                        "--search-gap", "--micro-batches", "--global-batch",
                                        "--export", "--actions", "--min-gain", "--for",
                                        "--schedule", "--virtual-stages"};
    const char *v;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        int r = cli_option(argc, argv, i, names[k], &v);
        *taken = r != 0;
        if (r < 0)
            return ERR_INPUT;
        if (r > 0)
            return set_value(a, names[k], v);
    }
    return ERR_OK;
}

/* A flag at argv[i]: 1 taken, 0 not a flag of plan. */
static int flag_option(char **argv, int i, struct plan_args *a)
{
    int *flag = cli_flag(argv, i, "--repartition")    ? &a->o.repartition
                : cli_flag(argv, i, "--whole-layers") ? &a->o.whole_layers
                : cli_flag(argv, i, "--verify")       ? &a->o.verify
                : cli_flag(argv, i, "--quiet")        ? &a->quiet
                                                      : NULL;
    if (flag != NULL)
        *flag = 1;
    return flag != NULL;
}

/* What a pool of GPUs (a file's, or --gpus's) cannot take: ERR_OK or a usage error's status
 * (printed). */
static int pool_usage(const struct plan_args *a, int pipelines)
{
    if (a->o.schedule >= 0 || a->o.schedule_auto || a->virtual_stages)
        return cli_usage_error("plan", "a pool or several pipelines are planned on their "
                               "file's schedule: no --schedule or --virtual-stages");
    if (pipelines > 0 || a->export_format || a->auto_micro || a->micro_batches || a->arena.on ||
        a->o.method != METHOD_OPTIMAL)
        return cli_usage_error("plan", "a pool of GPUs is searched with --method optimal (it "
                               "repartitions every candidate), no --export, --micro-batches or "
                               "--arena, and no \"pipelines\" in the file (ballast export --plan "
                               "ANSWER --to F writes its launch)");
    return ERR_OK;
}

/* The option at argv[*i] (*i moves past its values): -1 help was printed; otherwise ERR_OK or
 * the usage error's status (printed). */
static int parse_option(int argc, char **argv, int *i, struct plan_args *a)
{
    int r, taken;
    if (cli_is_help(argv[*i])) {
        help();
        return -1;
    }
    if (strcmp(argv[*i], "--share") == 0) {
        a->share = argv + *i + 1;
        while (*i + 1 < argc && argv[*i + 1][0] != '-')
            a->n_share++, (*i)++;
        return ERR_OK;
    }
    if (plan_gpus_option(argc, argv, i, &a->gpus, &r))
        return r;
    if (plan_arena_option(argc, argv, i, &a->arena, &r))
        return r;
    if ((r = value_option(argc, argv, i, a, &taken)) != ERR_OK)
        return r;
    if (!taken && !flag_option(argv, *i, a))
        return cli_usage_error("plan", "unknown option \"%s\"", argv[*i]);
    return ERR_OK;
}

/* Which planning is asked for (jobs sharing devices, a pool in one line, a cluster file) and
 * what it cannot take: ERR_OK or the usage error's status (printed). */
static int check_planning(const struct plan_args *a)
{
    if (a->share != NULL && (a->n_share == 0 || a->cluster_file != NULL || a->export_format ||
                             a->auto_micro || a->micro_batches ||
                             !framework_is_ballast(a->o.framework)))
        return cli_usage_error("plan", "--share takes one or more job files (jobs Ballast "
                               "runs), and no --cluster, --for, --export or --micro-batches");
    if (a->share != NULL && (a->o.schedule >= 0 || a->o.schedule_auto || a->virtual_stages))
        return cli_usage_error("plan", "--share plans each job on its cluster's schedule: no "
                               "--schedule or --virtual-stages");
    if (plan_gpus_given(&a->gpus) && (a->gpus.gpus == NULL || a->cluster_file || a->share))
        return cli_usage_error("plan", "--model, --gpus and their options plan a pool of GPUs "
                               "in one line: give --gpus, and no --cluster or --share");
    if (a->cluster_file == NULL && a->share == NULL && a->gpus.gpus == NULL)
        return cli_usage_error("plan", "--cluster (or --model and --gpus) is required");
    if (a->gpus.gpus != NULL && pool_usage(a, 0))
        return ERR_INPUT;
    return ERR_OK;
}

/* The arena's options joined to the planner's, and the options that do not go together:
 * ERR_OK or the usage error's status (printed). */
static int check_combinations(struct plan_args *a)
{
    struct err e;
    err_clear(&e);
    a->o.arena = a->arena.on ? &a->arena.o : NULL;
    a->arena.o.offload = (a->o.actions & PLAN_ACTION_OFFLOAD) != 0;
    if (plan_options_check(&a->o, &e))
        return cli_usage_error("plan", "%s", e.msg);
    if (a->min_gain_given && a->o.method != METHOD_OPTIMAL)
        return cli_usage_error("plan", "--min-gain applies to --method optimal only (the other "
                               "methods take no optional action)");
    if (a->global_batch && !a->auto_micro && a->gpus.gpus == NULL)
        return cli_usage_error("plan", "--global-batch applies to --micro-batches auto and "
                               "--gpus");
    if (a->arena.explain >= 0 && !a->arena.on)
        return cli_usage_error("plan", "--explain-arena needs --arena METHOD");
    /* the arena's objects have no host mirror yet: the two would disagree on the device
     * memory */
    if (a->arena.on && (a->o.actions & PLAN_ACTION_OPTIMIZER))
        return cli_usage_error("plan", "--arena and --actions optimizer cannot be combined yet "
                               "(the arena has no place for a host optimizer's gradients)");
    if (cli_check_output("plan", a->out_file))
        return ERR_INPUT;
    return ERR_OK;
}

/* -1: help was printed; otherwise ERR_OK or the usage error's status (printed). */
static int parse_args(int argc, char **argv, struct plan_args *a)
{
    *a = (struct plan_args){0};
    plan_options_default(&a->o);
    a->o.estimate = estimate_profile; /* profiles at other micro-batch sizes */
    a->o.estimate_for = estimate_for_framework; /* --for: the framework's activations */
    plan_arena_args_default(&a->arena);
    for (int i = 1; i < argc; i++) {
        int rc = parse_option(argc, argv, &i, a);
        if (rc)
            return rc;
    }
    int rc = check_planning(a);
    return rc ? rc : check_combinations(a);
}

/* A --repartition search that stopped before the end says so, even with --quiet: the plan is
 * then the best found, within its certified gap of the fastest. */
static void print_stopped(const struct plan_args *a, const struct plan *p)
{
    if (!p->search.present || p->search.exhausted)
        return;
    char why[128];
    if (p->search.nodes >= a->o.search_nodes)
        snprintf(why, sizeof why, "its node budget (--search-nodes %ld)", a->o.search_nodes);
    else
        snprintf(why, sizeof why, "its time limit (--time-limit %g s%s)", a->o.time_limit_s,
                 a->default_time_limit ? ", the default" : "");
    if (p->optimality_gap < 0) /* a plan that offloads has none (README) */
        fprintf(stderr, "ballast plan: --repartition stopped at %s: the split and order are the "
                "best found by then\n", why);
    else
        fprintf(stderr, "ballast plan: --repartition stopped at %s: the plan's %.3f ms is "
                "within %.3f%% of the fastest split and order (certified: none is faster than "
                "%.3f ms)\n", why, p->iteration_ms, 100 * p->optimality_gap,
                p->search.lower_bound);
}

/* Reads the cluster from its parsed file and plans it. */
static int make_plan(const struct plan_args *a, const cJSON *root, struct plan *p,
                     struct err *e)
{
    struct cluster c;
    if (cluster_parse(root, a->cluster_file, &c, e))
        return e->code;
    cluster_warn_cpu_threads(root, &c, stderr);
    if (a->micro_batches)
        c.micro_batches = (int)a->micro_batches;
    int rc;
    if (a->auto_micro) {
        long global = a->global_batch ? a->global_batch
                                      : (long)c.micro_batches * c.model.micro_batch *
                                            c.stages[0].dp;
        rc = planner_make_auto(&c, &a->o, (int)global,
                               a->quiet ? NULL : (a->export_format ? stderr : stdout), p, e);
    } else {
        rc = planner_make(&c, &a->o, p, e);
    }
    cluster_free(&c);
    if (rc == ERR_OK && a->arena.on)
        rc = plan_arena_apply(&a->arena, p, e);
    return rc;
}

/* The table, the export and the plan file. */
static int write_outputs(const struct plan_args *a, const struct plan *p, struct err *e)
{
    if (!a->quiet) {
        struct plan_kinds k;
        planner_print(a->export_format ? stderr : stdout, p);
        plan_kinds_make(p, 1, p->iteration_ms, NULL, &k);
        plan_kinds_print(a->export_format ? stderr : stdout, &k);
    }
    if (a->arena.explain >= 0)
        arena_explain(a->export_format ? stderr : stdout, p, (int)a->arena.explain);
    /* the per-rank file, when there is one, beside the plan file (else here) */
    char stages[4096] = "";
    if (a->out_file != NULL) {
        snprintf(stages, sizeof stages, "%s", a->out_file);
        char *slash = strrchr(stages, '/');
        snprintf(slash ? slash + 1 : stages, sizeof stages - (size_t)(slash ? slash + 1 - stages : 0),
                 "ballast_stages.py");
    }
    if (a->export_format != NULL &&
        cli_export(p, 1, a->export_format, NULL, stages[0] ? stages : NULL, NULL,
                   a->out_file ? a->out_file : "", e))
        return e->code;
    if (a->out_file != NULL && plan_write(a->out_file, p, e))
        return e->code;
    return ERR_OK;
}

/* The cluster file, parsed once: a pool, pipelines, or one pipeline. `written`: the file is
 * the pool --gpus wrote. */
static int plan_cluster(struct plan_args *a, const cJSON *root, int written)
{
    struct plan p;
    struct err e;
    err_clear(&e);
    int pipelines, rc;
    int pool = cJSON_GetObjectItemCaseSensitive(root, "pool") != NULL;
    if (cluster_pipeline_count(root, a->cluster_file, &pipelines, &e))
        return cli_fail("plan", &e);
    if (pool && pool_usage(a, pipelines))
        return ERR_INPUT;
    if (pool) {
        rc = cmd_plan_pool(root, a->cluster_file, &a->o, a->out_file, a->quiet);
        if (written)
            plan_gpus_print_written(stdout, a->cluster_file);
        return rc;
    }
    a->default_time_limit = a->o.repartition && !(a->o.time_limit_s > 0);
    if (a->default_time_limit)
        a->o.time_limit_s = PLAN_REPARTITION_TIME_LIMIT_DEFAULT_S;
    if (pipelines > 0 && (a->o.schedule >= 0 || a->o.schedule_auto || a->virtual_stages))
        return pool_usage(a, pipelines);
    if (pipelines > 0 && (a->export_format || a->auto_micro || a->micro_batches || a->arena.on))
        return cli_usage_error("plan", "a cluster of several pipelines takes no --export, "
                               "--micro-batches or --arena (plan each pipeline for those)");
    if (pipelines > 0)
        return cmd_plan_replicas(root, a->cluster_file, pipelines, &a->o, a->out_file,
                                 a->quiet);
    if (make_plan(a, root, &p, &e))
        return cli_fail("plan", &e);
    print_stopped(a, &p);
    if (write_outputs(a, &p, &e)) {
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

int cmd_plan(int argc, char **argv)
{
    struct plan_args a;
    struct err e;
    err_clear(&e);
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc < 0 ? ERR_OK : rc;
    if (a.share != NULL)
        return cmd_plan_share(a.share, a.n_share, &a.o, a.out_file, a.quiet);
    char written[4096];
    if (a.gpus.gpus != NULL) {
        if (plan_gpus_write(&a.gpus, a.global_batch, a.out_file, written, sizeof written, &e))
            return cli_fail("plan", &e);
        a.cluster_file = written;
        a.global_batch = 0; /* the pool's, now in the file */
    }
    cJSON *root = jsonio_read_kind(a.cluster_file, JSONIO_CLUSTER, &e);
    if (root == NULL)
        return cli_fail("plan", &e);
    rc = plan_cluster(&a, root, a.cluster_file == written);
    cJSON_Delete(root);
    return rc;
}
