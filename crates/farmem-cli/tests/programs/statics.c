/* Static arrays (.bss), in the shape of STREAM: three arrays filled, then triad passes over
 * the first `n` elements of each, checked at the end. Prints the peak resident set
 * ("VmHWM <kB>") and its resident file pages at the end ("RssFile <kB>": code and libraries)
 * so that the test can compare them with the local budget.
 * Usage: statics N_ELEMENTS PASSES [heap]   (N_ELEMENTS <= 8 Mi; 0 touches nothing; with
 * "heap", the same arrays from malloc instead, for comparison) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX (8u << 20) /* 3 x 64 MiB */
static double sa[MAX], sb[MAX], sc[MAX];

static long status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) v = atol(line + strlen(key));
    if (f) fclose(f);
    return v;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoul(argv[1], 0, 10) : MAX;
    int passes = argc > 2 ? atoi(argv[2]) : 2;
    if (n > MAX) n = MAX;
    double *a = sa, *b = sb, *c = sc;
    if (argc > 3 && !strcmp(argv[3], "heap")) {
        a = malloc(MAX * sizeof(double));
        b = malloc(MAX * sizeof(double));
        c = malloc(MAX * sizeof(double));
        if (!a || !b || !c) return 2;
    }
    for (size_t i = 0; i < n; i++) {
        a[i] = (double)(i % 1000);
        b[i] = 2.0;
        c[i] = 0.0;
    }
    for (int p = 0; p < passes; p++)
        for (size_t i = 0; i < n; i++) c[i] = a[i] + 3.0 * b[i] + p;
    for (size_t i = 0; i < n; i++) {
        double want = (double)(i % 1000) + 6.0 + (passes - 1);
        if (passes > 0 && c[i] != want) {
            fprintf(stderr, "statics: c[%zu] = %f, want %f\n", i, c[i], want);
            return 1;
        }
    }
    /* The kernel reads and writes the arrays too: c goes to a file with write(), comes back
     * into a with read() (pages of both far by now), and must match. */
    if (n > 0) {
        FILE *tmp = tmpfile();
        if (!tmp) return 3;
        int fd = fileno(tmp);
        size_t bytes = n * sizeof(double), done = 0;
        while (done < bytes) {
            ssize_t w = write(fd, (char *)c + done, bytes - done);
            if (w <= 0) { perror("statics: write"); return 3; }
            done += (size_t)w;
        }
        if (lseek(fd, 0, SEEK_SET) != 0) return 3;
        for (done = 0; done < bytes;) {
            ssize_t r = read(fd, (char *)a + done, bytes - done);
            if (r <= 0) { perror("statics: read"); return 3; }
            done += (size_t)r;
        }
        if (memcmp(a, c, bytes) != 0) {
            fprintf(stderr, "statics: what read() brought back differs from what write() took\n");
            return 1;
        }
        fclose(tmp);
    }
    printf("VmHWM %ld kB\n", status_kib("VmHWM:"));
    printf("RssFile %ld kB\n", status_kib("RssFile:"));
    return 0;
}
