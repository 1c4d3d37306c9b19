#include "profile.h"

#include <stdlib.h>
#include <string.h>

#include "jsonio.h"
#include "model_kind.h"
#include "units.h"

int link_from_json(const cJSON *obj, const char *file, const char *path, int strict,
                   struct link *l, struct err *e)
{
    static const char *const keys[] = {"gbps", "latency_us", NULL};
    l->latency_us = 0;
    if (jsonio_expect_object(obj, file, path, e) ||
        (strict && jsonio_check_keys(obj, file, path, keys, e)) ||
        units_json_rate(obj, file, path, "gbps", 1e9, 1e-6, 1e9, &l->gbps, e) ||
        units_json_us_opt(obj, file, path, "latency_us", 0, 1e9, &l->latency_us, e))
        return e->code;
    l->present = 1;
    return ERR_OK;
}

cJSON *link_to_json(const struct link *l)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "gbps", l->gbps);
    cJSON_AddNumberToObject(o, "latency_us", l->latency_us);
    return o;
}

double link_transfer_ms(const struct link *l, int64_t bytes)
{
    if (!l->present)
        return 0.0;
    return l->latency_us * 1e-3 + (double)bytes * 8.0 / (l->gbps * 1e9) * 1e3;
}

static int option_from_json(const cJSON *obj, const char *file, const char *path,
                            const struct layer_cost *c, struct recompute_option *o,
                            struct err *e)
{
    char sub[JSONIO_PATH_MAX];
    if (jsonio_expect_object(obj, file, path, e) ||
        jsonio_str_copy(obj, file, path, "name", o->name, sizeof o->name, e) ||
        units_json_bytes(obj, file, path, "kept_bytes", 0, JSONIO_INT_MAX, &o->kept_bytes, e) ||
        units_json_bytes(obj, file, path, "transient_bytes", 0, JSONIO_INT_MAX,
                         &o->transient_bytes, e) ||
        jsonio_num(obj, file, path, "recompute_ms", 0, PROFILE_MS_MAX, &o->recompute_ms, e))
        return e->code;
    jsonio_path_key(sub, path, "name");
    if (o->name[0] == '\0' || strcmp(o->name, "keep") == 0 || strcmp(o->name, "full") == 0)
        return err_set(e, ERR_INPUT,
                       "%s: %s: \"%s\": an option needs a name other than \"\", \"keep\" and "
                       "\"full\" (every layer has those two choices already)",
                       file, sub, o->name);
    if (o->kept_bytes < c->ckpt_bytes || o->kept_bytes + o->transient_bytes != c->act_bytes) {
        jsonio_path_key(sub, path, "kept_bytes");
        return err_set(e, ERR_INPUT,
                       "%s: %s: %lld, with transient_bytes %lld: expected ckpt_bytes %lld <= "
                       "kept_bytes and kept_bytes + transient_bytes = act_bytes %lld (what the "
                       "option keeps and what it regenerates make up the layer's activations)",
                       file, sub, (long long)o->kept_bytes, (long long)o->transient_bytes,
                       (long long)c->ckpt_bytes, (long long)c->act_bytes);
    }
    return ERR_OK;
}

static int options_from_json(const cJSON *obj, const char *file, const char *path,
                             struct layer_cost *c, struct err *e)
{
    char sub[JSONIO_PATH_MAX];
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(obj, "recompute_options");
    c->n_options = 0;
    if (list == NULL)
        return ERR_OK;
    jsonio_path_key(sub, path, "recompute_options");
    if (jsonio_expect_array(list, file, sub, e))
        return e->code;
    if (cJSON_GetArraySize(list) > PROFILE_OPTIONS_MAX)
        return err_set(e, ERR_INPUT, "%s: %s: %d options, at most %d", file, sub,
                       cJSON_GetArraySize(list), PROFILE_OPTIONS_MAX);
    for (const cJSON *it = list->child; it != NULL; it = it->next) {
        char ip[JSONIO_PATH_MAX];
        struct recompute_option *o = &c->options[c->n_options];
        jsonio_path_index(ip, sub, c->n_options);
        if (option_from_json(it, file, ip, c, o, e))
            return e->code;
        for (int k = 0; k < c->n_options; k++)
            if (strcmp(c->options[k].name, o->name) == 0)
                return err_set(e, ERR_INPUT, "%s: %s.name: \"%s\" is also option %d's name",
                               file, ip, o->name, k);
        c->n_options++;
    }
    return ERR_OK;
}

/* The optional state split and optimizer times (docs/formats.md "Profile"). */
static int split_from_json(const cJSON *obj, const char *file, const char *path,
                           struct layer_cost *c, struct err *e)
{
    static const char *const keys[3] = {"param_bytes", "grad_bytes", "optimizer_bytes"};
    int64_t *dst[3] = {&c->param_bytes, &c->grad_bytes, &c->optimizer_bytes};
    int given = 0;
    c->optimizer_ms = c->host_optimizer_ms = 0;
    c->param_bytes = c->grad_bytes = c->optimizer_bytes = -1;
    for (int k = 0; k < 3; k++) {
        if (units_json_bytes_opt(obj, file, path, keys[k], 0, JSONIO_INT_MAX, dst[k], e))
            return e->code;
        given += *dst[k] >= 0;
    }
    if (jsonio_num_opt(obj, file, path, "optimizer_ms", 0, PROFILE_MS_MAX, &c->optimizer_ms, e) ||
        jsonio_num_opt(obj, file, path, "host_optimizer_ms", 0, PROFILE_MS_MAX,
                       &c->host_optimizer_ms, e))
        return e->code;
    c->has_split = given == 3;
    c->wgrad_bytes = 0;
    c->wgrad_ms = 0;
    if (jsonio_int_opt(obj, file, path, "wgrad_bytes", 0, JSONIO_INT_MAX, &c->wgrad_bytes, e) ||
        jsonio_num_opt(obj, file, path, "wgrad_ms", 0, c->bwd_ms, &c->wgrad_ms, e))
        return e->code;
    c->split_bytes = c->wgrad_bytes;
    c->split_ms = c->wgrad_ms;
    if (given == 0) {
        c->param_bytes = c->grad_bytes = c->optimizer_bytes = 0;
        return ERR_OK;
    }
    if (given != 3 ||
        (__int128)c->param_bytes + c->grad_bytes + c->optimizer_bytes != c->state_bytes)
        return err_set(e, ERR_INPUT,
                       "%s: %s: param_bytes %lld, grad_bytes %lld, optimizer_bytes %lld (-1: "
                       "absent), state_bytes %lld: expected all three, summing to state_bytes",
                       file, path, (long long)c->param_bytes, (long long)c->grad_bytes,
                       (long long)c->optimizer_bytes, (long long)c->state_bytes);
    return ERR_OK;
}

int layer_cost_from_json(const cJSON *obj, const char *file, const char *path,
                         struct layer_cost *c, struct err *e)
{
    if (jsonio_expect_object(obj, file, path, e) ||
        jsonio_str_copy(obj, file, path, "name", c->name, sizeof c->name, e) ||
        jsonio_num(obj, file, path, "fwd_ms", 0, PROFILE_MS_MAX, &c->fwd_ms, e) ||
        jsonio_num(obj, file, path, "bwd_ms", 0, PROFILE_MS_MAX, &c->bwd_ms, e) ||
        units_json_bytes(obj, file, path, "state_bytes", 0, JSONIO_INT_MAX, &c->state_bytes, e) ||
        units_json_bytes(obj, file, path, "act_bytes", 0, JSONIO_INT_MAX, &c->act_bytes, e) ||
        units_json_bytes(obj, file, path, "ckpt_bytes", 0, JSONIO_INT_MAX, &c->ckpt_bytes, e) ||
        units_json_bytes(obj, file, path, "out_bytes", 0, JSONIO_INT_MAX, &c->out_bytes, e) ||
        units_json_bytes(obj, file, path, "workspace_bytes", 0, JSONIO_INT_MAX,
                         &c->workspace_bytes, e))
        return e->code;
    if (c->ckpt_bytes > c->act_bytes) {
        char sub[JSONIO_PATH_MAX];
        jsonio_path_key(sub, path, "ckpt_bytes");
        return err_set(e, ERR_INPUT,
                       "%s: %s: %lld is more than act_bytes %lld (a recomputed layer keeps at "
                       "most what it keeps otherwise)",
                       file, sub, (long long)c->ckpt_bytes, (long long)c->act_bytes);
    }
    if (options_from_json(obj, file, path, c, e) || split_from_json(obj, file, path, c, e))
        return e->code;
    return ERR_OK;
}

cJSON *layer_cost_to_json(const struct layer_cost *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddNumberToObject(o, "fwd_ms", c->fwd_ms);
    cJSON_AddNumberToObject(o, "bwd_ms", c->bwd_ms);
    jsonio_add_int(o, "state_bytes", c->state_bytes);
    jsonio_add_int(o, "act_bytes", c->act_bytes);
    jsonio_add_int(o, "ckpt_bytes", c->ckpt_bytes);
    jsonio_add_int(o, "out_bytes", c->out_bytes);
    jsonio_add_int(o, "workspace_bytes", c->workspace_bytes);
    if (c->has_split) {
        jsonio_add_int(o, "param_bytes", c->param_bytes);
        jsonio_add_int(o, "grad_bytes", c->grad_bytes);
        jsonio_add_int(o, "optimizer_bytes", c->optimizer_bytes);
    }
    if (c->optimizer_ms > 0)
        cJSON_AddNumberToObject(o, "optimizer_ms", c->optimizer_ms);
    if (c->host_optimizer_ms > 0)
        cJSON_AddNumberToObject(o, "host_optimizer_ms", c->host_optimizer_ms);
    if (c->wgrad_bytes > 0 || c->wgrad_ms > 0) { /* what the cost model applies */
        jsonio_add_int(o, "wgrad_bytes", c->wgrad_bytes);
        cJSON_AddNumberToObject(o, "wgrad_ms", c->wgrad_ms);
    }
    if (c->n_options > 0) {
        cJSON *list = cJSON_AddArrayToObject(o, "recompute_options");
        for (int k = 0; k < c->n_options; k++) {
            cJSON *opt = cJSON_CreateObject();
            cJSON_AddStringToObject(opt, "name", c->options[k].name);
            jsonio_add_int(opt, "kept_bytes", c->options[k].kept_bytes);
            jsonio_add_int(opt, "transient_bytes", c->options[k].transient_bytes);
            cJSON_AddNumberToObject(opt, "recompute_ms", c->options[k].recompute_ms);
            cJSON_AddItemToArray(list, opt);
        }
    }
    return o;
}

static int device_info_from_json(const cJSON *root, const char *file, struct device_info *d,
                                 struct err *e)
{
    const cJSON *obj = cJSON_GetObjectItemCaseSensitive(root, "device");
    if (obj == NULL)
        return err_set(e, ERR_INPUT, "%s: device: missing", file);
    if (jsonio_expect_object(obj, file, "device", e) ||
        jsonio_str_copy(obj, file, "device", "name", d->name, sizeof d->name, e) ||
        jsonio_str_copy(obj, file, "device", "kind", d->kind, sizeof d->kind, e) ||
        units_json_bytes(obj, file, "device", "memory_bytes", 1, JSONIO_INT_MAX,
                         &d->memory_bytes, e))
        return e->code;
    if (strcmp(d->kind, "cpu") != 0 && strcmp(d->kind, "cuda") != 0)
        return err_set(e, ERR_INPUT, "%s: device.kind: \"%s\", expected \"cpu\" or \"cuda\"",
                       file, d->kind);
    return ERR_OK;
}

int profile_check_layer_name(const struct model *m, int layer, const char *name,
                             const char *file, const char *path, struct err *e)
{
    char expect[MODEL_LAYER_NAME_MAX];
    model_layer_name(m, layer, expect);
    if (model_is_custom(m) && name[0] == '\0')
        return err_set(e, ERR_INPUT, "%s: %s.name: empty; every layer needs a name", file, path);
    if (!model_is_custom(m) && strcmp(expect, name) != 0)
        return err_set(e, ERR_INPUT, "%s: %s.name: \"%s\", expected \"%s\"", file, path, name,
                       expect);
    return ERR_OK;
}

/* The number of "layers" entries the profile's model must have (*want); a custom model
 * without layer_count takes them as they come. */
static int profile_layer_count(const char *file, struct profile *p, int have, int *want,
                               struct err *e)
{
    *want = model_layer_count(&p->model);
    if (model_is_custom(&p->model) && *want == 0) {
        if (have < 1 || have > MODEL_CUSTOM_LAYERS_MAX)
            return err_set(e, ERR_INPUT, "%s: layers: %d entries, expected 1 to %d", file, have,
                           MODEL_CUSTOM_LAYERS_MAX);
        *want = p->model.layer_count = have;
    }
    if (have != *want && model_is_custom(&p->model))
        return err_set(e, ERR_INPUT, "%s: layers: %d entries, but model.layer_count is %d", file,
                       have, *want);
    if (have != *want)
        return err_set(e, ERR_INPUT,
                       "%s: layers: %d entries, but the model (n_layer %d) has %d planning "
                       "layers (embed, %d blocks, head)",
                       file, have, p->model.n_layer, *want, p->model.n_layer);
    return ERR_OK;
}

/* "layers": each layer's costs, named as the model's layer at its index. */
static int read_profile_layers(const cJSON *layers, const char *file, struct profile *p,
                               struct err *e)
{
    int want;
    if (jsonio_expect_array(layers, file, "layers", e) ||
        profile_layer_count(file, p, cJSON_GetArraySize(layers), &want, e))
        return e->code;
    p->layers = calloc((size_t)want, sizeof *p->layers);
    if (p->layers == NULL)
        return err_set(e, ERR_FAIL, "%s: out of memory", file);
    p->n_layers = want;
    int i = 0;
    for (const cJSON *l = layers->child; l != NULL; l = l->next, i++) {
        char path[JSONIO_PATH_MAX];
        jsonio_path_index(path, "layers", i);
        if (layer_cost_from_json(l, file, path, &p->layers[i], e))
            return e->code;
        /* a profile states the split; only the planner applies it (profile.h) */
        p->layers[i].wgrad_bytes = 0;
        p->layers[i].wgrad_ms = 0;
        if (profile_check_layer_name(&p->model, i, p->layers[i].name, file, path, e))
            return e->code;
    }
    return ERR_OK;
}

/* The profile's host link, tensor-parallel degree and efficiency, and its provenance. */
static int read_profile_extras(const cJSON *root, const char *file, struct profile *p,
                               struct err *e)
{
    const cJSON *host_link = cJSON_GetObjectItemCaseSensitive(root, "host_link");
    if (host_link != NULL && link_from_json(host_link, file, "host_link", 0, &p->host_link, e))
        return e->code;
    int64_t tp = 1;
    if (jsonio_num_opt(root, file, "", "tp_efficiency", 1e-3, 1.0, &p->tp_efficiency, e) ||
        jsonio_int_opt(root, file, "", "tp", 1, 1024, &tp, e))
        return e->code;
    p->tp = (int)tp;
    const cJSON *prov = cJSON_GetObjectItemCaseSensitive(root, "provenance");
    if (prov != NULL)
        p->provenance = cJSON_Duplicate(prov, 1);
    return ERR_OK;
}

int profile_from_json(const cJSON *root, const char *file, struct profile *p, struct err *e)
{
    memset(p, 0, sizeof *p);
    if (jsonio_check_format(root, file, "profile", 1, e) ||
        device_info_from_json(root, file, &p->device, e) ||
        jsonio_bool(root, file, "", "estimated", &p->estimated, e))
        return e->code;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model == NULL)
        return err_set(e, ERR_INPUT, "%s: model: missing", file);
    if (model_from_json(model, file, "model", &p->model, e))
        return e->code;
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "layers");
    if (layers == NULL)
        return err_set(e, ERR_INPUT, "%s: layers: missing", file);
    if (read_profile_layers(layers, file, p, e) || read_profile_extras(root, file, p, e)) {
        profile_free(p);
        return e->code;
    }
    return ERR_OK;
}

int profile_load(const char *file, struct profile *p, struct err *e)
{
    memset(p, 0, sizeof *p);
    cJSON *root = jsonio_read_kind(file, JSONIO_PROFILE, e);
    if (root == NULL)
        return e->code;
    int rc = profile_from_json(root, file, p, e);
    cJSON_Delete(root);
    return rc;
}

cJSON *profile_to_json(const struct profile *p)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "ballast-profile/1");
    cJSON *dev = cJSON_AddObjectToObject(o, "device");
    cJSON_AddStringToObject(dev, "name", p->device.name);
    cJSON_AddStringToObject(dev, "kind", p->device.kind);
    jsonio_add_int(dev, "memory_bytes", p->device.memory_bytes);
    cJSON_AddBoolToObject(o, "estimated", p->estimated);
    cJSON_AddItemToObject(o, "model", model_to_json(&p->model));
    if (p->host_link.present)
        cJSON_AddItemToObject(o, "host_link", link_to_json(&p->host_link));
    if (p->tp_efficiency > 0)
        cJSON_AddNumberToObject(o, "tp_efficiency", p->tp_efficiency);
    if (p->tp > 1)
        cJSON_AddNumberToObject(o, "tp", p->tp);
    if (p->provenance != NULL)
        cJSON_AddItemToObject(o, "provenance", cJSON_Duplicate(p->provenance, 1));
    cJSON *layers = cJSON_AddArrayToObject(o, "layers");
    for (int i = 0; i < p->n_layers; i++) {
        struct layer_cost c = p->layers[i]; /* the split as stated, not as applied */
        c.wgrad_bytes = c.split_bytes;
        c.wgrad_ms = c.split_ms;
        cJSON_AddItemToArray(layers, layer_cost_to_json(&c));
    }
    return o;
}

int profile_write(const char *file, const struct profile *p, struct err *e)
{
    cJSON *o = profile_to_json(p);
    int rc = jsonio_write(file, o, e);
    cJSON_Delete(o);
    return rc;
}

void profile_free(struct profile *p)
{
    free(p->layers);
    cJSON_Delete(p->provenance);
    p->layers = NULL;
    p->provenance = NULL;
    p->n_layers = 0;
}
