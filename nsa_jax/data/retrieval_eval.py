"""Retrieval accuracy at the answers of :mod:`nsa_jax.data.retrieval` rows: where each query's
answer sits and how far its pair is (:func:`answer_info`, read back from the tokens and checked
against the layout), accuracy per distance bin (:func:`accuracy_by_distance`) and a whole
evaluation over batches with any predictor (:func:`evaluate_retrieval`). Chance is ``1 / V``
(``1 / n`` with values per key)."""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

import numpy as np

from nsa_jax.data.errors import DataError
from nsa_jax.data.retrieval import PAIR, RetrievalLayout


@dataclasses.dataclass(frozen=True)
class AnswerInfo:
    """Per query of a batch ``[B, seq_len + 1]``: all ``int64 [B, Q]``."""

    positions: np.ndarray   # row position of the answer (predicted from ``positions - 1``)
    answers: np.ndarray     # the answer token
    distances: np.ndarray   # query key position - pair key position


def answer_info(batch: np.ndarray, layout: RetrievalLayout) -> AnswerInfo:
    """Answer positions, answers and distances of a batch, read from its tokens.

    Raises :class:`DataError` if a row does not follow ``layout`` (wrong length, missing query
    marker, a queried key with no pair, or an answer that differs from the stored value).
    """
    batch = np.asarray(batch)
    B = batch.shape[0]
    if batch.ndim != 2 or batch.shape[1] != layout.row_len:
        raise DataError(f"retrieval batch: expected [B, {layout.row_len}] (seq_len + 1), got "
                        f"{list(batch.shape)}")
    C, Q = layout.context_len, layout.queries
    pos = np.broadcast_to(layout.answer_positions(), (B, Q)).astype(np.int64)
    dist = np.empty((B, Q), np.int64)
    for b in range(B):
        row = batch[b]
        if not np.all(row[C::3] == layout.query_id):
            raise DataError(f"retrieval batch: row {b} has no query marker every 3 tokens from "
                            f"position {C} (not a retrieval row of this layout)")
        starts = np.flatnonzero(row[:C - 2] == PAIR)
        qkeys = row[C + 1::3]
        where = np.full(layout.value0, -1, np.int64)     # key id -> pair start
        ok = all((k >= layout.key0).all() and (k < layout.value0).all()
                 for k in (row[starts + 1], qkeys))
        if ok:
            where[row[starts + 1]] = starts
            s = where[qkeys]
        if not ok or np.any(s < 0) or np.any(row[s + 2] != row[C + 2::3]):
            raise DataError(f"retrieval batch: row {b}: a queried key has no pair or a different "
                            f"value (not a retrieval row of this layout)")
        dist[b] = (C + 3 * np.arange(Q) + 1) - (s + 1)
    return AnswerInfo(pos, batch[:, C + 2::3].astype(np.int64), dist)


def distance_edges(window: int, max_distance: int) -> list[int]:
    """Bin edges in multiples of the window, ``[0, w, 2w, 4w, 8w, ...]``, the last one
    ``>= max_distance``. Bins are ``(lo, hi]``: the first holds what a window of ``w`` sees."""
    if window < 1:
        raise ValueError(f"window: must be >= 1, got {window}")
    edges, e = [0, window], window
    while e < max_distance:
        e *= 2
        edges.append(e)
    return edges


def accuracy_by_distance(correct: np.ndarray, distances: np.ndarray,
                         edges: list[int]) -> list[dict]:
    """One dict per bin ``(lo, hi]``: ``lo``, ``hi``, ``n``, ``correct``, ``accuracy``
    (None for an empty bin). Distances outside all bins are an error."""
    correct = np.asarray(correct, bool).ravel()
    distances = np.asarray(distances).ravel()
    if correct.shape != distances.shape:
        raise ValueError(f"correct {correct.shape} and distances {distances.shape} differ")
    if distances.size and (distances.min() <= edges[0] or distances.max() > edges[-1]):
        raise ValueError(f"distances {distances.min()}..{distances.max()} outside the bins "
                         f"({edges[0]}, {edges[-1]}]")
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (distances > lo) & (distances <= hi)
        n, k = int(m.sum()), int(correct[m].sum())
        out.append({"lo": int(lo), "hi": int(hi), "n": n, "correct": k,
                    "accuracy": k / n if n else None})
    return out


def accuracy_where(correct: np.ndarray, mask: np.ndarray) -> dict:
    """``{"n", "correct", "accuracy"}`` over the queries where ``mask`` holds."""
    c = np.asarray(correct, bool)[np.asarray(mask, bool)]
    return {"n": int(c.size), "correct": int(c.sum()),
            "accuracy": float(c.mean()) if c.size else None}


PredictFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


def evaluate_retrieval(predict: PredictFn, batches: Iterable[np.ndarray], layout: RetrievalLayout,
                       window: int) -> dict:
    """Accuracy of ``predict`` against distance, over ``batches`` of retrieval rows.

    ``predict(inputs [B, seq_len], query_positions [B, Q]) -> tokens [B, Q]`` returns the token
    the model predicts *after* each query position (its argmax); inputs are ``batch[:, :-1]``, so
    the model never sees the answers of the last query. Returns ``{"bins": accuracy_by_distance,
    "within_w", "beyond_w", "beyond_4w", "overall": accuracy_where, "chance", "window",
    "queries"}``; ``beyond_4w`` counts distances > 4w.
    """
    correct, dist = [], []
    for batch in batches:
        info = answer_info(batch, layout)
        pred = np.asarray(predict(np.asarray(batch)[:, :-1], info.positions - 1))
        if pred.shape != info.answers.shape:
            raise ValueError(f"predict returned shape {pred.shape}, expected "
                             f"{info.answers.shape}")
        correct.append(pred == info.answers)
        dist.append(info.distances)
    correct, dist = np.concatenate(correct).ravel(), np.concatenate(dist).ravel()
    max_d = layout.distance_range(layout.queries - 1)[1]
    return {"bins": accuracy_by_distance(correct, dist, distance_edges(window, max_d)),
            "within_w": accuracy_where(correct, dist <= window),
            "beyond_w": accuracy_where(correct, dist > window),
            "beyond_4w": accuracy_where(correct, dist > 4 * window),
            "overall": accuracy_where(correct, np.ones_like(correct)),
            "chance": layout.chance, "window": window, "queries": int(correct.size)}
