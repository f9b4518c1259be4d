/* A heap that grows to several GiB of address space (blocks below 1 MiB, served by the
 * small-object allocator, touched on one page each), under `farmem run`. The program writes
 * nothing to stderr itself: whatever appears there comes from the runtime.
 *
 * Exit status 0 on success; otherwise a message on stderr and a non-zero status.
 * Usage: grow GIB
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t gib = argc > 1 ? strtoul(argv[1], NULL, 10) : 3;
    size_t n = gib * 4096; /* blocks of 256 KiB .. 512 KiB: about 4096 per 1.5 GiB */
    uint64_t **b = malloc(n * sizeof *b);
    if (!b) {
        fprintf(stderr, "grow: malloc failed\n");
        return 2;
    }
    for (size_t i = 0; i < n; i++) {
        size_t sz = (256 << 10) + (i * 4096) % (256 << 10);
        b[i] = malloc(sz);
        if (!b[i]) {
            fprintf(stderr, "grow: malloc(%zu) #%zu failed\n", sz, i);
            return 1;
        }
        b[i][0] = i * 0x9e3779b97f4a7c15ULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (b[i][0] != i * 0x9e3779b97f4a7c15ULL) {
            fprintf(stderr, "grow: MISMATCH in block %zu\n", i);
            return 1;
        }
        free(b[i]);
    }
    free(b);
    return 0;
}
