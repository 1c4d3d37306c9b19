#include "plan.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonio.h"

/* The stage's per-layer arrays for first..last: its actions (every layer kept) and costs. */
static int stage_alloc_layers(struct plan_stage *st)
{
    int n = plan_stage_layer_count(st);
    st->actions = malloc((size_t)n * sizeof *st->actions);
    st->layers = calloc((size_t)n, sizeof *st->layers);
    if (st->actions == NULL || st->layers == NULL)
        return ERR_FAIL;
    for (int l = 0; l < n; l++)
        st->actions[l] = LAYER_ACTION_KEEP;
    return ERR_OK;
}

int plan_init(struct plan *p, int n_stages, const int *first, const int *last, struct err *e)
{
    memset(p, 0, sizeof *p);
    p->optimality_gap = -1;
    snprintf(p->framework.target, sizeof p->framework.target, "ballast");
    snprintf(p->framework.activations, sizeof p->framework.activations, "ballast");
    p->stages = calloc((size_t)n_stages, sizeof *p->stages);
    if (p->stages == NULL)
        return err_set(e, ERR_FAIL, "out of memory allocating %d plan stages", n_stages);
    p->n_stages = n_stages;
    for (int s = 0; s < n_stages; s++) {
        struct plan_stage *st = &p->stages[s];
        st->index = s;
        st->gpu = s;
        st->tp = st->dp = 1;
        st->first = first[s];
        st->last = last[s];
        if (stage_alloc_layers(st)) {
            plan_free(p);
            return err_set(e, ERR_FAIL, "out of memory allocating plan stage %d", s);
        }
    }
    return ERR_OK;
}

void plan_free(struct plan *p)
{
    for (int s = 0; s < p->n_stages; s++) {
        free(p->stages[s].actions);
        free(p->stages[s].layers);
        if (p->stages[s].arena != NULL)
            arena_free(p->stages[s].arena);
        free(p->stages[s].arena);
    }
    free(p->stages);
    free(p->replica_micro_batches);
    p->stages = NULL;
    p->replica_micro_batches = NULL;
    p->n_stages = 0;
}

struct schedule_shape plan_shape(const struct plan *p)
{
    int v = p->virtual_stages > 1 ? p->virtual_stages : 1;
    return schedule_shape_of(p->schedule, p->n_stages / v, v, p->micro_batches);
}

int plan_gpu_stages(const struct plan *p, int gpu, int stages[SCHEDULE_CHUNKS_MAX])
{
    struct schedule_shape sh = plan_shape(p);
    for (int c = 0; c < sh.chunks; c++)
        stages[c] = schedule_vstage(&sh, gpu, c);
    return sh.chunks;
}

static void chunk_cost(const struct plan_stage *st, int64_t reserve_bytes, struct stage_cost *out)
{
    struct cost_actions a = plan_stage_actions(st);
    cost_stage_actions(st->layers, plan_stage_layer_count(st), &a, st->in_flight, reserve_bytes,
                       out);
}

void plan_stage_cost(const struct plan *p, const struct plan_stage *st, struct stage_cost *out)
{
    if (p->virtual_stages <= 1) {
        chunk_cost(st, p->reserve_bytes, out);
        return;
    }
    int members[SCHEDULE_CHUNKS_MAX];
    struct stage_cost chunks[SCHEDULE_CHUNKS_MAX];
    int n = plan_gpu_stages(p, st->gpu, members);
    for (int c = 0; c < n; c++)
        chunk_cost(&p->stages[members[c]], 0, &chunks[c]);
    chunk_cost(st, p->reserve_bytes, out);
    out->memory_bytes = cost_chunks_memory(chunks, n, p->reserve_bytes);
}

void plan_stage_recost(const struct plan *p, struct plan_stage *st)
{
    struct stage_cost c;
    plan_stage_cost(p, st, &c);
    st->memory_bytes = c.memory_bytes;
    st->recompute_ms = c.recompute_ms;
    st->stage_ms = c.stage_ms;
    st->host_memory_bytes = c.host_memory_bytes;
    st->staging_bytes = c.staging_bytes;
    st->copy_ms = plan_stage_copy_ms(st);
}

/* "recompute" (the layers recomputed whole) and, where some recompute part of themselves,
 * "recompute_options". */
static void recompute_to_json(const struct plan_stage *st, cJSON *so)
{
    cJSON *rec = cJSON_AddArrayToObject(so, "recompute");
    int partial = 0;
    for (int l = 0; l < plan_stage_layer_count(st); l++) {
        if (st->actions[l].choice == COST_FULL)
            cJSON_AddItemToArray(rec, cJSON_CreateNumber(st->first + l));
        partial += st->actions[l].choice >= COST_OPTION;
    }
    if (partial == 0)
        return;
    cJSON *opts = cJSON_AddArrayToObject(so, "recompute_options");
    for (int l = 0; l < plan_stage_layer_count(st); l++) {
        if (st->actions[l].choice < COST_OPTION)
            continue;
        cJSON *item = cJSON_CreateObject();
        cJSON_AddNumberToObject(item, "layer", st->first + l);
        cJSON_AddStringToObject(item, "option",
                                cost_choice_name(&st->layers[l], st->actions[l].choice));
        cJSON_AddItemToArray(opts, item);
    }
}

static cJSON *stage_to_json(const struct plan *p, const struct plan_stage *st)
{
    cJSON *so = cJSON_CreateObject();
    cJSON_AddNumberToObject(so, "index", st->index);
    if (p->virtual_stages > 1)
        cJSON_AddNumberToObject(so, "gpu", st->gpu);
    cJSON_AddStringToObject(so, "device", st->device);
    cJSON_AddStringToObject(so, "device_kind", st->device_kind);
    cJSON *range = cJSON_AddArrayToObject(so, "layers");
    cJSON_AddItemToArray(range, cJSON_CreateNumber(st->first));
    cJSON_AddItemToArray(range, cJSON_CreateNumber(st->last));
    recompute_to_json(st, so);
    jsonio_add_int(so, "memory_bytes", st->memory_bytes);
    jsonio_add_int(so, "memory_limit_bytes", st->memory_limit_bytes);
    jsonio_add_int(so, "capacity_bytes", st->capacity_bytes);
    jsonio_add_int(so, "memory_before_bytes", st->memory_before_bytes);
    cJSON_AddNumberToObject(so, "in_flight", st->in_flight);
    cJSON_AddNumberToObject(so, "recompute_ms", st->recompute_ms);
    cJSON_AddNumberToObject(so, "stage_ms", st->stage_ms);
    if (st->link.present)
        cJSON_AddItemToObject(so, "link", link_to_json(&st->link));
    if (st->arena != NULL)
        cJSON_AddItemToObject(so, "arena", arena_to_json(st->arena));
    plan_offload_to_json(st, so);
    plan_group_to_json(st, so);
    plan_optimizer_to_json(st, so);
    cJSON *costs = cJSON_AddArrayToObject(so, "layer_costs");
    for (int l = 0; l < plan_stage_layer_count(st); l++)
        cJSON_AddItemToArray(costs, layer_cost_to_json(&st->layers[l]));
    return so;
}

/* What the planner tried and proved: the schedules, the repartition search, the MILP check. */
static void search_to_json(const struct plan *p, cJSON *o)
{
    if (p->n_tried > 0) {
        cJSON *tried = cJSON_AddArrayToObject(o, "schedules_tried");
        for (int k = 0; k < p->n_tried; k++) {
            cJSON *t = cJSON_CreateObject();
            cJSON_AddStringToObject(t, "schedule", schedule_name(p->tried[k].schedule));
            if (p->tried[k].virtual_stages > 1)
                cJSON_AddNumberToObject(t, "virtual_stages", p->tried[k].virtual_stages);
            if (p->tried[k].iteration_ms >= 0)
                cJSON_AddNumberToObject(t, "iteration_ms", p->tried[k].iteration_ms);
            else
                cJSON_AddNullToObject(t, "iteration_ms");
            cJSON_AddItemToArray(tried, t);
        }
    }
    if (p->search.present) {
        cJSON *v = cJSON_AddObjectToObject(o, "search");
        cJSON_AddNumberToObject(v, "device_orders", p->search.orders);
        cJSON_AddNumberToObject(v, "nodes", (double)p->search.nodes);
        cJSON_AddNumberToObject(v, "splits_simulated", (double)p->search.splits);
        cJSON_AddBoolToObject(v, "exhausted", p->search.exhausted);
        cJSON_AddNumberToObject(v, "lower_bound_ms", p->search.lower_bound);
    }
    if (p->verify.present) {
        cJSON *v = cJSON_AddObjectToObject(o, "verify");
        cJSON_AddNumberToObject(v, "milp_objective", p->verify.milp_objective);
        cJSON_AddNumberToObject(v, "dp_objective", p->verify.dp_objective);
        cJSON_AddBoolToObject(v, "agree", p->verify.agree);
    }
}

cJSON *plan_to_json(const struct plan *p)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "ballast-plan/1");
    cJSON_AddStringToObject(o, "method", p->method);
    cJSON *fw = cJSON_AddObjectToObject(o, "framework");
    cJSON_AddStringToObject(fw, "target", p->framework.target);
    cJSON_AddStringToObject(fw, "activations", p->framework.activations);
    cJSON_AddStringToObject(fw, "attention", model_attention_name(p->framework.attention));
    cJSON_AddStringToObject(o, "schedule", schedule_name(p->schedule));
    if (p->virtual_stages > 1)
        cJSON_AddNumberToObject(o, "virtual_stages", p->virtual_stages);
    cJSON_AddNumberToObject(o, "micro_batches", p->micro_batches);
    plan_dealing_to_json(p, o);
    cJSON_AddNumberToObject(o, "bottleneck_stage", p->bottleneck_stage);
    cJSON_AddNumberToObject(o, "most_loaded_stage", p->most_loaded_stage);
    cJSON_AddNumberToObject(o, "iteration_ms", p->iteration_ms);
    if (p->optimality_gap >= 0)
        cJSON_AddNumberToObject(o, "optimality_gap", p->optimality_gap);
    if (p->min_gain > 0)
        cJSON_AddNumberToObject(o, "min_gain", p->min_gain);
    if (p->fastest_ms > 0)
        cJSON_AddNumberToObject(o, "fastest_ms", p->fastest_ms);
    jsonio_add_int(o, "reserve_bytes", p->reserve_bytes);
    jsonio_add_int(o, "unit_bytes", p->unit_bytes);
    cJSON *stages = cJSON_AddArrayToObject(o, "stages");
    for (int s = 0; s < p->n_stages; s++)
        cJSON_AddItemToArray(stages, stage_to_json(p, &p->stages[s]));
    cJSON_AddItemToObject(o, "model", model_to_json(&p->model));
    search_to_json(p, o);
    return o;
}

int plan_write(const char *file, const struct plan *p, struct err *e)
{
    for (int s = 0; s < p->n_stages; s++) /* every plan the planner makes has one */
        if (p->stages[s].device_kind[0] == '\0')
            return err_set(e, ERR_FAIL, "internal: %s: stage %d has no device_kind", file, s);
    cJSON *o = plan_to_json(p);
    int rc = jsonio_write(file, o, e);
    cJSON_Delete(o);
    return rc;
}

/* "recompute_options": [{"layer", "option"}], after the layer costs that name the options. */
static int read_options(const cJSON *so, const char *file, const char *path,
                        struct plan_stage *st, struct err *e)
{
    char sub[JSONIO_PATH_MAX];
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(so, "recompute_options");
    if (list == NULL)
        return ERR_OK;
    jsonio_path_key(sub, path, "recompute_options");
    if (jsonio_expect_array(list, file, sub, e))
        return e->code;
    int k = 0;
    for (const cJSON *it = list->child; it != NULL; it = it->next, k++) {
        char ip[JSONIO_PATH_MAX];
        const char *name;
        int64_t v;
        jsonio_path_index(ip, sub, k);
        if (jsonio_expect_object(it, file, ip, e) ||
            jsonio_int(it, file, ip, "layer", st->first, st->last, &v, e) ||
            jsonio_str(it, file, ip, "option", &name, e))
            return e->code;
        int l = (int)(v - st->first);
        const struct layer_cost *c = &st->layers[l];
        if (st->actions[l].choice)
            return err_set(e, ERR_INPUT, "%s: %s.layer: layer %lld already has a recompute "
                           "choice (recompute or an earlier entry)", file, ip, (long long)v);
        for (int o = 0; o < c->n_options && !st->actions[l].choice; o++)
            if (strcmp(c->options[o].name, name) == 0)
                st->actions[l].choice = (unsigned char)(COST_OPTION + o);
        if (!st->actions[l].choice) {
            char known[PROFILE_OPTIONS_MAX * (PROFILE_OPTION_NAME_MAX + 2) + 8] = "";
            for (int o = 0; o < c->n_options; o++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s",
                         o ? ", " : "", c->options[o].name);
            return err_set(e, ERR_INPUT,
                           "%s: %s.option: \"%s\" is not a recompute option of layer %lld (%s), "
                           "whose layer costs list %s",
                           file, ip, name, (long long)v, c->name,
                           c->n_options ? known : "none");
        }
    }
    return ERR_OK;
}

/* The stage's arena, when the plan lays one out. */
/* Each object of the stage's arena is one of the stage's (arena.h): a layer of the stage and
 * a micro-batch of the step, or the workspace, which has neither (-1). */
static int check_arena_objects(const struct arena *a, const struct plan_stage *st,
                               int micro_batches, const char *file, const char *path,
                               struct err *e)
{
    for (int i = 0; i < a->n; i++) {
        const struct arena_object *b = &a->objects[i];
        int workspace = b->kind == ARENA_WORKSPACE;
        int layer_ok = workspace ? b->layer == -1 : b->layer >= st->first && b->layer <= st->last;
        int micro_ok = workspace ? b->micro == -1 : b->micro >= 0 && b->micro < micro_batches;
        if (!layer_ok)
            return err_set(e, ERR_INPUT, "%s: %s.objects[%d].layer: %d, expected %s%d..%d", file,
                           path, i, b->layer, workspace ? "-1 (the workspace has none), not " : "",
                           st->first, st->last);
        if (!micro_ok)
            return err_set(e, ERR_INPUT, "%s: %s.objects[%d].micro: %d, expected %s0..%d", file,
                           path, i, b->micro, workspace ? "-1 (the workspace has none), not " : "",
                           micro_batches - 1);
    }
    return ERR_OK;
}

static int read_arena(const cJSON *so, const char *file, const char *path, struct plan_stage *st,
                      int micro_batches, struct err *e)
{
    const cJSON *ao = cJSON_GetObjectItemCaseSensitive(so, "arena");
    if (ao == NULL)
        return ERR_OK;
    char sub[JSONIO_PATH_MAX];
    jsonio_path_key(sub, path, "arena");
    st->arena = calloc(1, sizeof *st->arena);
    if (st->arena == NULL)
        return err_set(e, ERR_FAIL, "%s: out of memory", file);
    ERR_TRY(arena_from_json(ao, file, sub, st->arena, e));
    return check_arena_objects(st->arena, st, micro_batches, file, sub, e);
}

static int check_costs(const struct plan *p, const struct plan_stage *st, const char *file,
                       struct err *e);

/* Where the stage computes is the plan's to say: a plan from before device_kind is refused
 * rather than guessed from device names (re-planning costs milliseconds). */
static int read_device_kind(const cJSON *so, const char *file, const char *path,
                            struct plan_stage *st, struct err *e)
{
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(so, "device_kind");
    if (kind == NULL)
        return err_set(e, ERR_INPUT,
                       "%s: %s.device_kind: missing (the plan predates it); re-plan with "
                       "`ballast plan` to say whether the stage runs on \"cpu\" or \"cuda\"",
                       file, path);
    if (!cJSON_IsString(kind) ||
        (strcmp(kind->valuestring, "cpu") != 0 && strcmp(kind->valuestring, "cuda") != 0))
        return err_set(e, ERR_INPUT, "%s: %s.device_kind: expected \"cpu\" or \"cuda\"", file,
                       path);
    snprintf(st->device_kind, sizeof st->device_kind, "%s", kind->valuestring);
    return ERR_OK;
}

/* "layers": [first, last], starting where the stage before ended; the per-layer arrays
 * allocated for them. */
static int read_layer_range(const cJSON *so, const char *file, const char *path,
                            const struct plan *p, struct plan_stage *st, int expect_first,
                            struct err *e)
{
    char sub[JSONIO_PATH_MAX];
    const cJSON *range = jsonio_array(so, file, path, "layers", sub, e);
    if (range == NULL)
        return e->code;
    int64_t r[2];
    if (cJSON_GetArraySize(range) != 2)
        return err_set(e, ERR_INPUT, "%s: %s: expected [first, last]", file, sub);
    for (int k = 0; k < 2; k++) {
        char ip[JSONIO_PATH_MAX];
        jsonio_path_index(ip, sub, k);
        if (jsonio_int_value(cJSON_GetArrayItem(range, k), file, ip, 0,
                             model_layer_count(&p->model) - 1, &r[k], e))
            return e->code;
    }
    if (r[0] != expect_first || r[1] < r[0])
        return err_set(e, ERR_INPUT,
                       "%s: %s: [%lld, %lld], expected a range starting at layer %d (stages tile "
                       "the model's layers in order)",
                       file, sub, (long long)r[0], (long long)r[1], expect_first);
    st->first = (int)r[0];
    st->last = (int)r[1];
    if (stage_alloc_layers(st))
        return err_set(e, ERR_FAIL, "%s: out of memory", file);
    return ERR_OK;
}

/* "recompute": the layers recomputed whole, each once and within the stage. */
static int read_recompute(const cJSON *so, const char *file, const char *path,
                          struct plan_stage *st, struct err *e)
{
    char sub[JSONIO_PATH_MAX];
    const cJSON *rec = jsonio_array(so, file, path, "recompute", sub, e);
    if (rec == NULL)
        return e->code;
    int k = 0;
    for (const cJSON *it = rec->child; it != NULL; it = it->next, k++) {
        char ip[JSONIO_PATH_MAX];
        int64_t v;
        jsonio_path_index(ip, sub, k);
        if (jsonio_int_value(it, file, ip, st->first, st->last, &v, e))
            return e->code;
        if (st->actions[v - st->first].choice)
            return err_set(e, ERR_INPUT, "%s: %s: layer %lld listed twice", file, ip,
                           (long long)v);
        st->actions[v - st->first].choice = COST_FULL;
    }
    return ERR_OK;
}

/* The stage's memory and time figures, its in-flight count (the schedule's) and its link. */
static int read_figures(const cJSON *so, const char *file, const char *path,
                        struct plan_stage *st, struct err *e)
{
    char sub[JSONIO_PATH_MAX];
    int64_t in_flight;
    if (jsonio_int(so, file, path, "memory_bytes", 0, JSONIO_INT_MAX, &st->memory_bytes, e) ||
        jsonio_int(so, file, path, "memory_limit_bytes", 0, JSONIO_INT_MAX,
                   &st->memory_limit_bytes, e) ||
        jsonio_num(so, file, path, "recompute_ms", 0, DBL_MAX, &st->recompute_ms, e) ||
        jsonio_num(so, file, path, "stage_ms", 0, DBL_MAX, &st->stage_ms, e))
        return e->code;
    st->capacity_bytes = st->memory_limit_bytes;
    in_flight = st->in_flight; /* the schedule's (plan_from_json) */
    if (jsonio_int_opt(so, file, path, "capacity_bytes", 1, JSONIO_INT_MAX, &st->capacity_bytes,
                       e) ||
        jsonio_int_opt(so, file, path, "memory_before_bytes", 0, JSONIO_INT_MAX,
                       &st->memory_before_bytes, e) ||
        jsonio_int_opt(so, file, path, "in_flight", in_flight, in_flight, &in_flight, e))
        return e->code;
    st->in_flight = (int)in_flight;
    const cJSON *link = cJSON_GetObjectItemCaseSensitive(so, "link");
    if (link != NULL) {
        jsonio_path_key(sub, path, "link");
        if (link_from_json(link, file, sub, 0, &st->link, e))
            return e->code;
    }
    return ERR_OK;
}

/* "layer_costs": one per layer, named as the model names it, with no split backward under a
 * schedule that runs the backward whole. */
static int read_layer_costs(const cJSON *so, const char *file, const char *path,
                            const struct plan *p, struct plan_stage *st, struct err *e)
{
    char sub[JSONIO_PATH_MAX];
    int n = plan_stage_layer_count(st), k = 0;
    const cJSON *costs = jsonio_array(so, file, path, "layer_costs", sub, e);
    if (costs == NULL)
        return e->code;
    if (cJSON_GetArraySize(costs) != n)
        return err_set(e, ERR_INPUT, "%s: %s: %d entries for the stage's %d layers", file, sub,
                       cJSON_GetArraySize(costs), n);
    for (const cJSON *it = costs->child; it != NULL; it = it->next, k++) {
        char ip[JSONIO_PATH_MAX];
        const struct layer_cost *c = &st->layers[k];
        jsonio_path_index(ip, sub, k);
        if (layer_cost_from_json(it, file, ip, &st->layers[k], e) ||
            profile_check_layer_name(&p->model, st->first + k, c->name, file, ip, e))
            return e->code;
        if (!schedule_splits(p->schedule) && c->wgrad_bytes + c->wgrad_ms > 0)
            return err_set(e, ERR_INPUT, "%s: %s.wgrad_bytes: %lld (wgrad_ms %g), but schedule %s "
                           "runs the backward whole", file, ip, (long long)c->wgrad_bytes,
                           c->wgrad_ms, schedule_name(p->schedule));
    }
    return ERR_OK;
}

/* One stage of a plan file: what it is and where, its layers and choices, its figures, its
 * actions beyond recomputation, and (one chunk a GPU) its numbers against the cost model. */
static int read_plan_stage(const cJSON *so, const char *file, int s, struct plan *p,
                           int expect_first, struct err *e)
{
    char path[JSONIO_PATH_MAX];
    int64_t v;
    struct plan_stage *st = &p->stages[s];
    jsonio_path_index(path, "stages", s);
    if (jsonio_expect_object(so, file, path, e) ||
        jsonio_int(so, file, path, "index", s, s, &v, e) ||
        jsonio_str_copy(so, file, path, "device", st->device, sizeof st->device, e) ||
        read_device_kind(so, file, path, st, e))
        return e->code;
    st->index = s;
    if (read_layer_range(so, file, path, p, st, expect_first, e) ||
        read_recompute(so, file, path, st, e) || read_figures(so, file, path, st, e) ||
        read_layer_costs(so, file, path, p, st, e))
        return e->code;
    if (read_options(so, file, path, st, e) || plan_offload_from_json(so, file, path, st, e) ||
        plan_optimizer_from_json(so, file, path, st, e) ||
        plan_optimizer_check(file, path, st, e) ||
        plan_optimizer_fraction_check(so, file, path, st, e))
        return e->code;
    if (read_arena(so, file, path, st, p->micro_batches, e) ||
        plan_group_from_json(so, file, path, st, e))
        return e->code;
    int64_t gpu = s;
    if (jsonio_int_opt(so, file, path, "gpu", st->gpu, st->gpu, &gpu, e))
        return e->code;
    if (st->memory_limit_bytes > st->capacity_bytes)
        return err_set(e, ERR_INPUT, "%s: %s.memory_limit_bytes: %lld is above capacity_bytes %lld",
                       file, path, (long long)st->memory_limit_bytes,
                       (long long)st->capacity_bytes);
    /* a GPU's chunks are costed together, once every stage is read (plan_from_json) */
    return p->virtual_stages > 1 ? ERR_OK : check_costs(p, st, file, e);
}

/* The numbers must be the cost model's for the stated choice: a plan edited by hand (or for
 * another model) is refused rather than trained with wrong limits. */
static int check_costs(const struct plan *p, const struct plan_stage *st, const char *file,
                       struct err *e)
{
    char path[JSONIO_PATH_MAX];
    jsonio_path_index(path, "stages", st->index);
    struct stage_cost c;
    plan_stage_cost(p, st, &c);
    if (st->arena != NULL)
        c.memory_bytes = cost_memory_with_arena(&c, st->arena->bytes);
    if (c.memory_bytes != st->memory_bytes)
        return err_set(e, ERR_INPUT,
                       "%s: %s.memory_bytes: %lld, but the cost model gives %lld for these "
                       "layers and recompute set%s",
                       file, path, (long long)st->memory_bytes, (long long)c.memory_bytes,
                       p->virtual_stages > 1 ? " (with the other chunks of its GPU)" : "");
    if (plan_offload_check(&c, file, path, st, e) || plan_stream_check(p, st, file, path, e))
        return e->code;
    if (fabs(c.stage_ms - st->stage_ms) > 1e-6 + 1e-9 * c.stage_ms ||
        fabs(c.recompute_ms - st->recompute_ms) > 1e-6 + 1e-9 * c.recompute_ms)
        return err_set(e, ERR_INPUT,
                       "%s: %s: stage_ms %g and recompute_ms %g, but the cost model gives %g and "
                       "%g",
                       file, path, st->stage_ms, st->recompute_ms, c.stage_ms, c.recompute_ms);
    if (st->memory_bytes > st->memory_limit_bytes)
        return err_set(e, ERR_INPUT,
                       "%s: %s.memory_bytes: %lld is above memory_limit_bytes %lld: the stage "
                       "does not fit",
                       file, path, (long long)st->memory_bytes, (long long)st->memory_limit_bytes);
    return ERR_OK;
}

/* "framework": {"target", "activations", "attention"}; absent: Ballast's own, the model's
 * attention (plans from before it). */
static int read_framework(const cJSON *root, const char *file, struct plan *p, struct err *e)
{
    struct plan_framework *f = &p->framework;
    snprintf(f->target, sizeof f->target, "ballast");
    snprintf(f->activations, sizeof f->activations, "ballast");
    f->attention = p->model.attention;
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, "framework");
    const char *att;
    if (o == NULL)
        return ERR_OK;
    if (jsonio_expect_object(o, file, "framework", e) ||
        jsonio_str_copy(o, file, "framework", "target", f->target, sizeof f->target, e) ||
        jsonio_str_copy(o, file, "framework", "activations", f->activations,
                        sizeof f->activations, e) ||
        jsonio_str(o, file, "framework", "attention", &att, e))
        return e->code;
    if (strcmp(att, "flash") == 0)
        f->attention = MODEL_ATTENTION_FLASH;
    else if (strcmp(att, "materialized") == 0)
        f->attention = MODEL_ATTENTION_MATERIALIZED;
    else
        return err_set(e, ERR_INPUT,
                       "%s: framework.attention: \"%s\", expected \"flash\" or \"materialized\"",
                       file, att);
    return ERR_OK;
}

/* "schedule", "virtual_stages" and the stages' in-flight counts and GPUs the schedule gives:
 * what each stage's "in_flight" and "gpu" must say. */
static int read_shape(const cJSON *root, const char *file, int S, struct plan *p, struct err *e)
{
    const char *sched;
    int64_t v = 1;
    if (jsonio_str(root, file, "", "schedule", &sched, e) ||
        jsonio_int_opt(root, file, "", "virtual_stages", 1, SCHEDULE_CHUNKS_MAX, &v, e))
        return e->code;
    if (schedule_parse(sched, &p->schedule) != 0)
        return err_set(e, ERR_INPUT, "%s: schedule: \"%s\", expected %s", file, sched,
                       schedule_names());
    p->virtual_stages = (int)v;
    if (p->schedule == SCHEDULE_V_HALF && v == 1)
        p->virtual_stages = 2;
    if (S % p->virtual_stages != 0)
        return err_set(e, ERR_INPUT, "%s: stages: %d stages, not a multiple of virtual_stages %d",
                       file, S, p->virtual_stages);
    struct schedule_shape sh = plan_shape(p);
    if (schedule_check(&sh, e)) {
        char why[ERR_MSG_MAX];
        snprintf(why, sizeof why, "%s", e->msg);
        return err_set(e, ERR_INPUT, "%s: %s", file, why);
    }
    int *flights = malloc((size_t)S * sizeof *flights);
    if (flights == NULL || schedule_in_flights(&sh, flights, e)) {
        free(flights);
        return e->code ? e->code : err_set(e, ERR_FAIL, "%s: out of memory", file);
    }
    for (int s = 0; s < S; s++) {
        int chunk;
        p->stages[s].in_flight = flights[s];
        p->stages[s].gpu = schedule_gpu(&sh, s, &chunk);
    }
    free(flights);
    return ERR_OK;
}

/* The plan's header: format, method, micro-batches, model, framework and step numbers. */
static int read_plan_header(const cJSON *root, const char *file, struct plan *p, struct err *e)
{
    int64_t v;
    if (jsonio_check_format(root, file, "plan", 1, e) ||
        jsonio_str_copy(root, file, "", "method", p->method, sizeof p->method, e))
        return e->code;
    if (jsonio_int(root, file, "", "micro_batches", 1, 1 << 20, &v, e))
        return e->code;
    p->micro_batches = (int)v;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model == NULL)
        return err_set(e, ERR_INPUT, "%s: model: missing", file);
    if (model_from_json(model, file, "model", &p->model, e))
        return e->code;
    if (model_layer_count(&p->model) == 0)
        return err_set(e, ERR_INPUT, "%s: model.layer_count: missing (a plan of a custom model "
                       "says how many layers it has)", file);
    if (read_framework(root, file, p, e) ||
        jsonio_num(root, file, "", "iteration_ms", 0, DBL_MAX, &p->iteration_ms, e) ||
        jsonio_int_opt(root, file, "", "reserve_bytes", 0, JSONIO_INT_MAX, &p->reserve_bytes, e) ||
        jsonio_int_opt(root, file, "", "unit_bytes", 1, JSONIO_INT_MAX, &p->unit_bytes, e) ||
        jsonio_num_opt(root, file, "", "optimality_gap", 0, DBL_MAX, &p->optimality_gap, e) ||
        jsonio_num_opt(root, file, "", "min_gain", 0, 1, &p->min_gain, e) ||
        jsonio_num_opt(root, file, "", "fastest_ms", 0, DBL_MAX, &p->fastest_ms, e))
        return e->code;
    return ERR_OK;
}

/* "stages": each stage, its layers following the last one's, every layer in one. */
static int read_plan_stages(const cJSON *root, const char *file, struct plan *p, struct err *e)
{
    const cJSON *stages = cJSON_GetObjectItemCaseSensitive(root, "stages");
    if (stages == NULL)
        return err_set(e, ERR_INPUT, "%s: stages: missing", file);
    if (jsonio_expect_array(stages, file, "stages", e))
        return e->code;
    int S = cJSON_GetArraySize(stages);
    if (S < 1 || S > model_layer_count(&p->model))
        return err_set(e, ERR_INPUT, "%s: stages: %d stages for a model of %d layers", file, S,
                       model_layer_count(&p->model));
    p->stages = calloc((size_t)S, sizeof *p->stages);
    if (p->stages == NULL)
        return err_set(e, ERR_FAIL, "%s: out of memory", file);
    p->n_stages = S;
    if (read_shape(root, file, S, p, e))
        return e->code;
    int s = 0, next = 0;
    for (const cJSON *so = stages->child; so != NULL; so = so->next, s++) {
        if (read_plan_stage(so, file, s, p, next, e))
            return e->code;
        next = p->stages[s].last + 1;
    }
    for (s = 0; p->virtual_stages > 1 && s < S; s++)
        if (check_costs(p, &p->stages[s], file, e))
            return e->code;
    if (next != model_layer_count(&p->model))
        return err_set(e, ERR_INPUT, "%s: stages[%d].layers: ends at %d, leaving layers %d..%d in "
                       "no stage", file, S - 1, next - 1, next, model_layer_count(&p->model) - 1);
    return ERR_OK;
}

/* The plan's summary: its bottleneck and most loaded stages, and --verify's answer. */
static int read_plan_summary(const cJSON *root, const char *file, struct plan *p, struct err *e)
{
    int64_t v;
    int S = p->n_stages;
    if (jsonio_int(root, file, "", "bottleneck_stage", 0, S - 1, &v, e))
        return e->code;
    p->bottleneck_stage = (int)v;
    v = 0;
    if (jsonio_int_opt(root, file, "", "most_loaded_stage", 0, S - 1, &v, e))
        return e->code;
    p->most_loaded_stage = (int)v;
    const cJSON *verify = cJSON_GetObjectItemCaseSensitive(root, "verify");
    if (verify == NULL)
        return ERR_OK;
    if (jsonio_expect_object(verify, file, "verify", e) ||
        jsonio_num(verify, file, "verify", "milp_objective", -DBL_MAX, DBL_MAX,
                   &p->verify.milp_objective, e) ||
        jsonio_num(verify, file, "verify", "dp_objective", -DBL_MAX, DBL_MAX,
                   &p->verify.dp_objective, e) ||
        jsonio_bool(verify, file, "verify", "agree", &p->verify.agree, e))
        return e->code;
    p->verify.present = 1;
    return ERR_OK;
}

static int plan_from_json(const cJSON *root, const char *file, struct plan *p, struct err *e)
{
    if (read_plan_header(root, file, p, e) || read_plan_stages(root, file, p, e) ||
        plan_group_check(p, file, e) || plan_dealing_from_json(root, file, p, e) ||
        read_plan_summary(root, file, p, e))
        return e->code;
    return ERR_OK;
}

int plan_parse(const cJSON *root, const char *where, struct plan *p, struct err *e)
{
    memset(p, 0, sizeof *p);
    p->optimality_gap = -1;
    int rc = plan_from_json(root, where, p, e);
    if (rc)
        plan_free(p);
    return rc;
}

int plan_load(const char *file, struct plan *p, struct err *e)
{
    memset(p, 0, sizeof *p);
    cJSON *root = jsonio_read_kind(file, JSONIO_PLAN, e);
    if (root == NULL)
        return e->code;
    int rc = plan_parse(root, file, p, e);
    cJSON_Delete(root);
    return rc;
}
