/*
 * policy_sim: how many pages would each reclaim policy read back on the suite's kvs or
 * dictgrow?
 *
 * Generates the page-access sequence of `kvs MIB` (crates/farmem-bench/workloads/kvs.c:
 * same table layout, same requests) or of the lookups of `dictgrow MIB` (dictgrow.c: its
 * objects, entries and final index, every probe reading an entry) and replays it against a
 * local budget of BUDGET pages, from the state its init leaves (every page touched once in
 * address order), counting the pages each policy would have to read back (page-ins) during
 * the requests:
 *
 *   lru       exact LRU (what per-access information buys at best)
 *   clock     second chance with a reference bit set by every access (Linux's shape)
 *   fifo      no access information (all a user-space pager sees of a resident page)
 *   refault   fifo plus refault-distance credits (farmem's second-chance: a page whose
 *             refault distance is under the budget comes back one level higher, up to 3,
 *             and survives level + 1 extra passes of the hand)
 *   nbavg     refault credits, a page's level taken from its 2 MiB neighbourhood instead
 *             of its own refaults in a row: the neighbourhood's average refault distance
 *             (moving 1/8 per refault) against the average over all refaults (1/1024):
 *             shorter by any, 1.2x, 1.5x: levels 1, 2, 3 (a data structure's pages are used
 *             alike, so the average says how hot they are, even those that stay local and
 *             never show a use; the higher of the two levels did half as well)
 *   inact P   refault, with P% of the budget an unmapped inactive list: a touch there is
 *             a minor fault (no read) that moves the page back to the active list
 *             (a "soft inactive list" through UFFDIO_MOVE); its minor faults are printed
 *
 * usage: policy_sim [kvs|dictgrow] MIB BUDGET_PAGES [BUDGET_PAGES...]   (default kvs)
 */
#include "../crates/farmem-bench/workloads/common.h"

#define REQ_PER_MIB 128
#define LOOKUPS 32
#define OBJ_BYTES 8192u
#define EMPTY UINT64_MAX
#define REGION_SLOTS 65536
#define MAX_LEVEL 3

static uint64_t nslots;

static uint64_t home_slot(uint64_t key) {
    return (uint64_t)(((unsigned __int128)mix64(key ^ 0x6b7673ull) * nslots) >> 64);
}

/* ---- the trace ---- */

static uint32_t *trace;
static size_t ntrace, cap;

static void record(uint32_t page) {
    if (ntrace > 0 && trace[ntrace - 1] == page)
        return;
    if (ntrace == cap) {
        cap = cap ? 2 * cap : 1 << 20;
        trace = realloc(trace, cap * sizeof *trace);
        if (trace == NULL)
            die("out of memory");
    }
    trace[ntrace++] = page;
}

/* kvs's keys and table (insertion in region order, as its build_table), then its requests:
 * one page per probe of the table, the two pages of each object after the table's pages. */
static uint32_t make_trace(uint64_t mib) {
    nslots = mib * MIB / 2 / 16;
    uint64_t nkeys = nslots / 2, nobjs = mib * MIB / 2 / OBJ_BYTES, nreq = mib * REQ_PER_MIB;
    uint64_t *keys = malloc(nslots * 16), *order = malloc(nkeys * 8);
    uint64_t nreg = (nslots + REGION_SLOTS - 1) / REGION_SLOTS;
    uint64_t *start = calloc(nreg + 1, 8);
    if (keys == NULL || order == NULL || start == NULL)
        die("out of memory");
    for (uint64_t k = 0; k < nkeys; k++)
        start[home_slot(k) / REGION_SLOTS + 1]++;
    for (uint64_t r = 0; r < nreg; r++)
        start[r + 1] += start[r];
    for (uint64_t k = 0; k < nkeys; k++)
        order[start[home_slot(k) / REGION_SLOTS]++] = k;
    memset(keys, 0xff, nslots * 16);
    for (uint64_t n = 0; n < nkeys; n++) {
        uint64_t k = order[n], i = home_slot(k);
        while (keys[2 * i] != EMPTY)
            i = i + 1 == nslots ? 0 : i + 1;
        keys[2 * i] = k;
    }
    struct zipf zkey, zobj;
    struct perm pkey, pobj;
    zipf_init(&zkey, nkeys, 0.8);
    zipf_init(&zobj, nobjs, 0.8);
    perm_init(&pkey, nkeys, 1);
    perm_init(&pobj, nobjs, 2);
    uint32_t table_pages = (uint32_t)(nslots * 16 / PAGE);
    for (uint64_t r = 0; r < nreq; r++) {
        struct rng rng;
        rng_seed(&rng, r);
        for (int l = 0; l < LOOKUPS; l++) {
            uint64_t key = perm_apply(&pkey, zipf_next(&zkey, &rng));
            for (uint64_t i = home_slot(key);; i = i + 1 == nslots ? 0 : i + 1) {
                record((uint32_t)(i * 16 / PAGE));
                if (keys[2 * i] == key || keys[2 * i] == EMPTY)
                    break;
            }
        }
        uint64_t o = perm_apply(&pobj, zipf_next(&zobj, &rng));
        record(table_pages + (uint32_t)(o * 2));
        record(table_pages + (uint32_t)(o * 2 + 1));
    }
    free(keys);
    free(order);
    free(start);
    return table_pages + (uint32_t)(nobjs * 2);
}

/* dictgrow's lookups (crates/farmem-bench/workloads/dictgrow.c): its objects (48 B plus the
 * allocator's 16, in insertion order), then its entries array (24 B each), then its final
 * index (4-byte slots, linear probing, every probe reading the entry it names). */
static uint32_t make_dict_trace(uint64_t mib) {
    uint64_t keys = mib * MIB / 110, cap = 8;
    while ((keys + 1) * 3 > cap * 2)
        cap *= 2;
    uint32_t *idx = malloc(cap * 4);
    uint64_t *hs = malloc(keys * 8);
    if (idx == NULL || hs == NULL)
        die("out of memory");
    memset(idx, 0xff, cap * 4);
    for (uint64_t i = 0; i < keys; i++) {
        uint64_t h = mix64(mix64(i ^ 0xd1c7)), s = h & (cap - 1);
        hs[i] = h;
        while (idx[s] != UINT32_MAX)
            s = (s + 1) & (cap - 1);
        idx[s] = (uint32_t)i;
    }
    uint32_t ent0 = (uint32_t)((keys * 64 + PAGE - 1) / PAGE);
    uint32_t idx0 = ent0 + (uint32_t)((keys * 24 + PAGE - 1) / PAGE);
    struct rng r;
    rng_seed(&r, 77);
    for (uint64_t l = 0; l < keys / 16; l++) {
        uint64_t k = rng_next(&r) % keys, h = mix64(mix64(k ^ 0xd1c7));
        for (uint64_t s = h & (cap - 1);; s = (s + 1) & (cap - 1)) {
            record(idx0 + (uint32_t)(s * 4 / PAGE));
            uint32_t e = idx[s];
            record(ent0 + (uint32_t)(e * 24ull / PAGE));
            if (hs[e] == h)
                break;
        }
        record((uint32_t)(k * 64 / PAGE));
    }
    free(idx);
    free(hs);
    return idx0 + (uint32_t)(cap * 4 / PAGE);
}

/* ---- an intrusive list of pages ---- */

static int32_t *prv, *nxt;
struct list {
    int32_t head, tail;
    long size;
};

static void push(struct list *l, int32_t p) { /* at the head (newest) */
    prv[p] = -1;
    nxt[p] = l->head;
    if (l->head >= 0)
        prv[l->head] = p;
    l->head = p;
    if (l->tail < 0)
        l->tail = p;
    l->size++;
}
static void unlink_page(struct list *l, int32_t p) {
    if (prv[p] >= 0)
        nxt[prv[p]] = nxt[p];
    else
        l->head = nxt[p];
    if (nxt[p] >= 0)
        prv[nxt[p]] = prv[p];
    else
        l->tail = prv[p];
    l->size--;
}
static int32_t pop_oldest(struct list *l) {
    int32_t p = l->tail;
    unlink_page(l, p);
    return p;
}

/* ---- the policies ---- */

enum policy { LRU, CLOCK, FIFO, REFAULT, NBAVG, INACTIVE };
#define NB_PAGES 512
enum where { FAR, ACTIVE, INACT };

struct result {
    long pageins, minor;
};

static struct result replay(enum policy pol, uint32_t npages, long budget, int inact_pct) {
    uint8_t *where = calloc(npages, 1), *ref = calloc(npages, 1), *level = calloc(npages, 1),
            *credit = calloc(npages, 1);
    uint64_t *shadow = calloc(npages, 8), clock = 0;
    double *nbavg = calloc(npages / NB_PAGES + 1, sizeof *nbavg), overall = 0;
    if (!where || !ref || !level || !credit || !shadow || !nbavg)
        die("out of memory");
    struct list act = {-1, -1, 0}, ina = {-1, -1, 0};
    long active_max = pol == INACTIVE ? budget - budget * inact_pct / 100 : budget;
    struct result res = {0, 0};
    /* Init: every page written once in address order. */
    size_t n = npages + ntrace;
    for (size_t t = 0; t < n; t++) {
        uint32_t p = t < npages ? (uint32_t)t : trace[t - npages];
        int counting = t >= npages;
        if (where[p] == ACTIVE) {
            if (pol == LRU) {
                unlink_page(&act, p);
                push(&act, p);
            }
            ref[p] = 1;
            continue;
        }
        if (where[p] == INACT) {
            res.minor += counting;
            unlink_page(&ina, p);
            if (level[p] < MAX_LEVEL)
                level[p]++;
        } else {
            res.pageins += counting;
            /* A recent refault (distance under the budget) climbs a level. */
            int recent = shadow[p] != 0 && clock - shadow[p] < (uint64_t)budget;
            level[p] = recent ? (level[p] < MAX_LEVEL ? level[p] + 1 : MAX_LEVEL) : 0;
            if (pol == NBAVG && shadow[p] != 0) {
                double d = (double)(clock - shadow[p]), *a = &nbavg[p / NB_PAGES];
                *a = *a == 0 ? d : *a + (d - *a) / 8;
                overall = overall == 0 ? d : overall + (d - overall) / 1024;
                double q = overall / *a;
                level[p] = q > 1.5 ? 3 : q > 1.2 ? 2 : q > 1 ? 1 : 0;
            }
        }
        while (act.size >= active_max) {
            int32_t v = pop_oldest(&act);
            if (pol == CLOCK && ref[v]) {
                ref[v] = 0;
                push(&act, v);
                continue;
            }
            if ((pol == REFAULT || pol == NBAVG || pol == INACTIVE) && credit[v] > 0) {
                credit[v]--;
                push(&act, v);
                continue;
            }
            if (pol == INACTIVE) {
                where[v] = INACT;
                push(&ina, v);
                if (ina.size > budget - active_max) {
                    int32_t e = pop_oldest(&ina);
                    where[e] = FAR;
                    shadow[e] = ++clock;
                }
                continue;
            }
            where[v] = FAR;
            shadow[v] = ++clock;
        }
        push(&act, p);
        where[p] = ACTIVE;
        ref[p] = 0;
        /* farmem: a working-set page starts used (one pass) with `level` credits. */
        credit[p] = level[p] ? level[p] + 1 : 0;
    }
    free(where);
    free(ref);
    free(level);
    free(credit);
    free(shadow);
    free(nbavg);
    return res;
}

int main(int argc, char **argv) {
    uint64_t mib;
    int dict = argc > 1 && strcmp(argv[1], "dictgrow") == 0;
    if (argc > 1 && (dict || strcmp(argv[1], "kvs") == 0)) {
        argv++;
        argc--;
    }
    if (argc < 3 || parse_u64(argv[1], 1, 1 << 16, &mib) != 0)
        die("usage: policy_sim [kvs|dictgrow] MIB BUDGET_PAGES [BUDGET_PAGES...]");
    uint32_t npages = dict ? make_dict_trace(mib) : make_trace(mib);
    prv = malloc(npages * sizeof *prv);
    nxt = malloc(npages * sizeof *nxt);
    if (prv == NULL || nxt == NULL)
        die("out of memory");
    printf("%s %llu MiB: %zu page accesses (repeats of one page merged) over %u pages\n",
           dict ? "dictgrow" : "kvs", (unsigned long long)mib, ntrace, npages);
    for (int a = 2; a < argc; a++) {
        uint64_t budget;
        if (parse_u64(argv[a], 16, npages, &budget) != 0)
            die("budget %s: 16 to %u pages", argv[a], npages);
        printf("budget %llu pages: page-ins", (unsigned long long)budget);
        const char *names[] = {"lru", "clock", "fifo", "refault", "nbavg"};
        for (int p = LRU; p <= NBAVG; p++)
            printf("  %s %ld", names[p], replay(p, npages, (long)budget, 0).pageins);
        printf("\n");
        for (int pct = 10; pct <= 30; pct += 10) {
            struct result r = replay(INACTIVE, npages, (long)budget, pct);
            printf("  inactive %d%%: page-ins %ld, minor faults %ld\n", pct, r.pageins,
                   r.minor);
        }
    }
    return 0;
}
