#include <fcntl.h>
#include <mpi.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "data.h"
#include "heartbeat.h"
#include "model_ops.h"
#include "plan.h"
#include "train.h"

static void help(void)
{
    printf("usage: mpirun -np S ballast train --plan PLAN.json [--steps N] [--data FILE\n"
           "         [--data-format llmc|bytes]] [--seed N] [--lr X] [--threads N]\n"
           "         [--metrics METRICS.json] [--trace TRACE.json] [--save DIR [--save-every N]]\n"
           "         [--resume DIR] [--quiet]\n"
           "         [--init FILE.safetensors] [--save-weights FILE.safetensors]\n"
           "         [--device auto|cpu|cuda] [--transport auto|mpi|nccl] [--timeout SECONDS]\n"
           "         [--stall SECONDS] [--check-arena] [--host-link-gbps RATE]\n"
           "         [--initial-loss-scale X] [--min-loss-scale X] [--loss-scale-window N]\n"
           "         [--hysteresis N] [--loss-scale-growth X] [--loss-scale-backoff X]\n"
           "       mpirun -np S ballast train --share SHARE.json [--slice K] [--switch share|full]\n"
           "         [--steps N] [--metrics FILE] ...\n\n"
           "Trains the plan's GPT with one MPI rank per stage (S = the plan's stage count),\n"
           "recomputing the layers the plan lists, and reports measured against planned memory\n"
           "and time per stage.\n\n"
           "  --plan FILE       the plan (ballast-plan/1): fp32, bf16 or fp16 (small runs on a\n"
           "                    CPU)\n"
           "  --steps N         train up to step N (default 10; a resumed run continues to N)\n"
           "  --data FILE       train on FILE's tokens; default: a synthetic Markov source of\n"
           "                    entropy ln 4 nats per token\n"
           "  --data-format F   llmc (default): llm.c's token file (a header of 256 int32:\n"
           "                    magic 20240520, version 1, token count; then uint16 tokens,\n"
           "                    each < vocab_size); bytes: the file's bytes (vocab_size >= 256)\n"
           "  --seed N          weights and data (default 1)\n"
           "  --lr X            AdamW learning rate (default %g; betas 0.9, 0.95, eps 1e-8,\n"
           "                    weight decay 0.1 on the weight matrices and embeddings)\n"
           "  --threads N       threads per CPU rank (default: the host's cores / its ranks)\n"
           "  --device D        auto (default): each stage where its plan's device is, a GPU\n"
           "                    (local rank mod the node's GPUs) for a CUDA device, else the\n"
           "                    CPU; cpu or cuda: every stage there\n"
           "  --transport T     auto (default): NCCL when every rank has a GPU of its own,\n"
           "                    else MPI (host-staged for GPU ranks); mpi; nccl\n"
           "  --metrics FILE    write ballast-metrics/1 at the end\n"
           "  --trace FILE      write a Chrome trace (Perfetto) of every stage\n"
           "  --save DIR        write a checkpoint at the end (and every --save-every N steps)\n"
           "  --resume DIR      continue from DIR's checkpoint\n"
           "  --init FILE       start from FILE's weights (safetensors, Hugging Face GPT-2\n"
           "                    names; F32, BF16 or F16; finite); {stage} in FILE: each stage\n"
           "                    its own file\n"
           "  --save-weights FILE  write the weights at the end as safetensors (F32, BF16 for\n"
           "                    a bf16 model, F16 for fp16): one file, or with {stage} one per\n"
           "                    stage\n"
           "  --quiet           no per-step lines\n"
           "  --share FILE      the jobs of a ballast-share/1 file (ballast plan --share) in turn\n"
           "                    on the same ranks, each in its persistent region, all through one\n"
           "                    temporary region, until each has run --steps\n"
           "  --slice K         steps of a job before switching to the next (default 1)\n"
           "  --switch M        share (default): a switch moves nothing; full: the baseline that\n"
           "                    copies a job's device state to host and back at each switch\n"
           "                    With --share, {job} in --init and --save-weights FILE is each\n"
           "                    job's name (--save-weights of several jobs needs it)\n"
           "  --check-arena     with a plan whose stages lay out an arena (planned with an\n"
           "                    arena): fail if two objects in use at once share a byte\n"
           "  --timeout S       a rank whose heartbeat has not been heard for S seconds\n"
           "                    (default %d) has stopped or died: every rank names it (world\n"
           "                    rank, replica, stage) and the job stops (exit 1); a slow but\n"
           "                    live rank is waited for however long it takes\n"
           "  --stall S         a rank alive but without progress (no layer computed, no piece\n"
           "                    of a file read or written) for S seconds (default %d) while it\n"
           "                    waits on no other rank is stuck: named, and the job stops\n"
           "  --host-link-gbps RATE  CPU stages: copies to and from host memory (offload) take\n"
           "                    as long as on a link of RATE (\"100Gbps\", \"16GB/s\"; a number\n"
           "                    alone is Gbit/s): a PCIe link, emulated\n"
           "an fp16 model's dynamic loss scaling (Megatron-LM's, with DeepSpeed's defaults; a step\n"
           "whose gradients overflow is skipped; the run stops at an overflow at the minimum):\n"
           "  --initial-loss-scale X  the first step's scale (default 65536)\n"
           "  --min-loss-scale X  the least scale (default 1; at most the initial scale)\n"
           "  --loss-scale-window N  steps without an overflow before the scale grows\n"
           "                    (default 1000)\n"
           "  --hysteresis N    overflows before the scale backs off (default 2)\n"
           "  --loss-scale-growth X  its growth factor, above 1 (default 2)\n"
           "  --loss-scale-backoff X  its backoff factor, in (0, 1) (default 0.5)\n\n"
           "A NaN or an infinity in the loss or the gradients of an fp32 or bf16 model stops the\n"
           "run (exit 1) before the optimizer step, on every rank.\n\n"
           "exit status: 0 done, 1 failure while running, 2 bad input, 3 a stage does not fit\n"
           "its memory limit\n",
           TRAIN_DEFAULT_LR, TRAIN_DEFAULT_TIMEOUT_S, TRAIN_DEFAULT_STALL_S);
}

/* The options: each sets one field of struct train_options from its value. */
enum opt_kind {
    OPT_PATH,   /* const char *: a file or folder */
    OPT_COUNT,  /* int64_t in [lo, hi] */
    OPT_INT,    /* int in [lo, hi] */
    OPT_SEED,   /* uint64_t in [lo, LONG_MAX] */
    OPT_REAL,   /* double in (lo, hi] (lo excluded: rates and times are positive) */
    OPT_GBPS,   /* the same, a rate in Gbit/s with or without a unit ("100Gbps", "50GB/s") */
    OPT_CHOICE, /* const char *: one of `choices` */
    OPT_FLAG,   /* int set to 1; takes no value */
};

struct opt {
    const char *name;
    enum opt_kind kind;
    size_t at; /* offsetof the field */
    double lo, hi;
    const char *expected; /* for the usage error: "expected <this>" */
    const char *choices;  /* OPT_CHOICE: "|a|b|" */
};

#define AT(field) offsetof(struct train_options, field)
static const struct opt opts[] = {
    {"--plan", OPT_PATH, AT(plan_file), 0, 0, NULL, NULL},
    {"--share", OPT_PATH, AT(share_file), 0, 0, NULL, NULL},
    {"--data", OPT_PATH, AT(data_file), 0, 0, NULL, NULL},
    {"--metrics", OPT_PATH, AT(metrics_file), 0, 0, NULL, NULL},
    {"--trace", OPT_PATH, AT(trace_file), 0, 0, NULL, NULL},
    {"--save", OPT_PATH, AT(save_dir), 0, 0, NULL, NULL},
    {"--init", OPT_PATH, AT(init_file), 0, 0, NULL, NULL},
    {"--save-weights", OPT_PATH, AT(save_weights_file), 0, 0, NULL, NULL},
    {"--resume", OPT_PATH, AT(resume_dir), 0, 0, NULL, NULL},
    {"--steps", OPT_COUNT, AT(steps), 1, 0x1p40, "a count >= 1", NULL},
    {"--slice", OPT_COUNT, AT(slice), 1, 0x1p40, "a count >= 1", NULL},
    {"--save-every", OPT_COUNT, AT(save_every), 1, 0x1p40, "a count >= 1", NULL},
    {"--threads", OPT_INT, AT(threads), 1, 1024, "1..1024", NULL},
    {"--seed", OPT_SEED, AT(seed), 0, 0, "an integer >= 0", NULL},
    {"--lr", OPT_REAL, AT(lr), 0, 1 - 0x1p-53, "a number in (0, 1)", NULL},
    {"--timeout", OPT_REAL, AT(timeout_s), 0, 1e7, "seconds in (0, 1e7]", NULL},
    {"--stall", OPT_REAL, AT(stall_s), 0, 1e7, "seconds in (0, 1e7]", NULL},
    {"--host-link-gbps", OPT_GBPS, AT(host_link_gbps), 0, 1e6, "Gbit/s in (0, 1e6]", NULL},
    {"--device", OPT_CHOICE, AT(device), 0, 0, "auto, cpu or cuda", "|auto|cpu|cuda|"},
    {"--transport", OPT_CHOICE, AT(transport), 0, 0, "auto, mpi or nccl", "|auto|mpi|nccl|"},
    {"--switch", OPT_CHOICE, 0, 0, 0, "share or full", "|share|full|"},
    {"--data-format", OPT_CHOICE, 0, 0, 0, "llmc or bytes", "|llmc|bytes|"},
    {"--initial-loss-scale", OPT_REAL, AT(loss_scale.initial), 0, 0x1.fffffep127,
     "a number in (0, 3.4e38]", NULL},
    {"--min-loss-scale", OPT_REAL, AT(loss_scale.min), 0, 0x1.fffffep127,
     "a number in (0, 3.4e38]", NULL},
    {"--loss-scale-growth", OPT_REAL, AT(loss_scale.growth), 1, 0x1.fffffep127,
     "a factor above 1", NULL},
    {"--loss-scale-backoff", OPT_REAL, AT(loss_scale.backoff), 0, 1 - 0x1p-53,
     "a factor in (0, 1)", NULL},
    {"--loss-scale-window", OPT_COUNT, AT(loss_scale.window), 1, 0x1p40, "a count >= 1", NULL},
    {"--hysteresis", OPT_COUNT, AT(loss_scale.hysteresis), 1, 0x1p40, "a count >= 1", NULL},
    {"--quiet", OPT_FLAG, AT(quiet), 0, 0, NULL, NULL},
    {"--check-arena", OPT_FLAG, AT(check_arena), 0, 0, NULL, NULL},
};
#undef AT

const struct cli_opt cmd_train_options[] = {
    {"--plan", CLI_VALUE},      {"--share", CLI_VALUE},        {"--data", CLI_VALUE},
    {"--metrics", CLI_VALUE},   {"--trace", CLI_VALUE},        {"--save", CLI_VALUE},
    {"--init", CLI_VALUE},      {"--save-weights", CLI_VALUE}, {"--resume", CLI_VALUE},
    {"--steps", CLI_VALUE},     {"--slice", CLI_VALUE},        {"--save-every", CLI_VALUE},
    {"--threads", CLI_VALUE},   {"--seed", CLI_VALUE},         {"--lr", CLI_VALUE},
    {"--timeout", CLI_VALUE},   {"--stall", CLI_VALUE},        {"--host-link-gbps", CLI_VALUE},
    {"--device", CLI_VALUE},
    {"--transport", CLI_VALUE}, {"--switch", CLI_VALUE},       {"--data-format", CLI_VALUE},
    {"--initial-loss-scale", CLI_VALUE}, {"--min-loss-scale", CLI_VALUE},
    {"--loss-scale-growth", CLI_VALUE},  {"--loss-scale-backoff", CLI_VALUE},
    {"--loss-scale-window", CLI_VALUE},  {"--hysteresis", CLI_VALUE},
    {"--quiet", CLI_FLAG},      {"--check-arena", CLI_FLAG},   {NULL, CLI_FLAG}};

/* Whether `v` is one of `choices` ("|a|b|c|"). */
static int is_choice(const char *v, const char *choices)
{
    char word[32];
    return strchr(v, '|') == NULL && snprintf(word, sizeof word, "|%s|", v) < (int)sizeof word &&
           strstr(choices, word) != NULL;
}

/* Sets the option's field from `v`: ERR_OK or a usage error's status (printed). */
static int set_option(const struct opt *k, const char *v, struct train_options *o)
{
    char *field = (char *)o + k->at;
    long n;
    double x;
    switch (k->kind) {
    case OPT_PATH:
        *(const char **)field = v;
        return ERR_OK;
    case OPT_FLAG:
        *(int *)field = 1;
        return ERR_OK;
    case OPT_COUNT:
    case OPT_INT:
    case OPT_SEED:
        if (cli_parse_int(v, (long)k->lo, k->kind == OPT_SEED ? LONG_MAX : (long)k->hi, &n))
            break;
        if (k->kind == OPT_COUNT)
            *(int64_t *)field = n;
        else if (k->kind == OPT_INT)
            *(int *)field = (int)n;
        else
            *(uint64_t *)field = (uint64_t)n;
        return ERR_OK;
    case OPT_REAL:
    case OPT_GBPS:
        if ((k->kind == OPT_REAL ? cli_parse_double(v, &x) : cli_parse_gbps(v, &x)) ||
            !(x > k->lo && x <= k->hi))
            break;
        *(double *)field = x;
        return ERR_OK;
    case OPT_CHOICE:
        if (!is_choice(v, k->choices))
            break;
        if (strcmp(k->name, "--switch") == 0)
            o->switch_full = strcmp(v, "full") == 0;
        else if (strcmp(k->name, "--data-format") == 0)
            o->data_format = strcmp(v, "bytes") == 0 ? DATA_FORMAT_BYTES : DATA_FORMAT_TOKENS;
        else
            *(const char **)field = v;
        return ERR_OK;
    }
    return cli_usage_error("train", "%s: \"%s\", expected %s", k->name, v, k->expected);
}

/* *scaling: whether an option of the loss scaling was given. */
static int parse_train_args(int argc, char **argv, struct train_options *o, int *scaling)
{
    int format_given = 0;
    struct err e;
    for (int i = 1; i < argc; i++) {
        const struct opt *k = NULL;
        const char *v = NULL;
        for (size_t j = 0; k == NULL && j < sizeof opts / sizeof opts[0]; j++) {
            int r = opts[j].kind == OPT_FLAG ? cli_flag(argv, i, opts[j].name)
                                             : cli_option(argc, argv, &i, opts[j].name, &v);
            if (r < 0)
                return ERR_INPUT;
            if (r > 0)
                k = &opts[j];
        }
        if (k == NULL)
            return cli_usage_error("train", "unknown option \"%s\"", argv[i]);
        ERR_TRY(set_option(k, v, o));
        format_given |= strcmp(k->name, "--data-format") == 0;
        *scaling |= strstr(k->name, "loss-scale") != NULL || strcmp(k->name, "--hysteresis") == 0;
    }
    if (lossscale_check(&o->loss_scale, &e))
        return cli_usage_error("train", "%s", e.msg);
    if ((o->plan_file == NULL) == (o->share_file == NULL))
        return cli_usage_error("train", "one of --plan and --share is required");
    if (format_given && o->data_file == NULL)
        return cli_usage_error("train", "--data-format needs --data FILE");
    if (o->init_file != NULL && o->resume_dir != NULL)
        return cli_usage_error("train", "--init and --resume: a resumed run has its weights");
    if (o->save_every > 0 && o->save_dir == NULL)
        return cli_usage_error("train", "--save-every needs --save DIR");
    return ERR_OK;
}

/* A stage split over tp GPUs: the runtime runs one GPU per stage (dp replicas it runs, on
 * S x dp ranks), so such a plan is for export. */
static void refuse_group(const struct plan *p, const char *plan_file, struct err *e)
{
    for (int s = 0; s < p->n_stages && e->code == ERR_OK; s++)
        if (p->stages[s].tp > 1)
            err_set(e, ERR_INPUT,
                    "%s: stages[%d]: tp %d, dp %d: ballast train runs one GPU per stage; a plan "
                    "with tensor parallelism is for export (ballast plan --export)",
                    plan_file, s, p->stages[s].tp, p->stages[s].dp);
}

/* Loads the plan, once for the whole run (*loaded). A plan of a custom model has each
 * layer's costs but no layers to run, one with tp > 1 is for export, and loss scaling options
 * (`scaling`) are for an fp16 model: refused before any MPI work. A plan that does not load is
 * train_run's to report, once its ranks agree (a rank may see another file). */
static int load_plan(const char *plan_file, int scaling, struct plan *p, int *loaded)
{
    struct err e;
    err_clear(&e);
    *loaded = plan_load(plan_file, p, &e) == ERR_OK;
    if (!*loaded)
        return ERR_OK;
    if (model_ops_of(&p->model) == NULL)
        err_set(&e, ERR_INPUT,
                "%s: model: \"%s\" is a custom model: Ballast has no layers to run for a "
                "custom model (its profiles give each layer's costs, not its computation); run "
                "the plan in your framework (ballast plan --export)",
                plan_file, p->model.name);
    refuse_group(p, plan_file, &e);
    if (e.code == ERR_OK && scaling && p->model.dtype != MODEL_DTYPE_FP16)
        err_set(&e, ERR_INPUT, "%s: model.dtype: \"%s\": the loss scaling options are for an "
                "fp16 model (a %s model trains unscaled)", plan_file,
                model_dtype_name(p->model.dtype), model_dtype_name(p->model.dtype));
    if (e.code) {
        plan_free(p);
        *loaded = 0;
    }
    return e.code ? cli_fail("train", &e) : ERR_OK;
}

/* Every rank's heartbeat (heartbeat.h), with --timeout as its deadline; rank 0 says when this
 * MPI cannot run one. */
static int start_heartbeat(struct train_options *o, int rank)
{
    struct err e;
    char why[256] = "";
    err_clear(&e);
    if (heartbeat_start(&o->heartbeat, o->timeout_s, o->stall_s, why, (int)sizeof why, &e))
        return cli_fail("train", &e);
    if (o->heartbeat == NULL && rank == 0)
        fprintf(stderr, "ballast train: warning: %s\n", why);
    return ERR_OK;
}

int cmd_train(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) {
            help();
            return ERR_OK;
        }
    int rank = 0, provided = 0;
    /* a file-size limit (ulimit -f) makes writes fail (EFBIG), reported, not a kill */
    signal(SIGXFSZ, SIG_IGN);
    /* the heartbeat's thread calls MPI beside the main thread */
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "ballast train: MPI_Init_thread failed\n");
        return ERR_FAIL;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    struct train_options o = {.steps = 10, .slice = 1, .seed = 1, .lr = TRAIN_DEFAULT_LR, .device = "auto",
                              .transport = "auto", .timeout_s = TRAIN_DEFAULT_TIMEOUT_S,
                              .stall_s = TRAIN_DEFAULT_STALL_S, .loss_scale = LOSSSCALE_DEFAULTS};
    /* every rank parses the same arguments; rank 0 alone reports a problem */
    int saved = -1;
    if (rank != 0) {
        int null = open("/dev/null", O_WRONLY);
        fflush(stderr);
        saved = dup(2);
        if (null >= 0) {
            dup2(null, 2);
            close(null);
        }
    }
    struct plan plan;
    int loaded = 0;
    int scaling = 0, rc = parse_train_args(argc, argv, &o, &scaling);
    if (rc == ERR_OK && o.plan_file != NULL)
        rc = load_plan(o.plan_file, scaling, &plan, &loaded);
    o.plan = loaded ? &plan : NULL;
    if (saved >= 0) {
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
    }
    if (rc == ERR_OK)
        rc = start_heartbeat(&o, rank);
    if (rc == ERR_OK)
        rc = train_run(&o);
    heartbeat_leave(o.heartbeat, rc);
    if (o.plan != NULL)
        plan_free(&plan);
    MPI_Finalize();
    heartbeat_free(o.heartbeat);
    return rc;
}
