#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "ckpt.h"
#include "mpicheck.h"
#include "plan.h"
#include "report.h"
#include "stage.h"
#include "transport.h"

/* AdamW as GPT-2 reproductions train it (nanoGPT, llm.c). */
#define ADAMW_BETA1 0.9f
#define ADAMW_BETA2 0.95f
#define ADAMW_EPS 1e-8f
#define ADAMW_WEIGHT_DECAY 0.1f

struct run {
    const struct train_options *o;
    MPI_Comm comm;
    int rank, size;
    struct plan plan;
    int plan_loaded;
    struct data_source data;
    int data_loaded;
    struct backend be;
    struct transport tp;
    struct stage_runner stage;
    int stage_ready;
    uint32_t *regen; /* this rank's layers: the kept tensors each regenerates */
    int64_t start_step; /* steps already done (resume) */
};

/* Every rank passes its status; all get the worst, and the first rank that failed. */
static int agree(struct run *r, int rc, int *first_failed)
{
    int worst = rc, mine = rc != ERR_OK ? r->rank : r->size, first = mine;
    if (MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, r->comm) != MPI_SUCCESS ||
        MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, r->comm) != MPI_SUCCESS)
        return ERR_FAIL;
    if (first_failed != NULL)
        *first_failed = first;
    return worst;
}

static void fail_now(struct run *r, const struct err *e)
{
    fprintf(stderr, "ballast train: stage %d: %s\n", r->rank, e->msg);
    fflush(stderr);
    MPI_Abort(r->comm, ERR_FAIL);
}

static int default_threads(struct run *r, struct err *e)
{
    MPI_Comm local;
    int n_local = 1;
    MPI_CHECK(MPI_Comm_split_type(r->comm, MPI_COMM_TYPE_SHARED, r->rank, MPI_INFO_NULL, &local),
              e);
    MPI_CHECK(MPI_Comm_size(local, &n_local), e);
    MPI_CHECK(MPI_Comm_free(&local), e);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int t = cores > 0 ? (int)(cores / n_local) : 1;
    return t > 0 ? t : 1;
}

/* Checks every rank makes identically: the plan, the rank count, the data, the manifest. */
static int setup_global(struct run *r, struct err *e)
{
    const struct train_options *o = r->o;
    if (plan_load(o->plan_file, &r->plan, e))
        return e->code;
    r->plan_loaded = 1;
    const struct plan *p = &r->plan;
    const struct model *m = &p->model;
    if (p->n_stages != r->size)
        return err_set(e, ERR_INPUT,
                       "%s: the plan has %d stages, one MPI rank each, but this run has %d "
                       "ranks (mpirun -np %d)",
                       o->plan_file, p->n_stages, r->size, p->n_stages);
    if (m->dtype != MODEL_DTYPE_FP32)
        return err_set(e, ERR_INPUT,
                       "%s: model.dtype: \"%s\": the CPU runtime trains fp32 only (bf16 is the "
                       "CUDA backend's)",
                       o->plan_file, model_dtype_name(m->dtype));
    /* micro-batch indices are the message tags */
    int *tag_ub, found = 0;
    if (MPI_Comm_get_attr(r->comm, MPI_TAG_UB, &tag_ub, &found) == MPI_SUCCESS && found &&
        p->micro_batches > *tag_ub)
        return err_set(e, ERR_INPUT, "%s: micro_batches: %d is more than this MPI's largest tag %d",
                       o->plan_file, p->micro_batches, *tag_ub);
    if ((int64_t)m->micro_batch * m->seq_len > 0x7fffffff)
        return err_set(e, ERR_INPUT,
                       "%s: model: micro_batch x seq_len = %lld rows is beyond 32-bit BLAS "
                       "dimensions",
                       o->plan_file, (long long)m->micro_batch * m->seq_len);
    /* every layer's recompute choice must be one this runtime can apply */
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        for (int l = 0; l < plan_stage_layer_count(st); l++) {
            uint32_t regen;
            struct err inner;
            err_clear(&inner);
            if (layout_regen(m, st->first + l, st->recompute[l], &st->layers[l], &regen, &inner))
                return err_set(e, inner.code, "%s: stages[%d].recompute_options: %s",
                               o->plan_file, s, inner.msg);
        }
    }
    if (o->data_file != NULL ? data_init_file(&r->data, o->data_file, m, o->seed, e)
                             : data_init_synthetic(&r->data, m, o->seed, e))
        return e->code;
    r->data_loaded = 1;
    if (o->resume_dir != NULL) {
        int n_stages;
        if (ckpt_read_manifest(o->resume_dir, &r->start_step, &n_stages, e))
            return e->code;
        if (n_stages != p->n_stages)
            return err_set(e, ERR_INPUT,
                           "%s/checkpoint.json: n_stages: %d, but the plan %s has %d stages",
                           o->resume_dir, n_stages, o->plan_file, p->n_stages);
        if (r->start_step >= o->steps)
            return err_set(e, ERR_INPUT,
                           "%s: the checkpoint is at step %lld and --steps is %lld: nothing to "
                           "train (raise --steps)",
                           o->resume_dir, (long long)r->start_step, (long long)o->steps);
    }
    return ERR_OK;
}

/* A plan made from a profile of another implementation carries other byte counts: this
 * runtime allocates what its own layers need, and says so, field by field (for a layer
 * recomputed with an option, that option's bytes too). */
static void compare_layer_costs(const struct run *r, const struct plan_stage *st)
{
    const struct model *m = &r->plan.model;
    int shown = 0;
    for (int l = st->first; l <= st->last; l++) {
        const struct layer_cost *c = &st->layers[l - st->first];
        int choice = st->recompute[l - st->first];
        struct layer_sizes s;
        sizes_layer(m, l, &s);
        const char *names[7] = {"state_bytes", "act_bytes", "ckpt_bytes", "workspace_bytes",
                                "out_bytes", "kept_bytes", "transient_bytes"};
        int64_t plan[7] = {c->state_bytes, c->act_bytes, c->ckpt_bytes, c->workspace_bytes,
                           c->out_bytes, 0, 0};
        int64_t here[7] = {s.state_bytes, s.act_bytes, s.ckpt_bytes, s.workspace_bytes,
                           s.out_bytes, 0, 0};
        if (choice >= COST_OPTION) {
            const struct recompute_option *o = &c->options[choice - COST_OPTION];
            plan[5] = o->kept_bytes;
            plan[6] = o->transient_bytes;
            sizes_regen_bytes(m, model_layer_kind(m, l), r->regen[l - st->first], &here[5],
                              &here[6]);
        }
        for (int k = 0; k < 7; k++) {
            if (plan[k] == here[k])
                continue;
            if (shown++ == 0)
                fprintf(stderr,
                        "ballast train: stage %d: warning: the plan's layer costs are not this "
                        "runtime's (a profile of another implementation?); training allocates "
                        "its own sizes, so measured memory will differ from planned:\n",
                        st->index);
            fprintf(stderr, "  %s: %s%s%s %lld in the plan, %lld here\n", c->name,
                    k >= 5 ? cost_choice_name(c, choice) : "", k >= 5 ? " " : "", names[k],
                    (long long)plan[k], (long long)here[k]);
        }
    }
}

/* This rank's stage: backend, transport, arenas, weights (or the checkpoint). */
static int setup_stage(struct run *r, struct err *e)
{
    const struct train_options *o = r->o;
    const struct plan *p = &r->plan;
    const struct plan_stage *st = &p->stages[r->rank];
    int threads = o->threads > 0 ? o->threads : default_threads(r, e);
    if (e->code)
        return e->code;
    if (backend_cpu_init(&r->be, threads, e))
        return e->code;
    /* a send and a receive per micro-batch in flight, in each direction, at most */
    if (transport_mpi_init(&r->tp, &r->comm, 4 * p->micro_batches + 8, e))
        return e->code;
    int n = plan_stage_layer_count(st);
    r->regen = calloc((size_t)n, sizeof *r->regen);
    if (r->regen == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    for (int l = 0; l < n; l++) /* checked in setup_global */
        if (layout_regen(&p->model, st->first + l, st->recompute[l], &st->layers[l],
                         &r->regen[l], e))
            return e->code;
    compare_layer_costs(r, st);
    struct stage_config c = {
        .model = &p->model,
        .stage = r->rank,
        .n_stages = p->n_stages,
        .micro_batches = p->micro_batches,
        .schedule = p->schedule,
        .first = st->first,
        .last = st->last,
        .regen = r->regen,
        .in_flight = st->in_flight,
        .adamw = {(float)o->lr, ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS, ADAMW_WEIGHT_DECAY},
        .limit_bytes = st->memory_limit_bytes,
        .reserve_bytes = p->reserve_bytes,
        .record_events = o->trace_file != NULL,
    };
    if (stage_init(&r->stage, &c, &r->be, &r->tp, &r->data, o->seed, e))
        return e->code;
    r->stage_ready = 1;
    if (o->resume_dir != NULL) {
        struct ckpt_identity id;
        ckpt_identity_of(&id, &r->stage, &r->data, o->seed);
        if (ckpt_read_stage(o->resume_dir, &id, r->start_step, &r->stage, e))
            return e->code;
    }
    return ERR_OK;
}

static void save(struct run *r, int64_t step)
{
    struct err e;
    err_clear(&e);
    struct ckpt_identity id;
    ckpt_identity_of(&id, &r->stage, &r->data, r->o->seed);
    int rc = ckpt_write_stage(r->o->save_dir, &id, step, &r->stage, &e);
    if (rc)
        fail_now(r, &e);
    /* the manifest names step N only once every stage's file of step N is on disk */
    if (agree(r, rc, NULL) != ERR_OK)
        MPI_Abort(r->comm, ERR_FAIL);
    if (r->rank == 0 && ckpt_write_manifest(r->o->save_dir, step, r->size, &e))
        fail_now(r, &e);
    if (MPI_Barrier(r->comm) != MPI_SUCCESS)
        MPI_Abort(r->comm, ERR_FAIL);
    ckpt_remove_older(r->o->save_dir, r->rank, step);
}

static void free_run(struct run *r)
{
    if (r->stage_ready)
        stage_free(&r->stage);
    if (r->tp.ops != NULL)
        r->tp.ops->free(&r->tp);
    if (r->be.ops != NULL)
        r->be.ops->free(&r->be);
    if (r->data_loaded)
        data_free(&r->data);
    if (r->plan_loaded)
        plan_free(&r->plan);
    free(r->regen);
}

/* Rank 0 gathers every stage's numbers and events, then writes and prints. */
static int finish(struct run *r, struct report *rep, const struct report_stage *mine,
                  struct err *e)
{
    const struct train_options *o = r->o;
    struct report_stage *all = NULL;
    int *counts = NULL, *displs = NULL;
    struct stage_event *events = NULL;
    int rc = ERR_OK;
    if (r->rank == 0) {
        all = calloc((size_t)r->size, sizeof *all);
        counts = calloc((size_t)r->size, sizeof *counts);
        displs = calloc((size_t)r->size, sizeof *displs);
        if (all == NULL || counts == NULL || displs == NULL)
            rc = err_set(e, ERR_FAIL, "out of memory gathering the report");
    }
    if (rc == ERR_OK && MPI_Gather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine,
                                   MPI_BYTE, 0, r->comm) != MPI_SUCCESS)
        rc = err_set(e, ERR_FAIL, "MPI_Gather of the stage reports failed");
    if (rc == ERR_OK && o->trace_file != NULL) {
        int n = r->stage.n_events * (int)sizeof(struct stage_event), total = 0;
        if (MPI_Gather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, r->comm) != MPI_SUCCESS)
            rc = err_set(e, ERR_FAIL, "MPI_Gather of the trace sizes failed");
        if (rc == ERR_OK && r->rank == 0) {
            for (int s = 0; s < r->size; s++) {
                displs[s] = total;
                total += counts[s];
            }
            events = malloc((size_t)total + 1);
            if (events == NULL)
                rc = err_set(e, ERR_FAIL, "out of memory gathering the trace");
        }
        if (rc == ERR_OK && MPI_Gatherv(r->stage.events, n, MPI_BYTE, events, counts, displs,
                                        MPI_BYTE, 0, r->comm) != MPI_SUCCESS)
            rc = err_set(e, ERR_FAIL, "MPI_Gatherv of the trace failed");
        if (r->rank == 0)
            for (int s = 0; s < r->size; s++)
                counts[s] /= (int)sizeof(struct stage_event);
    }
    if (rc == ERR_OK && r->rank == 0) {
        rep->stages = all;
        rep->n_stages = r->size;
        if (o->metrics_file != NULL)
            rc = report_write_metrics(o->metrics_file, rep, e);
        if (rc == ERR_OK && o->trace_file != NULL)
            rc = report_write_trace(o->trace_file, &r->plan.model, rep, counts, events, e);
        report_print_summary(stdout, rep);
        fflush(stdout);
    }
    free(all);
    free(counts);
    free(displs);
    free(events);
    return rc;
}

static int train_loop(struct run *r, struct err *e)
{
    const struct train_options *o = r->o;
    const struct plan *p = &r->plan;
    const struct model *m = &p->model;
    int64_t n_steps = o->steps - r->start_step;
    struct report rep = {
        .plan_file = o->plan_file,
        .schedule = schedule_name(p->schedule),
        .micro_batches = p->micro_batches,
        .threads = r->be.threads,
        .tokens_per_step = (int64_t)p->micro_batches * m->micro_batch * m->seq_len,
        .data = o->data_file != NULL ? o->data_file : "synthetic",
        .entropy_floor = data_entropy_floor(&r->data),
    };
    rep.steps = calloc((size_t)n_steps, sizeof *rep.steps);
    if (rep.steps == NULL)
        return err_set(e, ERR_FAIL, "out of memory for %lld steps", (long long)n_steps);
    struct stage_times sum = {0};
    int counted = 0;
    double timed_ms = 0;
    if (r->rank == 0 && !o->quiet)
        printf("train: %s, %d stages, %s, %d micro-batches of %d x %d tokens, %d threads per "
               "rank, steps %lld..%lld\n",
               o->plan_file, p->n_stages, schedule_name(p->schedule), p->micro_batches,
               m->micro_batch, m->seq_len, r->be.threads, (long long)r->start_step + 1,
               (long long)o->steps);
    MPI_CHECK(MPI_Barrier(r->comm), e);
    stage_set_origin(&r->stage);
    for (int64_t i = 0; i < n_steps; i++) {
        int64_t step = r->start_step + i;
        double t0 = stage_now_ms(), loss = 0;
        if (stage_step(&r->stage, step, &loss, e))
            fail_now(r, e);
        if (MPI_Bcast(&loss, 1, MPI_DOUBLE, r->size - 1, r->comm) != MPI_SUCCESS)
            MPI_Abort(r->comm, ERR_FAIL);
        double ms = stage_now_ms() - t0;
        rep.steps[i] = (struct report_step){step + 1, loss, ms};
        rep.n_steps = (int)i + 1;
        /* steps after the first of this run (a one-step run counts its only step) */
        if (i > 0 || n_steps == 1) {
            const struct stage_times *t = &r->stage.times;
            sum.fwd += t->fwd;
            sum.bwd += t->bwd;
            sum.recompute += t->recompute;
            sum.send += t->send;
            sum.idle += t->idle;
            sum.optimizer += t->optimizer;
            counted++;
            timed_ms += ms;
        }
        if (r->rank == 0 && !o->quiet) {
            printf("step %lld/%lld  loss %.6f  %.1f ms  %.0f tokens/s\n", (long long)step + 1,
                   (long long)o->steps, loss, ms, (double)rep.tokens_per_step / (ms * 1e-3));
            fflush(stdout);
        }
        if (o->save_dir != NULL &&
            ((o->save_every > 0 && (step + 1) % o->save_every == 0) || i == n_steps - 1))
            save(r, step + 1);
    }
    rep.tokens_per_s = (double)rep.tokens_per_step * counted / (timed_ms * 1e-3);
    const struct plan_stage *st = &p->stages[r->rank];
    struct report_stage mine = {
        .index = r->rank,
        .first = st->first,
        .last = st->last,
        .peak_bytes = r->stage.peak,
        .planned_bytes = st->memory_bytes - p->reserve_bytes,
        .reserve_bytes = p->reserve_bytes,
        .arena_bytes = r->stage.lay.arena_bytes,
        .planned_stage_ms = st->stage_ms,
        .planned_recompute_ms = st->recompute_ms,
        .fwd_ms = sum.fwd / (counted * p->micro_batches),
        .bwd_ms = sum.bwd / (counted * p->micro_batches),
        .recompute_ms = sum.recompute / (counted * p->micro_batches),
        .send_ms = sum.send / (counted * p->micro_batches),
        .idle_ms = sum.idle / (counted * p->micro_batches),
        .optimizer_ms = sum.optimizer / counted,
    };
    snprintf(mine.device, sizeof mine.device, "%s", st->device);
    for (int l = 0; l < plan_stage_layer_count(st); l++)
        mine.n_recompute += st->recompute[l] != COST_KEEP; /* whole or in part */
    int rc = finish(r, &rep, &mine, e);
    free(rep.steps);
    return rc;
}

int train_run(const struct train_options *o)
{
    struct run r;
    struct err e;
    memset(&r, 0, sizeof r);
    err_clear(&e);
    r.o = o;
    r.comm = MPI_COMM_WORLD;
    if (MPI_Comm_set_errhandler(r.comm, MPI_ERRORS_RETURN) != MPI_SUCCESS ||
        MPI_Comm_rank(r.comm, &r.rank) != MPI_SUCCESS ||
        MPI_Comm_size(r.comm, &r.size) != MPI_SUCCESS) {
        fprintf(stderr, "ballast train: MPI_COMM_WORLD is unusable\n");
        return ERR_FAIL;
    }

    /* The same on every rank: rank 0 speaks for all. */
    int first_failed, rc = setup_global(&r, &e);
    int all = agree(&r, rc, NULL);
    if (all != ERR_OK) {
        if (rc != ERR_OK && r.rank == 0)
            fprintf(stderr, "ballast train: %s\n", e.msg);
        free_run(&r);
        return all;
    }
    /* This rank's own: it speaks for itself. */
    rc = setup_stage(&r, &e);
    all = agree(&r, rc, &first_failed);
    if (all != ERR_OK) {
        if (rc != ERR_OK)
            fprintf(stderr, "ballast train: stage %d: %s\n", r.rank, e.msg);
        else if (r.rank == 0)
            fprintf(stderr, "ballast train: stopped: stage %d could not start\n",
                    first_failed);
        free_run(&r);
        return all;
    }
    rc = train_loop(&r, &e);
    /* only rank 0 writes files; its status is everyone's */
    if (MPI_Bcast(&rc, 1, MPI_INT, 0, r.comm) != MPI_SUCCESS)
        rc = ERR_FAIL;
    if (rc != ERR_OK && r.rank == 0)
        fprintf(stderr, "ballast train: %s\n", e.msg);
    free_run(&r);
    return rc;
}
