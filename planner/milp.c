#include "milp.h"

#include <glpk.h>
#include <stdlib.h>

/* Runs GLPK's branch and cut on a loaded problem: *objective on a proven optimum. */
static int intopt(glp_prob *lp, double *objective, struct err *e)
{
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    parm.tm_lim = MILP_TIME_LIMIT_MS;
    int rc = glp_intopt(lp, &parm);
    if (rc == GLP_ETMLIM)
        return err_set(e, ERR_FAIL,
                       "GLPK found no proven optimum within %d s for a stage of %d columns: not "
                       "verified",
                       MILP_TIME_LIMIT_MS / 1000, glp_get_num_cols(lp));
    /* With presolve on, an infeasible problem is reported by the return code. */
    if (rc == GLP_ENOPFS || rc == GLP_ENODFS)
        return err_set(e, ERR_NOFIT, "GLPK: no feasible choice");
    if (rc != 0)
        return err_set(e, ERR_FAIL, "%s:%d: glp_intopt failed with GLPK code %d", __FILE__,
                       __LINE__, rc);
    int status = glp_mip_status(lp);
    if (status == GLP_NOFEAS)
        return err_set(e, ERR_NOFIT, "GLPK: no feasible choice");
    if (status != GLP_OPT)
        return err_set(e, ERR_FAIL, "GLPK ended with MIP status %d, not optimal", status);
    *objective = glp_mip_obj_val(lp);
    return ERR_OK;
}

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
    intopt(lp, objective, e);
done:
    glp_delete_prob(lp);
    free(ia);
    free(ja);
    free(ar);
    return e->code;
}

/* Layers whose choices cost exactly the same form a group (a model's blocks do); a group of m
 * layers takes n_gc of its layers to choice c (integers, sum_c n_gc = m), and binary z_gc says
 * whether any does (n_gc <= m z_gc, tau >= t_gc z_gc). For single layers this is one binary
 * per choice with a sum-to-one row; counting alike layers instead of naming them spares GLPK
 * their permutations, which it cannot tell apart and would otherwise search one by one.
 * Columns: per group and choice n_gc then z_gc, then tau. Rows: memory, then per group its
 * sum row, then per group and choice its two linking rows. */
static int solve_choices(const struct knap_problem *p, double *objective, struct err *e)
{
    int n = p->n, nc = p->first_choice[n], G = 0;
    int *group = malloc((size_t)(n > 0 ? n : 1) * sizeof *group); /* first layer of each group */
    int *size = calloc((size_t)(n > 0 ? n : 1), sizeof *size);
    int *ia = calloc((size_t)6 * nc + 8, sizeof *ia);
    int *ja = calloc((size_t)6 * nc + 8, sizeof *ja);
    double *ar = calloc((size_t)6 * nc + 8, sizeof *ar);
    glp_prob *lp = glp_create_prob();
    int k = 0;
    if (group == NULL || size == NULL || ia == NULL || ja == NULL || ar == NULL) {
        err_set(e, ERR_FAIL, "out of memory building a MILP of %d layers", n);
        goto done;
    }
    for (int l = 0; l < n; l++) {
        int cl = p->first_choice[l + 1] - p->first_choice[l], g = 0;
        for (; g < G; g++) {
            int f = group[g], same = p->first_choice[f + 1] - p->first_choice[f] == cl;
            for (int c = 0; same && c < cl; c++) {
                const struct knap_choice *x = &p->choices[p->first_choice[f] + c],
                                         *y = &p->choices[p->first_choice[l] + c];
                same = x->w == y->w && x->t == y->t && x->ms == y->ms;
            }
            if (same)
                break;
        }
        if (g == G)
            group[G++] = l;
        size[g]++;
    }
    int cols = 0, rows = 1 + G;
    for (int g = 0; g < G; g++) {
        int cl = p->first_choice[group[g] + 1] - p->first_choice[group[g]];
        cols += 2 * cl;
        rows += 2 * cl;
    }
    int tau = cols + 1;
    glp_set_obj_dir(lp, GLP_MIN);
    glp_add_cols(lp, tau);
    glp_add_rows(lp, rows);
    glp_set_col_bnds(lp, tau, GLP_LO, 0, 0);
    /* memory: sum w_gc n_gc + tau <= cap */
    glp_set_row_bnds(lp, 1, GLP_UP, 0, (double)p->cap);
    k++, ia[k] = 1, ja[k] = tau, ar[k] = 1;
    int col = 0, row = 1 + G;
    for (int g = 0; g < G; g++) {
        int f = group[g], cl = p->first_choice[f + 1] - p->first_choice[f];
        /* sum_c n_gc = m */
        glp_set_row_bnds(lp, 2 + g, GLP_FX, size[g], size[g]);
        for (int c = 0; c < cl; c++) {
            const struct knap_choice *ch = &p->choices[p->first_choice[f] + c];
            int nv = ++col, zv = ++col;
            glp_set_col_kind(lp, nv, GLP_IV);
            glp_set_col_bnds(lp, nv, GLP_DB, 0, size[g]);
            glp_set_obj_coef(lp, nv, ch->ms);
            glp_set_col_kind(lp, zv, GLP_BV);
            k++, ia[k] = 1, ja[k] = nv, ar[k] = (double)ch->w;
            k++, ia[k] = 2 + g, ja[k] = nv, ar[k] = 1;
            /* n_gc - m z_gc <= 0 */
            glp_set_row_bnds(lp, ++row, GLP_UP, 0, 0);
            k++, ia[k] = row, ja[k] = nv, ar[k] = 1;
            k++, ia[k] = row, ja[k] = zv, ar[k] = -size[g];
            /* tau - t_gc z_gc >= 0 */
            glp_set_row_bnds(lp, ++row, GLP_LO, 0, 0);
            k++, ia[k] = row, ja[k] = tau, ar[k] = 1;
            k++, ia[k] = row, ja[k] = zv, ar[k] = -(double)ch->t;
        }
    }
    glp_load_matrix(lp, k, ia, ja, ar);
    intopt(lp, objective, e);
done:
    glp_delete_prob(lp);
    free(group);
    free(size);
    free(ia);
    free(ja);
    free(ar);
    return e->code;
}

int milp_min_recompute(const struct knap_problem *p, double *objective_ms, struct err *e)
{
    if (p->multi)
        return solve_choices(p, objective_ms, e);
    return solve(p, 0, 0, 1, objective_ms, e);
}

int milp_balance(const struct knap_problem *p, int64_t target_units, double time_unit_ms,
                 double *objective_units, struct err *e)
{
    return solve(p, 1, target_units, time_unit_ms, objective_units, e);
}
