/*
 * randscan: page-granular random scan of a large array (the "random access"
 * microbenchmark of Fastswap / AIFM / Eden). Each pass visits every 4 KiB page exactly
 * once, in a pseudo-random order (a keyed Feistel permutation of the page index, a
 * different key per pass, no index array in memory), and sums the page's 512 words.
 * Models pointer-chasing / hash-partitioned work with no locality beyond a page.
 *
 * usage: randscan <MiB> [threads, ignored]     ops = pages processed
 */
#include "common.h"
#include "farmem.h"

#define PASSES 4

int main(int argc, char **argv) {
    uint64_t mib;
    parse_args(argc, argv, &mib, NULL, 256);
    uint64_t npages = mib * MIB / PAGE;

    struct big mem;
    uint64_t *a = page_array(&mem, npages);

    uint64_t sum = 0, osum = 0;
    double t0 = now_secs();
    for (unsigned pass = 0; pass < PASSES; pass++) {
        struct perm perm;
        perm_init(&perm, npages, 0x5eed0000u + pass);
        for (uint64_t k = 0; k < npages; k++) {
            uint64_t p = perm_apply(&perm, k);
            const uint64_t *pg = a + p * WORDS_PER_PAGE;
            /* The page is random, so nothing can be read ahead: just fetch it now rather
             * than take a fault on the first word. */
            fm_hint(pg);
            uint64_t s = sum_page(pg);
            sum += s;
            osum += mix64(s + k); /* depends on the visiting order, checks the permutation */
        }
    }
    double secs = now_secs() - t0;

    printf("result=pages:%llu sum:%016llx osum:%016llx\n", (unsigned long long)npages,
           (unsigned long long)sum, (unsigned long long)osum);
    print_ops(npages * PASSES, secs);
    big_free(&mem);
    return 0;
}
