/*
 * single_thread_paths.c: what glibc's single-threaded fast paths save, and what a program
 * loses when a runtime's threads live in its process.
 *
 * glibc skips atomic instructions while a process has one thread: a default mutex's lock and
 * unlock, a FILE's lock in putc/getc/fwrite, malloc's arena lock. It never goes back once a
 * second thread has been created. Under `farmem run` every program has the runtime's fault,
 * control and watchdog threads, so it always takes the slow paths.
 *
 * The program times 100 M lock/unlock pairs of an uncontended default mutex and 20 M putc
 * calls on a FILE, once as it starts (one thread) and with `threaded` after creating one idle
 * thread that never runs again.
 *
 *   gcc -O2 -pthread -o single_thread_paths probes/single_thread_paths.c
 *   ./single_thread_paths; ./single_thread_paths threaded
 */
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;

static void *idle(void *a) {
    (void)a;
    pause();
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    (void)argv;
    if (argc > 1) {
        pthread_t t;
        if (pthread_create(&t, NULL, idle, NULL) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    const long pairs = 100000000, chars = 20000000;
    volatile long x = 0;
    double t0 = now();
    for (long i = 0; i < pairs; i++) {
        pthread_mutex_lock(&m);
        x++;
        pthread_mutex_unlock(&m);
    }
    double t1 = now();
    FILE *f = fopen("/dev/null", "w");
    if (f == NULL) {
        perror("/dev/null");
        return 1;
    }
    for (long i = 0; i < chars; i++)
        putc('a', f);
    double t2 = now();
    fclose(f);
    printf("%s: mutex lock+unlock %.2f ns, putc %.2f ns\n", argc > 1 ? "threaded" : "single",
           (t1 - t0) / pairs * 1e9, (t2 - t1) / chars * 1e9);
    return 0;
}
