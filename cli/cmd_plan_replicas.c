/* ballast plan on a cluster of several pipelines (heterogeneous replicas): each planned by
 * the method as a cluster of its own, then the step of all of them (planner/replicas.h); and
 * on a pool of GPUs: the search (planner/pool.h, planner/pool_mixed.h): one plan, or a
 * replicas file when heterogeneous pipelines step faster. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "jsonio.h"
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
    if (!quiet)
        pool_mixed_print(stdout, &a.mix, a.have_plan ? a.plan.iteration_ms : INFINITY);
    pool_answer_free(&a);
    return rc ? cli_fail("plan", &e) : ERR_OK;
}
