#include "replicas.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "jsonio.h"
#include "sim.h"

void replicas_result_free(struct replicas_result *r)
{
    free(r->pipeline_ms);
    memset(r, 0, sizeof *r);
}

int replicas_alone(const struct plan *p, double *last, double *alone, struct err *e)
{
    struct plan q = *p;
    q.stages = malloc((size_t)p->n_stages * sizeof *q.stages);
    if (q.stages == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    memcpy(q.stages, p->stages, (size_t)p->n_stages * sizeof *q.stages);
    for (int s = 0; s < p->n_stages; s++)
        q.stages[s].dp = 1;
    struct sim_result r;
    int rc = sim_plan(&q, &r, e);
    free(q.stages);
    if (rc)
        return rc;
    for (int s = 0; s < p->n_stages; s++)
        last[s] = 0;
    for (int i = 0; i < r.n_tasks; i++)
        if (r.tasks[i].kind == SIM_BACKWARD && r.tasks[i].end_ms > last[r.tasks[i].stage])
            last[r.tasks[i].stage] = r.tasks[i].end_ms;
    *alone = r.iteration_ms;
    sim_result_free(&r);
    return ERR_OK;
}

static int stage_of(const struct plan *p, int layer)
{
    int s = 0;
    while (p->stages[s].last < layer)
        s++;
    return s;
}

/* The stage's gradient bytes of its layers first..last (global), by their state share. */
static int64_t segment_bytes(const struct plan_stage *st, int first, int last)
{
    __int128 part = 0, whole = 0;
    for (int l = st->first; l <= st->last; l++) {
        whole += st->layers[l - st->first].state_bytes;
        if (l >= first && l <= last)
            part += st->layers[l - st->first].state_bytes;
    }
    return whole > 0 ? (int64_t)((st->allreduce_bytes * part + whole - 1) / whole) : 0;
}

/* The slower of two links (absent: free). */
static struct link slower(struct link a, struct link b)
{
    if (!a.present)
        return b;
    if (!b.present)
        return a;
    return (struct link){1, a.gbps < b.gbps ? a.gbps : b.gbps,
                         a.latency_us > b.latency_us ? a.latency_us : b.latency_us};
}

/* Reduces the segment first..last held by stage at[k] of each pipeline; returns its end. */
static double reduce_segment(const struct plan *plans, int n, const int *at, int first, int last,
                             int replicas, double *const *ready, double **lane)
{
    double start = 0;
    int64_t bytes = 0;
    struct link link = {0};
    for (int k = 0; k < n; k++) {
        const struct plan_stage *st = &plans[k].stages[at[k]];
        int64_t b = segment_bytes(st, first, last);
        bytes = b > bytes ? b : bytes;
        link = slower(link, st->dp_link);
        start = ready[k][at[k]] > start ? ready[k][at[k]] : start;
        start = lane[k][at[k]] > start ? lane[k][at[k]] : start;
    }
    double end = start + cost_dp_allreduce_ms(&link, replicas, bytes);
    for (int k = 0; k < n; k++)
        lane[k][at[k]] = end;
    return end;
}

static int check_models(const struct plan *plans, int n, struct err *e)
{
    for (int k = 1; k < n; k++)
        if (!model_equal(&plans[k].model, &plans[0].model))
            return err_set(e, ERR_INPUT,
                           "pipelines[%d]: its plan is of a different model than pipelines[0]'s: "
                           "replicas train one model",
                           k);
    return ERR_OK;
}

/* Every segment, from the last layers to the first. */
static double reduce_all(const struct plan *plans, int n, int replicas, double *const *ready,
                         double **lane, int *at, int *segments)
{
    double end = 0;
    int L = model_layer_count(&plans[0].model), last = L - 1;
    *segments = 0;
    while (last >= 0) {
        int first = 0;
        for (int k = 0; k < n; k++) {
            at[k] = stage_of(&plans[k], last);
            first = plans[k].stages[at[k]].first > first ? plans[k].stages[at[k]].first : first;
        }
        double t = reduce_segment(plans, n, at, first, last, replicas, ready, lane);
        end = t > end ? t : end;
        (*segments)++;
        last = first - 1;
    }
    return end;
}

int replicas_step_given(const struct plan *plans, int n, double *const *last,
                        const double *alone_ms, struct replicas_result *out, struct err *e)
{
    memset(out, 0, sizeof *out);
    if (check_models(plans, n, e))
        return e->code;
    out->n_pipelines = n;
    out->pipeline_ms = calloc((size_t)n, sizeof *out->pipeline_ms);
    double **lane = calloc((size_t)n, sizeof *lane);
    int *at = calloc((size_t)n, sizeof *at);
    int rc = out->pipeline_ms && lane && at ? ERR_OK : err_set(e, ERR_FAIL, "out of memory");
    for (int k = 0; k < n && rc == ERR_OK; k++) {
        if ((lane[k] = calloc((size_t)plans[k].n_stages, sizeof **lane)) == NULL)
            rc = err_set(e, ERR_FAIL, "out of memory");
        out->pipeline_ms[k] = alone_ms[k];
        out->replicas += plans[k].stages[0].dp;
        out->global_batch +=
            (long)plans[k].stages[0].dp * plans[k].micro_batches * plans[k].model.micro_batch;
    }
    if (rc == ERR_OK) {
        out->step_ms = reduce_all(plans, n, out->replicas, last, lane, at,
                                  &out->n_segments);
        for (int k = 0; k < n; k++)
            out->step_ms = out->pipeline_ms[k] > out->step_ms ? out->pipeline_ms[k] : out->step_ms;
    }
    for (int k = 0; k < n && lane != NULL; k++)
        free(lane[k]);
    free(lane);
    free(at);
    if (rc)
        replicas_result_free(out);
    return rc;
}

int replicas_step(const struct plan *plans, int n, struct replicas_result *out, struct err *e)
{
    memset(out, 0, sizeof *out);
    double **last = calloc((size_t)n, sizeof *last), *alone = calloc((size_t)n, sizeof *alone);
    int rc = last && alone ? ERR_OK : err_set(e, ERR_FAIL, "out of memory");
    for (int k = 0; k < n && rc == ERR_OK; k++)
        rc = (last[k] = calloc((size_t)plans[k].n_stages, sizeof **last)) == NULL
                 ? err_set(e, ERR_FAIL, "out of memory")
                 : replicas_alone(&plans[k], last[k], &alone[k], e);
    if (rc == ERR_OK)
        rc = replicas_step_given(plans, n, last, alone, out, e);
    for (int k = 0; k < n && last != NULL; k++)
        free(last[k]);
    free(last);
    free(alone);
    return rc;
}

cJSON *replicas_to_json(const struct plan *plans, int n, const struct replicas_result *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "ballast-replicas/1");
    cJSON_AddNumberToObject(o, "step_ms", r->step_ms);
    cJSON_AddNumberToObject(o, "replicas", r->replicas);
    cJSON_AddNumberToObject(o, "global_batch", (double)r->global_batch);
    cJSON *pipes = cJSON_AddArrayToObject(o, "pipelines");
    for (int k = 0; k < n; k++) {
        cJSON *p = plan_to_json(&plans[k]);
        cJSON_AddNumberToObject(p, "alone_ms", r->pipeline_ms[k]);
        cJSON_AddItemToArray(pipes, p);
    }
    return o;
}

int replicas_is_file(const cJSON *root)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "format");
    return cJSON_IsString(f) && strcmp(f->valuestring, "ballast-replicas/1") == 0;
}

/* What replicas_to_json derives from the plans: read for their types and ranges only (a
 * simulation computes them again). Other members pass, as in a plan. */
static int read_derived(const cJSON *root, const char *file, struct err *e)
{
    double ms;
    int64_t count;
    if (jsonio_num_opt(root, file, "", "step_ms", 0, DBL_MAX, &ms, e) ||
        jsonio_int_opt(root, file, "", "replicas", 1, JSONIO_INT_MAX, &count, e) ||
        jsonio_int_opt(root, file, "", "global_batch", 1, JSONIO_INT_MAX, &count, e))
        return e->code;
    return ERR_OK;
}

int replicas_parse(const cJSON *root, const char *file, struct plan **plans, int *n,
                   struct err *e)
{
    const cJSON *pipes = cJSON_GetObjectItemCaseSensitive(root, "pipelines");
    *plans = NULL;
    *n = 0;
    if (jsonio_check_format(root, file, "replicas", 1, e) || read_derived(root, file, e))
        return e->code;
    if (!cJSON_IsArray(pipes) || cJSON_GetArraySize(pipes) < 1)
        return err_set(e, ERR_INPUT, "%s: pipelines: expected an array of plans", file);
    int count = cJSON_GetArraySize(pipes);
    *plans = calloc((size_t)count, sizeof **plans);
    if (*plans == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (const cJSON *it = pipes->child; it != NULL; it = it->next) {
        char where[CLUSTER_PATH_MAX + 32], path[JSONIO_PATH_MAX];
        double ms;
        snprintf(where, sizeof where, "%s: pipelines[%d]", file, *n);
        jsonio_path_index(path, "pipelines", *n);
        if (jsonio_num_opt(it, file, path, "alone_ms", 0, DBL_MAX, &ms, e) ||
            plan_parse(it, where, &(*plans)[*n], e))
            break;
        (*n)++;
    }
    if (e->code) {
        for (int k = 0; k < *n; k++)
            plan_free(&(*plans)[k]);
        free(*plans);
        *plans = NULL;
        *n = 0;
    }
    return e->code;
}

void replicas_print(FILE *f, const struct plan *plans, int n, const struct replicas_result *r)
{
    fprintf(f, "replicas: %d pipelines, %d replicas, global batch %ld samples:", n, r->replicas,
            r->global_batch);
    for (int k = 0; k < n; k++)
        fprintf(f, " pipelines[%d] %d x %.3f ms alone%s", k, plans[k].stages[0].dp,
                r->pipeline_ms[k], k + 1 < n ? ";" : "\n");
    fprintf(f, "step: %.3f ms (gradients reduced over all replicas in %d segments; the slowest "
               "sets the step)\n",
            r->step_ms, r->n_segments);
}
