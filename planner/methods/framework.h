/* The training frameworks as planning targets (`ballast plan --for F`, `ballast export --to F`).
 *
 * A framework is data: what its configuration can say about a pipeline's memory actions (the
 * capability table in framework.c). Every framework here counts transformer blocks per stage
 * (the embedding rides with the first stage, the head with the last, and neither is ever
 * recomputed) and recomputes in one of two forms:
 *   full        the first n blocks of a stage, each recomputed whole (Megatron-LM's
 *               --recompute-method block, ColossalAI's num_ckpt_layers_per_stage, FlagScale's
 *               recompute_num_layers_per_stage_micro_batch);
 *   selective   recompute modules on every block of a stage (Megatron-core's
 *               recompute_modules core_attn, mlp), which are the `--for` profiles' options.
 * Each form is set for every stage alike (FW_GLOBAL: one n, one module set) or per stage
 * (FW_PER_STAGE: Megatron-LM and NeMo through a generated per-rank file, FlagScale's
 * per-stage lists, ColossalAI's Llama policy). A stage takes one form or none.
 *
 * A framework's plan is chosen by enumerating its settings: each global setting is applied to
 * every stage, and the per-stage mode gives each stage the fastest of its own menu that fits
 * (the simulated step never decreases when a stage gets slower, sim.h, so that is the best
 * per-stage choice); the fastest fitting setting wins (ties: less memory). The same menus give
 * the repartition search its per-range costs (planner/search/repartition.c). */
#ifndef BALLAST_FRAMEWORK_H
#define BALLAST_FRAMEWORK_H

#include "devices.h"
#include "plan.h"

enum fw_scope { FW_NO = 0, FW_GLOBAL, FW_PER_STAGE };

/* How the framework splits the blocks over the stages. */
enum fw_split {
    FW_SPLIT_ANY,  /* any count per stage (a layout string or a list) */
    FW_SPLIT_ENDS, /* the first and last stage's counts, the stages between them even (NeMo) */
};

/* Megatron-core's selective recompute modules of a dense block. */
enum { FW_MODULE_CORE_ATTN = 1, FW_MODULE_MLP = 2 };

#define FW_NAME_MAX 16

struct framework {
    const char *name;        /* --for and --to: "megatron" */
    const char *title;       /* "Megatron-LM" */
    const char *activations; /* whose activation model its profiles take (profile --for);
                                NULL: Ballast's own runtime */
    const char *hf_type;     /* the HuggingFace model_type this row is for (model_kind's
                                hf_type); NULL: any */
    enum fw_scope full;      /* the first n blocks of a stage recomputed whole */
    int full_all_only;       /* n is all of a stage's blocks or none */
    enum fw_scope selective; /* recompute modules on every block of a stage */
    enum fw_split split;
    int min_blocks;          /* blocks every stage must hold */
    int tp_per_stage;        /* each process mesh its own tensor-parallel size */
    enum fw_scope host_optimizer; /* FW_GLOBAL: every stage's optimizer on the host, or none */
    int per_rank_file;       /* settings per pipeline rank through a generated Python file */
    const char *exporter;    /* the writer (planner/export/): "megatron", "nemo", ... */
};

/* The row for `name` and the model's kind (m NULL: the name's first row, to check a name);
 * NULL for an unknown name. "ballast" is a row with everything allowed (today's planner). */
const struct framework *framework_find(const char *name, const struct model *m);
/* Whether row f is for the model's kind. */
int fw_row_fits(const struct framework *f, const struct model *m);
/* The names --for takes, comma-separated, for messages. */
const char *framework_names(void);
int framework_is_ballast(const struct framework *f);
/* Whether two activation models (profile provenance "for", or "ballast") are one. */
int fw_activations_alike(const char *a, const char *b);

/* Whose activation model profile p's costs are ("ballast": Ballast's own runtime, else its
 * provenance "for") and the attention kernel they assume (its provenance "attention", else the
 * model's). */
void fw_profile_assumptions(const struct profile *p, char acts[PLAN_FRAMEWORK_MAX],
                            enum model_attention *attention);
/* The plan's precision and attention kernel on its stages' devices (`t`: the device table;
 * devices it does not hold, and CPUs, are not checked): ERR_INPUT naming the first stage whose
 * device has no bf16 tensor cores (devices.json bf16_tensor false: compute capability below
 * 8.0) with a bf16 model (fp16 the way out) or flash attention (FlashAttention and
 * TransformerEngine's fused attention need 8.0; materialized attention the way out). */
int fw_device_check(const struct plan *p, const struct framework *f,
                    const struct device_table *t, struct err *e);

/* One stage's recompute as a framework's configuration says it. */
enum fw_recompute { FW_RECOMPUTE_NONE, FW_RECOMPUTE_FULL, FW_RECOMPUTE_SELECTIVE };

struct fw_stage {
    int blocks; /* transformer blocks the stage holds */
    enum fw_recompute recompute;
    int n;            /* FULL: its first n blocks (1..blocks) */
    unsigned modules; /* SELECTIVE: FW_MODULE_* */
};

/* A pipeline's settings in a framework's terms. */
struct fw_settings {
    int n_stages;
    struct fw_stage *stages; /* owned */
    int host_optimizer;      /* every stage's optimizer on the host */
    double host_fraction;    /* the share of each stage's optimizer state there (Megatron-LM's
                                --optimizer-offload-fraction): 1, or a plan's by-layer split */
};

int fw_settings_init(struct fw_settings *s, int n_stages, struct err *e);
void fw_settings_free(struct fw_settings *s);
/* "core_attn", "mlp" or "core_attn mlp" (separated by `sep`). */
void fw_modules_text(unsigned modules, const char *sep, char *out, size_t size);

/* Whether layer `layer` of the plan's model is a transformer block (a custom model's every
 * layer counts as one: the framework cannot be told its layers). */
int fw_is_block(const struct model *m, int layer);
int fw_stage_blocks(const struct plan *p, int s);

/* Stage s's actions as the framework runs `fs`: its first n blocks recomputed whole, or every
 * block the option standing for `modules`, the rest kept on the device, nothing offloaded.
 * ERR_INPUT when a block has no such option. `framework_acts`: the layer costs are the
 * framework's (its mlp module is the profile's "mlp" option only then). */
int fw_stage_apply(struct plan *p, int s, const struct fw_stage *fs, int framework_acts,
                   struct err *e);
/* Applies every stage's and the optimizer's settings, then costs and simulates the plan
 * (planner_finish). */
int fw_settings_apply(struct plan *p, const struct fw_settings *fs, int framework_acts,
                      struct err *e);

/* The plan's actions in a framework's terms, when some framework's configuration can say them
 * exactly (1), or 0 with `why` (a sentence naming the stage and layer) when not: a recomputed
 * embedding or head, blocks recomputed other than the first ones, mixed forms in a stage, an
 * option no module stands for, an offload, a per-stage optimizer place or share. */
int fw_settings_read(const struct plan *p, int framework_acts, struct fw_settings *out,
                     char *why, size_t why_size);
/* The share of its optimizer state every hosted stage keeps on the host, one for all as
 * Megatron-LM's --optimizer-offload-fraction says it (1 where none hosts): 1, or 0 with why
 * when the stages' shares differ. */
int fw_host_share(const struct plan *p, double *share, char *why, size_t why_size);
/* Whether one setting for every stage says these (none; the first N blocks of every stage,
 * all of a stage that holds fewer; the same modules on every stage): 1, or 0 with why. */
int fw_settings_uniform(const struct fw_settings *fs, char *why, size_t why_size);
/* Whether framework f can say these settings for the plan's split and groups: 1, or 0 with
 * `why` (the numbers) when not. `split_only`: check only the split and tp. */
int fw_settings_allowed(const struct framework *f, const struct plan *p,
                        const struct fw_settings *fs, int split_only, char *why,
                        size_t why_size);

/* The framework's best settings on the plan's split: applied, costed and simulated into p
 * (ERR_NOFIT naming each stage that cannot fit even with the most the framework can
 * recompute, with its bytes; ERR_INPUT when the framework cannot run the split).
 * `framework_acts` as above; `allow_host`: every stage's optimizer on the host is tried too
 * where the framework has that switch. Of the settings within `min_gain` of the fastest (or,
 * when cap_ms > 0, stepping at most cap_ms), the simplest is kept (choice.h: the device
 * optimizer, fewer recomputed layers); min_gain 0: the fastest; none within cap_ms: the
 * fastest. *out (when not NULL, initialised) gets them. */
int fw_choose(struct plan *p, const struct framework *f, int framework_acts, int allow_host,
              double min_gain, double cap_ms, struct fw_settings *out, struct err *e);

/* The repartition search's view: one setting of the framework (a global form, or the
 * per-stage mode) gives every range of layers its least recompute. */
struct fw_candidate {
    const struct framework *f;
    int per_stage;               /* each stage the best of its own menu */
    struct fw_stage global;      /* otherwise this on every stage (n clipped to its blocks) */
    int framework_acts;
};
/* The global settings and the per-stage mode of f, for a model of at most `max_blocks`
 * blocks a stage: *n candidates (owned, free()). */
int fw_candidates(const struct framework *f, int max_blocks, int framework_acts,
                  struct fw_candidate **out, int *n, struct err *e);
/* Layers first..first+n-1 (costs `layers`) at a position with `in_flight` micro-batches and
 * `limit` bytes: the least recompute ms the candidate gives them that fits, and its memory;
 * INFINITY when none fits. The framework's least blocks a stage are not checked here (the
 * search keeps the ranges' costs monotone and enforces them itself). */
double fw_range_recompute(const struct fw_candidate *c, const struct model *m, int first,
                          const struct layer_cost *layers, int n, int in_flight,
                          int64_t reserve_bytes, int64_t limit, int64_t *memory_bytes);

/* Whether framework f runs schedule sh as Ballast plans it: 1, or 0 with why (quoting the
 * framework's source where it has no such schedule). Megatron-LM runs 1F1B and, given a layout
 * of p x v stages (pipeline_parallel_layer_layout.py: stage i on rank i mod p as chunk i / p,
 * Ballast's virtual stages), its interleaved 1F1B in Ballast's order, the micro-batches a
 * multiple of p (schedules.py refuses a remainder); a rank builds all its chunks from one
 * TransformerConfig, so they share one recompute setting (fw_choose keeps them so). No
 * framework here runs zb-h1 or v-half; NeMo's YAML path and FlagScale's heterogeneous
 * training refuse a virtual pipeline. "ballast" runs every schedule. */
int fw_schedule_allowed(const struct framework *f, const struct schedule_shape *sh, char *why,
                        size_t size);

#endif
