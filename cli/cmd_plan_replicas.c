/* ballast plan on a cluster of several pipelines (heterogeneous replicas): each planned by
 * the method as a cluster of its own, then the step of all of them (planner/replicas.h); and
 * on a pool of GPUs: the search (planner/pool.h). */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "jsonio.h"
#include "planner.h"
#include "pool.h"
#include "replicas.h"

static int plan_pipelines(const char *file, int n, const struct plan_options *o,
                          struct plan *plans, int *made, struct err *e)
{
    for (*made = 0; *made < n; (*made)++) {
        struct cluster c;
        if (cluster_load_pipeline(file, *made, &c, e))
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

int cmd_plan_replicas(const char *file, int n, const struct plan_options *o,
                      const char *out_file, int quiet)
{
    struct err e;
    err_clear(&e);
    struct plan *plans = calloc((size_t)n, sizeof *plans);
    struct replicas_result r = {0};
    int made = 0, rc = plans != NULL ? ERR_OK : err_set(&e, ERR_FAIL, "out of memory");
    if (rc == ERR_OK)
        rc = plan_pipelines(file, n, o, plans, &made, &e);
    if (rc == ERR_OK)
        rc = replicas_step(plans, n, &r, &e);
    if (rc == ERR_OK && !quiet) {
        for (int k = 0; k < n; k++) {
            printf("pipelines[%d]:\n", k);
            planner_print(stdout, &plans[k]);
        }
        replicas_print(stdout, plans, n, &r);
    }
    if (rc == ERR_OK && out_file != NULL) {
        cJSON *root = replicas_to_json(plans, n, &r);
        rc = jsonio_write(out_file, root, &e);
        cJSON_Delete(root);
    }
    replicas_result_free(&r);
    for (int k = 0; k < made; k++)
        plan_free(&plans[k]);
    free(plans);
    return rc ? cli_fail("plan", &e) : ERR_OK;
}

int cmd_plan_pool(const char *file, const struct plan_options *o, const char *out_file,
                  int quiet)
{
    struct err e;
    err_clear(&e);
    struct plan p;
    struct pool_result r;
    if (pool_search(file, o, &p, &r, &e))
        return cli_fail("plan", &e);
    if (!quiet) {
        planner_print(stdout, &p);
        pool_print(stdout, &r);
    }
    int rc = out_file != NULL ? plan_write(out_file, &p, &e) : ERR_OK;
    plan_free(&p);
    return rc ? cli_fail("plan", &e) : ERR_OK;
}
