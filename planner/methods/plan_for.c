/* `ballast plan --for FRAMEWORK` (framework.h): the cluster's profiles become the framework's
 * activation model (what `ballast profile --estimate --for` makes), then only the framework's
 * settings are searched, on the cluster's split, or with --repartition over the splits and
 * device orders it can run: every setting's best split by the repartition search (its
 * per-range costs from the setting and the framework's split rules, repartition.c), planned
 * with the framework's best settings for that split. The plan is then what the framework
 * runs: its export carries no note. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "choice.h"
#include "cost.h"
#include "framework.h"
#include "microbatch.h"
#include "model_kind.h"
#include "plan_layout.h"
#include "repartition.h"

/* The group stage s's profile is costed for (cost.h cost_group): its activations divide by
 * the stage's tp. */
static struct cost_group stage_group(const struct cluster *c, int s)
{
    const struct cluster_stage *st = &c->stages[s];
    const struct profile *p = cluster_stage_profile(c, s);
    return (struct cost_group){.tp = st->tp,
                               .dp = 1,
                               .tp_efficiency = p->tp_efficiency > 0 ? p->tp_efficiency : 1.0,
                               .node_link = st->node_link,
                               .tensor_bytes = cost_tp_tensor_bytes(&c->model),
                               .dtype = c->model.dtype};
}

/* A copy of `from` (owned by the caller: profile_free). */
static int plan_for_profile_copy(const struct profile *from, struct profile *to, struct err *e)
{
    *to = *from;
    to->layers = malloc((size_t)from->n_layers * sizeof *to->layers);
    to->provenance = from->provenance ? cJSON_Duplicate(from->provenance, 1) : NULL;
    if (to->layers == NULL || (from->provenance && to->provenance == NULL)) {
        profile_free(to);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    memcpy(to->layers, from->layers, (size_t)from->n_layers * sizeof *to->layers);
    return ERR_OK;
}

/* `to`'s activations (act_bytes, recompute options) and assumptions become the framework's
 * estimate `fresh` of one GPU, as each GPU of stage s's group keeps them. */
static void take_activations(const struct cluster *c, int s, const struct profile *fresh,
                             struct profile *to)
{
    struct cost_group g = stage_group(c, s);
    for (int l = 0; l < to->n_layers; l++) {
        struct layer_cost grouped;
        cost_group_layer(&fresh->layers[l], model_layer_kind(&c->model, l), &g, &grouped);
        to->layers[l].act_bytes = grouped.act_bytes;
        to->layers[l].n_options = grouped.n_options;
        memcpy(to->layers[l].options, grouped.options, sizeof grouped.options);
    }
    const char *keys[] = {"for", "attention", "for_method"};
    for (int k = 0; k < 3; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(fresh->provenance, keys[k]);
        if (to->provenance == NULL)
            to->provenance = cJSON_CreateObject();
        if (v != NULL && to->provenance != NULL) {
            cJSON_DeleteItemFromObjectCaseSensitive(to->provenance, keys[k]);
            cJSON_AddItemToObject(to->provenance, keys[k], cJSON_Duplicate(v, 1));
        }
    }
}

/* Profile k of the cluster (first used by stage s) as framework f keeps activations. */
static int profile_for_framework(const struct cluster *c, int k, int s, const struct framework *f,
                                 const struct plan_options *o, const struct device_table *t,
                                 struct profile *to, struct err *e)
{
    const struct profile *from = &c->profiles[k];
    char acts[PLAN_FRAMEWORK_MAX];
    enum model_attention att;
    fw_profile_assumptions(from, acts, &att);
    if (plan_for_profile_copy(from, to, e))
        return e->code;
    if (fw_activations_alike(acts, f->activations))
        return ERR_OK;
    const struct device_spec *d = devices_find(t, from->device.name);
    const char *why = strcmp(acts, "ballast") != 0 ? "it was made --for another framework"
                      : !from->estimated           ? "it is measured on Ballast's runtime"
                      : d == NULL                  ? "its device is not in the device table"
                      : o->estimate == NULL || o->estimate_for == NULL
                          ? "no estimator was given to make it again"
                          : NULL;
    struct profile fresh = {0};
    int rc = why != NULL ? ERR_INPUT : o->estimate(t, d, &c->model, &fresh, e);
    if (rc == ERR_OK)
        rc = o->estimate_for(t, d, &c->model, f->activations, &fresh, e);
    if (rc == ERR_OK)
        take_activations(c, s, &fresh, to);
    profile_free(&fresh);
    if (why != NULL)
        err_set(e, ERR_INPUT,
                "--for %s: stage %d's profile (%s, activations \"%s\") cannot be made %s's "
                "activation model: %s; give profiles made with `ballast profile --estimate "
                "--device %s --for %s`, or plan --for ballast and export (ballast export "
                "--to %s re-plans the framework's settings on these costs)",
                f->name, s, from->device.name, acts, f->title, why, from->device.name,
                f->activations, f->name);
    if (e->code)
        profile_free(to);
    return e->code;
}

/* The cluster with every profile made framework f's activation model (out->profiles owned:
 * cluster_for_free). */
static int cluster_for(const struct cluster *c, const struct framework *f,
                       const struct plan_options *o, const struct device_table *t,
                       struct cluster *out, struct err *e)
{
    *out = *c;
    out->profiles = calloc((size_t)c->n_profiles, sizeof *out->profiles);
    if (out->profiles == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int done = 0;
    for (int k = 0; k < c->n_profiles && e->code == ERR_OK; k++) {
        int s = 0;
        while (s < c->n_stages && c->stages[s].profile != k)
            s++;
        if (s < c->n_stages &&
            profile_for_framework(c, k, s, f, o, t, &out->profiles[k], e) == ERR_OK)
            done++;
    }
    if (e->code == ERR_OK)
        return ERR_OK;
    for (int k = 0; k < done; k++)
        profile_free(&out->profiles[k]);
    free(out->profiles);
    return e->code;
}

static void cluster_for_free(struct cluster *fc, int n_profiles)
{
    for (int k = 0; k < n_profiles; k++)
        profile_free(&fc->profiles[k]);
    free(fc->profiles);
}

/* The plan on cluster c's split: laid out, the framework's settings kept by the margin —
 * of those stepping within `cap_ms` (> 0), else within o->min_gain of the split's fastest, the
 * simplest (framework.h fw_choose). */
static int plan_split(const struct cluster *c, const struct plan_options *o, double cap_ms,
                      struct plan *out, struct err *e)
{
    if (plan_layout(c, o, out, e))
        return e->code;
    int rc = fw_choose(out, o->framework, 1, (o->actions & PLAN_ACTION_OPTIMIZER) != 0,
                       o->min_gain, cap_ms, NULL, e);
    if (rc)
        plan_free(out);
    return rc;
}

/* The splits --repartition weighs for a framework, each with its fastest step (INFINITY
 * where nothing fits): every setting's fastest split and device order, the cluster's own
 * split, and its blocks dealt evenly (what a person would write). */
struct split_list {
    struct cluster *v;
    double *ms;
    int n, cap;
    double fastest_ms;
};

static void split_list_free(struct split_list *sl)
{
    for (int i = 0; i < sl->n; i++)
        free(sl->v[i].stages);
    free(sl->v);
    free(sl->ms);
    *sl = (struct split_list){.fastest_ms = INFINITY};
}

/* ERR_NOFIT or ERR_INPUT (the framework cannot run a split) is kept for the message; other
 * errors stop. */
static int tried(int rc, char *msg, size_t size, struct err *e)
{
    if (rc != ERR_NOFIT && rc != ERR_INPUT)
        return rc;
    if (!msg[0])
        snprintf(msg, size, "%s", e->msg);
    err_clear(e);
    return ERR_OK;
}

static int grow(struct split_list *sl, struct err *e)
{
    int cap = sl->cap ? 2 * sl->cap : 16;
    struct cluster *v = realloc(sl->v, (size_t)cap * sizeof *v);
    if (v != NULL)
        sl->v = v;
    double *ms = v != NULL ? realloc(sl->ms, (size_t)cap * sizeof *ms) : NULL;
    if (ms == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    sl->ms = ms;
    sl->cap = cap;
    return ERR_OK;
}

/* Takes `arranged` (its stages freed on failure) with its fastest step. */
static int split_list_add(struct split_list *sl, struct cluster *arranged,
                          const struct plan_options *o, char *msg, size_t size, struct err *e)
{
    struct plan p;
    struct plan_options fastest = *o;
    fastest.min_gain = 0;
    int rc = plan_split(arranged, &fastest, 0, &p, e);
    double ms = rc == ERR_OK ? p.iteration_ms : INFINITY;
    if (rc == ERR_OK)
        plan_free(&p);
    if (tried(rc, msg, size, e) || (sl->n == sl->cap && grow(sl, e))) {
        free(arranged->stages);
        return e->code;
    }
    sl->v[sl->n] = *arranged;
    sl->ms[sl->n++] = ms;
    sl->fastest_ms = ms < sl->fastest_ms ? ms : sl->fastest_ms;
    return ERR_OK;
}

/* Each of the framework's settings searched by --repartition for its fastest split; the
 * searches after the first stop where they cannot come within the margin of the fastest. */
static int search_splits(const struct cluster *c, const struct plan_options *o,
                         struct split_list *sl, char *msg, size_t size, struct err *e)
{
    struct fw_candidate *cand;
    int n_cand;
    if (fw_candidates(o->framework, model_is_custom(&c->model) ? c->n_layers
                                                                       : c->model.n_layer,
                      1, &cand, &n_cand, e))
        return e->code;
    for (int i = 0; i < n_cand && e->code == ERR_OK; i++) {
        struct plan_options so = *o;
        struct arrangement a;
        struct plan_search found;
        struct cluster arranged;
        so.actions = PLAN_ACTION_RECOMPUTE;
        so.min_gain = 0; /* its fastest split: the margin chooses among all of them below */
        so.framework_range = &cand[i];
        so.cutoff_ms = isinf(sl->fastest_ms) ? 0 : choice_cap(sl->fastest_ms, o->min_gain);
        int rc = repartition_search(c, &so, &a, &found, e);
        if (rc == ERR_NOFIT) {
            if (!found.present)
                tried(rc, msg, size, e);
            err_clear(e);
            continue;
        }
        if (rc || arranged_cluster(c, &a, &arranged, e)) {
            if (rc == ERR_OK)
                arrangement_free(&a);
            break;
        }
        arrangement_free(&a);
        split_list_add(sl, &arranged, o, msg, size, e);
    }
    free(cand);
    return e->code;
}

/* The cluster's own split and the even one (cluster_default_split), in its order. */
static int plain_splits(const struct cluster *c, const struct plan_options *o,
                        struct split_list *sl, char *msg, size_t size, struct err *e)
{
    for (int even = 0; even < 2 && e->code == ERR_OK; even++) {
        struct cluster copy = *c;
        copy.stages = malloc((size_t)c->n_stages * sizeof *copy.stages);
        if (copy.stages == NULL)
            return err_set(e, ERR_FAIL, "out of memory");
        memcpy(copy.stages, c->stages, (size_t)c->n_stages * sizeof *copy.stages);
        for (int s = 0; even && s < c->n_stages; s++)
            cluster_default_split(&c->model, c->n_layers, c->n_stages, s, &copy.stages[s].first,
                                  &copy.stages[s].last);
        split_list_add(sl, &copy, o, msg, size, e);
    }
    return e->code;
}

/* Of every split's settings within the margin of the fastest step of all, the simplest plan
 * (choice.h; ties: the faster, then less memory): exact over the splits weighed, so a wider
 * margin never keeps a less simple plan. */
static int keep_simplest(const struct split_list *sl, const struct plan_options *o,
                         struct plan *out, struct err *e)
{
    double cap = choice_cap(sl->fastest_ms, o->min_gain);
    struct choice_key best, key;
    int have = 0;
    for (int i = 0; i < sl->n && e->code == ERR_OK; i++) {
        struct plan p;
        if (isinf(sl->ms[i]) || sl->ms[i] > cap || plan_split(&sl->v[i], o, cap, &p, e))
            continue;
        choice_key_of(&p, o, &key);
        int cmp = have ? choice_key_cmp(&key, &best) : -1;
        if (cmp < 0 || (cmp == 0 && microbatch_better(p.iteration_ms, plan_memory(&p),
                                                      out->iteration_ms, plan_memory(out)))) {
            if (have)
                plan_free(out);
            *out = p;
            best = key;
            have = 1;
        } else {
            plan_free(&p);
        }
    }
    if (e->code && have)
        plan_free(out);
    if (e->code == ERR_OK && have) {
        out->min_gain = o->min_gain;
        out->fastest_ms = out->iteration_ms > choice_cap(sl->fastest_ms, 0) ? sl->fastest_ms : 0;
    }
    return e->code;
}

static int plan_repartitioned_for(const struct cluster *c, const struct plan_options *o,
                                  struct plan *out, struct err *e)
{
    char msg[sizeof e->msg] = "";
    struct split_list sl = {.fastest_ms = INFINITY};
    int rc = search_splits(c, o, &sl, msg, sizeof msg, e);
    if (rc == ERR_OK)
        rc = plain_splits(c, o, &sl, msg, sizeof msg, e);
    if (rc == ERR_OK && isinf(sl.fastest_ms))
        rc = err_set(e, ERR_NOFIT, "--for %s --repartition: no split %s can run fits%s%s",
                     o->framework->name, o->framework->title, msg[0] ? "; for one:\n  " : "",
                     msg);
    if (rc == ERR_OK)
        rc = keep_simplest(&sl, o, out, e);
    split_list_free(&sl);
    if (rc == ERR_OK)
        snprintf(out->method, sizeof out->method, "optimal+repartition");
    return rc;
}

/* --for with the options it takes: optimal's recompute (and every stage's optimizer on the
 * host, where the framework has that switch); no offload, arena or GLPK check. */
static int check_options(const struct plan_options *o, struct err *e)
{
    const struct framework *f = o->framework;
    if (o->method != METHOD_OPTIMAL)
        return err_set(e, ERR_INPUT, "--for %s plans with --method optimal (the framework's "
                       "fastest settings); the other methods are Ballast's baselines", f->name);
    if (o->actions & PLAN_ACTION_OFFLOAD)
        return err_set(e, ERR_INPUT, "--for %s: --actions offload is not planned for a "
                       "framework (its activation offloading keeps tensors the cost model does "
                       "not hold); plan --for ballast and export to see what it runs", f->name);
    if (o->actions & PLAN_ACTION_WEIGHTS)
        return err_set(e, ERR_INPUT, "--for %s: --actions weights is not planned for a "
                       "framework: none of those exported streams a layer's weights from host "
                       "memory for each use (plan --for ballast to train with it)", f->name);
    if ((o->actions & PLAN_ACTION_OPTIMIZER) && f->host_optimizer == FW_NO)
        return err_set(e, ERR_INPUT, "--for %s: %s has no setting for the optimizer on the "
                       "host (--actions optimizer)", f->name, f->title);
    if (o->arena != NULL || o->verify)
        return err_set(e, ERR_INPUT, "--for %s takes no --arena or --verify (the framework "
                       "lays out its own memory; its settings are enumerated, not a knapsack)",
                       f->name);
    return ERR_OK;
}

int plan_for_framework(const struct cluster *c, const struct plan_options *given,
                       struct plan *out, struct err *e)
{
    struct device_table t;
    struct cluster fc;
    struct plan_options fo = *given, *o = &fo; /* the framework's row for this model */
    fo.framework = framework_find(given->framework->name, &c->model);
    if (check_options(o, e) || devices_load(devices_default_file(), &t, e))
        return e->code;
    if (cluster_for(c, o->framework, o, &t, &fc, e)) {
        devices_free(&t);
        return e->code;
    }
    /* its stages' devices, whatever split or order: refused before any search */
    struct plan probe;
    int rc = plan_layout(&fc, o, &probe, e);
    if (rc == ERR_OK) {
        rc = fw_device_check(&probe, o->framework, &t, e);
        plan_free(&probe);
    }
    if (rc == ERR_OK)
        rc = o->repartition ? plan_repartitioned_for(&fc, o, out, e)
                            : plan_split(&fc, o, 0, out, e);
    if (rc == ERR_OK)
        snprintf(out->framework.target, sizeof out->framework.target, "%s", o->framework->name);
    cluster_for_free(&fc, c->n_profiles);
    devices_free(&t);
    return rc;
}

int planner_make_settings(const struct cluster *c, const struct plan_options *given,
                          const struct fw_settings *fs, struct plan *out, struct err *e)
{
    struct device_table t;
    struct cluster fc;
    struct plan_options fo = *given, *o = &fo;
    char why[512];
    fo.framework = framework_find(given->framework->name, &c->model);
    memset(out, 0, sizeof *out);
    int v = c->virtual_stages > 0 ? c->virtual_stages : 2;
    if (c->schedule_auto || schedule_fixed_chunks(c->schedule, v) > 1 ||
        schedule_splits(c->schedule))
        return err_set(e, ERR_INPUT, "a framework's settings are scored under schedules 1f1b "
                       "and gpipe (one chunk a GPU, the backward whole), and the cluster's "
                       "schedule is %s (docs/schedules.md)",
                       c->schedule_auto ? "auto" : schedule_name(c->schedule));
    if (devices_load(devices_default_file(), &t, e))
        return e->code;
    int rc = cluster_for(c, o->framework, o, &t, &fc, e);
    if (rc == ERR_OK) {
        rc = plan_layout(&fc, o, out, e);
        if (rc == ERR_OK && !fw_settings_allowed(o->framework, out, fs, 0, why, sizeof why))
            rc = err_set(e, ERR_INPUT, "%s cannot run these settings: %s", o->framework->title,
                         why);
        if (rc == ERR_OK)
            rc = fw_settings_apply(out, fs, 1, e);
        if (rc == ERR_OK) {
            snprintf(out->framework.target, sizeof out->framework.target, "%s",
                     o->framework->name);
            rc = fw_device_check(out, o->framework, &t, e);
        }
        if (rc && out->stages != NULL)
            plan_free(out);
        cluster_for_free(&fc, c->n_profiles);
    }
    devices_free(&t);
    return rc;
}
