#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "data.h"
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
           "       mpirun -np S ballast train --share SHARE.json [--slice K] [--switch share|full]\n"
           "         [--steps N] [--metrics FILE] ...\n\n"
           "Trains the plan's GPT with one MPI rank per stage (S = the plan's stage count),\n"
           "recomputing the layers the plan lists, and reports measured against planned memory\n"
           "and time per stage.\n\n"
           "  --plan FILE       the plan (ballast-plan/1): fp32 or bf16 (small runs on a CPU)\n"
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
           "                    names; F32 or BF16); {stage} in FILE: each stage its own file\n"
           "  --save-weights FILE  write the weights at the end as safetensors (F32, BF16 for\n"
           "                    a bf16 model): one file, or with {stage} one per stage\n"
           "  --quiet           no per-step lines\n"
           "  --share FILE      the jobs of a ballast-share/1 file (ballast plan --share) in turn\n"
           "                    on the same ranks, each in its persistent region, all through one\n"
           "                    temporary region, until each has run --steps\n"
           "  --slice K         steps of a job before switching to the next (default 1)\n"
           "  --switch M        share (default): a switch moves nothing; full: the baseline that\n"
           "                    copies a job's device state to host and back at each switch\n"
           "  --check-arena     with a plan whose stages lay out an arena (plan --arena): fail\n"
           "                    if two objects in use at once share a byte\n"
           "  --timeout S       a rank that waits S seconds (default %d) for another gives up,\n"
           "                    names the rank that went silent and stops the job (exit 1)\n"
           "  --host-link-gbps X  CPU stages: copies to and from host memory (offload) take\n"
           "                    as long as on an X Gbit/s link (a PCIe link, emulated)\n\n"
           "exit status: 0 done, 1 failure while running, 2 bad input, 3 a stage does not fit\n"
           "its memory limit\n",
           TRAIN_DEFAULT_LR, TRAIN_DEFAULT_TIMEOUT_S);
}

static int parse(int argc, char **argv, struct train_options *o)
{
    const char *v;
    long n;
    int format_given = 0;
    for (int i = 1; i < argc; i++) {
        int r;
#define VALUE(name) ((r = cli_option(argc, argv, &i, name, &v)) != 0)
        if (VALUE("--plan")) {
            if (r < 0)
                return ERR_INPUT;
            o->plan_file = v;
        } else if (VALUE("--share")) {
            if (r < 0)
                return ERR_INPUT;
            o->share_file = v;
        } else if (VALUE("--slice")) {
            if (r < 0)
                return ERR_INPUT;
            if (cli_parse_int(v, 1, 1L << 40, &n))
                return cli_usage_error("train", "--slice: \"%s\", expected a count >= 1", v);
            o->slice = n;
        } else if (VALUE("--switch")) {
            if (r < 0)
                return ERR_INPUT;
            if (strcmp(v, "share") != 0 && strcmp(v, "full") != 0)
                return cli_usage_error("train", "--switch: \"%s\", expected share or full", v);
            o->switch_full = strcmp(v, "full") == 0;
        } else if (VALUE("--steps")) {
            if (r < 0)
                return ERR_INPUT;
            if (cli_parse_int(v, 1, 1L << 40, &n))
                return cli_usage_error("train", "--steps: \"%s\", expected a count >= 1", v);
            o->steps = n;
        } else if (VALUE("--data")) {
            if (r < 0)
                return ERR_INPUT;
            o->data_file = v;
        } else if (VALUE("--data-format")) {
            if (r < 0)
                return ERR_INPUT;
            if (strcmp(v, "llmc") != 0 && strcmp(v, "bytes") != 0)
                return cli_usage_error("train", "--data-format: \"%s\", expected llmc or bytes",
                                       v);
            o->data_format = strcmp(v, "bytes") == 0 ? DATA_FORMAT_BYTES : DATA_FORMAT_TOKENS;
            format_given = 1;
        } else if (VALUE("--seed")) {
            if (r < 0)
                return ERR_INPUT;
            if (cli_parse_int(v, 0, 0x7fffffffffffffffL, &n))
                return cli_usage_error("train", "--seed: \"%s\", expected an integer >= 0", v);
            o->seed = (uint64_t)n;
        } else if (VALUE("--lr")) {
            if (r < 0)
                return ERR_INPUT;
            if (cli_parse_double(v, &o->lr) || !(o->lr > 0 && o->lr < 1))
                return cli_usage_error("train", "--lr: \"%s\", expected a number in (0, 1)", v);
        } else if (VALUE("--threads")) {
            if (r < 0)
                return ERR_INPUT;
            if (cli_parse_int(v, 1, 1024, &n))
                return cli_usage_error("train", "--threads: \"%s\", expected 1..1024", v);
            o->threads = (int)n;
        } else if (VALUE("--metrics")) {
            if (r < 0)
                return ERR_INPUT;
            o->metrics_file = v;
        } else if (VALUE("--trace")) {
            if (r < 0)
                return ERR_INPUT;
            o->trace_file = v;
        } else if (VALUE("--save")) {
            if (r < 0)
                return ERR_INPUT;
            o->save_dir = v;
        } else if (VALUE("--save-every")) {
            if (r < 0)
                return ERR_INPUT;
            if (cli_parse_int(v, 1, 1L << 40, &n))
                return cli_usage_error("train", "--save-every: \"%s\", expected a count >= 1",
                                       v);
            o->save_every = n;
        } else if (VALUE("--init")) {
            if (r < 0)
                return ERR_INPUT;
            o->init_file = v;
        } else if (VALUE("--save-weights")) {
            if (r < 0)
                return ERR_INPUT;
            o->save_weights_file = v;
        } else if (VALUE("--resume")) {
            if (r < 0)
                return ERR_INPUT;
            o->resume_dir = v;
        } else if (VALUE("--device")) {
            if (r < 0)
                return ERR_INPUT;
            if (strcmp(v, "auto") != 0 && strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0)
                return cli_usage_error("train", "--device: \"%s\", expected auto, cpu or cuda",
                                       v);
            o->device = v;
        } else if (VALUE("--transport")) {
            if (r < 0)
                return ERR_INPUT;
            if (strcmp(v, "auto") != 0 && strcmp(v, "mpi") != 0 && strcmp(v, "nccl") != 0)
                return cli_usage_error("train",
                                       "--transport: \"%s\", expected auto, mpi or nccl", v);
            o->transport = v;
        } else if (VALUE("--timeout")) {
            if (r < 0)
                return ERR_INPUT;
            if (cli_parse_double(v, &o->timeout_s) || !(o->timeout_s > 0 && o->timeout_s <= 1e7))
                return cli_usage_error("train", "--timeout: \"%s\", expected seconds in (0, 1e7]",
                                       v);
        } else if (VALUE("--host-link-gbps")) {
            if (r < 0)
                return ERR_INPUT;
            if (cli_parse_double(v, &o->host_link_gbps) ||
                !(o->host_link_gbps > 0 && o->host_link_gbps <= 1e6))
                return cli_usage_error("train",
                                       "--host-link-gbps: \"%s\", expected Gbit/s in (0, 1e6]", v);
        } else if (cli_flag(argv, i, "--quiet")) {
            o->quiet = 1;
        } else if (cli_flag(argv, i, "--check-arena")) {
            o->check_arena = 1;
        } else {
            return cli_usage_error("train", "unknown option \"%s\"", argv[i]);
        }
#undef VALUE
    }
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

/* A stage split over tp GPUs or replicated dp times: the runtime runs one GPU per stage and one
 * pipeline, so such a plan is for export. */
static void refuse_group(const struct plan *p, const char *plan_file, struct err *e)
{
    for (int s = 0; s < p->n_stages && e->code == ERR_OK; s++)
        if (p->stages[s].tp > 1 || p->stages[s].dp > 1)
            err_set(e, ERR_INPUT,
                    "%s: stages[%d]: tp %d, dp %d: ballast train runs one GPU per stage and one "
                    "pipeline; a plan with tensor or data parallelism is for export (ballast "
                    "plan --export)",
                    plan_file, s, p->stages[s].tp, p->stages[s].dp);
}

/* A plan of a custom model has each layer's costs but no layers to run: refused before any
 * rank starts. A plan that does not load is train_run's to report. */
static int refuse_custom(const char *plan_file)
{
    struct plan p;
    struct err e;
    err_clear(&e);
    if (plan_load(plan_file, &p, &e))
        return ERR_OK;
    if (model_ops_of(&p.model) == NULL)
        err_set(&e, ERR_INPUT,
                "%s: model: \"%s\" is a custom model: Ballast has no layers to run for a "
                "custom model (its profiles give each layer's costs, not its computation); run "
                "the plan in your framework (ballast plan --export)",
                plan_file, p.model.name);
    refuse_group(&p, plan_file, &e);
    plan_free(&p);
    return e.code ? cli_fail("train", &e) : ERR_OK;
}

int cmd_train(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) {
            help();
            return ERR_OK;
        }
    int rank = 0;
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        fprintf(stderr, "ballast train: MPI_Init failed\n");
        return ERR_FAIL;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    struct train_options o = {.steps = 10, .slice = 1, .seed = 1, .lr = TRAIN_DEFAULT_LR, .device = "auto",
                              .transport = "auto", .timeout_s = TRAIN_DEFAULT_TIMEOUT_S};
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
    int rc = parse(argc, argv, &o);
    if (rc == ERR_OK && o.plan_file != NULL)
        rc = refuse_custom(o.plan_file);
    if (saved >= 0) {
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
    }
    if (rc == ERR_OK)
        rc = train_run(&o);
    MPI_Finalize();
    return rc;
}
