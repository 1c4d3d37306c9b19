#include "splittest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_layers.h"
#include "sizes.h"

struct grads {
    int n;
    int64_t bytes[SIZES_TENSORS_MAX];
    float *g[SIZES_TENSORS_MAX];
};

static void grads_save(const struct layer_view *v, struct grads *s)
{
    struct sizes_tensor t[SIZES_TENSORS_MAX];
    s->n = sizes_layer_tensors(v->model, v->kind, SIZES_PARAMS, t);
    for (int k = 0; k < s->n; k++) {
        s->bytes[k] = t[k].elems * 4;
        s->g[k] = malloc((size_t)s->bytes[k]);
        memcpy(s->g[k], v->grads[k], (size_t)s->bytes[k]);
        memset(v->grads[k], 0, (size_t)s->bytes[k]);
    }
}

static void grads_free(struct grads *s)
{
    for (int k = 0; k < s->n; k++)
        free(s->g[k]);
}

/* One backward with output gradient g: its input gradient into `dinp_out`. */
static int one(struct backend *be, struct layer_view *v, int dout, int dinp, const float *g,
               int64_t act, float *dinp_out)
{
    struct err e;
    err_clear(&e);
    memcpy(v->ws[dout], g, (size_t)act);
    int rc = backend_layers(be, v->model)[v->kind].backward(be, v, 1.0f, &e);
    memcpy(dinp_out, v->ws[dinp], (size_t)act);
    if (rc)
        fprintf(stderr, "\nbackward: %s\n", e.msg);
    return rc;
}

/* Whether the n floats at p are all zero. */
static int zeros(const float *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (p[i] != 0)
            return 0;
    return 1;
}

int split_matches_fused(struct backend *be, struct layer_view *v, int dout, int dinp,
                        const float *g0, const float *g1)
{
    const struct model *m = v->model;
    int64_t act = (int64_t)m->micro_batch * m->seq_len * m->n_embd * 4;
    float *d[4];
    for (int i = 0; i < 4; i++)
        d[i] = malloc((size_t)act);
    struct sizes_tensor t[SIZES_TENSORS_MAX];
    int n = sizes_wgrad_tensors(m, v->kind, t);
    void *stash[2][SIZES_TENSORS_MAX] = {{0}};
    struct layer_wgrad rec[2];
    struct grads fused;
    struct err e;
    err_clear(&e);
    /* fused */
    int rc = one(be, v, dout, dinp, g0, act, d[0]) || one(be, v, dout, dinp, g1, act, d[1]);
    grads_save(v, &fused); /* and the gradients zero again */
    /* split: both B passes (the products' weight gradients left untouched), then both W */
    for (int s = 0; s < 2 && rc == 0; s++) {
        for (int k = 0; k < n; k++)
            v->wstash[k] = stash[s][k] = calloc(1, (size_t)sizes_tensor_bytes(&t[k]));
        v->wgrad = &rec[s];
        rec[s].n = 0;
        rc = one(be, v, dout, dinp, s ? g1 : g0, act, d[2 + s]);
    }
    v->wgrad = NULL;
    int deferred = rc == 0 && n > 0 && rec[0].n == n;
    for (int k = 0; k < rec[0].n && deferred; k++)
        deferred = zeros(rec[0].p[k].dw, (int64_t)rec[0].p[k].OC * rec[0].p[k].C);
    for (int s = 0; s < 2 && rc == 0; s++) {
        for (int k = 0; k < n; k++)
            v->wstash[k] = stash[s][k];
        rc = layer_weight_pass(be, v, &rec[s], &e);
    }
    int ok = deferred && rc == 0 && memcmp(d[0], d[2], (size_t)act) == 0 &&
             memcmp(d[1], d[3], (size_t)act) == 0;
    for (int k = 0; k < fused.n && rc == 0; k++)
        ok &= memcmp(v->grads[k], fused.g[k], (size_t)fused.bytes[k]) == 0;
    if (!ok)
        fprintf(stderr, "\nsplit backward (%d products, %d weight-pass tensors): deferred %d, "
                        "weight pass %d (%s), not bitwise the fused backward\n",
                rec[0].n, n, deferred, rc, e.msg);
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < n; k++)
            free(stash[s][k]);
    grads_free(&fused);
    for (int i = 0; i < 4; i++)
        free(d[i]);
    return ok;
}
