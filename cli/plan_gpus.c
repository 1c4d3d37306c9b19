#include "plan_gpus.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "devices.h"
#include "estimate.h"
#include "fileio.h"
#include "jsonio.h"
#include "links.h"
#include "model.h"
#include "model_kind.h"
#include "model_ops.h"
#include "profile.h"
#include "units.h"

/* GPUs a node when --nodes does not say: the usual 8-GPU server, or fewer when a kind has
 * fewer (the largest count at most 8 that divides the kind's). */
#define PLAN_GPUS_PER_NODE 8
#define PLAN_GPUS_RESERVE "2GiB"

/* One kind of the pool as the command line gives it. */
struct kind {
    char device[PROFILE_NAME_MAX];
    long count, per_node;
    struct link node_link;
    const char *node_link_name; /* a preset's, or NULL for a rate */
    const char *profile;        /* --profile, or NULL: estimated */
    int64_t memory_bytes;
};

struct pool_spec {
    int n;
    struct kind kind[PLAN_GPUS_KINDS_MAX];
    struct link network;
    const char *network_name;
    struct model model;
    char model_name[64];
    int64_t reserve_bytes, node_host_memory_bytes;
    int model_from_profile; /* no --model: the first --profile's */
    int64_t state_bytes;    /* the model's weights, gradients and optimizer state */
};

int plan_gpus_option(int argc, char **argv, int *i, struct plan_gpus *g, int *rc)
{
    const char **fields[] = {&g->model,       &g->gpus,    &g->nodes,   &g->node_link,
                             &g->network,     &g->host_memory, &g->reserve,
                             &g->save_cluster};
    static const char *const names[] = {"--model",   "--gpus",        "--nodes",
                                        "--node-link", "--network",   "--host-memory",
                                        "--reserve", "--save-cluster"};
    const char *v;
    int r;
    *rc = ERR_OK;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if ((r = cli_option(argc, argv, i, names[k], &v)) != 0) {
            *rc = r < 0 ? ERR_INPUT : ERR_OK;
            *fields[k] = v;
            return 1;
        }
    if ((r = cli_option(argc, argv, i, "--seq-len", &v)) != 0) {
        if (r < 0 || cli_parse_int(v, 1, 1 << 24, &g->seq_len))
            *rc = r < 0 ? ERR_INPUT
                        : cli_usage_error("plan", "--seq-len: \"%s\", expected tokens >= 1", v);
        return 1;
    }
    if ((r = cli_option(argc, argv, i, "--profile", &v)) != 0) {
        if (r > 0 && g->n_profiles == PLAN_GPUS_KINDS_MAX)
            *rc = cli_usage_error("plan", "--profile: at most %d, one per device kind",
                                  PLAN_GPUS_KINDS_MAX);
        else if (r > 0)
            g->profiles[g->n_profiles++] = v;
        else
            *rc = ERR_INPUT;
        return 1;
    }
    return 0;
}

int plan_gpus_given(const struct plan_gpus *g)
{
    return g->model || g->gpus || g->nodes || g->node_link || g->network || g->host_memory ||
           g->reserve || g->save_cluster || g->n_profiles || g->seq_len;
}

/* The i-th of a comma-separated list of n items, or the only item when there is one. */
static int list_item(const char *list, int i, int n, char *out, size_t cap, const char *what,
                     struct err *e)
{
    int items = 1;
    for (const char *s = list; *s; s++)
        items += *s == ',';
    if (items != 1 && items != n)
        return err_set(e, ERR_INPUT, "%s: \"%s\" gives %d values; expected one for every kind "
                       "or one per kind of --gpus (%d)", what, list, items, n);
    const char *s = list;
    for (int k = 0; k < i && items > 1; k++)
        s = strchr(s, ',') + 1;
    snprintf(out, cap, "%.*s", (int)strcspn(s, ","), s);
    return ERR_OK;
}

/* "8xA100-40GB": the count and the device. */
static int parse_kind(const char *item, struct kind *k, struct err *e)
{
    char *end;
    errno = 0;
    long n = strtol(item, &end, 10);
    if (end == item || errno != 0 || (*end != 'x' && *end != 'X') || end[1] == '\0' || n < 1 ||
        n > 1 << 20)
        return err_set(e, ERR_INPUT, "--gpus: \"%s\": expected COUNTxDEVICE, a count from 1 "
                       "and a device name, as 8xA100-40GB", item);
    if (strlen(end + 1) >= sizeof k->device)
        return err_set(e, ERR_INPUT, "--gpus: \"%s\": the device name is too long", item);
    k->count = n;
    snprintf(k->device, sizeof k->device, "%s", end + 1);
    return ERR_OK;
}

/* Nodes of a kind: --nodes's count (which must divide the GPUs), else nodes of up to 8. */
static int kind_nodes(const struct plan_gpus *g, int i, int n, struct kind *k, struct err *e)
{
    char item[32];
    long nodes = 0;
    if (g->nodes == NULL) {
        for (k->per_node = k->count < PLAN_GPUS_PER_NODE ? k->count : PLAN_GPUS_PER_NODE;
             k->count % k->per_node != 0; k->per_node--)
            ;
        return ERR_OK;
    }
    if (list_item(g->nodes, i, n, item, sizeof item, "--nodes", e))
        return e->code;
    if (cli_parse_int(item, 1, 1 << 20, &nodes))
        return err_set(e, ERR_INPUT, "--nodes: \"%s\", expected a count of nodes >= 1", item);
    if (k->count % nodes != 0)
        return err_set(e, ERR_INPUT, "--nodes: %ld nodes for the %ld %s GPUs: every node holds "
                       "as many GPUs, so the nodes must divide them", nodes, k->count,
                       k->device);
    k->per_node = k->count / nodes;
    return ERR_OK;
}

static int kind_link(const struct plan_gpus *g, const struct link_table *lt, int i, int n,
                     struct kind *k, struct err *e)
{
    char item[64];
    if (g->node_link != NULL)
        return list_item(g->node_link, i, n, item, sizeof item, "--node-link", e) ||
               links_parse(lt, item, "--node-link", &k->node_link, &k->node_link_name, e);
    const struct link_preset *p = links_node_link(lt, k->device);
    if (p == NULL)
        return err_set(e, ERR_INPUT, "--gpus: %s: %s names no link inside a node for it: give "
                       "--node-link (a preset of that file or a rate)",
                       k->device, links_default_file());
    k->node_link = p->link;
    k->node_link_name = p->name;
    return ERR_OK;
}

/* A kind's profile: the --profile made on its device, if any. */
static int kind_profile(const struct plan_gpus *g, struct kind *k, struct profile *p,
                        int *loaded, struct err *e)
{
    for (int j = 0; j < g->n_profiles; j++) {
        if (profile_load(g->profiles[j], p, e))
            return e->code;
        if (strcmp(p->device.name, k->device) == 0) {
            *loaded = 1;
            k->profile = g->profiles[j];
            return ERR_OK;
        }
        profile_free(p);
    }
    *loaded = 0;
    return ERR_OK;
}

/* Every --profile names a device of --gpus, once. */
static int check_profiles_used(const struct plan_gpus *g, const struct pool_spec *s,
                               struct err *e)
{
    for (int j = 0; j < g->n_profiles; j++) {
        int used = 0;
        for (int i = 0; i < s->n; i++)
            used += s->kind[i].profile == g->profiles[j];
        if (!used)
            return err_set(e, ERR_INPUT, "--profile: %s is not the profile of a device of "
                           "--gpus, or another --profile is its device's too", g->profiles[j]);
    }
    return ERR_OK;
}

/* --model, else the model of the first --profile. */
static int read_model(const struct plan_gpus *g, struct pool_spec *s, struct err *e)
{
    char path[PATH_MAX];
    struct profile p;
    if (g->model == NULL && g->n_profiles == 0)
        return err_set(e, ERR_INPUT, "--gpus needs --model (a name of configs/models or a "
                       "model file)");
    if (g->model == NULL) {
        if (profile_load(g->profiles[0], &p, e))
            return e->code;
        s->model = p.model;
        s->model_from_profile = 1;
        profile_free(&p);
        snprintf(path, sizeof path, "%s", g->profiles[0]);
    } else if (model_find(g->model, path, sizeof path, e) || model_load(path, &s->model, e)) {
        return e->code;
    }
    char copy[PATH_MAX], *base;
    snprintf(copy, sizeof copy, "%s", path);
    base = basename(copy);
    size_t n = strlen(base);
    snprintf(s->model_name, sizeof s->model_name, "%.*s",
             (int)(n > 5 && strcmp(base + n - 5, ".json") == 0 ? n - 5 : n), base);
    if (g->seq_len > 0) {
        s->model.seq_len = (int)g->seq_len;
        if (model_check_sizes(&s->model, "--seq-len", "seq_len", e))
            return e->code;
    }
    if (model_is_custom(&s->model))
        return err_set(e, ERR_INPUT, "--model: %s is a custom model: its profiles come from "
                       "your framework (give each device's with --profile) and it has no "
                       "heads to split; plan a cluster file of them with --cluster", path);
    return ERR_OK;
}

/* The kinds of --gpus, each with its memory, nodes and link. */
static int read_kinds(const struct plan_gpus *g, const struct device_table *t,
                      const struct link_table *lt, struct pool_spec *s, struct err *e)
{
    char item[PROFILE_NAME_MAX + 16];
    int items = 1;
    for (const char *c = g->gpus; *c; c++)
        items += *c == ',';
    if (items > PLAN_GPUS_KINDS_MAX)
        return err_set(e, ERR_INPUT, "--gpus: %d kinds of GPUs; a pool holds at most %d", items,
                       PLAN_GPUS_KINDS_MAX);
    s->n = items;
    for (int i = 0; i < s->n; i++) {
        struct kind *k = &s->kind[i];
        const struct device_spec *d = NULL;
        list_item(g->gpus, i, s->n, item, sizeof item, "--gpus", e);
        if (parse_kind(item, k, e))
            return e->code;
        struct profile p;
        int given = 0;
        if (kind_profile(g, k, &p, &given, e))
            return e->code;
        if (given) {
            k->memory_bytes = p.device.memory_bytes;
            profile_free(&p);
        } else if (devices_lookup(t, devices_default_file(), "--gpus", k->device, &d, e)) {
            return e->code;
        } else {
            snprintf(k->device, sizeof k->device, "%s", d->name); /* its spelling */
            k->memory_bytes = d->memory_bytes;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(s->kind[j].device, k->device) == 0)
                return err_set(e, ERR_INPUT, "--gpus: %s appears twice: give each kind once, "
                               "with all its GPUs", k->device);
        if (kind_nodes(g, i, s->n, k, e) || kind_link(g, lt, i, s->n, k, e))
            return e->code;
    }
    return check_profiles_used(g, s, e);
}

static int read_sizes(const struct plan_gpus *g, struct pool_spec *s, struct err *e)
{
    char why[UNITS_WHY_MAX];
    const char *reserve = g->reserve ? g->reserve : PLAN_GPUS_RESERVE;
    if (units_parse_bytes(reserve, &s->reserve_bytes, why))
        return err_set(e, ERR_INPUT, "--reserve: \"%s\" is %s", reserve, why);
    if (g->host_memory != NULL &&
        (units_parse_bytes(g->host_memory, &s->node_host_memory_bytes, why) ||
         s->node_host_memory_bytes < 1))
        return err_set(e, ERR_INPUT, "--host-memory: \"%s\" is %s", g->host_memory,
                       s->node_host_memory_bytes < 1 ? "not a size >= 1 byte" : why);
    return ERR_OK;
}

/* Where the cluster goes: --save-cluster, beside the plan (PLAN.cluster.json), or in the
 * current folder after the model and the GPUs. Its profiles go to CLUSTER-without-.json +
 * ".profiles". */
static void cluster_paths(const struct plan_gpus *g, const struct pool_spec *s,
                          const char *plan_file, char *cluster, size_t cap, char *dir,
                          size_t dir_cap)
{
    if (g->save_cluster != NULL) {
        snprintf(cluster, cap, "%s", g->save_cluster);
    } else if (plan_file != NULL) {
        size_t n = strlen(plan_file);
        int json = n > 5 && strcmp(plan_file + n - 5, ".json") == 0;
        snprintf(cluster, cap, "%.*s.cluster.json", (int)(json ? n - 5 : n), plan_file);
    } else {
        size_t used = (size_t)snprintf(cluster, cap, "%s", s->model_name);
        for (int i = 0; i < s->n && used < cap; i++)
            used += (size_t)snprintf(cluster + used, cap - used, "-%ldx%s", s->kind[i].count,
                                     s->kind[i].device);
        snprintf(cluster + (used < cap ? used : cap - 1), cap - (used < cap ? used : cap - 1),
                 ".cluster.json");
    }
    size_t n = strlen(cluster);
    int json = n > 5 && strcmp(cluster + n - 5, ".json") == 0;
    snprintf(dir, dir_cap, "%.*s.profiles", (int)(json ? n - 5 : n), cluster);
}

/* The model's state: every layer's state_bytes in profile p. */
static void add_state(struct pool_spec *s, const struct profile *p)
{
    s->state_bytes = 0;
    for (int l = 0; l < p->n_layers; l++)
        s->state_bytes += p->layers[l].state_bytes;
}

/* A pool whose GPUs cannot hold the model's state even spread over all of them (one replica,
 * nothing kept but weights, gradients and optimizer state) can make no pipeline: said with
 * the numbers. */
static int check_state(const struct pool_spec *s, struct err *e)
{
    double room = 0;
    long gpus = 0;
    for (int i = 0; i < s->n; i++) {
        room += (double)s->kind[i].count * (double)(s->kind[i].memory_bytes - s->reserve_bytes);
        gpus += s->kind[i].count;
    }
    if ((double)s->state_bytes <= room)
        return ERR_OK;
    return err_set(e, ERR_NOFIT,
                   "%s's weights, gradients and optimizer state take %.1f GiB (%.1f bytes a "
                   "parameter), more than the %.1f GiB of all %ld GPUs together (their "
                   "memory less the %.1f GiB --reserve each): no pipeline of them can hold it; "
                   "add GPUs or plan a smaller model",
                   s->model_name, s->state_bytes / 1073741824.0,
                   (double)s->state_bytes / (double)model_param_count(&s->model),
                   room / 1073741824.0, gpus, s->reserve_bytes / 1073741824.0);
}

/* Each kind without --profile estimated into dir/DEVICE.json; `rel` the names the cluster
 * gives (relative to its folder, or the --profile as given made absolute). */
static int write_profiles(struct pool_spec *s, const struct device_table *t, const char *dir,
                          char rel[][PATH_MAX], struct err *e)
{
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s", dir);
    const char *dir_name = basename(copy);
    if (fileio_make_dirs(dir, e))
        return e->code;
    for (int i = 0; i < s->n; i++) {
        struct kind *k = &s->kind[i];
        struct profile p;
        if (k->profile != NULL) {
            if (realpath(k->profile, rel[i]) == NULL)
                return err_set(e, ERR_INPUT, "--profile: %s: %s", k->profile, strerror(errno));
            if (i == 0 && profile_load(k->profile, &p, e))
                return e->code;
            if (i == 0) {
                add_state(s, &p);
                profile_free(&p);
            }
            continue;
        }
        char path[PATH_MAX + PROFILE_NAME_MAX];
        snprintf(rel[i], PATH_MAX, "%s/%s.json", dir_name, k->device);
        snprintf(path, sizeof path, "%s/%s.json", dir, k->device);
        if (s->model_from_profile)
            return err_set(e, ERR_INPUT, "--gpus: %s has no --profile, and without --model "
                           "there is no model to estimate its profile for", k->device);
        if (estimate_profile(t, devices_find(t, k->device), &s->model, &p, e))
            return e->code;
        if (i == 0)
            add_state(s, &p);
        int rc = profile_write(path, &p, e);
        profile_free(&p);
        if (rc)
            return rc;
    }
    return ERR_OK;
}

static cJSON *link_json(const struct link *l)
{
    cJSON *o = cJSON_CreateObject();
    char rate[64];
    snprintf(rate, sizeof rate, "%gGbps", l->gbps);
    cJSON_AddStringToObject(o, "gbps", rate);
    snprintf(rate, sizeof rate, "%gus", l->latency_us);
    cJSON_AddStringToObject(o, "latency_us", rate);
    return o;
}

static void add_size(cJSON *o, const char *key, int64_t bytes)
{
    char text[64];
    units_format_bytes(bytes, text, sizeof text);
    if (strspn(text, "0123456789") == strlen(text))
        jsonio_add_int(o, key, bytes);
    else
        cJSON_AddStringToObject(o, key, text);
}

/* The one-line command the cluster stands for (its "description"). */
static void describe_command(const struct plan_gpus *g, long global_batch, char *out,
                             size_t cap)
{
    const char *const values[] = {g->model,   g->gpus,        g->nodes,  g->node_link,
                                  g->network, g->host_memory, g->reserve};
    static const char *const names[] = {"--model",   "--gpus",        "--nodes", "--node-link",
                                        "--network", "--host-memory", "--reserve"};
    size_t used = (size_t)snprintf(out, cap, "the pool of: ballast plan");
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (values[k] != NULL && used < cap)
            used += (size_t)snprintf(out + used, cap - used, " %s %s", names[k], values[k]);
    for (int k = 0; k < g->n_profiles && used < cap; k++)
        used += (size_t)snprintf(out + used, cap - used, " --profile %s", g->profiles[k]);
    if (g->seq_len > 0 && used < cap)
        used += (size_t)snprintf(out + used, cap - used, " --seq-len %ld", g->seq_len);
    if (used < cap)
        snprintf(out + used, cap - used, " --global-batch %ld", global_batch);
}

static cJSON *cluster_json(const struct pool_spec *s, long global_batch, const char *command,
                           char rel[][PATH_MAX])
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "ballast-cluster/1");
    cJSON_AddStringToObject(root, "description", command);
    cJSON_AddStringToObject(root, "schedule", "1f1b");
    cJSON_AddNumberToObject(root, "global_batch", (double)global_batch);
    add_size(root, "reserve_bytes", s->reserve_bytes);
    cJSON_AddItemToObject(root, "link", link_json(&s->network));
    cJSON_AddItemToObject(root, "dp_link", link_json(&s->network));
    cJSON_AddBoolToObject(root, "shard_optimizer", 1);
    cJSON *pool = cJSON_AddArrayToObject(root, "pool");
    for (int i = 0; i < s->n; i++) {
        const struct kind *k = &s->kind[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "device", k->device);
        cJSON_AddNumberToObject(o, "count", (double)k->count);
        cJSON_AddNumberToObject(o, "per_node", (double)k->per_node);
        add_size(o, "memory_bytes", k->memory_bytes);
        cJSON_AddStringToObject(o, "profile", rel[i]);
        cJSON_AddItemToObject(o, "node_link", link_json(&k->node_link));
        if (s->node_host_memory_bytes > 0)
            add_size(o, "node_host_memory_bytes", s->node_host_memory_bytes);
        cJSON_AddItemToArray(pool, o);
    }
    return root;
}

/* A global batch no pipeline can take: not whole micro-batches. */
static int check_batch(const struct pool_spec *s, long global_batch, struct err *e)
{
    if (global_batch % s->model.micro_batch != 0)
        return err_set(e, ERR_INPUT,
                       "--global-batch %ld: not a whole number of micro-batches of %d samples "
                       "(the model's micro_batch): every replica takes whole micro-batches, so "
                       "no pipeline can take it; give a multiple of %d",
                       global_batch, s->model.micro_batch, s->model.micro_batch);
    return ERR_OK;
}

static void print_pool(FILE *f, const struct pool_spec *s)
{
    fprintf(f, "planning %s (micro-batch %d x %d tokens) on", s->model_name,
            s->model.micro_batch, s->model.seq_len);
    for (int i = 0; i < s->n; i++) {
        const struct kind *k = &s->kind[i];
        fprintf(f, " %ld %s (%ld a node, %s %g Gbit/s)%s", k->count, k->device, k->per_node,
                k->node_link_name ? k->node_link_name : "link", k->node_link.gbps,
                i + 1 < s->n ? "," : ";");
    }
    fprintf(f, " between nodes %s %g Gbit/s; %s\n",
            s->network_name ? s->network_name : "a link of", s->network.gbps,
            s->model_from_profile ? "profiles given" : "profiles estimated (configs/devices.json)");
}

void plan_gpus_print_written(FILE *f, const char *cluster)
{
    size_t n = strlen(cluster);
    fprintf(f, "cluster: %s (profiles in %.*s.profiles/); edit it and plan it again: ballast "
               "plan --cluster %s\n",
            cluster, (int)(n > 5 ? n - 5 : n), cluster, cluster);
}

int plan_gpus_write(const struct plan_gpus *g, long global_batch, const char *plan_file,
                    char *cluster, size_t cap, struct err *e)
{
    struct pool_spec s = {0};
    struct device_table t = {0};
    struct link_table lt = {0};
    char dir[PATH_MAX], (*rel)[PATH_MAX] = calloc(PLAN_GPUS_KINDS_MAX, sizeof *rel);
    int rc = rel == NULL ? err_set(e, ERR_FAIL, "out of memory") : ERR_OK;
    if (rc == ERR_OK && global_batch <= 0)
        rc = err_set(e, ERR_INPUT, "--gpus needs --global-batch G (samples a step, over every "
                     "replica)");
    if (rc == ERR_OK && (rc = read_model(g, &s, e)) == ERR_OK)
        rc = check_batch(&s, global_batch, e);
    if (rc == ERR_OK && (rc = devices_load(devices_default_file(), &t, e)) == ERR_OK)
        rc = links_load(links_default_file(), &lt, e);
    if (rc == ERR_OK)
        rc = read_kinds(g, &t, &lt, &s, e) || read_sizes(g, &s, e) ? e->code : ERR_OK;
    if (rc == ERR_OK && g->network != NULL)
        rc = links_parse(&lt, g->network, "--network", &s.network, &s.network_name, e);
    else if (rc == ERR_OK)
        s.network = lt.links[lt.network].link, s.network_name = lt.links[lt.network].name;
    if (rc == ERR_OK) {
        cluster_paths(g, &s, plan_file, cluster, cap, dir, sizeof dir);
        rc = cli_check_output("plan", cluster) ? err_set(e, ERR_INPUT, "%s: cannot write the "
                                                         "cluster there (above)", cluster)
                                               : write_profiles(&s, &t, dir, rel, e);
    }
    if (rc == ERR_OK) {
        char command[1024];
        describe_command(g, global_batch, command, sizeof command);
        cJSON *root = cluster_json(&s, global_batch, command, rel);
        rc = jsonio_write(cluster, root, e);
        cJSON_Delete(root);
    }
    if (rc == ERR_OK)
        rc = check_state(&s, e); /* the cluster is written: add GPUs to it and plan it again */
    if (rc == ERR_OK)
        print_pool(stdout, &s);
    links_free(&lt);
    devices_free(&t);
    free(rel);
    return rc;
}
