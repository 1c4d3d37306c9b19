/* The pipeline schedule as the simulator runs it equals the schedule as the executor runs it:
 * for every S in 1..9, M in 1..17 and both schedules, each stage's forwards and backwards in
 * the order the simulator timed them (its task list) against the order the executor ran them
 * (its spans, reported as they end) on a tiny GPT on the CPU backend, one stage at a time
 * with a port that stands in for its neighbours. The executor also holds no more micro-batches
 * than the in-flight count the planner sizes the activations by, reuses a slot only once its
 * micro-batch's backward is done, and the reruns of a recomputed stage are the simulator's
 * recompute tasks. */
#include <CUnit/CUnit.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "sim.h"
#include "testutil.h"

#define S_MAX 9
#define M_MAX 17

static const struct model tiny = {.n_layer = 1, .n_embd = 8, .n_head = 2, .seq_len = 4,
                                  .vocab_size = 16, .micro_batch = 1, .dtype = MODEL_DTYPE_FP32};

/* One op as someone ran it: forward, recompute or backward of a micro-batch. */
struct rec {
    int kind, micro;
};

struct recording {
    struct rec ops[4 * M_MAX];
    int n;
    int live, most_live;   /* micro-batches between their input and the end of their backward */
    int slot_owner[M_MAX]; /* per slot, the micro-batch in it, -1 none */
    int slot_clash;
    const char *zeros;
};

/* The stage's first layer marks a forward and a backward, its last one the recompute that
 * starts a backward. */
static void record_span(struct executor *x, int kind, int micro, int li, double ms)
{
    struct recording *r = x->c.ctx;
    int first_of_backward = li == x->c.lay->n_layers - 1;
    if (kind == STAGE_EV_RECOMPUTE ? first_of_backward : li == 0)
        r->ops[r->n++] = (struct rec){kind, micro};
}

static int fake_input(struct executor *x, int micro, struct err *e)
{
    struct recording *r = x->c.ctx;
    int slot = micro % x->c.lay->in_flight;
    r->slot_clash += r->slot_owner[slot] >= 0;
    r->slot_owner[slot] = micro;
    if (++r->live > r->most_live)
        r->most_live = r->live;
    struct layer_view v;
    exec_view(x, 0, micro, &v);
    ERR_TRY(exec_mem_add(x, x->c.lay->slot_bytes, e));
    /* tokens 0, or a zero activation; the head's targets 0 */
    int64_t BT = (int64_t)tiny.micro_batch * tiny.seq_len;
    ERR_TRY(x->c.be->ops->upload(x->c.be, v.kept[0], r->zeros,
                                 v.kind == MODEL_LAYER_EMBED ? 4 * BT : exec_boundary_bytes(&tiny),
                                 e));
    exec_view(x, x->c.lay->n_layers - 1, micro, &v);
    if (v.kind == MODEL_LAYER_HEAD)
        ERR_TRY(x->c.be->ops->upload(x->c.be, v.kept[HEAD_TARGETS], r->zeros, 4 * BT, e));
    return ERR_OK;
}

static int fake_grad(struct executor *x, int micro, void *dst, struct err *e)
{
    struct recording *r = x->c.ctx;
    return x->c.be->ops->upload(x->c.be, dst, r->zeros, exec_boundary_bytes(x->c.model), e);
}

static int fake_isend(struct executor *x, const void *buf, int64_t bytes, int peer, int micro,
                      int *req, struct err *e)
{
    *req = micro;
    return ERR_OK;
}

static int fake_wait(struct executor *x, int req, struct err *e)
{
    return ERR_OK;
}

static int fake_done(struct executor *x, int micro, struct err *e)
{
    struct recording *r = x->c.ctx;
    r->slot_owner[micro % x->c.lay->in_flight] = -1;
    r->live--;
    return ERR_OK;
}

static const struct exec_port fake_port = {fake_input, fake_grad, fake_isend, fake_wait,
                                           fake_done, NULL, NULL};

/* Stage s of S as the planner would cut the tiny model's three layers: the embedding first,
 * the head last, the block between (all three on one stage). */
static void stage_layers(int S, int s, int *first, int *last)
{
    *first = S == 1 ? 0 : s == 0 ? 0 : s == S - 1 ? 2 : 1;
    *last = S == 1 ? 2 : s == 0 ? 0 : s == S - 1 ? 2 : 1;
}

static uint32_t full_regen(int layer)
{
    return sizes_full_regen(&tiny, model_layer_kind(&tiny, layer));
}

/* Whether stage s, recomputed, reruns a forward before its backward: its last layer does. */
static int reruns(int S, int s)
{
    int first, last;
    stage_layers(S, s, &first, &last);
    return full_regen(last) != 0;
}

/* Runs stage s's step on the executor and records its ops. */
static int run_executor(struct backend *be, enum schedule sch, int S, int s, int M, int recompute,
                        struct recording *r)
{
    struct err e;
    struct stage_layout lay;
    int first, last;
    stage_layers(S, s, &first, &last);
    uint32_t regen[3];
    for (int l = first; l <= last; l++)
        regen[l - first] = recompute ? full_regen(l) : 0;
    err_clear(&e);
    if (layout_init(&lay, &tiny, first, last, regen, schedule_in_flight(sch, S, s, M), &e))
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
    for (int k = 0; k < M_MAX; k++)
        r->slot_owner[k] = -1;
    static const char zeros[4096];
    r->zeros = zeros;
    struct exec_config c = {.model = &tiny, .lay = &lay, .persistent = arena[0],
                            .activations = arena[1], .transient = arena[2],
                            .workspace = arena[3], .be = be, .port = &fake_port, .ctx = r,
                            .schedule = sch, .stage = s, .n_stages = S, .micro_batches = M,
                            .limit_bytes = INT64_MAX, .on_span = record_span};
    struct executor x;
    if (rc == ERR_OK && (rc = exec_init(&x, &c, &e)) == ERR_OK) {
        rc = exec_run(&x, &e);
        exec_free(&x);
    }
    if (rc)
        fprintf(stderr, "\nexecutor, stage %d of %d, M %d: %s\n", s, S, M, e.msg);
    for (int a = 0; a < 4; a++)
        if (arena[a] != NULL)
            be->ops->release(be, arena[a]);
    layout_free(&lay);
    return rc;
}

/* Stage s's compute tasks in the order the simulator ran them. */
static int sim_ops(const struct sim_result *res, int s, struct rec *ops)
{
    static const int kind[] = {[SIM_FORWARD] = STAGE_EV_FORWARD,
                               [SIM_RECOMPUTE] = STAGE_EV_RECOMPUTE,
                               [SIM_BACKWARD] = STAGE_EV_BACKWARD};
    int n = 0;
    for (int i = 0; i < res->n_tasks; i++) {
        const struct sim_task *t = &res->tasks[i];
        if (t->stage == s && t->kind != SIM_SEND_FORWARD && t->kind != SIM_SEND_BACKWARD)
            ops[n++] = (struct rec){kind[t->kind], t->micro};
    }
    return n;
}

static void compare(enum schedule sch, int S, int recompute)
{
    struct backend be;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(backend_cpu_init(&be, 1, &e) == ERR_OK);
    struct sim_stage st[S_MAX];
    for (int s = 0; s < S; s++) /* times that differ per stage, so that the order matters */
        st[s] = (struct sim_stage){.fwd_ms = 1 + s % 3, .bwd_ms = 2 + s % 2,
                                   .recompute_ms = recompute && reruns(S, s) ? 0.5 : 0};
    int failures = 0;
    for (int M = 1; M <= M_MAX; M++) {
        struct sim_result res;
        CU_ASSERT_FATAL(sim_run(sch, S, M, st, &res, &e) == ERR_OK);
        for (int s = 0; s < S; s++) {
            struct rec want[4 * M_MAX];
            struct recording got;
            int n = sim_ops(&res, s, want);
            int rc = run_executor(&be, sch, S, s, M, recompute, &got);
            int same = rc == ERR_OK && got.n == n && memcmp(got.ops, want, sizeof *want * n) == 0;
            CU_ASSERT(same);
            CU_ASSERT_EQUAL(n, (recompute && reruns(S, s) ? 3 : 2) * M);
            CU_ASSERT_EQUAL(got.most_live, schedule_in_flight(sch, S, s, M));
            CU_ASSERT_EQUAL(got.slot_clash, 0);
            CU_ASSERT_EQUAL(got.live, 0);
            if (!same && failures++ < 5) {
                fprintf(stderr, "\n%s S %d M %d stage %d: simulator / executor:\n",
                        schedule_name(sch), S, M, s);
                for (int i = 0; i < n || i < got.n; i++)
                    fprintf(stderr, "  %d:%d / %d:%d\n", i < n ? want[i].kind : -1,
                            i < n ? want[i].micro : -1, i < got.n ? got.ops[i].kind : -1,
                            i < got.n ? got.ops[i].micro : -1);
            }
        }
        sim_result_free(&res);
    }
    be.ops->free(&be);
}

static void test_1f1b(void)
{
    for (int S = 1; S <= S_MAX; S++)
        compare(SCHEDULE_1F1B, S, 0);
}

static void test_gpipe(void)
{
    for (int S = 1; S <= S_MAX; S++)
        compare(SCHEDULE_GPIPE, S, 0);
}

static void test_recomputed(void)
{
    for (int S = 1; S <= 4; S++) {
        compare(SCHEDULE_1F1B, S, 1);
        compare(SCHEDULE_GPIPE, S, 1);
    }
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("schedule", NULL, NULL);
    CU_add_test(s, "1F1B: simulator's op order = executor's, S 1..9, M 1..17", test_1f1b);
    CU_add_test(s, "GPipe: simulator's op order = executor's, S 1..9, M 1..17", test_gpipe);
    CU_add_test(s, "recomputed stages: the reruns where the simulator puts them",
                test_recomputed);
    return test_main();
}
