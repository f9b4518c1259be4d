/* exit() while the heap is busy, under `farmem run`.
 *
 * Worker threads allocate, write, verify and free blocks over a working set larger than the
 * budget, so that the runtime's threads are busy evicting and fetching. Once the workers have
 * done some work (a count that depends on the run number, so that runs exit at different
 * moments), the program calls exit(0) with the workers still running: from main, or (mode
 * `thread`) from one of the workers while main waits in pthread_join. It must end promptly
 * with status 0.
 *
 * A worker that finds a wrong pattern exits the process with status 1 and a message.
 * Usage: exit_busy RUN_NUMBER main|thread
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pattern.h"

#define NWORKERS 4
#define SLOTS 24

static atomic_long ops;
static long exit_after;
static int exit_from_thread;

static void *worker(void *arg) {
    int tid = (int)(intptr_t)arg;
    uint64_t rng = mix(tid + 1);
    uint64_t *blk[SLOTS] = {0};
    size_t words[SLOTS] = {0};
    uint64_t seed[SLOTS] = {0};
    for (;;) {
        int k = (int)(mix(rng++) % SLOTS);
        if (blk[k]) {
            for (size_t i = 0; i < words[k]; i += 7)
                if (blk[k][i] != seed[k] + i) {
                    fprintf(stderr, "exit_busy: worker %d: MISMATCH in block %d word %zu\n", tid,
                            k, i);
                    _exit(1);
                }
            free(blk[k]);
        }
        size_t n = 64 * 1024 + mix(rng++) % (2 * 1024 * 1024);
        words[k] = n / 8;
        blk[k] = malloc(n);
        if (!blk[k]) {
            fprintf(stderr, "exit_busy: worker %d: malloc(%zu) failed\n", tid, n);
            _exit(1);
        }
        seed[k] = mix(rng++);
        for (size_t i = 0; i < words[k]; i++)
            blk[k][i] = seed[k] + i;
        long done = atomic_fetch_add(&ops, 1) + 1;
        if (exit_from_thread && tid == 1 && done >= exit_after)
            exit(0);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int run = argc > 1 ? atoi(argv[1]) : 0;
    exit_from_thread = argc > 2 && strcmp(argv[2], "thread") == 0;
    exit_after = 40 + (run * 37) % 160;
    pthread_t t[NWORKERS];
    for (int i = 0; i < NWORKERS; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i)) {
            fprintf(stderr, "exit_busy: pthread_create failed\n");
            return 2;
        }
    if (exit_from_thread) {
        pthread_join(t[0], NULL); /* never returns: worker 1 calls exit */
        return 3;
    }
    struct timespec ts = {0, 100 * 1000};
    while (atomic_load(&ops) < exit_after)
        nanosleep(&ts, NULL);
    exit(0);
}
