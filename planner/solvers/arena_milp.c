/* The exact layout (OLLA, Steiner et al. 2022, without its scheduling part): a GLPK MILP.
 *   minimise A
 *   A >= o_i + s_i                              every object i
 *   o_i + s_i <= o_j + U y_ij                   every pair i < j live at a common tick:
 *   o_j + s_j <= o_i + U (1 - y_ij)             i below j (y = 0) or j below i (y = 1)
 *   0 <= o_i <= U - s_i,  lower bound <= A <= U,  y binary
 * U is the greedy layout's arena, which also stands when GLPK's time limit stops it first
 * without a better one. Sizes are divided by their greatest common divisor so that the big-M
 * rows stay small numbers. With the binaries fixed the rows are difference constraints, so
 * the optimum's offsets are integers; they are rounded and the layout checked all the same. */
#include <glpk.h>
#include <math.h>
#include <stdlib.h>

#include "arena_plan.h"
#include "milp.h"

/* Pairs beyond this make a MILP GLPK cannot close in any useful time: not attempted. */
#define ARENA_MILP_PAIRS_MAX 4000

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b != 0) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Pairs of objects live at a common tick, as (i, j) with i < j; returns the count, or -1
 * past `max`. */
static int meeting_pairs(const struct arena_object *o, int n, int (*pairs)[2], int max)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (arena_lifetimes_meet(&o[i], &o[j])) {
                if (k == max)
                    return -1;
                pairs[k][0] = i;
                pairs[k++][1] = j;
            }
    return k;
}

/* Row r: sum coef * col  {<= or >=} rhs. */
static void add_row(glp_prob *lp, struct milp_matrix *a, int r, int type, double rhs,
                    int n_terms, const int *cols, const double *coefs)
{
    glp_set_row_bnds(lp, r, type, rhs, rhs);
    for (int t = 0; t < n_terms; t++)
        milp_matrix_put(a, r, cols[t], coefs[t]);
}

/* Columns: 1..n offsets, n+1 the arena, n+2.. the pair binaries. */
static glp_prob *build_arena_milp(const struct arena_object *o, int n, const int (*pairs)[2],
                                  int np, double unit, double upper, double lower,
                                  struct err *e)
{
    glp_prob *lp = glp_create_prob();
    struct milp_matrix a = {0};
    glp_set_obj_dir(lp, GLP_MIN);
    glp_add_cols(lp, n + 1 + np);
    glp_add_rows(lp, n + 2 * np);
    int A = n + 1;
    glp_set_col_bnds(lp, A, lower < upper ? GLP_DB : GLP_FX, lower, upper);
    glp_set_obj_coef(lp, A, 1);
    for (int i = 0; i < n; i++) {
        double s = (double)o[i].bytes / unit;
        glp_set_col_bnds(lp, i + 1, upper - s > 0 ? GLP_DB : GLP_FX, 0, upper - s);
        int cols[2] = {A, i + 1};
        double coefs[2] = {1, -1};
        add_row(lp, &a, i + 1, GLP_LO, s, 2, cols, coefs);
    }
    for (int k = 0; k < np; k++) {
        int i = pairs[k][0], j = pairs[k][1], y = n + 2 + k;
        double si = (double)o[i].bytes / unit, sj = (double)o[j].bytes / unit;
        glp_set_col_kind(lp, y, GLP_BV);
        int c1[3] = {i + 1, j + 1, y};
        double v1[3] = {1, -1, -upper};
        add_row(lp, &a, n + 1 + 2 * k, GLP_UP, -si, 3, c1, v1);
        int c2[3] = {j + 1, i + 1, y};
        double v2[3] = {1, -1, upper};
        add_row(lp, &a, n + 2 + 2 * k, GLP_UP, upper - sj, 3, c2, v2);
    }
    if (milp_matrix_load(&a, lp, e)) {
        glp_delete_prob(lp);
        lp = NULL;
    }
    milp_matrix_free(&a);
    return lp;
}

int arena_exact(struct arena_problem *pb, const struct arena_options *opt,
                struct arena_result *r, struct err *e)
{
    ERR_TRY(arena_greedy(pb, opt, r, e));
    int n = pb->n;
    int64_t greedy = arena_extent(pb->o, n), lower = arena_lower_bound(pb->o, n), unit = 0;
    if (greedy == lower) {
        r->proven = 1;
        r->note = "greedy meets the lower bound";
        return ERR_OK;
    }
    for (int i = 0; i < n; i++)
        unit = gcd64(unit, pb->o[i].bytes);
    int(*pairs)[2] = malloc(sizeof *pairs * ARENA_MILP_PAIRS_MAX);
    if (pairs == NULL)
        return err_set(e, ERR_FAIL, "out of memory listing object pairs");
    int np = meeting_pairs(pb->o, n, pairs, ARENA_MILP_PAIRS_MAX);
    if (np < 0) {
        free(pairs);
        r->note = "too large for the MILP: the greedy layout, not proven";
        return ERR_OK;
    }
    glp_prob *lp =
        build_arena_milp(pb->o, n, (const int(*)[2])pairs, np, (double)unit,
                         (double)(greedy / unit), (double)((lower + unit - 1) / unit), e);
    if (lp == NULL) {
        free(pairs);
        return e->code;
    }
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    parm.tm_lim = opt->time_limit_s > 0 ? (int)(1e3 * opt->time_limit_s) : INT32_MAX;
    int rc = glp_intopt(lp, &parm), status = glp_mip_status(lp);
    r->note = "not proven: the time limit stopped GLPK";
    int kept = 1;
    if ((rc == 0 || rc == GLP_ETMLIM) && (status == GLP_OPT || status == GLP_FEAS) &&
        llround(glp_mip_obj_val(lp)) * unit < greedy) {
        for (int i = 0; i < n; i++)
            pb->o[i].offset = llround(glp_mip_col_val(lp, i + 1)) * unit;
        struct arena a = {.bytes = arena_extent(pb->o, n), .n = n, .objects = pb->o};
        struct err ignored;
        if (arena_check(&a, &ignored)) { /* rounding broke it: the greedy layout */
            arena_greedy(pb, opt, r, e);
            kept = 0;
        }
    }
    if (rc == 0 && status == GLP_OPT && kept) {
        r->proven = 1;
        r->note = "proven optimal";
    } else if (rc != 0 && rc != GLP_ETMLIM) {
        r->note = "GLPK failed: the greedy layout, not proven";
    }
    glp_delete_prob(lp);
    free(pairs);
    return ERR_OK;
}
