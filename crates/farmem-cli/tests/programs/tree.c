/* A process tree that needs more memory than its budget, under `farmem run`.
 *
 * The parent fills PARENT_MIB of heap with a pattern, then forks NCHILD workers without
 * exec. Each worker verifies the parent's data once (copy-on-write pages it shares), then
 * allocates CHILD_MIB of its own, fills it, and makes PASSES passes that verify every block
 * and rewrite it with the next version. While the workers run, the parent measures the
 * tree's memory every 5 ms: the sum of `Pss_Anon` (anonymous memory, pages shared by several
 * processes counted a part in each, so the sum is what a memory cgroup is charged) over
 * itself and its live workers, and prints the largest sum seen:
 *     tree-peak-kib N
 * then waits for the workers, checks that each exited 0 and verifies its own data.
 *
 * Exit status 0 on success; otherwise a message on stderr and a non-zero status.
 * Usage: tree NCHILD PARENT_MIB CHILD_MIB PASSES
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pattern.h"

#define MIB (1024UL * 1024UL)
#define BLOCK (64 * 1024UL)
#define MAX_CHILDREN 16

static const char *who = "parent";

static void fail(const char *what, size_t at) {
    fprintf(stderr, "tree: %s: %s at block %zu\n", who, what, at);
    exit(1);
}

/* Fill or verify `mib` MiB at p in blocks of BLOCK with the pattern of (tag, version). */
static void fill(unsigned char *p, size_t mib, uint64_t tag, uint64_t version) {
    for (size_t b = 0; b < mib * MIB / BLOCK; b++)
        fill_block(p + b * BLOCK, BLOCK, mix(tag * 1000003 + b * 31 + version));
}

static void verify(const unsigned char *p, size_t mib, uint64_t tag, uint64_t version) {
    for (size_t b = 0; b < mib * MIB / BLOCK; b++) {
        const uint64_t *w = (const uint64_t *)(p + b * BLOCK);
        uint64_t seed = mix(tag * 1000003 + b * 31 + version);
        for (size_t i = 0; i < BLOCK / 8; i++)
            if (w[i] != seed + i * 0x9e3779b97f4a7c15ULL)
                fail("data differs", b);
    }
}

/* Pss_Anon of a process in KiB (0 if it is gone). Plain read(2) into a stack buffer. */
static unsigned long pss_anon_kib(pid_t pid) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/smaps_rollup", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *s = strstr(buf, "Pss_Anon:");
    return s ? strtoul(s + 9, NULL, 10) : 0;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: tree NCHILD PARENT_MIB CHILD_MIB PASSES\n");
        return 2;
    }
    int nchild = atoi(argv[1]);
    size_t parent_mib = strtoul(argv[2], NULL, 10), child_mib = strtoul(argv[3], NULL, 10);
    int passes = atoi(argv[4]);
    if (nchild < 1 || nchild > MAX_CHILDREN) {
        fprintf(stderr, "tree: 1 to %d children\n", MAX_CHILDREN);
        return 2;
    }
    unsigned char *mine = malloc(parent_mib * MIB);
    if (!mine)
        fail("malloc", 0);
    fill(mine, parent_mib, 0, 0);
    verify(mine, parent_mib, 0, 0);

    pid_t kids[MAX_CHILDREN];
    for (int k = 0; k < nchild; k++) {
        pid_t pid = fork();
        if (pid < 0)
            fail("fork", (size_t)k);
        if (pid == 0) {
            static char name[32];
            snprintf(name, sizeof name, "worker %d", k);
            who = name;
            verify(mine, parent_mib, 0, 0);
            unsigned char *own = malloc(child_mib * MIB);
            if (!own)
                fail("malloc", 0);
            fill(own, child_mib, (uint64_t)k + 1, 0);
            for (int v = 0; v < passes; v++) {
                verify(own, child_mib, (uint64_t)k + 1, (uint64_t)v);
                fill(own, child_mib, (uint64_t)k + 1, (uint64_t)v + 1);
            }
            verify(own, child_mib, (uint64_t)k + 1, (uint64_t)passes);
            _exit(0);
        }
        kids[k] = pid;
    }

    unsigned long peak = 0;
    int live = nchild, status;
    while (live > 0) {
        unsigned long sum = pss_anon_kib(getpid());
        for (int k = 0; k < nchild; k++)
            if (kids[k] > 0)
                sum += pss_anon_kib(kids[k]);
        if (sum > peak)
            peak = sum;
        for (int k = 0; k < nchild; k++) {
            if (kids[k] > 0 && waitpid(kids[k], &status, WNOHANG) == kids[k]) {
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                    fail("a worker failed", (size_t)k);
                kids[k] = 0;
                live--;
            }
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    verify(mine, parent_mib, 0, 0);
    printf("tree-peak-kib %lu\n", peak);
    return 0;
}
