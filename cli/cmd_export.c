/* `ballast export --plan PLAN.json --to FRAMEWORK [-o FILE]`: any plan file (a plan, a pool's
 * plan, a replicas file) as the framework's settings (planner/export/export.h); `ballast plan
 * --export FRAMEWORK` calls the same. Both files are written whole or not at all. */
#define _GNU_SOURCE /* open_memstream */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "export.h"
#include "fileio.h"
#include "framework.h"
#include "jsonio.h"
#include "replicas.h"

static void help(void)
{
    printf("usage: ballast export --plan PLAN.json --to FRAMEWORK [-o FILE] [--stages FILE.py]\n"
           "                      [--devices DEVICES.json]\n\n"
           "Prints a plan (ballast-plan/1, a pool's plan, or ballast-replicas/1) as the\n"
           "settings FRAMEWORK runs: megatron (per-rank recompute through a generated Python\n"
           "file), megatron-cli (its command line alone), nemo, nemo-cli, colossalai or\n"
           "flagscale. A plan the framework cannot say as it is gets the framework's best\n"
           "settings on the same split, with its step and per-stage memory beside the plan's on\n"
           "standard error (docs/frameworks.md).\n\n"
           "  --plan FILE      the plan\n"
           "  --to F           the framework\n"
           "  -o FILE          write the settings there (default: standard output)\n"
           "  --stages FILE.py the per-rank Python file, when the settings differ per stage\n"
           "                   (default: ballast_stages.py beside -o FILE, or in the current\n"
           "                   directory)\n"
           "  --devices FILE   the device table of the precision and kernel checks (default\n"
           "                   %s)\n\n"
           "exit status: 0 written, 2 bad input or a plan the framework cannot run, 3 a stage\n"
           "does not fit as the framework runs it\n",
           devices_default_file());
}

/* `text` (len bytes) to `file` through a temporary, or to standard output when file is NULL. */
static int write_text(const char *file, const char *text, size_t len, struct err *e)
{
    if (file == NULL) {
        fwrite(text, 1, len, stdout);
        return ERR_OK;
    }
    struct fileio_out o;
    if (fileio_out_open(&o, file, e))
        return e->code;
    int ok = fileio_write_all(o.fd, text, (int64_t)len) == 0;
    return fileio_out_commit(&o, file, ok, e);
}

/* The Python file's path: `stages`, else ballast_stages.py beside `out` (or here). */
static void stages_path(const char *stages, const char *out, char *path, size_t size)
{
    if (stages != NULL) {
        snprintf(path, size, "%s", stages);
        return;
    }
    char copy[FILEIO_PATH_MAX];
    snprintf(copy, sizeof copy, "%s", out ? out : "");
    const char *dir = out ? dirname(copy) : ".";
    snprintf(path, size, "%s/ballast_stages.py", dir);
}

/* Its module name: the file name without ".py". */
static void module_name(const char *path, char *name, size_t size)
{
    char copy[FILEIO_PATH_MAX];
    snprintf(copy, sizeof copy, "%s", path);
    snprintf(name, size, "%s", basename(copy));
    char *dot = strrchr(name, '.');
    if (dot != NULL && strcmp(dot, ".py") == 0)
        *dot = '\0';
}

int cli_export(const struct plan *plans, int n, const char *to, const char *out_file,
               const char *stages_file, const char *devices_file, const char *plan_name,
               struct err *e)
{
    struct device_table t;
    char path[FILEIO_PATH_MAX], module[FILEIO_PATH_MAX];
    char *text = NULL, *py = NULL;
    size_t len = 0, py_len = 0;
    stages_path(stages_file, out_file, path, sizeof path);
    module_name(path, module, sizeof module);
    if (devices_load(devices_file ? devices_file : devices_default_file(), &t, e))
        return e->code;
    FILE *out = open_memstream(&text, &len), *stages = open_memstream(&py, &py_len);
    struct export_options o = {.to = to, .devices = &t, .note = stderr, .stages = stages,
                               .stages_module = module, .plan_name = plan_name};
    int rc = out && stages ? ERR_OK : err_set(e, ERR_FAIL, "out of memory");
    if (rc == ERR_OK)
        rc = n == 1 ? planner_export(out, &plans[0], &o, e)
                    : planner_export_replicas(out, plans, n, &o, e);
    if (out)
        fclose(out);
    if (stages)
        fclose(stages);
    if (rc == ERR_OK)
        rc = write_text(out_file, text, len, e);
    if (rc == ERR_OK && py_len > 0 && write_text(path, py, py_len, e) == ERR_OK)
        fprintf(stderr, "ballast export: the per-rank settings are in %s\n", path);
    free(text);
    free(py);
    devices_free(&t);
    return e->code;
}

/* The plans of `file`: one plan, or a replicas file's pipelines (owned: plan_free each and
 * free). */
static int load_plans(const char *file, struct plan **plans, int *n, struct err *e)
{
    cJSON *root = jsonio_read(file, e);
    if (root == NULL)
        return e->code;
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
    int rc;
    if (replicas_is_file(root)) {
        rc = replicas_parse(root, file, plans, n, e);
    } else if (cJSON_IsString(format) && strcmp(format->valuestring, "ballast-plan/1") != 0) {
        rc = err_set(e, ERR_INPUT, "%s: format: \"%s\", expected a plan (ballast-plan/1) or a "
                     "replicas file (ballast-replicas/1)", file, format->valuestring);
    } else {
        *plans = calloc(1, sizeof **plans);
        *n = 1;
        rc = *plans ? plan_parse(root, file, *plans, e) : err_set(e, ERR_FAIL, "out of memory");
        if (rc) {
            free(*plans);
            *plans = NULL;
        }
    }
    cJSON_Delete(root);
    return rc;
}

const struct cli_opt cmd_export_options[] = {
    {"--plan", CLI_VALUE}, {"--to", CLI_VALUE},      {"-o", CLI_VALUE},
    {"--stages", CLI_VALUE}, {"--devices", CLI_VALUE}, {NULL, CLI_FLAG}};

int cmd_export(int argc, char **argv)
{
    const char *plan_file = NULL, *to = NULL, *out = NULL, *stages = NULL, *devices = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int r = 0;
        if (cli_is_help(argv[i])) {
            help();
            return ERR_OK;
        }
        const char *names[] = {"--plan", "--to", "-o", "--stages", "--devices"};
        const char **slots[] = {&plan_file, &to, &out, &stages, &devices};
        for (int k = 0; k < 5 && r == 0; k++)
            if ((r = cli_option(argc, argv, &i, names[k], &v)) > 0)
                *slots[k] = v;
        if (r < 0)
            return ERR_INPUT;
        if (r == 0)
            return cli_usage_error("export", "unknown option \"%s\"", argv[i]);
    }
    if (plan_file == NULL || to == NULL)
        return cli_usage_error("export", "--plan and --to are required");
    if (framework_find(to, NULL) == NULL || framework_is_ballast(framework_find(to, NULL)))
        return cli_usage_error("export", "--to: \"%s\", expected megatron, megatron-cli, nemo, "
                               "nemo-cli, colossalai or flagscale", to);
    if (cli_check_output("export", out) || cli_check_output("export", stages))
        return ERR_INPUT;
    struct err e;
    struct plan *plans = NULL;
    int n = 0;
    err_clear(&e);
    if (load_plans(plan_file, &plans, &n, &e))
        return cli_fail("export", &e);
    int rc = cli_export(plans, n, to, out, stages, devices, plan_file, &e);
    for (int k = 0; k < n; k++)
        plan_free(&plans[k]);
    free(plans);
    return rc ? cli_fail("export", &e) : ERR_OK;
}
