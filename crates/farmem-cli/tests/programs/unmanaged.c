/* Memory farmem does not manage beside memory it does: UNMANAGED MiB mapped with the raw
 * mmap system call (not through the C library, so the preloaded runtime never sees it) and
 * written, then, once the runtime has had time to measure it, HEAP MiB of heap filled with
 * a pattern and checked twice. Exit status 0, or 1 on a mismatch.
 * Usage: unmanaged UNMANAGED_MIB HEAP_MIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(int argc, char **argv) {
    size_t un = (argc > 1 ? strtoul(argv[1], 0, 10) : 8) << 20;
    size_t heap = (argc > 2 ? strtoul(argv[2], 0, 10) : 32) << 20;
    char *u = (char *)syscall(SYS_mmap, 0, un, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (u == MAP_FAILED) return 2;
    memset(u, 0x5a, un);
    usleep(400 * 1000); /* the runtime measures the process's memory every 10 ms */
    size_t n = heap / 8;
    uint64_t *a = malloc(heap);
    if (!a) return 2;
    for (size_t i = 0; i < n; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n; i++)
            if (a[i] != i * 0x9E3779B97F4A7C15ull) { fprintf(stderr, "MISMATCH\n"); return 1; }
    for (size_t i = 0; i < un; i += 4096)
        if (u[i] != 0x5a) { fprintf(stderr, "UNMANAGED MISMATCH\n"); return 1; }
    printf("ok\n");
    return 0;
}
