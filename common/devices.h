/* The device table (configs/devices.json, ballast-devices/1): datasheet figures per device,
 * used for estimated profiles and as the peak for MFU. */
#ifndef BALLAST_DEVICES_H
#define BALLAST_DEVICES_H

#include <stdint.h>

#include "err.h"
#include "model.h"
#include "profile.h"

#define DEVICES_SOURCE_MAX 512
#define DEVICES_FILE_MAX 4096

struct device_spec {
    char name[PROFILE_NAME_MAX];
    char kind[8]; /* "cpu" or "cuda" */
    double peak_tflops_16bit; /* dense 16-bit tensor */
    int bf16_tensor;          /* 0: no bf16 tensor cores, bf16 GEMMs run at the fp32 rate */
    double peak_tflops_fp16;  /* dense fp16 GEMMs with fp32 accumulation; 0: not stated */
    double peak_tflops_fp32;
    int64_t memory_bytes;
    double memory_bandwidth_gbs; /* GB/s */
    double host_link_gbs;        /* GB/s each way, 0 if none */
    double op_overhead_us;       /* fixed cost per operation (kernel launch) */
    char source[DEVICES_SOURCE_MAX];
};

struct device_table {
    int n;
    struct device_spec *devices;
    double gemm_efficiency;
    double memory_efficiency;
    double host_memory_bandwidth_gbs; /* GB/s the host optimizer streams at; 0: not stated */
    char file[DEVICES_FILE_MAX];      /* the file it was read from, for messages */
};

/* Default location: configs/devices.json of the source tree Ballast was built from. */
const char *devices_default_file(void);
int devices_load(const char *file, struct device_table *t, struct err *e);
void devices_free(struct device_table *t);
/* NULL if absent. */
const struct device_spec *devices_find(const struct device_table *t, const char *name);
/* TFLOP/s of a GEMM in `dtype` on d: fp32 at the fp32 peak; bf16 at the 16-bit tensor peak, or
 * the fp32 peak without bf16 tensor cores; fp16 at peak_tflops_fp16 (0 when not stated). */
double devices_gemm_tflops(const struct device_spec *d, enum model_dtype dtype);
/* ERR_INPUT naming the table's file, the device and the field when d (one of t's devices)
 * states no rate for `dtype`'s GEMMs (an fp16 model on a device without peak_tflops_fp16):
 * what an estimate refuses to guess. */
int devices_check_dtype(const struct device_table *t, const struct device_spec *d,
                        enum model_dtype dtype, struct err *e);
/* The same, also ignoring case ("a100-40gb"); ERR_INPUT naming `what` (an option or a field),
 * `file` and every device of the table when absent. */
int devices_lookup(const struct device_table *t, const char *file, const char *what,
                   const char *name, const struct device_spec **out, struct err *e);

/* Pinned host copies reach about this share of the PCIe figure: an assumption, which a
 * profile measured on the device (`ballast profile --device cuda:N`: its host_link) replaces. */
#define DEVICES_PINNED_SHARE 0.8
/* The device's host link as a link (Gb/s): host_link_gbs GB/s x 8 x the pinned share; absent
 * when host_link_gbs is 0. */
struct link devices_host_link(const struct device_spec *d);

#endif
