"""The batch every source yields: the tokens and what the loss and attention need with them.

:class:`Batch` is a ``NamedTuple`` (so also a JAX pytree: ``jax.tree.map`` and ``jit`` take it
whole; a field that is None is an empty subtree)::

    tokens       int32   [B, T+1]  inputs tokens[:, :-1], targets tokens[:, 1:]
    loss_mask    float32 [B, T]    weight of target t (tokens[:, t+1]); None = every target 1
    segment_ids  int32   [B, T+1]  the document of each token, non-decreasing along a row, 0 at
                                   its first token; None = each row is one sequence

``loss_mask`` is set by ``data.retrieval.loss: answers`` (1 at the retrieval answers only);
``segment_ids`` by ``data.packing: documents`` (``nsa_jax.model.lm_loss`` feeds
``segment_ids[:, :-1]`` to the model, whose positions then restart at every document, and drops
a target that lies in another document than its input). Which fields are set depends only on
the data config (:func:`batch_fields`), so a compiled step sees one structure for a whole run.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np


class Batch(NamedTuple):
    tokens: np.ndarray
    loss_mask: Optional[np.ndarray] = None
    segment_ids: Optional[np.ndarray] = None

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0])


def as_batch(out) -> Batch:
    """A source's ``next_rows`` result (a token array or a :class:`Batch`) as a Batch of
    contiguous int32 / float32 arrays."""
    b = out if isinstance(out, Batch) else Batch(out)
    return Batch(np.ascontiguousarray(b.tokens, dtype=np.int32),
                 None if b.loss_mask is None else np.ascontiguousarray(b.loss_mask, np.float32),
                 None if b.segment_ids is None else np.ascontiguousarray(b.segment_ids, np.int32))


def batch_fields(data, rows: int) -> Batch:
    """The ``(shape, dtype)`` of each field a loader for ``data`` (a DataConfig) yields in a
    batch of ``rows`` rows; None for a field it leaves out."""
    T = data.seq_len
    mask = data.source == "retrieval" and data.retrieval.loss == "answers"
    return Batch(((rows, T + 1), np.int32),
                 ((rows, T), np.float32) if mask else None,
                 ((rows, T + 1), np.int32) if data.packing == "documents" else None)
