/*
 * psort: parallel sort of a large array of random u64 (the sorting workload of the
 * far-memory papers). Footprint = input array + output buffer, N = MiB * 2^20 / 16
 * elements. Measured phase: T threads each quicksort a contiguous part of the input in
 * place; the T sorted runs are then merged in parallel into the output (the output is cut
 * into T segments at splitter values, each thread does a k-way merge of its segment);
 * finally the output is verified in parallel (sorted, same sum as the input) and
 * checksummed.
 *
 * usage: psort <MiB> [threads]     ops = elements sorted
 */
#include <pthread.h>

#include "common.h"
#include "farmem.h"

#define MAX_THREADS 64
#define SMALL 24 /* insertion sort below this */
#define READAHEAD 31
#define HINT_MIN (1u << 16) /* hint partitions of parts this long (512 KiB) or longer */

static uint64_t *in, *out;
static uint64_t n;
static unsigned nthreads;
static uint64_t run_lo[MAX_THREADS + 1];           /* run t = in[run_lo[t], run_lo[t+1]) */
static uint64_t cut[MAX_THREADS + 1][MAX_THREADS]; /* segment j of run r starts at cut[j][r] */

static inline void swap(uint64_t *a, uint64_t *b) {
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

static inline int page_start(const void *p) { return ((uintptr_t)p & (PAGE - 1)) == 0; }

/* Hoare partition of a[0, len) around the median of a[0], a[len/2], a[len-1]; returns i
 * with a[0, i) <= pivot <= a[i, len), both sides non-empty. The two scans stream through
 * the part from both ends; with `hint` (parts too big to be local already) each scan hints
 * the page it enters (writable: it swaps there) and reads 8 pages ahead in its direction. */
static inline __attribute__((always_inline)) uint64_t partition(uint64_t *a, uint64_t len,
                                                                 int hint) {
    uint64_t m = len / 2;
    if (a[m] < a[0])
        swap(&a[m], &a[0]);
    if (a[len - 1] < a[m]) {
        swap(&a[len - 1], &a[m]);
        if (a[m] < a[0])
            swap(&a[m], &a[0]);
    }
    uint64_t p = a[m], i = 0, j = len - 1; /* a[0] <= p <= a[len-1] are sentinels */
    for (;;) {
        do {
            i++;
            if (hint && page_start(&a[i]))
                fm_hint_ex(&a[i], PAGE, FM_WRITE, 8, 0);
        } while (a[i] < p);
        do {
            j--;
            if (hint && page_start(&a[j + 1])) /* entering the page below from above */
                fm_hint_ex(&a[j], 8, FM_WRITE, -8, 0);
        } while (a[j] > p);
        if (i >= j)
            return i;
        swap(&a[i], &a[j]);
    }
}

/* Quicksort: median of 3, insertion sort for small parts, recursion on the smaller side
 * only (so the stack stays O(log n)). */
static void quicksort(uint64_t *a, uint64_t len) {
    while (len > SMALL) {
        uint64_t i = len >= HINT_MIN ? partition(a, len, 1) : partition(a, len, 0);
        if (i < len - i) {
            quicksort(a, i);
            a += i;
            len -= i;
        } else {
            quicksort(a + i, len - i);
            len = i;
        }
    }
    for (uint64_t i = 1; i < len; i++) {
        uint64_t v = a[i], j = i;
        for (; j > 0 && a[j - 1] > v; j--)
            a[j] = a[j - 1];
        a[j] = v;
    }
}

/* First index in a[0, len) with a[i] >= v. */
static uint64_t lower_bound(const uint64_t *a, uint64_t len, uint64_t v) {
    uint64_t lo = 0, hi = len;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (a[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The merge streams through k input runs and one output range: fetch each page with
 * read-ahead just before a run (or the output) enters it, instead of faulting on it. */
static inline void hint_in(const uint64_t *p) { fm_hint_ex(p, 8, FM_SEQ, READAHEAD, 0); }
static inline void hint_out(uint64_t *p) { fm_hint_ex(p, PAGE, FM_WRITE | FM_SEQ, 16, 0); }

/* k-way merge of segment j (the elements in [splitter j, splitter j+1) of every run). */
static void merge_segment(unsigned j) {
    uint64_t cur[MAX_THREADS], end[MAX_THREADS], o = 0;
    unsigned k = 0;
    for (unsigned r = 0; r < nthreads; r++) {
        o += cut[j][r];
        if (cut[j][r] < cut[j + 1][r]) {
            cur[k] = run_lo[r] + cut[j][r];
            end[k] = run_lo[r] + cut[j + 1][r];
            hint_in(&in[cur[k]]);
            k++;
        }
    }
    if (k > 0)
        hint_out(&out[o]);
    while (k > 0) {
        unsigned b = 0;
        for (unsigned r = 1; r < k; r++)
            if (in[cur[r]] < in[cur[b]])
                b = r;
        if (page_start(&out[o]))
            hint_out(&out[o]);
        out[o++] = in[cur[b]++];
        if (cur[b] == end[b]) { /* run exhausted: drop it */
            cur[b] = cur[k - 1];
            end[b] = end[k - 1];
            k--;
        } else if (page_start(&in[cur[b]])) {
            hint_in(&in[cur[b]]);
        }
    }
}

struct job {
    pthread_t tid;
    unsigned t;
    uint64_t sum, csum, unsorted;
};

static void *sort_worker(void *arg) {
    struct job *jb = arg;
    quicksort(in + run_lo[jb->t], run_lo[jb->t + 1] - run_lo[jb->t]);
    return NULL;
}

static void *merge_worker(void *arg) {
    merge_segment(((struct job *)arg)->t);
    return NULL;
}

static void *verify_worker(void *arg) {
    struct job *jb = arg;
    uint64_t lo = n * jb->t / nthreads, hi = n * (jb->t + 1) / nthreads;
    uint64_t sum = 0, csum = 0, bad = 0;
    for (uint64_t i = lo; i < hi; i++) {
        sum += out[i];
        csum += out[i] * (i + 1);
        bad += i > 0 && out[i - 1] > out[i];
    }
    jb->sum = sum;
    jb->csum = csum;
    jb->unsorted = bad;
    return NULL;
}

static void run_all(struct job *jobs, void *(*fn)(void *)) {
    for (unsigned t = 0; t < nthreads; t++) {
        int e = pthread_create(&jobs[t].tid, NULL, fn, &jobs[t]);
        if (e != 0)
            die("pthread_create: %s", strerror(e));
    }
    for (unsigned t = 0; t < nthreads; t++) {
        int e = pthread_join(jobs[t].tid, NULL);
        if (e != 0)
            die("pthread_join: %s", strerror(e));
    }
}

int main(int argc, char **argv) {
    uint64_t mib;
    parse_args(argc, argv, &mib, &nthreads, MAX_THREADS);
    n = mib * MIB / 16;

    struct big im, om;
    in = big_alloc(&im, n * 8, "input");
    out = big_alloc(&om, n * 8, "output");
    struct rng rng;
    rng_seed(&rng, 42);
    uint64_t in_sum = 0;
    for (uint64_t i = 0; i < n; i++) {
        in[i] = rng_next(&rng);
        in_sum += in[i];
    }
    for (unsigned t = 0; t <= nthreads; t++)
        run_lo[t] = n * t / nthreads;

    struct job jobs[MAX_THREADS];
    for (unsigned t = 0; t < nthreads; t++)
        jobs[t].t = t;
    double t0 = now_secs();
    run_all(jobs, sort_worker);
    /* Splitters: equally spaced elements of run 0 (the input is random, so they cut every
     * run about evenly). Segment j of run r is [cut[j][r], cut[j+1][r]); cutting every run
     * at the same value keeps equal elements in one segment. */
    for (unsigned r = 0; r < nthreads; r++) {
        cut[0][r] = 0;
        cut[nthreads][r] = run_lo[r + 1] - run_lo[r];
    }
    for (unsigned j = 1; j < nthreads; j++) {
        uint64_t s = in[run_lo[0] + (run_lo[1] - run_lo[0]) * j / nthreads];
        for (unsigned r = 0; r < nthreads; r++)
            cut[j][r] = lower_bound(in + run_lo[r], run_lo[r + 1] - run_lo[r], s);
    }
    run_all(jobs, merge_worker);
    run_all(jobs, verify_worker);
    double secs = now_secs() - t0;

    uint64_t sum = 0, csum = 0, bad = 0;
    for (unsigned t = 0; t < nthreads; t++) {
        sum += jobs[t].sum;
        csum += jobs[t].csum;
        bad += jobs[t].unsorted;
    }
    if (bad != 0 || sum != in_sum)
        die("psort: output wrong (%llu out of order, sum %s)", (unsigned long long)bad,
            sum == in_sum ? "ok" : "differs");
    printf("result=n:%llu checksum:%016llx\n", (unsigned long long)n, (unsigned long long)csum);
    print_ops(n, secs);
    big_free(&om);
    big_free(&im);
    return 0;
}
