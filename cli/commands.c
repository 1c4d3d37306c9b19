/* The commands of `ballast` and the check of their options against their tables. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

const struct cli_command cli_commands[] = {
    {"profile", "measure (or estimate) every layer's time and memory on a device", cmd_profile,
     cmd_profile_options},
    {"plan", "choose each stage's layers and actions so every stage fits (one line: --gpus)",
     cmd_plan, cmd_plan_options},
    {"simulate", "simulate a plan's pipeline schedule: iteration time, bubble, trace",
     cmd_simulate, cmd_simulate_options},
    {"export", "a plan as Megatron-LM, NeMo, ColossalAI or FlagScale settings", cmd_export,
     cmd_export_options},
    {"check", "score a framework configuration against the best plan for it", cmd_check,
     cmd_check_options},
    {"bench", "every method on the same clusters and models: tables and plots", cmd_bench,
     cmd_bench_options},
    {"train", "train a plan's GPT or Llama, one MPI rank per stage (mpirun -np S)", cmd_train,
     cmd_train_options},
};
const int cli_n_commands = (int)(sizeof cli_commands / sizeof cli_commands[0]);

static const struct cli_opt *find_option(const struct cli_opt *table, const char *arg)
{
    size_t n = strcspn(arg, "=");
    for (const struct cli_opt *o = table; o->name != NULL; o++)
        if (strlen(o->name) == n && strncmp(o->name, arg, n) == 0 &&
            (arg[n] == '\0' || o->kind != CLI_FLAG))
            return o;
    return NULL;
}

int cli_check_options(const struct cli_command *c, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (cli_is_help(arg))
            return ERR_OK; /* the command prints its help, whatever else is there */
        if (arg[0] != '-' || arg[1] == '\0')
            continue; /* a value or an operand: the command's to judge */
        const struct cli_opt *o = find_option(c->options, arg);
        if (o == NULL)
            return cli_usage_error(c->name, "unknown option \"%s\"", arg);
        if (o->kind == CLI_VALUE && strchr(arg, '=') == NULL)
            i++; /* its value, whatever it looks like */
        while (o->kind == CLI_VALUES && i + 1 < argc && argv[i + 1][0] != '-')
            i++;
    }
    return ERR_OK;
}
