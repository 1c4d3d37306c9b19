/* Megatron-LM's arguments (megatron/training/arguments.py, most made from TransformerConfig's
 * fields), one a line, continued with a backslash; with settings per stage, the per-rank
 * Python file and the lines pretrain_gpt.py needs to call it. */
#include <string.h>

#include "export_core.h"
#include "model_kind.h"

#define MEGATRON_COMMIT "Megatron-LM d98e8a64"

static void arg(FILE *f, int *first, const char *name, const char *value)
{
    fprintf(f, "%s--", *first ? "" : " \\\n");
    for (const char *c = name; *c; c++)
        fputc(*c == '_' ? '-' : *c, f);
    if (value[0])
        fprintf(f, " %s", value);
    *first = 0;
}

static void argf(FILE *f, int *first, const char *name, int value)
{
    char v[16];
    snprintf(v, sizeof v, "%d", value);
    arg(f, first, name, v);
}

/* The layout string: E the embedding, t a block, L the loss head, | between stages. */
static void megatron_layout(const struct export_job *x, char *out, size_t size)
{
    int n = 0, S = x->p->n_stages;
    out[0] = '\0';
    for (int s = 0; s < S && n < (int)size - 32; s++) {
        int b = x->fs->stages[s].blocks;
        char blocks[24] = "";
        if (b > 1)
            snprintf(blocks, sizeof blocks, "t*%d", b);
        else if (b == 1)
            snprintf(blocks, sizeof blocks, "t");
        n += snprintf(out + n, size - (size_t)n, "%s%s%s%s", s ? "|" : "", s == 0 ? "E" : "",
                      blocks, s == S - 1 ? "L" : "");
    }
}

/* One recompute setting for every stage (the command line's form). */
static void recompute_args(FILE *f, int *first, const struct fw_stage *st, int most)
{
    char mods[64];
    if (st->recompute == FW_RECOMPUTE_SELECTIVE) {
        fw_modules_text(st->modules, " ", mods, sizeof mods);
        arg(f, first, "recompute_granularity", "selective");
        arg(f, first, "recompute_modules", mods);
    } else if (most > 0) {
        arg(f, first, "recompute_granularity", "full");
        arg(f, first, "recompute_method", "block");
        argf(f, first, "recompute_num_layers", most);
    }
}

/* The stage whose setting the command line gives: a selective one, else the most blocks. */
static const struct fw_stage *cli_setting(const struct export_job *x, int *most)
{
    const struct fw_stage *pick = &x->ranks->stages[0];
    *most = 0;
    for (int s = 0; s < x->ranks->n_stages; s++) {
        const struct fw_stage *st = &x->ranks->stages[s];
        if (st->recompute == FW_RECOMPUTE_SELECTIVE)
            pick = st;
        if (st->recompute == FW_RECOMPUTE_FULL && st->n > *most)
            *most = st->n;
    }
    return pick;
}

static void megatron_per_rank_lines(FILE *f, const struct export_job *x)
{
    const char *m = x->o->stages_module;
    fprintf(f, "# per-rank recompute: put %s.py beside pretrain_gpt.py, and in pretrain_gpt.py "
               "(%s),\n# right after `model_cfg = gpt_config_from_args(args)`, add:\n"
               "#     import %s\n"
               "#     %s.apply(model_cfg.transformer,\n"
               "#         %s.pipeline_rank_from_env(args.pipeline_model_parallel_size))\n"
               "#     model_cfg.pre_wrap_hooks.append(%s.check_rank)\n"
               "# (with --use-tp-pp-dp-mapping give apply() the rank yourself; check_rank stops "
               "a mismatch)\n",
            m, MEGATRON_COMMIT, m, m, m, m);
}

int export_megatron(FILE *f, const struct export_job *x, struct err *e)
{
    (void)e;
    const struct plan *p = x->p;
    struct export_item items[EXPORT_ITEMS_MAX];
    int n = export_items(x, items), first = 1, most = 0;
    char lay[4096];
    export_header(f, x, "#");
    export_launch(f, x, "#");
    if (x->per_rank) {
        megatron_per_rank_lines(f, x);
        export_stages_py(x->o->stages, x, MEGATRON_COMMIT);
    }
    if (x->offload)
        fprintf(f, "# with Transformer Engine >= 2.10 set NVTE_CPU_OFFLOAD_V1=1 (Megatron-LM "
                   "asserts it for fine-grained activation offloading)\n");
    if (model_is_custom(&p->model))
        fprintf(x->note, "ballast export: note: the custom model \"%s\" carries no shape or "
                         "dtype: give Megatron-LM its own, and its precision (e.g. --bf16)\n",
                p->model.name);
    argf(f, &first, "pipeline_model_parallel_size", x->pp); /* the layout gives the chunks */
    megatron_layout(x, lay, sizeof lay);
    fprintf(f, " \\\n--pipeline-model-parallel-layout \"%s\"", lay);
    argf(f, &first, "tensor_model_parallel_size", x->tp);
    if (x->tp > 1)
        arg(f, &first, "sequence_parallel", "");
    if (x->shard)
        arg(f, &first, "use_distributed_optimizer", "");
    if (!model_is_custom(&p->model))
        arg(f, &first, "attention_backend",
            x->attention == MODEL_ATTENTION_FLASH ? "flash" : "unfused");
    for (int k = 0; k < n; k++)
        arg(f, &first, items[k].name, items[k].value);
    if (!x->per_rank) {
        const struct fw_stage *one = cli_setting(x, &most);
        recompute_args(f, &first, one, most);
    }
    if (x->fs->host_optimizer) {
        arg(f, &first, "optimizer_cpu_offload", "");
        char share[32];
        snprintf(share, sizeof share, "%.4g", x->fs->host_fraction);
        arg(f, &first, "optimizer_offload_fraction", strcmp(share, "1") == 0 ? "1.0" : share);
        arg(f, &first, "use_precision_aware_optimizer", "");
    }
    if (x->offload)
        fprintf(f, " \\\n%s", x->offload);
    fprintf(f, "\n");
    return ERR_OK;
}
