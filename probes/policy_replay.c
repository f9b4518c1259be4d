/*
 * policy_replay: replay a program's page accesses against reclaim policies, counting the
 * pages each would read back at a given number of resident pages.
 *
 * The accesses come from a fault log of `farmem trace` (FARMEM_TRACE_DIR) recorded with a
 * local budget far below the program's, FIFO, no read-ahead and writable installs, so that
 * nearly every access to a page faults:
 *
 *   FARMEM_TRACE_DIR=/tmp/t FARMEM_POLICY=fifo FARMEM_FAULT_READAHEAD=0 \
 *     FARMEM_WRITABLE_INSTALL=1 farmem run --local-mem 8M --backend local:// -- PROGRAM
 *
 * Accesses to the few pages that stay resident under that budget are lost, which matters
 * only for budgets of that size. The policies see only faults, as farmem does (no accessed
 * bits):
 *
 *   fifo      evict in arrival order
 *   sc BAR    farmem's second chance: a refault at distance (pages evicted since) under
 *             BAR x resident pages comes back one level higher (up to 3), used, with as
 *             many extra passes of the hand; any other fault starts idle
 *   jump BAR  the same, with the hand jumping to a random segment of 64 ring entries in the
 *             older half after each 64 looked at
 *   duel BAR  the default policy's level 0 (crates/farmem-runtime/src/policy/dueling.rs):
 *             pages split by a hash into groups; one in 64 always on sc, one in 64 always
 *             with a protected band (a recent refault enters it while it holds under 9/10
 *             of its group's share; once full, one in 8 recent refaults lets its oldest page
 *             back into the ring; evicted only when the ring is empty), each leader held to
 *             its share (1/64) of the resident pages; the rest follow whichever leader missed
 *             less (a counter saturating at +-1024)
 *
 * usage: policy_replay FAULTLOG BAR RESIDENT_PAGES [RESIDENT_PAGES...]
 * example (sqlite3's GROUP BY through an index, 128 MiB table): see probes/README.md
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t *acc, npages;
static size_t nacc;

/* Page numbers to dense ids: open addressing over the page-aligned addresses. */
static uint32_t page_id(uint64_t page, uint64_t *keys, uint32_t *ids, size_t cap) {
    size_t h = (page * 0x9E3779B97F4A7C15ull) >> 20;
    for (;; h++) {
        size_t i = h & (cap - 1);
        if (keys[i] == page + 1)
            return ids[i];
        if (keys[i] == 0) {
            keys[i] = page + 1;
            return ids[i] = npages++;
        }
    }
}

static void load(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f) / 24;
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(n * 24);
    if (b == NULL || fread(b, 24, n, f) != n) {
        fprintf(stderr, "%s: cannot read\n", path);
        exit(1);
    }
    size_t cap = 1;
    while (cap < 2 * n + 16)
        cap <<= 1;
    uint64_t *keys = calloc(cap, 8);
    uint32_t *ids = malloc(cap * 4);
    acc = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        unsigned char kind = b[i * 24 + 12]; /* 0 zero fill, 1 fetch: the page was absent */
        uint64_t addr;
        memcpy(&addr, b + i * 24 + 16, 8);
        if (kind <= 1)
            acc[nacc++] = page_id(addr >> 12, keys, ids, cap);
    }
    free(b);
    free(keys);
    free(ids);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

enum { FIFO, SC, JUMP, DUEL };
#define SEGMENT 64

static long replay(int policy, double bar, size_t resident_max) {
    uint8_t *res = calloc(npages, 1), *used = calloc(npages, 1), *level = calloc(npages, 1),
            *credit = calloc(npages, 1);
    uint64_t *shadow = calloc(npages, 8);
    size_t cap = npages + 1, head = 0, tail = 0, resident = 0, seg_left = 0;
    uint32_t *ring = malloc(cap * 4);
    uint64_t clock = 1;
    long misses = 0;
    for (size_t i = 0; i < nacc; i++) {
        uint32_t p = acc[i];
        if (res[p])
            continue; /* no accessed bits: a hit leaves no trace */
        misses++;
        while (resident >= resident_max) {
            size_t len = tail - head, half = len / 2;
            if (policy == JUMP && seg_left == 0 && half >= 2 * SEGMENT) {
                size_t at = SEGMENT + next_rand() % (half - SEGMENT);
                for (size_t j = 0; j < SEGMENT; j++) {
                    uint32_t t = ring[(head + j) % cap];
                    ring[(head + j) % cap] = ring[(head + at + j) % cap];
                    ring[(head + at + j) % cap] = t;
                }
            }
            seg_left = seg_left ? seg_left - 1 : SEGMENT - 1;
            uint32_t v = ring[head++ % cap];
            if (policy != FIFO && (used[v] || credit[v])) {
                if (used[v])
                    used[v] = 0;
                else
                    credit[v]--;
                ring[tail++ % cap] = v;
                continue;
            }
            res[v] = 0;
            resident--;
            shadow[v] = clock++;
        }
        if (policy != FIFO) {
            int recent = shadow[p] && (double)(clock - shadow[p]) < bar * (double)resident;
            level[p] = recent ? (level[p] < 3 ? level[p] + 1 : 3) : 0;
            credit[p] = level[p];
            used[p] = recent;
        }
        res[p] = 1;
        resident++;
        ring[tail++ % cap] = p;
    }
    free(res);
    free(used);
    free(level);
    free(credit);
    free(shadow);
    free(ring);
    return misses;
}

/* The dueling groups of `duel`: 0 the sc leader, 1 the band's leader, 2 the followers. */
#define SHARE 64
#define PSEL_MAX 1024
typedef struct {
    uint32_t *ring, *band;
    size_t rh, rt, bh, bt;
} Group;

static size_t group_len(const Group *g) { return (g->rt - g->rh) + (g->bt - g->bh); }

static int group_of(uint32_t p) {
    uint32_t h = (uint32_t)(((uint64_t)p * 0x9E3779B97F4A7C15ull) >> 40) % SHARE;
    return h == 0 ? 0 : h == 1 ? 1 : 2;
}

static long replay_duel(double bar, size_t resident_max) {
    uint8_t *res = calloc(npages, 1), *used = calloc(npages, 1), *level = calloc(npages, 1),
            *credit = calloc(npages, 1);
    uint64_t *shadow = calloc(npages, 8);
    size_t cap = npages + 1, resident = 0;
    Group g[3];
    for (int k = 0; k < 3; k++) {
        g[k].ring = malloc(cap * 4);
        g[k].band = malloc(cap * 4);
        g[k].rh = g[k].rt = g[k].bh = g[k].bt = 0;
    }
    uint64_t clock = 1, knocks = 0;
    long psel = 0, misses = 0;
    for (size_t i = 0; i < nacc; i++) {
        uint32_t p = acc[i];
        if (res[p])
            continue;
        misses++;
        while (resident >= resident_max) {
            size_t share = resident / SHARE;
            int e = group_len(&g[0]) > share ? 0 : group_len(&g[1]) > share ? 1 : 2;
            if (group_len(&g[e]) == 0)
                e = group_len(&g[2]) ? 2 : group_len(&g[0]) ? 0 : 1;
            Group *G = &g[e];
            if (e == 2 && psel <= 0 && G->bt > G->bh) /* followers on sc: the band drains */
                G->ring[G->rt++ % cap] = G->band[G->bh++ % cap];
            uint32_t v;
            if (G->rt > G->rh) {
                v = G->ring[G->rh++ % cap];
                if (used[v] || credit[v]) {
                    if (used[v])
                        used[v] = 0;
                    else
                        credit[v]--;
                    G->ring[G->rt++ % cap] = v;
                    continue;
                }
            } else {
                v = G->band[G->bh++ % cap];
            }
            res[v] = 0;
            resident--;
            shadow[v] = clock++;
        }
        int k = group_of(p);
        psel += k == 0 ? (psel < PSEL_MAX) : k == 1 ? -(psel > -PSEL_MAX) : 0;
        int recent = shadow[p] && (double)(clock - shadow[p]) < bar * (double)resident_max;
        level[p] = recent ? (level[p] < 3 ? level[p] + 1 : 3) : 0;
        credit[p] = level[p];
        used[p] = recent;
        Group *G = &g[k];
        res[p] = 1;
        if (recent && (k == 1 || (k == 2 && psel > 0))) {
            size_t share = resident / SHARE;
            size_t bcap = (k == 2 ? resident - 2 * share : share) * 9 / 10;
            if (G->bt - G->bh >= bcap && ++knocks % 8 == 0)
                G->ring[G->rt++ % cap] = G->band[G->bh++ % cap];
            if (G->bt - G->bh < bcap) {
                G->band[G->bt++ % cap] = p;
                resident++;
                continue;
            }
        }
        resident++;
        G->ring[G->rt++ % cap] = p;
    }
    for (int k = 0; k < 3; k++) {
        free(g[k].ring);
        free(g[k].band);
    }
    free(res);
    free(used);
    free(level);
    free(credit);
    free(shadow);
    return misses;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: policy_replay FAULTLOG BAR RESIDENT_PAGES...\n");
        return 1;
    }
    load(argv[1]);
    double bar = atof(argv[2]);
    printf("%zu accesses over %u pages; refault bar %.2f x resident\n", nacc, npages, bar);
    for (int a = 3; a < argc; a++) {
        size_t m = strtoul(argv[a], NULL, 10);
        if (m < 4 * SEGMENT || m >= npages) {
            fprintf(stderr, "resident pages %s: %d to %u\n", argv[a], 4 * SEGMENT, npages - 1);
            return 1;
        }
        printf("resident %zu: pages read back  fifo %ld  sc %ld  jump %ld  duel %ld\n", m,
               replay(FIFO, bar, m), replay(SC, bar, m), replay(JUMP, bar, m),
               replay_duel(bar, m));
    }
    return 0;
}
