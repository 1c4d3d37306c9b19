/* ColossalAI's HybridParallelPlugin with a HuggingFace model (transformers 4.51.3, which
 * ColossalAI pins): the model's config, the plugin's keywords, and HuggingFace's
 * gradient_checkpointing_enable(), without which no block is recomputed. Its GPT-2 forward
 * (shardformer/modeling/gpt2.py) then recomputes every block a stage holds and never reads
 * gradient_checkpoint_config; its Llama forward the first num_ckpt_layers_per_stage[s]. */
#include <string.h>

#include "export_core.h"
#include "model_kind.h"

/* The HuggingFace models ColossalAI's shardformer has a policy for, by model_type (the kind's
 * model_kind.hf_type). */
static const struct hf_model {
    const char *type;
    const char *cls, *head; /* cls's Config builds head */
    int column;             /* its keywords in keys[].hf */
    const char *extra;      /* keywords its config needs beside the items */
} hf_models[] = {
    {"gpt2", "GPT2", "GPT2LMHeadModel", 0, "    embd_pdrop=0,\n"},
    {"llama", "Llama", "LlamaForCausalLM", 1, ""},
};

/* The model's items as the HuggingFace config's keywords (GPT2Config, LlamaConfig); NULL:
 * not one it is given (its default is the model's, or it changes numerics, not memory). */
static const struct {
    const char *megatron, *hf[2];
} keys[] = {
    {"num_layers", {"n_layer", "num_hidden_layers"}},
    {"hidden_size", {"n_embd", "hidden_size"}},
    {"num_attention_heads", {"n_head", "num_attention_heads"}},
    {"ffn_hidden_size", {NULL, "intermediate_size"}}, /* GPT-2's n_inner defaults to 4 n_embd */
    {"max_position_embeddings", {"n_positions", "max_position_embeddings"}},
    {"hidden_dropout", {"resid_pdrop", NULL}},          /* Llama's dropout defaults to 0 */
    {"attention_dropout", {"attn_pdrop", NULL}},
    {"num_query_groups", {NULL, "num_key_value_heads"}},
};

#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))

/* The config's keywords; the attention kernel the layer costs assume (eager keeps the
 * probabilities; sdpa runs a flash kernel, keeping the log-sum-exp). */
static void config_keywords(FILE *f, const struct export_job *x, const struct hf_model *hf)
{
    struct export_item items[EXPORT_ITEMS_MAX];
    int n = export_items(x, items);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < N_KEYS; k++) {
            const char *key = keys[k].hf[hf->column];
            if (key != NULL && strcmp(items[i].name, keys[k].megatron) == 0)
                fprintf(f, "    %s=%s,\n", key, items[i].value);
        }
    fputs(hf->extra, f);
    /* the items leave num_query_groups out when it is n_head; a config with the field needs it */
    if (model_kind_of(&x->p->model)->gqa && model_kv_heads(&x->p->model) == x->p->model.n_head)
        fprintf(f, "    num_key_value_heads=%d,\n", model_kv_heads(&x->p->model));
    fprintf(f, "    vocab_size=%d,\n    tie_word_embeddings=False,\n    attn_implementation=\"%s\",\n",
            x->p->model.vocab_size, x->attention == MODEL_ATTENTION_FLASH ? "sdpa" : "eager");
}

static int recomputes(const struct export_job *x)
{
    for (int s = 0; s < x->fs->n_stages; s++)
        if (x->fs->stages[s].recompute != FW_RECOMPUTE_NONE)
            return 1;
    return 0;
}

/* Sequence parallelism as Megatron-LM's (split_gather: ColossalAI's default is all_to_all),
 * ZeRO-1 for a sharded optimizer. */
static void parallel_keywords(FILE *f, const struct export_job *x)
{
    if (x->tp > 1)
        fprintf(f, "    enable_sequence_parallelism=True,\n"
                   "    sequence_parallelism_mode=\"split_gather\",\n");
    if (x->shard)
        fprintf(f, "    zero_stage=1,\n");
}

/* bf16, or fp16 with dynamic loss scaling (Megatron-LM's numbers, export_items). */
static void precision_keywords(FILE *f, const struct export_job *x)
{
    const struct model *m = &x->p->model;
    if (model_is_custom(m)) {
        fprintf(x->note, "ballast export: note: the custom model \"%s\" carries no dtype: set "
                         "precision= yourself (ColossalAI's default is fp16)\n", m->name);
        return;
    }
    fprintf(f, "    precision=\"%s\",\n", m->dtype == MODEL_DTYPE_BF16   ? "bf16"
                                          : m->dtype == MODEL_DTYPE_FP16 ? "fp16"
                                                                         : "fp32");
    if (m->dtype == MODEL_DTYPE_FP16)
        fprintf(f, "    initial_scale=2**32,\n    min_scale=1,\n    growth_interval=1000,\n"
                   "    hysteresis=2,\n");
}

/* The model: a HuggingFace one from its config. */
static void model_lines(FILE *f, const struct export_job *x, const struct hf_model *hf)
{
    const struct model_kind_info *k = model_kind_of(&x->p->model);
    if (hf == NULL) {
        fprintf(f, "# the model: yours, with a ColossalAI policy\n");
        return;
    }
    fprintf(f, "from transformers import %sConfig, %s\n", hf->cls, hf->head);
    if (k->rmsnorm && k->rotary)
        fprintf(f, "# numerics, not memory: give rms_norm_eps=%g and the rotary base %g as "
                   "your checkpoint has them\n",
                x->p->model.norm_eps, x->p->model.rope_theta);
    fprintf(f, "config = %sConfig(\n", hf->cls);
    config_keywords(f, x, hf);
    fprintf(f, ")\nmodel = %s(config)\n", hf->head);
}

/* The HuggingFace model of the plan's model; NULL for a custom model (the user's own). */
static int hf_model_of(const struct export_job *x, const struct hf_model **out, struct err *e)
{
    const struct model_kind_info *k = model_kind_of(&x->p->model);
    *out = NULL;
    if (k->custom)
        return ERR_OK;
    for (size_t i = 0; i < sizeof hf_models / sizeof hf_models[0]; i++)
        if (k->hf_type != NULL && strcmp(hf_models[i].type, k->hf_type) == 0)
            *out = &hf_models[i];
    if (*out == NULL)
        return err_set(e, ERR_INPUT,
                       "--to colossalai: ColossalAI has no shardformer policy for a %s model "
                       "(HuggingFace model_type %s)",
                       k->name, k->hf_type ? k->hf_type : "none");
    return ERR_OK;
}

int export_colossalai(FILE *f, const struct export_job *x, struct err *e)
{
    const struct plan *p = x->p;
    const struct hf_model *hf;
    /* a row that recomputes all of a stage or nothing (GPT-2's forward) ignores the config */
    int per_stage = !x->f->full_all_only, rec = recomputes(x);
    ERR_TRY(hf_model_of(x, &hf, e));
    export_header(f, x, "#");
    export_launch(f, x, "#");
    fprintf(f, "# the data loader gives each data-parallel rank %d samples a step (%d "
               "micro-batches of %d)\n",
            p->micro_batches * p->model.micro_batch, p->micro_batches, p->model.micro_batch);
    model_lines(f, x, hf);
    fprintf(f, "from colossalai.booster.plugin import HybridParallelPlugin\n%s",
            per_stage && rec ? "from colossalai.shardformer import PipelineGradientCheckpointConfig\n"
                         : "");
    fprintf(f, "plugin = HybridParallelPlugin(\n    tp_size=%d,\n    pp_size=%d,\n", x->tp,
            p->n_stages);
    parallel_keywords(f, x);
    precision_keywords(f, x);
    fprintf(f, "    microbatch_size=%d,\n    num_microbatches=%d,\n    pp_style=\"1f1b\",\n"
               "    num_layers_per_stage=",
            p->model.micro_batch, p->micro_batches);
    export_list(f, x, 0);
    fprintf(f, ",\n");
    if (per_stage && rec) {
        fprintf(f, "    gradient_checkpoint_config=PipelineGradientCheckpointConfig("
                   "num_ckpt_layers_per_stage=");
        export_list(f, x, 1);
        fprintf(f, "),\n");
    }
    fprintf(f, ")\n");
    if (rec)
        fprintf(f, "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
                   "{\"use_reentrant\": False})\n");
    return ERR_OK;
}
