/* The executor's events, copy waits and clock (exec.h): below exec.c and its parts, which all
 * record into them. */
#include "exec.h"

#include <stdlib.h>

#include "clock.h"

double exec_now_ms(void)
{
    return 1e3 * clock_now_s();
}

void exec_event(struct executor *x, int kind, int micro, int layer, double t0, double t1)
{
    exec_event_at(x, kind, x->step, micro, layer, t0, t1);
}

void exec_event_at(struct executor *x, int kind, int64_t step, int micro, int layer, double t0,
                   double t1)
{
    /* the copies run beside the step: their time is the lanes' (copy_ms), not the step's */
    double *acc[STAGE_EV_KINDS] = {&x->times.fwd,  &x->times.recompute, &x->times.bwd,
                                   &x->times.send, &x->times.idle,      &x->times.optimizer,
                                   &x->times.stall, NULL, NULL, &x->times.host_update,
                                   &x->times.bwd}; /* a weight pass is backward time */
    if (acc[kind] != NULL)
        *acc[kind] += t1 - t0;
    if (!x->c.record_events)
        return;
    if (x->n_events == x->cap_events) {
        int cap = x->cap_events ? 2 * x->cap_events : 1024;
        struct stage_event *p = realloc(x->events, sizeof *p * (size_t)cap);
        if (p == NULL)
            return; /* the trace loses events; the run goes on */
        x->events = p;
        x->cap_events = cap;
    }
    x->events[x->n_events++] = (struct stage_event){kind, (int32_t)step, micro, layer,
                                                    t0 - x->origin_ms, t1 - x->origin_ms};
}

/* Compute waiting for copy `ev` of layer li's tensors: a stall event when the copy is still
 * running (*late). The spans sync the backend around every layer anyway, so the host is
 * level with the device here: a copy not done is late, and syncing then (after the compute
 * queued its wait) times the stall where the span would have. */
int exec_copy_wait(struct executor *x, int ev, int li, int micro, int *late, struct err *e)
{
    int done;
    ERR_TRY(x->c.be->ops->event_query(x->c.be, ev, &done, e));
    double t0 = exec_now_ms();
    ERR_TRY(x->c.be->ops->event_wait(x->c.be, ev, e));
    if (!done) {
        ERR_TRY(x->c.be->ops->sync(x->c.be, e));
        exec_event(x, STAGE_EV_STALL, micro, x->c.lay->layers[li].layer, t0, exec_now_ms());
    }
    *late = !done;
    return ERR_OK;
}

/* A copy submitted this step, for the trace (record_events). */
void exec_copy_note(struct executor *x, int ev, int li, int micro, int dir)
{
    struct exec_offload *o = &x->off;
    if (o->copies != NULL)
        o->copies[o->n_copies++] = (struct exec_copy){ev, li, micro, dir};
}
