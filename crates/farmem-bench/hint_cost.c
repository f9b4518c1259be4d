/* Cost of the inline hint fast path (a page that is present), measured by `farmem bench`.
 * Built twice: -DWITH_HINT=1 and -DWITH_HINT=0; the difference per iteration is the hint.
 *   hint_cost region N   touch 64 pages of a far-memory region, then N hinted reads (timing)
 *   hint_cost plain N    the same on malloc'd memory (for callgrind, which cannot run
 *                        userfaultfd; the hint executes the same instructions either way) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "farmem.h"

#ifndef WITH_HINT
#define WITH_HINT 1
#endif

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s region|plain N\n", argv[0]);
        return 2;
    }
    long n = atol(argv[2]);
    size_t sz = 64 * 4096;
    char *p;
    if (strcmp(argv[1], "region") == 0) {
        p = fm_region_create(sz);
        if (!p) {
            fprintf(stderr, "fm_region_create: %s\n", fm_last_error());
            return 1;
        }
    } else {
        p = aligned_alloc(4096, sz);
    }
    for (size_t i = 0; i < sz; i += 4096) {
        fm_hint_write(p + i);
        p[i] = (char)i;
    }
    struct timespec t0, t1;
    uint64_t sum = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < n; i++) {
        const char *q = p + ((uint64_t)(i & 63) << 12);
#if WITH_HINT
        fm_hint(q);
#endif
        sum += *(const volatile char *)q;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    printf("%.4f %llu\n", ns / n, (unsigned long long)sum);
    return 0;
}
