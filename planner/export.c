/* `ballast plan --export colossalai|nemo|megatron`: a plan in the form those frameworks take,
 * with only keys each framework's source accepts for a GPT (tests/data/export_keys.json names
 * the file and commit of every key). They count transformer blocks per stage (the embedding
 * rides with the first stage, the head with the last) and recompute the first N blocks of a
 * stage. What a framework cannot express is refused (exit 2) when it could make the run differ
 * in memory, and said on standard error with the numbers when the framework only recomputes
 * more (more time, less memory): never less recomputation than the plan. A block the plan
 * recomputes only in part (a recompute option) counts as recomputed whole, except in
 * Megatron-LM and NeMo when the plan recomputes no block whole: their selective recomputation
 * (recompute modules core_attn, mlp; every block of every stage) covers Ballast's options. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner.h"

struct stage_counts {
    int blocks;    /* transformer blocks on the stage */
    int recompute; /* of which recomputed, whole or in part */
    int partial;   /* of which in part (an option) */
};

/* What options the plan's blocks use, as Megatron-LM's selective modules cover them. */
struct option_use {
    int attn, mlp, other; /* blocks recomputing the attention, the MLP activation, else */
};

struct export {
    const struct plan *p;
    struct stage_counts *c;
    struct option_use u;
    int whole;   /* blocks recomputed whole, all stages */
    int partial; /* blocks recomputed in part, all stages */
    int most;    /* the most blocks one stage recomputes */
    int shard;   /* the cluster's shard_optimizer: optimizer state sharded over dp (ZeRO-1) */
    FILE *note;  /* where what the framework does differently is said */
};

/* The GPUs the plan runs on: every stage's tp GPUs, the pipeline dp times. */
static int world_size(const struct plan *p)
{
    int gpus = 0;
    for (int s = 0; s < p->n_stages; s++)
        gpus += p->stages[s].tp;
    return gpus * p->stages[0].dp;
}

/* Frameworks with one tensor-parallel size for every stage (a plan has one dp): ERR_INPUT
 * naming the first stage that differs from stage 0, with both numbers. */
static int one_tp(const struct plan *p, const char *format, const char *framework,
                  struct err *e)
{
    for (int s = 1; s < p->n_stages; s++)
        if (p->stages[s].tp != p->stages[0].tp)
            return err_set(e, ERR_INPUT,
                           "--export %s: stage %d has tp %d and stage 0 tp %d, but %s takes one "
                           "tensor-parallel size for every stage (--export flagscale takes one "
                           "per process mesh)",
                           format, s, p->stages[s].tp, p->stages[0].tp, framework);
    return ERR_OK;
}

/* How many GPUs, and how the framework gets dp (from the world size, as each of Megatron-LM,
 * NeMo and ColossalAI computes it: world / (tp * pp)). */
static void launch_line(FILE *f, const struct plan *p, const char *framework)
{
    fprintf(f, "# launch on %d GPUs (tp %d, pp %d, dp %d); %s takes dp from the world size "
               "(world / (tp * pp))\n",
            world_size(p), p->stages[0].tp, p->n_stages, p->stages[0].dp, framework);
}

/* A GPT or Llama states its attention kernel; a custom model's is the user's. */
static int flash(const struct plan *p)
{
    return p->model.attention == MODEL_ATTENTION_FLASH;
}

static int states_attention(const struct plan *p)
{
    return p->model.kind != MODEL_KIND_CUSTOM;
}

static void count(struct export *x)
{
    const struct plan *p = x->p;
    x->u = (struct option_use){0, 0, 0};
    x->whole = x->partial = x->most = 0;
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        struct stage_counts *c = &x->c[s];
        *c = (struct stage_counts){0, 0, 0};
        for (int l = st->first; l <= st->last; l++) {
            int block = model_layer_kind(&p->model, l) == MODEL_LAYER_BLOCK;
            int choice = st->recompute[l - st->first];
            c->blocks += block;
            c->recompute += block && choice != COST_KEEP;
            if (!block || choice < COST_OPTION)
                continue;
            c->partial++;
            const char *name = cost_choice_name(&st->layers[l - st->first], choice);
            int attn = strcmp(name, "attn") == 0 || strcmp(name, "attn+mlp") == 0;
            int mlp = strcmp(name, "mlp") == 0 || strcmp(name, "attn+mlp") == 0;
            x->u.attn += attn;
            x->u.mlp += mlp;
            x->u.other += !attn && !mlp;
        }
        x->whole += c->recompute - c->partial;
        x->partial += c->partial;
        x->most = c->recompute > x->most ? c->recompute : x->most;
    }
}

/* Selective recomputation stands for the plan when no block is recomputed whole and every
 * option is one of the framework's modules. */
static int selective(const struct export *x)
{
    return x->whole == 0 && x->partial > 0 && x->u.other == 0;
}

static void header(FILE *f, const struct plan *p, const char *comment)
{
    fprintf(f, "%s Ballast plan: method %s, %s, %d micro-batches, simulated iteration %.3f ms\n",
            comment, p->method, schedule_name(p->schedule), p->micro_batches, p->iteration_ms);
    if (p->model.kind == MODEL_KIND_CUSTOM)
        fprintf(f, "%s note: the model is custom (\"%s\"): the framework cannot be told its "
                   "layers; each of its %d layers counts as one transformer block below (beside "
                   "the framework's own embedding and head), which holds only if the "
                   "framework's model has those layers in that order\n",
                comment, p->model.name, p->model.layer_count);
    fprintf(f, "%s pipeline rank -> device (launch rank s on a GPU of this kind):", comment);
    for (int s = 0; s < p->n_stages; s++) {
        if (s % 8 == 0)
            fprintf(f, "\n%s ", comment);
        fprintf(f, " %d:%s", s, p->stages[s].device);
    }
    fprintf(f, "\n");
}

/* The blocks (recompute 0) or recomputed blocks (1) per stage, as [a, b, c]. */
static void list(FILE *f, const struct export *x, int recompute)
{
    fprintf(f, "[");
    for (int s = 0; s < x->p->n_stages; s++)
        fprintf(f, "%s%d", s ? ", " : "", recompute ? x->c[s].recompute : x->c[s].blocks);
    fprintf(f, "]");
}

/* The frameworks keep the embedding and the head: a stage whose plan recomputes them holds
 * more, said with its need against its limit. */
static void kept_ends_note(const struct export *x, const char *framework)
{
    const struct plan *p = x->p;
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        for (int l = 0; l < plan_stage_layer_count(st); l++) {
            const struct layer_cost *lc = &st->layers[l];
            if (!st->recompute[l] ||
                model_layer_kind(&p->model, st->first + l) == MODEL_LAYER_BLOCK)
                continue;
            /* an upper bound: the framework's extra block recomputation may give some back */
            double more = (double)cost_saved_bytes(lc, st->recompute[l], st->in_flight);
            if (more <= 0)
                continue;
            double need = (double)st->memory_bytes + more;
            fprintf(x->note, "ballast plan: export %s: note: stage %d recomputes its %s, which %s "
                             "keeps: %.3f GiB more there, up to %.3f GiB of its %.3f GiB limit\n",
                    framework, s, lc->name, framework, more / 1073741824.0,
                    need / 1073741824.0, (double)st->memory_limit_bytes / 1073741824.0);
            if (need > (double)st->memory_limit_bytes)
                fprintf(x->note, "ballast plan: export %s: note: stage %d may not fit as %s "
                                 "runs it (needs up to %.0f bytes of %lld)\n",
                        framework, s, framework, need, (long long)st->memory_limit_bytes);
        }
    }
}

/* What every framework here does differently from the plan whatever the settings. */
static void common_notes(const struct export *x, const char *framework)
{
    const struct plan *p = x->p;
    kept_ends_note(x, framework);
    if (p->schedule == SCHEDULE_GPIPE)
        fprintf(x->note, "ballast plan: export %s: note: the plan was made for GPipe; %s runs "
                         "1F1B, which keeps at most as many micro-batches in flight, so the plan "
                         "fits there too, at 1F1B's timing\n",
                framework, framework);
    if (x->partial > 0 && !selective(x)) {
        fprintf(x->note, "ballast plan: export %s: note: the plan recomputes %d block(s) only in "
                         "part (recompute options); %s recomputes them whole (more time, less "
                         "memory)\n",
                framework, x->partial, framework);
    }
}

/* Megatron-core's recompute_modules the plan's options need, as a YAML list. */
static const char *yaml_modules(const struct export *x)
{
    return x->u.attn && x->u.mlp ? "[core_attn, mlp]" : x->u.attn ? "[core_attn]" : "[mlp]";
}

/* A custom model carries no dtype: the precision is the user's to set. */
static void precision_note(const struct export *x, const char *framework, const char *example)
{
    fprintf(x->note, "ballast plan: export %s: note: the custom model \"%s\" carries no dtype: "
                     "set its precision yourself, e.g. %s\n",
            framework, x->p->model.name, example);
}

/* Selective recomputation (recompute modules) covers every block of every stage. */
static void selective_note(const struct export *x, const char *framework)
{
    fprintf(x->note, "ballast plan: export %s: note: selective recomputation applies to every "
                     "block; the plan recomputes %d block(s) in part and keeps the rest\n",
            framework, x->partial);
}

/* A framework that recomputes the first `n` blocks of every stage: what that is per stage
 * against the plan, said when it differs. */
static void same_count_note(const struct export *x, const char *framework, const char *key,
                            int n)
{
    int over = 0, S = x->p->n_stages;
    for (int s = 0; s < S; s++)
        over += (n < x->c[s].blocks ? n : x->c[s].blocks) - x->c[s].recompute;
    if (over == 0)
        return;
    fprintf(x->note, "ballast plan: export %s: note: %s %d recomputes per stage [", framework,
            key, n);
    for (int s = 0; s < S; s++)
        fprintf(x->note, "%s%d", s ? ", " : "", n < x->c[s].blocks ? n : x->c[s].blocks);
    fprintf(x->note, "] blocks against the plan's ");
    list(x->note, x, 1);
    fprintf(x->note, ": %d block(s) more in all (more time, less memory)\n", over);
}

/* ColossalAI's HybridParallelPlugin with the HuggingFace GPT-2 policy. Its GPT-2 forward
 * (shardformer/modeling/gpt2.py) recomputes every block a stage holds once HuggingFace's
 * gradient_checkpointing_enable() is called and never reads gradient_checkpoint_config (only
 * the llama, mistral, qwen2, qwen3 and command forwards do): all or nothing. */
/* Sequence parallelism as Megatron-LM's (split_gather: ColossalAI's default is all_to_all),
 * ZeRO-1 for a sharded optimizer, its flash attention for a flash model. */
static void colossalai_parallel_args(FILE *f, const struct plan *p, int shard)
{
    if (p->stages[0].tp > 1)
        fprintf(f, "    enable_sequence_parallelism=True,\n"
                   "    sequence_parallelism_mode=\"split_gather\",\n");
    if (shard)
        fprintf(f, "    zero_stage=1,\n");
    if (states_attention(p) && flash(p))
        fprintf(f, "    enable_flash_attention=True,\n");
}

/* ColossalAI leaves its own flash attention off, but HuggingFace loads a model with
 * attn_implementation "sdpa" by default, whose kernels may be flash ones. */
static void colossalai_attention_note(const struct export *x)
{
    if (!states_attention(x->p) || flash(x->p))
        return;
    fprintf(x->note, "ballast plan: export ColossalAI: note: the plan keeps the attention "
                     "probabilities (materialized attention); HuggingFace's default "
                     "attn_implementation \"sdpa\" will likely run a flash kernel and keep less "
                     "than planned: load the model with attn_implementation=\"eager\" to run "
                     "as planned\n");
}

static int export_colossalai(FILE *f, struct export *x, struct err *e)
{
    const struct plan *p = x->p;
    if (one_tp(p, "colossalai", "ColossalAI", e))
        return e->code;
    int S = p->n_stages, blocks = 0, gpt2 = p->model.kind == MODEL_KIND_GPT;
    for (int s = 0; s < S; s++)
        blocks += x->c[s].blocks;
    int recompute = x->whole + x->partial > 0;
    common_notes(x, "ColossalAI");
    if (gpt2 && recompute && x->whole + x->partial < blocks) {
        fprintf(x->note, "ballast plan: export ColossalAI: note: its GPT-2 policy recomputes "
                         "every block or none; recomputing all ");
        list(x->note, x, 0);
        fprintf(x->note, " against the plan's ");
        list(x->note, x, 1);
        fprintf(x->note, ": %d block(s) more in all (more time, less memory)\n",
                blocks - x->whole - x->partial);
    }
    if (!gpt2 && recompute)
        fprintf(x->note, "ballast plan: export ColossalAI: note: num_ckpt_layers_per_stage is "
                         "read only by ColossalAI's llama, mistral, qwen2, qwen3 and command "
                         "forwards; under another policy every block of a stage is recomputed\n");
    colossalai_attention_note(x);
    header(f, p, "#");
    launch_line(f, p, "ColossalAI");
    fprintf(f, "# the model a HuggingFace %s\n"
               "from colossalai.booster.plugin import HybridParallelPlugin\n%s\n"
               "plugin = HybridParallelPlugin(\n"
               "    tp_size=%d,\n"
               "    pp_size=%d,\n",
            gpt2 ? "GPT2LMHeadModel"
            : p->model.kind == MODEL_KIND_LLAMA ? "LlamaForCausalLM (its llama policy)"
                                                : "model with a ColossalAI policy",
            !gpt2 && recompute ? "from colossalai.shardformer import "
                                 "PipelineGradientCheckpointConfig\n" : "",
            p->stages[0].tp, S);
    colossalai_parallel_args(f, p, x->shard);
    if (p->model.kind != MODEL_KIND_CUSTOM)
        fprintf(f, "    precision=\"%s\",\n",
                p->model.dtype == MODEL_DTYPE_BF16 ? "bf16" : "fp32");
    else
        precision_note(x, "ColossalAI", "precision=\"bf16\" (it defaults to fp16)");
    fprintf(f, "    num_microbatches=%d,\n    pp_style=\"1f1b\",\n    num_layers_per_stage=",
            p->micro_batches);
    list(f, x, 0);
    fprintf(f, ",\n");
    if (!gpt2 && recompute) {
        fprintf(f, "    gradient_checkpoint_config=PipelineGradientCheckpointConfig("
                   "num_ckpt_layers_per_stage=");
        list(f, x, 1);
        fprintf(f, "),\n");
    }
    fprintf(f, ")\n");
    if (recompute)
        fprintf(f, "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
                   "{\"use_reentrant\": False})\n");
    return ERR_OK;
}

/* The first and last stage's blocks when NeMo can take the split (the stages between them
 * even; Megatron-core refuses a first or last count below 1): 1 with *first, *last set (-1:
 * not set, the even share), 0 when it cannot. */
static int nemo_split(const struct export *x, int *first, int *last)
{
    int S = x->p->n_stages;
    *first = *last = -1;
    if (S == 1)
        return 1;
    if (S == 2) { /* both set leaves no stage to divide by: NeMo divides by zero */
        *first = x->c[0].blocks;
        return *first >= 1 && x->c[1].blocks >= 1;
    }
    for (int s = 2; s < S - 1; s++)
        if (x->c[s].blocks != x->c[1].blocks)
            return 0;
    if (x->c[0].blocks != x->c[1].blocks)
        *first = x->c[0].blocks;
    if (x->c[S - 1].blocks != x->c[1].blocks)
        *last = x->c[S - 1].blocks;
    return *first != 0 && *last != 0;
}

/* Tensor and sequence parallelism, the distributed optimizer (optim.name, the rest of optim
 * left to the user's config) and the attention kernel Megatron-core runs. */
static void nemo_parallel(FILE *f, const struct plan *p, int shard)
{
    fprintf(f, "  tensor_model_parallel_size: %d\n", p->stages[0].tp);
    if (p->stages[0].tp > 1)
        fprintf(f, "  sequence_parallel: True\n");
    if (states_attention(p))
        fprintf(f, "  attention_backend: %s\n", flash(p) ? "flash" : "unfused");
    if (shard)
        fprintf(f, "  optim:\n    name: distributed_fused_adam\n");
}

/* NeMo's megatron_gpt_config.yaml overrides, on the Megatron-core model (mcore_gpt): its
 * recompute settings become Megatron-core's one recompute_num_layers for every stage, and
 * only the first and last stage's blocks may differ from the even share. */
static int export_nemo(FILE *f, struct export *x, struct err *e)
{
    const struct plan *p = x->p;
    int S = p->n_stages, first, last;
    if (one_tp(p, "nemo", "NeMo", e))
        return e->code;
    if (!nemo_split(x, &first, &last)) {
        char split[512];
        int n = 0;
        for (int s = 0; s < S && n < (int)sizeof split - 16; s++)
            n += snprintf(split + n, sizeof split - (size_t)n, "%s%d", s ? ", " : "",
                          x->c[s].blocks);
        return err_set(e, ERR_INPUT,
                       "--export nemo: NeMo sets the first and last stage's blocks "
                       "(num_layers_in_first/last_pipeline_stage, at least 1 each) and splits "
                       "the rest evenly; this plan's blocks per stage [%s] are not of that form, "
                       "and NeMo would run them with other memory than planned (use --export "
                       "megatron or flagscale)",
                       split);
    }
    common_notes(x, "NeMo");
    int sel = selective(x);
    if (!sel && x->most > 0)
        same_count_note(x, "NeMo", "activations_checkpoint_num_layers", x->most);
    if (sel)
        selective_note(x, "NeMo");
    header(f, p, "#");
    launch_line(f, p, "NeMo");
    if (p->model.kind != MODEL_KIND_CUSTOM)
        fprintf(f, "trainer:\n  precision: %s\n",
                p->model.dtype == MODEL_DTYPE_BF16 ? "bf16" : "32");
    else
        precision_note(x, "NeMo", "trainer.precision: bf16");
    fprintf(f, "model:\n  mcore_gpt: True\n  pipeline_model_parallel_size: %d\n", S);
    nemo_parallel(f, p, x->shard);
    if (first >= 0)
        fprintf(f, "  num_layers_in_first_pipeline_stage: %d\n", first);
    if (last >= 0)
        fprintf(f, "  num_layers_in_last_pipeline_stage: %d\n", last);
    if (sel)
        fprintf(f, "  activations_checkpoint_granularity: selective\n"
                   "  activations_checkpoint_method: null\n"
                   "  activations_checkpoint_num_layers: null\n"
                   "  recompute_modules: %s\n",
                yaml_modules(x));
    else if (x->most > 0)
        fprintf(f, "  activations_checkpoint_granularity: full\n"
                   "  activations_checkpoint_method: block\n"
                   "  activations_checkpoint_num_layers: %d\n",
                x->most);
    else
        fprintf(f, "  activations_checkpoint_granularity: null\n");
    return ERR_OK;
}

/* Megatron-LM's arguments (megatron/training/arguments.py, most generated from
 * TransformerConfig's fields), one per line, continued with a backslash. */
static void megatron_arg(FILE *f, int *first, const char *fmt, const char *value)
{
    fprintf(f, "%s", *first ? "" : " \\\n");
    fprintf(f, fmt, value);
    *first = 0;
}

/* ---- Megatron-LM's fine-grained activation offloading ----
 * (megatron/core/pipeline_parallel/fine_grained_activation_offload.py): every block of every
 * pipeline rank sends the input of each module in --offload-modules to host memory; after
 * warm-up it keeps the last group of each module name on the device (its reload margin),
 * then pp_rank x --delta-offload-bytes-across-pp-ranks bytes, then, in each micro-batch's
 * chunk, the last int(groups x (1 - --activation-offload-fraction)) groups in forward order.
 * For a dense GPT block its modules are around the attention only (nothing inside the MLP).
 * So it expresses a plan whose offloads are attention tensors (the `attn` option, as its
 * selective core_attn stands for that option's recomputation above), on the first blocks of
 * every stage in one fraction, with nothing recomputed beside them. */

struct megatron_offload {
    int offloads;    /* any block offloads */
    double fraction; /* --activation-offload-fraction */
    char text[32];   /* as written */
};

/* Stage s's offloading blocks: how many (*k), whether they are its first ones, and the most
 * bytes one sends per micro-batch; ERR_INPUT naming the first offload Megatron-LM cannot
 * take. */
static int megatron_stage_offloads(const struct export *x, int s, int *k, int *prefix,
                                   int64_t *most, struct err *e)
{
    const struct plan_stage *st = &x->p->stages[s];
    *k = *most = 0;
    *prefix = 1;
    for (int l = 0, block = 0; l < plan_stage_layer_count(st); l++) {
        int is_block = model_layer_kind(&x->p->model, st->first + l) == MODEL_LAYER_BLOCK;
        struct cost_row r = cost_action_row(&st->layers[l], st->recompute[l],
                                            (enum cost_place)st->place[l],
                                            st->offload_option[l], st->prefetch_ahead[l]);
        int attn = st->place[l] == COST_PLACE_DEVICE && st->offload_option[l] >= 0 &&
                   strcmp(st->layers[l].options[st->offload_option[l]].name, "attn") == 0;
        if (r.host_bytes > 0 && (!is_block || !attn)) {
            char name[MODEL_LAYER_NAME_MAX];
            model_layer_name(&x->p->model, st->first + l, name);
            return err_set(e, ERR_INPUT,
                           "--export megatron: stage %d layer %d (%s) sends %s (%lld bytes per "
                           "micro-batch) to host memory; Megatron-LM's fine-grained activation "
                           "offloading (--offload-modules) sends module inputs, for a dense GPT "
                           "block only around its attention (attn_norm, qkv_linear, core_attn, "
                           "attn_proj, mlp_norm), so it cannot express this; only the attn "
                           "option's tensors export (plan with --actions recompute for the rest)",
                           s, st->first + l, name,
                           st->place[l] == COST_PLACE_HOST ? "its kept tensors"
                           : st->offload_option[l] >= 0
                               ? st->layers[l].options[st->offload_option[l]].name
                               : "its tensors",
                           (long long)r.host_bytes);
        }
        if (!is_block)
            continue;
        *prefix = *prefix && (r.host_bytes == 0 || block == *k);
        *k += r.host_bytes > 0;
        *most = r.host_bytes > *most ? r.host_bytes : *most;
        block++;
    }
    return ERR_OK;
}

/* Whether fraction f, as Megatron-LM reads `text`, leaves offloaded the first k[s] of every
 * stage's blocks. */
static int fraction_gives(const struct export *x, const int *k, const char *text)
{
    double f = strtod(text, NULL);
    for (int s = 0; s < x->p->n_stages; s++)
        if (x->c[s].blocks - (int)(x->c[s].blocks * (1 - f)) != k[s])
            return 0;
    return 1;
}

static int megatron_offload_refuse_split(const struct export *x, const int *k, struct err *e)
{
    char split[512];
    int n = 0;
    for (int s = 0; s < x->p->n_stages && n < (int)sizeof split - 24; s++)
        n += snprintf(split + n, sizeof split - (size_t)n, "%s%d of %d", s ? ", " : "", k[s],
                      x->c[s].blocks);
    return err_set(e, ERR_INPUT,
                   "--export megatron: this plan offloads the attention of [%s] blocks per "
                   "stage; Megatron-LM offloads one fraction of every stage's blocks (the first "
                   "ones, --activation-offload-fraction) less a per-rank byte delta, which gives "
                   "no such split",
                   split);
}

/* What Megatron-LM's offloading flags are for the plan, or ERR_INPUT why it cannot take it. */
static int megatron_offload(const struct export *x, struct megatron_offload *mo, struct err *e)
{
    int S = x->p->n_stages, *k = calloc((size_t)S, sizeof *k), prefix = 1, rc = ERR_OK;
    if (k == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    *mo = (struct megatron_offload){0};
    for (int s = 0; s < S && rc == ERR_OK; s++) {
        int64_t most;
        int first;
        rc = megatron_stage_offloads(x, s, &k[s], &first, &most, e);
        prefix = prefix && first;
        mo->offloads |= k[s] > 0;
    }
    if (rc == ERR_OK && mo->offloads && x->whole + x->partial > 0)
        rc = err_set(e, ERR_INPUT,
                     "--export megatron: this plan offloads attention tensors and recomputes %d "
                     "block(s) (%d of them in part); Megatron-LM's offload groups are counted "
                     "over every block, recomputed or not, so its fraction cannot be matched to "
                     "the plan's blocks",
                     x->whole + x->partial, x->partial);
    for (int s = 0; s < S && rc == ERR_OK && mo->offloads; s++) /* any fraction to try */
        for (const char *fmt = "%.6g"; fmt != NULL && !mo->fraction;
             fmt = fmt[2] == '6' ? "%.17g" : NULL) {
            snprintf(mo->text, sizeof mo->text, fmt,
                     x->c[s].blocks ? (double)k[s] / x->c[s].blocks : 1.0);
            if (prefix && fraction_gives(x, k, mo->text))
                mo->fraction = strtod(mo->text, NULL);
        }
    if (rc == ERR_OK && mo->offloads && !mo->fraction)
        rc = megatron_offload_refuse_split(x, k, e);
    free(k);
    return rc;
}

/* Megatron-LM keeps one group per module name on each rank's device (its reload margin): a
 * stage without room for one block's attention tensors more may not fit; refused. */
static int megatron_margin(const struct export *x, struct err *e)
{
    for (int s = 0; s < x->p->n_stages; s++) {
        const struct plan_stage *st = &x->p->stages[s];
        int k, prefix;
        int64_t most;
        if (megatron_stage_offloads(x, s, &k, &prefix, &most, e))
            return e->code;
        if (most == 0)
            continue;
        if (st->memory_bytes + most > st->memory_limit_bytes)
            return err_set(e, ERR_INPUT,
                           "--export megatron: Megatron-LM keeps one offload group per module "
                           "on the device (its reload margin): stage %d would need %lld bytes "
                           "more than planned, %lld of its %lld-byte limit",
                           s, (long long)most, (long long)(st->memory_bytes + most),
                           (long long)st->memory_limit_bytes);
        fprintf(x->note, "ballast plan: export Megatron-LM: note: stage %d: Megatron-LM keeps "
                         "one block's attention tensors on the device (its reload margin): up "
                         "to %lld bytes more, %lld of its %lld-byte limit\n",
                s, (long long)most, (long long)(st->memory_bytes + most),
                (long long)st->memory_limit_bytes);
    }
    fprintf(x->note, "ballast plan: export Megatron-LM: note: its core_attn offload sends core "
                     "attention's input (q, k, v) to host memory where the plan sends the "
                     "attention tensors its profile counts; it prefetches on its own schedule, "
                     "not the plan's prefetch triggers\n");
    return ERR_OK;
}

static void megatron_offload_args(FILE *f, int *first, const struct megatron_offload *mo)
{
    megatron_arg(f, first, "--fine-grained-activation-offloading%s", "");
    megatron_arg(f, first, "--offload-modules core_attn%s", "");
    megatron_arg(f, first, "--min-offloaded-tensor-size 0%s", ""); /* every tensor, as planned */
    if (mo->fraction < 1)
        megatron_arg(f, first, "--activation-offload-fraction %s", mo->text);
}

/* Tensor parallelism with sequence parallelism (the cost model's), the distributed optimizer
 * for a sharded one and the attention kernel the plan was made for (unfused keeps the
 * probabilities as a materialized plan does; flash, the log-sum-exp). */
static void megatron_parallel_args(FILE *f, int *first, const struct plan *p, int shard)
{
    char num[32];
    snprintf(num, sizeof num, "%d%s", p->stages[0].tp,
             p->stages[0].tp > 1 ? " --sequence-parallel" : "");
    megatron_arg(f, first, "--tensor-model-parallel-size %s", num);
    if (shard)
        megatron_arg(f, first, "--use-distributed-optimizer%s", "");
    if (states_attention(p))
        megatron_arg(f, first, "--attention-backend %s", flash(p) ? "flash" : "unfused");
}

static int export_megatron(FILE *f, struct export *x, struct err *e)
{
    const struct plan *p = x->p;
    int S = p->n_stages, sel = selective(x);
    struct megatron_offload mo;
    if (one_tp(p, "megatron", "Megatron-LM", e) || megatron_offload(x, &mo, e) ||
        (mo.offloads && megatron_margin(x, e)))
        return e->code;
    common_notes(x, "Megatron-LM");
    if (!sel && x->most > 0)
        same_count_note(x, "Megatron-LM", "--recompute-num-layers", x->most);
    if (sel && x->u.mlp > 0)
        fprintf(x->note, "ballast plan: export Megatron-LM: note: its mlp module recomputes the "
                         "whole MLP from its input where the plan recomputes only the GELU (more "
                         "time, less memory)\n");
    if (sel)
        selective_note(x, "Megatron-LM");
    /* the layout string: E the embedding, t a block, L the loss head, | between stages */
    char layout[4096], num[32];
    int n = 0;
    for (int s = 0; s < S && n < (int)sizeof layout - 32; s++) {
        const char *sep = s ? "|" : "";
        const char *embed = s == 0 ? "E" : "", *loss = s == S - 1 ? "L" : "";
        if (x->c[s].blocks > 1)
            snprintf(num, sizeof num, "t*%d", x->c[s].blocks);
        else
            snprintf(num, sizeof num, "%s", x->c[s].blocks ? "t" : "");
        n += snprintf(layout + n, sizeof layout - (size_t)n, "%s%s%s%s", sep, embed, num, loss);
    }
    header(f, p, "#");
    launch_line(f, p, "Megatron-LM");
    if (mo.offloads)
        fprintf(f, "# with Transformer Engine >= 2.10 set NVTE_CPU_OFFLOAD_V1=1 (Megatron-LM "
                   "asserts it for fine-grained activation offloading)\n");
    fprintf(f, "# Megatron-LM before --pipeline-model-parallel-layout: --decoder-first-pipeline-"
               "num-layers and --decoder-last-pipeline-num-layers, only when the middle stages "
               "are even\n");
    int first = 1;
    snprintf(num, sizeof num, "%d", S);
    megatron_arg(f, &first, "--pipeline-model-parallel-size %s", num);
    megatron_arg(f, &first, "--pipeline-model-parallel-layout \"%s\"", layout);
    megatron_parallel_args(f, &first, p, x->shard);
    if (p->model.kind == MODEL_KIND_CUSTOM)
        precision_note(x, "Megatron-LM", "--bf16");
    else if (p->model.dtype == MODEL_DTYPE_BF16)
        megatron_arg(f, &first, "--bf16%s", "");
    if (sel) {
        megatron_arg(f, &first, "--recompute-granularity selective%s", "");
        snprintf(layout, sizeof layout, "%s%s", x->u.attn ? " core_attn" : "",
                 x->u.mlp ? " mlp" : "");
        megatron_arg(f, &first, "--recompute-modules%s", layout);
    } else if (x->most > 0) {
        snprintf(num, sizeof num, "%d", x->most);
        megatron_arg(f, &first, "--recompute-granularity full --recompute-method block "
                                "--recompute-num-layers %s",
                     num);
    }
    if (mo.offloads)
        megatron_offload_args(f, &first, &mo);
    if (p->stages[0].optimizer == COST_PLACE_HOST) { /* every stage's (refuse_host_optimizer) */
        char frac[32];
        snprintf(frac, sizeof frac, "%.4g", plan_stage_optimizer_fraction(&p->stages[0]));
        megatron_arg(f, &first, "--optimizer-cpu-offload --optimizer-offload-fraction %s "
                                "--use-precision-aware-optimizer",
                     strcmp(frac, "1") == 0 ? "1.0" : frac);
    }
    fprintf(f, "\n");
    return ERR_OK;
}

/* FlagScale's heterogeneous training (its Megatron-LM patches, flagscale/train/arguments.py):
 * a layer split of any shape, process meshes of consecutive stages on one device kind, and
 * recompute_num_layers_per_stage_micro_batch, the blocks each stage recomputes: the plan's
 * per-stage counts exactly, blocks recomputed in part counted whole. Its launcher turns
 * system: into arguments (nested sections flattened, lists spread). */
/* Whether stage s ends a process mesh: the next stage is of another device or tp. */
static int mesh_ends(const struct plan *p, int s)
{
    return s == p->n_stages - 1 || strcmp(p->stages[s].device, p->stages[s + 1].device) != 0 ||
           p->stages[s].tp != p->stages[s + 1].tp;
}

static void flagscale_meshes(FILE *f, const struct plan *p)
{
    int S = p->n_stages;
    fprintf(f, "    hetero_process_meshes: [");
    for (int s = 0, first = 0, n = 0; s < S; s++) /* tp, cp, ep, dp, pp per mesh */
        if (mesh_ends(p, s)) {
            fprintf(f, "%s%d, 1, 1, %d, %d", n++ ? ", " : "", p->stages[s].tp, p->stages[s].dp,
                    s + 1 - first);
            first = s + 1;
        }
    fprintf(f, "]\n    hetero_device_types: [");
    for (int s = 0, n = 0; s < S; s++)
        if (mesh_ends(p, s))
            fprintf(f, "%s\"%s\"", n++ ? ", " : "", p->stages[s].device);
    fprintf(f, "]\n");
}

/* Sequence parallelism where a mesh has tp (FlagScale turns it off per mesh of tp 1), the
 * distributed optimizer, the attention kernel. */
static void flagscale_parallel(FILE *f, const struct plan *p, int shard)
{
    int tp = 0;
    for (int s = 0; s < p->n_stages; s++)
        tp = tp || p->stages[s].tp > 1;
    if (tp)
        fprintf(f, "  sequence_parallel: True\n");
    if (shard)
        fprintf(f, "  use_distributed_optimizer: True\n");
    /* Ballast's GPT and Llama heads have their own weights (sizes.c lm_w); tied, FlagScale
     * would assert the first and last mesh's tp equal */
    if (states_attention(p))
        fprintf(f, "  attention_backend: %s\n  untie_embeddings_and_output_weights: True\n",
                flash(p) ? "flash" : "unfused");
}

static int export_flagscale(FILE *f, struct export *x)
{
    const struct plan *p = x->p;
    int S = p->n_stages, sel = selective(x);
    common_notes(x, "FlagScale");
    if (sel)
        selective_note(x, "FlagScale");
    header(f, p, "#");
    fprintf(f, "system:\n  pipeline_model_parallel_size: %d\n  hetero:\n"
               "    enable_hetero: True\n    hetero_pipeline_layer_split: ",
            S);
    list(f, x, 0);
    fprintf(f, "\n");
    flagscale_meshes(f, p);
    flagscale_parallel(f, p, x->shard);
    if (p->model.kind == MODEL_KIND_CUSTOM)
        precision_note(x, "FlagScale", "system.precision.bf16: True");
    else if (p->model.dtype == MODEL_DTYPE_BF16)
        fprintf(f, "  precision:\n    bf16: True\n");
    if (sel) {
        fprintf(f, "  recompute:\n    recompute_granularity: selective\n"
                   "    recompute_modules: %s\n",
                yaml_modules(x));
    } else if (x->most > 0) {
        fprintf(f, "  recompute:\n    recompute_granularity: full\n"
                   "    recompute_method: block\n    recompute_num_layers: %d\n"
                   "    recompute_num_layers_per_stage_micro_batch:\n",
                x->most);
        /* [stages, micro-batches, blocks]: that many stages recompute that many blocks in
         * every micro-batch */
        for (int s = 0; s < S;) {
            int run = 1;
            while (s + run < S && x->c[s + run].recompute == x->c[s].recompute)
                run++;
            fprintf(f, "      - [%d, %d, %d]\n", run, p->micro_batches, x->c[s].recompute);
            s += run;
        }
    }
    return ERR_OK;
}

/* Offload is per stage and per layer in a plan; NeMo, ColossalAI and FlagScale take none
 * here (Megatron-LM's is above): a config that kept the tensors on the device would not fit
 * where the plan needed host memory, so such a plan is refused. */
static int refuse_offload(const struct plan *p, const char *format, struct err *e)
{
    for (int s = 0; s < p->n_stages; s++)
        if (plan_stage_offloads(&p->stages[s]))
            return err_set(e, ERR_INPUT,
                           "--export %s: stage %d sends %lld bytes per micro-batch to host "
                           "memory (%lld in all), which %s cannot be told per stage; plan "
                           "without --actions offload to export",
                           format, s, (long long)(p->stages[s].host_memory_bytes /
                                                  (p->stages[s].in_flight > 0
                                                       ? p->stages[s].in_flight
                                                       : 1)),
                           (long long)p->stages[s].host_memory_bytes, format);
    return ERR_OK;
}

/* The optimizer's place is per stage in a plan. Megatron-LM takes one global switch and
 * fraction (--optimizer-cpu-offload, --optimizer-offload-fraction: each rank moves that share
 * of its own optimizer state), so it says "every stage, the same share" or "none" exactly;
 * the other formats have no such setting. Anything else is refused: a config with the
 * optimizer on the device would not fit where the plan needed the host. */
static int refuse_host_optimizer(const struct plan *p, const char *format, struct err *e)
{
    int hosted = 0, first = -1, same = 1;
    int64_t mirror = 0;
    for (int s = 0; s < p->n_stages; s++)
        if (p->stages[s].optimizer == COST_PLACE_HOST) {
            const struct plan_stage *st = &p->stages[s];
            hosted++;
            first = first < 0 ? s : first;
            mirror += cost_stage_mirror(st->layers, plan_stage_layer_count(st),
                                        st->optimizer_from);
            same &= fabs(plan_stage_optimizer_fraction(st) -
                         plan_stage_optimizer_fraction(&p->stages[0])) < 1e-4;
        }
    int megatron = strcmp(format, "megatron") == 0;
    if (hosted == 0 || (megatron && hosted == p->n_stages && same))
        return ERR_OK;
    if (megatron && hosted == p->n_stages)
        return err_set(e, ERR_INPUT,
                       "--export megatron: the stages keep different shares of their optimizer "
                       "on the host (stage 0 %.3g, and others not), which Megatron-LM cannot "
                       "be told (--optimizer-offload-fraction is global); plan with --actions "
                       "optimizer instead of optimizer-fraction to export",
                       plan_stage_optimizer_fraction(&p->stages[0]));
    return err_set(e, ERR_INPUT,
                   "--export %s: %d of %d stages (the first: stage %d) keep their optimizer on "
                   "the host, %lld bytes of host mirror in all, which %s; plan without "
                   "--actions optimizer to export",
                   format, hosted, p->n_stages, first, (long long)mirror,
                   megatron ? "Megatron-LM cannot be told per stage (--optimizer-cpu-offload "
                              "and --optimizer-offload-fraction are global)"
                            : "it has no setting for");
}

int planner_export(FILE *f, const struct plan *p, const char *format, int shard_optimizer,
                   struct err *e)
{
    int S = p->n_stages;
    if (S < 1)
        return err_set(e, ERR_INPUT, "--export %s: a plan of no stages", format);
    if ((strcmp(format, "megatron") != 0 && refuse_offload(p, format, e)) ||
        refuse_host_optimizer(p, format, e))
        return e->code;
    struct export x = {.p = p, .shard = shard_optimizer, .note = stderr};
    x.c = calloc((size_t)S, sizeof *x.c);
    if (x.c == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    count(&x);
    int rc;
    if (strcmp(format, "colossalai") == 0)
        rc = export_colossalai(f, &x, e);
    else if (strcmp(format, "nemo") == 0)
        rc = export_nemo(f, &x, e);
    else if (strcmp(format, "megatron") == 0)
        rc = export_megatron(f, &x, e);
    else if (strcmp(format, "flagscale") == 0)
        rc = export_flagscale(f, &x);
    else
        rc = err_set(e, ERR_INPUT,
                     "--export: \"%s\", expected colossalai, nemo, megatron or flagscale",
                     format);
    free(x.c);
    return rc;
}
