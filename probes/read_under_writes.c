// Random 4 KiB direct reads of a file while another thread writes 64 KiB direct writes
// to the same file: past its end (the file grows), into space allocated beforehand
// (fallocate), or no writer at all. On ext4 a direct write that extends the file (or fills
// a hole) holds the inode's lock exclusively for the whole write, and reads, which take it
// shared, wait behind it; a write into allocated space shares it.
// Usage: read_under_writes DIR MODE   (MODE -1: no writer, 0: extending, 1: preallocated)
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int fd;
static atomic_int stop;
static const off_t base = 256 << 20;

static void *writer(void *arg) {
    (void)arg;
    void *buf;
    if (posix_memalign(&buf, 4096, 65536)) exit(1);
    memset(buf, 7, 65536);
    for (off_t off = base; !atomic_load(&stop); off += 65536) {
        if (pwrite(fd, buf, 65536, off) != 65536) { perror("pwrite"); exit(1); }
        usleep(200);
    }
    return 0;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s DIR MODE(-1|0|1)\n", argv[0]);
        return 2;
    }
    int mode = atoi(argv[2]);
    fd = open(argv[1], O_TMPFILE | O_RDWR | O_DIRECT, 0600);
    if (fd < 0) { perror("open"); return 1; }
    void *buf;
    if (posix_memalign(&buf, 4096, 1 << 20)) return 1;
    memset(buf, 1, 1 << 20);
    for (off_t o = 0; o < base; o += 1 << 20)
        if (pwrite(fd, buf, 1 << 20, o) != 1 << 20) { perror("fill"); return 1; }
    if (mode == 1 && fallocate(fd, 0, base, 1L << 30)) { perror("fallocate"); return 1; }
    pthread_t t;
    if (mode >= 0) pthread_create(&t, 0, writer, 0);
    int n = 20000;
    double *lat = malloc(n * sizeof(double));
    uint64_t r = 88172645463325252ull;
    for (int i = 0; i < n; i++) {
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        off_t off = (r % (base / 4096)) * 4096;
        double a = now_us();
        if (pread(fd, buf, 4096, off) != 4096) { perror("pread"); return 1; }
        lat[i] = now_us() - a;
    }
    atomic_store(&stop, 1);
    if (mode >= 0) pthread_join(t, 0);
    qsort(lat, n, sizeof(double), cmp);
    double s = 0;
    for (int i = 0; i < n; i++) s += lat[i];
    printf("%s: read avg %.1f p50 %.1f p90 %.1f p99 %.1f us\n",
           mode < 0 ? "no writer" : mode == 0 ? "extending writes" : "preallocated",
           s / n, lat[n / 2], lat[n * 9 / 10], lat[n * 99 / 100]);
    return 0;
}
