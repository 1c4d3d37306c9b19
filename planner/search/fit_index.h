/* Which of many pipeline shapes a GPU budget could take (pool_mixed.c's seconds). Each entry
 * is a row of 1 + K whole numbers: its capacity c (micro-batches a replica could take), then
 * the GPUs n_k of each of K kinds a replica needs. Entry i fits `left` GPUs per kind for
 * `need` micro-batches within `most` replicas when c >= 1 and the r = max(1, ceil(need / c))
 * replicas that take need at c number at most `most` and fit: r n_k <= left_k for every k. A
 * k-d tree over the rows finds those without reading the entries of subtrees that need more
 * of some kind than is left for the replicas their best capacity asks for, or whose fewest
 * GPUs of some kind per micro-batch of capacity (n_k / c), times need, are more than is left:
 * for a first group that holds most of one kind, the menu's scan read nine entries out of ten
 * to keep one, and a test that let a fraction of a replica fit found 160 entries for each one
 * whose whole replicas fit. Both bounds follow capacities lowered (fit_index_lower): the
 * search lowers most of them before the index is made again, and with bounds from when it was
 * made the tree read 59 entries for each it kept, with them 27. */
#ifndef BALLAST_FIT_INDEX_H
#define BALLAST_FIT_INDEX_H

#include <stdint.h>

typedef struct fit_index fit_index_t;

/* An index over n rows (1 + K numbers each, n_k >= 0), kept in it. NULL: no memory. */
fit_index_t *fit_index_make(const int32_t *rows, int64_t n, int K);
void fit_index_free(fit_index_t *x);
/* Entry i's capacity lowered to cap (a cap no lower than its own is ignored), and the bounds of
 * the subtrees holding it with it. */
void fit_index_lower(fit_index_t *x, int64_t i, int32_t cap);
/* The entries i in [from, to) that fit `left` for `need` within `most` replicas (above), in
 * rising order, into out (room for to - from); their count. */
int64_t fit_index_find(fit_index_t *x, const int64_t *left, int64_t need, int64_t most,
                       int64_t from, int64_t to, int64_t *out);

#endif
