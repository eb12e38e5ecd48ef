"""``build_loader``: one batch iterator over any source, with a prefetch thread and exact state.

A *source* (synthetic, text, hf, tokens, retrieval) yields rows of ``seq_len + 1`` tokens -- as
an array, or as a :class:`~nsa_jax.data.batch.Batch` with the loss mask and segment ids that
go with them -- and reports its position as a small JSON dict. The loader hands out
:class:`~nsa_jax.data.batch.Batch` es. The :class:`Loader` asks it for ``batch_size`` rows at a time --
on a background thread that keeps ``data.prefetch`` batches ready -- and stores, with every
batch, the source position right *after* that batch. ``loader.state()`` returns the position
stored with the last batch handed out by ``next()``, so prefetched-but-unconsumed batches never
count, and ``build_loader(..., state=loader.state())`` continues with exactly the next batch.
"""
from __future__ import annotations

import copy
import queue
import threading
import weakref

from nsa_jax.data.batch import Batch, as_batch
from nsa_jax.data.errors import DataError

SPLITS = ("train", "eval")
_HEADER_KEYS = ("source", "split", "seq_len", "process_index", "process_count")


def _produce(source, batch_size: int):
    batch = as_batch(source.next_rows(batch_size))
    return batch, copy.deepcopy(source.position())


def _prefetch_worker(source, batch_size: int, q: queue.Queue, stop: threading.Event) -> None:
    """Fill ``q`` with ("ok", (batch, position_after)) or one final ("error", exception)."""
    while not stop.is_set():
        try:
            item = ("ok", _produce(source, batch_size))
        except BaseException as e:  # handed to the consumer, re-raised by next()
            item = ("error", e)
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                break
            except queue.Full:
                continue
        if item[0] == "error":
            return


class Loader:
    """Iterator of :class:`~nsa_jax.data.batch.Batch` es of ``batch_size`` rows (``tokens``
    ``int32 [batch_size, seq_len + 1]``); see module docstring."""

    def __init__(self, source, batch_size: int, prefetch: int, header: dict):
        self._source = source
        self._batch_size = batch_size
        self._header = dict(header)
        self._pos = copy.deepcopy(source.position())
        self._error: BaseException | None = None
        self._closed = False
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()
        self._thread = None
        if prefetch > 0:
            self._queue = queue.Queue(maxsize=prefetch)
            # the worker holds no reference to the Loader, so an unclosed, dropped Loader is
            # collected and its finalizer stops the thread
            self._thread = threading.Thread(
                target=_prefetch_worker, name="nsa-data-prefetch", daemon=True,
                args=(source, batch_size, self._queue, self._stop))
            self._thread.start()
            weakref.finalize(self, self._stop.set)

    def _produce(self):
        return _produce(self._source, self._batch_size)

    # -- consumer ---------------------------------------------------------------------------
    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        return self.next()

    def next(self, timeout: float | None = None) -> Batch | None:
        """The next batch; with ``timeout`` (seconds, prefetch > 0 only) None if none arrived in
        time -- nothing is consumed then, so the call can be repeated."""
        if self._error is not None:
            raise self._error
        if self._closed:
            raise RuntimeError("data loader is closed")
        if self._queue is None:
            try:
                batch, pos = self._produce()
            except BaseException as e:
                self._error = e
                raise
        else:
            try:
                kind, payload = self._queue.get(timeout=timeout)
            except queue.Empty:
                return None
            if kind == "error":
                self._error = payload
                raise payload
            batch, pos = payload
        self._pos = pos
        return batch

    def state(self) -> dict:
        """JSON-serialisable position after the last batch returned by ``next()``."""
        return {**self._header, **copy.deepcopy(self._pos)}

    def close(self) -> None:
        """Stop the prefetch thread (idempotent)."""
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            while True:  # unblock a producer waiting on a full queue
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
            self._thread.join(timeout=10)
            self._thread = None
        closer = getattr(self._source, "close", None)
        if closer is not None:
            closer()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_state(state: dict, header: dict) -> dict:
    if not isinstance(state, dict):
        raise DataError(f"data state: must be a dict from loader.state(), got "
                        f"{type(state).__name__}")
    for k in _HEADER_KEYS:
        if k not in state:
            raise DataError(f"data state: missing key {k!r} (not a loader.state() dict)")
        if state[k] != header[k]:
            raise DataError(f"data state: saved with {k}={state[k]!r}, but this loader has "
                            f"{k}={header[k]!r}")
    return {k: v for k, v in state.items() if k not in _HEADER_KEYS}


def _make_source(cfg, split: str, process_index: int, process_count: int, position):
    d = cfg.data
    if d.source == "synthetic":
        from nsa_jax.data.synthetic import SyntheticSource

        vocab = d.synthetic_vocab or cfg.model.vocab_size
        if vocab > cfg.model.vocab_size:
            raise DataError(f"data.synthetic_vocab: {vocab} > model.vocab_size "
                            f"{cfg.model.vocab_size}")
        if vocab < 2:
            raise DataError(f"data.synthetic_vocab: must be >= 2, got {vocab}")
        return SyntheticSource(vocab, d.seq_len, cfg.train.seed, split, process_index,
                               process_count, position)
    if d.source in ("text", "hf"):
        from nsa_jax.data.text import build_text_source

        return build_text_source(cfg, split, process_index, process_count, position)
    if d.source == "tokens":
        from nsa_jax.data.tokens import build_tokens_source

        return build_tokens_source(cfg, split, process_index, process_count, position)
    if d.source == "retrieval":
        from nsa_jax.data.retrieval import build_retrieval_source

        return build_retrieval_source(cfg, split, process_index, process_count, position)
    raise DataError(f"data.source: unknown source {d.source!r}")


def build_loader(cfg, split: str = "train", batch_size: int = 8, process_index: int = 0,
                 process_count: int = 1, state: dict | None = None) -> Loader:
    """Build the batch iterator for ``cfg.data`` (see module docstring).

    ``cfg`` is the full :class:`nsa_jax.config.Config`; ``batch_size`` is per process, in
    sequences. All input problems raise :class:`DataError` here, before any batch is made.
    """
    if split not in SPLITS:
        raise DataError(f"split: must be one of {list(SPLITS)}, got {split!r}")
    if batch_size < 1:
        raise DataError(f"batch_size: must be >= 1, got {batch_size}")
    if process_count < 1 or not 0 <= process_index < process_count:
        raise DataError(f"process_index: must be in [0, {process_count}), got {process_index}")
    header = {"source": cfg.data.source, "split": split, "seq_len": cfg.data.seq_len,
              "process_index": process_index, "process_count": process_count}
    position = _check_state(state, header) if state is not None else None
    source = _make_source(cfg, split, process_index, process_count, position)
    source.check()
    return Loader(source, batch_size, cfg.data.prefetch, header)
