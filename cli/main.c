/* ballast: plans and runs pipeline-parallel training on clusters of mixed GPUs. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct cli_command commands[] = {
    {"profile", "measure (or estimate) every layer's time and memory on a device", cmd_profile},
    {"plan", "choose each stage's recomputed layers so every stage fits", cmd_plan},
    {"simulate", "simulate a plan's pipeline schedule: iteration time, bubble, trace", cmd_simulate},
    {"export", "a plan as Megatron-LM, NeMo, ColossalAI or FlagScale settings", cmd_export},
    {"check", "score a framework configuration against the best plan for it", cmd_check},
    {"bench", "every method on the same clusters and models: tables and plots", cmd_bench},
    {"train", "train a plan's GPT, one MPI rank per stage (mpirun -np S)", cmd_train},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: ballast COMMAND [options]   (ballast COMMAND --help for its options)\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nexit status: 0 done, 1 failure while running, 2 bad input or usage, 3 no plan "
               "fits\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return ERR_INPUT;
    }
    if (cli_is_help(argv[1]) || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return ERR_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ballast: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return ERR_INPUT;
}
