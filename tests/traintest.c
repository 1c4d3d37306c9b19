#include "traintest.h"

#include <CUnit/CUnit.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "clock.h"
#include "cost.h"
#include "plan.h"

void train_sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

void train_job_start(struct train_job *j, const char *name, int np, int limit_s, const char *env,
                     const char *args)
{
    char cmd[8192];
    snprintf(j->out, sizeof j->out, "%s.out", test_path(name));
    snprintf(j->err, sizeof j->err, "%s.err", test_path(name));
    snprintf(j->status, sizeof j->status, "%s.status", test_path(name));
    j->code = -1;
    j->text = NULL;
    snprintf(cmd, sizeof cmd,
             "(timeout -k 5 %d mpirun --allow-run-as-root --oversubscribe -np %d %s '%s' train "
             "%s > '%s' 2> '%s'; echo $? > '%s') &",
             limit_s, np, env, BALLAST_EXE, args, j->out, j->err, j->status);
    CU_ASSERT_FATAL(system(cmd) == 0);
}

int train_job_saw(const struct train_job *j, const char *text, double within_s)
{
    for (double until = clock_now_s() + within_s; clock_now_s() < until; train_sleep_s(0.05)) {
        char *s = test_read(j->out);
        int seen = s != NULL && strstr(s, text) != NULL;
        free(s);
        if (seen)
            return 1;
    }
    return 0;
}

void train_job_wait(struct train_job *j, int limit_s)
{
    for (double until = clock_now_s() + limit_s + 10; j->code < 0 && clock_now_s() < until;) {
        char *s = test_read(j->status);
        if (s != NULL && strchr(s, '\n') != NULL)
            j->code = atoi(s);
        free(s);
        if (j->code < 0)
            train_sleep_s(0.05);
    }
    j->text = test_read(j->err);
}

void train_job_free(struct train_job *j)
{
    free(j->text);
    j->text = NULL;
}

/* The file's contents with NULs as spaces (a command line, an environment: NULs kept as
 * separators when `keep`), or "" (cap bytes at out). */
static size_t read_proc(const char *path, char *out, size_t cap, int keep)
{
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    if (f)
        fclose(f);
    for (size_t i = 0; !keep && i < n; i++)
        out[i] = out[i] ? out[i] : ' ';
    out[n] = '\0';
    return n;
}

int train_find_rank(int rank, const char *mark)
{
    DIR *d = opendir("/proc");
    struct dirent *ent;
    int found = -1;
    char want[64];
    snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
    while (found < 0 && d != NULL && (ent = readdir(d)) != NULL) {
        static char buf[65536];
        char path[300];
        if (ent->d_name[0] < '0' || ent->d_name[0] > '9')
            continue;
        snprintf(path, sizeof path, "/proc/%s/cmdline", ent->d_name);
        read_proc(path, buf, sizeof buf, 0);
        if (strstr(buf, mark) == NULL || strstr(buf, "mpirun") != NULL ||
            strstr(buf, " train ") == NULL)
            continue;
        snprintf(path, sizeof path, "/proc/%s/environ", ent->d_name);
        size_t n = read_proc(path, buf, sizeof buf, 1);
        for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
            if (strcmp(buf + i, want) == 0)
                found = atoi(ent->d_name);
    }
    if (d != NULL)
        closedir(d);
    return found;
}

const char *train_plan_cluster(const char *cluster, const char *flags, const char *name)
{
    static char path[8][1024];
    static int next;
    char *out = path[next++ % 8];
    snprintf(out, 1024, "%s", test_path(name));
    char args[4096], *o = NULL, *err = NULL;
    snprintf(args, sizeof args, "plan --cluster '%s' %s --quiet -o '%s'", cluster, flags, out);
    int rc = test_run(args, &o, &err);
    if (rc)
        fprintf(stderr, "\nplan %s: %s\n", name, err ? err : "");
    CU_ASSERT_EQUAL(rc, 0);
    free(o);
    free(err);
    return out;
}

struct train_run train_exec(int np, int limit_s, const char *args)
{
    struct train_run r = {0};
    char cmd[8192], opath[1024], epath[1024];
    snprintf(opath, sizeof opath, "%s", test_path("train.stdout"));
    snprintf(epath, sizeof epath, "%s", test_path("train.stderr"));
    snprintf(cmd, sizeof cmd,
             "timeout -k 5 %d mpirun --allow-run-as-root --oversubscribe -np %d '%s' train %s "
             "> '%s' 2> '%s'",
             limit_s, np, BALLAST_EXE, args, opath, epath);
    double t0 = clock_now_s();
    int status = system(cmd);
    r.seconds = clock_now_s() - t0;
    r.status = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = test_read(opath);
    r.err = test_read(epath);
    return r;
}

void train_run_free(struct train_run *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

static double number(const cJSON *o, const char *key)
{
    const cJSON *it = cJSON_GetObjectItem(o, key);
    return cJSON_IsNumber(it) ? it->valuedouble : -1;
}

cJSON *train_json_read(const char *file)
{
    char *text = test_read(file);
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    free(text);
    return o;
}

int train_metrics_read(const char *file, struct train_metrics *m)
{
    cJSON *o = train_json_read(file);
    memset(m, 0, sizeof *m);
    if (o == NULL)
        return -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "steps"))
        if (m->n_steps < TRAIN_MAX_STEPS) {
            const cJSON *scale = cJSON_GetObjectItem(it, "loss_scale");
            m->loss_scale[m->n_steps] = cJSON_IsNumber(scale) ? scale->valuedouble : 0;
            m->skipped[m->n_steps] = cJSON_IsTrue(cJSON_GetObjectItem(it, "skipped"));
            m->loss[m->n_steps++] = number(it, "loss");
        }
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "stages"))
        if (m->n_stages < TRAIN_MAX_STAGES) {
            m->peak[m->n_stages] = (long long)number(it, "peak_bytes");
            m->planned[m->n_stages] = (long long)number(it, "planned_bytes");
            m->recompute_ms[m->n_stages] = number(it, "recompute_ms");
            m->n_stages++;
        }
    const cJSON *tp = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "transport"), "kind");
    snprintf(m->transport, sizeof m->transport, "%s", cJSON_IsString(tp) ? tp->valuestring : "");
    cJSON_Delete(o);
    return 0;
}

int train_run_ok(int np, int limit_s, const char *plan, const char *extra, const char *metrics_name,
             struct train_metrics *m)
{
    char args[4096], mpath[1024];
    snprintf(mpath, sizeof mpath, "%s", test_path(metrics_name));
    snprintf(args, sizeof args, "--plan '%s' --metrics '%s' --quiet %s", plan, mpath, extra);
    struct train_run r = train_exec(np, limit_s, args);
    CU_ASSERT_EQUAL(r.status, 0);
    if (r.status != 0)
        fprintf(stderr, "\ntrain -np %d %s: status %d\n%s\n", np, args, r.status,
                r.err ? r.err : "");
    int status = r.status;
    train_run_free(&r);
    if (status != 0 || train_metrics_read(mpath, m) != 0)
        return -1;
    CU_ASSERT_EQUAL(m->n_stages, np);
    for (int s = 0; s < m->n_stages; s++) {
        int ok = m->planned[s] > 0 &&
                 llabs(m->peak[s] - m->planned[s]) <= 0.02 * (double)m->planned[s];
        if (!ok)
            fprintf(stderr, "\n%s stage %d: peak %lld bytes, planned %lld\n", plan, s,
                    m->peak[s], m->planned[s]);
        CU_ASSERT(ok);
    }
    return 0;
}

/* Plan tmpdir/NAME: a copy of `from` whose stage `s` was planned from a profile that
 * under-states memory (every byte count zero, as a profile of another implementation might):
 * the plan is consistent and fits its lowered limit `limit` on paper, and only the runtime,
 * which allocates by its own size functions, finds that the stage does not. Its path. */
const char *train_plan_understated(const char *from, int s, long long limit, const char *name)
{
    char *text = test_read(from);
    cJSON *o = cJSON_Parse(text);
    free(text);
    cJSON *st = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "stages"), s), *c;
    static const char *const bytes[] = {"state_bytes", "act_bytes",   "ckpt_bytes",
                                        "workspace_bytes", "param_bytes", "grad_bytes",
                                        "optimizer_bytes"};
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(st, "layer_costs"))
    {
        for (int k = 0; k < 7; k++)
            cJSON_ReplaceItemInObject(c, bytes[k], cJSON_CreateNumber(0));
        cJSON_DeleteItemFromObject(c, "recompute_options"); /* none in that implementation */
    }
    cJSON *reserve = cJSON_GetObjectItem(o, "reserve_bytes");
    cJSON_ReplaceItemInObject(st, "memory_bytes",
                              cJSON_CreateNumber(reserve ? reserve->valuedouble : 0));
    cJSON_ReplaceItemInObject(st, "memory_limit_bytes", cJSON_CreateNumber((double)limit));
    cJSON_ReplaceItemInObject(st, "capacity_bytes", cJSON_CreateNumber((double)limit));
    char *out = cJSON_Print(o);
    const char *path = test_write(name, out);
    cJSON_free(out);
    cJSON_Delete(o);
    return path;
}

/* A plan rewritten by a test: `from` loaded (else a message naming `to`, and nonzero) ... */
static int rewrite_open(const char *from, const char *to, struct plan *p)
{
    struct err e;
    err_clear(&e);
    if (plan_load(from, p, &e)) {
        fprintf(stderr, "plan %s: %s\n", to, e.msg);
        return 1;
    }
    return 0;
}

/* ... and written to `to`, then freed. */
static void rewrite_close(const char *to, struct plan *p)
{
    struct err e;
    err_clear(&e);
    if (plan_write(to, p, &e))
        fprintf(stderr, "plan %s: %s\n", to, e.msg);
    plan_free(p);
}

void train_plan_with_choices(const char *from, const char *to, const char *const *choice)
{
    struct plan p;
    if (rewrite_open(from, to, &p))
        return;
    for (int s = 0; s < p.n_stages; s++) {
        struct plan_stage *st = &p.stages[s];
        for (int l = 0; l < plan_stage_layer_count(st); l++) {
            const char *want = choice[st->first + l];
            st->actions[l].choice = COST_KEEP;
            if (want != NULL && strcmp(want, "full") == 0)
                st->actions[l].choice = COST_FULL;
            for (int k = 0; want != NULL && k < st->layers[l].n_options; k++)
                if (strcmp(st->layers[l].options[k].name, want) == 0)
                    st->actions[l].choice = (unsigned char)(COST_OPTION + k);
            if (want != NULL && st->actions[l].choice == COST_KEEP)
                fprintf(stderr, "plan %s: layer %d has no option %s\n", to, st->first + l,
                        want);
        }
        plan_stage_recost(&p, st);
    }
    rewrite_close(to, &p);
}

void train_plan_offload(const char *from, const char *to)
{
    struct plan p;
    if (rewrite_open(from, to, &p))
        return;
    for (int s = 0; s < p.n_stages; s++) {
        struct plan_stage *st = &p.stages[s];
        for (int l = 0; l < plan_stage_layer_count(st); l++)
            if (cost_whole_offload(&p.model, l, st->first + l)) {
                st->actions[l].place = COST_PLACE_HOST;
                st->actions[l].prefetch_ahead = 1;
            }
        st->host_link = (struct link){1, 200, 10};
        plan_stage_recost(&p, st);
        st->host_limit_bytes = st->host_memory_bytes;
    }
    rewrite_close(to, &p);
}

int train_same_scaling(const struct train_metrics *a, const struct train_metrics *b)
{
    if (a->n_steps != b->n_steps || a->n_steps == 0)
        return 0;
    for (int i = 0; i < a->n_steps; i++)
        if (a->loss_scale[i] != b->loss_scale[i] || a->skipped[i] != b->skipped[i]) {
            fprintf(stderr, "\nstep %d: loss scale %g%s against %g%s\n", i + 1,
                    a->loss_scale[i], a->skipped[i] ? " (skipped)" : "", b->loss_scale[i],
                    b->skipped[i] ? " (skipped)" : "");
            return 0;
        }
    return 1;
}

int train_arena_lie(cJSON *arena, int layer)
{
    cJSON *objs = cJSON_GetObjectItem(arena, "objects"), *a = NULL, *b = NULL;
    for (cJSON *it = objs != NULL ? objs->child : NULL; it != NULL; it = it->next) {
        const char *kind = cJSON_GetObjectItem(it, "kind")->valuestring;
        int micro = cJSON_GetObjectItem(it, "micro")->valueint;
        if (strcmp(kind, "kept") != 0 || cJSON_GetObjectItem(it, "layer")->valueint != layer)
            continue;
        if (micro == 0)
            a = it;
        else if (micro == 1)
            b = it;
    }
    if (a == NULL || b == NULL)
        return -1;
    double after = cJSON_GetObjectItem(a, "last")->valuedouble + 1;
    cJSON_ReplaceItemInObject(b, "offset",
                              cJSON_CreateNumber(cJSON_GetObjectItem(a, "offset")->valuedouble));
    cJSON_ReplaceItemInObject(b, "first", cJSON_CreateNumber(after));
    cJSON_ReplaceItemInObject(b, "last", cJSON_CreateNumber(after));
    /* the lower bound of the objects as now stated, counted tick by tick */
    int last = 0;
    for (cJSON *it = objs->child; it != NULL; it = it->next)
        last = cJSON_GetObjectItem(it, "last")->valueint > last
                   ? cJSON_GetObjectItem(it, "last")->valueint
                   : last;
    double most = 0;
    for (int t = 0; t <= last; t++) {
        double sum = 0;
        for (cJSON *it = objs->child; it != NULL; it = it->next)
            if (cJSON_GetObjectItem(it, "first")->valueint <= t &&
                t <= cJSON_GetObjectItem(it, "last")->valueint)
                sum += cJSON_GetObjectItem(it, "bytes")->valuedouble;
        most = sum > most ? sum : most;
    }
    cJSON_ReplaceItemInObject(arena, "lower_bound_bytes", cJSON_CreateNumber(most));
    return 0;
}

int train_same_losses(const struct train_metrics *a, const struct train_metrics *b)
{
    if (a->n_steps != b->n_steps || a->n_steps == 0)
        return 0;
    for (int i = 0; i < a->n_steps; i++)
        if (a->loss[i] != b->loss[i]) {
            fprintf(stderr, "\nstep %d: loss %.17g against %.17g\n", i + 1, a->loss[i],
                    b->loss[i]);
            return 0;
        }
    return 1;
}

int train_files_equal(const char *a, const char *b)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
    return system(cmd) == 0;
}

void train_plan_gpt(const char *name, int vocab, const char *dtype, int n_stages,
                    const char *method, char *plan, size_t size)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"format\": \"ballast-model/1\", \"kind\": \"gpt\", \"n_layer\": 2, "
             "\"n_embd\": 32, \"n_head\": 2, \"seq_len\": 16, \"vocab_size\": %d, "
             "\"micro_batch\": 2, \"dtype\": \"%s\"}",
             vocab, dtype);
    train_plan_model(name, text, n_stages, method, plan, size);
}

void train_plan_model(const char *name, const char *model_text, int n_stages,
                      const char *method, char *plan, size_t size)
{
    char text[1024], file[256], args[4096];
    snprintf(file, sizeof file, "%s-model.json", name);
    char model[1024], prof[1024];
    snprintf(model, sizeof model, "%s", test_write(file, model_text));
    snprintf(file, sizeof file, "%s-prof.json", name);
    snprintf(prof, sizeof prof, "%s", test_path(file));
    snprintf(args, sizeof args, "profile --model '%s' --estimate --device cpu -o '%s'", model,
             prof);
    if (test_run(args, NULL, NULL) != 0)
        fprintf(stderr, "profile of %s failed\n", name);
    int len = snprintf(text, sizeof text,
                       "{\"format\": \"ballast-cluster/1\", \"schedule\": \"1f1b\", "
                       "\"micro_batches\": 2, \"stages\": [");
    for (int s = 0; s < n_stages; s++)
        len += snprintf(text + len, sizeof text - (size_t)len,
                        "%s{\"device\": \"cpu\", \"memory_bytes\": 1073741824, "
                        "\"profile\": \"%s\"}",
                        s ? ", " : "", prof);
    snprintf(text + len, sizeof text - (size_t)len, "]}");
    snprintf(file, sizeof file, "%s-cluster.json", name);
    char cluster[1024];
    snprintf(cluster, sizeof cluster, "%s", test_write(file, text));
    snprintf(file, sizeof file, "%s-plan.json", name);
    snprintf(plan, size, "%s", test_path(file));
    snprintf(args, sizeof args, "plan --cluster '%s' --method %s --quiet -o '%s'", cluster,
             method, plan);
    if (test_run(args, NULL, NULL) != 0)
        fprintf(stderr, "plan %s failed\n", name);
}

/* Plan `to`: plan `from` with the optimizer on the host in the stages of `mask` (bit s),
 * each with host_limit_bytes `limit` (0: its own host_memory_bytes), and every number the
 * cost model's. */
void train_plan_host_optimizer(const char *from, const char *to, unsigned mask, int64_t limit)
{
    train_plan_host_optimizer_from(from, to, mask, 0, limit);
}

void train_plan_host_optimizer_from(const char *from, const char *to, unsigned mask,
                                    int host_from, int64_t limit)
{
    struct plan p;
    if (rewrite_open(from, to, &p))
        return;
    for (int s = 0; s < p.n_stages; s++) {
        struct plan_stage *st = &p.stages[s];
        if (!(mask >> s & 1))
            continue;
        if (host_from >= plan_stage_layer_count(st))
            continue; /* no layer left to host: the stage keeps its optimizer */
        st->optimizer = COST_PLACE_HOST;
        st->optimizer_from = host_from;
        if (!st->host_link.present) /* PCIe 4.0 x16's order; the CPU copies at memcpy speed */
            st->host_link = (struct link){1, 200, 10};
        plan_stage_recost(&p, st);
        st->host_limit_bytes = limit > 0 ? limit : st->host_memory_bytes;
    }
    rewrite_close(to, &p);
}
