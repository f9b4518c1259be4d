/* Concurrent allocation under `farmem run`.
 *
 * NTHREADS threads each keep a set of live blocks and, in random order, allocate (malloc,
 * calloc, realloc(NULL), posix_memalign, aligned_alloc, memalign, valloc), reallocate
 * (growing and shrinking), free, and pass blocks to other threads to free. Sizes range from
 * 16 bytes to 4 MiB (or 2^MAX_SIZE_LOG2), log-uniform. Every block carries a pattern over its whole usable size
 * (malloc_usable_size), verified before it is reallocated or freed; calloc memory must read
 * as zeros, alignments must hold, and realloc must keep the old contents.
 *
 * Exit status 0 on success; otherwise a message on stderr and a non-zero status.
 * Usage: threads NTHREADS OPS_PER_THREAD [MAX_SIZE_LOG2 (default 22: 4 MiB)]
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pattern.h"

#define SLOTS 40
#define SHARED 64

struct blk {
    unsigned char *p;
    size_t req;    /* size asked for */
    size_t usable; /* malloc_usable_size, filled with the pattern */
    uint64_t seed;
};

static int nthreads, nops;
static unsigned max_log = 22;
static size_t max_size = (size_t)1 << 22;
static atomic_int failed;

/* Blocks handed from one thread to another, freed by whoever takes them. */
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static struct blk shared[SHARED];

struct rng {
    uint64_t s;
};
static uint64_t rnd(struct rng *r) { return mix(r->s++); }

/* First differing offset among the first n bytes of a block patterned over `total` bytes
 * (n <= total; when n < total only whole words are compared), or -1. */
static long check(const unsigned char *p, size_t n, size_t total, uint64_t seed) {
    size_t nw = n / 8;
    const uint64_t *w = (const uint64_t *)p;
    for (size_t i = 0; i < nw; i++)
        if (w[i] != seed + i * 0x9e3779b97f4a7c15ULL)
            return (long)(i * 8);
    if (n < total)
        return -1;
    for (size_t i = nw * 8; i < n; i++)
        if (p[i] != ((unsigned char)(seed >> (8 * (i & 7))) ^ (unsigned char)i))
            return (long)i;
    return -1;
}

static int fail(int tid, const char *what, const struct blk *b, long off) {
    if (atomic_fetch_add(&failed, 1) == 0) {
        fprintf(stderr, "threads[%d]: %s: block %p, %zu bytes requested, %zu usable", tid, what,
                (void *)(b ? b->p : NULL), b ? b->req : 0, b ? b->usable : 0);
        if (off >= 0)
            fprintf(stderr, ", first bad byte at offset %ld (word %#" PRIx64 ")", off,
                    *(const uint64_t *)(b->p + (off & ~7L)));
        fprintf(stderr, "\n");
    }
    return 1;
}

static size_t random_size(struct rng *r) {
    unsigned e = 4 + rnd(r) % (max_log - 3); /* 16 B .. max_size, log-uniform */
    size_t n = ((size_t)1 << e) + rnd(r) % ((size_t)1 << e);
    return n > max_size ? max_size : n;
}

/* Allocate a block by a random member of the malloc family; 0 on success. */
static int alloc_block(int tid, struct rng *r, struct blk *b) {
    size_t n = random_size(r);
    size_t align = 16;
    unsigned char *p = NULL;
    int zero = 0;
    switch (rnd(r) % 8) {
    case 0:
    case 1:
        p = malloc(n);
        break;
    case 2: {
        size_t k = 1 + rnd(r) % 16;
        n = (n + k - 1) / k * k;
        p = calloc(k, n / k);
        zero = 1;
        break;
    }
    case 3:
        p = realloc(NULL, n);
        break;
    case 4: {
        void *q = NULL;
        align = (size_t)8 << (rnd(r) % 16); /* 8 B .. 256 KiB */
        int rc = posix_memalign(&q, align, n);
        if (rc != 0) {
            fprintf(stderr, "threads[%d]: posix_memalign(%zu, %zu) = %d\n", tid, align, n, rc);
            atomic_fetch_add(&failed, 1);
            return 1;
        }
        p = q;
        break;
    }
    case 5:
        align = (size_t)16 << (rnd(r) % 18); /* 16 B .. 2 MiB */
        n = (n + align - 1) / align * align;
        p = aligned_alloc(align, n);
        break;
    case 6:
        align = (size_t)32 << (rnd(r) % 10);
        p = memalign(align, n);
        break;
    default:
        align = 4096;
        p = valloc(n);
        break;
    }
    b->p = p;
    b->req = n;
    b->usable = 0;
    if (!p)
        return fail(tid, "allocation returned NULL", b, -1);
    if ((uintptr_t)p % align)
        return fail(tid, "misaligned block", b, -1);
    b->usable = malloc_usable_size(p);
    if (b->usable < n)
        return fail(tid, "malloc_usable_size smaller than requested", b, -1);
    if (zero) {
        const uint64_t *w = (const uint64_t *)p;
        for (size_t i = 0; i < n / 8; i++)
            if (w[i] != 0)
                return fail(tid, "calloc memory not zero", b, (long)(i * 8));
        for (size_t i = n / 8 * 8; i < n; i++)
            if (p[i] != 0)
                return fail(tid, "calloc memory not zero", b, (long)i);
    }
    b->seed = rnd(r);
    fill_block(p, b->usable, b->seed);
    return 0;
}

static int verify(int tid, const struct blk *b, const char *when) {
    long off = check(b->p, b->usable, b->usable, b->seed);
    if (off >= 0)
        return fail(tid, when, b, off);
    return 0;
}

static int realloc_block(int tid, struct rng *r, struct blk *b) {
    if (verify(tid, b, "pattern broken before realloc"))
        return 1;
    size_t n;
    switch (rnd(r) % 3) {
    case 0: /* grow */
        n = b->req + 1 + rnd(r) % (b->req * 2 + 64);
        if (n > max_size)
            n = max_size;
        break;
    case 1: /* shrink */
        n = 1 + rnd(r) % b->req;
        break;
    default:
        n = random_size(r);
    }
    unsigned char *q = realloc(b->p, n);
    if (!q)
        return fail(tid, "realloc returned NULL", b, -1);
    size_t keep = n < b->req ? n : b->req;
    struct blk nb = {q, n, 0, b->seed};
    long off = check(q, keep, b->usable, b->seed);
    if (off >= 0) {
        fprintf(stderr, "threads[%d]: realloc from %zu to %zu bytes\n", tid, b->req, n);
        return fail(tid, "realloc lost contents", &nb, off);
    }
    nb.usable = malloc_usable_size(q);
    if (nb.usable < n)
        return fail(tid, "malloc_usable_size smaller than requested after realloc", &nb, -1);
    nb.seed = rnd(r);
    fill_block(q, nb.usable, nb.seed);
    *b = nb;
    return 0;
}

static void *worker(void *arg) {
    int tid = (int)(intptr_t)arg;
    struct rng r = {mix(0x1000 + tid)};
    struct blk slots[SLOTS];
    memset(slots, 0, sizeof slots);
    for (int op = 0; op < nops && !atomic_load(&failed); op++) {
        struct blk *b = &slots[rnd(&r) % SLOTS];
        if (!b->p) {
            if (alloc_block(tid, &r, b))
                break;
            continue;
        }
        unsigned k = rnd(&r) % 10;
        if (k < 4) {
            if (realloc_block(tid, &r, b))
                break;
        } else if (k < 8) {
            if (verify(tid, b, "pattern broken before free"))
                break;
            if (k == 7 && b->req < 4096 && rnd(&r) % 2) {
                /* realloc(p, 0) frees (glibc) */
                if (realloc(b->p, 0) != NULL) {
                    fail(tid, "realloc(p, 0) returned a block", b, -1);
                    break;
                }
            } else {
                free(b->p);
            }
            b->p = NULL;
        } else {
            /* Swap with the shared pool: our block goes to another thread, which frees it. */
            if (verify(tid, b, "pattern broken before handing over"))
                break;
            pthread_mutex_lock(&shared_lock);
            struct blk *s = &shared[rnd(&r) % SHARED];
            struct blk mine = *b;
            *b = *s;
            *s = mine;
            pthread_mutex_unlock(&shared_lock);
            if (b->p) {
                if (verify(tid, b, "pattern broken in a block from another thread"))
                    break;
                free(b->p);
                b->p = NULL;
            }
        }
        free(NULL);
    }
    for (int i = 0; i < SLOTS; i++)
        if (slots[i].p) {
            if (!atomic_load(&failed))
                verify(tid, &slots[i], "pattern broken at the end");
            free(slots[i].p);
        }
    return NULL;
}

int main(int argc, char **argv) {
    nthreads = argc > 1 ? atoi(argv[1]) : 8;
    nops = argc > 2 ? atoi(argv[2]) : 1000;
    if (argc > 3) {
        max_log = (unsigned)atoi(argv[3]);
        if (max_log < 5 || max_log > 26) {
            fprintf(stderr, "threads: MAX_SIZE_LOG2 in 5..26\n");
            return 2;
        }
        max_size = (size_t)1 << max_log;
    }
    pthread_t t[64];
    if (nthreads < 1 || nthreads > 64) {
        fprintf(stderr, "threads: 1..64 threads\n");
        return 2;
    }
    for (int i = 0; i < nthreads; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i) != 0) {
            fprintf(stderr, "threads: pthread_create failed\n");
            return 2;
        }
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < SHARED; i++)
        if (shared[i].p) {
            if (!atomic_load(&failed))
                verify(-1, &shared[i], "pattern broken in the shared pool at the end");
            free(shared[i].p);
        }
    if (atomic_load(&failed))
        return 1;
    return 0;
}
