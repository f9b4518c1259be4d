/*
 * fault_round_trip.c: what a userfaultfd page fault costs the faulting thread, by where
 * the handler thread runs and how it waits.
 *
 * A thread reads one byte of each page of a registered region; a handler thread serves
 * each MISSING fault with UFFDIO_COPY of a prepared page (no compression, no eviction: the
 * round trip alone). Prints p50/p90/p99 of the reads, in microseconds, and the CPU the
 * reader ended on.
 *
 * usage: fault_round_trip WAIT HANDLER_CPU [READER_CPU [IDLE [FOLLOW]]]
 *   WAIT         0: the handler blocks in poll(); 1: it busy-polls with non-blocking read()
 *   HANDLER_CPU  the handler's CPU; -1: unpinned; 9: two handlers, pinned to CPUs 0 and 1
 *   READER_CPU   the reader's CPU (default 0); -1: unpinned
 *   IDLE         1: the handler runs SCHED_IDLE
 *   FOLLOW       N > 0: every N faults the handler reads the faulting thread's CPU from
 *                /proc/self/task/TID/stat and pins itself there
 *
 * gcc -O2 -pthread -o fault_round_trip probes/fault_round_trip.c   (root)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int uffd, busy, hcpu, idle, follow, moves;
static char *src;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000ull + t.tv_nsec;
}

static void pin(int c) {
    if (c < 0)
        return;
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(c, &s);
    sched_setaffinity(0, sizeof s, &s);
}

/* Field 39 of /proc/self/task/TID/stat: the CPU the thread last ran on. */
static int thread_cpu(unsigned tid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/self/task/%u/stat", tid);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    int k = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[k > 0 ? k : 0] = 0;
    char *p = strrchr(buf, ')');
    for (int f = 0; p && *p; p++)
        if (*p == ' ' && ++f == 37)
            return atoi(p + 1);
    return -1;
}

static void *handler(void *arg) {
    pin(arg ? (int)(long)arg - 1 : hcpu);
    if (idle) {
        struct sched_param sp = {0};
        if (sched_setscheduler(0, SCHED_IDLE, &sp))
            perror("SCHED_IDLE");
    }
    struct uffd_msg m;
    for (unsigned served = 0;; served++) {
        if (busy) {
            while (read(uffd, &m, sizeof m) != sizeof m) {
            }
        } else {
            struct pollfd p = {uffd, POLLIN, 0};
            poll(&p, 1, -1);
            if (read(uffd, &m, sizeof m) != sizeof m)
                continue;
        }
        if (m.event != UFFD_EVENT_PAGEFAULT)
            continue;
        if (follow && served % follow == 0) {
            int c = thread_cpu(m.arg.pagefault.feat.ptid);
            if (c >= 0 && c != sched_getcpu()) {
                pin(c);
                moves++;
            }
        }
        struct uffdio_copy c = {
            .dst = m.arg.pagefault.address & ~4095ull, .src = (uint64_t)src, .len = 4096};
        ioctl(uffd, UFFDIO_COPY, &c);
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s WAIT HANDLER_CPU [READER_CPU [IDLE [FOLLOW]]]\n", argv[0]);
        return 2;
    }
    busy = atoi(argv[1]);
    hcpu = atoi(argv[2]);
    int rcpu = argc > 3 ? atoi(argv[3]) : 0;
    idle = argc > 4 ? atoi(argv[4]) : 0;
    follow = argc > 5 ? atoi(argv[5]) : 0;
    size_t n = 20000;

    uffd = syscall(SYS_userfaultfd, O_CLOEXEC | (busy ? O_NONBLOCK : 0));
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_THREAD_ID};
    if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) {
        perror("userfaultfd");
        return 1;
    }
    src = aligned_alloc(4096, 4096);
    memset(src, 7, 4096);
    char *r = mmap(0, n * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(r, n * 4096, MADV_NOHUGEPAGE);
    struct uffdio_register reg = {.range = {(uint64_t)r, n * 4096},
                                  .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (ioctl(uffd, UFFDIO_REGISTER, &reg)) {
        perror("UFFDIO_REGISTER");
        return 1;
    }
    pthread_t t;
    if (hcpu == 9) {
        pthread_create(&t, 0, handler, (void *)1);
        pthread_create(&t, 0, handler, (void *)2);
    } else {
        pthread_create(&t, 0, handler, NULL);
    }
    pin(rcpu);
    usleep(10000);

    uint64_t *lat = malloc(n * sizeof *lat);
    volatile char sink = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t t0 = now_ns();
        sink += r[i * 4096];
        lat[i] = now_ns() - t0;
    }
    qsort(lat, n, sizeof *lat, cmp);
    printf("wait %s, handler cpu %d%s, reader cpu %d, follow %d: p50 %.2f us p90 %.2f p99 %.2f;"
           " reader ended on cpu %d, handler moves %d\n",
           busy ? "busy" : "poll", hcpu, idle ? " SCHED_IDLE" : "", rcpu, follow,
           lat[n / 2] / 1e3, lat[n * 9 / 10] / 1e3, lat[n * 99 / 100] / 1e3, sched_getcpu(),
           moves);
    return 0;
}
