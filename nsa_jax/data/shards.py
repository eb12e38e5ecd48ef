"""Pretokenized shards on disk: raw ``uint16``/``uint32`` token files plus ``index.json``.

Layout of a prepared directory::

    index.json          {"format": "nsa_jax.tokens", "version": 2, "dtype": "uint16",
                         "vocab_size": 50257, "eos_id": 50256, "tokenizer": "gpt2",
                         "docs": 150, "total_tokens": 123456, "source": "...",
                         "shards": [{"file": "shard_00000.bin", "tokens": 123456}, ...],
                         "documents": {"file": "documents.bin", "dtype": "int64"}}
    shard_00000.bin     tokens, native little-endian, no header (numpy.memmap-able)
    documents.bin       int64 [docs]: where each document ends in the stream (exclusive), so
                        document i is tokens [ends[i-1], ends[i]) (its last token is its EOS)

The shards concatenated in index order are the token stream (documents joined by EOS).
``documents.bin`` (version 2) gives ``data.packing: documents`` its boundaries; a version-1
directory (no ``documents``) still loads, for ``concat`` only.
:func:`write_dataset` writes into a temporary sibling directory and renames it into place, so an
error never leaves a half-written ``out_dir``.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterable

import numpy as np

from nsa_jax.data.errors import DataError
from nsa_jax.data.paths import resolve_path

INDEX = "index.json"
DOCUMENTS = "documents.bin"
FORMAT = "nsa_jax.tokens"
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def dtype_for_vocab(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


class ShardWriter:
    """Append token arrays; rolls over to a new shard file every ``shard_tokens`` tokens."""

    def __init__(self, directory: Path, dtype: str, shard_tokens: int):
        if shard_tokens < 1:
            raise DataError(f"data.shard_tokens: must be >= 1, got {shard_tokens}")
        self.dir, self.dtype, self.cap = Path(directory), dtype, shard_tokens
        self.max_id = np.iinfo(DTYPES[dtype]).max
        self.shards: list[dict] = []
        self._fh = None

    def _roll(self) -> None:
        if self._fh is not None:
            self._fh.close()
        name = f"shard_{len(self.shards):05d}.bin"
        self._fh = open(self.dir / name, "wb")
        self.shards.append({"file": name, "tokens": 0})

    def add(self, tokens: np.ndarray) -> None:
        tokens = np.asarray(tokens)
        if tokens.size:
            lo, hi = tokens.min(), tokens.max()
            if lo < 0 or hi > self.max_id:   # name the id that fails
                raise DataError(f"token id {int(lo if lo < 0 else hi)} does not fit {self.dtype}")
        tokens = tokens.astype(DTYPES[self.dtype])
        while tokens.size:
            if self._fh is None or self.shards[-1]["tokens"] >= self.cap:
                self._roll()
            room = self.cap - self.shards[-1]["tokens"]
            part, tokens = tokens[:room], tokens[room:]
            part.tofile(self._fh)
            self.shards[-1]["tokens"] += int(part.size)

    def close(self) -> list[dict]:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        return self.shards


def write_dataset(out_dir: str | Path, token_arrays: Iterable[np.ndarray], *, dtype: str,
                  shard_tokens: int, meta: dict) -> dict:
    """Write ``token_arrays`` (one per document) as shards + index.json, atomically."""
    out = Path(out_dir)
    if out.exists():
        raise DataError(f"data.out_dir: {out} already exists (remove it or choose another)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"data.out_dir: cannot create {out.parent} ({e.strerror})") from None
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        writer = ShardWriter(tmp, dtype, shard_tokens)
        docs, end = 0, 0
        with open(tmp / DOCUMENTS, "wb") as ends:
            for arr in token_arrays:
                writer.add(arr)
                docs += 1
                end += int(np.asarray(arr).size)
                np.array([end], np.int64).tofile(ends)
        shards = writer.close()
        if not any(s["tokens"] for s in shards):
            raise DataError(f"{meta.get('source', 'input')}: empty dataset (no tokens to write)")
        index = {"format": FORMAT, "version": 2, "dtype": dtype, **meta, "docs": docs,
                 "total_tokens": sum(s["tokens"] for s in shards), "shards": shards,
                 "documents": {"file": DOCUMENTS, "dtype": "int64"}}
        (tmp / INDEX).write_text(json.dumps(index, indent=1))
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return index


class ShardReader:
    """Random access to the token stream of a prepared directory (memory-mapped)."""

    def __init__(self, path: str, key: str = "data.path"):
        p = resolve_path(path)
        index_path = p if p.name == INDEX else p / INDEX
        if not p.exists():
            raise DataError(f"{key}: {path} does not exist (make it with python -m "
                            f"nsa_jax.data.prepare)")
        if not index_path.is_file():
            raise DataError(f"{key}: no {INDEX} in {p} (make one with python -m "
                            f"nsa_jax.data.prepare)")
        try:
            idx = json.loads(index_path.read_text())
            dtype = idx["dtype"]
            shards = [(str(s["file"]), int(s["tokens"])) for s in idx["shards"]]
            self.vocab_size, self.eos_id = int(idx["vocab_size"]), int(idx["eos_id"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataError(f"{index_path}: corrupt index ({type(e).__name__}: {e})") from None
        if dtype not in DTYPES:
            raise DataError(f"{index_path}: dtype must be one of {list(DTYPES)}, got {dtype!r}")
        self.index, self.dtype, self.dir = idx, dtype, index_path.parent
        item = np.dtype(DTYPES[dtype]).itemsize
        self.maps, counts = [], []
        for name, n in shards:
            f = self.dir / name
            if not f.is_file():
                raise DataError(f"{f}: shard listed in {INDEX} is missing")
            size = f.stat().st_size
            if size != n * item:
                raise DataError(f"{f}: corrupt shard: {size} bytes, expected {n} {dtype} tokens "
                                f"= {n * item} bytes")
            if n:
                self.maps.append(np.memmap(f, dtype=DTYPES[dtype], mode="r", shape=(n,)))
                counts.append(n)
        self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self.total = int(self.starts[-1])
        self.doc_ends = self._doc_ends(index_path, idx.get("documents"))

    def _doc_ends(self, index_path: Path, entry) -> np.ndarray | None:
        """The memory-mapped document ends, or None for a version-1 directory (no boundaries)."""
        if entry is None:
            return None
        try:
            f, n = self.dir / str(entry["file"]), int(self.index["docs"])
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"{index_path}: corrupt index ({type(e).__name__}: {e})") from None
        if not f.is_file():
            raise DataError(f"{f}: document boundaries listed in {INDEX} are missing")
        if f.stat().st_size != 8 * n:
            raise DataError(f"{f}: corrupt: {f.stat().st_size} bytes, expected {n} int64 "
                            f"document ends = {8 * n} bytes")
        ends = np.memmap(f, dtype=np.int64, mode="r", shape=(n,)) if n else np.zeros(0, np.int64)
        if n and int(ends[-1]) != self.total:
            raise DataError(f"{f}: corrupt: the last document ends at {int(ends[-1])}, but the "
                            f"shards hold {self.total} tokens")
        return ends

    def segment_ids(self, start: int, length: int) -> np.ndarray:
        """int32 [length]: the document of each token of ``[start, start + length)``, counted
        from 0 at ``start`` (needs document boundaries: ``doc_ends`` is not None)."""
        doc = np.searchsorted(self.doc_ends, np.arange(start, start + length), side="right")
        return (doc - doc[0]).astype(np.int32)

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens ``[start, start + length)`` of the stream as int64 (may span shards)."""
        if start < 0 or start + length > self.total:
            raise IndexError(f"read [{start}, {start + length}) outside [0, {self.total})")
        out = np.empty(length, np.int64)
        s = int(np.searchsorted(self.starts, start, side="right")) - 1
        got = 0
        while got < length:
            lo = start + got - int(self.starts[s])
            take = min(length - got, len(self.maps[s]) - lo)
            out[got:got + take] = self.maps[s][lo:lo + take]
            got += take
            s += 1
        return out
