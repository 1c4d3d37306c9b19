/* The pipeline schedule as the simulator runs it equals the schedule as the executor runs it:
 * for every schedule, S in 1..9 GPUs, M in 1..17 and v in 1..4 chunks a GPU (interleaved; 2
 * for v-half), each GPU's forwards, backwards and weight passes in the order the simulator
 * timed them (its task list) against the order the executor ran them (its spans, reported as
 * they end) on a tiny GPT on the CPU backend, one GPU at a time with a port that stands in for
 * its neighbours. The executor also holds no more micro-batches than the in-flight count the
 * planner sizes each chunk's activations by, reuses a slot only once its micro-batch's last
 * pass there is done, and the reruns of a recomputed stage are the simulator's recompute
 * tasks. */
#include <CUnit/CUnit.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "exec.h"
#include "sim.h"
#include "testutil.h"

#define S_MAX 9
#define M_MAX 17
#define V_MAX 4
#define OPS_MAX (V_MAX * M_MAX * 4)

/* The model of a pipeline of V virtual stages: enough blocks for one planning layer each
 * (3 at least: embed, a block, head). */
static struct model tiny_of(int V)
{
    return (struct model){.n_layer = V > 3 ? V - 2 : 1, .n_embd = 8, .n_head = 2,
                          .seq_len = 4, .vocab_size = 16, .micro_batch = 1,
                          .dtype = MODEL_DTYPE_FP32};
}

/* One op as someone ran it: forward, recompute, backward or weight pass of a micro-batch on
 * virtual stage vstage. */
struct rec {
    int kind, vstage, micro;
};

struct recording {
    struct rec ops[OPS_MAX];
    int n;
    /* per chunk: micro-batches between their input and their last pass there */
    int live[V_MAX], most_live[V_MAX];
    int slot_owner[V_MAX][M_MAX]; /* per chunk and slot, the micro-batch in it, -1 none */
    int slot_clash;
    const char *zeros;
};

/* A chunk's first layer marks a forward and a backward, its last one the recompute that
 * starts a backward, and any layer a weight pass (one per op: the chunk's last split layer
 * runs it first). */
static void record_span(struct executor *x, int kind, int micro, int li, double ms)
{
    struct recording *r = x->c.ctx;
    const struct layout_chunk *ch = &x->c.lay->chunks[x->c.lay->layers[li].chunk];
    int mark = kind == STAGE_EV_RECOMPUTE ? li == ch->hi - 1
               : kind == STAGE_EV_WEIGHT  ? !(r->n > 0 && r->ops[r->n - 1].kind == kind &&
                                             r->ops[r->n - 1].micro == micro &&
                                             r->ops[r->n - 1].vstage == ch->vstage)
                                          : li == ch->lo;
    (void)ms;
    if (mark)
        r->ops[r->n++] = (struct rec){kind, ch->vstage, micro};
}

static int fake_input(struct executor *x, int micro, struct err *e)
{
    struct recording *r = x->c.ctx;
    const struct layout_chunk *ch = &x->c.lay->chunks[x->chunk];
    int slot = micro % ch->in_flight;
    r->slot_clash += r->slot_owner[x->chunk][slot] >= 0;
    r->slot_owner[x->chunk][slot] = micro;
    if (++r->live[x->chunk] > r->most_live[x->chunk])
        r->most_live[x->chunk] = r->live[x->chunk];
    struct layer_view v;
    exec_view(x, ch->lo, micro, &v);
    ERR_TRY(exec_mem_add(x, ch->slot_bytes, e));
    /* tokens 0, or a zero activation; the head's targets 0 */
    int64_t BT = (int64_t)x->c.model->micro_batch * x->c.model->seq_len;
    ERR_TRY(x->c.be->ops->upload(x->c.be, v.kept[0], r->zeros,
                                 v.kind == MODEL_LAYER_EMBED ? 4 * BT
                                                             : exec_boundary_bytes(x->c.model),
                                 e));
    exec_view(x, ch->hi - 1, micro, &v);
    if (v.kind == MODEL_LAYER_HEAD)
        ERR_TRY(x->c.be->ops->upload(x->c.be, v.kept[HEAD_TARGETS], r->zeros, 4 * BT, e));
    return ERR_OK;
}

static int fake_grad(struct executor *x, int micro, void *dst, struct err *e)
{
    struct recording *r = x->c.ctx;
    (void)micro;
    return x->c.be->ops->upload(x->c.be, dst, r->zeros, exec_boundary_bytes(x->c.model), e);
}

static int fake_isend(struct executor *x, const void *buf, int64_t bytes, int peer, int micro,
                      int *req, struct err *e)
{
    (void)x, (void)buf, (void)bytes, (void)peer, (void)e;
    *req = micro;
    return ERR_OK;
}

static int fake_wait(struct executor *x, int req, struct err *e)
{
    (void)x, (void)req, (void)e;
    return ERR_OK;
}

static int fake_done(struct executor *x, int micro, struct err *e)
{
    struct recording *r = x->c.ctx;
    (void)e;
    r->slot_owner[x->chunk][micro % x->c.lay->chunks[x->chunk].in_flight] = -1;
    r->live[x->chunk]--;
    return ERR_OK;
}

static const struct exec_port fake_port = {fake_input, fake_grad, fake_isend, fake_wait,
                                           fake_done, NULL, NULL};

static uint32_t full_regen(const struct model *m, int layer)
{
    return sizes_full_regen(m, model_layer_kind(m, layer));
}

/* Whether virtual stage j, recomputed, reruns a forward before its backward: its last layer
 * does. */
static int reruns(const struct model *m, int V, int j)
{
    int first, last;
    cluster_even_split(model_layer_count(m), V, j, &first, &last);
    return full_regen(m, last) != 0;
}

/* GPU g's chunks as the planner lays them out: virtual stage j holds layers of an even split,
 * recomputed whole or kept (its blocks' backward split where the schedule splits it). */
static int lay_out(const struct schedule_shape *sh, const struct model *m, int g, int recompute,
                   struct stage_layout *lay, struct err *e)
{
    int V = schedule_virtual_stages(sh), flights[S_MAX * V_MAX], n = 0;
    struct layout_chunk_spec spec[V_MAX];
    struct layout_place place[64] = {0};
    ERR_TRY(schedule_in_flights(sh, flights, e));
    for (int c = 0; c < sh->chunks; c++) {
        int j = schedule_vstage(sh, g, c);
        spec[c] = (struct layout_chunk_spec){0, 0, j, flights[j]};
        cluster_even_split(model_layer_count(m), V, j, &spec[c].first, &spec[c].last);
        for (int l = spec[c].first; l <= spec[c].last; l++, n++) {
            place[n].regen = recompute ? full_regen(m, l) : 0;
            place[n].split = schedule_splits(sh->kind) && !recompute &&
                             model_layer_kind(m, l) == MODEL_LAYER_BLOCK;
        }
    }
    struct layout_spec ls = {.chunks = spec, .n_chunks = sh->chunks, .place = place};
    return layout_stage(lay, m, &ls, e);
}

/* Runs GPU g's step on the executor and records its ops. */
static int run_executor(struct backend *be, const struct schedule_shape *sh, int g,
                        int recompute, struct recording *r)
{
    struct err e;
    struct stage_layout lay;
    struct model m = tiny_of(schedule_virtual_stages(sh));
    err_clear(&e);
    if (lay_out(sh, &m, g, recompute, &lay, &e))
        return e.code;
    char *arena[4] = {NULL, NULL, NULL, NULL};
    int64_t bytes[4] = {lay.persistent_bytes, lay.activation_bytes, lay.transient_bytes,
                        lay.workspace_bytes};
    int rc = ERR_OK;
    for (int a = 0; a < 4 && rc == ERR_OK; a++)
        rc = be->ops->alloc(be, bytes[a] > 0 ? bytes[a] : 64, (void **)&arena[a], &e);
    if (rc == ERR_OK)
        rc = be->ops->zero(be, arena[0], lay.persistent_bytes, &e);
    memset(r, 0, sizeof *r);
    memset(r->slot_owner, 0xff, sizeof r->slot_owner);
    static const char zeros[4096];
    r->zeros = zeros;
    struct exec_config c = {.model = &m, .lay = &lay, .persistent = arena[0],
                            .activations = arena[1], .transient = arena[2],
                            .workspace = arena[3], .be = be, .port = &fake_port, .ctx = r,
                            .schedule = sh->kind, .stage = g, .n_stages = sh->gpus,
                            .micro_batches = sh->micro_batches, .limit_bytes = INT64_MAX,
                            .on_span = record_span};
    struct executor x;
    if (rc == ERR_OK && (rc = exec_init(&x, &c, &e)) == ERR_OK) {
        rc = exec_run(&x, &e);
        exec_free(&x);
    }
    if (rc)
        fprintf(stderr, "\nexecutor, %s GPU %d of %d, v %d, M %d: %s\n",
                schedule_name(sh->kind), g, sh->gpus, sh->chunks, sh->micro_batches, e.msg);
    for (int a = 0; a < 4; a++)
        if (arena[a] != NULL)
            be->ops->release(be, arena[a]);
    layout_free(&lay);
    return rc;
}

/* GPU g's compute tasks in the order the simulator ran them (a stage without a split layer
 * has empty weight passes, which the executor runs as nothing). */
static int sim_ops(const struct schedule_shape *sh, const struct sim_stage *st,
                   const struct sim_result *res, int g, struct rec *ops)
{
    static const int kind[] = {[SIM_FORWARD] = STAGE_EV_FORWARD,
                               [SIM_RECOMPUTE] = STAGE_EV_RECOMPUTE,
                               [SIM_BACKWARD] = STAGE_EV_BACKWARD,
                               [SIM_WEIGHT] = STAGE_EV_WEIGHT};
    int n = 0;
    for (int i = 0; i < res->n_tasks; i++) {
        const struct sim_task *t = &res->tasks[i];
        int chunk, compute = t->kind <= SIM_BACKWARD ||
                             (t->kind == SIM_WEIGHT && st[t->stage].w_ms > 0);
        if (compute && schedule_gpu(sh, t->stage, &chunk) == g)
            ops[n++] = (struct rec){kind[t->kind], t->stage, t->micro};
    }
    return n;
}

/* The simulated stages: times that differ per stage so that the order matters; a weight pass
 * where a stage's layers split (a block), a recompute where it reruns. */
static void sim_stages(const struct schedule_shape *sh, const struct model *m, int recompute,
                       struct sim_stage *st)
{
    int V = schedule_virtual_stages(sh);
    for (int j = 0; j < V; j++) {
        int first, last, blocks = 0;
        cluster_even_split(model_layer_count(m), V, j, &first, &last);
        for (int l = first; l <= last; l++)
            blocks += model_layer_kind(m, l) == MODEL_LAYER_BLOCK;
        st[j] = (struct sim_stage){
            .fwd_ms = 1 + j % 3, .bwd_ms = 2 + j % 2,
            .w_ms = schedule_splits(sh->kind) && !recompute && blocks > 0 ? 1 : 0,
            .recompute_ms = recompute && reruns(m, V, j) ? 0.5 : 0};
    }
}

static void compare(enum schedule sch, int S, int v, int recompute, int *failures)
{
    struct backend be;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(backend_cpu_init(&be, 1, &e) == ERR_OK);
    for (int M = 1; M <= M_MAX; M++) {
        struct schedule_shape sh = schedule_shape_of(sch, S, v, M);
        struct model m = tiny_of(S * v);
        struct sim_stage st[S_MAX * V_MAX];
        struct sim_result res;
        int flights[S_MAX * V_MAX];
        sim_stages(&sh, &m, recompute, st);
        CU_ASSERT_FATAL(sim_run_shape(&sh, st, &res, &e) == ERR_OK);
        CU_ASSERT_FATAL(schedule_in_flights(&sh, flights, &e) == ERR_OK);
        for (int g = 0; g < S; g++) {
            struct rec want[OPS_MAX];
            struct recording got;
            int n = sim_ops(&sh, st, &res, g, want);
            int rc = run_executor(&be, &sh, g, recompute, &got);
            int same = rc == ERR_OK && got.n == n && memcmp(got.ops, want, sizeof *want * n) == 0;
            CU_ASSERT(same);
            CU_ASSERT_EQUAL(got.slot_clash, 0);
            for (int c = 0; c < v; c++) {
                CU_ASSERT_EQUAL(got.most_live[c], flights[schedule_vstage(&sh, g, c)]);
                CU_ASSERT_EQUAL(got.live[c], 0);
            }
            if (!same && (*failures)++ < 5) {
                fprintf(stderr, "\n%s S %d v %d M %d GPU %d: simulator / executor:\n",
                        schedule_name(sch), S, v, M, g);
                for (int i = 0; i < n || i < got.n; i++)
                    fprintf(stderr, "  %d:%d:%d / %d:%d:%d\n", i < n ? want[i].kind : -1,
                            i < n ? want[i].vstage : -1, i < n ? want[i].micro : -1,
                            i < got.n ? got.ops[i].kind : -1, i < got.n ? got.ops[i].vstage : -1,
                            i < got.n ? got.ops[i].micro : -1);
            }
        }
        sim_result_free(&res);
    }
    be.ops->free(&be);
}

static void test_one_chunk(void)
{
    int failures = 0;
    for (int S = 1; S <= S_MAX; S++) {
        compare(SCHEDULE_1F1B, S, 1, 0, &failures);
        compare(SCHEDULE_GPIPE, S, 1, 0, &failures);
        compare(SCHEDULE_ZB_H1, S, 1, 0, &failures);
    }
}

static void test_chunks(void)
{
    int failures = 0;
    for (int S = 1; S <= S_MAX; S++) {
        for (int v = 1; v <= V_MAX; v++)
            compare(SCHEDULE_INTERLEAVED, S, v, 0, &failures);
        compare(SCHEDULE_V_HALF, S, 2, 0, &failures);
    }
}

static void test_recomputed(void)
{
    int failures = 0;
    for (int S = 1; S <= 4; S++) {
        compare(SCHEDULE_1F1B, S, 1, 1, &failures);
        compare(SCHEDULE_GPIPE, S, 1, 1, &failures);
        compare(SCHEDULE_ZB_H1, S, 1, 1, &failures);
        compare(SCHEDULE_INTERLEAVED, S, 2, 1, &failures);
        compare(SCHEDULE_V_HALF, S, 2, 1, &failures);
    }
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("schedule", NULL, NULL);
    CU_add_test(s, "1F1B, GPipe, ZB-H1: simulator's op order = executor's, S 1..9, M 1..17",
                test_one_chunk);
    CU_add_test(s, "interleaved (v 1..4), v-half: simulator's op order = executor's, S 1..9, "
                   "M 1..17", test_chunks);
    CU_add_test(s, "recomputed stages: the reruns where the simulator puts them",
                test_recomputed);
    return test_main();
}
