/* ballast: plans and runs pipeline-parallel training on clusters of mixed GPUs. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: ballast COMMAND [options]   (ballast COMMAND --help for its options)\n"
               "       ballast --version\n\n"
               "commands:\n");
    for (int i = 0; i < cli_n_commands; i++)
        fprintf(f, "  %-9s %s\n", cli_commands[i].name, cli_commands[i].summary);
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
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("%s\n", cli_version());
        return ERR_OK;
    }
    for (int i = 0; i < cli_n_commands; i++)
        if (strcmp(argv[1], cli_commands[i].name) == 0) {
            int rc = cli_check_options(&cli_commands[i], argc - 1, argv + 1);
            return rc != ERR_OK ? rc : cli_commands[i].run(argc - 1, argv + 1);
        }
    fprintf(stderr, "ballast: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return ERR_INPUT;
}
