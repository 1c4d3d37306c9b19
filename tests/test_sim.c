/* The pipeline simulator against closed forms derived by hand, against an independent
 * longest-path computation over the schedule's task graph, and against the properties the
 * planner relies on (monotone in every task's length, PipeDream-Flush order, in-flight
 * micro-batches as the cost model counts them). */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"
#include "testutil.h"

#define TRIALS 300

static double run(enum schedule sched, int S, int M, const struct sim_stage *st)
{
    struct sim_result r;
    struct err e;
    err_clear(&e);
    if (sim_run(sched, S, M, st, &r, &e) != ERR_OK) {
        CU_FAIL("sim_run failed");
        return NAN;
    }
    double t = r.iteration_ms;
    sim_result_free(&r);
    return t;
}

/* A link whose every transfer takes exactly c ms: all latency, no bytes. */
static struct link fixed_link(double c)
{
    return (struct link){.present = 1, .gbps = 100, .latency_us = c * 1e3};
}

static void homogeneous(struct sim_stage *st, int S, double f, double b, double r)
{
    for (int s = 0; s < S; s++)
        st[s] = (struct sim_stage){.fwd_ms = f, .bwd_ms = b, .recompute_ms = r};
}

/* Without transfers every stage's step is (M + S - 1) slots of f + b (+ r): S - 1 slots of
 * fill and drain around M of steady state, for both schedules. */
static void test_homogeneous_closed_form(void)
{
    struct test_rng rng = {1};
    struct sim_stage st[16];
    for (int trial = 0; trial < TRIALS; trial++) {
        int S = (int)test_rng_int(&rng, 1, 16), M = (int)test_rng_int(&rng, 1, 40);
        double f = test_rng_double(&rng, 0.1, 5), b = test_rng_double(&rng, 0.1, 10);
        double r = trial % 2 ? test_rng_double(&rng, 0, 5) : 0;
        homogeneous(st, S, f, b, r);
        double ref = (M + S - 1) * (f + b + r);
        for (int k = 0; k < 2; k++) {
            enum schedule sched = k ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
            struct sim_result res;
            struct err e;
            err_clear(&e);
            CU_ASSERT_FATAL(sim_run(sched, S, M, st, &res, &e) == ERR_OK);
            CU_ASSERT(test_close(res.iteration_ms, ref, 1e-9, 1e-12));
            /* every stage busy M (f + b + r); the bubble is (S - 1) / (M + S - 1) */
            for (int s = 0; s < S; s++) {
                CU_ASSERT(test_close(res.busy_ms[s], M * (f + b + r), 1e-9, 1e-12));
                CU_ASSERT(test_close(res.busy_ms[s] + res.idle_ms[s], ref, 1e-9, 1e-12));
            }
            CU_ASSERT(test_close(res.bubble_fraction, (S - 1) / (double)(M + S - 1), 1e-12,
                                 1e-9));
            sim_result_free(&res);
        }
    }
}

/* Transfers of c <= min(f, b) (no link ever queues), b here the backward including any
 * recompute. The makespan is the longest path through the schedule's task graph; every path
 * from the first forward to the last backward computes (M + S - 1)(f + b) at most, and the
 * longest ones differ only in how many link crossings they make.
 *
 * GPipe: micro-batch 0 crosses each boundary down and M-1's gradient crosses back, and the
 * other forward transfers overlap compute: + 2 (S - 1) c with c on every boundary, + 2c with c
 * on one boundary. Its backwards run one after another, and each takes the buffer the one
 * before it sends its gradient from (sim.h): a stage sending over a slow boundary spaces its
 * backwards b + c, and the last gradient leaves (M - 1) c later, + (M - 1) c either way.
 * (1F1B runs a forward between two backwards, and c <= f.)
 *
 * 1F1B: stage s admits a new forward only when a gradient comes back, so transfers land on
 * the critical path again and again. From stage 0 a path can make an excursion: a forward
 * goes j stages down, and the gradient of the micro-batch j + 1 later (the one stage j runs
 * next) comes back, covering j + 1 micro-batches with (j + 1)(f + b) of compute, as staying
 * on stage 0 would, and 2j crossings. Micro-batch 0 crosses all S - 1 boundaries both ways;
 * the other M - 1 micro-batches are covered by excursions of at most S (j <= S - 1), and the
 * fewest excursions, ceil((M - 1) / S), leave the most crossings:
 *   every boundary:  + 2c ((S - 1) + (M - 1) - ceil((M - 1) / S))
 *                    = + 2c ((S - 1) + floor((S - 1)(M - 1) / S)).
 * With only boundary k slow, the best excursions are one boundary deep from stage k, which
 * covers 2 micro-batches per crossing pair once its S - k - 1 warm-up forwards are done:
 *   one boundary k:  + 2c (1 + floor(max(0, M - (S - k - 1)) / 2)). */
static double transfer_cost(enum schedule sched, int S, int M, int k, double c)
{
    if (sched == SCHEDULE_GPIPE)
        return (k < 0 ? 2 * (S - 1) * c : 2 * c) + (S > 1 ? (M - 1) * c : 0);
    if (k < 0)
        return 2 * c * ((S - 1) + ((S - 1) * (M - 1)) / S);
    int warm = S - k - 1;
    return 2 * c * (1 + (M > warm ? (M - warm) / 2 : 0));
}

static void test_transfers_on_every_boundary(void)
{
    struct test_rng rng = {2};
    struct sim_stage st[16];
    for (int trial = 0; trial < TRIALS; trial++) {
        int S = (int)test_rng_int(&rng, 1, 16), M = (int)test_rng_int(&rng, 1, 40);
        double f = test_rng_double(&rng, 0.1, 5), b = test_rng_double(&rng, 0.1, 10);
        double r = trial % 2 ? test_rng_double(&rng, 0, 5) : 0;
        double c = test_rng_double(&rng, 0, fmin(f, b));
        homogeneous(st, S, f, b, r);
        for (int s = 0; s + 1 < S; s++)
            st[s].link = fixed_link(c);
        for (int k = 0; k < 2; k++) {
            enum schedule sched = k ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
            double ref = (M + S - 1) * (f + b + r) + transfer_cost(sched, S, M, -1, c);
            CU_ASSERT(test_close(run(sched, S, M, st), ref, 1e-9, 1e-12));
        }
    }
    /* by hand, S = 2, 1F1B, f = 1, b = 2, c = 0.5: stage 1 runs F0 at [1.5, 2.5], B0 to
     * 4.5; stage 0 B0 [5, 7], F2 [7, 8]; stage 1 F1 [4.5, 5.5], B1 to 7.5; stage 0 B1
     * [8, 10]; F2 reaches stage 1 at 8.5, B2 ends 11.5, stage 0 B2 [12, 14] */
    homogeneous(st, 2, 1, 2, 0);
    st[0].link = fixed_link(0.5);
    CU_ASSERT(test_close(run(SCHEDULE_1F1B, 2, 3, st), 14, 1e-9, 1e-12));
}

static void test_transfer_on_one_boundary(void)
{
    struct test_rng rng = {3};
    struct sim_stage st[12];
    for (int trial = 0; trial < TRIALS; trial++) {
        int S = (int)test_rng_int(&rng, 2, 12), M = (int)test_rng_int(&rng, 1, 30);
        int k = (int)test_rng_int(&rng, 0, S - 2);
        double f = test_rng_double(&rng, 0.1, 5), b = test_rng_double(&rng, 0.1, 10);
        double c = test_rng_double(&rng, 0, fmin(f, b));
        homogeneous(st, S, f, b, 0);
        st[k].link = fixed_link(c);
        for (int g = 0; g < 2; g++) {
            enum schedule sched = g ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
            double ref = (M + S - 1) * (f + b) + transfer_cost(sched, S, M, k, c);
            CU_ASSERT(test_close(run(sched, S, M, st), ref, 1e-9, 1e-12));
        }
    }
}

/* Two GPipe stages over a link slower than either compute (c >= f, b): the link carries one
 * transfer at a time, so the forwards arrive c apart. Stage 1's last forward ends at f + Mc
 * + f; its backwards follow, each after the one before has sent its gradient (b + c apart),
 * the last gradient arriving M (b + c) later; stage 0's last backward ends at 2f + (M + 1) b
 * + 2 M c. */
static void test_slow_link_queues(void)
{
    struct sim_stage st[2];
    double f = 1, b = 2, c = 3;
    for (int M = 1; M <= 20; M++) {
        homogeneous(st, 2, f, b, 0);
        st[0].link = fixed_link(c);
        CU_ASSERT(test_close(run(SCHEDULE_GPIPE, 2, M, st), 2 * f + (M + 1) * b + 2 * M * c,
                             1e-9, 1e-12));
    }
    /* bandwidth, not latency: 1.5e9 bytes at 4 Gb/s = 3 s per transfer, plus 20 us */
    homogeneous(st, 2, 1000, 2000, 0);
    st[0].out_bytes = 1500000000;
    st[0].link = (struct link){.present = 1, .gbps = 4, .latency_us = 20};
    double x = 3000.02;
    CU_ASSERT(test_close(run(SCHEDULE_GPIPE, 2, 4, st), 2 * 1000 + 5 * 2000 + 8 * x, 1e-6,
                         1e-12));
}

/* An independent reference: the schedule as a task graph (program order on each stage, data
 * dependencies, each link direction in its sender's order, and a send's buffer taken again by
 * the sender's next op of its direction: the next forward's last layer, out_fwd_ms long,
 * after it; the next backward after it), its longest path found by relaxing the tasks in a
 * topological order (Kahn's algorithm). */
struct node {
    double dur, finish;
    int n_pred, preds[3];
};

static int add_node(struct node *g, int *n, double dur)
{
    g[*n] = (struct node){.dur = dur};
    return (*n)++;
}

static void add_edge(struct node *g, int from, int to)
{
    if (from >= 0)
        g[to].preds[g[to].n_pred++] = from;
}

/* The PipeDream-Flush / GPipe program of stage s: op i is micro-batch prog[i], negative for
 * a backward (-1 - micro). */
static void program(enum schedule sched, int S, int M, int s, int *prog)
{
    int n = 0;
    int warm = sched == SCHEDULE_GPIPE ? M : (S - s - 1 < M ? S - s - 1 : M);
    for (int m = 0; m < warm; m++)
        prog[n++] = m;
    for (int i = 0; i < M - warm; i++) {
        prog[n++] = warm + i;
        prog[n++] = -1 - i;
    }
    for (int m = M - warm; m < M; m++)
        prog[n++] = -1 - m;
}

static double longest_path(enum schedule sched, int S, int M, const struct sim_stage *st)
{
    int cap = 6 * S * M;
    struct node *g = calloc((size_t)cap, sizeof *g);
    int *fwd = malloc(sizeof(int) * S * M), *bwd = malloc(sizeof(int) * S * M);
    int *fsend = malloc(sizeof(int) * S * M), *bsend = malloc(sizeof(int) * S * M);
    int *prog = malloc(sizeof(int) * 2 * M);
    int n = 0;
    /* the tasks: compute (recompute folded into backward) and sends */
    for (int s = 0; s < S; s++)
        for (int m = 0; m < M; m++) {
            fwd[s * M + m] = add_node(g, &n, st[s].fwd_ms);
            bwd[s * M + m] = add_node(g, &n, st[s].recompute_ms + st[s].bwd_ms);
            fsend[s * M + m] = s + 1 < S ? add_node(g, &n, link_transfer_ms(&st[s].link,
                                                                             st[s].out_bytes))
                                         : -1;
            bsend[s * M + m] =
                s > 0 ? add_node(g, &n, link_transfer_ms(&st[s - 1].link, st[s - 1].out_bytes))
                      : -1;
        }
    for (int s = 0; s < S; s++) {
        program(sched, S, M, s, prog);
        int prev = -1, prev_fsend = -1, prev_bsend = -1;
        for (int i = 0; i < 2 * M; i++) {
            int m = prog[i] >= 0 ? prog[i] : -1 - prog[i];
            int task = prog[i] >= 0 ? fwd[s * M + m] : bwd[s * M + m];
            add_edge(g, prev, task);
            if (prog[i] >= 0) {
                if (s > 0)
                    add_edge(g, fsend[(s - 1) * M + m], task);
                if (prev_fsend >= 0) { /* the forward ends after its output's buffer is free */
                    int last = add_node(g, &n, st[s].out_fwd_ms);
                    int done = add_node(g, &n, 0);
                    add_edge(g, prev_fsend, last);
                    add_edge(g, task, done);
                    add_edge(g, last, done);
                    task = done;
                }
                if (s + 1 < S) {
                    add_edge(g, task, fsend[s * M + m]);
                    add_edge(g, prev_fsend, fsend[s * M + m]);
                    prev_fsend = fsend[s * M + m];
                }
            } else {
                if (s + 1 < S)
                    add_edge(g, bsend[(s + 1) * M + m], task);
                else
                    add_edge(g, fwd[s * M + m], task);
                add_edge(g, prev_bsend, task); /* its first layer takes the send's buffer */
                if (s > 0) {
                    add_edge(g, task, bsend[s * M + m]);
                    add_edge(g, prev_bsend, bsend[s * M + m]);
                    prev_bsend = bsend[s * M + m];
                }
            }
            prev = task;
        }
    }
    /* Kahn: successors counted from the predecessor lists */
    int *indeg = calloc((size_t)n, sizeof *indeg), *order = malloc(sizeof(int) * n);
    int *head = malloc(sizeof(int) * n), *nxt = malloc(sizeof(int) * 3 * n),
        *to = malloc(sizeof(int) * 3 * n), n_edges = 0;
    for (int v = 0; v < n; v++)
        head[v] = -1;
    for (int v = 0; v < n; v++)
        for (int k = 0; k < g[v].n_pred; k++) {
            int u = g[v].preds[k];
            to[n_edges] = v;
            nxt[n_edges] = head[u];
            head[u] = n_edges++;
            indeg[v]++;
        }
    int qh = 0, qt = 0;
    for (int v = 0; v < n; v++)
        if (indeg[v] == 0)
            order[qt++] = v;
    while (qh < qt) {
        int u = order[qh++];
        double start = 0;
        for (int k = 0; k < g[u].n_pred; k++)
            start = fmax(start, g[g[u].preds[k]].finish);
        g[u].finish = start + g[u].dur;
        for (int ed = head[u]; ed >= 0; ed = nxt[ed])
            if (--indeg[to[ed]] == 0)
                order[qt++] = to[ed];
    }
    CU_ASSERT_EQUAL(qt, n); /* acyclic */
    double makespan = 0;
    for (int v = 0; v < n; v++)
        makespan = fmax(makespan, g[v].finish);
    free(g), free(fwd), free(bwd), free(fsend), free(bsend), free(prog);
    free(indeg), free(order), free(head), free(nxt), free(to);
    return makespan;
}

static void random_instance(struct test_rng *rng, int S, struct sim_stage *st)
{
    for (int s = 0; s < S; s++) {
        st[s] = (struct sim_stage){
            .fwd_ms = test_rng_double(rng, 0.1, 10),
            .bwd_ms = test_rng_double(rng, 0.1, 20),
            .recompute_ms = test_rng_int(rng, 0, 1) ? test_rng_double(rng, 0, 10) : 0,
            .out_bytes = test_rng_int(rng, 0, 1 << 30),
        };
        st[s].out_fwd_ms = test_rng_int(rng, 0, 1) ? test_rng_double(rng, 0, st[s].fwd_ms) : 0;
        if (s + 1 < S && test_rng_int(rng, 0, 3) > 0)
            st[s].link = (struct link){.present = 1,
                                       .gbps = test_rng_double(rng, 1, 3000),
                                       .latency_us = test_rng_double(rng, 0, 50)};
    }
}

static void test_against_longest_path(void)
{
    struct test_rng rng = {4};
    struct sim_stage st[10];
    for (int trial = 0; trial < TRIALS; trial++) {
        int S = (int)test_rng_int(&rng, 1, 10), M = (int)test_rng_int(&rng, 1, 24);
        random_instance(&rng, S, st);
        for (int k = 0; k < 2; k++) {
            enum schedule sched = k ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
            double ref = longest_path(sched, S, M, st), alone = NAN;
            struct err e;
            err_clear(&e);
            CU_ASSERT(test_close(run(sched, S, M, st), ref, 1e-9, 1e-12));
            /* the makespan-only entry point gives the same number */
            CU_ASSERT(sim_makespan(sched, S, M, st, &alone, &e) == ERR_OK);
            CU_ASSERT(alone == run(sched, S, M, st));
        }
    }
}

/* The same on long pipelines, up to 64 stages and 512 micro-batches: warm-ups cut short by M
 * and long steady states, which the simulator runs in different orders. */
static void test_against_longest_path_long(void)
{
    struct test_rng rng = {44};
    struct sim_stage st[64];
    for (int trial = 0; trial < 24; trial++) {
        int S = (int)test_rng_int(&rng, 1, 64), M = (int)test_rng_int(&rng, 1, 512);
        random_instance(&rng, S, st);
        for (int k = 0; k < 2; k++) {
            enum schedule sched = k ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
            CU_ASSERT(test_close(run(sched, S, M, st), longest_path(sched, S, M, st), 1e-9, 1e-12));
        }
    }
}

/* The periodic extrapolation equals the full simulation on random stages and links, equal
 * stages (ties between critical cycles) and slow links, and does extrapolate most 1F1B runs. */
static void test_periodic_extrapolation(void)
{
    struct test_rng rng = {12};
    struct sim_stage st[10];
    int extrapolated = 0, tried = 0;
    for (int trial = 0; trial < TRIALS; trial++) {
        int S = (int)test_rng_int(&rng, 1, 10);
        int M = (int)test_rng_int(&rng, 1, 1500);
        random_instance(&rng, S, st);
        if (test_rng_int(&rng, 0, 3) == 0)
            for (int s = 1; s < S; s++) {
                st[s].fwd_ms = st[0].fwd_ms;
                st[s].bwd_ms = st[0].bwd_ms;
                st[s].recompute_ms = st[0].recompute_ms;
            }
        for (int k = 0; k < 2; k++) {
            enum schedule sched = k ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
            double full = NAN, fast = NAN;
            int simulated = 0;
            struct err e;
            err_clear(&e);
            CU_ASSERT(sim_makespan(sched, S, M, st, &full, &e) == ERR_OK);
            CU_ASSERT(sim_makespan_periodic(sched, S, M, st, &fast, &simulated, &e) == ERR_OK);
            CU_ASSERT(test_close(fast, full, 1e-9, 1e-9));
            CU_ASSERT(simulated >= 1 && simulated <= M);
            if (sched == SCHEDULE_1F1B && M > 2 * (3 * S + 8 + 60)) {
                tried++;
                extrapolated += simulated < M;
            }
        }
    }
    CU_ASSERT(tried > TRIALS / 4);
    CU_ASSERT(extrapolated >= tried * 9 / 10);
    printf(" [%d of %d extrapolated] ", extrapolated, tried);
}

/* Lengthening any task (one stage's forward, backward or recompute, or one link's bandwidth
 * or latency) never shortens the step. */
static void test_monotone(void)
{
    struct test_rng rng = {5};
    struct sim_stage st[10];
    for (int trial = 0; trial < 3 * TRIALS; trial++) {
        int S = (int)test_rng_int(&rng, 1, 10), M = (int)test_rng_int(&rng, 1, 24);
        enum schedule sched = trial % 2 ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
        random_instance(&rng, S, st);
        double before = run(sched, S, M, st);
        int s = (int)test_rng_int(&rng, 0, S - 1), what = (int)test_rng_int(&rng, 0, 4);
        double grow = test_rng_double(&rng, 1e-6, 5);
        switch (what) {
        case 0:
            st[s].fwd_ms += grow;
            break;
        case 1:
            st[s].bwd_ms += grow;
            break;
        case 2:
            st[s].recompute_ms += grow;
            break;
        case 3: /* a slower link (or one where there was none) */
            if (st[s].link.present)
                st[s].link.gbps /= 1 + grow;
            else
                st[s].link = fixed_link(grow);
            break;
        default:
            st[s].out_bytes += (int64_t)(grow * 1e8);
            break;
        }
        double after = run(sched, S, M, st);
        CU_ASSERT(after >= before - 1e-9 * before);
    }
}

/* Each stage's forward and backward order is PipeDream-Flush's: min(S-s-1, M) warm-up
 * forwards, then one forward and one backward alternately, then the remaining backwards; the
 * recompute ends exactly when its backward starts. The most micro-batches a stage holds
 * (forward done, backward not) is the cost model's in-flight count min(S - s, M). */
static void test_1f1b_order(void)
{
    struct test_rng rng = {6};
    struct sim_stage st[12];
    for (int trial = 0; trial < 100; trial++) {
        int S = (int)test_rng_int(&rng, 1, 12), M = (int)test_rng_int(&rng, 1, 24);
        random_instance(&rng, S, st);
        for (int s = 0; s < S; s++)
            st[s].recompute_ms = test_rng_double(&rng, 0.1, 3); /* every stage recomputes */
        struct sim_result r;
        struct err e;
        err_clear(&e);
        CU_ASSERT_FATAL(sim_run(SCHEDULE_1F1B, S, M, st, &r, &e) == ERR_OK);
        for (int s = 0; s < S; s++) {
            /* this stage's forwards and backwards sorted by start time */
            int n = 0, warm = S - s - 1 < M ? S - s - 1 : M;
            struct sim_task *mine = malloc(sizeof *mine * 2 * M);
            for (int i = 0; i < r.n_tasks; i++)
                if (r.tasks[i].stage == s &&
                    (r.tasks[i].kind == SIM_FORWARD || r.tasks[i].kind == SIM_BACKWARD))
                    mine[n++] = r.tasks[i];
            CU_ASSERT_EQUAL_FATAL(n, 2 * M);
            for (int i = 1; i < n; i++)
                for (int j = i; j > 0 && mine[j].start_ms < mine[j - 1].start_ms; j--) {
                    struct sim_task t = mine[j];
                    mine[j] = mine[j - 1];
                    mine[j - 1] = t;
                }
            int i = 0, ok = 1, held = 0, most = 0;
            for (int m = 0; m < warm; m++, i++)
                ok = ok && mine[i].kind == SIM_FORWARD && mine[i].micro == m;
            for (int m = 0; m < M - warm; m++, i += 2)
                ok = ok && mine[i].kind == SIM_FORWARD && mine[i].micro == warm + m &&
                     mine[i + 1].kind == SIM_BACKWARD && mine[i + 1].micro == m;
            for (int m = M - warm; m < M; m++, i++)
                ok = ok && mine[i].kind == SIM_BACKWARD && mine[i].micro == m;
            CU_ASSERT(ok);
            for (i = 0; i < n; i++) {
                held += mine[i].kind == SIM_FORWARD ? 1 : -1;
                most = held > most ? held : most;
            }
            CU_ASSERT_EQUAL(most, schedule_in_flight(SCHEDULE_1F1B, S, s, M));
            free(mine);
        }
        for (int i = 0; i < r.n_tasks; i++) {
            if (r.tasks[i].kind != SIM_RECOMPUTE)
                continue;
            int found = 0;
            for (int j = 0; j < r.n_tasks; j++)
                found += r.tasks[j].kind == SIM_BACKWARD && r.tasks[j].stage == r.tasks[i].stage &&
                         r.tasks[j].micro == r.tasks[i].micro &&
                         r.tasks[j].start_ms == r.tasks[i].end_ms;
            CU_ASSERT_EQUAL(found, 1);
        }
        sim_result_free(&r);
    }
}

/* Bad input is refused with a message, never simulated. */
static void test_bad_input(void)
{
    struct sim_stage st[2];
    struct sim_result r;
    struct err e;
    homogeneous(st, 2, 1, 1, 0);
    err_clear(&e);
    CU_ASSERT_EQUAL(sim_run(SCHEDULE_1F1B, 2, 0, st, &r, &e), ERR_INPUT);
    err_clear(&e);
    CU_ASSERT_EQUAL(sim_run(SCHEDULE_1F1B, 4096, 1 << 20, st, &r, &e), ERR_INPUT);
    CU_ASSERT(strstr(e.msg, "4096 stages") != NULL);
    st[1].bwd_ms = NAN;
    err_clear(&e);
    CU_ASSERT_EQUAL(sim_run(SCHEDULE_GPIPE, 2, 3, st, &r, &e), ERR_INPUT);
    CU_ASSERT(strstr(e.msg, "stage 1: bwd_ms") != NULL);
    CU_ASSERT_PTR_NULL(r.tasks);
}

/* r's two all-reduce tasks, each 2 ms, starting at a and b. */
static void two_buckets(const struct sim_result *r, double a, double b)
{
    int seen = 0;
    for (int i = 0; i < r->n_tasks; i++)
        if (r->tasks[i].kind == SIM_ALLREDUCE) {
            double start = r->tasks[i].micro == 0 ? a : b;
            CU_ASSERT(test_close(r->tasks[i].start_ms, start, 1e-12, 0) &&
                      test_close(r->tasks[i].end_ms, start + 2, 1e-12, 0));
            seen++;
        }
    CU_ASSERT_EQUAL(seen, 2);
}

/* One stage of four layers (backwards 1, 2, 3, 4 ms; 10 MB of gradients each), one
 * micro-batch of 4 ms forward, dp 2 over 80 Gb/s (no latency: an all-reduce of B bytes is 2 x
 * B/2 at 10 GB/s, 0.1 ms a MB), the optimizer 1 ms. Buckets of 20 MB: layers 3-2 (ready when
 * layer 2's backward ends, 1 + 2 = 3 ms before the last ends), then 1-0. The backward runs
 * [4, 14]: bucket 0 [11, 13], bucket 1 [14, 16], the optimizer [16, 17]. One reduction
 * (cap 0): [14, 18], the step 19. A link a quarter as fast: [11, 19], [19, 27], 28. */
static void test_buckets_by_hand(void)
{
    int64_t grad[4] = {10000000, 10000000, 10000000, 10000000};
    double bwd[4] = {1, 2, 3, 4};
    struct link link = {1, 80, 0};
    struct sim_bucket b[4];
    int n = sim_buckets(grad, bwd, 4, 20000000, &link, 2, b);
    CU_ASSERT_FATAL(n == 2);
    CU_ASSERT(b[0].first == 2 && b[0].last == 3 && b[0].bytes == 20000000 && b[0].rest_ms == 3);
    CU_ASSERT(b[1].first == 0 && b[1].last == 1 && b[1].rest_ms == 0);
    CU_ASSERT(test_close(b[0].allreduce_ms, 2, 1e-12, 0));
    struct sim_stage st = {.fwd_ms = 4, .bwd_ms = 10, .optimizer_ms = 1, .n_buckets = n,
                           .buckets = b};
    struct sim_result r;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(sim_run(SCHEDULE_1F1B, 1, 1, &st, &r, &e) == ERR_OK);
    CU_ASSERT(test_close(r.iteration_ms, 17, 1e-12, 0));
    two_buckets(&r, 11, 14);
    sim_result_free(&r);
    st.n_buckets = sim_buckets(grad, bwd, 4, 0, &link, 2, b); /* one, after the last backward */
    CU_ASSERT(st.n_buckets == 1 && b[0].rest_ms == 0);
    CU_ASSERT(test_close(run(SCHEDULE_1F1B, 1, 1, &st), 19, 1e-12, 0));
    st.n_buckets = 0; /* the same as the whole reduction after the last backward */
    st.allreduce_ms = 4;
    CU_ASSERT(test_close(run(SCHEDULE_1F1B, 1, 1, &st), 19, 1e-12, 0));
    link.gbps = 20;
    st.n_buckets = sim_buckets(grad, bwd, 4, 20000000, &link, 2, b);
    CU_ASSERT(test_close(run(SCHEDULE_1F1B, 1, 1, &st), 28, 1e-12, 0));
    /* no replicas, no buckets */
    CU_ASSERT_EQUAL(sim_buckets(grad, bwd, 4, 20000000, &link, 1, b), 0);
}

/* The pass-by-pass walk (sim_passes.c) runs interleaved 1F1B of one chunk a GPU, which is
 * 1F1B's program, with its own code: on random stages, links, blocking sends and gradient
 * buckets (dp 2 to 8) it gives sim.c's 1F1B walk's step, send for send and bucket for
 * bucket. */
static void test_passes_equal_walk(void)
{
    struct test_rng rng = {31};
    struct sim_stage st[8];
    struct sim_bucket b[8][6];
    for (int trial = 0; trial < TRIALS; trial++) {
        int S = (int)test_rng_int(&rng, 1, 8), M = (int)test_rng_int(&rng, 1, 16);
        random_instance(&rng, S, st);
        for (int s = 0; s < S; s++) {
            int64_t grad[6];
            double bwd[6];
            for (int l = 0; l < 6; l++) {
                grad[l] = test_rng_int(&rng, 0, 1 << 28);
                bwd[l] = st[s].bwd_ms / 6;
            }
            struct link dp = {.present = 1, .gbps = test_rng_double(&rng, 1, 400),
                              .latency_us = test_rng_double(&rng, 0, 30)};
            st[s].n_buckets = sim_buckets(grad, bwd, 6, test_rng_int(&rng, 0, 1 << 28), &dp,
                                          (int)test_rng_int(&rng, 1, 8), b[s]);
            st[s].buckets = b[s];
            st[s].optimizer_ms = test_rng_double(&rng, 0, 5);
        }
        struct schedule_shape sh = schedule_shape_of(SCHEDULE_INTERLEAVED, S, 1, M);
        struct sim_result r;
        struct err e;
        err_clear(&e);
        CU_ASSERT_FATAL(sim_run_shape(&sh, st, &r, &e) == ERR_OK);
        CU_ASSERT(test_close(r.iteration_ms, run(SCHEDULE_1F1B, S, M, st), 1e-9, 1e-12));
        sim_result_free(&r);
    }
}

/* ZB-H1 on one GPU, one micro-batch: F [0, 4], B [4, 10], W [10, 14] with 1 ms for each of
 * four layers' weight gradients. Buckets of 20 MB, each 2 ms (as above): layers 3-2, final
 * once layer 2's weight pass has run (2 ms before W ends), [12, 14]; layers 1-0 [14, 16];
 * the optimizer [16, 17]. The step is 17, where one reduction after W would make it 19. */
static void test_passes_buckets_by_hand(void)
{
    int64_t grad[4] = {10000000, 10000000, 10000000, 10000000};
    double w[4] = {1, 1, 1, 1};
    struct link link = {1, 80, 0};
    struct sim_bucket b[4];
    struct sim_stage st = {.fwd_ms = 4, .bwd_ms = 6, .w_ms = 4, .optimizer_ms = 1,
                           .n_buckets = sim_buckets(grad, w, 4, 20000000, &link, 2, b),
                           .buckets = b};
    struct schedule_shape sh = schedule_shape_of(SCHEDULE_ZB_H1, 1, 1, 1);
    struct sim_result r;
    struct err e;
    err_clear(&e);
    CU_ASSERT_FATAL(st.n_buckets == 2);
    CU_ASSERT_FATAL(sim_run_shape(&sh, &st, &r, &e) == ERR_OK);
    CU_ASSERT(test_close(r.iteration_ms, 17, 1e-12, 0));
    two_buckets(&r, 12, 14);
    sim_result_free(&r);
    st.n_buckets = sim_buckets(grad, w, 4, 0, &link, 2, b);
    double ms = 0;
    CU_ASSERT(sim_makespan_shape(&sh, &st, &ms, &e) == ERR_OK && test_close(ms, 19, 1e-12, 0));
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("sim", NULL, NULL);
    CU_add_test(s, "homogeneous stages: (M + S - 1)(f + b + r)", test_homogeneous_closed_form);
    CU_add_test(s, "transfer c on every boundary, by critical path", test_transfers_on_every_boundary);
    CU_add_test(s, "transfer c on one boundary, by critical path", test_transfer_on_one_boundary);
    CU_add_test(s, "a slow link carries one transfer at a time", test_slow_link_queues);
    CU_add_test(s, "equals the task graph's longest path", test_against_longest_path);
    CU_add_test(s, "equals it on long pipelines", test_against_longest_path_long);
    CU_add_test(s, "a longer task never shortens the step", test_monotone);
    CU_add_test(s, "periodic extrapolation equals the full simulation", test_periodic_extrapolation);
    CU_add_test(s, "1F1B order is PipeDream-Flush's", test_1f1b_order);
    CU_add_test(s, "bad input refused", test_bad_input);
    CU_add_test(s, "gradient buckets by hand", test_buckets_by_hand);
    CU_add_test(s, "pass by pass = the 1F1B walk, sends and buckets",
                test_passes_equal_walk);
    CU_add_test(s, "zb-h1's buckets after the weight passes, by hand",
                test_passes_buckets_by_hand);
    return test_main();
}
