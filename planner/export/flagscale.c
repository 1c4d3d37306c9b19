/* FlagScale's heterogeneous training (its Megatron-LM patches, flagscale/train/arguments.py):
 * a layer split of any shape, process meshes of consecutive stages on one device kind and tp,
 * and recompute_num_layers_per_stage_micro_batch, each stage's count of recomputed blocks in
 * every micro-batch (granularity full, method block), or selective recomputation for every
 * stage at once. Its launcher turns the YAML into Megatron-LM arguments (sections flattened,
 * lists spread), so the keys are Megatron-LM's names. */
#include <string.h>

#include "export_core.h"
#include "model_kind.h"

/* Whether stage s ends a process mesh: the next stage is of another device or tp. */
static int mesh_ends(const struct plan *p, int s)
{
    return s == p->n_stages - 1 || strcmp(p->stages[s].device, p->stages[s + 1].device) != 0 ||
           p->stages[s].tp != p->stages[s + 1].tp;
}

static void meshes(FILE *f, const struct export_job *x)
{
    const struct plan *p = x->p;
    fprintf(f, "    hetero_process_meshes: [");
    for (int s = 0, first = 0, n = 0; s < p->n_stages; s++) /* tp, cp, ep, dp, pp per mesh */
        if (mesh_ends(p, s)) {
            fprintf(f, "%s%d, 1, 1, %d, %d", n++ ? ", " : "", p->stages[s].tp, x->dp,
                    s + 1 - first);
            first = s + 1;
        }
    fprintf(f, "]\n    hetero_device_types: [");
    for (int s = 0, n = 0; s < p->n_stages; s++)
        if (mesh_ends(p, s))
            fprintf(f, "%s\"%s\"", n++ ? ", " : "", p->stages[s].device);
    fprintf(f, "]\n    # each node sets hetero_current_device_type to its own device, one of "
               "hetero_device_types\n    hetero_current_device_type: \"%s\"\n",
            p->stages[0].device);
}

static void item_lines(FILE *f, const struct export_item *items, int n, int precision,
                       const char *indent)
{
    for (int k = 0; k < n; k++)
        if (items[k].precision == precision)
            fprintf(f, "%s%s: %s\n", indent, items[k].name,
                    items[k].value[0] ? items[k].value : "True");
}

/* [stages, micro-batches, blocks] per run of stages alike: that many stages recompute that
 * many blocks in every one of the step's micro-batches. */
static void recompute(FILE *f, const struct export_job *x)
{
    char why[256], mods[64];
    int S = x->fs->n_stages, most = 0, selective = -1;
    for (int s = 0; s < S; s++) {
        const struct fw_stage *st = &x->fs->stages[s];
        most = st->recompute == FW_RECOMPUTE_FULL && st->n > most ? st->n : most;
        selective = st->recompute == FW_RECOMPUTE_SELECTIVE ? s : selective;
    }
    if (selective >= 0 && fw_settings_uniform(x->fs, why, sizeof why)) {
        fw_modules_text(x->fs->stages[selective].modules, ", ", mods, sizeof mods);
        fprintf(f, "  recompute:\n    recompute_granularity: selective\n"
                   "    recompute_modules: [%s]\n", mods);
        return;
    }
    if (most == 0)
        return;
    fprintf(f, "  recompute:\n    recompute_granularity: full\n    recompute_method: block\n"
               "    recompute_num_layers: %d\n    recompute_num_layers_per_stage_micro_batch:\n",
            most);
    for (int s = 0; s < S;) {
        int run = 1, n = x->fs->stages[s].recompute == FW_RECOMPUTE_FULL ? x->fs->stages[s].n : 0;
        while (s + run < S &&
               (x->fs->stages[s + run].recompute == FW_RECOMPUTE_FULL ? x->fs->stages[s + run].n
                                                                      : 0) == n)
            run++;
        fprintf(f, "      - [%d, %d, %d]\n", run, x->p->micro_batches, n);
        s += run;
    }
}

int export_flagscale(FILE *f, const struct export_job *x, struct err *e)
{
    (void)e;
    const struct plan *p = x->p;
    struct export_item items[EXPORT_ITEMS_MAX];
    int n = export_items(x, items), tp = 0;
    for (int s = 0; s < p->n_stages; s++)
        tp = tp || p->stages[s].tp > 1;
    export_header(f, x, "#");
    export_launch(f, x, "#");
    fprintf(f, "system:\n  pipeline_model_parallel_size: %d\n  tensor_model_parallel_size: %d\n",
            p->n_stages, x->tp);
    if (tp) /* FlagScale turns it off in each mesh of tp 1 */
        fprintf(f, "  sequence_parallel: True\n");
    if (x->shard)
        fprintf(f, "  use_distributed_optimizer: True\n");
    if (!model_is_custom(&p->model))
        fprintf(f, "  attention_backend: %s\n",
                x->attention == MODEL_ATTENTION_FLASH ? "flash" : "unfused");
    fprintf(f, "  hetero:\n    enable_hetero: True\n    hetero_pipeline_layer_split: ");
    export_list(f, x, 0);
    fprintf(f, "\n");
    meshes(f, x);
    if (model_is_custom(&p->model))
        fprintf(x->note, "ballast export: note: the custom model \"%s\" carries no dtype: set "
                         "system.precision yourself (e.g. bf16: True)\n", p->model.name);
    else if (p->model.dtype != MODEL_DTYPE_FP32) {
        fprintf(f, "  precision:\n");
        item_lines(f, items, n, 1, "    ");
    }
    recompute(f, x);
    if (n > 0) {
        fprintf(f, "model:\n");
        item_lines(f, items, n, 0, "  ");
    }
    return ERR_OK;
}
