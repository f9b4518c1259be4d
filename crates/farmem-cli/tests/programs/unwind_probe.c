/* Test program for farmem trace's unwinder and symbolizer (tests/trace_unwind.rs).
 *
 * main -> outer -> middle -> inner, each a real call (noinline, noclone), the last one made
 * from call_inner, which is inlined into middle. `inner` records what a perf_event_open
 * sample of a page fault would hold: its user registers, the top of its stack from rsp
 * upward (PERF_SAMPLE_STACK_USER), and /proc/self/maps. The test unwinds and symbolizes that
 * and expects inner, call_inner (inlined) in middle, outer, main with the lines of the
 * calls, which carry the marker comments the test looks for.
 *
 * Usage: unwind_probe OUT [direct|qsort|signal]. With "qsort", middle sorts an array and
 * the comparator calls inner, so the stack crosses libc: inner <- compare <- qsort
 * internals <- middle <- outer <- main. With "signal", middle raises a signal whose handler
 * calls inner: inner <- on_signal <- __restore_rt (libc's signal trampoline) <- raise's
 * internals <- middle <- outer <- main.
 *
 * OUT: "UNWPROBE" magic, 8 little-endian u64 registers (rip rsp rbp rbx r12 r13 r14 r15),
 * u64 stack length, the stack bytes, then the maps text to the end of the file.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline, noclone))
#define STACK_COPY (16 * 1024)

static const char *out_path;
enum { DIRECT, QSORT, SIGNAL };
static int mode;
static volatile int signal_result;
static int captured;
static unsigned char stack_copy[STACK_COPY];
static char maps_text[1 << 20];

/* End of the mapping that holds `addr`, from /proc/self/maps; 0 if not found. */
static uint64_t mapping_end(uint64_t addr) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    uint64_t end = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long s, e;
        if (sscanf(line, "%llx-%llx", &s, &e) == 2 && s <= addr && addr < e) {
            end = e;
            break;
        }
    }
    fclose(f);
    return end;
}

static size_t read_maps(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    size_t n = 0, r;
    if (!f)
        return 0;
    while (n < sizeof maps_text && (r = fread(maps_text + n, 1, sizeof maps_text - n, f)) > 0)
        n += r;
    fclose(f);
    return n;
}

NOINLINE int inner(int x) {
    uint64_t regs[8];
    /* The registers at this very point; rip is the address right after the lea. */
    __asm__ volatile( /* CAPTURE */
        "lea 0(%%rip), %%rax\n\t"
        "mov %%rax, 0(%0)\n\t"
        "mov %%rsp, 8(%0)\n\t"
        "mov %%rbp, 16(%0)\n\t"
        "mov %%rbx, 24(%0)\n\t"
        "mov %%r12, 32(%0)\n\t"
        "mov %%r13, 40(%0)\n\t"
        "mov %%r14, 48(%0)\n\t"
        "mov %%r15, 56(%0)\n\t"
        :
        : "r"(regs)
        : "rax", "memory");
    /* What lies at and above rsp (saved registers, return addresses) does not change while
     * inner runs, so copying it now gives the stack as it was at the capture. Never read
     * past the end of the stack mapping. */
    uint64_t sp = regs[1];
    uint64_t end = mapping_end(sp);
    uint64_t len = end > sp ? end - sp : 0;
    if (len > STACK_COPY)
        len = STACK_COPY;
    memcpy(stack_copy, (const void *)(uintptr_t)sp, len);
    size_t maps_len = read_maps();

    FILE *f = fopen(out_path, "wb");
    if (!f) {
        perror(out_path);
        exit(2);
    }
    fwrite("UNWPROBE", 1, 8, f);
    fwrite(regs, sizeof regs[0], 8, f);
    fwrite(&len, sizeof len, 1, f);
    fwrite(stack_copy, 1, len, f);
    fwrite(maps_text, 1, maps_len, f);
    if (fclose(f) != 0) {
        perror(out_path);
        exit(2);
    }
    captured = 1;
    return x + (int)(len & 1);
}

NOINLINE int compare(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    int r = 0;
    if (!captured)
        r = inner(x); /* CALL_INNER_FROM_COMPARE */
    return (x > y) - (x < y) + (r & 0);
}

NOINLINE void on_signal(int sig) {
    signal_result = inner(sig) + 1; /* CALL_INNER_FROM_HANDLER */
}

/* Inlined into middle: the address of the call to inner symbolizes to two frames, this
 * one (inlined, at the call of inner) and middle (at the line that uses this). */
static inline __attribute__((always_inline)) int call_inner(int v) {
    int r = inner(v); /* CALL_INNER */
    return r + 1;
}

/* Uses a buffer on its stack and keeps values in callee-saved registers across the call,
 * so that its CFA is rsp plus a large offset and it saves registers: non-trivial CFI. */
NOINLINE int middle(int x) {
    volatile char buf[1000];
    int keep1 = x * 7, keep2 = x ^ 0x55;
    for (int i = 0; i < (int)sizeof buf; i++)
        buf[i] = (char)(i * x);
    int r;
    if (mode == SIGNAL) {
        signal(SIGUSR1, on_signal);
        raise(SIGUSR1); /* CALL_RAISE */
        r = signal_result;
    } else if (mode == QSORT) {
        int v[64];
        for (int i = 0; i < 64; i++)
            v[i] = (i * 37 + x) % 64;
        qsort(v, 64, sizeof v[0], compare); /* CALL_QSORT */
        r = v[0];
    } else {
        r = call_inner(x + buf[x & 511]); /* CALL_INLINED */
    }
    return r + keep1 + keep2 + buf[7];
}

NOINLINE int outer(int x) {
    int r = middle(x + 1); /* CALL_MIDDLE */
    return r * 3 + x;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUT [direct|qsort|signal]\n", argv[0]);
        return 2;
    }
    out_path = argv[1];
    mode = DIRECT;
    if (argc > 2 && strcmp(argv[2], "qsort") == 0)
        mode = QSORT;
    else if (argc > 2 && strcmp(argv[2], "signal") == 0)
        mode = SIGNAL;
    int r = outer(argc); /* CALL_OUTER */
    if (!captured) {
        fprintf(stderr, "inner was not called\n");
        return 1;
    }
    printf("%d\n", r);
    return 0;
}
