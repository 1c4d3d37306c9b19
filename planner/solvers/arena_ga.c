/* The published memory-reuse search (docs/cost-model.md, "The activation arena"), on a
 * stage's arena objects.
 *
 * Merged first: two accesses of one object whose lifetimes are adjacent become one item, and
 * small objects live over exactly the same ticks become one item (each keeps its place inside
 * it). Items sorted by size; the largest define segments: an item opens a new segment when it
 * fits in none of the segments so far (first fit, lowest offset, among the segment's items
 * live at the same time), and that first-fit assignment is the first plan of the population;
 * the others are random assignments of every item but the leaders to a segment as wide as it.
 * A plan decodes into offsets: segments stacked in order, each as tall as its leader or, when
 * its items do not fit, taller; items placed first fit inside their segment, largest first.
 * Fitness: the bytes above the device cap (they must migrate to host memory), then the arena.
 * Crossover (between two tournament winners) gives the child the second parent's choice for
 * the items either assigns to one random segment; mutation swaps two items of different
 * segments, only if each fits the other's segment (is no larger than its leader: the swap
 * alone may still push a segment up when their lifetimes crowd it, which the fitness then
 * says), with a probability growing from 0.1 to 0.6
 * over the generations. The best plan survives each generation. It stops after
 * `generations`, `time_limit_s`, or `stall` generations without a better plan; seeded, so
 * deterministic when the time limit does not stop it. The result is never worse than the
 * greedy layout (arena_plan.h), which it starts from: when the search finds nothing better, the
 * greedy offsets stand. */
#include <stdlib.h>
#include <string.h>

#include "arena_plan.h"

struct item {
    int64_t bytes;
    int first, last;
    int n_members, member0; /* members[member0 ..] */
};

struct ga {
    const struct arena_problem *pb;
    struct item *items; /* sorted largest first */
    int n_items, n_seg;
    int *members;       /* object indices */
    int64_t *member_at; /* offset inside its item */
    int *leader;        /* per segment, its item */
    int *is_leader;     /* per item */
    int64_t *width;     /* per segment */
    int64_t cap;
    uint64_t rng;
    int64_t *off;       /* decode scratch: per item */
    int64_t (*busy)[2]; /* first_fit scratch: per item */
};

static uint64_t next_rand(struct ga *g)
{
    uint64_t z = (g->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int rand_below(struct ga *g, int n)
{
    return (int)(next_rand(g) % (uint64_t)n);
}

static double rand_unit(struct ga *g)
{
    return (double)(next_rand(g) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- merging ---- */

static int same_object(const struct arena_object *a, const struct arena_object *b)
{
    return a->kind == b->kind && a->micro == b->micro && a->layer == b->layer;
}

/* The item each object joins: adjacent accesses of one object, then small objects of the
 * same lifetime. group[i] is the representative object. */
static void merge_groups(const struct arena_object *o, int n, int *group)
{
    int64_t largest = 0;
    for (int i = 0; i < n; i++) {
        group[i] = i;
        if (o[i].bytes > largest)
            largest = o[i].bytes;
    }
    int64_t small = largest / 16;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i && group[i] == i; j++) {
            if (group[j] != j)
                continue;
            int adjacent = same_object(&o[i], &o[j]) &&
                           (o[i].last + 1 == o[j].first || o[j].last + 1 == o[i].first);
            int together = o[i].first == o[j].first && o[i].last == o[j].last &&
                           o[i].bytes <= small && o[j].bytes <= small;
            if (adjacent || together)
                group[i] = j;
        }
}

static int item_by_size(const void *pa, const void *pb)
{
    const struct item *a = pa, *b = pb;
    if (a->bytes != b->bytes)
        return a->bytes > b->bytes ? -1 : 1;
    if (a->first != b->first)
        return a->first < b->first ? -1 : 1;
    return a->member0 - b->member0;
}

/* Builds the items from the groups: members listed item by item. */
static int build_items(struct ga *g, const int *group)
{
    const struct arena_object *o = g->pb->o;
    int n = g->pb->n;
    g->items = calloc((size_t)n + 1, sizeof *g->items);
    g->members = malloc(sizeof *g->members * ((size_t)n + 1));
    g->member_at = malloc(sizeof *g->member_at * ((size_t)n + 1));
    if (!g->items || !g->members || !g->member_at)
        return -1;
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (group[i] != i)
            continue;
        struct item *it = &g->items[g->n_items++];
        it->member0 = k;
        it->first = o[i].first;
        it->last = o[i].last;
        for (int j = i; j < n; j++) {
            if (group[j] != i)
                continue;
            int adjacent = same_object(&o[i], &o[j]) && j != i;
            g->members[k] = j;
            g->member_at[k++] = adjacent ? 0 : it->bytes;
            if (adjacent) {
                it->bytes = it->bytes > o[j].bytes ? it->bytes : o[j].bytes;
                it->first = it->first < o[j].first ? it->first : o[j].first;
                it->last = it->last > o[j].last ? it->last : o[j].last;
            } else {
                it->bytes += o[j].bytes;
            }
            it->n_members++;
        }
    }
    qsort(g->items, (size_t)g->n_items, sizeof *g->items, item_by_size);
    return 0;
}

/* ---- decoding ---- */

static int items_meet(const struct item *a, const struct item *b)
{
    return a->first <= b->last && b->first <= a->last;
}

static int cmp_busy(const void *pa, const void *pb)
{
    const int64_t *a = pa, *b = pb;
    return (a[0] > b[0]) - (a[0] < b[0]);
}

/* Lowest offset for item i among the placed items of `seg` (placed: off >= 0). */
static int64_t first_fit(const struct ga *g, const int *seg, int k, int i)
{
    int nb = 0;
    for (int j = 0; j < g->n_items; j++)
        if (j != i && seg[j] == k && g->off[j] >= 0 && items_meet(&g->items[i], &g->items[j])) {
            g->busy[nb][0] = g->off[j];
            g->busy[nb++][1] = g->off[j] + g->items[j].bytes;
        }
    qsort(g->busy, (size_t)nb, sizeof *g->busy, cmp_busy);
    int64_t at = 0;
    for (int b = 0; b < nb && g->busy[b][0] < at + g->items[i].bytes; b++)
        if (g->busy[b][1] > at)
            at = g->busy[b][1];
    return at;
}

struct fitness {
    int64_t host, arena;
};

static int ga_better(struct fitness a, struct fitness b)
{
    return a.host != b.host ? a.host < b.host : a.arena < b.arena;
}

/* Offsets of every item (g->off, absolute) for assignment `seg`; the plan's fitness. */
static struct fitness ga_decode(struct ga *g, const int *seg)
{
    int64_t base = 0, host = 0;
    for (int i = 0; i < g->n_items; i++)
        g->off[i] = -1;
    for (int k = 0; k < g->n_seg; k++) {
        int64_t height = g->width[k];
        for (int i = 0; i < g->n_items; i++) /* largest first: the items are sorted */
            if (seg[i] == k) {
                g->off[i] = first_fit(g, seg, k, i);
                if (g->off[i] + g->items[i].bytes > height)
                    height = g->off[i] + g->items[i].bytes;
            }
        for (int i = 0; i < g->n_items; i++)
            if (seg[i] == k) {
                g->off[i] += base;
                if (g->cap > 0 && g->off[i] + g->items[i].bytes > g->cap)
                    host += g->items[i].bytes;
            }
        base += height;
    }
    return (struct fitness){host, base};
}

/* The first plan: each item into the first segment where it fits, else a segment of its own. */
static int segment(struct ga *g, int *seg)
{
    g->leader = malloc(sizeof *g->leader * ((size_t)g->n_items + 1));
    g->width = malloc(sizeof *g->width * ((size_t)g->n_items + 1));
    g->is_leader = calloc((size_t)g->n_items + 1, sizeof *g->is_leader);
    if (!g->leader || !g->width || !g->is_leader)
        return -1;
    for (int i = 0; i < g->n_items; i++) {
        g->off[i] = -1;
        seg[i] = -1;
    }
    for (int i = 0; i < g->n_items; i++) {
        for (int k = 0; k < g->n_seg && seg[i] < 0; k++) {
            int64_t at = first_fit(g, seg, k, i);
            if (at + g->items[i].bytes <= g->width[k]) {
                seg[i] = k;
                g->off[i] = at;
            }
        }
        if (seg[i] < 0) {
            g->leader[g->n_seg] = i;
            g->width[g->n_seg] = g->items[i].bytes;
            g->is_leader[i] = 1;
            seg[i] = g->n_seg++;
            g->off[i] = 0;
        }
    }
    return 0;
}

/* ---- the search ---- */

static void random_plan(struct ga *g, const int *first, int *seg)
{
    for (int i = 0; i < g->n_items; i++) {
        seg[i] = first[i];
        if (g->is_leader[i])
            continue;
        int k = rand_below(g, g->n_seg);
        if (g->items[i].bytes <= g->width[k])
            seg[i] = k;
    }
}

static void crossover(struct ga *g, const int *a, const int *b, int *child)
{
    int k = rand_below(g, g->n_seg);
    for (int i = 0; i < g->n_items; i++)
        child[i] = !g->is_leader[i] && (a[i] == k || b[i] == k) ? b[i] : a[i];
}

static void mutate(struct ga *g, int *seg)
{
    int i = rand_below(g, g->n_items), j = rand_below(g, g->n_items);
    if (g->is_leader[i] || g->is_leader[j] || seg[i] == seg[j])
        return;
    if (g->items[i].bytes <= g->width[seg[j]] && g->items[j].bytes <= g->width[seg[i]]) {
        int t = seg[i];
        seg[i] = seg[j];
        seg[j] = t;
    }
}

static int tournament(struct ga *g, const struct fitness *fit, int pop)
{
    int a = rand_below(g, pop), b = rand_below(g, pop);
    return ga_better(fit[b], fit[a]) ? b : a;
}

/* Evolves the population from `first`; the best plan into `best`. */
static long evolve(struct ga *g, const struct arena_options *opt, const int *first, int *best,
                   double deadline_ms)
{
    int P = opt->population > 2 ? opt->population : 2, N = g->n_items;
    int *pop = malloc(sizeof *pop * (size_t)P * (size_t)N + 1);
    int *next = malloc(sizeof *next * (size_t)P * (size_t)N + 1);
    struct fitness *fit = malloc(sizeof *fit * (size_t)P), *nfit = malloc(sizeof *nfit * (size_t)P);
    long gen = 0;
    memcpy(best, first, sizeof *best * (size_t)N);
    if (!pop || !next || !fit || !nfit)
        goto done;
    memcpy(pop, first, sizeof *pop * (size_t)N);
    for (int p = 1; p < P; p++)
        random_plan(g, first, &pop[(size_t)p * N]);
    int top = 0;
    for (int p = 0; p < P; p++) {
        fit[p] = ga_decode(g, &pop[(size_t)p * N]);
        if (ga_better(fit[p], fit[top]))
            top = p;
    }
    for (int stall = 0; gen < opt->generations && stall < opt->stall; gen++) {
        if (arena_clock_ms() > deadline_ms)
            break;
        double pm = 0.1 + 0.5 * (double)gen / (double)opt->generations;
        memcpy(next, &pop[(size_t)top * N], sizeof *pop * (size_t)N);
        nfit[0] = fit[top];
        int ntop = 0;
        for (int p = 1; p < P; p++) {
            int *child = &next[(size_t)p * N];
            crossover(g, &pop[(size_t)tournament(g, fit, P) * N],
                      &pop[(size_t)tournament(g, fit, P) * N], child);
            if (rand_unit(g) < pm)
                mutate(g, child);
            nfit[p] = ga_decode(g, child);
            if (ga_better(nfit[p], nfit[ntop]))
                ntop = p;
        }
        stall = ga_better(nfit[ntop], fit[top]) ? 0 : stall + 1;
        int *t = pop;
        pop = next;
        next = t;
        struct fitness *tf = fit;
        fit = nfit;
        nfit = tf;
        top = ntop;
    }
    memcpy(best, &pop[(size_t)top * N], sizeof *best * (size_t)N);
done:
    free(pop);
    free(next);
    free(fit);
    free(nfit);
    return gen;
}

static void free_ga(struct ga *g)
{
    free(g->items);
    free(g->members);
    free(g->member_at);
    free(g->leader);
    free(g->is_leader);
    free(g->width);
    free(g->off);
    free(g->busy);
}

int arena_ga(struct arena_problem *pb, const struct arena_options *opt, struct arena_result *r,
             struct err *e)
{
    double deadline = opt->time_limit_s > 0 ? arena_clock_ms() + 1e3 * opt->time_limit_s : 1e300;
    ERR_TRY(arena_greedy(pb, opt, r, e));
    int n = pb->n;
    struct fitness greedy = {arena_above_cap(pb->o, n, opt->cap_bytes), arena_extent(pb->o, n)};
    struct ga g = {.pb = pb, .cap = opt->cap_bytes, .rng = opt->seed};
    int *group = malloc(sizeof *group * ((size_t)n + 1));
    int *first = malloc(sizeof *first * ((size_t)n + 1));
    int *best = malloc(sizeof *best * ((size_t)n + 1));
    g.off = malloc(sizeof *g.off * ((size_t)n + 1));
    g.busy = malloc(sizeof *g.busy * ((size_t)n + 1));
    int rc = ERR_OK;
    if (!group || !first || !best || !g.off || !g.busy)
        rc = err_set(e, ERR_FAIL, "out of memory searching %d objects", n);
    if (rc == ERR_OK) {
        merge_groups(pb->o, n, group);
        if (build_items(&g, group) || segment(&g, first))
            rc = err_set(e, ERR_FAIL, "out of memory searching %d objects", n);
    }
    if (rc == ERR_OK) {
        r->iterations = evolve(&g, opt, first, best, deadline);
        struct fitness f = ga_decode(&g, best);
        r->note = "the greedy layout stands";
        if (ga_better(f, greedy)) {
            r->note = "better than greedy";
            for (int i = 0; i < g.n_items; i++)
                for (int k = 0; k < g.items[i].n_members; k++) {
                    int m = g.items[i].member0 + k;
                    pb->o[g.members[m]].offset = g.off[i] + g.member_at[m];
                }
        }
    }
    free(group);
    free(first);
    free(best);
    free_ga(&g);
    return rc;
}
