#include "milp.h"

#include <glpk.h>
#include <stdlib.h>

/* GLPK reports through its own return codes; this names the call that failed. */
#define GLP_CHECK(call, e)                                                                       \
    do {                                                                                         \
        int rc_ = (call);                                                                        \
        if (rc_ != 0) {                                                                          \
            err_set((e), ERR_FAIL, "%s:%d: %s failed with GLPK code %d", __FILE__, __LINE__,     \
                    #call, rc_);                                                                 \
            goto done;                                                                           \
        }                                                                                        \
    } while (0)

/* Columns: 1..n r_l, n+1 tau, then (balance only) n+2 e_plus, n+3 e_minus.
 * Rows: 1 memory, 2..n+1 transient, then (balance only) n+2 the time deviation. */
static int solve(const struct knap_problem *p, int balance, int64_t target_units,
                 double time_unit_ms, double *objective, struct err *e)
{
    int n = p->n;
    int ncols = n + 1 + (balance ? 2 : 0);
    int nrows = 1 + n + (balance ? 1 : 0);
    int nnz = n + 1 + 2 * n + (balance ? n + 2 : 0);
    int *ia = calloc((size_t)nnz + 1, sizeof *ia);
    int *ja = calloc((size_t)nnz + 1, sizeof *ja);
    double *ar = calloc((size_t)nnz + 1, sizeof *ar);
    glp_prob *lp = glp_create_prob();
    int k = 0;
    double sum_w = 0;
    if (ia == NULL || ja == NULL || ar == NULL) {
        err_set(e, ERR_FAIL, "out of memory building a MILP of %d layers", n);
        goto done;
    }
    glp_set_obj_dir(lp, GLP_MIN);
    glp_add_cols(lp, ncols);
    glp_add_rows(lp, nrows);
    for (int l = 0; l < n; l++) {
        glp_set_col_kind(lp, l + 1, GLP_BV);
        sum_w += (double)p->w[l];
        if (balance)
            glp_set_obj_coef(lp, l + 1, 0);
        else
            glp_set_obj_coef(lp, l + 1, p->fwd[l]);
    }
    glp_set_col_bnds(lp, n + 1, GLP_LO, 0, 0); /* tau */
    /* memory: sum w_l (1 - r_l) + tau <= cap  <=>  -sum w_l r_l + tau <= cap - sum w_l */
    glp_set_row_bnds(lp, 1, GLP_UP, 0, (double)p->cap - sum_w);
    for (int l = 0; l < n; l++) {
        k++, ia[k] = 1, ja[k] = l + 1, ar[k] = -(double)p->w[l];
    }
    k++, ia[k] = 1, ja[k] = n + 1, ar[k] = 1;
    /* transient: tau - t_l r_l >= 0 */
    for (int l = 0; l < n; l++) {
        glp_set_row_bnds(lp, 2 + l, GLP_LO, 0, 0);
        k++, ia[k] = 2 + l, ja[k] = n + 1, ar[k] = 1;
        k++, ia[k] = 2 + l, ja[k] = l + 1, ar[k] = -(double)p->t[l];
    }
    if (balance) {
        /* sum q_l r_l - e_plus + e_minus = target; minimise e_plus + e_minus */
        glp_set_col_bnds(lp, n + 2, GLP_LO, 0, 0);
        glp_set_col_bnds(lp, n + 3, GLP_LO, 0, 0);
        glp_set_obj_coef(lp, n + 2, 1);
        glp_set_obj_coef(lp, n + 3, 1);
        glp_set_row_bnds(lp, n + 2, GLP_FX, (double)target_units, (double)target_units);
        for (int l = 0; l < n; l++) {
            k++, ia[k] = n + 2, ja[k] = l + 1,
            ar[k] = (double)knap_time_units(p, l, time_unit_ms);
        }
        k++, ia[k] = n + 2, ja[k] = n + 2, ar[k] = -1;
        k++, ia[k] = n + 2, ja[k] = n + 3, ar[k] = 1;
    }
    glp_load_matrix(lp, k, ia, ja, ar);
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    parm.tm_lim = MILP_TIME_LIMIT_MS;
    int rc = glp_intopt(lp, &parm);
    if (rc == GLP_ETMLIM) {
        err_set(e, ERR_FAIL,
                "GLPK found no proven optimum within %d s for a stage of %d layers: not verified",
                MILP_TIME_LIMIT_MS / 1000, n);
        goto done;
    }
    /* With presolve on, an infeasible problem is reported by the return code. */
    if (rc == GLP_ENOPFS || rc == GLP_ENODFS) {
        err_set(e, ERR_NOFIT, "GLPK: no feasible choice");
        goto done;
    }
    GLP_CHECK(rc, e);
    int status = glp_mip_status(lp);
    if (status == GLP_NOFEAS) {
        err_set(e, ERR_NOFIT, "GLPK: no feasible choice");
        goto done;
    }
    if (status != GLP_OPT) {
        err_set(e, ERR_FAIL, "GLPK ended with MIP status %d, not optimal", status);
        goto done;
    }
    *objective = glp_mip_obj_val(lp);
done:
    glp_delete_prob(lp);
    free(ia);
    free(ja);
    free(ar);
    return e->code;
}

int milp_min_recompute(const struct knap_problem *p, double *objective_ms, struct err *e)
{
    return solve(p, 0, 0, 1, objective_ms, e);
}

int milp_balance(const struct knap_problem *p, int64_t target_units, double time_unit_ms,
                 double *objective_units, struct err *e)
{
    return solve(p, 1, target_units, time_unit_ms, objective_units, e);
}
