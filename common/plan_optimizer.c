/* A plan stage's optimizer place (plan.h): on the device, on the host, or split, the stage's
 * last layers hosting theirs (a fraction of the optimizer, cost.h). */
#include <math.h>
#include <string.h>

#include "jsonio.h"
#include "plan.h"

void plan_optimizer_to_json(const struct plan_stage *st, cJSON *so)
{
    int split = st->optimizer == COST_PLACE_HOST && st->optimizer_from > 0;
    cJSON_AddStringToObject(so, "optimizer",
                            st->optimizer != COST_PLACE_HOST ? "device" : split ? "split" : "host");
    if (st->optimizer != COST_PLACE_HOST)
        return;
    cJSON *range = cJSON_AddArrayToObject(so, "optimizer_host_layers");
    cJSON_AddItemToArray(range, cJSON_CreateNumber(st->first + st->optimizer_from));
    cJSON_AddItemToArray(range, cJSON_CreateNumber(st->last));
    cJSON_AddNumberToObject(so, "optimizer_fraction", plan_stage_optimizer_fraction(st));
}

/* "optimizer_host_layers": [first, last], the stage's last layers; into st->optimizer_from. A
 * split takes at least one layer and leaves the stage's first on the device. */
static int read_host_layers(const cJSON *so, const char *file, const char *path, int split,
                            struct plan_stage *st, struct err *e)
{
    const cJSON *range = cJSON_GetObjectItemCaseSensitive(so, "optimizer_host_layers");
    char sub[JSONIO_PATH_MAX];
    jsonio_path_key(sub, path, "optimizer_host_layers");
    if (range == NULL)
        return split ? err_set(e, ERR_INPUT, "%s: %s: missing (\"split\" names the layers that "
                               "host their optimizer)", file, sub)
                     : ERR_OK;
    if (jsonio_expect_array(range, file, sub, e))
        return e->code;
    if (cJSON_GetArraySize(range) != 2)
        return err_set(e, ERR_INPUT, "%s: %s: expected [first, last]", file, sub);
    int64_t r[2];
    for (int k = 0; k < 2; k++) {
        char ip[JSONIO_PATH_MAX];
        jsonio_path_index(ip, sub, k);
        if (jsonio_int_value(cJSON_GetArrayItem(range, k), file, ip, st->first, st->last, &r[k],
                             e))
            return e->code;
    }
    if (r[1] != st->last || (split ? r[0] == st->first : r[0] != st->first))
        return err_set(e, ERR_INPUT,
                       "%s: %s: [%lld, %lld], but %s ends the stage's layers [%d, %d]%s", file,
                       sub, (long long)r[0], (long long)r[1],
                       split ? "a split hosts the optimizer of a run of layers that"
                             : "\"host\" takes every layer: the range",
                       st->first, st->last,
                       split ? " and leaves its first layer's on the device" : "");
    st->optimizer_from = (int)(r[0] - st->first);
    return ERR_OK;
}

int plan_optimizer_from_json(const cJSON *so, const char *file, const char *path,
                             struct plan_stage *st, struct err *e)
{
    st->optimizer = COST_PLACE_DEVICE;
    st->optimizer_from = 0;
    if (cJSON_GetObjectItemCaseSensitive(so, "optimizer") == NULL)
        return ERR_OK;
    const char *place;
    if (jsonio_str(so, file, path, "optimizer", &place, e))
        return e->code;
    int split = strcmp(place, "split") == 0;
    if (split || strcmp(place, "host") == 0)
        st->optimizer = COST_PLACE_HOST;
    else if (strcmp(place, "device") != 0)
        return err_set(e, ERR_INPUT,
                       "%s: %s.optimizer: \"%s\" (expected \"device\" or \"host\", or "
                       "\"split\" for a fraction)",
                       file, path, place);
    return st->optimizer == COST_PLACE_HOST ? read_host_layers(so, file, path, split, st, e)
                                            : ERR_OK;
}

int plan_optimizer_fraction_check(const cJSON *so, const char *file, const char *path,
                                  const struct plan_stage *st, struct err *e)
{
    double stated, model = plan_stage_optimizer_fraction(st);
    if (cJSON_GetObjectItemCaseSensitive(so, "optimizer_fraction") == NULL)
        return ERR_OK;
    if (jsonio_num(so, file, path, "optimizer_fraction", 0, 1, &stated, e))
        return e->code;
    if (fabs(stated - model) > 1e-9)
        return err_set(e, ERR_INPUT,
                       "%s: %s.optimizer_fraction: %.9g, but the cost model gives %.9g for the "
                       "optimizer's place",
                       file, path, stated, model);
    return ERR_OK;
}
