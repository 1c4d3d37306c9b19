/* Training data: a pure function of (seed, step, micro-batch), so every stage can draw the
 * tokens it needs (stage 0 the inputs, the last stage the targets) without communicating, and
 * a resumed run continues with exactly the batches an uninterrupted one would have seen.
 *
 *   synthetic (no --data): a random first-order Markov chain over the vocabulary. The seed
 *     fixes, for every token, DATA_MARKOV_SUCCESSORS distinct successor tokens (K, or V when
 *     the vocabulary is smaller); each sequence starts at a uniformly drawn token and moves to
 *     one of the K successors with probability 1/K each. Every target is thus uniform over K
 *     tokens given the token before it: the entropy rate, and the floor of the cross-entropy
 *     a model can reach, is ln K nats per token.
 *   file (--data FILE): llm.c's token format (DATA_FORMAT_TOKENS: a header of 256 little-endian
 *     int32, magic 20240520, version 1, the token count; then that many uint16 tokens, each
 *     below vocab_size) or, asked for explicitly, the file's bytes (DATA_FORMAT_BYTES,
 *     vocab_size >= 256). Each sequence of a micro-batch is the T + 1 tokens at an offset drawn
 *     uniformly from the seed, the step, the micro-batch and the row.
 *
 * A file is read, never mapped: a sequence is one pread of its T + 1 tokens, each checked
 * against the vocabulary as it is read, so a file cut short or rewritten under a running job
 * is a message naming it (data_batch fails), not a SIGBUS. Before training one rank reads the
 * whole file once, in 1 MiB pieces (data_init_file: every token checked, the contents hashed
 * for the checkpoints' identity); the others only open it and check its header and size
 * (data_open_file) and take that rank's hash. Memory: the piece and one sequence, whatever the
 * file's size. */
#ifndef BALLAST_DATA_H
#define BALLAST_DATA_H

#include <stdint.h>

#include "err.h"
#include "model.h"

#define DATA_MARKOV_SUCCESSORS 4
#define DATA_LLMC_MAGIC 20240520
#define DATA_LLMC_HEADER_INTS 256

enum data_kind { DATA_SYNTHETIC, DATA_FILE };
enum data_format { DATA_FORMAT_TOKENS, DATA_FORMAT_BYTES };

struct data_source {
    enum data_kind kind;
    uint64_t seed;
    int B, T, V;
    int successors;  /* synthetic: K */
    int32_t *table;  /* synthetic: (V, K) successors, owned */
    char *file;      /* file: its name (owned), for messages */
    int fd;          /* file: open for reading; -1 none */
    int64_t n_bytes; /* file: its size, header included */
    int64_t mtime_ns; /* file: its modification time when opened */
    int64_t tokens_at; /* file: the first token's byte offset (past the header) */
    int64_t n_tokens;
    int token_bytes; /* file: 2 (llm.c, little-endian uint16) or 1 (bytes) */
    unsigned char *row; /* file: one sequence's bytes, read by data_batch (owned) */
    uint64_t hash; /* file: FNV-1a of the contents (data_init_file's); synthetic: of (V, K) */
    /* Data parallelism: replica r of a pipeline of M micro-batches draws the step's
     * micro-batches r*M .. r*M+M-1, those one pipeline of dp*M micro-batches would; its
     * micro-batch i is the source's i + micro_offset. 0 (one pipeline) after init. */
    int micro_offset;
};

int data_init_synthetic(struct data_source *d, const struct model *m, uint64_t seed,
                        struct err *e);
/* Opens the file and reads it whole once, checking every token and hashing the contents.
 * Fails (ERR_INPUT, naming the file) if it cannot be read or holds fewer than seq_len + 1
 * tokens; as tokens, if its header is not llm.c's (magic, version), the file is shorter or
 * longer than the count says, or a token is >= vocab_size (the first one's offset named); as
 * bytes, if the model's vocabulary has fewer than 256 tokens. */
int data_init_file(struct data_source *d, const char *file, enum data_format format,
                   const struct model *m, uint64_t seed, struct err *e);
/* The same, reading it whole only when `whole`: otherwise no token is checked before it is
 * read for a batch and d->hash is 0 (the caller sets the hash of the rank that read the file
 * whole). Either, failing, leaves nothing open or allocated. */
int data_open_file(struct data_source *d, const char *file, enum data_format format,
                   const struct model *m, uint64_t seed, int whole, struct err *e);
void data_free(struct data_source *d);

/* tokens and targets (B,T), either may be NULL, of micro-batch `micro` (+ micro_offset) of
 * step `step` (0-based); targets[b][t] is the token after tokens[b][t]. A file that has
 * changed since it was opened (another size or modification time, a read cut short, a token
 * past the vocabulary) fails with ERR_FAIL naming it. */
int data_batch(const struct data_source *d, int64_t step, int micro, int32_t *tokens,
               int32_t *targets, struct err *e);

/* ln K for the synthetic source; a negative number for a file (unknown). */
double data_entropy_floor(const struct data_source *d);

#endif
