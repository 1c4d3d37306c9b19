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

#include "cost.h"
#include "framework.h"
#include "microbatch.h"
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
static int profile_copy(const struct profile *from, struct profile *to, struct err *e)
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
static int profile_for(const struct cluster *c, int k, int s, const struct framework *f,
                       const struct plan_options *o, const struct device_table *t,
                       struct profile *to, struct err *e)
{
    const struct profile *from = &c->profiles[k];
    char acts[PLAN_FRAMEWORK_MAX];
    enum model_attention att;
    fw_profile_assumptions(from, acts, &att);
    if (profile_copy(from, to, e))
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
        if (s < c->n_stages && profile_for(c, k, s, f, o, t, &out->profiles[k], e) == ERR_OK)
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

/* The plan on the cluster's own split: laid out, the framework's best settings. */
static int plan_split(const struct cluster *c, const struct plan_options *o, struct plan *out,
                      struct err *e)
{
    if (plan_layout(c, o, out, e))
        return e->code;
    int rc = fw_choose(out, o->framework, 1, (o->actions & PLAN_ACTION_OPTIMIZER) != 0, NULL, e);
    if (rc)
        plan_free(out);
    return rc;
}

/* Keeps `p` in `best` when it is the first or faster (ties: less memory); frees the other. */
static void keep_faster(struct plan *p, struct plan *best, int *have)
{
    if (*have && !microbatch_better(p->iteration_ms, plan_memory(p), best->iteration_ms,
                                    plan_memory(best))) {
        plan_free(p);
        return;
    }
    if (*have)
        plan_free(best);
    *best = *p;
    *have = 1;
}

/* ERR_NOFIT (a plan that did not fit) is kept for the message; other errors stop. */
static int tried(int rc, int *nofit_seen, struct err *e, char *msg, size_t size)
{
    if (rc != ERR_NOFIT)
        return rc;
    if (!*nofit_seen)
        snprintf(msg, size, "%s", e->msg);
    *nofit_seen = 1;
    err_clear(e);
    return ERR_OK;
}

/* Each of the framework's settings searched by --repartition, the split it finds planned
 * with the framework's best settings for it; the searches after the first stop at the best
 * step so far. */
static int search_splits(const struct cluster *c, const struct plan_options *o,
                         struct plan *best, int *have, int *nofit_seen, char *msg, size_t size,
                         struct err *e)
{
    struct fw_candidate *cand;
    int n_cand;
    if (fw_candidates(o->framework, c->model.kind == MODEL_KIND_CUSTOM ? c->n_layers
                                                                       : c->model.n_layer,
                      1, &cand, &n_cand, e))
        return e->code;
    for (int i = 0; i < n_cand && e->code == ERR_OK; i++) {
        struct plan_options so = *o;
        struct arrangement a;
        struct plan_search found;
        struct cluster arranged;
        so.actions = PLAN_ACTION_RECOMPUTE;
        so.framework_range = &cand[i];
        so.cutoff_ms = *have ? best->iteration_ms : 0;
        int rc = repartition_search(c, &so, &a, &found, e);
        if (rc == ERR_NOFIT) {
            if (!found.present)
                tried(rc, nofit_seen, e, msg, size);
            err_clear(e);
            continue;
        }
        if (rc || arranged_cluster(c, &a, &arranged, e)) {
            if (rc == ERR_OK)
                arrangement_free(&a);
            break;
        }
        arrangement_free(&a);
        struct plan p;
        struct plan_options po = *o;
        po.repartition = 0;
        rc = plan_split(&arranged, &po, &p, e);
        free(arranged.stages);
        if (rc == ERR_OK)
            keep_faster(&p, best, have);
        else
            tried(rc, nofit_seen, e, msg, size);
    }
    free(cand);
    return e->code;
}

static int plan_repartitioned_for(const struct cluster *c, const struct plan_options *o,
                                  struct plan *out, struct err *e)
{
    char msg[sizeof e->msg] = "";
    int have = 0, nofit_seen = 0;
    int rc = search_splits(c, o, out, &have, &nofit_seen, msg, sizeof msg, e);
    if (rc) {
        if (have)
            plan_free(out);
        return rc;
    }
    if (!have)
        return err_set(e, ERR_NOFIT, "--for %s --repartition: no split %s can run fits%s%s",
                       o->framework->name, o->framework->title, msg[0] ? "; for one:\n  " : "",
                       msg);
    snprintf(out->method, sizeof out->method, "optimal+repartition");
    return ERR_OK;
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
        rc = o->repartition ? plan_repartitioned_for(&fc, o, out, e) : plan_split(&fc, o, out, e);
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
