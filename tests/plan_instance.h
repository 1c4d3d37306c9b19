/* Small planning instances in memory, for the planner's brute-force tests: one custom
 * profile on a "gpu" and a cluster of its stages. */
#ifndef BALLAST_PLAN_INSTANCE_H
#define BALLAST_PLAN_INSTANCE_H

#include "cluster.h"
#include "planner.h"
#include "sim.h"
#include "testutil.h"

struct instance {
    struct cluster c;
    struct profile prof;
};

/* n layers named l0, l1, … (zeroed: the caller fills their costs) of a custom model on a
 * 1000 GiB "gpu", and S stages of them split evenly, each with `host` bytes of host memory
 * over a host link of `gbps` (10 us) and a 100 Gb/s, 5 us link to the next; the caller sets
 * each stage's memory_bytes. */
void instance_init(struct instance *in, int n, int S, enum schedule sched, int micro_batches,
                   double gbps, int64_t host);
void instance_free(struct instance *in);
/* The layer's one partial option, "attn": half its activations, regenerated in 10-50% of its
 * forward (at random), after its fwd_ms and act_bytes are set. */
void instance_attn_option(struct layer_cost *c, struct test_rng *r);
/* The layer's second partial option, "mlp": a quarter of its activations, regenerated in
 * 5-30% of its forward (at random); after instance_attn_option. */
void instance_mlp_option(struct layer_cost *c, struct test_rng *r);
/* A layer at random whose state splits (param and grad k GiB, optimizer 2k: fp32's
 * proportions), 2-8 GiB of activations, one partial option (instance_attn_option). */
void instance_split_layer(struct layer_cost *c, struct test_rng *r);
/* A custom model of 2 stages x 2 layers of instance_split_layer; each stage's device memory
 * `room` of the way (< 0: at random) from what it needs with its optimizer on the host and
 * every layer recomputed to what it needs with its whole state and every activation kept. */
void instance_hostopt_make(struct instance *in, struct test_rng *r, enum schedule sched,
                           double gbps, int64_t host, double room);
/* One stage of 4 instance_split_layer layers whose device memory lies at random between what
 * it needs streaming every layer's weights (every layer recomputed) and what it needs with its
 * optimizer on the host and every activation kept. */
void instance_stream_make(struct instance *in, struct test_rng *r, enum schedule sched,
                          double gbps, int64_t host);
/* planner_make with the default options but `actions`, `verify` and --min-gain 0 (the
 * exact optimum). */
int plan_with(const struct instance *in, int actions, int verify, struct plan *p);
/* The reference for the planner: every optimizer place of every stage (with
 * PLAN_ACTION_OPTIMIZER; with PLAN_ACTION_OPTIMIZER_FRACTION also the host for each run of
 * the stage's last layers; with PLAN_ACTION_WEIGHTS each of those with each count of its
 * hosted last layers streaming their weights; bit s of `device_only` keeps stage s's on the
 * device) and every action
 * the options allow on every layer (4 at most), each stage within its device and host memory,
 * simulated: the least iteration time, INFINITY if nothing fits. p is left with the last
 * combination tried. */
double instance_brute_force(struct plan *p, int actions, int device_only);
/* The same combinations: fn is called with p holding each one that fits, and its step. */
void instance_each_plan(struct plan *p, int actions, int device_only,
                        void (*fn)(const struct plan *p, double ms, void *ctx), void *ctx);
/* What `ballast export --to F` makes of p, in `out`; the note (standard error's text) in
 * `note`, each of `cap` bytes. */
int instance_export(const struct plan *p, const char *to, char *out, char *note, size_t cap,
                    struct err *e);

#endif
