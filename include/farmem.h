/*
 * farmem.h: the C/C++ interface of the farmem far-memory runtime (libfarmem.so).
 *
 * Hints are software guards: place one before an access that may touch far memory and the
 * runtime fetches the page (plus optional read-ahead) on the calling thread, before the
 * access, instead of taking a page fault. When the page is already local the hint costs a
 * few instructions inline: no function call, no system call.
 *
 * Hints are no-ops when the program is not linked with libfarmem and not run under
 * `farmem run` (the guard symbol is a weak reference), and on memory outside far-memory
 * regions. Define FARMEM_NO_HINTS to compile them out entirely.
 *
 * Link: cc app.c -I include -L target/release -lfarmem   (or let `farmem run` preload it)
 */
#ifndef FARMEM_H
#define FARMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Flags of fm_hint_ex. */
#define FM_WRITE 1u /* the access writes: map the page writable */
#define FM_SEQ 2u   /* skip when this thread's previous FM_SEQ hint was on the same page */

/* Per-page metadata bits the inline check reads (see crates/farmem-runtime/src/page_table.rs). */
#define FM__ABSENT 1ull
#define FM__NOWRITE 2ull
#define FM__IDLE 64ull /* the reclaim policy wants to hear of the next use of the page */

/* The runtime's page-metadata table, indexed by virtual page number. */
struct fm_guard {
    const uint64_t *table; /* read racily on purpose: a stale "present" only means an unhinted fault */
    uintptr_t mask;
};
extern const struct fm_guard fm_guard __attribute__((weak));

/* Out-of-line part of a hint: fetch/unprotect what the inline check found missing. */
void fm_hint_slow(const void *addr, size_t len, unsigned flags, int readahead, int ev_prio)
    __attribute__((weak));

/* Statistics of the process-wide runtime (all counters since start). */
struct fm_stats {
    uint64_t hint_calls, hint_hits, hint_misses;
    uint64_t unhinted_faults, wp_faults, stolen_faults, spurious_faults;
    uint64_t zero_fills, pages_fetched, readahead_pages, pages_installed, install_ioctls;
    uint64_t unverified_installs, verified_unchanged, verified_zero;
    uint64_t pages_evicted, pages_written_back, clean_drops, unmap_syscalls;
    uint64_t direct_reclaims, backend_full, over_budget_pages;
    uint64_t prefetch_batches, prefetch_pages, prefetch_late, prefetch_swept;
    uint64_t bytes_read, bytes_written, fetch_ns_total;
    uint64_t pages_discarded, fork_fetched_pages;
    uint64_t fault_predicted_pages, fault_prefetch_used, fault_prefetch_wasted;
    uint64_t recent_refaults, prefetch_dropped_late, watchdog_reports;
    uint64_t fault_thread_moves, follow_pauses, protect_handoffs, protect_handoffs_withdrawn;
    uint64_t neighbour_reads, blocks_compacted, room_waits;
    uint64_t budget_bytes, resident_pages, peak_resident_pages, backend_bytes, prefetch_inflight;
    uint64_t fetch_p50_ns, fetch_p99_ns, fetch_max_ns;
    uint64_t evict_p50_ns, evict_p99_ns, evict_max_ns;
    uint64_t far_pages, far_held_bytes, far_file_bytes;
    uint64_t other_bytes; /* the process's other anonymous memory, within the budget under
                             farmem run (FARMEM_BUDGET_SCOPE=process), else 0 */
    uint64_t tree_uncounted_bytes; /* memory of the process tree's cgroup that no process of
                                      it counts, within the tree's budget (FARMEM_CGROUP),
                                      else 0 */
    uint64_t protected_pages; /* resident pages the reclaim policy protects now (a loop
                                 larger than the budget: keep part of it) */
};

/* Start the process-wide runtime from FARMEM_* environment variables (FARMEM_LOCAL_MEM,
 * FARMEM_BACKEND, FARMEM_EVICT_BATCH, ...). Optional: the first region starts it.
 * Returns 0, or -1 with a message in fm_last_error(). */
int fm_init(void);
/* Create a far-memory region of `size` bytes (page-rounded, zero-filled); NULL on error. */
void *fm_region_create(size_t size);
/* Free a region made by fm_region_create (all its pages, local and far). 0 or -1. */
int fm_region_destroy(void *base);
/* Change the local budget to `bytes` while running: shrinking evicts at once and returns
 * when the resident set fits (within 10 s), growing stops evicting. 0, or -1 with a message
 * in fm_last_error() (below the minimum budget, or it could not shrink in time). */
int fm_set_local_mem(size_t bytes);
/* Copy the statistics into *out. 0 or -1. */
int fm_stats(struct fm_stats *out);
/* Print the statistics to stderr. (FARMEM_STATS=1 prints them at exit.) */
void fm_stats_print(void);
/* sizeof(struct fm_stats) in the library (to detect a header/library mismatch). */
size_t fm_stats_size(void);
/* Message of the calling thread's last failed call. */
const char *fm_last_error(void);

/* Inline check: is there work for the runtime? (weak guard absent -> no; table not reserved
 * -> mask 0 and a zero word -> no; page present with the permission -> no) */
#define FM__NEEDS(addr, bit)                                                                 \
    (__builtin_expect(&fm_guard != 0, 1) &&                                                  \
     __builtin_expect((fm_guard.table[((uintptr_t)(addr) >> 12) & fm_guard.mask] & (bit)) != 0, 0))

#ifdef FARMEM_NO_HINTS
/* Hints compiled out: nothing is checked and the runtime is never called. */
static inline void fm_hint(const void *addr) { (void)addr; }
static inline void fm_hint_write(const void *addr) { (void)addr; }
static inline void fm_hint_ex(const void *addr, size_t len, unsigned flags, int readahead,
                              int ev_prio) {
    (void)addr, (void)len, (void)flags, (void)readahead, (void)ev_prio;
}
#else
/* The next access to addr reads it. */
static inline __attribute__((always_inline)) void fm_hint(const void *addr) {
    if (FM__NEEDS(addr, FM__ABSENT | FM__IDLE))
        fm_hint_slow(addr, 1, 0, 0, 0);
}

/* The next access to addr writes it. */
static inline __attribute__((always_inline)) void fm_hint_write(const void *addr) {
    if (FM__NEEDS(addr, FM__NOWRITE | FM__IDLE))
        fm_hint_slow(addr, 1, FM_WRITE, 0, 0);
}

/* Extended hint: len bytes from addr will be accessed (FM_WRITE: written); also read ahead up
 * to readahead absent pages after the range (before it if negative); pages fetched get eviction
 * priority ev_prio (0..7, higher evicted first by policies that use it). */
static inline __attribute__((always_inline)) void fm_hint_ex(const void *addr, size_t len,
                                                             unsigned flags, int readahead,
                                                             int ev_prio) {
    uint64_t bit = FM__IDLE | ((flags & FM_WRITE) ? FM__NOWRITE : FM__ABSENT);
    if (FM__NEEDS(addr, bit) ||
        (len > 4096u - ((uintptr_t)(addr) & 4095u) && &fm_guard != 0))
        fm_hint_slow(addr, len, flags, readahead, ev_prio);
}
#endif /* FARMEM_NO_HINTS */

#ifdef __cplusplus
}
#endif
#endif /* FARMEM_H */
