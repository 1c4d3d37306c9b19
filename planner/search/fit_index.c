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

/* A subtree: its entries order[lo, hi) and what bounds them. Each node is a record of this
 * header, its K fewest GPUs per micro-batch of capacity (doubles) and its K fewest GPUs (int32),
 * all a query reads of it in one or two cache lines. */
struct fit_node {
    int32_t lo, hi;
    int32_t right;       /* its second child (the first follows it); 0: a leaf */
    int32_t first, last; /* the least and the most entry index */
    int32_t cap;         /* the most capacity (kept as capacities are lowered) */
};

struct fit_index {
    int K;
    int64_t n, n_node;
    size_t stride;   /* bytes a node's record takes */
    int32_t *order;  /* entry indices, a run of them per node */
    int32_t *rows;   /* their rows in that order */
    int32_t *where;  /* per entry: its place in that order */
    char *nodes;     /* the records, preorder, the root first */
};

static struct fit_node *node_at(const fit_index_t *x, int64_t at)
{
    return (struct fit_node *)(x->nodes + (size_t)at * x->stride);
}

/* Node at's fewest GPUs of each kind per micro-batch of capacity, n_k / c (kept as capacities
 * are lowered). */
static double *least_per_of(const fit_index_t *x, int64_t at)
{
    return (double *)(x->nodes + (size_t)at * x->stride + sizeof(struct fit_node));
}

/* Node at's fewest GPUs of each kind. */
static int32_t *least_of(const fit_index_t *x, int64_t at)
{
    return (int32_t *)(least_per_of(x, at) + x->K);
}

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
    struct fit_node *nd = node_at(x, at);
    const struct fit_node *a = node_at(x, at + 1), *b = node_at(x, nd->right);
    const double *pa = least_per_of(x, at + 1), *pb = least_per_of(x, nd->right);
    double *per = least_per_of(x, at);
    nd->cap = a->cap > b->cap ? a->cap : b->cap;
    for (int k = 0; k < x->K; k++)
        per[k] = fmin(pa[k], pb[k]);
}

/* Node at's most capacity and fewest GPUs per micro-batch made again from its rows (a leaf)
 * or its children; whether they changed. */
static int node_refresh(fit_index_t *x, int64_t at)
{
    int K = x->K, changed;
    struct fit_node *nd = node_at(x, at);
    double was[FIT_KINDS_MAX], *least_per = least_per_of(x, at);
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
static void select_nth(int32_t *a, int64_t lo, int64_t hi, int64_t nth, const int32_t *rows,
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
                int32_t t = a[i];
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
    struct fit_node *nd = node_at(x, at);
    int32_t *least = least_of(x, at), most[FIT_KINDS_MAX];
    double *least_per = least_per_of(x, at);
    *nd = (struct fit_node){.lo = (int32_t)lo, .hi = (int32_t)hi, .first = INT32_MAX,
                            .last = -1, .cap = 0};
    for (int k = 0; k < K; k++)
        least[k] = INT32_MAX, most[k] = 0, least_per[k] = INFINITY;
    for (int64_t i = lo; i < hi; i++) {
        int32_t e = x->order[i];
        const int32_t *row = rows + (int64_t)e * (K + 1);
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
    node_at(x, at)->right = (int32_t)x->n_node;
    build(x, rows, mid, hi);
    node_combine(x, at);
}

fit_index_t *fit_index_make(const int32_t *rows, int64_t n, int K)
{
    if (K < 1 || K > FIT_KINDS_MAX || n < 0 || n >= INT32_MAX / 2)
        return NULL; /* nodes number under 2n: their indices are int32 */
    fit_index_t *x = calloc(1, sizeof *x);
    if (x == NULL)
        return NULL;
    int64_t nodes = nodes_for(n);
    size_t m = n > 0 ? (size_t)n : 1;
    x->K = K;
    x->n = n;
    x->stride = (sizeof(struct fit_node) + (size_t)K * (sizeof(double) + sizeof(int32_t)) + 7) /
                8 * 8;
    x->order = malloc(m * sizeof *x->order);
    x->nodes = malloc((size_t)nodes * x->stride);
    x->rows = malloc(m * (size_t)(K + 1) * sizeof *x->rows);
    x->where = malloc(m * sizeof *x->where);
    if (x->order == NULL || x->nodes == NULL || x->rows == NULL || x->where == NULL) {
        fit_index_free(x);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        x->order[i] = (int32_t)i;
    build(x, rows, 0, n);
    for (int64_t i = 0; i < n; i++) {
        memcpy(x->rows + i * (K + 1), rows + (int64_t)x->order[i] * (K + 1),
               (size_t)(K + 1) * sizeof *rows);
        x->where[x->order[i]] = (int32_t)i;
    }
    return x;
}

void fit_index_free(fit_index_t *x)
{
    if (x == NULL)
        return;
    free(x->order);
    free(x->nodes);
    free(x->rows);
    free(x->where);
    free(x);
}

void fit_index_lower(fit_index_t *x, int64_t i, int32_t cap)
{
    int64_t at = x->where[i], path[FIT_DEPTH_MAX], depth = 0;
    int32_t *row = x->rows + at * (x->K + 1);
    if (cap >= row[0])
        return;
    row[0] = cap;
    for (int64_t nd = 0;; nd = at < node_at(x, nd + 1)->hi ? nd + 1 : node_at(x, nd)->right) {
        path[depth++] = nd;
        if (node_at(x, nd)->right == 0)
            break;
    }
    while (depth > 0 && node_refresh(x, path[--depth])) /* up while they change */
        ;
}

static int by_index(const void *a, const void *b)
{
    int64_t p = *(const int64_t *)a, q = *(const int64_t *)b;
    return (p > q) - (p < q);
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
        const struct fit_node *nd = node_at(x, at);
        /* every entry below takes as many replicas as the most capacity below asks for, or
           more, and each as many GPUs of each kind as the fewest below, or more */
        if (nd->last < from || nd->first >= to || nd->cap < 1 ||
            !replicas_fit(least_of(x, at), K, left, replicas_for(need, nd->cap), most) ||
            !per_batch_fit(least_per_of(x, at), K, left, need))
            continue;
        if (nd->right == 0) {
            for (int64_t i = nd->lo; i < nd->hi; i++) {
                int64_t e = x->order[i];
                const int32_t *row = x->rows + i * (K + 1);
                if (e >= from && e < to && row[0] >= 1 &&
                    replicas_fit(row + 1, K, left, replicas_for(need, row[0]), most))
                    out[m++] = e;
            }
            continue;
        }
        stack[depth++] = nd->right;
        stack[depth++] = at + 1;
    }
    qsort(out, (size_t)m, sizeof *out, by_index); /* found in the tree's order */
    return m;
}
