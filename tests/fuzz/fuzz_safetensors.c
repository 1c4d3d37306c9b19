/* st_stage_load: --init weights, into the one stage of a small GPT (or, when the input's
 * first byte is odd, a small Llama) on the CPU backend; the rest of the input is the file.
 * BALLAST_FUZZ_WRITE_SEED=DIR: writes each model's weights there (the seeds) and exits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "fuzz_file.h"
#include "safetensors.h"
#include "stage.h"

static struct model models[2] = {
    {.kind = MODEL_KIND_GPT, .n_layer = 2, .n_embd = 8, .n_head = 2, .seq_len = 4,
     .vocab_size = 16, .micro_batch = 1},
    {.kind = MODEL_KIND_LLAMA, .n_layer = 2, .n_embd = 8, .n_head = 2, .n_kv_head = 1,
     .ffn_hidden = 12, .rope_theta = 10000, .norm_eps = 1e-5, .seq_len = 4, .vocab_size = 16,
     .micro_batch = 1},
};
static struct backend be;
static struct stage_runner runners[2];

static void fail(const char *what, const struct err *e)
{
    fprintf(stderr, "fuzz_safetensors: %s: %s\n", what, e->msg);
    exit(1);
}

static void write_seed(const char *dir, int k)
{
    struct st_tensor *t;
    char *blob, file[4200];
    int n;
    struct err e;
    err_clear(&e);
    snprintf(file, sizeof file, "%s/%s.safetensors", dir, k ? "llama" : "gpt");
    if (st_stage_collect(&runners[k], &t, &n, &blob, &e))
        fail(file, &e);
    char **blobs = malloc(sizeof *blobs * (size_t)n); /* every tensor's bytes in the one blob */
    for (int i = 0; i < n && blobs != NULL; i++)
        blobs[i] = blob;
    if (blobs == NULL || st_write(file, t, n, blobs, &e))
        fail(file, &e);
    free(blobs);
    free(t);
    free(blob);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct err e;
    err_clear(&e);
    if (backend_cpu_init(&be, 1, &e))
        fail("backend", &e);
    for (int k = 0; k < 2; k++) {
        const struct model *m = &models[k];
        struct stage_config c = {.model = m, .n_stages = 1, .micro_batches = 1,
                                 .last = model_layer_count(m) - 1, .in_flight = 1,
                                 .adamw = adamw_params_gpt(1e-3f),
                                 .limit_bytes = (int64_t)1 << 30};
        if (stage_init(&runners[k], &c, &be, NULL, NULL, 1, &e))
            fail("stage", &e);
    }
    const char *seeds = getenv("BALLAST_FUZZ_WRITE_SEED");
    if (seeds != NULL) {
        write_seed(seeds, 0);
        write_seed(seeds, 1);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct err e;
    err_clear(&e);
    st_stage_load(&runners[data[0] % 2], fuzz_file(data + 1, size - 1, "w.safetensors"), &e);
    return 0;
}
