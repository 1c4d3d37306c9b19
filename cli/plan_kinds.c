#include "plan_kinds.h"

#include <string.h>

#include "devices.h"
#include "estimate.h"
#include "model_kind.h"

static struct plan_kind *kind_of(struct plan_kinds *k, const char *device)
{
    for (int i = 0; i < k->n; i++)
        if (strcmp(k->kind[i].device, device) == 0)
            return &k->kind[i];
    if (k->n == PLAN_KINDS_MAX)
        return NULL;
    struct plan_kind *r = &k->kind[k->n++];
    memset(r, 0, sizeof *r);
    snprintf(r->device, sizeof r->device, "%s", device);
    r->idle = -1;
    return r;
}

/* Adds v to a set of at most 4 values (a fifth is dropped: the table says "..."). */
static void add_value(int *set, int *n, int v)
{
    for (int i = 0; i < *n; i++)
        if (set[i] == v)
            return;
    if (*n < 4)
        set[(*n)++] = v;
}

/* The model's FLOPs of stage st's layers for one micro-batch (0 for a custom model). */
static double stage_flops(const struct model *m, const struct plan_stage *st)
{
    double sum = 0;
    if (model_is_custom(m))
        return 0;
    for (int l = st->first; l <= st->last; l++) {
        double fwd, bwd;
        estimate_layer_flops(m, l, &fwd, &bwd);
        sum += fwd + bwd;
    }
    return sum;
}

/* Stage s is its GPU's first chunk (schedule.h; every stage where a GPU holds one): a GPU
 * and its pipeline rank count once. */
static int gpu_first(const struct plan *p, int s)
{
    int group[SCHEDULE_CHUNKS_MAX];
    return plan_gpu_stages(p, p->stages[s].gpu, group) > 0 && group[0] == s;
}

static void add_plan(struct plan_kinds *k, const struct plan *p)
{
    int dp = p->n_stages > 0 && p->stages[0].dp > 0 ? p->stages[0].dp : 1;
    k->tokens += (double)plan_batches(p) * p->model.micro_batch * p->model.seq_len;
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        struct plan_kind *r = kind_of(k, st->device);
        if (r == NULL)
            continue;
        int tp = st->tp > 0 ? st->tp : 1, stages = 0;
        for (int t = 0; t < p->n_stages; t++)
            stages += strcmp(p->stages[t].device, st->device) == 0 && gpu_first(p, t);
        r->gpus += gpu_first(p, s) ? (long)tp * dp : 0;
        r->flops += stage_flops(&p->model, st) * (double)plan_batches(p);
        add_value(r->tp, &r->n_tp, tp);
        add_value(r->dp, &r->n_dp, dp);
        add_value(r->pp, &r->n_pp, stages);
    }
}

void plan_kinds_make(const struct plan *plans, int n, double step_ms,
                     const struct plan_kinds_pool *pool, struct plan_kinds *out)
{
    memset(out, 0, sizeof *out);
    out->step_ms = step_ms;
    if (pool != NULL)
        for (int i = 0; i < pool->n; i++)
            kind_of(out, pool->device[i]); /* the pool's order, and its idle kinds too */
    for (int i = 0; i < n; i++)
        add_plan(out, &plans[i]);
    struct device_table t;
    struct err e;
    err_clear(&e);
    int have_table = devices_load(devices_default_file(), &t, &e) == ERR_OK;
    for (int i = 0; i < out->n; i++) {
        struct plan_kind *r = &out->kind[i];
        const struct device_spec *d = have_table ? devices_find(&t, r->device) : NULL;
        double peak = d != NULL && n > 0 ? devices_gemm_tflops(d, plans[0].model.dtype) : 0;
        r->mfu = peak > 0 && r->flops > 0 && r->gpus > 0 && step_ms > 0
                     ? r->flops / ((double)r->gpus * peak * 1e12 * step_ms * 1e-3)
                     : -1;
        for (int j = 0; pool != NULL && j < pool->n; j++)
            if (strcmp(pool->device[j], r->device) == 0)
                r->idle = (long)pool->count[j] - r->gpus;
    }
    if (have_table)
        devices_free(&t);
}

/* "2" or "2/8" (the distinct values), "-" when none. */
static void format_set(const int *set, int n, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%d", i ? "/" : "", set[i]);
    if (n == 0)
        snprintf(buf, cap, "-");
}

void plan_kinds_print(FILE *f, const struct plan_kinds *k)
{
    int w = 11;
    for (int i = 0; i < k->n; i++)
        w = (int)strlen(k->kind[i].device) > w ? (int)strlen(k->kind[i].device) : w;
    fprintf(f, "%-*s %6s %6s %6s %4s %6s %7s\n", w, "device kind", "GPUs", "idle", "stages",
            "tp", "dp", "MFU");
    for (int i = 0; i < k->n; i++) {
        const struct plan_kind *r = &k->kind[i];
        char tp[32], dp[32], pp[32], idle[32], mfu[32];
        format_set(r->tp, r->n_tp, tp, sizeof tp);
        format_set(r->dp, r->n_dp, dp, sizeof dp);
        format_set(r->pp, r->n_pp, pp, sizeof pp);
        snprintf(idle, sizeof idle, "-");
        snprintf(mfu, sizeof mfu, "unknown");
        if (r->idle >= 0)
            snprintf(idle, sizeof idle, "%ld", r->idle);
        if (r->mfu >= 0)
            snprintf(mfu, sizeof mfu, "%.1f%%", 100 * r->mfu);
        fprintf(f, "%-*s %6ld %6s %6s %4s %6s %7s\n", w, r->device, r->gpus, idle, pp, tp, dp,
                mfu);
    }
    if (k->step_ms > 0)
        fprintf(f, "throughput: %.0f tokens a step in %.3f ms: %.0f tokens/s\n", k->tokens,
                k->step_ms, k->tokens / (k->step_ms * 1e-3));
}
