/* malloc_pairs: the cost of a malloc+free pair with many blocks live, natively and under
 * `farmem run`, for blocks of a size range, by one thread or several.
 *
 * Each thread keeps 1,024 blocks live; at each step it frees one of them at random and
 * allocates a block of a random size in [lo, hi) in its place, writing its first byte.
 * Blocks of a range fall in several size classes, as a real program's do.
 *
 * usage: malloc_pairs [threads [lo hi]]     (default: 1 thread, 260-500 bytes)
 * prints the time per pair, averaged over each thread's 2 M pairs.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define LIVE 1024
#define PAIRS 2000000

static size_t lo = 260, hi = 500;

static void *work(void *arg) {
    void *keep[LIVE] = {0};
    unsigned s = (unsigned)(size_t)arg * 7 + 1;
    for (int i = 0; i < PAIRS; i++) {
        s = s * 1103515245 + 12345;
        int k = (s >> 8) & (LIVE - 1);
        free(keep[k]);
        size_t n = lo + (s >> 16) % (hi - lo);
        keep[k] = malloc(n);
        if (!keep[k]) {
            perror("malloc");
            exit(1);
        }
        ((char *)keep[k])[0] = 1;
    }
    for (int k = 0; k < LIVE; k++)
        free(keep[k]);
    return NULL;
}

int main(int argc, char **argv) {
    int t = argc > 1 ? atoi(argv[1]) : 1;
    if (argc > 3) {
        lo = (size_t)atol(argv[2]);
        hi = (size_t)atol(argv[3]);
    }
    if (t < 1 || t > 64 || hi <= lo) {
        fprintf(stderr, "usage: %s [threads 1..64 [lo hi]]\n", argv[0]);
        return 2;
    }
    struct timespec a, b;
    pthread_t th[64];
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < t; i++)
        pthread_create(&th[i], NULL, work, (void *)(size_t)i);
    for (int i = 0; i < t; i++)
        pthread_join(th[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("%d thread(s), %zu-%zu bytes: %.1f ns per malloc+free\n", t, lo, hi, ns / PAIRS);
    return 0;
}
