#include "hostmirror.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "half.h"
#include "kernels_cpu.h"
#include "progress.h"

/* Where a layer's update stands: nothing pending (its weights on the device are current),
 * gradients copying down, on the host thread's queue (or being stepped), weights copying up. */
enum { HM_IDLE, HM_DOWN, HM_QUEUED, HM_UP };

/* The mirror's sections, as byte offsets into h->mem: each holds bytes [host_lo,
 * section_bytes) of an fp32 section (layout.h), those of the layers from host_from on. */
static char *section(const struct hostmirror *h, int which, int64_t off)
{
    const struct stage_layout *lay = h->lay;
    return h->mem + (int64_t)which * (lay->section_bytes - lay->host_lo) + (off - lay->host_lo);
}
enum { SEC_MASTER, SEC_M, SEC_V, SEC_LANDING };

char *hostmirror_landing(const struct hostmirror *h)
{
    return section(h, SEC_LANDING, h->lay->host_lo);
}

char *hostmirror_weights(const struct hostmirror *h)
{
    return h->mem + 4 * (h->lay->section_bytes - h->lay->host_lo);
}

static int streamed(const struct hostmirror *h, int li)
{
    return li >= h->lay->stream_from;
}

/* A streamed layer's new weights into the host's copy of them (exec_stream.c fetches them):
 * its master weights, rounded for a 16-bit model. */
static void stream_weights_out(struct hostmirror *h, int li)
{
    const struct stage_layout *lay = h->lay;
    const struct layer_layout *L = &lay->layers[li];
    for (int k = 0; k < L->n_params; k++) {
        char *w = hostmirror_weights(h) + (L->weight_off[k] - lay->dev_weights_bytes);
        const float *master = (const float *)section(h, SEC_MASTER, L->param_off[k]);
        if (lay->dtype == MODEL_DTYPE_FP32)
            memcpy(w, master, sizeof(float) * (size_t)L->params[k].elems);
        else
            half_narrow(lay->dtype, (uint16_t *)w, master, L->params[k].elems);
    }
}

/* One AdamW step of layer li, then (a 16-bit model) its master weights rounded into its
 * landing range, which its gradients no longer need: what goes up. */
static void update_layer(struct hostmirror *h, int li, int t)
{
    const struct stage_layout *lay = h->lay;
    const struct layer_layout *L = &lay->layers[li];
    const struct adamw_params *p = &h->adamw;
    for (int k = 0; k < L->n_params; k++) {
        int64_t off = L->param_off[k];
        adamw_update((float *)section(h, SEC_MASTER, off), (float *)section(h, SEC_LANDING, off),
                     (float *)section(h, SEC_M, off), (float *)section(h, SEC_V, off),
                     L->params[k].elems, p->lr, p->beta1, p->beta2, p->eps,
                     layout_param_decays(L->params[k].name) ? p->weight_decay : 0.0f, t);
    }
    if (streamed(h, li)) {
        stream_weights_out(h, li);
        return;
    }
    if (lay->dtype == MODEL_DTYPE_FP32)
        return;
    int64_t sec_off, sec_bytes, w_off, w_bytes;
    layout_layer_ranges(lay, li, &sec_off, &sec_bytes, &w_off, &w_bytes);
    for (int k = 0; k < L->n_params; k++) {
        uint16_t *w = (uint16_t *)section(h, SEC_LANDING, sec_off + L->weight_off[k] - w_off);
        half_narrow(lay->dtype, w, (const float *)section(h, SEC_MASTER, L->param_off[k]),
                    L->params[k].elems);
    }
}

static void *host_thread(void *arg)
{
    struct hostmirror *h = arg;
    omp_set_num_threads(h->threads); /* a new thread starts from the process's defaults */
    int n = h->lay->n_layers;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (h->q_len == 0 && !h->stop)
            pthread_cond_wait(&h->cv, &h->mu);
        if (h->q_len == 0)
            break;
        int li = h->queue[h->q_head];
        h->q_head = (h->q_head + 1) % n;
        h->q_len--;
        int64_t step = h->step[li];
        int t = h->t[li];
        pthread_mutex_unlock(&h->mu);
        double t0 = exec_now_ms();
        update_layer(h, li, t);
        double t1 = exec_now_ms();
        pthread_mutex_lock(&h->mu);
        h->done[h->n_done++] = (struct hostmirror_done){li, step, t0, t1};
        progress_tick();
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

int hostmirror_init(struct hostmirror *h, struct backend *be, const struct stage_layout *lay,
                    char *persistent, const struct adamw_params *p, int threads, struct err *e)
{
    memset(h, 0, sizeof *h);
    h->be = be;
    h->lay = lay;
    h->persistent = persistent;
    h->adamw = *p;
    h->threads = threads > 0 ? threads : 1;
    size_t n = (size_t)lay->n_layers;
    h->state = calloc(n, sizeof *h->state);
    h->down_ev = malloc(n * sizeof *h->down_ev);
    h->up_ev = malloc(n * sizeof *h->up_ev);
    h->step = calloc(n, sizeof *h->step);
    h->t = calloc(n, sizeof *h->t);
    h->queue = calloc(n, sizeof *h->queue);
    h->done = calloc(n, sizeof *h->done);
    if (!h->state || !h->down_ev || !h->up_ev || !h->step || !h->t || !h->queue || !h->done)
        return err_set(e, ERR_FAIL, "out of memory setting up the host optimizer");
    for (size_t li = 0; li < n; li++)
        h->down_ev[li] = h->up_ev[li] = -1;
    if (be->ops->host_alloc(be, lay->mirror_bytes, (void **)&h->mem, e))
        return err_set(e, ERR_NOFIT, "layers %d-%d: host memory for the optimizer's mirror "
                       "(%lld bytes): %s", lay->first, lay->last, (long long)lay->mirror_bytes,
                       e->msg);
    memset(h->mem, 0, (size_t)lay->mirror_bytes);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    if (pthread_create(&h->thread, NULL, host_thread, h) != 0)
        return err_set(e, ERR_FAIL, "cannot start the host optimizer's thread");
    h->started = 1;
    return ERR_OK;
}

void hostmirror_free(struct hostmirror *h)
{
    struct err e;
    if (h->started) {
        for (int li = 0; li < h->lay->n_layers; li++)
            if (h->state[li] == HM_DOWN || h->state[li] == HM_UP)
                h->be->ops->event_wait(h->be, h->state[li] == HM_DOWN ? h->down_ev[li]
                                                                      : h->up_ev[li], &e);
        h->be->ops->sync(h->be, &e); /* the copies into and out of the mirror have ended */
        pthread_mutex_lock(&h->mu);
        h->stop = 1;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->thread, NULL);
        pthread_mutex_destroy(&h->mu);
        pthread_cond_destroy(&h->cv);
    }
    if (h->mem != NULL)
        h->be->ops->host_release(h->be, h->mem);
    free(h->state);
    free(h->down_ev);
    free(h->up_ev);
    free(h->step);
    free(h->t);
    free(h->queue);
    free(h->done);
    memset(h, 0, sizeof *h);
}

/* The hand-offs that are due: landed gradients to the host thread, finished updates up. */
static int progress(struct hostmirror *h, struct executor *x, struct err *e)
{
    const struct stage_layout *lay = h->lay;
    int n = lay->n_layers;
    for (int li = 0; li < n; li++) {
        int landed;
        if (h->state[li] != HM_DOWN)
            continue;
        ERR_TRY(h->be->ops->event_query(h->be, h->down_ev[li], &landed, e));
        if (!landed)
            continue;
        h->state[li] = HM_QUEUED;
        pthread_mutex_lock(&h->mu);
        h->queue[(h->q_head + h->q_len++) % n] = li;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
    }
    for (;;) {
        struct hostmirror_done d = {.li = -1};
        pthread_mutex_lock(&h->mu);
        if (h->n_done > 0)
            d = h->done[--h->n_done];
        pthread_mutex_unlock(&h->mu);
        if (d.li < 0)
            break;
        int li = d.li;
        int64_t sec_off, sec_bytes, w_off, w_bytes;
        exec_event_at(x, STAGE_EV_HOST_UPDATE, d.step, -1, lay->layers[li].layer, d.t0, d.t1);
        if (streamed(h, li)) { /* its weights stay on the host, fetched as it runs */
            h->state[li] = HM_IDLE;
            continue;
        }
        layout_layer_ranges(lay, li, &sec_off, &sec_bytes, &w_off, &w_bytes);
        /* fp32: the master weights are the weights */
        const char *src = section(h, lay->dtype == MODEL_DTYPE_FP32 ? SEC_MASTER : SEC_LANDING,
                                  sec_off);
        ERR_TRY(h->be->ops->copy_async(h->be, BACKEND_FROM_HOST, h->persistent + w_off, src,
                                       w_bytes, -1, &h->up_ev[li], e));
        h->state[li] = HM_UP;
    }
    return ERR_OK;
}

int hostmirror_grads_done(struct hostmirror *h, struct executor *x, int li, int64_t step, int t,
                          struct err *e)
{
    const struct stage_layout *lay = h->lay;
    int64_t sec_off, sec_bytes, w_off, w_bytes;
    layout_layer_ranges(lay, li, &sec_off, &sec_bytes, &w_off, &w_bytes);
    h->step[li] = step;
    h->t[li] = t;
    if (streamed(h, li)) { /* its gradients are on their way to the landing already */
        h->down_ev[li] = exec_stream_out_event(x, li);
        h->state[li] = HM_DOWN;
        return progress(h, x, e);
    }
    ERR_TRY(h->be->ops->copy_async(h->be, BACKEND_TO_HOST, section(h, SEC_LANDING, sec_off),
                                   h->persistent + lay->dev_grads_at + sec_off, sec_bytes, -1,
                                   &h->down_ev[li], e));
    h->state[li] = HM_DOWN;
    return progress(h, x, e);
}

/* Drives layer li's update until its weights are on their way up (or nothing is pending);
 * *waited: whether the host had to wait for it. */
static int wait_update(struct hostmirror *h, struct executor *x, int li, int *waited,
                       struct err *e)
{
    *waited = 0;
    for (;;) {
        ERR_TRY(progress(h, x, e));
        if (h->state[li] == HM_IDLE || h->state[li] == HM_UP)
            return ERR_OK;
        *waited = 1;
        if (h->state[li] == HM_DOWN) { /* the CPU's lane blocks here; a GPU's is polled */
            ERR_TRY(h->be->ops->event_wait(h->be, h->down_ev[li], e));
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            continue;
        }
        pthread_mutex_lock(&h->mu);
        while (h->n_done == 0)
            pthread_cond_wait(&h->cv, &h->mu);
        pthread_mutex_unlock(&h->mu);
    }
}

/* Layer li's weights current on the device for the compute queued from now on. */
static int weights_arrive(struct hostmirror *h, struct executor *x, int li, struct err *e)
{
    double t0 = exec_now_ms();
    int waited, done = 1;
    ERR_TRY(wait_update(h, x, li, &waited, e));
    if (h->state[li] == HM_UP) {
        ERR_TRY(h->be->ops->event_query(h->be, h->up_ev[li], &done, e));
        ERR_TRY(h->be->ops->event_wait(h->be, h->up_ev[li], e));
        h->state[li] = HM_IDLE;
    }
    if (waited || !done) { /* as exec's copy waits: the stall is timed to the weights' arrival */
        ERR_TRY(h->be->ops->sync(h->be, e));
        exec_event(x, STAGE_EV_STALL, -1, h->lay->layers[li].layer, t0, exec_now_ms());
    }
    return ERR_OK;
}

int hostmirror_weights_ready(struct hostmirror *h, struct executor *x, int li, struct err *e)
{
    int64_t sec_off, sec_bytes, w_off, w_bytes;
    ERR_TRY(weights_arrive(h, x, li, e));
    if (streamed(h, li)) /* its first backward starts its gradients from zero */
        return ERR_OK;
    /* the gradients went down before the update ran: the new step's start from zero */
    layout_layer_ranges(h->lay, li, &sec_off, &sec_bytes, &w_off, &w_bytes);
    return h->be->ops->zero(h->be, h->persistent + h->lay->dev_grads_at + sec_off, sec_bytes, e);
}

int hostmirror_drain(struct hostmirror *h, struct executor *x, struct err *e)
{
    for (int li = h->lay->host_from; li < h->lay->n_layers; li++)
        ERR_TRY(weights_arrive(h, x, li, e));
    return h->be->ops->sync(h->be, e);
}
