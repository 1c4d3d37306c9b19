#include "cluster.h"

#include <float.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "devices.h"
#include "jsonio.h"
#include "model_kind.h"
#include "units.h"

/* "schedule" (a name, or "auto": the planner picks) and interleaved's "virtual_stages". */
static int read_schedule(const cJSON *root, const char *file, struct cluster *c, struct err *e)
{
    const char *sched;
    int64_t v = 0;
    if (jsonio_str(root, file, "", "schedule", &sched, e) ||
        jsonio_int_opt(root, file, "", "virtual_stages", 1, SCHEDULE_CHUNKS_MAX, &v, e))
        return e->code;
    c->schedule_auto = strcmp(sched, "auto") == 0;
    if (!c->schedule_auto && schedule_parse(sched, &c->schedule) != 0)
        return err_set(e, ERR_INPUT, "%s: schedule: \"%s\", expected %s or \"auto\"", file,
                       sched, schedule_names());
    if (v > 0 && !c->schedule_auto && c->schedule != SCHEDULE_INTERLEAVED)
        return err_set(e, ERR_INPUT, "%s: virtual_stages: %lld, but schedule \"%s\" holds %d "
                       "model chunk%s a GPU (virtual_stages is interleaved's)", file,
                       (long long)v, sched, schedule_fixed_chunks(c->schedule, 1),
                       schedule_fixed_chunks(c->schedule, 1) > 1 ? "s" : "");
    if (c->schedule_auto)
        c->schedule = SCHEDULE_1F1B;
    c->virtual_stages = (int)v;
    return ERR_OK;
}

void cluster_even_split(int n_layers, int n_stages, int stage, int *first, int *last)
{
    *first = (int)((int64_t)stage * n_layers / n_stages);
    *last = (int)((int64_t)(stage + 1) * n_layers / n_stages) - 1;
}

/* The first block of stage s when B blocks are dealt to S stages, the r = B mod S stages in
 * the middle taking one more. */
static int first_block(int blocks, int n_stages, int stage)
{
    int q = blocks / n_stages, r = blocks % n_stages, lo = (n_stages - r) / 2;
    int extra = stage - lo < 0 ? 0 : stage - lo > r ? r : stage - lo;
    return stage * q + extra;
}

void cluster_default_split(const struct model *m, int n_layers, int n_stages, int stage,
                           int *first, int *last)
{
    int blocks = n_layers - 2;
    if (model_is_custom(m) || blocks < n_stages) {
        cluster_even_split(n_layers, n_stages, stage, first, last);
        return;
    }
    /* block b is layer b + 1 */
    *first = stage == 0 ? 0 : 1 + first_block(blocks, n_stages, stage);
    *last = stage == n_stages - 1 ? n_layers - 1 : first_block(blocks, n_stages, stage + 1);
}

const struct profile *cluster_stage_profile(const struct cluster *c, int stage)
{
    return &c->profiles[c->stages[stage].profile];
}

void cluster_free(struct cluster *c)
{
    for (int i = 0; i < c->n_profiles; i++)
        profile_free(&c->profiles[i]);
    cluster_group_free(c);
    free(c->profiles);
    free(c->stages);
    memset(c, 0, sizeof *c);
}

/* provenance.`key` of a profile as a whole number, 0 when absent */
static long provenance_count(const struct profile *p, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(p->provenance, key);
    return cJSON_IsNumber(v) && v->valuedouble >= 1 ? (long)v->valuedouble : 0;
}

static int is_cpu_stage(const struct cluster *c, int s)
{
    return strcmp(cluster_stage_profile(c, s)->device.kind, "cpu") == 0;
}

int cluster_warn_cpu_threads(const cJSON *root, const struct cluster *c, FILE *out)
{
    int cpu_stages = 0, lines = 0;
    for (int s = 0; s < c->n_stages; s++)
        cpu_stages += is_cpu_stage(c, s);
    for (int s = 0; s < c->n_stages; s++) {
        const struct profile *p = cluster_stage_profile(c, s);
        long measured = p->estimated || !is_cpu_stage(c, s) ? 0 : provenance_count(p, "threads");
        if (measured == 0)
            continue; /* so cpu_stages >= 1 below */
        long cores = provenance_count(p, "cores_online");
        if (cores == 0)
            cores = sysconf(_SC_NPROCESSORS_ONLN) > 0 ? sysconf(_SC_NPROCESSORS_ONLN) : 1;
        long rank = cores / cpu_stages > 0 ? cores / cpu_stages : 1;
        if (measured <= rank)
            continue;
        const cJSON *rel = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "stages"), s), "profile");
        fprintf(out,
                "ballast plan: warning: stage %d: profile %s was measured with %ld threads, but "
                "a rank gets %ld (%ld cores / %d CPU stages): its times are optimistic; measure "
                "with --threads %ld\n",
                s, cJSON_IsString(rel) ? rel->valuestring : "?", measured, rank, cores,
                cpu_stages, rank);
        lines++;
    }
    return lines;
}

void cluster_profile_path(const char *cluster_file, const char *rel,
                          char out[CLUSTER_PATH_MAX])
{
    if (rel[0] == '/') {
        snprintf(out, CLUSTER_PATH_MAX, "%s", rel);
        return;
    }
    char copy[CLUSTER_PATH_MAX];
    snprintf(copy, sizeof copy, "%s", cluster_file);
    const char *dir = dirname(copy);
    if (strcmp(dir, ".") == 0)
        snprintf(out, CLUSTER_PATH_MAX, "%s", rel);
    else
        snprintf(out, CLUSTER_PATH_MAX, "%s/%s", dir, rel);
}

/* Loads the stage's profile unless another stage already named the same file. */
static int stage_profile(struct cluster *c, char (*paths)[CLUSTER_PATH_MAX], const char *file,
                         const char *path, const char *rel, int *index, struct err *e)
{
    char full[CLUSTER_PATH_MAX], canon[CLUSTER_PATH_MAX];
    cluster_profile_path(file, rel, full);
    if (realpath(full, canon) == NULL)
        snprintf(canon, sizeof canon, "%s", full);
    for (int i = 0; i < c->n_profiles; i++)
        if (strcmp(paths[i], canon) == 0) {
            *index = i;
            return ERR_OK;
        }
    struct err inner;
    err_clear(&inner);
    if (profile_load(full, &c->profiles[c->n_profiles], &inner)) {
        return err_set(e, inner.code, "%s: %s.profile: cannot use \"%s\":\n  %s", file, path, rel,
                       inner.msg);
    }
    snprintf(paths[c->n_profiles], CLUSTER_PATH_MAX, "%s", canon);
    *index = c->n_profiles++;
    return ERR_OK;
}

static const char *first_model_difference(const struct model *a, const struct model *b,
                                          char buf[128])
{
    if (a->kind != b->kind || model_is_custom(a)) {
        if (a->kind != b->kind)
            snprintf(buf, 128, "kind %s vs %s", model_kind_name(a->kind), model_kind_name(b->kind));
        else if (strcmp(a->name, b->name) != 0)
            snprintf(buf, 128, "name \"%s\" vs \"%s\"", a->name, b->name);
        else
            snprintf(buf, 128, "%d layers vs %d", a->layer_count, b->layer_count);
        return buf;
    }
#define DIFF(f)                                                                                  \
    if (a->f != b->f) {                                                                          \
        snprintf(buf, 128, #f " %d vs %d", (int)a->f, (int)b->f);                                \
        return buf;                                                                              \
    }
    DIFF(n_layer) DIFF(n_embd) DIFF(n_head) DIFF(seq_len) DIFF(vocab_size) DIFF(micro_batch)
#undef DIFF
    snprintf(buf, 128, "dtype %s vs %s", model_dtype_name(a->dtype), model_dtype_name(b->dtype));
    return buf;
}

/* Whether two profiles of one model give a device different costs; `what` names the first
 * difference. */
static int profiles_differ(const struct profile *a, const struct profile *b, char what[160])
{
    if (a->device.memory_bytes != b->device.memory_bytes) {
        snprintf(what, 160, "device.memory_bytes %lld vs %lld", (long long)a->device.memory_bytes,
                 (long long)b->device.memory_bytes);
        return 1;
    }
    for (int l = 0; l < a->n_layers; l++) {
        const struct layer_cost *x = &a->layers[l], *y = &b->layers[l];
#define DIFF(f, fmt, cast)                                                                       \
    if (x->f != y->f) {                                                                          \
        snprintf(what, 160, "layers[%d].%s " fmt " vs " fmt, l, #f, (cast)x->f, (cast)y->f);     \
        return 1;                                                                                \
    }
        DIFF(fwd_ms, "%g", double) DIFF(bwd_ms, "%g", double)
        DIFF(state_bytes, "%lld", long long) DIFF(act_bytes, "%lld", long long)
        DIFF(ckpt_bytes, "%lld", long long) DIFF(out_bytes, "%lld", long long)
        DIFF(workspace_bytes, "%lld", long long) DIFF(n_options, "%d", int)
        DIFF(param_bytes, "%lld", long long) DIFF(grad_bytes, "%lld", long long)
        DIFF(optimizer_bytes, "%lld", long long) DIFF(optimizer_ms, "%g", double)
        DIFF(host_optimizer_ms, "%g", double)
        for (int k = 0; k < x->n_options; k++) {
            const struct recompute_option *u = &x->options[k], *v = &y->options[k];
#define ODIFF(f, fmt, cast)                                                                      \
    if (u->f != v->f) {                                                                          \
        snprintf(what, 160, "layers[%d].recompute_options[%d].%s " fmt " vs " fmt, l, k, #f,     \
                 (cast)u->f, (cast)v->f);                                                        \
        return 1;                                                                                \
    }
            ODIFF(kept_bytes, "%lld", long long) ODIFF(transient_bytes, "%lld", long long)
            ODIFF(recompute_ms, "%g", double)
#undef ODIFF
            if (strcmp(u->name, v->name) != 0) {
                snprintf(what, 160, "layers[%d].recompute_options[%d].name %s vs %s", l, k,
                         u->name, v->name);
                return 1;
            }
        }
#undef DIFF
    }
    return 0;
}

/* The stage's host memory and its own host link, if given. */
static int read_host(const cJSON *obj, const char *file, const char *path,
                     struct cluster_stage *st, struct err *e)
{
    const cJSON *host_link = cJSON_GetObjectItemCaseSensitive(obj, "host_link");
    char lp[JSONIO_PATH_MAX];
    jsonio_path_key(lp, path, "host_link");
    if (units_json_bytes_opt(obj, file, path, "host_memory_bytes", 1, JSONIO_INT_MAX,
                       &st->host_memory_bytes, e) ||
        (host_link != NULL && link_from_json(host_link, file, lp, 1, &st->host_link, e)))
        return e->code;
    return ERR_OK;
}

/* Stages that may offload and give no host link take their profile's, else the datasheet's
 * (devices.json's host_link_gbs at the pinned share). */
static int resolve_host_links(struct cluster *c, struct err *e)
{
    struct device_table t = {0};
    int loaded = 0;
    for (int s = 0; s < c->n_stages; s++) {
        struct cluster_stage *st = &c->stages[s];
        if (st->host_memory_bytes == 0 || st->host_link.present)
            continue;
        st->host_link = cluster_stage_profile(c, s)->host_link;
        if (st->host_link.present)
            continue;
        if (!loaded && devices_load(devices_default_file(), &t, e))
            return e->code;
        loaded = 1;
        const struct device_spec *d = devices_find(&t, st->device);
        if (d != NULL)
            st->host_link = devices_host_link(d);
    }
    if (loaded)
        devices_free(&t);
    return ERR_OK;
}

/* The stage's profile against the stage and the stages before it: made on its device, for
 * at least its memory, of stage 0's model (a custom model: the same layer list), and, under a
 * device name another stage has used, that stage's costs. */
static int check_stage_profile(struct cluster *c, char (*paths)[CLUSTER_PATH_MAX],
                               const char *file, const char *path, const char *rel, int s,
                               struct err *e)
{
    const struct cluster_stage *st = &c->stages[s];
    const struct profile *p = &c->profiles[st->profile];
    if (strcmp(p->device.name, st->device) != 0)
        return err_set(e, ERR_INPUT,
                       "%s: %s.profile: \"%s\" was made on device \"%s\", but the stage's device "
                       "is \"%s\"",
                       file, path, rel, p->device.name, st->device);
    if (st->memory_bytes > p->device.memory_bytes)
        return err_set(e, ERR_INPUT,
                       "%s: %s.memory_bytes: %lld bytes (%.2f GiB) is more than the %lld bytes "
                       "(%.2f GiB) of device \"%s\" in \"%s\"",
                       file, path, (long long)st->memory_bytes, st->memory_bytes / 1073741824.0,
                       (long long)p->device.memory_bytes, p->device.memory_bytes / 1073741824.0,
                       st->device, rel);
    if (s == 0) {
        c->model = p->model;
    } else if (!model_equal(&c->model, &p->model)) {
        char buf[128];
        return err_set(e, ERR_INPUT,
                       "%s: %s.profile: \"%s\" describes a different model than stage 0's "
                       "profile (%s)",
                       file, path, rel, first_model_difference(&p->model, &c->model, buf));
    } else if (model_is_custom(&p->model)) {
        /* a custom model is its layer list: every profile names the same layers */
        const struct profile *p0 = &c->profiles[c->stages[0].profile];
        for (int l = 0; l < p->n_layers; l++)
            if (strcmp(p->layers[l].name, p0->layers[l].name) != 0)
                return err_set(e, ERR_INPUT,
                               "%s: %s.profile: \"%s\" names layer %d \"%s\", but stage 0's "
                               "profile names it \"%s\" (profiles of one custom model list the "
                               "same layers)",
                               file, path, rel, l, p->layers[l].name, p0->layers[l].name);
    }
    /* A device name is one set of costs: the planner groups stages by it (the order of
     * device kinds), so two profiles under one name that disagree would plan with either's
     * numbers. Copies of one profile are harmless. */
    for (int t = 0; t < s; t++) {
        char what[160];
        if (strcmp(c->stages[t].device, st->device) != 0 || c->stages[t].profile == st->profile ||
            !profiles_differ(&c->profiles[c->stages[t].profile], p, what))
            continue;
        return err_set(e, ERR_INPUT,
                       "%s: %s.profile: \"%s\" is a second profile of device \"%s\" that "
                       "disagrees with stages[%d]'s %s (%s): stages that name one device share "
                       "its costs; if the devices differ, give them different names (ballast "
                       "profile --name)",
                       file, path, rel, st->device, t, paths[c->stages[t].profile], what);
    }
    return ERR_OK;
}

/* "layers": given for every stage or for none; a [first, last] pair of integers. */
static int read_stage_layers(const cJSON *obj, const char *file, const char *path, int s,
                             struct cluster_stage *st, int *has_layers, struct err *e)
{
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(obj, "layers");
    int has = layers != NULL;
    if (s == 0)
        *has_layers = has;
    else if (has != *has_layers)
        return err_set(e, ERR_INPUT,
                       "%s: %s.layers: %s, but stages[0] %s it: give layers for every stage or "
                       "for none",
                       file, path, has ? "given" : "missing", *has_layers ? "gives" : "omits");
    if (has) {
        char lp[JSONIO_PATH_MAX];
        int64_t v[2];
        jsonio_path_key(lp, path, "layers");
        if (jsonio_expect_array(layers, file, lp, e))
            return e->code;
        if (cJSON_GetArraySize(layers) != 2)
            return err_set(e, ERR_INPUT, "%s: %s: expected [first, last], found %d numbers", file,
                           lp, cJSON_GetArraySize(layers));
        for (int k = 0; k < 2; k++) {
            char ip[JSONIO_PATH_MAX];
            jsonio_path_index(ip, lp, k);
            if (jsonio_int_value(cJSON_GetArrayItem(layers, k), file, ip, INT32_MIN, INT32_MAX,
                                 &v[k], e))
                return e->code;
        }
        st->first = (int)v[0];
        st->last = (int)v[1];
    }
    return ERR_OK;
}

static int read_cluster_stage(struct cluster *c, char (*paths)[CLUSTER_PATH_MAX], const cJSON *obj,
                              const char *file, int s, int *has_layers, struct err *e)
{
    static const char *const keys[] = {"device",           "memory_bytes", "profile", "layers",
                                       "link",             "host_link",    "host_memory_bytes",
                                       "tp",               "dp",           "per_node",
                                       "node_link",        "node_host_memory_bytes", NULL};
    struct cluster_stage *st = &c->stages[s];
    char path[JSONIO_PATH_MAX];
    const char *rel;
    jsonio_path_index(path, "stages", s);
    if (jsonio_expect_object(obj, file, path, e) || jsonio_check_keys(obj, file, path, keys, e) ||
        jsonio_str_copy(obj, file, path, "device", st->device, sizeof st->device, e) ||
        units_json_bytes(obj, file, path, "memory_bytes", 1, JSONIO_INT_MAX, &st->memory_bytes,
                         e) ||
        jsonio_str(obj, file, path, "profile", &rel, e))
        return e->code;
    if (stage_profile(c, paths, file, path, rel, &st->profile, e) ||
        check_stage_profile(c, paths, file, path, rel, s, e) ||
        read_stage_layers(obj, file, path, s, st, has_layers, e))
        return e->code;
    const cJSON *link = cJSON_GetObjectItemCaseSensitive(obj, "link");
    if (link != NULL) {
        char lp[JSONIO_PATH_MAX];
        jsonio_path_key(lp, path, "link");
        if (link_from_json(link, file, lp, 1, &st->link, e))
            return e->code;
    }
    if (read_host(obj, file, path, st, e) || cluster_group_read_stage(obj, file, path, st, e))
        return e->code;
    return ERR_OK;
}

/* Layer ranges must tile 0..L-1 in order, each stage at least one layer. */
static int check_layer_ranges(const struct cluster *c, const char *file, struct err *e)
{
    int L = c->n_layers;
    for (int s = 0; s < c->n_stages; s++) {
        const struct cluster_stage *st = &c->stages[s];
        int expect = s == 0 ? 0 : c->stages[s - 1].last + 1;
        if (st->first < 0 || st->last >= L)
            return err_set(e, ERR_INPUT,
                           "%s: stages[%d].layers: [%d, %d] runs past the %d layers of the model "
                           "(0 = embed .. %d = head)",
                           file, s, st->first, st->last, L, L - 1);
        if (st->first > st->last)
            return err_set(e, ERR_INPUT, "%s: stages[%d].layers: [%d, %d] is empty (first > last)",
                           file, s, st->first, st->last);
        if (st->first < expect)
            return err_set(e, ERR_INPUT,
                           "%s: stages[%d].layers: [%d, %d] overlaps stages[%d].layers, which "
                           "ends at %d",
                           file, s, st->first, st->last, s - 1, expect - 1);
        if (st->first > expect)
            return err_set(e, ERR_INPUT,
                           "%s: stages[%d].layers: [%d, %d] leaves layers %d..%d in no stage",
                           file, s, st->first, st->last, expect, st->first - 1);
    }
    if (c->stages[c->n_stages - 1].last != L - 1)
        return err_set(e, ERR_INPUT,
                       "%s: stages[%d].layers: ends at %d, leaving layers %d..%d in no stage",
                       file, c->n_stages - 1, c->stages[c->n_stages - 1].last,
                       c->stages[c->n_stages - 1].last + 1, L - 1);
    return ERR_OK;
}

/* The cluster's own members: its keys, schedule, micro-batches, reserve, link, groups. */
static int read_cluster_header(const cJSON *root, const char *file, struct cluster *c,
                               struct err *e)
{
    static const char *const keys[] = {"format", "schedule", "micro_batches", "stages",
                                       "reserve_bytes", "link", "name", "description",
                                       "shard_optimizer", "dp_link", "pipelines", "pool",
                                       "global_batch", "dp_bucket_bytes", "virtual_stages",
                                       NULL};
    int64_t micro;
    static const char *const text[] = {"name", "description", NULL};
    if (jsonio_check_format(root, file, "cluster", 1, e) ||
        jsonio_check_keys(root, file, "", keys, e) || jsonio_check_text(root, file, "", text, e) ||
        read_schedule(root, file, c, e))
        return e->code;
    if (jsonio_int(root, file, "", "micro_batches", 1, 1 << 20, &micro, e) ||
        units_json_bytes_opt(root, file, "", "reserve_bytes", 0, JSONIO_INT_MAX, &c->reserve_bytes,
                             e))
        return e->code;
    c->micro_batches = (int)micro;
    const cJSON *link = cJSON_GetObjectItemCaseSensitive(root, "link");
    if ((link != NULL && link_from_json(link, file, "link", 1, &c->link, e)) ||
        cluster_group_read(root, file, c, e))
        return e->code;
    return ERR_OK;
}

/* "stages", each with its profile (the model comes with the first); *has_layers when they
 * give their layers. */
static int read_cluster_stages(const cJSON *stages, const char *file, struct cluster *c,
                               int *has_layers, struct err *e)
{
    if (jsonio_expect_array(stages, file, "stages", e))
        return e->code;
    int S = cJSON_GetArraySize(stages);
    if (S < 1 || S > CLUSTER_STAGES_MAX)
        return err_set(e, ERR_INPUT, "%s: stages: %d stages, expected 1 to %d", file, S,
                       CLUSTER_STAGES_MAX);
    c->stages = calloc((size_t)S, sizeof *c->stages);
    c->profiles = calloc((size_t)S, sizeof *c->profiles);
    char (*paths)[CLUSTER_PATH_MAX] = calloc((size_t)S, sizeof *paths);
    if (c->stages == NULL || c->profiles == NULL || paths == NULL) {
        free(paths);
        return err_set(e, ERR_FAIL, "%s: out of memory", file);
    }
    c->n_stages = S;
    int s = 0;
    for (const cJSON *st = stages->child; st != NULL; st = st->next, s++)
        if (read_cluster_stage(c, paths, st, file, s, has_layers, e))
            break;
    free(paths);
    return e->code;
}

/* The stages' layers (given, checked; else the default split) and what the whole cluster
 * must hold: a layer a stage, no link after the last, memory beyond the reserve. */
static int check_cluster_stages(struct cluster *c, const char *file, int has_layers,
                                struct err *e)
{
    int S = c->n_stages;
    c->n_layers = model_layer_count(&c->model);
    if (S > c->n_layers)
        return err_set(e, ERR_INPUT,
                       "%s: stages: %d stages, but the model has only %d layers (each stage needs "
                       "at least one)",
                       file, S, c->n_layers);
    if (c->stages[S - 1].link.present)
        return err_set(e, ERR_INPUT, "%s: stages[%d].link: the last stage has no next stage",
                       file, S - 1);
    c->layers_given = has_layers;
    if (has_layers && check_layer_ranges(c, file, e))
        return e->code;
    for (int s = 0; !has_layers && s < S; s++)
        cluster_default_split(&c->model, c->n_layers, S, s, &c->stages[s].first,
                              &c->stages[s].last);
    for (int s = 0; s < S; s++)
        if (c->reserve_bytes >= c->stages[s].memory_bytes)
            return err_set(e, ERR_INPUT,
                           "%s: reserve_bytes: %lld bytes leaves nothing of stages[%d]'s "
                           "memory_bytes %lld",
                           file, (long long)c->reserve_bytes, s,
                           (long long)c->stages[s].memory_bytes);
    return ERR_OK;
}

static int cluster_from_json(const cJSON *root, const char *file, struct cluster *c,
                             struct err *e)
{
    if (read_cluster_header(root, file, c, e))
        return e->code;
    const cJSON *stages = cJSON_GetObjectItemCaseSensitive(root, "stages");
    if (stages == NULL || cJSON_GetObjectItemCaseSensitive(root, "pipelines") != NULL ||
        cJSON_GetObjectItemCaseSensitive(root, "pool") != NULL)
        return cluster_group_no_stages(root, file, e);
    int has_layers = 0;
    if (read_cluster_stages(stages, file, c, &has_layers, e) ||
        check_cluster_stages(c, file, has_layers, e) || resolve_host_links(c, e) ||
        cluster_group_apply(c, file, e))
        return e->code;
    return ERR_OK;
}

int cluster_parse(const cJSON *root, const char *file, struct cluster *c, struct err *e)
{
    memset(c, 0, sizeof *c);
    int rc = cluster_from_json(root, file, c, e);
    if (rc)
        cluster_free(c);
    c->file = rc ? NULL : file;
    return rc;
}

int cluster_check_host_memory(const struct cluster *c, struct err *e)
{
    const char *file = c->file != NULL ? c->file : "the cluster";
    int any = 0;
    for (int s = 0; s < c->n_stages; s++) {
        const struct cluster_stage *st = &c->stages[s];
        if (st->host_memory_bytes > 0 && !st->host_link.present)
            return err_set(e, ERR_INPUT,
                           "%s: stages[%d].host_memory_bytes: %lld, but the stage (%s) has no "
                           "host_link (none in the cluster, its profile, or devices.json's "
                           "host_link_gbs for it)",
                           file, s, (long long)st->host_memory_bytes, st->device);
        any |= st->host_memory_bytes > 0;
    }
    if (!any)
        return err_set(e, ERR_INPUT,
                       "--actions offload or optimizer: no stage of %s has host_memory_bytes "
                       "(the host memory it may offload to)", file);
    return ERR_OK;
}

int cluster_load(const char *file, struct cluster *c, struct err *e)
{
    memset(c, 0, sizeof *c);
    cJSON *root = jsonio_read_kind(file, JSONIO_CLUSTER, e);
    if (root == NULL)
        return e->code;
    int rc = cluster_parse(root, file, c, e);
    cJSON_Delete(root);
    return rc;
}
