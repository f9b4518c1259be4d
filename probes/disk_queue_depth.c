// Random direct reads of FILE by THREADS threads at once (each one read at a time, so the
// disk sees THREADS in flight), SIZE bytes each: what reading a fault's page and its
// read-ahead together saves over one after the other, and what a longer read costs.
// Usage: disk_queue_depth FILE THREADS SIZE_BYTES READS_PER_THREAD
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int fd, size, reads;
static uint64_t pages;

static void *reader(void *arg) {
    uint64_t r = (uintptr_t)arg * 7919 + 88172645463325252ull;
    void *buf;
    if (posix_memalign(&buf, 4096, size)) exit(1);
    for (int i = 0; i < reads; i++) {
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        off_t off = (r % (pages - size / 4096)) * 4096;
        if (pread(fd, buf, size, off) != size) { perror("pread"); exit(1); }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s FILE THREADS SIZE_BYTES READS_PER_THREAD\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[2]);
    size = atoi(argv[3]);
    reads = atoi(argv[4]);
    fd = open(argv[1], O_RDONLY | O_DIRECT);
    if (fd < 0 || threads < 1 || threads > 64 || size < 4096 || size % 4096) {
        perror("open / arguments");
        return 1;
    }
    pages = lseek(fd, 0, SEEK_END) / 4096;
    pthread_t t[64];
    double a = now();
    for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, reader, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < threads; i++) pthread_join(t[i], 0);
    double e = now() - a;
    printf("in flight %d, %d bytes: %.0f reads/s, %.1f us per read\n", threads, size,
           threads * reads / e, e / reads * 1e6);
    return 0;
}
