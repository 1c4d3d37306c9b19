/* The `ballast` command line: one executable, one entry per subcommand. Each command returns
 * an exit status (err.h) and prints its own --help. */
#ifndef BALLAST_CLI_H
#define BALLAST_CLI_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "err.h"

/* An option of a command: its name and whether it takes a value ("--out DIR"), several
 * values up to the next option ("--share A.json B.json"), or none. */
enum cli_opt_kind { CLI_FLAG, CLI_VALUE, CLI_VALUES };
struct cli_opt {
    const char *name;
    enum cli_opt_kind kind;
};

/* A command: its option table (ending with {NULL}) is every option its --help lists and its
 * parser takes: main refuses any other before the command runs, and test_help holds the
 * help text and the parser to it. */
struct cli_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the command name */
    const struct cli_opt *options;
};

/* Every command, in the order `ballast --help` lists them (commands.c). */
extern const struct cli_command cli_commands[];
extern const int cli_n_commands;
/* ERR_OK when every option in argv (argv[0]: the command) is in c's table, else a usage
 * error's status (printed, naming the option). --help and -h are every command's. */
int cli_check_options(const struct cli_command *c, int argc, char **argv);
/* "ballast 0.1.0 (git v0.1.0-12-gabcdef0)": the CMake project version and, when built from
 * a git checkout, git describe (version.c, made by cmake/version.cmake at each build). */
const char *cli_version(void);

/* Reads option argv[*i] if it is `name`, taking its value from "--name=V" or the next
 * argument. Returns 1 if matched (value set), 0 if not, -1 (message printed) if the value is
 * missing. */
int cli_option(int argc, char **argv, int *i, const char *name, const char **value);
int cli_flag(char **argv, int i, const char *name);
int cli_is_help(const char *arg);
/* Prints "ballast CMD: message" to stderr and returns code. */
int cli_fail(const char *cmd, const struct err *e);
/* Before any work: `file` (NULL: none) can be written (fileio_out_check); otherwise prints
 * why and returns ERR_INPUT. */
int cli_check_output(const char *cmd, const char *file);
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Human units (units.h): a byte count >= 1 ("40GiB", "32GB", "4096"), a rate in Gbit/s > 0
 * ("100Gbps", "50GB/s", "100"), a time in microseconds >= 0 ("3us", "0.5ms", "3"). */
int cli_parse_bytes(const char *text, int64_t *out);
int cli_parse_gbps(const char *text, double *out);
int cli_parse_us(const char *text, double *out);
int cli_parse_double(const char *text, double *out);
int cli_parse_int(const char *text, long lo, long hi, long *out);

extern const struct cli_opt cmd_profile_options[], cmd_plan_options[], cmd_simulate_options[],
    cmd_bench_options[], cmd_train_options[], cmd_export_options[], cmd_check_options[];
int cmd_profile(int argc, char **argv);
int cmd_plan(int argc, char **argv);
struct plan_options;
/* `ballast plan --share`: jobs "FILE[:METHOD]" (methods default to o's). */
int cmd_plan_share(char **jobs, int n, const struct plan_options *o, const char *out_file,
                   int quiet);
/* A cluster file of n "pipelines" (heterogeneous replicas), parsed (`root`). */
int cmd_plan_replicas(const cJSON *root, const char *file, int n, const struct plan_options *o,
                      const char *out_file, int quiet);
/* A cluster file of a "pool", parsed (`root`): the search for the fastest data-parallel
 * pipeline. */
int cmd_plan_pool(const cJSON *root, const char *file, const struct plan_options *o,
                  const char *out_file, int quiet);
int cmd_simulate(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_check(int argc, char **argv);
struct plan;
/* The plans (one, or a replicas file's n pipelines) as framework `to`'s settings, to
 * `out_file` (NULL: standard output) and, when they differ per stage, the per-rank Python file
 * (`stages_file`, NULL: ballast_stages.py beside out_file); both whole or not at all.
 * `devices_file` NULL: the default table. */
int cli_export(const struct plan *plans, int n, const char *to, const char *out_file,
               const char *stages_file, const char *devices_file, const char *plan_name,
               struct err *e);
int cmd_bench(int argc, char **argv);
int cmd_train(int argc, char **argv);

#endif
