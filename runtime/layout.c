#include "layout.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cost.h"
#include "model_layers.h"
#include "model_ops.h"

/* A flash-attention block keeps the rows' log-sum-exp where the probabilities would be, and
 * has its rowsum(dout * out) where their gradient would be: the same indices. */
static const char *expected_name(const struct model *m, const char *name)
{
    if (m->attention == MODEL_ATTENTION_FLASH && strcmp(name, "att") == 0)
        return "att_lse";
    if (m->attention == MODEL_ATTENTION_FLASH && strcmp(name, "datt") == 0)
        return "att_dsum";
    return name;
}

static int check_names(const struct model *m, enum model_layer_kind kind, enum sizes_class cls,
                       const struct sizes_tensor *t, int n, struct err *e)
{
    const struct model_layers *ml = model_layers_of(m);
    if (ml == NULL)
        return err_set(e, ERR_INPUT, "the runtime has no layers for a %s model",
                       model_kind_name(m->kind));
    const char *const *names = ml->names[kind][cls];
    int ok = n == ml->counts[kind][cls];
    for (int i = 0; ok && i < n; i++)
        ok = strcmp(t[i].name, expected_name(m, names[i])) == 0;
    if (!ok)
        return err_set(e, ERR_FAIL,
                       "internal: the size tables of models/ (layer kind %d, class %d, "
                       "%d tensors) no longer match the tensor indices of the runtime's %s layers",
                       (int)kind, (int)cls, n, ml->kind);
    return ERR_OK;
}

/* Offsets of n tensors laid end to end from `start`; returns the end. */
static int64_t carve(const struct sizes_tensor *t, int n, int64_t start, int64_t *off)
{
    for (int i = 0; i < n; i++) {
        off[i] = start;
        start += sizes_tensor_bytes(&t[i]);
    }
    return start;
}

/* The kept tensors of L from `slot` on: regenerated ones in the transient, offloaded ones in
 * a staging buffer (each from 0), the others in the slot, each in table order; returns the
 * slot's end. */
static int64_t carve_kept(struct layer_layout *L, int64_t slot)
{
    int64_t start = slot, t_end = 0, o_end = 0;
    for (int k = 0; k < L->n_kept; k++) {
        int64_t *at = L->regen >> k & 1 ? &t_end : L->offload >> k & 1 ? &o_end : &slot;
        L->kept_off[k] = *at;
        *at += sizes_tensor_bytes(&L->kept[k]);
    }
    L->slot_bytes = slot - start;
    L->transient_bytes = t_end;
    L->offload_bytes = o_end;
    return slot;
}

int layout_regen(const struct model *m, int layer, int choice, const struct layer_cost *c,
                 uint32_t *regen, struct err *e)
{
    enum model_layer_kind kind = model_layer_kind(m, layer);
    if (choice == COST_KEEP) {
        *regen = 0;
        return ERR_OK;
    }
    if (choice == COST_FULL) {
        *regen = sizes_full_regen(m, kind);
        return ERR_OK;
    }
    const char *name = cost_choice_name(c, choice);
    if (sizes_find_option(m, kind, name, regen))
        return ERR_OK;
    struct sizes_option o[SIZES_OPTIONS_MAX];
    int n = sizes_recompute_options(m, kind, o);
    char known[SIZES_OPTIONS_MAX * 24] = "";
    for (int i = 0; i < n; i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "",
                 o[i].name);
    return err_set(e, ERR_INPUT,
                   "layer %d (%s): recompute option \"%s\" is not one this runtime can apply "
                   "(it knows %s)",
                   layer, c->name, name, n ? known : "none for this layer");
}

static void sum_arenas(struct stage_layout *sl)
{
    sl->activation_bytes = 0;
    for (int c = 0; c < sl->n_chunks; c++) {
        sl->chunks[c].act_at = sl->activation_bytes;
        sl->activation_bytes += (int64_t)sl->chunks[c].in_flight * sl->chunks[c].slot_bytes;
    }
    sl->staging_bytes = (int64_t)sl->n_staging * sl->staging_buf_bytes +
                        (int64_t)sl->n_wbuf * sl->wbuf_bytes;
    sl->host_bytes = (int64_t)sl->in_flight * sl->host_slot_bytes;
    sl->arena_bytes = sl->persistent_bytes + sl->activation_bytes + sl->transient_bytes +
                      sl->workspace_bytes + sl->staging_bytes;
}

/* Layer i of the stage at global layer `layer`: its tensors and state, carved after the
 * stage's layers before it (section, weights: the running ends). */
static int lay_layer(struct stage_layout *sl, const struct model *m, int i, int layer,
                     uint32_t regen, int64_t *section, int64_t *weights, struct err *e)
{
    struct layer_layout *L = &sl->layers[i];
    L->layer = layer;
    L->kind = model_layer_kind(m, L->layer);
    L->regen = regen;
    L->n_params = sizes_layer_tensors(m, L->kind, SIZES_PARAMS, L->params);
    L->n_kept = sizes_layer_tensors(m, L->kind, SIZES_KEPT, L->kept);
    L->n_ws = sizes_layer_tensors(m, L->kind, SIZES_WORKSPACE, L->ws);
    if (check_names(m, L->kind, SIZES_PARAMS, L->params, L->n_params, e) ||
        check_names(m, L->kind, SIZES_KEPT, L->kept, L->n_kept, e) ||
        check_names(m, L->kind, SIZES_WORKSPACE, L->ws, L->n_ws, e))
        return e->code;
    int64_t end = carve(L->params, L->n_params, *section, L->param_off);
    struct sizes_tensor w[SIZES_TENSORS_MAX];
    for (int k = 0; k < L->n_params; k++) {
        w[k] = L->params[k];
        w[k].elem_bytes = sizes_weight_elem_bytes(m->dtype);
    }
    int64_t wend = carve(w, L->n_params, *weights, L->weight_off);
    L->state_bytes = sizes_state_bytes(m->dtype, wend - *weights, end - *section);
    *section = end;
    *weights = wend;
    for (int k = 0; k < L->n_params; k++)
        sl->param_count += L->params[k].elems;
    if (L->regen & ~sizes_full_regen(m, L->kind))
        return err_set(e, ERR_FAIL, "internal: layer %d cannot regenerate kept tensors 0x%x",
                       L->layer, (unsigned)L->regen);
    L->ws_bytes = carve(L->ws, L->n_ws, 0, L->ws_off);
    return ERR_OK;
}

/* A split backward's weight-pass tensors in the slot after the kept ones; returns the slot's
 * new end. Only a block kept whole on the device splits (cost.h). */
static int64_t carve_wstash(struct layer_layout *L, const struct model *m, int64_t slot,
                            struct err *e)
{
    L->n_wstash = sizes_wgrad_tensors(m, L->kind, L->wstash);
    if (L->regen != 0 || L->offload != 0 || L->n_wstash == 0) {
        L->n_wstash = 0;
        err_set(e, ERR_FAIL, "internal: layer %d's backward cannot split (only a block kept "
                "whole on the device does)", L->layer);
        return -1;
    }
    int64_t end = carve(L->wstash, L->n_wstash, slot, L->wstash_off);
    L->slot_bytes += end - slot;
    return end;
}

/* The cost model's view of laid-out layer L (global index L->layer, li in its chunk): its
 * costs from the size functions (a partial regeneration, or a partial offload, as an option
 * of these bytes) and its action. 0 when the cost model has no row for it: a recomputed
 * layer that offloads part of what it keeps (the input or the targets stay), which plans
 * never hold (cost_whole_offload). */
static int cost_view(const struct model *m, const struct layer_layout *L, int li, int streamed,
                     struct layer_cost *c, struct layer_action *a)
{
    struct layer_sizes s;
    uint32_t kept_all = ((uint32_t)1 << L->n_kept) - 1;
    sizes_layer(m, L->layer, &s);
    *c = (struct layer_cost){.state_bytes = s.state_bytes, .act_bytes = s.act_bytes,
                             .ckpt_bytes = s.ckpt_bytes, .workspace_bytes = s.workspace_bytes,
                             .has_split = 1, .param_bytes = s.param_bytes,
                             .grad_bytes = s.grad_bytes, .optimizer_bytes = s.optimizer_bytes,
                             .optimizer_shards = 1};
    c->wgrad_bytes = L->n_wstash > 0 ? sizes_wgrad_bytes(m, L->kind) : 0;
    *a = LAYER_ACTION_KEEP;
    a->weights = streamed ? COST_PLACE_HOST : COST_PLACE_DEVICE;
    if (L->regen == sizes_full_regen(m, L->kind)) {
        a->choice = L->regen ? COST_FULL : COST_KEEP;
    } else if (L->regen) {
        struct recompute_option *o = &c->options[c->n_options++];
        sizes_regen_bytes(m, L->kind, L->regen, &o->kept_bytes, &o->transient_bytes);
        a->choice = COST_OPTION;
    }
    if (L->offload == 0)
        return 1;
    a->prefetch_ahead = 1; /* the staging is the stage's, counted apart */
    if (L->offload == (kept_all & ~L->regen) && cost_whole_offload(m, li, L->layer)) {
        a->place = COST_PLACE_HOST;
        return 1;
    }
    if (L->regen)
        return 0;
    struct recompute_option *o = &c->options[c->n_options];
    sizes_regen_bytes(m, L->kind, L->offload, &o->kept_bytes, &o->transient_bytes);
    a->offload_option = (signed char)c->n_options++;
    return 1;
}

/* The planner's numbers come from sizes_layer through the cost model; these offsets come from
 * the same tables. They must agree to the byte, device and host memory, or the plan's memory
 * is not what this stage allocates. ZeRO-1's slices are cut across the stage's sections, the
 * cost model's per layer: with shards the activations' arenas are checked, the state is left to
 * layout_check_limit. */
static int check_against_cost(const struct stage_layout *sl, const struct model *m,
                              const struct layout_spec *spec, struct err *e)
{
    struct layer_cost *costs = calloc((size_t)sl->n_layers, sizeof *costs);
    struct layer_action *acts = calloc((size_t)sl->n_layers, sizeof *acts);
    struct stage_cost c[SCHEDULE_CHUNKS_MAX];
    int expressible = 1;
    if (costs == NULL || acts == NULL) {
        free(costs);
        free(acts);
        return err_set(e, ERR_FAIL, "out of memory laying out %d layers", sl->n_layers);
    }
    for (int k = 0; k < sl->n_chunks; k++)
        for (int i = sl->chunks[k].lo; i < sl->chunks[k].hi; i++)
            expressible &= cost_view(m, &sl->layers[i], i - sl->chunks[k].lo,
                                     i >= sl->stream_from, &costs[i], &acts[i]);
    for (int k = 0; k < sl->n_chunks; k++) {
        const struct layout_chunk *ch = &sl->chunks[k];
        struct cost_actions a = {acts + ch->lo, spec->optimizer, spec->optimizer_from};
        cost_stage_actions(costs + ch->lo, ch->hi - ch->lo, &a, ch->in_flight, 0, &c[k]);
    }
    free(costs);
    free(acts);
    /* one chunk: its M, staging included; several: the GPU's (no chunk offloads) */
    int64_t want = sl->n_chunks > 1 ? cost_chunks_memory(c, sl->n_chunks, 0) : c[0].memory_bytes;
    int64_t host = c[0].host_memory_bytes, have = sl->arena_bytes;
    if (sl->n_staging > 0) /* the staging of the spec's depth, as the plan's furthest trigger */
        want += (int64_t)(spec->prefetch_depth - 1) * sl->staging_buf_bytes;
    if (!expressible)
        return ERR_OK;
    if (spec->shards > 1) { /* the activations' arenas alone */
        for (int k = 0; k < sl->n_chunks; k++)
            want -= c[k].state_bytes;
        have -= sl->persistent_bytes;
    }
    if (want != have || host != sl->host_bytes + sl->mirror_bytes)
        return err_set(e, ERR_FAIL,
                       "internal: layers %d-%d lay out to %lld bytes on the device and %lld on "
                       "the host but the cost model of the size functions gives %lld and %lld",
                       sl->first, sl->layers[sl->n_layers - 1].layer, (long long)have,
                       (long long)(sl->host_bytes + sl->mirror_bytes), (long long)want,
                       (long long)host);
    return ERR_OK;
}

/* Chunk k's layers from layer index *i on: each laid out as its place says, its kept tensors
 * carved in the chunk's slot (from 0), its offloaded ones in a staging buffer and in the host
 * slot after the layers' before it, the weight-gradient stash where the backward is split,
 * its workspace after the previous chunk's. */
static int lay_chunk(struct stage_layout *sl, const struct model *m,
                     const struct layout_chunk_spec *spec, int k, int *i,
                     const struct layout_place *place, int64_t *section, int64_t *weights,
                     struct err *e)
{
    struct layout_chunk *ch = &sl->chunks[k];
    int64_t slot = 0, ws_at = sl->workspace_bytes, ws = 0;
    *ch = (struct layout_chunk){.lo = *i, .vstage = spec->vstage, .in_flight = spec->in_flight};
    for (int layer = spec->first; layer <= spec->last; layer++, (*i)++) {
        struct layer_layout *L = &sl->layers[*i];
        struct layout_place p = place != NULL ? place[*i] : (struct layout_place){0};
        L->chunk = k;
        if (lay_layer(sl, m, *i, layer, p.regen, section, weights, e))
            return e->code;
        L->offload = p.offload;
        L->ahead = p.ahead;
        slot = carve_kept(L, slot);
        if (p.split && (slot = carve_wstash(L, m, slot, e)) < 0)
            return e->code;
        L->host_off = sl->host_slot_bytes;
        sl->host_slot_bytes += L->offload_bytes;
        if (L->offload_bytes > sl->staging_buf_bytes)
            sl->staging_buf_bytes = L->offload_bytes;
        if (L->transient_bytes > sl->transient_bytes)
            sl->transient_bytes = L->transient_bytes;
        ws = L->ws_bytes > ws ? L->ws_bytes : ws;
        for (int t = 0; t < L->n_ws; t++)
            L->ws_off[t] += ws_at;
    }
    ch->hi = *i;
    ch->slot_bytes = slot;
    sl->workspace_bytes = ws_at + ws;
    return ERR_OK;
}

/* The persistent arena: the weights (in the model's dtype), then fp32 sections of the
 * gradients, the master weights (16-bit models) and AdamW's m and v, all on the device until
 * the host optimizer moves some. */
static void place_state(struct stage_layout *sl, const struct model *m, int64_t weights,
                        int64_t section)
{
    sl->section_bytes = section;
    sl->weights_bytes = weights;
    sl->grads_at = weights;
    if (m->dtype == MODEL_DTYPE_FP32) {
        sl->master_at = 0;
        sl->m_at = weights + section;
    } else {
        sl->master_at = weights + section;
        sl->m_at = weights + 2 * section;
    }
    sl->v_at = sl->m_at + section;
    sl->shard_bytes = section;
    sl->host_lo = section;
    sl->host_from = sl->n_layers;
    sl->dev_master_at = sl->master_at;
    sl->dev_m_at = sl->m_at;
    sl->dev_v_at = sl->v_at;
    sl->persistent_bytes = sizes_state_bytes(m->dtype, weights, section);
    sl->state_bytes = sl->persistent_bytes;
    sl->stream_from = sl->n_layers;
    sl->dev_weights_bytes = weights;
    sl->dev_section_bytes = section;
    sl->dev_grads_at = weights;
}

/* The layers from `from` on stream their weights: the device's sections end where theirs
 * start, and the weights buffers hold the largest of their weights and gradients. */
static void stream_weights(struct stage_layout *sl, int from)
{
    if (from >= sl->n_layers)
        return;
    sl->stream_from = from;
    sl->dev_weights_bytes = sl->layers[from].weight_off[0];
    sl->dev_section_bytes = sl->layers[from].param_off[0];
    sl->dev_grads_at = sl->dev_weights_bytes;
    sl->host_weights_bytes = sl->weights_bytes - sl->dev_weights_bytes;
    sl->n_wbuf = COST_STREAM_BUFFERS;
    for (int li = from; li < sl->n_layers; li++) {
        int64_t sec_off, sec_bytes, w_off, w_bytes;
        layout_layer_ranges(sl, li, &sec_off, &sec_bytes, &w_off, &w_bytes);
        if (w_bytes + sec_bytes > sl->wbuf_bytes)
            sl->wbuf_bytes = w_bytes + sec_bytes;
    }
}

static int64_t overlap(int64_t a, int64_t a_bytes, int64_t b, int64_t b_bytes)
{
    int64_t lo = a > b ? a : b, hi = a + a_bytes < b + b_bytes ? a + a_bytes : b + b_bytes;
    return hi > lo ? hi - lo : 0;
}

/* Keeps only slice [lo, lo + bytes) of the optimizer's sections on the device (the layout's
 * ZeRO-1 fields); the state's offsets stay. */
static void shard_optimizer(struct stage_layout *sl, int64_t lo, int64_t bytes)
{
    int n_opt = model_dtype_16bit(sl->dtype) ? 3 : 2; /* [master,] m, v */
    int64_t opt_at = sl->dev_grads_at + sl->dev_section_bytes;
    for (int li = 0; li < sl->n_layers; li++) { /* what layout_check_limit counts */
        int64_t sec_off, sec_bytes, w_off, w_bytes;
        layout_layer_ranges(sl, li, &sec_off, &sec_bytes, &w_off, &w_bytes);
        sl->layers[li].state_bytes = overlap(w_off, w_bytes, 0, sl->dev_weights_bytes) +
                                     overlap(sec_off, sec_bytes, 0, sl->dev_section_bytes) +
                                     n_opt * overlap(sec_off, sec_bytes, lo, bytes);
    }
    sl->shard_lo = lo;
    sl->shard_bytes = bytes;
    sl->dev_master_at = n_opt == 3 ? opt_at : lo; /* fp32: the weights are the master */
    sl->dev_m_at = opt_at + (n_opt - 2) * bytes;
    sl->dev_v_at = sl->dev_m_at + bytes;
    sl->persistent_bytes = opt_at + n_opt * bytes;
}

/* The device keeps the optimizer's sections of the layers before `from` as ZeRO-1 keeps a
 * slice (shard_optimizer, the slice [0, host_lo)): the same offsets, the same step. */
static void host_optimizer_from(struct stage_layout *sl, int from)
{
    int64_t lo = from < sl->n_layers ? sl->layers[from].param_off[0] : sl->section_bytes;
    shard_optimizer(sl, 0, lo);
    sl->host_lo = lo;
    sl->host_from = from;
    sl->mirror_bytes = 4 * (sl->section_bytes - lo) + sl->host_weights_bytes;
}


/* What the executor cannot run: an offload beside a GPU's several chunks or a split backward;
 * streamed weights without their optimizer on the host, or beside chunks, a split backward or
 * ZeRO-1 (their gradients then live in the host mirror alone). */
static int places_refused(const struct layout_spec *spec, int n, struct err *e)
{
    int offloads = 0, split = 0;
    for (int i = 0; spec->place != NULL && i < n; i++) {
        offloads |= spec->place[i].offload != 0;
        split |= spec->place[i].split;
    }
    if (offloads && (spec->n_chunks > 1 || split))
        return err_set(e, ERR_INPUT, "offload runs with schedules 1f1b and gpipe, not with a "
                       "GPU's several model chunks or a split backward");
    if (spec->stream_layers <= 0)
        return ERR_OK;
    if (spec->stream_layers > n || spec->optimizer != COST_PLACE_HOST ||
        spec->optimizer_from > n - spec->stream_layers)
        return err_set(e, ERR_INPUT, "streaming the weights of the last %d of %d layers needs "
                       "their optimizer on the host (it is on the host from layer index %d%s)",
                       spec->stream_layers, n, spec->optimizer_from,
                       spec->optimizer == COST_PLACE_HOST ? "" : ": it is on the device");
    if (spec->n_chunks > 1 || split || spec->shards > 1)
        return err_set(e, ERR_INPUT, "streamed weights run with schedules 1f1b and gpipe and "
                       "the optimizer unsharded, not with a GPU's several model chunks, a "
                       "split backward or ZeRO-1");
    return ERR_OK;
}

int layout_stage(struct stage_layout *sl, const struct model *m, const struct layout_spec *spec,
                 struct err *e)
{
    memset(sl, 0, sizeof *sl);
    sl->dtype = m->dtype;
    sl->n_chunks = spec->n_chunks;
    for (int k = 0; k < spec->n_chunks; k++)
        sl->n_layers += spec->chunks[k].last - spec->chunks[k].first + 1;
    sl->first = spec->chunks[0].first;
    sl->last = spec->chunks[0].last;
    sl->in_flight = spec->chunks[0].in_flight;
    if (places_refused(spec, sl->n_layers, e))
        return e->code;
    sl->layers = calloc((size_t)sl->n_layers, sizeof *sl->layers);
    if (sl->layers == NULL)
        return err_set(e, ERR_FAIL, "out of memory laying out %d layers", sl->n_layers);
    int64_t section = 0, weights = 0;
    for (int k = 0, i = 0; k < spec->n_chunks; k++)
        if (lay_chunk(sl, m, &spec->chunks[k], k, &i, spec->place, &section, &weights, e)) {
            layout_free(sl);
            return e->code;
        }
    place_state(sl, m, weights, section);
    sl->slot_bytes = sl->chunks[0].slot_bytes;
    sl->n_staging = sl->staging_buf_bytes > 0 ? spec->prefetch_depth + 2 : 0;
    stream_weights(sl, sl->n_layers - spec->stream_layers);
    if (spec->optimizer == COST_PLACE_HOST) {
        host_optimizer_from(sl, spec->optimizer_from);
    } else if (spec->shards > 1) {
        int64_t lo, bytes;
        layout_shard_range(sl, spec->shard, spec->shards, &lo, &bytes);
        shard_optimizer(sl, lo, bytes);
    }
    sum_arenas(sl);
    if (check_against_cost(sl, m, spec, e)) {
        layout_free(sl);
        return e->code;
    }
    return ERR_OK;
}

int layout_init(struct stage_layout *sl, const struct model *m, int first, int last,
                const uint32_t *regen, int in_flight, struct err *e)
{
    struct layout_chunk_spec one = {first, last, 0, in_flight};
    struct layout_place *place = calloc((size_t)(last - first + 1), sizeof *place);
    if (place == NULL)
        return err_set(e, ERR_FAIL, "out of memory laying out layers %d-%d", first, last);
    for (int i = 0; regen != NULL && i <= last - first; i++)
        place[i].regen = regen[i];
    int rc = layout_stage(sl, m, &(struct layout_spec){.chunks = &one, .n_chunks = 1,
                                                        .place = place}, e);
    free(place);
    return rc;
}

int layout_chunk_of(const struct stage_layout *sl, int vstage)
{
    for (int c = 0; c < sl->n_chunks; c++)
        if (sl->chunks[c].vstage == vstage)
            return c;
    return -1;
}

int layout_offload_mask(const struct model *m, int layer, int first, uint32_t regen, int place,
                        int option, uint32_t *mask, struct err *e)
{
    enum model_layer_kind kind = model_layer_kind(m, layer);
    struct sizes_tensor kept[SIZES_TENSORS_MAX];
    int n_kept = sizes_layer_tensors(m, kind, SIZES_KEPT, kept);
    *mask = 0;
    if (option >= 0) {
        struct sizes_option o[SIZES_OPTIONS_MAX];
        int n = sizes_recompute_options(m, kind, o);
        if (option >= n)
            return err_set(e, ERR_INPUT,
                           "layer %d: offload_option %d, but the layer has %d recompute options",
                           layer, option, n);
        if (regen != 0)
            return err_set(e, ERR_INPUT,
                           "layer %d: offload_option \"%s\" on a layer that is recomputed: "
                           "a per-tensor offload goes with keeping the layer",
                           layer, o[option].name);
        *mask = o[option].regen;
    }
    if (place != COST_PLACE_DEVICE)
        *mask |= (((uint32_t)1 << n_kept) - 1) & ~regen;
    if (first)
        *mask &= ~(uint32_t)1; /* the input: the receive buffer */
    if (kind == MODEL_LAYER_HEAD)
        *mask &= ~REGEN_BIT(HEAD_TARGETS);
    return ERR_OK;
}

int layout_place_of(const struct model *m, int layer, int li, const struct layer_action *a,
                    const struct layer_cost *c, int split, struct layout_place *out,
                    struct err *e)
{
    *out = (struct layout_place){.ahead = a->prefetch_ahead, .split = split};
    ERR_TRY(layout_regen(m, layer, a->choice, c, &out->regen, e));
    return layout_offload_mask(m, layer, li == 0, out->regen, a->place, a->offload_option,
                               &out->offload, e);
}

void layout_view_staging(const struct stage_layout *sl, int li, char *buf, struct layer_view *v)
{
    const struct layer_layout *L = &sl->layers[li];
    for (int k = 0; k < L->n_kept; k++)
        if (L->offload >> k & 1)
            v->kept[k] = buf != NULL ? buf + L->kept_off[k] : NULL;
}

int64_t layout_stream_grads_at(const struct stage_layout *sl, int li)
{
    int64_t sec_off, sec_bytes, w_off, w_bytes;
    layout_layer_ranges(sl, li, &sec_off, &sec_bytes, &w_off, &w_bytes);
    return w_bytes;
}

void layout_view_weights(const struct stage_layout *sl, int li, char *buf, struct layer_view *v)
{
    const struct layer_layout *L = &sl->layers[li];
    int64_t sec_off, sec_bytes, w_off, w_bytes;
    layout_layer_ranges(sl, li, &sec_off, &sec_bytes, &w_off, &w_bytes);
    for (int k = 0; k < L->n_params; k++) {
        v->params[k] = buf != NULL ? buf + (L->weight_off[k] - w_off) : NULL;
        v->grads[k] = buf != NULL ? (float *)(buf + w_bytes + (L->param_off[k] - sec_off)) : NULL;
    }
}

int layout_check_host(const struct stage_layout *sl, int64_t host_limit, struct err *e)
{
    if (sl->mirror_bytes > 0 && sl->mirror_bytes + sl->host_bytes > host_limit)
        return err_set(e, ERR_INPUT,
                       "layers %d-%d keep their optimizer on the host: a mirror of %lld bytes "
                       "(master, m, v and gradient landing: 4 x %lld, and %lld of streamed "
                       "weights) + %lld bytes offloaded = %lld, over its host_limit_bytes %lld",
                       sl->first + sl->host_from, sl->last, (long long)sl->mirror_bytes,
                       (long long)(sl->section_bytes - sl->host_lo),
                       (long long)sl->host_weights_bytes, (long long)sl->host_bytes,
                       (long long)(sl->mirror_bytes + sl->host_bytes), (long long)host_limit);
    if (host_limit >= 0 && sl->host_bytes > host_limit)
        return err_set(e, ERR_NOFIT,
                       "layers %d-%d offload %d in flight x %lld bytes = %lld bytes to host "
                       "memory, over its host_memory_bytes %lld",
                       sl->first, sl->last, sl->in_flight, (long long)sl->host_slot_bytes,
                       (long long)sl->host_bytes, (long long)host_limit);
    return ERR_OK;
}

void layout_shard_range(const struct stage_layout *sl, int shard, int shards, int64_t *lo,
                        int64_t *bytes)
{
    int64_t n = sl->section_bytes / 4, per = (n + shards - 1) / shards;
    int64_t a = (int64_t)shard * per < n ? (int64_t)shard * per : n;
    int64_t b = a + per < n ? a + per : n;
    *lo = 4 * a;
    *bytes = 4 * (b - a);
}

int64_t layout_tensor_slice(const struct stage_layout *sl, int li, int k, int64_t lo,
                            int64_t bytes, int64_t *first)
{
    const struct layer_layout *L = &sl->layers[li];
    int64_t off = L->param_off[k], end = off + 4 * L->params[k].elems;
    int64_t a = off > lo ? off : lo, b = end < lo + bytes ? end : lo + bytes;
    *first = (a - off) / 4;
    return a < b ? (b - a) / 4 : 0;
}

void layout_layer_ranges(const struct stage_layout *sl, int li, int64_t *sec_off,
                         int64_t *sec_bytes, int64_t *w_off, int64_t *w_bytes)
{
    const struct layer_layout *L = &sl->layers[li];
    int64_t sec_end = li + 1 < sl->n_layers ? sl->layers[li + 1].param_off[0] : sl->section_bytes;
    int64_t w_end = li + 1 < sl->n_layers ? sl->layers[li + 1].weight_off[0] : sl->weights_bytes;
    *sec_off = L->param_off[0];
    *sec_bytes = sec_end - *sec_off;
    *w_off = L->weight_off[0];
    *w_bytes = w_end - *w_off;
}

void layout_free(struct stage_layout *sl)
{
    free(sl->layers);
    sl->layers = NULL;
}

void layout_view(const struct stage_layout *sl, const struct model *m, int li, char *persistent,
                 char *slot, char *transient, char *workspace, struct layer_view *v)
{
    const struct layer_layout *L = &sl->layers[li];
    char *grads = persistent + sl->dev_grads_at;
    memset(v, 0, sizeof *v);
    v->model = m;
    v->kind = L->kind;
    v->layer = L->layer;
    for (int k = 0; k < L->n_params && li < sl->stream_from; k++) {
        v->params[k] = persistent + L->weight_off[k];
        v->grads[k] = (float *)(grads + L->param_off[k]);
    }
    for (int k = 0; k < L->n_kept; k++)
        v->kept[k] = (L->regen >> k & 1 ? transient : slot) + L->kept_off[k];
    for (int k = 0; k < L->n_wstash; k++)
        v->wstash[k] = slot + L->wstash_off[k];
    v->regen = L->regen;
    for (int k = 0; k < L->n_ws; k++)
        v->ws[k] = workspace + L->ws_off[k];
}

int layout_check_limit(const struct stage_layout *sl, const struct model *m, int64_t limit,
                       int64_t reserve, struct err *e)
{
    int64_t available = limit - reserve;
    if (sl->n_chunks > 1 && sl->arena_bytes > available)
        return err_set(e, ERR_NOFIT, "the GPU's %d model chunks (layers %d-%d first) do not fit "
                       "the memory limit: they need %lld bytes (state %lld + each chunk's in "
                       "flight x kept, %lld + transient %lld + workspace %lld), over "
                       "memory_limit_bytes %lld minus reserve_bytes %lld = %lld",
                       sl->n_chunks, sl->first, sl->last, (long long)sl->arena_bytes,
                       (long long)sl->persistent_bytes, (long long)sl->activation_bytes,
                       (long long)sl->transient_bytes, (long long)sl->workspace_bytes,
                       (long long)limit, (long long)reserve, (long long)available);
    if (sl->n_chunks > 1)
        return ERR_OK;
    struct cost_sum sum = {0};
    for (int i = 0; i < sl->n_layers; i++) {
        const struct layer_layout *L = &sl->layers[i];
        struct cost_row row = {.kept_bytes = L->slot_bytes, .transient_bytes = L->transient_bytes};
        cost_sum_add(&sum, L->state_bytes, L->ws_bytes, 0, &row);
        int64_t need = cost_sum_memory(&sum, sl->in_flight, 0);
        if (need > available) {
            char name[MODEL_LAYER_NAME_MAX];
            model_layer_name(m, L->layer, name);
            return err_set(
                e, ERR_NOFIT,
                "layers %d-%d do not fit the memory limit: at layer %d (%s) they need %lld "
                "bytes (state %lld + %d in flight x kept %lld + transient %lld + workspace "
                "%lld), over memory_limit_bytes %lld minus reserve_bytes %lld = %lld; all "
                "layers need %lld",
                sl->first, sl->last, L->layer, name, (long long)need, (long long)sum.state,
                sl->in_flight, (long long)sum.kept, (long long)sum.transient,
                (long long)sum.workspace, (long long)limit, (long long)reserve,
                (long long)available, (long long)sl->arena_bytes);
        }
    }
    if (sl->arena_bytes > available)
        return err_set(e, ERR_NOFIT,
                       "layers %d-%d do not fit the memory limit with the %d staging buffers of "
                       "%lld bytes their offloaded tensors pass through: they need %lld bytes, "
                       "over memory_limit_bytes %lld minus reserve_bytes %lld = %lld",
                       sl->first, sl->last, sl->n_staging, (long long)sl->staging_buf_bytes,
                       (long long)sl->arena_bytes, (long long)limit, (long long)reserve,
                       (long long)available);
    return ERR_OK;
}

int layout_param_decays(const char *name)
{
    /* by name: Llama's parameters share GPT's names where their roles are the same */
    return model_ops_gpt.param_decays(name);
}

void layout_param_init(const struct model *m, const char *name, float *std, float *fill)
{
    model_ops_of(m)->param_init(m, name, std, fill);
}
