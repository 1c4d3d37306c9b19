/* FNV-1a, 64 bits: the checksum of checkpoint payloads and the identity of a data source. */
#ifndef BALLAST_HASH_H
#define BALLAST_HASH_H

#include <stdint.h>

#define HASH_FNV1A_START 0xCBF29CE484222325ull

/* h continued over n bytes at p (start from HASH_FNV1A_START). */
static inline uint64_t hash_fnv1a(uint64_t h, const void *p, int64_t n)
{
    const unsigned char *b = p;
    for (int64_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

#endif
