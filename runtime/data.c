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

int data_init_synthetic(struct data_source *d, const struct model *m, uint64_t seed,
                        struct err *e)
{
    memset(d, 0, sizeof *d);
    d->kind = DATA_SYNTHETIC;
    d->seed = seed;
    d->B = m->micro_batch;
    d->T = m->seq_len;
    d->V = m->vocab_size;
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

int data_init_file(struct data_source *d, const char *file, const struct model *m,
                   uint64_t seed, struct err *e)
{
    memset(d, 0, sizeof *d);
    d->kind = DATA_FILE;
    d->seed = seed;
    d->B = m->micro_batch;
    d->T = m->seq_len;
    d->V = m->vocab_size;
    if (m->vocab_size < 256)
        return err_set(e, ERR_INPUT,
                       "%s: byte-level tokens need vocab_size >= 256; the plan's model has %d",
                       file, m->vocab_size);
    int fd;
    int64_t size;
    /* no cap: the file is mapped, not read */
    if (fileio_open_input(file, 0, &fd, &size, e))
        return e->code;
    if (size < (int64_t)m->seq_len + 1) {
        close(fd);
        return err_set(e, ERR_INPUT,
                       "%s: %lld bytes, but one sequence needs seq_len + 1 = %d bytes", file,
                       (long long)size, m->seq_len + 1);
    }
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return err_set(e, ERR_INPUT, "%s: cannot map: %s", file, strerror(errno));
    d->bytes = p;
    d->n_bytes = size;
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
    for (int b = 0; b < d->B; b++) {
        uint64_t row = ((uint64_t)micro << 32) | (uint64_t)b;
        int32_t *tok = tokens ? tokens + (int64_t)b * T : NULL;
        int32_t *tgt = targets ? targets + (int64_t)b * T : NULL;
        if (d->kind == DATA_FILE) {
            uint64_t span = (uint64_t)(d->n_bytes - T);
            const unsigned char *s =
                d->bytes + rng_key(d->seed, RNG_FILE_OFFSET, (uint64_t)step, row) % span;
            for (int t = 0; t < T; t++) {
                if (tok)
                    tok[t] = s[t];
                if (tgt)
                    tgt[t] = s[t + 1];
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
