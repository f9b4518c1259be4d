/* The kernel reads and writes heap pages in every state the runtime gives them: far (evicted),
 * fresh (never touched), and fetched back writable without tracking (written before their
 * eviction, so the runtime must find the kernel's writes at the next eviction). Covered:
 * write, pwrite, read, pread, readv, recv, fread and getline through a heap FILE buffer, a
 * mutex and a condition variable (futexes) inside a heap object, and execve with argv and envp
 * built in far memory. A ballast larger than the budget pushes everything else far between
 * steps. Exits non-zero with a message on the first mismatch.
 * Usage: kernel_io BALLAST_MIB            (the checks; execs itself for the execve check)
 *        kernel_io --exec-child N SEED    (the exec'd side: checks its argv and environment) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pattern.h"

#define PAGE 4096
#define BUF (4u << 20) /* each buffer the kernel reads or writes */

static unsigned char *ballast;
static size_t ballast_len;
static int failures;

#define FAIL(...)                                                                          \
    do {                                                                                   \
        fprintf(stderr, "kernel_io: " __VA_ARGS__);                                        \
        fputc('\n', stderr);                                                               \
        failures++;                                                                        \
    } while (0)

/* Touch (write) the whole ballast: with a budget below its size, every other page goes far. */
static void churn(void) {
    static uint64_t round;
    round++;
    for (size_t i = 0; i < ballast_len; i += PAGE) ((volatile uint64_t *)(ballast + i))[0] = round;
}

static int check_block(const char *what, const unsigned char *p, size_t n, uint64_t seed) {
    unsigned char *want = malloc(n);
    if (!want) return 0;
    fill_block(want, n, seed);
    int ok = memcmp(p, want, n) == 0;
    if (!ok) {
        size_t i = 0;
        while (p[i] == want[i]) i++;
        FAIL("%s: byte %zu is %u, want %u", what, i, p[i], want[i]);
    }
    free(want);
    return ok;
}

static int temp_file(void) {
    char path[] = "/tmp/kernel_io-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { perror("mkstemp"); exit(3); }
    unlink(path);
    return fd;
}

static void write_all(int fd, const unsigned char *p, size_t n, off_t at) {
    for (size_t done = 0; done < n;) {
        ssize_t w = at < 0 ? write(fd, p + done, n - done) : pwrite(fd, p + done, n - done, at + done);
        if (w <= 0) { perror("kernel_io: write"); exit(3); }
        done += (size_t)w;
    }
}

static void pread_all(int fd, unsigned char *p, size_t n, off_t at) {
    for (size_t done = 0; done < n;) {
        ssize_t r = pread(fd, p + done, n - done, at + done);
        if (r <= 0) { perror("kernel_io: pread"); exit(3); }
        done += (size_t)r;
    }
}

/* write() and pwrite() from far pages; pread() into fresh pages and into far pages; readv()
 * into two far buffers at once. */
static void files(void) {
    int fd = temp_file();
    unsigned char *a = malloc(BUF), *b = malloc(BUF);
    fill_block(a, BUF, 11);
    fill_block(b, BUF, 12);
    churn();
    write_all(fd, a, BUF, -1);      /* from far pages */
    write_all(fd, b, BUF, BUF);     /* pwrite from far pages */
    unsigned char *fresh = malloc(2 * BUF);
    pread_all(fd, fresh, BUF, 0);   /* into never-touched pages */
    pread_all(fd, fresh + BUF, BUF, BUF);
    churn();
    check_block("pread into fresh pages, first half", fresh, BUF, 11);
    check_block("pread into fresh pages, second half", fresh + BUF, BUF, 12);
    fill_block(fresh, BUF, 98); /* overwrite, then read back over far pages */
    fill_block(fresh + BUF, BUF, 99);
    churn();
    pread_all(fd, fresh, BUF, BUF);
    churn();
    check_block("pread into far pages", fresh, BUF, 12);
    check_block("far pages next to a pread", fresh + BUF, BUF, 99);

    fill_block(a, BUF, 99);
    fill_block(b, BUF, 99);
    churn();
    struct iovec iov[2] = {{a, BUF}, {b, BUF}};
    size_t done = 0;
    if (lseek(fd, 0, SEEK_SET) != 0) exit(3);
    while (done < 2 * BUF) {
        ssize_t r = readv(fd, iov, 2);
        if (r <= 0) { perror("kernel_io: readv"); exit(3); }
        done += (size_t)r;
        for (int i = 0; i < 2; i++) {
            size_t take = (size_t)r < iov[i].iov_len ? (size_t)r : iov[i].iov_len;
            iov[i].iov_base = (char *)iov[i].iov_base + take;
            iov[i].iov_len -= take;
            r -= (ssize_t)take;
        }
    }
    churn();
    check_block("readv into far pages, first buffer", a, BUF, 11);
    check_block("readv into far pages, second buffer", b, BUF, 12);
    free(a);
    free(b);
    free(fresh);
    close(fd);
}

/* Pages written, evicted, then fetched back by a read of one byte each: they come back
 * writable without tracking. The kernel writes them (read() from a pipe) with no trap to see;
 * the runtime must notice at their next eviction that they changed. */
static void into_pages_fetched_for_reading(void) {
    enum { SMALL = 1u << 20 }; /* all resident at once under a budget of a few MiB */
    unsigned char *p = malloc(SMALL);
    fill_block(p, SMALL, 21);
    churn();
    uint64_t sum = 0;
    for (size_t i = 0; i < SMALL; i += PAGE) sum += p[i]; /* fetch every page by a read */
    int fd = temp_file();
    unsigned char *src = malloc(SMALL);
    fill_block(src, SMALL, 22);
    write_all(fd, src, SMALL, -1);
    free(src);
    pread_all(fd, p, SMALL, 0);
    churn();
    check_block("pread into pages fetched for reading", p, SMALL, 22);
    close(fd);
    free(p);
    if (sum == 1) fputc(' ', stderr); /* keep the reads */
}

/* recv() over a socket pair into far pages, from a thread that sends from far pages. */
struct sender { int fd; unsigned char *p; };

static void *send_all(void *arg) {
    struct sender *s = arg;
    for (size_t done = 0; done < BUF;) {
        ssize_t w = send(s->fd, s->p + done, BUF - done, 0);
        if (w <= 0) { perror("kernel_io: send"); exit(3); }
        done += (size_t)w;
    }
    return 0;
}

static void sockets(void) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) { perror("socketpair"); exit(3); }
    unsigned char *out = malloc(BUF), *in = malloc(BUF);
    fill_block(out, BUF, 31);
    fill_block(in, BUF, 99);
    churn();
    struct sender s = {sv[0], out};
    pthread_t t;
    pthread_create(&t, 0, send_all, &s);
    for (size_t done = 0; done < BUF;) {
        ssize_t r = recv(sv[1], in + done, BUF - done, 0);
        if (r <= 0) { perror("kernel_io: recv"); exit(3); }
        done += (size_t)r;
        if ((done & ((1u << 20) - 1)) < (size_t)r) churn(); /* evict between receives */
    }
    pthread_join(t, 0);
    churn();
    check_block("recv into far pages", in, BUF, 31);
    free(out);
    free(in);
    close(sv[0]);
    close(sv[1]);
}

/* stdio with its buffer on the heap: fread into far pages, getline into a heap line. */
static void stdio_buffers(void) {
    FILE *f = tmpfile();
    if (!f) exit(3);
    char *iobuf = malloc(256 << 10);
    setvbuf(f, iobuf, _IOFBF, 256 << 10);
    for (int i = 0; i < 20000; i++) fprintf(f, "line %d %016llx\n", i, (unsigned long long)mix(i));
    unsigned char *blk = malloc(BUF);
    fill_block(blk, BUF, 41);
    if (fwrite(blk, 1, BUF, f) != BUF) exit(3);
    fflush(f);
    rewind(f);
    fill_block(blk, BUF, 99);
    churn();
    char *line = 0;
    size_t cap = 0;
    for (int i = 0; i < 20000; i++) {
        if (getline(&line, &cap, f) < 0) { FAIL("getline: early end at %d", i); break; }
        char want[64];
        snprintf(want, sizeof want, "line %d %016llx\n", i, (unsigned long long)mix(i));
        if (strcmp(line, want) != 0) { FAIL("getline %d: '%s'", i, line); break; }
        if (i % 5000 == 0) churn();
    }
    if (fread(blk, 1, BUF, f) != BUF) FAIL("fread: short");
    churn();
    check_block("fread into far pages", blk, BUF, 41);
    fclose(f);
    free(line);
    free(blk);
    free(iobuf);
}

/* A mutex and a condition variable inside a heap object (with payload around it), shared by
 * threads while another thread keeps pushing pages far: futex waits and wakes on far words. */
struct shared {
    unsigned char before[3 * PAGE];
    pthread_mutex_t lock;
    pthread_cond_t turn;
    long count;
    int next; /* whose turn it is, for the ping-pong */
    unsigned char after[3 * PAGE];
};

#define WORKERS 4
#define ROUNDS 4000
static struct shared *sh;
static volatile int stop_churn;

static void *worker(void *arg) {
    int me = (int)(long)arg;
    for (int i = 0; i < ROUNDS; i++) {
        pthread_mutex_lock(&sh->lock);
        while (sh->next != me) pthread_cond_wait(&sh->turn, &sh->lock);
        sh->count++;
        sh->next = (me + 1) % WORKERS;
        pthread_cond_broadcast(&sh->turn);
        pthread_mutex_unlock(&sh->lock);
    }
    return 0;
}

static void *churner(void *arg) {
    (void)arg;
    while (!stop_churn) churn();
    return 0;
}

static void futexes(void) {
    sh = malloc(sizeof *sh);
    fill_block(sh->before, sizeof sh->before, 51);
    fill_block(sh->after, sizeof sh->after, 52);
    pthread_mutex_init(&sh->lock, 0);
    pthread_cond_init(&sh->turn, 0);
    sh->count = 0;
    sh->next = 0;
    churn();
    pthread_t c, w[WORKERS];
    pthread_create(&c, 0, churner, 0);
    for (long i = 0; i < WORKERS; i++) pthread_create(&w[i], 0, worker, (void *)i);
    for (int i = 0; i < WORKERS; i++) pthread_join(w[i], 0);
    stop_churn = 1;
    pthread_join(c, 0);
    if (sh->count != (long)WORKERS * ROUNDS)
        FAIL("futexes: count %ld, want %ld", sh->count, (long)WORKERS * ROUNDS);
    check_block("payload before the mutex", sh->before, sizeof sh->before, 51);
    check_block("payload after the mutex", sh->after, sizeof sh->after, 52);
    free(sh);
}

/* execve with every argv and envp string (and the arrays) built in far memory. */
#define ARGS 48
#define ARG_LEN 2000

static void arg_text(char *s, int i, uint64_t seed) {
    for (int j = 0; j < ARG_LEN - 1; j++) s[j] = 'a' + (char)(mix(seed + (uint64_t)i * ARG_LEN + j) % 26);
    s[ARG_LEN - 1] = 0;
}

static void exec_far(const char *self) {
    const uint64_t seed = 61;
    extern char **environ;
    int nenv = 0;
    while (environ[nenv]) nenv++;
    char **argv = malloc((ARGS + 5) * sizeof *argv);
    char **envp = malloc((nenv + 2) * sizeof *envp);
    argv[0] = strdup(self);
    argv[1] = strdup("--exec-child");
    argv[2] = malloc(16);
    snprintf(argv[2], 16, "%d", ARGS);
    argv[3] = malloc(24);
    snprintf(argv[3], 24, "%llu", (unsigned long long)seed);
    for (int i = 0; i < ARGS; i++) {
        argv[4 + i] = malloc(ARG_LEN);
        arg_text(argv[4 + i], i, seed);
    }
    argv[4 + ARGS] = 0;
    for (int i = 0; i < nenv; i++) envp[i] = strdup(environ[i]);
    envp[nenv] = malloc(ARG_LEN + 16);
    strcpy(envp[nenv], "KERNEL_IO_ENV=");
    arg_text(envp[nenv] + strlen("KERNEL_IO_ENV="), ARGS, seed);
    envp[nenv + 1] = 0;
    churn();
    fflush(0);
    pid_t pid = fork();
    if (pid == 0) {
        churn(); /* the child's copies far too */
        execve(self, argv, envp);
        perror("kernel_io: execve");
        _exit(3);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        FAIL("execve: the child that checks its arguments failed (status %d)", st);
    /* and the parent's copies are intact */
    char *want = malloc(ARG_LEN);
    for (int i = 0; i < ARGS; i++) {
        arg_text(want, i, seed);
        if (strcmp(argv[4 + i], want) != 0) { FAIL("execve: the parent's argument %d changed", i); break; }
    }
    free(want);
}

static int exec_child(int argc, char **argv) {
    int n = atoi(argv[2]);
    uint64_t seed = strtoull(argv[3], 0, 10);
    if (argc != 4 + n) { fprintf(stderr, "kernel_io child: %d arguments, want %d\n", argc, 4 + n); return 1; }
    char *want = malloc(ARG_LEN);
    for (int i = 0; i < n; i++) {
        arg_text(want, i, seed);
        if (strcmp(argv[4 + i], want) != 0) { fprintf(stderr, "kernel_io child: argument %d differs\n", i); return 1; }
    }
    arg_text(want, n, seed);
    const char *env = getenv("KERNEL_IO_ENV");
    if (!env || strcmp(env, want) != 0) { fprintf(stderr, "kernel_io child: KERNEL_IO_ENV differs\n"); return 1; }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--exec-child")) return argc < 4 ? 2 : exec_child(argc, argv);
    ballast_len = (size_t)(argc > 1 ? atoi(argv[1]) : 32) << 20;
    ballast = malloc(ballast_len);
    if (!ballast) return 2;
    memset(ballast, 1, ballast_len);
    files();
    into_pages_fetched_for_reading();
    sockets();
    stdio_buffers();
    futexes();
    exec_far("/proc/self/exe");
    if (failures) return 1;
    printf("kernel_io: all checks passed\n");
    return 0;
}
