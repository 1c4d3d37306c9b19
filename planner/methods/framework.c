/* The frameworks' capability table and what a framework's settings do to a plan
 * (framework.h). Each row is read from the framework's source at the commit
 * tests/data/export_keys.json quotes; docs/frameworks.md says why each cell is what it is. */
#include "framework.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "choice.h"
#include "microbatch.h"
#include "model_kind.h"
#include "plan_layout.h"
#include "planner.h"

static const struct framework table[] = {
    /* Ballast's own runtime: every action, any split, its own activations */
    {"ballast", "Ballast", NULL, NULL, FW_PER_STAGE, 0, FW_PER_STAGE, FW_SPLIT_ANY,
     0, 1, FW_PER_STAGE, 0, NULL},
    /* Megatron-LM: every rank builds its own TransformerConfig (recompute_granularity,
     * _method, _num_layers, _modules), set per pipeline rank by the generated file; the layout
     * takes any split, an empty stage included; --optimizer-cpu-offload is one switch */
    {"megatron", "Megatron-LM", "megatron", NULL, FW_PER_STAGE, 0, FW_PER_STAGE,
     FW_SPLIT_ANY, 0, 0, FW_GLOBAL, 1, "megatron"},
    /* its command line alone: one setting for every stage */
    {"megatron-cli", "Megatron-LM", "megatron", NULL, FW_GLOBAL, 0, FW_GLOBAL,
     FW_SPLIT_ANY, 0, 0, FW_GLOBAL, 0, "megatron"},
    /* NeMo (Megatron-core underneath): the first and last stage's blocks, the rest even, at
     * least one each; per rank through its model_provider_func */
    {"nemo", "NeMo", "nemo", NULL, FW_PER_STAGE, 0, FW_PER_STAGE, FW_SPLIT_ENDS, 1,
     0, FW_NO, 1, "nemo"},
    {"nemo-cli", "NeMo", "nemo", NULL, FW_GLOBAL, 0, FW_GLOBAL, FW_SPLIT_ENDS, 1, 0,
     FW_NO, 0, "nemo"},
    /* ColossalAI's HybridParallelPlugin: its GPT-2 forward recomputes every block of every
     * stage or none (it never reads gradient_checkpoint_config); its Llama forward the first
     * num_ckpt_layers_per_stage[s] blocks of stage s; no recompute modules */
    {"colossalai", "ColossalAI", "colossalai", "gpt2", FW_GLOBAL, 1, FW_NO, FW_SPLIT_ANY,
     1, 0, FW_NO, 0, "colossalai"},
    {"colossalai", "ColossalAI", "colossalai", NULL, FW_PER_STAGE, 0, FW_NO,
     FW_SPLIT_ANY, 1, 0, FW_NO, 0, "colossalai"},
    /* FlagScale's heterogeneous training: per-stage recompute counts (granularity full,
     * method block), selective only for every stage at once; a tp per process mesh */
    {"flagscale", "FlagScale", "flagscale", NULL, FW_PER_STAGE, 0, FW_GLOBAL,
     FW_SPLIT_ANY, 1, 1, FW_NO, 0, "flagscale"},
};

#define N_TABLE ((int)(sizeof table / sizeof table[0]))

const struct framework *framework_find(const char *name, const struct model *m)
{
    for (int k = 0; k < N_TABLE; k++)
        if (strcmp(table[k].name, name) == 0 &&
            (m == NULL || fw_row_fits(&table[k], m)))
            return &table[k];
    return NULL;
}

int fw_row_fits(const struct framework *f, const struct model *m)
{
    const char *type = model_kind_of(m)->hf_type;
    return f->hf_type == NULL || (type != NULL && strcmp(f->hf_type, type) == 0);
}

const char *framework_names(void)
{
    return "ballast, megatron, megatron-cli, nemo, nemo-cli, colossalai or flagscale";
}

int fw_activations_alike(const char *a, const char *b)
{
    /* Megatron-LM, NeMo and FlagScale all run Megatron-core's layers (profile --for makes one
     * activation model for the three) */
    static const char *const core[] = {"megatron", "nemo", "flagscale"};
    int in_a = 0, in_b = 0;
    for (int k = 0; k < 3; k++) {
        in_a |= strcmp(a, core[k]) == 0;
        in_b |= strcmp(b, core[k]) == 0;
    }
    return strcmp(a, b) == 0 || (in_a && in_b);
}

int framework_is_ballast(const struct framework *f)
{
    return f == NULL || f->exporter == NULL;
}

void fw_profile_assumptions(const struct profile *p, char acts[PLAN_FRAMEWORK_MAX],
                            enum model_attention *attention)
{
    const cJSON *f = p->provenance ? cJSON_GetObjectItemCaseSensitive(p->provenance, "for") : NULL;
    const cJSON *a =
        p->provenance ? cJSON_GetObjectItemCaseSensitive(p->provenance, "attention") : NULL;
    snprintf(acts, PLAN_FRAMEWORK_MAX, "%s", cJSON_IsString(f) ? f->valuestring : "ballast");
    *attention = p->model.attention;
    if (cJSON_IsString(a))
        *attention = strcmp(a->valuestring, "flash") == 0 ? MODEL_ATTENTION_FLASH
                                                           : MODEL_ATTENTION_MATERIALIZED;
}

int fw_device_check(const struct plan *p, const struct framework *f,
                    const struct device_table *t, struct err *e)
{
    for (int s = 0; s < p->n_stages; s++) {
        const struct device_spec *d = devices_find(t, p->stages[s].device);
        if (d == NULL || strcmp(d->kind, "cuda") != 0 || d->bf16_tensor)
            continue;
        if (!model_is_custom(&p->model) && p->model.dtype == MODEL_DTYPE_BF16)
            return err_set(e, ERR_INPUT,
                           "%s: stage %d runs on %s, which has no bf16 tensor cores (compute "
                           "capability below 8.0): the bf16 model would train at its fp32 "
                           "rate, if the framework's kernels run at all; give the model "
                           "\"dtype\": \"fp16\" (with dynamic loss scaling) and plan again",
                           f->title, s, d->name);
        if (p->framework.attention == MODEL_ATTENTION_FLASH)
            return err_set(e, ERR_INPUT,
                           "%s: stage %d runs on %s (compute capability below 8.0: no bf16 "
                           "tensor cores), where FlashAttention and TransformerEngine's fused "
                           "attention do not run, but the plan's layer costs assume flash "
                           "attention (activations \"%s\"); plan for materialized attention "
                           "instead (a model with \"attention\": \"materialized\", planned "
                           "--for ballast and exported: the unfused backend)",
                           f->title, s, d->name, p->framework.activations);
    }
    return ERR_OK;
}

int fw_settings_init(struct fw_settings *s, int n_stages, struct err *e)
{
    s->n_stages = n_stages;
    s->host_optimizer = 0;
    s->host_fraction = 1;
    s->stages = calloc((size_t)(n_stages > 0 ? n_stages : 1), sizeof *s->stages);
    return s->stages ? ERR_OK : err_set(e, ERR_FAIL, "out of memory");
}

void fw_settings_free(struct fw_settings *s)
{
    free(s->stages);
    s->stages = NULL;
    s->n_stages = 0;
}

/* The modules and the profile option that stands for them; `framework_only`: the option has
 * that meaning only in the framework's own activation model (Ballast's "mlp" option
 * recomputes the activation function alone, Megatron-core's mlp module the whole MLP). */
static const struct {
    unsigned modules;
    const char *option;
    int framework_only;
} module_options[] = {
    {FW_MODULE_CORE_ATTN, "attn", 0},
    {FW_MODULE_MLP, "mlp", 1},
    {FW_MODULE_CORE_ATTN | FW_MODULE_MLP, "attn+mlp", 1},
};

#define N_MODULE_OPTIONS ((int)(sizeof module_options / sizeof module_options[0]))

void fw_modules_text(unsigned modules, const char *sep, char *out, size_t size)
{
    snprintf(out, size, "%s%s%s", modules & FW_MODULE_CORE_ATTN ? "core_attn" : "",
             modules == (FW_MODULE_CORE_ATTN | FW_MODULE_MLP) ? sep : "",
             modules & FW_MODULE_MLP ? "mlp" : "");
}

int fw_is_block(const struct model *m, int layer)
{
    return model_layer_kind(m, layer) == MODEL_LAYER_BLOCK;
}

int fw_stage_blocks(const struct plan *p, int s)
{
    int n = 0;
    for (int l = p->stages[s].first; l <= p->stages[s].last; l++)
        n += fw_is_block(&p->model, l);
    return n;
}

/* The choice of layer `c` that stands for `modules`: COST_OPTION + k, or -1. */
static int module_choice(const struct layer_cost *c, unsigned modules, int framework_acts)
{
    for (int k = 0; k < N_MODULE_OPTIONS; k++) {
        if (module_options[k].modules != modules ||
            (module_options[k].framework_only && !framework_acts))
            continue;
        for (int o = 0; o < c->n_options; o++)
            if (strcmp(c->options[o].name, module_options[k].option) == 0)
                return COST_OPTION + o;
    }
    return -1;
}

/* The recompute choices of layers first..first+n-1 under `fs` into `choice`; ERR_INPUT
 * naming the layer without the modules' option. */
static int range_choices(const struct model *m, int first, const struct layer_cost *layers,
                         int n, const struct fw_stage *fs, int framework_acts,
                         unsigned char *choice, struct err *e)
{
    for (int l = 0, block = 0; l < n; l++) {
        choice[l] = COST_KEEP;
        if (!fw_is_block(m, first + l))
            continue;
        if (fs->recompute == FW_RECOMPUTE_FULL && block < fs->n)
            choice[l] = COST_FULL;
        if (fs->recompute == FW_RECOMPUTE_SELECTIVE) {
            int c = module_choice(&layers[l], fs->modules, framework_acts);
            if (c < 0) {
                char mods[32];
                fw_modules_text(fs->modules, " ", mods, sizeof mods);
                return err_set(e, ERR_INPUT,
                               "layer %d (%s) has no recompute option standing for the "
                               "modules %s%s",
                               first + l, layers[l].name, mods,
                               framework_acts ? "" : " in Ballast's own activation model");
            }
            choice[l] = (unsigned char)c;
        }
        block++;
    }
    return ERR_OK;
}

int fw_stage_apply(struct plan *p, int s, const struct fw_stage *fs, int framework_acts,
                   struct err *e)
{
    struct plan_stage *st = &p->stages[s];
    int n = plan_stage_layer_count(st);
    unsigned char *choice = malloc((size_t)n);
    if (choice == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int rc = range_choices(&p->model, st->first, st->layers, n, fs, framework_acts, choice, e);
    for (int l = 0; rc == ERR_OK && l < n; l++) { /* the frameworks here offload nothing */
        st->actions[l] = LAYER_ACTION_KEEP;
        st->actions[l].choice = choice[l];
    }
    free(choice);
    return rc;
}

/* The by-layer split of stage st's optimizer nearest `fraction` of its state on the host
 * (cost_optimizer_fraction): the first hosted layer, 0 for the whole. */
static int host_from(const struct plan_stage *st, double fraction)
{
    int n = plan_stage_layer_count(st), best = 0;
    double gap = INFINITY;
    for (int from = 0; from < n && fraction < 1; from++) {
        double d = fabs(cost_optimizer_fraction(st->layers, n, from) - fraction);
        if (d < gap) {
            gap = d;
            best = from;
        }
    }
    return best;
}

int fw_settings_apply(struct plan *p, const struct fw_settings *fs, int framework_acts,
                      struct err *e)
{
    for (int s = 0; s < p->n_stages; s++) {
        p->stages[s].optimizer = fs->host_optimizer ? COST_PLACE_HOST : COST_PLACE_DEVICE;
        p->stages[s].optimizer_from =
            fs->host_optimizer ? host_from(&p->stages[s], fs->host_fraction) : 0;
        if (fw_stage_apply(p, s, &fs->stages[s], framework_acts, e))
            return e->code;
    }
    return planner_finish(p, e);
}

/* ---- reading a plan's actions as settings ---- */

/* How stage s recomputes its blocks: whole (how many), in part, whether the whole ones are
 * its first, and the one option those in part take (-2: none). */
struct block_tally {
    int whole, partial, prefix, option;
};

/* Stage s's blocks tallied, refusing (0, with why) what no framework says: a layer sent to the
 * host, a layer other than a block recomputed, blocks with different options. */
static int tally_blocks(const struct plan *p, int s, struct block_tally *t, char *why,
                        size_t size)
{
    const struct plan_stage *st = &p->stages[s];
    *t = (struct block_tally){.prefix = 1, .option = -2};
    for (int l = 0, block = 0; l < plan_stage_layer_count(st); l++) {
        int c = st->actions[l].choice, layer = st->first + l;
        if (st->actions[l].place != COST_PLACE_DEVICE || st->actions[l].offload_option >= 0) {
            snprintf(why, size, "stage %d sends layer %d (%s) to host memory", s, layer,
                     st->layers[l].name);
            return 0;
        }
        if (!fw_is_block(&p->model, layer)) {
            if (c != COST_KEEP) {
                snprintf(why, size, "stage %d recomputes its %s, which the frameworks keep",
                         s, st->layers[l].name);
                return 0;
            }
            continue;
        }
        t->whole += c == COST_FULL;
        t->partial += c >= COST_OPTION;
        t->prefix = t->prefix && (c == COST_FULL) == (t->whole == block + 1);
        if (c >= COST_OPTION && t->option != -2 && t->option != c) {
            snprintf(why, size, "stage %d recomputes its blocks with different options", s);
            return 0;
        }
        t->option = c >= COST_OPTION ? c : t->option;
        block++;
    }
    return 1;
}

/* The recompute module that stands for the stage's partial option (the first layer's that
 * takes one), where the framework has it; -1 when none does. */
static int module_of(const struct plan_stage *st, int framework_acts)
{
    const char *name = NULL;
    for (int l = 0; l < plan_stage_layer_count(st) && name == NULL; l++)
        if (st->actions[l].choice >= COST_OPTION)
            name = cost_choice_name(&st->layers[l], st->actions[l].choice);
    for (int k = 0; name != NULL && k < N_MODULE_OPTIONS; k++)
        if (strcmp(name, module_options[k].option) == 0 &&
            (!module_options[k].framework_only || framework_acts))
            return k;
    return -1;
}

/* Stage s's recompute as one form, or 0 with why. */
static int read_stage(const struct plan *p, int s, int framework_acts, struct fw_stage *fs,
                      char *why, size_t size)
{
    struct block_tally t;
    *fs = (struct fw_stage){.blocks = fw_stage_blocks(p, s)};
    if (!tally_blocks(p, s, &t, why, size))
        return 0;
    if (t.whole && t.partial) {
        snprintf(why, size, "stage %d recomputes %d block(s) whole and %d in part", s, t.whole,
                 t.partial);
        return 0;
    }
    if (t.whole && !t.prefix) {
        snprintf(why, size, "stage %d recomputes %d block(s) but not its first %d", s, t.whole,
                 t.whole);
        return 0;
    }
    if (t.partial && t.partial != fs->blocks) {
        snprintf(why, size, "stage %d recomputes %d of its %d blocks in part (recompute modules "
                 "apply to every block)", s, t.partial, fs->blocks);
        return 0;
    }
    if (t.whole) {
        fs->recompute = FW_RECOMPUTE_FULL;
        fs->n = t.whole;
        return 1;
    }
    if (!t.partial)
        return 1;
    int k = module_of(&p->stages[s], framework_acts);
    if (k < 0) {
        snprintf(why, size, "stage %d recomputes its blocks with an option no recompute module "
                 "stands for", s);
        return 0;
    }
    fs->recompute = FW_RECOMPUTE_SELECTIVE;
    fs->modules = module_options[k].modules;
    return 1;
}

int fw_settings_read(const struct plan *p, int framework_acts, struct fw_settings *out,
                     char *why, size_t why_size)
{
    int hosted = 0;
    for (int s = 0; s < p->n_stages; s++) {
        hosted += p->stages[s].optimizer == COST_PLACE_HOST;
        if (!read_stage(p, s, framework_acts, &out->stages[s], why, why_size))
            return 0;
    }
    if (hosted && hosted != p->n_stages) {
        snprintf(why, why_size, "%d of %d stages keep their optimizer on the host", hosted,
                 p->n_stages);
        return 0;
    }
    out->host_optimizer = hosted > 0;
    return fw_host_share(p, &out->host_fraction, why, why_size);
}

int fw_host_share(const struct plan *p, double *share, char *why, size_t why_size)
{
    int hosted = 0;
    for (int s = 0; s < p->n_stages; s++) {
        if (p->stages[s].optimizer != COST_PLACE_HOST)
            continue;
        double f = plan_stage_optimizer_fraction(&p->stages[s]);
        if (hosted++ == 0) {
            *share = f;
        } else if (fabs(f - *share) >= 1e-4) {
            snprintf(why, why_size, "the stages keep different shares of their optimizer on "
                     "the host (%.3g and stage %d's %.3g), which one offload fraction cannot "
                     "say", *share, s, f);
            return 0;
        }
    }
    if (hosted == 0)
        *share = 1;
    return 1;
}

/* ---- what a framework can say ---- */

static int fw_split_allowed(const struct framework *f, const struct plan *p, char *why,
                            size_t size)
{
    int S = p->n_stages;
    for (int s = 0; s < S; s++) {
        if (fw_stage_blocks(p, s) < f->min_blocks) {
            snprintf(why, size, "stage %d holds %d blocks, and %s needs at least %d a stage", s,
                     fw_stage_blocks(p, s), f->title, f->min_blocks);
            return 0;
        }
        if (!f->tp_per_stage && p->stages[s].tp != p->stages[0].tp) {
            snprintf(why, size, "stage %d has tp %d and stage 0 tp %d, but %s takes one "
                     "tensor-parallel size for every stage (flagscale takes one per process "
                     "mesh)", s, p->stages[s].tp, p->stages[0].tp, f->title);
            return 0;
        }
    }
    for (int s = 2; f->split == FW_SPLIT_ENDS && s < S - 1; s++)
        if (fw_stage_blocks(p, s) != fw_stage_blocks(p, 1)) {
            snprintf(why, size, "stage %d holds %d blocks and stage 1 %d, but %s sets only the "
                     "first and last stage's blocks and splits the rest evenly", s,
                     fw_stage_blocks(p, s), fw_stage_blocks(p, 1), f->title);
            return 0;
        }
    return 1;
}

/* Whether the form of fs (on a stage of its blocks) is one f has, with `scope`. */
static int form_allowed(const struct framework *f, const struct fw_stage *fs)
{
    if (fs->recompute == FW_RECOMPUTE_FULL)
        return f->full != FW_NO && (!f->full_all_only || fs->n == fs->blocks);
    if (fs->recompute == FW_RECOMPUTE_SELECTIVE)
        return f->selective != FW_NO;
    return 1;
}

int fw_settings_uniform(const struct fw_settings *fs, char *why, size_t size)
{
    int most = 0, first = -1;
    for (int s = 0; s < fs->n_stages; s++) {
        const struct fw_stage *st = &fs->stages[s];
        most = st->recompute == FW_RECOMPUTE_FULL && st->n > most ? st->n : most;
        if (first < 0 && st->recompute != FW_RECOMPUTE_NONE)
            first = s;
    }
    if (first < 0)
        return 1;
    const struct fw_stage *one = &fs->stages[first];
    for (int s = 0; s < fs->n_stages; s++) {
        const struct fw_stage *st = &fs->stages[s];
        int want = most < st->blocks ? most : st->blocks;
        if (one->recompute == FW_RECOMPUTE_FULL &&
            (st->recompute == FW_RECOMPUTE_FULL ? st->n : 0) != want)
            return snprintf(why, size, "stage %d recomputes %s where one setting for every "
                            "stage (the first %d blocks) gives it %d", s,
                            st->recompute == FW_RECOMPUTE_SELECTIVE ? "modules" : "otherwise",
                            most, want), 0;
        if (one->recompute == FW_RECOMPUTE_SELECTIVE && st->blocks > 0 &&
            (st->recompute != FW_RECOMPUTE_SELECTIVE || st->modules != one->modules))
            return snprintf(why, size, "stage %d does not recompute the modules stage %d "
                            "does, where one setting applies to every stage", s, first), 0;
    }
    return 1;
}

/* A form the framework sets for every stage at once needs one setting that says them all. */
static int global_same(const struct framework *f, const struct fw_settings *fs, char *why,
                       size_t size)
{
    int global = 0;
    for (int s = 0; s < fs->n_stages; s++) {
        enum fw_recompute r = fs->stages[s].recompute;
        global |= (r == FW_RECOMPUTE_FULL && f->full == FW_GLOBAL) ||
                  (r == FW_RECOMPUTE_SELECTIVE && f->selective == FW_GLOBAL);
    }
    if (!global || fw_settings_uniform(fs, why, size))
        return 1;
    size_t n = strlen(why);
    snprintf(why + n, size - n, ", and %s takes one recompute setting for every stage",
             f->title);
    return 0;
}

int fw_settings_allowed(const struct framework *f, const struct plan *p,
                        const struct fw_settings *fs, int split_only, char *why,
                        size_t why_size)
{
    if (!fw_split_allowed(f, p, why, why_size))
        return 0;
    if (split_only)
        return 1;
    for (int s = 0; s < fs->n_stages; s++)
        if (!form_allowed(f, &fs->stages[s])) {
            snprintf(why, why_size, "stage %d %s, which %s cannot say", s,
                     fs->stages[s].recompute == FW_RECOMPUTE_FULL
                         ? "recomputes only some of its blocks"
                         : "recomputes modules",
                     f->title);
            return 0;
        }
    if (fs->host_optimizer && f->host_optimizer == FW_NO) {
        snprintf(why, why_size, "the plan keeps the optimizer on the host, which %s has no "
                 "setting for", f->title);
        return 0;
    }
    return global_same(f, fs, why, why_size);
}

/* ---- choosing ---- */

int fw_candidates(const struct framework *f, int max_blocks, int framework_acts,
                  struct fw_candidate **out, int *n, struct err *e)
{
    int cap = 2 + max_blocks + N_MODULE_OPTIONS;
    struct fw_candidate *c = calloc((size_t)cap, sizeof *c);
    if (c == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    int k = 0;
    c[k++] = (struct fw_candidate){.f = f, .framework_acts = framework_acts}; /* none */
    if (f->full == FW_PER_STAGE || f->selective == FW_PER_STAGE)
        c[k++] = (struct fw_candidate){.f = f, .per_stage = 1, .framework_acts = framework_acts};
    for (int b = 1; f->full == FW_GLOBAL && b <= max_blocks; b++) {
        if (f->full_all_only && b < max_blocks)
            continue;
        c[k++] = (struct fw_candidate){
            .f = f, .global = {.recompute = FW_RECOMPUTE_FULL, .n = b, .blocks = b},
            .framework_acts = framework_acts};
    }
    for (int m = 0; f->selective == FW_GLOBAL && m < N_MODULE_OPTIONS; m++)
        if (!module_options[m].framework_only || framework_acts)
            c[k++] = (struct fw_candidate){
                .f = f,
                .global = {.recompute = FW_RECOMPUTE_SELECTIVE,
                           .modules = module_options[m].modules},
                .framework_acts = framework_acts};
    *out = c;
    *n = k;
    return ERR_OK;
}

/* The forms a stage of `blocks` blocks may take under candidate c, in order: *n of them. */
static int stage_menu(const struct fw_candidate *c, int blocks, struct fw_stage *menu)
{
    const struct framework *f = c->f;
    int n = 0;
    if (!c->per_stage) {
        menu[0] = c->global;
        menu[0].blocks = blocks;
        if (c->global.recompute == FW_RECOMPUTE_FULL)
            menu[0].n = c->global.n < blocks ? c->global.n : blocks;
        if (menu[0].recompute == FW_RECOMPUTE_FULL && f->full_all_only)
            menu[0].n = blocks;
        if (menu[0].recompute == FW_RECOMPUTE_FULL && menu[0].n == 0)
            menu[0].recompute = FW_RECOMPUTE_NONE;
        return 1;
    }
    menu[n++] = (struct fw_stage){.blocks = blocks};
    for (int b = 1; f->full == FW_PER_STAGE && b <= blocks; b++)
        if (!f->full_all_only || b == blocks)
            menu[n++] = (struct fw_stage){.blocks = blocks, .recompute = FW_RECOMPUTE_FULL,
                                          .n = b};
    for (int m = 0; f->selective == FW_PER_STAGE && blocks > 0 && m < N_MODULE_OPTIONS; m++)
        if (!module_options[m].framework_only || c->framework_acts)
            menu[n++] = (struct fw_stage){.blocks = blocks,
                                          .recompute = FW_RECOMPUTE_SELECTIVE,
                                          .modules = module_options[m].modules};
    return n;
}

/* Whether (ms, memory) beats the best so far (none yet: best_set 0). */
static int menu_better(double ms, int64_t memory, int best_set, double best_ms,
                       int64_t best_memory)
{
    return !best_set || microbatch_better(ms, memory, best_ms, best_memory);
}

/* The recompute ms of a menu's FULL entries, walked in their order (n ascending): the first n
 * blocks' forwards, summed as n grows. */
struct full_walk {
    double ms;
    int blocks, next;
};

/* Whether menu entry `it` cannot beat the best so far: a FULL entry recomputing longer (and
 * every later one, n ascending). Keeps the evaluations of a range to the entries that can. */
static int hopeless(const struct fw_stage *it, struct full_walk *w, const struct model *m,
                    int first, const struct layer_cost *layers, int n, int set, double best)
{
    if (it->recompute != FW_RECOMPUTE_FULL)
        return 0;
    for (; w->blocks < it->n && w->next < n; w->next++)
        if (fw_is_block(m, first + w->next)) {
            w->ms += layers[w->next].fwd_ms;
            w->blocks++;
        }
    return set && w->ms > best + 1e-12 * (1 + best);
}

double fw_range_recompute(const struct fw_candidate *c, const struct model *m, int first,
                          const struct layer_cost *layers, int n, int in_flight,
                          int64_t reserve_bytes, int64_t limit, int64_t *memory_bytes)
{
    int blocks = 0;
    for (int l = 0; l < n; l++)
        blocks += fw_is_block(m, first + l);
    *memory_bytes = 0; /* the framework's least blocks are the search's (repartition.c) */
    struct fw_stage *menu = malloc((size_t)(blocks + 1 + N_MODULE_OPTIONS) * sizeof *menu);
    unsigned char *choice = malloc((size_t)n);
    double best = INFINITY;
    if (menu == NULL || choice == NULL) {
        free(menu);
        free(choice);
        return INFINITY;
    }
    int k = stage_menu(c, blocks, menu), set = 0;
    struct full_walk w = {0};
    for (int i = 0; i < k; i++) {
        struct err e;
        err_clear(&e);
        struct stage_cost cost;
        if (hopeless(&menu[i], &w, m, first, layers, n, set, best) ||
            range_choices(m, first, layers, n, &menu[i], c->framework_acts, choice, &e))
            continue;
        cost_stage(layers, n, choice, in_flight, reserve_bytes, &cost);
        if (cost.memory_bytes > limit ||
            !menu_better(cost.recompute_ms, cost.memory_bytes, set, best, *memory_bytes))
            continue;
        best = cost.recompute_ms;
        *memory_bytes = cost.memory_bytes;
        set = 1;
    }
    free(menu);
    free(choice);
    return best;
}

/* The chunks of stage s's GPU (schedule.h: s alone where a GPU holds one), which a framework
 * builds from one setting; 0 when s is not the GPU's first chunk. */
static int gpu_chunks(const struct plan *p, int s, int chunks[SCHEDULE_CHUNKS_MAX])
{
    int n = plan_gpu_stages(p, p->stages[s].gpu, chunks);
    return chunks[0] == s ? n : 0;
}

/* A GPU's setting `it` on one of its chunks, of `blocks` blocks: the first n of them (all, where
 * it holds fewer, or the framework recomputes all or none), the same modules, or none. */
static struct fw_stage chunk_item(const struct fw_stage *it, int blocks, const struct framework *f)
{
    struct fw_stage one = *it;
    one.blocks = blocks;
    if (one.recompute == FW_RECOMPUTE_FULL && (f->full_all_only || one.n > blocks))
        one.n = blocks;
    if (blocks == 0 || (one.recompute == FW_RECOMPUTE_FULL && one.n == 0))
        one = (struct fw_stage){.blocks = blocks};
    return one;
}

/* Setting `it` on every chunk of a GPU: ERR_OK, or an error where a chunk has no such form. */
static int chunks_apply(struct plan *p, const int *chunks, int v, const struct fw_stage *it,
                        const struct framework *f, int framework_acts, struct fw_settings *fs,
                        struct err *e)
{
    for (int k = 0; k < v; k++) {
        struct fw_stage one = chunk_item(it, fw_stage_blocks(p, chunks[k]), f);
        if (fw_stage_apply(p, chunks[k], &one, framework_acts, e))
            return e->code;
        if (fs != NULL)
            fs->stages[chunks[k]] = one;
    }
    return ERR_OK;
}

/* Stage s's GPU (all its chunks) under candidate c: the menu's fastest form that fits, the
 * same on every chunk (its settings in fs, applied to the plan); 0 when none fits. A stage
 * that is not its GPU's first chunk was chosen with it. */
static int stage_choose(struct plan *p, int s, const struct fw_candidate *c,
                        struct fw_stage *menu, struct fw_settings *fs, struct err *e)
{
    struct plan_stage *st = &p->stages[s];
    int chunks[SCHEDULE_CHUNKS_MAX], v = gpu_chunks(p, s, chunks), blocks = 0, set = 0;
    if (v == 0)
        return 1;
    for (int k = 0; k < v; k++)
        blocks = fw_stage_blocks(p, chunks[k]) > blocks ? fw_stage_blocks(p, chunks[k]) : blocks;
    int n = stage_menu(c, blocks, menu);
    struct fw_stage chosen = {0};
    double best_ms = 0;
    int64_t best_memory = 0;
    struct full_walk w = {0};
    for (int i = 0; i < n; i++) {
        struct stage_cost cost;
        double ms = 0;
        if (v == 1 && hopeless(&menu[i], &w, &p->model, st->first, st->layers,
                               plan_stage_layer_count(st), set, best_ms))
            continue;
        if (chunks_apply(p, chunks, v, &menu[i], c->f, c->framework_acts, NULL, e)) {
            err_clear(e);
            continue;
        }
        for (int k = 0; k < v; k++) { /* the GPU's memory is every chunk's (plan.h) */
            plan_stage_cost(p, &p->stages[chunks[k]], &cost);
            ms += cost.recompute_ms;
        }
        if (cost.memory_bytes > st->memory_limit_bytes ||
            cost.host_memory_bytes > st->host_limit_bytes ||
            !menu_better(ms, cost.memory_bytes, set, best_ms, best_memory))
            continue;
        best_ms = ms;
        best_memory = cost.memory_bytes;
        chosen = menu[i];
        set = 1;
    }
    if (set && chunks_apply(p, chunks, v, &chosen, c->f, c->framework_acts, fs, e))
        return 0;
    return set;
}

/* The candidate with every optimizer on the host (host) or the device: *fits, and the
 * settings in fs; the plan's stages hold its actions. */
static int candidate_apply(struct plan *p, const struct fw_candidate *c, int host,
                           struct fw_settings *fs, struct fw_stage *menu, int *fits,
                           struct err *e)
{
    *fits = 1;
    fs->host_optimizer = host;
    fs->host_fraction = 1;
    for (int s = 0; s < p->n_stages; s++) {
        p->stages[s].optimizer = host ? COST_PLACE_HOST : COST_PLACE_DEVICE;
        p->stages[s].optimizer_from = 0;
    }
    for (int s = 0; s < p->n_stages && *fits; s++) {
        *fits = stage_choose(p, s, c, menu, fs, e);
        if (e->code)
            return e->code;
    }
    return ERR_OK;
}

/* Whether every stage may hold its optimizer on the host (the frameworks' one switch). */
static int all_host_possible(const struct plan *p)
{
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        int movable = cost_optimizer_movable(st->layers, plan_stage_layer_count(st), NULL);
        if (!movable || st->host_limit_bytes == 0 || !st->host_link.present)
            return 0;
    }
    return 1;
}

/* The least memory stage s's GPU can hold under f: its blocks all recomputed whole (or, for a
 * framework without that form, as they are), on every chunk. */
static int64_t least_memory(struct plan *p, const int *chunks, int v, const struct framework *f,
                            int host)
{
    struct fw_stage all = {.recompute = FW_RECOMPUTE_FULL, .n = INT_MAX};
    if (f->full == FW_NO)
        all.recompute = FW_RECOMPUTE_NONE;
    struct err e;
    err_clear(&e);
    for (int k = 0; k < v; k++) {
        p->stages[chunks[k]].optimizer = host ? COST_PLACE_HOST : COST_PLACE_DEVICE;
        p->stages[chunks[k]].optimizer_from = 0;
    }
    chunks_apply(p, chunks, v, &all, f, 1, NULL, &e);
    struct stage_cost cost;
    plan_stage_cost(p, &p->stages[chunks[0]], &cost);
    return cost.memory_bytes;
}

static int nofit(struct plan *p, const struct framework *f, int host, struct err *e)
{
    err_set(e, ERR_NOFIT, "no setting of %s fits this split:", f->title);
    int named = 0;
    for (int s = 0; s < p->n_stages; s++) {
        int chunks[SCHEDULE_CHUNKS_MAX], v = gpu_chunks(p, s, chunks), blocks = 0;
        if (v == 0)
            continue;
        int64_t need = least_memory(p, chunks, v, f, host);
        if (need <= p->stages[s].memory_limit_bytes)
            continue;
        for (int k = 0; k < v; k++)
            blocks += fw_stage_blocks(p, chunks[k]);
        err_append(e, "  %s %d (%s, %d blocks) needs %lld bytes %s, %lld over its "
                   "%lld-byte limit", v > 1 ? "GPU" : "stage", v > 1 ? p->stages[s].gpu : s,
                   p->stages[s].device, blocks, (long long)need,
                   f->full != FW_NO ? "recomputing every block" : "",
                   (long long)(need - p->stages[s].memory_limit_bytes),
                   (long long)p->stages[s].memory_limit_bytes);
        named++;
    }
    if (!named)
        err_append(e, "  every stage fits alone with its blocks recomputed, but %s's "
                   "one setting for every stage fits none of them together", f->title);
    return ERR_NOFIT;
}

/* One of the framework's settings that fits p's split, as the choice rule weighs it. */
struct tried {
    int host, cand;
    double ms;
    int64_t memory;
    struct choice_key key;
};

/* The setting kept among those that fit: of the steps within min_gain of the fastest
 * (choice.h) — or within cap_ms when > 0 — the simplest (ties: the faster, then less memory);
 * *fastest the fastest. */
static const struct tried *kept_setting(const struct tried *t, int n, double min_gain,
                                        double cap_ms, const struct tried **fastest)
{
    const struct tried *kept = NULL;
    for (int i = 0; i < n; i++)
        if (*fastest == NULL ||
            microbatch_better(t[i].ms, t[i].memory, (*fastest)->ms, (*fastest)->memory))
            *fastest = &t[i];
    double cap = cap_ms > 0 ? cap_ms : *fastest != NULL ? choice_cap((*fastest)->ms, min_gain) : 0;
    if (*fastest != NULL && (*fastest)->ms > cap) /* nothing within an absolute cap */
        return *fastest;
    for (int i = 0; i < n; i++) {
        if (t[i].ms > cap)
            continue;
        int cmp = kept == NULL ? -1 : choice_key_cmp(&t[i].key, &kept->key);
        if (cmp < 0 || (cmp == 0 && microbatch_better(t[i].ms, t[i].memory, kept->ms,
                                                      kept->memory)))
            kept = &t[i];
    }
    return kept;
}

/* The kept setting on p's split (kept_setting), into `best`; *found 0 when none fits. */
static int choose_best(struct plan *p, const struct fw_candidate *c, int n_cand, int hosts,
                       double min_gain, double cap_ms, struct fw_settings *best, int *found,
                       struct err *e)
{
    int max_blocks = 0, n = 0, fits;
    for (int s = 0; s < p->n_stages; s++)
        max_blocks = fw_stage_blocks(p, s) > max_blocks ? fw_stage_blocks(p, s) : max_blocks;
    struct fw_stage *menu = malloc((size_t)(max_blocks + 1 + N_MODULE_OPTIONS) * sizeof *menu);
    struct tried *t = malloc((size_t)(hosts * n_cand + 1) * sizeof *t);
    const struct plan_options plain = {0}; /* no framework preference: every setting is its */
    *found = 0;
    if (menu == NULL || t == NULL) {
        free(menu);
        free(t);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    for (int host = 0; host < hosts && e->code == ERR_OK; host++)
        for (int i = 0; i < n_cand && e->code == ERR_OK; i++) {
            if (candidate_apply(p, &c[i], host, best, menu, &fits, e) || !fits ||
                planner_finish(p, e))
                continue;
            t[n] = (struct tried){.host = host, .cand = i, .ms = p->iteration_ms,
                                  .memory = plan_memory(p)};
            choice_key_of(p, &plain, &t[n++].key);
        }
    const struct tried *fastest = NULL;
    const struct tried *k = e->code == ERR_OK ? kept_setting(t, n, min_gain, cap_ms, &fastest) : NULL;
    if (k != NULL && candidate_apply(p, &c[k->cand], k->host, best, menu, &fits, e) == ERR_OK) {
        *found = 1;
        p->min_gain = min_gain;
        p->fastest_ms = k->ms > choice_cap(fastest->ms, 0) ? fastest->ms : 0;
    }
    free(menu);
    free(t);
    return e->code;
}

int fw_choose(struct plan *p, const struct framework *f, int framework_acts, int allow_host,
              double min_gain, double cap_ms, struct fw_settings *out, struct err *e)
{
    char why[512];
    if (!fw_split_allowed(f, p, why, sizeof why))
        return err_set(e, ERR_INPUT, "%s cannot run this split: %s", f->title, why);
    int max_blocks = 0, n_cand, found = 0;
    for (int s = 0; s < p->n_stages; s++)
        max_blocks = fw_stage_blocks(p, s) > max_blocks ? fw_stage_blocks(p, s) : max_blocks;
    struct fw_candidate *c;
    struct fw_settings best;
    if (fw_candidates(f, max_blocks, framework_acts, &c, &n_cand, e))
        return e->code;
    if (fw_settings_init(&best, p->n_stages, e)) {
        free(c);
        return e->code;
    }
    int hosts = allow_host && f->host_optimizer != FW_NO && all_host_possible(p) ? 2 : 1;
    int rc = choose_best(p, c, n_cand, hosts, min_gain, cap_ms, &best, &found, e);
    free(c);
    if (rc == ERR_OK && !found)
        rc = nofit(p, f, 0, e);
    if (rc == ERR_OK)
        rc = fw_settings_apply(p, &best, framework_acts, e);
    if (rc == ERR_OK && out != NULL) {
        fw_settings_free(out);
        *out = best;
    } else {
        fw_settings_free(&best);
    }
    return rc;
}

/* ---- the schedules a framework runs ---- */

int fw_schedule_allowed(const struct framework *f, const struct schedule_shape *sh, char *why,
                        size_t size)
{
    const char *w = f->exporter != NULL ? f->exporter : "ballast";
    if (strcmp(w, "ballast") == 0)
        return 1;
    if (schedule_splits(sh->kind))
        return snprintf(why, size, "schedule %s splits each block's backward into an "
                        "input-gradient and a weight-gradient pass%s, which %s %s; plan "
                        "--schedule 1f1b%s for %s", schedule_name(sh->kind),
                        sh->kind == SCHEDULE_V_HALF ? " over two chunks a GPU in a V" : "",
                        f->title,
                        strcmp(w, "colossalai") == 0
                            ? "runs only as its pp_style zbv, another order with another "
                              "memory, which Ballast does not write"
                            : "does not run (its pipeline schedules are 1F1B and the "
                              "interleaved 1F1B)",
                        strcmp(w, "megatron") == 0 ? " or interleaved" : "", f->title), 0;
    if (sh->chunks <= 1)
        return 1;
    if (strcmp(w, "nemo") == 0)
        return snprintf(why, size, "%d chunks a GPU (schedule interleaved): NeMo's "
                        "megatron_gpt_config.yaml path refuses a virtual pipeline "
                        "(megatron_gpt_model.py, mcore_model_customize: \"Virtual pipeline "
                        "model parallel size is no longer supported for nemo 1.0\"); use "
                        "megatron, or --schedule 1f1b for NeMo", sh->chunks), 0;
    if (strcmp(w, "flagscale") == 0)
        return snprintf(why, size, "%d chunks a GPU (schedule interleaved): FlagScale's "
                        "heterogeneous training refuses a virtual pipeline "
                        "(flagscale/train/arguments.py: \"virtual pipeline not support now!\"); "
                        "use megatron, or --schedule 1f1b for FlagScale", sh->chunks), 0;
    if (strcmp(w, "megatron") != 0)
        return snprintf(why, size, "%d chunks a GPU (schedule interleaved): Ballast writes "
                        "%s's pp_style 1f1b only, not a virtual pipeline (its interleaved style "
                        "places the layers and orders the passes by rules Ballast does not "
                        "check); use megatron, or --schedule 1f1b for %s", sh->chunks, f->title,
                        f->title), 0;
    if (sh->micro_batches % sh->gpus != 0)
        return snprintf(why, size, "%d micro-batches over %d pipeline ranks: Megatron-LM's "
                        "interleaved schedule takes the micro-batches in groups of the pipeline "
                        "size and refuses a remainder (schedules.py: \"The remainder of M ... "
                        "should be 0\"); give --micro-batches a multiple of %d",
                        sh->micro_batches, sh->gpus, sh->gpus), 0;
    return 1;
}
