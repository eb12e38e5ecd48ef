"""Documents from a HuggingFace ``datasets`` stream (``data.source: hf``).

Opens ``datasets.load_dataset(data.hf_name, data.hf_config, split=data.hf_split,
streaming=True)`` -- with ``data_files=<data.path>`` when ``data.path`` is set, so
``hf_name: json`` / ``parquet`` streams local files through exactly the same code path.
``datasets`` is imported lazily (it is an optional extra: ``pip install 'nsa-jax[data]'``).

Splits and processes are assigned per document exactly as for the text source
(:mod:`nsa_jax.data.split`): every process streams the dataset and keeps its own share
("skip-every"), which works for any number of underlying files.

Position is a raw document index; a restore reopens the stream and skips forward with
``IterableDataset.skip`` -- i.e. a resume re-reads the stream up to the saved position.
Transient read errors (network) reopen the stream at the next unread document, with exponential
backoff (``data.retries`` attempts, first wait ``data.retry_backoff_s``), each retry logged.
"""
from __future__ import annotations

import itertools
from typing import Iterator

from nsa_jax.data.errors import DataError
from nsa_jax.data.paths import expand_files
from nsa_jax.data.retry import is_transient, resilient_iter, retry_call
from nsa_jax.errors import brief

HF_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt", ".csv", ".gz", ".zst", ".arrow")


def import_datasets():
    try:
        import datasets
    except ImportError:
        raise DataError("data.source=hf needs the `datasets` package: "
                        "pip install 'nsa-jax[data]'") from None
    return datasets


class HFDocs:
    """Documents of a streaming HF dataset; ``iter_docs(start)`` yields ``(index, text)``."""

    def __init__(self, dcfg, max_retries: int | None = None, backoff: float | None = None):
        self.datasets = import_datasets()
        self.name, self.config, self.split = dcfg.hf_name, dcfg.hf_config, dcfg.hf_split
        self.field = dcfg.text_field
        self.max_docs = dcfg.max_docs
        self.data_files = ([str(f) for f in expand_files(dcfg.path, suffixes=HF_SUFFIXES)]
                           if dcfg.path else None)
        self.max_retries = dcfg.retries if max_retries is None else max_retries
        self.backoff = dcfg.retry_backoff_s if backoff is None else backoff
        self.key = "data.path" if self.data_files else "data.hf_name"

    def describe(self) -> str:
        cfg = f"/{self.config}" if self.config else ""
        return f"hf:{self.name}{cfg}[{self.split}]"

    def _load(self):
        kw = {"data_files": self.data_files} if self.data_files else {}
        try:
            return self.datasets.load_dataset(self.name, self.config, split=self.split,
                                              streaming=True, **kw)
        except Exception as e:
            if isinstance(e, DataError) or is_transient(e):
                raise
            key, hint = self._blame(e)
            raise DataError(f"{key}: cannot open {self.describe()} ({brief(e)}){hint}") from None

    def _blame(self, e: Exception) -> tuple[str, str]:
        """The key an open error is about: ``datasets`` says "BuilderConfig ... not found" for a
        config the dataset lacks (the default ``sample-10BT`` is one a local directory lacks)
        and "Bad split" / "Unknown split" for a split; else the name or path."""
        text = str(e)
        if self.config and "BuilderConfig" in text:
            return "data.hf_config", (" (data.hf_config=null for a dataset without named "
                                      "configs, such as a local directory)")
        if "split" in text.lower() and self.split in text:
            return "data.hf_split", ""
        hint = (f"; data.path is passed as its data_files (data.path=null loads data.hf_name "
                f"alone)" if self.data_files else "")
        return self.key, hint

    def check(self) -> None:
        """Open the stream now (with retries) so a bad name/config/split fails at build time."""
        ds = retry_call(self._load, max_retries=self.max_retries, backoff=self.backoff,
                        what=f"opening {self.describe()}")
        cols = getattr(ds, "column_names", None)
        if cols is not None and self.field not in cols:
            raise DataError(f"data.text_field: {self.field!r} is not a column of "
                            f"{self.describe()} (columns: {', '.join(cols)})")

    def _open_at(self, start: int) -> Iterator[tuple[int, str]]:
        ds = self._load()
        if start:
            ds = ds.skip(start)
        for i, rec in enumerate(ds, start):
            if self.field not in rec:
                raise DataError(f"data.text_field: record {i} of {self.describe()} has no "
                                f"field {self.field!r}")
            text = rec[self.field]
            if text is not None and not isinstance(text, str):
                raise DataError(f"data.text_field: record {i} of {self.describe()}: "
                                f"{self.field!r} is {type(text).__name__}, not text")
            yield i, text or ""

    def iter_docs(self, start: int = 0) -> Iterator[tuple[int, str]]:
        if self.max_docs and start >= self.max_docs:
            return iter(())
        it = resilient_iter(self._open_at, start, max_retries=self.max_retries,
                            backoff=self.backoff, what=f"reading {self.describe()}")
        if self.max_docs:
            it = itertools.islice(it, self.max_docs - start)
        return it
