/* The profile file (ballast-profile/1): one device's per-layer costs for one micro-batch. */
#ifndef BALLAST_PROFILE_H
#define BALLAST_PROFILE_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "err.h"
#include "model.h"

#define PROFILE_NAME_MAX 64
/* A layer's forward or backward time per micro-batch is at most this (about 11.6 days): sums
 * over many layers then stay finite, and the planner's time units stay representable. */
#define PROFILE_MS_MAX 1e9

#define PROFILE_OPTIONS_MAX 4
#define PROFILE_OPTION_NAME_MAX 16

/* A partial recomputation of a layer (`recompute_options` in the file): it keeps kept_bytes
 * per micro-batch (ckpt_bytes <= kept_bytes <= act_bytes) and regenerates the rest,
 * transient_bytes = act_bytes - kept_bytes, just before the layer's backward, at a cost of
 * recompute_ms. Keeping everything (act, 0, 0 ms) and recomputing the whole layer (ckpt,
 * act - ckpt, fwd_ms) are not options: every layer has those two. */
struct recompute_option {
    char name[PROFILE_OPTION_NAME_MAX];
    int64_t kept_bytes;
    int64_t transient_bytes;
    double recompute_ms;
};

/* A link: between neighbouring stages, or a device's to host memory. Absent links are free
 * (no transfer time). */
struct link {
    int present;
    double gbps;       /* gigabits per second, each way */
    double latency_us; /* per transfer */
};

/* Reads a link object at `path` ({"gbps", "latency_us"}). `strict`: unknown members are an
 * error (cluster files); otherwise they are fields a later version added (plan files). */
int link_from_json(const cJSON *obj, const char *file, const char *path, int strict,
                   struct link *l, struct err *e);
cJSON *link_to_json(const struct link *l);
/* Milliseconds to move `bytes` over the link (0 for an absent link). */
double link_transfer_ms(const struct link *l, int64_t bytes);

struct layer_cost {
    char name[MODEL_LAYER_NAME_MAX];
    double fwd_ms;
    double bwd_ms;
    int64_t state_bytes;
    int64_t act_bytes;
    int64_t ckpt_bytes; /* <= act_bytes */
    int64_t out_bytes;
    int64_t workspace_bytes;
    int n_options; /* optional in the file: 0 when absent */
    struct recompute_option options[PROFILE_OPTIONS_MAX];
    /* state_bytes split into weights, fp32 gradients and what only the optimizer needs (m, v
     * and a bf16 model's fp32 master), all three or none in the file; has_split 0: none, and
     * the layer's optimizer cannot move to the host (nothing says what stays). */
    int has_split;
    int64_t param_bytes, grad_bytes, optimizer_bytes;
    double optimizer_ms;      /* one AdamW step of the layer on the device; 0 when absent */
    double host_optimizer_ms; /* the same on the host's cores; 0 when absent */
    /* ZeRO-1: the data-parallel replicas whose shares of the optimizer state make the whole,
     * optimizer_bytes being one share (cost_group_layer; a plan stage's dp when it shards);
     * 0 or 1: not sharded. Not a file field. */
    int optimizer_shards;
    /* The backward split into an input-gradient pass and a weight-gradient pass (schedules
     * zb-h1 and v-half, schedule.h): the bytes the weight pass keeps from the one to the
     * other (the output gradients of the layer's matrix products) and its share of bwd_ms
     * ("wgrad_bytes", "wgrad_ms"; 0 and 0 when absent, or for a layer that does not split).
     * split_*: as the file states them; wgrad_*: what the cost model applies (cost.h), the
     * same in a plan, and 0 in a cluster's profiles until the planner plans a schedule that
     * splits the backward. */
    int64_t wgrad_bytes, split_bytes;
    double wgrad_ms, split_ms; /* <= bwd_ms */
};

struct device_info {
    char name[PROFILE_NAME_MAX];
    char kind[8]; /* "cpu" or "cuda" */
    int64_t memory_bytes;
};

struct profile {
    struct device_info device;
    int estimated;
    struct link host_link; /* the device's link to host memory ("host_link"), if known */
    struct model model;
    int n_layers;
    struct layer_cost *layers; /* owned, n_layers of them, in model order */
    cJSON *provenance;         /* owned, may be NULL: where the numbers come from */
    /* "tp_efficiency"?: the share of ideal speed-up its compute reaches split over a
     * tensor-parallel group (cost.h cost_group); 0 when not stated, taken as 1.0 */
    double tp_efficiency;
    /* "tp"?: the layers' costs are on each GPU of a tensor-parallel group of this many (an
     * estimate for a (device, tp) pair, cluster_group_profile); 1 when absent */
    int tp;
};

/* Reads and validates a profile: every layer of the model, in order, with its expected
 * name (a custom model: any names; its layer list is its layers); times in [0, PROFILE_MS_MAX]; 0 <= ckpt_bytes <= act_bytes; recompute options with
 * distinct names (none "keep" or "full"), ckpt_bytes <= kept_bytes and kept_bytes +
 * transient_bytes = act_bytes; param_bytes, grad_bytes and optimizer_bytes all or none, summing
 * to state_bytes. Fields a later version
 * adds are ignored (but not in the embedded model, which must be exactly the model's). On
 * failure nothing is left allocated. */
int profile_load(const char *file, struct profile *p, struct err *e);
int profile_from_json(const cJSON *root, const char *file, struct profile *p, struct err *e);
cJSON *profile_to_json(const struct profile *p);
int profile_write(const char *file, const struct profile *p, struct err *e);
void profile_free(struct profile *p);

/* A layer's name in a profile or plan: the model's name for it (GPT), any but "" (custom). */
int profile_check_layer_name(const struct model *m, int layer, const char *name,
                             const char *file, const char *path, struct err *e);
/* Reads one layer cost object (shared with the plan file, which embeds them). */
int layer_cost_from_json(const cJSON *obj, const char *file, const char *path,
                         struct layer_cost *c, struct err *e);
cJSON *layer_cost_to_json(const struct layer_cost *c);

#endif
