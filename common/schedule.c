#include "schedule.h"

#include <stdlib.h>
#include <string.h>

static const char *const names[SCHEDULE_KINDS] = {
    [SCHEDULE_1F1B] = "1f1b",
    [SCHEDULE_GPIPE] = "gpipe",
    [SCHEDULE_INTERLEAVED] = "interleaved",
    [SCHEDULE_ZB_H1] = "zb-h1",
    [SCHEDULE_V_HALF] = "v-half",
};

const char *schedule_name(enum schedule s)
{
    return s >= 0 && s < SCHEDULE_KINDS ? names[s] : "?";
}

int schedule_parse(const char *text, enum schedule *out)
{
    for (int k = 0; k < SCHEDULE_KINDS; k++)
        if (strcmp(text, names[k]) == 0) {
            *out = (enum schedule)k;
            return 0;
        }
    return -1;
}

const char *schedule_names(void)
{
    return "\"1f1b\", \"gpipe\", \"interleaved\", \"zb-h1\" or \"v-half\"";
}

int schedule_splits(enum schedule s)
{
    return s == SCHEDULE_ZB_H1 || s == SCHEDULE_V_HALF;
}

int schedule_fixed_chunks(enum schedule s, int virtual_stages)
{
    return s == SCHEDULE_INTERLEAVED ? virtual_stages : s == SCHEDULE_V_HALF ? 2 : 1;
}

int schedule_check(const struct schedule_shape *sh, struct err *e)
{
    if (sh->gpus < 1 || sh->micro_batches < 1)
        return err_set(e, ERR_INPUT, "schedule %s: %d GPUs and %d micro-batches (need >= 1 each)",
                       schedule_name(sh->kind), sh->gpus, sh->micro_batches);
    if (sh->kind == SCHEDULE_INTERLEAVED &&
        (sh->chunks < 1 || sh->chunks > SCHEDULE_CHUNKS_MAX))
        return err_set(e, ERR_INPUT, "schedule interleaved: virtual_stages %d (need 1 .. %d)",
                       sh->chunks, SCHEDULE_CHUNKS_MAX);
    if (sh->kind != SCHEDULE_INTERLEAVED && sh->chunks != schedule_fixed_chunks(sh->kind, 1))
        return err_set(e, ERR_INPUT, "schedule %s holds %d model chunks a GPU, not %d "
                       "(virtual_stages is interleaved's)", schedule_name(sh->kind),
                       schedule_fixed_chunks(sh->kind, 1), sh->chunks);
    return ERR_OK;
}

int schedule_virtual_stages(const struct schedule_shape *sh)
{
    return sh->gpus * sh->chunks;
}

int schedule_gpu(const struct schedule_shape *sh, int j, int *chunk)
{
    int p = sh->gpus;
    if (sh->kind == SCHEDULE_V_HALF) {
        *chunk = j >= p;
        return j < p ? j : 2 * p - 1 - j;
    }
    *chunk = j / p;
    return j % p;
}

int schedule_vstage(const struct schedule_shape *sh, int g, int c)
{
    int p = sh->gpus;
    if (sh->kind == SCHEDULE_V_HALF)
        return c == 0 ? g : 2 * p - 1 - g;
    return c * p + g;
}

int schedule_op_count(const struct schedule_shape *sh)
{
    return sh->chunks * sh->micro_batches * (schedule_splits(sh->kind) ? 3 : 2);
}

/* ---- 1F1B, GPipe ---- */

static void one_f_one_b(enum schedule kind, int p, int s, int M, struct schedule_op *ops)
{
    int w = schedule_warmup(kind, p, s, M);
    for (int k = 0; k < 2 * M; k++)
        ops[k] = schedule_op_at(w, M, k);
}

/* ---- ZB-H1: 1F1B's warm-up; then per micro-batch i: F of w + i, B of i, W of i - s ---- */

static void zb_h1(int p, int s, int M, struct schedule_op *ops)
{
    int w = schedule_warmup(SCHEDULE_1F1B, p, s, M), n = 0, next_w = 0;
    for (int m = 0; m < w; m++)
        ops[n++] = (struct schedule_op){SCHEDULE_F, m, 0};
    for (int i = 0; i < M; i++) {
        if (w + i < M)
            ops[n++] = (struct schedule_op){SCHEDULE_F, w + i, 0};
        ops[n++] = (struct schedule_op){SCHEDULE_B, i, 0};
        if (i - s >= 0)
            ops[n++] = (struct schedule_op){SCHEDULE_W, next_w++, 0};
    }
    while (next_w < M)
        ops[n++] = (struct schedule_op){SCHEDULE_W, next_w++, 0};
}

/* ---- interleaved (Megatron-LM's order) ---- */

/* The k-th forward (or backward) of GPU s over Mp micro-batches, a multiple of p: groups of
 * p micro-batches, each through the chunks in order (backwards: reversed). */
static struct schedule_op interleaved_at(int p, int v, int k, int backward)
{
    int group = k / (p * v), r = k % (p * v), c = r / p;
    return (struct schedule_op){backward ? SCHEDULE_B : SCHEDULE_F, group * p + r % p,
                                backward ? v - 1 - c : c};
}

static void interleaved(int p, int v, int s, int M, struct schedule_op *ops)
{
    if (v == 1) {
        one_f_one_b(SCHEDULE_1F1B, p, s, M, ops);
        return;
    }
    int Mp = (M + p - 1) / p * p, total = v * Mp, n = 0, f = 0, b = 0;
    int w = (v - 1) * p + 2 * (p - s - 1);
    w = w < total ? w : total;
    /* the order of Mp micro-batches, those from M on left out */
    while (b < total) {
        struct schedule_op op = f < w || (f < total && f - w <= b)
                                    ? interleaved_at(p, v, f++, 0)
                                    : interleaved_at(p, v, b++, 1);
        if (op.micro < M)
            ops[n++] = op;
    }
}

/* ---- v-half: a list scheduler over unit passes ---- */

struct vsched {
    int p, M, V;
    int *nf, *nb, *nw;          /* per virtual stage: passes placed */
    long *tf, *tb;              /* V x M: when each F and B ends */
    long *free;                 /* per GPU */
    int *n_ops;                 /* per GPU */
    struct schedule_op *ops;    /* p x 6M, the program of each GPU */
};

/* A pass GPU g could start: at `start`, of virtual stage j, `pass`; priority (lower first). */
struct vcand {
    long start;
    int rank, j, pass;
};

static int v_cap(const struct vsched *v, int j)
{
    return (2 * v->p - j) / 2 + 1;
}

/* When virtual stage j's next pass of kind `pass` could start on its GPU (-1: not yet). */
static long v_ready(const struct vsched *v, int j, int pass, long gpu_free)
{
    long dep;
    if (pass == SCHEDULE_F) {
        int m = v->nf[j];
        if (m >= v->M || m - v->nw[j] >= v_cap(v, j))
            return -1;
        dep = j == 0 ? 0 : v->nf[j - 1] > m ? v->tf[(size_t)(j - 1) * v->M + m] : -1;
    } else if (pass == SCHEDULE_B) {
        int m = v->nb[j];
        if (m >= v->nf[j])
            return -1;
        dep = j == v->V - 1 ? v->tf[(size_t)j * v->M + m]
              : v->nb[j + 1] > m ? v->tb[(size_t)(j + 1) * v->M + m]
                                 : -1;
    } else {
        if (v->nw[j] >= v->nb[j])
            return -1;
        dep = 0;
    }
    if (dep < 0)
        return -1;
    return dep > gpu_free ? dep : gpu_free;
}

static int v_better(const struct vcand *a, const struct vcand *b)
{
    if (a->start != b->start)
        return a->start < b->start;
    if (a->rank != b->rank)
        return a->rank < b->rank;
    return a->j > b->j;
}

/* GPU g's best next pass; 0 when it has none it could ever start now. */
static int v_best(const struct vsched *v, int g, struct vcand *best)
{
    int found = 0, js[2] = {2 * v->p - 1 - g, g};
    for (int i = 0; i < 2; i++)
        for (int pass = 0; pass < 3; pass++) {
            int j = js[i];
            long t = v_ready(v, j, pass, v->free[g]);
            if (t < 0)
                continue;
            /* B first, then the return chunk's forward, the outbound one's, then W */
            int rank = pass == SCHEDULE_B ? 0 : pass == SCHEDULE_W ? 3 : j >= v->p ? 1 : 2;
            struct vcand c = {t, rank, j, pass};
            if (!found || v_better(&c, best))
                *best = c;
            found = 1;
        }
    return found;
}

static void v_place(struct vsched *v, int g, const struct vcand *c)
{
    int j = c->j, chunk = j >= v->p;
    int *count = c->pass == SCHEDULE_F ? v->nf : c->pass == SCHEDULE_B ? v->nb : v->nw;
    int m = count[j]++;
    long end = c->start + 1;
    if (c->pass == SCHEDULE_F)
        v->tf[(size_t)j * v->M + m] = end;
    else if (c->pass == SCHEDULE_B)
        v->tb[(size_t)j * v->M + m] = end;
    v->free[g] = end;
    v->ops[(size_t)g * 6 * v->M + v->n_ops[g]++] = (struct schedule_op){c->pass, m, chunk};
}

/* Every GPU's program into v->ops; the earliest pass of any GPU goes first (ties: the lower
 * GPU), so the order is that of a run with unit passes. */
static int v_run(struct vsched *v)
{
    int64_t total = (int64_t)6 * v->p * v->M;
    for (int64_t placed = 0; placed < total; placed++) {
        struct vcand best = {0}, c;
        int g_best = -1;
        for (int g = 0; g < v->p; g++)
            if (v_best(v, g, &c) && (g_best < 0 || c.start < best.start)) {
                best = c;
                g_best = g;
            }
        if (g_best < 0)
            return -1; /* cannot happen: every virtual stage holds at least one */
        v_place(v, g_best, &best);
    }
    return 0;
}

/* Every GPU's program, GPU g's at all + g x 6M. */
static int v_half(int p, int M, struct schedule_op *all, struct err *e)
{
    int V = 2 * p;
    size_t cells = (size_t)V * M;
    struct vsched v = {.p = p, .M = M, .V = V};
    v.nf = calloc((size_t)V * 3, sizeof(int));
    v.tf = malloc(2 * cells * sizeof(long));
    v.free = calloc((size_t)p, sizeof(long));
    v.n_ops = calloc((size_t)p, sizeof(int));
    v.ops = all;
    int rc = ERR_OK;
    if (!v.nf || !v.tf || !v.free || !v.n_ops) {
        rc = err_set(e, ERR_FAIL, "out of memory ordering v-half over %d GPUs, %d micro-batches",
                     p, M);
    } else {
        v.nb = v.nf + V;
        v.nw = v.nf + 2 * V;
        v.tb = v.tf + cells;
        if (v_run(&v))
            rc = err_set(e, ERR_FAIL, "internal: v-half's scheduler found no pass to run");
    }
    free(v.nf);
    free(v.tf);
    free(v.free);
    free(v.n_ops);
    return rc;
}

int schedule_all_ops(const struct schedule_shape *sh, struct schedule_op *all, struct err *e)
{
    int n = schedule_op_count(sh);
    if (sh->kind == SCHEDULE_V_HALF)
        return v_half(sh->gpus, sh->micro_batches, all, e);
    for (int g = 0; g < sh->gpus; g++)
        ERR_TRY(schedule_ops(sh, g, all + (size_t)g * n, e));
    return ERR_OK;
}

int schedule_ops(const struct schedule_shape *sh, int g, struct schedule_op *ops, struct err *e)
{
    int p = sh->gpus, M = sh->micro_batches;
    switch (sh->kind) {
    case SCHEDULE_1F1B:
    case SCHEDULE_GPIPE:
        one_f_one_b(sh->kind, p, g, M, ops);
        return ERR_OK;
    case SCHEDULE_ZB_H1:
        zb_h1(p, g, M, ops);
        return ERR_OK;
    case SCHEDULE_INTERLEAVED:
        interleaved(p, sh->chunks, g, M, ops);
        return ERR_OK;
    case SCHEDULE_V_HALF: {
        size_t n = (size_t)schedule_op_count(sh);
        struct schedule_op *all = malloc((size_t)p * n * sizeof *all);
        int rc = all == NULL ? err_set(e, ERR_FAIL, "out of memory ordering v-half")
                             : v_half(p, M, all, e);
        if (rc == ERR_OK)
            memcpy(ops, all + (size_t)g * n, n * sizeof *ops);
        free(all);
        return rc;
    }
    default:
        return err_set(e, ERR_INPUT, "schedule %d is not one Ballast knows", (int)sh->kind);
    }
}

/* ---- in-flight counts by replay ---- */

int schedule_in_flights(const struct schedule_shape *sh, int *out, struct err *e)
{
    int n = schedule_op_count(sh), split = schedule_splits(sh->kind);
    int gpus = sh->kind == SCHEDULE_V_HALF ? sh->gpus : 1; /* held at once */
    struct schedule_op *ops = malloc((size_t)gpus * n * sizeof *ops);
    if (ops == NULL)
        return err_set(e, ERR_FAIL, "out of memory listing a %s schedule of %d passes",
                       schedule_name(sh->kind), n);
    int rc = gpus > 1 ? schedule_all_ops(sh, ops, e) : ERR_OK;
    for (int g = 0; g < sh->gpus && rc == ERR_OK; g++) {
        int held[SCHEDULE_CHUNKS_MAX] = {0}, most[SCHEDULE_CHUNKS_MAX] = {0};
        const struct schedule_op *o = gpus > 1 ? ops + (size_t)g * n : ops;
        if (gpus == 1)
            rc = schedule_ops(sh, g, ops, e);
        for (int k = 0; k < n && rc == ERR_OK; k++) {
            int c = o[k].chunk;
            if (o[k].pass == SCHEDULE_F && ++held[c] > most[c])
                most[c] = held[c];
            else if (o[k].pass == (split ? SCHEDULE_W : SCHEDULE_B))
                held[c]--;
        }
        for (int c = 0; c < sh->chunks; c++)
            out[schedule_vstage(sh, g, c)] = most[c];
    }
    free(ops);
    return rc;
}

int schedule_in_flight(enum schedule kind, int n_stages, int stage, int micro_batches)
{
    struct schedule_shape sh = schedule_shape_of(kind, n_stages, 1, micro_batches);
    if (kind == SCHEDULE_1F1B || kind == SCHEDULE_GPIPE || kind == SCHEDULE_INTERLEAVED) {
        /* schedule_op_at's order: w forwards, then one more before the first backward
         * while any is left (the pool searches ask this per position, so no replay) */
        int w = schedule_warmup(kind == SCHEDULE_GPIPE ? kind : SCHEDULE_1F1B, n_stages, stage,
                                micro_batches);
        return w < micro_batches ? w + 1 : micro_batches;
    }
    int *out = malloc((size_t)n_stages * sizeof *out), v = -1;
    struct err e;
    err_clear(&e);
    if (out != NULL && schedule_check(&sh, &e) == ERR_OK &&
        schedule_in_flights(&sh, out, &e) == ERR_OK)
        v = out[stage];
    free(out);
    return v;
}
