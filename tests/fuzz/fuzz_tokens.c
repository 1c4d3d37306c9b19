/* data_init_file: a --data file. The first byte of the input picks the format (even: llm.c's
 * tokens, odd: bytes); the rest is the file. A file that loads gives one micro-batch. */
#include <stdlib.h>

#include "data.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct model m = {.kind = MODEL_KIND_GPT, .n_layer = 1, .n_embd = 8, .n_head = 2,
                      .seq_len = 8, .vocab_size = 300, .micro_batch = 2};
    enum data_format format = data[0] % 2 ? DATA_FORMAT_BYTES : DATA_FORMAT_TOKENS;
    struct data_source d;
    struct err e;
    err_clear(&e);
    if (data_init_file(&d, fuzz_file(data + 1, size - 1, "tokens.bin"), format, &m, 1, &e))
        return 0;
    int32_t tokens[2 * 8], targets[2 * 8];
    if (data_batch(&d, 3, 1, tokens, targets, &e))
        abort(); /* the file checked whole and unchanged: its batches read */
    for (int i = 0; i < 2 * 8; i++)
        if (tokens[i] < 0 || tokens[i] >= m.vocab_size || targets[i] < 0 ||
            targets[i] >= m.vocab_size)
            abort(); /* a token the embedding would read out of bounds */
    data_free(&d);
    return 0;
}
