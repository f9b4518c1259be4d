/* Heaps that reserve address space and commit it later, as V8 (node) and the JVM make
 * theirs, under `farmem run` with much more data than the budget:
 *
 *  1. V8's pages: reservations of 508 KiB (PROT_NONE), each trimmed to an aligned 256 KiB
 *     page (munmap of the head and the tail), committed with mprotect(RW) and filled; a
 *     third decommitted (mprotect PROT_NONE, then madvise(MADV_DONTNEED)) and committed
 *     again: zeros; the rest verified.
 *  2. The JVM's heap: one 1 GiB reservation, regions of 4 MiB committed with
 *     mmap(MAP_FIXED, RW) and filled; some decommitted with mmap(MAP_FIXED, PROT_NONE) and
 *     committed again: zeros; the rest verified.
 *  3. Committed data made unreadable (mprotect PROT_NONE, nothing discarded) while two
 *     threads churn through other far memory, then readable again: intact.
 *  4. Touching a reserved page that was never committed is SIGSEGV.
 *  5. A private file mapping at a fixed address over committed far memory and inside a
 *     fresh reservation: the file's bytes; writes stay private (the file is unchanged).
 *  6. A reservation asked for at a multiple of 1 TiB gets that address (ZGC gives up
 *     without its heap views at 4, 8 and 16 TiB).
 *  7. Small reservations next to far memory holding shared mappings at fixed addresses:
 *     "magic" ring buffers (one memfd mapped twice, back to back) and a double mapping
 *     (writable and executable views of one file, as .NET makes its code heap), used
 *     while threads churn through far memory, and in a forked child; then released
 *     (munmap, or an anonymous mapping over them) and the same address space used as heap:
 *     zeros, data kept.
 *
 * Exit status 0 on success; otherwise a message on stderr and a non-zero status.
 * Usage: reserve DIR (where to make the temporary file)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pattern.h"

#define KIB 1024UL
#define MIB (1024UL * KIB)
#define PAGE 4096UL

static const char *step = "start";

static void die(const char *what) {
    fprintf(stderr, "reserve: %s: %s (errno %d)\n", step, what, errno);
    exit(1);
}

static void check(const unsigned char *p, size_t n, uint64_t seed, const char *what) {
    static __thread unsigned char *want; /* one per thread: threads check side by side */
    if (want == NULL && (want = malloc(256 * KIB)) == NULL)
        die("malloc");
    for (size_t off = 0; off < n; off += 256 * KIB) {
        size_t len = n - off < 256 * KIB ? n - off : 256 * KIB;
        fill_block(want, len, seed + off);
        if (memcmp(p + off, want, len) != 0)
            die(what);
    }
}

static void fill(unsigned char *p, size_t n, uint64_t seed) {
    for (size_t off = 0; off < n; off += 256 * KIB)
        fill_block(p + off, n - off < 256 * KIB ? n - off : 256 * KIB, seed + off);
}

static void zeros(const unsigned char *p, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0)
            die(what);
}

static void *reserve(size_t len) {
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        die("reserving");
    return p;
}

/* 1. */
#define V8_PAGES 96
#define V8_PAGE (256 * KIB)
static void v8_pages(void) {
    step = "V8's pages";
    unsigned char *pages[V8_PAGES];
    for (int i = 0; i < V8_PAGES; i++) {
        size_t want = V8_PAGE * 2 - PAGE;
        uintptr_t r = (uintptr_t)reserve(want);
        uintptr_t a = (r + V8_PAGE - 1) & ~(V8_PAGE - 1);
        if (a > r && munmap((void *)r, a - r) != 0)
            die("trimming the head");
        if (r + want > a + V8_PAGE && munmap((void *)(a + V8_PAGE), r + want - a - V8_PAGE))
            die("trimming the tail");
        if (mprotect((void *)a, V8_PAGE, PROT_READ | PROT_WRITE) != 0)
            die("committing");
        pages[i] = (unsigned char *)a;
        fill(pages[i], V8_PAGE, 1000 + i);
    }
    for (int i = 0; i < V8_PAGES; i += 3) {
        if (mprotect(pages[i], V8_PAGE, PROT_NONE) != 0 ||
            madvise(pages[i], V8_PAGE, MADV_DONTNEED) != 0)
            die("decommitting");
        if (mprotect(pages[i], V8_PAGE, PROT_READ | PROT_WRITE) != 0)
            die("committing again");
        zeros(pages[i], V8_PAGE, "a page committed again is not zeros");
        fill(pages[i], V8_PAGE, 5000 + i);
    }
    for (int i = 0; i < V8_PAGES; i++)
        check(pages[i], V8_PAGE, (i % 3 ? 1000 : 5000) + i, "a page lost its data");
    for (int i = 0; i < V8_PAGES; i++)
        if (munmap(pages[i], V8_PAGE) != 0)
            die("freeing a page");
}

/* 2. */
#define JVM_HEAP (1024 * MIB)
#define REGION (4 * MIB)
#define REGIONS 16
static unsigned char *jvm_heap(void) {
    step = "the JVM's heap";
    unsigned char *heap = reserve(JVM_HEAP);
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE;
    for (int i = 0; i < REGIONS; i++) {
        unsigned char *r = heap + (size_t)i * 2 * REGION; /* every other region */
        if (mmap(r, REGION, PROT_READ | PROT_WRITE, flags, -1, 0) != r)
            die("committing a region");
        fill(r, REGION, 9000 + i);
    }
    for (int i = 0; i < REGIONS; i += 4) {
        unsigned char *r = heap + (size_t)i * 2 * REGION;
        if (mmap(r, REGION, PROT_NONE, flags, -1, 0) != r)
            die("decommitting a region");
        if (mmap(r, REGION, PROT_READ | PROT_WRITE, flags, -1, 0) != r)
            die("committing a region again");
        zeros(r, REGION, "a region committed again is not zeros");
        fill(r, REGION, 20000 + i);
    }
    for (int i = 0; i < REGIONS; i++)
        check(heap + (size_t)i * 2 * REGION, REGION, (i % 4 ? 9000 : 20000) + i,
              "a region lost its data");
    return heap;
}

/* 3. */
struct churn {
    unsigned char *p;
    size_t n;
    uint64_t seed;
    volatile int *stop;
};

static void *churn(void *arg) {
    struct churn *c = arg;
    for (uint64_t round = 0; !*c->stop; round++) {
        fill(c->p, c->n, c->seed + round);
        check(c->p, c->n, c->seed + round, "a churning thread lost its data");
    }
    return NULL;
}

static void unreadable_while_evicting(unsigned char *heap) {
    step = "unreadable data under eviction";
    volatile int stop = 0;
    struct churn c[2];
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        /* The odd regions of the heap: committed now, far from the even ones. */
        unsigned char *r = heap + (size_t)(2 * i + 1) * REGION;
        if (mmap(r, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                 -1, 0) != r)
            die("committing a churn region");
        c[i] = (struct churn){r, REGION, 77000 + (uint64_t)i * 1000, &stop};
        if (pthread_create(&t[i], NULL, churn, &c[i]) != 0)
            die("starting a thread");
    }
    for (int k = 0; k < 8; k++) {
        for (int i = 0; i < REGIONS; i += 2) {
            unsigned char *r = heap + (size_t)i * 2 * REGION;
            if (mprotect(r, REGION, PROT_NONE) != 0)
                die("protecting");
        }
        usleep(20000);
        for (int i = 0; i < REGIONS; i += 2) {
            unsigned char *r = heap + (size_t)i * 2 * REGION;
            if (mprotect(r, REGION, PROT_READ | PROT_WRITE) != 0)
                die("unprotecting");
            check(r, REGION, (i % 4 ? 9000 : 20000) + i, "data made unreadable was lost");
        }
    }
    stop = 1;
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
}

/* 4. */
static sigjmp_buf segv_jump;
static void on_segv(int sig) {
    (void)sig;
    siglongjmp(segv_jump, 1);
}

static void reserved_is_inaccessible(unsigned char *heap) {
    step = "touching reserved memory";
    struct sigaction sa = {0}, old;
    sa.sa_handler = on_segv;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &old) != 0)
        die("sigaction");
    volatile unsigned char *never = heap + JVM_HEAP - PAGE; /* never committed */
    int faulted = sigsetjmp(segv_jump, 1);
    if (!faulted) {
        (void)*never;
        die("reading reserved memory did not fault");
    }
    sigaction(SIGSEGV, &old, NULL);
}

/* 5. */
static void private_file_mappings(const char *dir, unsigned char *heap) {
    step = "private file mappings at fixed addresses";
    char path[4096];
    snprintf(path, sizeof path, "%s/reserve-file-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0)
        die("mkstemp");
    unlink(path);
    size_t n = 3 * 64 * KIB + 100; /* not a page multiple: the rest of its page reads zeros */
    unsigned char *buf = malloc(n);
    fill_block(buf, n, 4242);
    if (write(fd, buf, n) != (ssize_t)n)
        die("writing the file");
    unsigned char *committed = heap + 3 * REGION; /* committed in step 3 */
    unsigned char *fresh = reserve(256 * MIB);
    unsigned char *targets[2] = {committed, fresh};
    for (int i = 0; i < 2; i++) {
        unsigned char *p = targets[i];
        if (mmap(p, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0) != p)
            die(i ? "mapping into a fresh reservation" : "mapping over committed memory");
        if (memcmp(p, buf, n) != 0)
            die("a mapped file reads wrong");
        zeros(p + n, PAGE - n % PAGE, "past the end of the file is not zeros");
        memset(p, 0x5a, 4096); /* private: the file keeps its bytes */
    }
    unsigned char back[4096];
    if (pread(fd, back, sizeof back, 0) != (ssize_t)sizeof back || memcmp(back, buf, 4096))
        die("a private mapping's write reached the file");
    if (munmap(fresh, 256 * MIB) != 0)
        die("unmapping the fresh reservation");
    close(fd);
    free(buf);
}

/* 6. */
static void placed_reservation(void) {
    step = "a reservation placed by design";
    void *want = (void *)(5UL << 40);
    void *p = mmap(want, 64 * MIB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                   0);
    if (p != want)
        die("not placed where asked");
    if (mprotect(p, MIB, PROT_READ | PROT_WRITE) != 0)
        die("committing");
    fill(p, MIB, 31337);
    check(p, MIB, 31337, "lost data");
    if (munmap(p, 64 * MIB) != 0)
        die("munmap");
}

/* 7. */
#define RINGS 24
#define RING (64 * KIB)
static int memfd(size_t len) {
    int fd = (int)syscall(SYS_memfd_create, "reserve-ring", 0);
    if (fd < 0)
        die("memfd_create");
    if (ftruncate(fd, (off_t)len) != 0)
        die("ftruncate");
    return fd;
}

static void shared_views_in_small_reservations(const char *dir, unsigned char *heap) {
    step = "shared mappings in small reservations";
    volatile int stop = 0;
    struct churn c = {heap + 3 * REGION, REGION, 88000, &stop};
    pthread_t t;
    if (pthread_create(&t, NULL, churn, &c) != 0)
        die("starting a thread");
    unsigned char *rings[RINGS];
    unsigned char *bufs[RINGS]; /* ordinary far memory between the rings */
    for (int i = 0; i < RINGS; i++) {
        bufs[i] = malloc(3 * RING);
        fill(bufs[i], 3 * RING, 123000 + i);
        unsigned char *r = reserve(2 * RING);
        int fd = memfd(RING);
        const int fl = MAP_SHARED | MAP_FIXED;
        if (mmap(r, RING, PROT_READ | PROT_WRITE, fl, fd, 0) != r ||
            mmap(r + RING, RING, PROT_READ | PROT_WRITE, fl, fd, 0) != r + RING)
            die("mapping a ring's views");
        close(fd);
        /* A message across the wrap: written through the first view's end, read through
         * the second view's start. */
        fill(r + RING - 8 * KIB, 16 * KIB, 456000 + i);
        check(r + RING - 8 * KIB, 16 * KIB, 456000 + i, "a ring's message reads wrong");
        rings[i] = r;
    }
    for (int i = 0; i < RINGS; i++) {
        unsigned char *r = rings[i];
        check(r + RING - 8 * KIB, 16 * KIB, 456000 + i, "a ring lost its message");
        if (memcmp(r, r + RING, RING) != 0)
            die("a ring's two views differ");
        check(bufs[i], 3 * RING, 123000 + i, "far memory beside a ring lost its data");
    }
    /* A double mapping: a writable view and a read-only executable one of one file (a
     * regular file: the userfaultfd cannot take it, as it can take memfd's memory). */
    unsigned char *d = reserve(4 * RING);
    char path[4096];
    snprintf(path, sizeof path, "%s/reserve-views-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0 || ftruncate(fd, RING) != 0)
        die("making the views' file");
    unlink(path);
    if (mmap(d, RING, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != d ||
        mmap(d + 2 * RING, RING, PROT_READ | PROT_EXEC, MAP_SHARED | MAP_FIXED, fd, 0) !=
            d + 2 * RING)
        die("mapping the double views");
    close(fd);
    fill(d, RING, 777000);
    check(d + 2 * RING, RING, 777000, "the executable view does not show the writes");
    if (mprotect(d + 2 * RING, RING, PROT_READ) != 0)
        die("mprotect of a shared view");
    /* A forked child keeps far memory and the rings: it reads both, and its writes to a
     * ring (shared memory) reach the parent. */
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        for (int i = 0; i < RINGS; i++) {
            check(rings[i] + RING - 8 * KIB, 16 * KIB, 456000 + i, "the child's ring differs");
            check(bufs[i], 3 * RING, 123000 + i, "the child's far memory differs");
            fill(rings[i], 4 * KIB, 654000 + i);
        }
        check(d + 2 * RING, RING, 777000, "the child's view of a file differs");
        _exit(0);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("the forked child failed");
    for (int i = 0; i < RINGS; i++)
        check(rings[i] + RING, 4 * KIB, 654000 + i, "the child's write to a ring is not seen");
    /* Released: half the rings unmapped, the others replaced by an anonymous reservation
     * (as allocators release and keep the address space); then all used as heap. */
    const int anon = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE;
    for (int i = 0; i < RINGS; i++) {
        if (i % 2 == 0) {
            if (munmap(rings[i], 2 * RING) != 0)
                die("unmapping a ring");
            rings[i] = reserve(2 * RING);
        } else if (mmap(rings[i], 2 * RING, PROT_NONE, anon, -1, 0) != rings[i]) {
            die("replacing a ring by a reservation");
        }
        if (mprotect(rings[i], 2 * RING, PROT_READ | PROT_WRITE) != 0)
            die("committing a ring's address space");
        zeros(rings[i], 2 * RING, "memory committed where a ring was is not zeros");
        fill(rings[i], 2 * RING, 999000 + i);
    }
    if (munmap(d, 4 * RING) != 0)
        die("unmapping the double views");
    stop = 1;
    pthread_join(t, NULL);
    for (int i = 0; i < RINGS; i++) {
        check(rings[i], 2 * RING, 999000 + i, "heap where a ring was lost its data");
        check(bufs[i], 3 * RING, 123000 + i, "far memory beside a ring lost its data");
        if (munmap(rings[i], 2 * RING) != 0)
            die("unmapping");
        free(bufs[i]);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: reserve DIR\n");
        return 2;
    }
    v8_pages();
    unsigned char *heap = jvm_heap();
    unreadable_while_evicting(heap);
    reserved_is_inaccessible(heap);
    private_file_mappings(argv[1], heap);
    placed_reservation();
    shared_views_in_small_reservations(argv[1], heap);
    step = "freeing the heap";
    if (munmap(heap, JVM_HEAP) != 0)
        die("munmap");
    printf("ok\n");
    return 0;
}
