/* fork() without exec under `farmem run`.
 *
 * The parent builds a heap much larger than the local budget (blocks of many sizes from
 * malloc, calloc, realloc and posix_memalign, some freed again to leave holes, plus one large
 * anonymous mmap), writes a pattern into all of it and reads it back, so that most of it is
 * evicted. Then it forks:
 *   - the parent rewrites some blocks (version 1) and tells the child;
 *   - the child verifies ALL of the heap with the original pattern (the parent's later
 *     writes must not show), rewrites other blocks (version 2), tells the parent, and checks
 *     its own writes;
 *   - the parent verifies its whole heap (its writes, not the child's), then waits for the
 *     child and checks that it exited 0.
 * `nested` mode also makes the child allocate, reallocate and free memory after the fork,
 * fork a grandchild that verifies the child's view and writes (version 3) without affecting
 * the child, and makes the parent fork a second child after the first one is gone.
 *
 * Exit status 0 on success; otherwise a message on stderr and a non-zero status.
 * Usage: fork simple|nested [MiB]   (heap size, default 256: 3/4 malloc, 1/4 one mmap)
 * On success the parent prints one line (blocks and bytes verified) on stdout.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pattern.h"

#define MIB (1024UL * 1024UL)
#define MMAP_PIECE (1 * MIB)
#define MAX_BLOCKS 32768

static size_t MALLOC_TOTAL = 192 * MIB;
static size_t MMAP_TOTAL = 64 * MIB;

enum { K_MALLOC, K_MMAP };

struct blk {
    unsigned char *p;
    size_t n;
    int kind;
    int live;
};

static struct blk blocks[MAX_BLOCKS];
static int nblocks;
static const char *who = "parent";

static uint64_t rng_state = 12345;
static uint64_t rnd(void) { return mix(rng_state++); }

static uint64_t seed_of(int i, int version) { return mix((uint64_t)i * 16 + (uint64_t)version + 1); }

/* Offset of the first byte that differs from the pattern, or -1. */
static long check(const unsigned char *p, size_t n, uint64_t seed) {
    size_t nw = n / 8;
    const uint64_t *w = (const uint64_t *)p;
    for (size_t i = 0; i < nw; i++)
        if (w[i] != seed + i * 0x9e3779b97f4a7c15ULL)
            return (long)(i * 8);
    for (size_t i = nw * 8; i < n; i++)
        if (p[i] != ((unsigned char)(seed >> (8 * (i & 7))) ^ (unsigned char)i))
            return (long)i;
    return -1;
}

/* fork() timed: its cost goes to stderr as "fork-us N" (what `farmem bench programs`
 * reports next to the native time). */
static pid_t timed_fork(void) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pid_t pid = fork();
    if (pid > 0) {
        clock_gettime(CLOCK_MONOTONIC, &b);
        fprintf(stderr, "fork-us %ld\n",
                (long)((b.tv_sec - a.tv_sec) * 1000000 + (b.tv_nsec - a.tv_nsec) / 1000));
    }
    return pid;
}

static void die(const char *what) {
    fprintf(stderr, "fork[%s pid %d]: %s (errno %d: %s)\n", who, (int)getpid(), what, errno,
            strerror(errno));
    _exit(3);
}

/* Which version of block i this process should see: view bit v means "version v was written
 * here (by this process or an ancestor before the fork)"; the highest applicable wins. */
static int expected_version(int i, unsigned view) {
    int v = 0;
    if ((view & 2) && i % 5 == 1)
        v = 1;
    if ((view & 4) && i % 3 == 2)
        v = 2;
    if ((view & 8) && i % 4 == 3)
        v = 3;
    return v;
}

static int verify_all(const char *when, unsigned view) {
    for (int i = 0; i < nblocks; i++) {
        if (!blocks[i].live)
            continue;
        int v = expected_version(i, view);
        long off = check(blocks[i].p, blocks[i].n, seed_of(i, v));
        if (off >= 0) {
            const uint64_t *w = (const uint64_t *)(blocks[i].p + (off & ~7L));
            fprintf(stderr,
                    "fork[%s pid %d]: MISMATCH %s: block %d (%s, %zu bytes at %p) version %d, "
                    "offset %ld: word %#" PRIx64 "\n",
                    who, (int)getpid(), when, i, blocks[i].kind == K_MMAP ? "mmap" : "malloc",
                    blocks[i].n, (void *)blocks[i].p, v, off, (uint64_t)*w);
            return 1;
        }
    }
    return 0;
}

static void write_version(int version) {
    for (int i = 0; i < nblocks; i++)
        if (blocks[i].live && expected_version(i, 1u << version) == version)
            fill_block(blocks[i].p, blocks[i].n, seed_of(i, version));
}

static size_t random_size(void) {
    uint64_t r = rnd();
    switch (r % 10) {
    case 0: /* large: direct, page-granular blocks */
        return 256 * 1024 + (rnd() % (4 * MIB));
    case 1:
    case 2: /* medium */
        return 4096 + rnd() % (256 * 1024);
    default: /* small, not a multiple of 8 half of the time */
        return 1 + rnd() % 4096;
    }
}

static void build_heap(void) {
    size_t total = 0;
    while (total < MALLOC_TOTAL && nblocks < MAX_BLOCKS - (int)(MMAP_TOTAL / MMAP_PIECE)) {
        size_t n = random_size();
        unsigned char *p = NULL;
        switch (rnd() % 6) {
        case 0:
            p = calloc(1, n);
            if (p) {
                for (size_t j = 0; j < n; j += 511)
                    if (p[j] != 0) {
                        fprintf(stderr, "fork: calloc(%zu) not zero at %zu\n", n, j);
                        exit(4);
                    }
            }
            break;
        case 1: { /* grow a smaller block into this one */
            p = malloc(n / 3 + 1);
            if (p) {
                memset(p, 0xab, n / 3 + 1);
                unsigned char *q = realloc(p, n);
                if (!q)
                    die("realloc");
                for (size_t j = 0; j < n / 3 + 1; j++)
                    if (q[j] != 0xab) {
                        fprintf(stderr, "fork: realloc lost byte %zu of %zu\n", j, n / 3 + 1);
                        exit(4);
                    }
                p = q;
            }
            break;
        }
        case 2: {
            void *q = NULL;
            size_t align = (size_t)64 << (rnd() % 8); /* 64 .. 8192 */
            if (posix_memalign(&q, align, n) != 0)
                die("posix_memalign");
            if ((uintptr_t)q % align) {
                fprintf(stderr, "fork: posix_memalign(%zu) gave %p\n", align, q);
                exit(4);
            }
            p = q;
            break;
        }
        default:
            p = malloc(n);
        }
        if (!p)
            die("allocation failed");
        blocks[nblocks].p = p;
        blocks[nblocks].n = n;
        blocks[nblocks].kind = K_MALLOC;
        blocks[nblocks].live = 1;
        nblocks++;
        total += n;
    }
    unsigned char *m =
        mmap(NULL, MMAP_TOTAL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        die("mmap");
    for (size_t off = 0; off < MMAP_TOTAL; off += MMAP_PIECE) {
        blocks[nblocks].p = m + off;
        blocks[nblocks].n = MMAP_PIECE;
        blocks[nblocks].kind = K_MMAP;
        blocks[nblocks].live = 1;
        nblocks++;
    }
    for (int i = 0; i < nblocks; i++)
        fill_block(blocks[i].p, blocks[i].n, seed_of(i, 0));
    /* Holes: free every 7th malloc'ed block (never verified again). */
    for (int i = 0; i < nblocks; i += 7)
        if (blocks[i].kind == K_MALLOC) {
            free(blocks[i].p);
            blocks[i].live = 0;
        }
}

/* Allocation traffic in a process whose memory is now ordinary (a forked child). */
static int churn(const char *tag) {
    enum { N = 512 };
    static unsigned char *p[N];
    static size_t n[N];
    for (int i = 0; i < N; i++) {
        n[i] = random_size() / 2 + 1;
        p[i] = malloc(n[i]);
        if (!p[i])
            die("malloc in child");
        fill_block(p[i], n[i], mix(1000000 + i));
    }
    for (int i = 0; i < N; i += 2) { /* grow and shrink */
        size_t m = (i % 4 == 0) ? n[i] * 3 + 100 : n[i] / 2 + 1;
        unsigned char *q = realloc(p[i], m);
        if (!q)
            die("realloc in child");
        /* A shorter prefix is compared in whole words (the pattern's tail bytes depend on
         * the length). */
        size_t keep = m < n[i] ? m & ~(size_t)7 : n[i];
        if (check(q, keep, mix(1000000 + i)) >= 0) {
            fprintf(stderr, "fork[%s]: realloc after fork lost data (block %d)\n", tag, i);
            return 1;
        }
        p[i] = q;
        n[i] = m;
        fill_block(p[i], n[i], mix(1000000 + i));
    }
    for (int i = 0; i < N; i++) {
        if (check(p[i], n[i], mix(1000000 + i)) >= 0) {
            fprintf(stderr, "fork[%s]: MISMATCH in a block allocated after fork (%d)\n", tag, i);
            return 1;
        }
        if (i % 3)
            free(p[i]);
    }
    for (int i = 0; i < N; i += 3)
        free(p[i]);
    return 0;
}

static void send_byte(int fd) {
    char c = 'x';
    if (write(fd, &c, 1) != 1)
        die("pipe write");
}

static void wait_byte(int fd) {
    char c;
    ssize_t r;
    do
        r = read(fd, &c, 1);
    while (r < 0 && errno == EINTR);
    if (r != 1)
        die("pipe read (the other side died?)");
}

static int wait_ok(pid_t pid, const char *what) {
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            die("waitpid");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "fork[%s]: %s failed: %s %d\n", who, what,
                WIFEXITED(st) ? "exit status" : "signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        return 1;
    }
    return 0;
}

static int grandchild(void) {
    who = "grandchild";
    if (verify_all("grandchild, right after the fork", 4))
        return 1;
    if (churn("grandchild"))
        return 1;
    write_version(3);
    return verify_all("grandchild, after its own writes", 4 | 8);
}

static int child(int from_parent, int to_parent, int nested) {
    who = "child";
    wait_byte(from_parent); /* the parent has written version 1 by now */
    if (verify_all("child, after the parent's writes", 0))
        return 1;
    write_version(2);
    send_byte(to_parent);
    if (verify_all("child, after its own writes", 4))
        return 1;
    if (!nested)
        return 0;
    if (churn("child"))
        return 1;
    pid_t g = fork();
    if (g < 0)
        die("fork (grandchild)");
    if (g == 0)
        exit(grandchild());
    if (wait_ok(g, "the grandchild"))
        return 1;
    if (churn("child, second round"))
        return 1;
    return verify_all("child, after the grandchild", 4);
}

int main(int argc, char **argv) {
    int nested = argc > 1 && strcmp(argv[1], "nested") == 0;
    if (argc > 2) {
        size_t mib = strtoul(argv[2], NULL, 10);
        if (mib < 4 || mib > 16384) {
            fprintf(stderr, "fork: heap size %s MiB out of range (4..16384)\n", argv[2]);
            return 2;
        }
        MMAP_TOTAL = mib / 4 * MIB;
        MALLOC_TOTAL = mib * MIB - MMAP_TOTAL;
    }
    build_heap();
    /* A full read pass: the whole heap cycles through the budget again. */
    if (verify_all("before the fork", 0))
        return 1;

    int p2c[2], c2p[2];
    if (pipe(p2c) || pipe(c2p))
        die("pipe");
    pid_t pid = timed_fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        close(p2c[1]);
        close(c2p[0]);
        exit(child(p2c[0], c2p[1], nested));
    }
    close(p2c[0]);
    close(c2p[1]);
    write_version(1);
    send_byte(p2c[1]);
    wait_byte(c2p[0]); /* the child has written version 2 */
    if (verify_all("parent, while the child runs", 2))
        return 1;
    if (wait_ok(pid, "the child"))
        return 1;
    if (verify_all("parent, after the child exited", 2))
        return 1;
    if (nested) {
        /* A second fork, after reclaim has resumed and evicted again. */
        pid_t p2 = timed_fork();
        if (p2 < 0)
            die("fork (second child)");
        if (p2 == 0) {
            who = "second child";
            exit(verify_all("second child", 2) || churn("second child"));
        }
        if (wait_ok(p2, "the second child"))
            return 1;
        if (verify_all("parent, at the end", 2))
            return 1;
    }
    size_t bytes = 0;
    int live = 0;
    for (int i = 0; i < nblocks; i++)
        if (blocks[i].live) {
            bytes += blocks[i].n;
            live++;
        }
    printf("fork: %d blocks, %zu bytes verified in parent and child\n", live, bytes);
    return 0;
}
