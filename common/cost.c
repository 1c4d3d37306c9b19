#include "cost.h"

#include <stdint.h>

#include "cluster.h"
#include "model_kind.h"

int64_t cost_layer_state(const struct layer_cost *c, enum cost_place optimizer)
{
    return optimizer == COST_PLACE_HOST && c->has_split ? c->param_bytes + c->grad_bytes
                                                        : c->state_bytes;
}

static int64_t divide_up(int64_t bytes, int64_t by)
{
    return (int64_t)(((__int128)bytes + by - 1) / by);
}

int64_t cost_layer_mirror(const struct layer_cost *c)
{
    int64_t shards = c->optimizer_shards > 1 ? c->optimizer_shards : 1;
    return c->has_split ? divide_up(COST_MIRROR_SECTIONS * c->grad_bytes, shards) : 0;
}

enum cost_place cost_layer_optimizer(enum cost_place optimizer, int from, int l)
{
    return optimizer == COST_PLACE_HOST && l >= from ? COST_PLACE_HOST : COST_PLACE_DEVICE;
}

int64_t cost_stage_mirror(const struct layer_cost *layers, int n, int from)
{
    __int128 mirror = 0;
    for (int l = from > 0 ? from : 0; l < n; l++)
        mirror += cost_layer_mirror(&layers[l]);
    return cost_saturate(mirror);
}

double cost_optimizer_fraction(const struct layer_cost *layers, int n, int from)
{
    double hosted = 0, all = 0;
    for (int l = 0; l < n; l++) {
        double bytes = layers[l].has_split ? (double)layers[l].optimizer_bytes : 0;
        all += bytes;
        hosted += l >= from ? bytes : 0;
    }
    return all > 0 ? hosted / all : 0;
}

int cost_optimizer_movable(const struct layer_cost *layers, int n, int *first_missing)
{
    for (int l = 0; l < n; l++)
        if (!layers[l].has_split) {
            if (first_missing != NULL)
                *first_missing = l;
            return 0;
        }
    if (first_missing != NULL)
        *first_missing = -1;
    return 1;
}

int64_t cost_layers_for_optimizer(const struct layer_cost *in, int n,
                                  enum cost_place optimizer, struct layer_cost *out)
{
    return cost_layers_for_optimizer_from(in, n, optimizer, 0, out);
}

int64_t cost_layers_for_optimizer_from(const struct layer_cost *in, int n,
                                       enum cost_place optimizer, int from,
                                       struct layer_cost *out)
{
    for (int l = 0; l < n; l++) {
        out[l] = in[l];
        out[l].state_bytes = cost_layer_state(&in[l], cost_layer_optimizer(optimizer, from, l));
    }
    return optimizer == COST_PLACE_HOST ? cost_stage_mirror(in, n, from) : 0;
}

int cost_choice_count(const struct layer_cost *c)
{
    return COST_OPTION + c->n_options;
}

struct cost_row cost_row(const struct layer_cost *c, int choice)
{
    struct cost_row r = {.action = LAYER_ACTION_KEEP};
    r.action.choice = (unsigned char)choice;
    if (choice == COST_KEEP) {
        r.kept_bytes = c->act_bytes + c->wgrad_bytes;
        r.wgrad_ms = c->wgrad_ms;
    } else if (choice == COST_FULL) {
        r.kept_bytes = c->ckpt_bytes;
        r.transient_bytes = c->act_bytes - c->ckpt_bytes;
        r.recompute_ms = c->fwd_ms;
    } else {
        const struct recompute_option *o = &c->options[choice - COST_OPTION];
        r.kept_bytes = o->kept_bytes;
        r.transient_bytes = o->transient_bytes;
        r.recompute_ms = o->recompute_ms;
    }
    return r;
}

struct cost_row cost_action_row(const struct layer_cost *c, const struct layer_action *a)
{
    struct cost_row r = cost_row(c, a->choice);
    if (a->choice == COST_KEEP && layer_action_offloads(a)) {
        r.kept_bytes = c->act_bytes; /* what comes back lives only through the backward */
        r.wgrad_ms = 0;
    }
    if (a->place == COST_PLACE_HOST) {
        r.action.place = COST_PLACE_HOST;
        r.host_bytes = r.kept_bytes;
        r.kept_bytes = 0;
    } else if (a->offload_option >= 0 && a->choice == COST_KEEP) {
        int64_t sent = c->options[a->offload_option].transient_bytes;
        r.action.offload_option = a->offload_option;
        r.host_bytes = sent;
        r.kept_bytes = c->act_bytes - sent;
    }
    int ahead = a->prefetch_ahead > 0 ? a->prefetch_ahead : COST_PREFETCH_AHEAD;
    r.action.prefetch_ahead = r.host_bytes > 0 ? ahead : 0;
    return r;
}

int cost_whole_offload(const struct model *m, int li, int layer)
{
    return li > 0 && model_layer_kind(m, layer) != MODEL_LAYER_HEAD;
}

int cost_actions(const struct layer_cost *c, int whole_offload,
                 struct cost_row rows[COST_ACTIONS_MAX])
{
    int n = 0, choices = cost_choice_count(c);
    for (int k = 0; k < choices; k++) {
        struct layer_action a = LAYER_ACTION_KEEP;
        a.choice = (unsigned char)k;
        rows[n++] = cost_action_row(c, &a);
        a.place = COST_PLACE_HOST;
        if (whole_offload)
            rows[n++] = cost_action_row(c, &a);
    }
    for (int k = 0; k < c->n_options; k++) {
        struct layer_action a = LAYER_ACTION_KEEP;
        a.offload_option = (signed char)k;
        rows[n++] = cost_action_row(c, &a);
    }
    return n;
}

int cost_rows(const struct layer_cost *c, struct cost_row rows[COST_ROWS_MAX])
{
    int n = cost_choice_count(c);
    for (int k = 0; k < n; k++)
        rows[k] = cost_row(c, k);
    return n;
}

void cost_choice(const struct layer_cost *c, int choice, int64_t *kept, int64_t *transient,
                 double *recompute_ms)
{
    struct cost_row r = cost_row(c, choice);
    *kept = r.kept_bytes;
    *transient = r.transient_bytes;
    *recompute_ms = r.recompute_ms;
}

const char *cost_choice_name(const struct layer_cost *c, int choice)
{
    return choice == COST_KEEP   ? "keep"
           : choice == COST_FULL ? "full"
                                 : c->options[choice - COST_OPTION].name;
}

void cost_sum_add(struct cost_sum *s, int64_t state_bytes, int64_t workspace_bytes,
                  double compute_ms, const struct cost_row *row)
{
    s->state += state_bytes;
    s->kept += row->kept_bytes;
    if (row->transient_bytes > s->transient)
        s->transient = row->transient_bytes;
    if (workspace_bytes > s->workspace)
        s->workspace = workspace_bytes;
    s->compute_ms += compute_ms;
    s->recompute_ms += row->recompute_ms;
    s->host += row->host_bytes;
    if (row->host_bytes > s->host_max)
        s->host_max = row->host_bytes;
    if (row->action.prefetch_ahead > s->ahead_max)
        s->ahead_max = row->action.prefetch_ahead;
}

int64_t cost_sum_staging(const struct cost_sum *s)
{
    return cost_saturate((__int128)(s->ahead_max + 2) * s->host_max * (s->host_max > 0) +
                         (__int128)COST_STREAM_BUFFERS * s->stream_max);
}

void cost_sum_add_stream(struct cost_sum *s, const struct layer_cost *c)
{
    s->mirror += c->param_bytes;
    if (c->param_bytes + c->grad_bytes > s->stream_max)
        s->stream_max = c->param_bytes + c->grad_bytes;
}

int64_t cost_sum_host(const struct cost_sum *s, int in_flight)
{
    return cost_saturate((__int128)in_flight * s->host + s->mirror);
}

void cost_sum_add_mirror(struct cost_sum *s, int64_t mirror_bytes)
{
    s->mirror += mirror_bytes;
}

int64_t cost_sum_memory(const struct cost_sum *s, int in_flight, int64_t reserve_bytes)
{
    return cost_saturate(s->state + (__int128)in_flight * s->kept + s->transient + s->workspace +
                    cost_sum_staging(s) + reserve_bytes);
}

double cost_stage_ms(double compute_ms, double recompute_ms)
{
    return compute_ms + recompute_ms;
}

/* M, H and T of the stage with action a->actions[l] (NULL: kept) per layer, its choice
 * choices[l] instead when choices is not NULL. */
static void stage_sum(const struct layer_cost *layers, int n, const unsigned char *choices,
                      const struct cost_actions *a, int in_flight, int64_t reserve_bytes,
                      struct stage_cost *out)
{
    struct cost_sum s = {0};
    for (int l = 0; l < n; l++) {
        const struct layer_cost *c = &layers[l];
        struct layer_action act = a->actions != NULL ? a->actions[l] : LAYER_ACTION_KEEP;
        if (choices != NULL)
            act.choice = choices[l];
        struct cost_row r = cost_action_row(c, &act);
        enum cost_place o = cost_layer_optimizer(a->optimizer, a->optimizer_from, l);
        int stream = act.weights == COST_PLACE_HOST;
        cost_sum_add(&s, stream ? 0 : cost_layer_state(c, o), c->workspace_bytes,
                     c->fwd_ms + c->bwd_ms, &r);
        if (o == COST_PLACE_HOST)
            cost_sum_add_mirror(&s, cost_layer_mirror(c));
        if (stream)
            cost_sum_add_stream(&s, c);
    }
    *out = (struct stage_cost){
        .state_bytes = cost_saturate(s.state),
        .kept_bytes = cost_saturate(s.kept),
        .transient_bytes = s.transient,
        .workspace_bytes = s.workspace,
        .reserve_bytes = reserve_bytes,
        .host_bytes = cost_saturate(s.host),
        .staging_bytes = cost_sum_staging(&s),
        .host_memory_bytes = cost_sum_host(&s, in_flight),
        .in_flight = in_flight,
        .optimizer = a->optimizer,
        .memory_bytes = cost_sum_memory(&s, in_flight, reserve_bytes),
        .recompute_ms = s.recompute_ms,
        .stage_ms = cost_stage_ms(s.compute_ms, s.recompute_ms),
    };
}

void cost_stage(const struct layer_cost *layers, int n, const unsigned char *recompute,
                int in_flight, int64_t reserve_bytes, struct stage_cost *out)
{
    stage_sum(layers, n, recompute, &(struct cost_actions){0}, in_flight, reserve_bytes, out);
}

void cost_stage_actions(const struct layer_cost *layers, int n, const struct cost_actions *a,
                        int in_flight, int64_t reserve_bytes, struct stage_cost *out)
{
    stage_sum(layers, n, NULL, a, in_flight, reserve_bytes, out);
}

int64_t cost_chunks_memory(const struct stage_cost *chunks, int n, int64_t reserve_bytes)
{
    __int128 held = reserve_bytes;
    int64_t transient = 0;
    for (int k = 0; k < n; k++) {
        const struct stage_cost *c = &chunks[k];
        held += c->state_bytes + (__int128)c->in_flight * c->kept_bytes + c->workspace_bytes;
        transient = c->transient_bytes > transient ? c->transient_bytes : transient;
    }
    return cost_saturate(held + transient);
}

int64_t cost_arena_bytes(const struct stage_cost *c)
{
    return cost_saturate((__int128)c->in_flight * c->kept_bytes + c->transient_bytes +
                    c->workspace_bytes);
}

int64_t cost_memory_with_arena(const struct stage_cost *c, int64_t arena_bytes)
{
    return cost_saturate((__int128)c->state_bytes + arena_bytes + c->reserve_bytes);
}

/* in_flight[l], or `uniform` for every layer when in_flight is NULL; the largest workspace
 * of each chunk (chunk NULL: one) */
static __int128 fixed_bytes(const struct layer_cost *layers, int n, const int *in_flight,
                            const int *chunk, int uniform, int64_t reserve_bytes)
{
    __int128 fixed = reserve_bytes;
    int64_t workspace = 0;
    for (int l = 0; l < n; l++) {
        int v = in_flight != NULL ? in_flight[l] : uniform;
        if (chunk != NULL && l > 0 && chunk[l] != chunk[l - 1]) { /* the next chunk's own */
            fixed += workspace;
            workspace = 0;
        }
        fixed += layers[l].state_bytes + (__int128)v * layers[l].ckpt_bytes;
        if (layers[l].workspace_bytes > workspace)
            workspace = layers[l].workspace_bytes;
    }
    return fixed + workspace;
}

__int128 cost_fixed_bytes(const struct layer_cost *layers, int n, int in_flight,
                          int64_t reserve_bytes)
{
    return fixed_bytes(layers, n, NULL, NULL, in_flight, reserve_bytes);
}

__int128 cost_fixed_bytes_each(const struct layer_cost *layers, int n, const int *in_flight,
                               const int *chunk, int64_t reserve_bytes)
{
    return fixed_bytes(layers, n, in_flight, chunk, 0, reserve_bytes);
}

void cost_row_weights(const struct layer_cost *c, const struct cost_row *r, int in_flight,
                      __int128 *kept_bytes, int64_t *transient_bytes)
{
    *kept_bytes = (__int128)in_flight * (r->kept_bytes - c->ckpt_bytes);
    *transient_bytes = r->transient_bytes;
}

void cost_weights(const struct layer_cost *c, int choice, int in_flight, __int128 *kept_bytes,
                  int64_t *transient_bytes)
{
    struct cost_row r = cost_row(c, choice);
    cost_row_weights(c, &r, in_flight, kept_bytes, transient_bytes);
}

int64_t cost_saved_bytes(const struct layer_cost *c, int choice, int in_flight)
{
    return cost_saturate((__int128)in_flight *
                    (cost_row(c, COST_KEEP).kept_bytes - cost_row(c, choice).kept_bytes));
}

int64_t cost_tp_tensor_bytes(const struct model *m)
{
    if (model_is_custom(m))
        return 0;
    int elem = model_dtype_16bit(m->dtype) ? 2 : 4;
    return (int64_t)m->micro_batch * m->seq_len * m->n_embd * elem;
}

double cost_tp_collective_ms(const struct link *link, int tp, int64_t bytes)
{
    return tp > 1 ? (tp - 1) * link_transfer_ms(link, (bytes + tp - 1) / tp) : 0.0;
}

int cost_tp_collectives(enum model_layer_kind kind)
{
    return kind == MODEL_LAYER_BLOCK ? 4 : 1;
}

int64_t cost_grad_bytes(int64_t state_bytes, enum model_dtype dtype)
{
    return (int64_t)((__int128)state_bytes * 4 / (model_dtype_16bit(dtype) ? 18 : 16));
}

/* The optimizer's share of state_bytes by the runtime's layout (cost_group's comment). */
static int64_t optimizer_bytes(int64_t state_bytes, enum model_dtype dtype)
{
    return model_dtype_16bit(dtype) ? (int64_t)((__int128)state_bytes * 12 / 18)
                                    : state_bytes / 2;
}

double cost_dp_allreduce_ms(const struct link *link, int dp, int64_t bytes)
{
    return dp > 1 ? 2.0 * (dp - 1) * link_transfer_ms(link, divide_up(bytes, dp)) : 0.0;
}

void cost_group_layer(const struct layer_cost *in, enum model_layer_kind kind,
                      const struct cost_group *g, struct layer_cost *out)
{
    int64_t t = g->tp, opt = optimizer_bytes(in->state_bytes, g->dtype);
    int64_t opt_shards = g->shard_optimizer ? t * g->dp : t;
    double speed = t > 1 ? t * g->tp_efficiency : 1.0;
    double comm = t > 1 ? cost_tp_collectives(kind) *
                              cost_tp_collective_ms(&g->node_link, g->tp, g->tensor_bytes)
                        : 0.0;
    *out = *in;
    if (in->has_split) { /* the profile's split: each part over its own shards */
        out->param_bytes = divide_up(in->param_bytes, t);
        out->grad_bytes = divide_up(in->grad_bytes, t);
        out->optimizer_bytes = divide_up(in->optimizer_bytes, opt_shards);
        out->state_bytes = out->param_bytes + out->grad_bytes + out->optimizer_bytes;
        out->optimizer_ms = in->optimizer_ms / (double)opt_shards;
        out->host_optimizer_ms = in->host_optimizer_ms / (double)opt_shards;
        out->optimizer_shards = g->shard_optimizer && g->dp > 1 ? g->dp : 1;
    } else {
        out->state_bytes = divide_up(in->state_bytes - opt, t) + divide_up(opt, opt_shards);
    }
    out->act_bytes = divide_up(in->act_bytes, t);
    out->ckpt_bytes = divide_up(in->ckpt_bytes, t);
    out->out_bytes = divide_up(in->out_bytes, t);
    out->workspace_bytes = divide_up(in->workspace_bytes, t) +
                           (t > 1 && kind != MODEL_LAYER_EMBED ? g->tensor_bytes : 0);
    out->fwd_ms = in->fwd_ms / speed + comm;
    out->bwd_ms = in->bwd_ms / speed + comm;
    /* the weight pass: each GPU's share of the products, no collectives */
    out->wgrad_bytes = divide_up(in->wgrad_bytes, t);
    out->wgrad_ms = in->wgrad_ms / speed;
    out->split_bytes = divide_up(in->split_bytes, t);
    out->split_ms = in->split_ms / speed;
    for (int k = 0; k < in->n_options; k++) {
        struct recompute_option *o = &out->options[k];
        o->kept_bytes = divide_up(in->options[k].kept_bytes, t);
        o->transient_bytes = out->act_bytes - o->kept_bytes;
        o->recompute_ms = in->options[k].recompute_ms / speed;
    }
}
