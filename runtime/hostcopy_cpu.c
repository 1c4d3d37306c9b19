#include "hostcopy_cpu.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "progress.h"

#define LANE_JOBS 1024

struct job {
    void *dst;
    const void *src;
    int64_t bytes;
    int after;
    double gbps, latency_us;
    double t0_ms, t1_ms; /* when it ran, once done */
};

struct lane {
    struct job jobs[LANE_JOBS]; /* a ring: jobs[seq % LANE_JOBS] */
    int64_t queued, done;       /* sequence numbers: copies submitted, finished */
    double busy_ms;
    pthread_t thread;
    struct hostcopy *h;
    int dir;
};

struct hostcopy {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* any change to either lane */
    int stop;
    struct lane lane[2];
};

/* Under the lock. */
static int is_done(const struct hostcopy *h, int ev)
{
    return ev < 0 || h->lane[ev & 1].done >= ev / 2;
}

static void sleep_until(double t_ms)
{
    double left = t_ms - clock_now_ms();
    if (left <= 0)
        return;
    struct timespec ts = {(time_t)(left / 1e3), (long)((left - 1e3 * (double)(time_t)(left / 1e3)) * 1e6)};
    nanosleep(&ts, NULL);
}

static void *lane_run(void *arg)
{
    struct lane *l = arg;
    struct hostcopy *h = l->h;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (l->done == l->queued && !h->stop)
            pthread_cond_wait(&h->cv, &h->mu);
        if (l->done == l->queued)
            break;
        struct job j = l->jobs[l->done % LANE_JOBS];
        while (!is_done(h, j.after))
            pthread_cond_wait(&h->cv, &h->mu);
        pthread_mutex_unlock(&h->mu);
        double t0 = clock_now_ms();
        memcpy(j.dst, j.src, (size_t)j.bytes);
        if (j.gbps > 0)
            sleep_until(t0 + j.latency_us * 1e-3 + (double)j.bytes * 8 / (j.gbps * 1e6));
        double t1 = clock_now_ms();
        pthread_mutex_lock(&h->mu);
        l->jobs[l->done % LANE_JOBS].t0_ms = t0;
        l->jobs[l->done % LANE_JOBS].t1_ms = t1;
        l->busy_ms += t1 - t0;
        l->done++;
        progress_tick();
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

int hostcopy_start(struct hostcopy **out, struct err *e)
{
    struct hostcopy *h = calloc(1, sizeof *h);
    if (h == NULL)
        return err_set(e, ERR_FAIL, "out of memory starting the copy threads");
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    for (int d = 0; d < 2; d++) {
        h->lane[d].h = h;
        h->lane[d].dir = d;
        if (pthread_create(&h->lane[d].thread, NULL, lane_run, &h->lane[d]) != 0) {
            h->stop = 1;
            for (int k = 0; k < d; k++)
                pthread_join(h->lane[k].thread, NULL);
            free(h);
            return err_set(e, ERR_FAIL, "cannot start the copy threads");
        }
    }
    *out = h;
    return ERR_OK;
}

void hostcopy_stop(struct hostcopy *h)
{
    if (h == NULL)
        return;
    pthread_mutex_lock(&h->mu);
    h->stop = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    for (int d = 0; d < 2; d++)
        pthread_join(h->lane[d].thread, NULL);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
}

int hostcopy_submit(struct hostcopy *h, int dir, void *dst, const void *src, int64_t bytes,
                    int after, double gbps, double latency_us, int *ev, struct err *e)
{
    struct lane *l = &h->lane[dir & 1];
    pthread_mutex_lock(&h->mu);
    while (l->queued - l->done >= LANE_JOBS) /* the ring is full: a copy must finish */
        pthread_cond_wait(&h->cv, &h->mu);
    if (l->queued + 1 > (int64_t)(0x3fffffff)) {
        pthread_mutex_unlock(&h->mu);
        return err_set(e, ERR_FAIL, "internal: copy lane %d ran out of event numbers", dir);
    }
    l->jobs[l->queued % LANE_JOBS] = (struct job){dst, src, bytes, after, gbps, latency_us, 0, 0};
    l->queued++;
    *ev = (int)(2 * l->queued + (dir & 1));
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return ERR_OK;
}

int hostcopy_done(struct hostcopy *h, int ev)
{
    pthread_mutex_lock(&h->mu);
    int d = is_done(h, ev);
    pthread_mutex_unlock(&h->mu);
    return d;
}

void hostcopy_wait(struct hostcopy *h, int ev)
{
    pthread_mutex_lock(&h->mu);
    while (!is_done(h, ev))
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
}

void hostcopy_busy(struct hostcopy *h, double ms[2])
{
    pthread_mutex_lock(&h->mu);
    for (int d = 0; d < 2; d++) {
        ms[d] += h->lane[d].busy_ms;
        h->lane[d].busy_ms = 0;
    }
    pthread_mutex_unlock(&h->mu);
}

int hostcopy_span(struct hostcopy *h, int ev, double *t0_ms, double *t1_ms)
{
    const struct lane *l = &h->lane[ev & 1];
    int64_t seq = ev / 2;
    pthread_mutex_lock(&h->mu);
    while (!is_done(h, ev))
        pthread_cond_wait(&h->cv, &h->mu);
    int known = ev >= 2 && seq > l->queued - LANE_JOBS;
    if (known) {
        *t0_ms = l->jobs[(seq - 1) % LANE_JOBS].t0_ms;
        *t1_ms = l->jobs[(seq - 1) % LANE_JOBS].t1_ms;
    }
    pthread_mutex_unlock(&h->mu);
    return known;
}
