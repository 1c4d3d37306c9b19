/* Liveness by heartbeat (heartbeat.h): one thread per rank, rank 0 the judge. */
#include "heartbeat.h"

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "mpicheck.h"
#include "progress.h"

#define HB_NAMED_MAX 8       /* ranks a verdict names (and counts beyond) */
#define HB_STACK (256 << 10) /* the thread's stack: small, for a rank near its memory limit */

enum hb_kind { HB_BEAT, HB_BYE, HB_VERDICT, HB_ACK };
enum hb_verdict { HB_SILENT, HB_CUT_OFF, HB_STUCK, HB_DEADLOCK };

struct hb_msg {
    int32_t kind, waiting; /* a beat: whether the sender's main thread waits on another rank */
    uint64_t progress;     /* a beat: the sender's progress count (progress.h) */
    double deaf_s;         /* a beat to rank 0: how long since the sender last heard rank 0 */
    int32_t verdict, n_named; /* a verdict: enum hb_verdict, how many ranks it names */
    int32_t n_stages;         /* a verdict: the layout, for a rank that has not read it */
    int32_t named[HB_NAMED_MAX];
    double seconds; /* a verdict: the first named rank's silence, or time without progress */
};

struct heartbeat {
    double deadline, stall, period;
    int rank, size, tag;
    atomic_int n_stages; /* 0 until heartbeat_layout */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int leaving, left, finalized, status; /* under mu */
    /* per rank, as heard (rank 0 hears every rank, the others rank 0) */
    double *heard;          /* when a message last came */
    double *progressed;     /* when its progress count last moved */
    double *deaf;           /* how long it had not heard rank 0, by its last beat */
    uint64_t *count;        /* its progress count */
    char *waiting, *gone;   /* its main thread waits on another rank; it has left */
    MPI_Request *sent;      /* the beat in flight to it */
    /* What is sent lives until the send completes (MPI's rule: a transport may read it
     * later): a beat per rank, and the one-off messages, which are never sent twice over. */
    struct hb_msg *beats, bye, ack, verdict;
};

/* "rank 5 (replica 1, stage 2)", or "rank 5" before the layout is known. */
static void name_of(const struct heartbeat *h, int w, char *out, size_t cap)
{
    int S = atomic_load(&h->n_stages);
    if (S > 0)
        snprintf(out, cap, "rank %d (replica %d, stage %d)", w, w / S, w % S);
    else
        snprintf(out, cap, "rank %d", w);
}

/* Prints the verdict as this rank sees it; the process then ends. */
static void print_verdict(const struct heartbeat *h, const struct hb_msg *m)
{
    char me[96], who[HB_NAMED_MAX * 96 + 64] = "";
    size_t len = 0;
    name_of(h, h->rank, me, sizeof me);
    for (int i = 0; i < m->n_named && i < HB_NAMED_MAX; i++) {
        char one[96];
        name_of(h, m->named[i], one, sizeof one);
        len += (size_t)snprintf(who + len, sizeof who - len, "%s%s", i ? ", " : "", one);
    }
    if (m->n_named > HB_NAMED_MAX)
        snprintf(who + len, sizeof who - len, " and %d more", m->n_named - HB_NAMED_MAX);
    fflush(stdout);
    if (m->verdict == HB_SILENT)
        fprintf(stderr, "ballast train: %s: %s went silent: no heartbeat for %.1f s (stopped, "
                        "dead or cut off); the job stops (exit 1); --timeout SECONDS sets this "
                        "deadline\n",
                me, who, m->seconds);
    else if (m->verdict == HB_CUT_OFF)
        fprintf(stderr, "ballast train: %s: %s is cut off: its messages arrive, but it has not "
                        "heard rank 0 for %.1f s; the job stops (exit 1); --timeout SECONDS sets "
                        "this deadline\n",
                me, who, m->seconds);
    else if (m->verdict == HB_STUCK)
        fprintf(stderr, "ballast train: %s: %s is stuck: alive, but no progress for %.0f s and "
                        "not waiting on another rank (a library retrying a failed allocation, a "
                        "hung device?); the job stops (exit 1); --stall SECONDS sets this limit\n",
                me, who, m->seconds);
    else
        fprintf(stderr, "ballast train: %s: every rank has waited on another for %.0f s with "
                        "no progress anywhere (a message lost?); the job stops (exit 1); "
                        "--stall SECONDS sets this limit\n",
                me, m->seconds);
    fflush(stderr);
}

/* m: one of h's messages (it must outlive the send). */
static void send_msg(struct heartbeat *h, int to, const struct hb_msg *m, MPI_Request *req)
{
    if (!MPI_OK(MPI_Isend(m, (int)sizeof *m, MPI_BYTE, to, h->tag, MPI_COMM_WORLD, req)))
        *req = MPI_REQUEST_NULL;
}

/* One of h's messages that needs no answer and may never be received: its request is let go
 * (the message stays in h until the end). */
static void post_msg(struct heartbeat *h, int to, const struct hb_msg *m)
{
    MPI_Request q;
    send_msg(h, to, m, &q);
    if (q != MPI_REQUEST_NULL)
        MPI_RELEASE(MPI_Request_free(&q));
}

/* Whom this rank's thread hears and beats to: rank 0 every rank, the others rank 0. */
static int watches(const struct heartbeat *h, int k)
{
    return k != h->rank && !h->gone[k] && (h->rank == 0 || k == 0);
}

/* A beat to each watched rank whose previous beat has left: none piles up for a stopped one. */
static void beat(struct heartbeat *h, double now)
{
    struct hb_msg m = {.kind = HB_BEAT, .waiting = progress_is_waiting(),
                       .progress = progress_count(), .deaf_s = now - h->heard[0]};
    for (int k = 0; k < h->size; k++) {
        int done = 1;
        if (!watches(h, k))
            continue;
        if (h->sent[k] != MPI_REQUEST_NULL &&
            !MPI_OK(MPI_Test(&h->sent[k], &done, MPI_STATUS_IGNORE)))
            done = 0;
        if (!done)
            continue;
        h->beats[k] = m; /* its previous beat has left */
        send_msg(h, k, &h->beats[k], &h->sent[k]);
    }
}

static _Noreturn void end_process(int status)
{
    fflush(stdout);
    fflush(stderr);
    _exit(status);
}

/* Another rank: rank 0's verdict printed, acknowledged, and the end awaited (mpirun ends the
 * job once rank 0 exits), or this rank ends itself. */
static _Noreturn void obey(struct heartbeat *h, const struct hb_msg *m)
{
    if (atomic_load(&h->n_stages) == 0)
        atomic_store(&h->n_stages, m->n_stages);
    print_verdict(h, m);
    post_msg(h, 0, &h->ack);
    struct timespec ts = {0, 50000000};
    for (double until = clock_now_s() + h->deadline; clock_now_s() < until;)
        nanosleep(&ts, NULL);
    end_process(1);
}

/* What rank k's beat says of its progress (rank 0's own: read here). */
static void note_progress(struct heartbeat *h, int k, uint64_t count, int waiting, double now)
{
    if (count != h->count[k]) {
        h->count[k] = count;
        h->progressed[k] = now;
    }
    h->waiting[k] = (char)waiting;
}

/* Every message waiting: a beat refreshes its sender, a departure stops watching it, a
 * verdict is obeyed. Returns the acknowledgements seen. */
static int drain(struct heartbeat *h, double now)
{
    int flag = 0, acks = 0;
    MPI_Status st;
    while (MPI_OK(MPI_Iprobe(MPI_ANY_SOURCE, h->tag, MPI_COMM_WORLD, &flag, &st)) && flag) {
        struct hb_msg m;
        int from = st.MPI_SOURCE;
        if (!MPI_OK(MPI_Recv(&m, (int)sizeof m, MPI_BYTE, from, h->tag, MPI_COMM_WORLD,
                             MPI_STATUS_IGNORE)))
            break;
        h->heard[from] = now;
        if (m.kind == HB_BEAT) {
            note_progress(h, from, m.progress, m.waiting, now);
            h->deaf[from] = m.deaf_s;
        }
        else if (m.kind == HB_BYE)
            h->gone[from] = 1;
        else if (m.kind == HB_VERDICT)
            obey(h, &m);
        else if (m.kind == HB_ACK)
            acks++;
    }
    return acks;
}

/* Rank 0: the verdict printed, told to every rank still heard, their acknowledgements
 * awaited (at most min(deadline, 2 s)), then the end. */
static _Noreturn void pass_verdict(struct heartbeat *h, const struct hb_msg *m)
{
    print_verdict(h, m);
    h->verdict = *m;
    int told = 0;
    for (int k = 1; k < h->size; k++)
        if (!h->gone[k] && h->heard[k] > clock_now_s() - h->deadline) {
            post_msg(h, k, &h->verdict);
            told++;
        }
    double until = clock_now_s() + (h->deadline < 2 ? h->deadline : 2);
    struct timespec ts = {0, 10000000};
    for (int acks = 0; acks < told && clock_now_s() < until; nanosleep(&ts, NULL))
        acks += drain(h, clock_now_s());
    end_process(1);
}

static void name(struct hb_msg *m, int k, double seconds)
{
    if (m->n_named == 0)
        m->seconds = seconds;
    if (m->n_named < HB_NAMED_MAX)
        m->named[m->n_named] = k;
    m->n_named++;
}

/* Rank 0's verdict on every rank (itself included), or none (n_named 0, not a deadlock):
 * silent ones first, then those cut off (heard, but not hearing rank 0), then stuck ones
 * (alive, no progress, not waiting), then a deadlock (every rank waiting, nobody
 * progressing). */
static struct hb_msg judge_all(struct heartbeat *h, double now)
{
    struct hb_msg m = {.kind = HB_VERDICT, .verdict = HB_SILENT,
                       .n_stages = atomic_load(&h->n_stages)};
    for (int k = 1; k < h->size; k++)
        if (!h->gone[k] && now - h->heard[k] > h->deadline)
            name(&m, k, now - h->heard[k]);
    if (m.n_named > 0)
        return m;
    m.verdict = HB_CUT_OFF;
    for (int k = 1; k < h->size; k++)
        if (!h->gone[k] && h->deaf[k] > h->deadline)
            name(&m, k, h->deaf[k]);
    if (m.n_named > 0)
        return m;
    m.verdict = HB_STUCK;
    double latest = 0;
    int all_wait = 1;
    for (int k = 0; k < h->size; k++) {
        if (k > 0 && h->gone[k])
            continue;
        if (!h->waiting[k] && now - h->progressed[k] > h->stall)
            name(&m, k, now - h->progressed[k]);
        latest = h->progressed[k] > latest ? h->progressed[k] : latest;
        all_wait &= h->waiting[k];
    }
    if (m.n_named == 0 && all_wait && now - latest > h->stall) {
        m.verdict = HB_DEADLOCK;
        m.seconds = now - latest;
    }
    return m;
}

/* Rank 0 judges; the others watch rank 0, allowing it two periods more than the deadline to
 * name a rank it cannot hear before they name it (a rank cut off hears nobody). */
static void judge(struct heartbeat *h, double now)
{
    if (h->rank == 0) {
        note_progress(h, 0, progress_count(), progress_is_waiting(), now);
        struct hb_msg m = judge_all(h, now);
        if (m.n_named > 0 || m.verdict == HB_DEADLOCK)
            pass_verdict(h, &m);
        return;
    }
    double silent = now - h->heard[0];
    if (h->size > 1 && !h->gone[0] && silent > h->deadline + 2 * h->period) {
        struct hb_msg m = {.kind = HB_VERDICT, .verdict = HB_SILENT};
        name(&m, 0, silent);
        print_verdict(h, &m);
        end_process(1);
    }
}

/* After a gap in this thread's own wake-ups (this process was stopped, or starved of CPU),
 * the others' silence is this rank's own: they are heard afresh from now. */
static void forgive(struct heartbeat *h, double now, double last)
{
    if (now - last > 2 * h->period)
        for (int k = 0; k < h->size; k++)
            h->heard[k] = h->progressed[k] = now;
}

/* Sleeps until `until` (CLOCK_MONOTONIC) or a signal of the condition; mu held. */
static void wait_until(struct heartbeat *h, double until)
{
    double s = until > 0 ? until : 0;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    pthread_cond_timedwait(&h->cv, &h->mu, &ts);
}

static void depart(struct heartbeat *h)
{
    for (int k = 0; k < h->size; k++) {
        if (h->sent[k] != MPI_REQUEST_NULL)
            MPI_RELEASE(MPI_Request_free(&h->sent[k]));
        if (watches(h, k))
            post_msg(h, k, &h->bye);
    }
}

static void *run(void *arg)
{
    struct heartbeat *h = arg;
    double next = 0, last = clock_now_s();
    pthread_mutex_lock(&h->mu);
    while (!h->leaving) {
        pthread_mutex_unlock(&h->mu);
        double now = clock_now_s();
        forgive(h, now, last);
        last = now;
        drain(h, now);
        if (now >= next) {
            beat(h, now);
            next = now + h->period;
        }
        judge(h, now);
        pthread_mutex_lock(&h->mu);
        if (!h->leaving)
            wait_until(h, clock_now_s() + h->period / 4);
    }
    depart(h);
    h->left = 1;
    pthread_cond_broadcast(&h->cv);
    /* the guard on MPI_Finalize */
    double until = clock_now_s() + h->deadline;
    while (!h->finalized && clock_now_s() < until)
        wait_until(h, until);
    if (!h->finalized) {
        fprintf(stderr, "ballast train: rank %d: MPI_Finalize has not returned after %.0f s (a "
                        "rank stopped at the end?); exiting with status %d\n",
                h->rank, h->deadline, h->status);
        end_process(h->status);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static void free_heartbeat(struct heartbeat *h)
{
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h->heard);
    free(h->progressed);
    free(h->deaf);
    free(h->count);
    free(h->waiting);
    free(h->gone);
    free(h->sent);
    free(h->beats);
    free(h);
}

/* The tables, every rank heard and progressing as of now. */
static int tables(struct heartbeat *h)
{
    size_t n = (size_t)h->size;
    h->heard = malloc(sizeof *h->heard * n);
    h->progressed = malloc(sizeof *h->progressed * n);
    h->deaf = calloc(n, sizeof *h->deaf);
    h->count = calloc(n, sizeof *h->count);
    h->waiting = calloc(n, 1);
    h->gone = calloc(n, 1);
    h->sent = malloc(sizeof *h->sent * n);
    h->beats = calloc(n, sizeof *h->beats);
    if (!h->heard || !h->progressed || !h->deaf || !h->count || !h->waiting || !h->gone ||
        !h->sent || !h->beats)
        return -1;
    h->bye.kind = HB_BYE;
    h->ack.kind = HB_ACK;
    double now = clock_now_s();
    for (int k = 0; k < h->size; k++) {
        h->heard[k] = h->progressed[k] = now;
        h->sent[k] = MPI_REQUEST_NULL;
    }
    return 0;
}

int heartbeat_start(struct heartbeat **out, double deadline_s, double stall_s, char *why,
                    int cap, struct err *e)
{
    int provided = MPI_THREAD_SINGLE, *tag_ub = NULL, found = 0;
    *out = NULL;
    if (!MPI_OK(MPI_Query_thread(&provided)) || provided < MPI_THREAD_MULTIPLE) {
        snprintf(why, (size_t)cap, "this MPI does not provide MPI_THREAD_MULTIPLE: no "
                                   "heartbeat, so a rank that stops hangs the job");
        return ERR_OK;
    }
    struct heartbeat *h = calloc(1, sizeof *h);
    if (h == NULL)
        return err_set(e, ERR_FAIL, "out of memory for the heartbeat");
    h->deadline = deadline_s;
    h->stall = stall_s;
    h->period = deadline_s / 8 < 0.05 ? 0.05 : deadline_s / 8 > 1 ? 1 : deadline_s / 8;
    if (!MPI_OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN)) ||
        !MPI_OK(MPI_Comm_rank(MPI_COMM_WORLD, &h->rank)) ||
        !MPI_OK(MPI_Comm_size(MPI_COMM_WORLD, &h->size))) {
        free(h);
        return err_set(e, ERR_FAIL, "MPI_COMM_WORLD is unusable for the heartbeat");
    }
    if (!MPI_OK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found)))
        found = 0;
    h->tag = found ? *tag_ub : 32767; /* the standard's least MPI_TAG_UB */
    atomic_init(&h->n_stages, 0);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (tables(h) != 0) {
        int size = h->size;
        free_heartbeat(h);
        return err_set(e, ERR_FAIL, "out of memory for the heartbeat of %d ranks", size);
    }
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, HB_STACK);
    int rc = pthread_create(&h->thread, &at, run, h);
    pthread_attr_destroy(&at);
    if (rc != 0) {
        free_heartbeat(h);
        return err_set(e, ERR_FAIL, "cannot start the heartbeat thread: %s", strerror(rc));
    }
    *out = h;
    return ERR_OK;
}

void heartbeat_layout(struct heartbeat *h, int n_stages)
{
    if (h != NULL)
        atomic_store(&h->n_stages, n_stages);
}

void heartbeat_leave(struct heartbeat *h, int status)
{
    if (h == NULL)
        return;
    pthread_mutex_lock(&h->mu);
    h->leaving = 1;
    h->status = status;
    pthread_cond_broadcast(&h->cv);
    while (!h->left)
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
}

void heartbeat_free(struct heartbeat *h)
{
    if (h == NULL)
        return;
    pthread_mutex_lock(&h->mu);
    h->finalized = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thread, NULL);
    free_heartbeat(h);
}
