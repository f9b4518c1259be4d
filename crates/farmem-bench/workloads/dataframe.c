/*
 * dataframe: column-store analytics (the pattern of Eden's DataFrame experiment). A table
 * of `rows` rows is stored as five column arrays, which together fill the footprint:
 *     grp u32 (0..1023, skewed)  qty i32  price i64 (cents)  flag u8 (0..3)  ts i64 (ms)
 * The measured phase runs ROUNDS rounds of three filter + group-by queries, each a
 * sequential scan of 2-4 columns aggregating into a small local table:
 *     Q1  where flag == 1 and ts in [lo, hi)   group by grp: count, sum(qty)
 *     Q2  where price > p                      group by grp: count, sum(price), max(price)
 *     Q3  where qty > 0                        group by grp: sum(qty * price)
 * with different constants in every round.
 *
 * usage: dataframe <MiB> [threads, ignored]     ops = rows scanned (summed over queries)
 */
#include "common.h"
#include "farmem.h"

#define ROUNDS 4
#define NGRP 1024
#define BLOCK 512 /* rows per block: one page of an 8-byte column */
#define ROW_BYTES (4 + 4 + 8 + 1 + 8)
#define TS0 1600000000000ll

static uint32_t *grp;
static int32_t *qty;
static int64_t *price;
static uint8_t *flag;
static int64_t *ts;
static uint64_t rows;

/* At every page boundary of a scanned column, fetch the page and read the next 63 pages
 * ahead: the scans are pure streams, so the runtime can stay ahead of them. */
#define SCAN_HINT(col, i)                                                                  \
    do {                                                                                   \
        if (((uintptr_t)&(col)[i] & (PAGE - 1)) == 0)                                      \
            fm_hint_ex(&(col)[i], PAGE, FM_SEQ, 63, 0);                                    \
    } while (0)

/* Fold an aggregate table into the result checksum (order-dependent, single-threaded). */
static uint64_t fold(uint64_t h, const uint64_t *v, unsigned n) {
    for (unsigned i = 0; i < n; i++)
        h = mix64(h ^ v[i]);
    return h;
}

static uint64_t q1(uint64_t h, int64_t lo, int64_t hi) {
    uint64_t cnt[NGRP] = {0}, sum[NGRP] = {0};
    for (uint64_t b = 0; b < rows; b += BLOCK) {
        uint64_t e = b + BLOCK < rows ? b + BLOCK : rows;
        SCAN_HINT(flag, b);
        SCAN_HINT(ts, b);
        SCAN_HINT(grp, b);
        SCAN_HINT(qty, b);
        for (uint64_t i = b; i < e; i++) {
            if (flag[i] == 1 && ts[i] >= lo && ts[i] < hi) {
                cnt[grp[i]]++;
                sum[grp[i]] += (uint64_t)(int64_t)qty[i];
            }
        }
    }
    return fold(fold(h, cnt, NGRP), sum, NGRP);
}

static uint64_t q2(uint64_t h, int64_t p) {
    uint64_t cnt[NGRP] = {0}, sum[NGRP] = {0}, max[NGRP] = {0};
    for (uint64_t b = 0; b < rows; b += BLOCK) {
        uint64_t e = b + BLOCK < rows ? b + BLOCK : rows;
        SCAN_HINT(price, b);
        SCAN_HINT(grp, b);
        for (uint64_t i = b; i < e; i++) {
            if (price[i] > p) {
                uint32_t g = grp[i];
                cnt[g]++;
                sum[g] += (uint64_t)price[i];
                if ((uint64_t)price[i] > max[g])
                    max[g] = (uint64_t)price[i];
            }
        }
    }
    return fold(fold(fold(h, cnt, NGRP), sum, NGRP), max, NGRP);
}

static uint64_t q3(uint64_t h) {
    uint64_t rev[NGRP] = {0};
    for (uint64_t b = 0; b < rows; b += BLOCK) {
        uint64_t e = b + BLOCK < rows ? b + BLOCK : rows;
        SCAN_HINT(qty, b);
        SCAN_HINT(price, b);
        SCAN_HINT(grp, b);
        for (uint64_t i = b; i < e; i++)
            if (qty[i] > 0)
                rev[grp[i]] += (uint64_t)qty[i] * (uint64_t)price[i];
    }
    return fold(h, rev, NGRP);
}

int main(int argc, char **argv) {
    uint64_t mib;
    parse_args(argc, argv, &mib, NULL, 256);
    rows = mib * MIB / ROW_BYTES;

    struct big m[5];
    grp = big_alloc(&m[0], rows * sizeof *grp, "grp");
    qty = big_alloc(&m[1], rows * sizeof *qty, "qty");
    price = big_alloc(&m[2], rows * sizeof *price, "price");
    flag = big_alloc(&m[3], rows * sizeof *flag, "flag");
    ts = big_alloc(&m[4], rows * sizeof *ts, "ts");
    for (uint64_t i = 0; i < rows; i++) {
        uint64_t r = mix64(i);
        /* product of two uniforms: small groups are much more frequent */
        grp[i] = (uint32_t)(((r & 1023) * ((r >> 10) & 1023)) >> 10);
        int32_t q = (int32_t)((r >> 20) % 100) + 1;
        qty[i] = ((r >> 27) & 15) == 0 ? -q : q; /* some returns */
        price[i] = (int64_t)((r >> 32) % 100000) + 1;
        flag[i] = (uint8_t)((r >> 60) & 3);
        ts[i] = TS0 + (int64_t)i * 40 + (int64_t)((r >> 48) & 63); /* an event log */
    }

    uint64_t h = rows;
    double t0 = now_secs();
    for (int64_t round = 0; round < ROUNDS; round++) {
        int64_t span = (int64_t)rows * 40, lo = TS0 + span * round / (2 * ROUNDS);
        h = q1(h, lo, lo + span / 2); /* a sliding window over half of the log */
        h = q2(h, 50000 + 5000 * round);
        h = q3(h);
    }
    double secs = now_secs() - t0;

    printf("result=rows:%llu aggregates:%016llx\n", (unsigned long long)rows,
           (unsigned long long)h);
    print_ops(rows * 3 * ROUNDS, secs);
    for (int c = 0; c < 5; c++)
        big_free(&m[c]);
    return 0;
}
