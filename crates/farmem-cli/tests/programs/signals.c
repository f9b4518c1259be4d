/* Signal handlers that read far memory, under `farmem run`.
 *
 * A table of stable blocks (48 MiB, more than the budget) holds a pattern that the main
 * thread rewrites from time to time under a sequence counter (odd while it is being
 * written). Two sources of signals interrupt the main thread at a high rate: SIGUSR1 sent to
 * it by another thread (pthread_kill), and SIGALRM from an interval timer (setitimer, a
 * process-directed signal). The handler checksums a window of a random stable block (most of
 * them evicted) and compares it with the pattern of that block's generation, unless the
 * block was being rewritten at that moment. Meanwhile the main thread keeps allocating,
 * writing, verifying and freeing other memory, so that it is interrupted inside malloc and
 * free and while its own accesses fault.
 *
 * Exit status 0 on success; otherwise a message on stderr and a non-zero status.
 * Usage: signals CHECKS (how many handler checks to wait for)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "pattern.h"

#define NSTABLE 96
#define STABLE_SIZE (512 * 1024) /* 48 MiB in all */
#define WINDOW (16 * 1024)
#define NCHURN 32

static unsigned char *stable[NSTABLE];
/* Generation of each stable block: odd while the main thread rewrites it. */
static atomic_uint_fast64_t gen[NSTABLE];

static atomic_uint_fast64_t checks_done, checks_skipped, handler_runs, alarm_runs;
static atomic_int mismatch;
static atomic_int stop_sender;
/* The first mismatch seen by the handler, reported by main. */
static volatile int bad_sig, bad_block;
static volatile long bad_off;
static volatile uint64_t bad_gen, bad_sum, bad_want;
static volatile size_t bad_window;

static uint64_t seed_of(int block, uint64_t generation) {
    return mix(((uint64_t)block << 32) ^ generation);
}

static void fill(unsigned char *p, size_t n, uint64_t seed) {
    uint64_t *w = (uint64_t *)p;
    for (size_t i = 0; i < n / 8; i++)
        w[i] = seed + i * 0x9e3779b97f4a7c15ULL;
}

static long check(const unsigned char *p, size_t n, uint64_t seed) {
    const uint64_t *w = (const uint64_t *)p;
    for (size_t i = 0; i < n / 8; i++)
        if (w[i] != seed + i * 0x9e3779b97f4a7c15ULL)
            return (long)(i * 8);
    return -1;
}

/* The handler: async-signal-safe (atomics, plain loads, no allocation, no stdio). */
static void on_signal(int sig) {
    int saved = errno;
    uint64_t n = atomic_fetch_add(&handler_runs, 1);
    if (sig == SIGALRM)
        atomic_fetch_add(&alarm_runs, 1);
    uint64_t r = mix(n * 7919 + (uint64_t)sig);
    int b = (int)(r % NSTABLE);
    size_t off = (size_t)((r >> 20) % (STABLE_SIZE / WINDOW)) * WINDOW;
    uint64_t g1 = atomic_load(&gen[b]);
    if (g1 & 1) {
        atomic_fetch_add(&checks_skipped, 1);
        errno = saved;
        return;
    }
    /* Volatile: the loads happen here, between the two generation reads. */
    const volatile uint64_t *w = (const volatile uint64_t *)(stable[b] + off);
    uint64_t seed = seed_of(b, g1);
    uint64_t sum = 0, want = 0;
    long bad = -1;
    for (size_t i = 0; i < WINDOW / 8; i++) {
        uint64_t v = w[i];
        uint64_t e = seed + (off / 8 + i) * 0x9e3779b97f4a7c15ULL;
        sum = sum * 31 + v;
        want = want * 31 + e;
        if (v != e && bad < 0)
            bad = (long)(i * 8);
    }
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t g2 = atomic_load(&gen[b]);
    if (g1 != g2) {
        atomic_fetch_add(&checks_skipped, 1);
    } else if (sum != want || bad >= 0) {
        if (atomic_fetch_add(&mismatch, 1) == 0) {
            bad_sig = sig;
            bad_block = b;
            bad_gen = g1;
            bad_window = off;
            bad_sum = sum;
            bad_want = want;
            bad_off = bad;
        }
    } else {
        atomic_fetch_add(&checks_done, 1);
    }
    errno = saved;
}

static pthread_t main_thread;

static void *sender(void *arg) {
    (void)arg;
    struct timespec ts = {0, 500 * 1000}; /* 500 us */
    while (!atomic_load(&stop_sender)) {
        pthread_kill(main_thread, SIGUSR1);
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void rewrite(int b) {
    uint64_t g = atomic_load(&gen[b]);
    atomic_store(&gen[b], g + 1); /* odd: being written */
    atomic_thread_fence(memory_order_seq_cst);
    fill(stable[b], STABLE_SIZE, seed_of(b, g + 2));
    atomic_thread_fence(memory_order_seq_cst);
    atomic_store(&gen[b], g + 2);
}

int main(int argc, char **argv) {
    uint64_t want_checks = argc > 1 ? strtoull(argv[1], NULL, 10) : 3000;
    for (int b = 0; b < NSTABLE; b++) {
        stable[b] = malloc(STABLE_SIZE);
        if (!stable[b]) {
            fprintf(stderr, "signals: malloc failed\n");
            return 2;
        }
        fill(stable[b], STABLE_SIZE, seed_of(b, 0));
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGUSR1, &sa, NULL) || sigaction(SIGALRM, &sa, NULL)) {
        perror("signals: sigaction");
        return 2;
    }
    main_thread = pthread_self();
    pthread_t t;
    if (pthread_create(&t, NULL, sender, NULL)) {
        fprintf(stderr, "signals: pthread_create failed\n");
        return 2;
    }
    struct itimerval it = {{0, 1000}, {0, 1000}}; /* every 1 ms */
    if (setitimer(ITIMER_REAL, &it, NULL)) {
        perror("signals: setitimer");
        return 2;
    }

    unsigned char *churn[NCHURN] = {0};
    size_t churn_n[NCHURN] = {0};
    uint64_t rng = 99;
    uint64_t iter = 0;
    /* Until enough checks were made, by both kinds of signal (progress, not time). */
    while ((atomic_load(&checks_done) < want_checks || atomic_load(&alarm_runs) < 100 ||
            iter < 1000) &&
           !atomic_load(&mismatch)) {
        int k = (int)(mix(rng++) % NCHURN);
        if (churn[k]) {
            long off = check(churn[k], churn_n[k], mix(k + 1000 * churn_n[k]));
            if (off >= 0) {
                fprintf(stderr, "signals: MISMATCH in churn block %d (%zu bytes) at %ld\n", k,
                        churn_n[k], off);
                return 1;
            }
            free(churn[k]);
        }
        churn_n[k] = (size_t)(1024 + mix(rng++) % (1024 * 1024)) & ~(size_t)7;
        churn[k] = malloc(churn_n[k]);
        if (!churn[k]) {
            fprintf(stderr, "signals: malloc failed\n");
            return 2;
        }
        fill(churn[k], churn_n[k], mix(k + 1000 * churn_n[k]));
        if (iter % 16 == 0)
            rewrite((int)(mix(rng++) % NSTABLE));
        iter++;
    }

    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    atomic_store(&stop_sender, 1);
    pthread_join(t, NULL);

    if (atomic_load(&mismatch)) {
        fprintf(stderr,
                "signals: MISMATCH in the handler (signal %d): block %d generation %" PRIu64
                ", window at %zu: checksum %#" PRIx64 " expected %#" PRIx64
                ", first bad byte at window offset %ld\n",
                bad_sig, bad_block, bad_gen, bad_window, bad_sum, bad_want, bad_off);
        return 1;
    }
    for (int b = 0; b < NSTABLE; b++) {
        long o = check(stable[b], STABLE_SIZE, seed_of(b, atomic_load(&gen[b])));
        if (o >= 0) {
            fprintf(stderr, "signals: MISMATCH at the end: block %d offset %ld\n", b, o);
            return 1;
        }
        free(stable[b]);
    }
    for (int k = 0; k < NCHURN; k++)
        free(churn[k]);
    fprintf(stderr,
            "signals: %" PRIu64 " handler runs (%" PRIu64 " SIGALRM), %" PRIu64
            " checks, %" PRIu64 " skipped, %" PRIu64 " iterations\n",
            atomic_load(&handler_runs), atomic_load(&alarm_runs), atomic_load(&checks_done),
            atomic_load(&checks_skipped), iter);
    return 0;
}
