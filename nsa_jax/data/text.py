"""Packed text sources (``data.source: text`` and ``hf``): documents -> token windows.

The documents of one split and process (see :mod:`nsa_jax.data.split`) are tokenized (in chunks,
``encode_batch``) and joined as ``tokens(doc) + [EOS]`` (empty documents contribute nothing)
into one stream, cut into windows of ``seq_len + 1`` tokens with stride ``seq_len`` (neighbouring
windows share one token, so every token is a target exactly once). At the end of the documents
the stream wraps to the first document again (next epoch), without a gap.

With ``data.packing: documents`` a row also carries segment ids: 0 from its first token (a window
that starts mid-document starts a new segment), one more at the first token of each following
document (the EOS ends the document it follows). The windows are the same as with ``concat``.

Position: ``{"epoch", "doc", "offset"}`` -- the next window starts ``offset`` tokens into raw
document ``doc`` of that epoch; a restore re-tokenizes from that document.
"""
from __future__ import annotations

import collections
import math
from typing import Iterator

import numpy as np

from nsa_jax.data.batch import Batch
from nsa_jax.data.errors import DataError
from nsa_jax.data.split import DocFilter

ENCODE_CHUNK = 64  # documents tokenized together (tokenizers parallelises encode_batch)


def doc_token_arrays(docs, tokenizer, start: int, keep=lambda i: True
                     ) -> Iterator[tuple[int, np.ndarray]]:
    """``(raw_index, tokens + [eos])`` for kept non-empty documents from ``start`` (one pass)."""
    chunk: list[tuple[int, str]] = []

    def flush():
        ids = tokenizer.encode_batch([t for _, t in chunk])
        for (i, _), toks in zip(chunk, ids):
            arr = np.empty(len(toks) + 1, np.int64)
            arr[:-1] = toks
            arr[-1] = tokenizer.eos_id
            yield i, arr

    for i, text in docs.iter_docs(start):
        if text and keep(i):
            chunk.append((i, text))
            if len(chunk) >= ENCODE_CHUNK:
                yield from flush()
                chunk = []
    if chunk:
        yield from flush()


class PackedTextSource:
    """Rows of ``seq_len + 1`` tokens packed from documents; see module docstring."""

    def __init__(self, kind: str, docs, tokenizer, seq_len: int, split: str, eval_fraction: float,
                 process_index: int, process_count: int, position: dict | None = None,
                 documents: bool = False):
        self.kind, self.docs, self.tok = kind, docs, tokenizer
        self.documents = documents
        self.T = seq_len
        self.split = split
        self.filter = DocFilter(split, eval_fraction, process_index, process_count)
        self.where = f"process {process_index}/{process_count}" if process_count > 1 else ""
        pos = position or {}
        self.epoch, self.doc, self.offset = (int(pos.get(k, 0)) for k in ("epoch", "doc", "offset"))
        self._segments: collections.deque = collections.deque()  # [epoch, doc, offset, tokens]
        self._next = (self.epoch, self.doc)   # where the token stream resumes after the buffer
        self._buffered = 0
        self._stream = None

    # -- validation ------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise DataError unless one epoch of this split/process holds >= seq_len + 1 tokens."""
        check = getattr(self.docs, "check", None)
        if check is not None:
            check()
        need, have, n_docs = self.T + 1, 0, 0
        for _, toks in doc_token_arrays(self.docs, self.tok, 0, self.filter.keep):
            n_docs += 1
            have += len(toks)
            if have >= need:
                return
        part = f"{self.split} split" + (f" ({self.where})" if self.where else "")
        if n_docs == 0:
            held = ""
            if self.split == "eval" and self.filter.f > 0:   # the first held out: document n
                n = math.ceil(1 / self.filter.f - 1e-9)
                held = f": the first document it holds out is document {n}"
            raise DataError(f"{self.docs.key}: empty dataset: no non-empty documents in the "
                            f"{part} of {self.docs.describe()} (data.eval_fraction="
                            f"{self.filter.f}{held})")
        raise DataError(f"data.seq_len: {self.T} needs {need} tokens, but the {part} of "
                        f"{self.docs.describe()} has only {have}")

    # -- stream --------------------------------------------------------------------------------
    def _epochs(self) -> Iterator[tuple[int, int, np.ndarray]]:
        epoch, start, offset = self.epoch, self.doc, self.offset
        while True:
            empty = True
            for i, toks in doc_token_arrays(self.docs, self.tok, start, self.filter.keep):
                empty = False
                if offset:
                    toks, first = (toks[offset:], offset) if i == start else (toks, 0)
                    offset = 0
                    yield epoch, i, first, toks
                else:
                    yield epoch, i, 0, toks
            if empty and start == 0:
                raise DataError(f"{self.docs.key}: empty dataset: no tokens in the "
                                f"{self.split} split of {self.docs.describe()}")
            epoch, start, offset = epoch + 1, 0, 0

    def _fill(self, need: int) -> None:
        if self._stream is None:
            self._stream = self._epochs()
        while self._buffered < need:
            epoch, doc, first, toks = next(self._stream)
            if len(toks):
                self._segments.append([epoch, doc, first, toks])
                self._buffered += len(toks)
            self._next = (epoch, doc + 1)

    def _consume(self, k: int) -> None:
        self._buffered -= k
        while k:
            seg = self._segments[0]
            n = len(seg[3])
            if n <= k:
                self._segments.popleft()
                k -= n
            else:
                seg[2] += k
                seg[3] = seg[3][k:]
                k = 0

    def position(self) -> dict:
        if self._segments:
            epoch, doc, offset, _ = self._segments[0]
        elif self._stream is None:
            epoch, doc, offset = self.epoch, self.doc, self.offset
        else:
            (epoch, doc), offset = self._next, 0
        return {"epoch": int(epoch), "doc": int(doc), "offset": int(offset)}

    def next_rows(self, count: int) -> np.ndarray | Batch:
        out = np.empty((count, self.T + 1), np.int32)
        seg_ids = np.empty((count, self.T + 1), np.int32) if self.documents else None
        for r in range(count):
            self._fill(self.T + 1)
            got, row = 0, out[r]
            for k, seg in enumerate(self._segments):   # one buffered segment = one document
                take = min(len(seg[3]), self.T + 1 - got)
                row[got:got + take] = seg[3][:take]
                if seg_ids is not None:
                    seg_ids[r, got:got + take] = k
                got += take
                if got == self.T + 1:
                    break
            self._consume(self.T)
        return out if seg_ids is None else Batch(out, segment_ids=seg_ids)


def build_text_source(cfg, split, process_index, process_count, position):
    from nsa_jax.data.tokenizer import get_tokenizer

    d = cfg.data
    if split == "eval" and d.eval_fraction == 0:
        raise DataError("data.eval_fraction: is 0, so there is no eval split")
    tok = get_tokenizer(d.tokenizer)
    if tok.vocab_size > cfg.model.vocab_size:
        raise DataError(f"data.tokenizer: vocab {tok.vocab_size} > model.vocab_size "
                        f"{cfg.model.vocab_size}")
    if d.source == "text":
        from nsa_jax.data.documents import LocalDocs
        from nsa_jax.data.paths import expand_files

        docs = LocalDocs(expand_files(d.path), d.text_field, d.max_docs)
    else:
        from nsa_jax.data.hf import HFDocs

        docs = HFDocs(d)
    return PackedTextSource(d.source, docs, tok, d.seq_len, split, d.eval_fraction,
                            process_index, process_count, position,
                            documents=d.packing == "documents")
