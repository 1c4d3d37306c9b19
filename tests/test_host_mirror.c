/* The optimizer on the host (hostmirror.h), under `mpirun -np 1|3`: stages built directly from
 * stage configs, trained with AdamW on the device and on the host.
 *   - fp32 and bf16, 1F1B and GPipe, alone and beside offload through an emulated host link:
 *     losses, weights, gradients, master weights and AdamW moments bitwise equal to the
 *     device's optimizer (on CUDA, whose AdamW kernel is not the host's bit for bit, the
 *     losses to 1e-4);
 *   - the device peak is the device run's less exactly what left it (master, m, v: the
 *     layout's arenas otherwise), and the host peak is the mirror (4 fp32 copies of the
 *     parameters, the contract's host_memory_bytes) plus what offload holds;
 *   - a checkpoint written after 2 steps and resumed into a fresh stage gives, after a 3rd
 *     step, every byte of 3 straight steps, with the optimizer on the host before, after or
 *     both (fp32 and bf16);
 *   - a device limit of the host-optimizer stage's arenas: it fits, the device optimizer's
 *     does not;
 *   - a host limit below the mirror: ERR_INPUT on every rank, with the numbers.
 * With --cuda (a GPU test), the stages run on cuda:0: a pinned mirror, copy streams. */
#include <CUnit/CUnit.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "ckpt.h"
#include "cost.h"
#include "data.h"
#include "gpu.h"
#include "schedule.h"
#include "stage.h"
#include "mpitest.h"
#include "testutil.h"
#include "transport.h"

/* embedding, 4 blocks, head: global layers 0..5 */
static struct model model = {.n_layer = 4, .n_embd = 32, .n_head = 2, .seq_len = 16,
                             .vocab_size = 64, .micro_batch = 2, .dtype = MODEL_DTYPE_FP32};
#define N_LAYERS 6
#define MICRO 4
#define STEPS 3

static int rank, size;
static int use_cuda;
static int64_t device_limit = (int64_t)1 << 40; /* every stage's memory_limit_bytes */

struct run_opts {
    enum schedule schedule;
    enum cost_place optimizer;
    int offload;       /* every layer's kept tensors to the host */
    double gbps;       /* emulated link, 0 none */
    int steps;
    int64_t host_limit;
    const char *save, *resume; /* checkpoint dirs: save after the steps, resume before */
    int64_t start;             /* the first step (a resumed run's) */
};

struct result {
    double loss[8];
    unsigned char *state;
    int64_t state_bytes, weights_bytes, section_bytes, grads_at, master_at, m_at, v_at;
    int64_t peak, persistent, arena, host_peak, host_bytes, mirror;
    double host_update_ms;
};

static void split(int stage, int n_stages, int *first, int *last)
{
    static const int bounds[2][4] = {{0, 6}, {0, 2, 4, 6}};
    const int *b = bounds[n_stages == 1 ? 0 : 1];
    *first = b[stage];
    *last = b[stage + 1] - 1;
}

static void keep_result(struct stage_runner *r, struct result *res, struct err *e)
{
    res->state_bytes = stage_state_bytes(r);
    res->state = malloc((size_t)res->state_bytes);
    CU_ASSERT_FATAL(res->state != NULL);
    CU_ASSERT_EQUAL(stage_state_get(r, 0, res->state, res->state_bytes, e), ERR_OK);
    res->weights_bytes = r->lay.weights_bytes;
    res->section_bytes = r->lay.section_bytes;
    res->grads_at = r->lay.grads_at;
    res->master_at = r->lay.master_at;
    res->m_at = r->lay.m_at;
    res->v_at = r->lay.v_at;
    res->peak = r->x.peak;
    res->persistent = r->lay.persistent_bytes;
    res->arena = r->lay.arena_bytes;
    res->host_peak = r->x.off.host_peak;
    res->host_bytes = r->lay.host_bytes;
    res->mirror = r->lay.mirror_bytes;
}

/* Trains this rank's stage; returns stage_init's status (every rank's worst). */
static int run(const struct run_opts *ro, struct result *res, struct err *e)
{
    struct backend be;
    struct transport tp;
    struct data_source data;
    struct stage_runner r;
    MPI_Comm comm = MPI_COMM_WORLD;
    memset(res, 0, sizeof *res);
    if (use_cuda) {
        CU_ASSERT_FATAL(backend_cuda_init(&be, 0, e) == ERR_OK);
        CU_ASSERT_FATAL(transport_staged_init(&tp, &comm, 4 * MICRO + 8, &be,
                                              exec_boundary_bytes(&model), e) == ERR_OK);
    } else {
        CU_ASSERT_FATAL(backend_cpu_init(&be, 1, e) == ERR_OK);
        CU_ASSERT_FATAL(transport_mpi_init(&tp, &comm, 4 * MICRO + 8, e) == ERR_OK);
    }
    CU_ASSERT_FATAL(data_init_synthetic(&data, &model, 7, e) == ERR_OK);
    int first, last;
    split(rank, size, &first, &last);
    int n = last - first + 1;
    struct layout_place place[N_LAYERS] = {0};
    for (int li = 0; ro->offload && li < n; li++) {
        place[li].ahead = 1;
        CU_ASSERT_FATAL(layout_offload_mask(&model, first + li, li == 0, 0, COST_PLACE_HOST, -1,
                                            &place[li].offload, e) == ERR_OK);
    }
    struct stage_config c = {
        .model = &model,
        .stage = rank,
        .n_stages = size,
        .micro_batches = MICRO,
        .schedule = ro->schedule,
        .first = first,
        .last = last,
        .in_flight = schedule_in_flight(ro->schedule, size, rank, MICRO),
        .adamw = adamw_params_gpt(1e-3f),
        .limit_bytes = device_limit,
        .place = place,
        .host_limit_bytes = ro->host_limit,
        .host_link_gbps = ro->gbps,
        .host_link_latency_us = ro->gbps > 0 ? 10 : 0,
        .optimizer = ro->optimizer,
        .host_threads = 1,
    };
    int rc = stage_init(&r, &c, &be, &tp, &data, 1234, e), worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, comm);
    struct ckpt_identity id;
    if (worst == ERR_OK)
        ckpt_identity_of(&id, &r, &data, 1234);
    if (worst == ERR_OK && ro->resume != NULL)
        CU_ASSERT_EQUAL_FATAL(ckpt_read_stage(ro->resume, &id, ro->start, &r, e), ERR_OK);
    if (worst == ERR_OK) {
        MPI_Barrier(comm);
        for (int s = 0; s < ro->steps; s++) {
            double loss = 0;
            int step_rc = stage_step(&r, ro->start + s, &loss, e);
            if (step_rc != ERR_OK)
                fprintf(stderr, "rank %d, step %d: %s\n", rank, s, e->msg);
            CU_ASSERT_EQUAL_FATAL(step_rc, ERR_OK);
            MPI_Bcast(&loss, 1, MPI_DOUBLE, size - 1, comm);
            res->loss[s] = loss;
            res->host_update_ms += r.x.times.host_update;
        }
        if (ro->save != NULL)
            CU_ASSERT_EQUAL(ckpt_write_stage(ro->save, &id, ro->start + ro->steps, &r, e), ERR_OK);
        keep_result(&r, res, e);
        stage_free(&r);
    } else if (rc == ERR_OK) {
        stage_free(&r); /* another rank's stage did not fit */
    }
    data_free(&data);
    tp.ops->free(&tp);
    be.ops->free(&be);
    return worst;
}

static int all_ranks(int ok)
{
    int all = ok;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

static int same_bytes(const struct result *a, int64_t a_at, const struct result *b, int64_t b_at,
                      int64_t n, const char *what)
{
    int same = memcmp(a->state + a_at, b->state + b_at, (size_t)n) == 0;
    if (!same)
        fprintf(stderr, "rank %d: the %s differ\n", rank, what);
    return same;
}

/* Weights, gradients, master weights, m and v of two runs (the state is laid out the same
 * wherever the optimizer runs: stage.h). */
static int same_state(const struct result *a, const struct result *b)
{
    int64_t S = a->section_bytes;
    return a->state_bytes == b->state_bytes && a->weights_bytes == b->weights_bytes &&
           same_bytes(a, 0, b, 0, a->weights_bytes, "weights") &
               same_bytes(a, a->grads_at, b, b->grads_at, S, "gradients") &
               same_bytes(a, a->master_at, b, b->master_at, S, "master weights") &
               same_bytes(a, a->m_at, b, b->m_at, S, "AdamW m") &
               same_bytes(a, a->v_at, b, b->v_at, S, "AdamW v");
}

static void check_equal(enum model_dtype dtype, int offload, double gbps)
{
    static const enum schedule schedules[2] = {SCHEDULE_1F1B, SCHEDULE_GPIPE};
    model.dtype = dtype;
    for (int si = 0; si < 2; si++) {
        struct run_opts ro = {schedules[si], COST_PLACE_DEVICE, offload, gbps, STEPS,
                              (int64_t)1 << 40, NULL, NULL, 0};
        struct result dev, host;
        struct err e;
        err_clear(&e);
        CU_ASSERT_EQUAL_FATAL(run(&ro, &dev, &e), ERR_OK);
        ro.optimizer = COST_PLACE_HOST;
        CU_ASSERT_EQUAL_FATAL(run(&ro, &host, &e), ERR_OK);
        int same = memcmp(dev.loss, host.loss, sizeof dev.loss) == 0 && same_state(&dev, &host);
        if (use_cuda) /* the GPU's AdamW (nvcc contracts into FMAs) is not the host's bit for
                         bit: the same training, to rounding */
            for (int s = 0; s < STEPS; s++)
                same = (s == 0 || same) &&
                       fabs(dev.loss[s] - host.loss[s]) <= 1e-4 * fabs(dev.loss[s]);
        CU_ASSERT(all_ranks(same));
        /* the device lets go of exactly master, m and v; nothing else moves */
        CU_ASSERT_EQUAL(dev.persistent - host.persistent,
                        (dtype == MODEL_DTYPE_FP32 ? 2 : 3) * dev.section_bytes);
        CU_ASSERT_EQUAL(host.peak, dev.peak - (dev.persistent - host.persistent));
        CU_ASSERT_EQUAL(host.arena - host.peak, dev.arena - dev.peak);
        /* the host: the mirror, 4 fp32 copies, beside what offload holds */
        CU_ASSERT_EQUAL(host.mirror, 4 * host.section_bytes);
        CU_ASSERT_EQUAL(host.host_peak, host.mirror + dev.host_peak);
        CU_ASSERT(host.host_update_ms > 0);
        if (rank == 0)
            printf("\n  %d ranks %s %s%s link %g: loss %.6f; stage 0 device peak %lld "
                   "(optimizer on the device %lld), host peak %lld, host update %.2f ms",
                   size, si ? "gpipe" : "1f1b", model_dtype_name(dtype),
                   offload ? " offload" : "", gbps, host.loss[STEPS - 1], (long long)host.peak,
                   (long long)dev.peak, (long long)host.host_peak, host.host_update_ms);
        free(dev.state);
        free(host.state);
    }
    model.dtype = MODEL_DTYPE_FP32;
}

static void test_equal_fp32(void)
{
    check_equal(MODEL_DTYPE_FP32, 0, 0);
}

static void test_equal_bf16(void)
{
    check_equal(MODEL_DTYPE_BF16, 0, 0);
}

static void test_equal_offload_link(void)
{
    check_equal(MODEL_DTYPE_FP32, 1, 20);
}

/* A shared scratch directory: rank 0 names it. */
static void shared_dir(char *dir, size_t cap)
{
    char name[256] = "";
    if (rank == 0)
        snprintf(name, sizeof name, "%s/hostopt-ckpt", test_tmpdir());
    MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(dir, cap, "%s", name);
}

/* 2 steps with the optimizer at `before`, a checkpoint, 1 more at `after`: every byte of 3
 * straight steps at `after`. */
static void check_resume(enum cost_place before, enum cost_place after)
{
    char dir[256];
    shared_dir(dir, sizeof dir);
    struct err e;
    err_clear(&e);
    struct run_opts straight = {SCHEDULE_1F1B, after, 0, 0, 3, (int64_t)1 << 40, NULL, NULL, 0};
    struct run_opts first = straight, second = straight;
    first.optimizer = before;
    first.steps = 2;
    first.save = dir;
    second.steps = 1;
    second.resume = dir;
    second.start = 2;
    struct result a, b, c;
    CU_ASSERT_EQUAL_FATAL(run(&straight, &a, &e), ERR_OK);
    CU_ASSERT_EQUAL_FATAL(run(&first, &b, &e), ERR_OK);
    MPI_Barrier(MPI_COMM_WORLD);
    CU_ASSERT_EQUAL_FATAL(run(&second, &c, &e), ERR_OK);
    int same = a.loss[2] == c.loss[0] && a.state_bytes == c.state_bytes &&
               memcmp(a.state, c.state, (size_t)a.state_bytes) == 0;
    CU_ASSERT(all_ranks(same));
    free(a.state);
    free(b.state);
    free(c.state);
}

static void test_resume(void)
{
    for (int dtype = 0; dtype < 2; dtype++) {
        model.dtype = dtype ? MODEL_DTYPE_BF16 : MODEL_DTYPE_FP32;
        check_resume(COST_PLACE_HOST, COST_PLACE_HOST);
        if (use_cuda) /* the GPU's AdamW is not the host's bit for bit */
            continue;
        /* a checkpoint is the same state wherever the optimizer ran */
        check_resume(COST_PLACE_DEVICE, COST_PLACE_HOST);
        check_resume(COST_PLACE_HOST, COST_PLACE_DEVICE);
    }
    model.dtype = MODEL_DTYPE_FP32;
}

/* A device limit of the host-optimizer stage's arenas: it fits (the limit counts its weights
 * and gradients, layer by layer), and the device optimizer's stage does not. */
static void test_device_limit(void)
{
    struct run_opts ro = {SCHEDULE_1F1B, COST_PLACE_HOST, 0, 0, 1, (int64_t)1 << 40, NULL,
                          NULL, 0};
    struct result host, dev;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(run(&ro, &host, &e), ERR_OK);
    int64_t most = host.arena;
    MPI_Allreduce(&host.arena, &most, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    free(host.state); /* run again under the limit */
    device_limit = most;
    CU_ASSERT_EQUAL(run(&ro, &host, &e), ERR_OK);
    ro.optimizer = COST_PLACE_DEVICE;
    CU_ASSERT_EQUAL(run(&ro, &dev, &e), ERR_NOFIT);
    device_limit = (int64_t)1 << 40;
    free(host.state);
}

static void test_host_limit(void)
{
    struct run_opts ro = {SCHEDULE_1F1B, COST_PLACE_HOST, 0, 0, 1, 1000, NULL, NULL, 0};
    struct result res;
    struct err e;
    err_clear(&e);
    int rc = run(&ro, &res, &e);
    CU_ASSERT_EQUAL(rc, ERR_INPUT);
    CU_ASSERT_EQUAL(e.code, ERR_INPUT); /* every rank: each stage needs more than 1000 */
    CU_ASSERT(strstr(e.msg, "over its host_limit_bytes 1000") != NULL);
    CU_ASSERT(strstr(e.msg, "a mirror of") != NULL);
    if (rank == 0)
        printf("\n  %s", e.msg);
}

int main(int argc, char **argv)
{
    use_cuda = argc > 1 && strcmp(argv[1], "--cuda") == 0;
    if (use_cuda)
        gpu_require("test_host_mirror --cuda");
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("host optimizer", NULL, NULL);
    CU_add_test(s, "fp32: bitwise the device optimizer's", test_equal_fp32);
    CU_add_test(s, "bf16: bitwise the device optimizer's", test_equal_bf16);
    CU_add_test(s, "beside offload, through an emulated link", test_equal_offload_link);
    CU_add_test(s, "resumed from a checkpoint: bitwise", test_resume);
    CU_add_test(s, "a device limit that only the host optimizer fits", test_device_limit);
    CU_add_test(s, "host limit below the mirror: refused with the numbers", test_host_limit);
    return mpi_test_main();
}
