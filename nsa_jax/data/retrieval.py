"""Synthetic long-range retrieval (``data.source: retrieval``): key-value pairs in a haystack.

Token ids, with ``K = data.retrieval.keys``, ``V = data.retrieval.values`` and ``F`` filler ids
(``data.retrieval.filler``; 0 means every id left below ``model.vocab_size``)::

    0                   PAIR marker
    1                   QUERY marker
    2 .. 2+K-1          keys
    2+K .. 2+K+V-1      values
    2+K+V .. 2+K+V+F-1  filler

A row has ``n = seq_len + 1`` tokens: a context of ``C = n - 3Q`` tokens, then ``Q`` queries::

    [ filler with P pairs (PAIR, key, value) written over it | (QUERY, key, value) x Q ]
      0 .. C-1                                                 C .. n-1

* ``P = data.retrieval.pairs`` pairs sit at non-overlapping places in the context; their keys are
  distinct within the row, their values uniform (repeats allowed) -- over all ``V`` values, or,
  with ``data.retrieval.values_per_key: n``, over the ``n`` values key ``i`` owns (value ids
  ``[i*n, (i+1)*n)``; chance ``1/n``). Then the value token itself says which key it belongs to,
  and a query is *one hop* (attend to this key's value token, copy it) instead of the two-head
  induction circuit a shared pool needs (find the key, copy the token after it).
* ``data.retrieval.value_repeat: r`` writes a stored pair as ``PAIR, key`` and then its value
  ``r`` times (``2 + r`` tokens): a longer needle, which fills NSA's compressed blocks of ``l``
  tokens when ``r >= l`` -- a lone value token is a faint mark on a block of filler, and the
  selection scores are learned only through the compressed branch (bench/NOTES.md). Queries
  stay three tokens; the distance below is still measured to the pair's key.
* Filler (``data.retrieval.filler_mode``): ``random`` -- uniform iid ids; ``cycle`` -- the ids in
  a fixed random cyclic order (drawn from ``train.seed``), row ``r`` showing at context position
  ``i`` element ``(o_r + i) mod F`` of the cycle, so one filler token predicts all the others, also
  across a pair written over it; ``repeat`` -- each row repeats its own segment of ``p`` distinct
  random ids, ``p`` uniform in ``[data.retrieval.filler_period_min,
  data.retrieval.filler_period_max]`` (short periods make induction quick to find: many earlier
  occurrences to match), the ids drawn from *all* key, value and filler ids except the
  row's own keys and values (which so occur only in their pairs and queries): after the first
  ``p`` tokens every filler token is predicted by *induction* (find the previous occurrence of
  the current token, copy its successor) -- the very mechanism a query needs (find the stored
  key, copy the value after it), trained with the full-row loss on thousands of targets per row
  and on the same ids, instead of on Q answers. ``p`` varies by row so that no fixed relative
  position solves it. But that induction is short-range (the previous occurrence is ``p <= 64``
  tokens back, inside any sliding window), so it trains nothing that NSA's compressed and
  selection branches must do. ``copy`` -- *long-range* induction: iid uniform ids from the same
  pool as ``repeat``, then the context is walked in segments of ``L`` tokens (``L`` uniform in
  ``[data.retrieval.filler_period_min, data.retrieval.filler_period_max]``, a new ``L`` per
  segment, the last one that does not fit dropped); a segment starting at ``s >= L`` is, with
  probability ``data.retrieval.copy_fraction``, a copy of the ``L`` tokens ``D`` back,
  ``row[s:s+L] = row[s-D:s-D+L]``, ``D`` drawn from ``[L, s]`` like a query's distance
  (``data.retrieval.distance``: uniform or log-uniform; copies of copies happen). The first
  token of a copy is unpredictable, the other ``L - 1`` follow by finding its source (up to the
  whole context back) and copying on -- so about ``copy_fraction`` of the context trains the
  retrieval a query needs, at every distance, with the full-row loss (:meth:`copy_spans`).
  ``data.retrieval.filler_groups: G`` makes the fresh (non-copied) ids a skip-bigram over ``G``
  groups (:meth:`skip_bigram_filler`), which rewards a previous-token head on its own.
* Query ``j`` occupies ``[C+3j, C+3j+3)`` -- ``(QUERY, key, value)``, or with
  ``data.retrieval.query_marker: pair`` ``(PAIR, key, value)``, an exact repeat of the stored
  triple, so the answer follows the same two tokens as the stored value (models that learn
  induction from ``repeat`` filler match on the previous *two* tokens, and a QUERY marker breaks
  that match) -- and asks for pair ``j`` (pairs ``Q..P-1`` are
  distractors that are never asked). Its *answer* is the value at row position
  ``a_j = C + 3j + 2``, predicted from position ``a_j - 1`` (the query's key token).
* *Distance* of query ``j``: position of the query's key minus position of the pair's key, so a
  causal sliding window of ``w`` tokens at the query's key sees the stored value iff
  ``distance <= w``. Each query's distance is drawn from
  ``[data.retrieval.min_distance, data.retrieval.max_distance]`` intersected with what fits
  (``[3j+3, C+3j]``) -- ``data.retrieval.distance: uniform`` uniformly, ``log`` log-uniformly
  (probability ``log(1 + 1/d)``, about ``1/d``: every octave of distances equally often, so
  many queries are short and a share is far) -- then the pair is placed there (drawn again the
  same way among the free places when the drawn one collides).

Training (``data.retrieval.loss``): ``all`` -- the plain next-token loss over the whole row;
``answers`` -- only the Q answer targets (:func:`answer_loss_mask`), the only targets that
need retrieval. With ``all``, pair places, keys, values and the choice of queried key are
unpredictable, and so is ``random`` filler: their loss is a constant floor whose gradient noise
drowns the Q answers among thousands of targets per row (``cycle`` filler, a bigram, costs
nothing once learned). Accuracy is measured only at the answers (:mod:`nsa_jax.data.retrieval_eval`: ``answer_info``,
``evaluate_retrieval``); chance is ``1 / V`` (``1 / n`` with values per key).

Row ``g`` of a split comes from its own RNG keyed by (``train.seed``, split, ``g``): the stream is
infinite, deterministic and random-access; the position is one integer like the synthetic source
(process ``p`` of ``P`` takes global rows ``p, p+P, p+2P, ...``).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from nsa_jax.data.batch import Batch
from nsa_jax.data.errors import DataError

_TAG = 0x2E7A  # domain-separates the retrieval RNG streams from other uses of the seed
PAIR, QUERY = 0, 1
N_SPECIAL = 2
_CHAIN = 64    # copy filler with groups: skip-bigram chain length before a restart
_TRIES = 8     # random draws before falling back to listing the free places


@dataclasses.dataclass(frozen=True)
class RetrievalLayout:
    """Sizes and token ids of the retrieval rows (see module docstring)."""

    seq_len: int
    pairs: int
    queries: int
    keys: int
    values: int
    filler: int
    min_distance: int = 1
    max_distance: int = 0     # 0 = as far as the row allows
    filler_mode: str = "random"   # random | cycle | repeat | copy
    distance: str = "uniform"     # uniform | log
    period_min: int = 0           # repeat, copy: segment length range
    period_max: int = 0
    query_marker: str = "query"   # query | pair: the first token of each query
    copy_fraction: float = 0.5    # copy: probability that a segment is a copy
    groups: int = 0               # copy: 0 = iid fresh filler; G = skip-bigram over G groups
    per_key: int = 0              # 0: values drawn from all V; n: key i owns values [i*n, i*n+n)
    value_repeat: int = 1         # a stored pair is PAIR, key, value x r (2 + r tokens)

    @classmethod
    def from_config(cls, cfg) -> "RetrievalLayout":
        """Layout of ``cfg.data`` for a model of ``cfg.model.vocab_size``; validated."""
        r, vocab = cfg.data.retrieval, cfg.model.vocab_size
        filler = r.filler or vocab - N_SPECIAL - r.keys - r.values
        lay = cls(cfg.data.seq_len, r.pairs, r.queries, r.keys, r.values, filler,
                  r.min_distance, r.max_distance, r.filler_mode, r.distance,
                  r.filler_period_min, r.filler_period_max, r.query_marker, r.copy_fraction,
                  r.filler_groups, r.values_per_key, r.value_repeat)
        lay.validate(vocab)
        return lay

    # ---- ids and positions -----------------------------------------------------------------
    @property
    def key0(self) -> int:
        return N_SPECIAL

    @property
    def value0(self) -> int:
        return N_SPECIAL + self.keys

    @property
    def filler0(self) -> int:
        return N_SPECIAL + self.keys + self.values

    @property
    def vocab_needed(self) -> int:
        return self.filler0 + self.filler

    @property
    def row_len(self) -> int:
        return self.seq_len + 1

    @property
    def context_len(self) -> int:
        return self.row_len - 3 * self.queries

    def answer_positions(self) -> np.ndarray:
        """Row positions of the Q answers, ``C + 3j + 2`` (static for a layout)."""
        return self.context_len + 3 * np.arange(self.queries) + 2

    def answer_loss_mask(self) -> np.ndarray:
        """:func:`answer_loss_mask` of this layout."""
        return answer_loss_mask(self.seq_len, self.queries)

    def distance_range(self, j: int) -> tuple[int, int]:
        """Inclusive distances query ``j`` can have: config range within ``[3j+2+r, C+3j]``
        (``r = value_repeat``: the stored pair's ``2 + r`` tokens end before the queries)."""
        C = self.context_len
        hi = C + 3 * j if self.max_distance == 0 else min(self.max_distance, C + 3 * j)
        return max(self.min_distance, 3 * j + 2 + self.value_repeat), hi

    @property
    def pair_len(self) -> int:
        """Tokens of a stored pair: PAIR, key, then the value ``value_repeat`` times."""
        return 2 + self.value_repeat

    @property
    def query_id(self) -> int:
        """The first token of every query (QUERY, or PAIR with ``query_marker: pair``)."""
        return PAIR if self.query_marker == "pair" else QUERY

    @property
    def chance(self) -> float:
        """Accuracy of a model that knows the layout but retrieves nothing: 1 / (the values a
        queried key can have)."""
        return 1.0 / (self.per_key or self.values)

    def validate(self, vocab: int) -> None:
        def fail(key, msg):
            raise DataError(f"data.retrieval.{key}: {msg}")

        for k in ("queries", "pairs", "keys", "values", "min_distance", "value_repeat"):
            if getattr(self, k) < 1:
                fail(k, f"must be >= 1, got {getattr(self, k)}")
        if self.per_key < 0 or (self.per_key and self.values < self.keys * self.per_key):
            fail("values_per_key", f"must be 0 or n >= 1 with retrieval.values >= retrieval.keys"
                                   f" * n = {self.keys} * {self.per_key}, got n = {self.per_key}"
                                   f" and retrieval.values = {self.values}")
        if self.filler_mode not in ("random", "cycle", "repeat", "copy"):
            fail("filler_mode", f"must be random, cycle, repeat or copy, got "
                                f"{self.filler_mode!r}")
        if self.query_marker not in ("query", "pair"):
            fail("query_marker", f"must be query or pair, got {self.query_marker!r}")
        if self.distance not in ("uniform", "log"):
            fail("distance", f"must be uniform or log, got {self.distance!r}")
        if self.max_distance < 0:
            fail("max_distance", f"must be >= 0 (0 = no limit), got {self.max_distance}")
        if self.pairs < self.queries:
            fail("pairs", f"{self.pairs} < retrieval.queries={self.queries} (each query asks a "
                          f"different pair)")
        if self.keys < self.pairs:
            fail("keys", f"{self.keys} < retrieval.pairs={self.pairs} (keys are distinct in a row)")
        if self.filler < 1:
            fail("filler", f"no ids left for filler: 2 markers + {self.keys} keys + {self.values} "
                           f"values fill model.vocab_size={vocab}")
        if self.vocab_needed > vocab:
            fail("filler", f"2 markers + {self.keys} keys + {self.values} values + {self.filler} "
                           f"filler ids = {self.vocab_needed} > model.vocab_size={vocab}")
        C = self.context_len
        if C < 1 or 2 * self.pair_len * self.pairs > C:
            raise DataError(f"data.seq_len: {self.seq_len} is too short for {self.queries} queries "
                            f"and {self.pairs} pairs of {self.pair_len} tokens (pairs may fill at "
                            f"most half of the {max(C, 0)}-token context)")
        if self.filler_mode in ("repeat", "copy"):
            if self.period_min < 2:
                fail("filler_period_min", f"must be >= 2 with filler_mode {self.filler_mode}, "
                                          f"got {self.period_min}")
            if self.period_max < self.period_min:
                fail("filler_period_max", f"{self.period_max} < retrieval.filler_period_min="
                                          f"{self.period_min}")
        if self.filler_mode == "repeat":
            most = min(C, self.vocab_needed - N_SPECIAL - 2 * self.pairs)
            if self.period_max > most:
                fail("filler_period_max", f"{self.period_max} > {most} (a segment holds distinct "
                                          f"ids other than the row's keys and values and must "
                                          f"fit the {C}-token context)")
        if self.filler_mode == "copy":
            if 2 * self.period_max > C:
                fail("filler_period_max", f"{self.period_max} > {C // 2} (with filler_mode copy "
                                          f"a segment may be at most half the {C}-token context)")
            if not 0 <= self.groups <= self.filler // 2:
                fail("filler_groups", f"must be in [0, {self.filler // 2}] (at least 2 of the "
                                      f"{self.filler} filler ids per group), got {self.groups}")
            if not 0.0 < self.copy_fraction <= 1.0:
                fail("copy_fraction", f"must be in (0, 1] with filler_mode copy, got "
                                      f"{self.copy_fraction}")
        for j in range(self.queries):
            lo, hi = self.distance_range(j)
            if lo > hi:
                key = "max_distance" if self.max_distance and self.max_distance < lo else \
                    "min_distance"
                fail(key, f"distance range [{self.min_distance}, {self.max_distance or 'max'}] "
                          f"leaves no place for query {j} (its distance must lie in "
                          f"[{3 * j + 2 + self.value_repeat}, {C + 3 * j}])")

    # ---- generation ------------------------------------------------------------------------
    def filler_cycle(self, seed: int) -> np.ndarray:
        """The fixed cyclic order of the filler ids for ``filler_mode: cycle``."""
        return self.filler0 + np.random.default_rng([seed, _TAG, 0]).permutation(self.filler)

    def skip_bigram_filler(self, rng: np.random.Generator) -> np.ndarray:
        """``C`` filler ids in which id ``t`` is drawn uniformly from the *group* (id mod ``G``,
        ``G = groups``) of id ``t - 2``; chains restart with two random ids every 64 tokens.
        Predicting a fresh id then needs the token *before* the current one: a previous-token
        attention head -- the first half of the induction circuit that every copy and query
        needs -- pays off on its own on every fresh filler token (ln F -> ln F/G nats), so it can
        form early instead of only together with the second half (the plateau of iid filler).
        The group of an id is one of G classes, a low-rank map any small model can represent."""
        C, G, F = self.context_len, self.groups, self.filler
        out = np.empty((-(-C // _CHAIN), _CHAIN), np.int64)
        out[:, :2] = rng.integers(0, F, size=(len(out), 2))
        for j in range(2, _CHAIN):           # vectorised over the row's chains
            g = out[:, j - 2] % G
            n = (F - 1 - g) // G + 1          # ids of group g in [0, F)
            out[:, j] = g + G * (rng.random(len(out)) * n).astype(np.int64)
        return (self.filler0 + out.ravel()[:C]).astype(np.int32)

    def copy_spans(self, rng: np.random.Generator) -> np.ndarray:
        """``int64 [n, 3]``: ``(s, L, D)`` of each copied segment of ``filler_mode: copy``, ``s``
        increasing: ``row[s:s+L] = row[s-D:s-D+L]``, ``L <= D <= s`` (module docstring)."""
        C, lo, hi = self.context_len, self.period_min, self.period_max
        m = C // lo + 1                                # more segments than can fit
        L = rng.integers(lo, hi + 1, size=m)
        s = np.cumsum(L) - L
        keep = s + L <= C                              # the segments that fit (a prefix)
        copy = keep & (s >= L) & (rng.random(m) < self.copy_fraction)
        u = rng.random(m)
        s, L, u = s[copy], L[copy], u[copy]
        n = s - L + 1                                  # choices of D in [L, s]
        if self.distance == "log":
            D = L + _log_index(L, n, u)
        else:
            D = L + np.minimum((u * n).astype(np.int64), n - 1)
        return np.stack([s, L, D], axis=1).astype(np.int64)

    def generate(self, rng: np.random.Generator, cycle: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
        """One row ``int32 [seq_len + 1]`` and its queries' distances ``int64 [Q]``.
        ``cycle`` (from :meth:`filler_cycle`) is required for ``filler_mode: cycle``."""
        row, dist, _ = self.generate_with_spans(rng, cycle)
        return row, dist

    def generate_with_spans(self, rng: np.random.Generator, cycle: np.ndarray | None = None
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`generate` plus the row's :meth:`copy_spans` (``[0, 3]`` unless
        ``filler_mode: copy``); pairs are written over the copies afterwards."""
        C, P, Q = self.context_len, self.pairs, self.queries
        spans = np.zeros((0, 3), np.int64)
        row = np.empty(self.row_len, np.int32)
        if self.filler_mode == "cycle":
            row[:C] = cycle[(rng.integers(0, self.filler) + np.arange(C)) % self.filler]
        elif self.filler_mode == "random":
            row[:C] = self.filler0 + rng.integers(0, self.filler, size=C)
        keys = self.key0 + rng.choice(self.keys, size=P, replace=False)
        if self.per_key:     # key i's own values: the value token itself says which key it has
            vals = self.value0 + (keys - self.key0) * self.per_key + \
                rng.integers(0, self.per_key, size=P)
        else:
            vals = self.value0 + rng.integers(0, self.values, size=P)
        if self.filler_mode in ("repeat", "copy"):
            pool = np.ones(self.vocab_needed, bool)
            pool[:N_SPECIAL] = False
            pool[keys] = pool[vals] = False            # this row's keys and values occur once
            if self.per_key:                           # nor any value its keys could have
                own = self.value0 + (keys - self.key0)[:, None] * self.per_key
                pool[(own + np.arange(self.per_key)).ravel()] = False
            pool = np.flatnonzero(pool)
        if self.filler_mode == "repeat":
            p = int(rng.integers(self.period_min, self.period_max + 1))
            row[:C] = rng.choice(pool, size=p, replace=False)[np.arange(C) % p]
        elif self.filler_mode == "copy":
            if self.groups:
                row[:C] = self.skip_bigram_filler(rng)
            else:
                row[:C] = pool[rng.integers(0, len(pool), size=C)]
            spans = self.copy_spans(rng)
            for s, L, D in spans.tolist():             # in order: copies of copies
                row[s:s + L] = row[s - D:s - D + L]
        n = self.pair_len
        free = np.ones(C - n + 1, bool)    # free[s]: a pair [s, s+n) may start at s
        starts = np.empty(P, np.int64)
        dist = np.empty(Q, np.int64)
        for j in range(P):
            log_from = 0
            if j < Q:
                t = C + 3 * j + 1          # the query's key position
                lo, hi = self.distance_range(j)
                cands = t - 1 - np.arange(lo, hi + 1)   # pair starts giving those distances
                log_from = lo if self.distance == "log" else 0
            else:
                cands = np.arange(C - n + 1)
            s = _draw_free(rng, cands, free, log_from)
            if s < 0:
                raise DataError(f"data.retrieval.pairs: no free place left for pair {j} "
                                f"(distance range too narrow for {P} pairs)")
            starts[j] = s
            free[max(0, s - n + 1):s + n] = False   # no other pair may overlap [s, s+n)
            if j < Q:
                dist[j] = t - (s + 1)
        row[starts] = PAIR
        row[starts + 1] = keys
        for k in range(self.value_repeat):
            row[starts + 2 + k] = vals
        qpos = C + 3 * np.arange(Q)
        row[qpos] = self.query_id
        row[qpos + 1] = keys[:Q]
        row[qpos + 2] = vals[:Q]
        return row, dist, spans


def answer_loss_mask(seq_len: int, queries: int) -> np.ndarray:
    """``float32 [seq_len]`` weights over next-token targets: 1 where the target is an answer
    (input position ``a_j - 1``), else 0 -- the ``loss_mask`` of ``nsa_jax.model.lm_loss``
    that ``data.retrieval.loss: answers`` trains with (the source puts it in every batch)."""
    m = np.zeros(seq_len, np.float32)
    m[seq_len + 1 - 3 * queries + 3 * np.arange(queries) + 1] = 1.0
    return m


def _draw_free(rng, cands: np.ndarray, free: np.ndarray, log_from: int = 0) -> int:
    """A choice among ``cands`` with ``free[c]`` (rejection, then the explicit list of free
    candidates): uniform, or -- ``log_from = d0 >= 1``, candidate ``i`` being distance
    ``d0 + i`` -- with probability ``log(1 + 1/d)``, i.e. ``d = floor(d0 * r**u)`` for ``u``
    uniform in [0, 1) and ``r = (d0 + n) / d0`` (log-uniform over ``[d0, d0 + n)``)."""
    n = len(cands)
    for _ in range(_TRIES):
        i = rng.integers(n) if not log_from else int(_log_index(log_from, n, rng.random()))
        if free[cands[i]]:
            return int(cands[i])
    ok = np.flatnonzero(free[cands])
    if not len(ok):
        return -1
    if not log_from:
        return int(cands[ok[rng.integers(len(ok))]])
    cdf = np.cumsum(np.log1p(1.0 / (log_from + ok)))
    return int(cands[ok[np.searchsorted(cdf, rng.random() * cdf[-1], side="right")]])


def _log_index(d0, n, u):
    """Index ``i`` in ``[0, n)`` of distance ``d0 + i``, log-uniform over ``[d0, d0 + n)`` for
    ``u`` uniform in [0, 1): ``d = floor(d0 * ((d0 + n) / d0) ** u)``; scalars or arrays."""
    return np.minimum(np.floor(d0 * ((d0 + n) / d0) ** u).astype(np.int64) - d0, n - 1)


class RetrievalSource:
    """Infinite, seekable retrieval stream; rows are ``[seq_len + 1]`` int32 sequences."""

    kind = "retrieval"

    def __init__(self, layout: RetrievalLayout, seed: int, split: str, process_index: int,
                 process_count: int, position: dict | None = None, answers_only: bool = False):
        self.layout = layout
        self.mask = layout.answer_loss_mask() if answers_only else None
        self.seed = seed
        self.cycle = layout.filler_cycle(seed) if layout.filler_mode == "cycle" else None
        self.split_id = {"train": 1, "eval": 2}[split]
        self.p, self.P = process_index, process_count
        self.cursor = int((position or {}).get("seq", 0))

    def check(self) -> None:
        """Validated when the layout was built; nothing else can be missing."""

    def position(self) -> dict:
        return {"seq": self.cursor}

    def row(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """Global row ``g`` of this split and its distances (deterministic)."""
        return self.layout.generate(np.random.default_rng([self.seed, _TAG, self.split_id, g]),
                                    self.cycle)

    def next_rows(self, count: int) -> np.ndarray | Batch:
        """Rows ``[count, seq_len + 1]``; with ``data.retrieval.loss: answers`` a
        :class:`~nsa_jax.data.batch.Batch` whose ``loss_mask`` is :meth:`answer_loss_mask` on
        every row."""
        rows = [self.row((self.cursor + j) * self.P + self.p)[0] for j in range(count)]
        self.cursor += count
        if self.mask is None:
            return np.stack(rows)
        return Batch(np.stack(rows), loss_mask=np.broadcast_to(self.mask, (count, len(self.mask))))


def build_retrieval_source(cfg, split, process_index, process_count, position):
    return RetrievalSource(RetrievalLayout.from_config(cfg), cfg.train.seed, split,
                           process_index, process_count, position,
                           answers_only=cfg.data.retrieval.loss == "answers")
