#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "units.h"

int cli_option(int argc, char **argv, int *i, const char *name, const char **value)
{
    const char *arg = argv[*i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0)
        return 0;
    if (arg[n] == '=') {
        *value = arg + n + 1;
        return 1;
    }
    if (arg[n] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "ballast %s: %s needs a value\n", argv[0], name);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

int cli_flag(char **argv, int i, const char *name)
{
    return strcmp(argv[i], name) == 0;
}

int cli_is_help(const char *arg)
{
    return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

int cli_fail(const char *cmd, const struct err *e)
{
    fprintf(stderr, "ballast %s: %s\n", cmd, e->msg);
    return e->code ? e->code : ERR_FAIL;
}

int cli_check_output(const char *cmd, const char *file)
{
    struct err e;
    err_clear(&e);
    if (file == NULL || fileio_out_check(file, &e) == ERR_OK)
        return ERR_OK;
    return cli_fail(cmd, &e);
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "ballast %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see ballast %s --help)\n", cmd);
    return ERR_INPUT;
}

int cli_parse_bytes(const char *text, int64_t *out)
{
    char why[UNITS_WHY_MAX];
    int64_t v;
    if (units_parse_bytes(text, &v, why) || v < 1)
        return -1;
    *out = v;
    return 0;
}

int cli_parse_gbps(const char *text, double *out)
{
    char why[UNITS_WHY_MAX];
    double bps;
    if (units_parse_rate(text, 1e9, &bps, why) || !(bps > 0) || !isfinite(bps))
        return -1;
    *out = bps / 1e9;
    return 0;
}

int cli_parse_us(const char *text, double *out)
{
    char why[UNITS_WHY_MAX];
    return units_parse_us(text, out, why) || !isfinite(*out) ? -1 : 0;
}

int cli_parse_double(const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || errno != 0 || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

int cli_parse_int(const char *text, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || errno != 0 || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* version.c (cmake/version.cmake) */
extern const char *const ballast_version, *const ballast_git_describe;

const char *cli_version(void)
{
    static char text[160];
    if (ballast_git_describe[0] != '\0')
        snprintf(text, sizeof text, "ballast %s (git %s)", ballast_version, ballast_git_describe);
    else
        snprintf(text, sizeof text, "ballast %s", ballast_version);
    return text;
}
