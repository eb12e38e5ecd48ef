"""Retry transient read errors (network hiccups while streaming) with exponential backoff."""
from __future__ import annotations

import logging
import time
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")
log = logging.getLogger("nsa_jax.data")

_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def is_transient(e: BaseException) -> bool:
    """Network/IO errors worth retrying; missing files and permissions are not."""
    return isinstance(e, (OSError, ConnectionError, TimeoutError)) and not isinstance(e, _PERMANENT)


def retry_call(fn: Callable[[], T], *, max_retries: int, backoff: float, what: str,
               sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``fn()``; on a transient error wait ``backoff * 2**attempt`` s and retry (logged)."""
    for attempt in range(max_retries + 1):
        try:
            return fn()
        except Exception as e:
            if not is_transient(e) or attempt == max_retries:
                raise
            delay = backoff * 2 ** attempt
            log.warning("%s: %s: %s; retry %d/%d in %.1fs", what, type(e).__name__, e,
                        attempt + 1, max_retries, delay)
            sleep(delay)
    raise AssertionError("unreachable")


def resilient_iter(open_at: Callable[[int], Iterator[T]], start: int, *, max_retries: int,
                   backoff: float, what: str,
                   sleep: Callable[[float], None] = time.sleep) -> Iterator[T]:
    """Iterate ``open_at(start)``; after a transient error, reopen at the next unread item.

    ``open_at(i)`` must return an iterator over items ``i, i+1, ...``. Up to ``max_retries``
    consecutive failures (without progress in between) are retried; each retry is logged.
    """
    pos, failures = start, 0
    while True:
        try:
            for item in open_at(pos):
                yield item
                pos += 1
                failures = 0
            return
        except Exception as e:
            if not is_transient(e) or failures >= max_retries:
                raise
            delay = backoff * 2 ** failures
            failures += 1
            log.warning("%s: %s: %s at item %d; retry %d/%d in %.1fs", what, type(e).__name__,
                        e, pos, failures, max_retries, delay)
            sleep(delay)
