/* A plan laid out from its cluster before any method chooses (plan_layout.h): its stages,
 * their layers, limits and loads under the schedule, the profiles' assumptions; and the
 * cluster in a search's arrangement. Below dispatch.c and the frameworks' plans (plan_for.c)
 * that use it. */
#include "plan_layout.h"

#include <stdlib.h>
#include <string.h>

#include "framework.h"
#include "model_ops.h"
#include "schedule.h"
#include "sizes.h"

/* Load M_s / limit_s with nothing recomputed; ties go to the earlier stage. */
static int most_loaded(const struct plan *p)
{
    int star = 0;
    for (int s = 1; s < p->n_stages; s++) {
        const struct plan_stage *a = &p->stages[s], *b = &p->stages[star];
        if ((__int128)a->memory_before_bytes * b->memory_limit_bytes >
            (__int128)b->memory_before_bytes * a->memory_limit_bytes)
            star = s;
    }
    return star;
}

/* The link from virtual stage s to s + 1: none on one GPU (a V's turn), the cluster's between
 * neighbouring GPUs either way, its default link for interleaved's wrap from the last GPU to
 * the first. */
static struct link chunk_link(const struct cluster *c, const struct schedule_shape *sh, int s)
{
    int chunk, a = schedule_gpu(sh, s, &chunk), b = schedule_gpu(sh, s + 1, &chunk);
    if (a == b)
        return (struct link){0};
    if (b == a + 1 || b == a - 1)
        return cluster_link(c, a < b ? a : b);
    return c->link;
}

/* A split schedule applies each layer's weight pass (cost.h): the profile's, or for a block of
 * a model Ballast knows, the size functions' bytes and the FLOPs' share of its backward time;
 * a schedule that runs the backward whole applies none. */
static void apply_split(const struct model *m, int first, int n, int splits, int tp,
                        struct layer_cost *layers)
{
    for (int l = 0; l < n; l++) {
        struct layer_cost *c = &layers[l];
        c->wgrad_bytes = splits ? c->split_bytes : 0;
        c->wgrad_ms = splits ? c->split_ms : 0;
        enum model_layer_kind kind = model_layer_kind(m, first + l);
        const struct model_ops *ops = model_ops_of(m);
        if (splits && c->split_bytes == 0 && c->split_ms == 0 && ops != NULL &&
            kind == MODEL_LAYER_BLOCK) {
            c->wgrad_bytes = (sizes_wgrad_bytes(m, kind) + tp - 1) / tp; /* each GPU's share */
            c->wgrad_ms = c->bwd_ms * ops->wgrad_share(m, first + l);
        }
    }
}

/* Stage s (on GPU g of the cluster) as the cluster gives it, nothing recomputed yet. */
static void dispatch_stage_layout(const struct cluster *c, const struct schedule_shape *sh,
                                  struct plan *p, int s, int in_flight)
{
    struct plan_stage *st = &p->stages[s];
    int chunk, g = schedule_gpu(sh, s, &chunk), n = plan_stage_layer_count(st);
    const struct profile *prof = cluster_stage_profile(c, g);
    st->gpu = g;
    snprintf(st->device, sizeof st->device, "%s", c->stages[g].device);
    snprintf(st->device_kind, sizeof st->device_kind, "%s", prof->device.kind);
    memcpy(st->layers, prof->layers + st->first, (size_t)n * sizeof *st->layers);
    apply_split(&c->model, st->first, n, schedule_splits(sh->kind), c->stages[g].tp,
                st->layers);
    st->in_flight = in_flight;
    st->capacity_bytes = c->stages[g].memory_bytes;
    st->memory_limit_bytes = st->capacity_bytes;
    if (s + 1 < p->n_stages)
        st->link = sh->chunks > 1 ? chunk_link(c, sh, s) : cluster_link(c, s);
    st->host_limit_bytes = c->stages[g].host_memory_bytes;
    st->host_link = c->stages[g].host_link;
    st->tp = c->stages[g].tp;
    st->dp = c->stages[g].dp;
    st->shard_optimizer = c->shard_optimizer && st->dp > 1; /* its layer costs divide it */
    if (c->grad_bytes != NULL) {
        st->dp_link = c->stages[g].dp_link;
        st->allreduce_bytes = cluster_grad_bytes(c, g, st->first, st->last);
        st->dp_bucket_bytes = c->dp_bucket_bytes;
    }
}

/* The cluster's pipeline under its schedule: its GPUs, each holding the schedule's chunks. */
static struct schedule_shape cluster_shape(const struct cluster *c)
{
    int v = schedule_fixed_chunks(c->schedule, c->virtual_stages > 0 ? c->virtual_stages : 2);
    return schedule_shape_of(c->schedule, c->n_stages, v, c->micro_batches);
}

/* Virtual stage s's layers when each GPU holds several chunks: GPU g's stage in the cluster
 * has n_g layers (its "layers", else the even split), and its chunk c takes
 * floor((c+1) n_g / v) - floor(c n_g / v) of them, the virtual stages tiling the model in
 * order; so a split that balances the GPUs (by hand, or --repartition's) stays balanced.
 * ERR_INPUT when a GPU has fewer layers than chunks. */
static int chunk_split(const struct cluster *c, const struct schedule_shape *sh, int *first,
                       int *last, struct err *e)
{
    int S = schedule_virtual_stages(sh), next = 0;
    for (int s = 0; s < S; s++) {
        int chunk, g = schedule_gpu(sh, s, &chunk), v = sh->chunks;
        int n = c->stages[g].last - c->stages[g].first + 1;
        if (n < v)
            return err_set(e, ERR_INPUT, "schedule %s: stages[%d] has %d layer%s for its %d "
                           "model chunks (one each at least)", schedule_name(sh->kind), g, n,
                           n == 1 ? "" : "s", v);
        first[s] = next;
        next += (int)((int64_t)(chunk + 1) * n / v - (int64_t)chunk * n / v);
        last[s] = next - 1;
    }
    return ERR_OK;
}

/* What the stages' profiles assume (framework.h fw_profile_assumptions): "mixed" activations
 * when they differ. */
static void plan_assumptions(const struct cluster *c, struct plan *p)
{
    for (int s = 0; s < c->n_stages; s++) {
        char acts[PLAN_FRAMEWORK_MAX];
        enum model_attention att;
        fw_profile_assumptions(cluster_stage_profile(c, s), acts, &att);
        if (s == 0) {
            snprintf(p->framework.activations, sizeof p->framework.activations, "%s", acts);
            p->framework.attention = att;
        } else if (!fw_activations_alike(acts, p->framework.activations) ||
                   att != p->framework.attention) {
            snprintf(p->framework.activations, sizeof p->framework.activations, "mixed");
        }
    }
}

int plan_layout(const struct cluster *c, const struct plan_options *o, struct plan *out,
                struct err *e)
{
    struct schedule_shape sh = cluster_shape(c);
    int S = schedule_virtual_stages(&sh);
    int *first = malloc((size_t)S * sizeof *first), *last = malloc((size_t)S * sizeof *last),
        *flights = malloc((size_t)S * sizeof *flights);
    int rc = first && last && flights ? ERR_OK : err_set(e, ERR_FAIL, "out of memory");
    if (rc == ERR_OK && sh.chunks > 1)
        rc = chunk_split(c, &sh, first, last, e);
    for (int s = 0; s < S && rc == ERR_OK && sh.chunks == 1; s++) {
        first[s] = c->stages[s].first;
        last[s] = c->stages[s].last;
    }
    if (rc == ERR_OK)
        rc = schedule_in_flights(&sh, flights, e);
    if (rc == ERR_OK)
        rc = plan_init(out, S, first, last, e);
    free(first);
    free(last);
    if (rc) {
        free(flights);
        return rc;
    }
    char name[PLAN_METHOD_MAX];
    snprintf(out->method, sizeof out->method, "%s", plan_method_name(o, name));
    out->schedule = c->schedule;
    out->virtual_stages = sh.chunks;
    out->micro_batches = c->micro_batches;
    out->reserve_bytes = c->reserve_bytes;
    out->unit_bytes = o->unit_bytes;
    out->model = c->model;
    for (int s = 0; s < S; s++)
        dispatch_stage_layout(c, &sh, out, s, flights[s]);
    free(flights);
    for (int s = 0; s < S; s++) { /* a GPU's chunks count together: once all are laid out */
        struct stage_cost before;
        plan_stage_cost(out, &out->stages[s], &before);
        out->stages[s].memory_before_bytes = before.memory_bytes;
    }
    out->most_loaded_stage = most_loaded(out);
    plan_assumptions(c, out);
    return ERR_OK;
}

int arranged_cluster(const struct cluster *c, const struct arrangement *a, struct cluster *out,
                     struct err *e)
{
    *out = *c;
    out->stages = calloc((size_t)a->n_stages, sizeof *out->stages);
    if (out->stages == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int k = 0; k < a->n_stages; k++) {
        out->stages[k] = c->stages[a->stage[k]];
        out->stages[k].first = a->first[k];
        out->stages[k].last = k + 1 < a->n_stages ? a->first[k + 1] - 1 : c->n_layers - 1;
        out->stages[k].link = k + 1 < a->n_stages ? a->link[k] : (struct link){0};
    }
    out->link = (struct link){0};
    return ERR_OK;
}
