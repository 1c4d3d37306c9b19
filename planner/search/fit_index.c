#include "fit_index.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Kinds an index takes (pool_model.h's POOL_KINDS_MAX is 6). */
#define FIT_KINDS_MAX 8
/* Entries a leaf holds at most. */
#define FIT_LEAF 16
/* Runs of entries (by index) longer than this are halved by index first: a query is for a
 * run of them. */
#define FIT_RUN 16384
/* Deeper than any tree of 2^63 entries halved down to leaves. */
#define FIT_DEPTH_MAX 128

/* A subtree: its entries order[lo, hi) and what bounds them. */
struct fit_node {
    int64_t lo, hi;
    int64_t right;        /* its second child (the first follows it); 0: a leaf */
    int64_t first, last;  /* the least and the most entry index */
    int32_t cap;          /* the most capacity (kept as capacities are lowered) */
};

struct fit_index {
    int K;
    int64_t n, n_node;
    int64_t *order;        /* entry indices, a run of them per node */
    int32_t *rows;         /* their rows in that order */
    int64_t *where;        /* per entry: its place in that order */
    struct fit_node *node; /* preorder, the root first */
    int32_t *least;        /* per node, K of them: the fewest GPUs of each kind */
    /* per node, K of them: the fewest GPUs of each kind per micro-batch of capacity, n_k / c
     * (kept as capacities are lowered) */
    double *least_per;
    uint64_t *bits;        /* a query's hits by entry index, cleared as they are read */
};

/* The replicas that take `need` at capacity cap (cap >= 1). */
static int64_t replicas_for(int64_t need, int64_t cap)
{
    return need > cap ? (need + cap - 1) / cap : 1;
}

/* An entry's GPUs of kind k per micro-batch of its capacity (INFINITY: none). */
static double per_batch(const int32_t *row, int k)
{
    return row[0] >= 1 ? (double)row[1 + k] / row[0] : INFINITY;
}

/* Whether `need` micro-batches at `per` GPUs of each kind a micro-batch or more could fit
 * `left`: the replicas that take them at a capacity c number need / c or more (the rounding's
 * slack: no entry whose replicas fit is left out). */
static int per_batch_fit(const double *per, int K, const int64_t *left, int64_t need)
{
    int ok = 1;
    for (int k = 0; k < K; k++)
        ok &= (double)need * per[k] <= (double)left[k] * (1 + 1e-9);
    return ok;
}

/* Whether r replicas of at least `least` GPUs per kind fit `left` within `most`. */
static int replicas_fit(const int32_t *least, int K, const int64_t *left, int64_t r,
                        int64_t most)
{
    int ok = r <= most;
    for (int k = 0; k < K; k++)
        ok &= r * least[k] <= left[k];
    return ok;
}

/* Nodes a tree of n entries takes (halved until a leaf holds FIT_LEAF or fewer). */
static int64_t nodes_for(int64_t n)
{
    return n <= FIT_LEAF ? 1 : 1 + nodes_for(n / 2) + nodes_for(n - n / 2);
}

/* The key an entry is split by: its GPUs of kind dim, or (dim == K) its index. */
static int64_t key(const int32_t *rows, int K, int dim, int64_t e)
{
    return dim < K ? rows[e * (K + 1) + 1 + dim] : e;
}

/* Internal node at's most capacity and fewest GPUs per micro-batch, from its children's. */
static void node_combine(fit_index_t *x, int64_t at)
{
    int K = x->K;
    struct fit_node *nd = &x->node[at];
    const struct fit_node *a = &x->node[at + 1], *b = &x->node[nd->right];
    const double *pa = x->least_per + (at + 1) * K, *pb = x->least_per + nd->right * K;
    nd->cap = a->cap > b->cap ? a->cap : b->cap;
    for (int k = 0; k < K; k++)
        x->least_per[at * K + k] = fmin(pa[k], pb[k]);
}

/* Node at's most capacity and fewest GPUs per micro-batch made again from its rows (a leaf)
 * or its children; whether they changed. */
static int node_refresh(fit_index_t *x, int64_t at)
{
    int K = x->K, changed;
    struct fit_node *nd = &x->node[at];
    double was[FIT_KINDS_MAX], *least_per = x->least_per + at * K;
    int32_t cap = nd->cap;
    memcpy(was, least_per, (size_t)K * sizeof *was);
    if (nd->right != 0)
        node_combine(x, at);
    else {
        nd->cap = 0;
        for (int k = 0; k < K; k++)
            least_per[k] = INFINITY;
        for (int64_t j = nd->lo; j < nd->hi; j++) {
            const int32_t *row = x->rows + j * (K + 1);
            nd->cap = row[0] > nd->cap ? row[0] : nd->cap;
            for (int k = 0; k < K; k++)
                least_per[k] = fmin(least_per[k], per_batch(row, k));
        }
    }
    changed = nd->cap != cap;
    for (int k = 0; k < K; k++)
        changed |= least_per[k] != was[k];
    return changed;
}

/* a[lo, hi) reordered so that a[nth] is in its sorted place, none after it less and none
 * before it more (Hoare's selection). */
static void select_nth(int64_t *a, int64_t lo, int64_t hi, int64_t nth, const int32_t *rows,
                       int K, int dim)
{
    while (hi - lo > 1) {
        int64_t pivot = key(rows, K, dim, a[lo + (hi - lo) / 2]), i = lo, j = hi - 1;
        while (i <= j) {
            while (key(rows, K, dim, a[i]) < pivot)
                i++;
            while (key(rows, K, dim, a[j]) > pivot)
                j--;
            if (i <= j) {
                int64_t t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        if (nth <= j)
            hi = j + 1;
        else if (nth >= i)
            lo = i;
        else
            return; /* between the two runs: equal to the pivot */
    }
}

/* The subtree of order[lo, hi): split at the median of the kind whose GPUs spread most (of
 * the index when none spreads). */
static void build(fit_index_t *x, const int32_t *rows, int64_t lo, int64_t hi)
{
    int K = x->K;
    int64_t at = x->n_node++;
    struct fit_node *nd = &x->node[at];
    int32_t *least = x->least + at * K, most[FIT_KINDS_MAX];
    double *least_per = x->least_per + at * K;
    *nd = (struct fit_node){.lo = lo, .hi = hi, .first = INT64_MAX, .last = -1, .cap = 0};
    for (int k = 0; k < K; k++)
        least[k] = INT32_MAX, most[k] = 0, least_per[k] = INFINITY;
    for (int64_t i = lo; i < hi; i++) {
        int64_t e = x->order[i];
        const int32_t *row = rows + e * (K + 1);
        nd->cap = row[0] > nd->cap ? row[0] : nd->cap;
        nd->first = e < nd->first ? e : nd->first;
        nd->last = e > nd->last ? e : nd->last;
        for (int k = 0; k < K; k++) {
            least[k] = row[1 + k] < least[k] ? row[1 + k] : least[k];
            most[k] = row[1 + k] > most[k] ? row[1 + k] : most[k];
            if (hi - lo <= FIT_LEAF) /* an internal node's: its children's (below) */
                least_per[k] = fmin(least_per[k], per_batch(row, k));
        }
    }
    if (hi - lo <= FIT_LEAF)
        return;
    int dim = K;
    for (int k = 0, spread = 0; hi - lo <= FIT_RUN && k < K; k++)
        if (most[k] - least[k] > spread)
            spread = most[k] - least[k], dim = k;
    int64_t mid = lo + (hi - lo) / 2;
    select_nth(x->order, lo, hi, mid, rows, K, dim);
    build(x, rows, lo, mid);
    x->node[at].right = x->n_node;
    build(x, rows, mid, hi);
    node_combine(x, at);
}

fit_index_t *fit_index_make(const int32_t *rows, int64_t n, int K)
{
    if (K < 1 || K > FIT_KINDS_MAX || n < 0)
        return NULL;
    fit_index_t *x = calloc(1, sizeof *x);
    if (x == NULL)
        return NULL;
    int64_t nodes = nodes_for(n);
    x->K = K;
    x->n = n;
    x->order = malloc((size_t)(n > 0 ? n : 1) * sizeof *x->order);
    x->node = malloc((size_t)nodes * sizeof *x->node);
    x->least = malloc((size_t)nodes * (size_t)K * sizeof *x->least);
    x->least_per = malloc((size_t)nodes * (size_t)K * sizeof *x->least_per);
    x->rows = malloc((size_t)(n > 0 ? n : 1) * (size_t)(K + 1) * sizeof *x->rows);
    x->where = malloc((size_t)(n > 0 ? n : 1) * sizeof *x->where);
    x->bits = calloc((size_t)(n / 64 + 1), sizeof *x->bits);
    if (x->order == NULL || x->node == NULL || x->least == NULL || x->least_per == NULL ||
        x->rows == NULL || x->where == NULL || x->bits == NULL) {
        fit_index_free(x);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        x->order[i] = i;
    build(x, rows, 0, n);
    for (int64_t i = 0; i < n; i++) {
        memcpy(x->rows + i * (K + 1), rows + x->order[i] * (K + 1), (size_t)(K + 1) * sizeof *rows);
        x->where[x->order[i]] = i;
    }
    return x;
}

void fit_index_free(fit_index_t *x)
{
    if (x == NULL)
        return;
    free(x->order);
    free(x->node);
    free(x->least);
    free(x->least_per);
    free(x->rows);
    free(x->where);
    free(x->bits);
    free(x);
}

void fit_index_lower(fit_index_t *x, int64_t i, int32_t cap)
{
    int64_t at = x->where[i], path[FIT_DEPTH_MAX], depth = 0;
    int32_t *row = x->rows + at * (x->K + 1);
    if (cap >= row[0])
        return;
    row[0] = cap;
    for (int64_t nd = 0;; nd = at < x->node[nd + 1].hi ? nd + 1 : x->node[nd].right) {
        path[depth++] = nd;
        if (x->node[nd].right == 0)
            break;
    }
    while (depth > 0 && node_refresh(x, path[--depth])) /* up while they change */
        ;
}

int64_t fit_index_find(fit_index_t *x, const int64_t *left, int64_t need, int64_t most,
                       int64_t from, int64_t to, int64_t *out)
{
    int K = x->K;
    int64_t stack[FIT_DEPTH_MAX], depth = 0, m = 0;
    from = from < 0 ? 0 : from;
    to = to > x->n ? x->n : to;
    if (from >= to)
        return 0;
    stack[depth++] = 0;
    while (depth > 0) {
        int64_t at = stack[--depth];
        const struct fit_node *nd = &x->node[at];
        const int32_t *least = x->least + at * K;
        /* every entry below takes as many replicas as the most capacity below asks for, or
           more, and each as many GPUs of each kind as the fewest below, or more */
        if (nd->last < from || nd->first >= to || nd->cap < 1 ||
            !replicas_fit(least, K, left, replicas_for(need, nd->cap), most) ||
            !per_batch_fit(x->least_per + at * K, K, left, need))
            continue;
        if (nd->right == 0) {
            for (int64_t i = nd->lo; i < nd->hi; i++) {
                int64_t e = x->order[i];
                const int32_t *row = x->rows + i * (K + 1);
                if (e >= from && e < to && row[0] >= 1 &&
                    replicas_fit(row + 1, K, left, replicas_for(need, row[0]), most))
                    x->bits[e / 64] |= (uint64_t)1 << (e % 64);
            }
            continue;
        }
        stack[depth++] = nd->right;
        stack[depth++] = at + 1;
    }
    for (int64_t w = from / 64; w <= (to - 1) / 64; w++) {
        for (uint64_t b = x->bits[w]; b != 0; b &= b - 1)
            out[m++] = w * 64 + __builtin_ctzll(b);
        x->bits[w] = 0;
    }
    return m;
}

