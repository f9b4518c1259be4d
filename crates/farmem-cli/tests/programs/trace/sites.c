/* A program with known far-memory fault sites for `farmem trace` tests: a buffer of PAGES
 * pages, written once (zero-fill faults at FILL), then read by three loops in known
 * proportions: a sequential scan (two passes, one fault per page: SEQ), a strided scan (two
 * passes over every fourth page: STRIDE, in stride.c) and random reads (RANDOM, in
 * random.c). Run it with a budget far below PAGES and the fault read-ahead off, so each
 * access to an evicted page is one fault. With the argument `hint-seq` the sequential scan
 * is hinted (FM_SEQ): its faults should vanish from the report. Each loop checks what it
 * reads, so a wrong page is a non-zero exit. Markers name the faulting lines for the test. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "farmem.h"

#define PAGE 4096
#define PAGES 4096

uint64_t stride_scan(const unsigned char *buf, size_t pages, size_t step);
uint64_t random_reads(const unsigned char *buf, size_t pages, size_t count);

static uint64_t word_of(size_t page) { return page * 0x9e3779b97f4a7c15ULL + 1; }

__attribute__((noinline)) static void fill(unsigned char *buf) {
    for (size_t p = 0; p < PAGES; p++)
        *(uint64_t *)(buf + p * PAGE) = word_of(p); /* FILL */
}

__attribute__((noinline)) static uint64_t seq_scan(const unsigned char *buf, int hint) {
    uint64_t bad = 0;
    for (size_t p = 0; p < PAGES; p++) {
        if (hint)
            fm_hint_ex(buf + p * PAGE, 8, FM_SEQ, 63, 0);
        bad += *(const volatile uint64_t *)(buf + p * PAGE) != word_of(p); /* SEQ */
    }
    return bad;
}

int main(int argc, char **argv) {
    int hint = argc > 1 && strcmp(argv[1], "hint-seq") == 0;
    unsigned char *buf = malloc((size_t)PAGES * PAGE);
    if (!buf)
        return 2;
    fill(buf);
    uint64_t bad = 0;
    for (int pass = 0; pass < 2; pass++) {
        bad += seq_scan(buf, hint);
        bad += stride_scan(buf, PAGES, 4);
    }
    bad += random_reads(buf, PAGES, PAGES);
    if (bad) {
        fprintf(stderr, "sites: %llu wrong words\n", (unsigned long long)bad);
        return 1;
    }
    free(buf);
    return 0;
}
