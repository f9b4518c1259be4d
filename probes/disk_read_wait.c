// disk_read_wait: what one random 4 KiB direct read costs at queue depth 1, by the CPU the
// reader waits on and by whether that CPU may halt meanwhile.
//
// A fault served from a file tier waits for exactly one such read. On a VM an idle CPU halts,
// and the completion interrupt (or the wake-up IPI sent from the CPU that took it) must
// bring it back; a disk with one queue interrupts one CPU only. The variants:
//   reader on CPU r, nothing else                       (the CPU halts while it waits)
//   reader on CPU r, a SCHED_IDLE spinner on CPU s      (s never halts; any wake-up
//                                                        preempts the spinner at once)
//
// usage: disk_read_wait FILE [reads=10000]
//   FILE: a large file (>= 256 MiB) on the disk to measure, e.g. made with
//   dd if=/dev/urandom of=/var/tmp/probe.img bs=1M count=1024
// Prints one line per variant: average, p50, p90, p99 in microseconds.
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return sched_setaffinity(0, sizeof s, &s);
}

static atomic_int stop;

static void *spinner(void *arg) {
    int cpu = (int)(intptr_t)arg;
    pin(cpu);
    struct sched_param p = {0};
    if (sched_setscheduler(0, SCHED_IDLE, &p) != 0)
        perror("SCHED_IDLE");
    while (!atomic_load_explicit(&stop, memory_order_relaxed))
        __builtin_ia32_pause();
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void run(int fd, uint64_t pages, int reader, int spin_cpu, int n, double *lat) {
    pthread_t t;
    atomic_store(&stop, 0);
    if (spin_cpu >= 0)
        pthread_create(&t, NULL, spinner, (void *)(intptr_t)spin_cpu);
    pin(reader);
    void *buf;
    if (posix_memalign(&buf, 4096, 4096) != 0)
        exit(1);
    uint64_t r = 88172645463325252ull ^ (uint64_t)(reader * 31 + spin_cpu);
    for (int i = 0; i < n; i++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        double a = now_us();
        if (pread(fd, buf, 4096, (off_t)(r % pages) * 4096) != 4096) {
            perror("pread");
            exit(1);
        }
        lat[i] = now_us() - a;
    }
    atomic_store(&stop, 1);
    if (spin_cpu >= 0)
        pthread_join(t, NULL);
    free(buf);
    qsort(lat, n, sizeof *lat, cmp);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += lat[i];
    char spin[32] = "none";
    if (spin_cpu >= 0)
        snprintf(spin, sizeof spin, "SCHED_IDLE on cpu%d", spin_cpu);
    printf("reader cpu%d, spinner %-20s avg %6.1f  p50 %6.1f  p90 %6.1f  p99 %6.1f us\n", reader,
           spin, sum / n, lat[n / 2], lat[n * 9 / 10], lat[n * 99 / 100]);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [reads]\n", argv[0]);
        return 2;
    }
    int n = argc > 2 ? atoi(argv[2]) : 10000;
    int fd = open(argv[1], O_RDONLY | O_DIRECT);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    uint64_t pages = (uint64_t)lseek(fd, 0, SEEK_END) / 4096;
    if (pages < 65536) {
        fprintf(stderr, "%s: want at least 256 MiB\n", argv[1]);
        return 2;
    }
    double *lat = malloc(n * sizeof *lat);
    int cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus > 2)
        cpus = 2;
    // Alternated twice, so that a drift of the host shows as a spread, not as a difference.
    for (int round = 0; round < 2; round++)
        for (int reader = 0; reader < cpus; reader++) {
            run(fd, pages, reader, -1, n, lat);
            run(fd, pages, reader, reader, n, lat);
        }
    return 0;
}
