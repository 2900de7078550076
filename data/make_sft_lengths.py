"""Writes data/sft_lengths.txt: the length sample `maskpack demo` draws its batches from (one length
per line, in tokens; 4096 sequences). Run once; the file is committed and is the source of truth:

    python data/make_sft_lengths.py            # numpy's PCG64, seed 35: the committed file, byte for byte

Where the shape comes from: it is modelled, not measured (no dataset was read). Supervised fine-tuning
mixtures of chat, code and reasoning data have token lengths (prompt + response) with a median of a few
hundred tokens, a broad middle of multi-turn chats and code answers around 1-2K, and a long tail of
long documents and reasoning traces out to the context length. Three lognormal components stand for
them (weights 0.55 / 0.35 / 0.10; medians 350 / 1400 / 6000 tokens; log-sds 0.7 / 0.6 / 0.7), clipped
to [16, 32768] tokens (a 32K context). The result: median 696, mean 1515, p90 3350, p99 13289 tokens: a
padded batch of such sequences is mostly padding, which is what the demo shows.
"""
import os

import numpy as np

N, SEED = 4096, 35
WEIGHTS = (0.55, 0.35, 0.10)
MEDIANS = (350.0, 1400.0, 6000.0)
SIGMAS = (0.7, 0.6, 0.7)
LO, HI = 16, 32768


def lengths(n: int = N, seed: int = SEED) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64(seed))
    comp = rng.choice(len(WEIGHTS), size=n, p=WEIGHTS)
    z = rng.standard_normal(n)
    med = np.asarray(MEDIANS)[comp]
    sig = np.asarray(SIGMAS)[comp]
    return np.clip(np.rint(med * np.exp(sig * z)), LO, HI).astype(np.int64)


if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sft_lengths.txt")
    x = lengths()
    with open(out, "w") as f:
        f.write("".join(f"{int(v)}\n" for v in x))
    q = np.percentile(x, [50, 90, 99])
    print(f"{out}: {len(x)} lengths, median {q[0]:.0f}, mean {x.mean():.0f}, p90 {q[1]:.0f}, p99 {q[2]:.0f}, "
          f"max {x.max()}")
