#include "knapsack.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"

static int64_t units_of(__int128 bytes, int64_t unit, int64_t cap)
{
    __int128 u = (bytes + unit - 1) / unit;
    return (int64_t)(u > cap + 1 ? cap + 1 : u);
}

int knap_build_rows(struct knap_problem *p, const struct layer_cost *layers, int n,
                    const struct cost_row *rows, const int *first_row, const int *in_flight,
                    const int *chunk, int64_t reserve_bytes, int64_t limit_bytes,
                    int64_t unit_bytes, struct err *e)
{
    memset(p, 0, sizeof *p);
    size_t count = n > 0 ? (size_t)n : 1;
    int n_choices = first_row[n];
    p->n = n;
    p->w = calloc(count, sizeof *p->w);
    p->t = calloc(count, sizeof *p->t);
    double *fwd = calloc(count, sizeof *fwd);
    p->fwd = fwd;
    p->first_choice = calloc(count + 1, sizeof *p->first_choice);
    p->choices = calloc((size_t)n_choices + 1, sizeof *p->choices);
    if (p->w == NULL || p->t == NULL || fwd == NULL || p->first_choice == NULL ||
        p->choices == NULL) {
        knap_free(p);
        return err_set(e, ERR_FAIL, "out of memory building a knapsack of %d layers", n);
    }
    __int128 fixed = cost_fixed_bytes_each(layers, n, in_flight, chunk, reserve_bytes);
    __int128 room = (__int128)limit_bytes - fixed;
    p->cap = room >= 0 ? (int64_t)(room / unit_bytes) : -1;
    p->fixed_bytes = cost_saturate(fixed);
    p->limit_bytes = limit_bytes;
    p->unit_bytes = unit_bytes;
    for (int l = 0; l < n; l++) {
        const struct layer_cost *c = &layers[l];
        fwd[l] = c->fwd_ms;
        p->first_choice[l] = first_row[l];
        for (int k = first_row[l]; k < first_row[l + 1]; k++) {
            __int128 kept;
            int64_t transient;
            cost_row_weights(c, &rows[k], in_flight[l], &kept, &transient);
            p->choices[k] = (struct knap_choice){units_of(kept, unit_bytes, p->cap),
                                                 units_of(transient, unit_bytes, p->cap),
                                                 rows[k].recompute_ms};
        }
        p->w[l] = p->choices[first_row[l] + COST_KEEP].w;
        p->t[l] = p->choices[first_row[l] + COST_FULL].t;
        p->multi |= first_row[l + 1] - first_row[l] > COST_OPTION;
    }
    p->first_choice[n] = n_choices;
    return ERR_OK;
}

/* The layers' choices as rows (cost_row; keep and full alone without `options`) and in_flight
 * for every layer where `each` is NULL; knap_build_rows over them. */
static int build_choices(struct knap_problem *p, const struct layer_cost *layers, int n,
                         int in_flight, const int *each, const int *chunk, int64_t reserve_bytes,
                         int64_t limit_bytes, int64_t unit_bytes, int options, struct err *e)
{
    size_t count = n > 0 ? (size_t)n : 1;
    int total = 0;
    for (int l = 0; l < n; l++)
        total += options ? cost_choice_count(&layers[l]) : COST_OPTION;
    struct cost_row *rows = malloc(((size_t)total + 1) * sizeof *rows);
    int *first = malloc((count + 1) * sizeof *first), *uniform = malloc(count * sizeof *uniform);
    int rc = rows != NULL && first != NULL && uniform != NULL
                 ? ERR_OK
                 : err_set(e, ERR_FAIL, "out of memory building a knapsack of %d layers", n);
    for (int l = 0, k = 0; rc == ERR_OK && l <= n; l++) {
        first[l] = k;
        for (int c = 0; l < n && c < (options ? cost_choice_count(&layers[l]) : COST_OPTION);
             c++)
            rows[k++] = cost_row(&layers[l], c);
        if (l < n)
            uniform[l] = in_flight;
    }
    if (rc == ERR_OK)
        rc = knap_build_rows(p, layers, n, rows, first, each != NULL ? each : uniform, chunk,
                             reserve_bytes, limit_bytes, unit_bytes, e);
    free(rows);
    free(first);
    free(uniform);
    return rc;
}

int knap_build(struct knap_problem *p, const struct layer_cost *layers, int n, int in_flight,
               int64_t reserve_bytes, int64_t limit_bytes, int64_t unit_bytes, struct err *e)
{
    return build_choices(p, layers, n, in_flight, NULL, NULL, reserve_bytes, limit_bytes,
                         unit_bytes, 0, e);
}

int knap_build_options(struct knap_problem *p, const struct layer_cost *layers, int n,
                       int in_flight, int64_t reserve_bytes, int64_t limit_bytes,
                       int64_t unit_bytes, struct err *e)
{
    return build_choices(p, layers, n, in_flight, NULL, NULL, reserve_bytes, limit_bytes,
                         unit_bytes, 1, e);
}

int knap_build_each(struct knap_problem *p, const struct layer_cost *layers, int n,
                    const int *in_flight, const int *chunk, int64_t reserve_bytes,
                    int64_t limit_bytes, int64_t unit_bytes, int options, struct err *e)
{
    return build_choices(p, layers, n, 0, in_flight, chunk, reserve_bytes, limit_bytes,
                         unit_bytes, options, e);
}

void knap_free(struct knap_problem *p)
{
    free(p->w);
    free(p->t);
    free((void *)p->fwd);
    free(p->first_choice);
    free(p->choices);
    memset(p, 0, sizeof *p);
}

int64_t knap_units(const struct knap_problem *p, const unsigned char *recompute)
{
    __int128 kept = 0;
    int64_t transient = 0;
    for (int l = 0; l < p->n; l++) {
        const struct knap_choice *c = &p->choices[p->first_choice[l] + recompute[l]];
        kept += c->w;
        if (c->t > transient)
            transient = c->t;
    }
    return cost_saturate(kept + transient);
}

double knap_recompute_ms(const struct knap_problem *p, const unsigned char *recompute)
{
    double r = 0;
    for (int l = 0; l < p->n; l++)
        if (recompute[l])
            r += p->choices[p->first_choice[l] + recompute[l]].ms;
    return r;
}

int64_t knap_time_units(const struct knap_problem *p, int layer, double time_unit_ms)
{
    return (int64_t)llround(p->fwd[layer] / time_unit_ms);
}

/* The layers sorted by transient. For each threshold tau (0, then every distinct t_l), the
 * layers that may be recomputed (t_l <= tau) are the first end[g] of this order, and the
 * rest must be kept. */
struct sorted {
    int *layer;
    int n_groups;
    int *end;
    int64_t *tau;
    __int128 *prefix_w; /* prefix_w[j]: sum of w over the first j layers of the order */
};

struct by_t {
    int64_t t;
    int layer;
};

static int compare_by_t(const void *a, const void *b)
{
    const struct by_t *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return x->layer - y->layer;
}

static void sorted_free(struct sorted *s)
{
    free(s->layer);
    free(s->end);
    free(s->tau);
    free(s->prefix_w);
}

static int sorted_init(struct sorted *s, const struct knap_problem *p, struct err *e)
{
    int n = p->n;
    struct by_t *items = malloc((size_t)(n + 1) * sizeof *items);
    s->layer = malloc((size_t)(n + 1) * sizeof *s->layer);
    s->end = malloc((size_t)(n + 1) * sizeof *s->end);
    s->tau = malloc((size_t)(n + 1) * sizeof *s->tau);
    s->prefix_w = malloc((size_t)(n + 1) * sizeof *s->prefix_w);
    if (items == NULL || s->layer == NULL || s->end == NULL || s->tau == NULL ||
        s->prefix_w == NULL) {
        free(items);
        sorted_free(s);
        return err_set(e, ERR_FAIL, "out of memory sorting %d layers", n);
    }
    for (int l = 0; l < n; l++)
        items[l] = (struct by_t){p->t[l], l};
    qsort(items, (size_t)n, sizeof *items, compare_by_t);
    int g = 0;
    s->tau[0] = 0;
    s->end[0] = 0;
    s->prefix_w[0] = 0;
    for (int i = 0; i < n; i++) {
        s->layer[i] = items[i].layer;
        s->prefix_w[i + 1] = s->prefix_w[i] + p->w[items[i].layer];
        if (items[i].t != s->tau[g])
            s->tau[++g] = items[i].t;
        s->end[g] = i + 1;
    }
    s->n_groups = g + 1;
    free(items);
    return ERR_OK;
}

/* The DP table: one bit per (layer, column) to reconstruct the choice, and one value of
 * `value_size` bytes per column. */
struct table {
    unsigned char *bits;
    void *value;
    int64_t width;
};

static int table_init(struct table *tb, int rows, __int128 width, size_t value_size,
                      const char *option, struct err *e)
{
    memset(tb, 0, sizeof *tb);
    __int128 cells = ((__int128)rows + 8 * (__int128)value_size) * width;
    if (cells > KNAP_CELLS_MAX)
        return err_set(e, ERR_INPUT,
                       "the knapsack would need %d x %.0f cells (more than %lld): use a coarser "
                       "%s",
                       rows, (double)width, (long long)KNAP_CELLS_MAX, option);
    tb->width = (int64_t)width;
    tb->bits = calloc((size_t)(((__int128)rows * width + 7) / 8) + 1, 1);
    tb->value = malloc((size_t)width * value_size);
    if (tb->bits == NULL || tb->value == NULL) {
        free(tb->bits);
        free(tb->value);
        return err_set(e, ERR_FAIL, "out of memory for a knapsack table of %.0f cells",
                       (double)cells);
    }
    return ERR_OK;
}

static void table_free(struct table *tb)
{
    free(tb->bits);
    free(tb->value);
}

static void bit_set(struct table *tb, int row, int64_t col)
{
    int64_t i = (int64_t)row * tb->width + col;
    tb->bits[i / 8] |= (unsigned char)(1u << (i % 8));
}

static int bit_get(const struct table *tb, int row, int64_t col)
{
    int64_t i = (int64_t)row * tb->width + col;
    return (tb->bits[i / 8] >> (i % 8)) & 1;
}

/* Values equal up to rounding of sums in a different order count as ties. */
static int less_time(double a, double b)
{
    return a < b - 1e-9 * (1.0 + fabs(b));
}

/* Units of the layers threshold g must keep: those beyond its prefix. */
static __int128 forced_units(const struct sorted *s, int g, const struct knap_problem *p)
{
    return s->prefix_w[p->n] - s->prefix_w[s->end[g]];
}

/* What threshold g leaves of cap for its optional layers (< 0: nothing fits). */
static __int128 avail_units(const struct sorted *s, int g, const struct knap_problem *p)
{
    return p->cap - s->tau[g] - forced_units(s, g, p);
}

int knap_min_recompute_subsets(const struct knap_problem *p, unsigned char *recompute)
{
    int n = p->n, found = 0;
    double best_r = 0;
    int64_t best_units = 0;
    uint32_t best_mask = 0;
    for (uint32_t mask = 0; mask < (uint32_t)1 << n; mask++) {
        __int128 kept = 0;
        int64_t transient = 0;
        double r = 0;
        for (int l = 0; l < n; l++) {
            if (mask >> l & 1) {
                transient = p->t[l] > transient ? p->t[l] : transient;
                r += p->fwd[l];
            } else {
                kept += p->w[l];
            }
        }
        __int128 units = kept + transient;
        if (units > p->cap)
            continue;
        if (!found || less_time(r, best_r) || (!less_time(best_r, r) && units < best_units)) {
            found = 1;
            best_r = r;
            best_units = (int64_t)units;
            best_mask = mask;
        }
    }
    for (int l = 0; l < n; l++)
        recompute[l] = best_mask >> l & 1;
    return found ? ERR_OK : ERR_NOFIT;
}

int knap_min_recompute(const struct knap_problem *p, unsigned char *recompute, struct err *e)
{
    int n = p->n;
    if (p->multi)
        return knap_min_recompute_mc(p, recompute, e);
    /* The common cases need no table: even full recomputation (the least memory) does not
     * fit, or keeping everything does and no layer is free to recompute (one that is would
     * save memory at no cost, which the tie rule wants). */
    __int128 all_kept = 0;
    int64_t most_transient = 0;
    int free_saving = 0;
    for (int l = 0; l < n; l++) {
        all_kept += p->w[l];
        most_transient = p->t[l] > most_transient ? p->t[l] : most_transient;
        free_saving |= p->fwd[l] == 0 && p->w[l] > 0;
    }
    if (most_transient > p->cap)
        return ERR_NOFIT;
    if (all_kept <= p->cap && !free_saving) {
        memset(recompute, 0, (size_t)n);
        return ERR_OK;
    }
    /* A few layers with a wide table (v (act - ckpt) in MiB is tens of thousands of columns
     * for big models): every subset is cheaper than the table, with the same answer. */
    if (n <= KNAP_SUBSETS_MAX && ((int64_t)4 << n) < p->cap)
        return knap_min_recompute_subsets(p, recompute);
    return knap_min_recompute_dp(p, recompute, e);
}

/* The sorted layer `added` (weight w, forward time f) into the least-recompute table:
 * best[c], the largest kept time of layers of exact weight c; strictly better only, so that
 * a layer that costs no time is recomputed, for free. */
static void kept_add(struct table *tb, double *best, int64_t width, int added, int64_t w,
                     double f)
{
    for (int64_t c = width - 1; c >= w; c--)
        if (best[c - w] >= 0 && best[c - w] + f > best[c]) {
            best[c] = best[c - w] + f;
            bit_set(tb, added, c);
        }
}

/* The table's columns: kept weight of the optional layers, up to the most any threshold can
 * use; *any 0 when no threshold leaves room at all. */
static __int128 kept_width(const struct sorted *s, const struct knap_problem *p, int *any)
{
    __int128 width = 0;
    *any = 0;
    for (int g = 0; g < s->n_groups; g++) {
        __int128 avail = avail_units(s, g, p), optional_w = s->prefix_w[s->end[g]];
        __int128 used = avail < optional_w ? avail : optional_w;
        *any = *any || avail >= 0;
        if (used + 1 > width)
            width = used + 1;
    }
    return width;
}

/* The column up to `last` of the most kept time, ties (up to rounding) by the least weight:
 * scanning up, it moves only to a value better by more than rounding. The tolerance is
 * relative to the recompute time (of optional layers totalling `optional_ms`), not to the
 * kept time, which a long kept layer makes huge. */
static int64_t most_kept(const double *best, int64_t last, double optional_ms)
{
    int64_t at = 0;
    double top = best[0]; /* best[at] */
    for (int64_t c = 1; c <= last; c++)
        if (best[c] > top && best[c] - top > 1e-9 * (1.0 + (optional_ms - best[c]))) {
            top = best[c];
            at = c;
        }
    return at;
}

int knap_min_recompute_dp(const struct knap_problem *p, unsigned char *recompute, struct err *e)
{
    int n = p->n;
    struct sorted s;
    if (sorted_init(&s, p, e))
        return e->code;
    int any;
    __int128 width = kept_width(&s, p, &any);
    struct table tb;
    unsigned char *choice = malloc((size_t)(n > 0 ? n : 1));
    if (!any || choice == NULL || table_init(&tb, n, width, sizeof(double), "--unit", e)) {
        sorted_free(&s);
        free(choice);
        if (choice == NULL)
            return err_set(e, ERR_FAIL, "out of memory");
        return any ? e->code : ERR_NOFIT;
    }
    /* best[c]: the largest kept time of optional layers of exact weight c (-1: none) */
    double *best = tb.value;
    best[0] = 0;
    for (int64_t c = 1; c < width; c++)
        best[c] = -1;
    int rc = ERR_NOFIT, added = 0;
    double best_r = 0;
    int64_t best_units = 0;
    double optional_ms = 0; /* total time of the optional layers */
    for (int g = 0; g < s.n_groups; g++) {
        for (; added < s.end[g]; added++) {
            optional_ms += p->fwd[s.layer[added]];
            kept_add(&tb, best, width, added, p->w[s.layer[added]], p->fwd[s.layer[added]]);
        }
        __int128 avail = avail_units(&s, g, p);
        if (avail < 0)
            continue;
        int64_t at = most_kept(best, avail < width - 1 ? (int64_t)avail : width - 1,
                               optional_ms);
        memset(choice, 0, (size_t)n);
        for (int i = s.end[g] - 1; i >= 0; i--) {
            if (bit_get(&tb, i, at))
                at -= p->w[s.layer[i]];
            else
                choice[s.layer[i]] = 1;
        }
        double r = knap_recompute_ms(p, choice);
        int64_t units = knap_units(p, choice);
        if (rc == ERR_NOFIT || less_time(r, best_r) ||
            (!less_time(best_r, r) && units < best_units)) {
            rc = ERR_OK;
            best_r = r;
            best_units = units;
            memcpy(recompute, choice, (size_t)n);
        }
    }
    table_free(&tb);
    sorted_free(&s);
    free(choice);
    return rc;
}

double knap_balance_time_unit(const struct knap_problem *p, double wanted_ms)
{
    double total = 0;
    for (int l = 0; l < p->n; l++)
        total += p->fwd[l];
    /* Rounding each layer to the nearest unit adds up to n/2 columns; leave room for it. */
    double width = (double)(KNAP_CELLS_MAX / (p->n + 64) - p->n - 1);
    double needed = total / width;
    return needed > wanted_ms ? needed : wanted_ms;
}

/* The sorted layer `added` (time q, weight w) into the balance table: most[r], the most weight
 * recomputed layers of exact time r free, and the row's bit where taking it is better. The
 * sizes are arguments, not reads through p: the bit writes may alias anything the compiler
 * cannot see. */
static void balance_add(struct table *tb, int64_t *most, int64_t width, int added, int64_t q,
                        int64_t w)
{
    for (int64_t r = width - 1; r >= q; r--)
        if (most[r - q] >= 0 && most[r - q] + w > most[r]) {
            most[r] = most[r - q] + w;
            bit_set(tb, added, r);
        }
}

/* The layers' recompute times in whole time units (q) and the table's width (their sum + 1),
 * refused by name when the table would be too large. */
static int balance_units(const struct knap_problem *p, double time_unit_ms, int64_t *q,
                         int64_t *width, struct err *e)
{
    double total = 0;
    for (int l = 0; l < p->n; l++)
        total += p->fwd[l];
    if (!(total / time_unit_ms < (double)KNAP_CELLS_MAX))
        return err_set(e, ERR_INPUT,
                       "balancing %.6g ms of recomputation in units of %.6g ms needs too large a "
                       "table: use a coarser --time-unit",
                       total, time_unit_ms);
    *width = 1;
    for (int l = 0; l < p->n; l++) {
        q[l] = knap_time_units(p, l, time_unit_ms);
        *width += q[l];
    }
    return ERR_OK;
}

/* Group g's recompute time nearest the target among those whose kept units fit the cap (ties:
 * fewer units): its column of `most`, or -1; *d its distance to the target. */
static int64_t balance_closest(const struct sorted *s, const struct knap_problem *p, int g,
                               const int64_t *most, int64_t width, int64_t target_units,
                               int64_t *d)
{
    __int128 forced = forced_units(s, g, p), optional_w = s->prefix_w[s->end[g]];
    int64_t at = -1;
    __int128 at_units = 0;
    for (int64_t r = 0; r < width; r++) {
        if (most[r] < 0)
            continue;
        __int128 units = forced + optional_w - most[r] + s->tau[g];
        if (units > p->cap)
            continue;
        int64_t dr = r > target_units ? r - target_units : target_units - r;
        if (at < 0 || dr < *d || (dr == *d && units < at_units)) {
            at = r;
            *d = dr;
            at_units = units;
        }
    }
    return at;
}

int knap_balance(const struct knap_problem *p, int64_t target_units, double time_unit_ms,
                 unsigned char *recompute, int64_t *distance, struct err *e)
{
    int n = p->n;
    struct sorted s;
    if (sorted_init(&s, p, e))
        return e->code;
    /* 64-bit sums of weights below are safe up to here; beyond, the unit is absurdly fine */
    if (s.prefix_w[n] > INT64_MAX / 2) {
        sorted_free(&s);
        return err_set(e, ERR_INPUT, "a stage of %d layers weighs more than 2^62 memory units: "
                                     "use a coarser --unit", n);
    }
    int64_t *q = malloc((size_t)(n > 0 ? n : 1) * sizeof *q), width = 1;
    unsigned char *choice = malloc((size_t)(n > 0 ? n : 1));
    struct table tb;
    if (q == NULL || choice == NULL || balance_units(p, time_unit_ms, q, &width, e) ||
        table_init(&tb, n, width, sizeof(int64_t), "--time-unit", e)) {
        sorted_free(&s);
        free(q);
        free(choice);
        return q == NULL || choice == NULL ? err_set(e, ERR_FAIL, "out of memory") : e->code;
    }
    /* most[r]: the most weight that recomputed optional layers of exact time r free (-1:
     * none) */
    int64_t *most = tb.value;
    most[0] = 0;
    for (int64_t r = 1; r < width; r++)
        most[r] = -1;
    int rc = ERR_NOFIT, added = 0;
    int64_t best_d = 0, best_units = 0;
    for (int g = 0; g < s.n_groups; g++) {
        for (; added < s.end[g]; added++)
            balance_add(&tb, most, width, added, q[s.layer[added]], p->w[s.layer[added]]);
        int64_t at_d = 0, at = balance_closest(&s, p, g, most, width, target_units, &at_d);
        if (at < 0)
            continue;
        memset(choice, 0, (size_t)n);
        for (int i = s.end[g] - 1; i >= 0; i--)
            if (bit_get(&tb, i, at)) {
                choice[s.layer[i]] = 1;
                at -= q[s.layer[i]];
            }
        int64_t units = knap_units(p, choice);
        if (rc == ERR_NOFIT || at_d < best_d || (at_d == best_d && units < best_units)) {
            rc = ERR_OK;
            best_d = at_d;
            best_units = units;
            memcpy(recompute, choice, (size_t)n);
        }
    }
    table_free(&tb);
    sorted_free(&s);
    free(q);
    free(choice);
    if (rc == ERR_OK)
        *distance = best_d;
    return rc;
}

/* ---- multiple choice ---- */

/* A state of the multiple-choice DP after some layers: kept units, index of the largest
 * transient among the distinct transients, recompute time; `id` is its entry in the history
 * (a candidate's `id` is its parent's, until it is kept). */
struct mc_state {
    int64_t w;
    int32_t tix;
    int32_t id;
    double ms;
    int32_t choice; /* the layer's choice that made it */
};

/* Whether x comes before y: by units, then transient, then time. */
static int state_before(const struct mc_state *x, const struct mc_state *y)
{
    if (x->w != y->w)
        return x->w < y->w;
    if (x->tix != y->tix)
        return x->tix < y->tix;
    return x->ms < y->ms;
}

/* Runs sorted by insertion before sort_states merges them. */
#define STATE_RUN 16

/* A stable sort of n states by state_before (tmp: room for n): runs by insertion, then
 * merged pairwise. The candidates are sorted once per layer of every range's knapsack, the
 * planner's hottest sort: inlined comparisons make it several times faster than qsort, and
 * being stable it keeps equal states in the order they were made. */
static void sort_states(struct mc_state *a, int64_t n, struct mc_state *tmp)
{
    for (int64_t lo = 0; lo < n; lo += STATE_RUN) {
        int64_t hi = lo + STATE_RUN < n ? lo + STATE_RUN : n;
        for (int64_t i = lo + 1; i < hi; i++) {
            struct mc_state x = a[i];
            int64_t j = i;
            for (; j > lo && state_before(&x, &a[j - 1]); j--)
                a[j] = a[j - 1];
            a[j] = x;
        }
    }
    struct mc_state *from = a, *to = tmp;
    for (int64_t width = STATE_RUN; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n;
            int64_t hi = lo + 2 * width < n ? lo + 2 * width : n, i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                to[k++] = state_before(&from[j], &from[i]) ? from[j++] : from[i++];
            while (i < mid)
                to[k++] = from[i++];
            while (j < hi)
                to[k++] = from[j++];
        }
        struct mc_state *swap = from;
        from = to;
        to = swap;
    }
    if (from != a)
        memcpy(a, from, (size_t)n * sizeof *a);
}

static int compare_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* The least time of the states kept so far whose transient index is at most i: a Fenwick tree
 * of prefix minima (values only decrease while one layer's candidates are swept). */
static double prefix_min(const double *tree, int i)
{
    double m = INFINITY;
    for (i++; i > 0; i -= i & -i)
        m = tree[i] < m ? tree[i] : m;
    return m;
}

static void lower(double *tree, int size, int i, double v)
{
    for (i++; i <= size; i += i & -i)
        if (v < tree[i])
            tree[i] = v;
}

static int choice_fits(const struct knap_problem *p, const struct knap_choice *c)
{
    return c->w <= p->cap && c->t <= p->cap;
}

/* A step along a layer's lower hull: `units` fewer kept for `ms` more recompute. */
struct hull_step {
    double units, ms;
};

static int by_slope(const void *a, const void *b)
{
    const struct hull_step *x = a, *y = b;
    double lhs = x->ms * y->units, rhs = y->ms * x->units; /* x's slope against y's */
    return (lhs > rhs) - (lhs < rhs);
}

/* Layer l's lower hull of (units kept, time) over the choices that fit, from its fastest
 * choice down to its fewest units, into `steps` (*n more); *fastest gets that choice,
 * *transient the least of any choice's. 0 when no choice fits. */
static int layer_hull(const struct knap_problem *p, int l, struct hull_step *steps, int *n,
                      const struct knap_choice **fastest, int64_t *transient)
{
    const struct knap_choice *from = NULL;
    *transient = INT64_MAX;
    for (int c = p->first_choice[l]; c < p->first_choice[l + 1]; c++) {
        const struct knap_choice *x = &p->choices[c];
        if (!choice_fits(p, x))
            continue;
        *transient = x->t < *transient ? x->t : *transient;
        if (from == NULL || x->ms < from->ms || (x->ms == from->ms && x->w < from->w))
            from = x;
    }
    *fastest = from;
    while (from != NULL) {
        const struct knap_choice *to = NULL;
        for (int c = p->first_choice[l]; c < p->first_choice[l + 1]; c++) {
            const struct knap_choice *x = &p->choices[c];
            if (!choice_fits(p, x) || x->w >= from->w)
                continue;
            /* the least slope (ms added per unit freed), ties by the most units freed */
            double cross = to == NULL ? -1
                                      : (x->ms - from->ms) * (double)(from->w - to->w) -
                                            (to->ms - from->ms) * (double)(from->w - x->w);
            if (to == NULL || cross < 0 || (cross == 0 && x->w < to->w))
                to = x;
        }
        if (to != NULL)
            steps[(*n)++] = (struct hull_step){(double)(from->w - to->w), to->ms - from->ms};
        from = to;
    }
    return *fastest != NULL;
}

double knap_recompute_floor(const struct knap_problem *p)
{
    if (p->cap < 0)
        return INFINITY;
    struct hull_step *steps = malloc(((size_t)p->first_choice[p->n] + 1) * sizeof *steps);
    if (steps == NULL)
        return 0; /* a floor still */
    int n = 0;
    double need = -(double)p->cap, floor = 0;
    int64_t least_transient = 0;
    for (int l = 0; l < p->n; l++) {
        const struct knap_choice *fastest;
        int64_t transient;
        if (!layer_hull(p, l, steps, &n, &fastest, &transient)) {
            free(steps);
            return INFINITY;
        }
        floor += fastest->ms;
        need += (double)fastest->w;
        least_transient = transient > least_transient ? transient : least_transient;
    }
    need += (double)least_transient;
    qsort(steps, (size_t)n, sizeof *steps, by_slope);
    for (int k = 0; k < n && need > 0; k++) {
        double part = steps[k].units < need ? steps[k].units : need;
        floor += steps[k].ms * (part / steps[k].units);
        need -= part;
    }
    free(steps);
    /* rounding: the exact time is a sum of the same doubles in another order */
    return need > 0 ? INFINITY : floor * (1 - 1e-9);
}

/* The history of kept states, to reconstruct the choice: each one's parent and choice. */
struct mc_history {
    int32_t *parent;
    unsigned char *choice;
    int64_t used, cap;
};

static int history_add(struct mc_history *h, int32_t parent, int choice, int n,
                       struct err *e)
{
    if (h->used == h->cap) {
        if (h->cap >= KNAP_STATES_MAX)
            return err_set(e, ERR_INPUT,
                           "the multiple-choice knapsack of %d layers would keep more than %lld "
                           "states: use a coarser --unit",
                           n, (long long)KNAP_STATES_MAX);
        int64_t cap = h->cap ? 2 * h->cap : 1024;
        int32_t *parent = realloc(h->parent, (size_t)cap * sizeof *parent);
        if (parent != NULL)
            h->parent = parent;
        unsigned char *choice = realloc(h->choice, (size_t)cap);
        if (choice != NULL)
            h->choice = choice;
        if (parent == NULL || choice == NULL)
            return err_set(e, ERR_FAIL, "out of memory for %lld knapsack states",
                           (long long)cap);
        h->cap = cap;
    }
    h->parent[h->used] = parent;
    h->choice[h->used] = (unsigned char)choice;
    h->used++;
    return ERR_OK;
}

/* The multiple-choice DP's working set: states layer by layer (cur, then the candidates made
 * from them), the distinct transients they can have, a bound on what the remaining layers
 * keep, and each kept state's history (its parent and choice). */
struct mc_solver {
    const struct knap_problem *p;
    int64_t *tvals; /* distinct transients of the choices that can fit, ascending, 0 first */
    int D;
    int64_t *rest; /* rest[l]: the fewest units layers l.. can keep */
    double *tree;  /* least time so far by transient (prefix minima) */
    struct mc_state *cur, *cand, *sorting; /* sorting: sort_states' room */
    int64_t n_cur, cur_cap, cand_cap, sorting_cap;
    struct mc_history h;
};

static void mc_free(struct mc_solver *m)
{
    free(m->tvals);
    free(m->rest);
    free(m->tree);
    free(m->cur);
    free(m->cand);
    free(m->sorting);
    free(m->h.parent);
    free(m->h.choice);
}

/* Whether keeping everything is the answer (it takes no time; unless a choice is free it is
 * the only choice that does), ERR_NOFIT when a layer's transient alone is over the cap. */
static int mc_trivial(const struct knap_problem *p, int *kept_all)
{
    __int128 all_kept = 0;
    int64_t most_transient = 0;
    int free_choice = 0;
    for (int l = 0; l < p->n; l++) {
        all_kept += p->w[l];
        most_transient = p->t[l] > most_transient ? p->t[l] : most_transient;
        for (int c = p->first_choice[l] + 1; c < p->first_choice[l + 1]; c++)
            free_choice |= p->choices[c].ms == 0;
    }
    *kept_all = all_kept <= p->cap && !free_choice;
    return most_transient > p->cap ? ERR_NOFIT : ERR_OK;
}

/* The distinct transients and the fewest units each suffix of layers can keep. */
static int mc_init(struct mc_solver *m, const struct knap_problem *p, struct err *e)
{
    int n = p->n, n_choices = p->first_choice[n];
    *m = (struct mc_solver){.p = p, .n_cur = 1, .cur_cap = 1};
    m->tvals = malloc((size_t)(n_choices + 1) * sizeof *m->tvals);
    m->rest = malloc((size_t)(n + 1) * sizeof *m->rest);
    m->tree = malloc((size_t)(n_choices + 2) * sizeof *m->tree);
    m->cur = malloc(sizeof *m->cur);
    if (m->tvals == NULL || m->rest == NULL || m->tree == NULL || m->cur == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    m->tvals[m->D++] = 0;
    for (int c = 0; c < n_choices; c++)
        if (choice_fits(p, &p->choices[c]))
            m->tvals[m->D++] = p->choices[c].t;
    qsort(m->tvals, (size_t)m->D, sizeof *m->tvals, compare_i64);
    int distinct = 1;
    for (int i = 1; i < m->D; i++)
        if (m->tvals[i] != m->tvals[distinct - 1])
            m->tvals[distinct++] = m->tvals[i];
    m->D = distinct;
    m->rest[n] = 0; /* at most n (cap + 1): no overflow */
    for (int l = n - 1; l >= 0; l--) {
        int64_t least = p->cap + 1;
        for (int c = p->first_choice[l]; c < p->first_choice[l + 1]; c++)
            if (choice_fits(p, &p->choices[c]) && p->choices[c].w < least)
                least = p->choices[c].w;
        m->rest[l] = m->rest[l + 1] + least;
    }
    m->cur[0] = (struct mc_state){0, 0, -1, 0, 0};
    return ERR_OK;
}

/* Room for layer l's candidates: every state with every choice. */
static int mc_reserve(struct mc_solver *m, int l, int k, struct err *e)
{
    int64_t need = m->n_cur * k;
    if (need <= m->cand_cap)
        return ERR_OK;
    if (need > KNAP_STATES_MAX)
        return err_set(e, ERR_INPUT,
                       "the multiple-choice knapsack of %d layers would weigh %lld candidate "
                       "states at layer %d (more than %lld): use a coarser --unit",
                       m->p->n, (long long)need, l, (long long)KNAP_STATES_MAX);
    free(m->cand);
    m->cand_cap = need;
    m->cand = malloc((size_t)need * sizeof *m->cand);
    return m->cand != NULL ? ERR_OK
                           : err_set(e, ERR_FAIL, "out of memory for %lld knapsack states",
                                     (long long)need);
}

/* Layer l's candidates: each state with each choice that fits, unless the layers after it
 * could not fit whatever they choose; returns how many. */
static int64_t mc_candidates(struct mc_solver *m, int l)
{
    const struct knap_problem *p = m->p;
    int k = p->first_choice[l + 1] - p->first_choice[l];
    int64_t n = 0;
    for (int64_t s = 0; s < m->n_cur; s++)
        for (int c = 0; c < k; c++) {
            const struct knap_choice *ch = &p->choices[p->first_choice[l] + c];
            if (!choice_fits(p, ch))
                continue;
            int32_t tix = m->cur[s].tix;
            while (m->tvals[tix] < ch->t)
                tix++;
            int64_t w = m->cur[s].w + ch->w;
            if ((__int128)w + m->rest[l + 1] + m->tvals[tix] > p->cap)
                continue;
            m->cand[n++] = (struct mc_state){w, tix, m->cur[s].id, m->cur[s].ms + ch->ms, c};
        }
    return n;
}

/* The candidates no kept state beats become the next layer's states. Sorted by units, then
 * transient: a candidate is beaten exactly when a state kept before it, with no larger
 * transient, takes no more time. ERR_NOFIT when none is left. */
static int mc_prune(struct mc_solver *m, int64_t n, struct err *e)
{
    if (n > m->sorting_cap) {
        free(m->sorting);
        m->sorting_cap = n;
        if ((m->sorting = malloc((size_t)n * sizeof *m->sorting)) == NULL)
            return err_set(e, ERR_FAIL, "out of memory for %lld knapsack states", (long long)n);
    }
    sort_states(m->cand, n, m->sorting);
    for (int i = 0; i <= m->D; i++)
        m->tree[i] = INFINITY;
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!(prefix_min(m->tree, m->cand[i].tix) > m->cand[i].ms))
            continue;
        lower(m->tree, m->D, m->cand[i].tix, m->cand[i].ms);
        ERR_TRY(history_add(&m->h, m->cand[i].id, m->cand[i].choice, m->p->n, e));
        m->cand[kept] = m->cand[i];
        m->cand[kept++].id = (int32_t)(m->h.used - 1);
    }
    if (kept == 0)
        return ERR_NOFIT; /* nothing fits these layers */
    struct mc_state *swap = m->cur;
    int64_t swap_cap = m->cur_cap;
    m->cur = m->cand;
    m->cur_cap = m->cand_cap;
    m->cand = swap;
    m->cand_cap = swap_cap;
    m->n_cur = kept;
    return ERR_OK;
}

/* The least time, then (among times equal up to rounding) the fewest units, traced back to
 * each layer's choice. */
static void mc_answer(const struct mc_solver *m, unsigned char *recompute)
{
    double least = INFINITY;
    for (int64_t s = 0; s < m->n_cur; s++)
        least = m->cur[s].ms < least ? m->cur[s].ms : least;
    int64_t best = -1, best_units = 0;
    for (int64_t s = 0; s < m->n_cur; s++) {
        int64_t units = m->cur[s].w + m->tvals[m->cur[s].tix];
        if (!less_time(least, m->cur[s].ms) && (best < 0 || units < best_units)) {
            best = s;
            best_units = units;
        }
    }
    for (int32_t id = best >= 0 ? m->cur[best].id : -1, l = m->p->n - 1; id >= 0 && l >= 0;
         l--) {
        recompute[l] = m->h.choice[id];
        id = m->h.parent[id];
    }
}

/* Whole-layer recomputation everywhere needs the fewest units (knapsack.h). Layer by layer:
 * every state with every choice, the dominated dropped. */
int knap_min_recompute_mc(const struct knap_problem *p, unsigned char *recompute,
                          struct err *e)
{
    int kept_all;
    ERR_TRY(mc_trivial(p, &kept_all));
    memset(recompute, 0, (size_t)p->n);
    if (kept_all)
        return ERR_OK;
    struct mc_solver m;
    int rc = mc_init(&m, p, e);
    for (int l = 0; l < p->n && rc == ERR_OK; l++) {
        rc = mc_reserve(&m, l, p->first_choice[l + 1] - p->first_choice[l], e);
        if (rc == ERR_OK)
            rc = mc_prune(&m, mc_candidates(&m, l), e);
    }
    if (rc == ERR_OK)
        mc_answer(&m, recompute);
    mc_free(&m);
    return rc;
}
