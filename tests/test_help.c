/* Usage lines cannot drift from the options: for every command, the options its --help names
 * are exactly its option table (cli.h), each option of the table gets past the command's own
 * parser (which would call it unknown), an option outside the table is refused before the
 * command runs, and `ballast --help` lists every command. `ballast --version` gives the CMake
 * project version and, in a git checkout, the commit. */
#include <CUnit/CUnit.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "testutil.h"

#define MAX_SEEN 128

/* The options a help text names: words starting with "-" and a letter, after a space, a
 * bracket, a bar, a comma or a quote; "mpirun -np" is mpirun's. */
static int help_options(const char *text, char seen[MAX_SEEN][64])
{
    int n = 0;
    for (const char *s = text; *s != '\0'; s++) {
        int starts = s[0] == '-' && (s == text || strchr(" \n[(|,\"`'", s[-1]) != NULL);
        const char *name = s + (s[1] == '-' ? 2 : 1);
        if (!starts || !isalpha((unsigned char)*name))
            continue;
        size_t len = (size_t)(name - s) + strspn(name, "abcdefghijklmnopqrstuvwxyz"
                                                       "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-");
        while (len > 1 && s[len - 1] == '-')
            len--;
        if (strncmp(s, "-np", len) == 0 && len == 3)
            continue;
        char word[64];
        snprintf(word, sizeof word, "%.*s", (int)len, s);
        int known = 0;
        for (int k = 0; k < n && !known; k++)
            known = strcmp(seen[k], word) == 0;
        if (!known && n < MAX_SEEN)
            snprintf(seen[n++], 64, "%s", word);
        s += len - 1;
    }
    return n;
}

static int in_table(const struct cli_opt *table, const char *name)
{
    for (const struct cli_opt *o = table; o->name != NULL; o++)
        if (strcmp(o->name, name) == 0)
            return 1;
    return 0;
}

/* The synopsis: from "usage:" to the first blank line. */
static void synopsis(const char *help, char *out, size_t cap)
{
    const char *start = strstr(help, "usage:"), *end = start ? strstr(start, "\n\n") : NULL;
    snprintf(out, cap, "%.*s", start ? (int)(end ? end - start : (long)strlen(start)) : 0,
             start ? start : "");
}

static void test_help_equals_table(void)
{
    for (int c = 0; c < cli_n_commands; c++) {
        const struct cli_command *cmd = &cli_commands[c];
        char args[128], *out = NULL, seen[MAX_SEEN][64];
        snprintf(args, sizeof args, "%s --help", cmd->name);
        CU_ASSERT_FATAL(test_run(args, &out, NULL) == 0 && out != NULL);
        int n = help_options(out, seen);
        for (int k = 0; k < n; k++) {
            int ok = in_table(cmd->options, seen[k]) || strcmp(seen[k], "-h") == 0 ||
                     strcmp(seen[k], "--help") == 0;
            CU_ASSERT(ok);
            if (!ok)
                fprintf(stderr, "\nballast %s --help names %s, which its option table lacks\n",
                        cmd->name, seen[k]);
        }
        char usage[4096], in_usage[MAX_SEEN][64];
        synopsis(out, usage, sizeof usage);
        int u = help_options(usage, in_usage);
        for (const struct cli_opt *o = cmd->options; o->name != NULL; o++) {
            int named = 0;
            for (int k = 0; k < u && !named; k++)
                named = strcmp(in_usage[k], o->name) == 0;
            CU_ASSERT(named);
            if (!named)
                fprintf(stderr, "\nballast %s --help: its usage lines do not name %s\n",
                        cmd->name, o->name);
        }
        free(out);
    }
}

/* Each table option reaches the command's parser, which takes it (an error about its value or
 * about the operand after it, but never "unknown option" for it). The operand stops the
 * command before it does any work. The runs go four at a time (train's start MPI). */
static void test_parsers_take_table(void)
{
    char script[65536];
    size_t used = (size_t)snprintf(script, sizeof script, "cd '%s' || exit 1; ", test_tmpdir());
    int n = 0;
    for (int c = 0; c < cli_n_commands; c++)
        for (const struct cli_opt *o = cli_commands[c].options; o->name != NULL; o++, n++)
            used += (size_t)snprintf(script + used, sizeof script - used,
                                     "{ timeout 60 '%s' %s %s%s zzz-operand >/dev/null "
                                     "2>probe%d.err; echo $? >probe%d.rc; } & %s",
                                     BALLAST_EXE, cli_commands[c].name, o->name,
                                     o->kind == CLI_FLAG ? "" : " 1", n, n,
                                     n % 4 == 3 ? "wait; " : "");
    CU_ASSERT_FATAL(used + 8 < sizeof script);
    snprintf(script + used, sizeof script - used, "wait");
    CU_ASSERT_FATAL(system(script) == 0);
    n = 0;
    for (int c = 0; c < cli_n_commands; c++) {
        const struct cli_command *cmd = &cli_commands[c];
        for (const struct cli_opt *o = cmd->options; o->name != NULL; o++, n++) {
            char name[64], unknown[128];
            snprintf(name, sizeof name, "probe%d.rc", n);
            char *rc = test_read(test_path(name));
            snprintf(name, sizeof name, "probe%d.err", n);
            char *err = test_read(test_path(name));
            snprintf(unknown, sizeof unknown, "unknown option \"%s\"", o->name);
            int ok = rc != NULL && atoi(rc) == 2 && err != NULL && strstr(err, unknown) == NULL;
            CU_ASSERT(ok);
            if (!ok)
                fprintf(stderr, "\nballast %s %s: exit %s, %s\n", cmd->name, o->name,
                        rc ? rc : "?", err ? err : "");
            free(rc);
            free(err);
        }
        char args[128], *err = NULL;
        snprintf(args, sizeof args, "%s --not-an-option-of-any", cmd->name);
        CU_ASSERT(test_run(args, NULL, &err) == 2 && err != NULL &&
                  strstr(err, "unknown option \"--not-an-option-of-any\"") != NULL);
        free(err);
    }
}

static void test_command_list(void)
{
    char *out = NULL;
    CU_ASSERT_FATAL(test_run("--help", &out, NULL) == 0 && out != NULL);
    for (int c = 0; c < cli_n_commands; c++) {
        char line[64];
        snprintf(line, sizeof line, "\n  %s ", cli_commands[c].name);
        CU_ASSERT(strstr(out, line) != NULL);
    }
    CU_ASSERT(strstr(out, "ballast --version") != NULL);
    free(out);
}

/* Runs a shell command and returns its first line of output (static), "" on failure. */
static const char *shell_line(const char *command)
{
    static char line[256];
    line[0] = '\0';
    FILE *p = popen(command, "r");
    if (p == NULL)
        return line;
    if (fgets(line, sizeof line, p) == NULL)
        line[0] = '\0';
    pclose(p);
    line[strcspn(line, "\n")] = '\0';
    return line;
}

static void test_version(void)
{
    char *out = NULL, want[128];
    CU_ASSERT_FATAL(test_run("--version", &out, NULL) == 0 && out != NULL);
    snprintf(want, sizeof want, "ballast %s", BALLAST_VERSION);
    CU_ASSERT(strncmp(out, want, strlen(want)) == 0);
    /* built from a git checkout: git describe of a commit of this repository ("v1-3-gabc1234",
     * or "abc1234" without tags; "-dirty" when the tree had changes) */
    const char *head = shell_line("git -C '" BALLAST_SOURCE_DIR "' rev-parse HEAD 2>/dev/null");
    if (head[0] != '\0') {
        const char *git = strstr(out, "(git ");
        CU_ASSERT_FATAL(git != NULL);
        char describe[128], check[512];
        snprintf(describe, sizeof describe, "%.*s", (int)strcspn(git + 5, ")-"), git + 5);
        const char *g = strstr(git, "-g");
        if (g != NULL && g < strchr(git, ')'))
            snprintf(describe, sizeof describe, "%.*s", (int)strcspn(g + 2, ")-"), g + 2);
        snprintf(check, sizeof check,
                 "git -C '" BALLAST_SOURCE_DIR "' cat-file -e '%s^{commit}' 2>/dev/null && "
                 "echo yes", describe);
        CU_ASSERT(strcmp(shell_line(check), "yes") == 0);
        if (strcmp(shell_line(check), "yes") != 0)
            fprintf(stderr, "\n--version: %s; %s is no commit of this repository\n", out,
                    describe);
    }
    free(out);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("help", NULL, NULL);
    CU_add_test(s, "help names exactly the option table", test_help_equals_table);
    CU_add_test(s, "parsers take every table option", test_parsers_take_table);
    CU_add_test(s, "ballast --help lists every command", test_command_list);
    CU_add_test(s, "--version", test_version);
    return test_main();
}
