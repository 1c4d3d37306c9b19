#include "links.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonio.h"
#include "units.h"

const char *links_default_file(void)
{
    const char *env = getenv("BALLAST_LINKS");
    return env != NULL && env[0] != '\0' ? env : BALLAST_SOURCE_DIR "/configs/links.json";
}

void links_free(struct link_table *t)
{
    free(t->links);
    free(t->device);
    free(t->device_link);
    memset(t, 0, sizeof *t);
}

const struct link_preset *links_find(const struct link_table *t, const char *name)
{
    for (int k = 0; k < t->n; k++)
        if (strcmp(t->links[k].name, name) == 0)
            return &t->links[k];
    return NULL;
}

const struct link_preset *links_node_link(const struct link_table *t, const char *device)
{
    for (int k = 0; k < t->n_devices; k++)
        if (strcmp(t->device[k], device) == 0)
            return &t->links[t->device_link[k]];
    return NULL;
}

static int read_preset(const cJSON *o, const char *file, int k, struct link_preset *p,
                       struct err *e)
{
    static const char *const keys[] = {"name", "gbps", "latency_us", "source", NULL};
    char path[JSONIO_PATH_MAX];
    jsonio_path_index(path, "links", k);
    if (jsonio_expect_object(o, file, path, e) || jsonio_check_keys(o, file, path, keys, e) ||
        jsonio_str_copy(o, file, path, "name", p->name, sizeof p->name, e) ||
        jsonio_str_copy(o, file, path, "source", p->source, sizeof p->source, e) ||
        units_json_rate(o, file, path, "gbps", 1e9, 1e-6, 1e9, &p->link.gbps, e) ||
        units_json_us_opt(o, file, path, "latency_us", 0, 1e9, &p->link.latency_us, e))
        return e->code;
    p->link.present = 1;
    return ERR_OK;
}

/* Index of preset `name` read at `path`, or ERR_INPUT naming it. */
static int preset_index(const struct link_table *t, const char *file, const char *path,
                        const char *name, int *index, struct err *e)
{
    const struct link_preset *p = links_find(t, name);
    if (p == NULL)
        return err_set(e, ERR_INPUT, "%s: %s: \"%s\" is not a preset of \"links\"", file, path,
                       name);
    *index = (int)(p - t->links);
    return ERR_OK;
}

static int read_node_links(const cJSON *map, const char *file, struct link_table *t,
                           struct err *e)
{
    if (jsonio_expect_object(map, file, "node_link", e))
        return e->code;
    t->n_devices = cJSON_GetArraySize(map);
    t->device = calloc((size_t)t->n_devices + 1, sizeof *t->device);
    t->device_link = calloc((size_t)t->n_devices + 1, sizeof *t->device_link);
    if (t->device == NULL || t->device_link == NULL)
        return err_set(e, ERR_FAIL, "%s: out of memory", file);
    int k = 0;
    for (const cJSON *m = map->child; m != NULL; m = m->next, k++) {
        char path[JSONIO_PATH_MAX];
        jsonio_path_key(path, "node_link", m->string);
        if (!cJSON_IsString(m))
            return err_set(e, ERR_INPUT, "%s: %s: expected a preset's name", file, path);
        snprintf(t->device[k], PROFILE_NAME_MAX, "%s", m->string);
        if (preset_index(t, file, path, m->valuestring, &t->device_link[k], e))
            return e->code;
    }
    return ERR_OK;
}

int links_load(const char *file, struct link_table *t, struct err *e)
{
    static const char *const keys[] = {"format", "description", "links", "node_link", "network",
                                       NULL};
    memset(t, 0, sizeof *t);
    cJSON *root = jsonio_read_kind(file, JSONIO_LINKS, e);
    if (root == NULL)
        return e->code;
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "links");
    const char *network = NULL;
    int rc = ERR_OK;
    static const char *const text[] = {"description", NULL};
    if (jsonio_check_format(root, file, "links", 1, e) ||
        jsonio_check_keys(root, file, "", keys, e) || jsonio_check_text(root, file, "", text, e) ||
        jsonio_expect_array(list, file, "links", e) ||
        jsonio_str(root, file, "", "network", &network, e))
        rc = e->code;
    if (rc == ERR_OK) {
        t->n = cJSON_GetArraySize(list);
        t->links = calloc((size_t)t->n + 1, sizeof *t->links);
        rc = t->links == NULL ? err_set(e, ERR_FAIL, "%s: out of memory", file) : ERR_OK;
    }
    for (int k = 0; rc == ERR_OK && k < t->n; k++)
        rc = read_preset(cJSON_GetArrayItem(list, k), file, k, &t->links[k], e);
    if (rc == ERR_OK)
        rc = read_node_links(cJSON_GetObjectItemCaseSensitive(root, "node_link"), file, t, e);
    if (rc == ERR_OK)
        rc = preset_index(t, file, "network", network, &t->network, e);
    cJSON_Delete(root);
    if (rc)
        links_free(t);
    return rc;
}

int links_parse(const struct link_table *t, const char *text, const char *what, struct link *out,
                const char **name_out, struct err *e)
{
    const struct link_preset *p = links_find(t, text);
    char why[UNITS_WHY_MAX];
    double bps;
    if (p != NULL) {
        *out = p->link;
        *name_out = p->name;
        return ERR_OK;
    }
    if (units_parse_rate(text, 1e9, &bps, why) == 0 && bps > 0) {
        *out = (struct link){.present = 1, .gbps = bps / 1e9,
                             .latency_us = LINKS_DEFAULT_LATENCY_US};
        *name_out = NULL;
        return ERR_OK;
    }
    char names[512] = "";
    size_t used = 0;
    for (int k = 0; k < t->n; k++)
        used += (size_t)snprintf(names + used, used < sizeof names ? sizeof names - used : 0,
                                 "%s%s", k ? ", " : "", t->links[k].name);
    return err_set(e, ERR_INPUT, "%s: \"%s\" is neither a link preset (%s) nor a rate (%s)", what,
                   text, names, why);
}
