/* The per-stage offload problem (offload.h) as a MILP for --verify: a binary x_la per allowed
 * action a of layer l, sum_a x_la = 1; tau >= t_a x_la (the largest transient) and
 * z >= h_a x_la (the largest host bytes, which fixes the staging); device
 * sum v k_a x_la + tau + (COST_PREFETCH_AHEAD + 2) z <= limit - fixed, host
 * sum v h_a x_la <= host limit; the objective is sum ms_a x_la. */
#include <glpk.h>

#include "milp.h"
#include "offload.h"
#include "problem.h"

/* Bytes enter the MILP in MiB: coefficients of 1e10 beside times of 1 left GLPK's presolved
 * problem ill-conditioned enough to report a worse choice as optimal. */
#define MIB 1048576.0

struct milp_build {
    glp_prob *lp;
    struct milp_matrix a;
    int row;
};

static void put(struct milp_build *b, int row, int col, double value)
{
    milp_matrix_put(&b->a, row, col, value);
}

/* Columns 1 tau, 2 z, then the actions; rows 1 device, 2 host, then per layer one, then two
 * per action. */
static void build_offload_milp(struct milp_build *b, const struct plan *p,
                               const struct plan_stage *st, const struct plan_options *o, int n)
{
    int v = st->in_flight, col = 2;
    double fixed = (double)p->reserve_bytes, workspace = 0;
    glp_set_obj_dir(b->lp, GLP_MIN);
    glp_add_cols(b->lp, 2);
    glp_set_col_bnds(b->lp, 1, GLP_LO, 0, 0);
    glp_set_col_bnds(b->lp, 2, GLP_LO, 0, 0);
    glp_add_rows(b->lp, 2);
    put(b, 1, 1, 1);
    put(b, 1, 2, COST_PREFETCH_AHEAD + 2);
    b->row = 2;
    for (int l = 0; l < n; l++) {
        const struct layer_cost *c = &st->layers[l];
        struct cost_row rows[COST_ACTIONS_MAX];
        int count = method_menu(p, st, l, o, rows), one = ++b->row;
        fixed += (double)c->state_bytes;
        if (c->workspace_bytes > workspace)
            workspace = (double)c->workspace_bytes;
        glp_add_rows(b->lp, 1);
        glp_set_row_bnds(b->lp, one, GLP_FX, 1, 1);
        for (int a = 0; a < count; a++) {
            glp_add_cols(b->lp, 1);
            glp_set_col_kind(b->lp, ++col, GLP_BV);
            glp_set_obj_coef(b->lp, col, rows[a].recompute_ms);
            put(b, one, col, 1);
            put(b, 1, col, (double)v * (double)rows[a].kept_bytes / MIB);
            put(b, 2, col, (double)v * (double)rows[a].host_bytes / MIB);
            glp_add_rows(b->lp, 2);
            glp_set_row_bnds(b->lp, b->row + 1, GLP_LO, 0, 0);
            put(b, b->row + 1, 1, 1);
            put(b, b->row + 1, col, -(double)rows[a].transient_bytes / MIB);
            glp_set_row_bnds(b->lp, b->row + 2, GLP_LO, 0, 0);
            put(b, b->row + 2, 2, 1);
            put(b, b->row + 2, col, -(double)rows[a].host_bytes / MIB);
            b->row += 2;
        }
    }
    glp_set_row_bnds(b->lp, 1, GLP_UP, 0,
                     ((double)st->memory_limit_bytes - fixed - workspace) / MIB);
    glp_set_row_bnds(b->lp, 2, GLP_UP, 0, (double)st->host_limit_bytes / MIB);
}

int offload_milp_min_recompute(const struct plan *p, int s, const struct plan_options *o,
                               double *ms, struct err *e)
{
    const struct plan_stage *st = &p->stages[s];
    int n = plan_stage_layer_count(st);
    struct milp_build b = {.lp = glp_create_prob()};
    build_offload_milp(&b, p, st, o, n);
    int rc = milp_matrix_load(&b.a, b.lp, e) || milp_intopt(b.lp, ms, e) ? e->code : ERR_OK;
    glp_delete_prob(b.lp);
    milp_matrix_free(&b.a);
    return rc;
}
