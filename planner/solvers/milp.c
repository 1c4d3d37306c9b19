#include "milp.h"

#include <glpk.h>
#include <stdlib.h>

/* Runs GLPK's branch and cut on a loaded problem: *objective on a proven optimum. */
int milp_intopt(glp_prob *lp, double *objective, struct err *e)
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

void milp_matrix_put(struct milp_matrix *m, int row, int col, double value)
{
    if (m->failed)
        return;
    if (m->n + 1 >= m->cap) {
        int cap = m->cap > 0 ? 2 * m->cap : 64;
        int *ia = realloc(m->ia, (size_t)cap * sizeof *ia);
        if (ia != NULL)
            m->ia = ia;
        int *ja = realloc(m->ja, (size_t)cap * sizeof *ja);
        if (ja != NULL)
            m->ja = ja;
        double *ar = realloc(m->ar, (size_t)cap * sizeof *ar);
        if (ar != NULL)
            m->ar = ar;
        if (ia == NULL || ja == NULL || ar == NULL) {
            m->failed = 1;
            return;
        }
        m->cap = cap;
    }
    m->n++;
    m->ia[m->n] = row;
    m->ja[m->n] = col;
    m->ar[m->n] = value;
}

int milp_matrix_load(const struct milp_matrix *m, glp_prob *lp, struct err *e)
{
    if (m->failed)
        return err_set(e, ERR_FAIL, "out of memory building a MILP past %d coefficients",
                       m->n);
    glp_load_matrix(lp, m->n, m->ia, m->ja, m->ar);
    return ERR_OK;
}

void milp_matrix_free(struct milp_matrix *m)
{
    free(m->ia);
    free(m->ja);
    free(m->ar);
    *m = (struct milp_matrix){0};
}

/* Balancing, whole layers: r_l in {0,1} (1 = recompute l), tau, e_plus and e_minus.
 * Columns: 1..n r_l, n+1 tau, n+2 e_plus, n+3 e_minus. Rows: 1 memory, 2..n+1 transient, n+2
 * the time deviation, then for alike layers l after j (same w, t and time), r_j >= r_l, which
 * keeps GLPK from searching their permutations (see solve_choices). */
/* prev[l]: the nearest layer before l alike in w, t and time (whole layers), or -1; returns
 * how many layers have one. */
static int alike_layers_before(const struct knap_problem *p, int *prev)
{
    int orders = 0;
    for (int l = 0; l < p->n; l++) {
        prev[l] = -1;
        for (int j = l - 1; j >= 0 && prev[l] < 0; j--)
            if (p->w[j] == p->w[l] && p->t[j] == p->t[l] && p->fwd[j] == p->fwd[l])
                prev[l] = j;
        orders += prev[l] >= 0;
    }
    return orders;
}

static int solve_balance(const struct knap_problem *p, int64_t target_units,
                         double time_unit_ms, double *objective, struct err *e)
{
    int n = p->n;
    int *prev = malloc((size_t)(n > 0 ? n : 1) * sizeof *prev), orders;
    struct milp_matrix a = {0};
    glp_prob *lp = glp_create_prob();
    double sum_w = 0;
    if (prev == NULL) {
        err_set(e, ERR_FAIL, "out of memory building a MILP of %d layers", n);
        goto done;
    }
    orders = alike_layers_before(p, prev);
    glp_set_obj_dir(lp, GLP_MIN);
    glp_add_cols(lp, n + 3);
    glp_add_rows(lp, n + 2 + orders);
    for (int l = 0; l < n; l++) {
        glp_set_col_kind(lp, l + 1, GLP_BV);
        sum_w += (double)p->w[l];
    }
    glp_set_col_bnds(lp, n + 1, GLP_LO, 0, 0); /* tau */
    /* memory: sum w_l (1 - r_l) + tau <= cap  <=>  -sum w_l r_l + tau <= cap - sum w_l */
    glp_set_row_bnds(lp, 1, GLP_UP, 0, (double)p->cap - sum_w);
    for (int l = 0; l < n; l++)
        milp_matrix_put(&a, 1, l + 1, -(double)p->w[l]);
    milp_matrix_put(&a, 1, n + 1, 1);
    /* transient: tau - t_l r_l >= 0 */
    for (int l = 0; l < n; l++) {
        glp_set_row_bnds(lp, 2 + l, GLP_LO, 0, 0);
        milp_matrix_put(&a, 2 + l, n + 1, 1);
        milp_matrix_put(&a, 2 + l, l + 1, -(double)p->t[l]);
    }
    /* sum q_l r_l - e_plus + e_minus = target; minimise e_plus + e_minus */
    glp_set_col_bnds(lp, n + 2, GLP_LO, 0, 0);
    glp_set_col_bnds(lp, n + 3, GLP_LO, 0, 0);
    glp_set_obj_coef(lp, n + 2, 1);
    glp_set_obj_coef(lp, n + 3, 1);
    glp_set_row_bnds(lp, n + 2, GLP_FX, (double)target_units, (double)target_units);
    for (int l = 0; l < n; l++)
        milp_matrix_put(&a, n + 2, l + 1, (double)knap_time_units(p, l, time_unit_ms));
    milp_matrix_put(&a, n + 2, n + 2, -1);
    milp_matrix_put(&a, n + 2, n + 3, 1);
    int order = n + 2;
    for (int l = 0; l < n; l++) {
        if (prev[l] < 0)
            continue;
        glp_set_row_bnds(lp, ++order, GLP_LO, 0, 0);
        milp_matrix_put(&a, order, prev[l] + 1, 1);
        milp_matrix_put(&a, order, l + 1, -1);
    }
    if (milp_matrix_load(&a, lp, e) == ERR_OK)
        milp_intopt(lp, objective, e);
done:
    glp_delete_prob(lp);
    free(prev);
    milp_matrix_free(&a);
    return e->code;
}

/* prev[l]: the nearest layer before l with the same choices (same weights, transients and
 * times), or -1; returns how many layers have one (each an order row below). */
static int alike_before(const struct knap_problem *p, int *prev)
{
    int orders = 0;
    for (int l = 0; l < p->n; l++) {
        int cl = p->first_choice[l + 1] - p->first_choice[l];
        prev[l] = -1;
        for (int j = l - 1; j >= 0 && prev[l] < 0; j--) {
            int same = p->first_choice[j + 1] - p->first_choice[j] == cl;
            for (int c = 0; same && c < cl; c++) {
                const struct knap_choice *x = &p->choices[p->first_choice[j] + c],
                                         *y = &p->choices[p->first_choice[l] + c];
                same = x->w == y->w && x->t == y->t && x->ms == y->ms;
            }
            if (same)
                prev[l] = j;
        }
        orders += prev[l] >= 0;
    }
    return orders;
}

/* One binary x_lc per choice c of layer l, sum_c x_lc = 1, tau >= sum_c t_lc x_lc, memory
 * sum_lc w_lc x_lc + tau <= cap. Layers whose choices cost exactly the same (a model's blocks)
 * can swap choices without changing anything, and GLPK, which cannot tell, would search every
 * such permutation: for two alike layers l before l', sum_c c x_lc >= sum_c c x_l'c keeps
 * only the one with choices in decreasing order. Columns: the choices in the problem's order
 * (choice i is column i + 1), then tau. Rows: memory, then per layer its sum and transient
 * rows, then the order rows. */
static int solve_choices(const struct knap_problem *p, double *objective, struct err *e)
{
    int n = p->n, nc = p->first_choice[n], tau = nc + 1, orders = 0;
    int *prev = malloc((size_t)(n > 0 ? n : 1) * sizeof *prev); /* the alike layer before */
    struct milp_matrix a = {0};
    glp_prob *lp = glp_create_prob();
    if (prev == NULL) {
        err_set(e, ERR_FAIL, "out of memory building a MILP of %d layers", n);
        goto done;
    }
    orders = alike_before(p, prev);
    glp_set_obj_dir(lp, GLP_MIN);
    glp_add_cols(lp, tau);
    glp_add_rows(lp, 1 + 2 * n + orders);
    glp_set_col_bnds(lp, tau, GLP_LO, 0, 0);
    /* memory: sum w_lc x_lc + tau <= cap */
    glp_set_row_bnds(lp, 1, GLP_UP, 0, (double)p->cap);
    milp_matrix_put(&a, 1, tau, 1);
    for (int i = 0; i < nc; i++) {
        glp_set_col_kind(lp, i + 1, GLP_BV);
        glp_set_obj_coef(lp, i + 1, p->choices[i].ms);
        milp_matrix_put(&a, 1, i + 1, (double)p->choices[i].w);
    }
    int order = 1 + 2 * n;
    for (int l = 0; l < n; l++) {
        int one = 2 + 2 * l, transient = 3 + 2 * l;
        /* one choice per layer: sum_c x_lc = 1 */
        glp_set_row_bnds(lp, one, GLP_FX, 1, 1);
        /* tau - sum_c t_lc x_lc >= 0 */
        glp_set_row_bnds(lp, transient, GLP_LO, 0, 0);
        milp_matrix_put(&a, transient, tau, 1);
        for (int i = p->first_choice[l]; i < p->first_choice[l + 1]; i++) {
            milp_matrix_put(&a, one, i + 1, 1);
            milp_matrix_put(&a, transient, i + 1, -(double)p->choices[i].t);
        }
        if (prev[l] < 0)
            continue;
        /* sum_c c x_(prev)c - sum_c c x_lc >= 0 */
        glp_set_row_bnds(lp, ++order, GLP_LO, 0, 0);
        for (int c = 1; c < p->first_choice[l + 1] - p->first_choice[l]; c++) {
            milp_matrix_put(&a, order, p->first_choice[prev[l]] + c + 1, c);
            milp_matrix_put(&a, order, p->first_choice[l] + c + 1, -c);
        }
    }
    if (milp_matrix_load(&a, lp, e) == ERR_OK)
        milp_intopt(lp, objective, e);
done:
    glp_delete_prob(lp);
    free(prev);
    milp_matrix_free(&a);
    return e->code;
}

int milp_min_recompute(const struct knap_problem *p, double *objective_ms, struct err *e)
{
    return solve_choices(p, objective_ms, e);
}

int milp_balance(const struct knap_problem *p, int64_t target_units, double time_unit_ms,
                 double *objective_units, struct err *e)
{
    return solve_balance(p, target_units, time_unit_ms, objective_units, e);
}
