"""Synthetic token streams with learnable structure (``data.source: synthetic``).

Every sequence is a concatenation of short segments (8-64 tokens) of three kinds:

* Markov (50%): a slice of a long trajectory of a seeded random first-order Markov chain in which
  each token has 4 possible successors with probabilities (0.7, 0.15, 0.1, 0.05) -- about 1.3 bits
  per token instead of log2(vocab);
* pattern (25%): one of 32 fixed random n-grams (length 8-24), repeated to fill the segment;
* copy (25%): an exact copy of an earlier span of the same sequence (rewards induction heads).

So a model's loss must fall well below log(vocab). The structure (transition table, patterns)
depends only on ``train.seed``; train and eval draw different sequences from it. Sequence ``g``
of a split is generated from its own RNG keyed by (seed, split, g), so the stream is infinite,
random-access and its position is one integer (sequences consumed by this process; process
``p`` of ``P`` takes global sequences ``p, p+P, p+2P, ...``).
"""
from __future__ import annotations

import numpy as np

_TAG = 0x5E0D  # domain-separates the synthetic RNG streams from other uses of the seed
SUCC_PROBS = np.array([0.7, 0.15, 0.1, 0.05])
N_CHAINS, CHAIN_LEN = 64, 4096
N_PATTERNS = 32
SEG_MIN, SEG_MAX = 8, 64


class SyntheticStructure:
    """Transition table, Markov trajectory and n-gram patterns, all from ``seed``."""

    def __init__(self, vocab: int, seed: int):
        rng = np.random.default_rng([seed, _TAG, 0])
        self.vocab = vocab
        self.succ = rng.integers(0, vocab, size=(vocab, len(SUCC_PROBS)), dtype=np.int64)
        cum = np.cumsum(SUCC_PROBS)
        state = rng.integers(0, vocab, size=N_CHAINS)
        traj = np.empty((N_CHAINS, CHAIN_LEN), np.int32)
        choices = np.minimum(np.searchsorted(cum, rng.random((CHAIN_LEN, N_CHAINS))),
                             len(SUCC_PROBS) - 1)
        for t in range(CHAIN_LEN):
            traj[:, t] = state
            state = self.succ[state, choices[t]]
        self.markov = traj
        self.patterns = [rng.integers(0, vocab, size=int(n)).astype(np.int32)
                         for n in rng.integers(8, 25, size=N_PATTERNS)]


class SyntheticSource:
    """Infinite, seekable synthetic stream; rows are ``[seq_len + 1]`` int32 sequences."""

    kind = "synthetic"

    def __init__(self, vocab: int, seq_len: int, seed: int, split: str, process_index: int,
                 process_count: int, position: dict | None = None):
        self.structure = SyntheticStructure(vocab, seed)
        self.n = seq_len + 1
        self.seed = seed
        self.split_id = {"train": 1, "eval": 2}[split]
        self.p, self.P = process_index, process_count
        self.cursor = int((position or {}).get("seq", 0))

    def check(self) -> None:
        """Nothing can be missing: the stream is generated."""

    def position(self) -> dict:
        return {"seq": self.cursor}

    def sequence(self, g: int) -> np.ndarray:
        """Global sequence ``g`` of this split (deterministic)."""
        rng = np.random.default_rng([self.seed, _TAG, self.split_id, g])
        n, s = self.n, self.structure
        n_seg = n // SEG_MIN + 1
        kinds = rng.random(n_seg)
        lens = rng.integers(SEG_MIN, SEG_MAX + 1, size=n_seg)
        u = rng.random((n_seg, 2))
        out = np.empty(n, np.int32)
        pos = i = 0
        while pos < n:
            k, L = kinds[i], int(min(lens[i], n - pos))
            if k >= 0.75 and pos >= L:            # copy an earlier span
                src = int(u[i, 0] * (pos - L + 1))
                out[pos:pos + L] = out[src:src + L]
            elif k >= 0.5:                        # repeated n-gram pattern
                pat = s.patterns[int(u[i, 0] * len(s.patterns))]
                out[pos:pos + L] = np.resize(pat, L)
            else:                                 # Markov chain slice
                chain = s.markov[int(u[i, 0] * N_CHAINS)]
                start = int(u[i, 1] * (CHAIN_LEN - L + 1))
                out[pos:pos + L] = chain[start:start + L]
            pos += L
            i += 1
        return out

    def next_rows(self, count: int) -> np.ndarray:
        rows = [self.sequence((self.cursor + j) * self.P + self.p) for j in range(count)]
        self.cursor += count
        return np.stack(rows)
