/* Counter-based random numbers: every value is a pure function of a key (seed, stream,
 * indices), so weights and data do not depend on the order or the process in which they are
 * drawn — the stage split, the thread count and a resume all see the same numbers. */
#ifndef BALLAST_RNG_H
#define BALLAST_RNG_H

#include <math.h>
#include <stdint.h>

/* splitmix64's finaliser: a bijective mix of 64 bits. */
static inline uint64_t rng_mix(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t rng_key(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    return rng_mix(rng_mix(rng_mix(rng_mix(a) ^ b) ^ c) ^ d);
}

/* Uniform in (0, 1), 53 bits. */
static inline double rng_uniform(uint64_t key)
{
    return ((double)(key >> 11) + 0.5) / 9007199254740992.0;
}

/* Standard normal (Box-Muller on two uniforms drawn from the key). */
static inline double rng_normal(uint64_t key)
{
    double u1 = rng_uniform(rng_mix(key ^ 0x1ull)), u2 = rng_uniform(rng_mix(key ^ 0x2ull));
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Domains, so that the weight and data streams of one seed never share keys. */
enum rng_domain { RNG_WEIGHTS = 1, RNG_MARKOV_TABLE = 2, RNG_MARKOV_WALK = 3, RNG_FILE_OFFSET = 4 };

#endif
