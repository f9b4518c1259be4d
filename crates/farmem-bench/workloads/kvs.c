/*
 * kvs: the synthetic web-service front end of AIFM / Eden. Half of the footprint is an
 * open-addressing hash table (16-byte entries, linear probing, load factor 0.5) holding
 * keys 0..K-1; the other half is an array of 8 KiB objects. A request looks up 32 keys
 * drawn from Zipf(0.8) and then reads one 8 KiB object drawn from Zipf(0.8); popularity
 * ranks are scrambled by a permutation so hot keys and objects are spread out. Request r
 * draws its keys from its own seed (r), so the work does not depend on the thread count.
 *
 * usage: kvs <MiB> [threads]     ops = requests
 */
#include <pthread.h>

#include "common.h"
#include "farmem.h"

#define REQ_PER_MIB 128 /* requests per MiB of footprint */
#define LOOKUPS 32
#define OBJ_BYTES 8192u
#define OBJ_WORDS (OBJ_BYTES / 8)
#define EMPTY UINT64_MAX
#define MAX_THREADS 256

struct entry {
    uint64_t key, value;
};

static struct entry *table;
static uint64_t nslots, nkeys, nobjs, nreq;
static uint64_t *objs;
static struct zipf zkey, zobj;
static struct perm pkey, pobj;

static inline uint64_t home_slot(uint64_t key) {
    return (uint64_t)(((unsigned __int128)mix64(key ^ 0x6b7673ull) * nslots) >> 64);
}
static inline uint64_t value_of(uint64_t key) { return mix64(key * 3 + 1); }

static uint64_t lookup(uint64_t key) {
    for (uint64_t i = home_slot(key);; i = i + 1 == nslots ? 0 : i + 1) {
        /* Each probe is a random access into a table much larger than local memory:
         * bring the slot's page in before reading it. */
        fm_hint(&table[i]);
        if (table[i].key == key)
            return table[i].value;
        if (table[i].key == EMPTY)
            die("kvs: key %llu missing", (unsigned long long)key);
    }
}

/* Insert keys 0..K-1. Inserting them in key order would write the table at random, which
 * is slow once the table is larger than local memory (every insert a fault under farmem).
 * So the keys are first bucketed by table region (a counting sort into `scratch`, the
 * not yet initialized object area) and then inserted region by region: the table is
 * written almost sequentially. The resulting layout only depends on the data. */
#define REGION_SLOTS 65536
static void build_table(uint64_t *scratch) {
    uint64_t nreg = (nslots + REGION_SLOTS - 1) / REGION_SLOTS;
    uint64_t *start = calloc(nreg + 1, sizeof *start);
    if (start == NULL)
        die("malloc of region counts failed");
    for (uint64_t k = 0; k < nkeys; k++)
        start[home_slot(k) / REGION_SLOTS + 1]++;
    for (uint64_t r = 0; r < nreg; r++)
        start[r + 1] += start[r];
    for (uint64_t k = 0; k < nkeys; k++) /* start[r] ends as the end of region r */
        scratch[start[home_slot(k) / REGION_SLOTS]++] = k;

    memset(table, 0xff, nslots * sizeof(struct entry)); /* all EMPTY */
    for (uint64_t n = 0; n < nkeys; n++) {
        uint64_t k = scratch[n], i = home_slot(k);
        while (table[i].key != EMPTY)
            i = i + 1 == nslots ? 0 : i + 1;
        table[i].key = k;
        table[i].value = value_of(k);
    }
    free(start);
}

struct job {
    pthread_t tid;
    uint64_t lo, hi;
    uint64_t vsum, osum;
};

static void *worker(void *arg) {
    struct job *j = arg;
    uint64_t vsum = 0, osum = 0;
    for (uint64_t r = j->lo; r < j->hi; r++) {
        struct rng rng;
        rng_seed(&rng, r);
        for (int l = 0; l < LOOKUPS; l++)
            vsum += lookup(perm_apply(&pkey, zipf_next(&zkey, &rng)));
        const uint64_t *o = objs + perm_apply(&pobj, zipf_next(&zobj, &rng)) * OBJ_WORDS;
        /* The object is read whole: fetch both its pages at once, and give them eviction
         * priority 7 so a priority policy evicts big cold objects before the hash table,
         * whose pages serve 32 lookups per request. */
        fm_hint_ex(o, OBJ_BYTES, 0, 0, 7);
        uint64_t s = 0;
        for (unsigned w = 0; w < OBJ_WORDS; w++)
            s += o[w];
        osum += mix64(s);
    }
    j->vsum = vsum;
    j->osum = osum;
    return NULL;
}

int main(int argc, char **argv) {
    uint64_t mib;
    unsigned nthreads;
    parse_args(argc, argv, &mib, &nthreads, MAX_THREADS);
    nslots = mib * MIB / 2 / sizeof(struct entry);
    nkeys = nslots / 2;
    nobjs = mib * MIB / 2 / OBJ_BYTES;
    nreq = mib * REQ_PER_MIB;

    /* Init (untimed): table, objects, generators. */
    struct big tmem, omem;
    table = big_alloc(&tmem, nslots * sizeof(struct entry), "hash table");
    objs = big_alloc(&omem, nobjs * OBJ_BYTES, "objects");
    build_table(objs); /* the object area (F/2 bytes) holds the K key ids (F/8 bytes) */
    for (uint64_t w = 0; w < nobjs * OBJ_WORDS; w++)
        objs[w] = mix64(w ^ 0x0b1ec7ull);
    zipf_init(&zkey, nkeys, 0.8);
    zipf_init(&zobj, nobjs, 0.8);
    perm_init(&pkey, nkeys, 1);
    perm_init(&pobj, nobjs, 2);

    struct job jobs[MAX_THREADS];
    double t0 = now_secs();
    for (unsigned t = 0; t < nthreads; t++) {
        jobs[t].lo = nreq * t / nthreads;
        jobs[t].hi = nreq * (t + 1) / nthreads;
        int e = pthread_create(&jobs[t].tid, NULL, worker, &jobs[t]);
        if (e != 0)
            die("pthread_create: %s", strerror(e));
    }
    uint64_t vsum = 0, osum = 0;
    for (unsigned t = 0; t < nthreads; t++) {
        int e = pthread_join(jobs[t].tid, NULL);
        if (e != 0)
            die("pthread_join: %s", strerror(e));
        vsum += jobs[t].vsum;
        osum += jobs[t].osum;
    }
    double secs = now_secs() - t0;

    printf("result=requests:%llu values:%016llx objects:%016llx\n", (unsigned long long)nreq,
           (unsigned long long)vsum, (unsigned long long)osum);
    print_ops(nreq, secs);
    big_free(&omem);
    big_free(&tmem);
    return 0;
}
