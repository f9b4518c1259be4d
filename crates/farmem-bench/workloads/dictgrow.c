/*
 * dictgrow: a hash table that grows while it is filled, in the layout of CPython's dict
 * (and of many others): an index of 32-bit slots (open addressing, linear probing) pointing
 * into a dense array of entries (hash, key, value) appended in insertion order, each value
 * an object of its own on the heap. When the index is two-thirds full, it is rebuilt at
 * twice the size and the entries array is reallocated: the rebuild writes the new index at
 * random. Then a sixteenth of the keys, drawn at random, are looked up (and their objects
 * read). Footprint at the end: objects about 60%, entries 25%, index 15%. The timed phase is
 * the whole fill and the lookups.
 *
 * usage: dictgrow <MiB> [threads, ignored]     ops = inserts + lookups
 */
#include "common.h"
#include "farmem.h"

#define OBJ_BYTES 48 /* a small object: CPython's int or short str */
#define EMPTY UINT32_MAX

struct entry {
    uint64_t hash, key;
    uint64_t *value;
};

static uint32_t *index_;
static uint64_t cap; /* index slots, a power of two */
static struct entry *entries;
static uint64_t used, ecap;

static void rebuild(uint64_t ncap) {
    free(index_);
    index_ = malloc(ncap * sizeof *index_);
    if (index_ == NULL)
        die("dictgrow: malloc of the index failed");
    memset(index_, 0xff, ncap * sizeof *index_);
    cap = ncap;
    for (uint64_t i = 0; i < used; i++) {
        uint64_t s = entries[i].hash & (cap - 1);
        while (index_[s] != EMPTY)
            s = (s + 1) & (cap - 1);
        fm_hint_write(&index_[s]);
        index_[s] = (uint32_t)i;
    }
}

static void insert(uint64_t key, uint64_t *value) {
    if ((used + 1) * 3 > cap * 2) {
        rebuild(cap * 2);
    }
    if (used == ecap) {
        ecap = ecap * 2;
        entries = realloc(entries, ecap * sizeof *entries);
        if (entries == NULL)
            die("dictgrow: realloc of the entries failed");
    }
    uint64_t h = mix64(key), s = h & (cap - 1);
    while (index_[s] != EMPTY)
        s = (s + 1) & (cap - 1);
    index_[s] = (uint32_t)used;
    entries[used++] = (struct entry){h, key, value};
}

static uint64_t *lookup(uint64_t key) {
    uint64_t h = mix64(key);
    for (uint64_t s = h & (cap - 1);; s = (s + 1) & (cap - 1)) {
        fm_hint(&index_[s]);
        uint32_t e = index_[s];
        if (e == EMPTY)
            return NULL;
        fm_hint(&entries[e]);
        if (entries[e].hash == h && entries[e].key == key)
            return entries[e].value;
    }
}

int main(int argc, char **argv) {
    uint64_t mib;
    parse_args(argc, argv, &mib, NULL, 256);
    /* Per key: an object (48 B plus the allocator's 16), an entry (24 B, the array at most
     * twice that), index slots (4 B, 1.5-3 per key): about 110 B. */
    uint64_t keys = mib * MIB / 110;
    if (keys >= EMPTY)
        die("dictgrow: at most %u keys", EMPTY - 1);
    cap = 8;
    ecap = 8;
    index_ = malloc(cap * sizeof *index_);
    entries = malloc(ecap * sizeof *entries);
    if (index_ == NULL || entries == NULL)
        die("dictgrow: malloc failed");
    memset(index_, 0xff, cap * sizeof *index_);

    double t0 = now_secs();
    for (uint64_t k = 0; k < keys; k++) {
        uint64_t key = mix64(k ^ 0xd1c7);
        uint64_t *obj = malloc(OBJ_BYTES);
        if (obj == NULL)
            die("dictgrow: malloc of an object failed");
        for (unsigned w = 0; w < OBJ_BYTES / 8; w++)
            obj[w] = key + w;
        insert(key, obj);
    }
    struct rng r;
    rng_seed(&r, 77);
    uint64_t sum = 0, lookups = keys / 16;
    for (uint64_t i = 0; i < lookups; i++) {
        uint64_t k = rng_next(&r) % keys, key = mix64(k ^ 0xd1c7);
        const uint64_t *obj = lookup(key);
        if (obj == NULL || obj[0] != key || obj[OBJ_BYTES / 8 - 1] != key + OBJ_BYTES / 8 - 1)
            die("dictgrow: key %llu lost", (unsigned long long)k);
        sum += obj[1];
    }
    double secs = now_secs() - t0;

    printf("result=keys:%llu slots:%llu sum:%016llx\n", (unsigned long long)keys,
           (unsigned long long)cap, (unsigned long long)sum);
    print_ops(keys + lookups, secs);
    for (uint64_t i = 0; i < used; i++)
        free(entries[i].value);
    free(entries);
    free(index_);
    return 0;
}
