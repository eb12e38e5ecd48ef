"""Batches for the train loop: bounded waits on the loader, failures turned into one line.

:func:`open_loader` builds a loader; a source that cannot be opened (after its retries) is a
:class:`DataFailed` too. A read that *raises* is retried inside the data pipeline first (``data.retries`` attempts with
backoff ``data.retry_backoff_s``, doubling, each logged; hf streams); what still escapes ends
the run. A read that *stalls* is caught here: the loop waits for each batch at most
``train.data_timeout_s`` seconds (0 = no limit; the wait is on the loader's prefetch thread, so
it needs ``data.prefetch >= 1``). Either way :class:`DataFailed` is raised and the loop writes a
checkpoint of the last completed step before it stops (status 1). A
:class:`~nsa_jax.data.DataError` (bad data, e.g. a malformed record) propagates unchanged.

The wait is sliced (``POLL_S``) so that a SIGTERM/SIGINT arriving while a batch is late still
stops the run promptly: :meth:`BatchFeed.next` then returns None.
"""
from __future__ import annotations

import time
from typing import Callable

from nsa_jax.data import DataError, build_loader
from nsa_jax.data.batch import Batch
from nsa_jax.data.retry import is_transient
from nsa_jax.errors import brief
from nsa_jax.train.errors import DataFailed

POLL_S = 0.25


class BatchFeed:
    def __init__(self, loader, dcfg, split: str, timeout_s: float = 0.0):
        self.loader, self.timeout_s = loader, timeout_s
        self.what = f"the {split} data (data.source={dcfg.source})"
        self.retries = dcfg.retries if dcfg.source == "hf" else None

    def next(self, stop: Callable[[], bool] | None = None) -> Batch | None:
        """The next local batch (tokens, and the loss mask / segment ids the data config asks
        for), or None if ``stop()`` turned true while waiting for it."""
        t0 = time.monotonic()
        while True:
            wait = POLL_S
            if self.timeout_s:
                wait = max(min(wait, self.timeout_s - (time.monotonic() - t0)), 0.0)
            try:
                batch = self.loader.next(timeout=wait)
            except DataError:
                raise
            except Exception as e:  # noqa: BLE001 - the source gave up (after its retries)
                after = (f" after data.retries={self.retries} retries"
                         if self.retries is not None and is_transient(e) else "")
                raise DataFailed(f"data: reading {self.what} failed{after} "
                                 f"({brief(e)})") from e
            if batch is not None:
                return batch
            if stop is not None and stop():
                return None
            waited = time.monotonic() - t0
            if self.timeout_s and waited >= self.timeout_s:
                raise DataFailed(f"data: no batch of {self.what} within train.data_timeout_s="
                                 f"{self.timeout_s:g}s (a stalled read)")


def open_loader(cfg, split: str, *args):
    """``build_loader``; a source that cannot be opened after its retries (network) raises
    :class:`DataFailed` with one line (bad data or config: :class:`DataError`, status 2)."""
    try:
        return build_loader(cfg, split, *args)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001
        if not is_transient(e):
            raise
        after = f" after data.retries={cfg.data.retries} retries" if cfg.data.source == "hf" else ""
        raise DataFailed(f"data: opening the {split} data (data.source={cfg.data.source}) "
                         f"failed{after} ({brief(e)})") from e
