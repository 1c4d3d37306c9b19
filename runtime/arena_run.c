#include "arena_run.h"

#include <stdlib.h>
#include <string.h>

static int64_t *slot_of(const struct arena_run *a, int kind, int micro, int li, int phase)
{
    if (micro < 0 || micro >= a->micro_batches || li < 0 || li >= a->n_layers)
        return NULL;
    int64_t at = (int64_t)micro * a->n_layers + li;
    return kind == ARENA_KEPT        ? &a->kept_at[at]
           : kind == ARENA_TRANSIENT ? &a->transient_at[2 * at + (phase != 0)]
           : kind == ARENA_STAGING   ? &a->staging_at[2 * at + (phase != 0)]
                                     : NULL;
}

/* The bytes the layout gives object b, or -1 when the layout has no such object. */
static int64_t layout_bytes(const struct stage_layout *lay, const struct arena_object *b)
{
    int li = b->layer - lay->first;
    if (b->kind == ARENA_WORKSPACE)
        return lay->workspace_bytes;
    if (li < 0 || li >= lay->n_layers)
        return -1;
    return b->kind == ARENA_KEPT        ? lay->layers[li].slot_bytes
           : b->kind == ARENA_TRANSIENT ? lay->layers[li].transient_bytes
           : b->kind == ARENA_STAGING   ? lay->layers[li].offload_bytes
                                        : -1;
}

static int map_object(struct arena_run *a, const struct stage_layout *lay,
                      const struct arena_object *b, int i, const char *where, struct err *e)
{
    int64_t want = layout_bytes(lay, b);
    int64_t *at = b->kind == ARENA_WORKSPACE ? &a->workspace_at
                                             : slot_of(a, b->kind, b->micro, b->layer - lay->first,
                                                       b->phase);
    if (want != b->bytes || at == NULL || *at >= 0)
        return err_set(e, ERR_INPUT,
                       "%s.objects[%d]: %s of micro-batch %d, layer %d, %lld bytes: %s", where, i,
                       arena_kind_name(b->kind), b->micro, b->layer, (long long)b->bytes,
                       at == NULL || want < 0 ? "this stage has no such object"
                       : want != b->bytes     ? "this runtime's layout gives it another size"
                                              : "listed twice");
    *at = b->offset;
    if (b->kind == ARENA_STAGING) {
        int64_t cell = 2 * ((int64_t)b->micro * a->n_layers + (b->layer - lay->first)) + b->phase;
        a->staging_first[cell] = b->first;
        a->staging_last[cell] = b->last;
    }
    return ERR_OK;
}

/* Every object the layout has must be placed. */
static int check_complete(const struct arena_run *a, const struct stage_layout *lay,
                          const char *where, struct err *e)
{
    for (int m = 0; m < a->micro_batches; m++)
        for (int li = 0; li < a->n_layers; li++) {
            const struct layer_layout *L = &lay->layers[li];
            int64_t at = (int64_t)m * a->n_layers + li;
            int missing = (L->slot_bytes > 0 && a->kept_at[at] < 0) ? ARENA_KEPT
                          : (L->transient_bytes > 0 && (a->transient_at[2 * at] < 0 ||
                                                        a->transient_at[2 * at + 1] < 0))
                              ? ARENA_TRANSIENT
                          : (L->offload_bytes > 0 && (a->staging_at[2 * at] < 0 ||
                                                      a->staging_at[2 * at + 1] < 0))
                              ? ARENA_STAGING
                              : -1;
            if (missing >= 0)
                return err_set(e, ERR_INPUT, "%s: no %s object for micro-batch %d, layer %d",
                               where, arena_kind_name(missing), m, L->layer);
        }
    if (lay->workspace_bytes > 0 && a->workspace_at < 0)
        return err_set(e, ERR_INPUT, "%s: no workspace object", where);
    return ERR_OK;
}

int arena_run_init(struct arena_run *a, const struct arena *plan, const struct stage_layout *lay,
                   int micro_batches, int check, const char *where, struct err *e)
{
    memset(a, 0, sizeof *a);
    a->micro_batches = micro_batches;
    a->n_layers = lay->n_layers;
    a->check = check;
    a->lay = lay;
    a->bytes = plan->bytes;
    a->workspace_at = -1;
    size_t cells = (size_t)micro_batches * (size_t)lay->n_layers;
    a->kept_at = malloc(sizeof *a->kept_at * cells);
    a->transient_at = malloc(sizeof *a->transient_at * 2 * cells);
    a->staging_at = malloc(sizeof *a->staging_at * 2 * cells);
    a->staging_first = malloc(sizeof *a->staging_first * 2 * cells);
    a->staging_last = malloc(sizeof *a->staging_last * 2 * cells);
    a->slot_start = malloc(sizeof *a->slot_start * (size_t)lay->n_layers);
    a->cap_live = 16;
    a->live = malloc(sizeof *a->live * (size_t)a->cap_live);
    if (!a->kept_at || !a->transient_at || !a->staging_at || !a->staging_first ||
        !a->staging_last || !a->slot_start || !a->live) {
        arena_run_free(a);
        return err_set(e, ERR_FAIL, "out of memory mapping the arena");
    }
    for (size_t i = 0; i < cells; i++)
        a->kept_at[i] = a->transient_at[2 * i] = a->transient_at[2 * i + 1] =
            a->staging_at[2 * i] = a->staging_at[2 * i + 1] = -1;
    int64_t start = 0;
    for (int li = 0; li < lay->n_layers; li++) {
        a->slot_start[li] = start;
        start += lay->layers[li].slot_bytes;
    }
    for (int i = 0; i < plan->n; i++)
        if (map_object(a, lay, &plan->objects[i], i, where, e)) {
            arena_run_free(a);
            return e->code;
        }
    if (check_complete(a, lay, where, e) ||
        (lay->workspace_bytes > 0 &&
         arena_run_in(a, ARENA_WORKSPACE, -1, -1, 0, e))) {
        arena_run_free(a);
        return e->code;
    }
    return ERR_OK;
}

void arena_run_free(struct arena_run *a)
{
    free(a->kept_at);
    free(a->transient_at);
    free(a->staging_at);
    free(a->staging_first);
    free(a->staging_last);
    free(a->slot_start);
    free(a->live);
    memset(a, 0, sizeof *a);
}

void arena_run_view(const struct arena_run *a, const struct stage_layout *lay,
                    const struct model *m, int li, int micro, int phase, char *base,
                    char *persistent, struct layer_view *v)
{
    const struct layer_layout *L = &lay->layers[li];
    int64_t at = (int64_t)micro * a->n_layers + li;
    layout_view(lay, m, li, persistent, base, base, base + a->workspace_at, v);
    for (int k = 0; k < L->n_kept; k++)
        v->kept[k] = L->regen >> k & 1
                         ? base + a->transient_at[2 * at + (phase != 0)] + L->kept_off[k]
                     : L->offload >> k & 1
                         ? base + a->staging_at[2 * at + (phase != 0)] + L->kept_off[k]
                         : base + a->kept_at[at] + (L->kept_off[k] - a->slot_start[li]);
}

/* Where object (kind, micro, li, phase) lies: *off, *len; 0 when it has no bytes. */
static int locate(const struct arena_run *a, int kind, int micro, int li, int phase,
                  int64_t *off, int64_t *len)
{
    const int64_t *at = kind == ARENA_WORKSPACE ? &a->workspace_at
                                                : slot_of(a, kind, micro, li, phase);
    *off = at != NULL ? *at : -1;
    *len = kind == ARENA_WORKSPACE ? a->lay->workspace_bytes
           : kind == ARENA_KEPT    ? a->lay->layers[li].slot_bytes
           : kind == ARENA_STAGING ? a->lay->layers[li].offload_bytes
                                   : a->lay->layers[li].transient_bytes;
    return *off >= 0 && *len > 0;
}

static int same(const struct arena_live *l, int kind, int micro, int li, int phase)
{
    return l->kind == kind && l->micro == micro && l->li == li && l->phase == phase;
}

static int overlap_error(const struct arena_live *x, const struct arena_live *y, struct err *e)
{
    return err_set(e, ERR_FAIL,
                   "--check-arena: %s (micro-batch %d, layer index %d, phase %d) at [%lld, %lld) "
                   "comes into use while %s (micro-batch %d, layer index %d, phase %d) at "
                   "[%lld, %lld) is still in use",
                   arena_kind_name(x->kind), x->micro, x->li, x->phase, (long long)x->off,
                   (long long)(x->off + x->len), arena_kind_name(y->kind), y->micro, y->li,
                   y->phase, (long long)y->off, (long long)(y->off + y->len));
}

int arena_run_in(struct arena_run *a, int kind, int micro, int li, int phase, struct err *e)
{
    int64_t off, len;
    phase = arena_kind_phased(kind) ? phase : 0; /* only these have two */
    if (!locate(a, kind, micro, li, phase, &off, &len))
        return ERR_OK;
    struct arena_live x = {kind, micro, li, phase, off, len};
    for (int i = 0; i < a->n_live; i++) {
        const struct arena_live *y = &a->live[i];
        if (same(y, kind, micro, li, phase))
            return ERR_OK;
        if (a->check && off < y->off + y->len && y->off < off + len)
            return overlap_error(&x, y, e);
    }
    if (a->n_live == a->cap_live) {
        struct arena_live *p = realloc(a->live, sizeof *p * 2 * (size_t)a->cap_live);
        if (p == NULL)
            return err_set(e, ERR_FAIL, "out of memory tracking the arena");
        a->live = p;
        a->cap_live *= 2;
    }
    a->live[a->n_live++] = x;
    if (off + len > a->peak)
        a->peak = off + len;
    return ERR_OK;
}

void arena_run_out(struct arena_run *a, int kind, int micro, int li, int phase)
{
    phase = arena_kind_phased(kind) ? phase : 0;
    for (int i = 0; i < a->n_live; i++)
        if (same(&a->live[i], kind, micro, li, phase)) {
            a->live[i] = a->live[--a->n_live];
            return;
        }
}

int64_t arena_run_staging_at(const struct arena_run *a, int micro, int li, int phase)
{
    return a->staging_at[2 * ((int64_t)micro * a->n_layers + li) + (phase != 0)];
}

void arena_run_staging_ticks(const struct arena_run *a, int micro, int li, int phase, int *first,
                             int *last)
{
    int64_t cell = 2 * ((int64_t)micro * a->n_layers + li) + (phase != 0);
    *first = a->staging_first[cell];
    *last = a->staging_last[cell];
}
