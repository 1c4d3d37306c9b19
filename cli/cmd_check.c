/* `ballast check --from FRAMEWORK CONFIG --cluster CLUSTER.json`: the plan a user's current
 * configuration amounts to on the cluster's GPUs (its split, recompute and optimizer settings,
 * the framework's activation model), its per-stage memory (naming each stage that runs out and
 * by how much) and simulated step, beside Ballast's best plan for the same GPUs and framework. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_read.h"
#include "cli.h"
#include "cluster.h"
#include "estimate.h"
#include "framework.h"
#include "model_kind.h"
#include "planner.h"

#define GIB 1073741824.0

static void help(void)
{
    printf("usage: ballast check --from FRAMEWORK --config CONFIG --cluster CLUSTER.json\n"
           "                     [--same-split]\n\n"
           "Scores the configuration a framework runs today on the cluster's GPUs: its plan's\n"
           "per-stage memory (each stage that runs out, by how much) and simulated step, beside\n"
           "the best plan Ballast finds for the same GPUs and framework.\n\n"
           "  --from F         megatron, nemo, flagscale or colossalai\n"
           "  --config C       the configuration: Megatron-LM's arguments in one quoted string;\n"
           "                   NeMo's overrides 'model.x=v ...' or its YAML file; FlagScale's\n"
           "                   YAML file; ColossalAI's plugin keywords 'tp_size=1, pp_size=4,\n"
           "                   ...' with gradient_checkpointing=True when the script calls\n"
           "                   model.gradient_checkpointing_enable()\n"
           "  --cluster FILE   the GPUs: one stage a pipeline rank, with their profiles\n"
           "  --same-split     the best plan on the configuration's own split (default: the\n"
           "                   split searched too)\n\n"
           "exit status: 0 the configuration fits, 3 a stage runs out of memory (both printed),\n"
           "2 bad input\n");
}

/* The configuration's blocks per stage: given, from the first and last counts, or even. */
static int config_split(const struct check_config *k, int S, int blocks_total, int *blocks,
                        struct err *e)
{
    if (k->n_blocks > 0) {
        int sum = 0;
        for (int s = 0; s < k->n_blocks; s++)
            sum += blocks[s] = k->blocks[s];
        if (k->n_blocks != S || sum != blocks_total)
            return err_set(e, ERR_INPUT, "check: the configuration's split gives %d stages and "
                           "%d blocks, the cluster %d stages and the model %d blocks",
                           k->n_blocks, sum, S, blocks_total);
        return ERR_OK;
    }
    int first = k->first >= 0 ? k->first : -1, last = k->last >= 0 ? k->last : -1;
    int rest = blocks_total - (first > 0 ? first : 0) - (last > 0 ? last : 0);
    int shared = S - (first >= 0) - (last >= 0);
    if (shared < 0 || (shared > 0 && rest % shared != 0) || (shared == 0 && rest != 0))
        return err_set(e, ERR_INPUT, "check: %d blocks over %d stages (first %d, last %d): the "
                       "stages between do not divide evenly, which the framework refuses",
                       blocks_total, S, first, last);
    for (int s = 0; s < S; s++)
        blocks[s] = shared > 0 ? rest / shared : 0;
    if (first >= 0)
        blocks[0] = first;
    if (last >= 0)
        blocks[S - 1] = last;
    return ERR_OK;
}

/* The configuration against the cluster's model and stages: ERR_INPUT naming both numbers. */
static int config_matches(const struct check_config *k, const struct cluster *c, struct err *e)
{
    const struct model *m = &c->model;
    const struct {
        const char *name;
        int given, model;
    } shape[] = {{"num_layers", k->num_layers, m->n_layer},
                 {"hidden_size", k->hidden_size, m->n_embd},
                 {"num_attention_heads", k->num_heads, m->n_head},
                 {"seq_length", k->seq_len, m->seq_len},
                 {"micro_batch_size", k->micro_batch, m->micro_batch},
                 {"num_query_groups", k->kv_groups,
                  model_kv_heads(m)}};
    if (model_is_custom(m))
        return err_set(e, ERR_INPUT, "check: the cluster's model is custom: the framework's "
                       "configuration cannot be laid on its layers");
    for (size_t i = 0; i < sizeof shape / sizeof *shape; i++)
        if (shape[i].given > 0 && shape[i].given != shape[i].model)
            return err_set(e, ERR_INPUT, "check: %s %d, but the cluster's model has %d (profile "
                           "the model the configuration trains)",
                           shape[i].name, shape[i].given, shape[i].model);
    if (k->pp != c->n_stages)
        return err_set(e, ERR_INPUT, "check: pipeline size %d, but the cluster has %d stages "
                       "(one a pipeline rank)", k->pp, c->n_stages);
    for (int s = 0; s < c->n_stages; s++)
        if (c->stages[s].tp != k->tp)
            return err_set(e, ERR_INPUT, "check: tensor-parallel size %d, but the cluster's "
                           "stage %d has tp %d", k->tp, s, c->stages[s].tp);
    if (k->dtype_given && k->dtype != m->dtype)
        return err_set(e, ERR_INPUT, "check: precision %s, but the cluster's model is %s",
                       model_dtype_name(k->dtype), model_dtype_name(m->dtype));
    if (k->shard != c->shard_optimizer && c->stages[0].dp > 1)
        return err_set(e, ERR_INPUT, "check: the distributed optimizer is %s, but the cluster's "
                       "shard_optimizer is %s", k->shard ? "on" : "off",
                       c->shard_optimizer ? "true" : "false");
    return ERR_OK;
}

/* The cluster on the configuration's split and micro-batches (c's stages copied). */
static int config_cluster(const struct check_config *k, const struct cluster *c,
                          struct cluster *out, struct fw_settings *fs, struct err *e)
{
    int S = c->n_stages, blocks[CHECK_STAGES_MAX];
    if (config_split(k, S, c->model.n_layer, blocks, e) || fw_settings_init(fs, S, e))
        return e->code;
    *out = *c;
    out->stages = malloc((size_t)S * sizeof *out->stages);
    if (out->stages == NULL)
        return err_set(e, ERR_FAIL, "out of memory");
    memcpy(out->stages, c->stages, (size_t)S * sizeof *out->stages);
    for (int s = 0, l = 0; s < S; s++) {
        out->stages[s].first = l;
        l += blocks[s] + (s == 0) + (s == S - 1); /* the embedding and the head */
        out->stages[s].last = l - 1;
        struct fw_stage *st = &fs->stages[s];
        *st = (struct fw_stage){.blocks = blocks[s]};
        int n = k->all_blocks ? blocks[s]
                : k->n_per_stage > 0 ? (s < k->n_per_stage ? k->recompute[s] : 0)
                : strcmp(k->granularity, "full") == 0 ? k->recompute_num_layers : 0;
        if (strcmp(k->granularity, "selective") == 0)
            *st = (struct fw_stage){.blocks = blocks[s], .recompute = FW_RECOMPUTE_SELECTIVE,
                                    .modules = k->modules ? k->modules : FW_MODULE_CORE_ATTN};
        else if (n > 0)
            *st = (struct fw_stage){.blocks = blocks[s], .recompute = FW_RECOMPUTE_FULL,
                                    .n = n < blocks[s] ? n : blocks[s]};
    }
    fs->host_optimizer = k->host_optimizer;
    int dp = c->stages[0].dp, per_step = k->micro_batch > 0 ? k->micro_batch : c->model.micro_batch;
    if (k->micro_batches > 0)
        out->micro_batches = k->micro_batches;
    else if (k->global_batch > 0 && k->global_batch % (per_step * dp) != 0)
        return err_set(e, ERR_INPUT, "check: global batch %d is not a multiple of micro-batch "
                       "%d x dp %d", k->global_batch, per_step, dp);
    else if (k->global_batch > 0)
        out->micro_batches = k->global_batch / (per_step * dp);
    return ERR_OK;
}

static const char *recompute_text(const struct fw_stage *st, char *buf, size_t size)
{
    char mods[64];
    if (st->recompute == FW_RECOMPUTE_FULL)
        snprintf(buf, size, "first %d", st->n);
    else if (st->recompute == FW_RECOMPUTE_SELECTIVE) {
        fw_modules_text(st->modules, "+", mods, sizeof mods);
        snprintf(buf, size, "%s", mods);
    } else
        snprintf(buf, size, "-");
    return buf;
}

/* The plan's stages; returns how many run out of memory. */
static int print_plan(const struct plan *p, const struct fw_settings *fs, const char *title)
{
    int out = 0;
    char rec[64];
    printf("%s: step %.3f ms (simulated %s, %d micro-batches of %d)\n", title, p->iteration_ms,
           schedule_name(p->schedule), p->micro_batches, p->model.micro_batch);
    printf("  %5s %-12s %6s %-14s %12s %12s\n", "stage", "device", "blocks", "recompute",
           "memory GiB", "limit GiB");
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        int over = st->memory_bytes > st->memory_limit_bytes;
        out += over;
        printf("  %5d %-12s %6d %-14s %12.3f %12.3f%s", s, st->device, fw_stage_blocks(p, s),
               fs ? recompute_text(&fs->stages[s], rec, sizeof rec) : "", st->memory_bytes / GIB,
               st->memory_limit_bytes / GIB, over ? "  out of memory by " : "\n");
        if (over)
            printf("%.3f GiB (%lld bytes)\n",
                   (double)(st->memory_bytes - st->memory_limit_bytes) / GIB,
                   (long long)(st->memory_bytes - st->memory_limit_bytes));
    }
    return out;
}

/* Ballast's best for the framework on the same GPUs (and split, with same_split). */
static int best_plan(const struct cluster *c, const char *target, int same_split,
                     struct plan *p, struct fw_settings *fs, struct err *e)
{
    struct plan_options o;
    char why[256];
    plan_options_default(&o);
    o.repartition = !same_split;
    o.framework = framework_find(target, NULL);
    o.estimate = estimate_profile;
    o.estimate_for = estimate_for_framework;
    if (planner_make(c, &o, p, e))
        return e->code;
    if (fw_settings_init(fs, p->n_stages, e))
        return e->code;
    fw_settings_read(p, 1, fs, why, sizeof why);
    return ERR_OK;
}

const struct cli_opt cmd_check_options[] = {
    {"--from", CLI_VALUE}, {"--config", CLI_VALUE}, {"--cluster", CLI_VALUE},
    {"--same-split", CLI_FLAG}, {NULL, CLI_FLAG}};

struct check_args {
    const char *from, *config, *cluster;
    int same_split;
};

static int parse_check_args(int argc, char **argv, struct check_args *a)
{
    *a = (struct check_args){0};
    for (int i = 1; i < argc; i++) {
        const char *v;
        int r;
        if (cli_is_help(argv[i])) {
            help();
            return -1;
        }
        const char *names[] = {"--from", "--config", "--cluster"};
        const char **slots[] = {&a->from, &a->config, &a->cluster};
        for (int k = r = 0; k < 3 && r == 0; k++)
            if ((r = cli_option(argc, argv, &i, names[k], &v)) > 0)
                *slots[k] = v;
        if (r < 0)
            return ERR_INPUT;
        if (r > 0)
            continue;
        if (cli_flag(argv, i, "--same-split")) {
            a->same_split = 1;
        } else {
            return cli_usage_error("check", "unknown option \"%s\"", argv[i]);
        }
    }
    if (a->from == NULL || a->config == NULL || a->cluster == NULL)
        return cli_usage_error("check", "--from, --config and --cluster are required");
    if (strcmp(a->from, "megatron") && strcmp(a->from, "nemo") && strcmp(a->from, "colossalai") &&
        strcmp(a->from, "flagscale"))
        return cli_usage_error("check", "--from: \"%s\", expected megatron, nemo, colossalai or "
                               "flagscale", a->from);
    return ERR_OK;
}

/* The user's plan and Ballast's best, printed: ERR_NOFIT when a stage of the user's runs out. */
static int check(const struct check_args *a, const struct check_config *k,
                 const struct cluster *c, struct err *e)
{
    struct cluster cc;
    struct fw_settings fs, best_fs;
    struct plan user, best;
    struct plan_options o;
    plan_options_default(&o);
    o.framework = framework_find(a->from, NULL);
    o.estimate = estimate_profile;
    o.estimate_for = estimate_for_framework;
    if (config_matches(k, c, e) || config_cluster(k, c, &cc, &fs, e))
        return e->code;
    int rc = planner_make_settings(&cc, &o, &fs, &user, e);
    if (rc == ERR_OK && k->attention_given && k->attention != user.framework.attention)
        rc = err_set(e, ERR_INPUT, "check: the configuration runs %s attention, but %s's "
                     "activation model (its profiles here) assumes %s: set the backend it assumes",
                     model_attention_name(k->attention), o.framework->title,
                     model_attention_name(user.framework.attention));
    if (rc) {
        free(cc.stages);
        fw_settings_free(&fs);
        return rc;
    }
    int out = print_plan(&user, &fs, "your configuration");
    if (k->dropout > 0)
        printf("  note: dropout %g keeps masks the plan does not count (set 0 to run as "
               "planned)\n", k->dropout);
    if (k->ignored[0])
        printf("  not read (not about memory or step time): %s\n", k->ignored);
    const char *target = a->from; /* megatron and nemo: per rank, a superset of one setting */
    struct err be;
    err_clear(&be);
    if (best_plan(&cc, target, a->same_split, &best, &best_fs, &be) == ERR_OK) {
        char title[128];
        snprintf(title, sizeof title, "Ballast's best for %s (--for %s%s)", o.framework->title,
                 target, a->same_split ? "" : " --repartition");
        printf("\n");
        print_plan(&best, &best_fs, title);
        printf("\nstep: yours %.3f ms, Ballast's %.3f ms (%+.1f%%)%s\n", user.iteration_ms,
               best.iteration_ms, 100.0 * (best.iteration_ms - user.iteration_ms) / user.iteration_ms,
               out ? "; yours runs out of memory" : "");
        plan_free(&best);
        fw_settings_free(&best_fs);
    } else {
        printf("\nBallast finds no plan for %s on these GPUs:\n  %s\n", o.framework->title, be.msg);
    }
    plan_free(&user);
    fw_settings_free(&fs);
    free(cc.stages);
    if (out)
        return err_set(e, ERR_NOFIT, "%d stage(s) of the configuration run out of memory", out);
    return ERR_OK;
}

int cmd_check(int argc, char **argv)
{
    struct check_args a;
    struct check_config *k = calloc(1, sizeof *k);
    struct cluster c;
    struct err e;
    err_clear(&e);
    int rc = k ? parse_check_args(argc, argv, &a) : ERR_FAIL;
    if (rc) {
        free(k);
        return rc < 0 ? ERR_OK : rc;
    }
    if (check_read(a.from, a.config, k, &e) || cluster_load(a.cluster, &c, &e)) {
        free(k);
        return cli_fail("check", &e);
    }
    rc = check(&a, k, &c, &e);
    cluster_free(&c);
    free(k);
    return rc ? cli_fail("check", &e) : ERR_OK;
}
