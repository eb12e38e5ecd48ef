"""Windows over pretokenized shards (``data.source: tokens``).

The token stream of a prepared directory (see :mod:`nsa_jax.data.shards`) is split by position:
eval is the last ``data.eval_fraction`` of tokens, train everything before it. A split of ``R``
tokens holds ``W = (R - 1) // seq_len`` windows of ``seq_len + 1`` tokens (stride ``seq_len``).
Each train epoch visits the windows in a permutation drawn from (``train.seed``, epoch) (in order
when ``data.shuffle`` is false); eval is in order. Process ``p`` of ``P`` takes every ``P``-th window of that order (``W // P`` per
epoch, so all processes see equally many). Position: ``{"cursor": windows consumed}``.

With ``data.packing: documents`` a row also carries segment ids from the directory's document
boundaries (:mod:`nsa_jax.data.shards`, ``documents.bin``): 0 from the window's first token, one
more at each document start inside it.
"""
from __future__ import annotations

import numpy as np

from nsa_jax.data.batch import Batch
from nsa_jax.data.errors import DataError
from nsa_jax.data.shards import ShardReader
from nsa_jax.data.tokenizer import get_tokenizer

_TAG = 0x70C5


class TokensSource:
    kind = "tokens"

    def __init__(self, reader: ShardReader, seq_len: int, split: str, eval_fraction: float,
                 seed: int, process_index: int, process_count: int, position: dict | None = None,
                 shuffle: bool = True, documents: bool = False):
        self.r, self.T, self.split, self.seed = reader, seq_len, split, seed
        self.documents = documents
        self.shuffle = shuffle
        self.p, self.P = process_index, process_count
        n = reader.total
        if n == 0:
            raise DataError(f"data.path: empty dataset: {reader.dir} holds no tokens")
        n_eval = int(n * eval_fraction)
        self.lo, self.hi = (n - n_eval, n) if split == "eval" else (0, n - n_eval)
        region = self.hi - self.lo
        self.W = (region - 1) // seq_len if region > seq_len else 0
        self.per_proc = self.W // process_count
        if self.per_proc == 0:
            need = (f"{seq_len + 1} tokens" if process_count == 1 else
                    f"{process_count} windows of {seq_len + 1} tokens (one per process)")
            raise DataError(f"data.seq_len: {seq_len} needs {need}, but the {split} split of "
                            f"{reader.dir} has {region} tokens")
        self.cursor = int((position or {}).get("cursor", 0))
        self._order_epoch, self._order = -1, None

    def check(self) -> None:
        """Validated in the constructor (index, shard sizes, window count)."""

    def position(self) -> dict:
        return {"cursor": self.cursor}

    def _window(self, c: int) -> int:
        epoch, k = divmod(c, self.per_proc)
        if epoch != self._order_epoch:
            if self.split == "train" and self.shuffle:
                rng = np.random.default_rng([self.seed, _TAG, epoch])
                self._order = rng.permutation(self.W)
            else:
                self._order = np.arange(self.W)
            self._order_epoch = epoch
        return int(self._order[self.p + k * self.P])

    def next_rows(self, count: int) -> np.ndarray | Batch:
        out = np.empty((count, self.T + 1), np.int32)
        seg = np.empty((count, self.T + 1), np.int32) if self.documents else None
        for j in range(count):
            start = self.lo + self._window(self.cursor + j) * self.T
            out[j] = self.r.read(start, self.T + 1)
            if seg is not None:
                seg[j] = self.r.segment_ids(start, self.T + 1)
        self.cursor += count
        return out if seg is None else Batch(out, segment_ids=seg)


def _check_tokenizer(name: str, reader: ShardReader) -> None:
    """Refuse a ``data.tokenizer`` other than the one the shards were made with (index.json's
    ``tokenizer``), told apart by vocabulary size and EOS id: the run records data.tokenizer,
    and generation encodes and decodes with it. Shards whose index names no tokenizer that
    loads here (another machine's path, test data) are not checked."""
    made = reader.index.get("tokenizer")
    if not isinstance(made, str) or made == name:
        return
    try:
        get_tokenizer(made)
    except DataError:
        return
    tok = get_tokenizer(name)
    if (tok.vocab_size, tok.eos_id) != (reader.vocab_size, reader.eos_id):
        raise DataError(f"data.tokenizer: {name!r} (vocab {tok.vocab_size}, EOS {tok.eos_id}) "
                        f"is not the tokenizer the shards in {reader.dir} were made with "
                        f"({made!r}: vocab {reader.vocab_size}, EOS {reader.eos_id})")


def build_tokens_source(cfg, split, process_index, process_count, position):
    d = cfg.data
    if split == "eval" and d.eval_fraction == 0:
        raise DataError("data.eval_fraction: is 0, so there is no eval split")
    reader = ShardReader(d.path)
    _check_tokenizer(d.tokenizer, reader)
    if reader.vocab_size > cfg.model.vocab_size:
        raise DataError(f"data.path: {reader.dir}/index.json vocab {reader.vocab_size} > "
                        f"model.vocab_size {cfg.model.vocab_size}")
    documents = d.packing == "documents"
    if documents and reader.doc_ends is None:
        raise DataError(f"data.packing: documents needs document boundaries, but "
                        f"{reader.dir}/index.json has none (prepared before they were stored); "
                        f"re-run python -m nsa_jax.data.prepare, or use data.packing=concat")
    return TokensSource(reader, d.seq_len, split, d.eval_fraction, cfg.train.seed,
                        process_index, process_count, position, shuffle=d.shuffle,
                        documents=documents)
