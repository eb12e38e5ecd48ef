"""stdout and stderr that outlive their reader (the command lines).

A run is often watched through a pipe (``python -m nsa_jax.train ... 2>&1 | tee log``), and a
scheduler that preempts it sends SIGTERM to the whole process group: ``tee`` dies with it, and
every later write of the run fails with ``BrokenPipeError`` (Python ignores SIGPIPE). Before
:func:`outliving_streams`, the first such write -- the signal's own notice, or a progress line --
raised inside whatever the main thread was doing (often the checkpoint write) and the run ended
with an internal error and no checkpoint of the step it was asked to save.

Within :func:`outliving_streams`, a write or flush to ``sys.stdout`` / ``sys.stderr`` that finds
its pipe broken points the stream's file descriptor at ``/dev/null`` (so later writes from
anywhere in the process, ``os.write`` and C code included, go there too) and carries on: the
run finishes its step, writes its checkpoint and exits as it would have. Its record is in the
run directory (``metrics.jsonl``, checkpoints), which does not depend on the pipe.

``python -m nsa_jax.generate ... | head`` is the other case: there the output *is* the product,
so the generator stops at the first broken write and exits quietly with status 1, as Python's
documentation recommends for EPIPE (:func:`to_devnull` keeps the interpreter's last flush from
printing a second error).
"""
from __future__ import annotations

import contextlib
import io
import os
import sys


def to_devnull(stream) -> None:
    """Point ``stream``'s file descriptor at /dev/null (nothing for a stream without one)."""
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation, AttributeError):
        fd = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(fd, stream.fileno())
        finally:
            os.close(fd)


class _Outliving:
    """A text stream whose writes never raise ``BrokenPipeError`` (module docstring)."""

    def __init__(self, stream):
        self._stream = stream

    def _to_devnull(self) -> None:
        to_devnull(self._stream)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()       # the bytes still buffered go to /dev/null on the next flush

    def __getattr__(self, name):     # fileno, isatty, encoding, ...: the wrapped stream's
        return getattr(self._stream, name)


@contextlib.contextmanager
def outliving_streams():
    """``sys.stdout`` and ``sys.stderr`` wrapped (module docstring) inside the block; the
    streams that were there before are put back after it."""
    before = sys.stdout, sys.stderr
    wrapped = sys.stdout, sys.stderr = _Outliving(sys.stdout), _Outliving(sys.stderr)
    try:
        yield
    finally:
        for w in wrapped:      # what is still buffered meets a broken pipe here, not at exit
            w.flush()          # (Python's last flush would print an error and exit 120)
        sys.stdout, sys.stderr = before
