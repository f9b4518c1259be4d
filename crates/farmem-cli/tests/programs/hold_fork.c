/* Fill N MiB of heap with a pattern, fork, and in both processes check it over and over, a
 * millisecond apart, until killed (exit 1 and "BAD" on a mismatch). The child prints
 * "forked CHILD_PID" once fork() has returned in it (after the fork handlers, which give it
 * its own control socket under farmem run); it goes when its parent does. Usage:
 * hold_fork MIB */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    size_t n = ((size_t)atol(argv[1]) << 20) / 8;
    uint64_t *a = malloc(n * 8);
    if (a == NULL)
        return 2;
    for (size_t i = 0; i < n; i++)
        a[i] = i * 2654435761u;
    pid_t child = fork();
    if (child < 0)
        return 2;
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        printf("forked %d\n", (int)getpid());
        fflush(stdout);
    }
    for (;;) {
        for (size_t i = 0; i < n; i += 64)
            if (a[i] != i * 2654435761u) {
                fprintf(stderr, "BAD in %s\n", child == 0 ? "the child" : "the parent");
                return 1;
            }
        usleep(1000);
    }
}
