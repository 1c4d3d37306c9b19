#include "verify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "methods.h"
#include "milp.h"
#include "offload.h"
#include "optimizer.h"

/* The balancing DP's objective for the choice it made: its distance from the target, in
 * time units, as the DP counts it. */
static double balance_distance_ms(const struct knap_problem *kp, const unsigned char *recompute,
                                  int64_t target, double unit)
{
    int64_t r = 0;
    for (int l = 0; l < kp->n; l++)
        if (recompute[l])
            r += knap_time_units(kp, l, unit);
    return (double)(r > target ? r - target : target - r) * unit;
}

/* A stage planned by the action search: its least recompute by that search and by GLPK, with
 * its optimizer where the plan put it. */
static int verify_actions(const struct plan *p, int s, const struct plan_options *o, double *dp,
                          double *milp, struct err *e)
{
    struct optimizer_view v = {0};
    const struct plan *q = p;
    if (p->stages[s].optimizer == COST_PLACE_HOST) {
        if (optimizer_view_init_stream(p, s, p->stages[s].optimizer_from,
                                       plan_stage_streams(&p->stages[s]), &v, e))
            return e->code;
        q = &v.plan;
    }
    int rc = offload_stage_min_recompute(q, s, o, dp, e) ? e->code
                                                          : offload_milp_min_recompute(q, s, o,
                                                                                       milp, e);
    optimizer_view_free(&v);
    return rc;
}

/* One stage: its DP and GLPK objectives. */
static int verify_stage(const struct plan *p, int s, int balanced, double target_ms,
                        const struct plan_options *o, double *dp, double *milp, struct err *e)
{
    if (o->actions != PLAN_ACTION_RECOMPUTE) /* the offload search's least recompute */
        return verify_actions(p, s, o, dp, milp, e);
    struct knap_problem kp;
    if (method_problem(p, s, o, &kp, e))
        return e->code;
    unsigned char *recompute = malloc((size_t)kp.n + 1);
    if (recompute == NULL) {
        knap_free(&kp);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    method_gather(p, s, recompute); /* the stage's, or its GPU's chunks' */
    int rc;
    if (balanced) {
        double unit = knap_balance_time_unit(&kp, o->time_unit_ms), units = 0;
        int64_t target = (int64_t)llround(target_ms / unit);
        *dp = balance_distance_ms(&kp, recompute, target, unit);
        rc = milp_balance(&kp, target, unit, &units, e);
        *milp = units * unit;
    } else { /* the DP solved again: --min-gain may have taken a simpler choice */
        unsigned char *least = malloc((size_t)kp.n + 1);
        rc = least == NULL ? err_set(e, ERR_FAIL, "out of memory")
                           : knap_min_recompute(&kp, least, e);
        *dp = rc == ERR_OK ? knap_recompute_ms(&kp, least) : INFINITY;
        free(least);
        if (rc == ERR_OK)
            rc = milp_min_recompute(&kp, milp, e);
    }
    free(recompute);
    knap_free(&kp);
    if (rc == ERR_NOFIT)
        return err_set(e, ERR_FAIL,
                       "verify: stage %d: GLPK finds no choice that fits, the DP found one", s);
    return rc;
}

int verify_plan(struct plan *p, const struct plan_options *o, struct err *e)
{
    int star = p->most_loaded_stage, agree = 1;
    double target_ms = 0, dp_total = 0, milp_total = 0;
    for (int pass = 0; pass < p->n_stages; pass++) {
        int s = pass == 0 ? star : (pass <= star ? pass - 1 : pass);
        int balanced = o->method == METHOD_PATENT && s != star;
        double dp = 0, milp = 0;
        if (!method_leader(p, s)) /* its GPU's first chunk verified them all */
            continue;
        if (verify_stage(p, s, balanced, target_ms, o, &dp, &milp, e))
            return e->code;
        if (s == star)
            target_ms = dp;
        dp_total += dp;
        milp_total += milp;
        if (!(fabs(dp - milp) <= 1e-6 + 1e-6 * fabs(milp))) {
            agree = 0;
            fprintf(stderr, "verify: stage %d: DP objective %.9g ms, GLPK %.9g ms\n", s, dp,
                    milp);
        }
    }
    p->verify = (struct plan_verify){1, milp_total, dp_total, agree};
    return ERR_OK;
}
