/* Human units: the one parser of sizes, link rates and latencies, for every file loader and
 * the command line. A field that takes bytes, Gbit/s or microseconds still takes a plain JSON
 * number in that unit; it also takes a string with a unit:
 *
 *   sizes      "40GiB", "32GB", "1.5 TiB", "512MiB", "4096"  (bytes)
 *              KiB MiB GiB TiB PiB: powers of 1024; kB (or KB) MB GB TB PB: powers of 1000;
 *              B: bytes; K M G T alone: KiB MiB GiB TiB (as --unit has always read them)
 *   rates      "100Gbps", "100 Gb/s", "400Gbit/s", "800Mbps", "1.6Tbps" (bits per second),
 *              "50GB/s", "50GBps" (bytes per second: x 8)
 *   latencies  "3us", "3µs", "500ns", "0.5ms", "1s"
 *
 * A size must come to a whole number of bytes. Unit letters are case-sensitive where case
 * carries meaning (B is a byte, b a bit; M mega, m milli). */
#ifndef BALLAST_UNITS_H
#define BALLAST_UNITS_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "err.h"

#define UNITS_WHY_MAX 256

/* Each parser returns 0 and sets *out, or -1 with why (a phrase: `not a size: ...`). */
int units_parse_bytes(const char *text, int64_t *out, char why[UNITS_WHY_MAX]);
/* Bits per second; a bare number is in `bare_bps` (1e9 for a gbps field). */
int units_parse_rate(const char *text, double bare_bps, double *out_bps,
                     char why[UNITS_WHY_MAX]);
/* Microseconds; a bare number is microseconds. */
int units_parse_us(const char *text, double *out, char why[UNITS_WHY_MAX]);

/* JSON members: `obj`.`key` as a number in the field's unit or a string with a unit, checked
 * against [lo, hi] in the field's unit. Messages name the file and the field
 * (`cluster.json: stages[2].memory_bytes: "40GIB" is not a size: unknown unit "GIB" ...`).
 * The _opt variants leave *out as it is when the member is absent. */
int units_json_bytes(const cJSON *obj, const char *file, const char *path, const char *key,
                     int64_t lo, int64_t hi, int64_t *out, struct err *e);
int units_json_bytes_opt(const cJSON *obj, const char *file, const char *path, const char *key,
                         int64_t lo, int64_t hi, int64_t *out, struct err *e);
/* A rate field whose unit is `field_bps` bits per second (1e9: gbps; 8e9: GB/s, "_gbs"). */
int units_json_rate(const cJSON *obj, const char *file, const char *path, const char *key,
                    double field_bps, double lo, double hi, double *out, struct err *e);
int units_json_us_opt(const cJSON *obj, const char *file, const char *path, const char *key,
                      double lo, double hi, double *out, struct err *e);

/* The bytes as the shortest exact human size ("40GiB", "32GB", "1536MiB"), else the integer,
 * for files meant to be read and edited. */
void units_format_bytes(int64_t bytes, char *buf, size_t cap);

#endif
