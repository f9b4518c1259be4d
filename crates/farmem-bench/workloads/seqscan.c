/*
 * seqscan: page-granular sequential scan of a large array (the "sequential access"
 * microbenchmark of Fastswap / AIFM / Eden). The array of u64 words is scanned PASSES
 * times in address order; each 4 KiB page is processed as a unit (all its 512 words
 * summed). Models streaming analytics over data much larger than local memory.
 *
 * usage: seqscan <MiB> [threads, ignored]     ops = pages processed
 */
#include "common.h"
#include "farmem.h"

#define PASSES 8

int main(int argc, char **argv) {
    uint64_t mib;
    parse_args(argc, argv, &mib, NULL, 256);
    uint64_t npages = mib * MIB / PAGE;

    struct big mem;
    uint64_t *a = page_array(&mem, npages);

    uint64_t sum = 0, wsum = 0;
    double t0 = now_secs();
    for (unsigned pass = 0; pass < PASSES; pass++) {
        for (uint64_t p = 0; p < npages; p++) {
            const uint64_t *pg = a + p * WORDS_PER_PAGE;
            /* A pure stream: fetch this page now and read the next 63 ahead asynchronously,
             * so the scan rarely waits for far memory. FM_SEQ makes repeated hints on the
             * same page free. */
            fm_hint_ex(pg, PAGE, FM_SEQ, 63, 0);
            uint64_t s = sum_page(pg);
            sum += s;
            wsum += s * (p + 1);
        }
    }
    double secs = now_secs() - t0;

    printf("result=pages:%llu sum:%016llx wsum:%016llx\n", (unsigned long long)npages,
           (unsigned long long)sum, (unsigned long long)wsum);
    print_ops(npages * PASSES, secs);
    big_free(&mem);
    return 0;
}
