/* What the framework writers share (export_core.h): the model's and batch's settings as one
 * list of items, the header, the launch, the layout lists and the per-rank Python file. Below
 * export.c, which prepares the job and calls a writer; the writers call down to here. */
#include "export_core.h"
#include "model_kind.h"
#include "planner.h"

static void item(struct export_item *items, int *n, const char *name, const char *fmt, long v)
{
    items[*n].name = name;
    items[*n].precision = 0;
    snprintf(items[*n].value, sizeof items[*n].value, fmt, v);
    (*n)++;
}

static void text_item(struct export_item *items, int *n, const char *name, const char *text)
{
    items[*n].name = name;
    items[*n].precision = 0;
    snprintf(items[*n].value, sizeof items[*n].value, "%s", text);
    (*n)++;
}

static void flag(struct export_item *items, int *n, const char *name)
{
    items[*n].name = name;
    items[*n].precision = 0;
    items[*n].value[0] = '\0';
    (*n)++;
}

/* fp16's dynamic loss scaling, Megatron-LM's defaults written out (NeMo's and ColossalAI's
 * keys take the same numbers). */
static void precision_items(const struct model *m, struct export_item *items, int *n)
{
    int first = *n;
    if (m->dtype == MODEL_DTYPE_BF16)
        flag(items, n, "bf16");
    if (m->dtype == MODEL_DTYPE_FP16) {
        flag(items, n, "fp16");
        item(items, n, "initial_loss_scale", "%ld", 4294967296L);
        item(items, n, "min_loss_scale", "%ld", 1);
        item(items, n, "loss_scale_window", "%ld", 1000);
        item(items, n, "hysteresis", "%ld", 2);
    }
    for (int k = first; k < *n; k++)
        items[k].precision = 1;
}

/* The kind's traits as Megatron-LM's switches (its defaults are GPT's: LayerNorm, GELU,
 * learned positions, biases, one key/value head per head). */
static void trait_items(const struct model *m, struct export_item *items, int *n)
{
    const struct model_kind_info *k = model_kind_of(m);
    if (k->swiglu)
        flag(items, n, "swiglu");
    if (k->rmsnorm) {
        char eps[32];
        snprintf(eps, sizeof eps, "%g", m->norm_eps);
        text_item(items, n, "normalization", "RMSNorm");
        text_item(items, n, "norm_epsilon", eps);
    }
    if (k->rotary) {
        text_item(items, n, "position_embedding_type", "rope");
        item(items, n, "rotary_base", "%ld", (long)m->rope_theta);
    }
    if (!k->biases)
        flag(items, n, "disable_bias_linear");
    if (model_kv_heads(m) != m->n_head) {
        flag(items, n, "group_query_attention");
        item(items, n, "num_query_groups", "%ld", (long)model_kv_heads(m));
    }
}

int export_items(const struct export_job *x, struct export_item *items)
{
    const struct model *m = &x->p->model;
    int n = 0;
    if (model_is_custom(m))
        return 0; /* the framework's model is the user's: only the batch */
    item(items, &n, "num_layers", "%ld", m->n_layer);
    item(items, &n, "hidden_size", "%ld", m->n_embd);
    item(items, &n, "num_attention_heads", "%ld", m->n_head);
    item(items, &n, "ffn_hidden_size", "%ld", (long)model_ffn_hidden(m));
    item(items, &n, "seq_length", "%ld", m->seq_len);
    item(items, &n, "max_position_embeddings", "%ld", m->seq_len);
    item(items, &n, "micro_batch_size", "%ld", m->micro_batch);
    item(items, &n, "global_batch_size", "%ld", x->global_batch);
    item(items, &n, "hidden_dropout", "%ld", 0);
    item(items, &n, "attention_dropout", "%ld", 0);
    flag(items, &n, "untie_embeddings_and_output_weights"); /* Ballast's heads have their own */
    trait_items(m, items, &n);
    precision_items(m, items, &n);
    return n;
}

void export_header(FILE *f, const struct export_job *x, const char *comment)
{
    const struct plan *p = x->p;
    fprintf(f, "%s Ballast plan%s%s for %s, as %s (%s) runs it: %s, %d micro-batches of %d, "
               "simulated step %.3f ms\n",
            comment, x->o->plan_name && x->o->plan_name[0] ? " " : "",
            x->o->plan_name ? x->o->plan_name : "", p->framework.target, x->f->title,
            x->f->name, schedule_name(p->schedule), p->micro_batches, p->model.micro_batch,
            p->iteration_ms);
    fprintf(f, "%s layer costs: %s activations, %s attention\n", comment,
            p->framework.activations, model_attention_name(x->attention));
    if (model_is_custom(&p->model))
        fprintf(f, "%s note: the model is custom (\"%s\"): the framework cannot be told its "
                   "layers; each of its %d layers counts as one transformer block below, which "
                   "holds only if the framework's model has those layers in that order\n",
                comment, p->model.name, p->model.layer_count);
    fprintf(f, "%s pipeline rank -> device (launch rank s on a GPU of this kind):", comment);
    for (int g = 0; g < x->pp; g++) {
        int chunks[SCHEDULE_CHUNKS_MAX];
        plan_gpu_stages(p, g, chunks);
        if (g % 8 == 0)
            fprintf(f, "\n%s ", comment);
        fprintf(f, " %d:%s", g, p->stages[chunks[0]].device);
    }
    fprintf(f, "\n");
    if (x->pp < p->n_stages)
        fprintf(f, "%s %d model chunks a rank (interleaved 1F1B): rank s holds stages s, s + %d, "
                   "...\n", comment, p->n_stages / x->pp, x->pp);
}

void export_launch(FILE *f, const struct export_job *x, const char *comment)
{
    int gpus = 0;
    for (int s = 0; s < x->pp; s++) /* a rank's first chunk is stage s (schedule.h) */
        gpus += x->p->stages[s].tp;
    fprintf(f, "%s launch on %d GPUs (tp %d, pp %d, dp %d); %s takes dp from the world size "
               "(world / (tp * pp)); a step is %d samples\n",
            comment, gpus * x->dp, x->tp, x->pp, x->dp, x->f->title, x->global_batch);
}

void export_list(FILE *f, const struct export_job *x, int recompute)
{
    fprintf(f, "[");
    for (int s = 0; s < x->fs->n_stages; s++) {
        const struct fw_stage *st = &x->fs->stages[s];
        int n = st->recompute == FW_RECOMPUTE_FULL ? st->n : 0;
        fprintf(f, "%s%d", s ? ", " : "", recompute ? n : st->blocks);
    }
    fprintf(f, "]");
}

/* One stage's fields as a Python dict. */
static void stage_dict(FILE *f, const struct fw_stage *st)
{
    char mods[64];
    if (st->recompute == FW_RECOMPUTE_FULL)
        fprintf(f, "{\"recompute_granularity\": \"full\", \"recompute_method\": \"block\", "
                   "\"recompute_num_layers\": %d}", st->n);
    else if (st->recompute == FW_RECOMPUTE_SELECTIVE) {
        fw_modules_text(st->modules, "\", \"", mods, sizeof mods);
        fprintf(f, "{\"recompute_granularity\": \"selective\", \"recompute_method\": None, "
                   "\"recompute_num_layers\": None, \"recompute_modules\": [\"%s\"]}", mods);
    } else
        fprintf(f, "{\"recompute_granularity\": None, \"recompute_method\": None, "
                   "\"recompute_num_layers\": None}");
}

void export_stages_py(FILE *f, const struct export_job *x, const char *framework_commit)
{
    const struct plan *p = x->p;
    fprintf(f, "# %s.py: generated by ballast export --to %s%s%s. Each pipeline rank builds "
               "its own\n# model from its own TransformerConfig; apply() sets this rank's "
               "recompute fields, which\n# Megatron-core reads on that rank alone (%s: "
               "transformer_block.py and\n# recompute.py read recompute_granularity, _method "
               "and _num_layers in forward; attention.py\n# and transformer_layer.py "
               "recompute_modules when the layer is built).\n",
            x->o->stages_module, x->f->name, x->o->plan_name && x->o->plan_name[0] ? " from " : "",
            x->o->plan_name ? x->o->plan_name : "", framework_commit);
    fprintf(f, "# Stage memory as planned (bytes): ");
    for (int s = 0; s < x->pp; s++) /* a GPU's chunks each carry the GPU's */
        fprintf(f, "%s%lld", s ? ", " : "", (long long)p->stages[s].memory_bytes);
    fprintf(f, "\n\nPIPELINE_STAGES = [\n");
    for (int s = 0; s < x->pp; s++) {
        fprintf(f, "    ");
        stage_dict(f, &x->ranks->stages[s]);
        fprintf(f, ",  # stage %d: %s, %d blocks%s\n", s, p->stages[s].device,
                x->ranks->stages[s].blocks, x->pp < p->n_stages ? " over its chunks" : "");
    }
    fprintf(f, "]\n\n_applied = None\n\n\n"
               "def pipeline_rank_from_env(pipeline_size):\n"
               "    \"\"\"This process's pipeline rank in Megatron-core's default rank order\n"
               "    (tp-cp-ep-dp-pp: the first world/pp ranks are stage 0), before\n"
               "    torch.distributed starts; check_rank() verifies it once it has.\"\"\"\n"
               "    import os\n"
               "    rank, world = int(os.environ[\"RANK\"]), int(os.environ[\"WORLD_SIZE\"])\n"
               "    return rank // (world // pipeline_size)\n\n\n"
               "def apply(config, pipeline_rank):\n"
               "    \"\"\"Sets pipeline rank `pipeline_rank`'s recompute fields on a "
               "TransformerConfig.\"\"\"\n"
               "    global _applied\n"
               "    if not 0 <= pipeline_rank < len(PIPELINE_STAGES):\n"
               "        raise ValueError(f\"%s: pipeline rank {pipeline_rank}, but the plan has "
               "{len(PIPELINE_STAGES)} stages\")\n"
               "    for key, value in PIPELINE_STAGES[pipeline_rank].items():\n"
               "        setattr(config, key, value)\n"
               "    _applied = pipeline_rank\n"
               "    return config\n\n\n"
               "def check_rank(models):\n"
               "    \"\"\"A pre-wrap hook: the stage applied is this rank's pipeline stage.\"\"\"\n"
               "    from megatron.core import parallel_state\n"
               "    rank = parallel_state.get_pipeline_model_parallel_rank()\n"
               "    if _applied is not None and rank != _applied:\n"
               "        raise RuntimeError(f\"%s: applied stage {_applied}'s settings on pipeline "
               "rank {rank}\")\n"
               "    return models\n",
            x->o->stages_module, x->o->stages_module);
}
