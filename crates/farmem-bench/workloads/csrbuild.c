/*
 * csrbuild: builds the compressed-sparse-row adjacency of a graph from its edge stream,
 * the way graph frameworks (GAP's builder, Ligra, networkx-style loaders) do: count each
 * node's degree (random increments), prefix-sum the counts into row offsets, then scatter
 * every edge into its source's row (random writes into an array most of the footprint).
 * The edges come from an R-MAT generator with GAP's Kronecker parameters (A 0.57, B 0.19,
 * C 0.19): a skewed degree distribution, node ids scrambled by a permutation so that hot
 * rows are spread over the array. A quarter of the footprint is the offsets (8 bytes per
 * node), three quarters the adjacency (4 bytes per edge). The timed phase is the build.
 *
 * usage: csrbuild <MiB> [threads, ignored]     ops = edges placed
 */
#include "common.h"
#include "farmem.h"

/* A cheap bijection on [0, 2^scale): scatters the R-MAT ids (whose low ids are the hot
 * ones) over the whole range. */
static inline uint64_t scramble(uint64_t x, unsigned scale) {
    uint64_t mask = (1ull << scale) - 1;
    x = (x * 0x9e3779b97f4a7c15ull) & mask;
    x ^= x >> (scale / 2 + 1);
    return (x * 0xbf58476d1ce4e5b9ull) & mask;
}

/* Edge e's endpoints: one R-MAT descent of `scale` levels (8 random bits per level: A 146,
 * B 49, C 49, D 12 out of 256), then the scramble. */
static inline void rmat_edge(uint64_t e, unsigned scale, uint64_t *src, uint64_t *dst) {
    struct rng r;
    rng_seed(&r, e);
    uint64_t s = 0, d = 0, bits = 0;
    for (unsigned level = 0; level < scale; level++) {
        if (level % 8 == 0)
            bits = rng_next(&r);
        unsigned u = bits & 255;
        bits >>= 8;
        unsigned sbit = u >= 195, dbit = (u >= 146 && u < 195) || u >= 244;
        s = s << 1 | sbit;
        d = d << 1 | dbit;
    }
    *src = scramble(s, scale);
    *dst = scramble(d, scale);
}

int main(int argc, char **argv) {
    uint64_t mib;
    parse_args(argc, argv, &mib, NULL, 256);
    unsigned scale = 1;
    while ((2ull << scale) * 8 <= mib * MIB / 4) /* nodes: the largest power of two fitting */
        scale++;
    uint64_t nodes = 1ull << scale, edges = mib * MIB * 3 / 4 / 4;

    struct big ob, ab;
    uint64_t *off = big_alloc(&ob, (nodes + 1) * 8, "offsets");
    uint32_t *adj = big_alloc(&ab, edges * 4, "adjacency");

    double t0 = now_secs();
    memset(off, 0, (nodes + 1) * 8);
    for (uint64_t e = 0; e < edges; e++) {
        uint64_t s, d;
        rmat_edge(e, scale, &s, &d);
        fm_hint_write(&off[s + 1]);
        off[s + 1]++;
    }
    for (uint64_t i = 0; i < nodes; i++)
        off[i + 1] += off[i];
    /* off[s] is row s's write cursor during the scatter, and ends as row s+1's start. */
    for (uint64_t e = 0; e < edges; e++) {
        uint64_t s, d;
        rmat_edge(e, scale, &s, &d);
        fm_hint_write(&off[s]);
        uint64_t at = off[s]++;
        fm_hint_write(&adj[at]);
        adj[at] = (uint32_t)d;
    }
    for (uint64_t i = nodes; i > 0; i--)
        off[i] = off[i - 1];
    off[0] = 0;
    double secs = now_secs() - t0;

    /* Untimed check: every row, in order, hashed with its node; edges' order within a row
     * is the stream's, so the result depends only on the data. */
    uint64_t h = 0, maxdeg = 0;
    for (uint64_t n = 0; n < nodes; n++) {
        uint64_t rh = n, deg = off[n + 1] - off[n];
        for (uint64_t i = off[n]; i < off[n + 1]; i++)
            rh = mix64(rh ^ adj[i]);
        h += rh;
        if (deg > maxdeg)
            maxdeg = deg;
    }
    if (off[nodes] != edges)
        die("csrbuild: %llu edges placed, want %llu", (unsigned long long)off[nodes],
            (unsigned long long)edges);
    printf("result=nodes:%llu edges:%llu maxdeg:%llu hash:%016llx\n", (unsigned long long)nodes,
           (unsigned long long)edges, (unsigned long long)maxdeg, (unsigned long long)h);
    print_ops(edges, secs);
    big_free(&ab);
    big_free(&ob);
    return 0;
}
