/* `ballast plan --export colossalai|nemo|megatron`: a plan in the form those frameworks take.
 * They count transformer blocks per stage (the embedding rides with the first stage, the
 * head with the last) and recompute the first N blocks of a stage; what a framework cannot
 * express is said in a comment, always erring towards more recomputation, never less. A block
 * the plan recomputes only in part (a recompute option) counts as recomputed whole, except in
 * Megatron-LM when the plan recomputes no block whole: its selective recomputation
 * (--recompute-modules core_attn mlp, every block of every stage) covers Ballast's options. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner.h"

struct stage_counts {
    int blocks;    /* transformer blocks on the stage */
    int recompute; /* of which recomputed, whole or in part */
    int partial;   /* of which in part (an option) */
    int other;     /* embed or head recomputed: no framework here recomputes those */
};

/* What options the plan's blocks use, as Megatron-LM's selective modules cover them. */
struct option_use {
    int attn, mlp, other; /* blocks recomputing the attention, the MLP activation, else */
};

static void count(const struct plan *p, struct stage_counts *c, struct option_use *u)
{
    *u = (struct option_use){0, 0, 0};
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        c[s] = (struct stage_counts){0, 0, 0, 0};
        for (int l = st->first; l <= st->last; l++) {
            int block = model_layer_kind(&p->model, l) == MODEL_LAYER_BLOCK;
            int choice = st->recompute[l - st->first];
            c[s].blocks += block;
            c[s].recompute += block && choice != COST_KEEP;
            c[s].other += !block && choice != COST_KEEP;
            if (!block || choice < COST_OPTION)
                continue;
            c[s].partial++;
            const char *name = cost_choice_name(&st->layers[l - st->first], choice);
            int attn = strcmp(name, "attn") == 0 || strcmp(name, "attn+mlp") == 0;
            int mlp = strcmp(name, "mlp") == 0 || strcmp(name, "attn+mlp") == 0;
            u->attn += attn;
            u->mlp += mlp;
            u->other += !attn && !mlp;
        }
    }
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

/* Blocks recomputed in part, counted as whole by a framework that cannot do otherwise. */
static void partial_note(FILE *f, const struct plan *p, const struct stage_counts *c,
                         const char *framework, const char *comment)
{
    int partial = 0;
    for (int s = 0; s < p->n_stages; s++)
        partial += c[s].partial;
    if (partial == 0)
        return;
    fprintf(f, "%s note: the plan recomputes %d block(s) only in part (recompute options), per "
               "stage [",
            comment, partial);
    for (int s = 0; s < p->n_stages; s++)
        fprintf(f, "%s%d", s ? ", " : "", c[s].partial);
    fprintf(f, "]; %s cannot express them here, so they count as recomputed whole below (more "
               "recomputation, less memory)\n",
            framework);
}

static void notes(FILE *f, const struct plan *p, const struct stage_counts *c,
                  const char *comment)
{
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        for (int l = 0; l < plan_stage_layer_count(st); l++) {
            const struct layer_cost *lc = &st->layers[l];
            if (!st->recompute[l] || model_layer_kind(&p->model, st->first + l) == MODEL_LAYER_BLOCK)
                continue;
            fprintf(f, "%s note: stage %d also recomputes its %s, which the framework keeps: "
                       "%.3f GiB more there\n",
                    comment, s, lc->name,
                    (double)cost_saved_bytes(lc, st->recompute[l], st->in_flight) / 1073741824.0);
        }
        if (c[s].blocks == 0)
            fprintf(f, "%s note: stage %d holds no transformer block (only %s)\n", comment, s,
                    s == 0 ? "the embedding" : "the head");
    }
    fprintf(f, "%s note: frameworks recompute the first N blocks of a stage; Ballast chose "
               "which ones, equal when the blocks cost the same\n",
            comment);
}

static void list(FILE *f, const struct stage_counts *c, int n, int recompute)
{
    fprintf(f, "[");
    for (int s = 0; s < n; s++)
        fprintf(f, "%s%d", s ? ", " : "", recompute ? c[s].recompute : c[s].blocks);
    fprintf(f, "]");
}

static int export_colossalai(FILE *f, const struct plan *p, const struct stage_counts *c)
{
    header(f, p, "#");
    notes(f, p, c, "#");
    partial_note(f, p, c, "ColossalAI", "#");
    fprintf(f, "from colossalai.booster.plugin import HybridParallelPlugin\n"
               "from colossalai.shardformer import PipelineGradientCheckpointConfig\n\n"
               "plugin = HybridParallelPlugin(\n"
               "    tp_size=1,\n"
               "    pp_size=%d,\n"
               "    num_microbatches=%d,\n"
               "    pp_style=\"1f1b\",\n"
               "    num_layers_per_stage=",
            p->n_stages, p->micro_batches);
    list(f, c, p->n_stages, 0);
    fprintf(f, ",\n    enable_gradient_checkpointing=True,\n"
               "    gradient_checkpoint_config=PipelineGradientCheckpointConfig(\n"
               "        num_ckpt_layers_per_stage=");
    list(f, c, p->n_stages, 1);
    fprintf(f, ",\n    ),\n)\n");
    if (p->schedule == SCHEDULE_GPIPE)
        fprintf(f, "# note: the plan was made for GPipe; ColossalAI runs 1F1B, which keeps fewer "
                   "micro-batches in flight, so the plan fits there too\n");
    return ERR_OK;
}

/* NeMo recomputes activations_checkpoint_num_layers - int(s * layers_per_pipeline) blocks on
 * stage s: the least (N0, k) that covers every stage's need, with the least excess. */
static int export_nemo(FILE *f, const struct plan *p, const struct stage_counts *c)
{
    int S = p->n_stages, even = 1;
    for (int s = 0; s < S; s++)
        even = even && c[s].blocks == c[0].blocks;
    header(f, p, "#");
    notes(f, p, c, "#");
    partial_note(f, p, c, "NeMo", "#");
    if (!even) {
        fprintf(f, "# note: NeMo splits the blocks evenly over the stages; this plan's split ");
        list(f, c, S, 0);
        fprintf(f, " cannot be expressed: the recompute counts below assume it anyway\n");
    }
    int best_n0 = 0;
    double best_k = 0;
    long best_excess = -1;
    /* k in steps of 1/16 covers every slope a per-stage count can need */
    int most = 0;
    for (int s = 0; s < S; s++)
        most = c[s].recompute > most ? c[s].recompute : most;
    for (int step = 0; step <= 16 * (most + 1); step++) {
        double k = step / 16.0;
        int n0 = 0;
        for (int s = 0; s < S; s++) {
            int need = c[s].recompute + (int)(s * k);
            n0 = need > n0 ? need : n0;
        }
        long excess = 0;
        for (int s = 0; s < S; s++) {
            int got = n0 - (int)(s * k);
            if (got > c[s].blocks)
                got = c[s].blocks;
            excess += got - c[s].recompute;
        }
        if (best_excess < 0 || excess < best_excess) {
            best_excess = excess;
            best_n0 = n0;
            best_k = k;
        }
    }
    if (best_excess > 0) {
        fprintf(f, "# note: NeMo's linear rule recomputes %ld more block(s) in all than the plan: "
                   "per stage ",
                best_excess);
        fprintf(f, "[");
        for (int s = 0; s < S; s++) {
            int got = best_n0 - (int)(s * best_k);
            fprintf(f, "%s%d", s ? ", " : "", got > c[s].blocks ? c[s].blocks : got);
        }
        fprintf(f, "] against the plan's ");
        list(f, c, S, 1);
        fprintf(f, "\n");
    }
    fprintf(f, "model:\n"
               "  pipeline_model_parallel_size: %d\n"
               "  activations_checkpoint_granularity: full\n"
               "  activations_checkpoint_method: block\n"
               "  activations_checkpoint_num_layers: %d\n"
               "  activations_checkpoint_layers_per_pipeline: %g\n",
            S, best_n0, best_k);
    return ERR_OK;
}

/* Megatron-LM's selective recomputation, when the plan recomputes no block whole: core_attn
 * frees the attention probabilities and keeps its output, as Ballast's attn does; its mlp
 * recomputes the whole MLP from its input, more than Ballast's GELU-only mlp. Either applies
 * to every block of every stage. */
static void megatron_selective(FILE *f, const struct plan *p, const struct stage_counts *c,
                               const struct option_use *u)
{
    int kept = 0;
    for (int s = 0; s < p->n_stages; s++)
        kept += c[s].blocks - c[s].partial;
    if (kept > 0)
        fprintf(f, "# note: Megatron-LM's selective recomputation applies to every block; the "
                   "plan keeps %d block(s) whole, which it recomputes too\n",
                kept);
    if (u->mlp > 0)
        fprintf(f, "# note: Megatron-LM's mlp module recomputes the whole MLP from its input "
                   "where the plan recomputes only the GELU (more recomputation, less memory)\n");
    fprintf(f, "--recompute-granularity selective --recompute-modules%s%s\n",
            u->attn ? " core_attn" : "", u->mlp ? " mlp" : "");
}

static int export_megatron(FILE *f, const struct plan *p, const struct stage_counts *c,
                           const struct option_use *u)
{
    int S = p->n_stages, most = 0, whole = 0, partial = 0;
    header(f, p, "#");
    notes(f, p, c, "#");
    for (int s = 0; s < S; s++) {
        whole += c[s].recompute - c[s].partial;
        partial += c[s].partial;
    }
    /* selective when the plan recomputes no block whole and its options are Megatron's */
    int selective = whole == 0 && partial > 0 && u->other == 0;
    if (!selective && partial > 0) {
        if (u->other == 0)
            fprintf(f, "# note: Megatron-LM cannot combine full and selective recomputation; "
                       "the plan also recomputes blocks whole\n");
        partial_note(f, p, c, "Megatron-LM", "#");
    }
    for (int s = 0; s < S && !selective; s++)
        most = c[s].recompute > most ? c[s].recompute : most;
    int over = 0;
    for (int s = 0; s < S && !selective; s++) {
        int got = most < c[s].blocks ? most : c[s].blocks;
        over += got - c[s].recompute;
    }
    if (over > 0) {
        fprintf(f, "# note: Megatron-LM takes one --recompute-num-layers for every stage; %d "
                   "recomputes the plan's per-stage ",
                most);
        list(f, c, S, 1);
        fprintf(f, " plus %d block(s) more in all\n", over);
    }
    /* older Megatron-LM: only the first and last stage may differ (notes come before the
     * arguments, which continue over lines) */
    int middle = 1;
    for (int s = 2; s < S - 1; s++)
        middle = middle && c[s].blocks == c[1].blocks;
    if (S >= 3 && middle)
        fprintf(f, "# Megatron-LM before the layout flag: instead of the layout,\n"
                   "#   --decoder-first-pipeline-num-layers %d --decoder-last-pipeline-num-layers "
                   "%d\n",
                c[0].blocks, c[S - 1].blocks);
    else if (S >= 3)
        fprintf(f, "# note: Megatron-LM before the layout flag can make only the first and last "
                   "stage uneven; this split needs --pipeline-model-parallel-layout\n");
    if (selective) /* its notes come before the arguments too */
        megatron_selective(f, p, c, u);
    /* the layout string: E the embedding, t a block, L the loss head, | between stages */
    fprintf(f, "--pipeline-model-parallel-size %d \\\n--pipeline-model-parallel-layout \"", S);
    for (int s = 0; s < S; s++) {
        if (s)
            fprintf(f, "|");
        if (s == 0)
            fprintf(f, "E");
        if (c[s].blocks == 1)
            fprintf(f, "t");
        else if (c[s].blocks > 1)
            fprintf(f, "t*%d", c[s].blocks);
        if (s == S - 1)
            fprintf(f, "L");
    }
    fprintf(f, "\"%s\n", most > 0 ? " \\" : "");
    if (most > 0)
        fprintf(f, "--recompute-granularity full --recompute-method block "
                   "--recompute-num-layers %d\n",
                most);
    return ERR_OK;
}

int planner_export(FILE *f, const struct plan *p, const char *format, struct err *e)
{
    struct stage_counts *c = calloc((size_t)p->n_stages, sizeof *c);
    if (c == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    struct option_use u;
    count(p, c, &u);
    int rc;
    if (strcmp(format, "colossalai") == 0)
        rc = export_colossalai(f, p, c);
    else if (strcmp(format, "nemo") == 0)
        rc = export_nemo(f, p, c);
    else if (strcmp(format, "megatron") == 0)
        rc = export_megatron(f, p, c, &u);
    else
        rc = err_set(e, ERR_INPUT, "--export: \"%s\", expected colossalai, nemo or megatron",
                     format);
    free(c);
    return rc;
}
