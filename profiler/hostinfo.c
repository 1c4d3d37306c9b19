#include "hostinfo.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "cuda_device.h"
#if BALLAST_WITH_CUDA
#include "cudaprobe.h"
#endif

#ifndef BALLAST_VERSION
#define BALLAST_VERSION "unknown"
#endif

int hostinfo_parse_device(const char *text, int *cuda_index, struct err *e)
{
    if (strcmp(text, "cpu") == 0) {
        *cuda_index = -1;
        return ERR_OK;
    }
    if (strncmp(text, "cuda:", 5) == 0 && text[5] >= '0' && text[5] <= '9') {
        char *end;
        errno = 0;
        long v = strtol(text + 5, &end, 10);
        if (*end == '\0' && errno == 0 && v <= 1023) {
            *cuda_index = (int)v;
            return ERR_OK;
        }
    }
    return err_set(e, ERR_INPUT,
                   "--device: \"%s\", expected \"cpu\" or \"cuda:N\" (N the CUDA device number, "
                   "0 to 1023); to estimate a device from its datasheet use --estimate",
                   text);
}

/* The value of the first "key : value" line of /proc/cpuinfo whose key is one of `keys`. */
static void cpu_model(char *out, size_t cap)
{
    static const char *const keys[] = {"model name", "Model", "Hardware", "cpu model", NULL};
    char line[512];
    snprintf(out, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL)
        return;
    int found = 0;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        char *colon = strchr(line, ':');
        if (colon == NULL)
            continue;
        for (int k = 0; keys[k] != NULL && !found; k++)
            if (strncmp(line, keys[k], strlen(keys[k])) == 0) {
                char *v = colon + 1;
                while (*v == ' ' || *v == '\t')
                    v++;
                v[strcspn(v, "\n")] = '\0';
                if (*v != '\0') {
                    snprintf(out, cap, "%s", v);
                    found = 1;
                }
            }
    }
    fclose(f);
}

static int64_t host_memory_bytes(void)
{
    char line[256];
    long long kib = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f != NULL) {
        while (fgets(line, sizeof line, f) != NULL)
            if (sscanf(line, "MemTotal: %lld kB", &kib) == 1)
                break;
        fclose(f);
    }
    return (int64_t)kib * 1024;
}

/* Host, date, and the libraries every build links. */
static void common_provenance(cJSON *prov)
{
    char host[256] = "unknown";
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = '\0';
    cJSON_AddStringToObject(prov, "host", host);
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    cJSON_AddStringToObject(prov, "date", date);
    struct utsname u;
    if (uname(&u) == 0) {
        char os[256];
        snprintf(os, sizeof os, "%s %s %s", u.sysname, u.release, u.machine);
        cJSON_AddStringToObject(prov, "os", os);
    }
    cJSON *lib = cJSON_AddObjectToObject(prov, "libraries");
    cJSON_AddStringToObject(lib, "ballast", BALLAST_VERSION);
    char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = "unknown";
    int len = 0;
    /* one of the few MPI calls allowed before MPI_Init */
    if (MPI_Get_library_version(mpi, &len) == MPI_SUCCESS) {
        mpi[len < (int)sizeof mpi ? len : (int)sizeof mpi - 1] = '\0';
        mpi[strcspn(mpi, ",\n")] = '\0'; /* "Open MPI v4.1.4", without the build details */
    }
    cJSON_AddStringToObject(lib, "mpi", mpi);
    cJSON_AddStringToObject(lib, "cjson", cJSON_Version());
#if defined(__clang__)
    cJSON_AddStringToObject(lib, "compiler", __VERSION__); /* "Clang x.y.z ..." */
#elif defined(__GNUC__)
    cJSON_AddStringToObject(lib, "compiler", "GCC " __VERSION__);
#endif
}

static int open_cpu(int threads, struct backend *be, struct device_info *d, cJSON *prov,
                    struct err *e)
{
    char model[256];
    cpu_model(model, sizeof model);
    snprintf(d->name, sizeof d->name, "%s", model);
    snprintf(d->kind, sizeof d->kind, "cpu");
    d->memory_bytes = host_memory_bytes();
    if (d->memory_bytes <= 0)
        return err_set(e, ERR_FAIL, "cannot read the host's memory (MemTotal of /proc/meminfo)");
    if (backend_cpu_init(be, threads, e))
        return e->code;
    cJSON_AddStringToObject(prov, "device", model);
    cJSON_AddNumberToObject(prov, "threads", threads);
    cJSON_AddNumberToObject(prov, "cores_online", (double)sysconf(_SC_NPROCESSORS_ONLN));
    common_provenance(prov);
    cJSON *lib = cJSON_GetObjectItemCaseSensitive(prov, "libraries");
    char blas[256];
    snprintf(blas, sizeof blas, "%s", openblas_get_config());
    cJSON_AddStringToObject(lib, "openblas", blas);
    cJSON_AddStringToObject(lib, "openblas_core", openblas_get_corename());
#ifdef _OPENMP
    cJSON_AddNumberToObject(lib, "openmp", _OPENMP);
#endif
    return ERR_OK;
}

static int open_cuda(int index, struct backend *be, struct measure_timer *timer,
                     struct device_info *d, cJSON *prov, struct err *e)
{
    int count = 0;
    char why[256] = "";
    if (!cuda_built())
        return err_set(e, ERR_INPUT,
                       "--device cuda:%d: this ballast was built without the CUDA backend "
                       "(configure with -DBALLAST_CUDA=ON on a machine with the CUDA Toolkit "
                       "and NCCL); nothing was measured",
                       index);
    if (cuda_device_count(&count, why, sizeof why) || index >= count)
        return err_set(e, ERR_INPUT, "--device cuda:%d: this machine has %d CUDA device%s%s%s",
                       index, count, count == 1 ? "" : "s", why[0] ? ": " : "", why);
    struct cuda_device_info info;
    if (cuda_device_query(index, &info, e) || backend_cuda_init(be, index, e))
        return e->code;
    snprintf(d->name, sizeof d->name, "%s", info.name);
    snprintf(d->kind, sizeof d->kind, "cuda");
    d->memory_bytes = info.total_bytes;
    cJSON_AddStringToObject(prov, "device", info.name);
    cJSON_AddStringToObject(prov, "uuid", info.uuid);
    char cc[32];
    snprintf(cc, sizeof cc, "%d.%d", info.cc_major, info.cc_minor);
    cJSON_AddStringToObject(prov, "compute_capability", cc);
    cJSON_AddNumberToObject(prov, "multiprocessors", info.multiprocessors);
    common_provenance(prov);
#if BALLAST_WITH_CUDA
    if (cudaprobe_versions(cJSON_GetObjectItemCaseSensitive(prov, "libraries"), e) ||
        cudaprobe_timer_init(timer, backend_cuda_stream(be), e)) {
        be->ops->free(be);
        return e->code;
    }
#endif
    return ERR_OK;
}

int hostinfo_open(const char *device, int threads, struct backend *be,
                  struct measure_timer *timer, struct device_info *d, cJSON *prov,
                  struct err *e)
{
    int index = -1;
    memset(timer, 0, sizeof *timer);
    if (hostinfo_parse_device(device, &index, e))
        return e->code;
    if (index < 0)
        return open_cpu(threads, be, d, prov, e);
    return open_cuda(index, be, timer, d, prov, e);
}

void hostinfo_close(struct backend *be, struct measure_timer *timer)
{
#if BALLAST_WITH_CUDA
    if (timer->impl != NULL)
        cudaprobe_timer_free(timer);
#endif
    if (be->ops != NULL)
        be->ops->free(be);
}
