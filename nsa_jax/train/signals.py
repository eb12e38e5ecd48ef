"""SIGTERM / SIGINT during training: finish the step, write a checkpoint, exit 0.

:class:`GracefulStop` installs handlers for both signals while the loop runs. The first signal
only sets a flag and prints one line on stderr; the loop looks at the flag between steps (and
while it waits for data), writes a checkpoint of the last completed step, waits for it to be
complete and returns normally, so the CLI exits with status 0 (preemption-safe).

The handler then puts back the default action of both signals, so a second one ends the process
at once -- also while the main thread is blocked in a device call or a checkpoint write --
with the signal's status (143 for SIGTERM, 130 for SIGINT in a shell; -15 / -2 from
``subprocess``). Python runs the handler only when the main thread is back in Python, so two
signals that both arrive during one blocking call (a long compile, a hung collective) would
otherwise wait for it: the watchdog's ``nsa-stacks`` thread sees each signal as it arrives
(:meth:`GracefulStop.woken`) and on a second one (at least ``REPEAT_S`` after the first: one
sender may deliver a signal twice) ends the process with status 128 + the signal's number
(143 / 130, from ``subprocess`` too). A checkpoint being written at that moment stays
incomplete and is never chosen on resume.

Multi-process runs agree on stopping at log steps (``train.log_every``): the flag of every
process is gathered there, so all processes save the same step. Handlers can only be installed
from the main thread; elsewhere (``train()`` called from a thread) signals keep their handlers.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import numpy as np

SIGNALS = (signal.SIGTERM, signal.SIGINT)
REPEAT_S = 0.5   # a second signal sooner than this after the first is the same request


class GracefulStop:
    def __init__(self, clock=time.monotonic, exit_now=os._exit):
        """``clock`` and ``exit_now``: what :meth:`woken` times signals with and ends the
        process with (seams for tests)."""
        self.signum: int | None = None
        self._clock, self._exit_now = clock, exit_now
        self._first_woken: float | None = None     # clock() at the first signal
        self._previous: dict = {}
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        for s in self._previous:        # a second signal: the default action, at once
            signal.signal(s, signal.SIG_DFL)
        # os.write: safe even if the main thread was interrupted inside a print; a reader gone
        # (``train | tee`` preempted as a group) must not turn the stop into an error
        with contextlib.suppress(OSError):
            os.write(2, f"received {signal.Signals(signum).name}: finishing the current step, "
                        f"then writing a checkpoint (send it again to exit at once)\n".encode())

    def woken(self, signum: int) -> None:
        """One signal as it arrives (``Watchdog.on_signals``: a byte Python's C-level handler
        writes for each delivery while a Python handler is installed, whatever the main thread is
        doing). Ours put back the default action when they run, so a second SIGTERM / SIGINT seen
        here reached the process before the first was handled: the main thread is blocked, and
        the user asked twice. Exit now, as the second signal would have -- unless it came within
        ``REPEAT_S`` of the first: one sender can deliver a signal twice (GNU ``timeout`` signals
        the child and then its process group; launchers forward what the group also got), and
        that is one request."""
        if signum not in self._previous:
            return
        now = self._clock()
        if self._first_woken is None:
            self._first_woken = now
        elif now - self._first_woken >= REPEAT_S:
            with contextlib.suppress(OSError):
                os.write(2, f"received {signal.Signals(signum).name} again: exiting at once\n"
                            .encode())
            self._exit_now(128 + signum)

    def requested(self) -> bool:
        """This process got a signal (no communication)."""
        return self.signum is not None

    def agreed(self, sync_point: bool) -> bool:
        """Whether to stop now. Single process: the local flag. Several processes: the flags of
        all of them, gathered only at ``sync_point`` (the same steps on every process)."""
        import jax

        if jax.process_count() == 1:
            return self.requested()
        if not sync_point:
            return False
        from jax.experimental import multihost_utils

        flags = np.asarray(multihost_utils.process_allgather(
            np.array([self.signum or 0], np.int32)))
        if self.signum is None and flags.max() > 0:
            self.signum = int(flags.max())
        return bool(flags.max() > 0)

    def close(self) -> None:
        """Put back the handlers that were there before."""
        for s, h in self._previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._previous = {}
