/*
 * eviction_flush.c: what write-protecting and unmapping scattered pages costs, with and
 * without another thread of the process running on the other CPU.
 *
 * Every 7th page of a 64 MiB region (registered MISSING|WP, all pages present) is
 * write-protected with one UFFDIO_WRITEPROTECT each, then the same pages are unmapped with
 * process_madvise(MADV_DONTNEED), 16 ranges per call. Each such call changes page tables
 * and so flushes the TLB of every CPU running the process: when a thread of it runs on
 * another CPU, that is an IPI the caller waits for.
 *
 * usage: eviction_flush SPINNER    SPINNER 1: a thread of the process spins on CPU 0
 *   (the caller runs on CPU 1)
 *
 * gcc -O2 -pthread -o eviction_flush probes/eviction_flush.c   (root)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_process_madvise
#define SYS_process_madvise 440
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

static volatile int stop;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000ull + t.tv_nsec;
}

static void pin(int c) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(c, &s);
    sched_setaffinity(0, sizeof s, &s);
}

static void *spinner(void *arg) {
    (void)arg;
    pin(0);
    volatile uint64_t s = 0;
    while (!stop)
        for (int i = 0; i < 1000; i++)
            s += i;
    return NULL;
}

int main(int argc, char **argv) {
    int spin = argc > 1 ? atoi(argv[1]) : 0;
    size_t n = 16384;
    int uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    struct uffdio_api api = {.api = UFFD_API};
    if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) {
        perror("userfaultfd");
        return 1;
    }
    char *r = mmap(0, n * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(r, n * 4096, MADV_NOHUGEPAGE);
    struct uffdio_register reg = {.range = {(uint64_t)r, n * 4096},
                                  .mode = UFFDIO_REGISTER_MODE_MISSING |
                                          UFFDIO_REGISTER_MODE_WP};
    if (ioctl(uffd, UFFDIO_REGISTER, &reg)) {
        perror("UFFDIO_REGISTER");
        return 1;
    }
    pin(1);
    for (size_t i = 0; i < n; i++) {
        struct uffdio_zeropage z = {.range = {(uint64_t)r + i * 4096, 4096}};
        ioctl(uffd, UFFDIO_ZEROPAGE, &z);
    }
    memset(r, 1, n * 4096);
    pthread_t t;
    if (spin)
        pthread_create(&t, 0, spinner, NULL);
    usleep(20000);

    uint64_t t0 = now_ns();
    size_t pages = 0;
    for (size_t i = 0; i < n; i += 7, pages++) {
        struct uffdio_writeprotect w = {.range = {(uint64_t)r + i * 4096, 4096},
                                        .mode = UFFDIO_WRITEPROTECT_MODE_WP};
        if (ioctl(uffd, UFFDIO_WRITEPROTECT, &w))
            perror("UFFDIO_WRITEPROTECT");
    }
    uint64_t t1 = now_ns();

    int pidfd = syscall(SYS_pidfd_open, getpid(), 0);
    struct iovec iov[16];
    int k = 0;
    uint64_t t2 = now_ns();
    for (size_t i = 0; i < n; i += 7) {
        iov[k].iov_base = r + i * 4096;
        iov[k].iov_len = 4096;
        if (++k == 16) {
            syscall(SYS_process_madvise, pidfd, iov, k, MADV_DONTNEED, 0);
            k = 0;
        }
    }
    if (k)
        syscall(SYS_process_madvise, pidfd, iov, k, MADV_DONTNEED, 0);
    uint64_t t3 = now_ns();
    stop = 1;
    if (spin)
        pthread_join(t, NULL);
    printf("another thread running on the other CPU: %s; write-protect, one ioctl per scattered"
           " page: %.2f us/page; process_madvise(DONTNEED), 16 pages per call: %.2f us/page\n",
           spin ? "yes" : "no", (t1 - t0) / 1e3 / pages, (t3 - t2) / 1e3 / pages);
    return 0;
}
