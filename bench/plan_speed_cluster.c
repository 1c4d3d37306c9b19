/* The random clusters of plan_speed --search (and of the search's time-limit test): a GPT of
 * 8192 width (the shipped GPT-76B's blocks: 14.5 GB of state, 1 GB kept per micro-batch) or of
 * 4096 (a quarter of the state: more layers fit a stage, so far more splits do), 1.5 S blocks,
 * bf16, sequence 2048, micro-batch 1; K = 2..4 device kinds drawn from five GPUs, in equal
 * groups or random counts (each at least S/8), in a random order; nodes of 8 on NVLink,
 * InfiniBand between them; 1F1B with M = 2S unless asked. Profiles are estimated per kind,
 * then every block's times (forward, backward, recompute options) are scaled by one factor
 * that varies along the model, a slow wave times a ramp, the same on every kind: real models
 * are not uniform (wider blocks, MoE layers, attention windows). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "estimate.h"
#include "plan_speed_search.h"

static const char *const gpus[] = {"A100-40GB", "A100-80GB", "H100-80GB", "H200", "V100-32GB"};
#define N_GPUS 5
#define KINDS_MAX 4

struct rng {
    uint64_t s;
};

static uint64_t rng_next(struct rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_double(struct rng *r, double lo, double hi)
{
    return lo + (hi - lo) * (double)(rng_next(r) >> 11) / 9007199254740992.0;
}

static int rng_int(struct rng *r, int lo, int hi)
{
    return lo + (int)(rng_next(r) % (uint64_t)(hi - lo + 1));
}

/* Scales every block's times by the instance's factor along the model. */
static void vary_along_model(struct profile *p, double amp, double freq, double phase, double ramp)
{
    int n = p->n_layers;
    for (int l = 1; l + 1 < n; l++) {
        double x = (double)l / n;
        double f = exp(amp * sin(2 * M_PI * freq * x + phase) + ramp * (x - 0.5));
        struct layer_cost *lc = &p->layers[l];
        lc->fwd_ms *= f;
        lc->bwd_ms *= f;
        for (int k = 0; k < lc->n_options; k++)
            lc->options[k].recompute_ms *= f;
    }
}

/* Stage counts of K kinds adding up to S, each at least S/8. */
static void kind_counts(struct rng *r, int S, int K, int equal, int *count)
{
    int floor_count = S / 8 > 1 ? S / 8 : 1, left = S - K * floor_count;
    for (int k = 0; k < K; k++)
        count[k] = equal ? S / K + (k < S % K) : floor_count;
    for (; !equal && left > 0; left--)
        count[rng_int(r, 0, K - 1)]++;
}

static int random_cluster(const struct device_table *t, struct rng *r, int S, int M,
                          struct cluster *c, char *what, size_t what_size, struct err *e)
{
    int K = rng_int(r, 2, KINDS_MAX), equal = rng_int(r, 0, 1), picked[N_GPUS], count[KINDS_MAX];
    for (int g = 0; g < N_GPUS; g++)
        picked[g] = g;
    for (int g = 0; g < K; g++) { /* the first K of a random shuffle, in that order */
        int j = rng_int(r, g, N_GPUS - 1), tmp = picked[g];
        picked[g] = picked[j];
        picked[j] = tmp;
    }
    kind_counts(r, S, K, equal, count);
    double amp = rng_double(r, 0, 0.4), freq = rng_double(r, 0.5, 3);
    double phase = rng_double(r, 0, 2 * M_PI), ramp = rng_double(r, -0.6, 0.6);
    int width = rng_int(r, 0, 1) ? 8192 : 4096;
    memset(c, 0, sizeof *c);
    c->schedule = SCHEDULE_1F1B;
    c->micro_batches = M > 0 ? M : 2 * S;
    c->reserve_bytes = (int64_t)2 << 30;
    c->model = (struct model){.n_layer = 3 * S / 2, .n_embd = width, .n_head = width / 128,
                              .seq_len = 2048, .vocab_size = 50257, .micro_batch = 1,
                              .dtype = MODEL_DTYPE_BF16};
    c->n_layers = model_layer_count(&c->model);
    c->n_stages = S;
    c->n_profiles = K;
    c->link = (struct link){1, 400, 5};
    c->stages = calloc((size_t)S, sizeof *c->stages);
    c->profiles = calloc((size_t)K, sizeof *c->profiles);
    if (c->stages == NULL || c->profiles == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    size_t used = (size_t)snprintf(what, what_size, "w%d ", width);
    for (int k = 0, s = 0; k < K; k++) {
        const struct device_spec *d = devices_find(t, gpus[picked[k]]);
        if (d == NULL)
            return err_set(e, ERR_INPUT, "device %s is not in the device table", gpus[picked[k]]);
        if (estimate_profile(t, d, &c->model, &c->profiles[k], e))
            return e->code;
        vary_along_model(&c->profiles[k], amp, freq, phase, ramp);
        used += (size_t)snprintf(what + used, what_size - used, "%s%dx%s", k ? "+" : "",
                                 count[k], gpus[picked[k]]);
        for (int q = 0; q < count[k]; q++, s++) {
            struct cluster_stage *st = &c->stages[s];
            st->profile = k;
            snprintf(st->device, sizeof st->device, "%s", gpus[picked[k]]);
            st->memory_bytes = d->memory_bytes;
            if (s % 8 != 7)
                st->link = (struct link){1, 2400, 3};
            cluster_even_split(c->n_layers, S, s, &st->first, &st->last);
        }
    }
    return ERR_OK;
}

int plan_speed_random_cluster(const struct device_table *t, uint64_t seed, int S, int i, int M,
                              struct cluster *c, char *what, size_t what_size, struct err *e)
{
    struct rng r = {seed * 1000003u + (uint64_t)S * 1009u + (uint64_t)i};
    return random_cluster(t, &r, S, M, c, what, what_size, e);
}
