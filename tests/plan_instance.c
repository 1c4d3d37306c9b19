#include "plan_instance.h"

#define GIB_BYTES ((int64_t)1 << 30)

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export.h"

void instance_init(struct instance *in, int n, int S, enum schedule sched, int micro_batches,
                   double gbps, int64_t host)
{
    memset(in, 0, sizeof *in);
    in->prof.n_layers = n;
    in->prof.layers = calloc((size_t)n, sizeof *in->prof.layers);
    snprintf(in->prof.device.name, sizeof in->prof.device.name, "gpu");
    snprintf(in->prof.device.kind, sizeof in->prof.device.kind, "cuda");
    in->prof.device.memory_bytes = (int64_t)1000 << 30;
    in->prof.model = (struct model){.kind = MODEL_KIND_CUSTOM, .layer_count = n};
    snprintf(in->prof.model.name, sizeof in->prof.model.name, "instance");
    for (int l = 0; l < n; l++)
        snprintf(in->prof.layers[l].name, sizeof in->prof.layers[l].name, "l%d", l);
    struct cluster *c = &in->c;
    *c = (struct cluster){.schedule = sched, .micro_batches = micro_batches,
                          .model = in->prof.model, .n_layers = n, .n_stages = S,
                          .n_profiles = 1, .profiles = &in->prof};
    c->stages = calloc((size_t)S, sizeof *c->stages);
    for (int s = 0; s < S; s++) {
        struct cluster_stage *st = &c->stages[s];
        snprintf(st->device, sizeof st->device, "gpu");
        cluster_even_split(n, S, s, &st->first, &st->last);
        st->host_memory_bytes = host;
        st->host_link = (struct link){1, gbps, 10};
        if (s + 1 < S)
            st->link = (struct link){1, 100, 5};
    }
}

void instance_free(struct instance *in)
{
    free(in->c.stages);
    free(in->prof.layers);
}

void instance_attn_option(struct layer_cost *c, struct test_rng *r)
{
    c->n_options = 1;
    snprintf(c->options[0].name, sizeof c->options[0].name, "attn");
    c->options[0].transient_bytes = c->act_bytes / 2;
    c->options[0].kept_bytes = c->act_bytes - c->options[0].transient_bytes;
    c->options[0].recompute_ms = c->fwd_ms * test_rng_double(r, 0.1, 0.5);
}

void instance_mlp_option(struct layer_cost *c, struct test_rng *r)
{
    c->n_options = 2;
    snprintf(c->options[1].name, sizeof c->options[1].name, "mlp");
    c->options[1].transient_bytes = c->act_bytes / 4;
    c->options[1].kept_bytes = c->act_bytes - c->options[1].transient_bytes;
    c->options[1].recompute_ms = c->fwd_ms * test_rng_double(r, 0.05, 0.3);
}

void instance_split_layer(struct layer_cost *c, struct test_rng *r)
{
    c->fwd_ms = test_rng_double(r, 1, 4);
    c->bwd_ms = 2 * c->fwd_ms;
    c->has_split = 1;
    c->param_bytes = c->grad_bytes = test_rng_int(r, 1, 3) * GIB_BYTES;
    c->optimizer_bytes = 2 * c->grad_bytes;
    c->state_bytes = c->param_bytes + c->grad_bytes + c->optimizer_bytes;
    c->optimizer_ms = test_rng_double(r, 0.5, 8);
    c->host_optimizer_ms = test_rng_double(r, 1, 30);
    c->act_bytes = test_rng_int(r, 2, 8) * GIB_BYTES;
    c->ckpt_bytes = c->act_bytes / 8;
    c->out_bytes = c->ckpt_bytes;
    c->workspace_bytes = GIB_BYTES / 4;
    instance_attn_option(c, r);
}

void instance_hostopt_make(struct instance *in, struct test_rng *r, enum schedule sched,
                           double gbps, int64_t host, double room)
{
    int n = 4, S = 2;
    instance_init(in, n, S, sched, 4, gbps, host);
    for (int l = 0; l < n; l++)
        instance_split_layer(&in->prof.layers[l], r);
    struct cluster *c = &in->c;
    for (int s = 0; s < S; s++) {
        struct cluster_stage *st = &c->stages[s];
        int64_t least = GIB_BYTES / 2, most = GIB_BYTES;
        int v = schedule_in_flight(sched, S, s, c->micro_batches);
        for (int l = st->first; l <= st->last; l++) {
            const struct layer_cost *y = &in->prof.layers[l];
            least += y->param_bytes + y->grad_bytes + v * y->ckpt_bytes + y->act_bytes;
            most += y->state_bytes + v * y->act_bytes;
        }
        double f = room < 0 ? test_rng_double(r, 0, 1) : room;
        st->memory_bytes = least + (int64_t)(f * (double)(most - least));
    }
}

void instance_stream_make(struct instance *in, struct test_rng *r, enum schedule sched,
                          double gbps, int64_t host)
{
    int n = 4;
    instance_init(in, n, 1, sched, 4, gbps, host);
    int64_t least = GIB_BYTES / 2, most = GIB_BYTES / 2, stream = 0;
    for (int l = 0; l < n; l++) {
        const struct layer_cost *y = &in->prof.layers[l];
        instance_split_layer(&in->prof.layers[l], r);
        least += 4 * y->ckpt_bytes + y->act_bytes;
        most += y->param_bytes + y->grad_bytes + 4 * y->act_bytes;
        stream = y->param_bytes + y->grad_bytes > stream ? y->param_bytes + y->grad_bytes : stream;
    }
    least += COST_STREAM_BUFFERS * stream;
    in->c.stages[0].memory_bytes = least + (int64_t)(test_rng_double(r, 0, 1) * (most - least));
}

int plan_with(const struct instance *in, int actions, int verify, struct plan *p)
{
    struct plan_options o;
    struct err e;
    plan_options_default(&o);
    err_clear(&e);
    o.actions = actions;
    o.verify = verify;
    o.min_gain = 0; /* the exact optimum, which the brute force is */
    return planner_make(&in->c, &o, p, &e);
}

/* The actions the options allow each layer of p (4 layers at most). */
static void allowed_rows(const struct plan *p, int actions, struct cost_row rows[4][COST_ACTIONS_MAX],
                         int count[4])
{
    int L = 0;
    for (int s = 0; s < p->n_stages; s++)
        for (int l = 0; l < plan_stage_layer_count(&p->stages[s]); l++, L++) {
            struct cost_row all[COST_ACTIONS_MAX];
            int k = cost_actions(&p->stages[s].layers[l],
                                 cost_whole_offload(&p->model, l, p->stages[s].first + l), all);
            count[L] = 0;
            for (int a = 0; a < k; a++)
                if ((all[a].host_bytes == 0 || (actions & PLAN_ACTION_OFFLOAD)) &&
                    (all[a].action.choice == COST_KEEP || (actions & PLAN_ACTION_RECOMPUTE)))
                    rows[L][count[L]++] = all[a];
        }
}

/* A stage's optimizer place and streamed weights (instance_each_plan's order). */
struct place {
    enum cost_place optimizer;
    int from, stream;
};

/* Every place `actions` allows stage st (only the device's with `device_only`): the device;
 * the host (for each run of last layers with optimizer-fraction), each with each count of
 * its hosted layers streaming their weights with --actions weights. */
static int stage_places(const struct plan_stage *st, int actions, int device_only,
                        struct place out[64])
{
    int n = plan_stage_layer_count(st), count = 0;
    out[count++] = (struct place){COST_PLACE_DEVICE, 0, 0};
    if (device_only || !(actions & PLAN_ACTION_OPTIMIZER))
        return count;
    int froms = actions & PLAN_ACTION_OPTIMIZER_FRACTION ? n : 1;
    for (int from = 0; from < froms; from++)
        for (int k = 0; k <= (actions & PLAN_ACTION_WEIGHTS ? n - from : 0); k++)
            out[count++] = (struct place){COST_PLACE_HOST, from, k};
    return count;
}

/* p with stage optimizer places `places` (stage s: places[s], set_optimizer's) and layer
 * actions rows[L][pick[L]]: its simulated time if every stage fits its device and host memory,
 * else INFINITY. */
static double score(struct plan *p, const struct place *places,
                    struct cost_row rows[4][COST_ACTIONS_MAX], const int pick[4])
{
    int L = 0;
    for (int s = 0; s < p->n_stages; s++) {
        struct plan_stage *st = &p->stages[s];
        int n = plan_stage_layer_count(st);
        for (int l = 0; l < n; l++, L++) {
            st->actions[l] = rows[L][pick[L]].action;
            st->actions[l].weights =
                l >= n - places[s].stream ? COST_PLACE_HOST : COST_PLACE_DEVICE;
        }
        st->optimizer = places[s].optimizer;
        st->optimizer_from = places[s].from;
        struct stage_cost c;
        plan_stage_cost(p, st, &c);
        if (c.memory_bytes > st->memory_limit_bytes || c.host_memory_bytes > st->host_limit_bytes)
            return INFINITY;
    }
    struct sim_result r;
    struct err e;
    err_clear(&e);
    double ms = sim_plan(p, &r, &e) == ERR_OK ? r.iteration_ms : INFINITY;
    sim_result_free(&r);
    return ms;
}

void instance_each_plan(struct plan *p, int actions, int device_only,
                        void (*fn)(const struct plan *p, double ms, void *ctx), void *ctx)
{
    struct cost_row rows[4][COST_ACTIONS_MAX];
    int count[4], L = 0;
    allowed_rows(p, actions, rows, count);
    for (int s = 0; s < p->n_stages; s++)
        L += plan_stage_layer_count(&p->stages[s]);
    struct place all[4][64], places[4];
    int at[4] = {0}, opts[4], s;
    for (s = 0; s < p->n_stages; s++) {
        opts[s] = stage_places(&p->stages[s], actions, device_only >> s & 1, all[s]);
        places[s] = all[s][0];
    }
    do {
        int pick[4] = {0}, n;
        for (s = 0; s < p->n_stages; s++)
            places[s] = all[s][at[s]];
        for (;;) {
            double ms = score(p, places, rows, pick);
            if (!isinf(ms))
                fn(p, ms, ctx);
            for (n = 0; n < L && ++pick[n] == count[n]; n++)
                pick[n] = 0;
            if (n == L)
                break;
        }
        for (s = 0; s < p->n_stages && ++at[s] == opts[s]; s++)
            at[s] = 0;
    } while (s < p->n_stages);
}

static void keep_least(const struct plan *p, double ms, void *ctx)
{
    double *best = ctx;
    (void)p;
    *best = ms < *best ? ms : *best;
}

double instance_brute_force(struct plan *p, int actions, int device_only)
{
    double best = INFINITY;
    instance_each_plan(p, actions, device_only, keep_least, &best);
    return best;
}

int instance_export(const struct plan *p, const char *to, char *out, char *note, size_t cap,
                    struct err *e)
{
    FILE *f = tmpfile(), *n = tmpfile(), *py = tmpfile();
    CU_ASSERT_FATAL(f != NULL && n != NULL && py != NULL);
    struct export_options o = {.to = to, .note = n, .stages = py, .stages_module = "st",
                               .plan_name = ""};
    int rc = planner_export(f, p, &o, e);
    FILE *files[2] = {f, n};
    char *texts[2] = {out, note};
    for (int k = 0; k < 2; k++) {
        rewind(files[k]);
        size_t len = fread(texts[k], 1, cap - 1, files[k]);
        texts[k][len] = '\0';
        fclose(files[k]);
    }
    fclose(py);
    return rc;
}
