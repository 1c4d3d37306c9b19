#include "data.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"
#include "hash.h"
#include "progress.h"
#include "rng.h"

/* n bytes at offset `at`, retrying short reads: the bytes read (fewer at the file's end). */
static int64_t pread_all(int fd, unsigned char *p, int64_t n, int64_t at)
{
    int64_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, p + got, (size_t)(n - got), (off_t)(at + got));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += k;
    }
    return got;
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
    d->hash = hash_fnv1a(HASH_FNV1A_START, id, sizeof id);
    return ERR_OK;
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int32_t token_of(const unsigned char *p, int token_bytes)
{
    return token_bytes == 1 ? p[0] : (int32_t)(p[0] | p[1] << 8);
}

#define LLMC_HEADER_BYTES ((int64_t)DATA_LLMC_HEADER_INTS * 4)
#define DATA_PIECE ((int64_t)1 << 20) /* bytes read at a time by data_init_file */

static int64_t mtime_ns(const struct stat *st)
{
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

/* The file opened (a regular file, fileio.h), its size and time noted, the row buffer made. */
static int open_file(struct data_source *d, const char *file, int64_t min_bytes,
                     const char *what, struct err *e)
{
    struct stat st;
    if (fileio_open_input(file, 0, &d->fd, &d->n_bytes, e))
        return e->code;
    d->file = strdup(file);
    d->row = malloc((size_t)(d->T + 1) * 2);
    if (d->file == NULL || d->row == NULL)
        return err_set(e, ERR_FAIL, "%s: out of memory", file);
    if (fstat(d->fd, &st) != 0)
        return err_set(e, ERR_INPUT, "%s: cannot stat: %s", file, strerror(errno));
    d->mtime_ns = mtime_ns(&st);
    if (d->n_bytes < min_bytes)
        return err_set(e, ERR_INPUT, "%s: %lld bytes, but %s needs %lld bytes", file,
                       (long long)d->n_bytes, what, (long long)min_bytes);
    return ERR_OK;
}

/* llm.c's header (dev/data/data_common.py): its count must match the file's size exactly (a
 * short file was cut off, a long one is not this format). */
static int parse_llmc(struct data_source *d, struct err *e)
{
    const char *hint = "for a file of raw bytes: --data-format bytes";
    unsigned char h[12];
    if (pread_all(d->fd, h, sizeof h, 0) != (int64_t)sizeof h)
        return err_set(e, ERR_INPUT, "%s: cannot read the header: %s", d->file,
                       strerror(errno));
    uint32_t magic = le32(h), version = le32(h + 4);
    int32_t count = (int32_t)le32(h + 8);
    if (magic != DATA_LLMC_MAGIC)
        return err_set(e, ERR_INPUT,
                       "%s: header: magic %u, expected llm.c's token file (magic %d); %s",
                       d->file, magic, DATA_LLMC_MAGIC, hint);
    if (version != 1)
        return err_set(e, ERR_INPUT,
                       "%s: header: version %u, expected 1 (llm.c's uint16 tokens)", d->file,
                       version);
    int64_t want = LLMC_HEADER_BYTES + 2 * (int64_t)count;
    if (count < 0 || d->n_bytes != want)
        return err_set(e, ERR_INPUT,
                       "%s: header: %d tokens, %lld bytes with the header, but the file has "
                       "%lld bytes (%s)",
                       d->file, count, (long long)want, (long long)d->n_bytes,
                       d->n_bytes < want ? "truncated" : "bytes past the last token");
    d->tokens_at = LLMC_HEADER_BYTES;
    d->n_tokens = count;
    d->token_bytes = 2;
    return ERR_OK;
}

/* The file opened and its header checked (no token read). */
static int open_checked(struct data_source *d, const char *file, enum data_format format,
                        const struct model *m, uint64_t seed, struct err *e)
{
    data_start(d, DATA_FILE, m, seed);
    d->fd = -1;
    if (format == DATA_FORMAT_BYTES) {
        if (m->vocab_size < 256)
            return err_set(e, ERR_INPUT,
                           "%s: byte-level tokens need vocab_size >= 256; the plan's model "
                           "has %d",
                           file, m->vocab_size);
        ERR_TRY(open_file(d, file, (int64_t)m->seq_len + 1,
                          "one sequence (seq_len + 1 tokens)", e));
        d->n_tokens = d->n_bytes;
        d->token_bytes = 1;
        return ERR_OK;
    }
    ERR_TRY(open_file(d, file, LLMC_HEADER_BYTES, "llm.c's token-file header", e));
    ERR_TRY(parse_llmc(d, e));
    if (d->n_tokens < (int64_t)m->seq_len + 1)
        return err_set(e, ERR_INPUT,
                       "%s: %lld tokens, but one sequence needs seq_len + 1 = %d tokens", file,
                       (long long)d->n_tokens, m->seq_len + 1);
    return ERR_OK;
}

/* The index of the first token >= V among buf's n bytes of whole tokens, or -1. */
static int64_t first_past(const struct data_source *d, const unsigned char *buf, int64_t n)
{
    for (int64_t i = 0; i < n / d->token_bytes; i++)
        if (token_of(buf + i * d->token_bytes, d->token_bytes) >= d->V)
            return i;
    return -1;
}

/* The whole file once, a piece at a time: hashed, and every token checked. */
static int read_whole(struct data_source *d, struct err *e)
{
    unsigned char *buf = malloc((size_t)DATA_PIECE);
    if (buf == NULL)
        return err_set(e, ERR_FAIL, "%s: out of memory", d->file);
    uint64_t h = HASH_FNV1A_START;
    int rc = ERR_OK;
    for (int64_t at = 0; rc == ERR_OK && at < d->n_bytes; at += DATA_PIECE) {
        int64_t n = d->n_bytes - at < DATA_PIECE ? d->n_bytes - at : DATA_PIECE;
        if (pread_all(d->fd, buf, n, at) != n) {
            rc = err_set(e, ERR_INPUT, "%s: cannot read %lld bytes at byte %lld (changed while "
                         "being read?)", d->file, (long long)n, (long long)at);
            break;
        }
        h = hash_fnv1a(h, buf, n);
        progress_tick();
        int64_t lo = at > d->tokens_at ? at : d->tokens_at, bad;
        if (lo < at + n && (bad = first_past(d, buf + (lo - at), at + n - lo)) >= 0) {
            int64_t off = lo + bad * d->token_bytes;
            rc = err_set(e, ERR_INPUT,
                         "%s: token %d at byte offset %lld (token %lld) >= the model's "
                         "vocab_size %d",
                         d->file, token_of(buf + (off - at), d->token_bytes), (long long)off,
                         (long long)((off - d->tokens_at) / d->token_bytes), d->V);
        }
    }
    free(buf);
    d->hash = h;
    return rc;
}

int data_open_file(struct data_source *d, const char *file, enum data_format format,
                   const struct model *m, uint64_t seed, int whole, struct err *e)
{
    int rc = open_checked(d, file, format, m, seed, e);
    if (rc == ERR_OK && whole)
        rc = read_whole(d, e);
    if (rc != ERR_OK) /* nothing left open or allocated */
        data_free(d);
    return rc;
}

int data_init_file(struct data_source *d, const char *file, enum data_format format,
                   const struct model *m, uint64_t seed, struct err *e)
{
    return data_open_file(d, file, format, m, seed, 1, e);
}

void data_free(struct data_source *d)
{
    free(d->table);
    free(d->file);
    free(d->row);
    if (d->kind == DATA_FILE && d->fd >= 0)
        close(d->fd);
    memset(d, 0, sizeof *d);
}

/* The file as it was opened: the same size and modification time. */
static int check_unchanged(const struct data_source *d, struct err *e)
{
    struct stat st;
    if (fstat(d->fd, &st) != 0)
        return err_set(e, ERR_FAIL, "--data %s: cannot stat: %s", d->file, strerror(errno));
    if ((int64_t)st.st_size != d->n_bytes || mtime_ns(&st) != d->mtime_ns)
        return err_set(e, ERR_FAIL,
                       "--data %s: changed while training (%lld bytes now, %lld when the run "
                       "started%s): the run reads it until its last step; keep it unchanged, "
                       "or train on a copy",
                       d->file, (long long)st.st_size, (long long)d->n_bytes,
                       (int64_t)st.st_size == d->n_bytes ? ", modified since" : "");
    return ERR_OK;
}

/* The T + 1 tokens from token s, each checked. */
static int read_row(const struct data_source *d, int64_t s, int32_t *tok, int32_t *tgt,
                    struct err *e)
{
    int tb = d->token_bytes, T = d->T;
    int64_t n = (int64_t)(T + 1) * tb, at = d->tokens_at + s * tb;
    if (pread_all(d->fd, d->row, n, at) != n)
        return err_set(e, ERR_FAIL,
                       "--data %s: %lld bytes at byte %lld could not be read (cut short while "
                       "training?): the run reads it until its last step",
                       d->file, (long long)n, (long long)at);
    for (int t = 0; t <= T; t++) {
        int32_t x = token_of(d->row + t * tb, tb);
        if (x >= d->V)
            return err_set(e, ERR_FAIL, "--data %s: token %d at byte offset %lld >= the model's "
                           "vocab_size %d (changed while training?)", d->file, x,
                           (long long)(at + (int64_t)t * tb), d->V);
        if (tok != NULL && t < T)
            tok[t] = x;
        if (tgt != NULL && t > 0)
            tgt[t - 1] = x;
    }
    return ERR_OK;
}

int data_batch(const struct data_source *d, int64_t step, int micro, int32_t *tokens,
               int32_t *targets, struct err *e)
{
    int T = d->T;
    micro += d->micro_offset;
    if (d->kind == DATA_FILE)
        ERR_TRY(check_unchanged(d, e));
    for (int b = 0; b < d->B; b++) {
        uint64_t row = ((uint64_t)micro << 32) | (uint64_t)b;
        int32_t *tok = tokens ? tokens + (int64_t)b * T : NULL;
        int32_t *tgt = targets ? targets + (int64_t)b * T : NULL;
        if (d->kind == DATA_FILE) {
            uint64_t span = (uint64_t)(d->n_tokens - T);
            int64_t s = (int64_t)(rng_key(d->seed, RNG_FILE_OFFSET, (uint64_t)step, row) % span);
            ERR_TRY(read_row(d, s, tok, tgt, e));
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
    return ERR_OK;
}

double data_entropy_floor(const struct data_source *d)
{
    return d->kind == DATA_SYNTHETIC ? log((double)d->successors) : -1.0;
}
