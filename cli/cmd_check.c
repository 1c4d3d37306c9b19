#include "cli.h"
int cmd_check(int argc, char **argv)
{
    (void)argc, (void)argv;
    return ERR_INPUT;
}
