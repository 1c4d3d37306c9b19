#include "share.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonio.h"

int64_t share_align(int64_t bytes)
{
    return (bytes + SHARE_ALIGN - 1) / SHARE_ALIGN * SHARE_ALIGN;
}

void share_stage_bytes(const struct plan *p, int stage, int64_t *persistent, int64_t *temporary)
{
    struct stage_cost c;
    plan_stage_cost(p, &p->stages[stage], &c);
    *persistent = c.state_bytes;
    *temporary = c.memory_bytes - c.reserve_bytes - c.state_bytes;
}

/* ---- writing ---- */

static cJSON *region_json(const char *job, const struct share_region *r)
{
    cJSON *o = cJSON_CreateObject();
    if (job != NULL)
        cJSON_AddStringToObject(o, "job", job);
    jsonio_add_int(o, "offset", r->offset);
    jsonio_add_int(o, "bytes", r->bytes);
    return o;
}

static cJSON *share_device_json(const struct share *s, int d)
{
    const struct share_device *dv = &s->devices[d];
    cJSON *o = cJSON_CreateObject();
    jsonio_add_int(o, "stage", d);
    cJSON_AddStringToObject(o, "device", dv->device);
    jsonio_add_int(o, "capacity_bytes", dv->capacity_bytes);
    jsonio_add_int(o, "reserve_bytes", dv->reserve_bytes);
    cJSON *per = cJSON_AddArrayToObject(o, "persistent");
    for (int j = 0; j < s->n_jobs; j++)
        cJSON_AddItemToArray(per, region_json(s->jobs[j].name, &dv->persistent[j]));
    cJSON_AddItemToObject(o, "temporary", region_json(NULL, &dv->temporary));
    return o;
}

int share_write(const char *file, const struct share *s, struct err *e)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "ballast-share/1");
    cJSON *jobs = cJSON_AddArrayToObject(root, "jobs");
    for (int j = 0; j < s->n_jobs; j++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", s->jobs[j].name);
        cJSON_AddStringToObject(o, "cluster", s->jobs[j].cluster);
        cJSON_AddStringToObject(o, "method", s->jobs[j].plan.method);
        cJSON_AddItemToObject(o, "plan", plan_to_json(&s->jobs[j].plan));
        cJSON_AddItemToArray(jobs, o);
    }
    cJSON *devices = cJSON_AddArrayToObject(root, "devices");
    for (int d = 0; d < s->n_devices; d++)
        cJSON_AddItemToArray(devices, share_device_json(s, d));
    int rc = jsonio_write(file, root, e);
    cJSON_Delete(root);
    return rc;
}

/* ---- reading ---- */

static int read_job(const cJSON *o, const char *file, int j, struct share *s, struct err *e)
{
    char path[JSONIO_PATH_MAX], where[CLUSTER_PATH_MAX + JSONIO_PATH_MAX];
    struct share_job *job = &s->jobs[j];
    jsonio_path_index(path, "jobs", j);
    if (jsonio_expect_object(o, file, path, e) ||
        jsonio_str_copy(o, file, path, "name", job->name, sizeof job->name, e) ||
        jsonio_str_copy(o, file, path, "cluster", job->cluster, sizeof job->cluster, e))
        return e->code;
    for (int k = 0; k < j; k++)
        if (strcmp(s->jobs[k].name, job->name) == 0)
            return err_set(e, ERR_INPUT, "%s: %s.name: \"%s\" is also jobs[%d]'s name", file,
                           path, job->name, k);
    const cJSON *plan = cJSON_GetObjectItemCaseSensitive(o, "plan");
    if (plan == NULL)
        return err_set(e, ERR_INPUT, "%s: %s.plan: missing", file, path);
    char sub[JSONIO_PATH_MAX];
    jsonio_path_key(sub, path, "plan");
    snprintf(where, sizeof where, "%s: %s", file, sub);
    if (jsonio_expect_object(plan, file, sub, e) || plan_parse(plan, where, &job->plan, e))
        return e->code;
    s->n_jobs = j + 1;
    const struct plan *p0 = &s->jobs[0].plan, *p = &job->plan;
    if (p->n_stages != p0->n_stages)
        return err_set(e, ERR_INPUT, "%s: %s.plan.stages: %d stages, but jobs[0]'s plan has %d: "
                       "jobs share the same devices in the same order", file, path,
                       p->n_stages, p0->n_stages);
    for (int st = 0; st < p->n_stages; st++)
        if (strcmp(p->stages[st].device, p0->stages[st].device) != 0)
            return err_set(e, ERR_INPUT, "%s: %s.plan.stages[%d].device: \"%s\", but jobs[0]'s "
                           "stage %d is on \"%s\"", file, path, st, p->stages[st].device, st,
                           p0->stages[st].device);
    return ERR_OK;
}

/* A region {offset, bytes} at `path` starting at or after `from`. */
static int read_region(const cJSON *o, const char *file, const char *path, int64_t from,
                       struct share_region *r, struct err *e)
{
    if (jsonio_expect_object(o, file, path, e) ||
        jsonio_int(o, file, path, "offset", 0, JSONIO_INT_MAX, &r->offset, e) ||
        jsonio_int(o, file, path, "bytes", 0, JSONIO_INT_MAX, &r->bytes, e))
        return e->code;
    if (r->offset < from || r->offset % SHARE_ALIGN != 0)
        return err_set(e, ERR_INPUT, "%s: %s.offset: %lld, expected a multiple of %d at or after "
                       "%lld (where the region before it ends)", file, path,
                       (long long)r->offset, SHARE_ALIGN, (long long)from);
    return ERR_OK;
}

static int read_persistent(const cJSON *arr, const char *file, const char *path,
                           const struct share *s, struct share_device *dv, int64_t *end,
                           struct err *e)
{
    if (arr == NULL)
        return err_set(e, ERR_INPUT, "%s: %s: missing", file, path);
    if (jsonio_expect_array(arr, file, path, e))
        return e->code;
    if (cJSON_GetArraySize(arr) != s->n_jobs)
        return err_set(e, ERR_INPUT, "%s: %s: %d regions for %d jobs (one per job, in job "
                       "order)", file, path, cJSON_GetArraySize(arr), s->n_jobs);
    int j = 0;
    for (const cJSON *o = arr->child; o != NULL; o = o->next, j++) {
        char rp[JSONIO_PATH_MAX];
        const char *job;
        jsonio_path_index(rp, path, j);
        if (read_region(o, file, rp, *end, &dv->persistent[j], e) ||
            jsonio_str(o, file, rp, "job", &job, e))
            return e->code;
        if (strcmp(job, s->jobs[j].name) != 0)
            return err_set(e, ERR_INPUT, "%s: %s.job: \"%s\", expected \"%s\" (jobs[%d])", file,
                           rp, job, s->jobs[j].name, j);
        *end = dv->persistent[j].offset + dv->persistent[j].bytes;
    }
    return ERR_OK;
}

static int read_device(const cJSON *o, const char *file, int d, struct share *s, struct err *e)
{
    char path[JSONIO_PATH_MAX], sub[JSONIO_PATH_MAX];
    struct share_device *dv = &s->devices[d];
    int64_t stage, end = 0;
    jsonio_path_index(path, "devices", d);
    if (jsonio_expect_object(o, file, path, e) ||
        jsonio_int(o, file, path, "stage", d, d, &stage, e) ||
        jsonio_str_copy(o, file, path, "device", dv->device, sizeof dv->device, e) ||
        jsonio_int(o, file, path, "capacity_bytes", 1, JSONIO_INT_MAX, &dv->capacity_bytes, e) ||
        jsonio_int(o, file, path, "reserve_bytes", 0, JSONIO_INT_MAX, &dv->reserve_bytes, e))
        return e->code;
    if (strcmp(dv->device, s->jobs[0].plan.stages[d].device) != 0)
        return err_set(e, ERR_INPUT, "%s: %s.device: \"%s\", but the plans' stage %d is on "
                       "\"%s\"", file, path, dv->device, d, s->jobs[0].plan.stages[d].device);
    jsonio_path_key(sub, path, "persistent");
    if (read_persistent(cJSON_GetObjectItemCaseSensitive(o, "persistent"), file, sub, s, dv,
                        &end, e))
        return e->code;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "temporary");
    jsonio_path_key(sub, path, "temporary");
    if (t == NULL)
        return err_set(e, ERR_INPUT, "%s: %s: missing", file, sub);
    if (read_region(t, file, sub, end, &dv->temporary, e))
        return e->code;
    int64_t used = dv->temporary.offset + dv->temporary.bytes + dv->reserve_bytes;
    if (used > dv->capacity_bytes)
        return err_set(e, ERR_NOFIT, "%s: %s: the regions end at %lld bytes, with reserve %lld "
                       "that is %lld, above capacity_bytes %lld", file, path,
                       (long long)(dv->temporary.offset + dv->temporary.bytes),
                       (long long)dv->reserve_bytes, (long long)used,
                       (long long)dv->capacity_bytes);
    return ERR_OK;
}

static int share_from_json(const cJSON *root, const char *file, struct share *s, struct err *e)
{
    if (jsonio_check_format(root, file, "share", 1, e))
        return e->code;
    const cJSON *jobs = cJSON_GetObjectItemCaseSensitive(root, "jobs");
    const cJSON *devices = cJSON_GetObjectItemCaseSensitive(root, "devices");
    if (jobs == NULL || devices == NULL)
        return err_set(e, ERR_INPUT, "%s: %s: missing", file, jobs == NULL ? "jobs" : "devices");
    if (jsonio_expect_array(jobs, file, "jobs", e) ||
        jsonio_expect_array(devices, file, "devices", e))
        return e->code;
    int n = cJSON_GetArraySize(jobs);
    if (n < 1 || n > SHARE_JOBS_MAX)
        return err_set(e, ERR_INPUT, "%s: jobs: %d jobs, expected 1..%d", file, n, SHARE_JOBS_MAX);
    int j = 0;
    for (const cJSON *o = jobs->child; o != NULL; o = o->next, j++)
        if (read_job(o, file, j, s, e))
            return e->code;
    int S = s->jobs[0].plan.n_stages;
    if (cJSON_GetArraySize(devices) != S)
        return err_set(e, ERR_INPUT, "%s: devices: %d devices, but the plans have %d stages",
                       file, cJSON_GetArraySize(devices), S);
    s->devices = calloc((size_t)S, sizeof *s->devices);
    if (s->devices == NULL)
        return err_set(e, ERR_FAIL, "%s: out of memory", file);
    s->n_devices = S;
    int d = 0;
    for (const cJSON *o = devices->child; o != NULL; o = o->next, d++)
        if (read_device(o, file, d, s, e))
            return e->code;
    return ERR_OK;
}

int share_load(const char *file, struct share *s, struct err *e)
{
    memset(s, 0, sizeof *s);
    cJSON *root = jsonio_read_kind(file, JSONIO_SHARE, e);
    if (root == NULL)
        return e->code;
    int rc = share_from_json(root, file, s, e);
    cJSON_Delete(root);
    if (rc)
        share_free(s);
    return rc;
}

void share_free(struct share *s)
{
    for (int j = 0; j < s->n_jobs; j++)
        plan_free(&s->jobs[j].plan);
    free(s->devices);
    memset(s, 0, sizeof *s);
}
