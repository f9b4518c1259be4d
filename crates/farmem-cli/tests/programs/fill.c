/* Fill N MiB of heap in 64 KiB blocks with a pattern and check it: a short program that,
 * under a tiny budget, makes the runtime evict and fetch from its first milliseconds (while
 * the runtime's own threads may still be starting). Exit status 0, or 1 on a mismatch.
 * Usage: fill MIB [_exit|exec|wait]: end by exit (default), by _exit, by exec'ing /bin/true,
 * or print "filled" and wait to be killed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 32;
    size_t n = mib * 16;
    uint64_t **b = malloc(n * sizeof *b);
    if (!b) return 2;
    for (size_t i = 0; i < n; i++) {
        b[i] = malloc(65536);
        if (!b[i]) return 2;
        for (size_t w = 0; w < 8192; w += 512) b[i][w] = i * 31 + w;
    }
    for (size_t i = 0; i < n; i++)
        for (size_t w = 0; w < 8192; w += 512)
            if (b[i][w] != i * 31 + w) { fprintf(stderr, "MISMATCH\n"); return 1; }
    const char *end = argc > 2 ? argv[2] : "exit";
    if (!strcmp(end, "_exit")) _exit(0);
    if (!strcmp(end, "exec")) {
        char *args[] = {"true", NULL};
        execv("/bin/true", args);
        return 3;
    }
    if (!strcmp(end, "wait")) {
        printf("filled\n");
        fflush(stdout);
        for (;;) pause();
    }
    return 0;
}
