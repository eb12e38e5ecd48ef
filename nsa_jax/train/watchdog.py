"""``run.watchdog_s``: abort a run that stops making progress (a hung device, collective or read).

The loop calls :meth:`Watchdog.beat` after every step, eval batch and checkpoint. If no beat
arrives for ``watchdog_s`` seconds, the watchdog prints ``error: ...`` and every thread's stack
to stderr and ends the process with status 3 (checkpoints already written stay valid).
"""
from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

EXIT_HUNG = 3


class Watchdog:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.where = "start"
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = None
        if timeout_s > 0:
            self._thread = threading.Thread(target=self._run, name="nsa-watchdog", daemon=True)
            self._thread.start()

    def beat(self, where: str = "") -> None:
        self._last = time.monotonic()
        if where:
            self.where = where

    def _run(self) -> None:
        period = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(period):
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                sys.stderr.write(f"error: run.watchdog_s: no progress for {idle:.0f}s (last: "
                                 f"{self.where}); aborting\n")
                sys.stderr.flush()
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                os._exit(EXIT_HUNG)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
