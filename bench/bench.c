#include "bench.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

#include "clock.h"
#include "cost.h"
#include "estimate.h"
#include "fileio.h"
#include "model_kind.h"
#include "model_ops.h"
#include "planner.h"
#include "sim.h"

const char *const bench_method_names[BENCH_METHODS] = {"none",    "full",
                                                       "uniform-min", "patent",
                                                       "optimal", "optimal+repartition"};

void bench_options_default(struct bench_options *o)
{
    *o = (struct bench_options){.out_dir = "out/bench",
                                .clusters = BALLAST_SOURCE_DIR "/configs/clusters",
                                .models = "gpt-1.3b,gpt-13b,gpt-175b,llama2-7b,llama3-8b,llama2-70b",
                                .devices_file = devices_default_file(),
                                .plots = 1,
                                .fp16 = 1};
}

/* "dir/name.json" -> "name" */
static void base_name(const char *path, char out[BENCH_NAME_MAX])
{
    const char *slash = strrchr(path, '/');
    snprintf(out, BENCH_NAME_MAX, "%s", slash ? slash + 1 : path);
    size_t n = strlen(out);
    if (n > 5 && strcmp(out + n - 5, ".json") == 0)
        out[n - 5] = '\0';
}

/* A growing list of owned strings. */
struct names {
    int n, cap;
    char **v;
};

static int names_add(struct names *l, const char *s, struct err *e)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        char **v = realloc(l->v, (size_t)cap * sizeof *v);
        if (v == NULL)
            return err_set(e, ERR_FAIL, "out of memory");
        l->v = v;
        l->cap = cap;
    }
    if ((l->v[l->n] = strdup(s)) == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    l->n++;
    return ERR_OK;
}

static void names_free(struct names *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* The items of a comma-separated list, added to out. */
static int names_split(const char *spec, struct names *out, struct err *e)
{
    char *copy = strdup(spec), *save = NULL;
    if (copy == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (char *item = strtok_r(copy, ",", &save); item && !e->code;
         item = strtok_r(NULL, ",", &save))
        names_add(out, item, e);
    free(copy);
    return e->code;
}

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The *.json files of folder `dir`, sorted, added to out. */
static int add_folder(const char *dir, struct names *out, struct err *e)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return err_set(e, ERR_INPUT, "--clusters: %s: %s", dir, strerror(errno));
    int first = out->n;
    for (struct dirent *de = readdir(d); de && !e->code; de = readdir(d)) {
        size_t n = strlen(de->d_name);
        if (n > 5 && strcmp(de->d_name + n - 5, ".json") == 0) {
            char path[CLUSTER_PATH_MAX];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            names_add(out, path, e);
        }
    }
    closedir(d);
    qsort(out->v + first, (size_t)(out->n - first), sizeof *out->v, compare_strings);
    return e->code;
}

/* The cluster files named by a comma-separated list of files and folders (a folder gives its
 * *.json files, sorted). */
static int list_clusters(const char *spec, struct names *out, struct err *e)
{
    struct names items = {0};
    names_split(spec, &items, e);
    for (int i = 0; i < items.n && !e->code; i++) {
        struct stat sb;
        if (stat(items.v[i], &sb) != 0)
            err_set(e, ERR_INPUT, "--clusters: %s: %s", items.v[i], strerror(errno));
        else if (S_ISDIR(sb.st_mode))
            add_folder(items.v[i], out, e);
        else
            names_add(out, items.v[i], e);
    }
    names_free(&items);
    if (e->code == ERR_OK && out->n == 0)
        err_set(e, ERR_INPUT, "--clusters: \"%s\" names no cluster file", spec);
    return e->code;
}

/* Whether `m` (from --models) is the cluster's own model: equal, or the same custom model
 * named by a model file, which does not give the layer count its profiles give. */
static int own_model(const struct model *cluster_model, const struct model *m)
{
    return model_equal(cluster_model, m) ||
           (model_is_custom(m) && model_is_custom(cluster_model) &&
            m->layer_count == 0 && strcmp(m->name, cluster_model->name) == 0);
}

/* Layer ranges as the cluster file gave them, or the default split? */
static int even_split(const struct cluster *c)
{
    for (int s = 0; s < c->n_stages; s++) {
        int first, last;
        cluster_default_split(&c->model, c->n_layers, c->n_stages, s, &first, &last);
        if (first != c->stages[s].first || last != c->stages[s].last)
            return 0;
    }
    return 1;
}

/* Why cluster `c` cannot be benched with model `m` (into note, ERR_NOFIT), else ERR_OK. */
static int adapt_refusal(const struct cluster *c, const struct model *m,
                         char note[BENCH_NOTE_MAX])
{
    int S = c->n_stages, L = model_layer_count(m);
    if (model_ops_of(m) == NULL) {
        snprintf(note, BENCH_NOTE_MAX, "custom model \"%s\": no profiles for this cluster's "
                 "devices (a custom model is benched on clusters of its own profiles)", m->name);
        return ERR_NOFIT;
    }
    if (S > L) {
        snprintf(note, BENCH_NOTE_MAX, "%d stages, but the model has %d layers", S, L);
        return ERR_NOFIT;
    }
    return ERR_OK;
}

/* out: c's stages, memory, schedule and links with model m; no profiles yet. */
static int adapt_init(const struct cluster *c, const struct model *m, struct cluster *out,
                      struct err *e)
{
    int S = c->n_stages;
    out->stages = calloc((size_t)S, sizeof *out->stages);
    out->profiles = calloc((size_t)S, sizeof *out->profiles);
    if (out->stages == NULL || out->profiles == NULL) {
        cluster_free(out);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    out->schedule = c->schedule;
    out->micro_batches = c->micro_batches;
    out->reserve_bytes = c->reserve_bytes;
    out->link = c->link;
    out->n_stages = S;
    out->model = *m;
    out->n_layers = model_layer_count(m);
    for (int s = 0; s < S; s++)
        out->stages[s] = c->stages[s];
    return ERR_OK;
}

/* Stage s's profile: an earlier stage's on the same device, else one estimated for m. */
static int adapt_profile(const struct cluster *c, const struct model *m,
                         const struct device_table *t, struct cluster *out, int s, struct err *e)
{
    struct cluster_stage *st = &out->stages[s];
    st->profile = -1;
    for (int q = 0; q < s && st->profile < 0; q++)
        if (strcmp(out->stages[q].device, st->device) == 0)
            st->profile = out->stages[q].profile;
    if (st->profile >= 0)
        return ERR_OK;
    const struct device_spec *d = devices_find(t, st->device);
    if (d == NULL)
        return err_set(e, ERR_INPUT,
                       "stages[%d].device: \"%s\" is not in the device table, so its "
                       "profile cannot be estimated",
                       s, c->stages[s].device);
    if (estimate_profile(t, d, m, &out->profiles[out->n_profiles], e))
        return e->code;
    st->profile = out->n_profiles++;
    return ERR_OK;
}

/* Stage s's layers: the default split, or (scale) c's boundary at the same fraction of the
 * model, every stage keeping a layer. */
static void adapt_layers(const struct cluster *c, struct cluster *out, int s, int scale)
{
    int S = out->n_stages, L = out->n_layers;
    struct cluster_stage *st = &out->stages[s];
    if (!scale) {
        cluster_default_split(&out->model, L, S, s, &st->first, &st->last);
        return;
    }
    long first = s == 0 ? 0 : lround((double)c->stages[s].first * L / c->n_layers);
    long lo = s == 0 ? 0 : out->stages[s - 1].first + 1, hi = L - (S - s);
    st->first = (int)(first < lo ? lo : first > hi ? hi : first);
    if (s > 0)
        out->stages[s - 1].last = st->first - 1;
    st->last = L - 1;
}

int bench_cluster_for_model(const struct cluster *c, const struct model *m,
                            const struct device_table *t, struct cluster *out,
                            char note[BENCH_NOTE_MAX], struct err *e)
{
    memset(out, 0, sizeof *out);
    note[0] = '\0';
    int rc = adapt_refusal(c, m, note);
    if (rc)
        return rc;
    if (adapt_init(c, m, out, e))
        return e->code;
    int scale = !even_split(c);
    for (int s = 0; s < out->n_stages; s++) {
        if (adapt_profile(c, m, t, out, s, e)) {
            cluster_free(out);
            return e->code;
        }
        adapt_layers(c, out, s, scale);
    }
    if (scale && c->n_layers != out->n_layers)
        snprintf(note, BENCH_NOTE_MAX,
                 "the cluster's layer ranges for %d layers scaled to %d at the same boundaries",
                 c->n_layers, out->n_layers);
    return ERR_OK;
}

static void result_free(struct bench_result *r)
{
    free(r->memory_bytes);
    free(r->recompute_ms);
    free(r->devices);
    free(r->limit_bytes);
    memset(r, 0, sizeof *r);
}

static void case_free(struct bench_case *k)
{
    free(k->devices);
    free(k->limit_bytes);
    free(k->before_bytes);
    for (int i = 0; i < BENCH_METHODS; i++)
        result_free(&k->method[i]);
    memset(k, 0, sizeof *k);
}

/* Plans the case with one method and simulates the plan; *plan is kept when asked for. */
static int run_method(const struct cluster *c, int method, const struct device_table *t,
                      struct bench_result *r, struct plan *keep, struct err *e)
{
    struct plan_options o;
    struct plan p;
    struct sim_result sim;
    plan_options_default(&o);
    o.min_gain = 0; /* bench.h: each method's fastest plan */
    if (plan_method_parse(bench_method_names[method], &o, e))
        return e->code;
    double t0 = clock_now_ms();
    int rc = planner_make(c, &o, &p, e);
    r->plan_ms = clock_now_ms() - t0;
    if (rc == ERR_NOFIT) {
        err_clear(e);
        r->fits = 0;
        return ERR_OK;
    }
    if (rc)
        return rc;
    if (sim_plan(&p, &sim, e)) {
        plan_free(&p);
        return e->code;
    }
    r->fits = 1;
    r->iteration_ms = sim.iteration_ms;
    r->bubble_fraction = sim.bubble_fraction;
    bench_older_fill(&p, &sim, t, r);
    sim_result_free(&sim);
    r->memory_bytes = malloc((size_t)p.n_stages * sizeof *r->memory_bytes);
    r->recompute_ms = malloc((size_t)p.n_stages * sizeof *r->recompute_ms);
    r->devices = malloc((size_t)p.n_stages * sizeof *r->devices);
    r->limit_bytes = malloc((size_t)p.n_stages * sizeof *r->limit_bytes);
    if (r->memory_bytes == NULL || r->recompute_ms == NULL || r->devices == NULL ||
        r->limit_bytes == NULL) {
        plan_free(&p);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    for (int s = 0; s < p.n_stages; s++) {
        r->memory_bytes[s] = p.stages[s].memory_bytes;
        r->recompute_ms[s] = p.stages[s].recompute_ms;
        r->limit_bytes[s] = p.stages[s].memory_limit_bytes;
        snprintf(r->devices[s], sizeof r->devices[s], "%s", p.stages[s].device);
    }
    if (keep != NULL)
        *keep = p;
    else
        plan_free(&p);
    return ERR_OK;
}

/* Fills the case's per-stage facts and runs every method on cluster `c`. */
static int run_case(const struct cluster *c, const struct device_table *t, struct bench_case *k,
                    struct err *e)
{
    int S = c->n_stages;
    k->runnable = 1;
    k->n_stages = S;
    k->micro_batches = c->micro_batches;
    k->schedule = c->schedule;
    k->n_layers = c->n_layers;
    k->devices = calloc((size_t)S, sizeof *k->devices);
    k->limit_bytes = calloc((size_t)S, sizeof *k->limit_bytes);
    k->before_bytes = calloc((size_t)S, sizeof *k->before_bytes);
    if (k->devices == NULL || k->limit_bytes == NULL || k->before_bytes == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int s = 0; s < S; s++) {
        const struct cluster_stage *st = &c->stages[s];
        struct stage_cost cost;
        snprintf(k->devices[s], sizeof k->devices[s], "%s", st->device);
        k->limit_bytes[s] = st->memory_bytes;
        cost_stage(cluster_stage_profile(c, s)->layers + st->first, st->last - st->first + 1,
                   NULL, schedule_in_flight(c->schedule, S, s, c->micro_batches),
                   c->reserve_bytes, &cost);
        k->before_bytes[s] = cost.memory_bytes;
    }
    for (int i = 0; i < BENCH_METHODS; i++)
        if (run_method(c, i, t, &k->method[i], NULL, e))
            return e->code;
    return ERR_OK;
}

static void print_progress(FILE *f, int done, int total, const struct bench_case *k)
{
    if (f == NULL)
        return;
    fprintf(f, "bench [%2d/%d] %s x %s:", done, total, k->cluster, k->model);
    if (!k->runnable) {
        fprintf(f, " cannot run (%s)\n", k->note);
        return;
    }
    for (int i = 0; i < BENCH_METHODS; i++) {
        const struct bench_result *r = &k->method[i];
        if (r->fits)
            fprintf(f, "%s %s %.1f ms", i ? "," : "", bench_method_names[i], r->iteration_ms);
        else
            fprintf(f, "%s %s does not fit", i ? "," : "", bench_method_names[i]);
    }
    fprintf(f, "\n");
    fflush(f);
}

struct loaded_cluster {
    char name[BENCH_NAME_MAX];
    struct cluster c;
};

/* The message a step left in e, after `context: `, with status rc. */
static int err_prefix(struct err *e, int rc, const char *context)
{
    char msg[ERR_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", e->msg);
    return err_set(e, rc, "%s: %s", context, msg);
}

/* The case of cluster `cl` with model `m` (named `name`): on the cluster's own profiles when
 * they describe m, else on profiles estimated here. */
static int run_one(const struct loaded_cluster *cl, const struct model *m, const char *name,
                   const struct device_table *t, struct bench_case *k, struct err *e)
{
    snprintf(k->cluster, sizeof k->cluster, "%s", cl->name);
    snprintf(k->model, sizeof k->model, "%s", name);
    k->m = *m;
    k->n_older = bench_older_count(&cl->c, t);
    int rc;
    if (own_model(&cl->c.model, m)) {
        rc = run_case(&cl->c, t, k, e);
    } else {
        struct cluster adapted;
        rc = bench_cluster_for_model(&cl->c, m, t, &adapted, k->note, e);
        if (rc == ERR_NOFIT) {
            rc = ERR_OK;
            k->n_stages = cl->c.n_stages;
            k->micro_batches = cl->c.micro_batches;
            k->schedule = cl->c.schedule;
            k->n_layers = model_layer_count(m);
        } else if (rc == ERR_OK) {
            rc = run_case(&adapted, t, k, e);
            cluster_free(&adapted);
        }
        k->estimated = 1;
    }
    if (rc) {
        char context[3 * BENCH_NAME_MAX]; /* both names, the second with -fp16 */
        snprintf(context, sizeof context, "%s with %s", cl->name, name);
        err_prefix(e, rc, context);
    }
    return rc;
}

/* Whether the case of cluster `cl` and the j-th of the listed models gets an fp16 twin, *twin. */
static int wants_twin(const struct bench_options *o, const struct loaded_cluster *cl,
                      const struct device_table *t, const struct model *listed, int n, int j,
                      struct model *twin)
{
    return o->fp16 && bench_older_count(&cl->c, t) > 0 &&
           bench_fp16_twin(&listed[j], listed, n, twin);
}

static int compare_clusters(const void *a, const void *b)
{
    const struct loaded_cluster *x = a, *y = b;
    if (x->c.n_stages != y->c.n_stages)
        return x->c.n_stages - y->c.n_stages;
    return strcmp(x->name, y->name);
}

/* Loads the clusters, leaving out CPU ones, in order of stage count. */
static int load_clusters(const char *spec, FILE *progress, struct loaded_cluster **out, int *n,
                         struct err *e)
{
    struct names files = {0};
    *out = NULL;
    *n = 0;
    if (list_clusters(spec, &files, e)) {
        names_free(&files);
        return e->code;
    }
    struct loaded_cluster *l = calloc((size_t)files.n, sizeof *l);
    if (l == NULL) {
        names_free(&files);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    for (int i = 0; i < files.n; i++) {
        struct loaded_cluster *x = &l[*n];
        if (cluster_load(files.v[i], &x->c, e))
            break;
        base_name(files.v[i], x->name);
        int cpu = 0;
        for (int s = 0; s < x->c.n_stages; s++)
            cpu = cpu || strcmp(cluster_stage_profile(&x->c, s)->device.kind, "cpu") == 0;
        if (cpu) {
            if (progress)
                fprintf(progress, "bench: leaving out %s (CPU stages)\n", x->name);
            cluster_free(&x->c);
            continue;
        }
        (*n)++;
    }
    names_free(&files);
    if (e->code == ERR_OK && *n == 0)
        err_set(e, ERR_INPUT, "--clusters: \"%s\" holds no GPU cluster", spec);
    if (e->code) {
        for (int i = 0; i < *n; i++)
            cluster_free(&l[i].c);
        free(l);
        *n = 0;
        return e->code;
    }
    qsort(l, (size_t)*n, sizeof *l, compare_clusters);
    *out = l;
    return ERR_OK;
}

/* The case's fastest method that fits (ties: the first in bench_method_names). */
static int fastest_method(const struct bench_case *k)
{
    int best = BENCH_OPTIMAL;
    for (int m = 0; m < BENCH_METHODS; m++)
        if (k->method[m].fits && (!k->method[best].fits ||
                                  k->method[m].iteration_ms < k->method[best].iteration_ms))
            best = m;
    return best;
}

/* The detail case: the named cluster (default v100-a100-8, else the first) with its own
 * model if benched, else the first model whose optimal plan fits; -1 if none fits. */
static int pick_detail(const struct bench_case *cases, int n, const char *cluster)
{
    int first = -1;
    for (int i = 0; i < n; i++) {
        const struct bench_case *k = &cases[i];
        if (strcmp(k->cluster, cluster) != 0 || !k->runnable || !k->method[BENCH_OPTIMAL].fits)
            continue;
        if (!k->estimated)
            return i;
        if (first < 0)
            first = i;
    }
    return first;
}

static int find_cluster(const struct loaded_cluster *cl, int n, const char *want, int *ci,
                        struct err *e)
{
    *ci = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(cl[i].name, want ? want : "v100-a100-8") == 0) {
            *ci = i;
            return ERR_OK;
        }
    if (want == NULL)
        return ERR_OK;
    err_set(e, ERR_INPUT, "--detail: no cluster named \"%s\" among:", want);
    for (int i = 0; i < n; i++)
        err_append(e, "  %s", cl[i].name);
    return e->code;
}

/* What a run holds, released by bench_state_free. */
struct bench_state {
    struct device_table table;
    struct loaded_cluster *cl;
    int n_cl, ci;                        /* ci: the detail cluster */
    struct names models;                 /* --models, as given */
    struct model *mv;                    /* each of them loaded */
    char (*model_names)[BENCH_NAME_MAX]; /* and named in the tables (the file's base name) */
    struct bench_case *cases;
    int n_cases, detail;                 /* detail: the case plotted in full, -1: none */
    struct plan gantt;                   /* its fastest plan, when have_gantt */
    int have_gantt;
};

static void bench_state_free(struct bench_state *b)
{
    if (b->have_gantt)
        plan_free(&b->gantt);
    for (int i = 0; i < b->n_cases; i++)
        case_free(&b->cases[i]);
    free(b->cases);
    free(b->mv);
    free(b->model_names);
    names_free(&b->models);
    for (int i = 0; i < b->n_cl; i++)
        cluster_free(&b->cl[i].c);
    free(b->cl);
    devices_free(&b->table);
}

/* Each model --models names, loaded. */
static int load_models(const char *spec, struct bench_state *b, struct err *e)
{
    if (names_split(spec, &b->models, e))
        return e->code;
    if (b->models.n == 0)
        return err_set(e, ERR_INPUT, "--models: \"%s\" names no model", spec);
    b->mv = calloc((size_t)b->models.n, sizeof *b->mv);
    b->model_names = calloc((size_t)b->models.n, sizeof *b->model_names);
    if (b->mv == NULL || b->model_names == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int j = 0; j < b->models.n; j++) {
        char path[CLUSTER_PATH_MAX], context[ERR_MSG_MAX];
        if (model_find(b->models.v[j], path, sizeof path, e) ||
            model_load(path, &b->mv[j], e)) {
            snprintf(context, sizeof context, "--models: %s", b->models.v[j]);
            return err_prefix(e, e->code, context);
        }
        base_name(path, b->model_names[j]);
    }
    return ERR_OK;
}

/* The next case, cluster i with model m named `name`, run and its progress line printed. */
static int add_case(struct bench_state *b, int i, const struct model *m, const char *name,
                    int fp16_twin, FILE *progress, int total, struct err *e)
{
    struct bench_case *k = &b->cases[b->n_cases++];
    k->fp16_twin = fp16_twin;
    if (run_one(&b->cl[i], m, name, &b->table, k, e))
        return e->code;
    print_progress(progress, b->n_cases, total, k);
    return ERR_OK;
}

/* Every cluster with every model, each fp16 twin after its bf16 case. */
static int run_cases(const struct bench_options *o, FILE *progress, struct bench_state *b,
                     struct err *e)
{
    int total = 0;
    struct model twin;
    /* room for every fp16 twin */
    b->cases = calloc((size_t)b->n_cl * b->models.n * 2, sizeof *b->cases);
    if (b->cases == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int i = 0; i < b->n_cl; i++)
        for (int j = 0; j < b->models.n; j++)
            total += 1 + wants_twin(o, &b->cl[i], &b->table, b->mv, b->models.n, j, &twin);
    for (int i = 0; i < b->n_cl; i++)
        for (int j = 0; j < b->models.n; j++) {
            char name16[BENCH_NAME_MAX + 8];
            if (add_case(b, i, &b->mv[j], b->model_names[j], 0, progress, total, e))
                return e->code;
            if (!wants_twin(o, &b->cl[i], &b->table, b->mv, b->models.n, j, &twin))
                continue;
            snprintf(name16, sizeof name16, "%s-fp16", b->model_names[j]);
            if (add_case(b, i, &twin, name16, 1, progress, total, e))
                return e->code;
        }
    return ERR_OK;
}

/* The detail case, and its fastest method planned again to keep the plan for its Gantt
 * chart (the cases keep no plans). */
static int plan_detail(struct bench_state *b, struct err *e)
{
    b->detail = pick_detail(b->cases, b->n_cases, b->cl[b->ci].name);
    if (b->detail < 0)
        return ERR_OK;
    const struct model *m = &b->cases[b->detail].m;
    struct bench_result again = {0};
    struct cluster adapted;
    char note[BENCH_NOTE_MAX];
    const struct cluster *c = &b->cl[b->ci].c;
    if (!own_model(&c->model, m)) {
        int rc = bench_cluster_for_model(c, m, &b->table, &adapted, note, e);
        if (rc)
            return rc;
        c = &adapted;
    }
    int rc = run_method(c, fastest_method(&b->cases[b->detail]), &b->table, &again, &b->gantt,
                        e);
    if (c == &adapted)
        cluster_free(&adapted);
    b->have_gantt = again.fits;
    result_free(&again);
    return rc;
}

/* The run's steps in order, each leaving its message in e. */
static int bench_steps(const struct bench_options *o, FILE *progress, FILE *out,
                       struct bench_state *b, struct err *e)
{
    if (fileio_make_dirs(o->out_dir, e) || devices_load(o->devices_file, &b->table, e) ||
        load_clusters(o->clusters, progress, &b->cl, &b->n_cl, e) ||
        find_cluster(b->cl, b->n_cl, o->detail, &b->ci, e) || load_models(o->models, b, e) ||
        run_cases(o, progress, b, e) || plan_detail(b, e) ||
        bench_write_csv(o->out_dir, b->cases, b->n_cases, e) ||
        bench_write_markdown(o->out_dir, out, b->cases, b->n_cases, b->detail, e))
        return e->code;
    return bench_write_plots(o->out_dir, b->cases, b->n_cases, b->detail,
                             b->have_gantt ? &b->gantt : NULL, o->plots, e);
}

int bench_run(const struct bench_options *o, FILE *progress, FILE *out, struct err *e)
{
    if (o->detail != NULL && strchr(o->detail, '/') != NULL)
        return err_set(e, ERR_INPUT, "--detail: \"%s\": give a cluster name, not a path",
                       o->detail);
    struct bench_state b = {.detail = -1};
    bench_steps(o, progress, out, &b, e);
    bench_state_free(&b);
    return e->code;
}
