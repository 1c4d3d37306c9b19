#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "jsonio.h"
#include "plan.h"
#include "replicas.h"
#include "sim.h"
#include "trace.h"

static void help(void)
{
    printf("usage: ballast simulate --plan PLAN.json [-o RESULT.json] [--trace TRACE.json]\n"
           "                        [--quiet]\n\n"
           "Simulates one training step of a plan (its schedule, each stage's forward,\n"
           "recompute and backward times, and the transfers over its links) and prints the\n"
           "iteration time, the bubble fraction and each stage's busy and idle time.\n\n"
           "  --plan FILE    the plan (ballast-plan/1, from ballast plan -o)\n"
           "  -o FILE        write the result (ballast-simulation/1)\n"
           "  --trace FILE   write the timeline as a Chrome trace (open it in ui.perfetto.dev)\n"
           "  --quiet        no table\n\n"
           "exit status: 0 simulated, 1 failure while running, 2 bad input\n");
}

const struct cli_opt cmd_simulate_options[] = {
    {"--plan", CLI_VALUE}, {"-o", CLI_VALUE}, {"--trace", CLI_VALUE}, {"--quiet", CLI_FLAG},
    {NULL, CLI_FLAG}};

static void print_result(const struct plan *p, const struct sim_result *r)
{
    printf("simulated %s step, method %s, %d stages, %d micro-batches: iteration %.3f ms, "
           "bubble %.1f%%\n",
           schedule_name(p->schedule), p->method, p->n_stages, p->micro_batches, r->iteration_ms,
           100.0 * r->bubble_fraction);
    if (p->replica_micro_batches != NULL) /* a pool plan dealing its batch unevenly */
        printf("replicas: %d, taking %lld micro-batches in all (%lld samples); the busiest's "
               "%d set the step\n",
               p->stages[0].dp, (long long)plan_batches(p),
               (long long)plan_batches(p) * p->model.micro_batch, p->micro_batches);
    int w = 10;
    for (int s = 0; s < r->n_stages; s++)
        w = (int)strlen(p->stages[s].device) > w ? (int)strlen(p->stages[s].device) : w;
    printf("%5s  %-*s %12s %12s %12s %12s %12s %12s\n", "stage", w, "device", "busy ms", "idle ms",
           "fwd ms", "recompute ms", "bwd ms", "send ms");
    for (int s = 0; s < r->n_stages; s++) {
        struct sim_stage_totals t;
        sim_stage_totals(r, s, &t);
        printf("%5d  %-*s %12.3f %12.3f %12.3f %12.3f %12.3f %12.3f\n", s, w, p->stages[s].device,
               r->busy_ms[s], r->idle_ms[s], t.fwd_ms, t.recompute_ms, t.bwd_ms, t.send_ms);
        if (plan_stage_offloads(&p->stages[s]))
            printf("%5s  host link: to host %.3f ms, from host %.3f ms (%.1f%% busy), backwards "
                   "waiting for prefetches %.3f ms\n",
                   "", t.copy_out_ms, t.copy_in_ms,
                   r->iteration_ms > 0 ? 50.0 * (t.copy_out_ms + t.copy_in_ms) / r->iteration_ms
                                       : 0.0,
                   r->stall_ms[s]);
    }
}

/* A replicas file (ballast plan on a cluster of several pipelines): each pipeline's step and
 * the step of all of them; -o writes iteration_ms (the step), replicas, global_batch and each
 * pipeline's iteration_ms alone. */
static int simulate_replicas(const cJSON *root, const char *file, int quiet,
                             const char *out_file, struct err *e)
{
    struct plan *plans;
    int n;
    struct replicas_result r;
    if (replicas_parse(root, file, &plans, &n, e))
        return e->code;
    int rc = replicas_step(plans, n, &r, e);
    if (rc == ERR_OK && !quiet)
        replicas_print(stdout, plans, n, &r);
    if (rc == ERR_OK && out_file != NULL) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "format", "ballast-simulation/1");
        cJSON_AddNumberToObject(o, "iteration_ms", r.step_ms);
        cJSON_AddNumberToObject(o, "replicas", r.replicas);
        cJSON_AddNumberToObject(o, "global_batch", (double)r.global_batch);
        cJSON *pipes = cJSON_AddArrayToObject(o, "pipelines");
        for (int k = 0; k < n; k++) {
            cJSON *po = cJSON_CreateObject();
            cJSON_AddNumberToObject(po, "iteration_ms", r.pipeline_ms[k]);
            cJSON_AddNumberToObject(po, "dp", plans[k].stages[0].dp);
            cJSON_AddItemToArray(pipes, po);
        }
        rc = jsonio_write(out_file, o, e);
        cJSON_Delete(o);
    }
    if (rc == ERR_OK)
        replicas_result_free(&r);
    for (int k = 0; k < n; k++)
        plan_free(&plans[k]);
    free(plans);
    return rc;
}

/* What the command line asks for. */
struct simulate_args {
    const char *plan_file, *out_file, *trace_file;
    int quiet;
};

/* -1: help was printed; otherwise ERR_OK or the usage error's status (printed). */
static int parse_simulate_args(int argc, char **argv, struct simulate_args *a)
{
    const char *v;
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            help();
            return -1;
        } else if ((r = cli_option(argc, argv, &i, "--plan", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            a->plan_file = v;
        } else if ((r = cli_option(argc, argv, &i, "-o", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            a->out_file = v;
        } else if ((r = cli_option(argc, argv, &i, "--trace", &v)) != 0) {
            if (r < 0)
                return ERR_INPUT;
            a->trace_file = v;
        } else if (cli_flag(argv, i, "--quiet")) {
            a->quiet = 1;
        } else {
            return cli_usage_error("simulate", "unknown option \"%s\"", argv[i]);
        }
    }
    if (a->plan_file == NULL)
        return cli_usage_error("simulate", "--plan is required");
    if (cli_check_output("simulate", a->out_file) || cli_check_output("simulate", a->trace_file))
        return ERR_INPUT;
    return ERR_OK;
}

/* -o's result and --trace's timeline, those asked for. */
static int write_simulation(const struct simulate_args *a, const struct plan *p,
                            const struct sim_result *r, struct err *e)
{
    if (a->out_file != NULL) {
        cJSON *o = sim_result_to_json(p, r);
        int rc = o != NULL ? jsonio_write(a->out_file, o, e)
                           : err_set(e, ERR_FAIL, "%s: out of memory", a->out_file);
        cJSON_Delete(o);
        if (rc)
            return rc;
    }
    if (a->trace_file == NULL)
        return ERR_OK;
    struct trace *t = trace_init();
    if (t == NULL)
        return err_set(e, ERR_FAIL, "%s: out of memory", a->trace_file);
    sim_trace_add(t, 1, p, r);
    int rc = trace_write(t, a->trace_file, e);
    trace_free(t);
    return rc;
}

/* One pipeline's plan, parsed from root: simulated, its table printed (unless --quiet) and
 * written. */
static int simulate_plan(const struct simulate_args *a, const cJSON *root, struct err *e)
{
    struct plan p;
    struct sim_result r;
    int rc = plan_parse(root, a->plan_file, &p, e);
    if (rc)
        return rc;
    if ((rc = sim_plan(&p, &r, e)) != ERR_OK) {
        plan_free(&p);
        return rc;
    }
    if (!a->quiet) {
        print_result(&p, &r);
        /* A plan from another version of the simulator (or edited by hand) says otherwise. */
        if (fabs(p.iteration_ms - r.iteration_ms) > 1e-6 + 1e-9 * r.iteration_ms)
            printf("note: %s says iteration_ms %.3f; this simulation gives %.3f\n", a->plan_file,
                   p.iteration_ms, r.iteration_ms);
    }
    rc = write_simulation(a, &p, &r, e);
    sim_result_free(&r);
    plan_free(&p);
    return rc;
}

int cmd_simulate(int argc, char **argv)
{
    struct simulate_args a = {0};
    int rc = parse_simulate_args(argc, argv, &a);
    if (rc)
        return rc < 0 ? ERR_OK : rc;
    struct err e;
    err_clear(&e);
    cJSON *root = jsonio_read_kind(a.plan_file, JSONIO_PLAN, &e);
    if (root == NULL)
        return cli_fail("simulate", &e);
    if (!replicas_is_file(root))
        rc = simulate_plan(&a, root, &e);
    else if (a.trace_file != NULL)
        rc = err_set(&e, ERR_INPUT, "--trace: not for a plan of several pipelines");
    else
        rc = simulate_replicas(root, a.plan_file, a.quiet, a.out_file, &e);
    cJSON_Delete(root);
    return rc ? cli_fail("simulate", &e) : ERR_OK;
}
