/*
 * common.h: small helpers shared by the farmem benchmark workloads.
 *
 * Every workload: argv[1] = data size in MiB, argv[2] (optional) = threads. It builds its
 * data deterministically (untimed), runs a timed measured phase and prints exactly
 *     result=<deterministic checksum text>
 *     ops=<work units> secs=<measured seconds>
 * on stdout. `result` depends only on the arguments that define the data and the work,
 * never on timing, thread count, hints or whether the program runs under farmem.
 */
#ifndef FM_BENCH_COMMON_H
#define FM_BENCH_COMMON_H

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PAGE 4096u
#define MIB (1ull << 20)
#define WORDS_PER_PAGE (PAGE / 8)

/* ---- errors and arguments ---- */

static inline void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static inline void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

/* Parse a decimal unsigned number in [lo, hi]; 0 on success. */
static inline int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
    char *end;
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* argv[1] = MiB (1..1048576); argv[2] (optional) = threads (1..max_threads, default 2).
 * Single-threaded programs pass threads = NULL: they accept and ignore argv[2], so a
 * harness can pass a thread count to every program. Prints the usage and exits 2 on a
 * bad or missing argument. */
static inline void parse_args(int argc, char **argv, uint64_t *mib, unsigned *threads,
                              unsigned max_threads) {
    uint64_t t = 2;
    if (argc < 2 || argc > 3 || parse_u64(argv[1], 1, 1u << 20, mib) != 0 ||
        (argc == 3 && parse_u64(argv[2], 1, max_threads, &t) != 0)) {
        fprintf(stderr, "usage: %s <MiB> [threads 1..%u, default 2%s]\n", argv[0],
                max_threads, threads ? "" : "; ignored: single-threaded");
        exit(2);
    }
    if (threads)
        *threads = (unsigned)t;
}

/* ---- memory ---- */

/* A large malloc block whose usable part starts on a page boundary (farmem serves large
 * blocks page-aligned already; glibc puts a 16-byte header first). Free with big_free. */
struct big {
    void *raw;
    void *p;
};
static inline void *big_alloc(struct big *b, size_t bytes, const char *what) {
    if (bytes > SIZE_MAX - PAGE)
        die("%s: size overflow", what);
    b->raw = malloc(bytes + PAGE);
    if (b->raw == NULL)
        die("malloc of %zu bytes for %s failed", bytes + PAGE, what);
    uintptr_t a = ((uintptr_t)b->raw + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
    b->p = (void *)a;
    return b->p;
}
static inline void big_free(struct big *b) {
    free(b->raw);
    b->raw = b->p = NULL;
}

/* ---- time ---- */

static inline double now_secs(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        die("clock_gettime failed");
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- output ---- */

static inline void print_ops(uint64_t ops, double secs) {
    printf("ops=%llu secs=%.6f\n", (unsigned long long)ops, secs);
    if (fflush(stdout) != 0)
        die("writing stdout failed");
}

/* ---- random numbers and mixing ---- */

/* splitmix64 finalizer: a good 64-bit bijective mix. */
static inline uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* xorshift64* generator; seed it through mix64 so that any seed (even 0) works. */
struct rng {
    uint64_t s;
};
static inline void rng_seed(struct rng *r, uint64_t seed) {
    r->s = mix64(seed) | 1;
}
static inline uint64_t rng_next(struct rng *r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545f4914f6cdd1dull;
}
/* Uniform double in [0, 1) from the top 53 bits. */
static inline double rng_unit(struct rng *r) {
    return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- a pseudo-random bijection on [0, n) ----
 * A 4-round balanced Feistel network on the smallest even number of bits covering n, with
 * cycle-walking to stay below n (at most 4x the domain, so < 4 rounds of walking on
 * average). Different keys give different permutations; no table in memory. */
struct perm {
    uint64_t n;
    unsigned half;  /* bits per half */
    uint64_t hmask; /* (1 << half) - 1 */
    uint64_t key;
};
static inline void perm_init(struct perm *p, uint64_t n, uint64_t key) {
    unsigned bits = 2;
    while (bits < 64 && (1ull << bits) < n)
        bits += 2;
    if (bits >= 64)
        die("perm_init: domain too large");
    p->n = n;
    p->half = bits / 2;
    p->hmask = (1ull << p->half) - 1;
    p->key = mix64(key);
}
static inline uint64_t perm_apply(const struct perm *p, uint64_t x) {
    do {
        uint64_t l = x >> p->half, r = x & p->hmask;
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t f = mix64(r ^ (p->key + round * 0x632be59bd9b4e019ull)) & p->hmask;
            uint64_t t = l ^ f;
            l = r;
            r = t;
        }
        x = (l << p->half) | r;
    } while (x >= p->n);
    return x;
}

/* ---- pow without libm ----
 * The harness links without -lm, so the Zipf generator uses these: plain arithmetic
 * (series for log and exp), accurate to a few ulp, and deterministic everywhere. */
static inline double fm_log(double x) { /* x > 0, finite, normal */
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    int e = (int)((b >> 52) & 0x7ff) - 1023;
    b = (b & 0x000fffffffffffffull) | 0x3ff0000000000000ull; /* mantissa in [1, 2) */
    double m;
    memcpy(&m, &b, sizeof m);
    if (m > 1.4142135623730951) {
        m *= 0.5;
        e++;
    }
    double z = (m - 1.0) / (m + 1.0), z2 = z * z, term = z, s = 0.0;
    for (int k = 1; k <= 25; k += 2) { /* log m = 2 atanh z, |z| < 0.172 */
        s += term / k;
        term *= z2;
    }
    return 2.0 * s + e * 0.6931471805599453;
}
static inline double fm_exp(double y) {
    if (y < -708.0)
        return 0.0;
    if (y > 709.0)
        y = 709.0;
    double kd = y * 1.4426950408889634; /* y / ln 2, rounded to nearest */
    int k = (int)(kd < 0 ? kd - 0.5 : kd + 0.5);
    double r = y - k * 0.6931471805599453, term = 1.0, s = 1.0;
    for (int i = 1; i <= 18; i++) { /* |r| <= 0.35 */
        term *= r / i;
        s += term;
    }
    while (k > 1000) { /* keep the exponent field in range */
        s *= 0x1p1000;
        k -= 1000;
    }
    while (k < -1000) {
        s *= 0x1p-1000;
        k += 1000;
    }
    uint64_t b = (uint64_t)(k + 1023) << 52;
    double scale;
    memcpy(&scale, &b, sizeof scale);
    return s * scale;
}
static inline double fm_pow(double x, double a) { /* x >= 0 */
    return x > 0.0 ? fm_exp(a * fm_log(x)) : 0.0;
}

/* ---- Zipf ----
 * The zipfian generator of YCSB (Gray et al., "Quickly generating billion-record synthetic
 * databases", SIGMOD 1994): rank 0 is the most popular of n items, P(rank k) ~ 1/(k+1)^theta.
 * zeta(n) is computed once, in a fixed order, so the stream is deterministic. */
struct zipf {
    uint64_t n;
    double theta, alpha, zetan, eta, half_pow_theta;
};
static inline void zipf_init(struct zipf *z, uint64_t n, double theta) {
    double zetan = 0.0;
    for (uint64_t i = 1; i <= n; i++)
        zetan += fm_exp(-theta * fm_log((double)i));
    double zeta2 = 1.0 + 1.0 / fm_pow(2.0, theta);
    z->n = n;
    z->theta = theta;
    z->alpha = 1.0 / (1.0 - theta);
    z->zetan = zetan;
    z->eta = (1.0 - fm_pow(2.0 / (double)n, 1.0 - theta)) / (1.0 - zeta2 / zetan);
    z->half_pow_theta = fm_pow(0.5, theta);
}
static inline uint64_t zipf_next(const struct zipf *z, struct rng *r) {
    double u = rng_unit(r);
    double uz = u * z->zetan;
    if (uz < 1.0)
        return 0;
    if (uz < 1.0 + z->half_pow_theta)
        return z->n > 1 ? 1 : 0;
    uint64_t k = (uint64_t)((double)z->n * fm_pow(z->eta * u - z->eta + 1.0, z->alpha));
    return k < z->n ? k : z->n - 1;
}

/* ---- the scanned array of seqscan and randscan ---- */

/* npages pages of u64 words, word i = mix64(i). */
static inline uint64_t *page_array(struct big *mem, uint64_t npages) {
    uint64_t *a = big_alloc(mem, npages * PAGE, "array");
    for (uint64_t i = 0; i < npages * WORDS_PER_PAGE; i++)
        a[i] = mix64(i);
    return a;
}

/* The sum of a page's words: the scans process a page as a unit. */
static inline uint64_t sum_page(const uint64_t *pg) {
    uint64_t s = 0;
    for (unsigned i = 0; i < WORDS_PER_PAGE; i++)
        s += pg[i];
    return s;
}

#endif /* FM_BENCH_COMMON_H */
