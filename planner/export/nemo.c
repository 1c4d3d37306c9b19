/* NeMo's megatron_gpt_config.yaml overrides, on the Megatron-core model (mcore_gpt): the first
 * and last stage's blocks (the rest even); one recompute setting for every stage, or, per
 * stage, the per-rank Python file applied in NeMo's per-rank model hook (model_provider_func,
 * called on each rank once its pipeline rank is set). */
#include <string.h>

#include "export_core.h"
#include "model_kind.h"

#define NEMO_COMMIT "NeMo 8cfedd72"

/* The model's items as NeMo's keys: Megatron-LM's name, NeMo's, and the value NeMo takes for
 * a switch ("" keeps the item's value). */
static const struct {
    const char *megatron, *nemo, *value;
} keys[] = {
    {"num_layers", "num_layers", ""},
    {"hidden_size", "hidden_size", ""},
    {"num_attention_heads", "num_attention_heads", ""},
    {"ffn_hidden_size", "ffn_hidden_size", ""},
    {"seq_length", "encoder_seq_length", ""},
    {"max_position_embeddings", "max_position_embeddings", ""},
    {"micro_batch_size", "micro_batch_size", ""},
    {"global_batch_size", "global_batch_size", ""},
    {"hidden_dropout", "hidden_dropout", ""},
    {"attention_dropout", "attention_dropout", ""},
    {"untie_embeddings_and_output_weights", "share_embeddings_and_output_weights", "False"},
    {"swiglu", "activation", "fast-swiglu"},
    {"normalization", "normalization", "rmsnorm"},
    {"norm_epsilon", "layernorm_epsilon", ""},
    {"position_embedding_type", "position_embedding_type", ""},
    {"rotary_base", "rotary_base", ""},
    {"disable_bias_linear", "bias", "False"},
    {"num_query_groups", "num_query_groups", ""},
    {"initial_loss_scale", "native_amp_init_scale", ""},
    {"loss_scale_window", "native_amp_growth_interval", ""},
    {"hysteresis", "hysteresis", ""},
};

#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))

static void model_items(FILE *f, const struct export_job *x)
{
    struct export_item items[EXPORT_ITEMS_MAX];
    int n = export_items(x, items);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < N_KEYS; k++)
            if (strcmp(items[i].name, keys[k].megatron) == 0)
                fprintf(f, "  %s: %s\n", keys[k].nemo,
                        keys[k].value[0] ? keys[k].value : items[i].value);
}

/* The first and last stage's blocks NeMo is given (-1: not given, the even share); the
 * stages between are even (fw_settings_allowed checked it). Two stages set the first only:
 * setting both leaves no stage to divide by. */
static void ends(const struct export_job *x, int *first, int *last)
{
    int S = x->fs->n_stages, mid = S > 2 ? x->fs->stages[1].blocks : -1;
    *first = *last = -1;
    if (S == 2)
        *first = x->fs->stages[0].blocks;
    if (S > 2 && x->fs->stages[0].blocks != mid)
        *first = x->fs->stages[0].blocks;
    if (S > 2 && x->fs->stages[S - 1].blocks != mid)
        *last = x->fs->stages[S - 1].blocks;
}

static void recompute_keys(FILE *f, const struct export_job *x)
{
    char why[256], mods[64];
    if (x->per_rank || !fw_settings_uniform(x->fs, why, sizeof why)) {
        fprintf(f, "  activations_checkpoint_granularity: null\n");
        return;
    }
    const struct fw_stage *one = NULL;
    int most = 0;
    for (int s = 0; s < x->fs->n_stages; s++) {
        const struct fw_stage *st = &x->fs->stages[s];
        one = one == NULL && st->recompute != FW_RECOMPUTE_NONE ? st : one;
        most = st->recompute == FW_RECOMPUTE_FULL && st->n > most ? st->n : most;
    }
    if (one == NULL) {
        fprintf(f, "  activations_checkpoint_granularity: null\n");
    } else if (one->recompute == FW_RECOMPUTE_SELECTIVE) {
        fw_modules_text(one->modules, ", ", mods, sizeof mods);
        fprintf(f, "  activations_checkpoint_granularity: selective\n"
                   "  activations_checkpoint_method: null\n"
                   "  activations_checkpoint_num_layers: null\n"
                   "  recompute_modules: [%s]\n", mods);
    } else {
        fprintf(f, "  activations_checkpoint_granularity: full\n"
                   "  activations_checkpoint_method: block\n"
                   "  activations_checkpoint_num_layers: %d\n", most);
    }
}

static void nemo_per_rank_lines(FILE *f, const struct export_job *x)
{
    const char *m = x->o->stages_module;
    fprintf(f, "# per-rank recompute: put %s.py beside megatron_gpt_pretraining.py (%s), and "
               "there\n# build the model from a subclass whose model_provider_func (NeMo's "
               "per-rank model hook)\n# applies this rank's stage:\n"
               "#     import %s\n"
               "#     from megatron.core import parallel_state\n"
               "#     class StagedGPTModel(MegatronGPTModel):\n"
               "#         def model_provider_func(self, pre_process, post_process):\n"
               "#             %s.apply(self.transformer_config,\n"
               "#                 parallel_state.get_pipeline_model_parallel_rank())\n"
               "#             return super().model_provider_func(pre_process, post_process)\n"
               "#     model = StagedGPTModel(cfg.model, trainer)  # for MegatronGPTModel(...)\n",
            m, NEMO_COMMIT, m, m);
}

static const char *nemo_precision(const struct model *m)
{
    return m->dtype == MODEL_DTYPE_BF16 ? "bf16" : m->dtype == MODEL_DTYPE_FP16 ? "16-mixed"
                                                                                  : "32";
}

int export_nemo(FILE *f, const struct export_job *x, struct err *e)
{
    (void)e;
    const struct plan *p = x->p;
    int first, last;
    ends(x, &first, &last);
    export_header(f, x, "#");
    export_launch(f, x, "#");
    if (x->per_rank) {
        nemo_per_rank_lines(f, x);
        export_stages_py(x->o->stages, x, NEMO_COMMIT);
    }
    if (!model_is_custom(&p->model))
        fprintf(f, "trainer:\n  precision: %s\n", nemo_precision(&p->model));
    else
        fprintf(x->note, "ballast export: note: the custom model \"%s\" carries no dtype: set "
                         "trainer.precision yourself (e.g. bf16)\n",
                p->model.name);
    fprintf(f, "model:\n  mcore_gpt: True\n  transformer_engine: True\n"
               "  pipeline_model_parallel_size: %d\n  tensor_model_parallel_size: %d\n",
            p->n_stages, x->tp);
    if (x->tp > 1)
        fprintf(f, "  sequence_parallel: True\n");
    if (!model_is_custom(&p->model))
        fprintf(f, "  attention_backend: %s\n",
                x->attention == MODEL_ATTENTION_FLASH ? "flash" : "unfused");
    if (first >= 0)
        fprintf(f, "  num_layers_in_first_pipeline_stage: %d\n", first);
    if (last >= 0)
        fprintf(f, "  num_layers_in_last_pipeline_stage: %d\n", last);
    model_items(f, x);
    recompute_keys(f, x);
    if (x->shard)
        fprintf(f, "  optim:\n    name: distributed_fused_adam\n");
    return ERR_OK;
}
