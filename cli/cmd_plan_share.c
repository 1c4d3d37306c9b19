#include <stdio.h>

#include "cli.h"
#include "share_plan.h"

int cmd_plan_share(char **jobs, int n, const struct plan_options *o, const char *out_file,
                   int quiet)
{
    static char files[SHARE_JOBS_MAX][CLUSTER_PATH_MAX];
    struct share_job_spec spec[SHARE_JOBS_MAX];
    struct share s;
    struct err e;
    err_clear(&e);
    if (n > SHARE_JOBS_MAX)
        return cli_usage_error("plan", "--share: %d jobs, at most %d", n, SHARE_JOBS_MAX);
    for (int j = 0; j < n; j++)
        if (share_job_parse(jobs[j], o, files[j], sizeof files[j], &spec[j], &e))
            return cli_fail("plan", &e);
    if (planner_share(spec, n, &s, &e))
        return cli_fail("plan", &e);
    if (!quiet)
        planner_share_print(stdout, &s);
    int rc = out_file != NULL ? share_write(out_file, &s, &e) : ERR_OK;
    share_free(&s);
    return rc ? cli_fail("plan", &e) : ERR_OK;
}
