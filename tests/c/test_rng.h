/* test_rng.h: the random numbers of the C tests and of the fuzz driver, in one place (check.h
 * includes it). The generator is xorshift64 (Marsaglia's shifts 13, 7, 17) from a caller-chosen
 * nonzero seed, with the few ways the tests draw from it. Some tests' streams were recorded with
 * other small generators (test_kernel_digest pins digests of what a stream fed the kernels): those
 * stay as named variants below rather than be moved onto xorshift64, so no recorded stream changes. */
#ifndef MASKPACK_TEST_RNG_H
#define MASKPACK_TEST_RNG_H

#include <stdint.h>

typedef struct test_rng {
    uint64_t s; /* the state: nonzero */
} test_rng;

/* xorshift64: the next state, which is the value */
static inline uint64_t test_rng_next(test_rng *r) {
    uint64_t x = r->s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return r->s = x;
}

/* uniform in [0, n) (modulo bias and all); 0 when n <= 0 */
static inline int64_t test_rng_below(test_rng *r, int64_t n) {
    return n <= 0 ? 0 : (int64_t)(test_rng_next(r) % (uint64_t)n);
}

/* uniform in [lo, hi] (hi >= lo) */
static inline int64_t test_rng_in(test_rng *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(test_rng_next(r) % (uint64_t)(hi - lo + 1));
}

/* uniform in [-1, 1) from the value's top 53 bits */
static inline double test_rng_signed(test_rng *r) {
    return (double)(test_rng_next(r) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* ---- variants --------------------------------------------------------------------------------- */

/* xorshift64* (Vigna): xorshift64 with shifts 12, 25, 27 and the state multiplied on the way out
 * (the fuzz driver's mutations) */
static inline uint64_t test_rng_next_star(test_rng *r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 2685821657736338717ull;
}

/* xorshift32 (shifts 13, 17, 5) on a 32-bit state: the next state, which is the value */
static inline uint32_t test_rng_next32(uint32_t *s) {
    uint32_t x = *s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *s = x;
}

/* Knuth's MMIX linear congruential generator: the next state, which is the value (its high bits
 * are the good ones) */
static inline uint64_t test_lcg_next(uint64_t *s) { return *s = *s * 6364136223846793005ull + 1442695040888963407ull; }

#endif
