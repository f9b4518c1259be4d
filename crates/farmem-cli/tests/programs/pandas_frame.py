"""pandas and numpy under `farmem run`: a DataFrame of N rows (seeded), a groupby with
aggregations, a sort, a merge with a per-group Python aggregation, and a mostly unwritten
numpy array (calloc'd memory read whole). Prints the sizes, two sums and a hash of the
results, which must match a native run.

Usage: pandas_frame.py N
"""
import hashlib
import sys

import numpy as np
import pandas as pd

n = int(sys.argv[1])
rng = np.random.default_rng(42)
df = pd.DataFrame({
    "user": rng.integers(0, n // 20, n),
    "item": rng.integers(0, 5000, n),
    "price": rng.random(n) * 100,
    "qty": rng.integers(1, 10, n),
    "tag": pd.Categorical(rng.choice(["a", "b", "c", "d", "e"], n)),
})
df["total"] = df.price * df.qty
zeros = np.zeros(n * 4)
zeros[::1000] = 1.0
g = df.groupby("user").agg(total=("total", "sum"), n=("item", "count"), top=("item", "max"))
s = df.sort_values(["item", "price"]).head(100000)
top_tag = df.groupby("user").tag.agg(lambda t: t.value_counts().idxmax()).rename("tag")
m = g.merge(top_tag, left_index=True, right_index=True)
h = hashlib.sha256()
h.update(pd.util.hash_pandas_object(m).values.tobytes())
h.update(pd.util.hash_pandas_object(s).values.tobytes())
print(len(df), len(g), round(float(zeros.sum()), 1), round(float(g.total.sum()), 3), h.hexdigest())
