/* Megatron-LM's fine-grained activation offloading as a plan's offloads
 * (megatron/core/pipeline_parallel/fine_grained_activation_offload.py): every block of every
 * pipeline rank sends the input of each module in --offload-modules to host memory; after
 * warm-up it keeps the last group of each module name on the device (its reload margin), then
 * pp_rank x --delta-offload-bytes-across-pp-ranks bytes, then, in each micro-batch's chunk,
 * the last int(groups x (1 - --activation-offload-fraction)) groups in forward order. For a
 * dense GPT block its modules are around the attention only (nothing inside the MLP). So it
 * says a plan whose offloads are attention tensors (the `attn` option, as its selective
 * core_attn stands for that option's recomputation), on the first blocks of every stage in one
 * fraction, with nothing recomputed beside them, where every offloading stage has room for one
 * block's tensors more. Anything else is planned again without offload (export.c). */
#include <stdlib.h>
#include <string.h>

#include "export_core.h"

/* Stage s's offloading blocks: how many (*k), whether they are its first ones, the most bytes
 * one sends per micro-batch; 0 with why when an offload is not the attn option of a block. */
static int stage_offloads(const struct plan *p, int s, int *k, int *prefix, int64_t *most,
                          int *recomputes, char *why, size_t size)
{
    const struct plan_stage *st = &p->stages[s];
    *k = *recomputes = 0;
    *most = 0;
    *prefix = 1;
    for (int l = 0, block = 0; l < plan_stage_layer_count(st); l++) {
        int is_block = fw_is_block(&p->model, st->first + l);
        const struct layer_action *a = &st->actions[l];
        struct cost_row r = plan_stage_row(st, l);
        int attn = a->place == COST_PLACE_DEVICE && a->offload_option >= 0 &&
                   strcmp(st->layers[l].options[a->offload_option].name, "attn") == 0;
        *recomputes += a->choice != COST_KEEP;
        if (r.host_bytes > 0 && (!is_block || !attn)) {
            snprintf(why, size, "stage %d layer %d (%s) sends %lld bytes a micro-batch to host "
                     "memory that are not its attention's: Megatron-LM's offload modules are "
                     "around a dense block's attention only", s, st->first + l,
                     st->layers[l].name, (long long)r.host_bytes);
            return 0;
        }
        if (!is_block)
            continue;
        *prefix = *prefix && (r.host_bytes == 0 || block == *k);
        *k += r.host_bytes > 0;
        *most = r.host_bytes > *most ? r.host_bytes : *most;
        block++;
    }
    return 1;
}

/* Whether fraction f, as Megatron-LM reads `text`, leaves the first k[s] of every stage's
 * blocks offloaded. */
static int fraction_gives(const struct plan *p, const int *k, const char *text)
{
    double f = strtod(text, NULL);
    for (int s = 0; s < p->n_stages; s++) {
        int b = fw_stage_blocks(p, s);
        if (b - (int)(b * (1 - f)) != k[s])
            return 0;
    }
    return 1;
}

/* The fraction giving every stage its k[s] first blocks, as text; 0 when none does. */
static int find_fraction(const struct plan *p, const int *k, char *text, size_t size)
{
    for (int s = 0; s < p->n_stages; s++) {
        int b = fw_stage_blocks(p, s);
        for (const char *fmt = "%.6g"; fmt != NULL; fmt = fmt[2] == '6' ? "%.17g" : NULL) {
            snprintf(text, size, fmt, b ? (double)k[s] / b : 1.0);
            if (fraction_gives(p, k, text))
                return 1;
        }
    }
    return 0;
}

/* Every offloading stage has room for one block's attention tensors more (the margin). */
static int margin_fits(const struct plan *p, const int64_t *most, FILE *note, char *why,
                       size_t size)
{
    for (int s = 0; s < p->n_stages; s++) {
        const struct plan_stage *st = &p->stages[s];
        if (most[s] == 0)
            continue;
        if (st->memory_bytes + most[s] > st->memory_limit_bytes) {
            snprintf(why, size, "Megatron-LM keeps one offload group per module on the device "
                     "(its reload margin): stage %d would need %lld bytes more, %lld of its "
                     "%lld-byte limit", s, (long long)most[s],
                     (long long)(st->memory_bytes + most[s]), (long long)st->memory_limit_bytes);
            return 0;
        }
    }
    for (int s = 0; s < p->n_stages; s++)
        if (most[s] > 0)
            fprintf(note, "ballast export: note: stage %d: Megatron-LM keeps one block's "
                          "attention tensors on the device (its reload margin): up to %lld "
                          "bytes more, %lld of its %lld-byte limit\n",
                    s, (long long)most[s], (long long)(p->stages[s].memory_bytes + most[s]),
                    (long long)p->stages[s].memory_limit_bytes);
    fprintf(note, "ballast export: note: its core_attn offload sends core attention's input "
                  "(q, k, v) to host memory where the plan sends the attention tensors its "
                  "profile counts; it prefetches on its own schedule, not the plan's prefetch "
                  "triggers\n");
    return 1;
}

static int offload_split(const struct plan *p, int *k, int64_t *most, char *fraction,
                         size_t fraction_size, char *why, size_t size)
{
    int prefix = 1, any = 0, recomputed = 0;
    for (int s = 0; s < p->n_stages; s++) {
        int first, rec;
        if (!stage_offloads(p, s, &k[s], &first, &most[s], &rec, why, size))
            return 0;
        prefix = prefix && first;
        any |= k[s] > 0;
        recomputed += rec;
    }
    if (!any)
        return snprintf(why, size, "the plan offloads nothing"), 0;
    if (recomputed)
        return snprintf(why, size, "the plan offloads attention tensors and recomputes %d "
                        "layer(s); Megatron-LM counts its offload groups over every block, "
                        "recomputed or not", recomputed), 0;
    if (!prefix || !find_fraction(p, k, fraction, fraction_size)) {
        int n = snprintf(why, size, "the plan offloads the attention of [");
        for (int s = 0; s < p->n_stages && n < (int)size - 24; s++)
            n += snprintf(why + n, size - (size_t)n, "%s%d of %d", s ? ", " : "", k[s],
                          fw_stage_blocks(p, s));
        snprintf(why + n, size - (size_t)n, "] blocks per stage; Megatron-LM offloads one "
                 "fraction of every stage's blocks, the first ones");
        return 0;
    }
    return 1;
}

int megatron_offload_flags(const struct plan *p, FILE *note, char *text, size_t size, int *ok,
                           char *why, size_t why_size, struct err *e)
{
    int *k = calloc((size_t)p->n_stages, sizeof *k);
    int64_t *most = calloc((size_t)p->n_stages, sizeof *most);
    char fraction[32];
    *ok = 0;
    if (k == NULL || most == NULL) {
        free(k);
        free(most);
        return err_set(e, ERR_FAIL, "out of memory");
    }
    if (offload_split(p, k, most, fraction, sizeof fraction, why, why_size) &&
        margin_fits(p, most, note, why, why_size)) {
        *ok = 1;
        int n = snprintf(text, size, "--fine-grained-activation-offloading \\\n"
                         "--offload-modules core_attn \\\n--min-offloaded-tensor-size 0");
        if (strtod(fraction, NULL) < 1)
            snprintf(text + n, size - (size_t)n, " \\\n--activation-offload-fraction %s",
                     fraction);
    }
    free(k);
    free(most);
    return ERR_OK;
}
