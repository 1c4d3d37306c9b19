/* `ballast train --share`: the jobs of a share file (share.h) on the same ranks, in turn,
 * `slice` steps at a time, until each has run `steps` (docs/runtime.md, "Jobs time-sharing the devices").
 *
 * Memory, per rank (its device of the share file): one allocation of the device's regions,
 * each job's persistent region at its offset and the temporary region after them. A job's
 * stage keeps its weights, gradients and optimizer state in its persistent region for the
 * whole run, and carves its activations, transient and workspace from the temporary region
 * (stage_config): every job carves it its own way, and since a step ends with nothing live
 * there (every receipt matched, every send waited for), the next job's carving is all a
 * switch needs. With --switch full (the baseline) the device holds one job at a time: the
 * largest persistent region and the temporary region; a switch downloads the running job's
 * persistent region to a host copy and uploads the next job's.
 *
 * Device peak: the persistent regions (always live) plus the largest temporary any job had
 * live, each job's from its executor's accounting (exec.h) less its persistent bytes; with
 * --switch full, the largest job's. A switch starts at a barrier after the last slice (every
 * rank done with it) and is timed until the next job is in place on this rank; metrics report
 * the slowest rank's time and the bytes summed over ranks.
 *
 * --init and --save-weights work per job: TRAIN_JOB_MARK in the name becomes the job's name
 * (without it every job starts from the same file; saving several jobs needs it), and
 * ST_STAGE_MARK, as for one plan, the stage's index. --check-arena checks each job's arena
 * where its plan lays one out. The paths are checked on every rank before any work. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_device.h"
#include "fileio.h"
#include "heartbeat.h"
#include "jsonio.h"
#include "model_ops.h"
#include "mpicheck.h"
#include "report.h"
#include "safetensors.h"
#include "share.h"
#include "stage.h"
#include "train.h"
#include "train_weights.h"

struct share_job_run {
    struct data_source data;
    int data_loaded;
    struct layout_place *place; /* this rank's layers */
    struct stage_runner stage;
    int stage_ready;
    char *host_state; /* --switch full: the persistent region while the job is switched out */
    int64_t done;     /* steps run */
    struct stage_times sum;
    int counted;
    double *loss, *ms; /* per step (every rank has them; rank 0 writes them) */
    float *scale;      /* per step, an fp16 job's loss scale (stage_runner.last) */
    unsigned char *skipped; /* per step, whether an fp16 job skipped it */
};

struct share_switch {
    int from, to;
    double ms;
    int64_t persistent_moved, temporary_bytes;
};

struct share_run {
    const struct train_options *o;
    MPI_Comm comm;
    int rank, size;
    struct share sh;
    int loaded;
    struct backend be;
    int on_cuda;
    struct transport tp;
    char *device_mem;
    int64_t device_bytes;
    struct share_job_run *jobs;
    struct share_switch *switches;
    int n_switches, cap_switches;
    int resident; /* --switch full: the job whose state is on the device; -1 none */
    int stopped;  /* a step's verdict ended the run (stage.h), on every rank alike */
};

static void share_fail_now(struct share_run *r, const struct err *e)
{
    fprintf(stderr, "ballast train --share: stage %d: %s\n", r->rank, e->msg);
    fflush(stderr);
    MPI_RELEASE(MPI_Abort(r->comm, ERR_FAIL));
}

/* Every rank's status, the worst to all (mpicheck_agree); *first (may be NULL) the first
 * rank that failed. */
static int share_agree(struct share_run *r, int rc, int *first)
{
    struct err e;
    err_clear(&e);
    int verdict[2] = {rc, rc != ERR_OK ? r->rank : r->size};
    if (mpicheck_agree(r->comm, r->size, verdict, &e))
        share_fail_now(r, &e);
    if (first != NULL)
        *first = verdict[1];
    return verdict[0];
}

/* stage_config.agree_flag (train.c's, over this run's ranks). */
static int share_agree_flag(void *ctx, int mine, int *first, struct err *e)
{
    struct share_run *r = ctx;
    return mpicheck_agree_flag(r->comm, r->rank, r->size, mine, first, e);
}

/* ---- set-up ---- */

/* What every rank checks alike: the share file, the ranks, the options. */
static int check_share(struct share_run *r, struct err *e)
{
    const struct train_options *o = r->o;
    if (share_load(o->share_file, &r->sh, e))
        return e->code;
    r->loaded = 1;
    if (r->sh.n_devices != r->size)
        return err_set(e, ERR_INPUT, "%s: the jobs have %d stages, one MPI rank each, but this "
                       "run has %d ranks (mpirun -np %d)", o->share_file, r->sh.n_devices,
                       r->size, r->sh.n_devices);
    if (strcmp(o->transport, "nccl") == 0)
        return err_set(e, ERR_INPUT, "--transport nccl: time-shared jobs exchange activations "
                       "over MPI (host-staged on GPUs)");
    if (o->save_dir != NULL || o->resume_dir != NULL || o->trace_file != NULL)
        return err_set(e, ERR_INPUT, "--save, --resume and --trace are for one plan, not "
                       "--share");
    if (o->save_weights_file != NULL && r->sh.n_jobs > 1 &&
        strstr(o->save_weights_file, TRAIN_JOB_MARK) == NULL)
        return err_set(e, ERR_INPUT, "--save-weights %s: the %d jobs of %s would write one file: "
                       "put %s in the name (each job's own file, %s the job's name)",
                       o->save_weights_file, r->sh.n_jobs, o->share_file, TRAIN_JOB_MARK,
                       TRAIN_JOB_MARK);
    for (int j = 0; j < r->sh.n_jobs; j++) {
        const struct plan *p = &r->sh.jobs[j].plan;
        if (model_ops_of(&p->model) == NULL)
            return err_set(e, ERR_INPUT, "%s: jobs[%d].plan.model: \"%s\" is a custom model: "
                           "Ballast has no layers to run for it", o->share_file, j,
                           p->model.name);
        for (int s = 0; s < p->n_stages; s++) {
            const struct plan_stage *st = &p->stages[s];
            for (int l = 0; l < plan_stage_layer_count(st); l++) {
                uint32_t regen;
                struct err in;
                if (layout_regen(&p->model, st->first + l, st->actions[l].choice, &st->layers[l],
                                 &regen, &in))
                    return err_set(e, in.code, "%s: jobs[%d].plan: stages[%d]: %s",
                                   o->share_file, j, s, in.msg);
            }
        }
    }
    return ERR_OK;
}

/* `pattern` with TRAIN_JOB_MARK replaced by job j's name (or as is). */
static void job_path(const struct share_run *r, const char *pattern, int j, char *out,
                     size_t size)
{
    const char *at = strstr(pattern, TRAIN_JOB_MARK);
    if (at == NULL)
        snprintf(out, size, "%s", pattern);
    else
        snprintf(out, size, "%.*s%s%s", (int)(at - pattern), pattern, r->sh.jobs[j].name,
                 at + strlen(TRAIN_JOB_MARK));
}

/* This rank's files of every job, before any work: --init's can be read, --save-weights' can
 * be written. */
static int check_paths(const struct share_run *r, struct err *e)
{
    const struct train_options *o = r->o;
    for (int j = 0; j < r->sh.n_jobs; j++) {
        char pattern[FILEIO_PATH_MAX], file[FILEIO_PATH_MAX];
        struct err in;
        int fd;
        int64_t size;
        err_clear(&in);
        job_path(r, o->init_file != NULL ? o->init_file : "", j, pattern, sizeof pattern);
        st_stage_path(pattern, r->rank, file, sizeof file);
        if (o->init_file != NULL && fileio_open_input(file, 0, &fd, &size, &in))
            return err_set(e, in.code, "--init: job %s: %s", r->sh.jobs[j].name, in.msg);
        if (o->init_file != NULL)
            close(fd);
        job_path(r, o->save_weights_file != NULL ? o->save_weights_file : "", j, pattern,
                 sizeof pattern);
        st_stage_path(pattern, r->rank, file, sizeof file);
        if (o->save_weights_file != NULL && fileio_out_check(file, &in))
            return err_set(e, in.code, "--save-weights: job %s: %s", r->sh.jobs[j].name, in.msg);
    }
    return ERR_OK;
}

/* The CPU, or the GPU (local rank mod the node's GPUs) where the job's plans put the stage. */
static int start_share_backend(struct share_run *r, struct err *e)
{
    const char *d = r->o->device;
    const struct plan_stage *st = &r->sh.jobs[0].plan.stages[r->rank];
    r->on_cuda = train_stage_on_cuda(d, st);
    MPI_Comm local;
    int lrank = 0, lsize = 1;
    ERR_TRY(mpicheck_gate(r->comm, "every rank before finding the node's (MPI_Ibarrier)", e));
    MPI_CHECK(MPI_Comm_split_type(r->comm, MPI_COMM_TYPE_SHARED, r->rank, MPI_INFO_NULL, &local),
              e);
    int rc = !MPI_OK(MPI_Comm_rank(local, &lrank)) || !MPI_OK(MPI_Comm_size(local, &lsize));
    MPI_RELEASE(MPI_Comm_free(&local));
    if (rc)
        return err_set(e, ERR_FAIL, "MPI could not tell this node's ranks");
    if (!r->on_cuda)
        return backend_cpu_init(&r->be, train_cpu_threads(r->o->threads, lsize, lrank == 0), e);
    int n = 0;
    char why[256] = "";
    cuda_device_count(&n, why, (int)sizeof why);
    if (n == 0)
        return err_set(e, ERR_INPUT, "stage %d is on %s, a CUDA device, but none is usable here "
                       "(%s); --device cpu trains it on the CPU", r->rank, st->device, why);
    return backend_cuda_init(&r->be, lrank % n, e);
}

/* The device's regions in one allocation: all of them, or (--switch full) one job's
 * persistent region at a time and the temporary region. */
static int alloc_regions(struct share_run *r, struct err *e)
{
    const struct share_device *dv = &r->sh.devices[r->rank];
    int64_t temporary_at = dv->temporary.offset;
    if (r->o->switch_full) {
        int64_t most = 0;
        for (int j = 0; j < r->sh.n_jobs; j++)
            most = dv->persistent[j].bytes > most ? dv->persistent[j].bytes : most;
        temporary_at = share_align(most);
    }
    r->device_bytes = temporary_at + dv->temporary.bytes;
    return r->be.ops->alloc(&r->be, r->device_bytes, (void **)&r->device_mem, e);
}

static char *persistent_at(const struct share_run *r, int j)
{
    return r->o->switch_full ? r->device_mem
                             : r->device_mem + r->sh.devices[r->rank].persistent[j].offset;
}

static char *temporary_at(const struct share_run *r)
{
    const struct share_device *dv = &r->sh.devices[r->rank];
    return r->device_mem + r->device_bytes - dv->temporary.bytes;
}

/* Job j's stage on this rank, its weights drawn as if it trained alone. */
static int start_job(struct share_run *r, int j, struct err *e)
{
    const struct train_options *o = r->o;
    const struct plan *p = &r->sh.jobs[j].plan;
    const struct share_device *dv = &r->sh.devices[r->rank];
    struct share_job_run *job = &r->jobs[j];
    /* the data file read whole (checked against this job's model) by rank 0 alone */
    if (o->data_file != NULL ? data_open_file(&job->data, o->data_file, o->data_format, &p->model,
                                              o->seed, r->rank == 0, e)
                             : data_init_synthetic(&job->data, &p->model, o->seed, e))
        return e->code;
    job->data_loaded = 1;
    job->loss = calloc((size_t)o->steps, sizeof *job->loss);
    job->ms = calloc((size_t)o->steps, sizeof *job->ms);
    job->scale = calloc((size_t)o->steps, sizeof *job->scale);
    job->skipped = calloc((size_t)o->steps, sizeof *job->skipped);
    if (job->loss == NULL || job->ms == NULL || job->scale == NULL || job->skipped == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    struct stage_config c;
    if (stage_config_of_plan(&c, p, r->rank, o->lr, &job->place, e)) /* checked in check_share */
        return e->code;
    c.persistent = persistent_at(r, j);
    c.temporary = temporary_at(r);
    c.check_arena = o->check_arena;
    c.persistent_bytes = dv->persistent[j].bytes;
    c.temporary_bytes = dv->temporary.bytes;
    if (p->model.dtype == MODEL_DTYPE_FP16)
        c.loss_scale = &o->loss_scale;
    c.agree_flag = share_agree_flag;
    c.agree_ctx = r;
    char arena_where[FILEIO_PATH_MAX + 64];
    snprintf(arena_where, sizeof arena_where, "%s: jobs[%d].plan.stages[%d].arena",
             o->share_file, j, r->rank);
    c.arena_where = arena_where;
    struct err in;
    err_clear(&in);
    if (stage_init(&job->stage, &c, &r->be, &r->tp, &job->data, o->seed, &in))
        return err_set(e, in.code, "job %s: %s", r->sh.jobs[j].name, in.msg);
    job->stage_ready = 1;
    if (o->init_file != NULL) {
        char pattern[FILEIO_PATH_MAX];
        job_path(r, o->init_file, j, pattern, sizeof pattern);
        if (train_weights_load(&job->stage, pattern, r->rank, &in))
            return err_set(e, in.code, "--init: job %s: %s", r->sh.jobs[j].name, in.msg);
    }
    if (!o->switch_full)
        return ERR_OK;
    /* the device holds one job: this one's state waits on the host */
    int64_t bytes = job->stage.lay.persistent_bytes;
    job->host_state = malloc((size_t)bytes);
    if (job->host_state == NULL)
        return err_set(e, ERR_FAIL, "out of host memory for job %s's state (%lld bytes)",
                       r->sh.jobs[j].name, (long long)bytes);
    return stage_state_get(&job->stage, 0, job->host_state, bytes, e);
}

/* The transport every job uses in turn: MPI, host-staged for a GPU. */
static int start_transport(struct share_run *r, struct err *e)
{
    int max_requests = 8;
    int64_t act = 0;
    for (int j = 0; j < r->sh.n_jobs; j++) {
        const struct plan *p = &r->sh.jobs[j].plan;
        int need = 4 * p->micro_batches + 8;
        max_requests = need > max_requests ? need : max_requests;
        int64_t a = exec_boundary_bytes(&p->model);
        act = a > act ? a : act;
    }
    int rc = r->on_cuda ? transport_staged_init(&r->tp, &r->comm, max_requests, &r->be, act, e)
                        : transport_mpi_init(&r->tp, &r->comm, max_requests, e);
    return rc;
}

/* This rank's own set-up: backend, regions, the jobs, the transport. */
static int setup_rank(struct share_run *r, struct err *e)
{
    r->resident = -1;
    r->jobs = calloc((size_t)r->sh.n_jobs, sizeof *r->jobs);
    if (r->jobs == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    ERR_TRY(start_share_backend(r, e));
    ERR_TRY(alloc_regions(r, e));
    for (int j = 0; j < r->sh.n_jobs; j++)
        ERR_TRY(start_job(r, j, e));
    return start_transport(r, e);
}

static void free_share_run(struct share_run *r)
{
    for (int j = 0; r->jobs != NULL && j < r->sh.n_jobs; j++) {
        struct share_job_run *job = &r->jobs[j];
        if (job->stage_ready)
            stage_free(&job->stage);
        if (job->data_loaded)
            data_free(&job->data);
        free(job->place);
        free(job->host_state);
        free(job->loss);
        free(job->ms);
        free(job->scale);
        free(job->skipped);
    }
    free(r->jobs);
    if (r->tp.ops != NULL)
        r->tp.ops->free(&r->tp);
    if (r->be.ops != NULL) {
        r->be.ops->release(&r->be, r->device_mem);
        r->be.ops->free(&r->be);
    }
    if (r->loaded)
        share_free(&r->sh);
    free(r->switches);
}

/* ---- the jobs in turn ---- */

/* --switch full: the resident job's state to its host copy, job `to`'s onto the device. */
static int swap_state(struct share_run *r, int to, int64_t *moved, struct err *e)
{
    *moved = 0;
    if (r->resident >= 0) {
        struct share_job_run *out = &r->jobs[r->resident];
        int64_t bytes = out->stage.lay.persistent_bytes;
        ERR_TRY(stage_state_get(&out->stage, 0, out->host_state, bytes, e));
        *moved += bytes;
    }
    struct share_job_run *in = &r->jobs[to];
    int64_t bytes = in->stage.lay.persistent_bytes;
    ERR_TRY(stage_state_put(&in->stage, 0, in->host_state, bytes, e));
    *moved += bytes;
    r->resident = to;
    return r->be.ops->sync(&r->be, e);
}

/* From job `from` (-1: the start) to job `to`; recorded unless at the start. */
static int switch_to(struct share_run *r, int from, int to, struct err *e)
{
    MPI_Request q;
    ERR_TRY(mpicheck_collective(MPI_Ibarrier(r->comm, &q), &q, "every rank before a switch", e));
    double t0 = exec_now_ms();
    int64_t moved = 0;
    if (r->o->switch_full)
        ERR_TRY(swap_state(r, to, &moved, e));
    /* shared: the persistent regions stay; the next job's carving of the temporary region is
     * its stage's own (stage_config), so nothing moves */
    double ms = exec_now_ms() - t0; /* the switch's own work, not the wait for other ranks */
    ERR_TRY(mpicheck_collective(MPI_Ibarrier(r->comm, &q), &q, "every rank after a switch", e));
    if (from < 0)
        return ERR_OK;
    if (r->n_switches == r->cap_switches) {
        int cap = r->cap_switches ? 2 * r->cap_switches : 16;
        struct share_switch *more = realloc(r->switches, (size_t)cap * sizeof *more);
        if (more == NULL)
            return err_set(e, ERR_FAIL, "out of memory");
        r->switches = more;
        r->cap_switches = cap;
    }
    r->switches[r->n_switches++] = (struct share_switch){
        from, to, ms, moved, stage_temporary_bytes(&r->jobs[to].stage)};
    return ERR_OK;
}

/* `n` steps of job j; the last stage's loss to every rank. */
static int run_slice(struct share_run *r, int j, int64_t n, struct err *e)
{
    struct share_job_run *job = &r->jobs[j];
    for (int64_t i = 0; i < n; i++, job->done++) {
        double t0 = exec_now_ms(), loss = 0;
        MPI_Request q;
        ERR_TRY(stage_step(&job->stage, job->done, &loss, e));
        enum stage_verdict v = job->stage.last.verdict;
        if (v == STAGE_NONFINITE || v == STAGE_AT_MIN) {
            r->stopped = 1;
            return err_set(e, ERR_FAIL, "job %s: step %lld: %s (first on stage %d): stopped",
                           r->sh.jobs[j].name, (long long)job->done + 1,
                           v == STAGE_AT_MIN ? "the gradients overflow fp16 at the minimum "
                                               "loss scale (--min-loss-scale)"
                                             : "a NaN or an infinity in the loss or the "
                                               "gradients",
                           job->stage.last.first);
        }
        ERR_TRY(mpicheck_collective(MPI_Ibcast(&loss, 1, MPI_DOUBLE, r->size - 1, r->comm, &q),
                                    &q, "the loss (MPI_Ibcast)", e));
        job->loss[job->done] = loss;
        job->ms[job->done] = exec_now_ms() - t0;
        job->scale[job->done] = job->stage.last.loss_scale;
        job->skipped[job->done] = v == STAGE_SKIPPED;
        char scale[64] = "", value[32];
        report_scale_text(job->scale[job->done], value);
        if (job->stage.c.loss_scale != NULL)
            snprintf(scale, sizeof scale, "  scale %s%s", value,
                     v == STAGE_SKIPPED ? " (overflow: step skipped)" : "");
        if (r->rank == 0 && !r->o->quiet)
            printf("%s step %lld/%lld  loss %.6f%s  %.1f ms\n", r->sh.jobs[j].name,
                   (long long)job->done + 1, (long long)r->o->steps, loss, scale,
                   job->ms[job->done]);
        if (job->done == 0 && r->o->steps > 1)
            continue; /* warm-up: not in the stage times */
        stage_times_add(&job->sum, &job->stage.x.times);
        job->counted++;
    }
    return ERR_OK;
}

/* --save-weights: each job's, every rank's stage of it; every rank learns each outcome, the
 * first rank that failed says why. */
static int save_each_job_weights(struct share_run *r, struct err *e)
{
    for (int j = 0; r->o->save_weights_file != NULL && j < r->sh.n_jobs; j++) {
        char pattern[FILEIO_PATH_MAX];
        struct err in;
        int first;
        err_clear(&in);
        job_path(r, r->o->save_weights_file, j, pattern, sizeof pattern);
        /* --switch full: one job's state on the device at a time */
        int64_t moved;
        int rc = r->o->switch_full && r->resident != j ? swap_state(r, j, &moved, &in) : ERR_OK;
        if (rc == ERR_OK)
            rc = train_weights_save(&r->jobs[j].stage, r->comm, pattern, &in);
        if (share_agree(r, rc, &first) == ERR_OK)
            continue;
        if (r->rank == first)
            fprintf(stderr, "ballast train: stage %d: job %s: %s\n", r->rank,
                    r->sh.jobs[j].name, in.msg);
        return err_set(e, ERR_FAIL, "--save-weights: job %s: rank %d could not write its "
                       "weights (its message above)", r->sh.jobs[j].name, first);
    }
    return ERR_OK;
}

static int train_jobs(struct share_run *r, struct err *e)
{
    int current = -1, left = 1;
    while (left) {
        left = 0;
        for (int j = 0; j < r->sh.n_jobs; j++) {
            int64_t n = r->o->steps - r->jobs[j].done;
            n = n < r->o->slice ? n : r->o->slice;
            if (n <= 0)
                continue;
            if (j != current)
                ERR_TRY(switch_to(r, current, j, e));
            current = j;
            ERR_TRY(run_slice(r, j, n, e));
            left |= r->jobs[j].done < r->o->steps;
        }
    }
    return ERR_OK;
}

/* ---- metrics ---- */

enum { REP_PEAK, REP_PERSISTENT, REP_TEMPORARY, REP_FWD, REP_BWD, REP_RECOMPUTE, REP_SEND,
       REP_IDLE, REP_N };

/* This rank's numbers of job j (per micro-batch times). */
static void job_numbers(const struct share_run *r, int j, double out[REP_N])
{
    const struct share_job_run *job = &r->jobs[j];
    double k = job->counted > 0 ? (double)job->counted * job->stage.c.micro_batches : 1;
    out[REP_PEAK] = (double)job->stage.x.peak;
    out[REP_PERSISTENT] = (double)job->stage.lay.persistent_bytes;
    out[REP_TEMPORARY] = (double)stage_temporary_bytes(&job->stage);
    out[REP_FWD] = job->sum.fwd / k;
    out[REP_BWD] = job->sum.bwd / k;
    out[REP_RECOMPUTE] = job->sum.recompute / k;
    out[REP_SEND] = job->sum.send / k;
    out[REP_IDLE] = job->sum.idle / k;
}

static cJSON *job_json(const struct share_run *r, int j, const double *all)
{
    const struct share_job_run *job = &r->jobs[j];
    int J = r->sh.n_jobs;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", r->sh.jobs[j].name);
    cJSON *steps = cJSON_AddArrayToObject(o, "steps");
    for (int64_t i = 0; i < job->done; i++) {
        cJSON *s = cJSON_CreateObject();
        jsonio_add_int(s, "step", i + 1);
        cJSON_AddNumberToObject(s, "loss", job->loss[i]);
        cJSON_AddNumberToObject(s, "ms", job->ms[i]);
        if (job->stage.c.loss_scale != NULL) {
            cJSON_AddNumberToObject(s, "loss_scale", job->scale[i]);
            cJSON_AddBoolToObject(s, "skipped", job->skipped[i]);
        }
        cJSON_AddItemToArray(steps, s);
    }
    cJSON *stages = cJSON_AddArrayToObject(o, "stages");
    for (int s = 0; s < r->size; s++) {
        const double *n = all + ((size_t)s * J + j) * REP_N;
        cJSON *so = cJSON_CreateObject();
        jsonio_add_int(so, "index", s);
        jsonio_add_int(so, "peak_bytes", (int64_t)n[REP_PEAK]);
        jsonio_add_int(so, "persistent_bytes", (int64_t)n[REP_PERSISTENT]);
        jsonio_add_int(so, "temporary_bytes", (int64_t)n[REP_TEMPORARY]);
        const char *names[] = {"fwd_ms", "bwd_ms", "recompute_ms", "send_ms", "idle_ms"};
        for (int k = 0; k < 5; k++)
            cJSON_AddNumberToObject(so, names[k], n[REP_FWD + k]);
        cJSON_AddItemToArray(stages, so);
    }
    return o;
}

/* Device d's measured peak: the persistent regions and the largest temporary live (shared),
 * or the largest job (full). */
static cJSON *device_report_json(const struct share_run *r, int d, const double *all)
{
    const struct share_device *dv = &r->sh.devices[d];
    int J = r->sh.n_jobs;
    double persistent = 0, temporary = 0, largest = 0;
    for (int j = 0; j < J; j++) {
        const double *n = all + ((size_t)d * J + j) * REP_N;
        persistent += n[REP_PERSISTENT];
        temporary = n[REP_PEAK] - n[REP_PERSISTENT] > temporary ? n[REP_PEAK] - n[REP_PERSISTENT]
                                                                : temporary;
        largest = n[REP_PEAK] > largest ? n[REP_PEAK] : largest;
    }
    int64_t planned_persistent = 0;
    for (int j = 0; j < J; j++)
        planned_persistent += dv->persistent[j].bytes;
    cJSON *o = cJSON_CreateObject();
    jsonio_add_int(o, "index", d);
    cJSON_AddStringToObject(o, "device", dv->device);
    jsonio_add_int(o, "peak_bytes", (int64_t)(r->o->switch_full ? largest : persistent + temporary));
    jsonio_add_int(o, "persistent_bytes", planned_persistent);
    jsonio_add_int(o, "temporary_bytes", dv->temporary.bytes);
    jsonio_add_int(o, "planned_bytes", planned_persistent + dv->temporary.bytes);
    return o;
}

static cJSON *switches_json(const struct share_run *r, const double *ms, const int64_t *moved,
                            const int64_t *temporary)
{
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < r->n_switches; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "from", r->sh.jobs[r->switches[i].from].name);
        cJSON_AddStringToObject(o, "to", r->sh.jobs[r->switches[i].to].name);
        cJSON_AddNumberToObject(o, "ms", ms[i]);
        jsonio_add_int(o, "persistent_bytes_moved", moved[i]);
        jsonio_add_int(o, "temporary_bytes", temporary[i]);
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

static int write_metrics(const struct share_run *r, const double *all, const double *ms,
                         const int64_t *moved, const int64_t *temporary, struct err *e)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "ballast-share-metrics/1");
    cJSON_AddStringToObject(root, "share", r->o->share_file);
    cJSON_AddStringToObject(root, "switch", r->o->switch_full ? "full" : "share");
    jsonio_add_int(root, "slice", r->o->slice);
    cJSON *jobs = cJSON_AddArrayToObject(root, "jobs");
    for (int j = 0; j < r->sh.n_jobs; j++)
        cJSON_AddItemToArray(jobs, job_json(r, j, all));
    cJSON_AddItemToObject(root, "switches", switches_json(r, ms, moved, temporary));
    cJSON *devices = cJSON_AddArrayToObject(root, "devices");
    for (int d = 0; d < r->size; d++)
        cJSON_AddItemToArray(devices, device_report_json(r, d, all));
    int rc = jsonio_write(r->o->metrics_file, root, e);
    cJSON_Delete(root);
    return rc;
}

/* Every rank's numbers to rank 0: jobs' stages gathered, switches' ms the slowest rank's,
 * bytes summed over ranks. */
static int gather_share_report(struct share_run *r, struct err *e)
{
    int J = r->sh.n_jobs, n = r->n_switches;
    double *mine = calloc((size_t)J * REP_N, sizeof *mine);
    double *all = calloc((size_t)r->size * J * REP_N, sizeof *all);
    double *ms = calloc((size_t)n + 1, sizeof *ms), *ms_max = calloc((size_t)n + 1, sizeof *ms);
    int64_t *b = calloc(2 * (size_t)n + 1, sizeof *b), *b_sum = calloc(2 * (size_t)n + 1, sizeof *b);
    int rc = mine && all && ms && ms_max && b && b_sum ? ERR_OK
                                                       : err_set(e, ERR_FAIL, "out of memory");
    for (int j = 0; rc == ERR_OK && j < J; j++)
        job_numbers(r, j, mine + (size_t)j * REP_N);
    for (int i = 0; rc == ERR_OK && i < n; i++) {
        ms[i] = r->switches[i].ms;
        b[i] = r->switches[i].persistent_moved;
        b[n + i] = r->switches[i].temporary_bytes;
    }
    MPI_Request q;
    if (rc == ERR_OK)
        rc = mpicheck_collective(MPI_Igather(mine, J * REP_N, MPI_DOUBLE, all, J * REP_N,
                                             MPI_DOUBLE, 0, r->comm, &q),
                                 &q, "the jobs' numbers (MPI_Igather)", e);
    if (rc == ERR_OK)
        rc = mpicheck_collective(MPI_Ireduce(ms, ms_max, n, MPI_DOUBLE, MPI_MAX, 0, r->comm, &q),
                                 &q, "the switch times (MPI_Ireduce)", e);
    if (rc == ERR_OK)
        rc = mpicheck_collective(MPI_Ireduce(b, b_sum, 2 * n, MPI_INT64_T, MPI_SUM, 0, r->comm,
                                             &q),
                                 &q, "the switch bytes (MPI_Ireduce)", e);
    if (rc == ERR_OK && r->rank == 0 && r->o->metrics_file != NULL)
        rc = write_metrics(r, all, ms_max, b_sum, b_sum + n, e);
    if (rc == ERR_OK && r->rank == 0) {
        double total = 0;
        int64_t bytes = 0;
        for (int i = 0; i < n; i++) {
            total += ms_max[i];
            bytes += b_sum[i];
        }
        printf("train --share: %d jobs, %lld steps each, slices of %lld, %d switches (%s): "
               "%.3f ms and %lld persistent bytes moved per switch on average\n",
               J, (long long)r->o->steps, (long long)r->o->slice, n,
               r->o->switch_full ? "full" : "share", n ? total / n : 0.0,
               (long long)(n ? bytes / n : 0));
    }
    free(mine);
    free(all);
    free(ms);
    free(ms_max);
    free(b);
    free(b_sum);
    return rc;
}

int train_share_run(const struct train_options *o, int rank, int size)
{
    struct share_run r;
    struct err e;
    err_clear(&e);
    r = (struct share_run){.o = o, .comm = MPI_COMM_WORLD, .rank = rank, .size = size};
    /* the same on every rank: rank 0 speaks for all */
    int first, rc = check_share(&r, &e);
    struct err out;
    err_clear(&out);
    if (rc == ERR_OK && o->metrics_file != NULL && fileio_out_check(o->metrics_file, &out))
        rc = err_set(&e, out.code, "--metrics: %s", out.msg);
    if (r.loaded)
        heartbeat_layout(o->heartbeat, r.sh.n_devices);
    int all = share_agree(&r, rc, NULL);
    if (all != ERR_OK && rc != ERR_OK && r.rank == 0)
        fprintf(stderr, "ballast train: %s\n", e.msg);
    /* this rank's own, its paths first: it speaks for itself */
    for (int phase = 0; phase < 2 && all == ERR_OK; phase++) {
        rc = phase == 0 ? check_paths(&r, &e) : setup_rank(&r, &e);
        all = share_agree(&r, rc, NULL);
        if (rc != ERR_OK)
            fprintf(stderr, "ballast train: stage %d: %s\n", r.rank, e.msg);
    }
    if (all != ERR_OK) {
        free_share_run(&r);
        return all;
    }
    if (train_jobs(&r, &e) && r.stopped) { /* every rank has the verdict: each returns */
        if (r.rank == 0)
            fprintf(stderr, "ballast train: %s\n", e.msg);
        free_share_run(&r);
        return ERR_FAIL;
    } else if (e.code != ERR_OK) {
        share_fail_now(&r, &e);
    }
    rc = save_each_job_weights(&r, &e);
    if (rc == ERR_OK)
        rc = gather_share_report(&r, &e);
    all = share_agree(&r, rc, &first);
    if (all != ERR_OK && r.rank == first)
        fprintf(stderr, "ballast train: stage %d: %s\n", r.rank, e.msg);
    free_share_run(&r);
    return all;
}
