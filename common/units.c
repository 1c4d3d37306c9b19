#include "units.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonio.h"

#define SIZE_UNITS "B, KiB, MiB, GiB, TiB, PiB (powers of 1024) or kB, MB, GB, TB, PB (of 1000)"
#define RATE_UNITS "Gbps, Gb/s, Gbit/s (or M, T; bits) or GB/s, GBps (bytes)"
#define TIME_UNITS "ns, us, ms, s"

struct unit {
    const char *name;
    double scale;
};

/* A number as people write it: digits, an optional fraction, no sign or exponent. `*digits`
 * and `*decimals` are its digits as an integer and how many follow the point (trailing zeros
 * of the fraction dropped); *end is what follows (spaces skipped). 0, or -1 when `text` does
 * not start so or has more than 18 significant digits. */
static int scan_number(const char *text, int64_t *digits, int *decimals, const char **end)
{
    const char *s = text;
    int64_t v = 0;
    int n = 0, after = 0, seen_point = 0;
    for (;; s++) {
        if (*s == '.' && !seen_point) {
            seen_point = 1;
            continue;
        }
        if (*s < '0' || *s > '9')
            break;
        if (++n > 18)
            return -1;
        v = v * 10 + (*s - '0');
        after += seen_point;
    }
    if (n == 0 || s[-1] == '.')
        return -1;
    while (after > 0 && v % 10 == 0)
        v /= 10, after--;
    while (*s == ' ')
        s++;
    *digits = v, *decimals = after, *end = s;
    return 0;
}

static const struct unit *find_unit(const struct unit *units, size_t n, const char *name)
{
    for (size_t k = 0; k < n; k++)
        if (strcmp(units[k].name, name) == 0)
            return &units[k];
    return NULL;
}

/* "Gb", "Mib", "kb": a size prefix and a b, which is a bit */
static int counts_bits(const char *unit)
{
    static const char *const prefixes[] = {"",   "k",  "K",  "M",  "G",  "T",  "P",
                                           "Ki", "Mi", "Gi", "Ti", "Pi", NULL};
    size_t len = strlen(unit);
    for (int k = 0; len > 0 && unit[len - 1] == 'b' && prefixes[k] != NULL; k++)
        if (strlen(prefixes[k]) == len - 1 && strncmp(unit, prefixes[k], len - 1) == 0)
            return 1;
    return 0;
}

int units_parse_bytes(const char *text, int64_t *out, char why[UNITS_WHY_MAX])
{
    static const struct unit units[] = {
        {"", 1},           {"B", 1},           {"KiB", 0x1p10},    {"MiB", 0x1p20},
        {"GiB", 0x1p30},   {"TiB", 0x1p40},    {"PiB", 0x1p50},    {"K", 0x1p10},
        {"M", 0x1p20},     {"G", 0x1p30},      {"T", 0x1p40},      {"kB", 1e3},
        {"KB", 1e3},       {"MB", 1e6},        {"GB", 1e9},        {"TB", 1e12},
        {"PB", 1e15}};
    int64_t digits;
    int decimals;
    const char *rest;
    if (scan_number(text, &digits, &decimals, &rest))
        return snprintf(why, UNITS_WHY_MAX, "not a size: expected a number of bytes or a "
                        "number and a unit (%s)", SIZE_UNITS), -1;
    const struct unit *u = find_unit(units, sizeof units / sizeof units[0], rest);
    if (u == NULL && counts_bits(rest))
        return snprintf(why, UNITS_WHY_MAX, "not a size: \"%s\" counts bits; sizes are bytes "
                        "(%s)", rest, SIZE_UNITS), -1;
    if (u == NULL)
        return snprintf(why, UNITS_WHY_MAX, "not a size: unknown unit \"%s\" (%s)", rest,
                        SIZE_UNITS), -1;
    /* digits x scale / 10^decimals, exactly: the scale is an integer below 2^53 */
    int64_t scale = (int64_t)u->scale, pow10 = 1;
    for (int k = 0; k < decimals; k++)
        pow10 *= 10;
    if (digits > JSONIO_INT_MAX / scale)
        return snprintf(why, UNITS_WHY_MAX, "too large: sizes are below 2^53 bytes (8 PiB)"), -1;
    int64_t scaled = digits * scale;
    if (scaled % pow10 != 0)
        return snprintf(why, UNITS_WHY_MAX, "not a whole number of bytes"), -1;
    *out = scaled / pow10;
    return 0;
}

/* digits / 10^decimals as a double */
static double number_value(int64_t digits, int decimals)
{
    return (double)digits / pow(10.0, decimals);
}

int units_parse_rate(const char *text, double bare_bps, double *out_bps,
                     char why[UNITS_WHY_MAX])
{
    static const struct unit prefixes[] = {{"", 1},     {"k", 1e3},  {"K", 1e3}, {"M", 1e6},
                                           {"G", 1e9},  {"T", 1e12}, {"Ki", 0x1p10},
                                           {"Mi", 0x1p20}, {"Gi", 0x1p30}, {"Ti", 0x1p40}};
    static const struct unit per_second[] = {{"bps", 1},  {"b/s", 1},  {"bit/s", 1},
                                             {"Bps", 8},  {"B/s", 8}};
    int64_t digits;
    int decimals;
    const char *rest;
    if (scan_number(text, &digits, &decimals, &rest))
        return snprintf(why, UNITS_WHY_MAX, "not a rate: expected a number, with or without a "
                        "unit (%s)", RATE_UNITS), -1;
    double v = number_value(digits, decimals);
    if (*rest == '\0') {
        *out_bps = v * bare_bps;
        return 0;
    }
    for (size_t p = 0; p < sizeof prefixes / sizeof prefixes[0]; p++) {
        size_t n = strlen(prefixes[p].name);
        if (strncmp(rest, prefixes[p].name, n) != 0)
            continue;
        const struct unit *u =
            find_unit(per_second, sizeof per_second / sizeof per_second[0], rest + n);
        /* binary prefixes are for bytes (GiB/s), as nobody counts bits in them */
        if (u != NULL && (n < 2 || u->scale == 8)) {
            *out_bps = v * prefixes[p].scale * u->scale;
            return 0;
        }
    }
    return snprintf(why, UNITS_WHY_MAX, "not a rate: unknown unit \"%s\" (%s)", rest,
                    RATE_UNITS), -1;
}

int units_parse_us(const char *text, double *out, char why[UNITS_WHY_MAX])
{
    static const struct unit units[] = {{"", 1},     {"us", 1},  {"\xc2\xb5s", 1},
                                        {"ns", 1e-3}, {"ms", 1e3}, {"s", 1e6}};
    int64_t digits;
    int decimals;
    const char *rest;
    const struct unit *u = NULL;
    if (scan_number(text, &digits, &decimals, &rest) == 0)
        u = find_unit(units, sizeof units / sizeof units[0], rest);
    if (u == NULL)
        return snprintf(why, UNITS_WHY_MAX, "not a time: expected microseconds, or a number "
                        "and a unit (%s)", TIME_UNITS), -1;
    *out = number_value(digits, decimals) * u->scale;
    return 0;
}

/* A member that is no string is jsonio's to read (a number, or its message: missing, of the
 * wrong type); a string is ours. */
int units_json_bytes(const cJSON *obj, const char *file, const char *path, const char *key,
                     int64_t lo, int64_t hi, int64_t *out, struct err *e)
{
    char sub[JSONIO_PATH_MAX], why[UNITS_WHY_MAX];
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsString(item))
        return jsonio_int(obj, file, path, key, lo, hi, out, e);
    jsonio_path_key(sub, path, key);
    int64_t v;
    if (units_parse_bytes(item->valuestring, &v, why))
        return err_set(e, ERR_INPUT, "%s: %s: \"%s\" is %s", file, sub, item->valuestring, why);
    if (v < lo || v > hi)
        return err_set(e, ERR_INPUT, "%s: %s: \"%s\" is %lld bytes, outside [%lld, %lld]", file,
                       sub, item->valuestring, (long long)v, (long long)lo, (long long)hi);
    *out = v;
    return ERR_OK;
}

int units_json_bytes_opt(const cJSON *obj, const char *file, const char *path, const char *key,
                         int64_t lo, int64_t hi, int64_t *out, struct err *e)
{
    if (cJSON_GetObjectItemCaseSensitive(obj, key) == NULL)
        return ERR_OK;
    return units_json_bytes(obj, file, path, key, lo, hi, out, e);
}

/* A number (jsonio_num's to read) or a string with a unit: a rate (`rate`: bits a second,
 * `unit` of them the field's unit) or a latency; within [lo, hi] of the field's unit. */
static int json_real(const cJSON *obj, const char *file, const char *path, const char *key,
                     const char *unit_name, double unit, int rate, double lo, double hi,
                     double *out, struct err *e)
{
    char sub[JSONIO_PATH_MAX], why[UNITS_WHY_MAX];
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (item == NULL || cJSON_IsNumber(item))
        return jsonio_num(obj, file, path, key, lo, hi, out, e);
    jsonio_path_key(sub, path, key);
    if (!cJSON_IsString(item))
        return err_set(e, ERR_INPUT, "%s: %s: expected a number (%s) or a string with a unit",
                       file, sub, unit_name);
    double v;
    int bad = rate ? units_parse_rate(item->valuestring, unit, &v, why)
                   : units_parse_us(item->valuestring, &v, why);
    if (bad)
        return err_set(e, ERR_INPUT, "%s: %s: \"%s\" is %s", file, sub, item->valuestring, why);
    v = rate ? v / unit : v;
    if (!isfinite(v) || v < lo || v > hi)
        return err_set(e, ERR_INPUT, "%s: %s: %g %s is outside [%g, %g]", file, sub, v,
                       unit_name, lo, hi);
    *out = v;
    return ERR_OK;
}

int units_json_rate(const cJSON *obj, const char *file, const char *path, const char *key,
                    double field_bps, double lo, double hi, double *out, struct err *e)
{
    return json_real(obj, file, path, key, field_bps == 1e9 ? "Gbit/s" : "GB/s", field_bps, 1,
                     lo, hi, out, e);
}

int units_json_us_opt(const cJSON *obj, const char *file, const char *path, const char *key,
                      double lo, double hi, double *out, struct err *e)
{
    if (cJSON_GetObjectItemCaseSensitive(obj, key) == NULL)
        return ERR_OK;
    return json_real(obj, file, path, key, "microseconds", 1, 0, lo, hi, out, e);
}

void units_format_bytes(int64_t bytes, char *buf, size_t cap)
{
    static const struct unit units[] = {{"PiB", 0x1p50}, {"PB", 1e15}, {"TiB", 0x1p40},
                                        {"TB", 1e12},    {"GiB", 0x1p30}, {"GB", 1e9},
                                        {"MiB", 0x1p20}, {"MB", 1e6},  {"KiB", 0x1p10},
                                        {"kB", 1e3}};
    for (size_t k = 0; bytes > 0 && k < sizeof units / sizeof units[0]; k++) {
        int64_t scale = (int64_t)units[k].scale;
        if (bytes % scale == 0 && bytes / scale < 100000) {
            snprintf(buf, cap, "%lld%s", (long long)(bytes / scale), units[k].name);
            return;
        }
    }
    snprintf(buf, cap, "%lld", (long long)bytes);
}
