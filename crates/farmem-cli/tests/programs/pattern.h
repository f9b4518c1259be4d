/* Test data shared by the C test programs: a 64-bit mixer (splitmix64's finalizer) for seeds
 * and pseudo-random choices, and a fill pattern that differs in every word and in the odd
 * bytes of a block, so that lost, stale or shifted data shows. */
#ifndef FARMEM_TEST_PATTERN_H
#define FARMEM_TEST_PATTERN_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Fill n bytes at p with the pattern of `seed`. */
static inline void fill_block(unsigned char *p, size_t n, uint64_t seed) {
    size_t nw = n / 8;
    uint64_t *w = (uint64_t *)p;
    for (size_t i = 0; i < nw; i++)
        w[i] = seed + i * 0x9e3779b97f4a7c15ULL;
    for (size_t i = nw * 8; i < n; i++)
        p[i] = (unsigned char)(seed >> (8 * (i & 7))) ^ (unsigned char)i;
}

#endif
