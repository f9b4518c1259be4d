/* CPU affinity under `farmem run`, which may pin a thread that faults alone to its fault
 * thread's CPU: the program must never see that pin, nor pass it on, nor lose its own
 * settings to it.
 *
 * The main thread faults over a heap larger than the budget between checks. Each check
 * compares what the program sees (sched_getaffinity, pthread_getaffinity_np) with the
 * affinity it started with, and what the kernel gives a new thread, a posix_spawn'ed child,
 * a vfork'ed child, a forked child and system()'s shell (the children run without farmem:
 * LD_PRELOAD is taken out of the environment, so that their own runtime pins nothing).
 * Then the program pins itself to one CPU and checks that this sticks while it keeps
 * faulting, and takes the pin off again.
 *
 * Usage: affinity MiB     (as a spawned child: affinity --child EXPECTED_COUNT)
 * Exit status 0 on success; otherwise a message on stderr.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int count_cpus(void) {
    cpu_set_t s;
    if (sched_getaffinity(0, sizeof s, &s))
        return -1;
    return CPU_COUNT(&s);
}

static int kernel_count(void) {
    /* What the kernel says, past any interposition (no allocation: a forked child calls
     * this before anything could fault). */
    cpu_set_t s;
    CPU_ZERO(&s);
    if (syscall(SYS_sched_getaffinity, 0, sizeof s, &s) < 0)
        return -1;
    return CPU_COUNT(&s);
}

static void churn(unsigned char *p, size_t n, int round) {
    for (size_t i = 0; i < n / 4096; i++) {
        size_t pg = (i * 7919) % (n / 4096);
        p[pg * 4096 + (round & 4095)] += 1;
    }
}

static int expect;

static void *thread_main(void *arg) {
    (void)arg;
    int n = count_cpus(), k = kernel_count();
    /* (The new thread has not faulted yet: nothing can have pinned it.) */
    if (n != expect || k != expect) {
        fprintf(stderr, "affinity: a new thread sees %d CPUs (kernel: %d), expected %d\n", n, k,
                expect);
        exit(1);
    }
    return NULL;
}

static void check(const char *when) {
    int n = count_cpus();
    cpu_set_t s;
    if (pthread_getaffinity_np(pthread_self(), sizeof s, &s) || n != expect ||
        CPU_COUNT(&s) != expect) {
        fprintf(stderr, "affinity: %s: the program sees %d CPUs, expected %d\n", when, n, expect);
        exit(1);
    }
}

static void spawned(const char *how, pid_t pid) {
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "affinity: the child made by %s saw the wrong CPUs\n", how);
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) {
        /* The kernel's view: a child must not inherit a pin (its own runtime may pin it
         * later, but not before it faults; this runs first thing). */
        int want = atoi(argv[2]);
        int k = kernel_count(), n = count_cpus();
        return (k == want && n == want) ? 0 : (fprintf(stderr, "child: %d/%d of %d\n", n, k,
                                                         want),
                                                 1);
    }
    size_t n = (size_t)(argc > 1 ? atoi(argv[1]) : 64) << 20;
    expect = count_cpus();
    unsetenv("LD_PRELOAD");
    unsigned char *p = malloc(n);
    memset(p, 1, n);
    char want[16];
    snprintf(want, sizeof want, "%d", expect);
    char *child_argv[] = {argv[0], "--child", want, NULL};
    for (int round = 0; round < 3; round++) {
        churn(p, n, round);
        check("while faulting");
        churn(p, n, round);
        pthread_t t;
        if (pthread_create(&t, NULL, thread_main, NULL) || pthread_join(t, NULL)) {
            fprintf(stderr, "affinity: pthread_create failed\n");
            return 1;
        }
        churn(p, n, round);
        pid_t pid;
        if (posix_spawn(&pid, argv[0], NULL, NULL, child_argv, environ) != 0)
            pid = -1;
        spawned("posix_spawn", pid);
        churn(p, n, round);
        pid = vfork();
        if (pid == 0) {
            execv(argv[0], child_argv);
            _exit(2);
        }
        spawned("vfork", pid);
        churn(p, n, round);
        pid = fork();
        if (pid == 0) {
            /* A forked child keeps the runtime; check the kernel's view before it faults. */
            _exit(kernel_count() == expect ? 0 : 1);
        }
        spawned("fork", pid);
        churn(p, n, round);
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "'%s' --child %d", argv[0], expect);
        if (system(cmd) != 0) {
            fprintf(stderr, "affinity: the child started by system() saw the wrong CPUs\n");
            return 1;
        }
    }
    /* The program's own pin wins and stays while it faults; taking it off works too. */
    cpu_set_t all, one;
    sched_getaffinity(0, sizeof all, &all);
    int cpu = -1;
    for (int c = CPU_SETSIZE - 1; c >= 0 && cpu < 0; c--)
        if (CPU_ISSET(c, &all))
            cpu = c;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one)) {
        perror("affinity: sched_setaffinity");
        return 1;
    }
    expect = 1;
    for (int round = 0; round < 3; round++) {
        churn(p, n, round);
        if (kernel_count() != 1 || count_cpus() != 1 || sched_getcpu() != cpu) {
            fprintf(stderr, "affinity: the program's own pin to CPU %d did not hold (%d/%d)\n",
                    cpu, count_cpus(), kernel_count());
            return 1;
        }
    }
    if (sched_setaffinity(0, sizeof all, &all)) {
        perror("affinity: sched_setaffinity");
        return 1;
    }
    expect = CPU_COUNT(&all);
    churn(p, n, 9);
    check("after the program unpinned itself");
    printf("affinity: %d CPUs seen throughout\n", expect);
    return 0;
}
