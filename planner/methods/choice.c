/* Plans no more complex than they are worth (choice.h). */
#include "choice.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arena_fit.h"
#include "sim.h"

static int blocks_in(const struct model *m, int first, int last)
{
    int n = 0;
    for (int l = first; l <= last; l++)
        n += model_layer_kind(m, l) == MODEL_LAYER_BLOCK;
    return n;
}

/* Blocks of stage s, holding layers first..last, away from its share in the default split. */
static int stage_off(const struct model *m, int n_layers, int n_stages, int s, int first,
                     int last)
{
    int a, b;
    cluster_default_split(m, n_layers, n_stages, s, &a, &b);
    int d = blocks_in(m, first, last) - blocks_in(m, a, b);
    return d < 0 ? -d : d;
}

int choice_imbalance(const struct model *m, int n_layers, int n_stages, const int *first)
{
    int off = 0;
    for (int s = 0; s < n_stages; s++)
        off += stage_off(m, n_layers, n_stages, s, first[s],
                         s + 1 < n_stages ? first[s + 1] - 1 : n_layers - 1);
    return off;
}

void choice_key_of(const struct plan *p, const struct plan_options *o, struct choice_key *k)
{
    int n_layers = p->stages[p->n_stages - 1].last + 1;
    *k = (struct choice_key){0};
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        k->host_optimizer += st->optimizer == COST_PLACE_HOST;
        k->split_optimizer += st->optimizer == COST_PLACE_HOST && st->optimizer_from > 0;
        for (int l = 0; l < plan_stage_layer_count(st); l++) {
            k->actions += layer_action_offloads(&st->actions[l]) ||
                          st->actions[l].choice >= COST_OPTION;
            k->recomputed += st->actions[l].choice != COST_KEEP;
        }
        k->imbalance += stage_off(&p->model, n_layers, p->n_stages, s, st->first, st->last);
    }
}

int choice_key_cmp(const struct choice_key *a, const struct choice_key *b)
{
    const int x[] = {a->host_optimizer, a->split_optimizer, a->actions, a->recomputed,
                     a->imbalance};
    const int y[] = {b->host_optimizer, b->split_optimizer, b->actions, b->recomputed,
                     b->imbalance};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
        if (x[i] != y[i])
            return x[i] < y[i] ? -1 : 1;
    return 0;
}

double choice_cap(double fastest_ms, double min_gain)
{
    return fastest_ms * (1 + min_gain) + CHOICE_NOISE * (1 + fabs(fastest_ms));
}

int choice_stage_fits(const struct plan *p, int s, const struct plan_options *o, int *fits,
                      struct err *e)
{
    const struct plan_stage *st = &p->stages[s];
    struct stage_cost c;
    plan_stage_cost(p, st, &c);
    *fits = c.host_memory_bytes <= st->host_limit_bytes;
    if (o->arena != NULL)
        return *fits ? arena_stage_fits(p, s, o->arena, fits, e) : ERR_OK;
    *fits = *fits && c.memory_bytes <= st->memory_limit_bytes;
    return ERR_OK;
}

/* Where stage s's layers start in a snapshot of p's split. */
static int stage_at(const struct plan *p, int s)
{
    return p->stages[s].first - p->stages[0].first;
}

/* Stage s's choices from p into c. */
static void copy_stage(struct choice_snapshot *c, const struct plan *p, int s)
{
    const struct plan_stage *st = &p->stages[s];
    int n = plan_stage_layer_count(st), at = stage_at(p, s);
    memcpy(c->actions + at, st->actions, (size_t)n * sizeof *st->actions);
    c->optimizer[s] = (unsigned char)st->optimizer;
    c->optimizer_from[s] = st->optimizer_from;
}

/* p's choices alone (every stage taken to fit; no step). */
static int copy_choices(const struct plan *p, struct choice_snapshot *c, struct err *e)
{
    int L = 0, S = p->n_stages;
    for (int s = 0; s < S; s++)
        L += plan_stage_layer_count(&p->stages[s]);
    *c = (struct choice_snapshot){S, L, calloc((size_t)L + 1, sizeof *c->actions),
                                  malloc((size_t)S), malloc((size_t)S),
                                  malloc((size_t)S * sizeof(int)), INFINITY};
    if (!c->actions || !c->optimizer || !c->fits || !c->optimizer_from) {
        choice_free(c);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    for (int s = 0; s < S; s++)
        copy_stage(c, p, s);
    memset(c->fits, 1, (size_t)S);
    return ERR_OK;
}

int choice_save(const struct plan *p, const struct plan_options *o, struct choice_snapshot *c,
                struct err *e)
{
    int all = 1;
    if (copy_choices(p, c, e))
        return e->code;
    for (int s = 0; s < p->n_stages && o != NULL; s++) {
        int fits;
        if (choice_stage_fits(p, s, o, &fits, e)) {
            choice_free(c);
            return e->code;
        }
        c->fits[s] = (unsigned char)fits;
        all = all && fits;
    }
    if (all && sim_plan_ms(p, &c->ms, e)) {
        choice_free(c);
        return e->code;
    }
    return ERR_OK;
}

void choice_restore_stage(struct plan *p, const struct choice_snapshot *c, int s)
{
    struct plan_stage *st = &p->stages[s];
    int n = plan_stage_layer_count(st), at = stage_at(p, s);
    memcpy(st->actions, c->actions + at, (size_t)n * sizeof *st->actions);
    st->optimizer = (enum cost_place)c->optimizer[s];
    st->optimizer_from = c->optimizer_from[s];
}

void choice_restore(struct plan *p, const struct choice_snapshot *c)
{
    for (int s = 0; s < p->n_stages; s++)
        choice_restore_stage(p, c, s);
}

void choice_free(struct choice_snapshot *c)
{
    free(c->actions);
    free(c->optimizer);
    free(c->fits);
    free(c->optimizer_from);
    memset(c, 0, sizeof *c);
}

/* Stage s of p and of snapshot c hold the same choices. */
static int stage_same(const struct plan *p, const struct choice_snapshot *c, int s)
{
    const struct plan_stage *st = &p->stages[s];
    int n = plan_stage_layer_count(st), at = stage_at(p, s);
    if (st->optimizer != (enum cost_place)c->optimizer[s] ||
        st->optimizer_from != c->optimizer_from[s])
        return 0;
    for (int l = 0; l < n; l++)
        if (!layer_action_equal(&st->actions[l], &c->actions[at + l]))
            return 0;
    return 1;
}

/* The stages of stage s's GPU (its chunks, schedule.h), whose memory is one; returns their
 * count, 0 where s is not the GPU's first chunk (the GPU is tried from that one). */
static int gpu_group(const struct plan *p, int s, int group[SCHEDULE_CHUNKS_MAX])
{
    int n = plan_gpu_stages(p, p->stages[s].gpu, group);
    return group[0] == s ? n : 0;
}

/* Stage s's GPU (all its chunks) takes alternative a's choices where they fit and make the
 * plan simpler within the cap (*taken, *key updated, `now` too); otherwise it keeps now's. */
static int try_stage(struct plan *p, const struct plan_options *o, const struct choice_snapshot *a,
                     struct choice_snapshot *now, int s, double cap, struct choice_key *key,
                     int *taken, struct err *e)
{
    struct choice_key k;
    int group[SCHEDULE_CHUNKS_MAX], n = gpu_group(p, s, group), same = 1;
    double ms;
    *taken = 0;
    for (int i = 0; i < n; i++) {
        if (!a->fits[group[i]])
            return ERR_OK;
        same = same && stage_same(p, a, group[i]);
    }
    if (n == 0 || same)
        return ERR_OK;
    for (int i = 0; i < n; i++)
        choice_restore_stage(p, a, group[i]);
    choice_key_of(p, o, &k);
    if (choice_key_cmp(&k, key) < 0) {
        if (sim_plan_ms(p, &ms, e))
            return e->code;
        *taken = ms <= cap;
    }
    for (int i = 0; i < n; i++) {
        if (*taken)
            copy_stage(now, p, group[i]);
        else
            choice_restore_stage(p, now, group[i]);
    }
    if (*taken)
        *key = k;
    return ERR_OK;
}

int choice_simplify(struct plan *p, const struct plan_options *o,
                    const struct choice_snapshot *const *alts, int n_alts, double cap,
                    struct err *e)
{
    struct choice_key key, k;
    struct choice_snapshot now;
    double ms;
    if (copy_choices(p, &now, e))
        return e->code;
    if (sim_plan_ms(p, &ms, e)) {
        choice_free(&now);
        return e->code;
    }
    choice_key_of(p, o, &key);
    /* whole plans first (one may differ in every stage): the simplest within the cap, ties
     * by the shorter step, and any within it where p is not */
    for (int i = 0; i < n_alts; i++) {
        if (!(alts[i]->ms <= cap))
            continue;
        choice_restore(p, alts[i]);
        choice_key_of(p, o, &k);
        int c = choice_key_cmp(&k, &key);
        if (!(ms <= cap) || c < 0 || (c == 0 && alts[i]->ms < ms)) {
            key = k;
            ms = alts[i]->ms;
            for (int s = 0; s < p->n_stages; s++)
                copy_stage(&now, p, s);
        } else {
            choice_restore(p, &now);
        }
    }
    int rc = ERR_OK;
    for (int changed = 1; changed && rc == ERR_OK;) { /* each change makes the key smaller */
        changed = 0;
        for (int s = 0; s < p->n_stages && rc == ERR_OK; s++)
            for (int i = 0; i < n_alts && rc == ERR_OK; i++) {
                int taken;
                rc = try_stage(p, o, alts[i], &now, s, cap, &key, &taken, e);
                changed |= taken;
            }
    }
    if (rc)
        choice_restore(p, &now);
    choice_free(&now);
    return rc;
}
