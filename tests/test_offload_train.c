/* Offload in the executor (exec.h), under `mpirun -np 1|2|4`: stages built directly from
 * stage configs (the plan's mapping is train.c's), trained with and without offload.
 *   - any offload mix (whole layers, per-tensor options, beside recomputation), 1F1B and
 *     GPipe, with and without an emulated host link: losses and every byte of the stage's
 *     state (weights, gradients, AdamW moments) identical to keeping everything;
 *   - the measured device peak equal to the layout's arenas (as it is when nothing is
 *     offloaded), and the host peak equal to the bytes that left the slots times the
 *     micro-batches the schedule holds in flight;
 *   - on a link slower than one layer's backward, prefetches one layer ahead arrive late;
 *     they move earlier step by step until nothing stalls;
 *   - a host limit below the offloaded bytes: ERR_NOFIT on every rank, with the numbers;
 *   - streamed weights (the optimizer on the host, every layer's or the last layer's weights
 *     and gradients fetched for each use), alone and beside every offload mix, 1F1B and
 *     GPipe, fp32 and bf16: losses and every byte of the state identical to keeping
 *     everything on the device; the device peak the host optimizer's less the streamed
 *     layers' weights and gradients plus the weights buffers, the host peak its mirror plus
 *     the streamed weights' copy; a device limit only streaming fits.
 * With --cuda (a GPU test), the stages run on cuda:0: pinned host slots, copy streams. */
#include <CUnit/CUnit.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cost.h"
#include "data.h"
#include "gpu.h"
#include "schedule.h"
#include "stage.h"
#include "mpitest.h"
#include "testutil.h"
#include "transport.h"

/* embedding, 4 blocks, head: global layers 0..5 */
static const struct model tiny = {.n_layer = 4, .n_embd = 32, .n_head = 2, .seq_len = 16,
                                  .vocab_size = 64, .micro_batch = 2, .dtype = MODEL_DTYPE_FP32};
/* the same layers, wider: milliseconds of compute per layer, well above scheduling noise */
static const struct model wide = {.n_layer = 4, .n_embd = 128, .n_head = 4, .seq_len = 64,
                                  .vocab_size = 64, .micro_batch = 4, .dtype = MODEL_DTYPE_FP32};
static const struct model *model = &tiny;
#define N_LAYERS 6
#define MICRO 4
#define STEPS 3
#define HOST 1 /* COST_PLACE_HOST in the plan's terms */

static int rank, size;
static int use_cuda; /* --cuda: the stages on cuda:0 (the GPU test) */

/* One offload mix, by global layer. */
struct mix {
    const char *name;
    const char *recompute[N_LAYERS]; /* NULL keep, "full", or an option's name */
    unsigned char place[N_LAYERS];
    const char *option[N_LAYERS]; /* offload_option by name, NULL none */
};

static const struct mix keep_all = {"keep everything", {0}, {0}, {0}};
static const struct mix mixes[] = {
    {"whole layers", {0}, {HOST, HOST, HOST, HOST, HOST, HOST}, {0}},
    {"per tensor", {0}, {0}, {NULL, "attn", "mlp", "attn+mlp", "attn", NULL}},
    {"beside recompute",
     {NULL, "full", "attn", NULL, "full", "full"},
     {0, HOST, HOST, 0, 0, HOST},
     {NULL, NULL, NULL, "mlp", NULL, NULL}},
};

struct result {
    double loss[16];
    unsigned char *state; /* the persistent arena */
    int64_t state_bytes, peak, arena, host_peak, host_bytes, slot_bytes, staging;
    int64_t persistent, wbufs, streamed; /* the device's state; streaming's buffers, weights */
    int in_flight;
    int64_t layer_slot[N_LAYERS]; /* each layer's bytes in a slot, by index in the stage */
    double stall[16], copy_ms[16];
    int late[16];
    double bwd_ms; /* per layer-op of backward, the last step */
    int ahead;     /* the most any layer's prefetch starts ahead, at the end */
};

static void split(int stage, int n_stages, int *first, int *last)
{
    static const int bounds[3][5] = {{0, 6}, {0, 3, 6}, {0, 2, 4, 5, 6}};
    const int *b = bounds[n_stages == 1 ? 0 : n_stages == 2 ? 1 : 2];
    *first = b[stage];
    *last = b[stage + 1] - 1;
}

static uint32_t regen_of(int layer, const char *choice)
{
    uint32_t r = 0;
    enum model_layer_kind kind = model_layer_kind(model, layer);
    if (choice == NULL)
        return 0;
    if (strcmp(choice, "full") == 0)
        return sizes_full_regen(model, kind);
    if (kind == MODEL_LAYER_BLOCK)
        sizes_find_option(model, kind, choice, &r);
    return r;
}

static signed char option_of(int layer, const char *name)
{
    struct sizes_option o[SIZES_OPTIONS_MAX];
    int n = sizes_recompute_options(model, model_layer_kind(model, layer), o);
    for (int k = 0; name != NULL && k < n; k++)
        if (strcmp(o[k].name, name) == 0)
            return (signed char)k;
    return -1;
}

struct run_opts {
    enum schedule schedule;
    double gbps;       /* emulated link, 0 none */
    int ahead, depth;  /* prefetch_ahead of every layer, prefetch_depth */
    int steps;
    int64_t host_limit;
    int solo; /* each rank trains the whole model alone (MPI_COMM_SELF) */
    enum cost_place optimizer;
    int stream; /* the stage's last layers streaming their weights: 0 none, -1 all */
    int64_t limit; /* the device limit (0: none) */
};

/* Trains the mix on this rank's stage; returns stage_init's status (every rank's worst). */
static int run(const struct mix *mx, const struct run_opts *ro, struct result *res,
               struct err *e)
{
    struct backend be;
    struct transport tp;
    struct data_source data;
    struct stage_runner r;
    MPI_Comm comm = ro->solo ? MPI_COMM_SELF : MPI_COMM_WORLD;
    int stage = ro->solo ? 0 : rank, n_stages = ro->solo ? 1 : size;
    memset(res, 0, sizeof *res);
    if (use_cuda) {
        CU_ASSERT_FATAL(backend_cuda_init(&be, 0, e) == ERR_OK);
        CU_ASSERT_FATAL(transport_staged_init(&tp, &comm, 4 * MICRO + 8, &be,
                                              exec_boundary_bytes(model), e) == ERR_OK);
    } else {
        CU_ASSERT_FATAL(backend_cpu_init(&be, 1, e) == ERR_OK);
        CU_ASSERT_FATAL(transport_mpi_init(&tp, &comm, 4 * MICRO + 8, e) == ERR_OK);
    }
    CU_ASSERT_FATAL(data_init_synthetic(&data, model, 7, e) == ERR_OK);
    int first, last;
    split(stage, n_stages, &first, &last);
    int n = last - first + 1;
    struct layout_place place[N_LAYERS];
    for (int li = 0; li < n; li++) {
        int layer = first + li;
        place[li] = (struct layout_place){.regen = regen_of(layer, mx->recompute[layer]),
                                          .ahead = ro->ahead};
        if (layout_offload_mask(model, layer, li == 0, place[li].regen, mx->place[layer],
                                option_of(layer, mx->option[layer]), &place[li].offload, e))
            return e->code;
    }
    struct stage_config c = {
        .model = model,
        .stage = stage,
        .n_stages = n_stages,
        .micro_batches = MICRO,
        .schedule = ro->schedule,
        .first = first,
        .last = last,
        .place = place,
        .in_flight = schedule_in_flight(ro->schedule, n_stages, stage, MICRO),
        .adamw = adamw_params_gpt(1e-3f),
        .limit_bytes = ro->limit > 0 ? ro->limit : (int64_t)1 << 40,
        .optimizer = ro->optimizer,
        .stream_layers = ro->stream < 0 ? n : ro->stream,
        .host_threads = 1,
        .prefetch_depth = ro->depth,
        .host_limit_bytes = ro->host_limit,
        .host_link_gbps = ro->gbps,
        .host_link_latency_us = ro->gbps > 0 ? 10 : 0,
    };
    int rc = stage_init(&r, &c, &be, &tp, &data, 1234, e), worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, comm);
    if (worst == ERR_OK) {
        MPI_Barrier(comm);
        for (int s = 0; s < ro->steps; s++) {
            double loss = 0;
            int step_rc = stage_step(&r, s, &loss, e);
            if (step_rc != ERR_OK)
                fprintf(stderr, "rank %d, %s, step %d: %s\n", rank, mx->name, s, e->msg);
            CU_ASSERT_EQUAL_FATAL(step_rc, ERR_OK);
            MPI_Bcast(&loss, 1, MPI_DOUBLE, n_stages - 1, comm);
            res->loss[s] = loss;
            res->stall[s] = r.x.times.stall;
            res->late[s] = r.x.times.late_prefetches;
            res->copy_ms[s] = r.x.times.copy[0] + r.x.times.copy[1];
        }
        res->bwd_ms = r.x.times.bwd / (MICRO * n);
        res->state_bytes = stage_state_bytes(&r); /* wherever the optimizer and weights are */
        res->persistent = r.lay.persistent_bytes;
        res->wbufs = (int64_t)r.lay.n_wbuf * r.lay.wbuf_bytes;
        res->streamed = r.lay.host_weights_bytes;
        res->state = malloc((size_t)res->state_bytes);
        CU_ASSERT_FATAL(res->state != NULL);
        CU_ASSERT_EQUAL(stage_state_get(&r, 0, res->state, res->state_bytes, e), ERR_OK);
        res->peak = r.x.peak;
        res->arena = r.lay.arena_bytes;
        res->host_peak = r.x.off.host_peak;
        res->host_bytes = r.lay.host_bytes;
        res->slot_bytes = r.lay.slot_bytes;
        res->staging = r.lay.staging_bytes;
        res->in_flight = r.lay.in_flight;
        for (int li = 0; li < n; li++)
            res->layer_slot[li] = r.lay.layers[li].slot_bytes;
        for (int li = 0; r.x.off.ahead != NULL && li < n; li++)
            if (r.x.off.ahead[li] > res->ahead)
                res->ahead = r.x.off.ahead[li];
        stage_free(&r);
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

static void check_mixes(double gbps)
{
    static const enum schedule schedules[2] = {SCHEDULE_1F1B, SCHEDULE_GPIPE};
    for (int si = 0; si < 2; si++) {
        struct run_opts ro = {schedules[si], gbps, 1, 0, STEPS, (int64_t)1 << 40, 0,
                              COST_PLACE_DEVICE, 0, 0};
        struct result base, off;
        struct err e;
        err_clear(&e);
        CU_ASSERT_EQUAL_FATAL(run(&keep_all, &ro, &base, &e), ERR_OK);
        for (size_t k = 0; k < sizeof mixes / sizeof mixes[0]; k++) {
            CU_ASSERT_EQUAL_FATAL(run(&mixes[k], &ro, &off, &e), ERR_OK);
            int same = memcmp(base.loss, off.loss, sizeof base.loss) == 0 &&
                       base.state_bytes == off.state_bytes &&
                       memcmp(base.state, off.state, (size_t)base.state_bytes) == 0;
            CU_ASSERT(all_ranks(same));
            /* the device peak is the layout's arenas, staging buffers included, but for the
             * gap recomputation leaves (the largest transient and workspace need not be live
             * at once): offload adds none */
            /* the host holds what left the slots, for every micro-batch in flight */
            int64_t moved = 0;
            struct result ref;
            struct run_opts once = ro;
            once.steps = 1;
            struct mix recompute_only = mixes[k];
            memset(recompute_only.place, 0, sizeof recompute_only.place);
            memset(recompute_only.option, 0, sizeof recompute_only.option);
            CU_ASSERT_EQUAL_FATAL(run(&recompute_only, &once, &ref, &e), ERR_OK);
            moved = ref.slot_bytes - off.slot_bytes;
            CU_ASSERT_EQUAL(off.host_peak,
                            moved * schedule_in_flight(ro.schedule, size, rank, MICRO));
            CU_ASSERT_EQUAL(off.host_peak, off.host_bytes);
            CU_ASSERT_EQUAL(off.peak, ref.peak - moved * off.in_flight + off.staging);
            CU_ASSERT_EQUAL(off.arena - off.peak, ref.arena - ref.peak);
            /* staging: the cost model's (max prefetch_ahead + 2) x the largest layer's host
             * bytes (cost.h) */
            int first, last;
            int64_t largest = 0;
            split(rank, size, &first, &last);
            for (int l = first; l <= last; l++) {
                int64_t host_l = ref.layer_slot[l - first] - off.layer_slot[l - first];
                largest = host_l > largest ? host_l : largest;
            }
            CU_ASSERT_EQUAL(off.staging, (1 + 2) * largest);
            if (rank == 0)
                printf("\n  %d ranks %s %s link %g: loss %.6f; stage 0 peak %lld (not offloading %lld), "
                       "host peak %lld, staging %lld, copies %.2f ms/step",
                       size, si ? "gpipe" : "1f1b", mixes[k].name, gbps, off.loss[STEPS - 1],
                       (long long)off.peak, (long long)ref.peak, (long long)off.host_peak,
                       (long long)off.staging, off.copy_ms[STEPS - 1]);
            free(ref.state);
            free(off.state);
        }
        free(base.state);
    }
}

static void test_identical(void)
{
    check_mixes(0);
}

static void test_identical_throttled(void)
{
    check_mixes(20);
}

/* One block offloaded whole on GPipe, on one rank (no neighbour to wait for, which would hide
 * copies), with a link that takes about two and a half backward layer-ops to bring the block
 * back: a prefetch one layer-op ahead is late, and moves earlier until nothing stalls. */
static void test_late_prefetch_moves(void)
{
    struct mix one = {"block 2 whole", {0}, {0, 0, HOST}, {0}};
    struct run_opts ro = {SCHEDULE_GPIPE, 0, 1, 10, 2, (int64_t)1 << 40, 1, COST_PLACE_DEVICE,
                          0, 0};
    struct result res;
    struct err e;
    err_clear(&e);
    if (size > 1 || use_cuda) { /* timing wants the cores to itself; the link is emulated on
                                   the CPU only */
        printf(" (skipped on %d ranks%s)", size, use_cuda ? ", CUDA" : "");
        return;
    }
    model = &wide;
    CU_ASSERT_EQUAL_FATAL(run(&keep_all, &ro, &res, &e), ERR_OK);
    double b = res.bwd_ms;
    free(res.state);
    /* block 2's kept bytes per micro-batch */
    struct sizes_tensor kept[SIZES_TENSORS_MAX];
    int n_kept = sizes_layer_tensors(model, MODEL_LAYER_BLOCK, SIZES_KEPT, kept);
    int64_t bytes = 0;
    for (int k = 0; k < n_kept; k++)
        bytes += sizes_tensor_bytes(&kept[k]);
    ro.gbps = (double)bytes * 8 / (2.5 * b * 1e6);
    ro.steps = 12;
    CU_ASSERT_EQUAL_FATAL(run(&one, &ro, &res, &e), ERR_OK);
    int first_late = -1, calm = -1;
    for (int s = 0; s < ro.steps; s++) {
        if (first_late < 0 && res.late[s] > 0)
            first_late = s;
        if (first_late >= 0 && calm < 0 && res.late[s] == 0 && res.stall[s] == 0)
            calm = s;
    }
    printf("\n  rank %d: backward %.3f ms/layer, link %.2f Gbit/s (%.3f ms per copy): "
           "late, stall ms by step:", rank, b, ro.gbps, (double)bytes * 8 / (ro.gbps * 1e6));
    for (int s = 0; s < ro.steps; s++)
        printf(" %d/%.2f", res.late[s], res.stall[s]);
    printf(" (prefetch now %d layer-ops ahead)", res.ahead);
    model = &tiny;
    CU_ASSERT(first_late >= 0 && first_late <= 2);
    CU_ASSERT(calm > first_late && calm <= first_late + 6);
    CU_ASSERT(res.ahead > 1); /* the trigger moved earlier */
    free(res.state);
}

static void test_host_limit(void)
{
    struct run_opts ro = {SCHEDULE_1F1B, 0, 1, 0, 1, 1000, 0, COST_PLACE_DEVICE, 0, 0};
    struct result res;
    struct err e;
    err_clear(&e);
    int rc = run(&mixes[0], &ro, &res, &e);
    CU_ASSERT_EQUAL(rc, ERR_NOFIT);
    if (e.code == ERR_NOFIT) /* the rank that found it names the numbers */
        CU_ASSERT(strstr(e.msg, "over its host_memory_bytes 1000") != NULL);
}

/* Every mix with streamed weights (`stream` of the stage's last layers, -1 all) against keeping
 * everything on the device with the device's optimizer: bitwise; and against the same mix
 * with the optimizer on the host, not streaming: the device peak less exactly the streamed
 * layers' state, plus the weights buffers; the host peak plus exactly the weights' copy. */
static void check_stream(enum model_dtype dtype, int stream, double gbps)
{
    static const enum schedule schedules[2] = {SCHEDULE_1F1B, SCHEDULE_GPIPE};
    struct model m = *model;
    const struct model *saved = model;
    m.dtype = dtype;
    model = &m;
    for (int si = 0; si < 2; si++) {
        struct run_opts ro = {schedules[si], gbps, 1, 0, STEPS, (int64_t)1 << 40, 0,
                              COST_PLACE_DEVICE, 0, 0};
        struct run_opts host = ro, streamed = ro;
        host.optimizer = streamed.optimizer = COST_PLACE_HOST;
        streamed.stream = stream;
        struct result base, plain, st;
        struct err e;
        err_clear(&e);
        CU_ASSERT_EQUAL_FATAL(run(&keep_all, &ro, &base, &e), ERR_OK);
        for (size_t k = 0; k <= sizeof mixes / sizeof mixes[0]; k++) {
            const struct mix *mx = k == 0 ? &keep_all : &mixes[k - 1];
            CU_ASSERT_EQUAL_FATAL(run(mx, &host, &plain, &e), ERR_OK);
            CU_ASSERT_EQUAL_FATAL(run(mx, &streamed, &st, &e), ERR_OK);
            int same = memcmp(base.loss, st.loss, sizeof base.loss) == 0 &&
                       base.state_bytes == st.state_bytes &&
                       memcmp(base.state, st.state, (size_t)base.state_bytes) == 0;
            if (!same)
                fprintf(stderr, "rank %d: %s streamed differs\n", rank, mx->name);
            CU_ASSERT(all_ranks(same));
            CU_ASSERT(st.wbufs > 0 && st.streamed > 0);
            CU_ASSERT_EQUAL(st.peak, plain.peak - (plain.persistent - st.persistent) + st.wbufs);
            CU_ASSERT_EQUAL(st.host_peak, plain.host_peak + st.streamed);
            if (rank == 0)
                printf("\n  %d ranks %s %s %s, streaming %d: loss %.6f; stage 0 device peak "
                       "%lld (not streaming %lld), host peak %lld (%lld)",
                       size, si ? "gpipe" : "1f1b", model_dtype_name(dtype), mx->name, stream,
                       st.loss[STEPS - 1], (long long)st.peak, (long long)plain.peak,
                       (long long)st.host_peak, (long long)plain.host_peak);
            free(plain.state);
            free(st.state);
        }
        free(base.state);
    }
    model = saved;
}

static void test_stream_all(void)
{
    check_stream(MODEL_DTYPE_FP32, -1, 0);
    check_stream(MODEL_DTYPE_BF16, -1, 0);
}

static void test_stream_last(void)
{
    check_stream(MODEL_DTYPE_FP32, 1, 20); /* through an emulated link */
}

/* The whole model on one rank (each rank alone), under a device limit of its arenas with
 * every layer's weights streamed: it trains; with the weights kept on the device (the
 * optimizer on the host all the same) it does not fit. */
static void test_stream_fits(void)
{
    struct run_opts ro = {SCHEDULE_1F1B, 0, 1, 0, 1, (int64_t)1 << 40, 1, COST_PLACE_HOST,
                          -1, 0};
    struct result res;
    struct err e;
    err_clear(&e);
    CU_ASSERT_EQUAL_FATAL(run(&keep_all, &ro, &res, &e), ERR_OK);
    free(res.state);
    ro.limit = res.arena;
    CU_ASSERT_EQUAL(run(&keep_all, &ro, &res, &e), ERR_OK);
    free(res.state);
    ro.stream = 0;
    CU_ASSERT_EQUAL(run(&keep_all, &ro, &res, &e), ERR_NOFIT);
}

int main(int argc, char **argv)
{
    use_cuda = argc > 1 && strcmp(argv[1], "--cuda") == 0;
    if (use_cuda)
        gpu_require("test_offload_train --cuda");
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("offload", NULL, NULL);
    CU_add_test(s, "any offload mix trains bit for bit as keeping everything", test_identical);
    CU_add_test(s, "the same through an emulated host link", test_identical_throttled);
    CU_add_test(s, "late prefetches move earlier until nothing stalls", test_late_prefetch_moves);
    CU_add_test(s, "host memory exceeded: no fit, with the numbers", test_host_limit);
    CU_add_test(s, "streamed weights, every layer's: bit for bit", test_stream_all);
    CU_add_test(s, "streamed weights, the last layer's, through a link: bit for bit",
                test_stream_last);
    CU_add_test(s, "a device limit only streamed weights fit", test_stream_fits);
    return mpi_test_main();
}
