"""Build about MIB MiB of Python lists, dicts and bytearrays, then checksum them.

Usage: py_heap.py MIB

Deterministic: the same MIB always prints the same lines. Used by run_programs.rs, which
compares the output of a native run with the output under `farmem run`. The structures are
built first and read afterwards (twice, in different orders), so under a small local budget
most of them have been evicted before they are read back.
"""
import hashlib
import sys
import zlib

MIB = int(sys.argv[1])
# Rough shares of the heap: a third each. A list of small ints costs about 36 bytes per
# element (8-byte slot + int object); a dict of int -> int about 100 bytes per entry.
BA_CHUNK = 1 << 20
n_ba = max(1, MIB // 3)
n_list_elems = (MIB // 3) * (1 << 20) // 36
n_dict_entries = (MIB // 3) * (1 << 20) // 100

def lcg(x):
    return (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF

# bytearrays: 1 MiB each, a pattern that depends on the index, with sparse edits.
bas = []
base = bytes(range(256)) * (BA_CHUNK // 256)
for i in range(n_ba):
    b = bytearray(base)
    b[i % 251::4093] = bytes(((i * 7 + j) & 0xFF) for j in range(len(range(i % 251, BA_CHUNK, 4093))))
    bas.append(b)

# lists of ints: chunks of 1M elements (python ints beyond the small-int cache, so each one
# is a separate heap object).
lists = []
x = 12345
left = n_list_elems
while left > 0:
    n = min(left, 1 << 20)
    start = x & 0xFFFFFF
    lists.append([start + 1000 + k * 3 for k in range(n)])
    x = lcg(x)
    left -= n

# dicts: int -> int, chunks of 256K entries.
dicts = []
left = n_dict_entries
d_i = 0
while left > 0:
    n = min(left, 1 << 18)
    off = d_i * 1000003
    dicts.append({off + k: (k * 2654435761) & 0xFFFFFFFF for k in range(n)})
    d_i += 1
    left -= n

print("built", len(bas), "bytearrays,", sum(map(len, lists)), "list elements,",
      sum(map(len, dicts)), "dict entries")
sys.stdout.flush()

# Pass 1, in building order.
h = hashlib.sha256()
for b in bas:
    h.update(b)
ls = 0
for l in lists:
    ls = (ls * 31 + sum(l)) & 0xFFFFFFFFFFFFFFFF
ds = 0
for d in dicts:
    for k, v in d.items():
        ds = (ds + k * v) & 0xFFFFFFFFFFFFFFFF
print("pass1", h.hexdigest(), ls, ds)

# Pass 2, in reverse order, with a different reduction, after mutating part of everything.
for i, b in enumerate(bas):
    b[(i * 977) % BA_CHUNK] ^= 0x5A
for l in lists:
    l[len(l) // 2] += 1
for d in dicts:
    k = next(iter(d))
    d[k] += 1
c = 0
for b in reversed(bas):
    c = zlib.crc32(b, c)
ls2 = 0
for l in reversed(lists):
    ls2 ^= sum(l[::7]) + len(l)
ds2 = 0
for d in reversed(dicts):
    ds2 = (ds2 + sum(d.values()) + len(d)) & 0xFFFFFFFFFFFFFFFF
print("pass2", c, ls2, ds2)
