/* Page cache beside a budget: fill HEAP MiB of heap with a pattern, write FILE MiB to PATH
 * (left in the page cache, dirty: no fsync), then watch what the tree's memory cgroup
 * ($FARMEM_CGROUP) is charged until it is at most BOUND MiB, for up to SECS s (30); then
 * read the file back into heap memory and check both.
 * Usage: page_cache HEAP FILE PATH BOUND [SECS]
 * Prints "settled at K KiB after M ms" (exit 0), or "not settled: K KiB" (exit 2); 1 on a
 * mismatch, 3 on an I/O error, 4 without a cgroup to read. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pattern.h"

#define MIB (1UL << 20)

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}

/* The cgroup's charge in bytes (v1 or v2), or -1. */
static long long charged(const char *dir) {
    char path[4096];
    const char *names[] = {"memory.usage_in_bytes", "memory.current"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        long long v = -1;
        if (fscanf(f, "%lld", &v) != 1) v = -1;
        fclose(f);
        return v;
    }
    return -1;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: page_cache HEAP FILE PATH BOUND [SECS]\n");
        return 3;
    }
    size_t heap = strtoul(argv[1], 0, 10) * MIB, file = strtoul(argv[2], 0, 10) * MIB;
    long long bound = (long long)strtoul(argv[4], 0, 10) * (long long)MIB;
    long long wait_ms = (argc > 5 ? strtoul(argv[5], 0, 10) : 30) * 1000LL;
    const char *cg = getenv("FARMEM_CGROUP");
    if (!cg || charged(cg) < 0) {
        fprintf(stderr, "no cgroup to read\n");
        return 4;
    }
    unsigned char *h = malloc(heap), *buf = malloc(MIB);
    if (!h || !buf) return 3;
    for (size_t off = 0; off < heap; off += 4096) fill_block(h + off, 4096, off);
    int fd = open(argv[3], O_CREAT | O_TRUNC | O_RDWR, 0600);
    if (fd < 0) return 3;
    for (size_t off = 0; off < file; off += MIB) {
        fill_block(buf, MIB, ~off);
        if (write(fd, buf, MIB) != (ssize_t)MIB) return 3;
    }
    long long t0 = now_ms(), c = charged(cg);
    while (c > bound && now_ms() - t0 < wait_ms) {
        usleep(10000);
        c = charged(cg);
    }
    if (c > bound) {
        printf("not settled: %lld KiB\n", c >> 10);
        return 2;
    }
    printf("settled at %lld KiB after %lld ms\n", c >> 10, now_ms() - t0);
    /* The file comes back through read() into heap memory, part of which may be far. */
    unsigned char *want = malloc(MIB);
    if (!want) return 3;
    for (size_t off = 0; off < file; off += MIB) {
        if (pread(fd, buf, MIB, off) != (ssize_t)MIB) return 3;
        fill_block(want, MIB, ~off);
        if (memcmp(buf, want, MIB)) {
            fprintf(stderr, "MISMATCH in the file at %zu\n", off);
            return 1;
        }
    }
    close(fd);
    for (size_t off = 0; off < heap; off += 4096) {
        fill_block(buf, 4096, off);
        if (memcmp(h + off, buf, 4096)) {
            fprintf(stderr, "MISMATCH in the heap at %zu\n", off);
            return 1;
        }
    }
    return 0;
}
