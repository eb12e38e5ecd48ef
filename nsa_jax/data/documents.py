"""Document readers for local files: .txt, .jsonl and .parquet.

A reader enumerates documents in a fixed order (files sorted by path; rows in file order) and
can start at any raw document index ``i`` without parsing the earlier files (per-file document
counts come from the parquet metadata, a line count for .jsonl, and 1 for .txt).

* ``.txt``     -- the whole file is one document (UTF-8).
* ``.jsonl``   -- one JSON object per non-blank line; the document is field ``data.text_field``.
* ``.parquet`` -- one row per document, column ``data.text_field`` (needs ``pyarrow``).

A null/missing-valued row in parquet is an empty document. Any problem raises DataError naming
``file:line`` (jsonl) or the file.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from nsa_jax.data.errors import DataError


def _pq():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError("reading .parquet needs pyarrow: pip install 'nsa-jax[data]'") from None
    return pq


def _open_parquet(path: Path, field: str):
    pq = _pq()
    try:
        f = pq.ParquetFile(str(path))
    except Exception as e:
        raise DataError(f"{path}: unreadable parquet file ({str(e).splitlines()[0]})") from None
    if field not in f.schema_arrow.names:
        raise DataError(f"{path}: no column {field!r} (data.text_field); columns: "
                        f"{', '.join(f.schema_arrow.names)}")
    return f


class LocalDocs:
    """Documents of a sorted list of local files; ``iter_docs(start)`` yields ``(index, text)``."""

    def __init__(self, files: list[Path], text_field: str, max_docs: int = 0):
        self.files = list(files)
        self.field = text_field
        self.max_docs = max_docs
        self.key = "data.path"
        self._counts: dict[Path, int] = {}

    def describe(self) -> str:
        return self.files[0].as_posix() if len(self.files) == 1 else \
            f"{len(self.files)} files ({self.files[0].parent})"

    def check(self) -> None:
        """Open every parquet file now, so corrupt files fail at build time."""
        for f in self.files:
            if f.suffix == ".parquet":
                _open_parquet(f, self.field)

    def _count(self, path: Path) -> int:
        if path not in self._counts:
            if path.suffix == ".txt":
                n = 1
            elif path.suffix == ".parquet":
                n = _open_parquet(path, self.field).metadata.num_rows
            else:
                with open(path, "rb") as fh:
                    n = sum(1 for line in fh if line.strip())
            self._counts[path] = n
        return self._counts[path]

    def _read(self, path: Path, skip: int) -> Iterator[str]:
        if path.suffix == ".txt":
            if skip == 0:
                try:
                    yield path.read_text(encoding="utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte "
                                    f"{e.start})") from None
            return
        if path.suffix == ".jsonl":
            yield from self._read_jsonl(path, skip)
            return
        f = _open_parquet(path, self.field)
        row = 0
        for rg in range(f.metadata.num_row_groups):
            n = f.metadata.row_group(rg).num_rows
            if row + n <= skip:
                row += n
                continue
            try:
                col = f.read_row_group(rg, columns=[self.field]).column(0).to_pylist()
            except Exception as e:
                raise DataError(f"{path}: corrupt parquet row group {rg} "
                                f"({str(e).splitlines()[0]})") from None
            for j, text in enumerate(col):
                if row + j >= skip:
                    if text is not None and not isinstance(text, str):
                        raise DataError(f"{path}: row {row + j}: column {self.field!r} is "
                                        f"{type(text).__name__}, not text")
                    yield text or ""
            row += n

    def _read_jsonl(self, path: Path, skip: int) -> Iterator[str]:
        seen = 0
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                seen += 1
                if seen <= skip:
                    continue
                try:
                    obj = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise DataError(f"{path}:{lineno}: invalid JSON ({e})") from None
                if not isinstance(obj, dict) or self.field not in obj:
                    raise DataError(f"{path}:{lineno}: no field {self.field!r} (data.text_field)")
                text = obj[self.field]
                if text is not None and not isinstance(text, str):
                    raise DataError(f"{path}:{lineno}: field {self.field!r} is "
                                    f"{type(text).__name__}, not text")
                yield text or ""

    def iter_docs(self, start: int = 0) -> Iterator[tuple[int, str]]:
        """Documents ``start, start+1, ...`` of one pass over the files (``max_docs`` applies)."""
        base = 0
        for path in self.files:
            if self.max_docs and base >= self.max_docs:
                return
            n = self._count(path) if start > base else None
            if n is not None and base + n <= start:
                base += n
                continue
            skip = max(0, start - base)
            i = base + skip
            for text in self._read(path, skip):
                if self.max_docs and i >= self.max_docs:
                    return
                yield i, text
                i += 1
            base = i
