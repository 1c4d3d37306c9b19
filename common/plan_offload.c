/* A plan stage's offload fields (docs/formats.md "Plan"): per layer the place of what it keeps,
 * the option it sends to the host, and the prefetch trigger; per stage the host memory H,
 * the host limit, the host link, the copy time and the device staging. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "jsonio.h"
#include "plan.h"

struct cost_actions plan_stage_actions(const struct plan_stage *st)
{
    return (struct cost_actions){st->actions, st->optimizer, st->optimizer_from};
}

double plan_stage_optimizer_fraction(const struct plan_stage *st)
{
    return st->optimizer == COST_PLACE_HOST
               ? cost_optimizer_fraction(st->layers, plan_stage_layer_count(st),
                                         st->optimizer_from)
               : 0;
}

struct cost_row plan_stage_row(const struct plan_stage *st, int l)
{
    return cost_action_row(&st->layers[l], &st->actions[l]);
}

void plan_stage_choices(const struct plan_stage *st, unsigned char *choice)
{
    for (int l = 0; l < plan_stage_layer_count(st); l++)
        choice[l] = st->actions[l].choice;
}

void plan_stage_set_choices(struct plan_stage *st, const unsigned char *choice)
{
    for (int l = 0; l < plan_stage_layer_count(st); l++)
        st->actions[l].choice = choice[l];
}

int plan_stage_offloads(const struct plan_stage *st)
{
    for (int l = 0; l < plan_stage_layer_count(st); l++)
        if (plan_stage_row(st, l).host_bytes > 0)
            return 1;
    return 0;
}

double plan_stage_copy_ms(const struct plan_stage *st)
{
    double ms = 0;
    for (int l = 0; l < plan_stage_layer_count(st); l++) {
        int64_t bytes = plan_stage_row(st, l).host_bytes;
        if (bytes > 0)
            ms += link_transfer_ms(&st->host_link, bytes);
    }
    return ms;
}

int plan_stage_streams(const struct plan_stage *st)
{
    int n = plan_stage_layer_count(st), k = 0;
    while (k < n && st->actions[n - 1 - k].weights == COST_PLACE_HOST)
        k++;
    return k;
}

/* "offload_weights": the layers whose weights stream from host memory (cost.h). */
static void weights_to_json(const struct plan_stage *st, cJSON *so)
{
    int n = plan_stage_layer_count(st), k = plan_stage_streams(st);
    if (k == 0)
        return;
    cJSON *list = cJSON_AddArrayToObject(so, "offload_weights");
    for (int l = n - k; l < n; l++)
        cJSON_AddItemToArray(list, cJSON_CreateNumber(st->first + l));
}

void plan_offload_to_json(const struct plan_stage *st, cJSON *so)
{
    weights_to_json(st, so);
    if (st->host_limit_bytes == 0 && !plan_stage_offloads(st))
        return;
    int n = plan_stage_layer_count(st);
    cJSON *off = cJSON_AddArrayToObject(so, "offload");
    cJSON *opts = cJSON_AddArrayToObject(so, "offload_options");
    cJSON *pre = cJSON_AddArrayToObject(so, "prefetch");
    for (int l = 0; l < n; l++) {
        if (st->actions[l].place == COST_PLACE_HOST)
            cJSON_AddItemToArray(off, cJSON_CreateNumber(st->first + l));
        if (st->actions[l].offload_option >= 0) {
            cJSON *item = cJSON_CreateObject();
            cJSON_AddNumberToObject(item, "layer", st->first + l);
            cJSON_AddStringToObject(item, "option",
                                    st->layers[l].options[st->actions[l].offload_option].name);
            cJSON_AddItemToArray(opts, item);
        }
        if (st->actions[l].prefetch_ahead > 0) {
            cJSON *item = cJSON_CreateObject();
            cJSON_AddNumberToObject(item, "layer", st->first + l);
            cJSON_AddNumberToObject(item, "ahead", st->actions[l].prefetch_ahead);
            cJSON_AddItemToArray(pre, item);
        }
    }
    jsonio_add_int(so, "host_memory_bytes", st->host_memory_bytes);
    jsonio_add_int(so, "host_limit_bytes", st->host_limit_bytes);
    jsonio_add_int(so, "staging_bytes", st->staging_bytes);
    cJSON_AddNumberToObject(so, "copy_ms", st->copy_ms);
    if (st->host_link.present)
        cJSON_AddItemToObject(so, "host_link", link_to_json(&st->host_link));
}

/* A list of global layer indices of the stage, or objects with "layer"; `each` reads one
 * entry (its layer index relative to the stage in l). */
typedef int (*entry_fn)(const cJSON *it, const char *file, const char *ip, int l,
                        struct plan_stage *st, struct err *e);

static int read_list(const cJSON *so, const char *file, const char *path, const char *key,
                     entry_fn each, struct plan_stage *st, struct err *e)
{
    char sub[JSONIO_PATH_MAX];
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(so, key);
    if (list == NULL)
        return ERR_OK;
    jsonio_path_key(sub, path, key);
    if (jsonio_expect_array(list, file, sub, e))
        return e->code;
    int k = 0;
    for (const cJSON *it = list->child; it != NULL; it = it->next, k++) {
        char ip[JSONIO_PATH_MAX];
        int64_t v;
        jsonio_path_index(ip, sub, k);
        if (cJSON_IsObject(it) ? jsonio_int(it, file, ip, "layer", st->first, st->last, &v, e)
                               : jsonio_int_value(it, file, ip, st->first, st->last, &v, e))
            return e->code;
        if (each(it, file, ip, (int)(v - st->first), st, e))
            return e->code;
    }
    return ERR_OK;
}

static int read_offload(const cJSON *it, const char *file, const char *ip, int l,
                        struct plan_stage *st, struct err *e)
{
    (void)it;
    if (st->actions[l].place == COST_PLACE_HOST)
        return err_set(e, ERR_INPUT, "%s: %s: layer %d listed twice", file, ip, st->first + l);
    st->actions[l].place = COST_PLACE_HOST;
    return ERR_OK;
}

static int read_weights(const cJSON *it, const char *file, const char *ip, int l,
                        struct plan_stage *st, struct err *e)
{
    (void)it;
    if (st->actions[l].weights == COST_PLACE_HOST)
        return err_set(e, ERR_INPUT, "%s: %s: layer %d listed twice", file, ip, st->first + l);
    st->actions[l].weights = COST_PLACE_HOST;
    return ERR_OK;
}

static int read_offload_option(const cJSON *it, const char *file, const char *ip, int l,
                               struct plan_stage *st, struct err *e)
{
    const char *name;
    const struct layer_cost *c = &st->layers[l];
    if (jsonio_str(it, file, ip, "option", &name, e))
        return e->code;
    if (st->actions[l].choice != COST_KEEP || st->actions[l].place != COST_PLACE_DEVICE ||
        st->actions[l].offload_option >= 0)
        return err_set(e, ERR_INPUT,
                       "%s: %s.layer: layer %d is recomputed, offloaded whole or listed twice "
                       "(an option goes to the host only from a kept layer on the device)",
                       file, ip, st->first + l);
    for (int k = 0; k < c->n_options; k++)
        if (strcmp(c->options[k].name, name) == 0)
            st->actions[l].offload_option = (signed char)k;
    if (st->actions[l].offload_option < 0)
        return err_set(e, ERR_INPUT, "%s: %s.option: \"%s\" is not an option of layer %d (%s)",
                       file, ip, name, st->first + l, c->name);
    return ERR_OK;
}

static int read_prefetch(const cJSON *it, const char *file, const char *ip, int l,
                         struct plan_stage *st, struct err *e)
{
    int64_t ahead;
    if (!cJSON_IsObject(it))
        return err_set(e, ERR_INPUT, "%s: %s: expected {\"layer\", \"ahead\"}", file, ip);
    if (jsonio_int(it, file, ip, "ahead", 1, 1 << 20, &ahead, e))
        return e->code;
    if (st->actions[l].prefetch_ahead > 0)
        return err_set(e, ERR_INPUT, "%s: %s: layer %d listed twice", file, ip, st->first + l);
    st->actions[l].prefetch_ahead = (int)ahead;
    return ERR_OK;
}

int plan_offload_from_json(const cJSON *so, const char *file, const char *path,
                           struct plan_stage *st, struct err *e)
{
    const cJSON *host_link = cJSON_GetObjectItemCaseSensitive(so, "host_link");
    char lp[JSONIO_PATH_MAX];
    jsonio_path_key(lp, path, "host_link");
    if (read_list(so, file, path, "offload", read_offload, st, e) ||
        read_list(so, file, path, "offload_weights", read_weights, st, e) ||
        read_list(so, file, path, "offload_options", read_offload_option, st, e) ||
        read_list(so, file, path, "prefetch", read_prefetch, st, e) ||
        jsonio_int_opt(so, file, path, "host_memory_bytes", 0, JSONIO_INT_MAX,
                       &st->host_memory_bytes, e) ||
        jsonio_int_opt(so, file, path, "host_limit_bytes", 0, JSONIO_INT_MAX,
                       &st->host_limit_bytes, e) ||
        jsonio_int_opt(so, file, path, "staging_bytes", 0, JSONIO_INT_MAX, &st->staging_bytes,
                       e) ||
        jsonio_num_opt(so, file, path, "copy_ms", 0, 1e300, &st->copy_ms, e) ||
        (host_link != NULL && link_from_json(host_link, file, lp, 0, &st->host_link, e)))
        return e->code;
    for (int l = 0; l < plan_stage_layer_count(st); l++) {
        int sent = layer_action_offloads(&st->actions[l]);
        if (sent != (st->actions[l].prefetch_ahead > 0))
            return err_set(e, ERR_INPUT,
                           "%s: %s.prefetch: layer %d %s, so it %s a prefetch entry", file, path,
                           st->first + l, sent ? "is offloaded" : "offloads nothing",
                           sent ? "needs" : "takes no");
    }
    return ERR_OK;
}

int plan_optimizer_check(const char *file, const char *path, const struct plan_stage *st,
                           struct err *e)
{
    int missing, from = st->optimizer_from;
    if (st->optimizer != COST_PLACE_HOST ||
        cost_optimizer_movable(st->layers + from, plan_stage_layer_count(st) - from, &missing))
        return ERR_OK;
    missing += from;
    return err_set(e, ERR_INPUT,
                   "%s: %s.optimizer: on the host, but layer %d (%s) has no param_bytes, "
                   "grad_bytes and optimizer_bytes: without the split of its state_bytes the "
                   "stage cannot host its optimizer",
                   file, path, st->first + missing, st->layers[missing].name);
}

int plan_stream_check(const struct plan *p, const struct plan_stage *st, const char *file,
                      const char *path, struct err *e)
{
    int n = plan_stage_layer_count(st), k = plan_stage_streams(st), listed = 0;
    for (int l = 0; l < n; l++)
        listed += st->actions[l].weights == COST_PLACE_HOST;
    if (listed == 0)
        return ERR_OK;
    if (listed != k)
        return err_set(e, ERR_INPUT, "%s: %s.offload_weights: %d layers, but not the stage's "
                       "last ones: weights stream from host memory for a stage's last layers",
                       file, path, listed);
    if (st->optimizer != COST_PLACE_HOST || st->optimizer_from > n - k)
        return err_set(e, ERR_INPUT, "%s: %s.offload_weights: layers %d-%d stream their "
                       "weights, which needs their optimizer on the host (\"optimizer\": "
                       "\"host\" for them)", file, path, st->last - k + 1, st->last);
    if ((p->schedule != SCHEDULE_1F1B && p->schedule != SCHEDULE_GPIPE) ||
        p->virtual_stages > 1 || st->dp > 1 || st->tp > 1 || st->arena != NULL ||
        p->model.dtype == MODEL_DTYPE_FP16)
        return err_set(e, ERR_INPUT, "%s: %s.offload_weights: streamed weights run with "
                       "schedules 1f1b and gpipe, one stage a GPU, tp and dp 1, no arena and "
                       "no fp16 loss scaling (schedule %s, dp %d, tp %d, dtype %s)", file, path,
                       schedule_name(p->schedule), st->dp, st->tp,
                       model_dtype_name(p->model.dtype));
    return ERR_OK;
}

int plan_offload_check(const struct stage_cost *c, const char *file, const char *path,
                       const struct plan_stage *st, struct err *e)
{
    int offloads = plan_stage_offloads(st);
    if (!offloads && st->optimizer != COST_PLACE_HOST)
        return ERR_OK;
    if (st->host_limit_bytes == 0 || !st->host_link.present)
        return err_set(e, ERR_INPUT,
                       "%s: %s: %s, but has host_limit_bytes %lld and %s host_link", file, path,
                       offloads ? "offloads" : "has its optimizer on the host",
                       (long long)st->host_limit_bytes, st->host_link.present ? "a" : "no");
    if (c->host_memory_bytes != st->host_memory_bytes || c->staging_bytes != st->staging_bytes)
        return err_set(e, ERR_INPUT,
                       "%s: %s: host_memory_bytes %lld and staging_bytes %lld, but the cost model "
                       "gives %lld and %lld",
                       file, path, (long long)st->host_memory_bytes, (long long)st->staging_bytes,
                       (long long)c->host_memory_bytes, (long long)c->staging_bytes);
    if (st->host_memory_bytes > st->host_limit_bytes)
        return err_set(e, ERR_INPUT,
                       "%s: %s.host_memory_bytes: %lld is above host_limit_bytes %lld: the "
                       "stage does not fit its host memory",
                       file, path, (long long)st->host_memory_bytes,
                       (long long)st->host_limit_bytes);
    double copy = plan_stage_copy_ms(st);
    if (fabs(copy - st->copy_ms) > 1e-6 + 1e-9 * copy)
        return err_set(e, ERR_INPUT, "%s: %s.copy_ms: %g, but the host link gives %g", file,
                       path, st->copy_ms, copy);
    return ERR_OK;
}
