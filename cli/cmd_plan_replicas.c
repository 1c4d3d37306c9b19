/* ballast plan on a cluster of several pipelines (heterogeneous replicas): each planned by
 * the method as a cluster of its own, then the step of all of them (planner/search/replicas.h); and
 * on a pool of GPUs: the search (planner/search/pool.h, planner/search/pool_mixed.h): one plan, or a
 * replicas file when heterogeneous pipelines step faster. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "jsonio.h"
#include "plan_kinds.h"
#include "planner.h"
#include "pool.h"
#include "pool_mixed.h"
#include "replicas.h"

static int plan_pipelines(const cJSON *root, const char *file, int n,
                          const struct plan_options *o, struct plan *plans, int *made,
                          struct err *e)
{
    for (*made = 0; *made < n; (*made)++) {
        struct cluster c;
        if (cluster_parse_pipeline(root, file, *made, &c, e))
            return e->code;
        int rc = planner_make(&c, o, &plans[*made], e);
        cluster_free(&c);
        if (rc) {
            char msg[sizeof e->msg];
            snprintf(msg, sizeof msg, "%s", e->msg);
            return err_set(e, rc, "pipelines[%d]: %s", *made, msg);
        }
    }
    return ERR_OK;
}

/* Each pipeline's table and the step (unless quiet); -o: the replicas file. */
static int replicas_output(const struct plan *plans, int n, const struct replicas_result *r,
                           const char *out_file, int quiet, struct err *e)
{
    if (!quiet) {
        for (int k = 0; k < n; k++) {
            printf("pipelines[%d]:\n", k);
            planner_print(stdout, &plans[k]);
        }
        replicas_print(stdout, plans, n, r);
    }
    if (out_file == NULL)
        return ERR_OK;
    cJSON *root = replicas_to_json(plans, n, r);
    int rc = jsonio_write(out_file, root, e);
    cJSON_Delete(root);
    return rc;
}

/* The summary per device kind and the throughput (plan_kinds.h). */
static void print_kinds(FILE *f, const struct plan *plans, int n, double step_ms,
                        const struct plan_kinds_pool *pool)
{
    struct plan_kinds k;
    plan_kinds_make(plans, n, step_ms, pool, &k);
    plan_kinds_print(f, &k);
}

/* The GPUs of each kind the pool holds. */
static void pool_counts(const struct pool_answer *a, struct plan_kinds_pool *pool)
{
    memset(pool, 0, sizeof *pool);
    for (int k = 0; k < a->n_kinds && k < PLAN_KINDS_MAX; k++) {
        snprintf(pool->device[k], sizeof pool->device[k], "%s", a->device[k]);
        pool->count[pool->n++] = a->count[k];
    }
}

/* The whole answer's certificate (both searches), and the search's time. */
static void print_certified(FILE *f, const struct pool_answer *a)
{
    if (a->gap >= 0)
        fprintf(f, "pool: certified gap %.3f%% over every candidate of both searches (none "
                   "steps faster than %.3f ms); searched in %.2f s\n",
                100 * a->gap, a->lower_bound, a->seconds);
    else if (a->mix.framework != NULL)
        fprintf(f, "pool: no certified gap with --for (the bounds are of Ballast's "
                   "activations, which %s's may undercut); searched in %.2f s\n",
                a->mix.framework, a->seconds);
    else
        fprintf(f, "pool: no certified gap (--time-limit stopped a search before its bound); "
                   "searched in %.2f s\n",
                a->seconds);
}

int cmd_plan_replicas(const cJSON *root, const char *file, int n, const struct plan_options *o,
                      const char *out_file, int quiet)
{
    struct err e;
    err_clear(&e);
    struct plan *plans = calloc((size_t)n, sizeof *plans);
    struct replicas_result r = {0};
    int made = 0, rc = plans != NULL ? ERR_OK : err_set(&e, ERR_FAIL, "out of memory");
    if (rc == ERR_OK)
        rc = plan_pipelines(root, file, n, o, plans, &made, &e);
    if (rc == ERR_OK)
        rc = replicas_step(plans, n, &r, &e);
    if (rc == ERR_OK)
        rc = replicas_output(plans, n, &r, out_file, quiet, &e);
    if (rc == ERR_OK && !quiet)
        print_kinds(stdout, plans, n, r.step_ms, NULL);
    replicas_result_free(&r);
    for (int k = 0; k < made; k++)
        plan_free(&plans[k]);
    free(plans);
    return rc ? cli_fail("plan", &e) : ERR_OK;
}

int cmd_plan_pool(const cJSON *root, const char *file, const struct plan_options *o,
                  const char *out_file, int quiet)
{
    struct err e;
    err_clear(&e);
    struct pool_answer a;
    if (pool_answer_search(root, file, o, &a, &e))
        return cli_fail("plan", &e);
    int rc = ERR_OK;
    if (a.mixed) {
        rc = replicas_output(a.plans, a.n, &a.step, out_file, quiet, &e);
    } else {
        if (!quiet)
            planner_print(stdout, &a.plan);
        rc = out_file != NULL ? plan_write(out_file, &a.plan, &e) : ERR_OK;
    }
    if (!quiet && !a.mixed)
        pool_print(stdout, &a.homogeneous);
    if (!quiet) {
        pool_mixed_print(stdout, &a.mix, a.have_plan ? a.plan.iteration_ms : INFINITY);
        print_certified(stdout, &a);
    }
    if (rc == ERR_OK && !quiet) {
        struct plan_kinds_pool pool;
        pool_counts(&a, &pool);
        print_kinds(stdout, a.mixed ? a.plans : &a.plan, a.mixed ? a.n : 1,
                    a.mixed ? a.step.step_ms : a.plan.iteration_ms, &pool);
    }
    pool_answer_free(&a);
    return rc ? cli_fail("plan", &e) : ERR_OK;
}
