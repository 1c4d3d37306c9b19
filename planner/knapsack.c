#include "knapsack.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int64_t ceil_div(__int128 a, int64_t b)
{
    __int128 q = (a + b - 1) / b;
    return q > INT64_MAX ? INT64_MAX : (int64_t)q;
}

int knap_build(struct knap_problem *p, const struct layer_cost *layers, int n, int in_flight,
               int64_t reserve_bytes, int64_t limit_bytes, int64_t unit_bytes, struct err *e)
{
    memset(p, 0, sizeof *p);
    p->n = n;
    p->w = calloc((size_t)n, sizeof *p->w);
    p->t = calloc((size_t)n, sizeof *p->t);
    double *fwd = calloc((size_t)n, sizeof *fwd);
    if (p->w == NULL || p->t == NULL || fwd == NULL) {
        free(fwd);
        knap_free(p);
        return err_set(e, ERR_FAIL, "out of memory building a knapsack of %d layers", n);
    }
    __int128 fixed = reserve_bytes;
    int64_t workspace = 0;
    for (int l = 0; l < n; l++) {
        int64_t d = layers[l].act_bytes - layers[l].ckpt_bytes;
        fixed += layers[l].state_bytes + (__int128)in_flight * layers[l].ckpt_bytes;
        if (layers[l].workspace_bytes > workspace)
            workspace = layers[l].workspace_bytes;
        p->w[l] = ceil_div((__int128)in_flight * d, unit_bytes);
        p->t[l] = ceil_div(d, unit_bytes);
        fwd[l] = layers[l].fwd_ms;
    }
    fixed += workspace;
    p->fwd = fwd;
    p->fixed_bytes = fixed > INT64_MAX ? INT64_MAX : (int64_t)fixed;
    p->limit_bytes = limit_bytes;
    p->unit_bytes = unit_bytes;
    __int128 room = (__int128)limit_bytes - fixed;
    /* floor division, also for negative room */
    p->cap = room >= 0 ? (int64_t)(room / unit_bytes) : -(int64_t)((-room + unit_bytes - 1) / unit_bytes);
    return ERR_OK;
}

void knap_free(struct knap_problem *p)
{
    free(p->w);
    free(p->t);
    free((void *)p->fwd);
    memset(p, 0, sizeof *p);
}

int64_t knap_units(const struct knap_problem *p, const unsigned char *recompute)
{
    int64_t kept = 0, transient = 0;
    for (int l = 0; l < p->n; l++) {
        if (recompute[l]) {
            if (p->t[l] > transient)
                transient = p->t[l];
        } else {
            kept += p->w[l];
        }
    }
    return kept + transient;
}

double knap_recompute_ms(const struct knap_problem *p, const unsigned char *recompute)
{
    double r = 0;
    for (int l = 0; l < p->n; l++)
        if (recompute[l])
            r += p->fwd[l];
    return r;
}

int64_t knap_time_units(const struct knap_problem *p, int layer, double time_unit_ms)
{
    return (int64_t)llround(p->fwd[layer] / time_unit_ms);
}

/* The distinct transient values, ascending, with 0 first. */
static int thresholds(const struct knap_problem *p, int64_t *out)
{
    int k = 0;
    out[k++] = 0;
    for (int l = 0; l < p->n; l++) {
        int seen = 0;
        for (int i = 0; i < k && !seen; i++)
            seen = out[i] == p->t[l];
        if (!seen)
            out[k++] = p->t[l];
    }
    for (int i = 1; i < k; i++) /* insertion sort: k is small */
        for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
            int64_t x = out[j];
            out[j] = out[j - 1];
            out[j - 1] = x;
        }
    return k;
}

/* Bit table of n rows of `width` cells, for reconstructing the DP's choice. */
struct bits {
    unsigned char *b;
    int64_t width;
};

static int bits_init(struct bits *t, int n, int64_t width, struct err *e)
{
    if ((__int128)n * width > KNAP_CELLS_MAX)
        return err_set(e, ERR_INPUT,
                       "the knapsack would need %lld x %lld cells (more than %lld): use a coarser "
                       "unit (--unit)",
                       (long long)n, (long long)width, (long long)KNAP_CELLS_MAX);
    t->width = width;
    t->b = calloc((size_t)(((int64_t)n * width + 7) / 8), 1);
    if (t->b == NULL)
        return err_set(e, ERR_FAIL, "out of memory for a knapsack table of %lld cells",
                       (long long)((int64_t)n * width));
    return ERR_OK;
}

static void bits_set(struct bits *t, int row, int64_t col)
{
    int64_t i = (int64_t)row * t->width + col;
    t->b[i / 8] |= (unsigned char)(1u << (i % 8));
}

static int bits_get(const struct bits *t, int row, int64_t col)
{
    int64_t i = (int64_t)row * t->width + col;
    return (t->b[i / 8] >> (i % 8)) & 1;
}

/* Values equal up to rounding of sums in a different order count as ties. */
static int less_time(double a, double b)
{
    return a < b - 1e-9 * (1.0 + fabs(b));
}

struct subset {
    int64_t weight;
    double value;
    uint32_t mask;
};

static int by_weight(const void *a, const void *b)
{
    const struct subset *x = a, *y = b;
    return (x->weight > y->weight) - (x->weight < y->weight);
}

/* Chooses among `n` candidates (weight, value), ascending by weight, the one the tie rule
 * wants: scanning up, move only to a value better by more than rounding. */
static int64_t pick(const double *best, int64_t n)
{
    int64_t at = 0;
    for (int64_t c = 1; c < n; c++)
        if (best[c] >= 0 && less_time(best[at], best[c]))
            at = c;
    return at;
}

/* keep_most_valuable for few layers: every subset, instead of a table as wide as the
 * capacity. Same answer: per exact weight the best value, then the same scan. */
static int64_t keep_by_subsets(const struct knap_problem *p, const int *opt, int m,
                               int64_t avail, unsigned char *choice, struct err *e)
{
    uint32_t count = 1u << m;
    struct subset *all = malloc(count * sizeof *all);
    double *best = malloc(count * sizeof *best);
    if (all == NULL || best == NULL) {
        free(all);
        free(best);
        err_set(e, ERR_FAIL, "out of memory");
        return -1;
    }
    uint32_t n = 0;
    for (uint32_t mask = 0; mask < count; mask++) {
        int64_t w = 0;
        double v = 0;
        for (int j = 0; j < m; j++)
            if (mask >> j & 1) {
                w += p->w[opt[j]];
                v += p->fwd[opt[j]];
            }
        if (w <= avail)
            all[n++] = (struct subset){w, v, mask};
    }
    qsort(all, n, sizeof *all, by_weight);
    /* collapse to one entry per weight: its best value (the first such subset) */
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (k > 0 && all[k - 1].weight == all[i].weight) {
            if (all[i].value > all[k - 1].value)
                all[k - 1] = all[i];
        } else {
            all[k++] = all[i];
        }
    }
    for (uint32_t i = 0; i < k; i++)
        best[i] = all[i].value;
    struct subset chosen = all[pick(best, k)];
    for (int j = 0; j < m; j++)
        choice[opt[j]] = !(chosen.mask >> j & 1);
    free(all);
    free(best);
    return chosen.weight;
}

/* Keeps, among the optional layers `opt` (m of them), the most valuable set of total weight at
 * most `avail`, ties by least weight; marks the others recomputed in `choice`. Returns the kept
 * weight, or -1 with e set. */
static int64_t keep_most_valuable(const struct knap_problem *p, const int *opt, int m,
                                  int64_t avail, unsigned char *choice, struct err *e)
{
    if (m <= 16 && ((int64_t)1 << m) < avail)
        return keep_by_subsets(p, opt, m, avail, choice, e);
    struct bits take;
    double *best = malloc((size_t)(avail + 1) * sizeof *best);
    if (best == NULL || bits_init(&take, m, avail + 1, e)) {
        free(best);
        if (e->code == ERR_OK)
            err_set(e, ERR_FAIL, "out of memory");
        return -1;
    }
    /* best[c]: the largest kept value of optional layers of exact weight c (-1: none) */
    best[0] = 0;
    for (int64_t c = 1; c <= avail; c++)
        best[c] = -1;
    for (int j = 0; j < m; j++) {
        int l = opt[j];
        int64_t w = p->w[l];
        for (int64_t c = avail; c >= w; c--)
            if (best[c - w] >= 0 && best[c - w] + p->fwd[l] > best[c]) {
                best[c] = best[c - w] + p->fwd[l];
                bits_set(&take, j, c);
            }
    }
    int64_t at = pick(best, avail + 1);
    int64_t kept = at;
    for (int j = 0; j < m; j++)
        choice[opt[j]] = 1;
    for (int j = m - 1; j >= 0; j--)
        if (bits_get(&take, j, at)) {
            choice[opt[j]] = 0;
            at -= p->w[opt[j]];
        }
    free(best);
    free(take.b);
    return kept;
}

int knap_min_recompute(const struct knap_problem *p, unsigned char *recompute, struct err *e)
{
    int n = p->n;
    /* The common cases need no table: even recomputing everything does not fit, or keeping
     * everything does and no layer is free to recompute (a free one would save memory at no
     * cost, which the tie rule wants). */
    int64_t all_kept = 0, most_transient = 0;
    int free_saving = 0;
    for (int l = 0; l < n; l++) {
        all_kept += p->w[l];
        if (p->t[l] > most_transient)
            most_transient = p->t[l];
        free_saving |= p->fwd[l] == 0 && p->w[l] > 0;
    }
    if (p->cap < 0 || most_transient > p->cap)
        return ERR_NOFIT;
    if (all_kept <= p->cap && !free_saving) {
        memset(recompute, 0, (size_t)n);
        return ERR_OK;
    }
    int64_t *taus = malloc((size_t)(n + 1) * sizeof *taus);
    int *opt = malloc((size_t)(n > 0 ? n : 1) * sizeof *opt);
    unsigned char *choice = calloc((size_t)(n > 0 ? n : 1), 1);
    if (taus == NULL || opt == NULL || choice == NULL) {
        free(taus);
        free(opt);
        free(choice);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    int k = thresholds(p, taus);
    int found = 0;
    double best_r = 0;
    int64_t best_units = 0;
    for (int i = 0; i < k; i++) {
        int64_t tau = taus[i], forced = 0, optional_w = 0;
        int m = 0;
        for (int l = 0; l < n; l++) {
            if (p->t[l] > tau) {
                forced += p->w[l];
            } else {
                opt[m++] = l;
                optional_w += p->w[l];
            }
        }
        int64_t avail = p->cap - tau - forced;
        if (avail < 0)
            continue;
        memset(choice, 0, (size_t)n);
        int64_t kept = optional_w;
        if (avail < optional_w) {
            kept = keep_most_valuable(p, opt, m, avail, choice, e);
            if (kept < 0)
                break;
        }
        double r = knap_recompute_ms(p, choice);
        int64_t units = forced + kept + tau;
        if (!found || less_time(r, best_r) || (!less_time(best_r, r) && units < best_units)) {
            found = 1;
            best_r = r;
            best_units = units;
            memcpy(recompute, choice, (size_t)n);
        }
    }
    free(taus);
    free(opt);
    free(choice);
    if (e->code)
        return e->code;
    return found ? ERR_OK : ERR_NOFIT;
}

double knap_balance_time_unit(const struct knap_problem *p, double wanted_ms)
{
    double total = 0;
    for (int l = 0; l < p->n; l++)
        total += p->fwd[l];
    double width = (double)(KNAP_CELLS_MAX / (p->n > 0 ? p->n : 1)) - 2;
    double needed = total / width;
    return needed > wanted_ms ? needed : wanted_ms;
}

int knap_balance(const struct knap_problem *p, int64_t target_units, double time_unit_ms,
                 unsigned char *recompute, int64_t *distance, struct err *e)
{
    int n = p->n;
    int64_t *taus = malloc((size_t)(n + 1) * sizeof *taus);
    int *opt = malloc((size_t)(n > 0 ? n : 1) * sizeof *opt);
    int64_t *q = malloc((size_t)(n > 0 ? n : 1) * sizeof *q);
    unsigned char *choice = calloc((size_t)(n > 0 ? n : 1), 1);
    if (taus == NULL || opt == NULL || q == NULL || choice == NULL) {
        free(taus);
        free(opt);
        free(q);
        free(choice);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    for (int l = 0; l < n; l++)
        q[l] = knap_time_units(p, l, time_unit_ms);
    int k = thresholds(p, taus);
    int found = 0;
    int64_t best_d = 0, best_units = 0;
    for (int i = 0; i < k && e->code == ERR_OK; i++) {
        int64_t tau = taus[i], forced = 0, optional_w = 0, qsum = 0;
        int m = 0;
        for (int l = 0; l < n; l++) {
            if (p->t[l] > tau) {
                forced += p->w[l];
            } else {
                opt[m++] = l;
                optional_w += p->w[l];
                qsum += q[l];
            }
        }
        if (p->cap < 0 || forced + tau > p->cap)
            continue;
        /* most[r]: the most weight that recomputed optional layers of total time r free */
        struct bits take;
        int64_t *most = malloc((size_t)(qsum + 1) * sizeof *most);
        if (most == NULL || bits_init(&take, m, qsum + 1, e)) {
            free(most);
            if (e->code == ERR_OK)
                err_set(e, ERR_FAIL, "out of memory");
            break;
        }
        most[0] = 0;
        for (int64_t r = 1; r <= qsum; r++)
            most[r] = -1;
        for (int j = 0; j < m; j++) {
            int l = opt[j];
            for (int64_t r = qsum; r >= q[l]; r--)
                if (most[r - q[l]] >= 0 && most[r - q[l]] + p->w[l] > most[r]) {
                    most[r] = most[r - q[l]] + p->w[l];
                    bits_set(&take, j, r);
                }
        }
        int64_t at = -1, at_d = 0, at_units = 0;
        for (int64_t r = 0; r <= qsum; r++) {
            if (most[r] < 0)
                continue;
            int64_t units = forced + (optional_w - most[r]) + tau;
            if (units > p->cap)
                continue;
            int64_t d = r > target_units ? r - target_units : target_units - r;
            if (at < 0 || d < at_d || (d == at_d && units < at_units)) {
                at = r;
                at_d = d;
                at_units = units;
            }
        }
        if (at >= 0 && (!found || at_d < best_d || (at_d == best_d && at_units < best_units))) {
            found = 1;
            best_d = at_d;
            best_units = at_units;
            memset(choice, 0, (size_t)n);
            for (int j = m - 1; j >= 0; j--)
                if (bits_get(&take, j, at)) {
                    choice[opt[j]] = 1;
                    at -= q[opt[j]];
                }
            memcpy(recompute, choice, (size_t)n);
        }
        free(most);
        free(take.b);
    }
    free(taus);
    free(opt);
    free(q);
    free(choice);
    if (e->code)
        return e->code;
    if (!found)
        return ERR_NOFIT;
    *distance = best_d;
    return ERR_OK;
}
