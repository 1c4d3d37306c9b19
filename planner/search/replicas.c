#include "replicas.h"

#include <float.h>
#include <math.h>
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

void replicas_pipe_free(struct replicas_pipe *r)
{
    free(r->last);
    free(r->optimizer_ms);
    memset(r, 0, sizeof *r);
}

int replicas_alone(const struct plan *p, struct replicas_pipe *out, struct err *e)
{
    memset(out, 0, sizeof *out);
    out->last = calloc((size_t)p->n_stages, sizeof *out->last);
    out->optimizer_ms = calloc((size_t)p->n_stages, sizeof *out->optimizer_ms);
    double *none = calloc((size_t)p->n_stages, sizeof *none); /* no reduction */
    struct sim_result r;
    int rc = out->last && out->optimizer_ms && none ? sim_plan_reduced(p, none, &r, e)
                                                    : err_set(e, ERR_FAIL, "out of memory");
    free(none);
    if (rc) {
        replicas_pipe_free(out);
        return rc;
    }
    for (int i = 0; i < r.n_tasks; i++)
        if (r.tasks[i].kind == SIM_BACKWARD && r.tasks[i].end_ms > out->last[r.tasks[i].stage])
            out->last[r.tasks[i].stage] = r.tasks[i].end_ms;
    for (int s = 0; s < p->n_stages; s++) {
        struct sim_stage st;
        sim_stage_from_plan(&p->stages[s], &st);
        out->optimizer_ms[s] = p->stages[s].optimizer == COST_PLACE_HOST ? -1 : st.optimizer_ms;
    }
    out->alone_ms = r.iteration_ms;
    sim_result_free(&r);
    return ERR_OK;
}

int replicas_deal(struct plan *p, int64_t batches, struct err *e)
{
    int dp = p->stages[0].dp, M = p->micro_batches;
    if (batches < dp || batches > (int64_t)dp * M || batches <= (int64_t)dp * (M - 1))
        return err_set(e, ERR_INPUT,
                       "%lld micro-batches over %d replicas of at most %d each: not %d the most",
                       (long long)batches, dp, M, M);
    free(p->replica_micro_batches);
    p->replica_micro_batches = NULL;
    int64_t more = batches - (int64_t)dp * (M - 1); /* replicas taking M */
    if (more == dp)
        return ERR_OK;
    if ((p->replica_micro_batches = malloc((size_t)dp * sizeof *p->replica_micro_batches)) ==
        NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int r = 0; r < dp; r++)
        p->replica_micro_batches[r] = r < more ? M : M - 1;
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

/* Each stage's end: its optimizer step once its reductions (lane) have ended; a pipeline whose
 * optimizer runs on the host is simulated again with those reductions. */
static int stage_ends(const struct plan *p, const struct replicas_pipe *alone,
                      const double *lane, double *end, struct err *e)
{
    int host = 0;
    *end = 0;
    for (int s = 0; s < p->n_stages; s++) {
        host |= alone->optimizer_ms[s] < 0;
        *end = fmax(*end, lane[s] + alone->optimizer_ms[s]);
    }
    if (!host)
        return ERR_OK;
    double *reduce = malloc((size_t)p->n_stages * sizeof *reduce);
    if (reduce == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int s = 0; s < p->n_stages; s++)
        reduce[s] = lane[s] - alone->last[s];
    struct sim_result r;
    int rc = sim_plan_reduced(p, reduce, &r, e);
    free(reduce);
    if (rc == ERR_OK) {
        *end = r.iteration_ms;
        sim_result_free(&r);
    }
    return rc;
}

/* replicas_step_given with `extra` more replicas reducing beside the plans' own (whose
 * pipelines take no time and hold no bytes). */
static int step_given(const struct plan *plans, int n, const struct replicas_pipe *alone,
                      int extra, struct replicas_result *out, struct err *e)
{
    memset(out, 0, sizeof *out);
    if (check_models(plans, n, e))
        return e->code;
    out->n_pipelines = n;
    out->pipeline_ms = calloc((size_t)n, sizeof *out->pipeline_ms);
    double **lane = calloc((size_t)n, sizeof *lane), **last = calloc((size_t)n, sizeof *last);
    int *at = calloc((size_t)n, sizeof *at);
    int rc = out->pipeline_ms && lane && last && at ? ERR_OK
                                                    : err_set(e, ERR_FAIL, "out of memory");
    for (int k = 0; k < n && rc == ERR_OK; k++) {
        /* a stage's reductions start after its last backward */
        if ((lane[k] = malloc((size_t)plans[k].n_stages * sizeof **lane)) == NULL)
            rc = err_set(e, ERR_FAIL, "out of memory");
        else
            memcpy(lane[k], alone[k].last, (size_t)plans[k].n_stages * sizeof **lane);
        last[k] = alone[k].last;
        out->pipeline_ms[k] = alone[k].alone_ms;
        out->replicas += plans[k].stages[0].dp;
        out->global_batch += (long)plan_batches(&plans[k]) * plans[k].model.micro_batch;
    }
    out->replicas += extra;
    if (rc == ERR_OK) {
        reduce_all(plans, n, out->replicas, last, lane, at, &out->n_segments);
        for (int k = 0; k < n && rc == ERR_OK; k++) {
            double end;
            rc = stage_ends(&plans[k], &alone[k], lane[k], &end, e);
            out->step_ms = fmax(out->step_ms, fmax(end, out->pipeline_ms[k]));
        }
    }
    for (int k = 0; k < n && lane != NULL; k++)
        free(lane[k]);
    free(lane);
    free(last);
    free(at);
    if (rc)
        replicas_result_free(out);
    return rc;
}

int replicas_step_given(const struct plan *plans, int n, const struct replicas_pipe *alone,
                        struct replicas_result *out, struct err *e)
{
    return step_given(plans, n, alone, 0, out, e);
}

int replicas_step_floor(const struct plan *p, const struct replicas_pipe *alone, int replicas,
                        double *step_ms, struct err *e)
{
    struct replicas_result r;
    int extra = replicas - p->stages[0].dp;
    if (step_given(p, 1, alone, extra > 0 ? extra : 0, &r, e))
        return e->code;
    *step_ms = r.step_ms;
    replicas_result_free(&r);
    return ERR_OK;
}

int replicas_step(const struct plan *plans, int n, struct replicas_result *out, struct err *e)
{
    memset(out, 0, sizeof *out);
    struct replicas_pipe *alone = calloc((size_t)n, sizeof *alone);
    int rc = alone != NULL ? ERR_OK : err_set(e, ERR_FAIL, "out of memory"), made = 0;
    for (; made < n && rc == ERR_OK; made++)
        rc = replicas_alone(&plans[made], &alone[made], e);
    if (rc == ERR_OK)
        rc = replicas_step_given(plans, n, alone, out, e);
    for (int k = 0; k < made && alone != NULL; k++)
        replicas_pipe_free(&alone[k]);
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
    if (r->lower_bound_ms > 0) { /* the pool search's certificate */
        cJSON_AddNumberToObject(o, "optimality_gap", r->step_ms / r->lower_bound_ms - 1);
        cJSON_AddNumberToObject(o, "lower_bound_ms", r->lower_bound_ms);
    }
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
        fprintf(f, " pipelines[%d] %d x %.3f ms alone (%lld micro-batches)%s", k,
                plans[k].stages[0].dp, r->pipeline_ms[k], (long long)plan_batches(&plans[k]),
                k + 1 < n ? ";" : "\n");
    fprintf(f, "step: %.3f ms (gradients reduced over all replicas in %d segments; the slowest "
               "sets the step)\n",
            r->step_ms, r->n_segments);
}
