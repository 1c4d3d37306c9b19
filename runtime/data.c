#include "data.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fileio.h"
#include "rng.h"

static uint64_t fnv1a(uint64_t h, const unsigned char *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

static void data_start(struct data_source *d, enum data_kind kind, const struct model *m,
                       uint64_t seed)
{
    memset(d, 0, sizeof *d);
    d->kind = kind;
    d->seed = seed;
    d->B = m->micro_batch;
    d->T = m->seq_len;
    d->V = m->vocab_size;
}

int data_init_synthetic(struct data_source *d, const struct model *m, uint64_t seed,
                        struct err *e)
{
    data_start(d, DATA_SYNTHETIC, m, seed);
    int K = d->V < DATA_MARKOV_SUCCESSORS ? d->V : DATA_MARKOV_SUCCESSORS;
    d->successors = K;
    d->table = malloc(sizeof *d->table * (size_t)d->V * (size_t)K);
    if (d->table == NULL)
        return err_set(e, ERR_FAIL, "out of memory for the %d x %d Markov table", d->V, K);
    for (int a = 0; a < d->V; a++) {
        int32_t *row = d->table + (int64_t)a * K;
        uint64_t attempt = 0;
        for (int j = 0; j < K;) {
            int32_t c = (int32_t)(rng_key(seed, RNG_MARKOV_TABLE, (uint64_t)a, attempt++) %
                                  (uint64_t)d->V);
            int dup = 0;
            for (int i = 0; i < j; i++)
                dup |= row[i] == c;
            if (!dup)
                row[j++] = c;
        }
    }
    uint64_t id[2] = {(uint64_t)d->V, (uint64_t)K};
    d->hash = fnv1a(0xCBF29CE484222325ull, (const unsigned char *)id, sizeof id);
    return ERR_OK;
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int32_t token_at(const struct data_source *d, int64_t i)
{
    const unsigned char *p = d->tokens + i * d->token_bytes;
    return d->token_bytes == 1 ? p[0] : (int32_t)(p[0] | p[1] << 8);
}

#define LLMC_HEADER_BYTES ((int64_t)DATA_LLMC_HEADER_INTS * 4)

/* The mapped file as llm.c writes it (dev/data/data_common.py): a header whose count must
 * match the file's size exactly (a short file was cut off, a long one is not this format),
 * then uint16 tokens, each checked against the vocabulary once here so a batch never sees
 * an index past the embedding table. */
static int parse_llmc(struct data_source *d, const char *file, struct err *e)
{
    const char *hint = "for a file of raw bytes: --data-format bytes";
    uint32_t magic = le32(d->bytes), version = le32(d->bytes + 4);
    int32_t count = (int32_t)le32(d->bytes + 8);
    if (magic != DATA_LLMC_MAGIC)
        return err_set(e, ERR_INPUT,
                       "%s: header: magic %u, expected llm.c's token file (magic %d); %s", file,
                       magic, DATA_LLMC_MAGIC, hint);
    if (version != 1)
        return err_set(e, ERR_INPUT,
                       "%s: header: version %u, expected 1 (llm.c's uint16 tokens)", file,
                       version);
    int64_t want = LLMC_HEADER_BYTES + 2 * (int64_t)count;
    if (count < 0 || d->n_bytes != want)
        return err_set(e, ERR_INPUT,
                       "%s: header: %d tokens, %lld bytes with the header, but the file has "
                       "%lld bytes (%s)",
                       file, count, (long long)want, (long long)d->n_bytes,
                       d->n_bytes < want ? "truncated" : "bytes past the last token");
    d->tokens = d->bytes + LLMC_HEADER_BYTES;
    d->n_tokens = count;
    d->token_bytes = 2;
    for (int64_t i = 0; i < d->n_tokens; i++) {
        int32_t t = token_at(d, i);
        if (t >= d->V)
            return err_set(e, ERR_INPUT,
                           "%s: token %d at byte offset %lld (token %lld) >= the model's "
                           "vocab_size %d",
                           file, t, (long long)(LLMC_HEADER_BYTES + 2 * i), (long long)i,
                           d->V);
    }
    return ERR_OK;
}

static int map_file(struct data_source *d, const char *file, int64_t min_bytes,
                    const char *what, struct err *e)
{
    int fd;
    int64_t size;
    /* no cap: the file is mapped, not read */
    if (fileio_open_input(file, 0, &fd, &size, e))
        return e->code;
    if (size < min_bytes) {
        close(fd);
        return err_set(e, ERR_INPUT, "%s: %lld bytes, but %s needs %lld bytes", file,
                       (long long)size, what, (long long)min_bytes);
    }
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return err_set(e, ERR_INPUT, "%s: cannot map: %s", file, strerror(errno));
    d->bytes = p;
    d->n_bytes = size;
    return ERR_OK;
}

int data_init_file(struct data_source *d, const char *file, enum data_format format,
                   const struct model *m, uint64_t seed, struct err *e)
{
    data_start(d, DATA_FILE, m, seed);
    if (format == DATA_FORMAT_BYTES) {
        if (m->vocab_size < 256)
            return err_set(e, ERR_INPUT,
                           "%s: byte-level tokens need vocab_size >= 256; the plan's model "
                           "has %d",
                           file, m->vocab_size);
        if (map_file(d, file, (int64_t)m->seq_len + 1, "one sequence (seq_len + 1 tokens)", e))
            return e->code;
        d->tokens = d->bytes;
        d->n_tokens = d->n_bytes;
        d->token_bytes = 1;
    } else {
        if (map_file(d, file, LLMC_HEADER_BYTES, "llm.c's token-file header", e) ||
            parse_llmc(d, file, e))
            return e->code;
        if (d->n_tokens < (int64_t)m->seq_len + 1)
            return err_set(e, ERR_INPUT,
                           "%s: %lld tokens, but one sequence needs seq_len + 1 = %d tokens",
                           file, (long long)d->n_tokens, m->seq_len + 1);
    }
    d->hash = fnv1a(0xCBF29CE484222325ull, d->bytes, d->n_bytes);
    return ERR_OK;
}

void data_free(struct data_source *d)
{
    free(d->table);
    if (d->bytes != NULL)
        munmap((void *)d->bytes, (size_t)d->n_bytes);
    memset(d, 0, sizeof *d);
}

void data_batch(const struct data_source *d, int64_t step, int micro, int32_t *tokens,
                int32_t *targets)
{
    int T = d->T;
    micro += d->micro_offset;
    for (int b = 0; b < d->B; b++) {
        uint64_t row = ((uint64_t)micro << 32) | (uint64_t)b;
        int32_t *tok = tokens ? tokens + (int64_t)b * T : NULL;
        int32_t *tgt = targets ? targets + (int64_t)b * T : NULL;
        if (d->kind == DATA_FILE) {
            uint64_t span = (uint64_t)(d->n_tokens - T);
            int64_t s = (int64_t)(rng_key(d->seed, RNG_FILE_OFFSET, (uint64_t)step, row) % span);
            for (int t = 0; t < T; t++) {
                if (tok)
                    tok[t] = token_at(d, s + t);
                if (tgt)
                    tgt[t] = token_at(d, s + t + 1);
            }
            continue;
        }
        uint64_t key = rng_key(d->seed, RNG_MARKOV_WALK, (uint64_t)step, row);
        int32_t x = (int32_t)(rng_mix(key) % (uint64_t)d->V);
        for (int t = 0; t < T; t++) {
            uint64_t pick = rng_mix(key + (uint64_t)t + 1) % (uint64_t)d->successors;
            int32_t next = d->table[(int64_t)x * d->successors + (int64_t)pick];
            if (tok)
                tok[t] = x;
            if (tgt)
                tgt[t] = next;
            x = next;
        }
    }
}

double data_entropy_floor(const struct data_source *d)
{
    return d->kind == DATA_SYNTHETIC ? log((double)d->successors) : -1.0;
}
