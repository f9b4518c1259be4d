/* A program that closes every descriptor it did not open, as daemons and process helpers do
 * (Erlang's erl_child_setup, sshd, Python's subprocess children), under `farmem run` with
 * most of its heap far:
 *
 *  1. close_range(3, ~0U, 0) first thing, then a heap 4x the budget filled and verified;
 *  2. closefrom(3), close() of every number up to 4096, and dup2() onto every number up to
 *     1100 (closed again after): the heap still verifies, and read() from a pipe into a far
 *     buffer still works;
 *  3. the lowest free number is the program's, while the runtime evicts and fetches: open()
 *     returns it and dup2() onto it succeeds (a runtime thread blocked in accept() held it
 *     for good: a shell's `exec 3>file` failed with EBUSY, and so did the dup2 onto 3 of
 *     Erlang's forker child, which then lost its socket to its parent);
 *  4. fork() (Erlang's helper hung here: the runtime's own descriptor had been closed), the
 *     child checks the lowest free number at once (its runtime threads start as it runs),
 *     closes everything again and verifies and rewrites the heap under eviction;
 *     the parent verifies its own copy after.
 *
 * Exit status 0 on success; otherwise a message on stderr and a non-zero status.
 * Usage: closeall MIB
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pattern.h"

#define BLOCK (256 * 1024)

static const char *step = "start";

static void die(const char *what) {
    /* stderr may be gone: the exit status says it too. */
    fprintf(stderr, "closeall: %s: %s (errno %d)\n", step, what, errno);
    exit(1);
}

static void fill(unsigned char **b, int n, uint64_t seed) {
    for (int i = 0; i < n; i++)
        fill_block(b[i], BLOCK, seed + (uint64_t)i * 1000003);
}

static void check(unsigned char **b, int n, uint64_t seed) {
    static unsigned char want[BLOCK];
    for (int i = 0; i < n; i++) {
        fill_block(want, BLOCK, seed + (uint64_t)i * 1000003);
        if (memcmp(b[i], want, BLOCK) != 0)
            die("a block lost its data");
    }
}

static void close_everything(void) {
    closefrom(3);
    for (int fd = 3; fd < 4096; fd++)
        close(fd);
    for (int fd = 3; fd < 1100; fd++)
        if (dup2(1, fd) == fd)
            close(fd);
}

/* open() gives `want`, and dup2() onto it succeeds. A runtime thread may take a number for
 * a moment (the kernel fails a dup2 onto a number another thread is opening); a number held
 * for good fails every try. */
static int lowest_is_mine(int want) {
    for (int attempt = 0; attempt < 3; attempt++) {
        if (attempt > 0)
            usleep(10000);
        int got = open("/dev/null", O_RDONLY);
        if (got < 0)
            die("open /dev/null");
        close(got);
        if (got != want)
            continue;
        if (dup2(1, want) != want)
            continue;
        close(want);
        return 1;
    }
    return 0;
}

/* dup2() onto `fd`, which the program does not have open, succeeds (within a few tries). */
static int free_number_is_mine(int fd) {
    for (int attempt = 0; attempt < 3; attempt++) {
        if (attempt > 0)
            usleep(10000);
        if (dup2(1, fd) == fd) {
            close(fd);
            return 1;
        }
    }
    return 0;
}

static void numbers_are_the_programs(unsigned char **b, int n, uint64_t seed, int rounds) {
    /* Every number below 64 the program has not open takes a dup2 (one held by a runtime
     * thread waiting in accept() is not open, and is not the lowest free either). */
    for (int fd = 3; fd < 64; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && !free_number_is_mine(fd))
            die("dup2 onto a descriptor number the program has not open");
    int lowest = open("/dev/null", O_RDONLY);
    if (lowest < 0)
        die("open /dev/null");
    close(lowest);
    for (int r = 0; r < rounds; r++) {
        if (!lowest_is_mine(lowest))
            die("the lowest free descriptor is not the program's (open or dup2 onto it)");
        /* A share of the heap read back: faults, evictions and the runtime's threads busy. */
        int share = n / 8;
        int first = (r % 8) * share;
        check(b + first, share, seed + (uint64_t)first * 1000003);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: closeall MIB\n");
        return 2;
    }
    if (close_range(3, ~0U, 0) != 0)
        die("close_range");
    step = "filling";
    int n = atoi(argv[1]) * 4;
    unsigned char **b = malloc(n * sizeof *b);
    for (int i = 0; i < n; i++)
        if ((b[i] = malloc(BLOCK)) == NULL)
            die("malloc");
    fill(b, n, 1);
    check(b, n, 1);

    step = "closing everything";
    close_everything();
    check(b, n, 1);
    int p[2];
    if (pipe(p) != 0)
        die("pipe");
    unsigned char *far = b[n / 2];
    fill_block(far, 4096, 77); /* expected contents, then overwritten by the read */
    unsigned char msg[4096];
    memcpy(msg, far, sizeof msg);
    memset(far, 0, 4096);
    check(b, n / 2, 1); /* push the buffer's page out again */
    if (write(p[1], msg, sizeof msg) != (ssize_t)sizeof msg || read(p[0], far, 4096) != 4096)
        die("a pipe into far memory");
    if (memcmp(far, msg, sizeof msg) != 0)
        die("read() into far memory got the wrong bytes");
    fill_block(far, BLOCK, 1 + (uint64_t)(n / 2) * 1000003);
    close(p[0]);
    close(p[1]);

    step = "the lowest free descriptor";
    numbers_are_the_programs(b, n, 1, 16);

    step = "forking";
    fill(b, n, 2);
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        step = "the lowest free descriptor in the child";
        numbers_are_the_programs(b, n, 2, 8);
        step = "in the child";
        close_everything();
        check(b, n, 2);
        fill(b, n, 3);
        check(b, n, 3);
        _exit(0);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("the child failed");
    check(b, n, 2);
    printf("ok\n");
    return 0;
}
