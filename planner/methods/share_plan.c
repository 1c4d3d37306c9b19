/* `ballast plan --share` (share_plan.h). A job names its method on the command line
 * ("J.json:patent"), not in its cluster file: cluster files refuse unknown fields (a typo
 * must not be silently ignored), and a method is a choice made when planning, as --method is,
 * not a property of the cluster — the same cluster file serves a job alone and shared. */
#include "share_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int share_job_parse(const char *arg, const struct plan_options *defaults, char *file,
                    size_t file_cap, struct share_job_spec *out, struct err *e)
{
    const char *slash = strrchr(arg, '/');
    const char *colon = strchr(slash != NULL ? slash : arg, ':');
    size_t n = colon != NULL ? (size_t)(colon - arg) : strlen(arg);
    if (n == 0 || n >= file_cap)
        return err_set(e, ERR_INPUT, "--share: \"%s\", expected CLUSTER.json[:METHOD]", arg);
    memcpy(file, arg, n);
    file[n] = '\0';
    out->cluster_file = file;
    out->o = *defaults;
    struct err in;
    err_clear(&in);
    if (colon != NULL && plan_method_parse(colon + 1, &out->o, &in))
        return err_set(e, ERR_INPUT, "--share: %s: %s", arg, in.msg);
    return plan_options_check(&out->o, e);
}

/* The job's name: its cluster file's name without directory and ".json", made unique. */
static void job_name(struct share *s, int j, const char *file)
{
    const char *base = strrchr(file, '/');
    base = base != NULL ? base + 1 : file;
    char *name = s->jobs[j].name;
    snprintf(name, SHARE_NAME_MAX, "%s", base);
    char *dot = strstr(name, ".json");
    if (dot != NULL && dot[5] == '\0')
        *dot = '\0';
    for (int k = 0; k < j; k++)
        if (strcmp(s->jobs[k].name, name) == 0) {
            char tail[16];
            snprintf(tail, sizeof tail, "-%d", j + 1);
            name[SHARE_NAME_MAX - 1 - strlen(tail)] = '\0';
            strcat(name, tail);
        }
}

/* Every job's cluster over the same devices, memory and reserve as the first's. */
static int check_same_devices(const struct cluster *c, const struct share_job_spec *jobs, int n,
                              struct err *e)
{
    for (int j = 1; j < n; j++) {
        const char *f = jobs[j].cluster_file, *f0 = jobs[0].cluster_file;
        if (c[j].n_stages != c[0].n_stages)
            return err_set(e, ERR_INPUT, "%s: stages: %d stages, but %s has %d: shared jobs run "
                           "on the same devices in the same order", f, c[j].n_stages, f0,
                           c[0].n_stages);
        if (c[j].reserve_bytes != c[0].reserve_bytes)
            return err_set(e, ERR_INPUT, "%s: reserve_bytes: %lld, but %s has %lld: the jobs "
                           "share one reserve", f, (long long)c[j].reserve_bytes, f0,
                           (long long)c[0].reserve_bytes);
        for (int s = 0; s < c[0].n_stages; s++) {
            const struct cluster_stage *a = &c[j].stages[s], *b = &c[0].stages[s];
            if (strcmp(a->device, b->device) != 0 || a->memory_bytes != b->memory_bytes)
                return err_set(e, ERR_INPUT, "%s: stages[%d]: %s with %lld bytes, but %s's "
                               "stage %d is %s with %lld bytes", f, s, a->device,
                               (long long)a->memory_bytes, f0, s, b->device,
                               (long long)b->memory_bytes);
        }
    }
    for (int j = 0; j < n; j++)
        if (jobs[j].o.repartition)
            return err_set(e, ERR_INPUT, "%s: --repartition moves layers between devices, and "
                           "with them the persistent regions: not for shared jobs",
                           jobs[j].cluster_file);
    return ERR_OK;
}

/* Sum state_l of the stage's layers: the job's persistent bytes there. */
static int64_t stage_state(const struct cluster *c, int s)
{
    const struct profile *p = cluster_stage_profile(c, s);
    int64_t sum = 0;
    for (int l = c->stages[s].first; l <= c->stages[s].last; l++)
        sum += p->layers[l].state_bytes;
    return sum;
}

/* Lays the persistent regions end to end on every device; ERR_NOFIT where they and the
 * reserve exceed it. */
static int place_persistent(const struct cluster *c, int n, struct share *out, struct err *e)
{
    for (int s = 0; s < out->n_devices; s++) {
        struct share_device *dv = &out->devices[s];
        snprintf(dv->device, sizeof dv->device, "%s", c[0].stages[s].device);
        dv->capacity_bytes = c[0].stages[s].memory_bytes;
        dv->reserve_bytes = c[0].reserve_bytes;
        int64_t end = 0;
        for (int j = 0; j < n; j++) {
            dv->persistent[j] = (struct share_region){end, stage_state(&c[j], s)};
            end = share_align(end + dv->persistent[j].bytes);
        }
        dv->temporary.offset = end;
        if (end + dv->reserve_bytes <= dv->capacity_bytes)
            continue;
        char list[1024] = "";
        for (int j = 0, len = 0; j < n && len < (int)sizeof list; j++)
            len += snprintf(list + len, sizeof list - (size_t)len, "%s%s %lld", j ? " + " : "",
                            out->jobs[j].name, (long long)dv->persistent[j].bytes);
        return err_set(e, ERR_NOFIT, "device %d (%s): the jobs' persistent regions (%s) end at "
                       "%lld bytes; with the reserve %lld that is %lld, above its %lld bytes: "
                       "these jobs cannot share it", s, dv->device, list, (long long)end,
                       (long long)dv->reserve_bytes, (long long)(end + dv->reserve_bytes),
                       (long long)dv->capacity_bytes);
    }
    return ERR_OK;
}

/* Job j's plan for the temporary budget left on every device. */
static int plan_job(struct cluster *c, const struct share_job_spec *job, int j,
                    struct share *out, struct err *e)
{
    for (int s = 0; s < out->n_devices; s++) {
        const struct share_device *dv = &out->devices[s];
        /* its M = persistent_j + temporary_j + reserve; temporary_j <= the budget */
        c->stages[s].memory_bytes =
            dv->capacity_bytes - dv->temporary.offset + dv->persistent[j].bytes;
    }
    struct err inner;
    err_clear(&inner);
    if (c->schedule_auto || (c->schedule != SCHEDULE_1F1B && c->schedule != SCHEDULE_GPIPE))
        return err_set(e, ERR_INPUT, "%s: schedule: time-shared jobs run schedules 1f1b and "
                       "gpipe (a job's regions are one stage's)", job->cluster_file);
    if (planner_make(c, &job->o, &out->jobs[j].plan, &inner) == ERR_OK) {
        out->n_jobs = j + 1;
        return ERR_OK;
    }
    if (inner.code != ERR_NOFIT)
        return err_set(e, inner.code, "%s: %s", job->cluster_file, inner.msg);
    char budgets[1024] = "";
    for (int s = 0, len = 0; s < out->n_devices && len < (int)sizeof budgets; s++) {
        const struct share_device *dv = &out->devices[s];
        len += snprintf(budgets + len, sizeof budgets - (size_t)len,
                        "%sdevice %d (%s): %lld - reserve %lld - persistent %lld = %lld", s ? "; " : "",
                        s, dv->device, (long long)dv->capacity_bytes, (long long)dv->reserve_bytes,
                        (long long)dv->temporary.offset,
                        (long long)(dv->capacity_bytes - dv->reserve_bytes - dv->temporary.offset));
    }
    return err_set(e, ERR_NOFIT, "job %s (%s): its temporary memory does not fit the budget the "
                   "persistent regions leave (%s); its limits are that plus its own persistent "
                   "bytes: %s", out->jobs[j].name, job->cluster_file, budgets, inner.msg);
}

/* The temporary region: the largest temporary any job's plan needs, on each device. */
static void size_temporary(struct share *s)
{
    for (int d = 0; d < s->n_devices; d++) {
        int64_t most = 0;
        for (int j = 0; j < s->n_jobs; j++) {
            int64_t persistent, temporary;
            share_stage_bytes(&s->jobs[j].plan, d, &persistent, &temporary);
            most = temporary > most ? temporary : most;
        }
        s->devices[d].temporary.bytes = most;
    }
}

int planner_share(const struct share_job_spec *jobs, int n, struct share *out, struct err *e)
{
    memset(out, 0, sizeof *out);
    if (n < 1 || n > SHARE_JOBS_MAX)
        return err_set(e, ERR_INPUT, "--share: %d jobs, expected 1..%d", n, SHARE_JOBS_MAX);
    struct cluster *c = calloc((size_t)n, sizeof *c);
    if (c == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int loaded = 0, rc = ERR_OK;
    while (loaded < n && rc == ERR_OK)
        if ((rc = cluster_load(jobs[loaded].cluster_file, &c[loaded], e)) == ERR_OK)
            loaded++;
    if (rc == ERR_OK)
        rc = check_same_devices(c, jobs, n, e);
    if (rc == ERR_OK && (out->devices = calloc((size_t)c[0].n_stages, sizeof *out->devices)) == NULL)
        rc = err_set(e, ERR_FAIL, "out of memory");
    if (rc == ERR_OK) {
        out->n_devices = c[0].n_stages;
        for (int j = 0; j < n; j++) {
            job_name(out, j, jobs[j].cluster_file);
            snprintf(out->jobs[j].cluster, sizeof out->jobs[j].cluster, "%s",
                     jobs[j].cluster_file);
        }
        rc = place_persistent(c, n, out, e);
    }
    for (int j = 0; j < n && rc == ERR_OK; j++)
        rc = plan_job(&c[j], &jobs[j], j, out, e);
    if (rc == ERR_OK)
        size_temporary(out);
    for (int j = 0; j < loaded; j++)
        cluster_free(&c[j]);
    free(c);
    if (rc)
        share_free(out);
    return rc;
}

void planner_share_print(FILE *f, const struct share *s)
{
    fprintf(f, "%d jobs time-sharing %d devices:", s->n_jobs, s->n_devices);
    for (int j = 0; j < s->n_jobs; j++)
        fprintf(f, " %s (%s)", s->jobs[j].name, s->jobs[j].plan.method);
    fprintf(f, "\n%-6s %-12s %14s %12s", "stage", "device", "capacity", "reserve");
    for (int j = 0; j < s->n_jobs; j++)
        fprintf(f, " %18.18s", s->jobs[j].name);
    fprintf(f, " %14s %14s\n", "temporary", "used");
    for (int d = 0; d < s->n_devices; d++) {
        const struct share_device *dv = &s->devices[d];
        fprintf(f, "%-6d %-12.12s %14lld %12lld", d, dv->device, (long long)dv->capacity_bytes,
                (long long)dv->reserve_bytes);
        for (int j = 0; j < s->n_jobs; j++) {
            int64_t persistent, temporary;
            share_stage_bytes(&s->jobs[j].plan, d, &persistent, &temporary);
            fprintf(f, " %9lld+%8lld", (long long)persistent, (long long)temporary);
        }
        fprintf(f, " %14lld %14lld\n", (long long)dv->temporary.bytes,
                (long long)(dv->temporary.offset + dv->temporary.bytes + dv->reserve_bytes));
    }
    fprintf(f, "(per job: persistent+temporary bytes; the temporary region is their largest)\n");
}
