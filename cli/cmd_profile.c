#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "devices.h"
#include "estimate.h"
#include "hostinfo.h"
#include "jsonio.h"
#include "measure.h"
#include "measure_tp.h"
#include "cuda_device.h"
#include "cost.h"
#include "model.h"
#include "model_ops.h"
#include "cluster.h"
#include "profile.h"

#define WARMUP 3
/* the copies timing the host link: large enough that latency is a small part */
#define HOST_LINK_BYTES ((int64_t)64 << 20)

static void help(void)
{
    printf("usage: ballast profile --model MODEL.json --device cpu|cuda:N [-o PROFILE.json]\n"
           "                       [--repeats N] [--threads N] [--name NAME]\n"
           "                       [--tp N [--node-link-gbps RATE [--node-link-latency-us TIME]]]\n"
           "       ballast profile --model MODEL.json --estimate --device NAME\n"
           "                       [-o PROFILE.json] [--devices DEVICES.json] [--for FRAMEWORK]\n"
           "                       [--tp N --node-link-gbps RATE [--node-link-latency-us TIME]]\n\n"
           "Writes a profile (ballast-profile/1): every planning layer's forward and backward\n"
           "time, its recompute options and its memory, for one micro-batch.\n\n"
           "Measuring (the default) runs the runtime's layers, the code `ballast train` runs,\n"
           "on the device as one stage runs a micro-batch: %d warm-up passes, then enough\n"
           "timed passes for --repeats samples of every span, medians; memory measured by\n"
           "scanning each layer's arenas, any difference from the size functions reported.\n"
           "A progress bar on standard error when it is a terminal.\n\n"
           "  --model FILE     the model (ballast-model/1)\n"
           "  --device D       measure on D: cpu, or cuda:N (the CUDA device number)\n"
           "  --repeats N      timed samples of each span (default 20)\n"
           "  --threads N      CPU threads; use what each training rank will have. Without\n"
           "                   it: OMP_NUM_THREADS, else OPENBLAS_NUM_THREADS, else every\n"
           "                   online core (what `ballast train` gives a lone rank)\n"
           "  --name NAME      the device's name in the profile, which cluster files must use\n"
           "                   (default: the CPU model or the CUDA device name)\n"
           "  --estimate       derive the profile from datasheet figures (a roofline per\n"
           "                   operation) instead of measuring; marked \"estimated\": true;\n"
           "                   --device then names a device of the device table\n"
           "  --devices FILE   the device table (default: %s)\n"
           "  --tp N           the costs on each of N GPUs splitting every layer (tensor\n"
           "                   parallel with sequence parallelism, docs/pools.md): each GPU's\n"
           "                   share of every operation, measured on the device (or estimated),\n"
           "                   plus the collectives: over --node-link-gbps RATE (\"2400Gbps\",\n"
           "                   \"300GB/s\"; a number alone is Gbit/s) and --node-link-latency-us\n"
           "                   TIME (\"3us\"; default 0), or measured over NCCL across GPUs 0..N-1\n"
           "                   of this node when measuring on cuda without them; the profile\n"
           "                   says \"tp\": N and serves cluster stages of tp N\n"
           "  --for F          --estimate what framework F (megatron, nemo, colossalai,\n"
           "                   flagscale) keeps: its attention kernel, fp32 logits, its\n"
           "                   recompute modules (docs/frameworks.md)\n"
           "  -o FILE          where to write the profile (default: standard output)\n",
           WARMUP, devices_default_file());
}

const struct cli_opt cmd_profile_options[] = {
    {"--model", CLI_VALUE},   {"--device", CLI_VALUE},         {"-o", CLI_VALUE},
    {"--repeats", CLI_VALUE}, {"--threads", CLI_VALUE},        {"--name", CLI_VALUE},
    {"--estimate", CLI_FLAG}, {"--devices", CLI_VALUE},        {"--for", CLI_VALUE},
    {"--tp", CLI_VALUE},      {"--node-link-gbps", CLI_VALUE}, {"--node-link-latency-us", CLI_VALUE},
    {NULL, CLI_FLAG}};

/* host_link: {gbps, latency_us} measured, or NULL */
static int write_profile(const char *out_file, const struct profile *p, const double *host_link,
                         struct err *e)
{
    if (out_file != NULL && host_link == NULL)
        return profile_write(out_file, p, e);
    cJSON *o = profile_to_json(p);
    if (host_link != NULL && !cJSON_HasObjectItem(o, "host_link")) {
        cJSON *l = cJSON_AddObjectToObject(o, "host_link");
        cJSON_AddNumberToObject(l, "gbps", host_link[0]);
        cJSON_AddNumberToObject(l, "latency_us", host_link[1]);
    }
    int rc = ERR_OK;
    if (out_file != NULL) {
        rc = jsonio_write(out_file, o, e);
    } else {
        char *text = cJSON_Print(o);
        if (text != NULL)
            printf("%s\n", text);
        cJSON_free(text);
    }
    cJSON_Delete(o);
    return rc;
}

/* Loads the model to profile: one Ballast knows the layers of (a custom model has none to
 * estimate or run; its profile is written by hand). */
static int load_model(const char *file, const char *how, struct model *m, struct err *e)
{
    if (model_load(file, m, e))
        return e->code;
    if (model_ops_of(m) == NULL)
        return err_set(e, ERR_INPUT,
                       "%s: \"%s\" is a custom model: Ballast has no layers to run for a "
                       "custom model, so it cannot %s one; write its profile (each layer's "
                       "times and bytes) yourself, as configs/profiles/custom/ does",
                       file, m->name, how);
    return ERR_OK;
}

/* --tp and the node link of --estimate (tp 1: one GPU). */
struct estimate_group {
    long tp;
    struct link node_link;
};

static int estimate(const char *model_file, const char *device, const char *devices_file,
                    const char *framework, const struct estimate_group *group,
                    const char *out_file)
{
    struct model m;
    struct device_table t;
    struct err e;
    err_clear(&e);
    if (load_model(model_file, "estimate", &m, &e) || devices_load(devices_file, &t, &e))
        return cli_fail("profile", &e);
    const struct device_spec *d;
    if (devices_lookup(&t, devices_file, "--device", device, &d, &e)) {
        devices_free(&t);
        return cli_fail("profile", &e);
    }
    struct profile p;
    int rc = estimate_profile(&t, d, &m, &p, &e);
    if (rc == ERR_OK && framework != NULL)
        rc = estimate_for_framework(&t, d, &m, framework, &p, &e);
    if (rc == ERR_OK && group->tp > 1 &&
        cluster_group_profile(&p, (int)group->tp, &group->node_link, &e) == ERR_OK)
        rc = estimate_tp_times(&t, d, &group->node_link, framework != NULL, &p, &e);
    else if (rc == ERR_OK && group->tp > 1)
        rc = e.code;
    devices_free(&t);
    if (rc == ERR_OK)
        rc = write_profile(out_file, &p, NULL, &e);
    profile_free(&p);
    return rc ? cli_fail("profile", &e) : ERR_OK;
}

/* The collectives of --tp on a GPU without --node-link-gbps: measured over NCCL across the
 * node's GPUs (cuda_device.h), one collective the mean of an all-gather and a reduce-scatter;
 * -1 (the node link's) otherwise. */
static int tp_collective(const struct estimate_group *g, const struct model *m, int cuda,
                         int repeats, double *ms, struct err *e)
{
    double ag, rs;
    *ms = -1;
    if (g->tp <= 1 || g->node_link.present || !cuda)
        return ERR_OK;
    ERR_TRY(cuda_tp_collectives_ms((int)g->tp, cost_tp_tensor_bytes(m), repeats, &ag, &rs, e));
    *ms = (ag + rs) / 2;
    return ERR_OK;
}

/* threads_from: what chose the CPU threads (recorded in the provenance), NULL on a GPU */
static int measure(const char *model_file, const char *device, int repeats, int threads,
                   const char *threads_from, const char *name, const struct estimate_group *g,
                   const char *out_file)
{
    struct model m;
    struct profile p;
    struct backend be = {0};
    struct err e;
    int mismatches = 0;
    double link[2] = {0, 0}; /* the host link: gbps, latency_us */
    err_clear(&e);
    memset(&p, 0, sizeof p);
    if (load_model(model_file, "measure", &m, &e))
        return cli_fail("profile", &e);
    p.provenance = cJSON_CreateObject();
    struct measure_timer timer;
    int rc = hostinfo_open(device, threads, &be, &timer, &p.device, p.provenance, &e);
    if (rc == ERR_OK && !(be.ops->dtypes & BACKEND_DTYPE_BIT(m.dtype))) {
        fprintf(stderr, "ballast profile: %s: dtype: \"%s\": the %s backend does not compute "
                        "it\n",
                model_file, model_dtype_name(m.dtype), be.ops->name);
        hostinfo_close(&be, &timer);
        profile_free(&p);
        return ERR_INPUT;
    }
    if (rc == ERR_OK) {
        if (threads_from != NULL)
            cJSON_AddStringToObject(p.provenance, "threads_from", threads_from);
        if (name != NULL)
            snprintf(p.device.name, sizeof p.device.name, "%s", name);
        /* time the layers together in half the device's memory, at most */
        struct measure_options o = {repeats, WARMUP, p.device.memory_bytes / 2,
                                    isatty(STDERR_FILENO) ? stderr : NULL, stderr,
                                    timer.start != NULL ? &timer : NULL};
        struct measure_tp_options to = {(int)g->tp, g->node_link, -1, threads};
        if (g->tp > 1)
            rc = tp_collective(g, &m, strcmp(be.ops->name, "cpu") != 0, repeats,
                               &to.collective_ms, &e) ||
                         measure_tp_profile(&be, &m, &to, &o, &p, &e)
                     ? e.code
                     : ERR_OK;
        else
            rc = measure_profile(&be, &m, &o, &p, &mismatches, &e);
        if (rc == ERR_OK)
            rc = measure_host_link(&be, HOST_LINK_BYTES, repeats > 5 ? repeats : 5, &link[0],
                                   &link[1], &e);
        hostinfo_close(&be, &timer);
    }
    if (rc == ERR_OK && mismatches > 0)
        fprintf(stderr,
                "ballast profile: %d byte count%s differ%s from the size functions the planner "
                "and the runtime's allocations use (above); the profile keeps what was measured\n",
                mismatches, mismatches == 1 ? "" : "s", mismatches == 1 ? "s" : "");
    if (rc == ERR_OK)
        rc = write_profile(out_file, &p, link, &e);
    profile_free(&p);
    return rc ? cli_fail("profile", &e) : ERR_OK;
}

/* The CPU threads when --threads is absent: OMP_NUM_THREADS first (OpenMP splits the CPU
 * backend's work; OpenBLAS runs single-threaded in it), then OPENBLAS_NUM_THREADS, then every
 * online core. OpenMP's list form "4,2" gives its first level. 0: a variable is malformed
 * (said on standard error). */
static long default_threads(long cores, const char **from)
{
    static const char *const vars[] = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", NULL};
    for (int k = 0; vars[k] != NULL; k++) {
        const char *v = getenv(vars[k]);
        if (v == NULL || v[0] == '\0')
            continue;
        char first[32];
        long n;
        snprintf(first, sizeof first, "%.*s", (int)strcspn(v, ","), v);
        if (cli_parse_int(first, 1, 4096, &n) != 0) {
            fprintf(stderr, "ballast profile: %s: \"%s\", expected a whole number from 1 to "
                            "4096 (or give --threads)\n", vars[k], v);
            return 0;
        }
        *from = vars[k];
        return n;
    }
    *from = "online cores";
    return cores > 0 ? cores : 1;
}

/* --tp, --node-link-gbps, --node-link-latency-us: 1 taken, 0 not these, -1 bad (printed). */
static int group_option(int argc, char **argv, int *i, struct estimate_group *g)
{
    const char *v;
    int r;
    if ((r = cli_option(argc, argv, i, "--tp", &v)) != 0) {
        if (r > 0 && cli_parse_int(v, 1, 1024, &g->tp) != 0) {
            cli_usage_error("profile", "--tp: \"%s\", expected 1 to 1024", v);
            return -1;
        }
        return r;
    }
    const char *name = "--node-link-gbps";
    double *field = &g->node_link.gbps;
    if ((r = cli_option(argc, argv, i, name, &v)) == 0) {
        name = "--node-link-latency-us";
        field = &g->node_link.latency_us;
        r = cli_option(argc, argv, i, name, &v);
    }
    if (r <= 0)
        return r;
    int bad = field == &g->node_link.gbps ? cli_parse_gbps(v, field) : cli_parse_us(v, field);
    if (bad || !(*field >= 0 && *field < 1e9)) {
        cli_usage_error("profile", "%s: \"%s\", expected %s", name, v,
                        field == &g->node_link.gbps ? "a rate (\"900Gbps\", \"112GB/s\", Gbit/s "
                                                      "alone)"
                                                    : "microseconds (\"3\", \"3us\", \"0.5ms\")");
        return -1;
    }
    g->node_link.present |= field == &g->node_link.gbps;
    return 1;
}

struct profile_args {
    const char *model_file, *device, *out_file, *name, *devices_file, *framework;
    long repeats, threads;
    int estimated, measure_only; /* --estimate; an option only measuring takes */
    struct estimate_group group;
};

/* The command line into a; ERR_INPUT (said) for an option it does not take. */
static int parse_profile_args(int argc, char **argv, struct profile_args *a)
{
    const char *v;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "--model", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            a->model_file = v;
        } else if ((r = cli_option(argc, argv, &i, "--device", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            a->device = v;
        } else if ((r = cli_option(argc, argv, &i, "--devices", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            a->devices_file = v;
        } else if ((r = cli_option(argc, argv, &i, "-o", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            a->out_file = v;
        } else if ((r = cli_option(argc, argv, &i, "--repeats", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            if (cli_parse_int(v, 1, 1000000, &a->repeats) != 0)
                return cli_usage_error("profile", "--repeats: \"%s\", expected a whole number "
                                                  "from 1 to 1000000", v);
            a->measure_only = 1;
        } else if ((r = cli_option(argc, argv, &i, "--threads", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            if (cli_parse_int(v, 1, 4096, &a->threads) != 0)
                return cli_usage_error("profile", "--threads: \"%s\", expected a whole number "
                                                  "from 1 to 4096", v);
            a->measure_only = 1;
        } else if ((r = cli_option(argc, argv, &i, "--name", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            if (v[0] == '\0' || strlen(v) >= PROFILE_NAME_MAX)
                return cli_usage_error("profile", "--name: \"%s\", expected 1 to %d characters",
                                       v, PROFILE_NAME_MAX - 1);
            a->name = v;
            a->measure_only = 1;
        } else if ((r = cli_option(argc, argv, &i, "--for", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            a->framework = v;
        } else if (cli_flag(argv, i, "--estimate")) {
            a->estimated = 1;
        } else if ((r = group_option(argc, argv, &i, &a->group)) != 0) {
            if (r < 0)
                return ERR_INPUT;
        } else {
            return cli_usage_error("profile", "unknown option \"%s\"", argv[i]);
        }
    }
    return ERR_OK;
}

/* Options that do not go together, and what is required. */
static int check_profile_args(const struct profile_args *a)
{
    if (a->model_file == NULL || a->device == NULL)
        return cli_usage_error("profile", "--model and --device are required");
    if (a->estimated && a->measure_only)
        return cli_usage_error("profile", "--repeats, --threads and --name are for measuring; "
                                          "--estimate measures nothing");
    if (!a->estimated && a->framework != NULL)
        return cli_usage_error("profile", "--for FRAMEWORK is for --estimate");
    if (!a->estimated && a->devices_file != NULL)
        return cli_usage_error("profile", "--devices is the device table of --estimate");
    int cpu = strcmp(a->device, "cpu") == 0;
    const struct estimate_group *g = &a->group;
    if ((g->tp > 1 && !g->node_link.present && (a->estimated || cpu)) ||
        (g->tp <= 1 && g->node_link.present))
        return cli_usage_error("profile", "--node-link-gbps is for --tp N (above 1), which "
                                          "takes it with --estimate and on a CPU (on a GPU "
                                          "without it the collectives are measured over NCCL)");
    if (!a->estimated && !cpu && a->threads > 0)
        return cli_usage_error("profile", "--threads is for --device cpu");
    return cli_check_output("profile", a->out_file) ? ERR_INPUT : ERR_OK;
}

int cmd_profile(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) {
            help();
            return ERR_OK;
        }
    struct profile_args a = {.repeats = 20, .group = {.tp = 1}};
    ERR_TRY(parse_profile_args(argc, argv, &a));
    ERR_TRY(check_profile_args(&a));
    if (a.estimated)
        return estimate(a.model_file, a.device,
                        a.devices_file ? a.devices_file : devices_default_file(), a.framework,
                        &a.group, a.out_file);
    int cpu = strcmp(a.device, "cpu") == 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN), threads = a.threads;
    const char *threads_from = "--threads";
    if (cpu && threads == 0 && (threads = default_threads(cores, &threads_from)) == 0)
        return ERR_INPUT;
    if (cpu && cores > 0 && threads > cores)
        fprintf(stderr,
                "ballast profile: warning: %ld threads (%s) on %ld online cores: the threads "
                "share cores, so the times measure the sharing\n",
                threads, threads_from, cores);
    return measure(a.model_file, a.device, (int)a.repeats, (int)threads,
                   cpu ? threads_from : NULL, a.name, &a.group, a.out_file);
}
