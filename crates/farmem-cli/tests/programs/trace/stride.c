/* The strided loop of sites.c, in its own file. */
#include <stddef.h>
#include <stdint.h>

#define PAGE 4096

__attribute__((noinline)) uint64_t stride_scan(const unsigned char *buf, size_t pages,
                                               size_t step) {
    uint64_t bad = 0;
    for (size_t p = 0; p < pages; p += step)
        bad += *(const volatile uint64_t *)(buf + p * PAGE) != p * 0x9e3779b97f4a7c15ULL + 1; /* STRIDE */
    return bad;
}
