/* The mmap family under `farmem run`, with mappings larger than the budget.
 *
 *  1. anonymous mmap, filled and verified (most of it evicted on the way);
 *  2. mremap: grow with MREMAP_MAYMOVE (old contents kept, new part zero), shrink, grow
 *     again (the part dropped by the shrink must come back as zeros), grow without
 *     MREMAP_MAYMOVE (may fail with ENOMEM; if it succeeds the contents are kept);
 *  3. madvise(MADV_DONTNEED) of ranges of evicted and resident pages reads back as zeros,
 *     the rest of the mapping intact;
 *  4. partial munmap (middle, head, tail) of a larger mapping: the remaining parts intact,
 *     also after new mappings are made and written;
 *  5. file-backed mappings of a temporary file: MAP_SHARED writes reach the file (read back
 *     with read() into an evicted anonymous mapping), MAP_PRIVATE writes do not;
 *  6. double munmap is harmless: both return 0, and two new mappings do not overlap;
 *  7. a PROT_NONE reservation made accessible with mprotect; mappings of odd lengths;
 *     munmap of an unaligned address fails with EINVAL;
 *  8. many small mappings made and unmapped in random order, verified.
 *
 * Exit status 0 on success; otherwise a message on stderr and a non-zero status.
 * Usage: mmap DIR (where to make the temporary file)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pattern.h"

#define MIB (1024UL * 1024UL)
#define PAGE 4096UL

static const char *step = "start";

/* The pattern is a function of the word's offset from the start of the mapping, so that a
 * subrange can be checked on its own. */
static void fill(unsigned char *base, size_t from, size_t to, uint64_t seed) {
    uint64_t *w = (uint64_t *)base;
    for (size_t i = from / 8; i < to / 8; i++)
        w[i] = seed ^ mix(i);
}

static void fail(const char *what, const void *base, size_t off, uint64_t got, uint64_t want) {
    fprintf(stderr,
            "mmap [%s]: MISMATCH %s: mapping %p offset %zu: word %#" PRIx64 ", expected %#" PRIx64
            "\n",
            step, what, base, off, got, want);
    exit(1);
}

static void die(const char *what) {
    fprintf(stderr, "mmap [%s]: %s failed: %s\n", step, what, strerror(errno));
    exit(2);
}

static void check(const unsigned char *base, size_t from, size_t to, uint64_t seed) {
    const uint64_t *w = (const uint64_t *)base;
    for (size_t i = from / 8; i < to / 8; i++)
        if (w[i] != (seed ^ mix(i)))
            fail("pattern", base, i * 8, w[i], seed ^ mix(i));
}

static void check_zero(const unsigned char *base, size_t from, size_t to) {
    const uint64_t *w = (const uint64_t *)base;
    for (size_t i = from / 8; i < to / 8; i++)
        if (w[i] != 0)
            fail("expected zeros", base, i * 8, w[i], 0);
}

static unsigned char *map_anon(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        die("mmap");
    return p;
}

/* Push everything else out of local memory: write and drop a mapping twice the budget. */
static void churn(size_t len) {
    unsigned char *p = map_anon(len);
    fill(p, 0, len, 77);
    check(p, 0, len, 77);
    if (munmap(p, len))
        die("munmap (churn)");
}

static void test_mremap(void) {
    step = "mremap";
    size_t a = 64 * MIB;
    unsigned char *p = map_anon(a);
    check_zero(p, 0, a);
    fill(p, 0, a, 1);
    check(p, 0, a, 1);

    /* Grow, may move. */
    size_t b = 128 * MIB;
    unsigned char *q = mremap(p, a, b, MREMAP_MAYMOVE);
    if (q == MAP_FAILED)
        die("mremap grow");
    check(q, 0, a, 1);
    check_zero(q, a, b);
    fill(q, a, b, 1);
    check(q, 0, b, 1);

    /* Shrink, then grow again: the part dropped must read as zeros. */
    size_t c = 24 * MIB + 3 * PAGE;
    unsigned char *r = mremap(q, b, c, 0);
    if (r == MAP_FAILED)
        die("mremap shrink");
    if (r != q) {
        fprintf(stderr, "mmap [%s]: shrinking moved the mapping\n", step);
        exit(1);
    }
    churn(48 * MIB);
    check(r, 0, c, 1);
    size_t d = 80 * MIB;
    unsigned char *s = mremap(r, c, d, MREMAP_MAYMOVE);
    if (s == MAP_FAILED)
        die("mremap grow after shrink");
    check(s, 0, c, 1);
    check_zero(s, c, d);
    fill(s, c, d, 1);

    /* Grow in place only: either ENOMEM, or done with the contents kept. */
    size_t e = 96 * MIB;
    unsigned char *t = mremap(s, d, e, 0);
    if (t == MAP_FAILED) {
        if (errno != ENOMEM)
            die("mremap grow in place (expected ENOMEM or success)");
        e = d;
        t = s;
    } else {
        if (t != s) {
            fprintf(stderr, "mmap [%s]: mremap without MAYMOVE moved the mapping\n", step);
            exit(1);
        }
        check_zero(t, d, e);
        fill(t, d, e, 1);
    }
    check(t, 0, e, 1);
    if (munmap(t, e))
        die("munmap");
}

static void test_dontneed(void) {
    step = "madvise";
    size_t len = 64 * MIB;
    unsigned char *p = map_anon(len);
    fill(p, 0, len, 2);
    /* The start is evicted by now; the end is still resident. Drop a range of each, and
     * one that spans both, and single pages. */
    struct {
        size_t off, len;
    } drop[] = {
        {1 * MIB, 4 * MIB},
        {len - 2 * MIB, 1 * MIB},
        {20 * MIB + 5 * PAGE, 30 * MIB},
        {PAGE * 3, PAGE},
        {len - PAGE, PAGE},
    };
    size_t n = sizeof drop / sizeof drop[0];
    for (size_t i = 0; i < n; i++)
        if (madvise(p + drop[i].off, drop[i].len, MADV_DONTNEED))
            die("madvise(MADV_DONTNEED)");
    /* Walk the mapping in order: zeros in dropped ranges, the pattern elsewhere. */
    for (size_t off = 0; off < len; off += PAGE) {
        int dropped = 0;
        for (size_t i = 0; i < n; i++)
            if (off >= drop[i].off && off < drop[i].off + drop[i].len)
                dropped = 1;
        if (dropped)
            check_zero(p, off, off + PAGE);
        else
            check(p, off, off + PAGE, 2);
    }
    /* Dropped pages are usable again. */
    fill(p, 0, len, 3);
    churn(48 * MIB);
    check(p, 0, len, 3);
    if (munmap(p, len))
        die("munmap");

    /* The page-aligned middle of a large malloc'ed block (glibc would have mmap'ed it). */
    step = "madvise on malloc'ed memory";
    size_t blen = 24 * MIB;
    unsigned char *b = malloc(blen);
    if (!b)
        die("malloc");
    fill(b, 0, blen, 15);
    unsigned char *mid = (unsigned char *)(((uintptr_t)b + 4 * MIB) & ~(PAGE - 1));
    size_t moff = (size_t)(mid - b), mlen = 8 * MIB;
    if (madvise(mid, mlen, MADV_DONTNEED))
        die("madvise(MADV_DONTNEED) on malloc'ed memory");
    churn(48 * MIB);
    check(b, 0, moff, 15);
    check_zero(b, moff, moff + mlen);
    check(b, moff + mlen, blen, 15);
    free(b);
}

static void test_partial_munmap(void) {
    step = "partial munmap";
    size_t len = 48 * MIB;
    unsigned char *p = map_anon(len);
    fill(p, 0, len, 4);
    /* Middle, head and tail. */
    if (munmap(p + 16 * MIB, 8 * MIB))
        die("munmap middle");
    if (munmap(p, 2 * MIB))
        die("munmap head");
    if (munmap(p + len - 3 * MIB, 3 * MIB))
        die("munmap tail");
    /* New mappings must not land on the remaining parts. */
    unsigned char *n1 = map_anon(8 * MIB);
    unsigned char *n2 = map_anon(2 * MIB);
    check_zero(n1, 0, 8 * MIB);
    check_zero(n2, 0, 2 * MIB);
    fill(n1, 0, 8 * MIB, 5);
    fill(n2, 0, 2 * MIB, 6);
    churn(48 * MIB);
    check(p, 2 * MIB, 16 * MIB, 4);
    check(p, 24 * MIB, len - 3 * MIB, 4);
    check(n1, 0, 8 * MIB, 5);
    check(n2, 0, 2 * MIB, 6);
    if (munmap(p + 2 * MIB, 14 * MIB) || munmap(p + 24 * MIB, len - 27 * MIB))
        die("munmap rest");
    if (munmap(n1, 8 * MIB) || munmap(n2, 2 * MIB))
        die("munmap new");
}

static void test_file(const char *dir) {
    step = "file mapping";
    char path[4096];
    snprintf(path, sizeof path, "%s/mmap-test-%d", dir, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        die("open");
    size_t len = 24 * MIB;
    if (ftruncate(fd, (off_t)len))
        die("ftruncate");
    unsigned char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        die("mmap MAP_SHARED");
    fill(m, 0, len, 7);
    if (msync(m, len, MS_SYNC))
        die("msync");
    if (munmap(m, len))
        die("munmap file");

    /* Read the file with read() into anonymous memory that has been evicted meanwhile:
     * the kernel writes into far memory. */
    unsigned char *buf = map_anon(len);
    memset(buf, 0xee, len);
    churn(48 * MIB);
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, buf + got, len - got, (off_t)got);
        if (r <= 0)
            die("pread");
        got += (size_t)r;
    }
    check(buf, 0, len, 7);

    /* A private mapping: its writes stay in memory, the file is unchanged. */
    unsigned char *pm = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (pm == MAP_FAILED)
        die("mmap MAP_PRIVATE");
    check(pm, 0, len, 7);
    fill(pm, 0, len / 2, 8);
    churn(48 * MIB);
    check(pm, 0, len / 2, 8);
    check(pm, len / 2, len, 7);
    if (munmap(pm, len))
        die("munmap private");

    /* write() from evicted anonymous memory to the file, then map it again. */
    fill(buf, 0, len, 9);
    churn(48 * MIB);
    size_t put = 0;
    while (put < len) {
        ssize_t w = pwrite(fd, buf + put, len - put, (off_t)put);
        if (w <= 0)
            die("pwrite");
        put += (size_t)w;
    }
    unsigned char *m2 = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (m2 == MAP_FAILED)
        die("mmap again");
    check(m2, 0, len, 9);
    if (munmap(m2, len) || munmap(buf, len))
        die("munmap");
    close(fd);
    unlink(path);
}

static void test_double_munmap(void) {
    step = "double munmap";
    size_t len = 16 * MIB;
    unsigned char *p = map_anon(len);
    fill(p, 0, len, 10);
    if (munmap(p, len))
        die("munmap");
    if (munmap(p, len))
        die("second munmap of the same range");
    unsigned char *a = map_anon(len);
    unsigned char *b = map_anon(len);
    if (a < b + len && b < a + len) {
        fprintf(stderr, "mmap [%s]: two live mappings overlap: %p and %p\n", step, (void *)a,
                (void *)b);
        exit(1);
    }
    check_zero(a, 0, len);
    check_zero(b, 0, len);
    fill(a, 0, len, 11);
    fill(b, 0, len, 12);
    churn(48 * MIB);
    check(a, 0, len, 11);
    check(b, 0, len, 12);
    if (munmap(a, len) || munmap(b, len))
        die("munmap");
}

static void test_misc(void) {
    step = "PROT_NONE reservation";
    size_t len = 32 * MIB;
    unsigned char *r = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                            -1, 0);
    if (r == MAP_FAILED)
        die("mmap PROT_NONE");
    if (mprotect(r + 4 * MIB, 8 * MIB, PROT_READ | PROT_WRITE))
        die("mprotect");
    fill(r, 4 * MIB, 12 * MIB, 13);
    churn(48 * MIB);
    check(r, 4 * MIB, 12 * MIB, 13);
    if (munmap(r, len))
        die("munmap reservation");

    step = "odd lengths";
    size_t odd = 5 * MIB + 123;
    unsigned char *o = map_anon(odd);
    fill(o, 0, odd & ~7UL, 14);
    o[odd - 1] = 0x5a;
    churn(48 * MIB);
    check(o, 0, odd & ~7UL, 14);
    if (o[odd - 1] != 0x5a)
        fail("last byte", o, odd - 1, o[odd - 1], 0x5a);
    if (munmap(o, odd))
        die("munmap odd length");

    step = "unaligned munmap";
    unsigned char *u = map_anon(2 * PAGE);
    errno = 0;
    if (munmap(u + 1, PAGE) != -1 || errno != EINVAL) {
        fprintf(stderr, "mmap [%s]: munmap(p + 1) did not fail with EINVAL\n", step);
        exit(1);
    }
    if (munmap(u, 2 * PAGE))
        die("munmap");
}

static void test_many(void) {
    step = "many mappings";
    enum { N = 256 };
    static unsigned char *m[N];
    static size_t len[N];
    uint64_t rng = 5;
    for (int round = 0; round < 2048; round++) {
        int k = (int)(mix(rng++) % N);
        if (m[k]) {
            check(m[k], 0, len[k], mix(k * 100 + len[k]));
            if (munmap(m[k], len[k]))
                die("munmap");
        }
        len[k] = PAGE * (1 + mix(rng++) % 128);
        m[k] = map_anon(len[k]);
        check_zero(m[k], 0, len[k]);
        fill(m[k], 0, len[k], mix(k * 100 + len[k]));
    }
    for (int k = 0; k < N; k++)
        if (m[k]) {
            check(m[k], 0, len[k], mix(k * 100 + len[k]));
            if (munmap(m[k], len[k]))
                die("munmap");
        }
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    test_mremap();
    test_dontneed();
    test_partial_munmap();
    test_file(dir);
    test_double_munmap();
    test_misc();
    test_many();
    return 0;
}
