/* Mid-size blocks (over 256 bytes, up to 32 KiB): every size in that range is allocated
 * (many of each, so slabs fill, empty and are reused), and each must be usable for at most
 * 15 bytes more than asked up to 2 KiB and 1/32 more above (glibc rounds to 16 bytes;
 * mimalloc's classes alone would give up to 1/4 more: 1,025 bytes would take 1,280). Every
 * block carries a pattern, checked after the other blocks were written (so under a small
 * budget most of them went far and came back), after frees of their neighbours, and
 * through realloc within and out of the range. At the end, memory of blocks all freed goes
 * back within a second (the resident set drops), even the last slab of a size.
 *
 * Exit status 0 on success; otherwise a message on stderr and a non-zero status.
 * Usage: midsize ROUNDS
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pattern.h"

#define MIN 257
#define MAX 32768
#define N 6000

static unsigned char *blk[N];
static size_t len[N];
static uint64_t seed[N];

static int check(size_t i, const char *when) {
    unsigned char *want = malloc(len[i]);
    if (!want) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    fill_block(want, len[i], seed[i]);
    int bad = memcmp(want, blk[i], len[i]) != 0;
    free(want);
    if (bad)
        fprintf(stderr, "block %zu (%zu bytes) is wrong %s\n", i, len[i], when);
    return bad;
}

/* Resident pages of this process. */
static long resident_pages(void) {
    long size = 0, res = -1;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &res) != 2)
            res = -1;
        fclose(f);
    }
    return res;
}

static int put(size_t i, size_t n, uint64_t s) {
    blk[i] = malloc(n);
    if (!blk[i]) {
        fprintf(stderr, "malloc(%zu) failed\n", n);
        return 1;
    }
    size_t u = malloc_usable_size(blk[i]);
    if (u < n || (n <= 2048 ? u - n >= 16 : (u - n) * 32 >= n)) {
        fprintf(stderr, "malloc(%zu): %zu usable bytes\n", n, u);
        return 1;
    }
    if (((uintptr_t)blk[i]) % 16) {
        fprintf(stderr, "malloc(%zu) = %p: not 16-byte aligned\n", n, (void *)blk[i]);
        return 1;
    }
    len[i] = n;
    seed[i] = s;
    fill_block(blk[i], n, s);
    return 0;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 2;
    size_t size = MIN;
    uint64_t r = 1;
    for (int round = 0; round < rounds; round++) {
        for (size_t i = 0; i < N; i++) {
            if (put(i, size, mix(r++)))
                return 1;
            size += 1 + (size_t)(mix(r) % 37);
            if (size > MAX)
                size = MIN;
        }
        for (size_t i = 0; i < N; i++)
            if (check(i, "after the others were written"))
                return 1;
        /* Free two blocks of three: slabs empty partly, some wholly. */
        for (size_t i = 0; i < N; i++)
            if (i % 3 != 0) {
                free(blk[i]);
                blk[i] = NULL;
            }
        for (size_t i = 0; i < N; i += 3) {
            if (check(i, "after its neighbours were freed"))
                return 1;
            /* Grow or shrink: within the range, below it, or beyond it. */
            size_t n = (size_t[]){len[i] / 2, len[i] + 700, 100, 40000}[mix(r++) % 4];
            unsigned char *p = realloc(blk[i], n);
            if (!p) {
                fprintf(stderr, "realloc(%zu) failed\n", n);
                return 1;
            }
            size_t keep = n < len[i] ? n : len[i];
            unsigned char *want = malloc(len[i]);
            fill_block(want, len[i], seed[i]);
            if (memcmp(want, p, keep) != 0) {
                fprintf(stderr, "realloc of block %zu to %zu bytes lost its contents\n", i, n);
                return 1;
            }
            free(want);
            free(p);
            blk[i] = NULL;
        }
    }
    /* calloc of reused blocks reads as zeros. */
    for (size_t i = 0; i < N; i++) {
        size_t n = MIN + (size_t)(mix(r++) % (MAX - MIN));
        unsigned char *p = calloc(1, n);
        for (size_t k = 0; k < n; k++)
            if (p[k]) {
                fprintf(stderr, "calloc(1, %zu): byte %zu is %d\n", n, k, p[k]);
                return 1;
            }
        memset(p, 0xa5, n);
        free(p);
    }
    /* 50 blocks of one size (about one slab), written, then all freed: their pages go. */
    enum { LAST = 50, LAST_SIZE = 5000 };
    long before = resident_pages();
    for (size_t i = 0; i < LAST; i++)
        if (put(i, LAST_SIZE, mix(r++)))
            return 1;
    long full = resident_pages();
    for (size_t i = 0; i < LAST; i++) {
        if (check(i, "before the last frees"))
            return 1;
        free(blk[i]);
    }
    sleep(1);
    long after = resident_pages();
    long page_kib = sysconf(_SC_PAGESIZE) / 1024;
    if (full < 0 || full - after < 128 / page_kib) {
        fprintf(stderr,
                "%d blocks of %d bytes freed a second ago: resident %ld KiB before them, %ld KiB "
                "with them, %ld KiB after\n",
                LAST, LAST_SIZE, before * page_kib, full * page_kib, after * page_kib);
        return 1;
    }
    printf("ok\n");
    return 0;
}
