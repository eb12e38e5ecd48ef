"""Error lines and exit statuses shared by every command line (train, prepare, generate).

Every CLI reports a problem as one line ``error: ...`` on stderr (``--debug`` adds the
traceback) and exits with one of the statuses below; warnings are one line ``warning: ...``.
The helpers here turn any exception into such a line: :func:`one_line` (the message, white space
folded), :func:`first_line` (``Type: first line``) and :func:`root_reason` (the innermost cause,
e.g. ``No space left on device``, short enough for one line).

:func:`quiet_orbax_reads` silences the asyncio noise orbax leaves behind when an array read
fails (``Task exception was never retrieved``, ``Event loop is closed``): the failure itself is
reported once, by the caller, as a ``warning:`` or ``error:`` line.
"""
from __future__ import annotations

import argparse
import logging
import sys
import traceback

EXIT_OK = 0
EXIT_FAILED = 1          # training started but failed (non-finite steps, data, disk, a bug)
EXIT_BAD_INPUT = 2       # config, override, argument, data, run directory, checkpoint
EXIT_HUNG = 3            # the watchdog: no progress for run.watchdog_s
EXIT_OUT_OF_MEMORY = 4   # training: an allocation failed (device or host)
EXIT_INTERRUPTED = 130   # Ctrl-C before training started

MAX_REASON = 240         # characters of a nested cause quoted inside a message


def byte_size(n: int) -> str:
    """Bytes in binary units for a message, e.g. ``6.4 TiB``, ``1.50 GiB``, ``12.0 MiB``."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.{2 if unit == 'GiB' else 1}f} {unit}"
    return f"{n} B"


def one_line(e: BaseException) -> str:
    """An exception's message on one line (for ``error: ...`` lines)."""
    return " ".join(str(e).split()) or type(e).__name__


def first_line(e: BaseException) -> str:
    """``Type: first line of the message`` (``Type`` alone for an empty message)."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def os_reason(e: BaseException) -> str:
    """``No space left on device`` for an OSError, else :func:`first_line`."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return first_line(e)


def _shorten(text: str, limit: int = MAX_REASON) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def brief(e: BaseException) -> str:
    """``Type: message`` on one line, at most :data:`MAX_REASON` characters."""
    return _shorten(f"{type(e).__name__}: {one_line(e)}" if str(e).strip() else type(e).__name__)


def root_reason(e: BaseException) -> str:
    """The reason at the bottom of ``e``'s cause chain: an OSError's ``strerror`` if there is
    one, else the innermost exception's first line, at most :data:`MAX_REASON` characters."""
    seen, cur, inner = set(), e, e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.strerror:
            return cur.strerror
        inner = cur
        cur = cur.__cause__ or cur.__context__
    return _shorten(first_line(inner))


def warn(msg: str) -> None:
    """One ``warning: ...`` line on stderr."""
    sys.stderr.write(f"warning: {msg}\n")
    sys.stderr.flush()


def report(msg: str, status: int, debug: bool = False) -> int:
    """Print ``error: msg`` (after the traceback with ``debug``); returns ``status``."""
    if debug:
        traceback.print_exc()
    sys.stderr.write(f"error: {msg}\n")
    sys.stderr.flush()
    return status


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line ``error: ... (see --help)``, status 2."""

    def error(self, message):
        sys.stderr.write(f"error: {message} (see --help)\n")
        raise SystemExit(EXIT_BAD_INPUT)


def parse_args(parser: argparse.ArgumentParser, argv: list[str]):
    """``(args, None)``, or ``(None, status)`` when parsing ended (--help, a bad argument)."""
    try:
        return parser.parse_args(argv), None
    except SystemExit as e:
        return None, int(e.code or 0)


# ---- orbax's leftovers after a failed read -------------------------------------------------
def _from_orbax(exc: BaseException | None) -> bool:
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        if "orbax" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return exc is not None and "Event loop is closed" in str(exc)


class _AsyncioFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (_from_orbax(exc) or "orbax" in str(record.msg) + str(record.args))


_installed = False


def quiet_orbax_reads() -> None:
    """Drop (for the rest of the process) the tracebacks orbax's leftover tasks print when a
    read failed: asyncio's "exception was never retrieved" log records and "Exception ignored
    in <coroutine>" messages of orbax coroutines. Everything else still gets through."""
    global _installed
    if _installed:
        return
    _installed = True
    logging.getLogger("asyncio").addFilter(_AsyncioFilter())
    previous = sys.unraisablehook

    def hook(u):
        obj = repr(getattr(u, "object", ""))
        if _from_orbax(u.exc_value) or "orbax" in obj or "serialization" in obj:
            return
        previous(u)

    sys.unraisablehook = hook
