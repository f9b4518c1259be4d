/* The random loop of sites.c, in its own file. */
#include <stddef.h>
#include <stdint.h>

#define PAGE 4096

__attribute__((noinline)) uint64_t random_reads(const unsigned char *buf, size_t pages,
                                                size_t count) {
    uint64_t bad = 0, x = 88172645463325252ULL;
    for (size_t i = 0; i < count; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t p = x % pages;
        bad += *(const volatile uint64_t *)(buf + p * PAGE) != p * 0x9e3779b97f4a7c15ULL + 1; /* RANDOM */
    }
    return bad;
}
