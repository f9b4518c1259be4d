"""Build about MIB MiB of Python data in the parent, then checksum it in forked workers.

Usage: py_fork_pool.py MIB WORKERS

The data (bytearrays and lists of ints) is built before the Pool is created, with the 'fork'
start method, so the workers read it through the pages they inherited from the parent. Under
`farmem run` with a small budget, most of those pages were evicted in the parent before the
fork. Each worker checksums a share of the chunks; the parent checksums everything itself too
(after the workers, so it reads its own evicted pages again) and prints both.
Deterministic output.
"""
import hashlib
import multiprocessing
import sys

MIB = int(sys.argv[1])
WORKERS = int(sys.argv[2])
CHUNK = 1 << 20
n_ba = max(WORKERS, MIB // 2)
n_lists = max(WORKERS, (MIB // 2) * (1 << 20) // (36 << 16))  # lists of 64K ints, ~2.3 MiB

base = bytes(range(256)) * (CHUNK // 256)
bas = []
for i in range(n_ba):
    b = bytearray(base)
    b[i % 4096::4096] = bytes([(i * 13) & 0xFF]) * len(range(i % 4096, CHUNK, 4096))
    bas.append(b)
lists = [[i * 100003 + 1000 + k for k in range(1 << 16)] for i in range(n_lists)]


def digest_ba(i):
    return i, hashlib.sha256(bas[i]).hexdigest()


def sum_list(i):
    return i, sum(lists[i]) ^ len(lists[i]), multiprocessing.current_process().pid


def main():
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(WORKERS) as pool:
        ba_results = dict(pool.map(digest_ba, range(n_ba), chunksize=4))
        l_results = pool.map(sum_list, range(n_lists), chunksize=4)
    pids = {r[2] for r in l_results}
    l_results = {i: s for i, s, _ in l_results}
    mine_ba = {i: hashlib.sha256(bas[i]).hexdigest() for i in range(n_ba)}
    mine_l = {i: sum(lists[i]) ^ len(lists[i]) for i in range(n_lists)}
    h = hashlib.sha256()
    for i in range(n_ba):
        h.update(ba_results[i].encode())
    for i in range(n_lists):
        h.update(str(l_results[i]).encode())
    print("chunks", n_ba, "lists", n_lists)
    print("workers", h.hexdigest())
    print("workers agree with parent", ba_results == mine_ba and l_results == mine_l)
    # Not printed (it varies), but several workers must have taken part.
    print("more than one worker", len(pids) > 1)


if __name__ == "__main__":
    main()
