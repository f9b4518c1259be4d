/*
 * thread_switch.c — the floor under any fault served by another thread: two threads hand a
 * turn back and forth through a futex, first pinned to one CPU (each hand-over is a context
 * switch there), then to two CPUs (each is a wake-up sent to the other CPU, which may have
 * halted). A userfaultfd fault served by a handler thread makes one such round trip, plus
 * the fault itself and the install.
 *
 *   gcc -O2 -pthread -o thread_switch probes/thread_switch.c
 *   ./thread_switch [round_trips=100000]
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static _Atomic unsigned turn; /* odd: the partner's turn; even: the main thread's */
static long rounds;
static int partner_cpu;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void wait_while(unsigned v) {
    while (atomic_load(&turn) == v)
        syscall(SYS_futex, &turn, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}

static void pass(unsigned v) {
    atomic_store(&turn, v);
    syscall(SYS_futex, &turn, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static int pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *partner(void *arg) {
    (void)arg;
    if (pin(partner_cpu) != 0) {
        fprintf(stderr, "cannot pin to CPU %d\n", partner_cpu);
        exit(1);
    }
    for (long i = 0; i < rounds; i++) {
        wait_while(2 * (unsigned)i);     /* until the main thread passes 2i+1 */
        pass(2 * (unsigned)i + 2);
    }
    return NULL;
}

static double round_trip_us(int cpu) {
    atomic_store(&turn, 0);
    partner_cpu = cpu;
    pthread_t t;
    if (pthread_create(&t, NULL, partner, NULL) != 0) {
        perror("pthread_create");
        exit(1);
    }
    usleep(10000); /* the partner is waiting */
    double t0 = now();
    for (long i = 0; i < rounds; i++) {
        pass(2 * (unsigned)i + 1);
        wait_while(2 * (unsigned)i + 1);
    }
    double secs = now() - t0;
    pthread_join(t, NULL);
    return secs / rounds * 1e6;
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atol(argv[1]) : 100000;
    if (rounds <= 0 || pin(0) != 0) {
        fprintf(stderr, "usage: thread_switch [round_trips > 0]; needs CPUs 0 and 1\n");
        return 1;
    }
    printf("futex round trip, both threads on CPU 0: %.2f us\n", round_trip_us(0));
    printf("futex round trip, CPU 0 <-> CPU 1:       %.2f us\n", round_trip_us(1));
    return 0;
}
